"""The solver behind `looped.fit`: the paper's objective and a batched restart solver for it.

The joint law L = E + A (N_once + r^phi N_rec)^(-alpha) + B D^(-beta) is fitted in log space,
theta = (a=log A, alpha, b=log B, beta, e=log E, phi), by minimising

    sum over runs of Huber_delta(LSE(a - alpha log N_eff, b - beta log D, e) - log L),  delta = 1e-3,

in the box a, b in [-5, 35], alpha, beta in [0, 2.5], e in [-3, 2], phi in [-3, 3]: the paper's
protocol, the best of 500 local solves started uniformly in the box.  `objective_reference` is
that sum written plainly; `objective` is the same sum for many thetas at once, with its exact
gradient and Hessian.

The paper ran one scipy L-BFGS-B per restart (`serial_fit`, the reference here).  To make 500
restarts times 200 bootstrap resamples cheap, `batched_solve` advances all of them together as
one vectorised, box-projected trust-region Newton iteration, merges restarts that reach the same
basin and stops those that fall far behind their resample's best; `solve_restarts` then polishes
the best few end points with L-BFGS-B (`POLISH_OPTIONS`), so the reported optimum is a converged
L-BFGS-B optimum of exactly the paper's objective.  Torch-free, like `looped.fit`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import huber, logsumexp

THETA_PARAMS = ("a", "alpha", "b", "beta", "e", "phi")    # optimisation coordinates (log A, ..., log E)
LAW_PARAMS = ("A", "alpha", "B", "beta", "E", "phi")      # the law's parameters, reported in natural units


LO = np.array([-5.0, 0.0, -5.0, 0.0, -3.0, -3.0])


HI = np.array([35.0, 2.5, 35.0, 2.5, 2.0, 3.0])


WIDTH = HI - LO


HUBER_DELTA = 1e-3


POLISH_OPTIONS = {"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10_000, "maxfun": 100_000, "maxls": 50}


@dataclass
class RunArrays:
    """Arrays of one runs table, in the form the objective wants."""
    n_once: np.ndarray
    n_rec: np.ndarray
    logr: np.ndarray
    logD: np.ndarray
    logL: np.ndarray
    loss: np.ndarray

    @classmethod
    def from_frame(cls, df, chinchilla: bool = False) -> "RunArrays":
        n_once = df["n_once"].to_numpy(float)
        n_rec = df["n_rec"].to_numpy(float)
        r = df["r"].to_numpy(float)
        if chinchilla:  # N = unique params, r plays no role
            n_once, n_rec, r = n_once + n_rec, np.zeros_like(n_rec), np.ones_like(r)
        loss = df["loss"].to_numpy(float)
        return cls(n_once, n_rec, np.log(r), np.log(df["tokens"].to_numpy(float)), np.log(loss), loss)

    def __len__(self):
        return len(self.loss)


def objective_reference(theta, data: RunArrays, delta: float = HUBER_DELTA) -> float:
    """The fit objective at one theta = (log A, alpha, log B, beta, log E, phi), written plainly:
    the summed Huber loss between the law's log-loss and the observed log-loss."""

    a, alpha, b, beta, e, phi = theta
    n_eff = data.n_once + np.exp(phi * data.logr) * data.n_rec       # N_once + r^phi N_rec
    terms = [a - alpha * np.log(n_eff), b - beta * data.logD, np.full_like(n_eff, e)]
    log_law = logsumexp(terms, axis=0)                               # log(A N_eff^-alpha + B D^-beta + E)
    return float(huber(delta, log_law - data.logL).sum())           # summed over runs, not averaged


