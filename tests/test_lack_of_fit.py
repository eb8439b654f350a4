"""`looped misfit`: the ladder of models, phi's r = 1 anchor, the head counted on both sides; the
committed results rerun in small on the current records, and the chapters' claims fail on records
where they should not hold."""
import warnings

import numpy as np
import pandas as pd
import pytest

from looped.law import Law
from looped.report import misfit
from looped.solver import RunArrays, law_loss
from looped.studies.constancy import analysis as robustness
from looped.studies.constancy import misfit as L
from looped.studies.sweep.replicates import pure_error, replicate_tables
from looped.studies.sweep.study import Study

QUICK = dict(restarts=8, multi_restarts=4)


def _records():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main = Study("cpu-main").fit_table(main_design=False)
        seeds = replicate_tables()
        ctl = Study("cpu-controls").fit_table(main_design=False)
    return main, seeds, ctl


@pytest.fixture(scope="module")
def lawful():
    """The committed records with every loss replaced by the main fit's law plus pure-error noise:
    records on which the law fits, the looped runs carry no level, and φ lies below the paper's."""
    main, seeds, ctl = _records()
    law = dict(robustness.read_results()["summary"]["law"], phi=0.40)
    rng = np.random.default_rng(3)

    def redraw(df):
        clean = law_loss(Law.from_dict(law).theta, RunArrays.from_frame(df))
        return df.assign(loss=clean + rng.normal(0, 0.008, len(df)))
    return redraw(main), [redraw(s) for s in seeds], redraw(ctl)


def test_the_claims_fail_on_records_where_the_law_fits(lawful):
    main, seeds, ctl = lawful
    pe = pure_error(main, *seeds)
    lad, roles = L.ladder(main, pe, **QUICK)
    res = dict(ladder=lad, roles=roles, pure_error=pe,
               anchors=L.anchors(main, ctl, bootstrap=6, boot_restarts=1, multi_boot_restarts=1, **QUICK),
               conventions=L.conventions(main, restarts=8, bootstrap=6, boot_restarts=1))
    assert lad.set_index("model").loc["law", "F"] < 3
    said = misfit.misfit_claims(res)
    assert not said["no model of the ladder fits to within the pure error"]
    assert not said["separate laws per r still miss by more than twice the pure error"]
    assert not said["with every cell's level free, the misfit is still more than 1.5 times the pure error"]
    anchor = misfit.anchor_claims(res)
    assert not (anchor["the looped runs' free level is positive, its interval above zero"]
                and anchor["it moves φ up by more than the half-width of the main interval"])
    assert not misfit.convention_claims(res)["like for like, ours stays above the paper's minima"]


def test_the_committed_results_rerun_in_small(tmp_path):
    """CI's reduced rerun of `looped misfit` on the current records: the ladder's F and every φ near
    the committed full run's, and the committed results support the chapters' claims."""
    committed = L.read_results()
    out = tmp_path / "quick.json"
    assert L.main(["--quick", "--out", str(out)]) == 0
    quick = L.read_results(out)
    assert list(quick["ladder"].model) == list(L.LADDER)
    assert np.allclose(quick["ladder"].F, committed["ladder"].F, rtol=0.05)
    assert np.allclose(quick["anchors"].phi, committed["anchors"].phi, atol=0.02)
    assert np.allclose(quick["conventions"].phi, committed["conventions"].phi, atol=0.02)
    for claims in (misfit.misfit_claims, misfit.anchor_claims, misfit.convention_claims):
        assert all(claims(committed).values()), claims.__name__


def test_a_free_level_for_the_looped_runs_is_recovered(lawful):
    """Records whose looped runs carry a known log-loss level (an injection's cost): fit_multi's
    free level finds it and phi comes back; the plain law, without the level, moves phi."""
    from looped.studies.constancy.variants import fit_multi
    main = lawful[0]
    looped = (main["r"] > 1).to_numpy(float)
    shifted = main.assign(loss=main["loss"] * np.exp(0.02 * looped))
    m = fit_multi(shifted, np.ones((len(main), 1)), ["phi"], levels={"looped": looped}, restarts=8)
    assert m.params["looped"] == pytest.approx(0.02, abs=0.004) and m.params["phi"] == pytest.approx(0.40, abs=0.05)
    from looped.fit import fit
    assert fit(shifted, restarts=8).phi < m.params["phi"] - 0.05


