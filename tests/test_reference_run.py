"""The reference run (issue 51): a committed record a fresh clone can retrain and check.

`make reference` (`python -m looped.studies.sweep.reference`) retrains runs/reference/'s run with the
command its README gives and compares the loss with the committed one; the slow test does
exactly that (about a minute on a quiet 2-core machine: `pytest -m slow tests/test_reference_run.py`)."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from looped.studies.sweep import reference

REPO = Path(__file__).resolve().parents[1]
RECORD = json.loads((REPO / reference.RECORD).read_text())


def test_the_committed_record_is_the_command_it_names():
    """The record was trained with the reference's options, eagerly, on one thread, and the
    README of runs/reference gives the command, the tolerance and `make reference`."""
    assert RECORD["status"] == "ok" and RECORD["study"] == "reference"
    assert {k: RECORD["train"][k] for k in reference.OPTIONS} == reference.OPTIONS
    assert RECORD["compile"] is False and RECORD["device"].endswith("(x86_64, 1 threads)")
    assert RECORD["data"]["dataset"] == "shakespeare-bpe1024-T128"
    readme = (REPO / "runs" / "reference" / "README.md").read_text()
    assert reference.COMMAND in readme and "make reference" in readme
    assert f"{reference.TOLERANCE} nats" in readme and f"{RECORD['loss']:.6f}" in readme
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^reference: venv.*\n\t\$\(PY\) -m looped\.studies\.sweep\.reference$", makefile, re.M)


def test_the_comparison_says_how_close_a_rerun_came():
    same = copy.deepcopy(RECORD)
    assert reference.compare(same, RECORD) == (True, f"reference run: loss {RECORD['loss']:.6f}, committed "
                                                     f"{RECORD['loss']:.6f}: identical to the last bit")
    near = copy.deepcopy(RECORD)
    near["loss"] += 0.007
    near["train_loss_curve"][5][1] += 0.001
    ok, line = reference.compare(near, RECORD)
    step = RECORD["train_loss_curve"][5][0]
    assert ok and line.endswith(f"0.0070 nats apart, within the tolerance of 0.02 nats (the training curves part "
                                f"at step {step})")
    far = copy.deepcopy(RECORD)
    far["loss"] -= 0.05
    far["data"] = {**far["data"], "digest": "other"}
    ok, line = reference.compare(far, RECORD)
    assert not ok and "0.0500 nats apart, OUTSIDE the tolerance of 0.02 nats" in line
    assert "the dataset differs from the one the record names (digest other vs" in line


@pytest.mark.slow
def test_a_rerun_matches_the_committed_record(tmp_path, capsys):
    """Retrained in a fresh process, with its own copy of the dataset: within the tolerance (and,
    on the machine that wrote the record, identical to the last bit)."""
    assert reference.main(["--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"retraining into a temporary folder: {reference.RUN}\n")
    assert re.search(r"^reference run: loss \d\.\d{6}, committed \d\.\d{6}: (identical to the last bit|[\d.]+ nats "
                     r"apart, within the tolerance)", out, re.M), out


def test_the_readme_points_to_the_reference_run():
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "`make reference` retrains it" in readme and f"passes within {reference.TOLERANCE} nats" in readme
    assert "spread over 0.0077 nats" in readme
    assert "span 0.0077 nats" in " ".join((REPO / "runs" / "reference" / "README.md").read_text().split())
