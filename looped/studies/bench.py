"""`looped bench train|fit`: benchmarks that print figures (never timed tests).

`bench train` times the real training step (forward, backward, MuonH + AdamW) of the CPU
preset at a few widths and divides the accounting's model FLOP/s by a matmul peak measured
in the same process, so the MFU ratio is meaningful on a noisy shared machine.
torch is imported inside the training benchmarks only, so `bench fit` starts without it.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time

import numpy as np

from .. import accounting
from ..config import ConfigError, get_preset, model_config
from ..fit import bootstrap_weights, fit
from ..io import add_json_option, destination_error, write_json
from ..solver import (
    LO,
    WIDTH,
    RunArrays,
    lbfgsb,
    objective,
    random_starts,
    serial_fit,
    solve_restarts,
    to_theta,
)
from .paper import PAPER_LAW, synthetic_runs

PATHS = ("eager", "fast")


def _ready(a, prog: str) -> bool:
    """Shared start of the bench commands: a writable --json destination, then torch's threads."""
    if destination_error(a.json, "--json"):
        print(f"{prog}: error: {destination_error(a.json, '--json')}", file=sys.stderr)
        return False
    if a.threads:
        import torch  # deferred on purpose: torch only where a model runs
        torch.set_num_threads(a.threads)
    return True


