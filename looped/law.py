"""The fitted law as a value, and what it says: losses, effective sizes, compute-optimal frontiers.

`Law` holds A, alpha, B, beta, E, phi (phi None: a Chinchilla law, N unique); every function
here takes a `Law` or a `looped.fit.FitResult` (which holds one).  Here too are the one simulator
of synthetic runs (`synthetic_losses`) and the one iso-FLOP parabola (`parabola`).  The frontiers put the law on the
preset's iso-depth models through `looped.accounting` (D = C / training FLOPs per token), as the
paper does for its compute-optimal analysis and its worked example (appendix F.4).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy.optimize import brentq, minimize_scalar

from . import accounting as acc
from .config import R_VALUES, model_config
from .solver import LAW_PARAMS, RunArrays, log_law


class FitError(ValueError):
    """Bad input to a fit or to what a law computes; `looped fit` prints it as one line and exits 2."""


@dataclass(frozen=True)
class Law:
    """L(N_once, N_rec, r, D) = E + A N_eff^(-alpha) + B D^(-beta), N_eff = N_once + r^phi N_rec
    (phi None: a Chinchilla law, N_eff = N_once + N_rec).  A, B, E in natural units."""
    A: float
    alpha: float
    B: float
    beta: float
    E: float
    phi: float | None = None

    def __post_init__(self):   # plain floats, whatever numbers were given (ints, numpy scalars, CSV strings)
        for k in LAW_PARAMS:
            v = getattr(self, k)
            if not (k == "phi" and v is None):
                object.__setattr__(self, k, float(v))

    @classmethod
    def from_dict(cls, d) -> "Law":
        """A law from a mapping with A, alpha, B, beta, E and optionally phi (absent or None:
        Chinchilla); other keys (a fit's r2, ci, ...) are ignored."""
        missing = [k for k in LAW_PARAMS if k != "phi" and d.get(k) is None]
        if missing:
            raise FitError(f"the law has no value for {', '.join(missing)}")
        return cls(**{k: d.get(k) for k in LAW_PARAMS})

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in LAW_PARAMS}

    @property
    def theta(self) -> np.ndarray:
        """The solver's coordinates (log A, alpha, log B, beta, log E, phi); a Chinchilla law's phi
        is 0 (r^0 N_rec = N_rec)."""
        return np.array([math.log(self.A), self.alpha, math.log(self.B), self.beta, math.log(self.E),
                         0.0 if self.phi is None else self.phi])

    @classmethod
    def from_theta(cls, theta, chinchilla: bool = False) -> "Law":
        """The law at solver coordinates theta (`Law.theta`); chinchilla: phi None."""
        a, al, b, be, e, ph = map(float, theta[:6])
        return cls(math.exp(a), al, math.exp(b), be, math.exp(e), None if chinchilla else ph)

    def replace(self, **changes) -> "Law":
        """This law with some parameters changed, e.g. ``law.replace(phi=0.5)``."""
        return dataclasses.replace(self, **changes)

    def effective_n(self, n_once, n_rec, r):
        """N_once + r^phi N_rec (`accounting.n_effective`; N_once + N_rec for a Chinchilla law); arrays broadcast."""
        n_once, n_rec, r = (np.asarray(v, float) for v in (n_once, n_rec, r))
        return n_once + n_rec if self.phi is None else acc.n_effective(n_once, n_rec, r, self.phi)

    def size_slope(self, n_eff):
        """How much the size term A N_eff^-alpha falls per e-fold of N_eff (nats): alpha A N_eff^-alpha.
        A loss gap between two models of the same tokens is about this times the log of their
        N_eff ratio, so it grows with both phi's effect on N_eff and the law's steepness at N_eff."""
        return self.alpha * self.A * np.asarray(n_eff, float) ** (-self.alpha)

    def predict(self, n_once, n_rec, r, tokens):
        """Predicted loss (nats per token); arrays broadcast (the formula: `looped.solver.log_law`)."""
        arrays = np.broadcast_arrays(*(np.asarray(v, float) for v in (n_once, n_rec, r, tokens)))
        no, nr, rr, d = (a.ravel() for a in arrays)
        runs = RunArrays(no, nr, np.log(rr), np.log(d), np.zeros_like(d), np.zeros_like(d))
        return np.exp(log_law(self.theta, runs)).reshape(arrays[0].shape)[()]


