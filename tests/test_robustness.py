"""Robustness studies of phi: recovery on synthetic runs from a known law, the per-r / per-budget /
trend / kappa fitter, the lack-of-fit test, the accounting variants, the paper's tables, bad input."""
import json

import numpy as np
import pandas as pd
import pytest

from looped import accounting as acc
from looped.config import REPO, model_config
from looped.fit import FitError, fit
from looped.io import json_ready, json_table
from looped.law import Law
from looped.solver import RunArrays, law_loss, objective
from looped.studies.constancy import analysis as R
from looped.studies.constancy import drift as D
from looped.studies.constancy import variants as M

LAW = {"A": 8.0, "alpha": 0.15, "B": 300.0, "beta": 0.4, "E": 1.8, "phi": 0.5}
BUDGETS = (2.5e12, 5e12, 1e13, 2.5e13)


def design(budgets=BUDGETS, sizes=(4, 5, 6, 7, 8)) -> pd.DataFrame:
    """A CPU-like design (preset 'prose'): every budget x r in {1, 2, 4, 8} x width s."""
    rows = []
    for b in budgets:
        for r in (1, 2, 4, 8):
            for s in sizes:
                a = acc.summary(model_config("prose", r=r, s=s), b)
                rows.append({k: a[k] for k in ("budget", "r", "s", "n_once", "n_rec", "tokens", "d_model",
                                               "injection", "bptt_k")})
    return pd.DataFrame(rows)


def runs(law=LAW, noise=0.0, seed=0, kappa=1.0, **kw) -> pd.DataFrame:
    df = design(**kw)
    d = RunArrays.from_frame(df.assign(n_rec=kappa * df["n_rec"], loss=1.0))
    rng = np.random.default_rng(seed)
    return df.assign(loss=law_loss(Law.from_dict(law).theta, d) + rng.normal(0, noise, len(df)))


@pytest.fixture(scope="module")
def exact():
    return runs(noise=1e-4)


def test_per_budget_phis_and_trend_recover_a_constant_phi(exact):
    pb = D.per_budget_phi(exact, restarts=8, bootstrap=0)
    assert list(pb["budget"]) == list(BUDGETS)
    np.testing.assert_allclose(pb["phi"], 0.5, atol=0.02)
    tr = D.phi_trend(exact, restarts=8, bootstrap=4, boot_restarts=1)
    assert abs(tr["phi1"]) < 0.02 and abs(tr["phi_mid"] - 0.5) < 0.01
    assert tr["n_cells"] == 16 and tr["phi1_jack_se"] < 0.01 and abs(tr["phi1"]) < 0.01   # cells, not budgets
    assert tr["phi0"] == pytest.approx(tr["phi_mid"] - tr["phi1"] * tr["log10_c_centre"])


def test_per_r_fit_recovers_equal_phis_and_nests_looped_fit(exact):
    X, _ = M.onehot(exact["r"], [2, 4, 8])
    m = M.fit_multi(exact, X, ["phi_2", "phi_4", "phi_8"], restarts=8, bootstrap=6, boot_restarts=1)
    for lab in ("phi_2", "phi_4", "phi_8"):
        assert abs(m.params[lab] - 0.5) < 0.03
        assert m.n_valid[lab] <= 6 and lab in m.ci
    one = M.fit_multi(exact, np.ones((len(exact), 1)), ["phi"], restarts=8)   # the paper's law: same optimum
    ref = fit(exact, restarts=100)
    assert one.huber == pytest.approx(ref.huber, rel=1e-6) and one.params["phi"] == pytest.approx(ref.phi, abs=1e-5)
    assert m.huber <= one.huber * (1 + 1e-9)                                  # a freer form fits no worse


def test_kappa_form_recovers_the_multiplier():
    df = runs(noise=1e-4, kappa=0.7)
    m = M.fit_multi(df, np.ones((len(df), 1)), ["phi"], kappa=True, restarts=16)
    assert m.params["kappa"] == pytest.approx(0.7, rel=0.05) and m.params["phi"] == pytest.approx(0.5, abs=0.03)


