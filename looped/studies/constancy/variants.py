"""The law's variants that `looped.fit` cannot express: several phis (one per group, e.g. per r
or per budget) or a free multiplier kappa on the recurrent term,

    L = E + A (N_once + kappa r^phi_g N_rec)^(-alpha) + B D^(-beta),

fitted by the one solver (`looped.solver.solve_restarts` on a `RunArrays.design`) with the paper's
objective, from a warm start at the nested `looped.fit` optimum plus random starts, with a block
bootstrap over (budget, r) cells (`looped.resample`).  `fit_row` puts a `looped.fit` result in the
columns of `MultiFit.row`, so the robustness tables hold both kinds of fit.  Numbers only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...fit import FitError, fit, validate_runs
from ...resample import cell_resample, cells
from ...solver import HI, LO, LOG_SLOTS, RunArrays, law_loss, natural, random_starts, solve_restarts

FIVE = ("A", "alpha", "B", "beta", "E")
LOG_KAPPA_BOX = (-5.0, 5.0)
LEVEL_BOX = 1.0             # a free log-loss level lies in [-1, 1]
NAN2 = (math.nan, math.nan)


def rmse(x) -> float:
    """The root mean square of x (residuals: nats, or log loss)."""
    return float(np.sqrt(np.mean(np.square(x))))


@dataclass
class MultiFit:
    """The law with phi_i = X_i . c (one c per column of X, named by `labels`) and, with kappa, a
    free multiplier on r^phi N_rec.  params, ci (95% cell-bootstrap percentiles) in natural units;
    n_valid: resamples in which a parameter is identified (its looped runs drawn)."""
    params: dict
    ci: dict
    n_valid: dict
    huber: float
    r2: float
    rmse: float
    n_runs: int
    theta: np.ndarray

    def row(self, name: str) -> dict:
        lo, hi = self.ci.get(name, NAN2)
        return dict(phi=self.params[name], phi_lo=lo, phi_hi=hi, r2=self.r2, rmse=self.rmse, n_runs=self.n_runs,
                    huber=self.huber)


def fit_residuals(res, df) -> np.ndarray:
    """Observed - predicted loss (nats) of each run of df under a `looped.fit` result."""
    return df["loss"].to_numpy(float) - law_loss(res.theta, RunArrays.from_frame(df))


def fit_row(res, df) -> dict:
    """`MultiFit.row`'s columns for a `looped.fit` result on df: the one-phi law in the same tables."""
    lo, hi = res.ci.get("phi", NAN2)
    return dict(phi=res.phi, phi_lo=lo, phi_hi=hi, r2=res.r2, rmse=rmse(fit_residuals(res, df)),
                n_runs=len(df), huber=res.huber)


def fit_multi(df, X, labels, kappa=False, restarts=64, seed=0, bootstrap=0, boot_restarts=4, fix=None,
              levels=None) -> MultiFit:
    """Fit L = E + A (N_once + kappa r^(X_i . c) N_rec)^-alpha + B D^-beta (kappa = 1 unless
    `kappa`) from the nested looped.fit optimum (one phi) and `restarts` uniform starts in the
    paper's box (c in phi's box, log kappa in LOG_KAPPA_BOX); each resample from the full-data
    optimum and `boot_restarts` uniform starts.  fix: some of A, alpha, B, beta, E held.
    levels: {name: indicator column (n,)}, free log-loss levels (L times exp(level) on its runs,
    in LEVEL_BOX), e.g. one for the looped runs or one per cell; in `params` as fitted (log)."""
    df, X = validate_runs(df), np.asarray(X, float)
    if len(X) != len(df):   # validate_runs dropped runs (status not ok): X no longer lines up
        raise FitError(f"X has {len(X)} rows for {len(df)} valid runs")
    X, levels = X.reshape(len(df), -1), dict(levels or {})
    S = np.column_stack([np.asarray(v, float) for v in levels.values()]) if levels else None
    d, k, m = RunArrays.from_frame(df).design(X, kappa, S), X.shape[1], len(levels)
    names = [*FIVE, *labels, *["kappa"] * kappa, *levels]
    lo = np.r_[LO[:5], np.full(k, LO[5]), [LOG_KAPPA_BOX[0]] * kappa, [-LEVEL_BOX] * m]
    hi = np.r_[HI[:5], np.full(k, HI[5]), [LOG_KAPPA_BOX[1]] * kappa, [LEVEL_BOX] * m]
    fixed = {FIVE.index(n): (math.log(v) if n in ("A", "B", "E") else v) for n, v in (fix or {}).items()}
    free = ~np.isin(np.arange(len(names)), list(fixed))
    rng_s, rng_b, rng_bs = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    box = dict(lo=lo, hi=hi)

    looped = (d.logr > 0) & (d.n_rec > 0)
    nested = fit(df, restarts=max(restarts, 50), seed=seed, fix=fix)
    c = np.linalg.lstsq(X[looped], np.full(looped.sum(), nested.phi), rcond=None)[0]
    starts = np.vstack([np.r_[nested.theta[:5], c, [0.0] * (kappa + m)], random_starts(rng_s, restarts, fixed, **box)])
    ((theta, f, _),) = solve_restarts(d, starts, free, polish=3, **box)
    j = 5 + k + kappa
    log_slots = [*LOG_SLOTS, *range(5 + k, j)]  # A, B, E and the kappas
    ci, n_valid = {}, {}
    if bootstrap:
        W, per = cell_resample(cells(df), rng_b, bootstrap), 1 + boot_restarts
        starts = np.vstack([np.vstack([theta, random_starts(rng_bs, boot_restarts, fixed, **box)])
                            for _ in range(bootstrap)])
        group = np.repeat(np.arange(bootstrap), per)
        sols = solve_restarts(d, starts, free, np.repeat(W, per, 0), group, bootstrap, polish=1, **box)
        T = np.array([natural(t, log_slots) for t, _, _ in sols])
        seen = (W * looped) @ np.abs(X) > 0                    # (B, k): a c with no looped run drawn is free
        for i in np.flatnonzero(free):
            ok = seen[:, i - 5] if 5 <= i < 5 + k else np.ones(bootstrap, bool)
            n_valid[names[i]] = int(ok.sum())
            ci[names[i]] = tuple(map(float, np.percentile(T[ok, i], [2.5, 97.5]))) if ok.any() else NAN2
    resid = d.loss - law_loss(theta, d)
    r2 = 1 - float(resid @ resid) / float(((d.loss - d.loss.mean()) ** 2).sum())
    return MultiFit(dict(zip(names, map(float, natural(theta, log_slots)))), ci, n_valid, f, r2, rmse(resid), len(df),
                    theta)


def onehot(values, levels=None) -> tuple[np.ndarray, list]:
    """Indicator columns, one per level (default: the sorted distinct values)."""
    values = np.asarray(values, float)
    levels = sorted(set(values)) if levels is None else list(levels)
    return (values[:, None] == np.asarray(levels, float)[None, :]).astype(float), levels
