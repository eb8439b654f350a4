"""Run records: one JSON file per finished (or failed) run, and the table a study's folder reads as.

A record is what `looped.train.train` writes; a folder of them is a study.  `read_records` is
the one reader: the fitter, the sweep and the cost estimates all go through it.
"""
from __future__ import annotations

import json
from pathlib import Path

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


def read_records(folder: str | Path) -> pd.DataFrame:
    """All run records of a folder as one table (every status; unreadable files reported)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RecordError(f"{folder} is not a folder of run records")
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
