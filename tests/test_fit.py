"""The fitter: parameter recovery, restricted fits, published minima, determinism, bad input."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from looped import fit as F
from looped import solver
from looped.studies import paper
from looped.studies.sweep import iso_flop

PAPER = Path(__file__).resolve().parents[1] / "runs" / "paper"


@pytest.fixture(scope="module")
def grid():
    return paper.paper_grid()


def test_grid_is_the_papers_116_runs(grid):
    assert len(grid) == 116
    assert sorted(grid["r"].unique()) == [1, 2, 4, 8]
    assert grid.groupby(["budget", "r"]).ngroups == 24


def test_gradient_and_hessian_match_finite_differences(grid):
    df = paper.synthetic_runs(seed=3, grid=grid)
    data = solver.RunArrays.from_frame(df)
    rng = np.random.default_rng(0)
    th = np.array([[3.3, 0.2, 6.8, 0.37, 0.45, 0.46]]) + rng.normal(0, 0.05, (1, 6))
    delta = 0.05   # a wide Huber zone: every residual quadratic, so finite differences are clean
    f, g, H = solver.objective(th, data, order=2, delta=delta)
    eps = 1e-6
    for i in range(6):
        tp, tm = th.copy(), th.copy()
        tp[0, i] += eps
        tm[0, i] -= eps
        fp, gp = solver.objective(tp, data, order=1, delta=delta)
        fm, gm = solver.objective(tm, data, order=1, delta=delta)
        assert (fp - fm)[0] / (2 * eps) == pytest.approx(g[0, i], rel=1e-5, abs=1e-9)
        np.testing.assert_allclose((gp - gm)[0] / (2 * eps), H[0, i], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("phi", [0.2, 0.46, 0.8])
def test_recovers_phi_with_bootstrap_coverage(grid, phi):
    df = paper.synthetic_runs({"phi": phi}, noise=0.01, seed=1, grid=grid)
    res = F.fit(df, restarts=100, seed=0, bootstrap=30)
    assert abs(res.phi - phi) < 0.05
    lo, hi = res.ci["phi"]
    assert lo <= phi <= hi
    assert set(res.ci) == {"A", "alpha", "B", "beta", "E", "phi"}
    assert res.r2 > 0.99 and res.n_runs == 116


def test_bootstrap_does_not_depend_on_the_order_of_the_rows(grid):
    """The same runs in another order resample the same cells: same fit, same intervals."""
    df = paper.synthetic_runs({"phi": 0.46}, noise=0.01, seed=1, grid=grid)
    a = F.fit(df, restarts=20, seed=0, bootstrap=10, boot_restarts=2)
    b = F.fit(df.sample(frac=1.0, random_state=3).reset_index(drop=True), restarts=20, seed=0, bootstrap=10,
              boot_restarts=2)
    assert b.phi == pytest.approx(a.phi, abs=1e-8)
    for name, (lo, hi) in a.ci.items():
        assert b.ci[name] == pytest.approx((lo, hi), rel=1e-6, abs=1e-8)


def test_restricted_fits_explain_less(grid):
    df = paper.synthetic_runs(seed=2, grid=grid)
    free = F.fit(df, restarts=100)
    for v in (0.0, 1.0):
        fixed = F.fit(df, restarts=100, fix={"phi": v})
        assert fixed.phi == v and "phi" in fixed.fixed
        assert fixed.r2 < free.r2
        assert fixed.huber > free.huber


def test_published_minima_give_phi_in_the_papers_interval():
    """The 24 published iso-FLOP minima as runs (split and tokens from the accounting, see
    `runs_from_minima`): phi lands inside the paper's bootstrap interval [0.41, 0.53]."""
    runs = paper.runs_from_minima(PAPER / "compute_optimal_minima.csv")
    assert len(runs) == 24
    np.testing.assert_allclose(runs["n_once"] + runs["n_rec"],
                               pd.read_csv(PAPER / "compute_optimal_minima.csv")["n_star_unique_millions"] * 1e6)
    res = F.fit(runs, restarts=200, seed=0)
    assert 0.41 <= res.phi <= 0.53
    assert res.r2 > 0.99