def as_law(law) -> Law:
    """The `Law` of a Law or of a fit result (its ``.law``)."""
    if isinstance(law, Law):
        return law
    if isinstance(getattr(law, "law", None), Law):
        return law.law
    raise TypeError(f"expected a Law or a FitResult, got {type(law).__name__} (a dict: use Law.from_dict)")


def predict(law, n_once, n_rec, r, tokens):
    """Loss of a law (nats per token); phi None means N = n_once + n_rec (Chinchilla)."""
    return as_law(law).predict(n_once, n_rec, r, tokens)


def residuals(law, df) -> np.ndarray:
    """Actual minus predicted loss (nats) for every run of df."""
    return df["loss"].to_numpy(float) - predict(law, df["n_once"], df["n_rec"], df["r"], df["tokens"])


def synthetic_losses(law, runs, rng: np.random.Generator, *, noise: float | None = 0.0, cell_sd: float = 0.0,
                     cells=None, cells_first: bool = False, log_shifts=()) -> np.ndarray:
    """The one simulator of synthetic runs: the losses (nats) a law gives the runs of a table (its
    n_once, n_rec, r and tokens), shifted in log loss by each of `log_shifts` in turn (a number, or
    one per run), plus Gaussian noise drawn from `rng`: `noise` nats per run (None: none drawn)
    and, given `cells` (a cell id per run), one shift of `cell_sd` nats shared by each cell's runs,
    drawn after the runs' noise (before it with `cells_first`).  Noise of SD 0 is still drawn, so
    the stream of draws does not depend on the SDs."""
    loss = as_law(law).predict(runs["n_once"], runs["n_rec"], runs["r"], runs["tokens"])
    if len(log_shifts):
        log_loss = np.log(loss)
        for shift in log_shifts:
            log_loss = log_loss + shift
        loss = np.exp(log_loss)

    def white():
        return 0.0 if noise is None else rng.normal(0.0, noise, len(loss))

    def shared():
        return rng.normal(0.0, cell_sd, cells.max() + 1)[cells]
    if cells is None:
        return loss + white()
    if cells_first:
        shift = shared()
        return loss + shift + white()
    draw = white()
    return loss + draw + shared()


def residual_cells(law, df) -> "pd.DataFrame":
    """Mean residual (actual minus predicted, nats) per training budget (rows) and r (columns).

    A law that fits only on average leaves a pattern here: a row of one sign says a budget sits
    off the law, a column of one sign says the law mis-prices that r (the r^phi form, or an
    r-specific effect such as a learning rate that suits one architecture less)."""
    table = df.assign(residual=residuals(law, df))
    return table.pivot_table(index="budget", columns="r", values="residual", aggfunc="mean")




def parabola(u, y) -> tuple[tuple[float, float, float], float, float]:
    """The least-squares parabola y = c0 + c1 u + c2 u^2 through the points (u, y) (at one budget,
    u = log N and y the loss: the iso-FLOP profile) and its vertex: ((c2, c1, c0), u*, y*).  The
    vertex is a minimum only where c2 > 0; for a straight line (c2 = 0) u* and y* are NaN."""
    c2, c1, c0 = np.polyfit(u, y, 2)
    us = -c1 / (2 * c2) if c2 != 0 else float("nan")
    return (c2, c1, c0), us, c0 + c1 * us + c2 * us * us


def config_at_width(preset, r: int, d: float, injection=None, bptt_k=None):
    """The preset's iso-depth model at a continuous width d (for interpolating the accounting)."""
    return replace(model_config(preset, r=r, s=10, injection=injection, bptt_k=bptt_k), d_model=d, s=None)


