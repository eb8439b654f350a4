"""`looped fit` on the inputs a new user brings (issue 51): a bootstrap over too few cells is
flagged, a repeated row is named with the row it repeats, a table too large for the machine is
refused before the solver starts, r must be a positive integer, and a file separated by ';' or
tabs gets a hint instead of "missing columns"."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from looped import fit_cli
from looped.cli import main
from looped.studies import paper

COLUMNS = ["budget", "r", "s", "n_once", "n_rec", "tokens", "loss"]


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def two_budgets(tmp_path_factory):
    """The paper's grid at its two lowest budgets: 8 (budget, r) cells, 36 runs."""
    df = paper.synthetic_runs(seed=8)
    low = sorted(df.budget.unique())[:2]
    path = tmp_path_factory.mktemp("fit") / "two_budgets.csv"
    df[df.budget.isin(low)][COLUMNS].to_csv(path, index=False)
    return path


def test_the_cells_a_bootstrap_needs():
    """13 cells for the joint law: the fewest for which at most 5% of resamples hold 6 or fewer
    distinct cells (checked against a simulation of the resampling)."""
    assert [fit_cli.units_needed(k) for k in (4, 5, 6)] == [10, 12, 13]
    assert fit_cli.few_distinct(8, 6) == pytest.approx(0.930, abs=1e-3)
    assert fit_cli.few_distinct(12, 6) > 0.05 >= fit_cli.few_distinct(13, 6)
    rng = np.random.default_rng(0)
    for n in (8, 13):
        distinct = np.array([len(set(rng.integers(0, n, n))) for _ in range(20_000)])
        assert (distinct <= 6).mean() == pytest.approx(fit_cli.few_distinct(n, 6), abs=0.01)


def test_a_bootstrap_over_eight_cells_is_flagged(two_budgets, capsys):
    code, out, err = run(["fit", two_budgets, "--restarts", "20", "--bootstrap", "10"], capsys)
    assert code == 0 and "2.5%" in out
    warning = [ln for ln in err.splitlines() if "bootstrap resampled" in ln]
    assert warning == ["looped fit: warning: the bootstrap resampled 8 (budget, r) cells; a 6-parameter law needs "
                       "at least 13: with 8, 93% of resamples hold 6 or fewer distinct ones, too few to pin 6 "
                       "parameters, so the intervals are not meaningful"]
    code, out, err = run(["fit", two_budgets, "--restarts", "20"], capsys)       # no bootstrap, no warning
    assert code == 0 and "bootstrap" not in err
    full = two_budgets.parent / "all.csv"
    paper.synthetic_runs(seed=8)[COLUMNS].to_csv(full, index=False)              # 24 cells
    code, out, err = run(["fit", full, "--restarts", "20", "--bootstrap", "4", "--boot-restarts", "0"], capsys)
    assert code == 0 and "bootstrap resampled" not in err


def test_a_repeated_row_is_named_with_the_row_it_repeats(two_budgets, tmp_path, capsys):
    df = pd.read_csv(two_budgets)
    pd.concat([df, df.iloc[[2, 4]]], ignore_index=True).to_csv(tmp_path / "dup.csv", index=False)
    code, out, err = run(["fit", tmp_path / "dup.csv"], capsys)
    n = len(df)
    assert code == 2 and err.count("\n") == 1
    assert f"data rows 3 and {n + 1} are the same run" in err and "1 more row(s) repeat an earlier one" in err
    # rows a status column skips keep their numbers: row 2 is skipped, the pair is still 3 and n + 1
    status = pd.concat([df, df.iloc[[2]]], ignore_index=True).assign(status="ok")
    status.loc[1, "status"] = "failed"
    status.to_csv(tmp_path / "status.csv", index=False)
    code, out, err = run(["fit", tmp_path / "status.csv"], capsys)
    assert code == 2 and f"data rows 3 and {n + 1} are the same run" in err.splitlines()[-1]


