"""Budget-driven training of one configuration, and the run record it leaves behind.

Steps come from the FLOPs budget through the accounting module, so every run of a study
spends exactly its compute.  One code path serves the CPU (fp32), one GPU (bf16 autocast)
and several GPUs under `torchrun` (DDP); on the CPU the same DDP path runs on gloo, which is
how the tests check it.  By default the step is the fast one on every device: the model's
forward and backward compiled by torch.compile (inductor) and the optimizers batched over
tensors; `compile=False` (`--no-compile`) is the plain eager reference with the same maths.  Checkpoints and records are written
atomically, so a killed run loses at most one checkpoint interval and never a record.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

from . import accounting, data, optim
from .config import DEFAULT_SEED, REPO, ConfigError, get_preset, model_config, run_name
from .dist import Dist, prepare_once
from .io import atomic_open, atomic_write_json
from .memory import gpu_spec
from .model import LoopedGPT


class TrainError(RuntimeError):
    """A run that cannot start or continue (bad checkpoint, existing record, too little data)."""


@dataclass
class TrainConfig:
    preset: str = "cpu"
    r: int = 1
    s: float = 8
    injection: str | None = None      # None: 'none' for r=1, 'linear' otherwise
    lanes: int = 2
    bptt_k: int | None = None
    budget: float | None = None       # training FLOPs; or give `steps`
    steps: int | None = None          # with `budget` too: train this many steps; `budget` names the cell
    batch_tokens: int | None = None   # default: the preset's
    micro_batch: int | None = None    # rows per forward pass per process (None: the whole batch on
                                      # the CPU, the largest that fits on a GPU)
    seed: int = DEFAULT_SEED
    data_order: int | None = None     # None: the fixed row order every run reads; an int seeds a
                                      # permutation of the run's step blocks (same rows, new order)
    lr_scale: float | None = None     # multiplies HyperP's learning rates (None: the preset's default)
    out: str | None = None            # record path; None writes no record
    study: str = "adhoc"
    checkpoint: str | None = None     # checkpoint path; default: next to the record under ckpt/
    checkpoint_every: int = 0         # steps between checkpoints; 0 = never
    resume: bool = True               # continue from the checkpoint if one exists
    overwrite: bool = False           # replace an existing record
    eval_tokens: int | None = None    # default: the preset's
    log_every: int = 10
    compile: bool = True              # the fast path (torch.compile + batched optimizers); False: eager
    data_dir: str | None = None
    quiet: bool = False
    peak_flops: float | None = None   # MFU denominator; None: device_peak_flops()
    stop_after: int | None = None     # stop (as if killed) after this many steps: for tests

    def model_config(self):
        return model_config(self.preset, r=self.r, s=self.s, injection=self.injection,
                            lanes=self.lanes, bptt_k=self.bptt_k)


def run_id(tc: TrainConfig) -> str:
    """A readable, unique name for a run within a study."""
    return run_name(tc.model_config(), tc.budget, tc.steps, tc.lr_scale, tc.seed, tc.batch_tokens, tc.data_order)


# ----------------------------------------------------------------------------- utilities

def step_blocks(steps: int, data_order: int | None) -> list[int]:
    """Which block of rows_per_step train rows each step reads: block i at step i, or a seeded
    permutation of the same blocks (a run still sees exactly its first steps x R rows)."""
    order = list(range(steps))
    if data_order is not None:
        random.Random(f"data-order-{data_order}").shuffle(order)
    return order


def git_commit() -> str | None:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict:
    import numpy

    from . import __version__
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
            "looped": __version__}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def matmul_peak(device: torch.device, dtype=torch.float32, n: int = 1024, seconds: float = 0.5) -> float:
    """FLOP/s of a large square matmul: the denominator of MFU, measured on this machine."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(4):
            a @ b
        reps += 4
        sync()
    return 2 * n ** 3 * reps / (time.perf_counter() - t0)