def width_polynomials(preset, r: int, injection=None, bptt_k=None) -> np.ndarray:
    """Coefficients (3 rows: n_once, n_rec, flops_per_token; columns d^0, d^1, d^2) of the
    accounting as exact quadratics in the width d (every term of `accounting` is of degree <= 2)."""
    ds = np.array([1.0, 2.0, 3.0])
    vals = np.array([[f(config_at_width(preset, r, d, injection, bptt_k)) for d in ds]
                     for f in (acc.n_once, acc.n_rec, acc.flops_per_token)], float)
    return np.linalg.solve(np.vander(ds, 3, increasing=True), vals.T).T


def effective_sizes(preset="paper", r: int = 4, s: float = 32, *, phi: float,
                    injection: str | None = None, bptt_k: int | None = None) -> dict:
    """Three sizes of a looped model (and of the plain model of the same width, for scale).

    unique: N = N_once + N_rec (what is stored); loss_equivalent: the plain N with the same
    fitted loss, N_once + r^phi N_rec; compute_equivalent: N of the plain model whose training
    FLOPs per token (accounting.flops_per_token) equal this model's (continuous width).
    Ratios are to the plain model at the same width.  `block_*` ratios count transformer blocks
    only (the paper's worked example, (2+4+2)/20 and (4 + 4^phi 4)/20): the exact figures also
    include the 2d^2 injection in N_rec and the model norms.
    """

    cfg = model_config(preset, r=r, s=s, injection=injection, bptt_k=bptt_k)
    plain = model_config(preset, r=1, s=s)
    no, nr = acc.n_once(cfg), acc.n_rec(cfg)
    n_plain = acc.n_params(plain)
    fl = acc.flops_per_token(cfg)
    d = plain.d_model
    fplain = lambda x: acc.flops_per_token(config_at_width(preset, 1, x)) - fl  # noqa: E731
    d_ce = brentq(fplain, 1e-3, 64 * d)
    n_ce = acc.n_params(config_at_width(preset, 1, d_ce))
    p = cfg
    depth = p.n_prelude + p.n_coda + p.n_loop_layers            # unique blocks
    eff_depth = p.n_prelude + p.n_coda + (p.n_loop_layers * r if cfg.looped else p.n_loop_layers)
    once_blocks = p.n_prelude + p.n_coda + (0 if cfg.looped else p.n_loop_layers)
    rec_blocks = p.n_loop_layers if cfg.looped else 0
    return {
        "r": r, "s": s, "d_model": cfg.d_model, "phi": phi,
        "n_once": no, "n_rec": nr, "unique": no + nr,
        "loss_equivalent": acc.n_effective(no, nr, r, phi),
        "compute_equivalent": float(n_ce), "flops_per_token": fl,
        "plain_unique": n_plain, "plain_flops_per_token": acc.flops_per_token(plain),
        "unique_ratio": (no + nr) / n_plain, "loss_equivalent_ratio": acc.n_effective(no, nr, r, phi) / n_plain,
        "compute_equivalent_ratio": n_ce / n_plain,
        "block_unique_ratio": depth / eff_depth,
        "block_loss_equivalent_ratio": acc.n_effective(once_blocks, rec_blocks, r, phi) / eff_depth,
    }


def effective_size_vs_phi(preset: str = "paper", s: float = 32, r_values=(2, 4, 8), phis=None):
    """Sizes of the r-loop sibling of the plain model at width s, as fractions of the plain
    model's unique N, for a range of phi: unique (phi-free), loss-equivalent N_once + r^phi N_rec,
    compute-equivalent (the plain model with the same training FLOPs per token, phi-free)."""
    phis = np.linspace(0.0, 1.0, 101) if phis is None else np.asarray(phis, float)
    rows = []
    for r in r_values:
        e = effective_sizes(preset, r=r, s=s, phi=0.0)
        for phi in phis:
            rows.append(dict(r=r, phi=float(phi), unique=e["unique_ratio"],
                             loss_equivalent=acc.n_effective(e["n_once"], e["n_rec"], r, phi) / e["plain_unique"],
                             compute_equivalent=e["compute_equivalent_ratio"]))
    return pd.DataFrame(rows)


