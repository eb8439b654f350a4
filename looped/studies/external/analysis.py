"""φ on another lab's looped runs (the qlabs-eng/scaling-exponents tables, read into our runs table
by `looped.studies.external.runs`), analysed: `run_all`, `python -m looped.studies.external.analysis --out F`.

What one ladder can identify (profiles), a matched-loss (ladder-equivalent) φ of the two-loop arm
against each r = 1 reference ladder, and the data-constrained grid fitted with D fixed.  Every fit
is `looped.fit.fit`; the profiles fix one parameter and refit the others.  Numbers only.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from scipy.interpolate import PchipInterpolator
from scipy.optimize import brentq

from ...config import REPO, repo_relative
from ...fit import FitError, fit
from ...io import atomic_write_json, json_ready
from ...solver import RunArrays, law_loss
from ..paper import PAPER_LAW
from .runs import BATCH_TOKENS, DATA, GRID_STEPS, export, flops_check, grid_runs, ladder_runs

RESULTS = REPO / "runs" / "analysis" / "external.json"
REFERENCES = ("untied_2", "deep_vanilla", "vanilla")
FULL = dict(restarts=300, bootstrap=200, boot_restarts=20, profile_points=36)
QUICK = dict(restarts=40, bootstrap=20, boot_restarts=3, profile_points=13)
INTERP = ("linear", "pchip", "quadratic")
DATA_SCALES = (0.5, 1.0, 1.5)     # the paper's data term B D^-beta, scaled: the token correction's range


# ----------------------------------------------------------------------------- profiles and fits

def _sse(res, df) -> float:
    data = RunArrays.from_frame(df, chinchilla=res.phi is None)
    return float(((law_loss(res.theta, data) - data.loss) ** 2).sum())


def profile(df, name: str, values, fix=None, restarts=40, seed=0, chinchilla=None) -> pd.DataFrame:
    """The fitter's objective with `name` held at each value and every other free parameter refitted."""
    rows = []
    for v in values:
        res = fit(df, restarts=restarts, seed=seed, fix=dict(fix or {}, **{name: float(v)}), chinchilla=chinchilla)
        rows.append({name: float(v), "huber": res.huber, "rmse": math.sqrt(_sse(res, df) / len(df)),
                     "alpha": res.alpha, "beta": res.beta, "A": res.A, "E": res.E})
    return pd.DataFrame(rows)


def profile_interval(prof: pd.DataFrame, name: str, n: int, k: int, level: float = 0.95):
    """Values whose residual sum of squares is within the F-test bound of the profile's best (nonlinear
    least squares; n runs, k free parameters), the crossings interpolated linearly between profile points:
    (lo, hi), NaN where the bound is not crossed inside the profile."""
    sse = prof.rmse.to_numpy() ** 2 * n
    limit = sse.min() * (1 + stats.f.ppf(level, 1, max(n - k, 1)) / max(n - k, 1))
    x, i = prof[name].to_numpy(), np.flatnonzero(sse <= limit)

    def cross(a, b):   # between profile points a (outside) and b (inside)
        return float(x[a] + (x[b] - x[a]) * (sse[a] - limit) / (sse[a] - sse[b]))
    lo = cross(i[0] - 1, i[0]) if i[0] > 0 else float("nan")
    hi = cross(i[-1] + 1, i[-1]) if i[-1] < len(x) - 1 else float("nan")
    return lo, hi


def identification(ladder, s) -> dict:
    """One ladder cannot separate size from data (N and D move together: D = k (N + embedding)), nor
    φ from A (N_rec / N is nearly fixed along the loop ladder): two flat profiles, against a joint fit."""
    tpp = ladder.assign(k=ladder.tokens / (ladder.n_once + ladder.n_rec + ladder.embedding),
                        d_over_n=ladder.tokens / (ladder.n_once + ladder.n_rec))
    ratio = tpp.groupby("arm").agg(k=("k", "mean"), k_sd=("k", "std"), d_over_n_min=("d_over_n", "min"),
                                   d_over_n_max=("d_over_n", "max")).reset_index()
    van, loop = ladder[ladder.arm == "vanilla"], ladder[ladder.arm == "loop_2"]
    npts, rs = s["profile_points"], s["restarts"]
    beta = profile(van, "beta", np.linspace(0.05, 1.5, npts), restarts=rs, chinchilla=True)
    phi_loop = profile(loop, "phi", np.linspace(-1, 2, npts), restarts=rs)
    joint = ladder[ladder.arm.isin(["loop_2", "untied_2"])]
    phi_joint = profile(joint, "phi", np.linspace(-1, 2, npts), restarts=rs)
    res = fit(joint, restarts=max(rs, 200))     # a shallow optimum: never fewer restarts, even in the quick rerun
    return {"tokens_per_param": ratio, "beta_profile_vanilla": beta, "phi_profile_loop2": phi_loop,
            "phi_profile_loop2_untied2": phi_joint, "joint_loop2_untied2": res.to_dict()}


