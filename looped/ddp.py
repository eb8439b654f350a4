"""Distributed helpers that must not hit a collective timeout.

`prepare_once`: under torchrun, rank 0 builds (or opens) a preset's dataset while the other
ranks wait.  A plain `dist.barrier()` on the NCCL group would time out after the process
group's timeout (10 minutes by default) while rank 0 tokenizes for hours; here the ranks wait
on a separate gloo group created with a long timeout, and rank 0 tells them the outcome (the
path, or the error that stopped it), so a failed build fails every rank with its message
instead of leaving them to hang.
"""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

PREPARE_TIMEOUT_S = 12 * 3600  # a full FineWeb-Edu tokenization on one node fits easily


def prepare_once(preset, data_dir=None, timeout_s: float = PREPARE_TIMEOUT_S, prepare=None) -> Path:
    """`data.prepare(preset, data_dir)` on rank 0 only; every rank returns the dataset path.

    Without an initialised process group (one process) it is `data.prepare`.  The dataset
    folder must be visible to every rank (one node, or a shared file system); the other
    ranks check it (`data.prepare` finds the finished build and returns at once).
    `prepare` replaces data.prepare (tests)."""
    import torch.distributed as dist

    from . import data
    prepare = prepare or data.prepare
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return Path(prepare(preset, data_dir=data_dir))
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    try:
        message = [None]
        if dist.get_rank() == 0:
            try:
                message = [("ok", str(prepare(preset, data_dir=data_dir)))]
            except Exception as e:  # noqa: BLE001 - passed on to the waiting ranks, then re-raised
                message = [("error", f"{type(e).__name__}: {e}")]
                dist.broadcast_object_list(message, src=0, group=group)
                raise
        dist.broadcast_object_list(message, src=0, group=group)
    finally:
        dist.destroy_process_group(group)
    status, value = message[0]
    if status != "ok":
        raise data.DataError(f"rank 0 could not prepare the {preset} dataset: {value}")
    return Path(prepare(preset, data_dir=data_dir)) if dist.get_rank() else Path(value)
