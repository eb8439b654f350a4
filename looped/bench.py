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
    from .fit import benchmark
    return int(benchmark(argv[1:]) or 0)
