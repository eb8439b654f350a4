"""Peak memory of one training step, predicted from the architecture; the automatic micro-batch.

A step holds, at its peak (the backward of its last micro-batch, when the gradients of the
earlier micro-batches and the optimizer state are already allocated)::

    static  = parameters (fp32, 4 B) + gradients (fp32, 4 B) + optimizer state
              (MuonH: one fp32 momentum per matrix; AdamW: two fp32 moments per tensor)
    cache   = the bf16 copies that autocast keeps of every weight it casts (2 B per matrix
              weight, the LM head included; none without autocast)
    rows    = micro_batch x T x (bytes per token of saved activations and backward transients)

The bytes per token are a sum of named terms (`Coefficients`) calibrated against a FakeTensor +
MemTracker measurement of the live model's forward and backward on the CPU under bf16
autocast.  CPU and CUDA autocast cast different op lists (CUDA runs pow, exp, log, rsqrt... in
fp32); `measure_peak(policy="cuda")` corrects the CPU policy op by op to CUDA's, probed on fake
CUDA tensors, and for this model the two measurements agree (every op that meets a bf16 input
casts alike: the MLP squares with a mul, not pow), so the coefficients hold for CUDA too::

    head  HEAD_BYTES_PER_LOGIT x padded vocab      (the fp32 softcap / cross-entropy tail)
    block block x d per block application with gradient, no_grad_block x d without
    inject per differentiated recurrence (linear / additive / hyperconnect lanes)
    base  embedding, final norm and the other once-per-token tensors

`measure_peak` runs that measurement (no real memory is allocated) and `calibrate` refits the
coefficients from it, so a model change (a fused or chunked logits tail, a fused QKV) is one
`python -m looped.memory --calibrate` away from a new prediction; the tests compare prediction
and measurement on the live model.  The measurement is eager: torch.compile usually needs less
(fused elementwise chains save fewer tensors), so on a GPU the prediction is an upper bound.
torch is imported inside the functions that measure, so a dry run's prediction needs no torch.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import nnls

from . import accounting
from .config import ModelConfig, model_config

GB, MiB = 1e9, 2 ** 20

# The one GPU table: vendor dense bf16 tensor-core peak (no sparsity) and memory per device in
# the bytes the device reports (torch.cuda.get_device_properties(0).total_memory), which the
# trainer's micro-batch comes from: recorded on an H200 (143,771 MiB = 150.8e9 B, sold as 141 GB)
# and an H100 SXM (81,559 MiB = 85.5e9 B, sold as 80 GB).  The other parts are not recorded yet
# and keep the vendor's decimal GB, which understates what a device reports.
GPU_SPECS = {  # name -> (peak FLOP/s, memory bytes)
    "H200": (989e12, 143_771 * MiB),
    "GH200": (989e12, 96e9),
    "H100": (989e12, 81_559 * MiB),
    "H100-PCIe": (756e12, 80e9),
    "A100": (312e12, 80e9),
    "A100-40GB": (312e12, 40e9),
    "L40S": (362e12, 48e9),
}


def gpu_spec(device_name: str, total_memory: float | None = None) -> tuple[str, float, float] | None:
    """(table key, peak FLOP/s, memory) of the GPU whose CUDA name is `device_name`, or None.
    The longest matching key wins (GH200 before H200); an A100 under 60 GB is the 40 GB one."""
    for key in sorted(GPU_SPECS, key=len, reverse=True):
        if key.split("-")[0] not in device_name:
            continue
        if key == "A100-40GB" and (total_memory is None or total_memory >= 60e9):
            continue
        if key == "H100-PCIe" and "PCIe" not in device_name:
            continue
        return (key, *GPU_SPECS[key])
    return None


@dataclass(frozen=True)
class Coefficients:
    """Bytes per token of one micro-batch row (see the module docstring for each term)."""
    head: float            # per padded-vocabulary column: the logits tail
    block: float           # per d, per block application that is differentiated
    no_grad_block: float   # per d, per block application outside the truncation window
    inject_linear: float   # per d, per differentiated recurrence with linear injection
    inject_additive: float  # per d, per differentiated recurrence, additive / passthrough
    inject_hyper: float    # per d per lane, per recurrence with hyperconnections
    base: float            # per d, once per token (embedding, norms, final block input)


# Calibrated by `python -m looped.memory --calibrate` (paper preset, T = 256, eager, torch
# 2.13 CPU) against FakeTensor + MemTracker: every calibration config within 4% (bf16) or 7%
# (fp32) per row and 1.2% in total.  The cost is linear in T (attention saves O(T) per row).
# HEAD_BYTES_PER_LOGIT is the term a fused or chunked logits tail changes: update it (or rerun
# the calibration) when the tail changes; tests/test_gpu_path.py compares the prediction with
# the live model's measurement.
HEAD_BYTES_PER_LOGIT = {"bf16": 16.0, "fp32": 16.3}
COEFFICIENTS = {
    "bf16": Coefficients(head=HEAD_BYTES_PER_LOGIT["bf16"], block=57.5, no_grad_block=1.2,
                         inject_linear=19.6, inject_additive=15.6, inject_hyper=13.8, base=0.0),
    "fp32": Coefficients(head=HEAD_BYTES_PER_LOGIT["fp32"], block=81.0, no_grad_block=0.9,
                         inject_linear=32.0, inject_additive=24.0, inject_hyper=17.5, base=0.0),
}

SAFETY = 0.85          # the fraction of free memory a predicted step may use
RESERVE_BYTES = 1.5e9  # CUDA context, cuBLAS/cuDNN workspaces, allocator fragmentation


def _dtype_key(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    if name in ("bf16", "bfloat16", "float16", "fp16", "half"):
        return "bf16"
    if name in ("fp32", "float32", "float"):
        return "fp32"
    raise ValueError(f"unknown training dtype {dtype!r}; use 'bf16' or 'fp32'")


def param_counts(cfg: ModelConfig) -> dict:
    """Parameter counts by optimizer: MuonH matrices, AdamW tensors (embedding, head, norms,
    hyperconnection mixing).  Matches `optim.build_optimizers`."""
    d, v = cfg.d_model, cfg.padded_vocab
    blocks = cfg.n_prelude + cfg.n_coda + cfg.n_loop_layers
    matrices = blocks * 12 * d * d + (2 * d * d if cfg.injection == "linear" else 0)
    adam = 2 * v * d + blocks * 2 * d + 3 * d
    if cfg.injection == "hyperconnect":
        adam += accounting.injection_params(cfg)
    return {"muon": matrices, "adam": adam, "total": matrices + adam}


def static_bytes(cfg: ModelConfig) -> int:
    """Parameters + gradients + optimizer state, all fp32."""
    c = param_counts(cfg)
    return 4 * c["total"] + 4 * c["total"] + 4 * c["muon"] + 8 * c["adam"]


def autocast_cache_bytes(cfg: ModelConfig, dtype="bf16") -> int:
    """bf16 weight copies autocast keeps for the step (the matrices and the LM head)."""
    if _dtype_key(dtype) == "fp32":
        return 0
    return 2 * (param_counts(cfg)["muon"] + cfg.padded_vocab * cfg.d_model)


def row_bytes(cfg: ModelConfig, dtype="bf16", coef: Coefficients | None = None) -> float:
    """Activation bytes of one micro-batch row of seq_len tokens (eager forward + backward)."""
    c = coef or COEFFICIENTS[_dtype_key(dtype)]
    d = cfg.d_model
    once = cfg.n_prelude + cfg.n_coda
    if cfg.looped:
        grad_apps = once + cfg.n_loop_layers * cfg.k_bwd
        free_apps = cfg.n_loop_layers * (cfg.r - cfg.k_bwd)
        if cfg.injection == "linear":
            inject = c.inject_linear * d * cfg.k_bwd
        elif cfg.injection == "hyperconnect":
            inject = c.inject_hyper * d * cfg.lanes * cfg.r
        else:
            inject = c.inject_additive * d * cfg.k_bwd
    else:
        grad_apps, free_apps, inject = once + cfg.n_loop_layers, 0, 0.0
    per_token = (c.head * cfg.padded_vocab + c.block * d * grad_apps + c.no_grad_block * d * free_apps
                 + inject + c.base * d)
    return per_token * cfg.seq_len


def predict_peak(cfg: ModelConfig, micro_batch: int, dtype="bf16", *, optimizer: bool = True,
                 coef: Coefficients | None = None) -> dict:
    """Predicted peak bytes of a training step at `micro_batch` rows per forward pass.

    `optimizer=False` leaves out the optimizer state (what a bare forward+backward with the
    gradients already allocated holds: the quantity `measure_peak` measures)."""
    c = param_counts(cfg)
    static = 8 * c["total"] + (4 * c["muon"] + 8 * c["adam"] if optimizer else 0)
    cache = autocast_cache_bytes(cfg, dtype)
    per_row = row_bytes(cfg, dtype, coef)
    return {"static_bytes": static, "autocast_cache_bytes": cache, "row_bytes": per_row,
            "micro_batch": micro_batch, "peak_bytes": static + cache + micro_batch * per_row}


def micro_batch_candidates(rows_per_process: int) -> list[int]:
    """Powers of two that divide the rows of one process's share of a step, largest first."""
    if rows_per_process < 1:
        raise ValueError(f"rows_per_process must be >= 1, got {rows_per_process}")
    m, out = 1, []
    while m <= rows_per_process:
        if rows_per_process % m == 0:
            out.append(m)
        m *= 2
    return out[::-1]


