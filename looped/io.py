"""Atomic writes: a reader (or a restarted sweep) sees the old file or the new one, never half of one."""
from __future__ import annotations

import dataclasses
import json
import math
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np


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
