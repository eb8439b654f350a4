"""The machine a run runs on: where the code came from (git commit, versions), the device (its
name, its peak FLOP/s, its free and peak memory, the micro-batch that fits it) and the fast path
(the model compiled by inductor, and what a failed compile raises), and `StepGuard`, the trainer's
recovery from out-of-memory and failed compiles, agreed across ranks.  `looped.train` reads all of
it; the benchmark and the GPU check call it directly."""
from __future__ import annotations

import gc
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy
import torch
import torch.distributed

from . import __version__, memory
from .config import CHECKOUT
from .options import TrainError

# ----------------------------------------------------------------------------- provenance

def git_commit() -> str | None:
    """The commit (with "-dirty" for uncommitted changes) of the checkout the package runs from;
    None for an installed package (its version is in `versions()`): never the commit of whatever
    repository the current folder happens to be in."""
    if CHECKOUT is None:
        return None
    try:
        top, _, sha = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=CHECKOUT,
                                     capture_output=True, text=True, timeout=5).stdout.strip().partition("\n")
        if not top or Path(top).resolve() != CHECKOUT.resolve():  # a tree without .git inside another repository
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=CHECKOUT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
            "looped": __version__}


# ----------------------------------------------------------------------------- the device

def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def matmul_peak(device: torch.device, dtype=torch.float32, n: int = 1024, seconds: float = 0.5) -> float:
    """FLOP/s of a large square matmul: the denominator of MFU, measured on this machine."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(4):
            a @ b
        reps += 4
        sync()
    return 2 * n ** 3 * reps / (time.perf_counter() - t0)


# Dense bf16 tensor-core peaks (vendor spec sheets, SXM parts): a measured GEMM on these
# parts lands at 65-80% of them, and MFU conventionally divides by the spec.
def device_peak_flops(device: torch.device) -> float:
    """The MFU denominator: the spec bf16 peak of a known GPU, else a measured large matmul.

    On the CPU the measurement (fp32, 1024^3, in this process and thread setting) is the
    honest ceiling for our small models; on an unknown GPU an 8192^3 bf16 GEMM is large enough
    to fill the device.
    """
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        spec = memory.gpu_spec(torch.cuda.get_device_name(device), total)
        if spec:
            return spec[1]
        return matmul_peak(device, torch.bfloat16, n=8192)
    return matmul_peak(device, torch.float32)


def first_micro_batch(cfg, rows_per_process: int, device: torch.device) -> int:
    """A run's micro-batch when none is given: where the device reports its free memory (CUDA),
    looped.memory's choice for it -- the call, and so the number, `looped sweep --dry-run`
    prints -- else (the CPU) the process's whole share of the step."""
    free = memory.device_free_bytes(device)
    if free is None:
        return rows_per_process
    return memory.auto_micro_batch(cfg, rows_per_process, free, "bf16" if device.type == "cuda" else "fp32")


def fresh_device_memory(device: torch.device):
    """Start a run with the device's memory as a new process would see it: the blocks earlier
    runs of a sweep left cached (counted as used by the free memory the micro-batch is chosen
    from) returned, and the peak counter reset, so no run inherits another's peak."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    """Peak memory and its scope: this run's allocated CUDA memory ('run'), or on the CPU the
    process's peak resident size ('process'): ru_maxrss cannot be reset, so in a sweep it is the
    largest run so far, not this run's own."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "run"
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "process"  # Linux: KiB


# ----------------------------------------------------------------------------- the fast path

def fast_model(model: torch.nn.Module) -> torch.nn.Module:
    """The fast path's model: the fused loss tail (`model.softcap_cross_entropy`), and forward
    and backward compiled by inductor, on the CPU as on CUDA.

    The r recurrences, truncated BPTT (grad mode toggled inside the graph) and the
    hyperconnection lanes trace into one graph with no breaks, so the loop is unrolled and the
    elementwise work around every matmul (norms, rotary, ReLU^2, softcap, log-softmax) fuses.
    Shapes are static (one run trains one shape); a fresh dynamo state per call keeps a long
    sweep from reaching dynamo's recompile limit, which would silently drop later runs to eager.
    Compiled code is still reused across runs of one shape through inductor's on-disk caches.
    """
    torch._dynamo.reset()
    model.fused_loss = True
    return torch.compile(model, dynamic=False)