def auto_micro_batch(cfg: ModelConfig, rows_per_process: int, free_bytes: float, dtype="bf16", *,
                     safety: float = SAFETY, reserve: float = RESERVE_BYTES) -> int:
    """The largest power of two dividing `rows_per_process` whose predicted step fits in
    safety x (free_bytes - reserve); 1 if even one row does not (the caller's OOM handler then
    says so).  `free_bytes` is what the device has before the model is built."""
    budget = safety * (free_bytes - reserve)
    for m in micro_batch_candidates(rows_per_process):
        if predict_peak(cfg, m, dtype)["peak_bytes"] <= budget:
            return m
    return 1


def prefer_expandable_segments():
    """Let CUDA's caching allocator grow its segments in place, unless the user set its options:
    memory freed by an out-of-memory halving is then found again in one piece, not as fragments.
    The allocator reads the variable at CUDA's first use; where CUDA is already up (a notebook
    that trains in-process) the setting is applied to the running allocator instead."""
    if "PYTORCH_CUDA_ALLOC_CONF" in os.environ:
        return
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    torch = sys.modules.get("torch")  # never imported here: a dry run needs no torch
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")


def device_free_bytes(device=None) -> int | None:
    """Free memory of a CUDA device (`torch.cuda.mem_get_info`); None for the CPU, where the
    micro-batch is not chosen from memory."""
    import torch  # deferred on purpose: torch only where a model runs
    device = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def device_total_bytes(device=None) -> int | None:
    import torch  # deferred on purpose: torch only where a model runs
    device = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    if device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)


