"""torchrun's processes (`Dist`): their collectives and the gradient average.

A run's dataset is prepared before its processes start (`looped data prepare`, or `looped sweep`
before its first run), so no rank waits on another's tokenizer inside a collective."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


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
