"""The sweep runner (looped.studies.sweep.runner) on a tiny ad-hoc grid: every run once, skip/retry on rerun,
failures recorded, shards, dry run, a SIGKILLed `looped sweep` restarted to the same records,
the runs table/CSV and the CLI's failure paths."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from looped import accounting
from looped.config import model_config
from looped.data import dataset
from looped.io import atomic_write_json
from looped.records import run_state
from looped.studies.sweep import cost, registry
from looped.studies.sweep import runner as sweep

REPO = Path(__file__).resolve().parents[1]
STUDY = "t"
NAME = "tiny-test"
GRID_COLUMNS = ["study", "budget_flops", "r", "s", "injection", "bptt_k"]


def budget(steps: float, r: int = 2) -> float:
    """A budget worth about `steps` steps of a tiny s=1 model (8 rows x 32 tokens per step)."""
    return float(f"{accounting.flops_per_token(model_config('tiny', r=r, s=1)) * 256 * steps:.3g}")


def grid_rows():
    # ~10 steps each; r=1 plain, r=2 linear, r=4 truncated (k=1), r=2 hyperconnections
    return [(STUDY, budget(10), 1, 1, "none", 1), (STUDY, budget(10), 2, 1, "linear", 2),
            (STUDY, budget(10), 4, 1, "linear", 1), (STUDY, budget(10), 2, 1, "hyperconnect_2lanes", 2),
            ("other", budget(3), 2, 1, "linear", 2)]


pytestmark = pytest.mark.usefixtures("one_thread")  # the shared 2-core machine


@pytest.fixture(scope="module")
def grid_csv(tmp_path_factory):
    dataset.prepare("tiny")
    path = tmp_path_factory.mktemp("grid") / "grid.csv"
    pd.DataFrame(grid_rows(), columns=GRID_COLUMNS).to_csv(path, index=False)
    return path


@pytest.fixture
def study(grid_csv, monkeypatch):
    """Register the grid as a named study, as runs/paper/grids.csv is."""
    monkeypatch.setitem(registry.GRID_FILES, "tiny", grid_csv)
    monkeypatch.setitem(registry.STUDIES, NAME, ("tiny", STUDY, "tiny"))
    return NAME


@pytest.fixture(scope="module")
def reference(grid_csv, tmp_path_factory):
    """An uninterrupted sweep of the grid, in process: the reference records."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("reference")
    log = []
    table = sweep.sweep(STUDY, out, grid=grid_csv, preset="tiny", checkpoint_every=2, log=log.append,
                        compile=False)  # eager: the fast path's own tests are in test_fast_path.py
    return out, table, log