# ----------------------------------------------------------------------------- matched-loss φ

def _interp(x, xs, ys, method):
    if method == "pchip":
        return float(PchipInterpolator(xs, ys, extrapolate=True)(x))
    if method == "quadratic":     # through the three nearest ladder points
        i = np.argsort(np.abs(xs - x))[:3]
        return float(np.polyval(np.polyfit(xs[i], ys[i], 2), x))
    j = int(np.clip(np.searchsorted(xs, x) - 1, 0, len(xs) - 2))     # linear, extended at both ends
    return float(ys[j] + (ys[j + 1] - ys[j]) * (x - xs[j]) / (xs[j + 1] - xs[j]))


def matched_phi(loop_row, ref: pd.DataFrame, method="linear", data_scale=1.0, law=PAPER_LAW) -> dict:
    """φ at which the loop run's N_once + 2^φ N_rec equals N*, the reference-ladder size of equal loss.
    The loop's loss is first moved to the reference's tokens at N* with data_scale x the law's B D^-beta
    (0: the ladder-equivalent φ as trained).  Loss and log D are interpolated in log N along the ladder."""
    ref = ref.sort_values("n_once")
    xs = np.log((ref.n_once + ref.n_rec).to_numpy(float))
    ys, ds = ref.loss.to_numpy(float), np.log(ref.tokens.to_numpy(float))
    B, beta = law.B * data_scale, law.beta

    def gap(x):
        d_ref = math.exp(_interp(x, xs, ds, "linear"))
        return _interp(x, xs, ys, method) - loop_row.loss - B * (d_ref ** -beta - loop_row.tokens ** -beta)

    grid = np.linspace(xs[0] - 1.0, xs[-1] + 1.0, 241)
    g = np.array([gap(x) for x in grid])
    cross = np.flatnonzero(np.sign(g[:-1]) != np.sign(g[1:]))
    n_u = loop_row.n_once + loop_row.n_rec
    if not len(cross):
        return dict(n_star=float("nan"), phi=float("nan"), extrapolated=True, ratio=float("nan"))
    i = cross[np.argmin(np.abs(grid[cross] - math.log(n_u)))]
    x = brentq(gap, grid[i], grid[i + 1])
    n_star = math.exp(x)
    over = n_star - loop_row.n_once
    phi = math.log(over / loop_row.n_rec, loop_row.r) if over > 0 else float("nan")
    return dict(n_star=n_star, phi=phi, extrapolated=bool(x < xs[0] or x > xs[-1]), ratio=n_star / n_u)


def _span(values) -> tuple[float, float]:
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    return (float(v.min()), float(v.max())) if len(v) else (float("nan"), float("nan"))


def matched_table(ladder, references=REFERENCES) -> pd.DataFrame:
    """Per (reference arm, depth): the ladder-equivalent φ as trained (no token correction), φ with the
    paper's data term (linear interpolation: the central value), and the envelope over interpolation
    (linear, PCHIP, local quadratic) x token correction (DATA_SCALES of the paper's data term)."""
    rows = []
    for ref_arm in references:
        ref = ladder[ladder.arm == ref_arm]
        for x in ladder[ladder.arm == "loop_2"].sort_values("depth").itertuples():
            raw, mid = matched_phi(x, ref, "linear", 0.0), matched_phi(x, ref, "linear", 1.0)
            lo, hi = _span([matched_phi(x, ref, m, sc)["phi"] for m in INTERP for sc in DATA_SCALES])
            rows.append(dict(reference=ref_arm, depth=x.depth, loss=x.loss, phi_raw=raw["phi"], phi=mid["phi"],
                             phi_lo=lo, phi_hi=hi, n_star=mid["n_star"],
                             n_star_over_unique=mid["ratio"], extrapolated=mid["extrapolated"] or raw["extrapolated"]))
    return pd.DataFrame(rows)


