"""Paired estimators of a case study's change in phi, with the law held at the main fit.

A variant run (truncated backprop, hyperconnections, ...) is paired with the baseline run of the
same (budget, r, s, seed, data_order).  The law L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta
is fitted once to the main arm; only the variant's change is free: dphi (variant uses
r^(phi+dphi)), optionally with an r-independent log-loss offset c.  Both are fitted with the
paper's objective (Huber, delta 1e-3, on log loss) to the paired log-loss differences, so the
law's misfit that both arms share at (budget, r, s) cancels.  Intervals come from a bootstrap
that refits the main law on block resamples of its (budget, r) cells and resamples the pairs.
`paper_protocol` is the paper's estimator.  `looped.studies.paired_study` runs all three on our
runs, checks them by simulation and writes the results (`looped paired`).
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from scipy.special import huber

from ..config import DEFAULT_SEED
from ..fit import FitError, FitResult, at_bounds, fit, load_runs, validate_runs
from ..solver import HI, HUBER_DELTA, LO

KEYS = ("budget", "r", "s", "seed", "data_order")
FOLDERS = ("cpu-main", "cpu-truncated", "cpu-hyper", "cpu-controls", "cpu-matched", "cpu-replicates")
DPHI_GRID = np.linspace(-3.0, 3.0, 241)      # coarse search for dphi before the golden-section polish


@dataclass
class Estimate:
    """A point estimate with its bootstrap SD (se) and 95% percentile interval."""
    estimate: float
    se: float
    lo: float
    hi: float
    n: int
    at_bound: bool = False         # the point estimate sits on the dphi box edge (+-3)
    boot_at_bound: float = 0.0     # share of resamples on that edge (the interval is open there)


# ------------------------------------------------------------------ runs, arms and pairs

def arm_of(df) -> np.ndarray:
    """Each run's arm, read from its record fields: main, truncated, truncated_matched, hyper,
    control_linear (r = 1, linear injection) or control_hyper (r = 1, hyperconnect lanes)."""
    col = lambda c, d: df[c] if c in df.columns else pd.Series(d, index=df.index)
    inj = col("injection", "none").fillna("none").astype(str).to_numpy()
    r = df["r"].to_numpy(float)
    k = pd.to_numeric(col("bptt_k", np.nan), errors="coerce").fillna(pd.Series(r, index=df.index)).to_numpy(float)
    steps = col("run_id", "").fillna("").astype(str).str.contains("_steps").to_numpy()  # matched-token runs
    trunc = np.where(steps, "truncated_matched", "truncated")
    linear = np.where(r == 1, "control_linear", np.where(k < r, trunc, "main"))
    return np.where(inj == "hyperconnect", np.where(r > 1, "hyper", "control_hyper"),
                    np.where(inj == "linear", linear, "main"))


def load_arms(root="runs", folders=FOLDERS) -> dict:
    """{arm: runs table} from the record folders under `root` that exist (others are skipped)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frames = [load_runs(p) for p in (Path(root) / f for f in folders) if p.is_dir() and any(p.rglob("*.json"))]
    if not frames:
        raise FitError(f"{root}: no run records in {', '.join(folders)}")
    df = pd.concat(frames, ignore_index=True)
    df["arm"] = arm_of(df)
    if "run_id" in df.columns:   # one record copied into two folders counts once
        df = df.drop_duplicates(["arm", "run_id"])
    return {a: df[df["arm"] == a].reset_index(drop=True)
            for a in ("main", "truncated", "truncated_matched", "hyper", "control_linear", "control_hyper")}


def same_runs(arms: dict, results) -> dict:
    """The arms cut to the runs an earlier results file of `looped paired` used (its run_ids)."""
    used = json.loads(Path(results).read_text()).get("settings", {}).get("run_ids")
    if not used:
        raise FitError(f"{results}: no run_ids recorded, so its runs cannot be picked out again")
    out = {k: v[v["run_id"].astype(str).isin(used.get(k, []))].reset_index(drop=True) for k, v in arms.items()}
    lost = sum(map(len, used.values())) - sum(map(len, out.values()))
    if lost:
        raise FitError(f"{results}: {lost} of the runs it used are no longer in the record folders")
    return out


