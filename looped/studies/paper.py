"""The paper's published numbers and where they come from, in one place.

Schwethelm, Rückert and Kaissis (2026), "How Much Is One Recurrence Worth? Iso-Depth Scaling
Laws for Looped Language Models", arXiv:2604.21106 (CC BY 4.0).  Its tables are copied,
digit for digit, into ``runs/paper/`` (one CSV per table):

- ``fits.csv``: the per-architecture Chinchilla fits (Table 1), the joint fit with its 95%
  bootstrap interval of phi and the restricted fits (phi = 0, phi = 1, budget halves), and the
  case studies (Table 3);
- ``unique_params.csv``, ``train_flops_per_token.csv``: Table 6 (appendix);
- ``compute_optimal_minima.csv``: the 24 iso-FLOP minima (N*, L*) per (budget, r);
- ``grids.csv``: the run grids of the main sweep and the two case studies;
- ``joint_fit_residuals.csv``, ``r1_training_tokens.csv``, ``injection_ablation.csv``,
  ``extrapolation_s34.csv``: the smaller appendix tables.

Everything else here is derived from those files with `looped.accounting`.
"""
from __future__ import annotations

import csv
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy.optimize import brentq

from .. import accounting as acc
from ..config import shipped
from ..law import Law, config_at_width, predict, synthetic_losses
from .sweep.registry import GRID_FILES, load_study

if TYPE_CHECKING:
    import pandas as pd

PAPER_DIR = shipped("runs/paper")   # the checkout's runs/paper, or the wheel's copy
PAPER_BUDGETS = (4.64e17, 1e18, 2.15e18, 4.64e18, 1e19, 2.15e19)   # training budgets (FLOPs) of its main grid


def _joint_fit() -> dict:
    """The row of the joint fit (phi free) in fits.csv, as strings."""
    with open(PAPER_DIR / "fits.csv", newline="") as f:
        return next(row for row in csv.DictReader(f) if row["fit"] == "phi_free")


_JOINT = _joint_fit()
PAPER_LAW = Law.from_dict(_JOINT)                          # the joint fit: A, alpha, B, beta, E, phi
PAPER_PHI = PAPER_LAW.phi                                  # 0.459
PAPER_PHI_CI = (float(_JOINT["phi_ci_low"]), float(_JOINT["phi_ci_high"]))   # its 95% interval [0.41, 0.53]


def paper_table(name: str) -> "pd.DataFrame":
    """One of the paper's published tables, by file name without ``.csv`` (see the module docstring)."""
    return pd.read_csv(PAPER_DIR / f"{name}.csv")


def paper_fits() -> "pd.DataFrame":
    """The paper's published fits (Table 1, the joint fit and its variants, Table 3), indexed by
    the ``fit`` column."""
    return paper_table("fits").set_index("fit")


def paper_grid(study: str = "main", grids=None, batch_tokens: int = 262_144) -> "pd.DataFrame":
    """The paper's run grid (``grids.csv``, via `looped.studies.sweep.registry.load_study`) with the
    accounting's n_once, n_rec and tokens."""
    runs = load_study(study, GRID_FILES["paper"] if grids is None else grids, preset="paper")
    return design_of(runs, batch_tokens).assign(study=study)


def design_of(runs, batch_tokens: int | None = None) -> "pd.DataFrame":
    """Runs (`registry.Run`) as the design a fit would see: budget, r, s, injection, bptt_k and the
    accounting's n_once, n_rec and tokens (at each run's tokens per step unless `batch_tokens`)."""
    rows = []
    for run in runs:
        cfg = run.model_config()
        rows.append(dict(budget=run.budget, r=run.r, s=run.s, injection=cfg.injection, bptt_k=cfg.k_bwd,
                         n_once=acc.n_once(cfg), n_rec=acc.n_rec(cfg),
                         tokens=acc.tokens_for_budget(cfg, run.budget, batch_tokens or run.tokens_per_step)))
    return pd.DataFrame(rows)


