"""Budget-driven training of one configuration, and the run record it leaves behind.

Steps come from the FLOPs budget through the accounting module, so every run of a study
spends exactly its compute.  One code path serves the CPU (fp32), one GPU (bf16 autocast)
and several GPUs under `torchrun` (data parallel: each rank a contiguous slice of a step's rows,
gradients averaged once per step after the ranks agree none ran out of memory); on the CPU the
same path runs on gloo, which is how the tests check it.  By default the step is the fast one on
every device: the model's forward and backward compiled by torch.compile (inductor) and the
optimizers batched over tensors; `compile=False` (`--no-compile`) is the plain eager reference with the same maths, and
where inductor cannot compile the run falls back to it.  On a GPU the micro-batch starts at
looped.memory's prediction and halves on out-of-memory (`runtime.StepGuard`).  A run reads a
prepared dataset (`looped data prepare`; `looped sweep` prepares it before its runs) and never
builds one.  Checkpoints (looped.checkpoint) and records are written atomically, so a killed run
loses at most one checkpoint interval."""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from . import accounting, memory, optim
from .checkpoint import Cadence, load_checkpoint, save_checkpoint
from .config import ConfigError, DataError, size_note, size_used
from .data.dataset import Dataset, locate
from .dist import Dist
from .io import atomic_write_json
from .model import LoopedGPT
from .options import TrainConfig, TrainError, add_options, given_options, run_id  # noqa: F401 (the API)
from .records import SCHEMA, data_field
from .runtime import (
    StepGuard,
    device_name,
    device_peak_flops,
    fast_model,
    first_micro_batch,
    fresh_device_memory,
    git_commit,
    peak_memory_bytes,
    versions,
)

# ----------------------------------------------------------------------------- utilities

def step_blocks(steps: int, data_order: int | None) -> list[int]:
    """Which block of rows_per_step train rows each step reads: block i at step i, or a seeded
    permutation of the same blocks (a run still sees exactly its first steps x R rows)."""
    order = list(range(steps))
    if data_order is not None:
        random.Random(f"data-order-{data_order}").shuffle(order)
    return order


# ----------------------------------------------------------------------------- training

def evaluate(model, dataset, rows: int, micro: int, dd: Dist, autocast) -> float:
    """Mean cross-entropy in nats over the fixed validation rows (a contiguous slice per rank)."""
    model.eval()
    total, count = 0.0, 0
    lo, hi = rows * dd.rank // dd.world, rows * (dd.rank + 1) // dd.world
    with torch.no_grad():
        for start in range(lo, hi, micro):
            batch = dataset.rows("val", start, min(micro, hi - start)).to(dd.device)
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


def step_budget(tc: TrainConfig, cfg) -> tuple[int, int]:
    """(tokens per optimizer step, steps) of a run: its steps, or as many as its FLOPs budget buys."""
    batch_tokens = tc.batch_tokens or tc.preset.batch_tokens
    if batch_tokens % cfg.seq_len:
        raise ConfigError(f"batch_tokens={batch_tokens} must be a multiple of seq_len={cfg.seq_len}")
    if tc.budget is None and tc.steps is None:
        raise ConfigError("give a budget or a number of steps")
    if tc.steps is not None and tc.steps < 1:
        raise ConfigError(f"steps must be >= 1, got {tc.steps}")
    return batch_tokens, tc.steps or accounting.steps_for_budget(cfg, tc.budget, batch_tokens)


def split_rows(rows_per_step: int, world: int, micro_batch: int | None) -> int:
    """The micro-batch: the one given, else a process's whole share of the step (0 is refused)."""
    micro = rows_per_step // world if micro_batch is None else micro_batch
    if micro < 1 or rows_per_step % (micro * world):
        raise ConfigError(f"{rows_per_step} rows per step do not split into {world} process(es) "
                          f"x micro-batches of {micro}")
    return micro


def output_paths(tc: TrainConfig) -> tuple[Path | None, Path | None]:
    """(record, checkpoint) of a run; an existing record is refused unless `overwrite`."""
    record_path = Path(tc.out) if tc.out else None
    if record_path and record_path.exists() and not tc.overwrite:
        raise TrainError(f"record {record_path} exists; pass --overwrite to replace it")
    ckpt_path = Path(tc.checkpoint) if tc.checkpoint else (
        record_path.parent / "ckpt" / (record_path.stem + ".pt") if record_path else None)
    return record_path, ckpt_path


