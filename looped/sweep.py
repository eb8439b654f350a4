"""Named studies (grids as data) and a sweep runner that survives being killed.

A study is a list of (budget, r, s, injection, bptt_k) rows in a CSV: the paper's grids come
from runs/paper/grids.csv, ours from runs/cpu_grids.csv.  A sweep writes one JSON record per
run into its folder.  Restarting skips finished records (ok or diverged), resumes an
interrupted run from its checkpoint and retries failed ones; records and checkpoints are
written atomically, so a kill at any moment costs at most one checkpoint interval of one run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import accounting
from .config import REPO, ConfigError, get_preset, model_config, run_name

GRID_FILES = {"paper": REPO / "runs" / "paper" / "grids.csv", "cpu": REPO / "runs" / "cpu_grids.csv"}
# study name -> (grid file key, study column value, preset)
STUDIES = {
    "paper-main": ("paper", "main", "paper"),
    "paper-truncated": ("paper", "truncated_bptt", "paper"),
    "paper-hyper": ("paper", "hyperconnections", "paper"),
    "cpu-main": ("cpu", "main", "cpu"),
    "cpu-truncated": ("cpu", "truncated_bptt", "cpu"),
    "cpu-hyper": ("cpu", "hyperconnections", "cpu"),
    "cpu-smoke": ("cpu", "smoke", "cpu"),
}


class SweepError(RuntimeError):
    pass


@dataclass(frozen=True)
class Run:
    study: str
    preset: str
    budget: float
    r: int
    s: float
    injection: str
    lanes: int
    bptt_k: int | None

    def train_config(self, **kw):
        from .train import TrainConfig
        return TrainConfig(preset=self.preset, r=self.r, s=self.s, injection=self.injection, lanes=self.lanes,
                           bptt_k=self.bptt_k, budget=self.budget, study=self.study, **kw)

    def model_config(self):
        return model_config(self.preset, r=self.r, s=self.s, injection=self.injection, lanes=self.lanes,
                            bptt_k=self.bptt_k)

    @property
    def run_id(self) -> str:
        return run_name(self.model_config(), self.budget)


def parse_injection(name: str) -> tuple[str, int]:
    """Grid spelling -> (injection, lanes): 'hyperconnect_2lanes' -> ('hyperconnect', 2)."""
    if name.startswith("hyperconnect"):
        digits = "".join(ch for ch in name if ch.isdigit())
        return "hyperconnect", int(digits or 2)
    return name, 2


GRID_COLUMNS = ("study", "budget_flops", "r", "s", "injection", "bptt_k")


def load_study(name: str, grid: str | Path | None = None, preset: str = "cpu") -> list[Run]:
    """The runs of a named study; or, with `grid` (a CSV with GRID_COLUMNS), the rows of that
    file whose study column is `name`, trained with `preset`."""
    if grid is None:
        if name not in STUDIES:
            raise SweepError(f"unknown study {name!r}; choose from {', '.join(STUDIES)}")
        key, column_value, preset = STUDIES[name]
        grid = GRID_FILES[key]
    else:
        column_value = name
        get_preset(preset)  # ConfigError for an unknown preset
    try:
        table = pd.read_csv(grid)
    except (OSError, ValueError) as e:
        raise SweepError(f"cannot read grid {grid}: {e}") from None
    missing = [c for c in GRID_COLUMNS if c not in table.columns]
    if missing:
        raise SweepError(f"grid {grid} lacks column(s) {', '.join(missing)}")
    rows = table[table.study == column_value]
    if rows.empty:
        raise SweepError(f"grid {grid} has no rows with study {column_value!r}")
    runs = []
    for row in rows.itertuples():
        injection, lanes = parse_injection(row.injection)
        k = int(row.bptt_k)
        runs.append(Run(name, preset, float(row.budget_flops), int(row.r), float(row.s), injection, lanes,
                        None if k >= row.r else k))
    # Records are keyed by run_id (budget to 3 significant digits): two different rows with one
    # id would silently share a record, the second skipped as done.  This also validates every
    # row's architecture (ConfigError) before anything runs.
    seen: dict[str, Run] = {}
    for run in runs:
        other = seen.setdefault(run.run_id, run)
        if other != run:
            raise SweepError(f"grid rows {other} and {run} share the run id {run.run_id!r}")
    return runs


def record_status(path: Path) -> str | None:
    """'ok' / 'diverged' / 'failed' for a readable record, 'corrupt' for an unreadable one."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text()).get("status", "corrupt")
    except (OSError, ValueError):
        return "corrupt"


