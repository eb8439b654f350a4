"""`looped sweep STUDY --dry-run` decides (issue 51): it says which dataset and tokenizer each
preset needs and whether they are here (with the command that prepares them), that the MFU is
assumed unless given, what the hours leave out; `--slurm` shows each array task's hours beside
`--time`; a dry run writes no file, with `--slurm` too."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from looped import accounting
from looped.config import model_config
from looped.data import dataset
from looped.studies.sweep import dry_run, registry
from looped.studies.sweep import runner as sweep

pytestmark = pytest.mark.usefixtures("one_thread")


def files_under(*folders: Path) -> list[str]:
    return sorted(str(p) for f in folders if f.exists() for p in f.rglob("*"))


def dry(argv, capsys) -> str:
    assert sweep.main(argv) == 0
    return capsys.readouterr().out


def test_gpu_main_says_the_paper_data_is_missing_and_how_to_make_it(tmp_path, capsys):
    data, out = tmp_path / "data", tmp_path / "records"
    data.mkdir()   # (--data-dir must exist)
    text = dry(["gpu-main", "--dry-run", "--data-dir", str(data), "--out", str(out)], capsys)
    runs = registry.load_study("gpu-main")
    rows = max(accounting.steps_for_budget(r.model_config(), r.budget, r.tokens_per_step) * 128 for r in runs)
    assert f"data for preset paper: fineweb-edu-llama2-T2048 in {data}/ (the longest run reads {rows * 2049:,} " \
           "training tokens): MISSING" in text
    assert "tokenizer: Llama-2's, from the gated hub repository meta-llama/Llama-2-7b-hf" in text
    assert (f"`looped data prepare --preset paper --max-tokens 2200000000 --data-dir {data}`" in text
            and 2.2e9 >= rows * 2049)   # the README's figure for gpu-main
    assert "MFU: assumed 35% (the default, --mfu to change), not measured" in text
    assert "tools/device_check.sh" in text
    left_out = next(ln for ln in text.splitlines() if ln.startswith("hours count"))
    for part in ("compilation", "final evaluation", "checkpoint saves", "data preparation"):
        assert part in left_out, part
    assert files_under(data, out) == [] and not out.exists()   # nothing written
    text = dry(["gpu-main", "--dry-run", "--mfu", "0.5", "--data-dir", str(data)], capsys)
    assert "MFU: 50% as given (--mfu), not measured by this command" in text and "at an assumed 50% MFU" in text


def test_the_evaluation_left_out_is_counted(capsys, tmp_path):
    """The GPU-hours the final evaluations add: forward FLOPs (a third of training's, all r
    recurrences) x the preset's validation tokens, at the same MFU."""
    runs = registry.load_study("gpu-main")
    peak = 989e12
    want = sum(accounting.flops_per_token(model_config("paper", r=r.r, s=r.s)) / 3 * 70_778_880 for r in runs)
    assert dry_run._eval_hours(runs, peak, 0.35, None) == pytest.approx(want / (peak * 0.35) / 3600, rel=1e-9)
    text = dry(["gpu-main", "--dry-run", "--gpu", "H100", "--data-dir", str(tmp_path)], capsys)
    assert f"final evaluation (forward only: {want / (peak * 0.35) / 3600:.1f} GPU-hours more" in text


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return dataset.prepare("tiny", data_dir=tmp_path_factory.mktemp("data"))


@pytest.fixture
def tiny_grid(tmp_path):
    grid = tmp_path / "grid.csv"
    pd.DataFrame([("g", 2e9, 1, 1, "none", 1), ("g", 2e9, 2, 1, "linear", 2)],
                 columns=["study", "budget_flops", "r", "s", "injection", "bptt_k"]).to_csv(grid, index=False)
    return grid


