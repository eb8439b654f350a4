"""A sweep runner that survives being killed, and its SLURM script (the dry run: `looped.studies.sweep.dry_run`).

A sweep runs a named study (`looped.studies.sweep.registry`) and writes one JSON record per run into
its folder.  Restarting skips finished records (ok or diverged), resumes an interrupted run from
its checkpoint and retries failed ones; records and checkpoints are written atomically, so a kill
at any moment costs at most one checkpoint interval of one run.  The training options it passes
on to every run are TrainConfig's (looped.options), flags and SLURM script alike.  The sweep
prepares each preset's dataset once, before the first run that trains on it (`looped.data.dataset.
prepare`: under torchrun every rank calls it, and a file lock lets one build it); the trainer
only reads it.
torch is imported only when a run trains or fails, so a dry run and a SLURM script need none.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from ... import memory
from ...config import REPO, ConfigError, DataError
from ...data import dataset
from ...io import atomic_write_json
from ...memory import GPU_SPECS
from ...options import TrainConfig, add_options, given_options, option_argv
from ...records import RecordError, read_records, record_status
from .cost import DEFAULT_GPU_MFU
from .dry_run import dry_run, slurm_lines
from .registry import GRID_COLUMNS, STUDIES, Run, SweepError, load_study, study_folder


def sweep(study: str, out: str | Path, shard: tuple[int, int] = (0, 1), checkpoint_every: int | None = None,
          quiet: bool = True, log=print, grid: str | Path | None = None, preset: str | None = None,
          budgets=None, sizes=None, runs: list[Run] | None = None, **train_kw) -> pd.DataFrame:
    """Run what is not yet done; never stop the sweep for one bad run.

    `runs` are the study's runs as the caller resolved them (study, grid and preset, once);
    without them `grid`/`preset` run an ad-hoc grid file instead of a named study (see
    load_study).  `budgets`/`sizes` restrict the study to those budgets and widths s (None: all);
    `checkpoint_every` and `train_kw` are TrainConfig options (None: the trainer's defaults)."""
    from ...train import train  # torch only when training
    out = Path(out)
    runs = [run for run in (runs if runs is not None else load_study(study, grid, preset))
            if (budgets is None or any(abs(run.budget / b - 1) < 1e-6 for b in budgets))
            and (sizes is None or run.s in sizes)]
    index, count = shard
    mine = [run for i, run in enumerate(runs) if i % count == index]
    prepared = set()  # (preset, data_dir) whose dataset this sweep has prepared

    def attempt(n: int, run: Run) -> bool:
        """Train `run` unless it is finished; False if another process holds it."""
        path = out / f"{run.run_id}.json"
        status = record_status(path)
        if status in ("ok", "diverged"):
            stale = out / "ckpt" / f"{run.run_id}.pt"  # killed between writing the record and
            if stale.exists():                         # deleting its checkpoint
                stale.unlink(missing_ok=True)
            return True
        claim = _claim(out, run.run_id)
        if claim is None:
            log(f"[{n}/{len(mine)}] {run.run_id}: skipped, another sweep is training it")
            return False
        status = record_status(path)  # again: the other sweep may have finished it meanwhile
        if status in ("ok", "diverged"):
            claim()
            return True
        log(f"[{n}/{len(mine)}] {run.run_id}" + (" (retrying failed run)" if status else ""))
        t0 = time.time()
        tc = run.train_config(out=str(path), checkpoint_every=checkpoint_every, quiet=quiet,
                              overwrite=status in ("failed", "corrupt"), **train_kw)
        try:
            if (tc.preset.name, tc.data_dir) not in prepared:  # the dataset: built once, before its first run
                dataset.prepare(tc.preset, data_dir=tc.data_dir)
                prepared.add((tc.preset.name, tc.data_dir))
            rec = train(tc)
            log(f"    {rec['status']}: loss {rec['loss']} in {time.time() - t0:.0f}s")
        except KeyboardInterrupt:
            raise
        except DataError as e:  # the dataset is every run's: stop once, record nothing
            reason = str(e).splitlines()[0]
            raise SweepError(f"{run.run_id}: no dataset for preset {run.preset.name}: {reason}") from None
        except Exception as e:  # one broken run must not cost the sweep; say what broke
            from ...dist import Dist  # torch only when a run has failed
            if Dist().main:
                atomic_write_json(path, {"schema": 1, "study": study, "run_id": run.run_id, "status": "failed",
                                         "error": f"{type(e).__name__}: {e}", "r": run.r, "s": run.s,
                                         "budget": run.budget, "injection": run.injection})
            log(f"    failed: {type(e).__name__}: {e}")
        finally:
            claim()
        return True

    busy = [(n, run) for n, run in enumerate(mine, 1) if not attempt(n, run)]
    for n, run in busy:  # once more: the process that held them may have finished or died since
        attempt(n, run)
    return read_records(out)


def _claim(out: Path, run_id: str):
    """An exclusive lock on one run, or None if another process holds it: two sweeps over one
    folder (a restart while the first still runs, a second process without --shard) never train
    the same run at once, and unsharded processes share a study's runs between them.  The lock
    dies with its process.  Under torchrun every rank trains the same run, so ranks do not lock."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return lambda: None
    folder = out / "ckpt"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{run_id}.lock"
    handle = open(path, "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None

    def release():  # whoever opens the name later re-checks the record under its own lock
        path.unlink(missing_ok=True)
        handle.close()
        try:
            folder.rmdir()  # only if empty: checkpoints of other runs stay
        except OSError:
            pass
    return release


def adopt_records(runs: list[Run], out: str | Path, sources) -> list[str]:
    """Copy finished records of identical runs from `sources` (folders, e.g. a pilot's) into
    `out` instead of training them again, so a study can grow out of the pilot that placed it.

    Identical means the same model config, budget, tokens per step, seed and effective LR
    multiplier; the copy names its origin in `copied_from` (so timing fits count it once) and a
    record already in `out` is never replaced.  Returns the adopted run ids."""
    out, adopted = Path(out), []
    for run in runs:
        if record_status(out / f"{run.run_id}.json") is not None:
            continue
        want = {"budget": run.budget, "batch_tokens": run.tokens_per_step, "seed": run.seed,
                "lr_scale": run.lr_scale if run.lr_scale is not None else run.preset.lr_scale}
        config = run.model_config().to_dict()
        for src in map(Path, sources):
            try:
                rec = json.loads((src / f"{run.run_id}.json").read_text())
            except (OSError, ValueError):
                continue
            same = (rec.get("status") == "ok" and all(rec.get(k) == v for k, v in want.items())
                    and all(rec.get("config", {}).get(k) == v for k, v in config.items()))
            if same:
                atomic_write_json(out / f"{run.run_id}.json",
                                  {**rec, "study": run.study, "copied_from": f"{src.name}/{run.run_id}.json"})
                adopted.append(run.run_id)
                break
    return adopted



def runs_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="looped runs",
                                 description="A study's runs table; --csv exports it for `looped fit`.")
    ap.add_argument("folders", nargs="+", help="folders of run records (e.g. runs/cpu-main); several are "
                                                "read as one table")
    ap.add_argument("--csv", default=None, help="write the table (all folders together) to this CSV")
    a = ap.parse_args(argv)
    try:
        table = pd.concat([read_records(f) for f in a.folders], ignore_index=True)
    except (SweepError, RecordError) as e:
        print(f"looped runs: error: {e}", file=sys.stderr)
        return 2
    with pd.option_context("display.max_rows", 500, "display.width", 200):
        print(table.drop(columns=["flops_per_token", "d_model"]).to_string(index=False, float_format="%.4g"))
    print(f"\n{len(table)} runs: " + ", ".join(f"{k} {v}" for k, v in table.status.value_counts().items()))
    if a.csv:
        table.to_csv(a.csv, index=False)
        print(f"wrote {a.csv}")
    return 0


def slurm_script(study: str, n_tasks: int, *, sweep_args: list[str] = (), gpus_per_task: int = 1,
                 time_limit: str = "24:00:00", partition: str | None = None, account: str | None = None,
                 cpus_per_gpu: int = 8, max_parallel: int | None = None, log_dir: str | Path = "slurm-logs",
                 python: str | None = None, repo: str | Path = REPO, extra_sbatch: list[str] = ()) -> str:
    """An sbatch job-array script: array task i runs `looped sweep STUDY --shard i/n_tasks`.

    Each task is one node-local job on `gpus_per_task` GPUs (torchrun data-parallel when more
    than one).  Shards are disjoint and every run writes its own record atomically, so tasks
    never collide, and resubmitting the same script resumes: finished records are skipped,
    interrupted runs continue from their checkpoints (`#SBATCH --requeue` lets SLURM do that
    after a preemption)."""
    if n_tasks < 1 or gpus_per_task < 1:
        raise SweepError("--slurm needs at least one task and one GPU per task")
    python = python or sys.executable
    array = f"0-{n_tasks - 1}" + (f"%{max_parallel}" if max_parallel else "")
    lines = ["#!/bin/bash", f"# looped sweep {study}: {n_tasks} array task(s), task i runs --shard i/{n_tasks}",
             f"#SBATCH --job-name=looped-{study}", f"#SBATCH --array={array}", "#SBATCH --nodes=1",
             "#SBATCH --ntasks=1", f"#SBATCH --gpus-per-task={gpus_per_task}",
             f"#SBATCH --cpus-per-task={cpus_per_gpu * gpus_per_task}", f"#SBATCH --time={time_limit}",
             f"#SBATCH --output={log_dir}/%x-%A_%a.out", "#SBATCH --requeue"]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    lines += [f"#SBATCH {x}" for x in extra_sbatch]
    args = " ".join(shlex.quote(a) for a in sweep_args)
    launcher = (f"{shlex.quote(python)} -m looped sweep" if gpus_per_task == 1 else
                f"{shlex.quote(python)} -m torch.distributed.run --standalone --nproc_per_node {gpus_per_task} "
                f"-m looped sweep")
    lines += ["set -euo pipefail", f"cd {shlex.quote(str(repo))}",
              f"mkdir -p {shlex.quote(str(log_dir))}",
              "export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}",
              "TASK=${SLURM_ARRAY_TASK_ID:?run this script with sbatch (or set SLURM_ARRAY_TASK_ID)}",
              f"echo \"looped sweep {study}: shard $TASK/{n_tasks} on $(hostname)\"",
              f"exec {launcher} {shlex.quote(study)} --shard \"$TASK/{n_tasks}\"" + (f" {args}" if args else ""),
              ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="looped sweep", description="Run a named study resumably.",
        epilog="An ad-hoc grid: `looped sweep NAME --grid my.csv --preset tiny --out DIR` runs the rows of "
               "my.csv whose study column is NAME (columns: " + ",".join(GRID_COLUMNS) + "; bptt_k >= r "
               "means full backprop, injection none|linear|additive|passthrough|hyperconnect_Klanes).  "
               "A SLURM cluster: `looped sweep paper-main --slurm 16` writes an sbatch job array whose task i "
               "runs --shard i/16 (add --submit to pass it to sbatch).")
    ap.add_argument("study", help="a named study (" + ", ".join(STUDIES) + "), or the study column value "
                                  "of the --grid file")
    ap.add_argument("--grid", default=None, help="CSV of runs to use instead of the named studies' grids")
    ap.add_argument("--preset", default=None, help="model/data preset of the --grid runs (default cpu; a named "
                                                   "study has its own)")
    ap.add_argument("--out", default=None, help="folder of run records (default runs/STUDY)")
    ap.add_argument("--shard", default="0/1", help="i/n: run every n-th run starting at i")
    ap.add_argument("--budgets", default=None, help="comma list: run only these budgets (e.g. 3e12,1e13)")
    ap.add_argument("--verbose", action="store_true", help="progress bar per run")
    ap.add_argument("--reuse", nargs="+", default=None, metavar="DIR",
                    help="first copy finished records of identical runs from these folders (e.g. the "
                         "pilot's) instead of training them again; the copies say where they came from")
    add_options(ap.add_argument_group("training (passed to every run, as `looped train` takes them)"),
                passthrough=True)
    d = ap.add_argument_group("--dry-run estimates")
    d.add_argument("--dry-run", action="store_true",
                   help="list the runs with size, micro-batch, predicted memory and a time estimate, what the "
                        "estimate leaves out, and whether each preset's dataset and tokenizer are here (with the "
                        "command that prepares them); writes nothing (with --slurm: shows the script)")
    d.add_argument("--mfu", type=float, default=None,
                   help=f"assumed MFU: of the GPU's spec peak (default {DEFAULT_GPU_MFU}) or, for CPU "
                        "presets, of the measured matmul peak (default 0.3)")
    d.add_argument("--gpu", default=None, choices=sorted(GPU_SPECS),
                   help="estimate for this GPU (default: the visible one, else H200 for the paper-architecture "
                        "studies; CPU presets without --gpu get the CPU estimate)")
    d.add_argument("--device-memory", type=float, default=None,
                   help="bytes per GPU for the automatic micro-batch (default: the visible GPU's free memory, "
                        "which the trainer picks it from; else --gpu's)")
    d.add_argument("--gpus", type=int, default=1, help="data-parallel GPUs per run (torchrun)")
    d.add_argument("--timing-from", nargs="+", default=None, metavar="DIR",
                   help="CPU estimate: fit the wall-time model to the finished runs in these folders "
                        "(default: the study's own folder; with fewer than 4, every fast-path run of the "
                        "same preset under runs/; with none, assume --mfu)")
    d.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                   help="CPU estimate: also give the wall time with the study split over this many "
                        "processes, one per core (default: this machine's cores)")
    sl = ap.add_argument_group("SLURM job array")
    sl.add_argument("--slurm", type=int, default=None, metavar="N",
                    help="write an sbatch job-array script of N tasks (task i runs --shard i/N) instead of running")
    sl.add_argument("--slurm-script", default=None, help="where to write it (default slurm/STUDY.sbatch)")
    sl.add_argument("--gpus-per-task", type=int, default=1, help="GPUs per array task (torchrun when > 1)")
    sl.add_argument("--time", dest="time_limit", default="24:00:00", help="#SBATCH --time of each task")
    sl.add_argument("--partition", default=None, help="#SBATCH --partition of each task (default: the cluster's)")
    sl.add_argument("--account", default=None, help="#SBATCH --account charged for each task (default: yours)")
    sl.add_argument("--max-parallel", type=int, default=None, help="at most this many tasks at once (%%K)")
    sl.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                    help="an extra #SBATCH line, e.g. --sbatch=--constraint=h100 (repeatable)")
    sl.add_argument("--submit", action="store_true", help="pass the script to sbatch")
    memory.prefer_expandable_segments()  # before torch is imported: CUDA's allocator reads it once
    a = ap.parse_args(argv)
    try:
        i, n = (int(x) for x in a.shard.split("/"))
        if not 0 <= i < n:
            raise ValueError
    except ValueError:
        print(f"looped sweep: error: --shard must be i/n with 0 <= i < n, got {a.shard!r}", file=sys.stderr)
        return 2
    try:
        budgets = [float(b) for b in a.budgets.split(",")] if a.budgets else None
    except ValueError:
        print(f"looped sweep: error: --budgets must be a comma list of numbers, got {a.budgets!r}", file=sys.stderr)
        return 2
    error = _estimate_error(a)
    if error:
        print(f"looped sweep: error: {error}", file=sys.stderr)
        return 2
    out = Path(a.out or study_folder(a.study))
    train_kw = given_options(a, passthrough=True)
    try:
        runs = load_study(a.study, a.grid, a.preset)  # the study, grid and preset, resolved once
        if budgets is not None:  # every mode (dry run, SLURM, reuse, sweep) sees the same subset
            known = sorted({r.budget for r in runs})
            runs = [r for r in runs if any(abs(r.budget / b - 1) < 1e-6 for b in budgets)]
            if not runs:
                raise SweepError(f"--budgets {a.budgets} matches no run of {a.study} (its budgets: "
                                 + ",".join(f"{b:g}" for b in known) + ")")
        # bad options fail here, once, not in every run (with the study's preset, which the error names)
        TrainConfig(**train_kw, **({"preset": runs[0].preset} if runs else {}))
        if a.slurm is not None:
            return _write_slurm(a, runs, out, train_kw)
        if a.dry_run:
            return dry_run(a, runs, out, i, n, train_kw.get("micro_batch"), train_kw)
        if a.reuse:
            missing = [d for d in a.reuse if not Path(d).is_dir()]
            if missing:
                raise SweepError(f"--reuse: {', '.join(missing)} is not a folder of run records")
            adopted = adopt_records(runs, out, a.reuse)
            print(f"{a.study}: adopted {len(adopted)} finished run(s) from {', '.join(a.reuse)}")
        table = sweep(a.study, out, (i, n), quiet=not a.verbose, runs=runs, budgets=budgets, **train_kw)
    except (SweepError, RecordError, ConfigError) as e:
        print(f"looped sweep: error: {e}", file=sys.stderr)
        return 2
    print(f"{a.study}: " + ", ".join(f"{k} {v}" for k, v in table.status.value_counts().items()))
    return 0


def _estimate_error(a) -> str | None:
    """Why the dry run's or the SLURM script's numbers cannot be used, or None: each is one line
    here, not a division by zero (or an impossible figure) later."""
    if a.mfu is not None and not (math.isfinite(a.mfu) and 0 < a.mfu <= 1):
        return f"--mfu must be a fraction of the peak in (0, 1], got {a.mfu:g}"
    if a.device_memory is not None and not (math.isfinite(a.device_memory) and a.device_memory > 0):
        return f"--device-memory must be a positive number of bytes, got {a.device_memory:g}"
    for flag, value in (("--gpus", a.gpus), ("--processes", a.processes), ("--slurm", a.slurm),
                        ("--gpus-per-task", a.gpus_per_task), ("--max-parallel", a.max_parallel)):
        if value is not None and value < 1:
            return f"{flag} must be >= 1, got {value}"
    return None


def _write_slurm(a, runs: list[Run], out: Path, train_kw: dict) -> int:
    args = ["--out", str(out.resolve())]
    if a.grid:
        args += ["--grid", str(Path(a.grid).resolve()), "--preset", runs[0].preset.name]
    args += option_argv(train_kw)
    if a.budgets:
        args += ["--budgets", a.budgets]
    if a.verbose:
        args.append("--verbose")
    path = Path(a.slurm_script or REPO / "slurm" / f"{a.study}.sbatch")
    text = slurm_script(a.study, a.slurm, sweep_args=args, gpus_per_task=a.gpus_per_task,
                        time_limit=a.time_limit, partition=a.partition, account=a.account,
                        max_parallel=a.max_parallel, log_dir=path.parent.resolve() / "logs",
                        extra_sbatch=a.sbatch)
    hours = slurm_lines(a, runs, out, a.slurm, train_kw.get("micro_batch"))
    if a.dry_run:   # show it, write nothing
        print(f"{text}\n(dry run: {path} not written, nothing submitted)")
        print("\n".join(hours))
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent.resolve() / "logs").mkdir(exist_ok=True)  # Slurm opens --output before the script runs
    path.write_text(text)
    path.chmod(0o755)
    print(f"wrote {path}: {a.slurm} array task(s), records in {out}")
    print("\n".join(hours))
    if not a.submit:
        print(f"submit with: sbatch {path}")
        return 0
    try:
        done = subprocess.run(["sbatch", str(path)], capture_output=True, text=True)
    except OSError as e:
        raise SweepError(f"cannot run sbatch ({e.strerror}); submit {path} on the cluster's login node") from None
    print(done.stdout.strip() or done.stderr.strip())
    return done.returncode
