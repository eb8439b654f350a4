"""looped.studies.sweep.pilot and looped.studies.phi.targets: the pilot checks (iso-FLOP optima, tokens per
parameter), the LR sweep, the seed spread and the scorecard, on synthetic records written where the
sweep would write them."""
from __future__ import annotations

import math

import pytest

from looped.io import atomic_write_json
from looped.report import formatting, tables
from looped.studies.phi.targets import leave_one_r_out, rerun_targets
from looped.studies.sweep import cost, pilot, registry
from looped.studies.sweep.iso_flop import main_design
from looped.studies.sweep.study import Study


def write(folder, run, loss, **extra):
    cfg = run.model_config()
    from looped import accounting
    s = accounting.summary(cfg, run.budget, run.tokens_per_step)
    atomic_write_json(folder / f"{run.run_id}.json", {
        "run_id": run.run_id, "study": run.study, "status": "ok", "budget": run.budget, "r": run.r, "s": run.s,
        "injection": run.injection, "bptt_k": cfg.k_bwd, "d_model": cfg.d_model, "n": s["n"], "n_once": s["n_once"],
        "n_rec": s["n_rec"], "flops_per_token": s["flops_per_token"], "tokens": s["tokens"], "steps": s["steps"],
        "loss": loss, "lr_scale": run.lr_scale, "seed": run.seed, **extra})


def test_pilot_optima_bracket_and_tokens_per_param(tmp_path):
    runs = registry.load_study("prose-pilot")
    for run in runs:  # a parabola in log N with its vertex at the middle of each cell's widths
        cell = [x for x in runs if x.budget == run.budget and x.r == run.r]
        logs = [math.log(x.model_config().d_model) for x in cell]
        mid = (min(logs) + max(logs)) / 2
        write(tmp_path, run, 4.0 + (math.log(run.model_config().d_model) - mid) ** 2)
    table = pilot.pilot_optima("prose-pilot", tmp_path)
    assert len(table) == 4 and table.fitted.all() and table.inside.all()
    assert (table.finished == 4).all()
    assert (table.tokens_per_param > 1).all()
    by = table.set_index(["budget", "r"]).tokens_per_param  # a wider vertex at 4x the compute
    for r in (1, 8):
        assert 1 < by[(1e13, r)] / by[(2.5e12, r)] < 4
    # a cell whose losses fall monotonically with width has no interior minimum
    for run in runs:
        if run.budget == 2.5e12 and run.r == 1:
            write(tmp_path, run, 6.0 - 0.1 * run.s)
    table = pilot.pilot_optima("prose-pilot", tmp_path).set_index(["budget", "r"])
    assert not table.loc[(2.5e12, 1), "inside"] and table.loc[(1e13, 1), "inside"]


def test_lr_sweep_finds_the_best_multiplier(tmp_path):
    for run in registry.load_study("prose-lr"):
        write(tmp_path, run, 4.0 + 0.1 * math.log2(run.lr_scale / (1.4 if run.r == 1 else 1.0)) ** 2)
    table = pilot.lr_sweep("prose-lr", tmp_path).set_index("r")
    assert table.loc[1, "best_multiplier"] == 1.4 and table.loc[4, "best_multiplier"] == 1.0
    assert table.loc[4, "transfer_ok"] and not table.loc[1, "transfer_ok"]
    assert table.loc[1, "gap_at_1"] == pytest.approx(0.1 * math.log2(1 / 1.4) ** 2)


def test_seed_spread(tmp_path):
    losses = {42: 4.00, 43: 4.02, 44: 4.01}
    for run in registry.load_study("prose-seeds"):
        write(tmp_path, run, losses[run.seed] + run.r)
    table = pilot.seed_spread("prose-seeds", tmp_path)
    assert list(table.r) == [1, 8] and (table.seeds == 3).all()
    assert table["range"].tolist() == pytest.approx([0.02, 0.02])
    assert table["std"].tolist() == pytest.approx([0.01, 0.01])