def compute_optimal(law, preset="paper", r=R_VALUES, *, budgets, s_grid=None,
                    injection: str | None = None, bptt_k: int | None = None) -> "pd.DataFrame":
    """Compute-optimal allocation under the fitted law: for each r and budget C, minimise the
    predicted loss over the preset's widths (s_grid, deduplicated by d_model) with D = C / F,
    F = accounting.flops_per_token of that architecture (injection / bptt_k passed through; a
    per-r bptt_k may be given as a callable r -> k).  Returns the grid argmin (s, d_model, n, n_once,
    n_rec, tokens, loss, tokens_per_param) and a parabola-in-log-N refinement (n_star, loss_star)."""
    rs = [r] if np.isscalar(r) else list(r)
    budgets = list(budgets)
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
            L = predict(law, no, nr, rr, D)
            i = int(np.argmin(L))
            u = np.log(no + nr)
            n_s, l_s = no[i] + nr[i], L[i]
            if 0 < i < len(L) - 1:
                (c2, _, _), us, ls = parabola(u[i - 1:i + 2], L[i - 1:i + 2])
                if c2 > 0:
                    n_s, l_s = float(np.exp(us)), float(ls)
            rows.append(dict(r=rr, budget=C, s=cfgs[i].s, d_model=cfgs[i].d_model, n=no[i] + nr[i],
                             n_once=no[i], n_rec=nr[i], tokens=D[i], loss=L[i],
                             tokens_per_param=D[i] / (no[i] + nr[i]), n_star=n_s, loss_star=l_s,
                             at_edge=i in (0, len(L) - 1)))
    return pd.DataFrame(rows)


def compute_optimal_frontier(law, preset="paper", r=R_VALUES, *, budgets,
                             injection: str | None = None, bptt_k=None,
                             d_bounds=(8.0, 1e6)) -> "pd.DataFrame":
    """The compute-optimal frontier of a law with the width treated as continuous.

    Like `compute_optimal`, but instead of the preset's discrete widths the loss
    L(d) = E + A N_eff(d)^(-alpha) + B (C / F(d))^(-beta) is minimised over a continuous width
    d (the accounting is an exact quadratic in d), so N*, D* and L* are smooth in C.  injection /
    bptt_k as in `compute_optimal` (bptt_k may be a callable r -> k).  One row per (r, budget): d_model,
    n_star (unique non-embedding params), n_once, n_rec, n_eff, tokens_star (= C / F),
    tokens_per_param (D* / N*), flops_per_token (training, F), loss_star, at_edge (the optimum
    hit d_bounds)."""

    p = as_law(law)
    rs = [r] if np.isscalar(r) else list(r)
    budgets = list(budgets)
    lo, hi = np.log(d_bounds[0]), np.log(d_bounds[1])
    grid = np.linspace(lo, hi, 241)
    rows = []
    for rr in rs:
        k = bptt_k(rr) if callable(bptt_k) else bptt_k
        k = None if (k is None or k >= rr) else k
        poly = width_polynomials(preset, rr, injection if rr > 1 else None, k)

        def parts(u):
            d = np.exp(u)
            no, nr, fl = (c[0] + c[1] * d + c[2] * d * d for c in poly)
            return no, nr, fl

        for C in budgets:
            def loss(u):
                no, nr, fl = parts(u)
                return p.predict(no, nr, rr, C / fl)

            i = int(np.argmin(loss(grid)))
            a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
            u = minimize_scalar(loss, bounds=(a, b), method="bounded", options={"xatol": 1e-10}).x
            no, nr, fl = (float(v) for v in parts(u))
            n = no + nr
            rows.append(dict(r=rr, budget=float(C), d_model=float(np.exp(u)), n_star=n, n_once=no, n_rec=nr,
                             n_eff=no + nr if p.phi is None else acc.n_effective(no, nr, float(rr), p.phi),
                             tokens_star=C / fl, tokens_per_param=C / fl / n,
                             flops_per_token=fl, loss_star=float(loss(u)),
                             at_edge=bool(u - lo < 1e-6 or hi - u < 1e-6)))
    return pd.DataFrame(rows)


