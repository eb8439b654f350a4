"""The trainer (looped.train) on the 'tiny' preset: records, determinism, resume after a kill,
DDP on gloo, divergence, gradient accumulation, budgets and the CLI's failure paths.

Every run here is a few dozen steps of a d=16 model on one CPU thread; subprocesses get
OMP_NUM_THREADS=1 so that their float results are bit-identical to the in-process runs.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from looped import accounting
from looped.config import ConfigError, model_config
from looped.data import dataset
from looped.io import atomic_write_json
from looped.train import TrainConfig, TrainError, run_id, train
from looped.train import main as train_main

REPO = Path(__file__).resolve().parents[1]
# d=16, 8 rows of 33 tokens per step.  The eager reference step: these tests are about the
# trainer's bookkeeping, and compiling every tiny run would cost ~30 s each (the fast path has
# its own equivalence tests in test_fast_path.py).
BASE = dict(preset="tiny", r=2, s=1, quiet=True, log_every=1, compile=False)
STEPS = 40
RECORD_FIELDS = ("config", "n", "n_once", "n_rec", "flops_per_token", "budget", "tokens", "steps", "loss",
                 "train_loss_curve", "wall_seconds", "tokens_per_s", "flops_per_s", "device", "versions",
                 "git_commit", "status")


pytestmark = pytest.mark.usefixtures("one_thread")  # the shared 2-core machine


@pytest.fixture(scope="module")
def tiny_data():
    return dataset.prepare("tiny")


@pytest.fixture(scope="module")
def baseline(tiny_data, tmp_path_factory):
    """An uninterrupted 40-step run with a record: the reference for the other tests."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("baseline") / "rec.json"
    return train(TrainConfig(**BASE, steps=STEPS, out=str(out)))


def env1():
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "looped", "train", "--preset", "tiny", "--recurrences", "2", "--size", "1",
            "--quiet", "--no-compile", *map(str, args)]


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------- the record

def test_loss_falls_and_record_is_complete(baseline):
    rec = baseline
    for k in RECORD_FIELDS:
        assert k in rec, k
    cfg = model_config("tiny", r=2, s=1)
    assert rec["config"] == cfg.to_dict()
    assert (rec["n"], rec["n_once"], rec["n_rec"]) == (accounting.n_params(cfg), accounting.n_once(cfg),
                                                      accounting.n_rec(cfg))
    assert rec["n"] == rec["n_once"] + rec["n_rec"]
    assert rec["flops_per_token"] == accounting.flops_per_token(cfg)
    assert rec["budget"] is None and rec["steps"] == STEPS and rec["tokens"] == STEPS * 256
    assert rec["status"] == "ok" and rec["run_id"] == "steps40_r2_s1"
    assert math.isfinite(rec["loss"]) and 0 < rec["loss"] < math.log(256)  # beats the uniform guess
    curve = rec["train_loss_curve"]
    assert [s for s, _ in curve] == list(range(STEPS))  # log_every=1
    first, last = sum(v for _, v in curve[:3]) / 3, sum(v for _, v in curve[-3:]) / 3
    assert last < first - 0.2, (first, last)
    assert rec["wall_seconds"] > 0 and rec["tokens_per_s"] > 0
    assert rec["flops_per_s"] == pytest.approx(rec["tokens_per_s"] * rec["flops_per_token"])
    assert rec["device"].startswith("cpu") and rec["versions"]["torch"] == torch.__version__
    assert rec["git_commit"] is None or len(rec["git_commit"]) >= 40
    # s = 1 asks for d = 8, below the preset's narrowest model (16): the record says what trained
    assert (rec["s"], rec["d_model"], rec["s_model"]) == (1, 16, 2) and "gives d_model 16" in rec["size_note"]
    # written atomically: the file is exactly the returned record, and nothing else is left over
    folder = Path(rec["train"]["out"]).parent
    assert json.loads(Path(rec["train"]["out"]).read_text()) == json.loads(json.dumps(rec))
    assert files_under(folder) == ["rec.json"]


