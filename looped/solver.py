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

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import huber, logsumexp

THETA_PARAMS = ("a", "alpha", "b", "beta", "e", "phi")    # optimisation coordinates (log A, ..., log E)
LAW_PARAMS = ("A", "alpha", "B", "beta", "E", "phi")      # the law's parameters, reported in natural units
LOG_SLOTS = [0, 2, 4]                                      # A, B and E enter theta as their logs


def natural(T, log_slots=LOG_SLOTS) -> np.ndarray:
    """Rows (or one row) of solver coordinates with A, B, E (and any further `log_slots`) back in
    natural units; the other columns as they are.  A copy.  One law: `Law.from_theta`."""
    out = np.array(T, float)
    out[..., log_slots] = np.exp(out[..., log_slots])
    return out


def to_theta(P, log_slots=LOG_SLOTS) -> np.ndarray:
    """Rows (or one row) of law parameters in natural units (A, alpha, B, beta, E, phi, ...) as
    solver coordinates: `natural`'s inverse.  A copy.  One law: `Law.theta`."""
    out = np.array(P, float)
    out[..., log_slots] = np.log(out[..., log_slots])
    return out

LO = np.array([-5.0, 0.0, -5.0, 0.0, -3.0, -3.0])

HI = np.array([35.0, 2.5, 35.0, 2.5, 2.0, 3.0])

WIDTH = HI - LO

HUBER_DELTA = 1e-3