def test_objective_gradient_matches_finite_differences(exact):
    X = np.column_stack([np.ones(len(exact)), np.log10(exact["budget"]) - 12.8])
    d = RunArrays.from_frame(exact)
    th = np.r_[Law.from_dict(LAW).theta[:5], 0.5, 0.05, np.log(0.8)] + 0.01
    d = d.design(X, kappa=True, offsets=(exact["r"].to_numpy() == 1).astype(float))   # and one offset column
    th = np.r_[th, 0.002]
    _, g, H = objective(th[None], d, order=2, delta=0.05)     # wide delta: the Hessian's quadratic part in play
    for i in range(len(th)):
        e = np.zeros_like(th)
        e[i] = 1e-6
        fp, gp = objective((th + e)[None], d, order=1, delta=0.05)
        fm, gm = objective((th - e)[None], d, order=1, delta=0.05)
        assert (fp[0] - fm[0]) / 2e-6 == pytest.approx(g[0, i], rel=1e-4, abs=1e-10)
        np.testing.assert_allclose((gp[0] - gm[0]) / 2e-6, H[0, i], rtol=1e-3, atol=1e-7)


def replicates(sd, seed, configs=8, n=3):
    base = runs().iloc[::10].head(configs)
    rng = np.random.default_rng(seed)
    return pd.concat([base.assign(seed=43 + k, loss=base["loss"] + rng.normal(0, sd, len(base))) for k in range(n)],
                     ignore_index=True)


def test_lack_of_fit_not_significant_on_white_noise_and_significant_on_a_misfit():
    sd = 0.01
    white = runs(noise=sd, seed=1)
    g = R.goodness_of_fit(white, replicates(sd, seed=2), restarts=50)["summary"]
    assert g["df_pe"] == 24 and g["df1"] == len(white) - 6    # each config: the fitted run and 3 replicates
    assert g["p_value"] > 0.05 and 0.6 < g["rmse_over_seed_sd"] < 1.4
    bumped = white.assign(loss=white["loss"] + np.select([white["r"] == 2, white["r"] == 4], [0.06, -0.06], 0.0))
    out = R.goodness_of_fit(bumped, replicates(sd, seed=2), restarts=50)
    assert out["summary"]["p_value"] < 1e-3
    by_r = out["by_r"].set_index("r")["mean"]
    assert by_r[2.0] > by_r[4.0] + 0.05
    assert set(out["by_role"]["role"]) == {"narrowest", "interior", "widest"}
    assert list(out["lobo"]["budget"]) == list(BUDGETS) and out["by_position"]["n"].sum() == len(white)


def test_replicate_sd_counts_a_record_once_and_pools_groups():
    rep = replicates(0.01, seed=3, configs=2, n=2)
    a = R.replicate_sd(rep, rep)                       # the same records twice: still two per group
    assert a["df_pe"] == 2 and a["n_groups"] == 2
    v = rep.groupby(["r", "s"])["loss"].var(ddof=1)
    assert a["seed_sd"] == pytest.approx(np.sqrt(v.mean()))


def test_head_variant_shifts_n_once_by_exactly_v_times_d(exact):
    head = R.count_embeddings(exact)
    np.testing.assert_array_equal(head["n_once"] - exact["n_once"], 2048 * exact["d_model"])
    both = R.count_embeddings(exact, embedding=True)
    np.testing.assert_array_equal(both["n_once"] - exact["n_once"], 2 * 2048 * exact["d_model"])
    np.testing.assert_array_equal(head["n_rec"], exact["n_rec"])
    bare = exact.drop(columns=["d_model"])             # no accounting columns: rebuilt from the preset
    np.testing.assert_array_equal(R.embedding_params(bare), 2048 * exact["d_model"])


def test_cell_interiors_drop_each_cells_narrowest_and_widest(exact):
    inner = R.cell_interiors(exact)
    assert len(inner) == len(exact) - 2 * 16 and set(inner["s"]) == {5, 6, 7}