def compile_errors() -> tuple[type, ...]:
    """What a failed torch.compile raises: dynamo's errors (inductor's wrapped in them at the
    first call) and inductor's own (raised bare by a compile outside dynamo, e.g. the backward)."""
    import torch._dynamo.exc  # deferred on purpose: dynamo adds ~2 s to importing torch, and only
    import torch._inductor.exc  # a compiled run needs it
    own = (v for v in vars(torch._inductor.exc).values() if isinstance(v, type) and issubclass(v, Exception))
    return (torch._dynamo.exc.TorchDynamoException, *own)


def short_reason(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:200]


# ----------------------------------------------------------------------------- one step, recovered

class StepGuard:
    """One optimizer step, retried until every rank got through it: the trainer's recovery policy.

    `guard.step(work)` calls ``work(micro, loss_sum)`` (forward and backward over this rank's rows
    in micro-batches of `micro`, adding the loss to the device scalar `loss_sum`).  Two failures are
    recovered from, and the ranks agree on both before any gradient moves (one all-reduce, so an
    out-of-memory or a failed compile on one rank is every rank's):

    - out of memory: the micro-batch halves and the step starts again (`history` gets [step, micro]);
      a micro-batch the user chose (`chosen`), or one already 1, is not halved: TrainError (alone,
      the bare OutOfMemoryError);
    - a failed torch.compile (`compile_errors`) while `compiled`: `to_eager()` switches the run to
      the eager reference step, the reason is kept in `compile_error`, and the step starts again.

    `also` are callables whose numbers are summed over the ranks in the same all-reduce (the
    trainer's checkpoint clock: any rank's clock makes a checkpoint due).  Returns (the step's mean
    loss over the ranks, the summed `also` values, whether the step was retried)."""

    def __init__(self, dd, micro: int, history: list, *, chosen: bool, compiled: bool, to_eager, zero_grad):
        self.dd, self.micro, self.history, self.chosen = dd, micro, history, chosen
        self.compiled, self.compile_error = compiled, None
        self.to_eager, self.zero_grad = to_eager, zero_grad
        self.cannot_compile = compile_errors() if compiled else ()

    def step(self, step: int, work, also=()) -> tuple[float, list[float], bool]:
        dd, retried = self.dd, False
        while True:
            loss_sum, failure, oom = torch.zeros((), device=dd.device), None, False
            try:
                work(self.micro, loss_sum)
            except torch.OutOfMemoryError:
                if dd.world == 1 and (self.chosen or self.micro == 1):  # a chosen micro-batch is the user's to change
                    raise
                oom = True
            except self.cannot_compile as e:
                if not self.compiled:
                    raise
                failure = short_reason(e)
            votes = torch.stack([loss_sum, *(torch.full((), float(v), device=dd.device)
                                             for v in (*(f() for f in also), oom, failure is not None))])
            if dd.world > 1:
                torch.distributed.all_reduce(votes)
                votes[0] /= dd.world
            loss, *summed, n_oom, n_failed = votes.tolist()
            if not n_oom and not n_failed:
                return loss, summed, retried
            # here, out of the handler, the traceback and the activations its frames held are gone
            retried = True
            self.zero_grad()  # the partial step's gradients: redo it from its start
            if n_failed:  # inductor cannot compile on this machine: the eager reference step, as --no-compile
                self.compiled, self.compile_error = False, failure or "on another rank"
                self.to_eager()
                if dd.main:
                    print(f"looped train: warning: torch.compile failed, training eager ({self.compile_error})",
                          file=sys.stderr)
            else:  # the memory model is an estimate, and optimizer state comes at step 1
                if self.chosen or self.micro == 1:
                    raise TrainError(f"{int(n_oom)} of {dd.world} ranks ran out of memory at step {step} with "
                                     f"micro-batch {self.micro}" + (": lower --micro-batch" if self.chosen else ""))
                self.micro //= 2
                self.history.append([step, self.micro])
                fresh_device_memory(dd.device)