def open_dataset(tc: TrainConfig, rows: int) -> Dataset:
    """The preset's prepared dataset (`dataset.locate`: a one-line DataError naming `looped data
    prepare` when it is missing), checked to hold the run's training rows."""
    dataset = Dataset(locate(tc.preset, data_dir=tc.data_dir))
    if dataset.n_rows("train") < rows:
        raise TrainError(f"run needs {rows} training rows but the corpus has "
                         f"{dataset.n_rows('train')}: lower the budget (runs never repeat data)")
    return dataset


def build(tc: TrainConfig, cfg, dd: Dist, batch_tokens: int, tokens_total: int):
    """(model, optimizers, learning-rate multiplier) of a run, seeded, on the device."""
    torch.manual_seed(tc.seed)
    raw = LoopedGPT(cfg).to(dd.device)
    optimizers = optim.build_optimizers(raw, cfg, batch_tokens, tokens_total, fast=tc.compile)
    lr_scale = tc.preset.lr_scale if tc.lr_scale is None else tc.lr_scale
    if lr_scale != 1.0:
        for o in optimizers:
            for g in o.param_groups:
                g["initial_lr"] *= lr_scale
    dd.broadcast_params(raw)  # under torchrun: no DDP wrapper, see Dist.average_grads
    return raw, optimizers, lr_scale


def zero_grad(optimizers):
    for o in optimizers:
        o.zero_grad(set_to_none=True)


def progress_bar(tc: TrainConfig, steps: int, start: int, main: bool):
    from tqdm.auto import tqdm  # deferred on purpose: in a notebook without widgets it warns when imported
    return tqdm(total=steps, initial=start, disable=tc.quiet or not main, unit="step",
                desc=run_id(tc) if tc.budget or tc.steps else "train", dynamic_ncols=True)


