"""Budget-driven training of one configuration, and the run record it leaves behind.

Steps come from the FLOPs budget through the accounting module, so every run of a study
spends exactly its compute.  One code path serves the CPU (fp32), one GPU (bf16 autocast)
and several GPUs under `torchrun` (data parallel: each rank a contiguous slice of a step's rows,
gradients averaged once per step after the ranks agree none ran out of memory); on the CPU the
same path runs on gloo, which is how the tests check it.  By default the step is the fast one on
every device: the model's forward and backward compiled by torch.compile (inductor) and the
optimizers batched over tensors; `compile=False` (`--no-compile`) is the plain eager reference with the same maths, and
where inductor cannot compile the run falls back to it.  On a GPU the micro-batch starts at
looped.memory's prediction and halves on out-of-memory.  Checkpoints (looped.checkpoint) and
records are written atomically, so a killed run loses at most one checkpoint interval."""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

from . import accounting, memory, optim
from .checkpoint import Cadence, load_checkpoint, save_checkpoint
from .config import ConfigError, DataError, size_note, size_used
from .data.dataset import Dataset
from .dist import Dist, prepare_once
from .io import atomic_write_json
from .model import LoopedGPT
from .options import TrainConfig, TrainError, add_options, given_options, run_id  # noqa: F401 (the API)
from .records import SCHEMA, data_field
from .runtime import (
    compile_errors,
    device_name,
    device_peak_flops,
    fast_model,
    first_micro_batch,
    fresh_device_memory,
    git_commit,
    peak_memory_bytes,
    short_reason,
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


def train(tc: TrainConfig) -> dict:
    """Train one configuration; returns (and, with `out`, writes) its run record."""
    memory.prefer_expandable_segments()  # in-process callers (notebooks) too, not only the CLIs
    cfg = tc.model_config()
    preset = tc.preset  # resolved by TrainConfig
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
    micro = rows_per_step // dd.world if tc.micro_batch is None else tc.micro_batch  # 0 is refused, not a default
    if micro < 1 or rows_per_step % (micro * dd.world):
        raise ConfigError(f"{rows_per_step} rows per step do not split into {dd.world} process(es) "
                          f"x micro-batches of {micro}")
    record_path = Path(tc.out) if tc.out else None
    if record_path and record_path.exists() and not tc.overwrite:
        raise TrainError(f"record {record_path} exists; pass --overwrite to replace it")
    ckpt_path = Path(tc.checkpoint) if tc.checkpoint else (
        record_path.parent / "ckpt" / (record_path.stem + ".pt") if record_path else None)

    # under torchrun rank 0 builds the dataset while the others wait on a long-timeout group
    dataset = Dataset(prepare_once(tc.preset, data_dir=tc.data_dir))
    if dataset.n_rows("train") < steps * rows_per_step:
        raise TrainError(f"run needs {steps * rows_per_step} training rows but the corpus has "
                         f"{dataset.n_rows('train')}: lower the budget (runs never repeat data)")
    eval_rows = min(dataset.n_rows("val"), max(1, (tc.eval_tokens or preset.eval_tokens) // T))

    fresh_device_memory(dd.device)  # before the model: the micro-batch is chosen from what is free
    if tc.micro_batch is None:  # the ranks' GPUs may have different memory free: all take the smallest
        micro = dd.min(first_micro_batch(cfg, micro, dd.device))
    torch.manual_seed(tc.seed)
    raw = LoopedGPT(cfg).to(dd.device)
    tokens_total = steps * batch_tokens
    optimizers = optim.build_optimizers(raw, cfg, batch_tokens, tokens_total, fast=tc.compile)
    lr_scale = preset.lr_scale if tc.lr_scale is None else tc.lr_scale
    if lr_scale != 1.0:
        for o in optimizers:
            for g in o.param_groups:
                g["initial_lr"] *= lr_scale
    dd.broadcast_params(raw)  # under torchrun: no DDP wrapper, see Dist.average_grads
    model = eager = raw
    if tc.compile:
        model = fast_model(raw)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if dd.device.type == "cuda" \
        else torch.autocast("cpu", enabled=False)

    # The micro-batch is not part of a run's identity: it changes only the summation order,
    # so a run may resume on another GPU with another micro-batch.
    identity = {"model": cfg.to_dict(), "steps": steps, "batch_tokens": batch_tokens, "seed": tc.seed,
                "lr_scale": lr_scale, **({"data_order": tc.data_order} if tc.data_order is not None else {})}
    blocks = step_blocks(steps, tc.data_order)
    fresh = {"curve": [], "train_seconds": 0.0, "steady": [0, 0.0], "first_step_seconds": None, "run": identity,
             "micro_batch_history": [], "checkpoints": 0, "checkpoint_save_seconds": 0.0}
    start, state = 0, fresh
    if ckpt_path and tc.resume and ckpt_path.exists():
        start, state = load_checkpoint(ckpt_path, raw, optimizers, identity)
        state = {**fresh, **state}  # a checkpoint of an older version lacks the newer keys
    history = state["micro_batch_history"]  # [step, micro-batch from that step on]
    if tc.micro_batch is None and history and history[-1][1] < micro and micro % history[-1][1] == 0:
        micro = history[-1][1]  # the run had halved before it stopped: no second out-of-memory
    if not history or history[-1][1] != micro:
        history.append([start, micro])

    flops_per_token = accounting.flops_per_token(cfg)
    peak = tc.peak_flops or device_peak_flops(dd.device)
    from tqdm.auto import tqdm  # here, not at the top: in a notebook without widgets it warns when imported

    bar = tqdm(total=steps, initial=start, disable=tc.quiet or not dd.main, unit="step",
               desc=run_id(tc) if tc.budget or tc.steps else "train", dynamic_ncols=True)

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
    compiled, compile_error, cannot_compile = tc.compile, None, compile_errors() if tc.compile else ()
    status, step = "ok", start
    t_seg = time.perf_counter()
    for step in range(start, steps):
        t_step = time.perf_counter()
        optim.set_lr(optimizers, optim.lr_multiplier(step, steps))
        retried = False
        while True:
            loss_sum, failure, oom = torch.zeros((), device=dd.device), None, False
            try:
                one_step(step, micro, loss_sum)
            except torch.OutOfMemoryError:
                # a micro-batch the user chose is theirs to change
                if dd.world == 1 and (tc.micro_batch is not None or micro == 1):
                    raise
                oom = True
            except cannot_compile as e:
                if not compiled:
                    raise
                failure = short_reason(e)
            # The ranks agree before any gradient moves: an out-of-memory or a failed compile on
            # one rank is every rank's; the clocks' checkpoint votes ride along.  One host sync.
            votes = torch.stack([loss_sum, *(torch.full((), float(v), device=dd.device)
                                             for v in (cadence.time_due(), oom, failure is not None))])
            if dd.world > 1:
                dist.all_reduce(votes)
                votes[0] /= dd.world
            loss_value, due_by_time, n_oom, n_failed = votes.tolist()
            if not n_oom and not n_failed:
                break
            # here, out of the handler, the traceback and the activations its frames held are gone
            retried = True
            for o in optimizers:
                o.zero_grad(set_to_none=True)  # the partial step's gradients: redo it from its start
            if n_failed:  # inductor cannot compile on this machine: the eager reference step, as --no-compile
                failure = failure or "on another rank"
                model, compiled, compile_error = eager, False, failure
                raw.fused_loss = False
                optim.set_fast(optimizers, False)
                if dd.main:
                    print(f"looped train: warning: torch.compile failed, training eager ({failure})", file=sys.stderr)
            else:  # the memory model is an estimate, and optimizer state comes at step 1
                if tc.micro_batch is not None or micro == 1:
                    raise TrainError(f"{int(n_oom)} of {dd.world} ranks ran out of memory at step {step} "
                                     f"with micro-batch {micro}"
                                     + (": lower --micro-batch" if tc.micro_batch is not None else ""))
                micro //= 2
                history.append([step, micro])
                fresh_device_memory(dd.device)
        dd.average_grads(raw.parameters())
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
        elif not retried:  # (a retried step compiled again, for its new micro-batch)
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
        if ckpt_path and done < steps and cadence.due(done, bool(due_by_time)):
            state["train_seconds"] = elapsed
            state["checkpoints"] += 1
            t_save = time.perf_counter()
            if dd.main:
                save_checkpoint(ckpt_path, raw, optimizers, done, state)
            dd.barrier()
            # out of wall_seconds and tokens/s, and recorded on its own (a resumed run lacks the
            # duration of the save it resumed from: that checkpoint was written before it was known)
            state["checkpoint_save_seconds"] += time.perf_counter() - t_save
            cadence.saved()
            t_seg = time.perf_counter()
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
    peak_bytes, peak_scope = peak_memory_bytes(dd.device)
    record = {
        "schema": SCHEMA, "study": tc.study, "run_id": run_id(tc), "status": status,
        "r": cfg.r, "s": tc.s, "s_model": size_used(cfg.preset, tc.s), "size_note": size_note(cfg.preset, tc.s, True),
        "injection": cfg.injection,
        "lanes": cfg.lanes if cfg.injection == "hyperconnect" else None,
        "bptt_k": cfg.k_bwd, "budget": tc.budget, "preset": preset.name,
        "data": data_field(dataset.meta, dataset.path.name),  # what it trained on: runs of two corpora never pool
        "d_model": cfg.d_model, "n": accounting.n_params(cfg), "n_once": accounting.n_once(cfg),
        "n_rec": accounting.n_rec(cfg), "flops_per_token": flops_per_token,
        "batch_tokens": batch_tokens, "steps": steps, "tokens": steps * batch_tokens,
        "loss": val, "eval_tokens": eval_rows * T, "train_loss_curve": state["curve"],
        "wall_seconds": round(train_seconds, 3), "tokens_per_s": tok_s,
        "flops_per_s": tok_s * flops_per_token if tok_s else None,
        "mfu": tok_s * flops_per_token / peak if tok_s and peak else None, "peak_flops": peak,
        "first_step_seconds": state["first_step_seconds"], "micro_batch": micro,
        "micro_batch_history": history, "compile": compiled, "compile_error": compile_error,
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
    if dd.main and record_path:
        atomic_write_json(record_path, record)
        if ckpt_path and ckpt_path.exists():
            ckpt_path.unlink()  # the record is the durable result; the checkpoint is scratch
    dd.barrier()
    return record


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