def test_empty_studies_give_empty_tables(tmp_path):
    assert pilot.lr_sweep("prose-lr", tmp_path / "none").empty
    assert pilot.seed_spread("prose-seeds", tmp_path / "none").empty
    assert not pilot.pilot_optima("prose-pilot", tmp_path / "none").fitted.any()


def test_grid_batch_column_names_and_trains_the_run():
    runs = [run for run in registry.load_study("prose-batch") if run.batch_tokens]
    assert len(runs) == 8 and all(run.batch_tokens == 4096 and run.run_id.endswith("_b4096") for run in runs)
    tc = runs[0].train_config()
    assert tc.batch_tokens == 4096 and tc.lr_scale == 0.5 ** 0.558
    from looped.train import run_id
    assert run_id(tc) == runs[0].run_id
    plan = cost.plan(runs, peak_flops=1e9, mfu=0.5)
    assert (plan.tokens / plan.steps == 4096).all()


def test_batch_comparison_pairs_the_two_batch_sizes(tmp_path):
    runs = registry.load_study("prose-batch")
    for run in runs:
        write(tmp_path, run, 4.0 + run.s / 100 + (0.05 if run.tokens_per_step == 4096 else 0.0),
              batch_tokens=run.tokens_per_step)
    table = pilot.batch_comparison("prose-batch", tmp_path)
    assert len(table) == 8 and (table.budget == 3e12).all()
    assert list(table.columns[-3:]) == ["loss at 2,048", "loss at 4,096", "4,096 minus 2,048"]
    assert table["4,096 minus 2,048"].tolist() == pytest.approx([0.05] * 8)
    assert pilot.batch_comparison("prose-batch", tmp_path / "none").empty


def test_grid_shape_and_the_main_study_meets_the_design_rules():
    """The committed cpu-main grid: >= 4 budgets over >= 10x, >= 4 widths of d >= 16 (two heads
    of 8) per budget, all four r, >= 64 runs; case studies on the lower two budgets."""
    shape = pilot.grid_shape("cpu-main")
    assert len(shape) >= 4 and shape.budget.max() / shape.budget.min() >= 10
    assert shape.runs.sum() >= 64 and (shape.r == "1, 2, 4, 8").all()
    for widths in shape.widths:
        d = [int(x) for x in widths.split(", ")]
        assert len(d) >= 4 and min(d) >= 16 and all(x % 8 == 0 for x in d)
    for study in ("cpu-truncated", "cpu-hyper"):
        case = pilot.grid_shape(study)
        assert list(case.budget) == list(shape.budget[:2]) and (case.r == "2, 4, 8").all()


def test_no_prose_run_reads_more_than_80_percent_of_the_training_split():
    """Runs never repeat data: the longest run of every prose study stays within 80% of the
    packed training tokens that `looped data prepare --preset prose` recorded."""
    import json

    from looped import accounting
    from looped.config import REPO
    train = json.loads((REPO / "runs" / "prose-corpus.json").read_text())["splits"]["train"]["tokens"]
    for study in ("cpu-main", "cpu-truncated", "cpu-hyper", "prose-pilot", "prose-lr", "prose-seeds",
                  "prose-batch"):
        for run in registry.load_study(study):
            tokens = accounting.summary(run.model_config(), run.budget, run.tokens_per_step)["tokens"]
            assert tokens <= 0.8 * train, (study, run.run_id, tokens / train)


def _law_loss(run, phi=0.5):
    """A Chinchilla-like law whose iso-FLOP minima fall inside every cell of the prose grid."""
    from looped import accounting
    s = accounting.summary(run.model_config(), run.budget, run.tokens_per_step)
    n_eff = s["n_once"] + run.r ** phi * s["n_rec"]
    return 2.0 + 60.0 * n_eff ** -0.35 + 100.0 * s["tokens"] ** -0.3


