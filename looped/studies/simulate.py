"""Law-generated run records: what a study's folder would hold if the paper's law were exact.

Each planned run of a named study gets a record with the real accounting of its configuration
(N, N_once, N_rec, FLOPs per token, steps, tokens, exactly what `looped.train` would write), a
final loss from a law plus Gaussian noise, a training curve from the same law at the tokens seen
so far, and a wall time at an assumed throughput.  Records say ``"synthetic": true``.

They let the chapters and their tests run at GPU scale without a GPU: the chapters read them as
they would read a finished sweep, and a fit on them must recover the law that made them.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from .. import accounting
from ..config import ConfigError
from ..io import atomic_write_json
from ..law import as_law, synthetic_losses
from ..memory import GPU_SPECS
from .paper import PAPER_LAW
from .sweep.cost import DEFAULT_GPU, DEFAULT_GPU_MFU
from .sweep.registry import STUDIES, SweepError, load_study


def law_records(study: str, law=None, noise: float = 0.01, seed: int = 0, peak_flops: float | None = None,
                mfu: float = DEFAULT_GPU_MFU, curve_points: int = 20) -> list[dict]:
    """One record per planned run of `study` (see the module docstring); `law` (a `Law` or a fit)
    defaults to the paper's joint fit, the throughput to `mfu` of the default GPU's spec peak."""
    law = as_law(PAPER_LAW if law is None else law)
    peak = peak_flops or GPU_SPECS[DEFAULT_GPU][0]
    runs = load_study(study)
    cfgs = [run.model_config() for run in runs]
    steps_of = [run.steps or accounting.steps_for_budget(cfg, run.budget, run.tokens_per_step)
                for run, cfg in zip(runs, cfgs)]
    design = {"n_once": [accounting.n_once(c) for c in cfgs], "n_rec": [accounting.n_rec(c) for c in cfgs],
              "r": [c.r for c in cfgs], "tokens": [k * run.tokens_per_step for k, run in zip(steps_of, runs)]}
    losses = synthetic_losses(law, design, np.random.default_rng(seed), noise=noise)
    records = []
    for run, cfg, steps, loss in zip(runs, cfgs, steps_of, losses):
        batch = run.tokens_per_step
        tokens, flops_per_token = steps * batch, accounting.flops_per_token(cfg)
        n_once, n_rec = accounting.n_once(cfg), accounting.n_rec(cfg)
        tokens_per_s = peak * mfu / flops_per_token
        # the curve: the law at the tokens seen so far (from 1% of the run, where the law is meaningful)
        marks = np.unique(np.linspace(max(1, steps // 100), steps, curve_points).astype(int))
        curve = [[int(k), round(float(law.predict(n_once, n_rec, cfg.r, k * batch)), 5)] for k in marks]
        records.append({
            "schema": 1, "study": study, "run_id": run.run_id, "status": "ok", "synthetic": True,
            "r": cfg.r, "s": run.s, "injection": cfg.injection,
            "lanes": cfg.lanes if cfg.injection == "hyperconnect" else None, "bptt_k": cfg.k_bwd,
            "budget": run.budget, "preset": run.preset.name, "d_model": cfg.d_model,
            "n": accounting.n_params(cfg), "n_once": n_once, "n_rec": n_rec, "flops_per_token": flops_per_token,
            "batch_tokens": batch, "steps": steps, "tokens": tokens, "loss": float(loss),
            "eval_tokens": run.preset.eval_tokens, "train_loss_curve": curve,
            "wall_seconds": tokens / tokens_per_s, "tokens_per_s": tokens_per_s,
            "flops_per_s": tokens_per_s * flops_per_token, "mfu": mfu, "peak_flops": peak,
            "device": f"synthetic ({DEFAULT_GPU} at {mfu:.0%} MFU)", "seed": run.seed, "data_order": run.data_order,
            "lr_scale": run.lr_scale if run.lr_scale is not None else run.preset.lr_scale,
            "config": cfg.to_dict(),
        })
    return records


def write_law_records(study: str, out, **kw) -> list[Path]:
    """Write `law_records(study, **kw)` into the folder `out` (one JSON file per run)."""
    out = Path(out)
    paths = []
    for rec in law_records(study, **kw):
        path = out / f"{rec['run_id']}.json"
        atomic_write_json(path, rec)
        paths.append(path)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m looped.studies.simulate",
        description="write law-generated records of a study (to try the chapters without a GPU)",
    )
    ap.add_argument("study", help=", ".join(STUDIES))
    ap.add_argument("--out", required=True, help="folder for the records")
    ap.add_argument("--noise", type=float, default=0.01, help="Gaussian noise on each loss (nats)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the noise added to the law's losses (default 0)")
    a = ap.parse_args(argv)
    if not (math.isfinite(a.noise) and a.noise >= 0):
        print("simulate: error: --noise must be a finite number >= 0", file=sys.stderr)
        return 2
    try:
        paths = write_law_records(a.study, a.out, noise=a.noise, seed=a.seed)
    except (SweepError, ConfigError) as e:
        print(f"simulate: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(paths)} law-generated records of {a.study} to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
