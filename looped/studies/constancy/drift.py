"""Does phi drift with compute?  One phi per budget, the law fitted to windows of consecutive
budgets, and a linear trend phi = phi0 + phi1 log10 C (ours and the paper's 24 minima), with the
trend's null spread simulated and the power to see a given slope.  Runs at a further budget
(`--drift`, the cpu-drift study) join these fits once they have a run at every r (`add_budgets`).
Part of `looped constancy` (`looped.studies.constancy.analysis.run_all`).  Numbers only.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from ...fit import FitError, fit, validate_runs
from ...law import Law, synthetic_losses
from ...resample import cells
from ..paper import PAPER_DIR, PAPER_LAW, runs_from_minima
from .variants import FIVE, NAN2, fit_multi, fit_row, onehot


def add_budgets(df, extra) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(df plus the budgets of `extra` that have a run at every r of df, those added runs): a budget
    still missing an r would leave its own phi unidentified, so it waits.  FitError if `extra`
    repeats a budget of df (replicates belong in --seeds)."""
    if extra is None or not len(extra):
        return df, df.iloc[:0]
    extra = validate_runs(extra, need=("budget", "s"))
    twice = sorted(set(extra["budget"]) & set(df["budget"]))
    if twice:
        raise FitError(f"drift runs repeat budget(s) {', '.join(f'{b:g}' for b in twice)} of the main runs")
    rs = set(df["r"])
    ready = [b for b, g in extra.groupby("budget") if rs <= set(g["r"])]
    added = extra[extra["budget"].isin(ready)]
    return pd.concat([df, added], ignore_index=True), added.reset_index(drop=True)


def per_budget_phi(df, restarts=200, bootstrap=200, seed=0, boot_restarts=8, fix=None) -> pd.DataFrame:
    """One phi per budget, the other five shared (one joint fit): budget, phi, phi_lo, phi_hi,
    r2, rmse, n_runs (all budgets), huber, n_boot_valid (resamples with a looped cell of it)."""
    df = validate_runs(df, need=("budget",))
    X, budgets = onehot(df["budget"])
    labels = [f"phi_C{v:g}" for v in budgets]
    m = fit_multi(
        df, X, labels, restarts=restarts, seed=seed, bootstrap=bootstrap, boot_restarts=boot_restarts, fix=fix
    )
    return pd.DataFrame(
        [dict(budget=v, **m.row(lab), n_boot_valid=m.n_valid.get(lab, 0)) for v, lab in zip(budgets, labels)]
    )


def window_phi(df, width=2, restarts=500, bootstrap=200, seed=0, boot_restarts=None) -> pd.DataFrame:
    """The law fitted to each `width` consecutive budgets: budget_lo, budget_hi, then fit_row's columns."""
    df = validate_runs(df, need=("budget",))
    b = sorted(df["budget"].unique())
    subs = [df[df["budget"].isin(b[i:i + width])].reset_index(drop=True) for i in range(len(b) - width + 1)]
    return pd.DataFrame([dict(budget_lo=s["budget"].min(), budget_hi=s["budget"].max(), **fit_row(
        fit(s, restarts=restarts, seed=seed, bootstrap=bootstrap, boot_restarts=boot_restarts), s)) for s in subs])


def phi_trend(df, restarts=200, bootstrap=200, seed=0, boot_restarts=8, fix=None) -> dict:
    """phi_i = phi0 + phi1 log10(C_i), the other five shared.  phi_mid: phi at the mean log10 C of
    the budgets (log10_c_centre).  phi1's scales: cell-bootstrap percentiles (a robustness band:
    with few cells its ends move between reruns) and the delete-one jackknife over (budget, r)
    cells (SE, z = phi1 / SE).  A jackkknife over budgets would only measure how far four points
    scatter about a line, not the noise of each budget's phi."""
    df = validate_runs(df, need=("budget",))
    lb = np.log10(sorted(df["budget"].unique()))
    centre = float(lb.mean())

    def one(sub, boot, restarts=restarts):
        X = np.column_stack([np.ones(len(sub)), np.log10(sub["budget"].to_numpy(float)) - centre])
        return fit_multi(sub, X, ["phi_mid", "phi1"], restarts=restarts, seed=seed, bootstrap=boot,
                         boot_restarts=boot_restarts, fix=fix)

    m, cell = one(df, bootstrap), cells(df)
    jack = np.array([one(df[cell != c].reset_index(drop=True), 0, min(restarts, 32)).params["phi1"]
                     for c in range(cell.max() + 1)])
    k, p1 = len(jack), m.params["phi1"]
    se = float(np.sqrt((k - 1) / k * ((jack - jack.mean()) ** 2).sum())) if k > 2 else math.nan
    return dict(phi_mid=m.params["phi_mid"], phi1=p1, phi0=m.params["phi_mid"] - p1 * centre, log10_c_centre=centre,
                phi1_boot_lo=m.ci.get("phi1", NAN2)[0], phi1_boot_hi=m.ci.get("phi1", NAN2)[1], phi1_jack_se=se,
                phi1_jack_z=p1 / se, n_cells=k, n_budgets=len(lb), n_runs=m.n_runs, r2=m.r2, rmse=m.rmse)