def test_rerun_targets_report_hits_and_misses(tmp_path):
    """On runs that follow the law exactly every target is met; a failed run, a cell whose loss
    falls monotonically with width and noisy losses are each reported as misses."""
    from looped.fit import fit
    from looped.studies.phi import estimates as phi_fits
    runs = registry.load_study("cpu-main")
    for run in runs:
        write(tmp_path, run, _law_loss(run))
    table = Study("cpu-main", tmp_path).table()
    kept, _ = main_design(table)
    joint = fit(kept, restarts=20, seed=0, bootstrap=20, boot_restarts=4)
    halves = phi_fits.half_fits(kept, restarts=20, seed=0, bootstrap=20)
    targets = rerun_targets(table, joint, halves, seed_std=0.01).set_index("target")
    assert len(targets) == 7 and targets.met.all(), targets
    assert joint.phi == pytest.approx(0.5, abs=0.02)
    # a failed run, and the narrowest model of one cell made the best: two misses
    first = [r for r in runs if r.budget == 2.5e12 and r.r == 1]
    atomic_write_json(tmp_path / f"{runs[-1].run_id}.json", {"run_id": runs[-1].run_id, "status": "failed"})
    write(tmp_path, first[0], 3.0)
    table = Study("cpu-main", tmp_path).table()
    targets = rerun_targets(table, joint, halves, seed_std=0.01).set_index("target")
    assert not targets.loc["runs finished without divergence or failure", "met"]
    assert "1 diverged or failed" in targets.loc["runs finished without divergence or failure", "measured"]
    assert not targets.loc["(budget, r) cells that bracket their minimum", "met"]
    # residuals larger than three seed spreads and 0.03 nats miss both residual targets
    noisy = fit(kept.assign(loss=kept.loss + 0.08 * (-1.0) ** kept.index.to_numpy()), restarts=20, seed=0)
    targets = rerun_targets(table, noisy, None, seed_std=0.01).set_index("target")
    assert not targets.loc["residual RMSE (nats)", "met"] and not targets.loc["residual RMSE / seed noise (std)", "met"]
    # before a fit exists only the run and cell counts are reported
    assert len(rerun_targets(table, None)) == 2


def test_scale_comparison_reads_both_grids_and_presets():
    """The scale table: ranges from the two studies' grids, single values from the presets, and
    the paper-over-ours factor of their geometric means."""
    table = tables.scale_comparison().set_index("quantity")
    assert table.loc["context length T", "paper"] == "2,048" and table.loc["context length T", "ours"] == "128"
    assert table.loc["context length T", "paper / ours"] == 16.0
    assert table.loc["head dimension", "ours"] == "8" and table.loc["effective depth (layers)", "paper / ours"] == 2.0
    shape = pilot.grid_shape("cpu-main")
    budgets = [shape.budget.min(), shape.budget.max()]
    assert table.loc["training budget (FLOPs)", "ours"] == " to ".join(formatting.power_of_ten(b) for b in budgets)
    assert table.loc["unique non-embedding parameters", "ours"].endswith("k")   # engineering notation, no 1e+05
    assert table.loc["training budget (FLOPs)", "paper / ours"] == pytest.approx(
        (4.64e17 * 2.15e19) ** 0.5 / (budgets[0] * budgets[1]) ** 0.5, rel=1e-3)


def test_leave_one_r_out_finds_the_architecture_that_misfits():
    """Runs from a law, with r = 2 made worse by 0.05 nats: only the fit without r = 2 is exact."""
    from looped.studies.paper import paper_grid, synthetic_runs
    runs = synthetic_runs(noise=0.0, grid=paper_grid())
    runs.loc[runs.r == 2, "loss"] += 0.05
    table = leave_one_r_out(runs, restarts=20).set_index("fit")
    assert list(table.index) == ["all runs", "without r = 2", "without r = 4", "without r = 8"]
    assert table.loc["without r = 2", "rmse"] < 1e-3 < table.loc["without r = 4", "rmse"]
    assert table.loc["without r = 2", "runs"] == (runs.r != 2).sum()
    assert table.loc["without r = 2", "phi"] == pytest.approx(0.459, abs=0.01)