@pytest.mark.parametrize("r, shown", [(1.5, "1.5"), (0, "0"), (-2, "-2")])
def test_r_must_be_a_positive_integer(two_budgets, tmp_path, capsys, r, shown):
    df = pd.read_csv(two_budgets).astype({"r": float})
    df.loc[3, "r"] = r
    df.to_csv(tmp_path / "r.csv", index=False)
    code, out, err = run(["fit", tmp_path / "r.csv"], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"looped fit: error: {tmp_path / 'r.csv'}: data row 4: r is not a positive integer ({shown})"]


@pytest.mark.parametrize("sep, shown", [(";", "';'"), ("\t", "'\\t'")])
def test_a_file_with_another_separator_gets_a_hint(two_budgets, tmp_path, capsys, sep, shown):
    pd.read_csv(two_budgets).to_csv(tmp_path / "other.csv", index=False, sep=sep)
    code, out, err = run(["fit", tmp_path / "other.csv"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"one column read, its header holds {shown}: looped fit reads comma-separated files" in err


def test_the_memory_estimate_matches_the_measurements():
    """The constants reproduce what was measured (peak RSS of `looped fit`, 500 restarts) to 20%."""
    for runs, restarts, gb in ((2_000, 500, 0.23), (5_000, 500, 0.34), (5_000, 50, 0.23),
                               (100_000, 500, 3.5)):
        assert fit_cli.fit_memory(runs, restarts) / 1e9 == pytest.approx(gb, rel=0.2), (runs, restarts)
    assert fit_cli.fit_memory(2_000, 500, bootstrap=50) / 1e9 == pytest.approx(0.34, rel=0.2)
    assert fit_cli.fit_memory(1_000_000, 500) > 23.4e9      # the table that was killed at 23.4 GB


def test_a_million_runs_stop_with_one_line_before_the_solver(tmp_path, capsys, monkeypatch):
    """The newcomer's table (a million rows, --allow-duplicates) on a machine with 16 GB available:
    refused in one line naming the estimate, the memory available and the most runs that fit,
    before any solving (the same command was killed at 23.4 GB without a word)."""
    rng = np.random.default_rng(0)
    r = rng.choice([1, 2, 4, 8], 1000)
    block = pd.DataFrame({"r": r, "n_once": rng.uniform(1e6, 1e8, 1000), "n_rec": 1e7 * (r > 1),
                          "tokens": rng.uniform(1e8, 1e10, 1000), "loss": rng.uniform(2, 4, 1000)})
    head, rows = block.to_csv(index=False).split("\n", 1)
    (tmp_path / "million.csv").write_text(head + "\n" + rows * 1000)
    n = 1_000_000
    monkeypatch.setattr(fit_cli, "available_memory", lambda: 16e9)
    monkeypatch.setattr(fit_cli, "fit", lambda *a, **k: pytest.fail("the solver started"))
    code, out, err = run(["fit", tmp_path / "million.csv", "--allow-duplicates"], capsys)
    assert code == 2 and not out and err.count("\n") == 1, err
    most = int((16e9 - fit_cli.BASE_BYTES) / (fit_cli.BYTES_PER_RUN_RESTART * 128))
    assert err.startswith("looped fit: error: 1,000,000 runs need about 34.7 GB to fit (35 kB a run at 128 "
                          f"restarts a block), and 16.0 GB is available: at most {most:,} runs fit here"), err
    code, out, err = run(["fit", tmp_path / "million.csv", "--allow-duplicates", "--bootstrap", "100"], capsys)
    assert code == 2 and "restarts a block, more for the bootstrap), and 16.0 GB is available" in err
    monkeypatch.setattr(fit_cli, "available_memory", lambda: None)    # unknown: no refusal
    assert fit_cli.memory_error(n, 500, 0) is None


def test_the_readme_states_what_the_fitter_does():
    from pathlib import Path
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert f"A bootstrap over fewer than {fit_cli.units_needed(6)} (budget, r) cells is flagged" in readme
    assert f"(8 cells: {fit_cli.few_distinct(8, 6):.0%})" in readme
    per_run = fit_cli.BYTES_PER_RUN_RESTART * fit_cli.SOLVER_BLOCK
    assert f"{fit_cli.BASE_BYTES / 1e9:.2f} GB plus {per_run / 1e3:.0f} kB a run" in readme
    assert f"a million runs would need about {fit_cli.fit_memory(1_000_000, 500) / 1e9:.0f} GB" in readme