def objective(theta: np.ndarray, data: RunArrays, weights: np.ndarray | None = None,
               order: int = 1, delta: float = HUBER_DELTA, newton=True):
    """`objective_reference` for a batch of parameter vectors, with its derivatives.

    theta (P, 6); weights (P, n) or (n,) or None (all 1: each run counted once).
    Returns f (P,), and with order >= 1 the gradient (P, 6), with order 2 the Hessian (P, 6, 6).
    newton (bool or (P,) bool): the exact Hessian (Huber'' = 1 inside delta, 0 outside); where
    False, the Hessian of the IRLS majoriser instead (Huber'' replaced by the secant curvature
    ``Huber'(rho)/rho = min(1, delta/abs(rho))``): positive far from the fit, it makes the early
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


OBJ_BLOCK = 128  # rows per `objective` call in the solver: temporaries stay small (cache, no page faults)


def objective_in_blocks(theta: np.ndarray, data: RunArrays, weights: np.ndarray | None, newton, block: int = OBJ_BLOCK):
    """`objective(..., order=2)` evaluated `block` rows at a time (identical values, row by row):
    numpy temporaries of ~100 kB are recycled by the allocator, while (P, n) arrays of
    thousands of rows are fresh memory (page faults) on every operation: ~2x slower."""
    P = theta.shape[0]
    if P <= block:
        return objective(theta, data, weights, order=2, newton=newton)
    f, g, H = np.empty(P), np.empty((P, 6)), np.empty((P, 6, 6))
    nw = newton if isinstance(newton, bool) else np.asarray(newton)
    for i in range(0, P, block):
        j = min(P, i + block)
        f[i:j], g[i:j], H[i:j] = objective(theta[i:j], data, None if weights is None else weights[i:j],
                                            order=2, newton=nw if isinstance(nw, bool) else nw[i:j])
    return f, g, H


def batched_solve(theta0: np.ndarray, data: RunArrays, weights: np.ndarray | None, free: np.ndarray,
                   group: np.ndarray | None = None, maxiter: int = 500, merge_every: int = 2,
                   merge_tol: float = 1e-3, switch_tol: float = 1e-5, ftol: float = 1e-10,
                   pgtol: float = 1e-9, prune_gap: float | None = 1.0, prune_after: int = 8,
                   block: int = OBJ_BLOCK, trace: bool = False):
    """Minimise the objective from every row of theta0 (P, 6) at once.

    weights: (P, n) per-problem run multiplicities (bootstrap) or None.  free: (6,) bool.
    group: (P,) int; restarts are merged only within a group (one group per resample).
    Each restart starts with IRLS curvature (see `objective`) and switches to the exact
    Hessian once an iteration improves f by less than `switch_tol` (relative); it stops when
    an exact-Newton iteration improves f by less than `ftol` relative, when the projected
    gradient vanishes, or when the trust region collapses (no descent left at machine precision).
    Pruning (prune_gap not None): from iteration `prune_after` on, a restart whose objective
    exceeds (1 + prune_gap) times its group's current best is stopped (not alive).  f only
    decreases along a restart, so a pruned restart could matter only by overtaking the best from
    far behind; `looped bench fit` checks that pruning leaves the optimum unchanged.
    prune_gap=None solves every restart to convergence.  trace prints every iteration.
    Returns (theta (P, 6), f (P,), alive (P,) bool: not merged into / pruned by a better restart).
    """
    P = theta0.shape[0]
    group = np.zeros(P, np.int64) if group is None else np.asarray(group, np.int64)
    n_groups = int(group.max()) + 1 if P else 0
    z = np.clip((theta0 - LO) / WIDTH, 0.0, 1.0)
    newton = np.zeros(P, bool)
    f, g, H = objective_in_blocks(LO + z * WIDTH, data, weights, False, block)
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
        fn, gn, Hn = objective_in_blocks(LO + znew * WIDTH, data, wi, nw, block)
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
            _, g[sw], H[sw] = objective_in_blocks(LO + z[sw] * WIDTH, data, None if weights is None else weights[sw],
                                          True, block)
        if trace:   # one line per iteration: restarts active, accepted, in Newton mode, best f, alive
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


def lbfgsb(theta0: np.ndarray, data: RunArrays, weights: np.ndarray | None, free: np.ndarray,
            options: dict | None = None):
    """One scipy L-BFGS-B solve over the free parameters (analytic gradient); returns (theta, f, nit)."""

    fi = np.flatnonzero(free)
    base = np.clip(np.asarray(theta0, float), LO, HI)
    w = None if weights is None else np.asarray(weights, float)[None, :]

    def fun(v):
        th = base.copy()
        th[fi] = v
        f, g = objective(th[None, :], data, w, order=1)
        return float(f[0]), g[0, fi]

    res = minimize(fun, base[fi], jac=True, method="L-BFGS-B", bounds=list(zip(LO[fi], HI[fi])),
                   options=dict(POLISH_OPTIONS, **(options or {})))
    th = base.copy()
    th[fi] = res.x
    return th, float(res.fun), int(res.nit)


def serial_fit(data: "RunArrays", starts: np.ndarray, free: np.ndarray, weights=None, options=None):
    """Reference: one scipy L-BFGS-B solve per restart, in turn.  Returns (theta*, f*, seconds, nits)."""
    t0 = time.perf_counter()
    best, fbest, nits = None, np.inf, []
    for th0 in starts:
        th, f, nit = lbfgsb(th0, data, weights, free, options)
        nits.append(nit)
        if f < fbest:
            best, fbest = th, f
    return best, fbest, time.perf_counter() - t0, nits


def random_starts(rng: np.random.Generator, k: int, fixed: dict) -> np.ndarray:
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


def solve_restarts(data: RunArrays, starts: np.ndarray, free: np.ndarray, weights=None, group=None,
           n_groups: int = 1, polish: int = 3, **solver):
    """Batched solve of every start, then L-BFGS-B polish of each group's `polish` best distinct
    end points (`solver`: options of `batched_solve`, e.g. prune_gap=None).
    Returns per group: (theta*, f*, local minima found (sorted thetas))."""
    th, f, alive = batched_solve(starts, data, weights, free, group, **solver)
    group = np.zeros(len(starts), np.int64) if group is None else group
    out = []
    for gi, idx in enumerate(_best_in_groups(th, f, alive, group, n_groups, polish)):
        w = None if weights is None else weights[idx[0]]
        best_t, best_f = th[idx[0]].copy(), f[idx[0]]
        for i in idx:
            if polish <= 0:
                break
            t2, f2, _ = lbfgsb(th[i], data, w, free)
            if f2 < best_f:
                best_t, best_f = t2, f2
        out.append((best_t, float(best_f), th[idx]))
    return out


def law_loss(theta, data: RunArrays) -> np.ndarray:
    a, al, b, be, e, ph = map(float, theta)
    neff = data.n_once + np.exp(ph * data.logr) * data.n_rec
    return math.exp(e) + np.exp(a - al * np.log(neff)) + np.exp(b - be * data.logD)