# Dense bf16 tensor-core peaks (vendor spec sheets, SXM parts): a measured GEMM on these
# parts lands at 65-80% of them, and MFU conventionally divides by the spec.
def device_peak_flops(device: torch.device) -> float:
    """The MFU denominator: the spec bf16 peak of a known GPU, else a measured large matmul.

    On the CPU the measurement (fp32, 1024^3, in this process and thread setting) is the
    honest ceiling for our small models; on an unknown GPU an 8192^3 bf16 GEMM is large enough
    to fill the device.
    """
    if device.type == "cuda":
        spec = gpu_spec(torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).total_memory)
        if spec:
            return spec[1]
        return matmul_peak(device, torch.bfloat16, n=8192)
    return matmul_peak(device, torch.float32)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this run: allocated CUDA memory, or the process's peak resident size."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


# ----------------------------------------------------------------------------- checkpoints

def fast_model(model: torch.nn.Module) -> torch.nn.Module:
    """The fast path's model: the fused loss tail (`model.softcap_cross_entropy`), and forward
    and backward compiled by inductor, on the CPU as on CUDA.

    The r recurrences, truncated BPTT (grad mode toggled inside the graph) and the
    hyperconnection lanes trace into one graph with no breaks, so the loop is unrolled and the
    elementwise work around every matmul (norms, rotary, ReLU^2, softcap, log-softmax) fuses.
    Shapes are static (one run trains one shape); a fresh dynamo state per call keeps a long
    sweep from reaching dynamo's recompile limit, which would silently drop later runs to eager.
    Compiled code is still reused across runs of one shape through inductor's on-disk caches.
    """
    torch._dynamo.reset()
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    inner.fused_loss = True
    return torch.compile(model, dynamic=False)


def save_checkpoint(path: Path, model, optimizers, step: int, state: dict):
    """Written straight to a temporary file, then renamed: no second copy in host memory."""
    with atomic_open(path) as f:
        torch.save({"model": model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
                    "step": step, "state": state}, f)


def load_checkpoint(path: Path, model, optimizers, expect: dict) -> tuple[int, dict]:
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
        if ck["state"]["run"] != expect:
            raise TrainError(f"checkpoint {path} belongs to a different run configuration; "
                             "delete it or pass another --checkpoint")
        model.load_state_dict(ck["model"])
        for o, sd in zip(optimizers, ck["optimizers"], strict=True):
            o.load_state_dict(sd)
        return int(ck["step"]), ck["state"]
    except TrainError:
        raise
    except Exception as e:  # a truncated or foreign file: say so, never train from garbage
        raise TrainError(f"checkpoint {path} is unreadable ({type(e).__name__}); delete it to restart the run") from None


# ----------------------------------------------------------------------------- training

