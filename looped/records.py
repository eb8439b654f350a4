"""Run records: one JSON file per finished (or failed) run, and the table a study's folder reads as.

A record is what `looped.train.train` writes; a folder of them is a study.  `iter_records` is
the one place record files are opened: `read_records` (the study table) and the fitter's
`looped.fit.load_runs` (through `flat_record`) both read through it.
`fcntl` (POSIX only) is imported where a running run's lock is probed.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pandas as pd


class RecordError(ValueError):
    """A folder that is not a folder of run records."""


COLUMNS = ["run_id", "study", "status", "budget", "r", "s", "injection", "bptt_k", "d_model", "n", "n_once",
           "n_rec", "flops_per_token", "tokens", "steps", "loss", "wall_seconds", "tokens_per_s", "mfu",
           "lr_scale", "seed", "batch_tokens", "data_order"]


def record_status(path: Path) -> str | None:
    """'ok' / 'diverged' / 'failed' for a readable record, 'corrupt' for an unreadable one."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text()).get("status", "corrupt")
    except (OSError, ValueError):
        return "corrupt"


def run_state(out: Path, run_id: str) -> str:
    """What a dry run shows for one run: its record's status, 'running' while another process
    holds its lock, else ''.  Looks without creating anything."""
    status = record_status(Path(out) / f"{run_id}.json")
    if status:
        return status
    lock = Path(out) / "ckpt" / f"{run_id}.lock"
    if not lock.exists():
        return ""
    import fcntl
    try:
        with open(lock) as handle:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return "running"
    except OSError:
        pass
    return ""


def iter_records(folder: str | Path, recursive: bool = False) -> Iterator[tuple[Path, object]]:
    """(path, parsed JSON) for every ``*.json`` file of a folder (and of its subfolders with
    ``recursive``), in sorted order; the JSON is None where the file cannot be read or parsed."""
    folder = Path(folder)
    for path in sorted(p for p in (folder.rglob if recursive else folder.glob)("*.json") if p.is_file()):
        try:
            yield path, json.loads(path.read_text())
        except (OSError, ValueError):   # unreadable, not UTF-8 or not JSON
            yield path, None


def flat_record(rec: dict) -> dict:
    """A record's scalar fields in one flat dict: the nested parts "config", "result", "results"
    and "metrics" lifted to the top level (top-level keys win), ``budget_flops`` read as
    ``budget`` and ``val_loss`` / ``final_val_loss`` as ``loss`` where those are absent."""
    flat = {}
    for sub in ("config", "result", "results", "metrics"):
        if isinstance(rec.get(sub), dict):
            flat.update({k: v for k, v in rec[sub].items() if not isinstance(v, (dict, list))})
    flat.update({k: v for k, v in rec.items() if not isinstance(v, (dict, list))})
    if "budget" not in flat and "budget_flops" in flat:
        flat["budget"] = flat["budget_flops"]
    if "loss" not in flat:
        for alt in ("val_loss", "final_val_loss"):
            if alt in flat:
                flat["loss"] = flat[alt]
                break
    return flat


def read_records(folder: str | Path) -> "pd.DataFrame":
    """All run records of a folder as one table (every status; unreadable files reported)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RecordError(f"{folder} is not a folder of run records")
    rows = []
    for path, rec in iter_records(folder):
        if rec is None:
            rows.append({"run_id": path.stem, "status": "corrupt"})
        elif isinstance(rec, dict) and "run_id" in rec:
            rows.append({c: rec.get(c) for c in COLUMNS})
    return pd.DataFrame(rows, columns=COLUMNS)
