"""Every bad input a user can type is one line on stderr and a non-zero exit, never a traceback
and never a value silently put in its place (issue 38).  The table runs the real command line
(`looped.cli.main`, as the `looped` script does) in this process; what argparse itself refuses
(a word where a number goes) keeps argparse's usage + error lines and is not listed here."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import looped
from looped.cli import main
from looped.studies import paper

REPO = Path(__file__).resolve().parents[1]


def run(argv, capsys):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Small inputs: a runs CSV, one with a repeated row, one of two studies, a folder of records
    with one copied twice, and grids with a word, a fraction, a repeated row and no injection."""
    d = tmp_path_factory.mktemp("bad")
    df = paper.synthetic_runs(seed=8).head(40)
    df.to_csv(d / "runs.csv", index=False)
    df.iloc[[0, *range(len(df))]].to_csv(d / "repeated.csv", index=False)
    df.assign(study=["a" if i % 2 else "b" for i in range(len(df))]).to_csv(d / "two_studies.csv", index=False)
    recs = d / "records"
    shutil.copytree(REPO / "runs" / "cpu-main", recs, ignore=shutil.ignore_patterns("ckpt"))
    first = sorted(recs.glob("*.json"))[0]
    shutil.copy(first, recs / "copy.json")
    head = "study,budget_flops,r,s,injection,bptt_k\n"
    for name, row in (("word", "g,abc,1,2,none,1"), ("fraction", "g,1e9,1.5,2,none,1"),
                      ("negative", "g,-1e9,1,2,none,1"), ("no_injection", "g,1e9,1,2,,1"),
                      ("repeated", "g,1e9,1,2,none,1\ng,1e9,1,2,none,1")):
        (d / f"grid_{name}.csv").write_text(head + row + "\n")
    return d