def matched_summary(tab: pd.DataFrame, ladder) -> pd.DataFrame:
    """Per reference: the median over interpolated depths of the central φ, of the raw φ and of the
    envelope's ends; the depths' range; and the recipe gap (untied_2 - deep_vanilla: same N, D, FLOPs)."""
    rows = []
    for ref, t in tab.groupby("reference", sort=False):
        t = t[~t.extrapolated]
        rows.append(dict(reference=ref, n_depths=len(t), phi=float(t.phi.median()), phi_raw=float(t.phi_raw.median()),
                         phi_lo=float(t.phi_lo.median()), phi_hi=float(t.phi_hi.median()),
                         depth_min=float(t.phi.min()), depth_max=float(t.phi.max())))
    by_arm = {arm: t.set_index("depth").loss for arm, t in ladder.groupby("arm")}
    gap = by_arm["untied_2"] - by_arm["deep_vanilla"]
    out = pd.DataFrame(rows)
    out.attrs["recipe_gap"] = gap
    return out


# ----------------------------------------------------------------------------- the data-constrained grid

def pointwise_phi(best: pd.DataFrame, law) -> pd.DataFrame:
    """φ of each looped grid run against its own depth's r = 1 run: the law's alpha and E, A_d set so the
    law passes through the r = 1 run, then the φ that puts the looped run on the law (D is the same)."""
    c = law.B * (GRID_STEPS * BATCH_TOKENS) ** -law.beta
    rows = []
    for d, t in best.groupby("depth"):
        one = t[t.r == 1]
        if one.empty:
            continue
        n1 = float(one.n_once.iloc[0])
        a_d = (float(one.loss.iloc[0]) - law.E - c) * n1 ** law.alpha
        for x in t[t.r > 1].itertuples():
            excess = x.loss - law.E - c
            n_eff = (excess / a_d) ** (-1 / law.alpha) if excess > 0 and a_d > 0 else float("nan")
            over = n_eff - x.n_once
            rows.append(dict(depth=d, r=x.r, loss=x.loss, gain=float(one.loss.iloc[0]) - x.loss, n_eff=n_eff,
                             phi=math.log(over / x.n_rec, x.r) if over > 0 else float("nan")))
    return pd.DataFrame(rows)


def grid_matched(best: pd.DataFrame) -> pd.DataFrame:
    """The matched-loss φ inside the grid, law-free: each looped run against the r = 1 runs of every
    depth (all runs have the same tokens, so no token correction); envelope over the interpolations."""
    ref = best[best.r == 1]
    rows = []
    for x in best[best.r > 1].itertuples():
        mid = matched_phi(x, ref, "linear", 0.0)
        lo, hi = _span([matched_phi(x, ref, m, 0.0)["phi"] for m in INTERP])
        rows.append(dict(depth=x.depth, r=x.r, loss=x.loss, phi=mid["phi"], phi_lo=lo, phi_hi=hi, n_star=mid["n_star"],
                         extrapolated=mid["extrapolated"]))
    return pd.DataFrame(rows)