def plan(runs: list[Run], peak_flops: float, mfu: float, timing: tuple[float, float] | None = None) -> pd.DataFrame:
    """Every run's size, tokens and steps, and an estimate of its wall time.

    With `timing` = (seconds per step, seconds per FLOP) fitted to finished runs on this
    machine (see `time_model`) the estimate includes the per-step overhead that dominates
    small models; otherwise it assumes `mfu` of the measured matmul peak.
    """
    rows = []
    for run in runs:
        cfg = run.model_config()
        bt = get_preset(run.preset).batch_tokens
        s = accounting.summary(cfg, run.budget, bt)
        flops = s["flops_per_token"] * s["tokens"]
        est = timing[0] * s["steps"] + timing[1] * flops if timing else flops / (peak_flops * mfu)
        rows.append({"run_id": run.run_id, "budget": run.budget, "r": run.r, "s": run.s,
                     "injection": run.injection, "bptt_k": cfg.k_bwd, "d_model": cfg.d_model,
                     "n": s["n"], "n_once": s["n_once"], "n_rec": s["n_rec"],
                     "flops_per_token": s["flops_per_token"], "tokens": s["tokens"], "steps": s["steps"],
                     "est_seconds": est})
    return pd.DataFrame(rows)


def time_model(records: pd.DataFrame) -> tuple[float, float] | None:
    """Least-squares fit of wall seconds = a * steps + b * FLOPs over finished runs (a, b >= 0).

    Needs at least 4 finished runs; returns None otherwise (the caller falls back to the peak).
    """
    import numpy as np
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


def sweep(study: str, out: str | Path, shard: tuple[int, int] = (0, 1), checkpoint_every: int = 25,
          quiet: bool = True, log=print, grid: str | Path | None = None, preset: str = "cpu",
          budgets=None, sizes=None, **train_kw) -> pd.DataFrame:
    """Run what is not yet done; never stop the sweep for one bad run.

    `grid`/`preset` run an ad-hoc grid file instead of a named study (see load_study);
    `budgets`/`sizes` restrict the study to those budgets and widths s (None: all)."""
    from .train import train  # torch only when training
    out = Path(out)
    runs = [run for run in load_study(study, grid, preset)
            if (budgets is None or any(abs(run.budget / b - 1) < 1e-6 for b in budgets))
            and (sizes is None or run.s in sizes)]
    index, count = shard
    mine = [run for i, run in enumerate(runs) if i % count == index]
    for n, run in enumerate(mine, 1):
        path = out / f"{run.run_id}.json"
        status = record_status(path)
        if status in ("ok", "diverged"):
            stale = out / "ckpt" / f"{run.run_id}.pt"  # killed between writing the record and
            if stale.exists():                         # deleting its checkpoint
                stale.unlink(missing_ok=True)
            continue
        log(f"[{n}/{len(mine)}] {run.run_id}" + (" (retrying failed run)" if status else ""))
        t0 = time.time()
        tc = run.train_config(out=str(path), checkpoint_every=checkpoint_every, quiet=quiet,
                              overwrite=status in ("failed", "corrupt"), **train_kw)
        try:
            rec = train(tc)
            log(f"    {rec['status']}: loss {rec['loss']} in {time.time() - t0:.0f}s")
        except KeyboardInterrupt:
            raise
        except Exception as e:  # one broken run must not cost the sweep; say what broke
            from .train import Dist, atomic_write_json
            if Dist().main:
                    atomic_write_json(path, {"schema": 1, "study": study, "run_id": run.run_id, "status": "failed",
                                         "error": f"{type(e).__name__}: {e}", "r": run.r, "s": run.s,
                                         "budget": run.budget, "injection": run.injection})
            log(f"    failed: {type(e).__name__}: {e}")
    return read_records(out)


# ----------------------------------------------------------------------------- runs tables

COLUMNS = ["run_id", "study", "status", "budget", "r", "s", "injection", "bptt_k", "d_model", "n", "n_once",
           "n_rec", "flops_per_token", "tokens", "steps", "loss", "wall_seconds", "tokens_per_s", "mfu"]