def compute_optimal_for_loss(law, target: float, preset="paper", r=R_VALUES, injection: str | None = None,
                             bptt_k=None, budget_bounds=(1e12, 1e30)) -> "pd.DataFrame":
    """For each r, the compute-optimal model (on `compute_optimal_frontier`) whose predicted loss
    equals `target`: the smallest training budget that reaches it, and that model.  Raises
    FitError when the target is at or below the law's floor E or outside budget_bounds."""

    p = as_law(law)
    if not target > p.E:
        raise FitError(f"target loss {target:g} is not above the law's irreducible loss E = {p.E:g}")
    rs = [r] if np.isscalar(r) else list(r)
    out = []
    for rr in rs:
        def optimum(logc):
            return compute_optimal_frontier(p, preset, rr, budgets=[math.exp(logc)], injection=injection, bptt_k=bptt_k)

        def gap(logc):
            return optimum(logc)["loss_star"].iloc[0] - target

        a, b = math.log(budget_bounds[0]), math.log(budget_bounds[1])
        if gap(a) < 0 or gap(b) > 0:
            raise FitError(f"target loss {target:g} is not reached for r={rr} within budgets {budget_bounds}")
        out.append(optimum(brentq(gap, a, b, xtol=1e-10)).assign(target=target))
    return pd.concat(out, ignore_index=True)


def frontier_gaps(frontier):
    """Loss gap of every r to r = 1 at the same budget on a compute-optimal frontier table."""
    base = frontier[frontier.r == 1].set_index("budget")["loss_star"]
    return frontier.assign(gap=frontier["loss_star"] - frontier["budget"].map(base))


def equal_loss_models(law, targets, preset: str = "paper", r_values=R_VALUES):
    """For each target loss and r: the compute-optimal model of the law that reaches it
    (`compute_optimal_for_loss`) and what it costs to store and to run.

    Columns: training budget C; width d; unique non-embedding N (memory of the blocks);
    stored = N + embedding + LM head (2 x padded vocab x d); weights_per_token = N_once +
    r N_rec + LM head (weights a token's forward pass multiplies by); forward_flops =
    training FLOPs per token / 3 (full backprop costs exactly three forward passes in the
    accounting: 2 FLOPs per weight touched plus 4dT per effective layer for attention at the
    training context); kv_per_token = 2 x effective depth x d cached values (every recurrence
    keeps its own keys and values).  The columns ending in ``_ratio`` divide by the r = 1 model
    of the same target."""
    cfg = model_config(preset, r=1)     # the padded vocabulary does not depend on the width
    p, vocab = cfg.preset, cfg.padded_vocab
    out = []
    for t in ([targets] if isinstance(targets, (int, float)) else targets):
        df = compute_optimal_for_loss(law, float(t), preset=preset, r=tuple(r_values))
        df["stored"] = df["n_star"] + 2 * vocab * df["d_model"]
        df["weights_per_token"] = df["n_once"] + df["r"] * df["n_rec"] + vocab * df["d_model"]
        df["forward_flops"] = df["flops_per_token"] / 3
        df["kv_per_token"] = 2 * p.effective_depth * df["d_model"]
        base = df[df.r == 1].iloc[0]
        for col in ("budget", "n_star", "stored", "weights_per_token", "forward_flops", "kv_per_token"):
            df[f"{col}_ratio"] = df[col] / base[col]
        out.append(df)
    return pd.concat(out, ignore_index=True)