def test_existing_record_is_never_overwritten_silently(tmp_path, tiny_data, capsys):
    out = tmp_path / "rec.json"
    out.write_text('{"status": "ok", "keep": true}')
    with pytest.raises(TrainError, match="exists"):
        train(TrainConfig(**BASE, steps=2, out=str(out)))
    assert json.loads(out.read_text())["keep"]
    assert train_main(["--preset", "tiny", "--size", "1", "--steps", "2", "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("looped train: error:") and "exists" in err and len(err.splitlines()) == 1
    rec = train(TrainConfig(**BASE, steps=2, out=str(out), overwrite=True))
    assert json.loads(out.read_text())["loss"] == rec["loss"]
    assert files_under(tmp_path) == ["rec.json"]


def test_only_rank_0_writes_the_record(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setenv("RANK", "1")  # world size 1, so no process group: just the rank gate
    rec = train(TrainConfig(**BASE, steps=2, out=str(tmp_path / "rec.json"), checkpoint_every=1))
    assert rec["status"] == "ok" and files_under(tmp_path) == []


# ----------------------------------------------------------------------------- determinism and resume

def test_same_seed_same_losses(baseline):
    again = train(TrainConfig(**BASE, steps=STEPS))
    assert again["loss"] == baseline["loss"]
    assert again["train_loss_curve"] == baseline["train_loss_curve"]
    other = train(TrainConfig(**BASE, steps=3, seed=7))
    assert other["train_loss_curve"][0] != baseline["train_loss_curve"][0]


def test_resume_in_process(baseline, tmp_path):
    out, ckpt = tmp_path / "rec.json", tmp_path / "ckpt" / "rec.pt"
    tc = dict(**BASE, steps=STEPS, out=str(out), checkpoint_every=5)
    assert train(TrainConfig(**tc, stop_after=13)) == {"status": "stopped", "step": 13}
    assert ckpt.exists() and not out.exists()  # the last checkpoint is at step 10
    rec = train(TrainConfig(**tc))
    assert rec["loss"] == baseline["loss"]
    assert rec["train_loss_curve"] == baseline["train_loss_curve"]
    assert files_under(tmp_path) == ["rec.json"]  # the checkpoint is scratch: gone once the record exists


def test_resume_with_another_micro_batch(baseline, tmp_path):
    """The micro-batch only changes the summation order (a GPU may pick another after a crash):
    a run resumes from its checkpoint with it and ends at the uninterrupted loss, to rounding."""
    out = tmp_path / "rec.json"
    tc = dict(**BASE, steps=STEPS, out=str(out), checkpoint_every=5)
    assert train(TrainConfig(**tc, stop_after=13))["status"] == "stopped"
    rec = train(TrainConfig(**tc, micro_batch=2))
    assert rec["status"] == "ok" and rec["micro_batch"] == 2
    assert rec["loss"] == pytest.approx(baseline["loss"], rel=1e-4)


def test_resume_after_sigkill(baseline, tmp_path):
    out = tmp_path / "rec.json"
    ckpt = tmp_path / "ckpt" / "rec.pt"
    cmd = cli("--steps", STEPS, "--out", out, "--checkpoint-every", 5)
    proc = subprocess.Popen(cmd, env=env1(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert ckpt.exists() and not out.exists(), "the run finished before it could be killed"
    done = subprocess.run(cmd, env=env1(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    rec = json.loads(out.read_text())
    assert rec["status"] == "ok" and summary["loss"] == rec["loss"]
    assert rec["loss"] == pytest.approx(baseline["loss"], abs=1e-6)
    assert rec["train_loss_curve"][-1] == baseline["train_loss_curve"][-1]
    assert files_under(tmp_path) == ["rec.json"]


def test_corrupt_checkpoint_is_a_one_line_error(tmp_path, tiny_data, capsys):
    out, ckpt = tmp_path / "rec.json", tmp_path / "ckpt" / "rec.pt"
    tc = dict(**BASE, steps=10, out=str(out), checkpoint_every=2)
    train(TrainConfig(**tc, stop_after=3))
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    with pytest.raises(TrainError, match="unreadable"):
        train(TrainConfig(**tc))
    args = ["--preset", "tiny", "--recurrences", "2", "--size", "1", "--steps", "10", "--quiet", "--out", str(out),
            "--checkpoint-every", "2", "--no-compile"]  # eager, like the run that wrote the checkpoint
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "unreadable" in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()
    # --no-resume starts over instead (and the result is an ordinary run)
    assert train_main(args + ["--no-resume"]) == 0
    assert json.loads(out.read_text())["status"] == "ok"


def test_checkpoint_of_another_config_is_refused(tmp_path, tiny_data):
    ckpt = tmp_path / "shared.pt"
    train(TrainConfig(**BASE, steps=10, checkpoint=str(ckpt), checkpoint_every=2, stop_after=2))
    for other in (dict(seed=1), dict(lr_scale=2.0), dict(steps=12)):
        kw = {**BASE, "steps": 10, **other}
        with pytest.raises(TrainError, match="different run configuration"):
            train(TrainConfig(**kw, checkpoint=str(ckpt)))
    with pytest.raises(TrainError, match="different run configuration"):
        train(TrainConfig(**{**BASE, "r": 4}, steps=10, checkpoint=str(ckpt)))


# ----------------------------------------------------------------------------- DDP

def test_ddp_two_processes_match_one(baseline, tmp_path):
    """Two gloo ranks x 4 rows = the same 8-row global batch.  DDP averages the ranks' gradients
    (the mean of two 4-row means) where one process takes one 8-row mean, so sums happen in a
    different order: agreement is to float rounding (~1e-7 per step), not bitwise."""
    out = tmp_path / "rec.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "looped", "train", "--preset", "tiny", "--recurrences", "2", "--size", "1", "--quiet",
           "--no-compile", "--steps", str(STEPS), "--out", str(out), "--checkpoint-every", "10"]
    done = subprocess.run(cmd, env=env1(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summaries = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1  # only rank 0 reports
    rec = json.loads(out.read_text())
    assert rec["world_size"] == 2 and rec["status"] == "ok"
    assert rec["loss"] == pytest.approx(baseline["loss"], abs=1e-4)
    assert files_under(tmp_path) == ["rec.json"]


# ----------------------------------------------------------------------------- divergence

def test_nan_loss_stops_the_run_as_diverged(tmp_path, tiny_data, monkeypatch, capsys):
    from looped.model import LoopedGPT
    forward, calls = LoopedGPT.forward, {"n": 0}

    def poisoned(self, idx, targets=None):
        out = forward(self, idx, targets)
        if targets is not None and self.training:
            calls["n"] += 1
            if calls["n"] > 3:
                return out * float("nan")
        return out

    monkeypatch.setattr(LoopedGPT, "forward", poisoned)
    out = tmp_path / "runs" / "bad.json"
    rec = train(TrainConfig(**BASE, steps=20, out=str(out), checkpoint_every=2))
    assert rec["status"] == "diverged" and rec["loss"] is None
    assert rec["train_loss_curve"][-1] == [3, None] and len(rec["train_loss_curve"]) == 4
    assert json.loads(out.read_text())["status"] == "diverged"
    assert files_under(out.parent) == ["bad.json"]
    # the CLI says so with exit code 3 (not an error: the record is a valid result)
    calls["n"] = 0
    code = train_main(
        [
            "--preset",
            "tiny",
            "--size",
            "1",
            "--steps",
            "20",
            "--quiet",
            "--no-compile",  # eager, like BASE:
            "--out",
            str(tmp_path / "cli.json"),
        ]
    )  # the poisoned forward would recompile every step
    assert code == 3 and '"status": "diverged"' in capsys.readouterr().out
    # the fitter ignores diverged runs
    fit = pytest.importorskip("looped.fit")
    monkeypatch.setattr(LoopedGPT, "forward", forward)
    train(TrainConfig(**BASE, steps=2, out=str(out.parent / "good.json")))
    with pytest.warns(UserWarning, match="not 'ok'"):
        runs = fit.load_runs(out.parent)
    assert len(runs) == 1 and runs.iloc[0]["loss"] > 0


# ----------------------------------------------------------------------------- micro-batches, budgets, bad input

def test_gradient_accumulation_matches_one_batch(baseline):
    """4 micro-batches of 2 rows = one batch of 8, up to float rounding: the gradient is summed
    in another order, and MuonH's normalised updates let those ~1e-7 differences grow to ~1e-5
    in 40 steps.  A real accumulation bug (wrong scaling, wrong rows) shows at step 0 by ~1e-2."""
    rec = train(TrainConfig(**BASE, steps=STEPS, micro_batch=2))
    assert rec["loss"] == pytest.approx(baseline["loss"], abs=1e-4)
    for (step, a), (_, b) in zip(rec["train_loss_curve"][:20], baseline["train_loss_curve"][:20]):
        assert a == pytest.approx(b, abs=2e-5), step


@pytest.mark.parametrize("kw, match", [
    (dict(micro_batch=3), "do not split"),
    (dict(micro_batch=16), "do not split"),
    (dict(micro_batch=-1), "do not split"),
    (dict(micro_batch=0), "do not split"),  # not the default in its place
    (dict(batch_tokens=100), "multiple of seq_len"),
    (dict(steps=0), "steps must be"),
    (dict(steps=None), "give a budget or a number of steps"),
    (dict(r=3), "must divide"),
])
def test_impossible_settings_are_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        train(TrainConfig(**{**BASE, "steps": 5, **kw}))


def test_a_size_with_an_exact_width_records_itself():
    from looped.config import PRESETS, size_note, size_used
    tiny, paper = PRESETS["tiny"], PRESETS["paper"]
    assert size_used(tiny, 2) == 2 and size_note(tiny, 2, narrowest=True) is None
    assert size_used(paper, 2.5) == 4 and "d_model 256" in size_note(paper, 2.5)
    assert size_note(tiny, 1) is None  # no warning (one-line stderr stays one line), but the record's note:
    assert "gives d_model 16" in size_note(tiny, 1, narrowest=True)


def test_installed_package_records_no_commit_of_the_folder_it_runs_in(tmp_path):
    """Outside a checkout (an installed copy of the package) the record's git_commit is None, not
    the commit of whatever repository the current folder is in."""
    import shutil
    site = tmp_path / "site"
    shutil.copytree(REPO / "looped", site / "looped", ignore=shutil.ignore_patterns("__pycache__"))
    other = tmp_path / "other"
    other.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=other, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], cwd=other, check=True)
    probe = "import looped.config as c, looped.train as t; print(c.CHECKOUT, t.git_commit())"
    done = subprocess.run([sys.executable, "-c", probe], cwd=other, capture_output=True, text=True, timeout=120,
                          env={**env1(), "PYTHONPATH": str(site)})
    assert done.stdout.split() == ["None", "None"], done.stdout + done.stderr


def test_budget_sets_steps_through_accounting(tmp_path, tiny_data):
    cfg = model_config("tiny", r=2, s=1)
    budget = accounting.flops_per_token(cfg) * 256 * 7.2
    rec = train(TrainConfig(**{**BASE, "log_every": 10}, budget=budget, out=str(tmp_path / "rec.json")))
    assert rec["steps"] == accounting.steps_for_budget(cfg, budget, 256) == 7
    assert rec["tokens"] == 7 * 256 and rec["budget"] == budget
    assert rec["run_id"] == run_id(TrainConfig(**BASE, budget=budget)) == f"C{budget:.3g}_r2_s1".replace("+", "")


def test_budget_beyond_the_corpus_is_refused(tmp_path, tiny_data, capsys):
    rows = dataset.Dataset(tiny_data).n_rows("train")
    cfg = model_config("tiny", r=2, s=1)
    budget = accounting.flops_per_token(cfg) * 256 * (rows // 8 + 5)
    with pytest.raises(TrainError, match="never repeat data"):
        train(TrainConfig(**BASE, budget=budget))
    out = tmp_path / "rec.json"
    assert train_main(["--preset", "tiny", "--recurrences", "2", "--size", "1", "--budget", f"{budget:.6g}",
                       "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "never repeat data" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_cli_accepts_the_torchrun_separator(tmp_path, tiny_data, capsys):
    out = tmp_path / "rec.json"
    assert train_main(["--", "--preset", "tiny", "--r", "1", "--size", "1", "--steps", "2", "--quiet", "--no-compile",
                       "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "steps2_r1_s1"
    assert json.loads(out.read_text())["r"] == 1


def test_atomic_write_json_leaves_no_temp_files(tmp_path):
    path = tmp_path / "a" / "b.json"
    atomic_write_json(path, {"x": 1})
    atomic_write_json(path, {"x": 2})
    assert json.loads(path.read_text()) == {"x": 2} and files_under(tmp_path) == ["a/b.json"]


def test_preset_lr_scale_is_the_default_multiplier(tiny_data, monkeypatch):
    """A preset re-based by an LR sweep (`Preset.lr_scale`) multiplies HyperP's learning rates of
    every run that does not set its own; run names mark only multipliers other than the preset's."""
    from dataclasses import replace

    from looped import optim
    from looped.config import PRESETS, run_name
    monkeypatch.setitem(PRESETS, "tiny", replace(PRESETS["tiny"], lr_scale=1.4))
    tc = TrainConfig(**BASE, steps=2)
    rec = train(tc)
    assert rec["lr_scale"] == 1.4
    hyperp = optim.learning_rates(tc.model_config(), rec["batch_tokens"], rec["tokens"])
    assert rec["learning_rates"]["matrix"] == pytest.approx(1.4 * hyperp["matrix"])
    assert train(TrainConfig(**BASE, steps=2, lr_scale=1.0))["learning_rates"]["matrix"] == pytest.approx(
        hyperp["matrix"]
    )
    cfg = tc.model_config()
    assert run_name(cfg, steps=2) == run_name(cfg, steps=2, lr_scale=1.4) == "steps2_r2_s1"
    assert run_name(cfg, steps=2, lr_scale=1.0) == "steps2_r2_s1_lr1"


# ----------------------------------------------------------------------------- the GPU path, simulated on the CPU

def fake_free_memory(monkeypatch, micro: int) -> float:
    """Make the device report just enough free memory (as CUDA's mem_get_info would) for `micro`
    rows of BASE's model per forward pass: the trainer then picks its micro-batch from it."""
    from looped import memory
    cfg = model_config("tiny", r=2, s=1)
    free = memory.RESERVE_BYTES + memory.predict_peak(cfg, micro, "fp32")["peak_bytes"] / memory.SAFETY + 1
    monkeypatch.setattr(memory, "device_free_bytes", lambda device=None: free)
    assert memory.auto_micro_batch(cfg, 8, free, "fp32") == micro
    return free


def oom_forward(monkeypatch, when) -> list[int]:
    """LoopedGPT.forward raises torch.OutOfMemoryError on the training calls `when(call, rows)`
    picks (calls counted from 1); returns the rows of every training call."""
    from looped.model import LoopedGPT
    forward, rows_seen = LoopedGPT.forward, []

    def maybe_oom(self, idx, targets=None):
        if targets is not None and self.training:
            rows_seen.append(idx.shape[0])
            if when(len(rows_seen), idx.shape[0]):
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return forward(self, idx, targets)
    monkeypatch.setattr(LoopedGPT, "forward", maybe_oom)
    return rows_seen


def assert_same_curve(rec, ref, tol=2e-5):
    """Equal to float rounding: a step at another micro-batch sums its gradient in another order."""
    assert rec["loss"] == pytest.approx(ref["loss"], abs=5 * tol)
    for (step, a), (_, b) in zip(rec["train_loss_curve"], ref["train_loss_curve"], strict=True):
        assert a == pytest.approx(b, abs=tol), step


def test_automatic_micro_batch_comes_from_the_free_memory(tiny_data, monkeypatch):
    fake_free_memory(monkeypatch, 2)
    rec = train(TrainConfig(**BASE, steps=6))
    assert rec["micro_batch"] == 2 and rec["micro_batch_history"] == [[0, 2]]
    fixed = train(TrainConfig(**BASE, steps=6, micro_batch=2))
    assert rec["train_loss_curve"] == fixed["train_loss_curve"] and rec["loss"] == fixed["loss"]


@pytest.mark.parametrize("at_step", [0, 1])
def test_out_of_memory_halves_the_micro_batch_at_any_step(at_step, tiny_data, tmp_path, monkeypatch):
    """An automatic micro-batch that does not fit after all, at step 0 or at step 1 (when the
    optimizer state has arrived), is halved and the step redone: the run ends ok, its record
    says so, and it trains as a run started at the halved micro-batch."""
    oom_forward(monkeypatch, lambda call, rows: rows == 8 and call > at_step)  # step k's forward is call k + 1
    rec = train(TrainConfig(**BASE, steps=12, out=str(tmp_path / "rec.json")))
    assert rec["status"] == "ok" and rec["micro_batch"] == 4
    assert rec["micro_batch_history"] == [[0, 8], [at_step, 4]]
    assert json.loads((tmp_path / "rec.json").read_text())["micro_batch_history"] == rec["micro_batch_history"]
    ref = train(TrainConfig(**BASE, steps=12, micro_batch=4))
    assert_same_curve(rec, ref)
    if at_step == 0:
        assert rec["train_loss_curve"] == ref["train_loss_curve"]


def test_out_of_memory_mid_step_discards_the_partial_gradient(tiny_data, monkeypatch):
    """At 4 rows a step is two micro-batches; the second one of step 1 runs out of memory after
    the first has accumulated its gradient, which the redone step must not count again."""
    fake_free_memory(monkeypatch, 4)
    oom_forward(monkeypatch, lambda call, rows: rows == 4 and call == 4)
    rec = train(TrainConfig(**BASE, steps=12))
    assert rec["status"] == "ok" and rec["micro_batch_history"] == [[0, 4], [1, 2]]
    assert_same_curve(rec, train(TrainConfig(**BASE, steps=12, micro_batch=2)))


def test_a_halved_run_resumes_at_its_halved_micro_batch(tiny_data, tmp_path, monkeypatch):
    rows_seen = oom_forward(monkeypatch, lambda call, rows: rows == 8 and call > 1)  # 8 rows fit step 0 only
    tc = dict(**BASE, steps=12, out=str(tmp_path / "rec.json"), checkpoint_every=5)
    assert train(TrainConfig(**tc, stop_after=7))["status"] == "stopped"
    before = len(rows_seen)
    rec = train(TrainConfig(**tc))
    assert rec["micro_batch_history"] == [[0, 8], [1, 4]] and set(rows_seen[before:]) == {4}


def test_out_of_memory_at_a_chosen_micro_batch_fails_the_run(tiny_data, monkeypatch):
    oom_forward(monkeypatch, lambda call, rows: call == 2)
    with pytest.raises(torch.OutOfMemoryError):
        train(TrainConfig(**BASE, steps=4, micro_batch=4))


def test_each_run_starts_its_own_peak_memory_count(tiny_data, monkeypatch):
    """On CUDA a run's recorded peak is its own, not the largest of the sweep so far (simulated
    CUDA allocator); on the CPU it is the process's peak and the record says so."""
    from looped import train as trainer
    allocator = {"now": 0, "peak": 0}
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda device=None: allocator.update(peak=allocator["now"]))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocator["peak"])
    cuda, peaks = torch.device("cuda"), []
    for size in (10e9, 2e9):  # a large run, then a small one, in one process
        trainer.fresh_device_memory(cuda)
        allocator["peak"] = max(allocator["peak"], allocator["now"] + size)
        peaks.append(trainer.peak_memory_bytes(cuda))
    assert peaks == [(10e9, "run"), (2e9, "run")]
    starts = []
    monkeypatch.setattr(trainer, "fresh_device_memory", starts.append)
    recs = [train(TrainConfig(**BASE, steps=2)) for _ in range(2)]
    assert len(starts) == 2 and {r["peak_memory_scope"] for r in recs} == {"process"}


def test_checkpoint_cadence_defaults_by_device(capsys):
    from looped.checkpoint import Cadence
    cpu, gpu = (Cadence.of(TrainConfig(), torch.device(d)) for d in ("cpu", "cuda"))
    assert (cpu.steps, cpu.seconds) == (25, 0) and (gpu.steps, gpu.seconds) == (0, 600)
    own = Cadence.of(TrainConfig(checkpoint_every=7, checkpoint_seconds=0), torch.device("cuda"))
    assert (own.steps, own.seconds) == (7, 0)
    with pytest.raises(ConfigError, match="must be >= 0"):
        train(TrainConfig(**BASE, steps=2, checkpoint_seconds=-1))
    assert train_main(["--preset", "tiny", "--steps", "2", "--checkpoint-seconds", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "must be >= 0" in err


def test_time_based_checkpoints_resume_to_the_same_record(baseline, tmp_path, monkeypatch):
    """Checkpoints every `checkpoint_seconds` of training (a GPU's default): a run stopped between
    two of them resumes from the last one and ends with the uninterrupted run's record; the time
    spent saving is recorded on its own."""
    from looped import checkpoint
    from looped import train as trainer
    clock = iter(range(10 ** 6))  # the cadence's clock reads one second later at every look
    monkeypatch.setattr(checkpoint, "now", lambda: float(next(clock)))
    saves, save = [], trainer.save_checkpoint

    def slow_save(path, model, optimizers, step, state):
        saves.append(step)
        time.sleep(0.05)
        save(path, model, optimizers, step, state)
    monkeypatch.setattr(trainer, "save_checkpoint", slow_save)
    out, ckpt = tmp_path / "rec.json", tmp_path / "ckpt" / "rec.pt"
    tc = dict(**BASE, steps=STEPS, out=str(out), checkpoint_every=0, checkpoint_seconds=4)
    assert train(TrainConfig(**tc, stop_after=13)) == {"status": "stopped", "step": 13}
    assert saves == [4, 8, 12] and torch.load(ckpt, weights_only=False)["step"] == 12
    rec = train(TrainConfig(**tc))
    assert rec["loss"] == baseline["loss"] and rec["train_loss_curve"] == baseline["train_loss_curve"]
    assert rec["checkpoints"] == len(saves) > 3
    assert rec["checkpoint_save_seconds"] >= 0.05 * (len(saves) - 1)  # less the one the resume began from
    assert files_under(tmp_path) == ["rec.json"]


def test_a_failed_compile_falls_back_to_the_eager_step(tiny_data, monkeypatch, capsys):
    """Where inductor cannot compile (say, no working C++ compiler) the run trains with the eager
    reference step: one warning line, `compile: false` and the reason in the record, and the
    losses of a --no-compile run."""
    import torch._inductor.exc as inductor_exc

    def uncompilable(model, **kw):
        def first_call(*args, **kwargs):
            raise inductor_exc.InductorError(inductor_exc.CppCompileError(["c++", "k.cpp"], "error: no"), None)
        return first_call
    monkeypatch.setattr(torch, "compile", uncompilable)
    rec = train(TrainConfig(**{**BASE, "compile": True}, steps=8))
    assert rec["status"] == "ok" and rec["compile"] is False
    assert rec["compile_error"] == "InductorError: CppCompileError: C++ compile error"
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("looped train:")]
    assert len(err) == 1 and err[0].startswith("looped train: warning: torch.compile failed")
    eager = train(TrainConfig(**BASE, steps=8))
    assert rec["train_loss_curve"] == eager["train_loss_curve"] and rec["loss"] == eager["loss"]


@pytest.mark.slow
def test_no_cxx_compiler_falls_back_to_the_eager_step(tiny_data, tmp_path, monkeypatch):
    """The real failure (about 15 s of tracing before inductor finds no compiler)."""
    import torch._inductor.config as inductor_config
    monkeypatch.setattr(inductor_config.cpp, "cxx", ("/nonexistent/c++",))
    monkeypatch.setattr(inductor_config, "fx_graph_cache", False)  # a cached kernel needs no compiler
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    rec = train(TrainConfig(**{**BASE, "compile": True}, steps=3))
    assert rec["status"] == "ok" and rec["compile"] is False and "C++ compiler" in rec["compile_error"]


def test_training_in_process_prefers_expandable_segments(tiny_data, monkeypatch):
    """A notebook that calls train() gets expandable segments as the CLIs do: before CUDA's first
    use through the variable, after it through the running allocator; a user's setting stays."""
    from looped import memory
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    train(TrainConfig(**BASE, steps=1))
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    train(TrainConfig(**BASE, steps=1))
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    applied = []  # CUDA already initialised (simulated): the running allocator is told
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", applied.append)
    memory.prefer_expandable_segments()
    assert applied == ["expandable_segments:True"]


# ----------------------------------------------------------------------------- a dataset that is not there

def test_train_without_a_prepared_dataset_stops_in_one_line(tmp_path, capsys):
    """The trainer reads a prepared dataset and never builds one: without it, a one-line DataError
    naming the command that prepares it (exit 2 from `looped train`, no traceback), and the data
    folder is left as it was."""
    from looped.config import DataError
    empty = tmp_path / "data"
    empty.mkdir()
    with pytest.raises(DataError, match=r"^no prepared dataset for preset tiny .*: run `looped data prepare "
                                        r"--preset tiny --data-dir .*` first$"):
        train(TrainConfig(**BASE, steps=2, data_dir=str(empty)))
    assert list(empty.iterdir()) == []
    done = subprocess.run(cli("--steps", 2, "--out", tmp_path / "rec.json"), capture_output=True, text=True,
                          env={**env1(), "LOOPED_DATA": str(empty)}, cwd=tmp_path, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("looped train: error: no prepared dataset for preset tiny (")
    assert lines[0].endswith(": missing): run `looped data prepare --preset tiny` first")
    assert list(empty.iterdir()) == [] and not (tmp_path / "rec.json").exists()


def test_a_stale_dataset_is_named_as_such(tiny_data, tmp_path):
    from looped.config import DataError
    copy = tmp_path / tiny_data.name
    shutil.copytree(tiny_data, copy)
    meta = json.loads((copy / "meta.json").read_text())
    (copy / "meta.json").write_text(json.dumps({**meta, "recipe": -1}))
    with pytest.raises(DataError, match="stale or damaged"):
        train(TrainConfig(**BASE, steps=2, data_dir=str(tmp_path)))


# ----------------------------------------------------------------------------- the step's recovery (StepGuard)

class FakeDist:
    world, rank, main, device = 1, 0, True, torch.device("cpu")


def guard_of(micro=8, chosen=False, compiled=False):
    from looped.runtime import StepGuard
    events = []
    guard = StepGuard(FakeDist(), micro, [[0, micro]], chosen=chosen, compiled=compiled,
                      to_eager=lambda: events.append("eager"), zero_grad=lambda: events.append("zero"))
    return guard, events


def test_step_guard_halves_the_micro_batch_until_the_step_fits():
    guard, events = guard_of(micro=8)
    tried = []

    def work(micro, loss_sum):
        tried.append(micro)
        if micro > 2:
            raise torch.OutOfMemoryError("simulated")
        loss_sum += 1.5

    assert guard.step(3, work, also=(lambda: 1,)) == (1.5, [1.0], True)
    assert tried == [8, 4, 2] and guard.micro == 2 and guard.history == [[0, 8], [3, 4], [3, 2]]
    assert events == ["zero", "zero"]  # the partial step's gradients, once per retry
    assert guard.step(4, work) == (1.5, [], False) and guard.history[-1] == [3, 2]


def test_step_guard_never_halves_a_chosen_micro_batch_or_one_row():
    def oom(micro, loss_sum):
        raise torch.OutOfMemoryError("simulated")
    for guard, _ in (guard_of(micro=4, chosen=True), guard_of(micro=1)):
        with pytest.raises(torch.OutOfMemoryError):  # one process: the error itself
            guard.step(0, oom)
    guard, _ = guard_of(micro=4, chosen=True)
    guard.dd.world = 2  # several ranks: the agreed count of ranks, as a TrainError
    with pytest.raises(TrainError, match="1 of 2 ranks ran out of memory at step 5 with micro-batch 4: lower"):
        _agree_alone(guard, oom)


def _agree_alone(guard, work):
    """StepGuard.step with world 2 on one process: the all-reduce is the identity."""
    import torch.distributed
    real = torch.distributed.all_reduce
    torch.distributed.all_reduce = lambda t: t.mul_(1)
    try:
        return guard.step(5, work)
    finally:
        torch.distributed.all_reduce = real


def test_step_guard_falls_back_to_eager_once_on_a_failed_compile(capsys):
    guard, events = guard_of(compiled=True)
    calls = []

    def work(micro, loss_sum):
        calls.append(guard.compiled)
        if guard.compiled:
            failing_compile(micro, loss_sum)
        loss_sum += 2.0

    assert guard.step(0, work) == (2.0, [], True)
    assert calls == [True, False] and events == ["zero", "eager"] and guard.micro == 8
    assert guard.compiled is False and guard.compile_error == "InductorError: CppCompileError: C++ compile error"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("looped train: warning: torch.compile failed, training eager")
    plain, _ = guard_of(compiled=False)  # an eager run has no fallback: the error is the run's
    with pytest.raises(RuntimeError, match="C[+][+] compile error"):
        plain.step(0, failing_compile)


def failing_compile(micro, loss_sum):
    import torch._inductor.exc as inductor_exc
    raise inductor_exc.InductorError(inductor_exc.CppCompileError(["c++", "k.cpp"], "error: no"), None)