def runs_from_minima(path_or_df, preset="paper") -> "pd.DataFrame":
    """Turn published iso-FLOP minima (budget_flops, r, n_star_unique_millions, loss_star_nats)
    into runs the fitter takes.  For every cell the continuous width d at which the preset's
    iso-depth model has N = N* is found from the accounting; n_once / n_rec are split in that
    architecture's proportion (summing to N* exactly) and D = C / flops_per_token(width d)."""

    t = pd.read_csv(path_or_df) if not isinstance(path_or_df, pd.DataFrame) else path_or_df
    rows = []
    for row in t.itertuples():
        r, n_star, c = int(row.r), row.n_star_unique_millions * 1e6, float(row.budget_flops)
        d = brentq(lambda x: acc.n_params(config_at_width(preset, r, x)) - n_star, 1.0, 1e6)
        cfg = config_at_width(preset, r, d)
        no, nr = acc.n_once(cfg), acc.n_rec(cfg)
        k = n_star / (no + nr)
        rows.append(dict(budget=c, r=r, d_model=d, n_once=no * k, n_rec=nr * k,
                         tokens=c / acc.flops_per_token(cfg), loss=float(row.loss_star_nats)))
    return pd.DataFrame(rows)


def _minima_with_tokens(preset: str = "paper"):
    """The published minima (``budget`` renamed from ``budget_flops``) with ``n_star`` in
    parameters and ``tokens_star`` from `runs_from_minima`; returns (table, runs)."""
    t = paper_table("compute_optimal_minima")
    runs = runs_from_minima(t, preset=preset)
    out = t.rename(columns={"budget_flops": "budget"})
    out["n_star"] = out["n_star_unique_millions"] * 1e6
    out["tokens_star"] = runs["tokens"].to_numpy()
    return out, runs


def paper_minima() -> "pd.DataFrame":
    """The paper's 24 published iso-FLOP minima with what the accounting adds to them.

    From ``compute_optimal_minima.csv`` (N* in millions as ``n_star_M``, L* in nats as
    ``loss_star``): ``tokens_star`` is the budget divided by the training FLOPs per token of the
    iso-depth model whose unique N equals N* (`runs_from_minima`), and ``inside`` says
    whether N* lies within the range of N that the paper's main grid trained in that cell.
    """
    out, _ = _minima_with_tokens()
    out = out.rename(columns={"n_star_unique_millions": "n_star_M", "loss_star_nats": "loss_star"})
    out["tokens_per_param"] = out["tokens_star"] / out["n_star"]
    grid = paper_grid("main").assign(n=lambda g: g.n_once + g.n_rec)
    grid = grid.groupby(["budget", "r"]).n.agg(["min", "max"]).reset_index()
    out = out.merge(grid, on=["budget", "r"], how="left")
    out["inside"] = (out["n_star"] >= out["min"]) & (out["n_star"] <= out["max"])
    return out.drop(columns=["min", "max"])


def published_minima(preset: str = "paper", law=None) -> "pd.DataFrame":
    """The paper's 24 iso-FLOP minima with the tokens the accounting gives at N* (D = C / F at
    the width where N = N*), that width, tokens per unique parameter, the loss gap to r = 1 at
    the same budget, and (if `law`, a Law or FitResult, is given) the law's loss at that N* and D.
    Columns keep the published names (``n_star_unique_millions``, ``loss_star_nats``)."""
    out, runs = _minima_with_tokens(preset)
    out["d_model"] = runs["d_model"].to_numpy()
    out["tokens_per_param"] = out["tokens_star"] / out["n_star"]
    base = out[out.r == 1].set_index("budget")["loss_star_nats"]
    out["gap"] = out["loss_star_nats"] - out["budget"].map(base)
    if law is not None:
        out["law_loss_at_n_star"] = predict(law, runs["n_once"], runs["n_rec"], runs["r"], runs["tokens"])
    return out


def synthetic_runs(changes: dict | None = None, noise: float = 0.01, seed: int = 0, grid=None) -> "pd.DataFrame":
    """Runs of the grid (default: the paper's 116-run main grid) with losses from the paper's
    joint fit with the parameters in `changes` replaced (e.g. ``{"phi": 0.3}``), plus Gaussian
    noise of `noise` nats."""
    law = PAPER_LAW.replace(**(changes or {}))
    df = (paper_grid() if grid is None else grid).copy()
    df["loss"] = synthetic_losses(law, df, np.random.default_rng(seed), noise=noise)
    df["status"] = "ok"
    return df