POLISH_OPTIONS = {"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10_000, "maxfun": 100_000, "maxls": 50}


@dataclass
class RunArrays:
    """Arrays of one runs table, in the form the objective wants, and the law's design:

        log L = LSE(a - alpha log(N_once + exp(Z . c) N_rec), b - beta log D, e) + S . o

    theta = (a, alpha, b, beta, e, c_1..c_k, o_1..o_m).  The paper's law is Z = log r (k = 1,
    c = phi) and no offsets; `design` builds the variants: several phis (phi_i = X_i . c), a free
    log kappa (a column of ones in Z), log-loss offsets (columns of S).  A `link` replaces Z . c by a
    nonlinear log multiplier (`looped.mapping`'s bounded mapping): called with c (P, k), it returns
    that log multiplier (P, n), its k first derivatives and k x k second derivatives ((P, n) each)."""
    n_once: np.ndarray
    n_rec: np.ndarray
    logr: np.ndarray
    logD: np.ndarray
    logL: np.ndarray
    loss: np.ndarray
    Z: np.ndarray | None = None     # (n, k): d log(multiplier of N_rec) / d c
    S: np.ndarray | None = None     # (n, m): log-loss offset (shift) columns
    link: object | None = None      # a nonlinear log multiplier in place of Z . c (its `k` coordinates)

    def __post_init__(self):
        self.Z = self.logr[:, None] if self.Z is None else np.asarray(self.Z, float).reshape(len(self.logr), -1)
        n = len(self.logr)
        self.S = np.zeros((n, 0)) if self.S is None else np.asarray(self.S, float).reshape(n, -1)

    def design(self, X=None, kappa: bool = False, offsets=None) -> "RunArrays":
        """These runs with phi_i = X_i . c (X (n, k); default one phi), a free log kappa and offsets (n, m)."""
        X = np.ones((len(self), 1)) if X is None else np.asarray(X, float).reshape(len(self), -1)
        Z = np.column_stack([self.logr[:, None] * X] + [np.ones(len(self))] * kappa)
        return dataclasses.replace(self, Z=Z, S=offsets)

    @property
    def k(self) -> int:
        """How many coordinates c the multiplier of N_rec has."""
        return self.Z.shape[1] if self.link is None else self.link.k

    @property
    def n_params(self) -> int:
        return 5 + self.k + self.S.shape[1]

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
    """The fit objective at one theta = (log A, alpha, log B, beta, log E, phi), written
    plainly: the summed Huber loss between the law's log-loss and the observed one."""

    a, alpha, b, beta, e, phi = theta
    # N_eff = N_once + r^phi N_rec
    n_eff = data.n_once + np.exp(phi * data.logr) * data.n_rec
    # log(A N_eff^-alpha + B D^-beta + E)
    terms = [a - alpha * np.log(n_eff), b - beta * data.logD, np.full_like(n_eff, e)]
    log_law = logsumexp(terms, axis=0)
    # summed over runs, not averaged
    return float(huber(delta, log_law - data.logL).sum())


def log_law(theta, data: RunArrays) -> np.ndarray:
    """The law's log-loss of every run at one theta (any design of `data`)."""
    th = np.asarray(theta, float)
    k = data.k
    ell = data.Z @ th[5:5 + k] if data.link is None else data.link(th[None, 5:5 + k])[0][0]
    n_eff = data.n_once + np.exp(ell) * data.n_rec
    size, tokens = th[0] - th[1] * np.log(n_eff), th[2] - th[3] * data.logD
    return np.logaddexp(np.logaddexp(size, tokens), th[4]) + data.S @ th[5 + k:]


def objective(theta: np.ndarray, data: RunArrays, weights: np.ndarray | None = None,
               order: int = 1, delta: float = HUBER_DELTA, newton=True, target: np.ndarray | None = None):
    """`objective_reference` for a batch of parameter vectors, with its derivatives (any design).

    theta (P, p); weights (P, n) or (n,) or None (all 1: each run counted once); target (P, n):
    per-problem observed log-losses in place of data.logL (the paired fits).
    Returns f (P,), and with order >= 1 the gradient (P, p), with order 2 the Hessian (P, p, p).
    newton (bool or (P,) bool): the exact Hessian (Huber'' = 1 inside delta, 0 outside); where
    False, the Hessian of the IRLS majoriser instead (Huber'' replaced by the secant curvature
    ``Huber'(rho)/rho = min(1, delta/abs(rho))``): positive far from the fit, it makes the early
    iterations converge like Gauss-Newton on a weighted least-squares problem.
    """
    k, m_off = data.k, data.S.shape[1]
    a, al, b, be, e = (theta[:, i:i + 1] for i in range(5))
    if data.link is None:   # log multiplier Z . c, its derivatives in c (the second ones vanish)
        ell, dl, d2l = theta[:, 5:5 + k] @ data.Z.T, [data.Z[:, j] for j in range(k)], None
    else:
        ell, dl, d2l = data.link(theta[:, 5:5 + k])
    rp = np.exp(ell) * data.n_rec                                   # r^phi N_rec   (P, n)
    neff = data.n_once + rp
    x = np.log(neff)
    u1 = a - al * x
    u2 = b - be * data.logD
    u3 = np.broadcast_to(e, u1.shape)
    m = np.maximum(np.maximum(u1, u2), u3)
    w1, w2, w3 = np.exp(u1 - m), np.exp(u2 - m), np.exp(u3 - m)
    tot = w1 + w2 + w3
    lse = m + np.log(tot)
    rho = lse - (data.logL if target is None else target)
    if m_off:
        rho = rho + theta[:, 5 + k:] @ data.S.T
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
    xp = [dl[j] * q for j in range(k)]                             # d x / d c_j
    s1, s2, s3 = s * w1, s * w2, s * w3
    g = np.empty(theta.shape)
    g[:, 0] = s1.sum(1)
    g[:, 1] = -(s1 * x).sum(1)
    g[:, 2] = s2.sum(1)
    g[:, 3] = -(s2 * data.logD).sum(1)
    g[:, 4] = s3.sum(1)
    for j in range(k):
        g[:, 5 + j] = -(al[:, 0] * (s1 * xp[j]).sum(1))
    for j in range(m_off):
        g[:, 5 + k + j] = (s * data.S[:, j]).sum(1)
    if order < 2:
        return f, g
    # Hessian: sum_i (c H'' - c H') G G^T + c H' (sum_k w_k J_k J_k^T + w_1 d2u_1)
    offs = [np.broadcast_to(data.S[:, j], x.shape) for j in range(m_off)]
    G = np.stack([w1, -w1 * x, w2, -w2 * data.logD, w3, *(-al * w1 * v for v in xp), *offs], axis=2)   # (P, n, p)
    if newton is True:
        curv = quad
    else:
        curv = np.minimum(1.0, delta / np.maximum(arho, 1e-300))
        if newton is not False:
            curv = np.where(np.asarray(newton)[:, None], quad, curv)
    t = c * curv - s
    H = np.matmul(G.transpose(0, 2, 1), G * t[:, :, None])
    if m_off:   # offsets enter rho linearly, outside the LSE: their rows and columns keep c H'' only
        so = G[:, :, 5 + k:] * s[:, :, None]
        H[:, :, 5 + k:] += np.matmul(G.transpose(0, 2, 1), so)
        H[:, 5 + k:, :5 + k] += np.matmul(so.transpose(0, 2, 1), G[:, :, :5 + k])
    x2 = x * x
    H[:, 0, 0] += g[:, 0]
    H[:, 0, 1] += g[:, 1]
    H[:, 1, 1] += (s1 * x2).sum(1)
    H[:, 2, 2] += g[:, 2]
    H[:, 2, 3] += g[:, 3]
    H[:, 3, 3] += (s2 * data.logD * data.logD).sum(1)
    H[:, 4, 4] += g[:, 4]
    pairs = [(0, 1), (2, 3)]
    for i in range(k):
        sxp = (s1 * xp[i]).sum(1)
        H[:, 0, 5 + i] += -al[:, 0] * sxp
        H[:, 1, 5 + i] += al[:, 0] * (s1 * x * xp[i]).sum(1) - sxp    # J1 part + d2u1/(dalpha dc_i)
        for j in range(i, k):
            xpp = dl[i] * xp[j] * (1.0 - q)                             # d2 x / (dc_i dc_j)
            if d2l is not None:
                xpp = xpp + q * d2l[i][j]
            H[:, 5 + i, 5 + j] += al[:, 0] ** 2 * (s1 * xp[i] * xp[j]).sum(1) - al[:, 0] * (s1 * xpp).sum(1)
            pairs += [(5 + i, 5 + j)] * (j > i)
        pairs += [(0, 5 + i), (1, 5 + i)]
    for i, j in pairs:
        H[:, j, i] = H[:, i, j]
    return f, g, H


OBJ_BLOCK = 128  # rows per `objective` call in the solver: temporaries stay small (cache, no page faults)


def objective_in_blocks(theta: np.ndarray, data: RunArrays, weights: np.ndarray | None, newton, block: int = OBJ_BLOCK,
                        target: np.ndarray | None = None):
    """`objective(..., order=2)` evaluated `block` rows at a time (identical values, row by row):
    numpy temporaries of ~100 kB are recycled by the allocator, while (P, n) arrays of
    thousands of rows are fresh memory (page faults) on every operation: ~2x slower."""
    P, p = theta.shape
    if P <= block:
        return objective(theta, data, weights, order=2, newton=newton, target=target)
    f, g, H = np.empty(P), np.empty((P, p)), np.empty((P, p, p))
    nw = newton if isinstance(newton, bool) else np.asarray(newton)
    for i in range(0, P, block):
        j = min(P, i + block)
        f[i:j], g[i:j], H[i:j] = objective(theta[i:j], data, None if weights is None else weights[i:j],
                                            order=2, newton=nw if isinstance(nw, bool) else nw[i:j],
                                            target=None if target is None else target[i:j])
    return f, g, H


def batched_solve(theta0: np.ndarray, data: RunArrays, weights: np.ndarray | None, free: np.ndarray,
                   group: np.ndarray | None = None, maxiter: int = 500, merge_every: int = 2,
                   merge_tol: float = 1e-3, switch_tol: float = 1e-5, ftol: float = 1e-10,
                   pgtol: float = 1e-9, prune_gap: float | None = 1.0, prune_after: int = 8,
                   block: int = OBJ_BLOCK, trace: bool = False, lo=LO, hi=HI, target=None):
    """Minimise the objective from every row of theta0 (P, p) at once, inside the box [lo, hi].

    weights: (P, n) per-problem run multiplicities (bootstrap) or None.  free: (p,) bool.
    target: (P, n) per-problem observed log-losses (`objective`) or None.
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
    Returns (theta (P, p), f (P,), alive (P,) bool: not merged into / pruned by a better restart).
    """
    P = theta0.shape[0]
    lo, width = np.asarray(lo, float), np.asarray(hi, float) - np.asarray(lo, float)
    tg = (lambda rows: None) if target is None else (lambda rows: target[rows])  # noqa: E731
    group = np.zeros(P, np.int64) if group is None else np.asarray(group, np.int64)
    n_groups = int(group.max()) + 1 if P else 0
    z = np.clip((theta0 - lo) / width, 0.0, 1.0)
    newton = np.zeros(P, bool)
    f, g, H = objective_in_blocks(lo + z * width, data, weights, False, block, target)
    lam = np.full(P, 1e-6)
    active = np.ones(P, bool)
    alive = np.ones(P, bool)
    eye = np.eye(len(lo))
    scale = np.outer(width, width)
    it = 0
    while active.any() and it < maxiter:
        it += 1
        idx = np.flatnonzero(active)
        wi = None if weights is None else weights[idx]
        zi, gi = z[idx], g[idx] * width                      # gradient in box units
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
        fn, gn, Hn = objective_in_blocks(lo + znew * width, data, wi, nw, block, tg(idx))
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
            _, g[sw], H[sw] = objective_in_blocks(lo + z[sw] * width, data, None if weights is None else weights[sw],
                                                  True, block, tg(sw))
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
    return lo + z * width, f, alive


def lbfgsb(theta0: np.ndarray, data: RunArrays, weights: np.ndarray | None, free: np.ndarray,
            options: dict | None = None, lo=LO, hi=HI, target=None):
    """One scipy L-BFGS-B solve over the free parameters (analytic gradient); returns (theta, f, nit)."""

    fi = np.flatnonzero(free)
    lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    base = np.clip(np.asarray(theta0, float), lo, hi)
    w = None if weights is None else np.asarray(weights, float)[None, :]
    t = None if target is None else np.asarray(target, float)[None, :]

    def fun(v):
        th = base.copy()
        th[fi] = v
        f, g = objective(th[None, :], data, w, order=1, target=t)
        return float(f[0]), g[0, fi]

    res = minimize(fun, base[fi], jac=True, method="L-BFGS-B", bounds=list(zip(lo[fi], hi[fi])),
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


def random_starts(rng: np.random.Generator, k: int, fixed: dict, lo=LO, hi=HI) -> np.ndarray:
    """k starts uniform in the box, the `fixed` {index: value} held."""
    th = lo + rng.uniform(size=(k, len(lo))) * (hi - lo)
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
           n_groups: int = 1, polish: int = 3, lo=LO, hi=HI, target=None, **solver):
    """Batched solve of every start, then L-BFGS-B polish of each group's `polish` best distinct
    end points (`solver`: options of `batched_solve`, e.g. prune_gap=None).  The one solver of
    every law in `looped`: the paper's, its variants (`RunArrays.design`) and the paired fits.
    Returns per group: (theta*, f*, local minima found (sorted thetas))."""
    th, f, alive = batched_solve(starts, data, weights, free, group, lo=lo, hi=hi, target=target, **solver)
    group = np.zeros(len(starts), np.int64) if group is None else group
    out = []
    for gi, idx in enumerate(_best_in_groups(th, f, alive, group, n_groups, polish)):
        w = None if weights is None else weights[idx[0]]
        t = None if target is None else target[idx[0]]
        best_t, best_f = th[idx[0]].copy(), f[idx[0]]
        for i in idx:
            if polish <= 0:
                break
            t2, f2, _ = lbfgsb(th[i], data, w, free, lo=lo, hi=hi, target=t)
            if f2 < best_f:
                best_t, best_f = t2, f2
        out.append((best_t, float(best_f), th[idx]))
    return out


def law_loss(theta, data: RunArrays) -> np.ndarray:
    """The law's loss (nats) of every run at one theta."""
    return np.exp(log_law(theta, data))
