"""The fits behind every estimate of phi: the joint fit of the main design and its budget
halves, the case-study refits beside them, the paper's published estimates for comparison, and
two views of how firmly the runs pin phi down (`phi_profile`, `rmse_at_phi`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ...fit import fit
from ...law import as_law, residuals
from ..case_studies.protocol import case_study
from ..paper import paper_fits
from ..sweep.iso_flop import budget_halves, main_design
from ..sweep.study import Study


def phi_profile(runs, phis=None, restarts: int = 100, seed: int = 0):
    """How well the data pin phi down: the law refitted with phi held at each value of `phis`
    (the other five parameters free), one row per value with the fit's Huber objective, its
    ratio to the lowest objective of the profile, and R^2.  A flat profile means the data hardly
    prefer one phi over another; a narrow valley means phi is well identified."""
    phis = np.linspace(-0.5, 1.5, 21) if phis is None else np.asarray(phis, float)
    rows = []
    for v in phis:
        res = fit(runs, restarts=restarts, seed=seed, fix={"phi": float(v)})
        rows.append({"phi": float(v), "huber": float(res.huber), "r2": float(res.r2)})
    out = pd.DataFrame(rows)
    out["relative"] = out["huber"] / out["huber"].min()
    return out


PHI_FITS = {   # label of an estimate of phi -> its row in the paper's fits.csv (`looped.studies.paper.paper_fits`)
    "joint fit": "phi_free",
    "lower budgets": "phi_free_low_half_budgets",
    "upper budgets": "phi_free_high_half_budgets",
    "case-study baseline": "baseline_four_lower_budgets",
    "truncated BPTT": "truncated_bptt",
    "hyperconnections": "hyperconnections_2lanes",
}


def joint_fit_ready(runs) -> bool:
    """Whether a main-design runs table (`main_design`) can carry the joint law: at least 12
    runs, the plain model (r = 1) and a looped one, and two budgets (at one budget the tokens
    are a function of the width, so the size and data terms cannot be told apart)."""
    r = set(runs["r"].astype(int)) if len(runs) else set()
    return len(runs) >= 12 and 1 in r and len(r) >= 2 and runs["budget"].nunique() >= 2


def half_fits(runs, restarts: int = 500, seed: int = 0, bootstrap: int = 0) -> dict:
    """The joint law fitted to the lower and to the upper budgets separately (`budget_halves`),
    the paper's check that phi does not drift with scale.

    Returns ``{"lower": (budgets, FitResult), "upper": (budgets, FitResult)}``.  A half is left
    out when it would hold every budget (a single budget), fewer than 7 runs (six free
    parameters) or no looped run.
    """
    budgets = sorted(runs["budget"].unique())
    out = {}
    for name, part in zip(("lower", "upper"), budget_halves(budgets)):
        sub = runs[runs["budget"].isin(part)].reset_index(drop=True)
        if len(part) < len(budgets) and len(sub) >= 7 and (sub["r"] > 1).any():
            out[name] = (part, fit(sub, restarts=restarts, seed=seed, bootstrap=bootstrap))
    return out


def our_phi_fits(main_runs, truncated_runs=None, hyper=None, restarts: int = 500, seed: int = 0,
                 bootstrap: int = 200) -> dict:
    """Our fits behind every estimate of phi, under the labels of `PHI_FITS`.

    The joint fit and the budget halves (each with ``bootstrap`` block-bootstrap resamples) on
    the main design of the records in the folder ``main_runs`` (`looped.studies.sweep.study.Study.records`);
    the case-study baseline and the hyperconnection refit
    from ``hyper`` (a `looped.studies.case_studies.protocol.CaseStudy` already fitted); the truncated-BPTT refit
    on the records in ``truncated_runs`` beside the main study (`looped.studies.case_studies.protocol.case_study`,
    reusing the baseline of ``hyper`` when both studies cover the same budgets).  A fit that
    could not be done (too few runs, a study not given) is None.  Relative folders are taken
    from the repository root (by `Study`).
    """
    runs, _ = main_design(Study.at(main_runs).records())
    out = dict.fromkeys(PHI_FITS)
    if joint_fit_ready(runs):
        out["joint fit"] = fit(runs, restarts=restarts, seed=seed, bootstrap=bootstrap)
        for name, (_, res) in half_fits(runs, restarts=restarts, seed=seed, bootstrap=bootstrap).items():
            out[f"{name} budgets"] = res
    if hyper is not None:
        out["case-study baseline"], out["hyperconnections"] = hyper.baseline, hyper.variant
    if truncated_runs is not None:
        cs = case_study(main_runs, truncated_runs, name="truncated BPTT", restarts=restarts, seed=seed,
                        bootstrap=bootstrap, reuse=hyper)
        out["truncated BPTT"] = cs.variant
        if out["case-study baseline"] is None:
            out["case-study baseline"] = cs.baseline
    return out


def phi_estimates(ours: dict | None = None) -> pd.DataFrame:
    """Every estimate of phi, the paper's and ours, one row each (for `looped.report.fit_figures.plot_phi_forest`).

    Columns label, source ('paper' or 'ours'), phi, lo, hi (the 95% bootstrap interval; NaN
    where there is none: the paper gives one for its joint fit only).  The paper's rows come from
    its published fits (`PHI_FITS`: the joint fit, its budget halves and Table 3); ``ours`` maps
    the same labels to FitResults (`our_phi_fits`), and a label whose fit is None or has no phi
    gets a row with NaN phi (not fitted).  Rows are ordered by label, the paper's before ours.
    """
    paper = paper_fits()
    unknown = set(ours or {}) - set(PHI_FITS)
    if unknown:
        raise ValueError(f"unknown estimate(s) of phi: {', '.join(sorted(unknown))}; choose from {', '.join(PHI_FITS)}")
    rows = []
    for label, key in PHI_FITS.items():
        p = paper.loc[key]
        rows.append(dict(label=label, source="paper", phi=float(p["phi"]), lo=float(p["phi_ci_low"]),
                         hi=float(p["phi_ci_high"])))
        if ours is not None and label in ours:
            res = ours[label]
            phi = float("nan") if res is None or res.phi is None else float(res.phi)
            lo, hi = (float("nan"),) * 2 if res is None else res.ci.get("phi", (float("nan"),) * 2)
            rows.append(dict(label=label, source="ours", phi=phi, lo=float(lo), hi=float(hi)))
    return pd.DataFrame(rows, columns=["label", "source", "phi", "lo", "hi"])


def rmse_at_phi(law, runs, phis) -> dict:
    """RMSE (nats) of the runs around a law (a Law or FitResult) with its phi replaced by each value
    of ``phis``, the other five parameters kept: how well the effective size N_once + r^phi N_rec
    lines the runs of every r up on the law's curve (the measure of
    `looped.report.fit_figures.plot_neff_collapse`).  Returns {phi: RMSE}."""
    law = as_law(law)
    return {float(v): float(np.sqrt(np.mean(residuals(law.replace(phi=float(v)), runs) ** 2))) for v in phis}
