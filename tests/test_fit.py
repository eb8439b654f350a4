"""The fitter: parameter recovery, restricted fits, published minima, determinism, bad input."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from looped import fit as F

PAPER = Path(__file__).resolve().parents[1] / "runs" / "paper"


@pytest.fixture(scope="module")
def grid():
    return F.paper_grid()


def test_grid_is_the_papers_116_runs(grid):
    assert len(grid) == 116
    assert sorted(grid["r"].unique()) == [1, 2, 4, 8]
    assert grid.groupby(["budget", "r"]).ngroups == 24


def test_gradient_and_hessian_match_finite_differences(grid):
    df = F.synthetic_runs(seed=3, grid=grid)
    data = F._Data.from_frame(df)
    rng = np.random.default_rng(0)
    th = np.array([[3.3, 0.2, 6.8, 0.37, 0.45, 0.46]]) + rng.normal(0, 0.05, (1, 6))
    delta = 0.05   # a wide Huber zone: every residual quadratic, so finite differences are clean
    f, g, H = F._objective(th, data, order=2, delta=delta)
    eps = 1e-6
    for i in range(6):
        tp, tm = th.copy(), th.copy()
        tp[0, i] += eps
        tm[0, i] -= eps
        fp, gp = F._objective(tp, data, order=1, delta=delta)
        fm, gm = F._objective(tm, data, order=1, delta=delta)
        assert (fp - fm)[0] / (2 * eps) == pytest.approx(g[0, i], rel=1e-5, abs=1e-9)
        np.testing.assert_allclose((gp - gm)[0] / (2 * eps), H[0, i], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("phi", [0.2, 0.46, 0.8])
def test_recovers_phi_with_bootstrap_coverage(grid, phi):
    df = F.synthetic_runs({"phi": phi}, noise=0.01, seed=1, grid=grid)
    res = F.fit(df, restarts=100, seed=0, bootstrap=30)
    assert abs(res.phi - phi) < 0.05
    lo, hi = res.ci["phi"]
    assert lo <= phi <= hi
    assert set(res.ci) == {"A", "alpha", "B", "beta", "E", "phi"}
    assert res.r2 > 0.99 and res.n_runs == 116


def test_restricted_fits_explain_less(grid):
    df = F.synthetic_runs(seed=2, grid=grid)
    free = F.fit(df, restarts=100)
    for v in (0.0, 1.0):
        fixed = F.fit(df, restarts=100, fix={"phi": v})
        assert fixed.phi == v and "phi" in fixed.fixed
        assert fixed.r2 < free.r2
        assert fixed.huber > free.huber


def test_published_minima_give_phi_in_the_papers_interval():
    """The 24 published iso-FLOP minima as runs (split and tokens from the accounting, see
    `runs_from_minima`): phi lands inside the paper's bootstrap interval [0.41, 0.53]."""
    runs = F.runs_from_minima(PAPER / "compute_optimal_minima.csv")
    assert len(runs) == 24
    np.testing.assert_allclose(runs["n_once"] + runs["n_rec"],
                               pd.read_csv(PAPER / "compute_optimal_minima.csv")["n_star_unique_millions"] * 1e6)
    res = F.fit(runs, restarts=200, seed=0)
    assert 0.41 <= res.phi <= 0.53
    assert res.r2 > 0.99


def test_same_seed_same_result(grid):
    df = F.synthetic_runs(seed=4, grid=grid)
    a = F.fit(df, restarts=60, seed=7, bootstrap=8)
    b = F.fit(df, restarts=60, seed=7, bootstrap=8)
    da, db = a.to_dict(), b.to_dict()
    da.pop("seconds"), db.pop("seconds")
    assert da == db


def test_chinchilla_fallback_for_plain_runs_only(grid):
    df = F.synthetic_runs(seed=5, grid=grid)
    plain = df[df["r"] == 1].reset_index(drop=True)
    res = F.fit(plain, restarts=60)
    assert res.phi is None and res.law == "chinchilla"
    assert "phi" not in res.free
    per = F.fit(df, restarts=40, per_r=True)
    assert sorted(per.per_r) == [1, 2, 4, 8] and all(p.phi is None for p in per.per_r.values())


def test_fast_path_matches_serial_scipy_reference(grid):
    """Best objective of the batched solver (+ polish) equals one-restart-at-a-time scipy L-BFGS-B."""
    df = F.synthetic_runs(seed=6, grid=grid)
    data = F._Data.from_frame(df)
    free = np.ones(6, bool)
    starts = F._starts(np.random.default_rng(0), 12, {})
    _, fref, _, _ = F.serial_fit(data, starts, free)
    ((_, ffast, _),) = F._solve(data, starts, free)
    assert ffast <= fref * (1 + 1e-6)
    assert abs(ffast - fref) / fref <= 1e-6