def test_robustness_table_rows_and_columns(exact):
    t = R.robustness_table(exact, restarts=20, bootstrap=3, boot_restarts=1, multi_restarts=4, multi_boot_restarts=1)
    assert list(t["variant"]) == ["paper", "head_in_n_once", "embedding_and_head_in_n_once", "without_r2", "without_r8",
                                  "without_lowest_budget", "without_highest_budget", "cell_interiors", "per_r_phi_2",
                                  "per_r_phi_4", "per_r_phi_8", "kappa_r_phi"]
    assert {"phi", "phi_lo", "phi_hi", "r2", "rmse", "n_runs", "kappa"} <= set(t.columns)
    row = t.set_index("variant")
    assert abs(row.loc["paper", "phi"] - 0.5) < 0.01 and row.loc["paper", "rmse"] < 1e-3
    assert row.loc["without_r2", "n_runs"] == 60 and row.loc["cell_interiors", "n_runs"] == 48
    assert row.loc["kappa_r_phi", "kappa"] == pytest.approx(1.0, rel=0.05)


def test_synthetic_recovery_is_unbiased_on_white_noise():
    df = design(budgets=BUDGETS[:3], sizes=(4, 6, 8))
    out = R.synthetic_recovery(df, LAW, n_draws=20, noise=0.003, restarts=30, bootstrap=5, boot_restarts=1)
    s = out["summary"]
    assert s["n_draws"] == 20 and len(out["draws"]) == 20 and 0 <= s["coverage"] <= 1
    assert abs(s["bias"]) < 0.03 and s["sd"] < 0.05
    cell = R.synthetic_recovery(df, LAW, n_draws=2, noise=0.003, kind="cell", restarts=30, bootstrap=0)
    assert cell["summary"]["cell_noise"] == 0.003 and np.isnan(cell["summary"]["coverage"])


def test_paper_tables():
    from looped.studies.paper import PAPER_DIR, PAPER_LAW, runs_from_minima
    law = PAPER_LAW.to_dict()
    assert law["phi"] == 0.459 and law["alpha"] == pytest.approx(0.199, abs=1e-3)
    m = runs_from_minima(PAPER_DIR / "compute_optimal_minima.csv")
    star = pd.read_csv(PAPER_DIR / "compute_optimal_minima.csv")
    assert len(m) == 24
    np.testing.assert_allclose(m["n_once"] + m["n_rec"], star["n_star_unique_millions"] * 1e6, rtol=1e-9)
    assert (m.loc[m["r"] == 1, "n_rec"] == 0).all() and (m.loc[m["r"] > 1, "n_rec"] > 0).all()
    g = R.paper_design()
    assert len(g) == 116 and g.groupby(["budget", "r"]).ngroups == 24
    one = g.iloc[0]
    cfg = model_config("paper", r=int(one["r"]), s=float(one["s"]))
    assert one["n_once"] == acc.n_once(cfg) and one["tokens"] == acc.tokens_for_budget(cfg, one["budget"], 262_144)