def _keyed(df, where: str):
    """A validated copy with seed / data_order filled (42 / -1: the default seed and order) and a
    hashable `_key` of (budget to 6 digits, r, s, seed, data_order)."""
    if df is None or len(df) == 0:
        raise FitError(f"{where}: no runs")
    df = validate_runs(df, where)
    for c in ("budget", "s"):
        if c not in df.columns:
            raise FitError(f"{where}: missing column {c} (needed to pair runs)")
    for c, fill in (("seed", DEFAULT_SEED), ("data_order", -1)):
        df[c] = pd.to_numeric(df[c], errors="coerce").fillna(fill).astype(int) if c in df.columns else fill
    df["_key"] = [(float(f"{b:.6g}"), float(r), round(float(s), 6), int(sd), int(o))
                  for b, r, s, sd, o in df[list(KEYS)].itertuples(index=False)]
    dup = df["_key"].duplicated()
    if dup.any():
        raise FitError(f"{where}: two runs share (budget, r, s, seed, data_order) = {df['_key'][dup].iloc[0]}")
    return df


def pairs(main_df, variant_df, controls=None) -> pd.DataFrame:
    """Variant runs matched to baseline runs on (budget, r, s, seed, data_order).  `controls`:
    r = 1 linear-injection runs that replace the plain r = 1 run as baseline at their key (the
    looped baseline's injection).  Columns: the keys, loss_v/loss_b, diff (nats), log_diff and
    each side's n_once, n_rec, tokens.  Unmatched variant runs are left out (attrs['unmatched'])."""
    base, var = _keyed(main_df, "baseline"), _keyed(variant_df, "variant")
    if controls is not None and len(controls):
        ctl = _keyed(controls, "controls")
        base = pd.concat([base[~base["_key"].isin(set(ctl["_key"]))], ctl], ignore_index=True)
    cols = ["_key", "loss", "n_once", "n_rec", "tokens"]
    m = var[cols + list(KEYS)].merge(base[cols], on="_key", suffixes=("_v", "_b"))
    if not len(m):
        raise FitError("no variant run has a baseline run with the same (budget, r, s, seed, data_order)")
    m["diff"] = m["loss_v"] - m["loss_b"]
    m["log_diff"] = np.log(m["loss_v"]) - np.log(m["loss_b"])
    m = m.drop(columns="_key").sort_values(list(KEYS), kind="stable").reset_index(drop=True)
    m.attrs["unmatched"] = len(var) - len(m)
    return m


def paired_gains(P, by=("r",)) -> pd.DataFrame:
    """Mean paired loss difference (variant - baseline, nats) per group, with a t interval."""
    rows = []
    for key, g in P.groupby(list(by), sort=True):
        d, n = g["diff"].to_numpy(float), len(g)
        sd = float(d.std(ddof=1)) if n > 1 else float("nan")
        se = sd / np.sqrt(n)
        h = float(stats.t.ppf(0.975, n - 1)) * se if n > 1 else float("nan")
        rows.append(dict(zip(by, key if isinstance(key, tuple) else (key,)), n=n, mean=float(d.mean()),
                         sd=sd, se=se, lo=float(d.mean()) - h, hi=float(d.mean()) + h))
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ the paired fit

def law_theta(law) -> np.ndarray:
    """(1, 6) natural parameters (A, alpha, B, beta, E, phi) of a FitResult or a 6-sequence."""
    if isinstance(law, FitResult) and law.phi is None:
        raise FitError("the main fit has no phi (no looped runs)")
    return np.array([[getattr(law, k) for k in ("A", "alpha", "B", "beta", "E", "phi")]]) \
        if isinstance(law, FitResult) else np.asarray(law, float).reshape(1, 6)


def log_law(T, n_once, n_rec, r, D, dphi=0.0):
    """log L for law rows T (K, 6: A, alpha, B, beta, E, phi) at runs (n,); dphi broadcasts
    against (K, ..., n), and T's columns get as many middle axes as dphi has."""
    extra = max(np.ndim(dphi) - 2, 0)
    A, al, B, be, E, ph = (T[:, i].reshape((-1,) + (1,) * (1 + extra)) for i in range(6))
    neff = n_once + np.exp((ph + dphi) * np.log(r)) * n_rec
    return np.logaddexp(np.logaddexp(np.log(A) - al * np.log(neff), np.log(B) - be * np.log(D)), np.log(E))


def _profile_offset(rho, w, iters=48):
    """c minimising sum w Huber(rho + c) over the last axis (bisection on its monotone slope)."""
    lo, hi = -rho.max(-1) - HUBER_DELTA, -rho.min(-1) + HUBER_DELTA
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        neg = (w * np.clip(rho + mid[..., None], -HUBER_DELTA, HUBER_DELTA)).sum(-1) < 0
        lo, hi = np.where(neg, mid, lo), np.where(neg, hi, mid)
    return 0.5 * (lo + hi)


