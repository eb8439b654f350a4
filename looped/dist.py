"""torchrun's processes (`Dist`: their collectives, the gradient average) and the one wait that
must not hit a collective timeout.

`prepare_once`: under torchrun, rank 0 builds (or opens) a preset's dataset while the other
ranks wait.  A plain `dist.barrier()` on the NCCL group would time out after the process
group's timeout (10 minutes by default) while rank 0 tokenizes for hours; here the ranks wait
on a separate gloo group created with a long timeout, and rank 0 tells them the outcome (the
path, or the error that stopped it), so a failed build fails every rank with its message
instead of leaving them to hang.
"""
from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .data import dataset

PREPARE_TIMEOUT_S = 12 * 3600  # a full FineWeb-Edu tokenization on one node fits easily


def prepare_once(preset, data_dir=None, timeout_s: float = PREPARE_TIMEOUT_S, prepare=None) -> Path:
    """`dataset.prepare(preset, data_dir)` on rank 0 only; every rank returns the dataset path.

    Without an initialised process group (one process) it is `dataset.prepare`.  The dataset
    folder must be visible to every rank (one node, or a shared file system); the other
    ranks check it (`dataset.prepare` finds the finished build and returns at once).
    `prepare` replaces dataset.prepare (tests)."""
    prepare = prepare or dataset.prepare
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
        raise dataset.DataError(f"rank 0 could not prepare the {preset} dataset: {value}")
    return Path(prepare(preset, data_dir=data_dir)) if dist.get_rank() else Path(value)


class Dist:
    """torchrun's environment, or a single process."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            self.device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def mean(self, x: float) -> float:
        if self.world == 1:
            return x
        t = torch.tensor([x], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.item() / self.world

    def min(self, x: int) -> int:
        if self.world == 1:
            return x
        t = torch.tensor([x], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def barrier(self):
        if self.world > 1:
            dist.barrier()

    def broadcast_params(self, module: torch.nn.Module):
        """Rank 0's parameters on every rank (equal seeds give equal ones; this makes sure)."""
        if self.world > 1:
            for p in module.parameters():
                dist.broadcast(p.data, src=0)

    def average_grads(self, params, bucket_elems: int = 1 << 25):
        """Average the ranks' gradients, one all-reduce per flat bucket of at most `bucket_elems`.

        The trainer calls it once per step, after the ranks have agreed that every one of them
        finished its backward: DDP's all-reduce inside the backward would leave a rank that ran out
        of memory mid-step with unmatched collectives (a gloo error, an NCCL hang).  The price is
        the overlap of that all-reduce with the backward."""
        if self.world == 1:
            return
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
        grads, bucket, size = [p.grad for p in params if p.grad is not None], [], 0
        for i, g in enumerate(grads):
            bucket.append(g)
            size += g.numel()
            if size >= bucket_elems or i == len(grads) - 1:
                flat = _flatten_dense_tensors(bucket)
                dist.all_reduce(flat)
                flat /= self.world
                for g_, r in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                    g_.copy_(r)
                bucket, size = [], 0