def test_a_present_dataset_is_reported_present_and_a_short_or_damaged_one_is_not(tiny_data, tiny_grid, tmp_path,
                                                                                   capsys):
    argv = ["g", "--grid", str(tiny_grid), "--preset", "tiny", "--dry-run", "--out", str(tmp_path / "o")]
    before = files_under(tiny_data)
    text = dry([*argv, "--data-dir", str(tiny_data.parent)], capsys)
    line = next(ln for ln in text.splitlines() if ln.startswith("data for preset tiny"))
    assert line.startswith(f"data for preset tiny: {tiny_data.name} in {tiny_data.parent}/") and \
        line.endswith("training tokens)") and ": present (" in line
    assert "  tokenizer: a BPE of the preset's vocabulary trained on the training plays" in text
    assert text.splitlines()[-1].endswith(": present")
    assert files_under(tiny_data) == before and not (tmp_path / "o").exists()
    # a run that needs more rows than the dataset holds
    big = tmp_path / "big.csv"
    pd.read_csv(tiny_grid).assign(budget_flops=1e14).to_csv(big, index=False)
    text = dry(["g", "--grid", str(big), "--preset", "tiny", "--dry-run", "--data-dir", str(tiny_data.parent)],
               capsys)
    assert re.search(r"training tokens\): too small \([\d,]+ training tokens\)", text), text[-800:]
    assert f"prepare it with `looped data prepare --preset tiny --data-dir {tiny_data.parent}`" in text
    # a copy whose shard lost its tail
    copy = tmp_path / "copy" / tiny_data.name
    copy.mkdir(parents=True)
    for f in tiny_data.iterdir():
        copy.joinpath(f.name).write_bytes(f.read_bytes())
    shard = copy / "train-000.bin"
    shard.write_bytes(shard.read_bytes()[:-100])
    text = dry([*argv, "--data-dir", str(copy.parent)], capsys)
    assert "training tokens): damaged (" in text and "truncated" in text


def test_the_cpu_estimate_says_what_its_hours_hold(tiny_grid, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    text = dry(["g", "--grid", str(tiny_grid), "--preset", "tiny", "--dry-run", "--data-dir", str(empty),
                "--timing-from", str(empty)], capsys)
    assert "hours: training FLOPs at an ASSUMED MFU of this CPU's measured matmul peak" in text
    assert "compilation, evaluation, checkpoints, start-up and data preparation left out" in text
    assert "MISSING" in text and not any(empty.iterdir())


def test_slurm_shows_each_tasks_hours_beside_time_and_a_dry_run_writes_no_script(tmp_path, capsys):
    script, out = tmp_path / "s" / "gpu-main.sbatch", tmp_path / "records"
    argv = ["gpu-main", "--slurm", "4", "--slurm-script", str(script), "--out", str(out), "--time", "05:00:00"]
    text = dry([*argv, "--dry-run"], capsys)
    assert "#SBATCH --time=05:00:00" in text and f"(dry run: {script} not written, nothing submitted)" in text
    assert files_under(tmp_path) == []
    tasks = re.findall(r"^  task (\d): (\d+) runs, ([\d.]+) h  EXCEEDS --time$", text, re.M)
    assert [t[0] for t in tasks] == ["0", "1", "2", "3"] and sum(int(t[1]) for t in tasks) == 68
    total = float(re.search(r"ESTIMATE ([\d.]+) GPU-hours", dry(["gpu-main", "--dry-run"], capsys)).group(1))
    assert sum(float(t[2]) for t in tasks) == pytest.approx(total, abs=0.2)
    assert "estimated hours per array task beside --time 05:00:00 (training FLOPs only, H200 at an assumed 35% " \
           "MFU" in text and "raise --time or use more tasks" in text
    text = dry([*argv, "--time", "1-00:00:00", "--gpus-per-task", "2"], capsys)   # written: the same lines
    assert script.is_file() and f"wrote {script}" in text and "EXCEEDS" not in text
    assert re.search(r"^  task 0: 17 runs, [\d.]+ h$", text, re.M)


@pytest.mark.parametrize("text, hours", [("24:00:00", 24), ("1-12:00:00", 36), ("90", 1.5), ("02:30", 2.5 / 60),
                                         ("1-6", 30), ("soon", None)])
def test_slurm_time_limits_read_as_hours(text, hours):
    assert dry_run.hhmmss_hours(text) == (pytest.approx(hours) if hours is not None else None)


def test_the_readme_gives_the_commands_the_dry_run_prints(tmp_path, capsys):
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    text = dry(["gpu-main", "--dry-run"], capsys)
    command = re.search(r"`(looped data prepare --preset paper --max-tokens \d+)", text).group(1)
    assert f"`{command}` on a networked machine" in readme
    assert "It prints each array task's estimated hours beside `--time`" in readme
