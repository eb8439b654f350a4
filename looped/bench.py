"""`looped bench train|fit`: benchmarks that print figures (never timed tests)."""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("train", "fit"):
        print("usage: looped bench {train,fit} [options]", file=sys.stderr)
        return 2
    if argv[0] == "train":
        from .train import benchmark
    else:
        from .fit import benchmark
    return int(benchmark(argv[1:]) or 0)
