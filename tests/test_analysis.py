"""The reading of a joint fit (`joint_fit_verdict`), every estimate of phi beside the paper's
(`phi_estimates`) and the budget halves, on synthetic inputs."""
import math

import numpy as np
import pandas as pd
import pytest

from looped.fit import FitResult
from looped.law import Law
from looped.studies.phi import estimates as phi_fits
from looped.studies.sweep import iso_flop


def _fit(phi, lo=None, hi=None, r2=0.99, theta=(), n_runs=40):
    ci = {} if lo is None else {"phi": (lo, hi)}
    return FitResult(Law(A=28.0, alpha=0.2, B=900.0, beta=0.37, E=1.57, phi=phi), r2=r2, huber=0.0, n_runs=n_runs,
                     restarts=10, ci=ci, theta=theta)


def _runs(phi=0.5, noise=0.0, seed=0, budgets=(1e17, 1e18, 1e19)):
    """Three budgets, r = 1, 2, 4 at four widths, losses from a law (iso-depth: the tokens of a
    width are the same for every r)."""
    rows = []
    for budget in budgets:
        for r in (1, 2, 4):
            for d in (256, 512, 1024, 2048):
                n_rec = 0.0 if r == 1 else 48.0 * d * d / r
                n_once = 24.0 * d * d + (96.0 * d * d if r == 1 else 48.0 * d * d - n_rec)
                rows.append(dict(budget=budget, r=r, n_once=n_once, n_rec=n_rec, tokens=budget / (6 * 120.0 * d * d)))
    df = pd.DataFrame(rows)
    law = _fit(phi)
    neff = df.n_once + df.r ** phi * df.n_rec
    df["loss"] = law.E + law.A * neff ** -law.alpha + law.B * df.tokens ** -law.beta
    df["loss"] += np.random.default_rng(seed).normal(0, noise, len(df))
    return df





def test_phi_estimates_pairs_the_papers_rows_with_ours():
    paper_only = phi_fits.phi_estimates()
    assert list(paper_only.label) == list(phi_fits.PHI_FITS) and set(paper_only.source) == {"paper"}
    joint = paper_only.set_index("label").loc["joint fit"]
    assert (joint.phi, joint.lo, joint.hi) == (0.459, 0.41, 0.53)
    assert paper_only.set_index("label").loc["hyperconnections"].phi == 0.646
    assert paper_only.drop(index=0)[["lo", "hi"]].isna().all().all()          # an interval for the joint fit only
    est = phi_fits.phi_estimates({"joint fit": _fit(0.9, 0.7, 1.1), "truncated BPTT": None,
                                  "lower budgets": _fit(1.0)})
    ours = est[est.source == "ours"].set_index("label")
    assert len(est) == len(phi_fits.PHI_FITS) + 3
    assert tuple(ours.loc["joint fit", ["phi", "lo", "hi"]]) == (0.9, 0.7, 1.1)
    assert math.isnan(ours.loc["truncated BPTT", "phi"]) and math.isnan(ours.loc["lower budgets", "lo"])
    with pytest.raises(ValueError, match="unknown estimate"):
        phi_fits.phi_estimates({"joint": _fit(0.5)})


def test_joint_fit_ready_and_half_fits():
    runs = _runs(0.5, noise=0.002)
    assert phi_fits.joint_fit_ready(runs)
    assert not phi_fits.joint_fit_ready(runs[runs.r == 1]) and not phi_fits.joint_fit_ready(runs[runs.budget == 1e17])
    halves = phi_fits.half_fits(runs, restarts=20)
    assert list(halves) == ["lower", "upper"]
    assert halves["lower"][0] == [1e17, 1e18] and halves["upper"][0] == [1e18, 1e19]   # odd: share the middle
    assert all(res.n_runs == 24 and res.phi is not None for _, res in halves.values())
    assert phi_fits.half_fits(runs[runs.budget == 1e17], restarts=5) == {}           # one budget: no halves


def test_rmse_at_phi_is_zero_at_the_laws_phi():
    runs = _runs(0.5)
    rmse = phi_fits.rmse_at_phi(_fit(0.5), runs, (0.0, 0.5, 1.0))
    assert list(rmse) == [0.0, 0.5, 1.0]
    assert rmse[0.5] < 1e-12 < 1e-3 < min(rmse[0.0], rmse[1.0])
    assert phi_fits.rmse_at_phi(_fit(0.5).law, runs, (0.0, 0.5, 1.0)) == rmse      # a Law or a FitResult


def test_gap_side_needs_every_r_on_one_side():
    paper = pd.DataFrame({"mean_gap": [0.04, 0.07, 0.11]}, index=[2, 4, 8])
    ours = lambda *g: pd.DataFrame({"mean_gap": list(g)}, index=[2, 4, 8])  # noqa: E731
    assert iso_flop.gap_side(ours(0.08, 0.09, 0.12), paper) == "more"
    assert iso_flop.gap_side(ours(0.01, 0.02, 0.03), paper) == "less"
    assert iso_flop.gap_side(ours(0.08, 0.02, 0.12), paper) is None


def test_same_width_gaps_split_into_slope_times_log_ratio():
    """With equal tokens at one width, a gap is the law's size term at two N_eff: about its fall
    per e-fold (`Law.size_slope`) times the log of the N_eff ratio; by budget it is constant."""
    runs = _runs(0.5).assign(s=lambda df: np.log2(df.budget / df.tokens).round())   # one s per width
    law = _fit(0.5).law
    pairs = iso_flop.same_width_pairs(runs, law)
    assert len(pairs) == 3 * 2 * 4 and (pairs.gap > 0).all()
    approx = law.size_slope(pairs.n_eff) * pairs.log_ratio
    np.testing.assert_allclose(pairs.gap, approx, rtol=0.02)
    table = iso_flop.gaps_by_budget(runs)
    assert list(table.columns) == [2, 4] and len(table) == 3
    np.testing.assert_allclose(table.std(), 0.0, atol=1e-12)
    summary = iso_flop.same_width_gaps(runs)
    np.testing.assert_allclose(summary.mean_gap, table.mean())



def test_gap_split_multiplies_to_about_the_gap():
    """On runs that follow a law exactly, log N_eff ratio x the size term's slope ~ the mean gap."""
    runs = _runs(0.5).assign(s=lambda df: np.log2(df.budget / df.tokens).round())
    law = _fit(0.5).law
    ratio, slope = iso_flop.gap_split(runs, law, 4)
    gap = iso_flop.same_width_gaps(runs).mean_gap[4]
    assert ratio > 0 and slope > 0
    assert ratio * slope == pytest.approx(gap, rel=0.15)
