"""Atomic writes: a reader (or a restarted sweep) sees the old file or the new one, never half of one;
and an exclusive lock, so that concurrent processes do a job (build a dataset) once."""
from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np


@contextmanager
def exclusive_lock(path):
    """An exclusive advisory lock on the file `path` (created) for the block: a second process
    waits here until the first has finished."""
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def atomic_open(path):
    """A binary file that replaces `path` only once the block finishes (written, flushed, fsynced)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path, payload: bytes):
    with atomic_open(path) as f:
        f.write(payload)


def atomic_write_json(path, obj, **dump_kw):
    atomic_write_bytes(path, (json.dumps(obj, **{"indent": 1, **dump_kw}) + "\n").encode())


def json_ready(x):
    """Numbers as JSON can hold them: tables (anything with ``to_dict``) as lists of records,
    dataclasses as dicts, numpy scalars and arrays as Python, NaN and infinities as null."""

    if hasattr(x, "to_dict") and hasattr(x, "columns"):
        return json_ready(x.to_dict(orient="records"))
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return json_ready(dataclasses.asdict(x))
    if isinstance(x, dict):
        return {str(k): json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [json_ready(v) for v in x]
    if isinstance(x, (np.integer, np.bool_)):
        return x.item()
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x



def json_table(rows):
    """A table that `json_ready` wrote, read back as a DataFrame: a column of numbers whose missing
    values JSON holds as null is float again (NaN, not None), so comparisons on it do not raise."""
    import pandas as pd  # here, not at the top: the trainer imports io and needs no pandas

    df = pd.DataFrame(rows)
    for c in df.select_dtypes(include="object").columns:
        values = df[c].dropna()
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            df[c] = df[c].astype(float)
    return df


def json_numbers(d: dict) -> dict:
    """A dict of numbers that `json_ready` wrote (a summary), read back with each null as NaN again: a
    number that could not be measured (a pure error without replicates) compares False, never raises."""
    return {k: json_numbers(v) if isinstance(v, dict) else math.nan if v is None else v for k, v in d.items()}

# ------------------------------------------------------------- the `--json [PATH|-]` convention

def add_json_option(ap, what: str) -> None:
    """The one `--json` option every command that writes JSON takes: `--json PATH` writes a file,
    `--json -` or a bare `--json` prints it on stdout (which then holds the JSON alone; a readable
    table, if the command prints one, goes to stderr)."""
    ap.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                    help=f"write {what} as JSON to PATH; with '-' or no PATH, print it on stdout instead of the "
                         "readable output (which goes to stderr)")


def destination_error(path, option: str) -> str | None:
    """Why `path` cannot be written (for a one-line error before any long work), or None.
    '-' (stdout) is always fine; a missing folder is refused, not created."""
    if path is None or str(path) == "-":
        return None
    path = Path(path)
    if path.is_dir():
        return f"{option} {path}: is a folder, not a file"
    if not path.parent.is_dir():
        return f"{option} {path}: folder {path.parent} does not exist"
    if not os.access(path.parent, os.W_OK):
        return f"{option} {path}: folder {path.parent} is not writable"
    return None


def write_json(dest, obj) -> None:
    """`obj` (through json_ready) to stdout for '-' (one line, as `looped train` prints its record),
    else atomically to the file `dest`."""
    if str(dest) == "-":
        sys.stdout.write(json.dumps(json_ready(obj)) + "\n")
    else:
        atomic_write_json(dest, json_ready(obj))