def test_same_seed_same_result(grid):
    df = paper.synthetic_runs(seed=4, grid=grid)
    a = F.fit(df, restarts=60, seed=7, bootstrap=8)
    b = F.fit(df, restarts=60, seed=7, bootstrap=8)
    da, db = a.to_dict(), b.to_dict()
    da.pop("seconds"), db.pop("seconds")
    assert da == db


def test_chinchilla_fallback_for_plain_runs_only(grid):
    df = paper.synthetic_runs(seed=5, grid=grid)
    plain = df[df["r"] == 1].reset_index(drop=True)
    res = F.fit(plain, restarts=60)
    assert res.phi is None and res.kind == res.to_dict()["kind"] == "chinchilla" and res.law.phi is None
    assert "phi" not in res.free
    per = F.fit(df, restarts=40, per_r=True)
    assert sorted(per.per_r) == [1, 2, 4, 8] and all(p.phi is None for p in per.per_r.values())


def test_batched_objective_is_the_reference_objective(grid):
    """The solver's batched objective (with derivatives) computes exactly the plain
    `objective_reference` (scipy's huber and logsumexp), for random thetas in the box, with and
    without looped runs; and a fit's reported Huber sum is the reference objective at its theta."""
    df = paper.synthetic_runs(seed=15, grid=grid)
    thetas = solver.random_starts(np.random.default_rng(1), 300, {})
    for data in (solver.RunArrays.from_frame(df), solver.RunArrays.from_frame(df, chinchilla=True)):
        fast = solver.objective(thetas, data, order=0)
        ref = np.array([solver.objective_reference(th, data) for th in thetas])
        np.testing.assert_allclose(fast, ref, rtol=1e-10, atol=0)
    res = F.fit(df, restarts=20)
    assert res.huber == pytest.approx(solver.objective_reference(res.theta, solver.RunArrays.from_frame(df)), rel=1e-10)


def test_fast_path_matches_serial_scipy_reference(grid):
    """Best objective of the batched solver (+ polish) equals one-restart-at-a-time scipy L-BFGS-B."""
    df = paper.synthetic_runs(seed=6, grid=grid)
    data = solver.RunArrays.from_frame(df)
    free = np.ones(6, bool)
    starts = solver.random_starts(np.random.default_rng(0), 12, {})
    _, fref, _, _ = solver.serial_fit(data, starts, free)
    ((_, ffast, _),) = solver.solve_restarts(data, starts, free)
    assert ffast <= fref * (1 + 1e-6)
    assert abs(ffast - fref) / fref <= 1e-6


def test_bootstrap_is_the_full_protocol_and_pruning_is_exact(grid):
    """bootstrap > 0 runs the paper's protocol per resample (`restarts` fresh random starts,
    the best kept); the pruned batched solve reaches the same optimum as solving every restart
    to convergence (prune_gap=None)."""
    df = paper.synthetic_runs({"phi": 0.8, "alpha": 0.3}, seed=14, grid=grid)
    R, B = 40, 3
    res = F.fit(df, restarts=R, seed=3, bootstrap=B)
    data = solver.RunArrays.from_frame(df)
    free = np.ones(6, bool)
    ss = np.random.SeedSequence(3).spawn(3)
    W = F.bootstrap_weights(df, np.random.default_rng(ss[1]), B)
    rng = np.random.default_rng(ss[2])
    for i in range(B):
        st = solver.random_starts(rng, R, {})
        ((_, f_all, _),) = solver.solve_restarts(data, st, free, weights=np.repeat(W[i][None], R, 0), polish=1,
                                                 prune_gap=None)
        th = np.array(res.boot_samples[i], float)
        th[[0, 2, 4]] = np.log(th[[0, 2, 4]])
        f_fit = solver.objective(th[None], data, W[i][None], order=0)[0]
        assert abs(f_fit - f_all) <= 1e-6 * f_all


def test_iso_flop_minima(grid):
    df = paper.synthetic_runs(noise=0.0, grid=grid)
    m = iso_flop.iso_flop_minima(df)
    assert len(m) == 24 and m["opens_up"].all()
    assert (m.loc[m["r"] == 1, "n_star"].to_numpy() > m.loc[m["r"] == 8, "n_star"].to_numpy()).all()


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------

