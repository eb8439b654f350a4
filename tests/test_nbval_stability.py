"""The nbval checks hold on any machine: a checked cell's output must not move when its inputs move
by a rounding error, nor when torch runs its plain (non-vectorised) CPU kernels.

Another CPU picks another BLAS kernel and another summation order.  `make test-nbval-perturbed`
reproduces that on one machine (OpenBLAS's kernels chosen by OPENBLAS_CORETYPE, torch's plain
kernels, one thread, an empty fit cache); here the property is also tested directly:

* every chapter is replayed (tests/nbval_replay.py: its code cells in order, default parameters)
  with each measured loss that enters it multiplied by (1 + 1e-12 u), u ~ U(-1, 1), for several
  seeds, and the text of every cell tagged ``nbval-check-output`` must equal the committed
  reference notebook, sanitized as nbval sanitizes it;
* the chapters' torch-side checked cells are replayed once with ``ATEN_CPU_CAPABILITY=default``.

Both are slow (whole chapters, fits with bootstrap): ``pytest -m slow tests/test_nbval_stability.py``.
The fast tests below cover `looped.report.checks`.  tests/README.md lists which outputs are exact and
which are tolerance-checked.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from looped.report import checks

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbval_replay  # noqa: E402

JITTER_SEEDS = (1, 2, 3)
JITTERED = ("02_sweep", "03_fit", "03_our_phi", "03_phi_limits", "05_truncation", "06_hyperconnections",
            "07_what_phi_buys")
TORCH_CELLS = {"01_architecture": None,      # chapter 1: live models throughout (whole chapter)
               "05_truncation": 5,          # code cells 0-5: the truncation check on a live model
               "06_hyperconnections": 5}    # code cells 0-5: the hyperconnection init check


# --- looped.report.checks ------------------------------------------------------------------------------

def test_near_prints_the_reference_not_the_value():
    a = checks.near("phi", 0.4391, 0.439, 0.01)
    b = checks.near("phi", 0.4309, 0.439, 0.01)
    assert a == b == "phi  within 0.01 of the reference 0.439"


def test_near_raises_outside_the_tolerance():
    with pytest.raises(AssertionError, match=r"phi = 0.451 is not within 0.01 of the reference 0.439"):
        checks.near("phi", 0.451, 0.439, 0.01)
    for bad in (float("nan"), float("inf"), None, "x"):
        with pytest.raises(AssertionError):
            checks.near("phi", bad, 0.439, 0.01)


def test_relative_tolerance():
    assert checks.near("A", 104.9, 100.0, "5%") == "A  within 5% of the reference 100"
    with pytest.raises(AssertionError):
        checks.near("A", 105.1, 100.0, "5%")
    with pytest.raises(AssertionError):
        checks.near("A", -100.0, -95.0, "5%")      # |ref| * 5% = 4.75 < 5
    with pytest.raises(ValueError):
        checks.near("A", 1.0, 1.0, "5")


def test_compare_aligns_names_and_lists_every_mismatch():
    ref = {"phi": (0.439, 0.01), "R^2": (0.9993, 1e-4), "runs": (24, 0)}
    assert checks.compare({"phi": 0.44, "R^2": 0.99935, "runs": 24}, ref).splitlines() == [
        "phi   within 0.01 of the reference 0.439",
        "R^2   within 0.0001 of the reference 0.9993",
        "runs  within 0 of the reference 24"]
    with pytest.raises(AssertionError) as e:
        checks.compare({"phi": 0.5, "R^2": 0.99, "runs": 24}, ref)
    assert "phi = 0.5 " in str(e.value) and "R^2 = 0.99 " in str(e.value)
    with pytest.raises(KeyError):
        checks.compare({"phi": 0.44}, ref)


def test_inactive_checks_report_the_value_and_never_raise():
    assert checks.near("phi", 0.9, 0.439, 0.01, active=False) == "phi  0.9 (no reference for these parameters)"


# --- the chapters -------------------------------------------------------------------------------

def _replay(chapter: str, tmp_path: Path, *args: str, env: dict | None = None) -> list[str]:
    out = tmp_path / f"{chapter}.json"
    cmd = [sys.executable, str(ROOT / "tests" / "nbval_replay.py"), chapter, "--out", str(out), *args]
    environ = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=environ, cwd=ROOT, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def _assert_same(chapter: str, got: list[str], what: str) -> None:
    want = nbval_replay.reference(chapter)
    assert got, f"{chapter}: no checked cell ran"
    assert len(got) <= len(want), f"{chapter}: more checked cells than the reference has (stale notebook?)"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"{chapter}, checked cell {i}, {what}: output differs from the reference\n" \
                       f"--- reference\n{w}\n--- {what}\n{g}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", JITTER_SEEDS)
@pytest.mark.parametrize("chapter", JITTERED)
def test_checked_output_survives_loss_jitter(chapter, seed, tmp_path):
    got = _replay(chapter, tmp_path, "--jitter", str(seed))
    assert len(got) == len(nbval_replay.reference(chapter))
    _assert_same(chapter, got, f"losses jittered by 1e-12 (seed {seed})")


@pytest.mark.slow
@pytest.mark.parametrize("chapter", sorted(TORCH_CELLS))
def test_torch_checked_cells_with_default_cpu_capability(chapter, tmp_path):
    stop = TORCH_CELLS[chapter]
    args = () if stop is None else ("--stop-after", str(stop))
    got = _replay(chapter, tmp_path, *args, env={"ATEN_CPU_CAPABILITY": "default"})
    _assert_same(chapter, got, "ATEN_CPU_CAPABILITY=default")


def test_checked_records_then_checks_against_the_recorded_reference(tmp_path, monkeypatch):
    monkeypatch.setattr(checks, "REFERENCE_DIR", tmp_path)
    tol = {"phi": 0.01, "A": "5%"}
    monkeypatch.setenv(checks.RECORD_ENV, "1")
    recorded = checks.checked("03_fit/joint", {"phi": 0.4391234567, "A": 28.0, "other": 1.0}, tol)
    assert json.loads((tmp_path / "03_fit.json").read_text()) == {"joint": {"phi": 0.439123, "A": 28.0}}
    monkeypatch.delenv(checks.RECORD_ENV)
    # another machine: the value moved by less than the tolerance, the text is the same
    assert checks.checked("03_fit/joint", {"phi": 0.4352, "A": 28.9}, tol) == recorded
    assert recorded.splitlines() == ["phi  within 0.01 of the reference 0.439123",
                                     "A    within 5% of the reference 28"]
    with pytest.raises(checks.ReferenceMismatch, match="phi = 0.46"):
        checks.checked("03_fit/joint", {"phi": 0.46, "A": 28.0}, tol)   # a regression fails the cell
    with pytest.raises(checks.ReferenceMismatch, match="make notebooks"):
        checks.checked("03_fit/halves", {"phi": 0.4}, {"phi": 0.01})    # never recorded
    assert "no reference" in checks.checked("03_fit/joint", {"phi": 0.9, "A": 1.0}, tol, active=False)
    with pytest.raises(ValueError):
        checks.checked("joint", {"phi": 0.4}, {"phi": 0.01})
