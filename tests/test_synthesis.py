"""The conclusion's synthesis (looped.report.synthesis): every φ and Δφ of the book in one frame
and one figure, from the committed analyses and small stand-ins for the fits."""
from types import SimpleNamespace

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from looped.fit import FitResult  # noqa: E402
from looped.law import Law  # noqa: E402
from looped.report import case_studies, synthesis  # noqa: E402
from looped.studies.constancy import analysis as robustness  # noqa: E402
from looped.studies.constancy import misfit as lack_of_fit
from looped.studies.paper import PAPER_PHI_CI  # noqa: E402


def _fit(phi, lo, hi):
    return FitResult(Law(A=28.0, alpha=0.2, B=900.0, beta=0.37, E=1.57, phi=phi), r2=0.99, huber=0.0,
                     n_runs=40, restarts=1, ci={"phi": (lo, hi)})


FITS = {"joint fit": _fit(0.64, 0.55, 0.80), "lower budgets": _fit(0.74, 0.49, 0.87),
        "upper budgets": _fit(0.58, 0.45, 0.78), "case-study baseline": _fit(0.74, 0.49, 0.87),
        "truncated BPTT": _fit(0.75, 0.53, 0.86), "hyperconnections": None}


def _paired(hyper_z=(0.9, 3.5, -9.1)):
    est = lambda v: pd.DataFrame({"estimator": ["paper", "paired"], "estimate": [v, v],  # noqa: E731
                                  "lo": [v - 0.03, v - 0.02], "hi": [v + 0.03, v + 0.02]})
    models = pd.DataFrame({"model": ["width_linear", "width_plain", "none_linear"], "estimate": [-0.21, -0.11, 0.24],
                           "lo": [-0.28, -0.18, 0.16], "hi": [-0.16, -0.06, 0.30], "r1_z": list(hyper_z)})
    return {"studies": {"truncated": {"estimates": est(-0.054)}, "truncated_matched": {"estimates": est(-0.007)},
                        "hyper": {"models": models}}}


def _case(dphi, lo, hi):
    return SimpleNamespace(ok=True, delta_phi=dphi, delta_phi_ci=(lo, hi))


@pytest.fixture(scope="module")
def phis():
    return synthesis.phi_rows(FITS, robustness.read_results(), lack_of_fit.read_results())


@pytest.fixture(scope="module")
def dphis():
    return synthesis.dphi_rows(_case(0.008, -0.11, 0.10), None, _paired(), case_studies.paper_fits())


def test_every_phi_is_read_not_retyped(phis):
    ours = phis[phis.source == "ours"].set_index("label")
    assert ours.loc["joint fit, the paper's counting", "phi"] == 0.64           # from the fits given
    assert phis.verdict.sum() == 1 and phis[phis.verdict].label.iloc[0].startswith("joint fit")
    refits = robustness.read_results()["robustness"].set_index("variant")
    assert ours.loc["φ₂", "phi"] == refits.loc["per_r_phi_2", "phi"]              # chapter 4's committed refit
    assert len(phis[phis.group.str.startswith("one budget")]) == len(robustness.read_results()["per_budget"])
    paper = phis[(phis.source == "paper") & (phis.label.str.startswith("joint"))].iloc[0]
    assert (paper.lo, paper.hi) == tuple(PAPER_PHI_CI)
    assert "hyperconnections" not in set(ours.index)                               # a fit not made: no point of ours
    assert (phis.lo.dropna() <= phis.phi[phis.lo.notna()]).all()


def test_one_fit_under_two_names_is_drawn_once_or_named(phis):
    ours = phis[phis.source == "ours"]
    assert "case-study baseline (= lower budgets)" in set(ours.label)   # kept: the paper has its own baseline
    assert not ours.duplicated(["group", "label"]).any()


def test_changes_of_phi_mark_the_verdicts_and_the_rejected_models(dphis):
    paper = case_studies.paper_fits()
    trunc = dphis[dphis.group.str.startswith("truncated")]
    p = trunc[trunc.source == "paper"].phi.iloc[0]
    assert p == pytest.approx(paper.loc["truncated_bptt", "phi"] - paper.loc["baseline_four_lower_budgets", "phi"])
    assert list(dphis[dphis.verdict].label) == ["twins, matched tokens", "twins, offset per width, linear anchor"]
    assert {"twins, offset per width, plain anchor (rejected)", "twins, no offset (rejected)"} <= set(dphis.label)
    hyper = dphis[dphis.group.str.startswith("hyper")]
    assert set(hyper.source) == {"paper", "ours"} and len(hyper[hyper.label.str.startswith("each arm")]) == 1
    rejected_verdict = synthesis.dphi_rows(None, None, _paired((4.0, 3.5, -9.1)), paper)
    assert not rejected_verdict[rejected_verdict.group.str.startswith("hyper")].verdict.any()