def train(tc: TrainConfig) -> dict:
    """Train one configuration on its prepared dataset; returns (and, with `out`, writes) its record."""
    memory.prefer_expandable_segments()  # in-process callers (notebooks) too, not only the CLIs
    cfg = tc.model_config()
    batch_tokens, steps = step_budget(tc, cfg)
    dd = Dist()
    rows_per_step = batch_tokens // cfg.seq_len
    micro = split_rows(rows_per_step, dd.world, tc.micro_batch)
    record_path, ckpt_path = output_paths(tc)
    dataset = open_dataset(tc, steps * rows_per_step)
    eval_rows = min(dataset.n_rows("val"), max(1, (tc.eval_tokens or tc.preset.eval_tokens) // cfg.seq_len))

    fresh_device_memory(dd.device)  # before the model: the micro-batch is chosen from what is free
    if tc.micro_batch is None:  # the ranks' GPUs may have different memory free: all take the smallest
        micro = dd.min(first_micro_batch(cfg, micro, dd.device))
    raw, optimizers, lr_scale = build(tc, cfg, dd, batch_tokens, steps * batch_tokens)
    model = fast_model(raw) if tc.compile else raw
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if dd.device.type == "cuda" \
        else torch.autocast("cpu", enabled=False)

    # The micro-batch is not part of a run's identity: it changes only the summation order,
    # so a run may resume on another GPU with another micro-batch.
    identity = {"model": cfg.to_dict(), "steps": steps, "batch_tokens": batch_tokens, "seed": tc.seed,
                "lr_scale": lr_scale, **({"data_order": tc.data_order} if tc.data_order is not None else {})}
    start, state, micro = resume(tc, ckpt_path, raw, optimizers, identity, micro)
    history = state["micro_batch_history"]  # [step, micro-batch from that step on]

    def to_eager():  # inductor cannot compile on this machine: the eager reference step, as --no-compile
        nonlocal model
        model, raw.fused_loss = raw, False
        optim.set_fast(optimizers, False)

    blocks = step_blocks(steps, tc.data_order)
    rows_per_rank = rows_per_step // dd.world

    def one_step(step: int, micro: int, loss_sum: torch.Tensor):
        """Forward and backward over this rank's rows of the step (a contiguous slice, so ranks at
        different micro-batches still read each row once), summing the loss on the device."""
        accum = rows_per_rank // micro
        for a in range(accum):
            batch = dataset.rows("train", blocks[step] * rows_per_step + dd.rank * rows_per_rank + a * micro, micro)
            if dd.device.type == "cuda":  # from pinned memory the copy need not wait for the GPU
                batch = batch.pin_memory()
            batch = batch.to(dd.device, non_blocking=True)
            with autocast:
                loss = model(batch[:, :-1], batch[:, 1:]) / accum
            loss.backward()
            loss_sum += loss.detach()

    cadence = Cadence.of(tc, dd.device)
    guard = StepGuard(dd, micro, history, chosen=tc.micro_batch is not None, compiled=tc.compile,
                      to_eager=to_eager, zero_grad=lambda: zero_grad(optimizers))
    meter = Meter(state, batch_tokens, accounting.flops_per_token(cfg), tc.peak_flops or device_peak_flops(dd.device))
    bar = progress_bar(tc, steps, start, dd.main)
    status = "ok"
    for step in range(start, steps):
        meter.start()
        optim.set_lr(optimizers, optim.lr_multiplier(step, steps))
        loss, (due_by_time,), retried = guard.step(step, partial(one_step, step), also=(cadence.time_due,))
        dd.average_grads(raw.parameters())
        if not math.isfinite(loss):
            status = "diverged"
            state["curve"].append([step, None])
            break
        for o in optimizers:
            o.step()
        zero_grad(optimizers)
        done = step + 1
        meter.stepped(step, loss, first=step == start, retried=retried, log=step % tc.log_every == 0 or done == steps)
        bar.set_postfix(meter.postfix(loss), refresh=False)
        bar.update(1)
        if ckpt_path and done < steps and cadence.due(done, bool(due_by_time)):
            meter.pause()
            if dd.main:
                save_checkpoint(ckpt_path, raw, optimizers, done, state)
            dd.barrier()
            cadence.saved()
            meter.resume()
        if tc.stop_after is not None and done >= tc.stop_after and done < steps:
            bar.close()
            return {"status": "stopped", "step": done}
    bar.close()
    train_seconds = meter.seconds()
    # Evaluate the bare module: under DDP ranks may get different numbers of validation batches,
    # and compiling the no-grad graph of a single evaluation would cost more than it saves.
    val = evaluate(raw, dataset, eval_rows, guard.micro, dd, autocast) if status == "ok" else None
    if val is not None and not math.isfinite(val):
        status, val = "diverged", None
    record = run_record(tc, cfg, dd, dataset, optimizers, state, status=status, loss=val, steps=steps,
                        batch_tokens=batch_tokens, eval_tokens=eval_rows * cfg.seq_len, guard=guard,
                        lr_scale=lr_scale, train_seconds=train_seconds, meter=meter)
    if dd.main and record_path:
        atomic_write_json(record_path, record)
        if ckpt_path and ckpt_path.exists():
            ckpt_path.unlink()  # the record is the durable result; the checkpoint is scratch
    dd.barrier()
    return record


def resume(tc: TrainConfig, ckpt_path: Path | None, raw, optimizers, identity: dict, micro: int):
    """(first step, state, micro-batch) of a run: from its checkpoint if it has one (with the
    micro-batch it had halved to, so there is no second out-of-memory), else from step 0."""
    start, state = 0, fresh_state(identity)
    if ckpt_path and tc.resume and ckpt_path.exists():
        start, state = load_checkpoint(ckpt_path, raw, optimizers, identity)
        state = {**fresh_state(identity), **state}  # a checkpoint of an older version lacks the newer keys
    history = state["micro_batch_history"]  # [step, micro-batch from that step on]
    if tc.micro_batch is None and history and history[-1][1] < micro and micro % history[-1][1] == 0:
        micro = history[-1][1]
    if not history or history[-1][1] != micro:
        history.append([start, micro])
    return start, state, micro


def fresh_state(identity: dict) -> dict:
    """What a checkpoint carries besides the weights: the curve, the clocks, the micro-batches."""
    return {"curve": [], "train_seconds": 0.0, "steady": [0, 0.0], "first_step_seconds": None, "run": identity,
            "micro_batch_history": [], "checkpoints": 0, "checkpoint_save_seconds": 0.0}


class Meter:
    """A run's clocks in its checkpointed `state`: training seconds (checkpoint saves left out and
    counted on their own), the first step's (compile and warm-up) and the steady steps' throughput,
    and the logged loss curve."""

    def __init__(self, state: dict, batch_tokens: int, flops_per_token: float, peak: float):
        self.state, self.batch_tokens, self.flops_per_token, self.peak = state, batch_tokens, flops_per_token, peak
        self.t_seg = self.t_step = time.perf_counter()

    def start(self):
        self.t_step = time.perf_counter()

    def stepped(self, step: int, loss: float, *, first: bool, retried: bool, log: bool):
        state, now = self.state, time.perf_counter()
        if first:  # compile and warm-up: kept out of the throughput figures
            state["first_step_seconds"] = state["first_step_seconds"] or now - self.t_step
        elif not retried:  # (a retried step compiled again, for its new micro-batch)
            state["steady"] = [state["steady"][0] + 1, state["steady"][1] + now - self.t_step]
        if log:
            state["curve"].append([step, round(loss, 5)])

    def tokens_per_s(self) -> float | None:
        steps, seconds = self.state["steady"]
        return steps * self.batch_tokens / seconds if seconds > 0 else None

    def postfix(self, loss: float) -> dict:
        post = {"loss": f"{loss:.3f}"}
        if self.state["steady"][0]:
            tok_s = self.tokens_per_s()
            post.update({"tok/s": f"{tok_s:,.0f}", "mfu": f"{tok_s * self.flops_per_token / self.peak:.0%}"})
        return post

    def seconds(self) -> float:
        return self.state["train_seconds"] + time.perf_counter() - self.t_seg

    def pause(self):
        """Before a checkpoint save: out of wall_seconds and tokens/s, and recorded on its own (a
        resumed run lacks the duration of the save it resumed from: that checkpoint was written
        before it was known)."""
        self.state["train_seconds"] = self.seconds()
        self.state["checkpoints"] += 1
        self.t_save = time.perf_counter()

    def resume(self):
        self.state["checkpoint_save_seconds"] += time.perf_counter() - self.t_save
        self.t_seg = time.perf_counter()


def run_record(tc: TrainConfig, cfg, dd: Dist, dataset: Dataset, optimizers, state: dict, *, status: str,
               loss: float | None, steps: int, batch_tokens: int, eval_tokens: int, guard: StepGuard,
               lr_scale: float, train_seconds: float, meter: Meter) -> dict:
    """The run record: what ran (configuration, data, budget), what it reached, and how fast."""
    preset, flops_per_token, peak = tc.preset, meter.flops_per_token, meter.peak
    tok_s = meter.tokens_per_s()
    peak_bytes, peak_scope = peak_memory_bytes(dd.device)
    return {
        "schema": SCHEMA, "study": tc.study, "run_id": run_id(tc), "status": status,
        "r": cfg.r, "s": tc.s, "s_model": size_used(cfg.preset, tc.s), "size_note": size_note(cfg.preset, tc.s, True),
        "injection": cfg.injection,
        "lanes": cfg.lanes if cfg.injection == "hyperconnect" else None,
        "bptt_k": cfg.k_bwd, "budget": tc.budget, "preset": preset.name,
        "data": data_field(dataset.meta, dataset.path.name),  # what it trained on: runs of two corpora never pool
        "d_model": cfg.d_model, "n": accounting.n_params(cfg), "n_once": accounting.n_once(cfg),
        "n_rec": accounting.n_rec(cfg), "flops_per_token": flops_per_token,
        "batch_tokens": batch_tokens, "steps": steps, "tokens": steps * batch_tokens,
        "loss": loss, "eval_tokens": eval_tokens, "train_loss_curve": state["curve"],
        "wall_seconds": round(train_seconds, 3), "tokens_per_s": tok_s,
        "flops_per_s": tok_s * flops_per_token if tok_s else None,
        "mfu": tok_s * flops_per_token / peak if tok_s and peak else None, "peak_flops": peak,
        "first_step_seconds": state["first_step_seconds"], "micro_batch": guard.micro,
        "micro_batch_history": guard.history, "compile": guard.compiled, "compile_error": guard.compile_error,
        "checkpoints": state["checkpoints"], "checkpoint_save_seconds": round(state["checkpoint_save_seconds"], 3),
        "peak_memory_bytes": peak_bytes, "peak_memory_scope": peak_scope,
        "device": device_name(dd.device), "world_size": dd.world, "seed": tc.seed, "data_order": tc.data_order,
        "lr_scale": lr_scale,
        "learning_rates": {g.get("name", str(i)): g["initial_lr"] for o in optimizers
                           for i, g in enumerate(o.param_groups)},
        "config": cfg.to_dict(), "train": {k: v for k, v in tc.to_dict().items() if k not in ("quiet",)},
        "versions": versions(), "git_commit": git_commit(),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


# ----------------------------------------------------------------------------- CLI

def main(argv=None) -> int:
    memory.prefer_expandable_segments()  # before CUDA's first use (Dist picks the device)
    ap = argparse.ArgumentParser(prog="looped train", description=__doc__.splitlines()[0])
    add_options(ap)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--"]:  # `torchrun ... -m looped train -- ARGS` passes the separator through
        argv = argv[1:]
    options = given_options(ap.parse_args(argv))
    try:
        rec = train(TrainConfig(**options))
    except (ConfigError, TrainError, DataError) as e:
        print(f"looped train: error: {e}", file=sys.stderr)
        return 2
    if Dist().main:
        print(json.dumps({k: rec.get(k) for k in ("run_id", "status", "loss", "tokens", "steps",
                                                  "wall_seconds", "tokens_per_s", "mfu")}))
    return 0 if rec["status"] == "ok" else 3