GRID = ["sweep", "g", "--preset", "tiny", "--dry-run", "--grid"]
TRAIN = ["train", "--preset", "tiny", "--r", "2", "--size", "2", "--steps", "2"]
# (argv, a phrase the one line must hold); FILES/... is a file of the fixture, OUT a fresh folder
BAD = [
    # looped fit: refusals that used to fit anyway
    (["fit", "FILES/repeated.csv"], "same run"),
    (["fit", "FILES/records"], "appears 2 times"),
    (["fit", "FILES/two_studies.csv"], "2 studies"),
    (["fit", "FILES/runs.csv", "--study", "nope"], "no runs of that study"),
    (["fit", "FILES/runs.csv", "--fix", "phi=5"], "outside the fitting box"),
    (["fit", "FILES/runs.csv", "--fix", "E=100"], "outside the fitting box"),
    (["fit", "FILES/runs.csv", "--fix", "alpha=-1"], "outside the fitting box"),
    (["fit", "FILES/runs.csv", "--fix", "phi=nan"], "finite"),
    (["fit", "FILES/runs.csv", "--bootstrap", "-3"], "--bootstrap must be >= 0"),
    (["fit", "FILES/runs.csv", "--seed", "-1"], "--seed must be >= 0"),
    (["fit", "FILES/runs.csv", "--restarts", "0"], "--restarts must be >= 1"),
    (["fit", "FILES/runs.csv", "--json", "/nonexistent/fit.json"], "does not exist"),
    (["fit", "FILES/runs.csv", "--restarts", "x"], "invalid int"),
    # training options (TrainConfig, shared by train and sweep): refused before anything is built
    ([*TRAIN, "--budget", "nan"], "--budget must be a finite number"),
    ([*TRAIN, "--budget", "inf"], "--budget must be a finite number"),
    ([*TRAIN, "--budget=-1e9"], "--budget must be > 0"),
    ([*TRAIN, "--log-every", "0"], "--log-every must be >= 1"),
    ([*TRAIN, "--lr-scale", "-1"], "--lr-scale must be > 0"),
    ([*TRAIN, "--lr-scale", "nan"], "--lr-scale must be a finite number"),
    ([*TRAIN, "--eval-tokens", "0"], "--eval-tokens must be >= 1"),
    ([*TRAIN, "--batch-tokens", "0"], "--batch-tokens must be >= 1"),
    ([*TRAIN, "--seed", "-1"], "--seed must be >= 0"),
    ([*TRAIN, "--data-order", "-2"], "--data-order must be >= 0"),
    ([*TRAIN, "--checkpoint-seconds", "nan"], "--checkpoint-seconds must be a finite number"),
    ([*TRAIN, "--peak-flops", "0"], "--peak-flops must be > 0"),
    (["train", "--preset", "tiny", "--steps", "0"], "--steps must be >= 1"),
    # a preset is looked up by name where it comes in (TrainConfig, load_study): one line, exit 2
    (["train", "--preset", "nosuch", "--steps", "2"], "unknown preset 'nosuch'"),
    (["sweep", "g", "--preset", "nosuch", "--dry-run", "--grid", "FILES/grid_word.csv"], "unknown preset 'nosuch'"),
    (["accounting", "--preset", "nosuch"], "unknown preset 'nosuch'"),
    ([*TRAIN, "--micro-batch", "0"], "--micro-batch must be >= 1, got 0"),        # was: the default, silently
    ([*TRAIN, "--micro-batch", "-1"], "do not split"),
    ([*TRAIN, "--data-dir", "OUT"], "does not exist"),                             # was: a dataset built there
    ([*TRAIN, "--data-dir", "FILES/runs.csv"], "is not a folder"),
    (["sweep", "cpu-smoke", "--dry-run", "--out", "OUT/runs", "--data-dir", "OUT"], "--data-dir"),
    (["sweep", "cpu-smoke", "--dry-run", "--out", "OUT", "--micro-batch", "0"], "--micro-batch must be >= 1"),
    # sweep: the estimate's and the SLURM script's numbers (were: ZeroDivisionError, or 200 % MFU taken)
    (["sweep", "gpu-main", "--dry-run", "--out", "OUT", "--gpus", "0"], "--gpus must be >= 1"),
    (["sweep", "gpu-main", "--dry-run", "--out", "OUT", "--mfu", "0"], "--mfu must be a fraction of the peak"),
    (["sweep", "gpu-main", "--dry-run", "--out", "OUT", "--mfu", "2"], "in (0, 1]"),
    (["sweep", "gpu-main", "--dry-run", "--out", "OUT", "--mfu", "nan"], "in (0, 1]"),
    (["sweep", "cpu-smoke", "--dry-run", "--out", "OUT", "--mfu", "0"], "--mfu must be a fraction of the peak"),
    (["sweep", "gpu-main", "--dry-run", "--out", "OUT", "--device-memory", "0"], "--device-memory must be"),
    (["sweep", "cpu-smoke", "--dry-run", "--out", "OUT", "--processes", "0"], "--processes must be >= 1"),
    (["sweep", "cpu-smoke", "--out", "OUT", "--slurm", "0", "--slurm-script", "OUT/s.sbatch"], "--slurm must be"),
    (["sweep", "cpu-smoke", "--out", "OUT", "--slurm", "2", "--gpus-per-task", "0", "--slurm-script",
      "OUT/s.sbatch"], "--gpus-per-task must be >= 1"),
    (["sweep", "cpu-smoke", "--dry-run", "--out", "OUT", "--checkpoint-every", "-1"], "--checkpoint-every"),
    (["sweep", "cpu-smoke", "--dry-run", "--out", "OUT", "--peak-flops", "-1"], "--peak-flops must be > 0"),
    # grids (registry.load_study): the file's line and column
    ([*GRID, "FILES/grid_word.csv"], "line 2: budget_flops 'abc' is not a number"),
    ([*GRID, "FILES/grid_fraction.csv"], "r 1.5 is not a whole number"),
    ([*GRID, "FILES/grid_negative.csv"], "must be positive"),
    ([*GRID, "FILES/grid_no_injection.csv"], "injection"),
    ([*GRID, "FILES/grid_repeated.csv"], "lines 2 and 3 are the same run"),
    # looped accounting
    (["accounting", "--budget", "nan"], "--budget must be a finite number > 0"),
    (["accounting", "--budget", "inf"], "--budget must be a finite number > 0"),
    (["accounting", "--budget", "0"], "--budget must be a finite number > 0"),
    (["accounting", "--seq-len", "0"], "--seq-len must be >= 1"),
    (["accounting", "--batch-tokens", "7", "--budget", "1e18"], "multiple of the sequence length"),
    (["accounting", "--json", "/nonexistent/a.json"], "does not exist"),
    (["accounting", "--r", "3"], "must divide"),
    # looped runs, looped bench
    (["runs", str(REPO / "runs" / "cpu-main"), "--csv", "/nonexistent/runs.csv"], "does not exist"),
    (["runs", "FILES/runs.csv", "--csv", "FILES"], "is a folder"),
    (["bench"], "name a benchmark"),
    (["bench", "nope"], "unknown benchmark 'nope'"),
    (["bench", "train", "--json", "/nonexistent/b.json"], "does not exist"),
]