def test_summary_counts_distinct_estimates(phis, dphis):
    s = synthesis.summary(phis, dphis)
    distinct = phis[(phis.source == "ours") & ~phis.group.str.startswith("one φ per r")]
    assert s["n_ours"] == len(distinct.drop_duplicates(["phi", "lo", "hi"])) < len(distinct)
    assert s["n_above"] + s["n_below"] <= s["n_ours"] and s["n_entirely_above"] <= s["n_above"]
    assert s["trunc: twins, same budget: contains the paper's"] is True      # [−0.074, −0.034] holds −0.073
    assert s["trunc: twins, matched tokens: contains the paper's"] is False
    assert s["hc: twins, no offset (rejected): contains the paper's"] is True        # [0.16, 0.30] holds +0.193


def test_the_figure_has_a_row_per_estimate_and_cuts_long_intervals(phis, dphis):
    top, bottom = synthesis.plot_every_phi(phis, dphis)
    for ax, rows in ((top, phis), (bottom, dphis)):    # a row per estimate, a header per group
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert len(labels) == rows.groupby(["group", "label"]).ngroups + rows.group.nunique()
        assert [t for t in labels if t in set(rows.group)] == list(dict.fromkeys(rows.group))
    bold = [t.get_text() for t in bottom.get_yticklabels() if t.get_fontweight() == "bold"]
    assert bold == list(dphis[dphis.verdict].label)
    cut = [t.get_text() for t in top.texts if t.get_text().startswith("to ")]
    assert cut and all("-" not in t for t in cut) and any("\u2212" in t for t in cut)   # a true minus
    left, right = top.get_xlim()
    assert left < 0 < 1 < right
    assert np.isclose(bottom.get_xlim()[0] < 0 < bottom.get_xlim()[1], True)
    values = synthesis.figure_values(phis, dphis)
    assert values.name.is_unique and len(values) == len(phis) + len(dphis)
    plt.close("all")


def test_verdicts_read_each_case_study_by_its_chapters_rule_and_leave_a_missing_one_empty():
    """Appendix C's two-corpus table: truncation's twins at matched tokens, hyperconnections' per-width
    linear-anchored model unless its r = 1 pairs reject it, the paper's change beside; a family whose
    case studies have not run gives NaN rows, not a KeyError."""
    paper = case_studies.paper_fits()
    v = synthesis.verdicts(_paired(), paper).set_index("case_study")
    assert v.dphi.tolist() == [-0.007, -0.21] and v.lo.tolist() == [-0.027, -0.28]
    base = paper.loc["baseline_four_lower_budgets", "phi"]
    assert v.paper_dphi["hyperconnections"] == pytest.approx(paper.loc["hyperconnections_2lanes", "phi"] - base)
    rejected = synthesis.verdicts(_paired((4.0, 3.5, -9.1)), paper).set_index("case_study")
    assert np.isnan(rejected.dphi["hyperconnections"]) and rejected.dphi["truncated backprop"] == -0.007
    assert rejected.status.tolist() == ["read", "rejected"]
    empty = synthesis.verdicts({"studies": {}}, paper)
    assert empty.dphi.isna().all() and empty.paper_dphi.notna().all()


def test_a_verdict_carries_over_only_when_both_corpora_read_it_alike():
    """Appendix C's reading of the case studies on two corpora: where each interval lies against zero
    and against the paper's change; a corpus without the analysis is 'not analysed', not a verdict."""
    paper = case_studies.paper_fits()
    v2 = synthesis.verdicts(_paired(), paper).assign(corpus="v2")
    v3 = v2.assign(corpus="v3", dphi=[-0.006, 0.1], lo=[-0.011, -0.1], hi=[-0.002, 0.3])   # overlapping v2
    cases = pd.concat([v2, v3]).set_index(["corpus", "case_study"])
    out = synthesis.carry_over(cases)
    assert out.loc["hyperconnections", "v2"].startswith("below zero")
    assert out.loc["hyperconnections", "v3"] == "holds zero, holds the paper's"
    assert out.loc["truncated backprop", "v3"] == "below zero, excludes the paper's"   # v2's holds zero
    assert out.verdict.tolist() == ["carries over", "does not carry over"]
    apart = pd.concat([v2, v3.assign(lo=[0.02, -0.1], hi=[0.04, 0.3])]).set_index(["corpus", "case_study"])
    assert synthesis.carry_over(apart).verdict.tolist() == ["does not carry over"] * 2   # disjoint intervals
    missing = pd.concat([v2, synthesis.verdicts({"studies": {}}, paper).assign(corpus="v3")])
    out = synthesis.carry_over(missing.set_index(["corpus", "case_study"]))
    assert (out.v3 == "not analysed").all() and (out.verdict == "not analysed").all()
    rejected = synthesis.verdicts(_paired((4.0, 3.5, -9.1)), paper).assign(corpus="v3")
    out = synthesis.carry_over(pd.concat([v2, rejected]).set_index(["corpus", "case_study"]))
    assert out.loc["hyperconnections"].tolist() == ["below zero, excludes the paper's", "rejected",
                                                    "does not carry over"]
