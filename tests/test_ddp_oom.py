"""Out of memory on one rank under torchrun, through the real trainer on two gloo ranks (CPU,
tiny preset): in the forward of a step's first micro-batch and mid-backward of its last one.
The ranks agree on the halving before any gradient is averaged, so the run ends ok at the loss
of an out-of-memory-free run; with DDP's in-backward all-reduce the backward case mismatched
collectives and the forward case trained on the wrong rows."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent("""
    import json, sys
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    sys.path.insert(0, {repo!r})
    from looped import train as trainer
    from looped.data import dataset
    from looped.model import LoopedGPT
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))  # a mismatch fails, never hangs
    rank = dist.get_rank()
    trainer.first_micro_batch = lambda cfg, rows, device: 2  # as a GPU's free memory would give
    reads, rows = [], dataset.Dataset.rows
    def logged_rows(self, split, start, n):
        if split == "train":
            reads.append([start, n])
        return rows(self, split, start, n)
    dataset.Dataset.rows = logged_rows

    class OutOfMemoryInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)
        @staticmethod
        def backward(ctx, g):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated, backward)")

    forward, calls = LoopedGPT.forward, []
    def oom_on_rank0(self, idx, targets=None):
        if targets is None or not self.training:
            return forward(self, idx, targets)
        calls.append(idx.shape[0])
        # step 1 at 2 rows is calls 3 (first micro-batch) and 4 (last, the one DDP synced)
        if rank == 0 and MODE == "forward" and len(calls) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated, forward)")
        if rank == 0 and MODE == "backward" and len(calls) == 4:  # the embedding's grad comes last
            h = self.wte.register_forward_hook(lambda m, i, o: OutOfMemoryInBackward.apply(o))
            try:
                return forward(self, idx, targets)
            finally:
                h.remove()
        return forward(self, idx, targets)
    LoopedGPT.forward = oom_on_rank0

    for label in ("none", "forward", "backward", "given"):
        calls.clear(); reads.clear()
        MODE = "forward" if label == "given" else label
        tc = trainer.TrainConfig(preset="tiny", r=2, s=1, steps=4, compile=False, quiet=True, log_every=1,
                                 data_dir={data_dir!r}, micro_batch=2 if label == "given" else None)
        if label == "given":
            try:
                trainer.train(tc)
                out = {{"status": "no error"}}
            except trainer.TrainError as e:
                out = {{"status": "error", "error": str(e)}}
        else:
            rec = trainer.train(tc)
            out = {{k: rec[k] for k in ("status", "loss", "train_loss_curve", "micro_batch_history")}}
        print("RESULT", json.dumps({{"mode": label, "rank": rank, "reads": list(reads), **out}}), flush=True)
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    from looped.data import dataset
    data_dir = tmp_path_factory.mktemp("data")
    dataset.prepare("tiny", data_dir=data_dir)
    script = tmp_path_factory.mktemp("worker") / "worker.py"
    script.write_text(WORKER.format(repo=str(REPO), data_dir=str(data_dir)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2",
                                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                              "OMP_NUM_THREADS": "1"})
             for rank in (0, 1)]
    try:
        outs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    results = {}
    for out in outs:
        for line in out.splitlines():
            if line.startswith("RESULT "):
                r = json.loads(line[7:])
                results[r["mode"], r["rank"]] = r
    return results, outs


@pytest.mark.timeout(200)
def test_ranks_read_contiguous_slices(two_ranks):
    results, outs = two_ranks
    ref = [results.get(("none", rank)) for rank in (0, 1)]
    assert all(ref), outs
    # 8 rows a step, 4 per rank, micro-batches of 2: rank 0 reads rows 0-3, rank 1 rows 4-7
    assert ref[0]["reads"][:2] == [[0, 2], [2, 2]] and ref[1]["reads"][:2] == [[4, 2], [6, 2]]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["forward", "backward"])
def test_one_rank_out_of_memory_halves_every_rank(two_ranks, mode):
    results, outs = two_ranks
    ref, got = results.get(("none", 0)), [results.get((mode, rank)) for rank in (0, 1)]
    assert ref and all(got), outs[0][-3000:]
    assert ref["micro_batch_history"] == [[0, 2]]
    for rec in got:
        assert rec["status"] == "ok" and rec["micro_batch_history"] == [[0, 2], [1, 1]], rec
        assert rec["loss"] == pytest.approx(ref["loss"], abs=1e-5)
        for (step, a), (_, b) in zip(rec["train_loss_curve"], ref["train_loss_curve"], strict=True):
            assert a == pytest.approx(b, abs=1e-5), step
    # after the halving each rank reads its own 4 rows of a step, one at a time (step 3: rows 24-31)
    assert [rec["reads"][-4:] for rec in got] == [[[24 + 4 * rank + i, 1] for i in range(4)] for rank in (0, 1)]


@pytest.mark.timeout(200)
def test_out_of_memory_at_a_given_micro_batch_stops_every_rank(two_ranks):
    results, outs = two_ranks
    errs = [r for r in (results.get(("given", rank)) for rank in (0, 1)) if r]
    assert len(errs) == 2, outs
    for e in errs:  # a micro-batch the user chose is theirs to change: every rank stops, saying so
        assert e["status"] == "error" and "1 of 2 ranks ran out of memory at step 1" in e["error"], e