def test_bootstrap_is_the_full_protocol_and_pruning_is_exact(grid):
    """bootstrap > 0 runs the paper's protocol per resample (`restarts` fresh random starts,
    the best kept); the pruned batched solve reaches the same optimum as solving every restart
    to convergence (prune_gap=None)."""
    df = F.synthetic_runs({"phi": 0.8, "alpha": 0.3}, seed=14, grid=grid)
    R, B = 40, 3
    res = F.fit(df, restarts=R, seed=3, bootstrap=B)
    data = F._Data.from_frame(df)
    free = np.ones(6, bool)
    ss = np.random.SeedSequence(3).spawn(3)
    W = F._boot_weights(df, np.random.default_rng(ss[1]), B)
    rng = np.random.default_rng(ss[2])
    for i in range(B):
        st = F._starts(rng, R, {})
        ((_, f_all, _),) = F._solve(data, st, free, weights=np.repeat(W[i][None], R, 0), polish=1, prune_gap=None)
        th = np.array(res.boot_samples[i], float)
        th[[0, 2, 4]] = np.log(th[[0, 2, 4]])
        f_fit = F._objective(th[None], data, W[i][None], order=0)[0]
        assert abs(f_fit - f_all) <= 1e-6 * f_all


def test_predict_and_residuals(grid):
    df = F.synthetic_runs(noise=0.0, grid=grid)
    res = F.FitResult(**F.PAPER_LAW, r2=1, huber=0, n_runs=len(df), restarts=0)
    np.testing.assert_allclose(F.residuals(res, df), 0, atol=1e-12)


def test_iso_flop_minima(grid):
    df = F.synthetic_runs(noise=0.0, grid=grid)
    m = F.iso_flop_minima(df)
    assert len(m) == 24 and m["opens_up"].all()
    assert (m.loc[m["r"] == 1, "n_star"].to_numpy() > m.loc[m["r"] == 8, "n_star"].to_numpy()).all()


def test_worked_example_effective_sizes():
    """Paper appendix F.4: a ~1B plain model (s=32, d=2048) and its r=4 sibling."""
    e = F.effective_sizes("paper", r=4, s=32, phi=0.46)
    assert e["plain_unique"] == pytest.approx(1.0e9, rel=0.01)
    assert e["block_unique_ratio"] == pytest.approx(0.40)
    assert round(e["block_loss_equivalent_ratio"], 2) == 0.58
    assert e["unique"] == pytest.approx(410e6, rel=0.01)          # ~410M with the injection
    assert e["loss_equivalent_ratio"] == pytest.approx(0.58, abs=0.015)
    assert e["compute_equivalent_ratio"] == pytest.approx(1.0, abs=0.04)   # the compute of the 1B


def test_compute_optimal(grid):
    res = F.FitResult(**F.PAPER_LAW, r2=1, huber=0, n_runs=116, restarts=0)
    co = F.compute_optimal(res, r=(1, 4), budgets=[1e18, 1e19])
    assert len(co) == 4 and not co["at_edge"].any()
    r1, r4 = co[co.r == 1].set_index("budget"), co[co.r == 4].set_index("budget")
    assert (r4["n"] < r1["n"]).all() and (r4["loss"] > r1["loss"]).all()
    assert (r1.loc[1e19, "n"] > r1.loc[1e18, "n"])


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------

def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "looped", "fit", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture()
def runs_csv(tmp_path, grid):
    p = tmp_path / "runs.csv"
    F.synthetic_runs(seed=8, grid=grid).to_csv(p, index=False)
    return p


def test_cli_fit_writes_json(runs_csv, tmp_path):
    out = tmp_path / "fit.json"
    p = run_cli(runs_csv, "--restarts", 40, "--bootstrap", 5, "--json", out, "--fix", "E=1.56773")
    assert p.returncode == 0, p.stderr
    assert "phi" in p.stdout and "R^2" in p.stdout
    d = json.loads(out.read_text())
    for k in ("A", "alpha", "B", "beta", "E", "phi", "r2", "huber", "n_runs", "ci"):
        assert k in d
    assert set(d["ci"]) == {"A", "alpha", "B", "beta", "phi"} and d["E"] == pytest.approx(1.56773)


