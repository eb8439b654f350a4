"""The README's numbers come from the code: its GPU-cost table is recomputed from the studies'
accounting (`looped.studies.sweep.study.Study.cost`) at the spec peaks and MFUs its header names."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from looped.memory import GPU_SPECS
from looped.studies.sweep.study import Study

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
ROWS = re.findall(r"^\| `([\w-]+)` \| (\d+) \| ([\d.e]+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \|$", README, re.M)


def test_the_cost_table_is_there():
    assert {r[0] for r in ROWS} >= {"gpu-main", "gpu-truncated", "gpu-hyper", "paper-main", "paper-truncated",
                                    "paper-hyper"}


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_each_cost_row_is_the_accounting(row):
    study, runs, flops, h35, h50, a100 = row
    total = Study(study).cost(GPU_SPECS["H200"][0], 0.35).iloc[-1]
    assert int(runs) == total.runs and float(flops) == pytest.approx(total.flops, rel=5e-3)
    for text, peak, mfu in ((h35, GPU_SPECS["H200"][0], 0.35), (h50, GPU_SPECS["H200"][0], 0.5),
                            (a100, GPU_SPECS["A100"][0], 0.35)):
        hours = Study(study).cost(peak, mfu).iloc[-1].gpu_hours
        assert int(text.replace(",", "")) == round(hours), (study, text, hours)


def test_the_totals_in_the_text():
    hours = {s: Study(s).cost(GPU_SPECS["H200"][0], 0.35).iloc[-1].gpu_hours
             for s in ("gpu-main", "gpu-truncated", "gpu-hyper", "paper-main", "paper-truncated", "paper-hyper")}
    one_gpu = hours["gpu-main"] + hours["gpu-truncated"] + hours["gpu-hyper"]
    paper = hours["paper-main"] + hours["paper-truncated"] + hours["paper-hyper"]
    assert f"about {one_gpu:.0f} H200-hours" in README
    assert f"about {paper:.0f} H200-hours, some {paper / 24:.0f} days on" in README
    assert f"or {paper / 8 / 24:.1f} days on an 8-GPU node" in README


def test_the_studies_table_counts_the_registered_runs():
    """Each CPU study's run count in the README's studies table is its grid's."""
    from looped.studies.sweep.registry import load_study
    rows = {m[0]: m[1] for m in re.findall(r"^\| `([\w-]+)`[^|]* \| `prose` \| (.*) \|$", README, re.M)}
    n = {s: len(load_study(s)) for s in ("cpu-main", "cpu-truncated", "cpu-hyper", "cpu-controls", "cpu-matched",
                                         "cpu-replicates", "cpu-drift")}
    assert f"{n['cpu-main']} runs" in rows["cpu-main"]
    assert n["cpu-truncated"] == n["cpu-hyper"] and f"{n['cpu-hyper']} runs each" in rows["cpu-truncated"]
    assert f"({n['cpu-controls']} runs)" in rows["cpu-controls"] and f"({n['cpu-matched']})" in rows["cpu-controls"]
    assert f"({n['cpu-replicates']} runs)" in rows["cpu-replicates"] and f"({n['cpu-drift']} runs" in rows["cpu-drift"]