def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "looped", "fit", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture()
def runs_csv(tmp_path, grid):
    p = tmp_path / "runs.csv"
    paper.synthetic_runs(seed=8, grid=grid).to_csv(p, index=False)
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
    df = paper.synthetic_runs(seed=9, grid=grid).head(40)
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


def test_a_folder_of_records_is_read_through_looped_records(tmp_path, grid):
    """`load_runs` of a folder and the study table read every record below it through the one reader
    `looped.records.runs_table` (nested parts flattened, old field names mapped); an unreadable file
    is skipped with a warning by the fitter and listed as corrupt by the study table, and a JSON file
    that is no run is ignored."""
    from looped import records
    df = paper.synthetic_runs(seed=16, grid=grid).head(12)
    (tmp_path / "sub").mkdir()
    for i, row in enumerate(df.to_dict("records")):
        rec = {"run_id": f"run{i}", "status": "ok", "r": row["r"], "n_once": row["n_once"], "n_rec": row["n_rec"],
               "tokens": row["tokens"], "result": {"val_loss": row["loss"]}, "config": {"budget_flops": row["budget"]}}
        (tmp_path / ("sub" if i % 2 else ".") / f"run{i}.json").write_text(json.dumps(rec))
    (tmp_path / "torn.json").write_text('{"run_id": "torn", "loss"')
    (tmp_path / "manifest.json").write_text(json.dumps({"study": "x"}))
    with pytest.warns(UserWarning, match="skipping torn.json"):
        runs = F.load_runs(tmp_path)
    assert len(runs) == 12 and runs.file.str.startswith("run").all()
    got = runs.set_index("run_id").loc[[f"run{i}" for i in range(12)]]
    np.testing.assert_array_equal(got[["loss", "budget", "r"]].to_numpy(), df[["loss", "budget", "r"]].to_numpy())
    table = records.read_records(tmp_path)            # the study table: the same records, every status
    assert sorted(table.run_id) == sorted([f"run{i}" for i in range(12)] + ["torn"])
    assert (table.set_index("run_id").loc[[f"run{i}" for i in range(12)], "budget"].to_numpy() == df.budget).all()
    assert table.set_index("run_id").loc["torn", "status"] == "corrupt"


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
    df = paper.synthetic_runs(seed=10, grid=grid)
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
    df = paper.synthetic_runs(seed=11, grid=grid)
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
    df = paper.synthetic_runs(seed=0)
    res = F.fit(df, restarts=500, bootstrap=200)
    assert abs(res.phi - 0.459) < 0.05 and res.ci["phi"][0] <= 0.459 <= res.ci["phi"][1]


def test_fit_cache_returns_the_same_fit_and_refits_what_changed(grid, tmp_path, monkeypatch):
    """With $LOOPED_FIT_CACHE set, a second fit of the same runs with the same arguments is read
    back instead of solved; other runs, other arguments or a torn cache file are fitted afresh;
    without the variable nothing is written."""
    df = paper.synthetic_runs(seed=7, grid=grid)
    plain = F.fit(df, restarts=8, seed=0, bootstrap=4)
    assert not any(tmp_path.iterdir())
    monkeypatch.setenv(F.CACHE_ENV, str(tmp_path / "cache"))
    first = F.fit(df, restarts=8, seed=0, bootstrap=4)
    assert len(list((tmp_path / "cache").glob("*.pkl"))) == 1
    assert first.theta == plain.theta and first.ci == plain.ci
    solves = []
    real = F.solve_restarts
    monkeypatch.setattr(F, "solve_restarts", lambda *a, **k: solves.append(1) or real(*a, **k))
    again = F.fit(df, restarts=8, seed=0, bootstrap=4)
    assert solves == [] and again.theta == first.theta and again.ci == first.ci
    F.fit(df, restarts=8, seed=1, bootstrap=4)                       # another seed
    F.fit(df.assign(loss=df.loss * 1.001), restarts=8, seed=0, bootstrap=4)  # other losses
    assert len(solves) >= 2 and len(list((tmp_path / "cache").glob("*.pkl"))) == 3
    for path in (tmp_path / "cache").glob("*.pkl"):
        path.write_bytes(b"torn")
    solves.clear()
    assert F.fit(df, restarts=8, seed=0, bootstrap=4).theta == first.theta and solves