def records(folder: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def copy_records(src: Path, dest: Path) -> tuple[dict[str, dict], list[str]]:
    """The records of `src` written into `dest`; returns them and their sorted run ids."""
    recs = records(src)
    for rid, rec in recs.items():
        atomic_write_json(dest / f"{rid}.json", rec)
    return recs, sorted(recs)


def all_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def env1():
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def fake_train(calls):
    """Stands in for train(): records the call and writes a minimal 'ok' record."""
    from looped.train import run_id

    def train(tc):
        calls.append(run_id(tc))
        rec = {"run_id": run_id(tc), "status": "ok", "loss": 1.0, "r": tc.r, "s": tc.s, "study": tc.study}
        atomic_write_json(Path(tc.out), rec)
        return rec
    return train


# ----------------------------------------------------------------------------- studies

def test_load_study_named_and_adhoc(study, grid_csv):
    runs = registry.load_study(study)
    adhoc = registry.load_study(STUDY, grid_csv, "tiny")
    assert [r.run_id for r in runs] == [r.run_id for r in adhoc]
    assert {r.study for r in runs} == {study} and {r.study for r in adhoc} == {STUDY}
    assert [(r.r, r.injection, r.lanes, r.bptt_k) for r in runs] == [
        (1, "none", 2, None), (2, "linear", 2, None), (4, "linear", 2, 1), (2, "hyperconnect", 2, None)]
    assert len({r.run_id for r in runs}) == len(runs) and all(r.preset.name == "tiny" for r in runs)
    with pytest.raises(registry.SweepError, match="unknown study"):
        registry.load_study("nope")
    with pytest.raises(registry.SweepError, match="no rows"):
        registry.load_study("nope", grid_csv, "tiny")


def test_grid_rows_sharing_a_run_id_are_refused(tmp_path):
    b = budget(10)
    path = tmp_path / "dup.csv"
    pd.DataFrame([(STUDY, b, 2, 1, "linear", 2), (STUDY, b * 1.0001, 2, 1, "linear", 2)],
                 columns=GRID_COLUMNS).to_csv(path, index=False)
    with pytest.raises(registry.SweepError, match="share the run id"):
        registry.load_study(STUDY, path, "tiny")
    pd.DataFrame([(STUDY, b, 3, 1, "linear", 3)], columns=GRID_COLUMNS).to_csv(path, index=False)
    assert sweep.main([STUDY, "--grid", str(path), "--preset", "tiny", "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()


def test_paper_grids_load():
    for name in ("paper-main", "paper-truncated", "paper-hyper"):
        runs = registry.load_study(name)
        assert runs and len({r.run_id for r in runs}) == len(runs), name


# ----------------------------------------------------------------------------- running

def test_sweep_runs_every_run_once(reference, grid_csv):
    out, table, log = reference
    runs = registry.load_study(STUDY, grid_csv, "tiny")
    recs = records(out)
    assert sorted(recs) == sorted(r.run_id for r in runs)
    assert all(rec["status"] == "ok" and rec["study"] == STUDY for rec in recs.values())
    assert sum(line.startswith("[") for line in log) == len(runs)
    assert set(table.run_id) == set(recs) and (table.status == "ok").all()
    for run in runs:
        rec = recs[run.run_id]
        cfg = run.model_config()
        assert rec["steps"] == accounting.steps_for_budget(cfg, run.budget, 256) and rec["budget"] == run.budget
        assert rec["bptt_k"] == cfg.k_bwd and rec["injection"] == run.injection
    assert all_files(out) == sorted(f"{k}.json" for k in recs)  # no checkpoints or temp files left


def test_rerun_skips_finished_and_retries_failed(reference, grid_csv, tmp_path, monkeypatch):
    src, _, _ = reference
    out = tmp_path / "out"
    recs, ids = copy_records(src, out)
    atomic_write_json(out / f"{ids[0]}.json", {**recs[ids[0]], "status": "diverged", "loss": None})
    atomic_write_json(out / f"{ids[1]}.json", {"run_id": ids[1], "status": "failed", "error": "boom"})
    (out / f"{ids[2]}.json").write_text('{"run_id": "trunc')  # a torn file (not from us; say, a copy)
    calls = []
    monkeypatch.setattr("looped.train.train", fake_train(calls))
    log = []
    table = sweep.sweep(STUDY, out, grid=grid_csv, preset="tiny", log=log.append)
    assert sorted(calls) == sorted([ids[1], ids[2]])
    assert sum("retrying failed run" in line for line in log) == 2
    final = records(out)
    assert final[ids[0]]["status"] == "diverged"  # finished: kept as it was
    assert final[ids[1]]["status"] == final[ids[2]]["status"] == "ok"
    assert final[ids[3]] == recs[ids[3]]
    assert len(table) == len(ids)
    # a kill between writing a record and deleting its checkpoint leaves scratch behind: swept up
    (out / "ckpt").mkdir()
    (out / "ckpt" / f"{ids[3]}.pt").write_bytes(b"stale")
    calls.clear()
    sweep.sweep(STUDY, out, grid=grid_csv, preset="tiny", log=log.append)
    assert calls == [] and not (out / "ckpt" / f"{ids[3]}.pt").exists()


def test_a_failing_run_is_recorded_and_the_sweep_goes_on(grid_csv, tmp_path, monkeypatch):
    calls, ok = [], fake_train([])
    runs = registry.load_study(STUDY, grid_csv, "tiny")
    bad = runs[1].run_id

    def train(tc):
        from looped.train import run_id
        calls.append(run_id(tc))
        if run_id(tc) == bad:
            raise RuntimeError("CUDA out of memory (simulated)")
        return ok(tc)

    monkeypatch.setattr("looped.train.train", train)
    log = []
    table = sweep.sweep(STUDY, tmp_path, grid=grid_csv, preset="tiny", log=log.append)
    assert calls == [r.run_id for r in runs]
    rec = json.loads((tmp_path / f"{bad}.json").read_text())
    assert rec["status"] == "failed" and "out of memory" in rec["error"] and rec["r"] == runs[1].r
    assert dict(zip(table.run_id, table.status))[bad] == "failed"
    assert (table.status == "ok").sum() == len(runs) - 1
    assert any("failed: RuntimeError" in line for line in log)


def test_shards_cover_the_grid_exactly_once(grid_csv, tmp_path, monkeypatch):
    runs = registry.load_study(STUDY, grid_csv, "tiny")
    seen = {}
    for i in range(2):
        calls = []
        monkeypatch.setattr("looped.train.train", fake_train(calls))
        sweep.sweep(STUDY, tmp_path / f"shard{i}", shard=(i, 2), grid=grid_csv, preset="tiny", log=lambda s: None)
        seen[i] = calls
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == sorted(r.run_id for r in runs)
    # the CLI's --shard does the same
    calls = []
    monkeypatch.setattr("looped.train.train", fake_train(calls))
    assert sweep.main([STUDY, "--grid", str(grid_csv), "--preset", "tiny", "--out", str(tmp_path / "cli"),
                       "--shard", "1/2"]) == 0
    assert calls == seen[1]


def test_dry_run_lists_every_run_and_writes_nothing(study, tmp_path, capsys):
    out = tmp_path / "never"
    assert sweep.main([study, "--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    runs = registry.load_study(study)
    header = text.splitlines()[0].split()
    for col in ("run_id", "n", "flops_per_token", "tokens", "steps", "est_seconds"):
        assert col in header, col
    for run in runs:
        line = next(ln for ln in text.splitlines() if ln.split()[:1] == [run.run_id])
        s = accounting.summary(run.model_config(), run.budget, 256)
        fields = dict(zip(header, line.split()))
        assert int(fields["steps"]) == s["steps"] and int(fields["tokens"]) == s["tokens"]
        assert int(fields["n"]) == s["n"]
    assert f"{len(runs)} runs ({len(runs)} to do)" in text and " h left" in text
    assert not out.exists()
    table = cost.plan(runs, peak_flops=1e9, mfu=0.5)
    assert list(table.run_id) == [r.run_id for r in runs]
    assert (table.est_seconds == table.flops_per_token * table.tokens / 5e8).all()
    # no division by zero (the CLI says so in one line first): an impossible MFU or GPU count
    for kw in (dict(mfu=0), dict(mfu=2), dict(peak_flops=0)):
        with pytest.raises(registry.SweepError, match="MFU in"):
            cost.plan(runs, **{"peak_flops": 1e9, "mfu": 0.5, **kw})
    with pytest.raises(registry.SweepError, match="--gpus must be >= 1"):
        cost.gpu_plan(runs, 1e15, 0.35, 80e9, gpus=0)
    assert cost.plan(runs, peak_flops=float("nan"), mfu=0.3).est_seconds.isna().all()  # unknown peak


# ----------------------------------------------------------------------------- kill and restart

def test_sigkilled_sweep_resumes_to_the_same_records(reference, grid_csv, tmp_path):
    ref, _, _ = reference
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "looped", "sweep", STUDY, "--grid", str(grid_csv), "--preset", "tiny",
           "--out", str(out), "--checkpoint-every", "2", "--no-compile"]
    proc = subprocess.Popen(cmd, env=env1(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # kill at a random moment while a run is half done: a record exists and a checkpoint too
    target = random.Random().randint(1, 2)
    deadline = time.time() + 240
    while proc.poll() is None and time.time() < deadline:
        if len(list(out.glob("*.json"))) >= target and list(out.glob("ckpt/*.pt")):
            break
        time.sleep(0.003)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert list(out.glob("ckpt/*.pt")), "the sweep finished before it could be killed"
    assert len(list(out.glob("*.json"))) < len(records(ref))
    done = subprocess.run(cmd, env=env1(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    got, want = records(out), records(ref)  # every JSON parses
    assert sorted(got) == sorted(want)
    for rid in want:
        assert got[rid]["status"] == "ok"
        assert got[rid]["loss"] == pytest.approx(want[rid]["loss"], abs=1e-6), rid
        assert got[rid]["train_loss_curve"][-1] == want[rid]["train_loss_curve"][-1]
    assert all_files(out) == sorted(f"{k}.json" for k in want)  # no duplicates, temp files or checkpoints
    assert f"{STUDY}: ok {len(want)}" in done.stdout


# ----------------------------------------------------------------------------- runs table and CLI errors

def test_runs_table_and_csv(reference, tmp_path, capsys):
    src, _, _ = reference
    csv = tmp_path / "runs.csv"
    assert sweep.runs_main([str(src), "--csv", str(csv)]) == 0
    text = capsys.readouterr().out
    recs = records(src)
    assert all(rid in text for rid in recs) and f"{len(recs)} runs: ok {len(recs)}" in text
    table = pd.read_csv(csv)
    for col in ("r", "n_once", "n_rec", "tokens", "loss", "budget", "s", "study", "status"):
        assert col in table.columns, col
    assert len(table) == len(recs)
    for row in table.itertuples():
        rec = recs[row.run_id]
        assert (row.r, row.n_once, row.n_rec, row.tokens) == (rec["r"], rec["n_once"], rec["n_rec"], rec["tokens"])
        assert row.loss == pytest.approx(rec["loss"], rel=1e-12)
    fit = pytest.importorskip("looped.fit")
    assert len(fit.load_runs(csv)) == len(recs)


@pytest.mark.parametrize("argv, match", [
    (["no-such-study"], "unknown study"),
    ([STUDY, "--shard", "2/2"], "--shard"),
    ([STUDY, "--shard", "x"], "--shard"),
    ([STUDY, "--shard", "0/0"], "--shard"),
    ([STUDY, "--grid", "/no/such/grid.csv", "--preset", "tiny"], "cannot read grid"),
    ([STUDY, "--grid", "GRID", "--preset", "nope"], "unknown preset"),
    (["absent", "--grid", "GRID", "--preset", "tiny"], "no rows"),
    (["paper-main", "--preset", "tiny", "--dry-run"], "applies to --grid runs"),
    ([STUDY, "--grid", "GRID", "--preset", "tiny", "--checkpoint-seconds", "-5"], "must be >= 0"),
])
def test_sweep_cli_bad_input_exits_2(argv, match, grid_csv, tmp_path, capsys):
    argv = [str(grid_csv) if a == "GRID" else a for a in argv] + ["--out", str(tmp_path / "o")]
    assert sweep.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("looped sweep: error:") and match in err
    assert not (tmp_path / "o").exists()


def test_runs_cli_missing_folder_exits_2(tmp_path, capsys):
    assert sweep.runs_main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a folder" in err


def test_cli_dispatch_exit_codes(capsys):
    """The real entry point (a subprocess) for one bad input; --help documents the ad-hoc grid."""
    done = subprocess.run([sys.executable, "-m", "looped", "sweep", "no-such-study"], env=env1(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    with pytest.raises(SystemExit) as exc:
        sweep.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "--grid" in text and "--preset" in text and "budget_flops" in text


# ----------------------------------------------------------------------------- GPU dry run, SLURM

def test_gpu_dry_run_prints_micro_batch_memory_and_gpu_hours(capsys):
    """The paper-architecture studies get the GPU estimate even without a GPU (H200 assumed)."""
    from looped import memory
    assert sweep.main(["gpu-main", "--dry-run", "--gpu", "H100"]) == 0
    text = capsys.readouterr().out
    header = text.splitlines()[0].split()
    for col in ("micro_batch", "mem_GB", "gpu_hours"):
        assert col in header
    runs = registry.load_study("gpu-main")
    lines = {ln.split()[0]: dict(zip(header, ln.split())) for ln in text.splitlines()[1:] if ln.strip()
             and ln.split()[0] in {r.run_id for r in runs}}
    assert len(lines) == len(runs)
    for run in runs:
        f = lines[run.run_id]
        h100 = memory.GPU_SPECS["H100"][1]
        m = memory.auto_micro_batch(run.model_config(), 128, h100)
        assert int(f["micro_batch"]) == m
        assert float(f["mem_GB"]) <= 0.85 * h100 / 1e9
        # estimated hours = FLOPs / (989 TFLOP/s x 35%)
        s = accounting.summary(run.model_config(), run.budget, 262_144)
        assert float(f["gpu_hours"]) == pytest.approx(s["flops_per_token"] * s["tokens"] / (989e12 * 0.35) / 3600,
                                                      rel=1e-3)
    total = float(text.split("ESTIMATE ")[1].split()[0])
    assert 12 <= total <= 48, "the single-GPU study should fit one to two days on one H100/H200"
    assert "assumed 35% MFU" in text


def test_gpu_dry_run_fixed_micro_batch_and_gpus(capsys):
    assert sweep.main(["paper-main", "--dry-run", "--gpu", "H200", "--micro-batch", "8", "--gpus", "8",
                       "--mfu", "0.5"]) == 0
    text = capsys.readouterr().out
    header = text.splitlines()[0].split()
    rows = [
        dict(zip(header, ln.split()))
        for ln in text.splitlines()[1:]
        if ln.split()[:1] and ln.split()[0].startswith("C")
    ]
    assert len(rows) == 116 and {r["micro_batch"] for r in rows} == {"8"}
    assert "h wall on 8 GPU(s)" in text and "assumed 50% MFU" in text


def test_sweep_cli_passes_training_options(grid_csv, tmp_path, monkeypatch):
    seen = []

    def fake(tc):
        seen.append(tc)
        atomic_write_json(Path(tc.out), {"run_id": Path(tc.out).stem, "status": "ok", "loss": 1.0})
        return {"status": "ok", "loss": 1.0}
    monkeypatch.setattr("looped.train.train", fake)
    assert sweep.main([STUDY, "--grid", str(grid_csv), "--preset", "tiny", "--out", str(tmp_path / "o"),
                       "--micro-batch", "2", "--no-compile", "--peak-flops", "1e12"]) == 0
    assert seen and all(tc.micro_batch == 2 and tc.compile is False and tc.peak_flops == 1e12 for tc in seen)
    seen.clear()
    assert sweep.main([STUDY, "--grid", str(grid_csv), "--preset", "tiny", "--out", str(tmp_path / "p")]) == 0
    from looped.train import TrainConfig
    default = TrainConfig()
    assert all(tc.micro_batch is None and tc.compile == default.compile and tc.peak_flops is None for tc in seen)


def test_slurm_script_content(grid_csv, tmp_path, capsys):
    script = tmp_path / "s" / "t.sbatch"
    out = tmp_path / "records"
    assert sweep.main([STUDY, "--grid", str(grid_csv), "--preset", "tiny", "--out", str(out), "--slurm", "3",
                       "--slurm-script", str(script), "--gpus-per-task", "4", "--time", "02:00:00",
                       "--partition", "gpu", "--max-parallel", "2", "--sbatch=--constraint=h100",
                       "--micro-batch", "8", "--no-compile"]) == 0
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n") and os.access(script, os.X_OK)
    for line in ("#SBATCH --array=0-2%2", "#SBATCH --gpus-per-task=4", "#SBATCH --time=02:00:00",
                 "#SBATCH --partition=gpu", "#SBATCH --constraint=h100", "#SBATCH --requeue",
                 "TASK=${SLURM_ARRAY_TASK_ID:?"):
        assert line in text, line
    cmd = text.strip().splitlines()[-1]
    assert "torch.distributed.run --standalone --nproc_per_node 4 -m looped sweep t" in cmd
    assert '--shard "$TASK/3"' in cmd and f"--out {out.resolve()}" in cmd and "--micro-batch 8" in cmd
    assert "--no-compile" in cmd and f"--grid {grid_csv.resolve()}" in cmd and "--preset tiny" in cmd
    assert "sbatch" in capsys.readouterr().out
    assert not out.exists()  # writing the script runs nothing


@pytest.mark.timeout(600)
def test_slurm_array_runs_locally_to_the_full_study(grid_csv, tmp_path):
    """Each array task, run as SLURM would run it (bash + SLURM_ARRAY_TASK_ID), trains its
    shard; together the tasks leave every run of the study done."""
    script, out = tmp_path / "t.sbatch", tmp_path / "records"
    assert sweep.main([STUDY, "--grid", str(grid_csv), "--preset", "tiny", "--out", str(out), "--slurm", "2",
                       "--slurm-script", str(script), "--no-compile"]) == 0
    for task in (0, 1):
        done = subprocess.run(["bash", str(script)], env={**env1(), "SLURM_ARRAY_TASK_ID": str(task)},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"shard {task}/2" in done.stdout
    recs = records(out)
    assert set(recs) == {r.run_id for r in registry.load_study(STUDY, grid_csv, "tiny")}
    assert all(r["status"] == "ok" and r["train"]["compile"] is False for r in recs.values())
    missing = subprocess.run(["bash", str(script)], env=env1(), capture_output=True, text=True)
    assert missing.returncode != 0 and "SLURM_ARRAY_TASK_ID" in missing.stderr


def test_cpu_estimate_times_a_new_study_with_the_presets_fast_path_runs(tmp_path, monkeypatch):
    """A study with no finished runs is timed from every fast-path record of its preset under
    runs/ (copies and eager runs excluded); the wall time on P processes is the longest of the
    P round-robin shards, as `--shard i/P` splits it."""
    from looped.io import atomic_write_json
    runs = registry.load_study("cpu-main")[:6]
    root = tmp_path / "runs"
    for k, run in enumerate(registry.load_study("prose-pilot")):  # wall = 0.2 s/step + 1e-10 s/FLOP
        s = accounting.summary(run.model_config(), run.budget, run.tokens_per_step)
        rec = {"run_id": run.run_id, "status": "ok", "preset": "prose", "compile": True, "steps": s["steps"],
               "tokens": s["tokens"], "flops_per_token": s["flops_per_token"],
               "wall_seconds": 0.2 * s["steps"] + 1e-10 * s["flops_per_token"] * s["tokens"]}
        atomic_write_json(root / "pilot" / f"{run.run_id}.json", rec)
        # an eager run and a copied record must not count
        atomic_write_json(root / "eager" / f"{run.run_id}.json", {**rec, "compile": False, "wall_seconds": 1.0})
        atomic_write_json(root / "copy" / f"{run.run_id}.json", {**rec, "copied_from": "x", "wall_seconds": 1.0})
    found = cost.fast_path_records("prose", root)
    assert len(found) == len(registry.load_study("prose-pilot"))
    monkeypatch.setattr(
        cost, "fast_path_records", lambda preset, orig=cost.fast_path_records: orig(preset, root)
    )
    est = cost.cpu_estimate(runs, tmp_path / "runs" / "new", peak_flops=1e9, processes=2)
    assert est["timing"] == pytest.approx((0.2, 1e-10), rel=1e-6)
    secs = est["table"].est_seconds
    assert est["hours"] == pytest.approx(secs.sum() / 3600)
    assert est["hours_wall"] == pytest.approx(max(secs.iloc[0::2].sum(), secs.iloc[1::2].sum()) / 3600)
    assert est["todo"] == len(runs) and "fast-path" in est["basis"]
    assert est["hours_wall_all"] == pytest.approx(est["hours_wall"])  # nothing recorded yet
    # without any timing source it falls back to the assumed MFU of the peak
    bare = cost.cpu_estimate(runs, tmp_path / "none", peak_flops=1e9, mfu=0.5,
                              timing_from=[str(tmp_path / "empty")])
    assert bare["timing"] is None and "50% of the measured" in bare["basis"]


def test_reuse_adopts_identical_finished_runs_only(reference, grid_csv, tmp_path, monkeypatch, capsys):
    """`looped sweep --reuse DIR` copies a pilot's finished records of identical runs instead of
    training them again; a record under the same name but trained differently (here: at another
    LR multiplier, as when a preset's default moved after the pilot) is trained afresh, and the
    copies say where they came from, so timing fits do not count them twice."""
    src, _, _ = reference
    pilot = tmp_path / "pilot"
    recs, ids = copy_records(src, pilot)
    atomic_write_json(pilot / f"{ids[0]}.json", {**recs[ids[0]], "lr_scale": 0.5})
    atomic_write_json(pilot / f"{ids[1]}.json", {**recs[ids[1]], "status": "failed"})
    out = tmp_path / "main"
    atomic_write_json(out / f"{ids[2]}.json", {**recs[ids[2]], "loss": 9.0})  # already there: kept
    calls = []
    monkeypatch.setattr("looped.train.train", fake_train(calls))
    assert sweep.main([STUDY, "--grid", str(grid_csv), "--preset", "tiny", "--out", str(out),
                       "--reuse", str(pilot)]) == 0
    assert sorted(calls) == sorted([ids[0], ids[1]])
    assert f"adopted {len(ids) - 3} finished run(s)" in capsys.readouterr().out
    final = records(out)
    assert final[ids[2]]["loss"] == 9.0 and "copied_from" not in final[ids[2]]
    for rid in ids[3:]:
        assert final[rid]["copied_from"] == f"pilot/{rid}.json"
        assert final[rid]["loss"] == recs[rid]["loss"] and final[rid]["study"] == STUDY
    assert sweep.main([STUDY, "--grid", str(grid_csv), "--preset", "tiny", "--out", str(out),
                       "--reuse", str(tmp_path / "nowhere")]) == 2
    assert "is not a folder of run records" in capsys.readouterr().err


def test_a_run_another_sweep_is_training_is_skipped(grid_csv, tmp_path, monkeypatch):
    """Two sweeps over one folder never train one run at once: a run whose lock another
    process holds is skipped (here the lock is held from this process through its own file
    handle, which flock treats like another process), the rest run, and no lock files remain."""
    import fcntl
    runs = registry.load_study(STUDY, grid_csv, "tiny")
    out = tmp_path / "out"
    (out / "ckpt").mkdir(parents=True)
    held = open(out / "ckpt" / f"{runs[0].run_id}.lock", "w")
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    calls, log = [], []
    monkeypatch.setattr("looped.train.train", fake_train(calls))
    sweep.sweep(STUDY, out, grid=grid_csv, preset="tiny", log=log.append)
    assert sorted(calls) == sorted(run.run_id for run in runs[1:])
    assert any(f"{runs[0].run_id}: skipped, another sweep is training it" in line for line in log)
    assert run_state(out, runs[0].run_id) == "running"  # what a dry run shows meanwhile
    assert run_state(out, runs[1].run_id) == "ok" and run_state(out, "nothing") == ""
    held.close()
    assert run_state(out, runs[0].run_id) == ""  # a stale lock file of a dead process
    sweep.sweep(STUDY, out, grid=grid_csv, preset="tiny", log=log.append)
    assert calls[-1] == runs[0].run_id and len(calls) == len(runs)
    assert not (out / "ckpt").exists()


def test_a_run_whose_holder_dies_is_taken_up_at_the_end(grid_csv, tmp_path, monkeypatch):
    """A run skipped because another process held it gets a second look once the rest are done:
    if that process has died (its lock released) in the meantime, this sweep trains the run."""
    import fcntl
    runs = registry.load_study(STUDY, grid_csv, "tiny")
    out = tmp_path / "out"
    (out / "ckpt").mkdir(parents=True)
    held = open(out / "ckpt" / f"{runs[0].run_id}.lock", "w")
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    calls = []
    train = fake_train(calls)

    def train_then_the_holder_dies(tc):
        held.close()
        return train(tc)
    monkeypatch.setattr("looped.train.train", train_then_the_holder_dies)
    log = []
    sweep.sweep(STUDY, out, grid=grid_csv, preset="tiny", log=log.append)
    assert sorted(calls) == sorted(run.run_id for run in runs) and calls[-1] == runs[0].run_id
    assert sum("skipped, another sweep" in line for line in log) == 1


def test_issue25_grid_columns_seed_the_data_order_and_match_tokens():
    """The replicate, matched-token and control rows load with their options and distinct ids."""
    replicates = registry.load_study("cpu-replicates")
    assert {run.seed for run in replicates} == {43, 44}
    assert all(run.data_order == run.seed for run in replicates)
    assert all(run.run_id.endswith(f"_seed{run.seed}_order{run.seed}") for run in replicates)
    matched = registry.load_study("cpu-matched")
    truncated = {(run.budget, run.r, run.s): run for run in registry.load_study("cpu-truncated")}
    for run in matched:
        pair = model_config("prose", r=run.r, s=run.s)  # the same model with full backprop
        assert run.steps == accounting.steps_for_budget(pair, run.budget, run.tokens_per_step)
        # truncation makes a step cheaper, so at one budget the truncated run trains longer
        alone = truncated[(run.budget, run.r, run.s)]
        assert accounting.steps_for_budget(alone.model_config(), run.budget, run.tokens_per_step) > run.steps
        assert run.train_config().steps == run.steps and run.train_config().budget == run.budget
    controls = registry.load_study("cpu-controls")
    assert {run.r for run in controls} == {1}
    assert {run.run_id.split("_")[-1] for run in controls} == {"linear", "hyperconnect2"}


def test_data_order_permutes_the_same_blocks():
    from looped.train import step_blocks
    assert step_blocks(50, None) == list(range(50))
    shuffled = step_blocks(50, 43)
    assert sorted(shuffled) == list(range(50)) and shuffled != list(range(50))
    assert shuffled == step_blocks(50, 43) and shuffled != step_blocks(50, 44)


def test_the_trainer_starts_from_the_micro_batch_the_dry_run_prints(monkeypatch, capsys):
    """For one device memory size (injected: no GPU here) the trainer's first micro-batch is the
    dry run's, run by run: both are looped.memory's choice for the same free memory."""
    from looped import memory
    from looped import train as trainer
    free = 60e9
    assert sweep.main(["gpu-main", "--dry-run", "--device-memory", str(free)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    printed = {ln.split()[0]: int(dict(zip(header, ln.split()))["micro_batch"]) for ln in lines[1:]
               if ln.split()[:1] and ln.split()[0].startswith("C")}
    monkeypatch.setattr(memory, "device_free_bytes", lambda device=None: free)  # what CUDA would report
    runs = registry.load_study("gpu-main")
    assert len(printed) == len(runs) and len(set(printed.values())) > 1
    for run in runs:
        rows = run.tokens_per_step // run.model_config().seq_len
        assert trainer.first_micro_batch(run.model_config(), rows, torch.device("cuda")) == printed[run.run_id]


def test_sweep_sets_expandable_segments_before_torch(grid_csv, tmp_path, monkeypatch):
    """`looped sweep` lets CUDA's allocator grow segments (unless the user configured it) and sets
    that before torch is imported: the allocator reads the variable once."""
    seen, write = [], fake_train([])

    def train(tc):
        seen.append(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
        return write(tc)
    monkeypatch.setattr("looped.train.train", train)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    argv = [STUDY, "--grid", str(grid_csv), "--preset", "tiny"]
    assert sweep.main([*argv, "--out", str(tmp_path / "a")]) == 0
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    assert sweep.main([*argv, "--out", str(tmp_path / "b")]) == 0
    n = len(registry.load_study(STUDY, grid_csv, "tiny"))
    assert seen == ["expandable_segments:True"] * n + ["max_split_size_mb:512"] * n
    probe = "import sys; from looped import cli; from looped.studies import sweep; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], env=env1(), capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_every_training_option_is_one_flag_in_train_sweep_and_slurm(grid_csv, tmp_path, monkeypatch, capsys):
    """TrainConfig is the one definition of a training option: every user-facing field is a
    `looped train` flag; those the sweep passes on are `looped sweep` flags that reach every run
    and the SLURM script when set (and only then); the study is resolved once."""
    import argparse
    import re
    import shlex
    import typing
    from dataclasses import fields

    from looped import options
    from looped.train import TrainConfig
    from looped.train import main as train_main

    def help_of(main):
        with pytest.raises(SystemExit):
            main(["--help"])
        return capsys.readouterr().out

    def shown(flag, text):
        return re.search(rf"(^|[\s\[]){re.escape(flag)}[\s,\]]", text) is not None
    train_help, sweep_help = help_of(train_main), help_of(sweep.main)
    passed = options.cli_fields(passthrough=True)
    assert {f.name for f in passed} >= {"micro_batch", "compile", "peak_flops", "checkpoint_every",
                                        "checkpoint_seconds", "data_dir"}
    for f in fields(TrainConfig):
        flag = options.flags(f)[0]
        assert shown(flag, train_help) == bool(f.metadata["cli"]), flag
        if flag not in ("--preset", "--out"):  # the sweep's own, with their own meaning
            assert shown(flag, sweep_help) == (f in passed), flag
    hints = typing.get_type_hints(TrainConfig)

    def sample(f):  # a value other than the default, by type
        kind = next(t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None))
        return {bool: not f.default, int: 3, float: 2.5e12, str: str(tmp_path / f.name)}[kind]
    values = {f.name: sample(f) for f in passed}
    Path(values["data_dir"]).mkdir()  # a --data-dir must be a folder that exists (a missing one is refused)
    argv = options.option_argv(values)
    ap = argparse.ArgumentParser()
    options.add_options(ap)
    assert options.given_options(ap.parse_args(argv)) == values  # `looped train` reads them back
    seen, loads, load_study = [], [], sweep.load_study

    def fake(tc):
        seen.append(tc)
        return fake_train([])(tc)
    monkeypatch.setattr("looped.train.train", fake)
    monkeypatch.setattr(sweep, "load_study", lambda *a: loads.append(a) or load_study(*a))
    base = [STUDY, "--grid", str(grid_csv), "--preset", "tiny", "--out", str(tmp_path / "o")]
    assert sweep.main([*base, *argv]) == 0
    assert len(loads) == 1 and seen and all({k: getattr(tc, k) for k in values} == values for tc in seen)
    script = tmp_path / "t.sbatch"
    assert sweep.main([*base, "--slurm", "2", "--slurm-script", str(script), *argv]) == 0
    assert shlex.join(argv) in script.read_text().strip().splitlines()[-1]
    assert sweep.main([*base, "--slurm", "2", "--slurm-script", str(script)]) == 0
    bare = script.read_text().strip().splitlines()[-1]
    assert not any(shown(options.flags(f)[0], bare) for f in passed)


# ----------------------------------------------------------------------------- issue 35: budgets, logs, data

def test_dry_run_honours_budgets(capsys):
    runs = registry.load_study("gpu-main")
    one = sorted({r.budget for r in runs})[0]
    assert sweep.main(["gpu-main", "--dry-run", "--budgets", f"{one:g}"]) == 0
    text = capsys.readouterr().out
    subset = [r.run_id for r in runs if r.budget == one]
    listed = [ln.split()[0] for ln in text.splitlines() if ln.split()[:1] and ln.split()[0] in
              {r.run_id for r in runs}]
    assert listed == subset and 0 < len(subset) < len(runs)
    assert f"\n{len(subset)} runs ({len(subset)} to do)" in text
    assert sweep.main(["gpu-main", "--dry-run", "--budgets", "7e99"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--budgets 7e99 matches no run of gpu-main" in err


def test_slurm_creates_its_log_folder_and_passes_budgets(grid_csv, tmp_path):
    script = tmp_path / "slurm" / "t.sbatch"
    assert sweep.main([STUDY, "--grid", str(grid_csv), "--preset", "tiny", "--out", str(tmp_path / "o"),
                       "--slurm", "2", "--slurm-script", str(script), "--budgets", f"{budget(10):g}"]) == 0
    text = script.read_text()
    output = next(ln for ln in text.splitlines() if ln.startswith("#SBATCH --output="))
    assert Path(output.split("=", 1)[1]).parent.is_dir()  # Slurm would not create it
    assert f"--budgets {budget(10):g}" in text.strip().splitlines()[-1]


def test_a_missing_dataset_stops_the_sweep_once(grid_csv, tmp_path, monkeypatch, capsys):
    """A data error is every run's: one line, exit 2, no failed records (not one per run)."""
    from looped.config import DataError
    calls = []

    def no_data(tc):
        calls.append(tc)
        raise DataError("prose corpus sources missing in /x/sources (bigbench.tar.gz): run `make corpus`\nmore")
    monkeypatch.setattr("looped.train.train", no_data)
    out = tmp_path / "o"
    assert sweep.main([STUDY, "--grid", str(grid_csv), "--preset", "tiny", "--out", str(out)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("looped sweep")]
    assert len(err) == 1 and err[0].startswith("looped sweep: error:") and err[0].endswith("make corpus`")
    assert len(calls) == 1 and not list(out.glob("*.json")) and not (out / "ckpt").exists()


def test_the_sweep_prepares_each_dataset_once_before_its_runs(grid_csv, tmp_path, monkeypatch, capsys):
    """The trainer only reads a dataset: the sweep prepares it, once per preset, before the first
    run that trains; a dataset it cannot prepare stops the sweep with one line and exit 2, with no
    run trained and no record written."""
    from looped.config import DataError
    from looped.data import dataset
    prepared, calls = [], []
    monkeypatch.setattr(dataset, "prepare", lambda preset, data_dir=None: prepared.append(preset.name))
    monkeypatch.setattr("looped.train.train", fake_train(calls))
    assert sweep.main([STUDY, "--grid", str(grid_csv), "--preset", "tiny", "--out", str(tmp_path / "o")]) == 0
    assert prepared == ["tiny"] and len(calls) > 1  # one preparation for every run
    assert sweep.main([STUDY, "--grid", str(grid_csv), "--preset", "tiny", "--out", str(tmp_path / "o")]) == 0
    assert prepared == ["tiny"]  # every run finished: nothing to prepare for

    def no_sources(preset, data_dir=None):
        raise DataError("prose corpus sources missing in /x/sources (bigbench.tar.gz): run `make corpus`\nmore")
    monkeypatch.setattr(dataset, "prepare", no_sources)
    calls.clear()
    capsys.readouterr()
    out = tmp_path / "p"
    assert sweep.main([STUDY, "--grid", str(grid_csv), "--preset", "tiny", "--out", str(out)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("looped sweep: error:") and err[0].endswith("make corpus`"), err
    assert calls == [] and not list(out.glob("*.json"))


def test_looped_sweep_without_its_dataset_exits_2_without_a_traceback(grid_csv, tmp_path):
    """The command itself: a dataset that cannot be prepared (the prose preset without its corpus
    sources) is one line on stderr and exit 2."""
    grid = tmp_path / "grid.csv"
    pd.DataFrame(grid_rows()[:1], columns=GRID_COLUMNS).to_csv(grid, index=False)
    (tmp_path / "data").mkdir()
    done = subprocess.run([sys.executable, "-m", "looped", "sweep", STUDY, "--grid", str(grid), "--preset", "prose3",
                           "--out", str(tmp_path / "o"), "--data-dir", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO),  # no corpus sources, whatever this machine has
                               "LOOPED_SOURCES": str(tmp_path / "no-sources")})
    err = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2 and len(err) == 1 and err[0].startswith("looped sweep: error:"), done.stderr
    assert "no dataset for preset prose3" in err[0] and "Traceback" not in done.stderr
