"""Laws `looped.fit` cannot express: several phis (one per group, e.g. per r or per budget) or a
free multiplier kappa on the recurrent term,

    L = E + A (N_once + kappa r^phi_g N_rec)^(-alpha) + B D^(-beta),

fitted with the paper's objective (Huber on log loss over log-sum-exp) from a warm start at the
nested `looped.fit` optimum plus random starts: batched Levenberg-Marquardt, then scipy L-BFGS-B,
with a block bootstrap over (budget, r) cells.  Numbers only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from ..fit import FitError, fit, validate_runs
from ..solver import HI, HUBER_DELTA, LO, POLISH_OPTIONS, RunArrays

FIVE = ("A", "alpha", "B", "beta", "E")
LOG_KAPPA_BOX = (-5.0, 5.0)
NAN2 = (math.nan, math.nan)


def check_runs(df, need=("budget",)) -> pd.DataFrame:
    """validate_runs plus the columns these studies need; FitError (one line) otherwise."""
    if df is None or len(df) == 0:
        raise FitError("no runs: the table is empty")
    df = validate_runs(df)
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise FitError(f"runs: missing column(s) {', '.join(missing)}")
    return df


def _cells(df) -> np.ndarray:
    """(budget, r) cell of each run, numbered in sorted order (row order does not matter)."""
    return df.groupby(["budget", "r"], sort=True).ngroup().to_numpy()


def cell_bootstrap(df, rng, n_boot: int) -> np.ndarray:
    """(n_boot, n) run multiplicities: (budget, r) cells drawn with replacement, as looped.fit."""
    cell = _cells(df)
    k = cell.max() + 1
    return np.stack([np.bincount(rng.integers(0, k, k), minlength=k) for _ in range(n_boot)])[:, cell].astype(float)


def _rmse(x) -> float:
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


def _batch(TH, d: RunArrays, X, kappa: bool, W):
    """For P parameter vectors (log A, alpha, log B, beta, log E, c_1..c_K[, log kappa]) at once:
    the objective (P,), its gradient (P, p), the Gauss-Newton Hessian with IRLS curvature (the
    majoriser of `looped.solver.objective`) (P, p, p) and rho = log pred - log L (P, n)."""
    k = X.shape[1]
    a, al, b, be, e = (TH[:, i:i + 1] for i in range(5))
    m = np.exp((TH[:, 5 + k:6 + k] if kappa else 0.0) + (TH[:, 5:5 + k] @ X.T) * d.logr) * d.n_rec
    neff = d.n_once + m
    x = np.log(neff)
    u1, u2, u3 = a - al * x, b - be * d.logD, np.broadcast_to(e, x.shape)
    top = np.maximum(np.maximum(u1, u2), u3)
    w1, w2, w3 = np.exp(u1 - top), np.exp(u2 - top), np.exp(u3 - top)
    tot = w1 + w2 + w3
    rho = top + np.log(tot) - d.logL
    ar = np.abs(rho)
    f = (W * np.where(ar <= HUBER_DELTA, 0.5 * rho * rho, HUBER_DELTA * (ar - 0.5 * HUBER_DELTA))).sum(1)
    w1, w2, w3 = w1 / tot, w2 / tot, w3 / tot
    t = -al * w1 * m / neff                                                      # d rho / d log(kappa r^phi)
    J = np.stack([w1, -w1 * x, w2, -w2 * d.logD, w3, *(t * d.logr * X[:, j] for j in range(k)), *[t] * kappa], 2)
    g = np.einsum("pn,pnj->pj", W * np.clip(rho, -HUBER_DELTA, HUBER_DELTA), J)
    H = np.einsum("pni,pn,pnj->pij", J, W * np.minimum(1.0, HUBER_DELTA / np.maximum(ar, 1e-300)), J)
    return f, g, H, rho


def _polish(th0, d, X, kappa, w, free, lo, hi):
    """scipy L-BFGS-B on the free parameters, the paper's local solver (looped.solver's options)."""
    fi, base = np.flatnonzero(free), np.clip(th0, lo, hi)

    def fun(v):
        th = base.copy()
        th[fi] = v
        f, g, _, _ = _batch(th[None], d, X, kappa, w[None])
        return f[0], g[0, fi]

    res = minimize(fun, base[fi], jac=True, method="L-BFGS-B", bounds=list(zip(lo[fi], hi[fi])), options=POLISH_OPTIONS)
    th = base.copy()
    th[fi] = res.x
    return th, float(res.fun)


def _solve(starts, group, W, d, X, kappa, free, lo, hi, polish, maxiter=400, prune=1.0):
    """Box-projected Levenberg-Marquardt from every start at once (row j of W: the resample of
    start j); after 10 iterations starts worse than (1 + prune) x their group's best are stopped
    for good (as looped.solver prunes); the `polish` best others of each group polished by
    L-BFGS-B.  Returns [(theta, f)] per group."""
    span, eye = hi - lo, np.eye(len(lo))
    z = np.clip((starts - lo) / span, 0, 1)
    f, g, H, _ = _batch(lo + z * span, d, X, kappa, W)
    lam, active, alive = np.full(len(z), 1e-3), np.ones(len(z), bool), np.ones(len(z), bool)
    for it in range(maxiter):
        i = np.flatnonzero(active)
        if not len(i):
            break
        gi, Hi, zi = g[i] * span, H[i] * np.outer(span, span), z[i]
        fr = free & ~(((zi <= 0) & (gi > 0)) | ((zi >= 1) & (gi < 0)))           # not pushed out of the box
        M = np.where(fr[:, :, None] & fr[:, None, :], Hi, 0) + eye * (~fr)[:, :, None]
        M = M + lam[i, None, None] * eye * (np.diagonal(M, axis1=1, axis2=2)[:, None, :] + 1e-12)
        zn = np.clip(zi + np.where(fr, np.linalg.solve(M, -np.where(fr, gi, 0)[..., None])[..., 0], 0), 0, 1)
        fn, gn, Hn, _ = _batch(lo + zn * span, d, X, kappa, W[i])
        ok = fn < f[i]
        rel = (f[i] - fn) / np.maximum(f[i], 1e-300)
        z[i[ok]], g[i[ok]], H[i[ok]], f[i[ok]] = zn[ok], gn[ok], Hn[ok], fn[ok]
        lam[i] = np.clip(np.where(ok, lam[i] / 3, lam[i] * 4), 1e-12, 1e12)
        active[i[(ok & (rel < 1e-12)) | (lam[i] >= 1e12)]] = False
        if it >= 10:
            best = np.full(group.max() + 1, np.inf)
            np.minimum.at(best, group, f)
            alive &= f <= best[group] * (1 + prune)
            active &= alive
    out = []
    for gi in range(group.max() + 1):
        idx = np.flatnonzero((group == gi) & alive)
        out.append(
            min(
                (_polish(lo + z[j] * span, d, X, kappa, W[j], free, lo, hi) for j in idx[np.argsort(f[idx])[:polish]]),
                key=lambda t: t[1],
            )
        )
    return out


def fit_multi(df, X, labels, kappa=False, restarts=64, seed=0, bootstrap=0, boot_restarts=4, fix=None) -> MultiFit:
    """Fit L = E + A (N_once + kappa r^(X_i . c) N_rec)^-alpha + B D^-beta (kappa = 1 unless
    `kappa`) from the nested looped.fit optimum (one phi) and `restarts` uniform starts in the
    paper's box (c in phi's box, log kappa in LOG_KAPPA_BOX); each resample from the full-data
    optimum and `boot_restarts` uniform starts.  fix: some of A, alpha, B, beta, E held."""
    df, X = check_runs(df, need=()), np.asarray(X, float)
    if len(X) != len(df):   # validate_runs dropped runs (status not ok): X no longer lines up
        raise FitError(f"X has {len(X)} rows for {len(df)} valid runs")
    X = X.reshape(len(df), -1)
    d, k = RunArrays.from_frame(df), X.shape[1]
    names = [*FIVE, *labels, *["kappa"] * kappa]
    lo = np.r_[LO[:5], np.full(k, LO[5]), [LOG_KAPPA_BOX[0]] * kappa]
    hi = np.r_[HI[:5], np.full(k, HI[5]), [LOG_KAPPA_BOX[1]] * kappa]
    fixed = {FIVE.index(n): (math.log(v) if n in ("A", "B", "E") else v) for n, v in (fix or {}).items()}
    free = ~np.isin(np.arange(len(names)), list(fixed))
    rng_s, rng_b, rng_bs = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))

    def uniform(rng, n):
        th = lo + rng.uniform(size=(n, len(lo))) * (hi - lo)
        th[:, list(fixed)] = list(fixed.values())
        return th

    looped = (d.logr > 0) & (d.n_rec > 0)
    nested = fit(df, restarts=max(restarts, 50), seed=seed, fix=fix)
    c = np.linalg.lstsq(X[looped], np.full(looped.sum(), nested.phi), rcond=None)[0]
    starts = np.vstack([np.r_[nested.theta[:5], c, [0.0] * kappa], uniform(rng_s, restarts)])
    ((theta, f),) = _solve(starts, np.zeros(len(starts), int), np.ones((len(starts), len(df))), d, X, kappa,
                           free, lo, hi, polish=3)
    nat = lambda t: np.r_[np.exp(t[0]), t[1], np.exp(t[2]), t[3], np.exp(t[4]), t[5:5 + k], np.exp(t[5 + k:])]
    ci, n_valid = {}, {}
    if bootstrap:
        W, per = cell_bootstrap(df, rng_b, bootstrap), 1 + boot_restarts
        starts = np.vstack([np.vstack([theta, uniform(rng_bs, boot_restarts)]) for _ in range(bootstrap)])
        T = np.array([nat(t) for t, _ in _solve(starts, np.repeat(np.arange(bootstrap), per), np.repeat(W, per, 0),
                                                d, X, kappa, free, lo, hi, polish=1)])
        seen = (W * looped) @ np.abs(X) > 0                    # (B, k): a c with no looped run drawn is free
        for i in np.flatnonzero(free):
            ok = seen[:, i - 5] if 5 <= i < 5 + k else np.ones(bootstrap, bool)
            n_valid[names[i]] = int(ok.sum())
            ci[names[i]] = tuple(map(float, np.percentile(T[ok, i], [2.5, 97.5]))) if ok.any() else NAN2
    resid = d.loss - d.loss * np.exp(_batch(theta[None], d, X, kappa, np.ones((1, len(df))))[3][0])
    return MultiFit(
        dict(zip(names, map(float, nat(theta)))),
        ci,
        n_valid,
        f,
        1 - float(resid @ resid) / float(((d.loss - d.loss.mean()) ** 2).sum()),
        _rmse(resid),
        len(df),
        theta,
    )


def onehot(values, levels=None) -> tuple[np.ndarray, list]:
    """Indicator columns, one per level (default: the sorted distinct values)."""
    values = np.asarray(values, float)
    levels = sorted(set(values)) if levels is None else list(levels)
    return (values[:, None] == np.asarray(levels, float)[None, :]).astype(float), levels
