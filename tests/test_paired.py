"""Paired case-study estimators (looped.studies.case_studies.paired) and `looped case-studies`
(looped.studies.case_studies.analysis) on synthetic arms from a known law."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from looped.fit import FitError, fit
from looped.law import Law
from looped.studies.case_studies import analysis as ps
from looped.studies.case_studies import paired as pp
from looped.studies.sweep.registry import analysis_file

THETA = Law(7.2, 0.108, 335.0, 0.414, 1.71, 0.64)   # A, alpha, B, beta, E, phi: close to our CPU fit
MAIN = {2.5e12: (2, 3, 4, 5), 5e12: (3, 4, 5, 6, 7), 1e13: (4, 5, 6, 7, 8), 2.5e13: (5, 6, 7, 8, 10)}
CASE = {2.5e12: (2, 3, 4, 5), 5e12: (3, 4, 5, 6, 7)}


def design(budgets=MAIN, rs=(1, 2, 4, 8), dmult=1.0, **extra):
    """A runs table shaped like our CPU design (loss to be filled by ps.synthetic)."""
    rows = []
    for c, widths in budgets.items():
        for r in rs:
            for s in widths:
                no, nr = (7772 * s * s, 0.0) if r == 1 else (1564 * s * s, 6464 * s * s / r)
                rows.append(dict(budget=c, r=r, s=float(s), n_once=no, n_rec=nr, loss=1.0,
                                 tokens=dmult * c / (20 * (no + r * nr) + 4e5), **extra))
    return pd.DataFrame(rows)


def arms(dphi=0.3, offset=0.0, resid=None, law=THETA):
    main = ps.synthetic(law, design(), resid=resid)
    var = ps.synthetic(law, design(CASE, (2, 4, 8), dmult=1.2), dphi, offset, resid)  # truncation: more tokens
    return main, var


def test_paired_recovers_dphi_without_noise():
    main, var = arms(0.3)
    est = pp.paired_estimate(main, var, restarts=30, bootstrap=0)
    assert est["dphi"].estimate == pytest.approx(0.3, abs=1e-4) and est["offset"] is None
    assert est["resid_sd"] < 1e-6


def test_shared_residuals_cancel_in_pairs_but_move_the_paper_protocol():
    rng = np.random.default_rng(3)
    resid = {k: rng.normal(0, 0.006) for k in pp.run_key(design())}
    observed, _ = arms(resid=resid)
    law = fit(observed, restarts=30)   # the simulation's model: the main fit plus its own residuals
    main, var = arms(0.3, resid=ps.law_residuals(law, observed), law=law)
    paired = pp.paired_estimate(main, var, restarts=30, bootstrap=0)["dphi"].estimate
    paper = pp.paper_protocol(main, var, restarts=30, bootstrap=0).estimate
    assert paired == pytest.approx(0.3, abs=1e-4)
    assert abs(paper - 0.3) > 0.02
    errs = []   # residuals the main fit does not reproduce: the pairs still err far less
    for seed in range(3):
        rng = np.random.default_rng(seed)
        main, var = arms(0.3, resid={k: rng.normal(0, 0.006) for k in pp.run_key(design())})
        errs.append((abs(pp.paired_estimate(main, var, restarts=30, bootstrap=0)["dphi"].estimate - 0.3),
                     abs(pp.paper_protocol(main, var, restarts=30, bootstrap=0).estimate - 0.3)))
    assert np.mean([e[0] for e in errs]) < 0.5 * np.mean([e[1] for e in errs])


def test_offset_model_recovers_an_r_independent_offset():
    main, var = arms(0.0, offset=0.01)
    est = pp.paired_estimate(main, var, offset=True, restarts=30, bootstrap=0)
    assert est["offset"].estimate == pytest.approx(0.01, abs=1e-4)
    assert est["dphi"].estimate == pytest.approx(0.0, abs=1e-3)


def test_bootstrap_interval_covers_truth_with_noise():
    main, var = arms(0.3)
    rng = np.random.default_rng(0)
    main["loss"] += rng.normal(0, 0.005, len(main))
    var["loss"] += rng.normal(0, 0.005, len(var))
    est = pp.paired_estimate(main, var, restarts=20, bootstrap=60, boot_restarts=2)["dphi"]
    assert est.lo < est.estimate < est.hi and est.se > 0 and est.lo < 0.3 < est.hi


def test_pairing_matches_on_seed_and_data_order():
    base = pd.concat([design(CASE, (2,), seed=42), design(CASE, (2,), seed=43, data_order=43)], ignore_index=True)
    base["loss"] = 4.0 + 0.1 * (base["seed"] == 43)
    var = design(CASE, (2,), seed=43, data_order=43).assign(loss=3.95)
    P = pp.pairs(base, var)
    assert len(P) == len(var) and set(P["seed"]) == {43} and np.allclose(P["diff"], 3.95 - 4.1)
    with pytest.raises(FitError, match="no variant run"):   # same seed, another data order: no pair
        pp.pairs(base, var.assign(data_order=44))
    ctl = design({2.5e12: (2,)}, (1,)).assign(loss=3.0)     # r = 1 control replaces the plain baseline
    P = pp.pairs(design(CASE, (1,)), design({2.5e12: (2,)}, (1,)).assign(loss=3.5), controls=ctl)
    assert P["loss_b"].tolist() == [3.0]


def test_bad_inputs_raise_one_clear_error():
    main, var = arms()
    with pytest.raises(FitError, match="no runs"):
        pp.pairs(main, var.iloc[0:0])
    with pytest.raises(FitError, match="no runs"):
        pp.pairs(None, var)
    with pytest.raises(FitError, match="no variant run"):
        pp.pairs(main[main["budget"] > 1e13], var)
    with pytest.raises(FitError, match="share"):
        pp.pairs(pd.concat([main, main]), var)
    with pytest.raises(FitError, match="missing column"):
        pp.pairs(main.drop(columns="s"), var)
    with pytest.raises(FitError, match="r > 1"):
        pp.paired_estimate(main, main[main["r"] == 1], bootstrap=0, restarts=10)


def test_arm_of_reads_the_record_fields():
    df = pd.DataFrame(dict(r=[1, 2, 2, 2, 2, 1, 1], injection=["none", "linear", "linear", "linear", "hyperconnect",
                                                                 "linear", "hyperconnect"],
                           bptt_k=[1, 2, 1, 1, 2, 1, 1], run_id=["a", "b", "c", "C1_r2_s2_steps9_k1", "d", "e", "f"]))
    assert pp.arm_of(df).tolist() == ["main", "main", "truncated", "truncated_matched", "hyper",
                                      "control_linear", "control_hyper"]


def test_simulation_and_cli_quick(tmp_path):
    main, var = arms(0.2)
    sim = ps.simulate_estimators(main, var, 0.2, n_reps=2, seed=1, quick=True)
    assert set(sim["estimator"]) == {"paired", "paired_offset", "paired_offset:offset", "paper"}
    assert sim["n_reps"].eq(2).all() and sim[["bias", "sd", "coverage"]].notna().all().all()
    assert abs(sim.set_index("estimator").loc["paired", "bias"]) < 0.05
    # two processes refit the same draws: the same numbers to the last digit
    twice = ps.simulate_estimators(main, var, 0.2, n_reps=2, seed=1, quick=True, jobs=2)
    pd.testing.assert_frame_equal(sim.attrs["raw"], twice.attrs["raw"])
    for folder, df in (("cpu-main", main), ("cpu-truncated", var)):
        (tmp_path / folder).mkdir()
        for i, row in df.iterrows():
            rec = dict(row.to_dict(), status="ok", run_id=f"x{i}", injection="none" if row.r == 1 else "linear",
                       bptt_k=int(row.r) // (2 if folder == "cpu-truncated" else 1))
            (tmp_path / folder / f"x{i}.json").write_text(json.dumps(rec))
    out = tmp_path / "case_studies.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ps.main(["--out", str(out), "--runs", str(tmp_path), "--family", "cpu", "--quick", "--reps", "1"]) == 0
    res = json.loads(out.read_text())
    assert set(res["studies"]) == {"truncated"} and res["settings"]["quick"]
    assert res["studies"]["truncated"]["paired"]["estimate"] == pytest.approx(0.2, abs=1e-3)
    assert {r["r"] for r in res["studies"]["truncated"]["gains_by_r"]} == {2.0, 4.0, 8.0}
    assert res["simulation"]["truncated"]["summary"][0]["n_reps"] == 1
    assert ps.main(["--out", str(out), "--runs", str(tmp_path / "none")]) == 2


def test_the_committed_results_rerun_in_small(tmp_path):
    """CI's reduced rerun of `looped case-studies` on the committed runs: every point estimate within 0.01
    of the committed full run's (its intervals come from far fewer resamples), and the chapters'
    reading of the committed file."""
    from looped.report import case_studies
    committed = ps.read_results()
    out = tmp_path / "case_studies.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        same = str(analysis_file("case_studies"))
        assert ps.main(["--out", str(out), "--quick", "--reps", "1", "--same-runs-as", same]) == 0
    quick = ps.read_results(out)
    assert set(quick["studies"]) == set(committed["studies"])
    assert quick["settings"]["run_ids"] == committed["settings"]["run_ids"]   # the sweeps' newer runs left out
    for name, res in committed["studies"].items():
        mine = quick["studies"][name]["estimates"].set_index("estimator").estimate
        assert np.allclose(mine, res["estimates"].set_index("estimator").estimate, atol=0.01), name
        assert len(case_studies.paired_estimates(res)) == 3
    models = quick["studies"]["hyper"]["models"].set_index("model").estimate
    assert np.allclose(models, committed["studies"]["hyper"]["models"].set_index("model").estimate, atol=0.01)
    check = committed["studies"]["truncated"]["token_check"]
    assert quick["studies"]["truncated"]["token_check"] == pytest.approx(check)   # no resampling: exact


def with_controls(dphi, offsets):
    """Main arm, a variant at r in {2, 4, 8} and its r = 1 controls (variant at r = 1), every width's
    log-loss shifted by its own offset (offsets: {(budget, s): shift}), the linear r = 1 controls
    equal to the main r = 1 runs."""
    main = ps.synthetic(THETA, design())
    var = ps.synthetic(THETA, design(CASE, (1, 2, 4, 8)), dphi)
    var["loss"] *= np.exp([offsets[(b, s)] for b, s in zip(var["budget"], var["s"])])
    ctl = main[main["budget"].isin(CASE) & (main["r"] == 1)].reset_index(drop=True)
    return main, var, ctl


def test_offset_per_width_recovers_dphi_where_one_offset_cannot():
    offsets = {(b, s): 0.004 * s - 0.03 for b, widths in CASE.items() for s in widths}   # grows with width
    main, var, ctl = with_controls(-0.2, offsets)
    width = pp.paired_estimate(main, var, ctl, "width", restarts=30, bootstrap=0)
    one = pp.paired_estimate(main, var, ctl, True, restarts=30, bootstrap=0)
    assert width["dphi"].estimate == pytest.approx(-0.2, abs=2e-3) and width["resid_sd"] < 1e-4
    assert abs(width["r1"]["mean"]) < 1e-4
    assert one["resid_sd"] > 10 * width["resid_sd"]


def test_the_r1_controls_reject_a_model_without_offset():
    main, var, ctl = with_controls(0.0, {(b, s): -0.02 for b, widths in CASE.items() for s in widths})
    rng = np.random.default_rng(5)
    var["loss"] += rng.normal(0, 0.002, len(var))
    none = pp.paired_estimate(main, var, ctl, False, restarts=30, bootstrap=0)
    const = pp.paired_estimate(main, var, ctl, True, restarts=30, bootstrap=0)
    assert none["r1"]["z"] < -5 and none["r1"]["n"] == len(ctl)       # the gain at r = 1 is not predicted
    assert abs(const["r1"]["z"]) < 3 and const["dphi"].estimate == pytest.approx(0.0, abs=0.05)


def test_width_bootstrap_resamples_whole_widths_within_their_budget():
    main, var, ctl = with_controls(0.1, {(b, s): 0.0 for b, widths in CASE.items() for s in widths})
    P = pp.pairs(main, var, ctl)
    groups = pp.width_groups(P)
    W = pp._pair_weights(P, np.random.default_rng(0), 50, groups)
    for g in range(groups.max() + 1):                       # all pairs of a width share its count
        assert (W[:, groups == g] == W[:, groups == g][:, :1]).all()
    for b in CASE:                                          # each budget keeps its number of widths
        first = [np.flatnonzero(groups == g)[0] for g in np.unique(groups[P["budget"] == b])]
        assert (W[:, first].sum(1) == len(first)).all()


def test_paired_difference_and_the_token_check_on_a_law_that_prices_tokens_right():
    main = ps.synthetic(THETA, design())
    more = ps.synthetic(THETA, design(CASE, (2, 4, 8), dmult=1.27), -0.05)
    fewer = ps.synthetic(THETA, design(CASE, (2, 4, 8)), -0.05)
    law = pp.main_law(main, restarts=30, bootstrap=20, boot_restarts=1)
    d = pp.paired_difference(main, more, fewer, law, bootstrap=20)
    assert d["a"].estimate == pytest.approx(-0.05, abs=1e-3) and d["difference"].estimate == pytest.approx(0, abs=1e-3)
    more, fewer = (ps.synthetic(THETA, design(CASE, (2, 4, 8), dmult=m)) for m in (1.27, 1.0))
    check = pp.token_term_check(more, fewer, THETA)                   # the law that made the runs
    assert check["n"] == len(fewer) and check["token_ratio"] == pytest.approx(1.27)
    assert check["observed"] < -0.01 and abs(check["difference"]) < 1e-9
    mispriced = more.assign(loss=more["loss"] * np.exp(0.002))        # extra tokens worth less than the law says
    assert pp.token_term_check(mispriced, fewer, THETA)["difference"] == pytest.approx(0.002, abs=1e-9)


def test_chapter_5_reads_the_laws_price_of_tokens_by_its_sign_and_t():
    from looped.report.case_studies import token_labels
    over = token_labels({"predicted": -0.0165, "observed": -0.0150, "t": 1.6})
    assert over["token_prices"] == "overprices" and over["token_resolved"] == "not resolved"
    assert over["token_overprice"] == pytest.approx(0.1)
    under = token_labels({"predicted": -0.012, "observed": -0.015, "t": -2.5})
    assert under == {"token_overprice": pytest.approx(0.2), "token_prices": "underprices", "token_resolved": "resolved"}


def test_chapter_6_reads_the_plain_anchor_by_its_controls_and_the_sign_by_both_anchors():
    from looped.report.case_studies import anchor_labels

    def models(plain_z, plain_hi):
        return pd.DataFrame({"model": ["width_linear", "width_plain", "constant_plain"],
                             "estimate": [-0.26, 0.02, 0.03], "lo": [-0.32, -0.11, -0.03],
                             "hi": [-0.18, plain_hi, 0.11], "r1_z": [-0.5, plain_z, 1.2]})
    assert anchor_labels(models(2.0, 0.12)) == {"hc_plain_controls": "accept",
                                                "hc_anchor_effect": "the anchor decides whether they lower it"}
    assert anchor_labels(models(4.0, -0.01)) == {"hc_plain_controls": "split on",
                                                 "hc_anchor_effect": "with either anchor they lower it"}