def evaluate(model, dataset, rows: int, micro: int, dd: Dist, autocast) -> float:
    """Mean cross-entropy in nats over the fixed validation rows (split across ranks)."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(dd.rank * micro, rows, micro * dd.world):
            batch = dataset.rows("val", start, min(micro, rows - start)).to(dd.device)
            with autocast:
                loss = model(batch[:, :-1], batch[:, 1:])
            total += loss.item() * batch.shape[0]  # every row holds T targets
            count += batch.shape[0]
    model.train()
    if dd.world > 1:
        t = torch.tensor([total, count], dtype=torch.float64, device=dd.device)
        dist.all_reduce(t)
        total, count = t.tolist()
    return total / count


def train(tc: TrainConfig) -> dict:
    """Train one configuration; returns (and, with `out`, writes) its run record."""
    cfg = tc.model_config()
    preset = get_preset(tc.preset)
    batch_tokens = tc.batch_tokens or preset.batch_tokens
    T = cfg.seq_len
    if batch_tokens % T:
        raise ConfigError(f"batch_tokens={batch_tokens} must be a multiple of seq_len={T}")
    if tc.budget is None and tc.steps is None:
        raise ConfigError("give a budget or a number of steps")
    if tc.steps is not None and tc.steps < 1:
        raise ConfigError(f"steps must be >= 1, got {tc.steps}")
    steps = tc.steps or accounting.steps_for_budget(cfg, tc.budget, batch_tokens)
    dd = Dist()
    rows_per_step = batch_tokens // T
    micro = tc.micro_batch or rows_per_step // dd.world
    if micro < 1 or rows_per_step % (micro * dd.world):
        raise ConfigError(f"{rows_per_step} rows per step do not split into {dd.world} process(es) "
                          f"x micro-batches of {micro}")
    record_path = Path(tc.out) if tc.out else None
    if record_path and record_path.exists() and not tc.overwrite:
        raise TrainError(f"record {record_path} exists; pass --overwrite to replace it")
    ckpt_path = Path(tc.checkpoint) if tc.checkpoint else (
        record_path.parent / "ckpt" / (record_path.stem + ".pt") if record_path else None)

    # under torchrun rank 0 builds the dataset while the others wait on a long-timeout group
    dataset = data.Dataset(prepare_once(tc.preset, data_dir=tc.data_dir))
    if dataset.n_rows("train") < steps * rows_per_step:
        raise TrainError(f"run needs {steps * rows_per_step} training rows but the corpus has "
                         f"{dataset.n_rows('train')}: lower the budget (runs never repeat data)")
    eval_rows = min(dataset.n_rows("val"), max(1, (tc.eval_tokens or preset.eval_tokens) // T))

    torch.manual_seed(tc.seed)
    raw = LoopedGPT(cfg).to(dd.device)
    tokens_total = steps * batch_tokens
    optimizers = optim.build_optimizers(raw, cfg, batch_tokens, tokens_total, fast=tc.compile)
    lr_scale = preset.lr_scale if tc.lr_scale is None else tc.lr_scale
    if lr_scale != 1.0:
        for o in optimizers:
            for g in o.param_groups:
                g["initial_lr"] *= lr_scale
    model = raw
    if dd.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            raw, device_ids=[dd.local_rank] if dd.device.type == "cuda" else None,
            gradient_as_bucket_view=True, broadcast_buffers=False)
    if tc.compile:
        model = fast_model(model)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if dd.device.type == "cuda" \
        else torch.autocast("cpu", enabled=False)

    # The micro-batch is not part of a run's identity: it changes only the summation order,
    # so a run may resume on another GPU with another micro-batch.
    identity = {"model": cfg.to_dict(), "steps": steps, "batch_tokens": batch_tokens, "seed": tc.seed,
                "lr_scale": lr_scale, **({"data_order": tc.data_order} if tc.data_order is not None else {})}
    blocks = step_blocks(steps, tc.data_order)
    start, state = 0, {"curve": [], "train_seconds": 0.0, "steady": [0, 0.0], "first_step_seconds": None,
                       "run": identity}
    if ckpt_path and tc.resume and ckpt_path.exists():
        start, state = load_checkpoint(ckpt_path, raw, optimizers, identity)

    flops_per_token = accounting.flops_per_token(cfg)
    peak = tc.peak_flops or device_peak_flops(dd.device)
    from tqdm.auto import tqdm
    bar = tqdm(total=steps, initial=start, disable=tc.quiet or not dd.main, unit="step",
               desc=run_id(tc) if tc.budget or tc.steps else "train", dynamic_ncols=True)

    def one_step(step: int, micro: int) -> torch.Tensor:
        """Forward and backward over the step's rows; the summed loss stays on the device."""
        accum = rows_per_step // (micro * dd.world)
        loss_sum = torch.zeros((), device=dd.device)
        for a in range(accum):
            first = blocks[step] * rows_per_step + (a * dd.world + dd.rank) * micro
            batch = dataset.rows("train", first, micro).to(dd.device, non_blocking=True)
            sync_ctx = model.no_sync() if dd.world > 1 and a < accum - 1 else contextlib.nullcontext()
            with sync_ctx, autocast:
                loss = model(batch[:, :-1], batch[:, 1:]) / accum
            loss.backward()
            loss_sum += loss.detach()
        return loss_sum

    status, step = "ok", start
    t_seg = time.perf_counter()
    for step in range(start, steps):
        t_step = time.perf_counter()
        optim.set_lr(optimizers, optim.lr_multiplier(step, steps))
        while True:
            try:
                loss_sum = one_step(step, micro)
                break
            except torch.cuda.OutOfMemoryError:
                # an automatically chosen micro-batch that does not fit after all: halve it
                # (only at a segment's first step, before anything was learned from it)
                if tc.micro_batch is not None or step != start or micro == 1:
                    raise
                for o in optimizers:
                    o.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                micro //= 2
        if dd.world > 1:
            dist.all_reduce(loss_sum)
            loss_sum /= dd.world
        loss_value = loss_sum.item()  # the step's one host sync
        if not math.isfinite(loss_value):
            status = "diverged"
            state["curve"].append([step, None])
            break
        for o in optimizers:
            o.step()
        for o in optimizers:
            o.zero_grad(set_to_none=True)
        done = step + 1
        now = time.perf_counter()
        if step == start:  # compile and warm-up: kept out of the throughput figures
            state["first_step_seconds"] = state["first_step_seconds"] or now - t_step
        else:
            state["steady"] = [state["steady"][0] + 1, state["steady"][1] + now - t_step]
        if step % tc.log_every == 0 or done == steps:
            state["curve"].append([step, round(loss_value, 5)])
        elapsed = state["train_seconds"] + now - t_seg
        post = {"loss": f"{loss_value:.3f}"}
        if state["steady"][0]:
            tok_s = state["steady"][0] * batch_tokens / state["steady"][1]
            post.update({"tok/s": f"{tok_s:,.0f}", "mfu": f"{tok_s * flops_per_token / peak:.0%}"})
        bar.set_postfix(post, refresh=False)
        bar.update(1)
        if ckpt_path and tc.checkpoint_every and done % tc.checkpoint_every == 0 and done < steps:
            state["train_seconds"] = elapsed
            if dd.main:
                save_checkpoint(ckpt_path, raw, optimizers, done, state)
            state["train_seconds"], t_seg, start = elapsed, time.perf_counter(), done
            dd.barrier()
        if tc.stop_after is not None and done >= tc.stop_after and done < steps:
            bar.close()
            return {"status": "stopped", "step": done}
    bar.close()
    train_seconds = state["train_seconds"] + time.perf_counter() - t_seg
    # Under DDP evaluate the bare module: ranks may get different numbers of validation batches,
    # and the DDP wrapper's forward can issue a buffer broadcast that would then never be matched.
    # The compiled model is not used either: evaluation runs once, and compiling its no-grad
    # graph would cost more than it saves.
    val = evaluate(raw, dataset, eval_rows, micro, dd, autocast) if status == "ok" else None
    if val is not None and not math.isfinite(val):
        status, val = "diverged", None
    steady_steps, steady_seconds = state["steady"]
    tok_s = steady_steps * batch_tokens / steady_seconds if steady_seconds > 0 else None
    record = {
        "schema": 1, "study": tc.study, "run_id": run_id(tc), "status": status,
        "r": cfg.r, "s": tc.s, "injection": cfg.injection, "lanes": cfg.lanes if cfg.injection == "hyperconnect" else None,
        "bptt_k": cfg.k_bwd, "budget": tc.budget, "preset": tc.preset,
        "d_model": cfg.d_model, "n": accounting.n_params(cfg), "n_once": accounting.n_once(cfg),
        "n_rec": accounting.n_rec(cfg), "flops_per_token": flops_per_token,
        "batch_tokens": batch_tokens, "steps": steps, "tokens": steps * batch_tokens,
        "loss": val, "eval_tokens": eval_rows * T, "train_loss_curve": state["curve"],
        "wall_seconds": round(train_seconds, 3), "tokens_per_s": tok_s,
        "flops_per_s": tok_s * flops_per_token if tok_s else None,
        "mfu": tok_s * flops_per_token / peak if tok_s and peak else None, "peak_flops": peak,
        "first_step_seconds": state["first_step_seconds"], "micro_batch": micro, "compile": tc.compile,
        "peak_memory_bytes": peak_memory_bytes(dd.device),
        "device": device_name(dd.device), "world_size": dd.world, "seed": tc.seed, "data_order": tc.data_order,
        "lr_scale": lr_scale,
        "learning_rates": {g.get("name", str(i)): g["initial_lr"] for o in optimizers
                           for i, g in enumerate(o.param_groups)},
        "config": cfg.to_dict(), "train": {k: v for k, v in asdict(tc).items() if k not in ("quiet",)},
        "versions": versions(), "git_commit": git_commit(),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if dd.main and record_path:
        atomic_write_json(record_path, record)
        if ckpt_path and ckpt_path.exists():
            ckpt_path.unlink()  # the record is the durable result; the checkpoint is scratch
    dd.barrier()
    return record


# ----------------------------------------------------------------------------- CLI

def add_train_args(ap: argparse.ArgumentParser):
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--r", "--recurrences", dest="r", type=int, default=1,
                    help="recurrences per forward pass (under torchrun spell it --recurrences: "
                         "torchrun rejects --r as an ambiguous abbreviation of its own options)")
    ap.add_argument("--size", "-s", type=float, default=8)
    ap.add_argument("--injection", default=None)
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--bptt-k", type=int, default=None)
    ap.add_argument("--budget", type=float, default=None, help="training FLOPs")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch-tokens", type=int, default=None)
    ap.add_argument("--micro-batch", type=int, default=None, help="rows per forward pass per process")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--data-order", type=int, default=None,
                    help="seed a permutation of the run's step blocks (default: the fixed order)")
    ap.add_argument("--lr-scale", type=float, default=None,
                    help="multiplier on HyperP's learning rates (default: the preset's, 1 but where an LR sweep re-based it)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="the fast path: torch.compile + batched optimizers (default); --no-compile "
                         "runs the plain eager reference step")
    ap.add_argument("--peak-flops", type=float, default=None,
                    help="MFU denominator in FLOP/s (default: a known GPU's spec, else measured)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--quiet", action="store_true")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="looped train", description=__doc__.splitlines()[0])
    add_train_args(ap)
    ap.add_argument("--out", default=None, help="run record path (JSON)")
    ap.add_argument("--study", default="adhoc")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--no-resume", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--"]:  # `torchrun ... -m looped train -- ARGS` passes the separator through
        argv = argv[1:]
    a = ap.parse_args(argv)
    tc = TrainConfig(preset=a.preset, r=a.r, s=a.size, injection=a.injection, lanes=a.lanes, bptt_k=a.bptt_k,
                     budget=a.budget, steps=a.steps, batch_tokens=a.batch_tokens, micro_batch=a.micro_batch,
                     seed=a.seed, data_order=a.data_order, lr_scale=a.lr_scale, out=a.out, study=a.study, checkpoint=a.checkpoint,
                     checkpoint_every=a.checkpoint_every, resume=not a.no_resume, overwrite=a.overwrite,
                     compile=a.compile, peak_flops=a.peak_flops, data_dir=a.data_dir, quiet=a.quiet)
    try:
        rec = train(tc)
    except (ConfigError, TrainError, data.DataError) as e:
        print(f"looped train: error: {e}", file=sys.stderr)
        return 2
    if Dist().main:
        print(json.dumps({k: rec.get(k) for k in ("run_id", "status", "loss", "tokens", "steps",
                                                  "wall_seconds", "tokens_per_s", "mfu")}))
    return 0 if rec["status"] == "ok" else 3
