"""`looped bench train|fit`: benchmarks that print figures (never timed tests).

`bench train` times the real training step (forward, backward, MuonH + AdamW) of the CPU
preset at a few widths and divides the accounting's model FLOP/s by a matmul peak measured
in the same process, so the MFU ratio is meaningful on a noisy shared machine.
"""
from __future__ import annotations

import argparse
import sys
import time


def bench_train(argv) -> int:
    import torch

    from . import accounting, optim
    from .config import ConfigError, get_preset, model_config
    from .model import LoopedGPT
    from .train import matmul_peak

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
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        preset = get_preset(a.preset)
        configs = [model_config(preset, r=int(r), s=float(s)) for s in a.sizes.split(",") for r in a.r.split(",")]
    except (ConfigError, ValueError) as e:
        print(f"looped bench train: error: {e}", file=sys.stderr)
        return 2
    peak = matmul_peak(device, dtype, a.peak_size, seconds=1.0)
    print(f"device {device.type}, {torch.get_num_threads()} threads; {dtype} matmul peak "
          f"({a.peak_size}^3): {peak / 1e9:.1f} GFLOP/s")
    print(f"{'s':>4} {'r':>2} {'d':>5} {'N':>10} {'F/token':>10} {'tokens/s':>10} {'GFLOP/s':>8} {'MFU':>6}")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    B = preset.batch_tokens // preset.seq_len
    for cfg in configs:
        torch.manual_seed(0)
        model = LoopedGPT(cfg).to(device)
        opts = optim.build_optimizers(model, cfg, preset.batch_tokens, 10 * preset.batch_tokens)
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
        for _ in range(a.steps):
            step()
        sync()
        tok_s = a.steps * preset.batch_tokens / (time.perf_counter() - t0)
        f = accounting.flops_per_token(cfg)
        print(f"{cfg.s:>4g} {cfg.r:>2} {cfg.d_model:>5} {accounting.n_params(cfg):>10,} {f:>10.3g} "
              f"{tok_s:>10,.0f} {tok_s * f / 1e9:>8.2f} {tok_s * f / peak:>6.1%}")
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
