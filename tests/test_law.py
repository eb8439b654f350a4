"""What a fitted law gives: predictions, effective sizes (the paper's worked example),
compute-optimal frontiers, and the case-study refits (Table 3)."""
import dataclasses

import numpy as np
import pandas as pd
import pytest

from looped import fit as F
from looped import law
from looped.studies import paper
from looped.studies.case_studies import protocol as case_studies


@pytest.fixture(scope="module")
def grid():
    return paper.paper_grid()


def test_paper_law_is_the_published_joint_fit():
    row = paper.paper_fits().loc["phi_free"]
    assert isinstance(paper.PAPER_LAW, law.Law)
    assert paper.PAPER_LAW.to_dict() == {k: float(row[k]) for k in F.LAW_PARAMS}
    assert paper.PAPER_PHI == 0.459 and paper.PAPER_PHI_CI == (0.41, 0.53)
    assert tuple(paper.PAPER_BUDGETS) == tuple(sorted(paper.paper_grid()["budget"].unique()))


def test_predict_and_residuals(grid):
    df = paper.synthetic_runs(noise=0.0, grid=grid)
    np.testing.assert_allclose(law.residuals(paper.PAPER_LAW, df), 0, atol=1e-12)


def test_law_value_type():
    """A Law predicts E + A N_eff^-alpha + B D^-beta; a FitResult carries its Law; a mapping
    converts (extra keys ignored, phi absent: Chinchilla); the functions take a Law or a fit."""
    p = paper.PAPER_LAW
    n_once, n_rec, r, tokens = np.array([3e8, 1e9]), np.array([2e8, 0.0]), np.array([4, 1]), np.array([1e10, 2e10])
    n_eff = n_once + r ** 0.459 * n_rec
    np.testing.assert_array_equal(p.effective_n(n_once, n_rec, r), n_eff)
    np.testing.assert_allclose(p.predict(n_once, n_rec, r, tokens),     # via log space: to rounding
                               1.56773 + 28.027 * n_eff ** -0.19924 + 915.82 * tokens ** -0.36863, rtol=1e-14)
    chin = p.replace(phi=None)
    assert chin.phi is None and chin.A == p.A and p.phi == 0.459          # replace makes a new Law
    np.testing.assert_array_equal(chin.effective_n(n_once, n_rec, r), n_once + n_rec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.phi = 0.5
    assert law.Law.from_dict({**p.to_dict(), "r2": 0.99}) == p
    assert law.Law.from_dict({k: v for k, v in p.to_dict().items() if k != "phi"}) == chin
    with pytest.raises(F.FitError, match="no value for E"):
        law.Law.from_dict({"A": 1, "alpha": 0.3, "B": 1, "beta": 0.3})
    res = F.FitResult(p, r2=1, huber=0, n_runs=116, restarts=0)
    assert res.law == p and law.as_law(res) == p and law.as_law(p) is p
    np.testing.assert_array_equal(law.predict(res, n_once, n_rec, r, tokens), p.predict(n_once, n_rec, r, tokens))
    with pytest.raises(TypeError, match="Law.from_dict"):
        law.predict(p.to_dict(), n_once, n_rec, r, tokens)


def test_residual_cells_locate_a_mispriced_r(grid):
    """Runs of one r made worse by 0.03 nats show up as that column of the budget x r table,
    and only there."""
    df = paper.synthetic_runs(noise=0.0, grid=grid)
    df.loc[df.r == 2, "loss"] += 0.03
    cells = law.residual_cells(paper.PAPER_LAW, df)
    assert list(cells.columns) == sorted(df.r.unique()) and list(cells.index) == sorted(df.budget.unique())
    np.testing.assert_allclose(cells[2], 0.03, atol=1e-12)
    np.testing.assert_allclose(cells.drop(columns=2).to_numpy(), 0, atol=1e-12)


def test_worked_example_effective_sizes():
    """Paper appendix F.4: a ~1B plain model (s=32, d=2048) and its r=4 sibling."""
    e = law.effective_sizes("paper", r=4, s=32, phi=0.46)
    assert e["plain_unique"] == pytest.approx(1.0e9, rel=0.01)
    assert e["block_unique_ratio"] == pytest.approx(0.40)
    assert round(e["block_loss_equivalent_ratio"], 2) == 0.58
    assert e["unique"] == pytest.approx(410e6, rel=0.01)          # ~410M with the injection
    assert e["loss_equivalent_ratio"] == pytest.approx(0.58, abs=0.015)
    assert e["compute_equivalent_ratio"] == pytest.approx(1.0, abs=0.04)   # the compute of the 1B


def test_compute_optimal(grid):
    co = law.compute_optimal(paper.PAPER_LAW, r=(1, 4), budgets=[1e18, 1e19])
    assert len(co) == 4 and not co["at_edge"].any()
    r1, r4 = co[co.r == 1].set_index("budget"), co[co.r == 4].set_index("budget")
    assert (r4["n"] < r1["n"]).all() and (r4["loss"] > r1["loss"]).all()
    assert (r1.loc[1e19, "n"] > r1.loc[1e18, "n"])


def test_case_study_refit_against_baseline(tmp_path):
    """Case-study protocol: baseline = main runs at the case study's budgets; the refit uses the
    main r = 1 runs plus the case study's r > 1 runs.  A lower phi in the case-study law is
    recovered, the two bootstraps are paired, and thin studies are skipped with a note."""
    main = paper.synthetic_runs(seed=12)
    trunc = paper.synthetic_runs({"phi": 0.30}, seed=13, grid=paper.paper_grid("truncated_bptt"))
    cs = case_studies.case_study(main, trunc, name="truncated", restarts=80, seed=0, bootstrap=12)
    assert cs.budgets == sorted(trunc["budget"].unique()) and len(cs.budgets) == 4
    assert len(cs.baseline_runs) == (main["budget"] <= 4.64e18 * 1.0001).sum()
    n_plain = ((main["r"] == 1) & (main["budget"] <= 4.64e18 * 1.0001)).sum()
    assert len(cs.variant_runs) == n_plain + len(trunc) and cs.study_runs == len(trunc)
    assert cs.ok and cs.note == ""
    assert abs(cs.baseline.phi - 0.459) < 0.06 and abs(cs.variant.phi - 0.30) < 0.06
    assert cs.delta_phi < -0.1 and cs.paired
    lo, hi = cs.delta_phi_ci
    assert lo <= cs.delta_phi <= hi and hi < 0
    t = cs.table()
    assert list(t["fit"]) == ["baseline", "truncated"] and (t["r2"] > 0.99).all()
    # only r = 4, 8 of the case study (the paper's "without r = 2" variant)
    # is set against a baseline without r = 2 (refitted, not reused), so the two stay paired
    sub = case_studies.case_study(main, trunc, study_r=(4, 8), restarts=40, seed=0, bootstrap=12, reuse=cs)
    assert set(sub.variant_runs["r"]) == set(sub.baseline_runs["r"]) == {1, 4, 8}
    assert sub.baseline is not cs.baseline and sub.ok and sub.paired and sub.delta_phi_ci is not None
    # a sweep that has barely started: the refit is skipped, the baseline still fitted
    two = sorted(trunc["budget"].unique())[:2]
    few = case_studies.case_study(main, trunc[trunc["budget"].isin(two)].groupby("budget").head(2), restarts=20)
    assert few.variant is None and few.baseline is not None and "skipped" in few.note
    assert few.budgets == two and few.delta_phi is None and few.table()["phi"].isna().iloc[1]
    # a baseline offered for reuse that covers other budgets is refitted, not reused
    part = case_studies.case_study(main, trunc[trunc["budget"].isin(two)], restarts=20, reuse=cs)
    assert part.baseline is not cs.baseline and part.baseline.n_runs == len(part.baseline_runs)
    # one budget: N and D are tied, neither fit is attempted
    one = case_studies.case_study(main, trunc.head(9), restarts=20)
    assert one.budgets == [4.64e17] and one.baseline is None and one.variant is None
    assert "1 budget(s)" in one.note
    # no records at all (missing or empty folder): baseline on every main budget
    (tmp_path / "empty").mkdir()
    for missing in (tmp_path / "nothing", tmp_path / "empty", None):
        none = case_studies.case_study(main, missing, restarts=20)
        assert none.variant is None and none.study_runs == 0 and len(none.budgets) == 6


def test_width_polynomials_are_the_accounting():
    from looped import accounting as acc
    for r, inj, k in ((1, None, None), (4, None, None), (8, None, 4), (4, "hyperconnect", None)):
        P = law.width_polynomials("paper", r, inj, k)
        for d in (128.0, 777.7, 2048.0):
            cfg = law.config_at_width("paper", r, d, inj, k)
            np.testing.assert_allclose(P @ [1.0, d, d * d],
                                       [acc.n_once(cfg), acc.n_rec(cfg), acc.flops_per_token(cfg)], rtol=1e-12)


def test_compute_optimal_frontier():
    res = F.FitResult(paper.PAPER_LAW, r2=1, huber=0, n_runs=116, restarts=0)
    fr = law.compute_optimal_frontier(paper.PAPER_LAW, r=(1, 4), budgets=[1e18, 1e19])
    assert len(fr) == 4 and not fr["at_edge"].any()
    # the FitResult and its Law give the same frontier; its losses are the law's
    pd.testing.assert_frame_equal(fr, law.compute_optimal_frontier(res, r=(1, 4), budgets=[1e18, 1e19]))
    np.testing.assert_allclose(law.predict(res, fr.n_once, fr.n_rec, fr.r, fr.tokens_star), fr.loss_star, rtol=1e-12)
    np.testing.assert_allclose(fr.tokens_star * fr.flops_per_token, fr.budget, rtol=1e-12)
    # no preset width does better, and the discrete-width parabola lands close by
    co = law.compute_optimal(res, r=(1, 4), budgets=[1e18, 1e19])
    m = co.merge(fr, on=["r", "budget"], suffixes=("_grid", "_cont"))
    assert (m["loss_star_cont"] <= m["loss"] + 1e-12).all()
    np.testing.assert_allclose(m["n_star_cont"], m["n_star_grid"], rtol=0.02)
    # a minimum: nudging the width either way costs loss
    for row in fr.itertuples():
        for f in (0.98, 1.02):
            cfg = law.config_at_width("paper", row.r, row.d_model * f)
            from looped import accounting as acc
            L = law.predict(res, acc.n_once(cfg), acc.n_rec(cfg), row.r, row.budget / acc.flops_per_token(cfg))
            assert L > row.loss_star
    # more recurrences: fewer unique params, more tokens per param, higher loss
    r1, r4 = fr[fr.r == 1].set_index("budget"), fr[fr.r == 4].set_index("budget")
    assert (r4.n_star < r1.n_star).all() and (r4.tokens_per_param > r1.tokens_per_param).all()
    assert (r4.loss_star > r1.loss_star).all()
    # phi = None (Chinchilla: unique params) is phi = 0
    a = law.compute_optimal_frontier(paper.PAPER_LAW.replace(phi=None), r=4, budgets=[1e19])
    b = law.compute_optimal_frontier(paper.PAPER_LAW.replace(phi=0.0), r=4, budgets=[1e19])
    np.testing.assert_allclose(a.loss_star, b.loss_star, rtol=1e-12)


def test_compute_optimal_for_loss():
    eq = law.compute_optimal_for_loss(paper.PAPER_LAW, 2.3, r=(1, 4))
    np.testing.assert_allclose(eq["loss_star"], 2.3, atol=1e-8)
    r1, r4 = eq.set_index("r").loc[1], eq.set_index("r").loc[4]
    assert r4.budget > r1.budget and r4.n_star < r1.n_star and r4.d_model > r1.d_model
    with pytest.raises(F.FitError, match="irreducible"):
        law.compute_optimal_for_loss(paper.PAPER_LAW, 1.5)
    with pytest.raises(F.FitError, match="not reached"):
        law.compute_optimal_for_loss(paper.PAPER_LAW, 1.6, budget_bounds=(1e18, 1e20))