def test_cli_reads_a_directory_of_records(tmp_path, grid):
    df = F.synthetic_runs(seed=9, grid=grid).head(40)
    for i, row in enumerate(df.to_dict("records")):
        rec = {"status": "ok", "loss": row["loss"], "tokens": row["tokens"],
               "config": {"r": row["r"], "n_once": row["n_once"], "n_rec": row["n_rec"],
                          "budget": row["budget"], "s": row["s"]}}
        (tmp_path / f"run{i}.json").write_text(json.dumps(rec))
    (tmp_path / "notes.txt").write_text("not a record")
    (tmp_path / "manifest.json").write_text(json.dumps({"study": "x"}))
    p = run_cli(tmp_path, "--restarts", 30)
    assert p.returncode == 0, p.stderr
    assert "40 runs" in p.stdout


def _bad(tmp_path, df, name="bad.csv"):
    p = tmp_path / name
    df.to_csv(p, index=False)
    return p


def _one_line_error(p):
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.startswith("looped fit: error:")]
    assert len(lines) == 1 and "Traceback" not in p.stderr
    return lines[0]


def test_cli_bad_inputs_exit_2(tmp_path, grid):
    df = F.synthetic_runs(seed=10, grid=grid)
    assert "loss" in _one_line_error(run_cli(_bad(tmp_path, df.drop(columns="loss"))))
    neg = df.copy()
    neg.loc[3, "loss"] = -1.0
    assert "loss" in _one_line_error(run_cli(_bad(tmp_path, neg)))
    nan = df.copy()
    nan.loc[5, "tokens"] = np.nan
    assert "tokens" in _one_line_error(run_cli(_bad(tmp_path, nan)))
    assert "too few runs" in _one_line_error(run_cli(_bad(tmp_path, df.head(6)), "--restarts", 5))
    garbage = tmp_path / "garbage.csv"
    garbage.write_bytes(b"\x00\xff\xfe binary \x00")
    _one_line_error(run_cli(garbage))
    _one_line_error(run_cli(tmp_path / "does_not_exist.csv"))
    assert "gamma" in _one_line_error(run_cli(_bad(tmp_path, df), "--fix", "gamma=1"))
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_error(run_cli(empty))


def test_cli_skips_non_ok_rows_with_a_warning(tmp_path, grid):
    df = F.synthetic_runs(seed=11, grid=grid)
    df.loc[:9, "status"] = "failed"
    df.loc[:9, "loss"] = np.nan     # failed runs have no loss: must not trip the NaN check
    p = run_cli(_bad(tmp_path, df), "--restarts", 30)
    assert p.returncode == 0, p.stderr
    assert "warning" in p.stderr and "10 run(s)" in p.stderr
    assert "106 runs" in p.stdout
    with pytest.warns(UserWarning, match="not 'ok'"):
        F.load_runs(tmp_path / "bad.csv")


@pytest.mark.slow
def test_paper_protocol_full_restarts():
    """The full protocol (500 restarts, 200 resamples) recovers the paper's phi."""
    df = F.synthetic_runs(seed=0)
    res = F.fit(df, restarts=500, bootstrap=200)
    assert abs(res.phi - 0.459) < 0.05 and res.ci["phi"][0] <= 0.459 <= res.ci["phi"][1]


def test_case_study_refit_against_baseline(tmp_path):
    """Case-study protocol: baseline = main runs at the case study's budgets; the refit uses the
    main r = 1 runs plus the case study's r > 1 runs.  A lower phi in the case-study law is
    recovered, the two bootstraps are paired, and thin studies are skipped with a note."""
    main = F.synthetic_runs(seed=12)
    trunc = F.synthetic_runs({"phi": 0.30}, seed=13, grid=F.paper_grid("truncated_bptt"))
    cs = F.case_study(main, trunc, name="truncated", restarts=80, seed=0, bootstrap=12)
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
    sub = F.case_study(main, trunc, study_r=(4, 8), restarts=40, baseline=cs.baseline)
    assert set(sub.variant_runs["r"]) == {1, 4, 8} and sub.baseline is cs.baseline
    assert sub.ok and not sub.paired and sub.delta_phi_ci is None
    # a sweep that has barely started: the refit is skipped, the baseline still fitted
    two = sorted(trunc["budget"].unique())[:2]
    few = F.case_study(main, trunc[trunc["budget"].isin(two)].groupby("budget").head(2), restarts=20)
    assert few.variant is None and few.baseline is not None and "skipped" in few.note
    assert few.budgets == two and few.delta_phi is None and few.table()["phi"].isna().iloc[1]
    # one budget: N and D are tied, neither fit is attempted
    one = F.case_study(main, trunc.head(9), restarts=20)
    assert one.budgets == [4.64e17] and one.baseline is None and one.variant is None
    assert "1 budget(s)" in one.note
    # no records at all (missing or empty folder): baseline on every main budget
    (tmp_path / "empty").mkdir()
    for missing in (tmp_path / "nothing", tmp_path / "empty", None):
        none = F.case_study(main, missing, restarts=20)
        assert none.variant is None and none.study_runs == 0 and len(none.budgets) == 6


