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
   the box, same resample) are merged: only the lowest one continues.
3. The best few distinct end points are POLISHED with scipy L-BFGS-B (analytic gradient,
   ftol 1e-15, gtol 1e-12, up to 10,000 iterations), so the reported optimum is a
   converged L-BFGS-B optimum of exactly the paper's objective.

Bootstrap resamples (block bootstrap over (budget, r) cells; over runs when there is no
budget column) get the SAME full random-restart protocol by default (``boot_restarts=None``
means as many restarts as the main fit), batched many resamples at a time; each resample's
restart set also contains the full-data optimum (a warm start).  ``boot_restarts=k`` uses
the warm start plus k random restarts instead (`looped bench fit` shows both agree).

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

def _batched_solve(theta0: np.ndarray, data: _Data, weights: np.ndarray | None, free: np.ndarray,
                   group: np.ndarray | None = None, maxiter: int = 500, merge_every: int = 2,
                   merge_tol: float = 1e-3, switch_tol: float = 1e-5, ftol: float = 1e-10,
                   pgtol: float = 1e-9):
    """Minimise the objective from every row of theta0 (P, 6) at once.

    weights: (P, n) per-problem run multiplicities (bootstrap) or None.  free: (6,) bool.
    group: (P,) int; restarts are merged only within a group (one group per resample).
    Each restart starts with IRLS curvature (see `_objective`) and switches to the exact
    Hessian once an iteration improves f by less than `switch_tol` (relative); it stops when
    an exact-Newton iteration improves f by less than `ftol` relative, when the projected
    gradient vanishes, or when the trust region collapses (no descent left at machine precision).
    Returns (theta (P, 6), f (P,), alive (P,) bool: not merged into a better restart).
    """
    P = theta0.shape[0]
    group = np.zeros(P, np.int64) if group is None else np.asarray(group, np.int64)
    z = np.clip((theta0 - LO) / WIDTH, 0.0, 1.0)
    newton = np.zeros(P, bool)
    f, g, H = _objective(LO + z * WIDTH, data, weights, order=2, newton=False)
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
        fn, gn, Hn = _objective(LO + znew * WIDTH, data, wi, order=2, newton=nw)
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
            _, g[sw], H[sw] = _objective(LO + z[sw] * WIDTH, data, None if weights is None else weights[sw],
                                         order=2, newton=True)
        if _TRACE:
            print(it, len(idx), int(acc.sum()), int(newton[idx].sum()), float(f[idx].min()), int(alive.sum()))
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


def serial_fit(data: _Data, starts: np.ndarray, free: np.ndarray, weights=None, options=None):
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
           n_groups: int = 1, polish: int = 3):
    """Batched solve of every start, then L-BFGS-B polish of each group's `polish` best distinct
    end points.  Returns per group: (theta*, f*, local minima found (sorted thetas))."""
    th, f, alive = _batched_solve(starts, data, weights, free, group)
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
        boot_restarts: int | None = 10, per_r: bool = False, polish: int = 3,
        chinchilla: bool | None = None) -> FitResult:
    """Fit the joint law to a runs table (see the module docstring for the method).

    restarts: random starts (uniform in the box, numpy Generator seeded by `seed`);
    fix: parameters held fixed (A, alpha, B, beta, E, phi; natural units), removed from the
    optimisation; bootstrap: number of block-bootstrap resamples (2.5/97.5 percentiles of every
    free parameter in `ci`); boot_restarts: random restarts per resample IN ADDITION to warm
    starts at the full-data optimum and at the full fit's other distinct local minima (None:
    the same number as `restarts`); per_r: also fit a Chinchilla law per r (`per_r` dict);
    chinchilla: force (True) or forbid (False) the Chinchilla law; default: automatic.
    """
    t0 = time.perf_counter()
    df = _validate(df) if not hasattr(df, "_looped_validated") else df
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
        nb = restarts if boot_restarts is None else boot_restarts
        warm = np.vstack([theta[None, :], minima[:10]])
        blocks = [np.vstack([warm, _starts(rng_bstarts, nb, fixed)]) for _ in range(bootstrap)]
        per = len(blocks[0])
        chunk = max(1, int(2_000_000 // (per * len(df))))
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