def measure_train(preset: str = "cpu", sizes=(6, 32, 64), r_values=(1, 4), steps: int = 5,
                  peak_size: int | None = None, paths=PATHS, warmup: int = 2, micro_batch: int | None = None,
                  peak_flops: float | None = None):
    """Time real training steps (forward, backward, MuonH + AdamW) on random tokens.

    Each (s, r) is timed on every path of `paths`: "eager" is the reference step (no compile,
    MuonH matrix by matrix, one-tensor-at-a-time AdamW), "fast" the trainer's default (the
    model compiled by `runtime.fast_model`, MuonH batched by shape, foreach AdamW).  Both start
    from the same weights and tokens.  `warmup` untimed steps come first (the fast path's
    first one compiles; its duration is reported as `warmup_s`).  `micro_batch` splits each
    step's rows into gradient-accumulation micro-batches (default: as the trainer chooses, the
    memory model's micro-batch on a GPU, the whole step on the CPU); `peak_flops` is the MFU
    denominator (default: measured here, a bf16 8192^3 GEMM on a GPU, fp32 1024^3 on the CPU).

    Returns (rows, peak): one dict per (s, r, path) with ms/step, tokens/s, the model FLOP/s the
    accounting credits and MFU against `peak`, a square-matmul FLOP/s measured in this process.
    """
    import torch  # deferred on purpose: torch only where a model runs

    from ..runtime import first_micro_batch, matmul_peak

    unknown = set(paths) - set(PATHS)
    if unknown:
        raise ValueError(f"unknown path(s) {', '.join(sorted(unknown))}; choose from {', '.join(PATHS)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    p = get_preset(preset)
    configs = [model_config(p, r=int(r), s=float(s)) for s in sizes for r in r_values]
    peak_size = peak_size or (8192 if device.type == "cuda" else 1024)  # a GPU needs a large GEMM to fill it
    peak = peak_flops or matmul_peak(device, dtype, peak_size, seconds=1.0)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    B = p.batch_tokens // p.seq_len
    if micro_batch is not None and (micro_batch < 1 or B % micro_batch):
        raise ValueError(f"{B} rows per step do not split into micro-batches of {micro_batch}")
    rows = []
    for cfg in configs:
        f = accounting.flops_per_token(cfg)
        micro = micro_batch or first_micro_batch(cfg, B, device)
        for path in paths:
            step = training_step(cfg, p, path == "fast", device, micro)
            t0 = time.perf_counter()
            for _ in range(warmup):
                step()
            sync()
            warm = time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            sync()
            seconds = (time.perf_counter() - t0) / steps
            tok_s = p.batch_tokens / seconds
            rows.append({"s": cfg.s, "r": cfg.r, "d_model": cfg.d_model, "path": path,
                         "n": accounting.n_params(cfg), "flops_per_token": f, "ms_per_step": seconds * 1e3,
                         "tokens_per_s": tok_s, "gflops_per_s": tok_s * f / 1e9, "mfu": tok_s * f / peak,
                         "warmup_s": warm, "micro_batch": micro})
    return rows, peak


def training_step(cfg, p, fast: bool, device, micro: int):
    """One training step of `cfg` as the trainer takes it (forward and backward over the step's
    rows in micro-batches, MuonH + AdamW, one host sync), on fixed random tokens, seed 0: the
    eager reference (`fast=False`) or the fast path."""
    import torch  # deferred on purpose: torch only where a model runs

    from .. import optim
    from ..model import LoopedGPT
    from ..runtime import fast_model
    B = p.batch_tokens // p.seq_len
    torch.manual_seed(0)
    raw = LoopedGPT(cfg).to(device)
    model = fast_model(raw) if fast else raw
    opts = optim.build_optimizers(raw, cfg, p.batch_tokens, 10 * p.batch_tokens, fast=fast)
    x = torch.randint(0, cfg.vocab_size, (B, cfg.seq_len + 1), device=device)

    def step():
        total = torch.zeros((), device=device)
        for a in range(0, B, micro):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = model(x[a:a + micro, :-1], x[a:a + micro, 1:]) * (micro / B)
            loss.backward()
            total += loss.detach()
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        return total.item()  # the trainer's one host sync per step
    return step


# torch.profiler operator names -> what they are, for the share of a step each part takes
PROFILE_PARTS = (("attention", ("scaled_dot_product", "flash_attention", "_efficient_attention")),
                 ("matrix multiplies", ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")),
                 ("fused elementwise (inductor kernels)", ("CompiledFxGraph", "triton_")))


def profile_step(preset: str = "prose", s: float = 4, r: int = 1, fast: bool = True, steps: int = 3,
                 warmup: int = 3) -> dict:
    """Where one training step's time goes: torch.profiler's self time per operator over `steps`
    steps (after `warmup`), summed into `PROFILE_PARTS` and "other" (optimizer bookkeeping,
    copies, Python).  Returns the shares, ms per step and the top operators' table."""
    import torch  # deferred on purpose: torch only where a model runs
    from torch.profiler import ProfilerActivity, profile

    p = get_preset(preset)
    cfg = model_config(p, r=int(r), s=float(s))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    step = training_step(cfg, p, fast, device, p.batch_tokens // p.seq_len)
    for _ in range(warmup):
        step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        for _ in range(steps):
            step()
    seconds = (time.perf_counter() - t0) / steps
    events = prof.key_averages()
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    parts = {name: 0.0 for name, _ in PROFILE_PARTS} | {"other": 0.0}
    for e in events:
        name = next((n for n, keys in PROFILE_PARTS if any(k in e.key for k in keys)), "other")
        parts[name] += getattr(e, attr, 0.0) or 0.0
    total = sum(parts.values()) or 1.0
    return {"preset": preset, "s": float(s), "r": int(r), "d_model": cfg.d_model, "path": "fast" if fast else "eager",
            "threads": torch.get_num_threads(), "ms_per_step": seconds * 1e3,
            "shares": {k: v / total for k, v in parts.items()},
            "table": events.table(sort_by=attr, row_limit=12)}


def speedups(rows) -> dict[tuple[float, int], float]:
    """Fast / eager steps per second for every (s, r) that was timed on both paths."""
    ms = {(x["s"], x["r"], x["path"]): x["ms_per_step"] for x in rows}
    return {(s, r): ms[s, r, "eager"] / ms[s, r, "fast"] for (s, r, path) in ms
            if path == "fast" and (s, r, "eager") in ms}


def bench_train(argv) -> int:
    import torch  # deferred on purpose: torch only where a model runs


    ap = argparse.ArgumentParser(prog="looped bench train")
    ap.add_argument("--preset", default="cpu", help="model preset (default: cpu)")
    ap.add_argument("--sizes", default="4,6,8,16,32",
                    help="comma-separated widths s (default: d = 16-128 on the cpu preset)")
    ap.add_argument("--r", default="1,4", help="comma-separated recurrences")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per (s, r, path)")
    ap.add_argument("--paths", default="eager,fast", help="eager, fast or both")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--peak-size", type=int, default=None,
                    help="square matmul size for the peak (default: 8192 on a GPU, 1024 on the CPU)")
    ap.add_argument("--peak-flops", type=float, default=None, help="MFU denominator in FLOP/s (default: measured)")
    ap.add_argument("--micro-batch", type=int, default=None, help="rows per forward pass (default: the whole batch)")
    add_json_option(ap, "the rows and the peak")
    a = ap.parse_args(argv)
    if not _ready(a, "looped bench train"):
        return 2
    a.peak_size = a.peak_size or (8192 if torch.cuda.is_available() else 1024)
    try:
        rows, peak = measure_train(a.preset, [float(s) for s in a.sizes.split(",")],
                                   [int(r) for r in a.r.split(",")], a.steps, a.peak_size,
                                   paths=tuple(a.paths.split(",")), micro_batch=a.micro_batch,
                                   peak_flops=a.peak_flops)
    except (ConfigError, ValueError) as e:
        print(f"looped bench train: error: {e}", file=sys.stderr)
        return 2
    kind = "cuda bf16" if torch.cuda.is_available() else "cpu fp32"
    with readable_output(a.json):
        ratios = _print_train(rows, peak, kind, a)
    if a.json is not None:
        write_json(a.json, {"preset": a.preset, "device": kind, "threads": torch.get_num_threads(),
                            "peak_flops": peak, "peak_size": a.peak_size, "rows": rows,
                            "speedups": [{"s": s, "r": r, "fast_over_eager": v} for (s, r), v in ratios.items()]})
    return 0


def readable_output(json_dest):
    """Where a command's readable output goes: stdout, or stderr while stdout carries `--json -`."""
    return contextlib.redirect_stdout(sys.stderr) if json_dest == "-" else contextlib.nullcontext()


def _print_train(rows, peak, kind, a) -> dict:
    import torch  # deferred on purpose: torch only where a model runs
    print(f"{kind}, {torch.get_num_threads()} threads; "
          + (f"peak (given): {peak / 1e9:.1f} GFLOP/s" if a.peak_flops else
             f"matmul peak ({a.peak_size}^3): {peak / 1e9:.1f} GFLOP/s"))
    print(f"{'s':>4} {'r':>2} {'d':>5} {'path':>6} {'ms/step':>8} {'tokens/s':>10} {'GFLOP/s':>8} "
          f"{'MFU':>6} {'warm-up':>8}")
    for x in rows:
        print(f"{x['s']:>4g} {x['r']:>2} {x['d_model']:>5} {x['path']:>6} {x['ms_per_step']:>8.1f} "
              f"{x['tokens_per_s']:>10,.0f} {x['gflops_per_s']:>8.2f} {x['mfu']:>6.1%} {x['warmup_s']:>7.1f}s")
    ratios = speedups(rows)
    if ratios:
        print("fast / eager steps per second: " + ", ".join(f"s={s:g} r={r}: {v:.2f}x" for (s, r), v in ratios.items()))
    return ratios


def bench_profile(argv) -> int:
    """`looped bench profile`: the share of a training step each part takes (see profile_step)."""

    ap = argparse.ArgumentParser(prog="looped bench profile")
    ap.add_argument("--preset", default="prose", help="model preset (default: prose)")
    ap.add_argument("--s", type=float, default=4, help="width knob (prose: d = 8 s; default: 4)")
    ap.add_argument("--r", type=int, default=1, help="recurrences (default: 1)")
    ap.add_argument("--path", choices=PATHS, default="fast", help="training step to profile (default: fast)")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (default: 3)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    add_json_option(ap, "the shares and the operator table")
    a = ap.parse_args(argv)
    if not _ready(a, "looped bench profile"):
        return 2
    try:
        out = profile_step(a.preset, a.s, a.r, a.path == "fast", a.steps)
    except (ConfigError, ValueError) as e:
        print(f"looped bench profile: error: {e}", file=sys.stderr)
        return 2
    with readable_output(a.json):
        print(out["table"])
        print(f"{a.preset} s={a.s:g} (d={out['d_model']}) r={a.r}, {a.path} path, {out['threads']} thread(s): "
              f"{out['ms_per_step']:.0f} ms/step; " + ", ".join(f"{k} {v:.0%}" for k, v in out["shares"].items()))
    if a.json is not None:
        write_json(a.json, {**out, "command": "looped bench profile " + " ".join(argv)})
    return 0


BENCH_USAGE = """usage: looped bench {train,fit,profile} [options]

  train    fast vs eager training step: ms/step, tokens/s, MFU against a measured matmul peak
  fit      the fitter (the paper's full protocol) against a serial scipy reference
  profile  the share of a training step each part takes

looped bench COMMAND --help lists its options."""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(BENCH_USAGE)
        return 0
    if not argv or argv[0] not in ("train", "fit", "profile"):
        what = f"unknown benchmark {argv[0]!r}" if argv else "name a benchmark"
        print(f"looped bench: error: {what}: train, fit or profile (looped bench --help)", file=sys.stderr)
        return 2
    if argv[0] == "train":
        return bench_train(argv[1:])
    if argv[0] == "profile":
        return bench_profile(argv[1:])
    return int(bench_fit(argv[1:]) or 0)


# ------------------------------------------------------------------------ bench fit: the fitter

def bench_fit(argv=None) -> int:
    """`looped bench fit`: the paper's full protocol (500 restarts for the main fit and for each
    of 200 block-bootstrap resamples) on the synthetic 116-run main grid, timed, against a
    serial scipy L-BFGS-B reference (timed on a subset of restarts, scaled linearly); then the
    best objectives are checked (relative differences must be <= 1e-6): the batched solver
    vs serial scipy from the same starts, and the pruned full protocol vs every restart solved
    to convergence (no pruning), for the main fit and a few resamples."""
    ap = argparse.ArgumentParser(prog="looped bench fit")
    ap.add_argument("--restarts", type=int, default=500, help="random starts per fit (default: 500, the paper's)")
    ap.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples (default: 200, the paper's)")
    ap.add_argument("--boot-restarts", type=int, default=-1,
                    help="-1 (default): the full protocol; k >= 0: time the warm-start shortcut instead")
    ap.add_argument("--reference-restarts", type=int, default=20,
                    help="restarts of the main fit solved by serial scipy (timing and check)")
    ap.add_argument("--check-resamples", type=int, default=3,
                    help="bootstrap resamples whose optimum is checked (serial scipy and unpruned)")
    ap.add_argument("--check-restarts", type=int, default=8,
                    help="starts per checked resample solved by serial scipy")
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic runs, starts and resamples "
                                                        "(default: 0)")
    a = ap.parse_args(argv)

    df = synthetic_runs(seed=a.seed)
    data = RunArrays.from_frame(df)
    free = np.ones(6, bool)
    R, B = a.restarts, a.bootstrap
    boot_restarts = None if a.boot_restarts < 0 else a.boot_restarts
    print(f"synthetic paper main grid: {len(df)} runs, law {PAPER_LAW}, noise 0.01 nats")
    lbfgsb(LO + WIDTH / 2, data, None, free)          # import scipy outside the timings
    total_fits = R * (B + 1)
    t = time.perf_counter()
    res = fit(df, restarts=R, seed=a.seed, bootstrap=B, boot_restarts=boot_restarts)
    fast = time.perf_counter() - t
    what = (f"full protocol: {R} restarts x (1 + {B} resamples) = {total_fits:,} local solves" if boot_restarts is None
            else f"warm-start shortcut: {R} restarts + {B} resamples x (11 warm + {boot_restarts} random) starts")
    print(f"{what}: {fast:.2f} s")
    print(f"  phi = {res.phi:.4f}  CI {res.ci.get('phi')}  Huber {res.huber:.12e}  R^2 {res.r2:.5f}")
    ss = np.random.SeedSequence(a.seed).spawn(3)
    starts = random_starts(np.random.default_rng(ss[0]), R, {})       # the main fit's starts
    t = time.perf_counter()
    solve_restarts(data, starts, free)
    print(f"  (main fit alone, {R} restarts: {time.perf_counter() - t:.2f} s)")
    k = min(a.reference_restarts, R)
    _, fref, tref, nits = serial_fit(data, starts[:k], free)
    per = tref / k
    scaled = per * total_fits
    print(f"serial scipy L-BFGS-B reference (analytic gradient, ftol 1e-15, gtol 1e-12): {k} restarts "
          f"in {tref:.2f} s ({per * 1e3:.1f} ms/solve, median {int(np.median(nits))} iterations)")
    print(f"  scaled to {R} x {B + 1} = {total_fits:,} solves: {scaled:,.0f} s")
    print(f"speed-up (reference / fast): {scaled / fast:,.0f}x")
    print("best objectives, relative differences (each must be <= 1e-6 in size):")
    checks = []

    def show(label, f_fast, f_ref, ref_label):
        rel = (f_fast - f_ref) / abs(f_ref)
        checks.append(abs(rel) <= 1e-6)
        print(f"  {label}: fast {f_fast:.12e}  {ref_label} {f_ref:.12e}  {rel:+.2e}")

    ((_, f_k, _),) = solve_restarts(data, starts[:k], free)
    show(f"main fit, first {k} starts: batched", f_k, fref, "serial scipy")
    ((_, f_np, _),) = solve_restarts(data, starts, free, prune_gap=None)
    show(f"main fit, all {R} starts: fit()", res.huber, f_np, "unpruned")
    if boot_restarts is None and B > 0 and a.check_resamples > 0:
        W = bootstrap_weights(df, np.random.default_rng(ss[1]), B)
        rng_b = np.random.default_rng(ss[2])
        m = min(a.check_resamples, B)
        kb = min(a.check_restarts, R)
        for i in range(m):
            st = random_starts(rng_b, R, {})                           # resample i's starts in fit()
            w = W[i]
            th_w = to_theta(res.boot_samples[i])
            f_fit = float(objective(th_w[None], data, w[None], order=0)[0])
            _, fs, _, _ = serial_fit(data, st[:kb], free, weights=w)
            ((_, fb, _),) = solve_restarts(data, st[:kb], free, weights=np.repeat(w[None], kb, 0), polish=1)
            show(f"resample {i}, first {kb} starts: batched", fb, fs, "serial scipy")
            ((_, fu, _),) = solve_restarts(data, st, free, weights=np.repeat(w[None], R, 0), polish=1, prune_gap=None)
            show(f"resample {i}, all {R} starts: fit()", f_fit, fu, "unpruned")
    print(f"{'OK' if all(checks) else 'FAIL'}: {sum(checks)}/{len(checks)} checks within 1e-6")
    return 0 if all(checks) else 1