# ----------------------------------------------------------------------------- measurement

def cuda_autocast_policy():
    """A TorchFunctionMode that, inside CPU bf16 autocast, makes every torch call cast as CUDA
    autocast would.  Each call's output dtype is probed on fake CPU and fake CUDA tensors (the
    real autocast kernels; a CPU build cannot run a fake-CUDA backward, so per op); where they
    differ, the floating inputs are cast to CUDA's dtype (recorded by autograd, as autocast's
    casts are) and the op runs outside autocast.  `.changed` lists the ops it corrected."""
    import torch  # deferred on purpose: torch only where a model runs
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import _disable_current_modes
    from torch.utils._pytree import tree_flatten, tree_map

    def probe(func, args, kwargs, device):
        fake = lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device) \
            if isinstance(t, torch.Tensor) else t
        on = torch.is_autocast_enabled("cuda")
        try:
            with _disable_current_modes(), FakeTensorMode(), torch.no_grad():
                torch.set_autocast_enabled("cuda", True)
                torch.set_autocast_dtype("cuda", torch.bfloat16)
                out = func(*tree_map(fake, args), **tree_map(fake, kwargs))
            return out.dtype if isinstance(out, torch.Tensor) else None
        except Exception:  # noqa: BLE001 - an op that cannot run on fresh fakes keeps CPU's policy
            return None
        finally:
            torch.set_autocast_enabled("cuda", on)

    class Policy(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.decided, self.changed = {}, set()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            leaves = tree_flatten((args, kwargs))[0]
            if not torch.is_autocast_enabled("cpu") or not any(
                    isinstance(t, torch.Tensor) and t.is_floating_point() for t in leaves):
                return func(*args, **kwargs)
            key = (func, tuple(t.dtype if isinstance(t, torch.Tensor) else type(t) for t in leaves))
            if key not in self.decided:
                cpu, cuda = probe(func, args, kwargs, "cpu"), probe(func, args, kwargs, "cuda")
                self.decided[key] = cuda if cpu and cuda and cpu != cuda and cuda.is_floating_point else None
            want = self.decided[key]
            if want is None:
                return func(*args, **kwargs)
            self.changed.add(getattr(func, "__name__", str(func)))
            cast = lambda t: t.to(want) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
            with torch.autocast("cpu", enabled=False):
                return func(*tree_map(cast, args), **tree_map(cast, kwargs))
    return Policy()


def measure_peak(cfg: ModelConfig, rows: int, dtype="bf16", *, grads: bool = True, policy: str = "cpu") -> dict:
    """Peak bytes of one eager forward+backward of the live model, measured without memory.

    The model and batch are FakeTensors (shapes and dtypes, no storage) on the CPU, the step
    runs under CPU bf16 autocast (or none for 'fp32'), and torch's MemTracker follows every
    allocation.  `policy="cuda"` casts op by op as CUDA autocast would (`cuda_autocast_policy`;
    the ops it changed are returned as `cuda_casts`).  With `grads` the gradients exist before
    the step, as in every micro-batch after the first of a step.  Returns the peak total and its
    parts (parameters, gradients, activations, temporaries) in bytes.
    """
    import torch  # deferred on purpose: torch only where a model runs
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from .model import LoopedGPT

    key = _dtype_key(dtype)
    if policy not in ("cpu", "cuda"):
        raise ValueError(f"unknown autocast policy {policy!r}; use 'cpu' or 'cuda'")
    mode = cuda_autocast_policy() if policy == "cuda" else None
    with FakeTensorMode():
        model = LoopedGPT(cfg)
        if grads:
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
        x = torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len + 1))
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=key == "bf16"), mode or contextlib.nullcontext():
                loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
        snap = tracker.get_tracker_snapshot("peak")
    parts: dict = {}
    for per_device in snap.values():
        for k, v in per_device.items():
            name = k if isinstance(k, str) else k.value
            parts[name.lower()] = parts.get(name.lower(), 0) + int(v)
    return {"rows": rows, "dtype": key, "peak_bytes": parts.pop("total"), "parts": parts,
            "cuda_casts": sorted(mode.changed) if mode else None}


