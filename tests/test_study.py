"""looped.studies.sweep.study.Study: a named study's grid, resolved preset and folder as one value; its
tables read the same records from any working directory."""
from __future__ import annotations

import os
import warnings

import pandas as pd
import pytest

from looped.config import PRESETS, REPO
from looped.fit import load_runs
from looped.studies.sweep.iso_flop import main_design
from looped.studies.sweep.registry import SweepError, load_study
from looped.studies.sweep.study import Study


def test_a_named_study_carries_its_grid_preset_and_folder():
    s = Study("cpu-main")
    assert s.runs == tuple(load_study("cpu-main")) and s.preset is PRESETS["prose"]
    assert s.folder == REPO / "runs" / "cpu-main"
    assert len(s.plan()) == len(s.runs) and {"run_flops", "tokens_per_param"} <= set(s.plan().columns)


def test_a_missing_folder_has_no_records(tmp_path):
    s = Study("cpu-main", tmp_path / "not-yet")
    assert s.records().empty and list(s.records().columns)[:3] == ["run_id", "study", "status"]
    assert s.records(ok=True).empty and s.fit_table().empty
    assert (s.table().status == "missing").all() and len(s.table()) == len(s.runs)
    with pytest.raises(SweepError, match="no grid"):
        Study.at(tmp_path / "not-yet").plan()  # a folder that is no named study has no grid


def test_a_relative_folder_is_read_from_the_repository_at_any_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Study.at("runs/cpu-main")
    assert os.getcwd() == str(tmp_path) and s.folder == REPO / "runs" / "cpu-main" and s.name == "cpu-main"
    assert len(s.records()) == len(Study("cpu-main").records()) > 0


def test_the_fit_table_is_the_fitters_main_design():
    ours = Study("cpu-main").fit_table()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (unfinished runs are dropped with a warning)
        theirs, _ = main_design(load_runs(REPO / "runs" / "cpu-main"))
    pd.testing.assert_frame_equal(ours, theirs)
    assert len(Study("cpu-main").fit_table(main_design=False)) >= len(ours)


def test_every_table_of_a_folder_is_a_view_of_the_one_reader():
    """`looped.records.runs_table` is the one folder -> table reader: the study table is its rows in
    `COLUMNS`, the fitter's table its rows cast and checked (`validate_runs`), and `load_arms` reads
    each arm's folder through `Study.fit_table`."""
    from looped import records
    from looped.fit import validate_runs
    from looped.studies.case_studies.paired import load_arms
    s = Study("cpu-main")
    one = records.runs_table(s.folder)
    assert len(one) == len(list(s.folder.glob("*.json")))   # one row per record
    pd.testing.assert_frame_equal(s.records(), records.study_columns(one))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (unfinished runs are dropped with a warning)
        fitted = validate_runs(one, str(s.folder))
    pd.testing.assert_frame_equal(s.fit_table(main_design=False), fitted)
    assert list(s.fit_table(main_design=False).file) == list(one.file[one.status == "ok"])
    arms = load_arms()
    assert sum(map(len, arms.values())) > len(s.fit_table(main_design=False))


def test_gpu_costs_sum_each_studys_plan_and_size_its_longest_runs_shards():
    """The chapter's cost table of the GPU studies: hours at the assumed MFU as `Study.cost`
    totals them, days on one GPU and on a node, and 2 bytes on disk per token of the longest run."""
    from looped.studies.sweep.study import gpu_costs
    table = gpu_costs(["gpu-main", "paper-main"], peak_flops=1e15, mfu=0.5).set_index("study")
    for name in ("gpu-main", "paper-main"):
        plan = Study(name).plan()
        row = table.loc[name]
        assert row.runs == len(plan)
        assert row.gpu_hours == pytest.approx(plan.run_flops.sum() / 0.5e15 / 3600)
        assert row.days_1gpu == pytest.approx(row.gpu_hours / 24)
        assert row.days_8gpu == pytest.approx(row.gpu_hours / 8 / 24)
        assert row.shards_GB == pytest.approx(2 * plan.tokens.max() / 1e9)


def test_every_table_types_its_numbers_by_one_policy():
    """`looped.records.cast` is the one type policy: the study table's finished runs, the fitter's
    table and the main design give a column one dtype (counts integers, measurements floats)."""
    from looped import records
    s = Study("cpu-main")
    tables = {"records(ok)": s.records(ok=True), "fit_table(all)": s.fit_table(main_design=False),
              "fit_table": s.fit_table()}
    for name, table in tables.items():
        assert table["r"].dtype.kind == "i" and table["seed"].dtype.kind == "i", name
        for col in ("loss", "budget", "s", "tokens"):
            assert table[col].dtype.kind == "f", (name, col)
    mixed = records.cast(pd.DataFrame({"r": ["2", 4.0], "d_model": [64, None], "steps": [10, 10.5],
                                       "loss": ["3.5", "x"], "injection": ["linear", "none"]}))
    assert mixed["r"].tolist() == [2, 4] and mixed["r"].dtype.kind == "i"
    assert mixed["d_model"].dtype.kind == "f" and mixed["steps"].dtype.kind == "f"   # a gap, a fraction
    assert mixed["loss"].iloc[0] == 3.5 and pd.isna(mixed["loss"].iloc[1])
    assert mixed["injection"].tolist() == ["linear", "none"]   # text left as it is


def test_an_analysis_names_the_columns_it_needs():
    from looped.fit import FitError, validate_runs
    runs = Study("cpu-main").fit_table()
    assert len(validate_runs(runs, need=("budget", "s"))) == len(runs)
    with pytest.raises(FitError, match="^runs: missing column.s. budget$"):
        validate_runs(runs.drop(columns="budget"), need=("budget",))
