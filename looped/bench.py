"""`looped bench train|fit`: benchmarks that print figures (never timed tests).

`bench train` times the real training step (forward, backward, MuonH + AdamW) of the CPU
preset at a few widths and divides the accounting's model FLOP/s by a matmul peak measured
in the same process, so the MFU ratio is meaningful on a noisy shared machine.
"""
from __future__ import annotations

import argparse
import sys
import time


def measure_train(preset: str = "cpu", sizes=(6, 32, 64), r_values=(1, 4), steps: int = 5,
                  peak_size: int = 1024):
    """Time real training steps (forward, backward, MuonH + AdamW) on random tokens.

    Returns (rows, peak): one dict per (s, r) with tokens/s, the model FLOP/s the accounting
    credits and MFU against `peak`, a square-matmul FLOP/s measured in the same process.
    """
    import torch

    from . import accounting, optim
    from .config import get_preset, model_config
    from .model import LoopedGPT
    from .train import matmul_peak

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    p = get_preset(preset)
    configs = [model_config(p, r=int(r), s=float(s)) for s in sizes for r in r_values]
    peak = matmul_peak(device, dtype, peak_size, seconds=1.0)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    B = p.batch_tokens // p.seq_len
    rows = []
    for cfg in configs:
        torch.manual_seed(0)
        model = LoopedGPT(cfg).to(device)
        opts = optim.build_optimizers(model, cfg, p.batch_tokens, 10 * p.batch_tokens)
        x = torch.randint(0, cfg.vocab_size, (B, cfg.seq_len + 1), device=device)

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
            for o in opts:
                o.step()
                o.zero_grad(set_to_none=True)

        step()
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        tok_s = steps * p.batch_tokens / (time.perf_counter() - t0)
        f = accounting.flops_per_token(cfg)
        rows.append({"s": cfg.s, "r": cfg.r, "d_model": cfg.d_model, "n": accounting.n_params(cfg),
                     "flops_per_token": f, "tokens_per_s": tok_s, "gflops_per_s": tok_s * f / 1e9,
                     "mfu": tok_s * f / peak})
    return rows, peak


def bench_train(argv) -> int:
    import torch

    from .config import ConfigError

    ap = argparse.ArgumentParser(prog="looped bench train")
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--sizes", default="6,32,64", help="comma-separated widths s (cpu preset: d = 4 s)")
    ap.add_argument("--r", default="1,4", help="comma-separated recurrences")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--peak-size", type=int, default=1024, help="square matmul size for the peak")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        rows, peak = measure_train(a.preset, [float(s) for s in a.sizes.split(",")],
                                   [int(r) for r in a.r.split(",")], a.steps, a.peak_size)
    except (ConfigError, ValueError) as e:
        print(f"looped bench train: error: {e}", file=sys.stderr)
        return 2
    kind = "cuda bf16" if torch.cuda.is_available() else "cpu fp32"
    print(f"{kind}, {torch.get_num_threads()} threads; matmul peak ({a.peak_size}^3): {peak / 1e9:.1f} GFLOP/s")
    print(f"{'s':>4} {'r':>2} {'d':>5} {'N':>10} {'F/token':>10} {'tokens/s':>10} {'GFLOP/s':>8} {'MFU':>6}")
    for x in rows:
        print(f"{x['s']:>4g} {x['r']:>2} {x['d_model']:>5} {x['n']:>10,} {x['flops_per_token']:>10.3g} "
              f"{x['tokens_per_s']:>10,.0f} {x['gflops_per_s']:>8.2f} {x['mfu']:>6.1%}")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("train", "fit"):
        print("usage: looped bench {train,fit} [options]", file=sys.stderr)
        return 2
    if argv[0] == "train":
        return bench_train(argv[1:])
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
    ap.add_argument("--restarts", type=int, default=500)
    ap.add_argument("--bootstrap", type=int, default=200)
    ap.add_argument("--boot-restarts", type=int, default=-1,
                    help="-1 (default): the full protocol; k >= 0: time the warm-start shortcut instead")
    ap.add_argument("--reference-restarts", type=int, default=20,
                    help="restarts of the main fit solved by serial scipy (timing and check)")
    ap.add_argument("--check-resamples", type=int, default=3,
                    help="bootstrap resamples whose optimum is checked (serial scipy and unpruned)")
    ap.add_argument("--check-restarts", type=int, default=8,
                    help="starts per checked resample solved by serial scipy")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    import numpy as np

    from .fit import bootstrap_weights, fit
    from .law import synthetic_runs
    from .paper import PAPER_LAW
    from .solver import LO, WIDTH, RunArrays, lbfgsb, objective, random_starts, serial_fit, solve_restarts
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
            th_w = np.array(res.boot_samples[i], float)
            th_w[[0, 2, 4]] = np.log(th_w[[0, 2, 4]])
            f_fit = float(objective(th_w[None], data, w[None], order=0)[0])
            _, fs, _, _ = serial_fit(data, st[:kb], free, weights=w)
            ((_, fb, _),) = solve_restarts(data, st[:kb], free, weights=np.repeat(w[None], kb, 0), polish=1)
            show(f"resample {i}, first {kb} starts: batched", fb, fs, "serial scipy")
            ((_, fu, _),) = solve_restarts(data, st, free, weights=np.repeat(w[None], R, 0), polish=1, prune_gap=None)
            show(f"resample {i}, all {R} starts: fit()", f_fit, fu, "unpruned")
    print(f"{'OK' if all(checks) else 'FAIL'}: {sum(checks)}/{len(checks)} checks within 1e-6")
    return 0 if all(checks) else 1
