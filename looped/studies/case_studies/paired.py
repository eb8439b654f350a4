"""Paired estimators of a case study's change in phi, with the law held at the main fit.

A variant run (truncated backprop, hyperconnections, ...) is paired with the baseline run of the
same (budget, r, s, seed, data_order).  The law L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta
is fitted once to the main arm; only the variant's change is free: dphi (variant uses
r^(phi+dphi)), optionally with an r-independent log-loss offset c.  Both are fitted by the core
solver with the paper's objective (a dphi column and offset columns of `RunArrays.design`) to the
paired log-loss differences, so the law's misfit that both arms share at (budget, r, s) cancels.
Intervals come from a bootstrap that refits the main law on block resamples of its (budget, r)
cells and resamples the pairs.
`paper_protocol` is the paper's estimator.  `looped.studies.case_studies.analysis` runs all three on our
runs, checks them by simulation and writes the results (`looped case-studies`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from ...config import DEFAULT_SEED
from ...fit import FitError, FitResult, at_bounds, fit, validate_runs
from ...law import Law
from ...resample import cell_resample, cells
from ...solver import HI, LO, RunArrays, log_law, solve_restarts, to_theta
from ..sweep.registry import FAMILIES
from ..sweep.study import Study

KEYS = ("budget", "r", "s", "seed", "data_order")
FOLDERS = FAMILIES["cpu"]["arms"]
DPHI_BOX, OFFSET_BOX = 3.0, 1.0              # the box of dphi and of each log-loss offset
DPHI_STARTS = np.linspace(-DPHI_BOX, DPHI_BOX, 25)   # starts of each solve: dphi may have several minima


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
    """{arm: runs table} from the record folders under `root` (relative: to the repository root), each
    read as the fitter reads it (`Study.fit_table`, all designs); a folder without records is skipped."""
    frames = [t for t in (Study.at(Path(root) / f).fit_table(main_design=False) for f in folders) if len(t)]
    if not frames:
        raise FitError(f"{root}: no run records in {', '.join(folders)}")
    df = pd.concat(frames, ignore_index=True)
    df["arm"] = arm_of(df)
    if "run_id" in df.columns:   # one record copied into two folders counts once
        df = df.drop_duplicates(["arm", "run_id"])
    return {a: df[df["arm"] == a].reset_index(drop=True)
            for a in ("main", "truncated", "truncated_matched", "hyper", "control_linear", "control_hyper")}


def same_runs(arms: dict, results) -> dict:
    """The arms cut to the runs an earlier results file of `looped case-studies` used (its run_ids)."""
    used = json.loads(Path(results).read_text()).get("settings", {}).get("run_ids")
    if not used:
        raise FitError(f"{results}: no run_ids recorded, so its runs cannot be picked out again")
    out = {k: v[v["run_id"].astype(str).isin(used.get(k, []))].reset_index(drop=True) for k, v in arms.items()}
    lost = sum(map(len, used.values())) - sum(map(len, out.values()))
    if lost:
        raise FitError(f"{results}: {lost} of the runs it used are no longer in the record folders")
    return out


def unused_runs(arms: dict, results) -> int:
    """How many records of the arms an earlier results file of `looped case-studies` did not use (its
    run_ids): 0 while the committed analysis is current, more once a sweep has added runs."""
    used = json.loads(Path(results).read_text()).get("settings", {}).get("run_ids") or {}
    return sum(int((~v["run_id"].astype(str).isin(used.get(k, []))).sum()) for k, v in arms.items() if len(v))


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


def gain_trend(P) -> dict:
    """The least-squares slope of the paired loss difference (nats) on log2 r: nats per doubling
    of r, with its SE, t, two-sided p and the number of pairs."""
    x, y = np.log2(P["r"].to_numpy(float)), P["diff"].to_numpy(float)
    fit = stats.linregress(x, y)
    return {"slope": float(fit.slope), "se": float(fit.stderr), "t": float(fit.slope / fit.stderr),
            "p": float(fit.pvalue), "n": len(P)}


# ------------------------------------------------------------------ the paired fit

def main_of(law) -> Law:
    """The looped law of a FitResult, a Law or six numbers (A, alpha, B, beta, E, phi)."""
    law = law.law if isinstance(law, FitResult) else law if isinstance(law, Law) else Law(*law)
    if law.phi is None:
        raise FitError("the main fit has no phi (no looped runs)")
    return law


def _runs(P, side: str, S=None) -> RunArrays:
    """One side ('v' variant, 'b' baseline) of the pairs as runs of the core law, with a dphi column
    beside phi (both times log r) and the offsets' columns S."""
    x = {k: P[f"{k}_{side}"].to_numpy(float) for k in ("n_once", "n_rec", "tokens", "loss")}
    runs = RunArrays(x["n_once"], x["n_rec"], np.log(P["r"].to_numpy(float)), np.log(x["tokens"]), np.log(x["loss"]),
                     x["loss"])
    return runs.design(np.ones((len(P), 2)), offsets=S)


