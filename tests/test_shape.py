"""Is r^phi the right shape?  The law's mappings of r (looped.mapping), `fit(..., mapping=)`, `looped fit
--mapping`, and the held-out-r tests of `looped shape` (looped.studies.shape): on runs drawn from each
mapping, the right one wins its own test; the committed results rerun in small."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from looped import fit_cli
from looped.fit import FitError, at_bounds, fit
from looped.mapping import MAPPINGS, Mapping
from looped.solver import RunArrays, law_loss, objective
from looped.studies import shape

LAW = dict(A=30.0, alpha=0.25, B=400.0, beta=0.3, E=1.8)
TRUE = {"power": {"phi": 0.5}, "linear": {"phi": 1.0}, "bounded": {"k1": 2.0, "k2": 1.5},
        "free": {"phi_2": 0.9, "phi_4": 0.3, "phi_8": 0.6}}


def _design(r_values=(1, 2, 4, 8), budgets=(1e15, 4e15, 1.6e16)):
    """Iso-depth runs: 4 prelude/coda-like blocks run once, 16 / r looped layers run r times, five widths."""
    rows = []
    for budget in budgets:
        for r in r_values:
            for d in (128, 192, 256, 384, 512):
                block = 12.0 * d * d
                n_once, n_rec = (20 * block, 0.0) if r == 1 else (4 * block, 16 / r * block)
                rows.append(dict(budget=budget, r=r, n_once=n_once, n_rec=n_rec, tokens=budget / (6 * 20 * block)))
    return pd.DataFrame(rows)


def _runs(mapping, noise=0.002, seed=0, **kw):
    """Losses from the law with `mapping` at its TRUE parameters, plus white noise in log loss."""
    df = _design(**kw)
    mp = Mapping.of(mapping, df.r)
    theta = np.r_[math.log(LAW["A"]), LAW["alpha"], math.log(LAW["B"]), LAW["beta"], math.log(LAW["E"]),
                  mp.to_coordinates([TRUE[mapping][n] for n in mp.names])]
    clean = law_loss(theta, mp.design(RunArrays.from_frame(df.assign(loss=1.0))))
    return df.assign(loss=clean * np.exp(np.random.default_rng(seed).normal(0, noise, len(df))))


@pytest.mark.parametrize("name", MAPPINGS)
def test_each_mappings_objective_has_exact_derivatives(name):
    df = _runs("power")
    mp = Mapping.of(name, df.r)
    data = mp.design(RunArrays.from_frame(df))
    th = np.r_[3.0, 0.3, 6.0, 0.3, 0.5, np.linspace(-0.4, 0.8, len(mp.names))][None, :]
    f, g, H = objective(th, data, order=2, delta=10.0)      # every residual inside Huber's quadratic part
    eps, p = 1e-6, th.shape[1]
    step = [eps * np.eye(p)[i] for i in range(p)]
    g_num = [(objective(th + s, data, order=0, delta=10.0) - objective(th - s, data, order=0, delta=10.0))[0]
             / (2 * eps) for s in step]
    H_num = [(objective(th + s, data, delta=10.0)[1] - objective(th - s, data, delta=10.0)[1])[0] / (2 * eps)
             for s in step]
    assert np.allclose(g[0], g_num, rtol=1e-6, atol=1e-9 * np.abs(g_num).max())
    assert np.allclose(H[0], H_num, rtol=1e-5, atol=1e-7 * np.abs(H_num).max())


def test_the_mappings_multipliers_and_phi_equivalents():
    r = np.array([1.0, 2.0, 4.0, 8.0])
    power, linear = Mapping.of("power"), Mapping.of("linear")
    assert np.allclose(power.phi_equivalent(r[1:], [0.46]), 0.46) and linear.fixed == {5: 1.0}
    bounded = Mapping.of("bounded")
    c = bounded.to_coordinates([2.0, 1.5])
    assert np.allclose(bounded.natural(c), [2.0, 1.5])
    assert np.allclose(np.exp(bounded.log_multiplier(r, c)), 1 + 2.0 * (1 - np.exp(-(r - 1) / 1.5)))
    free = Mapping.of("free", [1, 2, 2, 8])
    assert free.names == ("phi_2", "phi_8") and free.n_free == 2
    assert np.allclose(free.phi_equivalent([2.0, 8.0], [0.3, 0.7]), [0.3, 0.7])
    assert np.isnan(free.log_multiplier([4.0], [0.3, 0.7])).all()          # no phi for an r it never saw
    with pytest.raises(FitError, match="unknown mapping"):
        Mapping.of("cubic")


def test_the_power_mapping_is_the_papers_fit_and_linear_is_phi_one():
    df = _runs("power")
    plain, power = fit(df, restarts=30), fit(df, restarts=30, mapping="power")
    assert power.theta == plain.theta and power.mapping_params == {"phi": plain.phi}
    linear, fixed = fit(df, restarts=30, mapping="linear"), fit(df, restarts=30, fix={"phi": 1.0})
    assert linear.huber == pytest.approx(fixed.huber, rel=1e-9) and linear.fixed == {"phi": 1.0}
    with pytest.raises(FitError, match="cannot be fixed"):
        fit(df, restarts=5, mapping="bounded", fix={"phi": 0.5})


@pytest.mark.parametrize("name", ["bounded", "free"])
def test_a_mapping_recovers_its_own_parameters(name):
    df = _runs(name, noise=0.0005)
    res = fit(df, restarts=60, mapping=name, bootstrap=8, boot_restarts=2)
    for p, v in TRUE[name].items():
        assert res.mapping_params[p] == pytest.approx(v, rel=0.1, abs=0.03), (p, res.mapping_params)
    assert res.phi is None and not at_bounds(res) and set(TRUE[name]) <= set(res.ci)
    assert np.allclose(res.predict(df), df.loss, rtol=3e-3)
    with pytest.raises(FitError, match="no r\\^phi law"):
        res.law


@pytest.mark.parametrize("truth", ["power", "linear", "bounded"])
def test_the_right_mapping_wins_its_own_held_out_test(truth):
    """Fitted to r <= 4 of runs drawn from one mapping, that mapping predicts r = 8 best of the three that
    can price an unseen r, and the free mapping's held-out r given its own phi is about as good (its
    other parameters come from the training runs, with one phi more per r, so it is not an exact floor)."""
    df = _runs(truth)
    s = dict(restarts=40, bootstrap=8, boot_restarts=2, oracle_restarts=3)
    rows, phis = shape.heldout(df, (8.0,), s)
    rmse = {row["mapping"]: row["rmse"] for row in rows}
    assert min(shape.PRICED, key=rmse.get) == truth, rmse
    assert rmse["free"] <= rmse[truth] * 1.25
    assert {p["mapping"] for p in phis} == set(MAPPINGS) and all(p["r"] == 8.0 for p in phis)


def test_the_free_mapping_wins_its_own_test_by_information_criterion():
    """Runs with one multiplier per r that no smooth mapping follows: the free mapping has the lowest AICc."""
    rows, phis = shape.in_sample(_runs("free"), dict(restarts=40, bootstrap=8, boot_restarts=2))
    aicc = {row["mapping"]: row["aicc"] for row in rows}
    assert min(aicc, key=aicc.get) == "free"
    free = {p["r"]: p for p in phis if p["mapping"] == "free"}
    assert all(free[float(r[4:])]["lo"] <= v <= free[float(r[4:])]["hi"] for r, v in TRUE["free"].items())


def test_splits_leave_each_looped_r_out_and_extrapolate_past_half_the_largest():
    assert shape.splits([1, 2, 4, 8]) == [("r = 2", (2.0,), False), ("r = 4", (4.0,), False), ("r = 8", (8.0,), True)]
    grid = shape.splits([1, 2, 3, 4, 6, 8, 12])
    assert grid[-1] == ("r >= 8", (8.0, 12.0), True) and len(grid) == 7 and sum(s[2] for s in grid) == 1
    assert shape.splits([1, 2]) == [] and shape.splits([1, 2, 4]) == []


def test_looped_fit_mapping_prints_the_phi_equivalents(tmp_path, capsys):
    path = tmp_path / "runs.csv"
    _runs("bounded").to_csv(path, index=False)
    out = tmp_path / "fit.json"
    assert fit_cli.main([str(path), "--mapping", "bounded", "--restarts", "30", "--bootstrap", "4",
                         "--boot-restarts", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "mapping bounded" in text and "k1" in text and "phi-equivalent (r^phi = m(r)): r=2 " in text
    saved = json.loads(out.read_text())
    assert saved["mapping"] == "bounded" and set(saved["mapping_params"]) == {"k1", "k2"}
    assert set(saved["phi_equivalent"]) == {"2", "4", "8"} and "lo" in saved["phi_equivalent"]["8"]
    assert fit_cli.main([str(path), "--mapping", "bounded", "--fix", "phi=0.5", "--restarts", "5"]) == 2
    assert "cannot be fixed" in capsys.readouterr().err


def test_the_committed_results_cover_every_run_set_and_rerun_in_small(tmp_path):
    from looped.studies.sweep.registry import DEFAULT_FAMILY, FAMILIES
    committed, main = shape.read_results(), FAMILIES[DEFAULT_FAMILY]["main"]
    assert set(committed["regime"].set) == set(shape.family_sets(DEFAULT_FAMILY))
    held = committed["heldout"]
    assert set(held.set) == {s for s, r in committed["regime"].set_index("set").r_levels.items() if len(r) >= 4}
    assert (held.rmse_lo <= held.rmse_hi).all() and (held.gain_lo <= held.gain_hi).all()
    assert set(committed["in_sample"].mapping) == set(MAPPINGS)
    out = tmp_path / "quick.json"
    assert shape.main(["--quick", "--sets", main, "--out", str(out)]) == 0
    quick = shape.read_results(out)
    mine, theirs = (r["in_sample"].set_index(["set", "mapping"]).loc[main] for r in (quick, committed))
    assert np.allclose(mine.rmse, theirs.rmse, rtol=0.02)
    assert list(quick["heldout"].split.unique()) == ["r = 2", "r = 4", "r = 8"]