def _rho(T, P, d):
    """Paired residuals (predicted minus observed variant log-loss) for law rows T (K, 6), dphi d
    (K, g): (K, g, n).  The observed side is the variant's log-loss minus its baseline's residual
    from the law (= paired log difference), so the misfit both arms share at (budget, r, s) cancels;
    fitting the variant's raw losses would load that misfit onto dphi."""
    x = {f"{k}_{s}": P[f"{k}_{s}"].to_numpy(float) for k in ("n_once", "n_rec", "tokens") for s in "vb"}
    r = P["r"].to_numpy(float)
    target = P["log_diff"].to_numpy(float) + log_law(T, x["n_once_b"], x["n_rec_b"], r, x["tokens_b"])
    return log_law(T, x["n_once_v"], x["n_rec_v"], r, x["tokens_v"], d[..., None]) - target[:, None, :]


def _group_offsets(rho, w, groups):
    """Offsets per group (..., G) minimising the weighted Huber loss of rho + c[group]: the loss is
    separable in the groups, so each is the one-offset profile of its own pairs."""
    return np.stack([_profile_offset(rho[..., groups == g], w[..., groups == g]) for g in range(groups.max() + 1)], -1)


def _solve(T, P, W, offset, chunk_elems=3_000_000):
    """(dphi, offsets) per law row of T (K, 6) and pair weights W (K, n): grid search, then golden
    section.  `offset`: False (none), True (one for all pairs) or an int array (n,) of group ids,
    one offset per group (e.g. per width); offsets come back (K, G)."""
    groups = (np.zeros(len(P), int) if offset is True else np.asarray(offset, int)) if offset is not False else None
    n_groups = 0 if groups is None else groups.max() + 1

    def objective(t, w, d):   # dphi d (k, g) -> (objective (k, g), offsets (k, g, G))
        rho = _rho(t, P, d)
        if groups is None:
            return (w[:, None, :] * huber(HUBER_DELTA, rho)).sum(-1), np.zeros(d.shape + (0,))
        c = _group_offsets(rho, np.broadcast_to(w[:, None, :], rho.shape), groups)
        return (w[:, None, :] * huber(HUBER_DELTA, rho + c[..., groups])).sum(-1), c

    out_d, out_c = np.empty(len(T)), np.zeros((len(T), n_groups))
    step = max(1, chunk_elems // (len(DPHI_GRID) * len(P)))
    for a in range(0, len(T), step):
        t, w = T[a:a + step], W[a:a + step]
        f = partial(objective, t, w)
        fg, _ = f(np.broadcast_to(DPHI_GRID, (len(t), len(DPHI_GRID))))
        i = fg.argmin(1)
        lo, hi = DPHI_GRID[np.maximum(i - 1, 0)][:, None], DPHI_GRID[np.minimum(i + 1, len(DPHI_GRID) - 1)][:, None]
        g = (np.sqrt(5) - 1) / 2
        for _ in range(40):   # golden section inside the grid bracket
            m1, m2 = hi - g * (hi - lo), lo + g * (hi - lo)
            left = f(m1)[0] <= f(m2)[0]
            lo, hi = np.where(left, lo, m1), np.where(left, m2, hi)
        d = 0.5 * (lo + hi)
        out_d[a:a + step], out_c[a:a + step] = d[:, 0], f(d)[1][:, 0]
    return out_d, out_c


def _pair_weights(P, rng, n_boot, groups=None):
    """(n_boot, n) multiplicities.  Default: pairs resampled within their (budget, r) cell, so every
    r stays in and dphi and the offset stay identified in every resample.  With `groups` (one
    offset each): whole groups resampled within their budget, so a drawn group brings all its r."""
    W = np.zeros((n_boot, len(P)))
    rows = np.arange(n_boot)[:, None]
    if groups is None:
        for idx in P.groupby(["budget", "r"]).indices.values():
            np.add.at(W, (rows, idx[rng.integers(0, len(idx), (n_boot, len(idx)))]), 1.0)
        return W
    budget_of = pd.Series(P["budget"].to_numpy()).groupby(groups).first()
    for ids in budget_of.groupby(budget_of).groups.values():   # the groups of one budget
        ids = np.asarray(ids)
        counts = np.zeros((n_boot, groups.max() + 1))
        np.add.at(counts, (rows, ids[rng.integers(0, len(ids), (n_boot, len(ids)))]), 1.0)
        members = np.isin(groups, ids)
        W[:, members] = counts[:, groups[members]]
    return W


def width_groups(P) -> np.ndarray:
    """Group id of each pair's (budget, s): the configurations that share a width-dependent offset."""
    return P.groupby(["budget", "s"], sort=True).ngroup().to_numpy()


def _estimate(point, samples, n, box=np.inf) -> Estimate:
    s = np.asarray(samples, float)
    lo, hi = np.percentile(s, [2.5, 97.5]) if s.size else (np.nan, np.nan)
    return Estimate(float(point), float(s.std(ddof=1)) if s.size > 1 else float("nan"), float(lo), float(hi),
                    int(n), bool(abs(point) >= box - 1e-6), float((np.abs(s) >= box - 1e-6).mean()) if s.size else 0.0)


def main_law(main_df, restarts=100, seed=0, bootstrap=0, boot_restarts=5) -> FitResult:
    """The main fit (all main-arm runs), with `bootstrap` block resamples of its (budget, r) cells."""
    res = fit(main_df, restarts=restarts, seed=seed, bootstrap=bootstrap, boot_restarts=boot_restarts)
    law_theta(res)
    return res


def paired_estimate(main_df, variant_df, controls=None, offset=False, law: FitResult | None = None,
                    restarts=100, bootstrap=1000, boot_restarts=5, seed=0) -> dict:
    """dphi of the variant, the law held at the main fit, with a log-loss offset: none (False), one
    for every pair (True) or one per width ('width': per (budget, s), pinned there by the r = 1
    pairs).  Bootstrap: each resample pairs one refit of the main law (its bootstrap) with a
    resample of the pairs (of whole widths for 'width').  `law`: a main fit to reuse (with at least
    `bootstrap` boot_samples).  Returns {'dphi': Estimate, 'offset': Estimate of the one offset or
    None, 'resid_sd': SD (nats) of the paired residuals, 'r1': the mean log residual of the r = 1
    pairs with its SE and z (None without r = 1 pairs): how far the model misses the controls}."""
    P = pairs(main_df, variant_df, controls)
    if not ((P["r"] > 1) & (P["n_rec_v"] > 0)).any():
        raise FitError("no pair with r > 1: dphi is not identifiable")
    groups = width_groups(P) if offset == "width" else None
    how = groups if groups is not None else bool(offset)
    if law is None or (bootstrap and (law.boot_samples is None or len(law.boot_samples) < bootstrap)):
        law = main_law(main_df, restarts, seed, bootstrap, boot_restarts)
    d0, c0 = _solve(law_theta(law), P, np.ones((1, len(P))), how)
    W = _pair_weights(P, np.random.default_rng([seed, 7]), bootstrap, groups) if bootstrap else None
    db, cb = _solve(law.boot_samples[:bootstrap], P, W, how) if bootstrap else (np.empty(0), np.empty((0, 1)))
    shift = c0[0][groups] if groups is not None else (c0[0, 0] if offset else 0.0)
    resid = -(_rho(law_theta(law), P, d0[:, None])[0, 0] + shift)      # observed minus predicted log-loss
    one = P["r"].to_numpy() == 1
    r1 = None
    if one.sum() > 1:
        m, se = float(resid[one].mean()), float(resid[one].std(ddof=1) / np.sqrt(one.sum()))
        r1 = {"mean": m, "se": se, "z": m / se, "n": int(one.sum())}
    return {"dphi": _estimate(d0[0], db, len(P), box=DPHI_GRID[-1]),
            "offset": _estimate(c0[0, 0], cb[:, 0], len(P)) if offset is True else None,
            "resid_sd": float((resid * P["loss_v"].to_numpy(float)).std(ddof=1)), "r1": r1}


def paired_difference(main_df, variant_a, variant_b, law: FitResult, bootstrap=1000, seed=0) -> dict:
    """dphi(a) - dphi(b) (no offset) on the configurations both variants share, every resample
    drawing one law refit and one resample of those configurations for both: e.g. truncated runs
    at the budget's tokens against the same runs at their untruncated twin's tokens.  Returns
    {'a': Estimate, 'b': Estimate, 'difference': Estimate}."""
    Pa, Pb = pairs(main_df, variant_a), pairs(main_df, variant_b)
    key = lambda P: pd.Series(list(zip(*(P[k] for k in KEYS))))  # noqa: E731
    shared = set(key(Pa)) & set(key(Pb))
    Pa, Pb = (P[key(P).isin(shared).to_numpy()].reset_index(drop=True) for P in (Pa, Pb))
    if not len(Pa):
        raise FitError("the two variants share no configuration")
    W = _pair_weights(Pa, np.random.default_rng([seed, 11]), bootstrap) if bootstrap else None  # same rows, same order
    ests = {}
    for name, P in (("a", Pa), ("b", Pb)):
        d0, _ = _solve(law_theta(law), P, np.ones((1, len(P))), False)
        db, _ = _solve(law.boot_samples[:bootstrap], P, W, False) if bootstrap else (np.empty(0), None)
        ests[name] = (d0[0], db)
    diff = _estimate(ests["a"][0] - ests["b"][0], ests["a"][1] - ests["b"][1], len(Pa))
    return {"a": _estimate(*ests["a"], len(Pa)), "b": _estimate(*ests["b"], len(Pb)), "difference": diff}


def token_term_check(variant_more, variant_fewer, law: FitResult) -> dict:
    """The law's data term against the runs: pairs of one model (same N, same r) trained on more and
    on fewer tokens; observed and law-predicted change of log-loss, and their difference per pair
    (mean, SD, t).  A law that prices extra tokens right has a mean difference near zero."""
    m, f = _keyed(variant_more, "more tokens"), _keyed(variant_fewer, "fewer tokens")
    j = m.merge(f, on="_key", suffixes=("_m", "_f"))
    if len(j) < 2:
        raise FitError("fewer than two pairs of the same model at two token counts")
    T, r = law_theta(law), j["r_m"].to_numpy(float)
    pred = log_law(T, j["n_once_m"].to_numpy(float), j["n_rec_m"].to_numpy(float), r, j["tokens_m"].to_numpy(float)) \
        - log_law(T, j["n_once_f"].to_numpy(float), j["n_rec_f"].to_numpy(float), r, j["tokens_f"].to_numpy(float))
    obs = np.log(j["loss_m"].to_numpy(float)) - np.log(j["loss_f"].to_numpy(float))
    e = obs - pred[0]
    sd = float(e.std(ddof=1))
    return {"n": len(j), "token_ratio": float((j["tokens_m"] / j["tokens_f"]).mean()), "observed": float(obs.mean()),
            "predicted": float(pred[0].mean()), "difference": float(e.mean()), "sd": sd,
            "t": float(e.mean() / (sd / np.sqrt(len(j))))}


def paper_protocol(main_df, variant_df, budgets=None, restarts=100, bootstrap=200, boot_restarts=5,
                   seed=0) -> Estimate:
    """The paper's estimator: refit all six parameters on the main arm at the variant's budgets
    (baseline) and on main r = 1 plus variant r > 1 runs there (variant); dphi = difference, its
    interval from the two bootstraps drawn with one seed (paired when both hold the same cells)."""
    main, var = validate_runs(main_df, "baseline"), validate_runs(variant_df, "variant")
    budgets = sorted(var["budget"].unique()) if budgets is None else budgets
    inb = lambda df: np.isclose(df["budget"].to_numpy(float)[:, None], np.asarray(budgets, float)).any(1)
    base = main[inb(main)]
    vt = pd.concat([base[base["r"] == 1], var[inb(var) & (var["r"] > 1)]], ignore_index=True)
    kw = dict(restarts=restarts, seed=seed, bootstrap=bootstrap, boot_restarts=boot_restarts)
    fb, fv = fit(base, **kw), fit(vt, **kw)
    if fb.phi is None or fv.phi is None:
        raise FitError("paper protocol: phi is not identifiable in one of the two fits")
    s = fv.boot_samples[:, 5] - fb.boot_samples[:, 5] if bootstrap else []
    e = _estimate(fv.phi - fb.phi, s, len(vt))
    e.at_bound = "phi" in at_bounds(fb) or "phi" in at_bounds(fv)   # here: either fit's phi on its box edge
    if bootstrap:
        phis = np.c_[fb.boot_samples[:, 5], fv.boot_samples[:, 5]]
        e.boot_at_bound = float(((phis <= LO[5] + 1e-6) | (phis >= HI[5] - 1e-6)).any(1).mean())
    return e


def run_key(df):
    """(budget, r, s) of each run, rounded so that one configuration has one key across tables."""
    return [
        (float(f"{b:.6g}"), float(r), round(float(s), 6))
        for b, r, s in df[["budget", "r", "s"]].itertuples(index=False)
    ]