def _solve(T, P, W, offset):
    """(dphi (K,), offsets (K, G), log residuals of row 0 (n,)) per law row of T (K, 6, solver
    coordinates) and pair weights W (K, n): the core solver on the variant runs, the law's six
    held, dphi and the offsets free.
    `offset`: False (none), True (one for all pairs) or an int array (n,) of group ids (one each).
    The observed side is the variant's log-loss minus its baseline's residual from the law (= the
    paired log difference), so the misfit both arms share at (budget, r, s) cancels; fitting the
    variant's raw losses would load that misfit onto dphi."""
    groups = None if offset is False else np.zeros(len(P), int) if offset is True else np.asarray(offset, int)
    var = _runs(P, "v", None if groups is None else np.eye(groups.max() + 1)[groups])
    base, K, m, k = _runs(P, "b"), len(T), var.S.shape[1], len(DPHI_STARTS)
    thetas = np.c_[T, np.zeros((K, 1 + m))]
    target = P["log_diff"].to_numpy(float) + np.array([log_law(t[:7], base) for t in thetas])
    starts = np.repeat(thetas, k, 0)
    starts[:, 6] = np.tile(DPHI_STARTS, K)
    lo, hi = np.r_[LO, -DPHI_BOX, [-OFFSET_BOX] * m], np.r_[HI, DPHI_BOX, [OFFSET_BOX] * m]
    sols = solve_restarts(var, starts, np.arange(7 + m) >= 6, np.repeat(W, k, 0), np.repeat(np.arange(K), k), K,
                          polish=3 if K == 1 else 1, lo=lo, hi=hi, target=np.repeat(target, k, 0))
    theta = np.array([t for t, _, _ in sols]).reshape(K, 7 + m)
    return theta[:, 6], theta[:, 7:], target[0] - log_law(theta[0], var)   # the first row's observed - predicted


def _pair_weights(P, rng, n_boot, groups=None):
    """(n_boot, n) multiplicities (`looped.resample`).  Default: pairs resampled within their
    (budget, r) cell, so every r stays in and dphi and the offset stay identified in every
    resample.  With `groups` (one offset each): whole groups resampled within their budget, so a
    drawn group brings all its r."""
    if groups is None:
        return cell_resample(np.arange(len(P)), rng, n_boot, within=cells(P))
    budget_of = pd.Series(P["budget"].to_numpy()).groupby(groups).first().to_numpy()
    return cell_resample(groups, rng, n_boot, within=np.unique(budget_of, return_inverse=True)[1])


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
    main_of(res)
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
    d0, c0, resid = _solve(main_of(law).theta[None], P, np.ones((1, len(P))), how)  # observed - predicted
    W = _pair_weights(P, np.random.default_rng([seed, 7]), bootstrap, groups) if bootstrap else None
    db, cb = (np.empty(0), np.empty((0, 1))) if not bootstrap else \
        _solve(to_theta(law.boot_samples[:bootstrap]), P, W, how)[:2]
    one = P["r"].to_numpy() == 1
    r1 = None
    if one.sum() > 1:
        m, se = float(resid[one].mean()), float(resid[one].std(ddof=1) / np.sqrt(one.sum()))
        r1 = {"mean": m, "se": se, "z": m / se, "n": int(one.sum())}
    return {"dphi": _estimate(d0[0], db, len(P), box=DPHI_BOX),
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
        d0 = _solve(main_of(law).theta[None], P, np.ones((1, len(P))), False)[0]
        db = _solve(to_theta(law.boot_samples[:bootstrap]), P, W, False)[0] if bootstrap else np.empty(0)
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
    main, r = main_of(law), j["r_m"].to_numpy(float)
    pred = np.log(main.predict(j["n_once_m"], j["n_rec_m"], r, j["tokens_m"])) \
        - np.log(main.predict(j["n_once_f"], j["n_rec_f"], r, j["tokens_f"]))
    obs = np.log(j["loss_m"].to_numpy(float)) - np.log(j["loss_f"].to_numpy(float))
    e = obs - pred
    sd = float(e.std(ddof=1))
    return {"n": len(j), "token_ratio": float((j["tokens_m"] / j["tokens_f"]).mean()), "observed": float(obs.mean()),
            "predicted": float(pred.mean()), "difference": float(e.mean()), "sd": sd,
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
