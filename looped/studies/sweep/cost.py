"""How long a study takes: every run's size and steps, a wall-time model fitted to the runs a
machine has finished (CPU), and GPU-hours at an assumed MFU with the micro-batch that fits.

`looped sweep STUDY --dry-run` prints these; chapters use them for the cost of a study.

torch is imported only to read a GPU's free memory, so a dry run starts without it, and the
GPU estimate of a base install (no torch) assumes a GPU as one without a visible GPU does.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ... import accounting, memory
from ...config import REPO, repo_relative
from ...memory import gpu_spec
from ...records import COLUMNS, read_records, run_state, runs_table, study_columns
from .registry import SweepError

if TYPE_CHECKING:
    from .registry import Run


def plan(runs: list[Run], peak_flops: float, mfu: float, timing: tuple[float, float] | None = None) -> pd.DataFrame:
    """Every run's size, tokens and steps, and an estimate of its wall time.

    With `timing` = (seconds per step, seconds per FLOP) fitted to finished runs on this
    machine (see `time_model`) the estimate includes the per-step overhead that dominates
    small models; otherwise it assumes `mfu` of the measured matmul peak.
    """
    if not timing and (peak_flops <= 0 or mfu <= 0 or mfu > 1):  # (a NaN peak: no estimate, NaN hours)
        raise SweepError(f"an estimate needs a peak above 0 FLOP/s and an MFU in (0, 1], got {peak_flops:g} "
                         f"and {mfu:g}")
    rows = []
    for run in runs:
        cfg = run.model_config()
        s = accounting.summary(cfg, run.budget, run.tokens_per_step)
        flops = s["flops_per_token"] * s["tokens"]
        est = timing[0] * s["steps"] + timing[1] * flops if timing else flops / (peak_flops * mfu)
        rows.append({"run_id": run.run_id, "budget": run.budget, "r": run.r, "s": run.s,
                     "injection": run.injection, "bptt_k": cfg.k_bwd, "d_model": cfg.d_model,
                     "n": s["n"], "n_once": s["n_once"], "n_rec": s["n_rec"],
                     "flops_per_token": s["flops_per_token"], "tokens": s["tokens"], "steps": s["steps"],
                     "est_seconds": est})
    return pd.DataFrame(rows)


# Dense bf16 tensor-core peaks (vendor spec sheets, SXM parts unless named) and memory, for
# dry-run GPU-hour estimates: estimated hours = FLOPs / (peak x assumed MFU).  The MFU is an
# assumption (--mfu), not a measurement; `tools/gpu_check.py` measures it on a real device.
DEFAULT_GPU = "H200"   # assumed when no GPU is visible (the device this project checks on)
DEFAULT_GPU_MFU = 0.35


def detect_gpu() -> tuple[str, float, float] | None:
    """(name, spec peak, total memory) of the visible CUDA device; None without one (or without
    torch: a base install, `pip install looped`, sees no GPU)."""
    try:
        import torch  # deferred on purpose: torch only where a model runs
    except ModuleNotFoundError:
        return None
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    total = float(torch.cuda.get_device_properties(0).total_memory)
    spec = gpu_spec(name, total)
    return name, spec[1] if spec else float("nan"), total


def gpu_plan(runs: list[Run], peak_flops: float, mfu: float, device_memory: float, gpus: int = 1,
             micro_batch: int | None = None, dtype: str = "bf16") -> pd.DataFrame:
    """`plan` for GPUs: each run's micro-batch (automatic for `device_memory` per GPU unless
    given), its predicted peak memory (looped.memory) and estimated GPU-hours at `mfu` of
    `peak_flops`; `gpus` data-parallel processes share each step's rows."""
    if gpus < 1:
        raise SweepError(f"--gpus must be >= 1, got {gpus}")
    table = plan(runs, peak_flops, mfu)
    micro, mem = [], []
    for run in runs:
        cfg = run.model_config()
        rows = run.tokens_per_step // cfg.seq_len
        if rows % gpus:
            raise SweepError(f"{rows} rows per step do not split over {gpus} GPUs")
        m = micro_batch if micro_batch is not None else memory.auto_micro_batch(cfg, rows // gpus, device_memory, dtype)
        micro.append(m)
        mem.append(memory.predict_peak(cfg, m, dtype)["peak_bytes"] / 1e9)
    table["micro_batch"] = micro
    table["mem_GB"] = mem
    table["gpu_hours"] = table.est_seconds / 3600
    return table


def time_model(records: pd.DataFrame) -> tuple[float, float] | None:
    """Least-squares fit of wall seconds = a * steps + b * FLOPs over finished runs (a, b >= 0).

    Needs at least 4 finished runs; returns None otherwise (the caller falls back to the peak).
    """
    ok = records[(records.status == "ok") & records.wall_seconds.notna()]
    if len(ok) < 4:
        return None
    X = np.stack([ok.steps.astype(float), ok.flops_per_token.astype(float) * ok.tokens.astype(float)], 1)
    coef = np.linalg.lstsq(X, ok.wall_seconds.astype(float).to_numpy(), rcond=None)[0]
    if (coef < 0).any():  # one term explains it all: keep the better single-term fit
        single = [float(ok.wall_seconds @ X[:, j] / (X[:, j] @ X[:, j])) for j in (0, 1)]
        err = [np.sum((ok.wall_seconds - single[j] * X[:, j]) ** 2) for j in (0, 1)]
        coef = np.array([single[0], 0.0]) if err[0] <= err[1] else np.array([0.0, single[1]])
    return float(coef[0]), float(coef[1])


def fast_path_records(preset: str, runs_root: str | Path | None = None) -> pd.DataFrame:
    """Finished fast-path runs of `preset` in every study folder under runs/: the measured speed
    a new study's dry run is timed with before it has finished runs of its own (records copied
    from another study are skipped, so no run counts twice)."""
    rows = []
    for folder in sorted(p for p in Path(runs_root or REPO / "runs").glob("*") if p.is_dir()):
        t = runs_table(folder)
        col = lambda c: t[c] if c in t.columns else pd.Series(None, index=t.index, dtype=object)
        keep = (col("status").eq("ok") & col("preset").eq(preset) & col("compile").fillna(False).astype(bool)
                & col("copied_from").isna())
        rows += study_columns(t[keep]).to_dict("records")
    return pd.DataFrame(rows, columns=COLUMNS)


def cpu_estimate(runs: list[Run], out: str | Path, peak_flops: float, mfu: float = 0.3,
                 timing_from=None, processes: int = 1) -> dict:
    """How long the unfinished `runs` take on this CPU: wall seconds = a * steps + b * FLOPs,
    fitted to finished runs (`timing_from` folders; else the study's own folder once it has 4;
    else every fast-path run of the same preset under runs/), or `mfu` of `peak_flops` without
    any.  `hours_wall` is the longest of `processes` round-robin shards, as `--shard i/P` splits
    the study over one process per core."""
    out = Path(out)
    if timing_from:
        sources = [Path(p) for p in timing_from]
        finished = pd.concat([read_records(p) for p in sources if p.is_dir()] or [pd.DataFrame(columns=COLUMNS)])
        where = ", ".join(map(repo_relative, sources))
    else:
        finished = read_records(out) if out.is_dir() else pd.DataFrame(columns=COLUMNS)
        where = repo_relative(out)
        if time_model(finished) is None and runs:
            finished = fast_path_records(runs[0].preset.name)
            where = f"the {runs[0].preset.name} preset's fast-path runs under runs/"
    timing = time_model(finished)
    table = plan(runs, peak_flops, mfu, timing)
    table["done"] = [run_state(out, rid) for rid in table.run_id]
    left = table.est_seconds.where(~table.done.isin(["ok", "diverged"]), 0.0)
    shards = [left.iloc[k::processes].sum() for k in range(max(1, processes))]
    whole = [table.est_seconds.iloc[k::processes].sum() for k in range(max(1, processes))]
    basis = (f"{timing[0] * 1e3:.0f} ms/step + {timing[1] * 1e12:.1f} s/TFLOP fitted to {len(finished)} "
             f"finished runs ({where})" if timing else
             f"{mfu:.0%} of the measured {peak_flops / 1e9:.0f} GFLOP/s matmul peak")
    return {"table": table, "todo": int((left > 0).sum()), "hours": float(left.sum()) / 3600,
            "hours_wall": max(shards) / 3600, "hours_wall_all": max(whole) / 3600, "basis": basis, "timing": timing,
            "flops": float(table.flops_per_token.astype(float).mul(table.tokens.astype(float)).sum())}