def read_records(folder: str | Path) -> pd.DataFrame:
    """All run records of a folder as one table (every status; unreadable files reported)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SweepError(f"{folder} is not a folder of run records")
    rows = []
    for path in sorted(folder.glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            rows.append({"run_id": path.stem, "status": "corrupt"})
            continue
        if isinstance(rec, dict) and "run_id" in rec:
            rows.append({c: rec.get(c) for c in COLUMNS})
    return pd.DataFrame(rows, columns=COLUMNS)


def runs_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="looped runs", description="A study's runs table; --csv exports it for `looped fit`.")
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--csv", default=None, help="write the table (all folders together) to this CSV")
    a = ap.parse_args(argv)
    try:
        table = pd.concat([read_records(f) for f in a.folders], ignore_index=True)
    except SweepError as e:
        print(f"looped runs: error: {e}", file=sys.stderr)
        return 2
    with pd.option_context("display.max_rows", 500, "display.width", 200):
        print(table.drop(columns=["flops_per_token", "d_model"]).to_string(index=False, float_format="%.4g"))
    print(f"\n{len(table)} runs: " + ", ".join(f"{k} {v}" for k, v in table.status.value_counts().items()))
    if a.csv:
        table.to_csv(a.csv, index=False)
        print(f"wrote {a.csv}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="looped sweep", description="Run a named study resumably.",
        epilog="An ad-hoc grid: `looped sweep NAME --grid my.csv --preset tiny --out DIR` runs the rows of "
               "my.csv whose study column is NAME (columns: " + ",".join(GRID_COLUMNS) + "; bptt_k >= r "
               "means full backprop, injection none|linear|additive|passthrough|hyperconnect_Klanes).")
    ap.add_argument("study", help="a named study (" + ", ".join(STUDIES) + "), or the study column value "
                                  "of the --grid file")
    ap.add_argument("--grid", default=None, help="CSV of runs to use instead of the named studies' grids")
    ap.add_argument("--preset", default="cpu", help="model/data preset of the --grid runs (default cpu)")
    ap.add_argument("--out", default=None, help="folder of run records (default runs/STUDY)")
    ap.add_argument("--shard", default="0/1", help="i/n: run every n-th run starting at i")
    ap.add_argument("--dry-run", action="store_true", help="list the runs and estimate their wall time")
    ap.add_argument("--mfu", type=float, default=0.3, help="assumed MFU for --dry-run estimates")
    ap.add_argument("--timing-from", nargs="+", default=None, metavar="DIR",
                    help="--dry-run: fit the wall-time model to the finished runs in these folders "
                         "(default: the study's own folder; with fewer than 4, assume --mfu)")
    ap.add_argument("--checkpoint-every", type=int, default=25)
    ap.add_argument("--verbose", action="store_true", help="progress bar per run")
    a = ap.parse_args(argv)
    try:
        i, n = (int(x) for x in a.shard.split("/"))
        if not 0 <= i < n:
            raise ValueError
    except ValueError:
        print(f"looped sweep: error: --shard must be i/n with 0 <= i < n, got {a.shard!r}", file=sys.stderr)
        return 2
    out = Path(a.out or REPO / "runs" / a.study)
    try:
        runs = load_study(a.study, a.grid, a.preset)
        if a.dry_run:
            import torch
            from .train import matmul_peak
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            peak = matmul_peak(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
            sources = [Path(p) for p in (a.timing_from or [out])]
            finished = pd.concat([read_records(p) for p in sources if p.is_dir()] or [pd.DataFrame(columns=COLUMNS)])
            timing = time_model(finished)
            table = plan([r for k, r in enumerate(runs) if k % n == i], peak, a.mfu, timing)
            table["done"] = [record_status(out / f"{rid}.json") or "" for rid in table.run_id]
            with pd.option_context("display.max_rows", 1000, "display.width", 200):
                print(table.drop(columns=["n_once", "n_rec"]).to_string(index=False, float_format="%.4g"))
            todo = table[~table.done.isin(["ok", "diverged"])]
            basis = (f"{timing[0] * 1e3:.0f} ms/step + {timing[1] * 1e12:.1f} s/TFLOP fitted to {len(finished)} "
                     f"finished runs in {', '.join(map(str, sources))}" if timing else
                     f"{a.mfu:.0%} of the measured {peak / 1e9:.0f} GFLOP/s matmul peak ({device.type})")
            print(f"\n{len(table)} runs ({len(todo)} to do), {table.flops_per_token.mul(table.tokens).sum():.3g} FLOPs; "
                  f"estimated {todo.est_seconds.sum() / 3600:.2f} h left at {basis}")
            return 0
        table = sweep(a.study, out, (i, n), a.checkpoint_every, quiet=not a.verbose, grid=a.grid,
                      preset=a.preset)
    except (SweepError, ConfigError) as e:
        print(f"looped sweep: error: {e}", file=sys.stderr)
        return 2
    print(f"{a.study}: " + ", ".join(f"{k} {v}" for k, v in table.status.value_counts().items()))
    return 0