def test_bad_input_raises_a_clear_error(exact, tmp_path):
    with pytest.raises(FitError, match="empty"):
        R.robustness_table(pd.DataFrame())
    with pytest.raises(FitError, match="loss"):
        D.per_budget_phi(exact.drop(columns="loss"))
    with pytest.raises(FitError, match="budget"):
        D.phi_trend(exact.drop(columns="budget"))
    with pytest.raises(FitError, match="s"):
        R.goodness_of_fit(exact.drop(columns="s"))
    with pytest.raises(FitError, match="kind"):
        R.synthetic_recovery(design(), LAW, kind="pink")
    assert R.main(["--runs", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.json")]) == 2


def test_json_is_plain():
    out = json_ready({"t": pd.DataFrame({"a": [1.0, np.nan]}), "x": np.float64(2), "n": np.int64(3), "v": (np.nan,)})
    assert json.loads(json.dumps(out, allow_nan=False)) == {
        "t": [{"a": 1.0}, {"a": None}],
        "x": 2.0,
        "n": 3,
        "v": [None],
    }



def test_a_table_written_as_json_reads_back_with_its_missing_numbers_as_nan():
    """A column of numbers that JSON holds as null (an F without replicates) reads back as float NaN, so a
    chapter's comparison on it is False, not a TypeError; text columns stay text."""
    rows = json.loads(json.dumps(json_ready(pd.DataFrame({"model": ["law", "free"], "F": [np.nan, np.nan],
                                                          "p": [np.nan, 0.5]}))))
    table = json_table(rows)
    assert table.F.dtype == float and table.p.tolist()[1] == 0.5 and not (table.F > 2).any()
    assert table.model.tolist() == ["law", "free"]


def test_phi_vs_compute_tables(exact):
    out = D.phi_vs_compute(exact, restarts=20, bootstrap=3, boot_restarts=1, multi_restarts=4, multi_boot_restarts=1)
    assert set(out) == {"per_budget", "windows", "paper_per_budget", "paper_windows", "trend"}
    assert list(out["windows"][["budget_lo", "budget_hi"]].itertuples(index=False, name=None)) == list(
        zip(BUDGETS[:-1], BUDGETS[1:])
    )
    np.testing.assert_allclose(out["windows"]["phi"], 0.5, atol=0.03)
    paper = out["paper_per_budget"]
    assert len(paper) == 6 and (paper["n_cells"] == 4).all() and paper["phi"].between(0.2, 0.8).all()
    windows = out["paper_windows"]
    assert len(windows) == 5 and (windows["n_cells"] == 8).all()
    assert (windows["budget_lo"].to_numpy() == paper["budget"].to_numpy()[:-1]).all()
    # a window's phi lies between (or near) the phis of its two budgets
    lo = np.minimum(paper["phi"].to_numpy()[:-1], paper["phi"].to_numpy()[1:])
    hi = np.maximum(paper["phi"].to_numpy()[:-1], paper["phi"].to_numpy()[1:])
    assert ((windows["phi"] >= lo - 0.02) & (windows["phi"] <= hi + 0.02)).all()
    assert list(out["trend"]["data"]) == ["ours", "paper_minima"] and out["trend"]["n_budgets"].tolist() == [4, 6]


def test_a_further_budget_is_predicted_refitted_and_joins_the_drift_fits(exact):
    """Runs at a fifth budget: the four-budget fit predicts them; once every r has a run there, they
    join the refit and the phi-against-compute fits; a budget still missing an r is only predicted."""
    far = runs(noise=1e-4, budgets=(5e13,), sizes=(6, 8))
    held = R.goodness_of_fit(exact, restarts=8, drift=far)["holdout"]
    assert held["budget"].tolist() == [5e13] and held["n_runs"].tolist() == [8]
    assert abs(held["mean_error"].iloc[0]) < 2e-3 and np.isnan(held["rmse_over_seed_sd"].iloc[0])  # no replicates
    kw = dict(restarts=8, bootstrap=2, boot_restarts=1, multi_restarts=4, multi_boot_restarts=1)
    t = R.robustness_table(exact, drift=far, **kw).set_index("variant")
    assert t.index[-1] == "with_drift_budgets" and t.loc["with_drift_budgets", "n_runs"] == len(exact) + 8
    assert abs(t.loc["with_drift_budgets", "phi"] - 0.5) < 0.01
    pvc = D.phi_vs_compute(exact, drift=far, **kw)
    assert pvc["per_budget"]["budget"].tolist() == [*BUDGETS, 5e13] and pvc["trend"]["n_budgets"].tolist() == [5, 6]
    partial = far[far["r"] != 8]
    assert len(D.add_budgets(exact, partial)[1]) == 0
    assert "with_drift_budgets" not in R.robustness_table(exact, drift=partial, **kw)["variant"].tolist()
    assert R.goodness_of_fit(exact, restarts=8, drift=partial)["holdout"]["n_runs"].tolist() == [6]
    with pytest.raises(FitError, match="repeat budget"):
        D.add_budgets(exact, exact)


def test_fit_multi_rejects_a_design_that_does_not_line_up(exact):
    with pytest.raises(FitError, match="rows"), pytest.warns(UserWarning, match="status"):
        M.fit_multi(exact.assign(status=["ok"] * (len(exact) - 1) + ["failed"]), np.ones((len(exact), 1)), ["phi"])


def test_the_committed_results_rerun_in_small(tmp_path):
    """CI's reduced rerun of `looped constancy`: the same refits, each point estimate of phi within
    0.01 of the committed full run's (the bootstrap intervals shrink with its fewer resamples)."""
    committed = R.read_results()
    out = tmp_path / "quick.json"
    settings = committed["settings"]
    drift = [str(REPO / p) for p in settings.get("drift", [])]
    assert R.main(["--quick", "--out", str(out),
                   "--runs", str(REPO / settings["runs"]), "--drift", *drift]) == 0
    quick = R.read_results(out)
    assert list(quick["robustness"].variant) == list(committed["robustness"].variant)
    assert np.allclose(quick["robustness"].phi, committed["robustness"].phi, atol=0.01)
    assert np.allclose(quick["per_budget"].phi, committed["per_budget"].phi, atol=0.02)
    assert quick["settings"]["runs"] == settings["runs"] and quick["settings"]["quick"]
    mine, theirs = (r["trend"].set_index("data").loc["ours"] for r in (quick, committed))
    assert mine.phi1 == pytest.approx(theirs.phi1, abs=0.02)
    assert mine.phi1_jack_se == pytest.approx(theirs.phi1_jack_se, rel=0.2)
    assert 0 < quick["drift_calibration"]["se"] < 1 and quick["summary"]["seed_sd"] == committed["summary"]["seed_sd"]


def test_the_refit_table_says_where_each_interval_lies_and_names_added_budgets():
    """Where an interval of phi lies against the paper's (an overlap is not called agreement), and the
    label of a refit with further budgets added."""
    from looped.report import constancy
    sides = [constancy.paper_side(*iv) for iv in ((0.55, 0.8), (0.1, 0.3), (-2.5, 0.7))]
    assert sides == ["above", "below", "overlaps"]
    results = R.read_results(family="cpu")   # four budgets: the added one is new
    frame = constancy.robustness_frame(results)
    assert set(frame["against the paper's"]) <= {"above", "below", "overlaps"}
    assert (frame["width"] == frame["phi_hi"] - frame["phi_lo"]).all()
    top = results["per_budget"].iloc[[-1]].assign(budget=5e13)
    extra = dict(results, per_budget=pd.concat([results["per_budget"], top]),
                 robustness=pd.concat([results["robustness"], results["robustness"].iloc[[0]].assign(
                     variant="with_drift_budgets", phi=0.6123, phi_lo=0.5, phi_hi=0.7)]))
    assert constancy.added_budgets(extra) == [5e13]
    assert constancy.robustness_frame(extra).refit.iloc[-1] == "with C = 5×10¹³ added"


def test_pure_error_keeps_the_protocols_apart_and_measures_their_shift():
    """Fixed-order runs (no data_order) sit 0.02 nats above their permuted-order replicates: the shift
    is measured by protocol_shift and does not inflate the pure error."""
    fixed = runs(noise=0.0).iloc[::10].head(8).reset_index(drop=True)
    rng = np.random.default_rng(4)
    perm = pd.concat([fixed.assign(seed=43 + k, data_order=43 + k, loss=fixed["loss"] - 0.02 + rng.normal(0, 0.005, 8))
                      for k in range(2)], ignore_index=True)
    pe = R.replicate_sd(fixed, perm)
    assert pe["df_pe"] == 8 and pe["n_groups"] == 8 and 0.002 < pe["seed_sd"] < 0.009   # 43/44 pairs only
    sh = R.protocol_shift(fixed, perm)
    assert sh["n_configs"] == 8 and sh["shift"] == pytest.approx(-0.02, abs=0.005) and sh["t"] < -5
    assert R.replicate_sd(fixed, perm, design=fixed.head(3))["n_groups"] == 3          # design points only
    assert R.protocol_shift(perm)["n_configs"] == 0                                     # nothing to compare


def test_trend_simulation_is_centred_on_zero_and_power_is_a_z_test(exact):
    sim = D.trend_simulation(exact, LAW, cell_sd=0.01, noise=0.005, n_draws=6, restarts=4)
    assert abs(sim["null_mean"]) < 3 * sim["se"] and 0 < sim["se"] < 1
    assert D.power(0.0, 0.1) == pytest.approx(0.05, abs=1e-6)
    assert D.power(2.8 * 0.1, 0.1) == pytest.approx(0.80, abs=0.01) and D.power(-0.28, 0.1) == D.power(0.28, 0.1)


def test_seed_and_order_attributes_a_shift_to_the_order():
    """Runs whose loss moves with the data order (permuted 0.015 lower) and not with the seed: the
    attribution puts the shift on the order at both seeds and finds no seed effect."""
    from looped.studies.sweep.replicates import seed_and_order
    base = runs(noise=0.0).iloc[::10].head(8).reset_index(drop=True)
    rng = np.random.default_rng(7)
    arms = [base.assign(seed=seed, data_order=order,
                        loss=base["loss"] - (0.015 if order else 0) + rng.normal(0, 1e-3, 8))
            for seed, order in ((42, None), (43, 43), (43, None), (42, 42))]
    out = seed_and_order(*arms)
    assert out["n_configs"] == 8
    assert out["order_at_seed42"]["mean"] == pytest.approx(-0.015, abs=2e-3) and out["order_at_seed43"]["t"] < -10
    assert abs(out["seed_at_fixed_order"]["mean"]) < 2e-3 and abs(out["seed_at_fixed_order"]["t"]) < 5
    assert seed_and_order(*arms[:2]) == {"n_configs": 0}          # without the cpu-order runs: nothing to attribute


def test_seed_and_order_reads_the_second_studys_two_by_two():
    """cpu3-replicates crosses two seeds with one permuted order (data_order 43) at eight
    configurations of cpu3-main, whose runs are seed 42 under the fixed order: the attribution sees
    all eight and puts a shift made by the order on the order."""
    from looped.studies.paper import design_of
    from looped.studies.sweep.registry import load_study
    from looped.studies.sweep.replicates import seed_and_order
    reps = load_study("cpu3-replicates")
    design = design_of(reps).assign(seed=[r.seed for r in reps], data_order=[r.data_order for r in reps])
    configs = design.drop_duplicates(["budget", "r", "s"]).assign(seed=42, data_order=None)
    rng = np.random.default_rng(3)
    base = {(b, r, s): 3.0 + rng.normal(0, 0.05) for b, r, s in configs[["budget", "r", "s"]].itertuples(index=False)}
    loss = lambda t: [base[k] - (0.014 if o == o and o is not None else 0) + rng.normal(0, 1e-3)   # noqa: E731
                      for k, o in zip(t[["budget", "r", "s"]].itertuples(index=False, name=None), t.data_order)]
    main, replicates = configs.assign(loss=loss(configs)), design.assign(loss=loss(design))
    out = seed_and_order(main, replicates)
    assert out["n_configs"] == 8
    for seed in (42, 43):
        assert out[f"order_at_seed{seed}"]["mean"] == pytest.approx(-0.014, abs=2e-3)
    assert abs(out["seed_at_permuted_order"]["mean"]) < 2e-3


def test_a_drift_is_resolved_only_when_its_weaker_scale_clears_one_percent():
    """The verdict the book prints for a drift of phi: both calibrated scales must put it past
    two-sided 1% (|z| > 2.576)."""
    from looped.report.constancy import drift_verdict
    assert drift_verdict(-3.4, -4.2) == drift_verdict(4.0, 2.6) == "resolved at the 1% level by both scales"
    assert drift_verdict(-1.95, -2.2) == drift_verdict(-5.0, -2.5) == "suggested, not resolved"


def test_the_seed_order_effects_read_the_committed_v3_design():
    """The four effects of cpu3-replicates' seed x order design, one row each, from the committed analysis."""
    from looped.report.constancy import seed_order_effects
    so = R.read_results(family="cpu3")["summary"]["seed_order"]
    effects = seed_order_effects(so)
    assert list(effects.effect) == ["order42", "order43", "seed_fixed", "seed_perm"]
    assert (effects.n == so["n_configs"]).all() and effects.t.abs().max() < 2