# ------------------------------------------------------------------------------------------
# Continuous compute-optimal frontier (chapter 7)
# ------------------------------------------------------------------------------------------

def test_width_polynomials_are_the_accounting():
    from looped import accounting as acc
    for r, inj, k in ((1, None, None), (4, None, None), (8, None, 4), (4, "hyperconnect", None)):
        P = F._width_polynomials("paper", r, inj, k)
        for d in (128.0, 777.7, 2048.0):
            cfg = F._cfg_at_width("paper", r, d, inj, k)
            np.testing.assert_allclose(P @ [1.0, d, d * d],
                                       [acc.n_once(cfg), acc.n_rec(cfg), acc.flops_per_token(cfg)], rtol=1e-12)


def test_compute_optimal_frontier():
    res = F.FitResult(**F.PAPER_LAW, r2=1, huber=0, n_runs=116, restarts=0)
    fr = F.compute_optimal_frontier(F.PAPER_LAW, r=(1, 4), budgets=[1e18, 1e19])
    assert len(fr) == 4 and not fr["at_edge"].any()
    # the FitResult and the dict give the same frontier; its losses are the law's
    pd.testing.assert_frame_equal(fr, F.compute_optimal_frontier(res, r=(1, 4), budgets=[1e18, 1e19]))
    np.testing.assert_allclose(F.predict(res, fr.n_once, fr.n_rec, fr.r, fr.tokens_star), fr.loss_star, rtol=1e-12)
    np.testing.assert_allclose(fr.tokens_star * fr.flops_per_token, fr.budget, rtol=1e-12)
    # no preset width does better, and the discrete-width parabola lands close by
    co = F.compute_optimal(res, r=(1, 4), budgets=[1e18, 1e19])
    m = co.merge(fr, on=["r", "budget"], suffixes=("_grid", "_cont"))
    assert (m["loss_star_cont"] <= m["loss"] + 1e-12).all()
    np.testing.assert_allclose(m["n_star_cont"], m["n_star_grid"], rtol=0.02)
    # a minimum: nudging the width either way costs loss
    for row in fr.itertuples():
        for f in (0.98, 1.02):
            cfg = F._cfg_at_width("paper", row.r, row.d_model * f)
            from looped import accounting as acc
            L = F.predict(res, acc.n_once(cfg), acc.n_rec(cfg), row.r, row.budget / acc.flops_per_token(cfg))
            assert L > row.loss_star
    # more recurrences: fewer unique params, more tokens per param, higher loss
    r1, r4 = fr[fr.r == 1].set_index("budget"), fr[fr.r == 4].set_index("budget")
    assert (r4.n_star < r1.n_star).all() and (r4.tokens_per_param > r1.tokens_per_param).all()
    assert (r4.loss_star > r1.loss_star).all()
    # phi = None (Chinchilla: unique params) is phi = 0
    a = F.compute_optimal_frontier(dict(F.PAPER_LAW, phi=None), r=4, budgets=[1e19])
    b = F.compute_optimal_frontier(dict(F.PAPER_LAW, phi=0.0), r=4, budgets=[1e19])
    np.testing.assert_allclose(a.loss_star, b.loss_star, rtol=1e-12)


def test_compute_optimal_for_loss():
    eq = F.compute_optimal_for_loss(F.PAPER_LAW, 2.3, r=(1, 4))
    np.testing.assert_allclose(eq["loss_star"], 2.3, atol=1e-8)
    r1, r4 = eq.set_index("r").loc[1], eq.set_index("r").loc[4]
    assert r4.budget > r1.budget and r4.n_star < r1.n_star and r4.d_model > r1.d_model
    with pytest.raises(F.FitError, match="irreducible"):
        F.compute_optimal_for_loss(F.PAPER_LAW, 1.5)
    with pytest.raises(F.FitError, match="not reached"):
        F.compute_optimal_for_loss(F.PAPER_LAW, 1.6, budget_bounds=(1e18, 1e20))