@pytest.mark.parametrize("argv, phrase", BAD, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD])
def test_a_bad_input_is_one_line_and_a_non_zero_exit(argv, phrase, files, tmp_path, capsys):
    argv = [a.replace("FILES", str(files)).replace("OUT", str(tmp_path / "out")) for a in argv]
    code, _, err = run(argv, capsys)
    lines = err.strip().splitlines()
    assert code not in (0, None), err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"looped {argv[0]}") and ": error: " in lines[0], lines[0]
    assert phrase in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_fit_says_which_files_it_skipped_and_why(files, tmp_path, capsys):
    folder = tmp_path / "records"
    shutil.copytree(files / "records", folder)
    (folder / "copy.json").unlink()
    n = len(list(folder.glob("*.json")))
    (folder / "torn.json").write_text('{"run_id": "torn", "loss"')
    (folder / "null.json").write_text("null")
    (folder / "manifest.json").write_text(json.dumps({"note": "not a run"}))
    code, out, err = run(["fit", folder, "--restarts", "5"], capsys)
    assert code == 0, err
    assert f"{n} runs" in out.splitlines()[0]
    warnings = [line for line in err.splitlines() if line.startswith("looped fit: warning:")]
    assert any("skipping torn.json" in w for w in warnings) and any("skipping null.json" in w for w in warnings)
    assert any("manifest.json" in w and "ignoring 1 JSON file" in w for w in warnings)


def test_fit_takes_duplicates_and_mixed_studies_when_asked(files, capsys):
    code, out, err = run(["fit", files / "repeated.csv", "--restarts", "5", "--allow-duplicates"], capsys)
    assert code == 0 and "41 runs" in out, err
    code, out, err = run(["fit", files / "two_studies.csv", "--restarts", "5", "--mixed-studies"], capsys)
    assert code == 0 and "40 runs" in out, err
    code, out, err = run(["fit", files / "two_studies.csv", "--restarts", "5", "--study", "a"], capsys)
    assert code == 0 and "20 runs" in out, err


def test_a_fixed_value_inside_the_box_is_fixed(files, capsys):
    code, out, err = run(["fit", files / "runs.csv", "--restarts", "5", "--fix", "phi=0.5"], capsys)
    assert code == 0, err
    assert any(line.split()[:3] == ["phi", "0.5", "(fixed)"] for line in out.splitlines()), out


def test_a_rounded_size_is_said_not_hidden(capsys):
    code, out, err = run(["accounting", "--size", "2.5"], capsys)
    assert code == 0 and "d_model  256" in out
    assert err.strip().splitlines() == [err.strip()] and "size 2.5 gives d_model 256" in err


@pytest.mark.parametrize("form", [["--json"], ["--json", "-"], ["--json", "FILE"]])
def test_json_is_one_convention(form, files, tmp_path, capsys):
    """`--json [PATH|-]`: stdout (the JSON alone) with '-' or no value, else the file."""
    target = tmp_path / "out.json"
    form = [str(target) if f == "FILE" else f for f in form]
    code, out, err = run(["accounting", "--r", "4", "--budget", "1e18", *form], capsys)
    assert code == 0, err
    got = json.loads(target.read_text()) if target.exists() else json.loads(out)
    assert got["r"] == 4 and got["steps"] > 0
    code, out, err = run(["fit", files / "runs.csv", "--restarts", "5", *form], capsys)
    assert code == 0, err
    got = json.loads(target.read_text()) if target.exists() else json.loads(out)
    assert got["n_runs"] == 40 and "phi" in got
    assert ("joint law fit" in err) == (target.exists() is False)   # the table moves to stderr


def test_version_and_bench_help(capsys):
    assert run(["--version"], capsys)[:2] == (0, f"looped {looped.__version__}\n")
    code, out, _ = run(["bench", "--help"], capsys)
    assert code == 0 and all(name in out for name in ("train", "fit", "profile"))


@pytest.mark.parametrize("old, new", [("robustness", "constancy"), ("paired", "case-studies")])
def test_a_renamed_command_names_its_new_name(old, new, capsys):
    code, out, err = run([old, "--out", "/tmp/never.json"], capsys)
    assert code == 2 and out == "" and err == f"looped: error: `looped {old}` is now `looped {new}` (same options)\n"


@pytest.mark.parametrize("command", [["accounting"], ["train"], ["fit"], ["bench", "train"], ["bench", "fit"],
                                     ["bench", "profile"], ["sweep"], ["runs"], ["data"], ["constancy"], ["misfit"],
                                     ["case-studies"], ["shape"], ["corpora"], ["external"]])
def test_every_option_has_help(command, monkeypatch):
    import argparse
    import importlib

    from looped.cli import COMMANDS
    parsers = []

    def grab(self, args=None, namespace=None):
        parsers.append(self)
        raise SystemExit(0)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    module, func, _ = COMMANDS[command[0]]
    with pytest.raises(SystemExit):
        getattr(importlib.import_module(module), func)(command[1:] + ["--help"])
    actions = [a for a in parsers[-1]._actions if not isinstance(a, argparse._HelpAction)]
    for sub in [a for a in actions if isinstance(a, argparse._SubParsersAction)]:  # `data prepare`'s options
        actions += [a for p in sub.choices.values() for a in p._actions if not isinstance(a, argparse._HelpAction)]
    assert actions and [a.option_strings or a.dest for a in actions if not a.help] == []