def trend_simulation(df, law: dict, cell_sd: float, noise: float, n_draws=100, restarts=16, seed=0) -> dict:
    """The trend's SE where there is no trend: losses from the constant-phi `law` on our design, plus
    one shift per (budget, r) cell of SD `cell_sd` nats (the law's misfit, as observed) and white
    noise of SD `noise` nats (seed noise), each draw's phi1 refitted.  Returns the null mean and SD of phi1."""
    design = validate_runs(df, need=("budget",))
    truth, cell = Law.from_dict(law), cells(design)
    rng, centre = np.random.default_rng([seed, 3]), float(np.log10(sorted(design["budget"].unique())).mean())
    X = np.column_stack([np.ones(len(design)), np.log10(design["budget"].to_numpy(float)) - centre])
    draws = []
    for i in range(n_draws):
        y = synthetic_losses(truth, design, rng, noise=noise, cell_sd=cell_sd, cells=cell, cells_first=True)
        draws.append(fit_multi(design.assign(loss=y), X, ["phi_mid", "phi1"], restarts=restarts,
                               seed=seed + i).params["phi1"])
    d = np.asarray(draws)
    return dict(null_mean=float(d.mean()), se=float(d.std(ddof=1)), n_draws=n_draws, cell_sd=cell_sd, noise=noise)


def power(effect: float, se: float) -> float:
    """Two-sided 5% power of a z test of slope `effect` with standard error `se` (normal approximation)."""
    z = abs(effect) / se
    return float(stats.norm.sf(1.959964 - z) + stats.norm.cdf(-1.959964 - z))


def phi_vs_compute(df, restarts=500, bootstrap=200, seed=0, boot_restarts=None, multi_restarts=200,
                   multi_boot_restarts=8, drift=None) -> dict:
    """per_budget (our runs, per_budget_phi), windows (window_phi), paper_per_budget and
    paper_windows (the paper's 24 minima per budget and per two consecutive budgets, its five
    other published parameters held: budget or budget_lo/budget_hi, phi, n_cells), trend
    (phi_trend, one row per data set: 'ours', 'paper_minima').  Ours include the `drift` budgets
    that have a run at every r (add_budgets)."""
    df = add_budgets(validate_runs(df, need=("budget",)), drift)[0]
    kw = dict(restarts=multi_restarts, seed=seed, bootstrap=bootstrap, boot_restarts=multi_boot_restarts)
    five = {k: v for k, v in PAPER_LAW.to_dict().items() if k in FIVE}
    minima = runs_from_minima(PAPER_DIR / "compute_optimal_minima.csv")     # the 24 published minima as runs
    held = lambda s: fit(s.reset_index(drop=True), restarts=restarts, seed=seed, fix=five).phi  # noqa: E731
    paper = [dict(budget=v, phi=held(s), n_cells=len(s)) for v, s in minima.groupby("budget")]
    b = sorted(minima["budget"].unique())
    pairs = [minima[minima["budget"].isin(b[i:i + 2])] for i in range(len(b) - 1)]
    return dict(per_budget=per_budget_phi(df, **kw),
                windows=window_phi(df, restarts=restarts, bootstrap=bootstrap, seed=seed, boot_restarts=boot_restarts),
                paper_per_budget=pd.DataFrame(paper),
                paper_windows=pd.DataFrame([dict(budget_lo=s["budget"].min(), budget_hi=s["budget"].max(),
                                                 phi=held(s), n_cells=len(s)) for s in pairs]),
                trend=pd.DataFrame([dict(data="ours", **phi_trend(df, **kw)),
                                    dict(data="paper_minima", **phi_trend(minima, fix=five, **kw))]))