def measured_row_bytes(cfg: ModelConfig, dtype="bf16", policy: str = "cpu") -> tuple[float, float]:
    """(bytes per row, bytes at zero rows) from measurements at 1 and 2 rows."""
    one, two = (measure_peak(cfg, b, dtype, policy=policy)["peak_bytes"] for b in (1, 2))
    return float(two - one), float(2 * one - two)


CALIBRATION_CONFIGS = [  # (label, model_config kwargs): each isolates one coefficient
    ("plain s10", dict(r=1, s=10)),
    ("plain s20", dict(r=1, s=20)),
    ("plain s10 V8k", dict(r=1, s=10, vocab_size=8001)),
    ("linear r4 s10", dict(r=4, s=10)),
    ("linear r4 k1 s10", dict(r=4, s=10, bptt_k=1)),
    ("additive r4 s10", dict(r=4, s=10, injection="additive")),
    ("hyper r4 s10", dict(r=4, s=10, injection="hyperconnect")),
]


def calibrate(seq_len: int = 256, dtype="bf16", log=print) -> Coefficients:
    """Refit the coefficients to FakeTensor measurements of the live model (paper preset)."""

    key = _dtype_key(dtype)
    rows_X, rows_y = [], []
    names = [f for f in Coefficients.__dataclass_fields__]
    for label, kw in CALIBRATION_CONFIGS:
        cfg = model_config("paper", seq_len=seq_len, **kw)
        per_row, _ = measured_row_bytes(cfg, key)
        # the features: row_bytes with one unit coefficient at a time
        feats = [row_bytes(cfg, key, Coefficients(**{n: float(n == m) for n in names})) for m in names]
        rows_X.append(feats)
        rows_y.append(per_row)
        log(f"{label:>18}: {per_row / seq_len:10.0f} B/token measured")
    X, y = np.array(rows_X), np.array(rows_y)
    # no_grad_block and the injection terms are small; non-negative least squares keeps them >= 0
    coef, _ = nnls(X / y[:, None], np.ones_like(y))  # relative error
    out = Coefficients(**{n: round(float(c), 1) for n, c in zip(names, coef)})
    log(json.dumps(asdict(out)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m looped.memory", description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", action="store_true", help="refit the per-token coefficients")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--r", type=int, default=4)
    ap.add_argument("--size", "-s", type=float, default=10)
    ap.add_argument("--bptt-k", type=int, default=None)
    ap.add_argument("--injection", default=None)
    ap.add_argument("--rows", type=int, default=128, help="rows per process of one step")
    ap.add_argument("--device-memory", type=float, default=GPU_SPECS["H200"][1], help="free bytes assumed")
    a = ap.parse_args(argv)
    if a.calibrate:
        calibrate(a.seq_len, a.dtype)
        return 0
    cfg = model_config(a.preset, r=a.r, s=a.size, injection=a.injection, bptt_k=a.bptt_k)
    m = auto_micro_batch(cfg, a.rows, a.device_memory, a.dtype)
    p = predict_peak(cfg, m, a.dtype)
    print(json.dumps({"micro_batch": m, **{k: (round(v / GB, 3) if k != "micro_batch" else v)
                                           for k, v in p.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