def grid_analysis(best: pd.DataFrame, s, seed=0, all_runs=None) -> dict:
    """Our law with D fixed (B, beta held at the paper's: with one D their term is a constant E absorbs):
    pooled φ with bootstrap and profile intervals, per-depth φ (alpha, E from the pooled fit; A, φ free),
    pointwise φ, and the same fit on subsets (r <= 4, the paper's r, one weight decay for all)."""
    held = {"B": PAPER_LAW.B, "beta": PAPER_LAW.beta}
    res = fit(best, restarts=s["restarts"], seed=seed, fix=held, bootstrap=s["bootstrap"],
              boot_restarts=s["boot_restarts"])
    prof = profile(best, "phi", np.linspace(-0.25, 1.5, s["profile_points"]), fix=held, restarts=s["restarts"])
    lo, hi = profile_interval(prof, "phi", len(best), 4)
    pooled = dict(res.to_dict(), phi_profile_lo=lo, phi_profile_hi=hi, n_runs=len(best),
                  rmse=math.sqrt(_sse(res, best) / len(best)))
    per_depth = []
    for d, t in best.groupby("depth"):
        if (t.r == 1).sum() == 0 or len(t) < 3:
            continue
        fix = dict(held, alpha=res.alpha, E=res.E)
        r_d = fit(t, restarts=s["restarts"], seed=seed, fix=fix)
        p_d = profile(t, "phi", np.linspace(-0.5, 2.5, s["profile_points"]), fix=fix,
                      restarts=max(8, s["restarts"] // 4))
        lo_d, hi_d = profile_interval(p_d, "phi", len(t), 2)
        per_depth.append(dict(depth=d, n_runs=len(t), max_r=int(t.r.max()), phi=r_d.phi, phi_lo=lo_d, phi_hi=hi_d))
    subsets = {"r <= 4": best[best.r <= 4], "r in {1, 2, 4, 8}": best[best.r.isin([1, 2, 4, 8])]}
    if all_runs is not None:
        subsets["weight decay 0.8 for all"] = all_runs[all_runs.weight_decay == 0.8]
    sub = []
    for name, t in subsets.items():
        r_s = fit(t.reset_index(drop=True), restarts=s["restarts"], seed=seed, fix=held)
        sub.append(dict(subset=name, n_runs=len(t), phi=r_s.phi, alpha=r_s.alpha,
                        rmse=math.sqrt(_sse(r_s, t) / len(t))))
    table = best[["depth", "r", "weight_decay", "wd_at_edge", "n_wd", "loss", "n_once", "n_rec"]]
    return {"fit": pooled, "profile": prof, "per_depth": pd.DataFrame(per_depth),
            "pointwise": pointwise_phi(best, res.law), "matched": grid_matched(best),
            "subsets": pd.DataFrame(sub), "best_weight_decay": table}


# ----------------------------------------------------------------------------- all of it

def run_all(folder=DATA, settings=None, seed=0) -> dict:
    s = dict(FULL if settings is None else settings)
    ladder, grid_all = ladder_runs(folder), grid_runs(folder, best=False)
    best = grid_runs(folder)
    tab = matched_table(ladder)
    summ = matched_summary(tab, ladder)
    return {"flops_check": flops_check(ladder, grid_all), "ladder": ladder, "identification": identification(ladder, s),
            "matched": tab, "matched_summary": summ, "recipe_gap": summ.attrs["recipe_gap"].rename("gap").reset_index(),
            "grid": grid_analysis(best, s, seed, all_runs=grid_all), "settings": s,
            "paper": {"phi": PAPER_LAW.phi, "B": PAPER_LAW.B, "beta": PAPER_LAW.beta}}


def read_results(path=RESULTS) -> dict:
    """The committed results: tables as DataFrames (nested dicts kept), as `run_all` made them."""
    raw = json.loads(Path(path).read_text())

    def tables(x):
        if isinstance(x, list) and x and isinstance(x[0], dict):
            return pd.DataFrame(x)
        if isinstance(x, dict):
            return {k: tables(v) for k, v in x.items()}
        return x
    return tables(raw)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="looped external", description="phi on the qlabs-eng/scaling-exponents runs.")
    ap.add_argument("--data", default=str(DATA), help="folder of their CSV files")
    ap.add_argument("--out", help="JSON file of the analysis to write")
    ap.add_argument("--export", metavar="DIR", help="write the runs tables as CSV files for `looped fit`")
    ap.add_argument("--quick", action="store_true", help="fewer restarts, resamples and profile points (CI)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fits and resamples (default 0)")
    a = ap.parse_args(argv)
    if not (a.out or a.export):
        ap.error("give --out and/or --export")
    t0 = time.perf_counter()
    try:
        if a.export:
            for p in export(a.data, a.export):
                print(f"wrote {p}")
        if a.out:
            out = run_all(a.data, QUICK if a.quick else FULL, seed=a.seed)
            out["settings"] = dict(out["settings"], quick=a.quick, seed=a.seed, data=repo_relative(a.data),
                                   total_seconds=time.perf_counter() - t0)
            atomic_write_json(a.out, json_ready(out), allow_nan=False)
            print(f"wrote {a.out}")
    except FitError as e:
        print(f"looped external: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
