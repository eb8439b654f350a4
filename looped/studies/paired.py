"""Paired estimators of a case study's change in phi, with the law held at the main fit.

A variant run (truncated backprop, hyperconnections, ...) is paired with the baseline run of the
same (budget, r, s, seed, data_order).  The law L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta
is fitted once to the main arm; only the variant's change is free: dphi (variant uses
r^(phi+dphi)), optionally with an r-independent log-loss offset c.  Both are fitted with the
paper's objective (Huber, delta 1e-3, on log loss) to the paired log-loss differences, so the
law's misfit that both arms share at (budget, r, s) cancels.  Intervals come from a bootstrap
that refits the main law on block resamples of its (budget, r) cells and resamples the pairs.
`paper_protocol` is the paper's estimator; `simulate_estimators` checks all three on our design.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from scipy.special import huber

from ..config import DEFAULT_SEED, REPO
from ..fit import FitError, FitResult, at_bounds, fit, load_runs, validate_runs
from ..io import atomic_write_json, json_ready
from ..solver import HI, HUBER_DELTA, LO

KEYS = ("budget", "r", "s", "seed", "data_order")
FOLDERS = ("cpu-main", "cpu-truncated", "cpu-hyper", "cpu-controls", "cpu-matched", "cpu-replicates")
STUDIES = ("truncated", "hyper", "truncated_matched")
DPHI_GRID = np.linspace(-3.0, 3.0, 241)      # coarse search for dphi before the golden-section polish
QUICK = dict(restarts=20, bootstrap=40, boot_restarts=2, n_reps=4, sim_bootstrap=30)
FULL = dict(restarts=100, bootstrap=1000, boot_restarts=5, n_reps=100, sim_bootstrap=200)


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

def _theta(law) -> np.ndarray:
    """(1, 6) natural parameters (A, alpha, B, beta, E, phi) of a FitResult or a 6-sequence."""
    if isinstance(law, FitResult) and law.phi is None:
        raise FitError("the main fit has no phi (no looped runs)")
    return np.array([[getattr(law, k) for k in ("A", "alpha", "B", "beta", "E", "phi")]]) \
        if isinstance(law, FitResult) else np.asarray(law, float).reshape(1, 6)


def _log_law(T, n_once, n_rec, r, D, dphi=0.0):
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
    target = P["log_diff"].to_numpy(float) + _log_law(T, x["n_once_b"], x["n_rec_b"], r, x["tokens_b"])
    return _log_law(T, x["n_once_v"], x["n_rec_v"], r, x["tokens_v"], d[..., None]) - target[:, None, :]


def _solve(T, P, W, offset: bool, chunk_elems=3_000_000):
    """(dphi, c) per law row of T (K, 6) and pair weights W (K, n): grid search, then golden section."""
    def objective(t, w, d):   # dphi d (k, g) -> (objective, offset), each (k, g)
        rho = _rho(t, P, d)
        c = _profile_offset(rho, w[:, None, :]) if offset else np.zeros(d.shape)
        return (w[:, None, :] * huber(HUBER_DELTA, rho + c[..., None])).sum(-1), c

    out_d, out_c = np.empty(len(T)), np.zeros(len(T))
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


def _pair_weights(P, rng, n_boot):
    """(n_boot, n) multiplicities: pairs resampled within their (budget, r) cell, so every r stays
    in and dphi and the offset stay identified in every resample."""
    W = np.zeros((n_boot, len(P)))
    for idx in P.groupby(["budget", "r"]).indices.values():
        draws = rng.integers(0, len(idx), (n_boot, len(idx)))
        np.add.at(W, (np.arange(n_boot)[:, None], idx[draws]), 1.0)
    return W


def _estimate(point, samples, n, box=np.inf) -> Estimate:
    s = np.asarray(samples, float)
    lo, hi = np.percentile(s, [2.5, 97.5]) if s.size else (np.nan, np.nan)
    return Estimate(float(point), float(s.std(ddof=1)) if s.size > 1 else float("nan"), float(lo), float(hi),
                    int(n), bool(abs(point) >= box - 1e-6), float((np.abs(s) >= box - 1e-6).mean()) if s.size else 0.0)


def main_law(main_df, restarts=100, seed=0, bootstrap=0, boot_restarts=5) -> FitResult:
    """The main fit (all main-arm runs), with `bootstrap` block resamples of its (budget, r) cells."""
    res = fit(main_df, restarts=restarts, seed=seed, bootstrap=bootstrap, boot_restarts=boot_restarts)
    _theta(res)
    return res


def paired_estimate(main_df, variant_df, controls=None, offset=False, law: FitResult | None = None,
                    restarts=100, bootstrap=1000, boot_restarts=5, seed=0) -> dict:
    """dphi (and with `offset` the log-loss offset c) of the variant, the law held at the main fit.
    Bootstrap: each resample pairs one refit of the main law (its bootstrap) with a resample of the
    pairs.  `law`: a main fit to reuse (with at least `bootstrap` boot_samples).  Returns
    {'dphi': Estimate, 'offset': Estimate or None, 'resid_sd': SD (nats) of the paired residuals}."""
    P = pairs(main_df, variant_df, controls)
    if not ((P["r"] > 1) & (P["n_rec_v"] > 0)).any():
        raise FitError("no pair with r > 1: dphi is not identifiable")
    if law is None or (bootstrap and (law.boot_samples is None or len(law.boot_samples) < bootstrap)):
        law = main_law(main_df, restarts, seed, bootstrap, boot_restarts)
    d0, c0 = _solve(_theta(law), P, np.ones((1, len(P))), offset)
    db, cb = _solve(law.boot_samples[:bootstrap], P, _pair_weights(P, np.random.default_rng([seed, 7]), bootstrap),
                    offset) if bootstrap else (np.empty(0), np.empty(0))
    rho = (_rho(_theta(law), P, d0[:, None]) + c0[0])[0, 0] * P["loss_v"].to_numpy(float)
    return {"dphi": _estimate(d0[0], db, len(P), box=DPHI_GRID[-1]),
            "offset": _estimate(c0[0], cb, len(P)) if offset else None, "resid_sd": float(rho.std(ddof=1))}


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


RESULTS = REPO / "runs" / "analysis" / "paired.json"   # what `looped paired` wrote, committed
ESTIMATORS = ("paper", "paired", "paired_offset")


def read_results(path=RESULTS) -> dict:
    """The committed results of `looped paired`, per case study: its estimates of dphi (one row
    per estimator, and the offset), its paired gains by r (variant minus baseline log-loss) and
    the simulation of the estimators at the estimated dphi; plus the settings, the main fit and
    the run time in seconds."""
    raw = json.loads(Path(path).read_text())
    out = {"settings": raw["settings"], "main_fit": raw["main_fit"], "seconds": raw["seconds"], "studies": {}}
    for name, st in raw["studies"].items():
        if "paired" not in st:
            continue
        out["studies"][name] = {
            "estimates": pd.DataFrame([dict(estimator=k, **st[k]) for k in ESTIMATORS]),
            "offset": st["offset_log"], "pairs": st["pairs"], "gains_by_r": pd.DataFrame(st["gains_by_r"]),
            "simulation": pd.DataFrame(raw["simulation"].get(name, {}).get("summary", []))}
    return out


# ------------------------------------------------------------------ simulation

def _key3(df):
    return [
        (float(f"{b:.6g}"), float(r), round(float(s), 6))
        for b, r, s in df[["budget", "r", "s"]].itertuples(index=False)
    ]


def law_residuals(law: FitResult, main_df) -> dict:
    """{(budget, r, s): mean log-loss residual of the main fit} (observed minus law)."""
    df = validate_runs(main_df)
    res = np.log(df["loss"].to_numpy(float)) - _log_law(_theta(law), df["n_once"].to_numpy(float),
                                                        df["n_rec"].to_numpy(float), df["r"].to_numpy(float),
                                                        df["tokens"].to_numpy(float))[0]
    by = pd.Series(res).groupby(pd.Series(_key3(df))).mean()   # replicates: their mean
    return {k: float(v) for k, v in by.items()}


def synthetic(law: FitResult, df, dphi=0.0, offset=0.0, resid=None, noise_sd=0.0, rng=None):
    """A copy of runs table `df` with losses from the law (phi + dphi, log-loss shift offset), plus
    the shared log residual of each (budget, r, s) in `resid` and independent noise in nats."""
    out = validate_runs(df).copy()
    logl = _log_law(_theta(law), out["n_once"].to_numpy(float), out["n_rec"].to_numpy(float),
                    out["r"].to_numpy(float), out["tokens"].to_numpy(float), dphi)[0] + offset
    logl += np.array([(resid or {}).get(k, 0.0) for k in _key3(out)])
    noise = rng.normal(0.0, noise_sd, len(out)) if noise_sd else 0.0
    out["loss"] = np.exp(logl) + noise
    return out


def simulate_estimators(main_df, variant_df, true_dphi, n_reps=None, seed=0, controls=None, true_offset=0.0,
                        noise_sd=0.011, quick=False, restarts=None, bootstrap=None, boot_restarts=None):
    """Bias, SD, RMSE and 95% coverage of the paired (with and without offset) and paper-protocol
    estimators on our design: both arms from the main fit's law with a known dphi (and offset),
    the main fit's real log residuals shared at each (budget, r, s), and seed noise (nats).
    n_reps / restarts / bootstrap default to FULL, or to QUICK (few of each) with `quick`.
    One row per estimator ('paired_offset:offset' is the offset); attrs['raw'] holds every rep."""
    cfg = QUICK if quick else FULL
    n_reps, restarts, bootstrap = (
        n_reps or cfg["n_reps"],
        restarts or cfg["restarts"],
        bootstrap or cfg["sim_bootstrap"],
    )
    boot_restarts = cfg["boot_restarts"] if boot_restarts is None else boot_restarts
    law0 = main_law(main_df, restarts, seed)
    resid, rng, rows = law_residuals(law0, main_df), np.random.default_rng(seed), []
    for rep in range(n_reps):
        m = synthetic(law0, main_df, resid=resid, noise_sd=noise_sd, rng=rng)
        v = synthetic(law0, variant_df, true_dphi, true_offset, resid, noise_sd, rng)
        c = None if controls is None or not len(controls) else synthetic(law0, controls, 0.0, 0.0, resid, noise_sd, rng)
        kw = dict(restarts=restarts, bootstrap=bootstrap, boot_restarts=boot_restarts, seed=seed + rep)
        law = main_law(m, **kw)
        ests = {"paired": paired_estimate(m, v, c, False, law, **kw)["dphi"]}
        both = paired_estimate(m, v, c, True, law, **kw)
        ests["paired_offset"], ests["paired_offset:offset"] = both["dphi"], both["offset"]
        ests["paper"] = paper_protocol(m, v, **kw)
        for name, e in ests.items():
            rows.append(dict(rep=rep, estimator=name, **asdict(e)))
    raw = pd.DataFrame(rows)
    raw["true"] = np.where(raw["estimator"].str.endswith(":offset"), true_offset, true_dphi)
    raw["covered"] = (raw["lo"] <= raw["true"]) & (raw["true"] <= raw["hi"])
    err = raw["estimate"] - raw["true"]
    summary = raw.assign(err=err, sq=err ** 2, width=raw["hi"] - raw["lo"]).groupby("estimator", sort=False).agg(
        true=("true", "first"), bias=("err", "mean"), sd=("estimate", "std"), rmse=("sq", "mean"),
        coverage=("covered", "mean"), mean_se=("se", "mean"), mean_width=("width", "mean"),
        at_bound=("at_bound", "mean"), n_reps=("rep", "count")).reset_index()
    summary["rmse"] = np.sqrt(summary["rmse"])
    summary.attrs["raw"] = raw
    return summary


def seed_sd(runs) -> float:
    """Pooled SD (nats) of the loss across seeds of one (arm, budget, r, s); NaN without replicates."""
    df = pd.concat([validate_runs(d).assign(arm=a) for a, d in runs.items() if len(d)], ignore_index=True)
    g = df.assign(k=_key3(df)).groupby(["arm", "k"])["loss"]
    n, v = g.count(), g.var(ddof=1)
    dof = (n - 1)[n > 1]
    return float(np.sqrt((v[n > 1] * dof).sum() / dof.sum())) if dof.sum() > 0 else float("nan")


# ------------------------------------------------------------------ command line


def main(argv=None) -> int:
    """`python -m looped.studies.paired --out runs/analysis/paired.json [--quick] [--runs runs]`."""
    ap = argparse.ArgumentParser(prog="looped paired", description="Paired case-study estimators.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", default="runs")
    ap.add_argument("--quick", action="store_true", help="few restarts, resamples and simulation reps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--seed-sd", type=float, default=None, help="simulation noise (nats); default: measured, else 0.011"
    )
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--same-runs-as", default=None, metavar="JSON",
                    help="a results file of this command: rerun on exactly the runs it used (sweeps add runs)")
    ap.add_argument("--true-dphi", type=float, default=None, help="default: each study's paired estimate")
    a = ap.parse_args(argv)
    t0, cfg = time.perf_counter(), dict(QUICK if a.quick else FULL)
    if a.reps:
        cfg["n_reps"] = a.reps
    kw = dict(restarts=cfg["restarts"], bootstrap=cfg["bootstrap"], boot_restarts=cfg["boot_restarts"], seed=a.seed)
    try:
        arms = load_arms(a.runs)
        if a.same_runs_as:
            arms = same_runs(arms, a.same_runs_as)
        main_df, ctl = arms["main"], arms["control_linear"]
        measured = seed_sd(arms)
        noise = a.seed_sd if a.seed_sd is not None else (measured if np.isfinite(measured) else 0.011)
        law = main_law(main_df, **kw)
        out = {"settings": dict(cfg, seed=a.seed, seed_sd=noise, seed_sd_measured=measured, quick=a.quick,
                                huber_delta=HUBER_DELTA, runs={k: len(v) for k, v in arms.items()},
                                run_ids={k: sorted(map(str, v["run_id"])) for k, v in arms.items()}),
               "main_fit": {k: getattr(law, k) for k in ("A", "alpha", "B", "beta", "E", "phi", "r2", "n_runs")},
               "studies": {}, "simulation": {}}
        if len(ctl):
            out["studies"]["linear_r1"] = {"gains_by_budget": paired_gains(pairs(main_df, ctl), ("budget",))}
        for name in STUDIES:
            var = arms[name]
            if not len(var):
                continue
            if name == "hyper" and len(arms["control_hyper"]):
                var = pd.concat([var, arms["control_hyper"]], ignore_index=True)
            P = pairs(main_df, var, ctl)
            one, both = (paired_estimate(main_df, var, ctl, o, law, **kw) for o in (False, True))
            res = {"pairs": len(P), "unmatched": P.attrs["unmatched"], "paired": one["dphi"],
                   "paired_offset": both["dphi"], "offset_log": both["offset"],
                   "resid_sd": one["resid_sd"], "resid_sd_offset": both["resid_sd"]}
            res["paper"] = paper_protocol(main_df, arms[name], **kw)
            res.update(gains_by_r=paired_gains(P, ("r",)), gains_by_budget=paired_gains(P, ("budget",)),
                       gains_by_budget_r=paired_gains(P, ("budget", "r")))
            out["studies"][name] = res
            if name in ("truncated", "hyper"):
                true = a.true_dphi if a.true_dphi is not None else float(np.clip(res["paired"].estimate, -1, 1))
                t1 = time.perf_counter()
                sim = simulate_estimators(main_df, var, true, cfg["n_reps"], a.seed, ctl, 0.0, noise, a.quick)
                out["simulation"][name] = {"true_dphi": true, "seconds": time.perf_counter() - t1, "summary": sim}
    except FitError as e:
        print(f"looped.studies.paired: error: {e}", file=sys.stderr)
        return 2
    out["seconds"] = time.perf_counter() - t0
    atomic_write_json(a.out, json_ready(out), allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
