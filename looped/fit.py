"""Fit the joint scaling law of looped models (paper-facts section 6), fast and exactly.

    L(N_once, N_rec, D, r) = E + A (N_once + r^phi N_rec)^(-alpha) + B D^(-beta)

Parameters are fitted in log space, theta = (a=log A, alpha, b=log B, beta, e=log E, phi), by
minimising the SUM over runs of Huber_delta(LSE(a - alpha log N_eff, b - beta log D, e) - log L)
with delta = 1e-3 inside the box a,b in [-5,35], alpha,beta in [0,2.5], e in [-3,2],
phi in [-3,3]: the best of `restarts` (500) local solves started uniformly in the box.

How the 500 local solves are done (the paper used one scipy L-BFGS-B per restart):

1. All restarts of a fit (and, for the bootstrap, all restarts of several resamples) are
   solved TOGETHER as one vectorised problem: a batched, box-projected Levenberg-Marquardt
   (trust-region Newton) iteration on the exact analytic gradient and the exact 6x6
   analytic Hessian, in box-normalised coordinates.  Variables at a bound whose gradient
   points outward are frozen for that step (projected Newton); fixed parameters are never
   moved.  One objective/gradient/Hessian evaluation per iteration and restart.
2. Every few iterations restarts that have fallen into the same basin (same point to 1e-3 of
   the box, same resample) are merged: only the lowest one continues.  From iteration 8 on,
   a restart whose objective is more than twice its resample's current best is stopped
   (pruned): it cannot improve the best unless it later falls from far behind into a better
   basin, which never happened in the tests described at `_batched_solve`.  This cuts the
   work ~8x (most restarts are pruned after 8 iterations instead of crawling ~110).
3. The best few distinct end points are POLISHED with scipy L-BFGS-B (analytic gradient,
   ftol 1e-15, gtol 1e-12, up to 10,000 iterations), so the reported optimum is a
   converged L-BFGS-B optimum of exactly the paper's objective.

Bootstrap resamples (block bootstrap over (budget, r) cells; over runs when there is no
budget column) get the SAME random-restart protocol by default (``boot_restarts=None``:
`restarts` fresh random starts per resample, the best kept; the paper's literal protocol),
solved many resamples at a time in one batch.  ``boot_restarts=k`` instead starts each
resample from the full-data optimum and the main fit's best 10 local minima plus k random
starts (faster; it agreed with the full protocol on the benchmark resamples).

`serial_fit` is the reference implementation: one scipy L-BFGS-B solve per restart.
This module must stay torch-free (it imports in milliseconds).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PARAMS = ("a", "alpha", "b", "beta", "e", "phi")          # optimisation coordinates
REPORT = ("A", "alpha", "B", "beta", "E", "phi")          # reported (natural units)
LO = np.array([-5.0, 0.0, -5.0, 0.0, -3.0, -3.0])
HI = np.array([35.0, 2.5, 35.0, 2.5, 2.0, 3.0])
WIDTH = HI - LO
DELTA = 1e-3
_TRACE = False
REQUIRED = ("r", "n_once", "n_rec", "tokens", "loss")
OPTIONAL = ("budget", "s", "study", "status", "injection", "bptt_k")
FIX_KEYS = {"A": 0, "a": 0, "alpha": 1, "B": 2, "b": 2, "beta": 3, "E": 4, "e": 4, "phi": 5}
POLISH_OPTIONS = {"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10_000, "maxfun": 100_000, "maxls": 50}


class FitError(ValueError):
    """Bad input or an impossible fit; the CLI prints it as one line and exits 2."""


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------

def _records_from_dir(path: Path) -> list[dict]:
    rows = []
    files = sorted(p for p in path.rglob("*.json") if p.is_file())
    for p in files:
        try:
            rec = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            warnings.warn(f"skipping {p.name}: not a JSON run record", stacklevel=3)
            continue
        if not isinstance(rec, dict):
            continue
        flat = {}
        for sub in ("config", "result", "results", "metrics"):   # nested parts, top level wins
            if isinstance(rec.get(sub), dict):
                flat.update({k: v for k, v in rec[sub].items() if not isinstance(v, (dict, list))})
        flat.update({k: v for k, v in rec.items() if not isinstance(v, (dict, list))})
        if "budget" not in flat and "budget_flops" in flat:
            flat["budget"] = flat["budget_flops"]
        if "loss" not in flat:
            for alt in ("val_loss", "final_val_loss"):
                if alt in flat:
                    flat["loss"] = flat[alt]
                    break
        if not any(k in flat for k in REQUIRED):
            continue   # some other JSON file (a manifest, a config): not a run record
        flat.setdefault("file", p.name)
        rows.append(flat)
    return rows


def load_runs(path) -> "pd.DataFrame":
    """Runs table from a CSV file or a directory of run-record JSON files (one per run).

    Required columns r, n_once, n_rec, tokens, loss; optional budget, s, study, status,
    injection, bptt_k (a CSV column `budget_flops` is read as budget).  JSON records may nest
    fields under "config"/"result"; top-level keys win.  Rows whose status is not 'ok' are
    dropped with a warning.  Raises FitError (one line) for unreadable input, missing columns
    or non-positive / non-finite values.
    """
    import pandas as pd

    p = Path(path)
    if not p.exists():
        raise FitError(f"{p}: no such file or directory")
    if p.is_dir():
        rows = _records_from_dir(p)
        if not rows:
            raise FitError(f"{p}: no run-record JSON files found")
        df = pd.DataFrame(rows)
    else:
        try:
            if p.suffix == ".json":
                rec = json.loads(p.read_text())
                df = pd.DataFrame(rec if isinstance(rec, list) else [rec])
            else:
                df = pd.read_csv(p)
        except Exception as e:  # noqa: BLE001 - any parse failure is a one-line input error
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise FitError(f"{p}: unreadable ({msg})") from None
    if "budget" not in df.columns and "budget_flops" in df.columns:
        df = df.rename(columns={"budget_flops": "budget"})
    return _validate(df, str(p))


def _validate(df, where: str = "runs"):
    import pandas as pd

    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise FitError(f"{where}: missing column(s) {', '.join(missing)}")
    df = df.copy()
    if "status" in df.columns:
        st = df["status"].fillna("ok").astype(str)
        bad = st != "ok"
        if bad.any():
            msg = f"{where}: skipping {int(bad.sum())} run(s) whose status is not 'ok'"
            warnings.warn(msg, stacklevel=3)
            print(f"looped fit: warning: {msg}", file=sys.stderr)
            df = df[~bad].copy()
    for c in REQUIRED + tuple(c for c in ("budget", "s") if c in df.columns):
        vals = pd.to_numeric(df[c], errors="coerce")
        if c in ("budget", "s") and vals.isna().all():
            df = df.drop(columns=c)
            continue
        nonfinite = ~np.isfinite(vals.to_numpy(dtype=float))
        if nonfinite.any():
            i = int(np.flatnonzero(nonfinite)[0])
            raise FitError(f"{where}: column {c} has a missing or non-finite value ({df[c].iloc[i]!r}, row {i})")
        v = vals.to_numpy(dtype=float)
        low = (v < 0) if c == "n_rec" else (v < 1) if c == "r" else (v <= 0)
        if low.any():
            i = int(np.flatnonzero(low)[0])
            what = "negative" if c == "n_rec" else "below 1" if c == "r" else "non-positive"
            raise FitError(f"{where}: column {c} has a {what} value ({v[i]:g}, row {i})")
        df[c] = v
    if len(df) == 0:
        raise FitError(f"{where}: no runs to fit")
    return df.reset_index(drop=True)


@dataclass
class _Data:
    """Arrays of one runs table, in the form the objective wants."""
    n_once: np.ndarray
    n_rec: np.ndarray
    logr: np.ndarray
    logD: np.ndarray
    logL: np.ndarray
    loss: np.ndarray

    @classmethod
    def from_frame(cls, df, chinchilla: bool = False) -> "_Data":
        n_once = df["n_once"].to_numpy(float)
        n_rec = df["n_rec"].to_numpy(float)
        r = df["r"].to_numpy(float)
        if chinchilla:  # N = unique params, r plays no role
            n_once, n_rec, r = n_once + n_rec, np.zeros_like(n_rec), np.ones_like(r)
        loss = df["loss"].to_numpy(float)
        return cls(n_once, n_rec, np.log(r), np.log(df["tokens"].to_numpy(float)), np.log(loss), loss)

    def __len__(self):
        return len(self.loss)


# --------------------------------------------------------------------------------------------
# Objective: value, analytic gradient and analytic Hessian, batched over parameter vectors
# --------------------------------------------------------------------------------------------

def _objective(theta: np.ndarray, data: _Data, weights: np.ndarray | None = None,
               order: int = 1, delta: float = DELTA, newton=True):
    """Huber-LSE objective for a batch of parameter vectors.

    theta (P, 6); weights (P, n) or (n,) or None (all 1: each run counted once).
    Returns f (P,), and with order >= 1 the gradient (P, 6), with order 2 the Hessian (P, 6, 6).
    newton (bool or (P,) bool): the exact Hessian (Huber'' = 1 inside delta, 0 outside); where
    False, the Hessian of the IRLS majoriser instead (Huber'' replaced by the secant curvature
    Huber'(rho)/rho = min(1, delta/|rho|)): positive far from the fit, it makes the early
    iterations converge like Gauss-Newton on a weighted least-squares problem.
    """
    a, al, b, be, e, ph = (theta[:, i:i + 1] for i in range(6))
    rp = np.exp(ph * data.logr) * data.n_rec                        # r^phi N_rec   (P, n)
    neff = data.n_once + rp
    x = np.log(neff)
    u1 = a - al * x
    u2 = b - be * data.logD
    u3 = np.broadcast_to(e, u1.shape)
    m = np.maximum(np.maximum(u1, u2), u3)
    w1, w2, w3 = np.exp(u1 - m), np.exp(u2 - m), np.exp(u3 - m)
    tot = w1 + w2 + w3
    lse = m + np.log(tot)
    rho = lse - data.logL
    arho = np.abs(rho)
    quad = arho <= delta
    hub = np.where(quad, 0.5 * rho * rho, delta * (arho - 0.5 * delta))
    c = 1.0 if weights is None else weights
    f = (c * hub).sum(axis=1)
    if order < 1:
        return f
    w1 /= tot
    w2 /= tot
    w3 /= tot
    s = c * np.clip(rho, -delta, delta)                             # c * Huber'(rho)
    q = rp / neff
    xp = data.logr * q                                              # d x / d phi
    s1, s2, s3 = s * w1, s * w2, s * w3
    g = np.empty(theta.shape)
    g[:, 0] = s1.sum(1)
    g[:, 1] = -(s1 * x).sum(1)
    g[:, 2] = s2.sum(1)
    g[:, 3] = -(s2 * data.logD).sum(1)
    g[:, 4] = s3.sum(1)
    g[:, 5] = -(al[:, 0] * (s1 * xp).sum(1))
    if order < 2:
        return f, g
    # Hessian: sum_i (c H'' - c H') G G^T + c H' (sum_k w_k J_k J_k^T + w_1 d2u_1)
    G = np.stack([w1, -w1 * x, w2, -w2 * data.logD, w3, -al * w1 * xp], axis=2)   # (P, n, 6)
    if newton is True:
        curv = quad
    else:
        curv = np.minimum(1.0, delta / np.maximum(arho, 1e-300))
        if newton is not False:
            curv = np.where(np.asarray(newton)[:, None], quad, curv)
    t = c * curv - s
    H = np.matmul(G.transpose(0, 2, 1), G * t[:, :, None])
    x2 = x * x
    H[:, 0, 0] += g[:, 0]
    H[:, 0, 1] += g[:, 1]
    H[:, 1, 1] += (s1 * x2).sum(1)
    H[:, 2, 2] += g[:, 2]
    H[:, 2, 3] += g[:, 3]
    H[:, 3, 3] += (s2 * data.logD * data.logD).sum(1)
    H[:, 4, 4] += g[:, 4]
    sxp = (s1 * xp).sum(1)
    H[:, 0, 5] += -al[:, 0] * sxp
    H[:, 1, 5] += al[:, 0] * (s1 * x * xp).sum(1) - sxp            # J1 part + d2u1/(dalpha dphi)
    xpp = data.logr * xp * (1.0 - q)                                # d2 x / d phi2
    H[:, 5, 5] += al[:, 0] ** 2 * (s1 * xp * xp).sum(1) - al[:, 0] * (s1 * xpp).sum(1)
    for i, j in ((0, 1), (0, 5), (1, 5), (2, 3)):
        H[:, j, i] = H[:, i, j]
    return f, g, H


# --------------------------------------------------------------------------------------------
# Batched projected Levenberg-Marquardt over many restarts at once
# --------------------------------------------------------------------------------------------

OBJ_BLOCK = 128  # rows per `_objective` call in the solver: temporaries stay small (cache, no page faults)
BOOT_CHUNK = 6_000_000   # bootstrap: resamples solved together, at most this many (restart x run) weights


def _objective2(theta: np.ndarray, data: _Data, weights: np.ndarray | None, newton, block: int = OBJ_BLOCK):
    """`_objective(..., order=2)` evaluated `block` rows at a time (identical values, row by row):
    numpy temporaries of ~100 kB are recycled by the allocator, while (P, n) arrays of
    thousands of rows are fresh memory (page faults) on every operation: ~2x slower."""
    P = theta.shape[0]
    if P <= block:
        return _objective(theta, data, weights, order=2, newton=newton)
    f, g, H = np.empty(P), np.empty((P, 6)), np.empty((P, 6, 6))
    nw = newton if isinstance(newton, bool) else np.asarray(newton)
    for i in range(0, P, block):
        j = min(P, i + block)
        f[i:j], g[i:j], H[i:j] = _objective(theta[i:j], data, None if weights is None else weights[i:j],
                                            order=2, newton=nw if isinstance(nw, bool) else nw[i:j])
    return f, g, H


def _batched_solve(theta0: np.ndarray, data: _Data, weights: np.ndarray | None, free: np.ndarray,
                   group: np.ndarray | None = None, maxiter: int = 500, merge_every: int = 2,
                   merge_tol: float = 1e-3, switch_tol: float = 1e-5, ftol: float = 1e-10,
                   pgtol: float = 1e-9, prune_gap: float | None = 1.0, prune_after: int = 8,
                   block: int = OBJ_BLOCK):
    """Minimise the objective from every row of theta0 (P, 6) at once.

    weights: (P, n) per-problem run multiplicities (bootstrap) or None.  free: (6,) bool.
    group: (P,) int; restarts are merged only within a group (one group per resample).
    Each restart starts with IRLS curvature (see `_objective`) and switches to the exact
    Hessian once an iteration improves f by less than `switch_tol` (relative); it stops when
    an exact-Newton iteration improves f by less than `ftol` relative, when the projected
    gradient vanishes, or when the trust region collapses (no descent left at machine precision).
    Pruning (prune_gap not None): from iteration `prune_after` on, a restart whose objective
    exceeds (1 + prune_gap) times its group's current best is stopped (not alive).  f only
    decreases along a restart, so a pruned restart could matter only by later descending below
    the group's best by a factor > 2 from far behind; on the benchmark grid and on synthetic
    data with other laws (phi -0.3 ... 1.2, 73 groups of 500 restarts) this never changed a
    group's best objective (to 1e-13; the main fit and 3 resamples are rechecked by
    `looped bench fit`), while prune_gap 0.2 after 3 iterations did change one (the best
    basin was lost).  prune_gap=None solves every restart to convergence.
    Returns (theta (P, 6), f (P,), alive (P,) bool: not merged into / pruned by a better restart).
    """
    P = theta0.shape[0]
    group = np.zeros(P, np.int64) if group is None else np.asarray(group, np.int64)
    n_groups = int(group.max()) + 1 if P else 0
    z = np.clip((theta0 - LO) / WIDTH, 0.0, 1.0)
    newton = np.zeros(P, bool)
    f, g, H = _objective2(LO + z * WIDTH, data, weights, False, block)
    lam = np.full(P, 1e-6)
    active = np.ones(P, bool)
    alive = np.ones(P, bool)
    eye = np.eye(6)
    scale = np.outer(WIDTH, WIDTH)
    it = 0
    while active.any() and it < maxiter:
        it += 1
        idx = np.flatnonzero(active)
        wi = None if weights is None else weights[idx]
        zi, gi = z[idx], g[idx] * WIDTH                      # gradient in box units
        Hi = H[idx] * scale
        # free set: free parameters not sitting on a bound with the gradient pointing out
        fr = free & ~(((zi <= 0.0) & (gi > 0)) | ((zi >= 1.0) & (gi < 0)))
        gi = np.where(fr, gi, 0.0)
        pg = np.abs(np.clip(zi - gi, 0.0, 1.0) - zi).max(1)
        Hm = np.where(fr[:, :, None] & fr[:, None, :], Hi, 0.0) + eye * (~fr)[:, :, None]
        ev, V = np.linalg.eigh(Hm)
        ev = np.abs(ev)                                       # saddle-free: always a descent step
        damp = lam[idx, None] * (ev.max(1, keepdims=True) + 1e-30)
        coef = -np.einsum("pij,pi->pj", V, gi) / (ev + damp)
        p = np.where(fr, np.einsum("pij,pj->pi", V, coef), 0.0)
        znew = np.clip(zi + p, 0.0, 1.0)
        step = znew - zi
        vs = np.einsum("pij,pi->pj", V, step)
        pred = -(np.einsum("pi,pi->p", gi, step) + 0.5 * np.einsum("pj,pj->p", vs * vs, ev))
        nw = newton[idx]
        fn, gn, Hn = _objective2(LO + znew * WIDTH, data, wi, nw, block)
        fo = f[idx]
        red = fo - fn
        acc = red > 0
        ratio = np.where(pred > 0, red / np.where(pred > 0, pred, 1.0), -1.0)
        li = np.where(ratio > 0.75, lam[idx] / 4, np.where(ratio < 0.25, lam[idx] * 4, lam[idx]))
        lam[idx] = np.clip(li, 1e-12, 1e16)
        ai = idx[acc]
        z[ai], f[ai], g[ai], H[ai] = znew[acc], fn[acc], gn[acc], Hn[acc]
        rel = red / np.maximum(np.abs(fo), 1e-300)
        stuck = ~acc & (lam[idx] >= 1e12)
        switch = ~nw & ((acc & (rel < switch_tol)) | stuck)
        done = (pg <= pgtol * np.abs(fo)) | (nw & ((acc & (rel < ftol)) | stuck))
        active[idx[done]] = False
        sw = idx[switch & ~done]
        if len(sw):
            newton[sw] = True
            lam[sw] = 1e-6
            _, g[sw], H[sw] = _objective2(LO + z[sw] * WIDTH, data, None if weights is None else weights[sw],
                                          True, block)
        if _TRACE:
            print(it, len(idx), int(acc.sum()), int(newton[idx].sum()), float(f[idx].min()), int(alive.sum()))
        if prune_gap is not None and it >= prune_after:
            best = np.full(n_groups, np.inf)
            np.minimum.at(best, group[idx], f[idx])
            np.minimum.at(best, group[alive & ~active], f[alive & ~active])
            drop = idx[f[idx] > best[group[idx]] * (1.0 + prune_gap)]
            alive[drop] = False
            active[drop] = False
        if merge_every and it % merge_every == 0:
            alive_idx = np.flatnonzero(alive)
            key = np.column_stack([group[alive_idx], np.round(z[alive_idx] / merge_tol).astype(np.int64)])
            order = np.lexsort((f[alive_idx],) + tuple(key.T[::-1]))
            ks = key[order]
            first = np.ones(len(order), bool)
            first[1:] = (ks[1:] != ks[:-1]).any(1)
            drop = alive_idx[order[~first]]
            alive[drop] = False
            active[drop] = False
    return LO + z * WIDTH, f, alive


# --------------------------------------------------------------------------------------------
# scipy L-BFGS-B: the polish step and the serial reference
# --------------------------------------------------------------------------------------------

def _lbfgsb(theta0: np.ndarray, data: _Data, weights: np.ndarray | None, free: np.ndarray,
            options: dict | None = None):
    """One scipy L-BFGS-B solve over the free parameters (analytic gradient); returns (theta, f, nit)."""
    from scipy.optimize import minimize

    fi = np.flatnonzero(free)
    base = np.clip(np.asarray(theta0, float), LO, HI)
    w = None if weights is None else np.asarray(weights, float)[None, :]

    def fun(v):
        th = base.copy()
        th[fi] = v
        f, g = _objective(th[None, :], data, w, order=1)
        return float(f[0]), g[0, fi]

    res = minimize(fun, base[fi], jac=True, method="L-BFGS-B", bounds=list(zip(LO[fi], HI[fi])),
                   options=dict(POLISH_OPTIONS, **(options or {})))
    th = base.copy()
    th[fi] = res.x
    return th, float(res.fun), int(res.nit)


def serial_fit(data: "_Data", starts: np.ndarray, free: np.ndarray, weights=None, options=None):
    """Reference: one scipy L-BFGS-B solve per restart, in turn.  Returns (theta*, f*, seconds, nits)."""
    t0 = time.perf_counter()
    best, fbest, nits = None, np.inf, []
    for th0 in starts:
        th, f, nit = _lbfgsb(th0, data, weights, free, options)
        nits.append(nit)
        if f < fbest:
            best, fbest = th, f
    return best, fbest, time.perf_counter() - t0, nits


# --------------------------------------------------------------------------------------------
# The fit
# --------------------------------------------------------------------------------------------

@dataclass
class FitResult:
    """A fitted law.  A, B, E in natural units (A = exp(a), ...); phi is None for a Chinchilla
    fit (no run with r > 1 and n_rec > 0, or a per-r fit).  huber is the summed objective at
    the optimum; ci maps each free parameter to its bootstrap (2.5%, 97.5%) percentiles."""
    A: float
    alpha: float
    B: float
    beta: float
    E: float
    phi: float | None
    r2: float
    huber: float
    n_runs: int
    restarts: int
    ci: dict = field(default_factory=dict)
    law: str = "joint"
    fixed: dict = field(default_factory=dict)
    seed: int = 0
    bootstrap: int = 0
    theta: tuple = ()
    per_r: dict = field(default_factory=dict)
    seconds: float = 0.0
    boot_samples: np.ndarray | None = field(default=None, repr=False)

    @property
    def free(self) -> list[str]:
        out = [p for p in REPORT if p not in self.fixed]
        return [p for p in out if not (p == "phi" and self.phi is None)]

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("A", "alpha", "B", "beta", "E", "phi", "r2", "huber",
                                             "n_runs", "restarts", "law", "seed", "bootstrap", "seconds")}
        d["fixed"] = dict(self.fixed)
        d["ci"] = {k: [float(v[0]), float(v[1])] for k, v in self.ci.items()}
        d["theta"] = dict(zip(PARAMS, map(float, self.theta)))
        if self.per_r:
            d["per_r"] = {str(k): v.to_dict() for k, v in self.per_r.items()}
        return {k: (float(v) if isinstance(v, np.floating) else v) for k, v in d.items()}


def _theta_to_params(theta, chinchilla: bool) -> dict:
    a, al, b, be, e, ph = map(float, theta)
    return {"A": math.exp(a), "alpha": al, "B": math.exp(b), "beta": be, "E": math.exp(e),
            "phi": None if chinchilla else ph}


def _parse_fix(fix: dict | None):
    """{'phi': 0.5, 'E': 1.7, ...} -> {index in theta: value in log-space coordinates}."""
    out = {}
    for k, v in (fix or {}).items():
        if k not in FIX_KEYS:
            raise FitError(f"cannot fix {k!r}: choose from A, alpha, B, beta, E, phi")
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise FitError(f"fixed value for {k} must be a number, got {v!r}") from None
        if not math.isfinite(v):
            raise FitError(f"fixed value for {k} must be finite")
        if k in ("A", "B", "E"):
            if v <= 0:
                raise FitError(f"fixed {k} must be positive, got {v:g}")
            v = math.log(v)
        out[FIX_KEYS[k]] = v
    return out


def _starts(rng: np.random.Generator, k: int, fixed: dict) -> np.ndarray:
    th = LO + rng.uniform(size=(k, 6)) * WIDTH
    for i, v in fixed.items():
        th[:, i] = v
    return th


def _best_in_groups(theta, f, alive, group, n_groups, k):
    """Indices of the k lowest alive problems of every group (list of arrays)."""
    out = []
    for gi in range(n_groups):
        idx = np.flatnonzero(alive & (group == gi))
        out.append(idx[np.argsort(f[idx], kind="stable")[:k]])
    return out


def _solve(data: _Data, starts: np.ndarray, free: np.ndarray, weights=None, group=None,
           n_groups: int = 1, polish: int = 3, **solver):
    """Batched solve of every start, then L-BFGS-B polish of each group's `polish` best distinct
    end points (`solver`: options of `_batched_solve`, e.g. prune_gap=None).
    Returns per group: (theta*, f*, local minima found (sorted thetas))."""
    th, f, alive = _batched_solve(starts, data, weights, free, group, **solver)
    group = np.zeros(len(starts), np.int64) if group is None else group
    out = []
    for gi, idx in enumerate(_best_in_groups(th, f, alive, group, n_groups, polish)):
        w = None if weights is None else weights[idx[0]]
        best_t, best_f = th[idx[0]].copy(), f[idx[0]]
        for i in idx:
            if polish <= 0:
                break
            t2, f2, _ = _lbfgsb(th[i], data, w, free)
            if f2 < best_f:
                best_t, best_f = t2, f2
        out.append((best_t, float(best_f), th[idx]))
    return out


def _r2(theta, data: _Data) -> float:
    pred = _predict_theta(theta, data)
    ss_res = float(((data.loss - pred) ** 2).sum())
    ss_tot = float(((data.loss - data.loss.mean()) ** 2).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")


def _predict_theta(theta, data: _Data) -> np.ndarray:
    a, al, b, be, e, ph = map(float, theta)
    neff = data.n_once + np.exp(ph * data.logr) * data.n_rec
    return math.exp(e) + np.exp(a - al * np.log(neff)) + np.exp(b - be * data.logD)


def _boot_weights(df, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """(n_boot, n) multiplicities: block bootstrap over (budget, r) cells, else over runs."""
    n = len(df)
    if "budget" in df.columns:
        keys = list(zip(df["budget"].to_numpy(float), df["r"].to_numpy(float)))
        uniq = {k: i for i, k in enumerate(dict.fromkeys(keys))}
        cell = np.array([uniq[k] for k in keys])
        n_cells = len(uniq)
        draws = rng.integers(0, n_cells, size=(n_boot, n_cells))
        counts = np.stack([np.bincount(d, minlength=n_cells) for d in draws])
        return counts[:, cell].astype(float)
    draws = rng.integers(0, n, size=(n_boot, n))
    return np.stack([np.bincount(d, minlength=n) for d in draws]).astype(float)


def is_chinchilla(df) -> bool:
    """True when phi is not identifiable: no run with r > 1, or every n_rec is 0."""
    return not bool(((df["r"].to_numpy(float) > 1) & (df["n_rec"].to_numpy(float) > 0)).any())


def fit(df, restarts: int = 500, seed: int = 0, fix: dict | None = None, bootstrap: int = 0,
        boot_restarts: int | None = None, per_r: bool = False, polish: int = 3,
        chinchilla: bool | None = None) -> FitResult:
    """Fit the joint law to a runs table (see the module docstring for the method).

    restarts: random starts (uniform in the box, numpy Generator seeded by `seed`);
    fix: parameters held fixed (A, alpha, B, beta, E, phi; natural units), removed from the
    optimisation; bootstrap: number of block-bootstrap resamples (2.5/97.5 percentiles of every
    free parameter in `ci`); boot_restarts: None (default) is the paper's literal protocol,
    `restarts` random starts per resample and the best kept; an int k instead uses warm starts
    at the full-data optimum and the full fit's other distinct local minima plus k random
    starts (faster, an approximation); per_r: also fit a Chinchilla law per r (`per_r` dict);
    chinchilla: force (True) or forbid (False) the Chinchilla law; default: automatic.
    """
    t0 = time.perf_counter()
    df = _validate(df)
    if chinchilla is None:
        chinchilla = is_chinchilla(df)
    fixed = _parse_fix(fix)
    if chinchilla:
        fixed = {i: v for i, v in fixed.items() if i != 5}
        fixed[5] = 0.0
    free = np.ones(6, bool)
    free[list(fixed)] = False
    k = int(free.sum())
    if len(df) < k + 1:
        raise FitError(f"too few runs to fit: {len(df)} run(s) for {k} free parameters (need at least {k + 1})")
    if restarts < 1:
        raise FitError("restarts must be at least 1")
    data = _Data.from_frame(df, chinchilla=chinchilla)
    ss = np.random.SeedSequence(seed)
    rng_starts, rng_boot, rng_bstarts = (np.random.default_rng(s) for s in ss.spawn(3))
    starts = _starts(rng_starts, restarts, fixed)
    ((theta, fbest, minima),) = _solve(data, starts, free, polish=polish)
    params = _theta_to_params(theta, chinchilla)
    res = FitResult(**params, r2=_r2(theta, data), huber=fbest, n_runs=len(df), restarts=restarts,
                    law="chinchilla" if chinchilla else "joint",
                    fixed={REPORT[i]: (math.exp(v) if i in (0, 2, 4) else v)
                           for i, v in fixed.items() if not (chinchilla and i == 5)},
                    seed=seed, bootstrap=bootstrap, theta=tuple(map(float, theta)))
    if bootstrap > 0:
        W = _boot_weights(df, rng_boot, bootstrap)
        if boot_restarts is None:   # the literal protocol: `restarts` random starts per resample
            blocks = [_starts(rng_bstarts, restarts, fixed) for _ in range(bootstrap)]
        else:                       # warm starts + boot_restarts random starts
            warm = np.vstack([theta[None, :], minima[:10]])
            blocks = [np.vstack([warm, _starts(rng_bstarts, boot_restarts, fixed)]) for _ in range(bootstrap)]
        per = len(blocks[0])
        chunk = max(1, int(BOOT_CHUNK // (per * len(df))))
        thetas = []
        for c0 in range(0, bootstrap, chunk):
            c1 = min(bootstrap, c0 + chunk)
            st = np.vstack(blocks[c0:c1])
            grp = np.repeat(np.arange(c1 - c0), per)
            sols = _solve(data, st, free, weights=W[c0:c1][grp], group=grp, n_groups=c1 - c0, polish=1)
            thetas += [s[0] for s in sols]
        T = np.array(thetas)
        nat = T.copy()
        nat[:, [0, 2, 4]] = np.exp(nat[:, [0, 2, 4]])
        res.boot_samples = nat
        for i, name in enumerate(REPORT):
            if free[i]:
                lo, hi = np.percentile(nat[:, i], [2.5, 97.5])
                res.ci[name] = (float(lo), float(hi))
    if per_r:
        for r in sorted(df["r"].unique()):
            sub = df[df["r"] == r].reset_index(drop=True)
            res.per_r[float(r) if r % 1 else int(r)] = fit(sub, restarts=restarts, seed=seed, fix=fix,
                                                          polish=polish, chinchilla=True)
    res.seconds = time.perf_counter() - t0
    return res


def predict(result: FitResult, n_once, n_rec, r, tokens):
    """Loss of the fitted law (nats); phi None means N = n_once + n_rec (Chinchilla)."""
    n_once, n_rec, r, tokens = (np.asarray(v, float) for v in (n_once, n_rec, r, tokens))
    n = n_once + n_rec if result.phi is None else n_once + r ** result.phi * n_rec
    return result.E + result.A * n ** (-result.alpha) + result.B * tokens ** (-result.beta)


def residuals(result: FitResult, df) -> np.ndarray:
    """Actual minus predicted loss (nats) for every run of df."""
    return df["loss"].to_numpy(float) - predict(result, df["n_once"], df["n_rec"], df["r"], df["tokens"])


# --------------------------------------------------------------------------------------------
# Iso-FLOP minima, effective sizes, compute-optimal allocation
# --------------------------------------------------------------------------------------------

def iso_flop_minima(df) -> "pd.DataFrame":
    """Per (budget, r) cell with >= 3 runs: the parabola of loss in log N (N = n_once + n_rec,
    unique params) and its vertex.  Columns budget, r, n_runs, n_star, loss_star, tokens_star
    (tokens interpolated log-linearly in log N at the vertex), inside (vertex within the
    cell's range of N), opens_up (positive curvature; otherwise the vertex is a maximum)."""
    import pandas as pd

    df = _validate(df)
    if "budget" not in df.columns:
        raise FitError("iso-FLOP minima need a budget column")
    rows = []
    for (c, r), g in df.groupby(["budget", "r"], sort=True):
        if len(g) < 3:
            continue
        u = np.log(g["n_once"].to_numpy() + g["n_rec"].to_numpy())
        y = g["loss"].to_numpy()
        c2, c1, c0 = np.polyfit(u, y, 2)
        opens = c2 > 0
        us = -c1 / (2 * c2) if c2 != 0 else float("nan")
        ls = c0 + c1 * us + c2 * us * us
        k1, k0 = np.polyfit(u, np.log(g["tokens"].to_numpy()), 1)
        rows.append(dict(budget=c, r=int(r) if float(r).is_integer() else r, n_runs=len(g),
                         n_star=float(np.exp(us)), loss_star=float(ls), tokens_star=float(np.exp(k0 + k1 * us)),
                         inside=bool(u.min() <= us <= u.max()), opens_up=bool(opens)))
    return pd.DataFrame(rows, columns=["budget", "r", "n_runs", "n_star", "loss_star", "tokens_star",
                                       "inside", "opens_up"])


def _cfg_at_width(preset, r: int, d: float, injection=None, bptt_k=None):
    """The preset's iso-depth model at a continuous width d (for interpolating the accounting)."""
    from dataclasses import replace

    from .config import model_config
    return replace(model_config(preset, r=r, s=10, injection=injection, bptt_k=bptt_k), d_model=d, s=None)


def effective_sizes(preset="paper", r: int = 4, s: float = 32, phi: float = 0.459,
                    injection: str | None = None, bptt_k: int | None = None) -> dict:
    """Three sizes of a looped model (and of the plain model of the same width, for scale).

    unique: N = N_once + N_rec (what is stored); loss_equivalent: the plain N with the same
    fitted loss, N_once + r^phi N_rec; compute_equivalent: N of the plain model whose training
    FLOPs per token (accounting.flops_per_token) equal this model's (continuous width).
    Ratios are to the plain model at the same width.  `block_*` ratios count transformer blocks
    only (the paper's worked example, (2+4+2)/20 and (4 + 4^phi 4)/20): the exact figures also
    include the 2d^2 injection in N_rec and the model norms.
    """
    from scipy.optimize import brentq

    from . import accounting as acc
    from .config import model_config

    cfg = model_config(preset, r=r, s=s, injection=injection, bptt_k=bptt_k)
    plain = model_config(preset, r=1, s=s)
    no, nr = acc.n_once(cfg), acc.n_rec(cfg)
    n_plain = acc.n_params(plain)
    fl = acc.flops_per_token(cfg)
    d = plain.d_model
    fplain = lambda x: acc.flops_per_token(_cfg_at_width(preset, 1, x)) - fl  # noqa: E731
    d_ce = brentq(fplain, 1e-3, 64 * d)
    n_ce = acc.n_params(_cfg_at_width(preset, 1, d_ce))
    p = cfg
    depth = p.n_prelude + p.n_coda + p.n_loop_layers            # unique blocks
    eff_depth = p.n_prelude + p.n_coda + (p.n_loop_layers * r if cfg.looped else p.n_loop_layers)
    once_blocks = p.n_prelude + p.n_coda + (0 if cfg.looped else p.n_loop_layers)
    rec_blocks = p.n_loop_layers if cfg.looped else 0
    return {
        "r": r, "s": s, "d_model": cfg.d_model, "phi": phi,
        "n_once": no, "n_rec": nr, "unique": no + nr,
        "loss_equivalent": no + r ** phi * nr,
        "compute_equivalent": float(n_ce), "flops_per_token": fl,
        "plain_unique": n_plain, "plain_flops_per_token": acc.flops_per_token(plain),
        "unique_ratio": (no + nr) / n_plain, "loss_equivalent_ratio": (no + r ** phi * nr) / n_plain,
        "compute_equivalent_ratio": n_ce / n_plain,
        "block_unique_ratio": depth / eff_depth,
        "block_loss_equivalent_ratio": (once_blocks + r ** phi * rec_blocks) / eff_depth,
    }


def runs_from_minima(path_or_df, preset="paper") -> "pd.DataFrame":
    """Turn published iso-FLOP minima (budget_flops, r, n_star_unique_millions, loss_star_nats)
    into runs the fitter takes.  For every cell the continuous width d at which the preset's
    iso-depth model has N = N* is found from the accounting; n_once / n_rec are split in that
    architecture's proportion (summing to N* exactly) and D = C / flops_per_token(width d)."""
    import pandas as pd
    from scipy.optimize import brentq

    from . import accounting as acc
    t = pd.read_csv(path_or_df) if not isinstance(path_or_df, pd.DataFrame) else path_or_df
    rows = []
    for row in t.itertuples():
        r, n_star, c = int(row.r), row.n_star_unique_millions * 1e6, float(row.budget_flops)
        d = brentq(lambda x: acc.n_params(_cfg_at_width(preset, r, x)) - n_star, 1.0, 1e6)
        cfg = _cfg_at_width(preset, r, d)
        no, nr = acc.n_once(cfg), acc.n_rec(cfg)
        k = n_star / (no + nr)
        rows.append(dict(budget=c, r=r, d_model=d, n_once=no * k, n_rec=nr * k,
                         tokens=c / acc.flops_per_token(cfg), loss=float(row.loss_star_nats)))
    return pd.DataFrame(rows)


def compute_optimal(result: FitResult, preset="paper", r=(1, 2, 4, 8), budgets=None, s_grid=None,
                    injection: str | None = None, bptt_k: int | None = None) -> "pd.DataFrame":
    """Compute-optimal allocation under the fitted law: for each r and budget C, minimise the
    predicted loss over the preset's widths (s_grid, deduplicated by d_model) with D = C / F,
    F = accounting.flops_per_token of that architecture (injection / bptt_k passed through; a
    per-r bptt_k may be given as a callable r -> k).  Returns the grid argmin (s, d_model, n, n_once,
    n_rec, tokens, loss, tokens_per_param) and a parabola-in-log-N refinement (n_star, loss_star)."""
    import pandas as pd

    from . import accounting as acc
    from .config import model_config
    rs = [r] if np.isscalar(r) else list(r)
    budgets = [4.64e17, 1e18, 2.15e18, 4.64e18, 1e19, 2.15e19] if budgets is None else list(budgets)
    s_grid = np.arange(2, 160, 1.0) if s_grid is None else np.asarray(s_grid, float)
    rows = []
    for rr in rs:
        k = bptt_k(rr) if callable(bptt_k) else bptt_k
        cfgs, seen = [], set()
        for s in s_grid:
            cfg = model_config(preset, r=rr, s=float(s), injection=injection if rr > 1 else None,
                               bptt_k=k if (k is None or k <= rr) else None)
            if cfg.d_model not in seen:
                seen.add(cfg.d_model)
                cfgs.append(cfg)
        no = np.array([acc.n_once(c) for c in cfgs], float)
        nr = np.array([acc.n_rec(c) for c in cfgs], float)
        fl = np.array([acc.flops_per_token(c) for c in cfgs], float)
        for C in budgets:
            D = C / fl
            L = predict(result, no, nr, rr, D)
            i = int(np.argmin(L))
            u = np.log(no + nr)
            n_s, l_s = no[i] + nr[i], L[i]
            if 0 < i < len(L) - 1:
                c2, c1, c0 = np.polyfit(u[i - 1:i + 2], L[i - 1:i + 2], 2)
                if c2 > 0:
                    us = -c1 / (2 * c2)
                    n_s, l_s = float(np.exp(us)), float(c0 + c1 * us + c2 * us * us)
            rows.append(dict(r=rr, budget=C, s=cfgs[i].s, d_model=cfgs[i].d_model, n=no[i] + nr[i],
                             n_once=no[i], n_rec=nr[i], tokens=D[i], loss=L[i],
                             tokens_per_param=D[i] / (no[i] + nr[i]), n_star=n_s, loss_star=l_s,
                             at_edge=i in (0, len(L) - 1)))
    return pd.DataFrame(rows)


def _law_dict(law) -> dict:
    """A, alpha, B, beta, E, phi from a FitResult or a dict (phi None or absent: Chinchilla, N unique)."""
    get = (lambda k: law.get(k)) if isinstance(law, dict) else (lambda k: getattr(law, k))
    out = {k: get(k) for k in REPORT}
    for k in ("A", "alpha", "B", "beta", "E"):
        if out[k] is None:
            raise FitError(f"the law has no value for {k}")
        out[k] = float(out[k])
    return out


def _width_polynomials(preset, r: int, injection=None, bptt_k=None) -> np.ndarray:
    """Coefficients (3 rows: n_once, n_rec, flops_per_token; columns d^0, d^1, d^2) of the
    accounting as exact quadratics in the width d (every term of `accounting` is of degree <= 2)."""
    from . import accounting as acc
    ds = np.array([1.0, 2.0, 3.0])
    vals = np.array([[f(_cfg_at_width(preset, r, d, injection, bptt_k)) for d in ds]
                     for f in (acc.n_once, acc.n_rec, acc.flops_per_token)], float)
    return np.linalg.solve(np.vander(ds, 3, increasing=True), vals.T).T


def compute_optimal_frontier(law, preset="paper", r=(1, 2, 4, 8), budgets=None,
                             injection: str | None = None, bptt_k=None,
                             d_bounds=(8.0, 1e6)) -> "pd.DataFrame":
    """The compute-optimal frontier of a law with the width treated as continuous.

    Like `compute_optimal`, but instead of the preset's discrete widths the loss
    L(d) = E + A N_eff(d)^(-alpha) + B (C / F(d))^(-beta) is minimised over a continuous width
    d (the accounting is an exact quadratic in d), so N*, D* and L* are smooth in C.  `law` is a
    FitResult or a dict with A, alpha, B, beta, E, phi.  injection / bptt_k as in
    `compute_optimal` (bptt_k may be a callable r -> k).  One row per (r, budget): d_model,
    n_star (unique non-embedding params), n_once, n_rec, n_eff, tokens_star (= C / F),
    tokens_per_param (D* / N*), flops_per_token (training, F), loss_star, at_edge (the optimum
    hit d_bounds)."""
    import pandas as pd
    from scipy.optimize import minimize_scalar

    p = _law_dict(law)
    rs = [r] if np.isscalar(r) else list(r)
    budgets = [4.64e17, 1e18, 2.15e18, 4.64e18, 1e19, 2.15e19] if budgets is None else list(budgets)
    lo, hi = np.log(d_bounds[0]), np.log(d_bounds[1])
    grid = np.linspace(lo, hi, 241)
    rows = []
    for rr in rs:
        k = bptt_k(rr) if callable(bptt_k) else bptt_k
        k = None if (k is None or k >= rr) else k
        poly = _width_polynomials(preset, rr, injection if rr > 1 else None, k)
        gain = 1.0 if p["phi"] is None else float(rr) ** p["phi"]

        def parts(u):
            d = np.exp(u)
            no, nr, fl = (c[0] + c[1] * d + c[2] * d * d for c in poly)
            return no, nr, fl

        for C in budgets:
            def loss(u):
                no, nr, fl = parts(u)
                return p["E"] + p["A"] * (no + gain * nr) ** (-p["alpha"]) + p["B"] * (C / fl) ** (-p["beta"])

            i = int(np.argmin(loss(grid)))
            a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
            u = minimize_scalar(loss, bounds=(a, b), method="bounded", options={"xatol": 1e-10}).x
            no, nr, fl = (float(v) for v in parts(u))
            n = no + nr
            rows.append(dict(r=rr, budget=float(C), d_model=float(np.exp(u)), n_star=n, n_once=no, n_rec=nr,
                             n_eff=no + gain * nr, tokens_star=C / fl, tokens_per_param=C / fl / n,
                             flops_per_token=fl, loss_star=float(loss(u)),
                             at_edge=bool(u - lo < 1e-6 or hi - u < 1e-6)))
    return pd.DataFrame(rows)


def compute_optimal_for_loss(law, target: float, preset="paper", r=(1, 2, 4, 8), injection: str | None = None,
                             bptt_k=None, budget_bounds=(1e12, 1e30)) -> "pd.DataFrame":
    """For each r, the compute-optimal model (on `compute_optimal_frontier`) whose predicted loss
    equals `target`: the smallest training budget that reaches it, and that model.  Raises
    FitError when the target is at or below the law's floor E or outside budget_bounds."""
    import pandas as pd
    from scipy.optimize import brentq

    p = _law_dict(law)
    if not target > p["E"]:
        raise FitError(f"target loss {target:g} is not above the law's irreducible loss E = {p['E']:g}")
    rs = [r] if np.isscalar(r) else list(r)
    out = []
    for rr in rs:
        def gap(logc):
            return compute_optimal_frontier(p, preset, rr, [math.exp(logc)], injection, bptt_k)["loss_star"].iloc[0] - target

        a, b = math.log(budget_bounds[0]), math.log(budget_bounds[1])
        if gap(a) < 0 or gap(b) > 0:
            raise FitError(f"target loss {target:g} is not reached for r={rr} within budgets {budget_bounds}")
        logc = brentq(gap, a, b, xtol=1e-10)
        out.append(compute_optimal_frontier(p, preset, rr, [math.exp(logc)], injection, bptt_k).assign(target=target))
    return pd.concat(out, ignore_index=True)


# --------------------------------------------------------------------------------------------
# Synthetic runs, CLI, benchmark
# --------------------------------------------------------------------------------------------

PAPER_LAW = dict(A=28.027, alpha=0.19924, B=915.82, beta=0.36863, E=1.56773, phi=0.459)


def paper_grid(study: str = "main", grids=None, batch_tokens: int = 262_144) -> "pd.DataFrame":
    """The paper's run grid (runs/paper/grids.csv, via `looped.sweep.load_study`) with the
    accounting's n_once, n_rec and tokens."""
    import pandas as pd

    from . import accounting as acc
    from .sweep import GRID_FILES, load_study
    rows = []
    for run in load_study(study, GRID_FILES["paper"] if grids is None else grids, preset="paper"):
        cfg = run.model_config()
        rows.append(dict(study=study, budget=run.budget, r=run.r, s=run.s, injection=cfg.injection,
                         bptt_k=cfg.k_bwd, n_once=acc.n_once(cfg), n_rec=acc.n_rec(cfg),
                         tokens=acc.tokens_for_budget(cfg, run.budget, batch_tokens)))
    return pd.DataFrame(rows)


def synthetic_runs(law: dict | None = None, noise: float = 0.01, seed: int = 0, grid=None) -> "pd.DataFrame":
    """Runs of the grid (default: the paper's 116-run main grid) with losses from `law`
    (default: the paper's joint fit) plus Gaussian noise of `noise` nats."""
    law = dict(PAPER_LAW, **(law or {}))
    df = (paper_grid() if grid is None else grid).copy()
    neff = df["n_once"] + df["r"] ** law["phi"] * df["n_rec"]
    clean = law["E"] + law["A"] * neff ** (-law["alpha"]) + law["B"] * df["tokens"] ** (-law["beta"])
    df["loss"] = clean + np.random.default_rng(seed).normal(0.0, noise, len(df))
    df["status"] = "ok"
    return df


def format_result(res: FitResult) -> str:
    """A readable table: parameter, value, bootstrap interval (when there is one)."""
    lines = [f"{res.law} law fit: {res.n_runs} runs, {res.restarts} restarts, seed {res.seed}"
             + (f", {res.bootstrap} bootstrap resamples" if res.bootstrap else "")]
    head = f"  {'param':<6} {'value':>12}"
    if res.ci:
        head += f" {'2.5%':>12} {'97.5%':>12}"
    lines.append(head)
    for name in REPORT:
        v = getattr(res, name)
        if v is None:
            lines.append(f"  {name:<6} {'n/a':>12}   (not identifiable: no looped runs)")
            continue
        row = f"  {name:<6} {v:>12.6g}"
        if name in res.fixed:
            row += "   (fixed)"
        elif name in res.ci:
            row += f" {res.ci[name][0]:>12.6g} {res.ci[name][1]:>12.6g}"
        lines.append(row)
    lines.append(f"  R^2 (nats) {res.r2:.5f}   Huber sum {res.huber:.6e}   n_runs {res.n_runs}")
    for r, sub in res.per_r.items():
        lines.append(f"  per-r Chinchilla r={r}: A={sub.A:.4g} alpha={sub.alpha:.4g} B={sub.B:.4g} "
                     f"beta={sub.beta:.4g} E={sub.E:.4g} R^2={sub.r2:.4f} Huber={sub.huber:.3e}")
    return "\n".join(lines)


def _parse_fix_args(items) -> dict:
    out = {}
    for it in items or []:
        for part in it.split(","):
            if "=" not in part:
                raise FitError(f"--fix expects NAME=VALUE, got {part!r}")
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's own convention)
        raise FitError(message)


def main(argv=None) -> int:
    """`looped fit PATH [--restarts 500] [--seed 0] [--fix phi=0.5 ...] [--bootstrap B] [--per-r]
    [--json OUT] [--study NAME]`."""
    ap = _Parser(prog="looped fit", description="Fit the joint scaling law (phi) to a runs table.")
    ap.add_argument("path", help="runs CSV or a directory of run-record JSON files")
    ap.add_argument("--restarts", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                    help="hold a parameter fixed (A, alpha, B, beta, E, phi); repeatable")
    ap.add_argument("--bootstrap", type=int, default=0, metavar="B", help="block-bootstrap resamples")
    ap.add_argument("--boot-restarts", type=int, default=-1,
                    help="-1 (default): --restarts random restarts per resample (the paper's protocol); "
                         "k >= 0: warm starts at the full fit's minima plus k random restarts")
    ap.add_argument("--per-r", action="store_true", help="also fit a Chinchilla law per r")
    ap.add_argument("--json", metavar="OUT", help="write the result as JSON")
    ap.add_argument("--study", help="only runs of this study")
    try:
        a = ap.parse_args(argv)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # _validate already printed them to stderr
            df = load_runs(a.path)
            if a.study is not None:
                if "study" not in df.columns:
                    raise FitError(f"--study {a.study}: the runs have no study column")
                df = df[df["study"].astype(str) == a.study].reset_index(drop=True)
                if not len(df):
                    raise FitError(f"--study {a.study}: no runs of that study")
            res = fit(df, restarts=a.restarts, seed=a.seed, fix=_parse_fix_args(a.fix), bootstrap=a.bootstrap,
                      boot_restarts=None if a.boot_restarts < 0 else a.boot_restarts, per_r=a.per_r)
        print(format_result(res))
        if a.json:
            try:
                Path(a.json).write_text(json.dumps(res.to_dict(), indent=2) + "\n")
            except OSError as e:
                raise FitError(f"cannot write {a.json}: {e.strerror or e}") from None
    except FitError as e:
        print(f"looped fit: error: {str(e).splitlines()[0] if str(e) else 'bad input'}", file=sys.stderr)
        return 2
    return 0


def benchmark(argv=None) -> int:
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
    df = synthetic_runs(seed=a.seed)
    data = _Data.from_frame(df)
    free = np.ones(6, bool)
    R, B = a.restarts, a.bootstrap
    boot_restarts = None if a.boot_restarts < 0 else a.boot_restarts
    print(f"synthetic paper main grid: {len(df)} runs, law {PAPER_LAW}, noise 0.01 nats")
    _lbfgsb(LO + WIDTH / 2, data, None, free)          # import scipy outside the timings
    total_fits = R * (B + 1)
    t = time.perf_counter()
    res = fit(df, restarts=R, seed=a.seed, bootstrap=B, boot_restarts=boot_restarts)
    fast = time.perf_counter() - t
    what = (f"full protocol: {R} restarts x (1 + {B} resamples) = {total_fits:,} local solves" if boot_restarts is None
            else f"warm-start shortcut: {R} restarts + {B} resamples x (11 warm + {boot_restarts} random) starts")
    print(f"{what}: {fast:.2f} s")
    print(f"  phi = {res.phi:.4f}  CI {res.ci.get('phi')}  Huber {res.huber:.12e}  R^2 {res.r2:.5f}")
    ss = np.random.SeedSequence(a.seed).spawn(3)
    starts = _starts(np.random.default_rng(ss[0]), R, {})       # the main fit's starts
    t = time.perf_counter()
    _solve(data, starts, free)
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

    ((_, f_k, _),) = _solve(data, starts[:k], free)
    show(f"main fit, first {k} starts: batched", f_k, fref, "serial scipy")
    ((_, f_np, _),) = _solve(data, starts, free, prune_gap=None)
    show(f"main fit, all {R} starts: fit()", res.huber, f_np, "unpruned")
    if boot_restarts is None and B > 0 and a.check_resamples > 0:
        W = _boot_weights(df, np.random.default_rng(ss[1]), B)
        rng_b = np.random.default_rng(ss[2])
        m = min(a.check_resamples, B)
        kb = min(a.check_restarts, R)
        for i in range(m):
            st = _starts(rng_b, R, {})                           # resample i's starts in fit()
            w = W[i]
            th_w = np.array(res.boot_samples[i], float)
            th_w[[0, 2, 4]] = np.log(th_w[[0, 2, 4]])
            f_fit = float(_objective(th_w[None], data, w[None], order=0)[0])
            _, fs, _, _ = serial_fit(data, st[:kb], free, weights=w)
            ((_, fb, _),) = _solve(data, st[:kb], free, weights=np.repeat(w[None], kb, 0), polish=1)
            show(f"resample {i}, first {kb} starts: batched", fb, fs, "serial scipy")
            ((_, fu, _),) = _solve(data, st, free, weights=np.repeat(w[None], R, 0), polish=1, prune_gap=None)
            show(f"resample {i}, all {R} starts: fit()", f_fit, fu, "unpruned")
    print(f"{'OK' if all(checks) else 'FAIL'}: {sum(checks)}/{len(checks)} checks within 1e-6")
    return 0 if all(checks) else 1


# --------------------------------------------------------------------------------------------
# Case studies: refit on (case-study runs, r > 1) + (plain r = 1 runs) vs the baseline refit
# --------------------------------------------------------------------------------------------

def _as_runs(runs):
    """A runs table from a DataFrame, a CSV / record folder, or None; a missing folder, a folder
    without records or None give an empty table (a sweep that has not started yet)."""
    import pandas as pd

    empty = pd.DataFrame(columns=list(REQUIRED) + ["budget"])
    if runs is None:
        return empty
    if isinstance(runs, pd.DataFrame):
        return _validate(runs) if len(runs) else empty
    p = Path(runs)
    if not p.exists() or (p.is_dir() and not any(p.rglob("*.json"))):
        return empty
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_runs(p)


def _in_budgets(df, budgets) -> np.ndarray:
    b = df["budget"].to_numpy(float)
    return np.isclose(b[:, None], np.asarray(budgets, float)[None, :], rtol=1e-6, atol=0).any(1)


def _sorted_cells(df):
    """Rows ordered by (budget, r, width): the bootstrap then numbers the cells the same way in
    every table that holds the same cells, so two fits with one seed draw paired resamples."""
    keys = [c for c in ("budget", "r", "n_once", "n_rec") if c in df.columns]
    return df.sort_values(keys, kind="stable").reset_index(drop=True)


def case_study_runs(main, study, budgets=None, study_r=None):
    """The two runs tables of a case study (paper-facts section 6).

    baseline: every run of the main study at the case-study budgets (all r);
    variant: the main study's plain r = 1 runs at those budgets plus the case study's runs
    with r > 1 (only r in `study_r` when given).  `budgets` defaults to the budgets present in
    the case-study runs (to all budgets of the main study while there are none).  Both inputs may be DataFrames or record folders / CSV files.
    Returns (baseline, variant), each sorted by (budget, r, size).
    """
    import pandas as pd

    main, study = _as_runs(main), _as_runs(study)
    for name, df in (("main", main), ("case study", study)):
        if len(df) and "budget" not in df.columns:
            raise FitError(f"{name} runs need a budget column")
    study = study[study["r"].astype(float) > 1] if len(study) else study
    if study_r is not None and len(study):
        study = study[study["r"].astype(float).isin([float(r) for r in study_r])]
    if budgets is None:   # the case study's budgets; all of the main study's while it has no runs
        src = study if len(study) else main
        budgets = sorted(src["budget"].astype(float).unique()) if len(src) else []
    budgets = [float(b) for b in budgets]
    base = main[_in_budgets(main, budgets)] if len(main) and budgets else main.iloc[0:0]
    study = study[_in_budgets(study, budgets)] if len(study) and budgets else study.iloc[0:0]
    plain = base[base["r"].astype(float) == 1]
    variant = pd.concat([plain, study], ignore_index=True) if len(study) else plain.iloc[0:0]
    return _sorted_cells(base), _sorted_cells(variant)


@dataclass
class CaseStudy:
    """A case-study refit beside its baseline (see `case_study`).  A fit that was skipped for
    lack of runs is None, with the reason in `note`."""
    name: str
    budgets: list
    baseline_runs: "pd.DataFrame"
    variant_runs: "pd.DataFrame"
    baseline: FitResult | None
    variant: FitResult | None
    note: str = ""
    study_runs: int = 0

    @property
    def ok(self) -> bool:
        """Both fits were done and phi is identifiable in both."""
        return (self.baseline is not None and self.variant is not None
                and self.baseline.phi is not None and self.variant.phi is not None)

    @property
    def delta_phi(self) -> float | None:
        """phi(variant) - phi(baseline)."""
        return self.variant.phi - self.baseline.phi if self.ok else None

    @property
    def paired(self) -> bool:
        """Both tables hold the same (budget, r) cells, so the two bootstraps (same seed) drew
        the same cells: their phi samples are paired and `delta_phi_ci` is meaningful."""
        if not self.ok or self.baseline.boot_samples is None or self.variant.boot_samples is None:
            return False
        cells = lambda df: sorted(set(zip(df["budget"].astype(float), df["r"].astype(float))))  # noqa: E731
        return cells(self.baseline_runs) == cells(self.variant_runs)

    @property
    def delta_phi_ci(self) -> tuple | None:
        """(2.5%, 97.5%) percentiles of the paired bootstrap differences of phi, when paired."""
        if not self.paired:
            return None
        d = self.variant.boot_samples[:, 5] - self.baseline.boot_samples[:, 5]
        lo, hi = np.percentile(d, [2.5, 97.5])
        return float(lo), float(hi)

    def table(self) -> "pd.DataFrame":
        """One row per fit (baseline, variant): runs, phi with its bootstrap interval, alpha,
        beta, E, A, B, R^2; NaN where a fit was skipped."""
        import pandas as pd
        rows = []
        for label, res, runs in (("baseline", self.baseline, self.baseline_runs),
                                 (self.name, self.variant, self.variant_runs)):
            row = {"fit": label, "runs": len(runs)}
            for k in ("phi", "phi_lo", "phi_hi", "alpha", "beta", "E", "A", "B", "r2"):
                row[k] = float("nan")
            if res is not None:
                for k in ("alpha", "beta", "E", "A", "B", "r2"):
                    row[k] = getattr(res, k)
                if res.phi is not None:
                    row["phi"] = res.phi
                    row["phi_lo"], row["phi_hi"] = res.ci.get("phi", (float("nan"), float("nan")))
            rows.append(row)
        return pd.DataFrame(rows)


def case_study(main, study, name: str = "case study", budgets=None, study_r=None, restarts: int = 500,
               seed: int = 0, bootstrap: int = 0, boot_restarts: int | None = None,
               min_runs: int = 12, min_study_runs: int = 6, min_budgets: int = 2,
               baseline: FitResult | None = None) -> CaseStudy:
    """The paper's case-study protocol: refit all six parameters on the case study's runs
    (r > 1) plus the main study's r = 1 runs, and refit the baseline on the main study's runs
    at the same budgets (see `case_study_runs`).  Both fits use the same restarts and seed.

    A fit is skipped (None, with a reason in `note`) when its table has fewer than `min_runs`
    runs, lacks looped runs or covers fewer than `min_budgets` budgets (at one budget the tokens
    are a function of the width, so the N and D terms of the law cannot be told apart), and the
    case-study fit also when the case study contributes fewer than `min_study_runs` runs: a
    study whose sweep has not (fully) run yet.
    With `bootstrap` > 0 and the same (budget, r) cells in both tables, the two bootstraps are
    paired (`CaseStudy.delta_phi_ci`).  `baseline`: a baseline fit already done on the same
    runs and budgets (e.g. by another `case_study` call), reused instead of refitted.
    """
    base, var = case_study_runs(main, study, budgets, study_r)
    budgets = sorted(base["budget"].astype(float).unique()) if len(base) else []
    n_study = int((var["r"].astype(float) > 1).sum()) if len(var) else 0
    notes = []

    def attempt(df, label, extra_ok=True, why=""):
        if not extra_ok:
            notes.append(f"{label}: {why}; fit skipped")
            return None
        if len(df) < min_runs or is_chinchilla(df):
            have = f"{len(df)} run(s)" + ("" if len(df) == 0 or not is_chinchilla(df) else ", none looped")
            notes.append(f"{label}: {have}, need at least {min_runs} with looped runs; fit skipped")
            return None
        n_budgets = df["budget"].astype(float).nunique()
        if n_budgets < min_budgets:
            notes.append(f"{label}: runs at {n_budgets} budget(s), need at least {min_budgets}; fit skipped")
            return None
        return fit(df, restarts=restarts, seed=seed, bootstrap=bootstrap, boot_restarts=boot_restarts)

    if baseline is not None:
        if baseline.n_runs != len(base):
            raise FitError(f"the given baseline fit has {baseline.n_runs} runs, the baseline table {len(base)}")
    else:
        baseline = attempt(base, "baseline")
    variant = attempt(var, name, n_study >= min_study_runs,
                      f"{n_study} case-study run(s) with r > 1, need at least {min_study_runs}")
    return CaseStudy(name=name, budgets=budgets, baseline_runs=base, variant_runs=var, baseline=baseline,
                     variant=variant, note="; ".join(notes), study_runs=n_study)