def test_the_injection_guard_reads_the_controls():
    """Chapter 4's sentence on what the linear r = 1 controls measure holds on the records and fails
    when the controls are made better than the plain r = 1 runs, the more so the wider."""
    main, _, ctl = _records()
    cost = L.injection_cost(main, ctl)
    assert len(cost) == 9 and all(misfit.injection_claims(cost).values())
    plain = main[main["r"] == 1].set_index(["budget", "s"])["loss"]
    better = ctl.assign(loss=[plain.get((b, s), v) - 0.002 * s
                              for b, s, v in zip(ctl["budget"], ctl["s"], ctl["loss"])])
    assert not any(misfit.injection_claims(L.injection_cost(main, better)).values())
    none = L.injection_cost(main, ctl.iloc[:0])   # a family whose controls have not run yet
    assert len(none) == 0 and not any(misfit.injection_claims(none).values())


def test_the_additive_anchor_contrast_finds_a_known_difference_in_differences():
    """cpu3-additive's design (additive injection at r = 1 and 8 on nine (budget, s) points) against
    the main r = 8 runs and the linear r = 1 controls: additive minus linear is +0.01 nats at r = 1
    and +0.03 at r = 8, so the difference in differences is +0.02; points missing a run are left out."""
    from looped.studies.paper import design_of
    from looped.studies.sweep.registry import load_study
    add = design_of(load_study("cpu3-additive"))
    points = add[["budget", "s"]].drop_duplicates()
    rng = np.random.default_rng(5)
    base = {k: 3.0 + 0.1 * rng.random() for k in points.itertuples(index=False, name=None)}
    def runs(t, r, injection, shift):
        t = t.assign(r=r, injection=injection, bptt_k=r, n_once=1e5, n_rec=1e5 * r, tokens=1e7)
        return t.assign(loss=[base[(b, s)] + shift + rng.normal(0, 5e-4) for b, s in zip(t.budget, t.s)])
    lin1, lin8 = runs(points, 1, "linear", 0.0), runs(points, 8, "linear", -0.2)
    add1, add8 = runs(points, 1, "additive", 0.01), runs(points, 8, "additive", -0.2 + 0.03)
    out = L.additive_anchor(lin8.iloc[1:], lin1, pd.concat([add1, add8]))   # one point lacks its r = 8 run
    assert out["n"] == len(points) - 1 == 8
    assert out["at_r1"]["mean"] == pytest.approx(0.01, abs=1e-3)
    assert out["at_r8"]["mean"] == pytest.approx(0.03, abs=1e-3)
    assert out["difference"]["mean"] == pytest.approx(0.02, abs=1e-3) and out["difference"]["t"] > 20
    assert L.additive_anchor(lin8, lin1, None) == {"n": 0}


def test_the_anchor_table_shows_each_fit_once_when_the_controls_cover_every_budget():
    """With linear controls at two of four budgets (corpus v2) the controls' budgets get their own
    refits; at every budget (v3) those refits are the main ones, so the table keeps the main rows and
    names the linear anchor's fit by all main runs."""
    rows = [("main", "plain", 76), ("main", "looped_level", 76), ("controls", "plain", 36),
            ("controls", "looped_level", 36), ("controls", "linear", 36)]
    part = pd.DataFrame(rows, columns=["design", "anchor", "n_runs"]).assign(
        phi=0.6, phi_lo=0.5, phi_hi=0.7, level=np.nan, level_lo=np.nan, level_hi=np.nan)
    assert len(misfit.anchor_frame({"anchors": part})) == 5
    every = part.assign(n_runs=76)
    shown = misfit.anchor_frame({"anchors": every})
    assert list(shown.fit) == [misfit.ANCHORS[("main", "plain")], misfit.ANCHORS[("main", "looped_level")],
                               misfit.ANCHORS[("every", "linear")]]
    assert list(shown.index) == [0, 1, 2]   # a fresh index: the table shows none


def test_controls_at_every_budget_reuse_the_main_fits(lawful):
    """When the linear r = 1 controls cover every budget (v3's design), the 'controls' design is the
    main runs again: its plain and free-level rows are the main ones, not refitted; 'linear' is fitted."""
    main, _, ctl = lawful
    everywhere = pd.concat([ctl.assign(budget=b) for b in sorted(main["budget"].unique())], ignore_index=True)
    a = L.anchors(main, everywhere, bootstrap=4, boot_restarts=1, multi_boot_restarts=1, **QUICK)
    rows = a.set_index(["design", "anchor"])
    for anchor in ("plain", "looped_level"):
        assert rows.loc[("controls", anchor)].equals(rows.loc[("main", anchor)])
    linear = (everywhere["r"] == 1) & (everywhere["injection"].astype(str) == "linear")
    assert rows.loc[("controls", "linear"), "n_runs"] == (main["r"] > 1).sum() + linear.sum()
