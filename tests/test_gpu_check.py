"""The one-shot device check (tools/device_check.sh + tools/gpu_check.py) end to end on the CPU with
the tiny preset, as a subprocess through its shell wrapper: it exits 0, every phase runs and every
check passes, the results folder holds a handful of small files, and the data and the inductor
cache went to WORK instead."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "device_check.sh"


def run_check(tmp_path, **env):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "OUT": str(out), "WORK": str(work), "PY": sys.executable, "PRESET": "tiny",
           "COMPILE": "0", "CUDA_VISIBLE_DEVICES": "", **env}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=280)
    return done, out, work


def assert_small_results(out: Path):
    files = sorted(out.rglob("*"))
    assert all(f.is_file() for f in files), files  # no folders: the data and caches live in WORK
    assert 1 <= len(files) <= 5 and all(f.stat().st_size < 1_000_000 for f in files), \
        [(f.name, f.stat().st_size) for f in files]
    return {f.name for f in files}


@pytest.mark.timeout(300)
def test_device_check_runs_end_to_end_on_the_cpu(tmp_path):
    done, out, work = run_check(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert assert_small_results(out) == {"device_check.json", "summary.txt", "log.txt", "nvidia-smi.txt"}
    assert list((work / "data").glob("*/train-000.bin"))  # the synthetic dataset, outside OUT
    res = json.loads((out / "device_check.json").read_text())
    phases = res["phases"]
    assert set(phases) == {"env", "gemm", "data", "correctness", "muon", "sdpa", "throughput_r4_eager",
                           "throughput_r1_eager", "oom", "grid", "resume", "r_sweep"}
    assert res["ok"] and not res["errors"] and not res["skipped"] and all(res["checks"].values())
    assert {"bf16_eager_matches_fp32", "polar_express_close_to_exact_polar", "muon_step_matches_fp32",
            "resume_matches_straight_run", "r_sweep_r8_loss_falls", "oom_halves_and_finishes"} <= set(res["checks"])
    # the out-of-memory phase (simulated on the CPU above 2 of the 8 rows): halved twice, finished
    assert phases["oom"]["status"] == "ok" and phases["oom"]["micro_batch_history"] == [[0, 8], [0, 4], [0, 2]]
    assert set(res["gemm_tflops"]) == {"n256", "n512"} and all(v > 0 for v in res["gemm_tflops"].values())
    assert phases["sdpa"]["sdpa_ops"]  # which scaled-dot-product-attention op ran
    for r in (1, 4):
        t = phases[f"throughput_r{r}_eager"]
        assert t["status"] == "ok" and t["tokens_per_s"] > 0 and t["predicted_peak_bytes"] > 0
        assert len(t["loss_curve"]) == 3  # step 0 + 2 timed steps, each logged
    by_width = res["mfu_eager_by_width"]  # what replaces the assumed MFU once a GPU run exists
    assert set(by_width) == {"s2", "s4"} and all(set(v) == {"r1", "r8"} and min(v.values()) > 0
                                                 for v in by_width.values())
    assert phases["resume"]["stopped_at"] == 6 and phases["resume"]["checkpoint_bytes"] > 0
    assert not (work / "resume.pt").exists()
    summary = (out / "summary.txt").read_text()
    assert "mfu_eager_by_width" in summary and "FAILED" not in summary and "OK True" in summary


@pytest.mark.timeout(120)
def test_the_budget_guard_skips_phases_and_the_run_still_reports(tmp_path):
    done, out, _ = run_check(tmp_path, BUDGET_S="1")  # the imports alone take longer
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_small_results(out)
    res = json.loads((out / "device_check.json").read_text())
    assert {"gemm", "data"} <= set(res["skipped"]) and "env" not in res["skipped"] and res["ok"]
    assert "SKIPPED" in (out / "summary.txt").read_text()


def test_work_inside_out_is_refused(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OUT": str(tmp_path), "WORK": str(tmp_path / "work")})
    assert done.returncode == 2 and "outside" in done.stderr


def load_gpu_check():
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "tools" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_summary_survives_none_and_a_diverged_run(tmp_path):
    """summary.txt is written whatever a phase recorded: None where a figure was expected (a
    diverged run's validation loss, a missing MFU), a record missing a key, checks that failed."""
    gc = load_gpu_check()
    dc = gc.DeviceCheck(gc.parse(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]))
    nothing = dict.fromkeys(("micro_batch", "tokens_per_s", "mfu_vs_spec", "mfu_vs_gemm", "first_step_s",
                             "peak_over_predicted"))
    dc.res["phases"] = {
        "throughput_r4_eager": nothing, "correctness": {"loss_rel_diff": None, "grad_cosine": float("nan")},
        "muon": {"cosine_device_vs_exact": None, "cosine_fp32_vs_exact": 0.99, "muon_step_cosine_vs_fp32": [None]},
        "resume": {"val_straight": None, "val_resumed": 5.1, "max_curve_diff_after_resume": None},
        "oom": {"status": "diverged", "micro_batch_history": [[0, 128]], "wall_s": None, "allocated_after": None},
        "grid": {"rows": [{"s": 4, "r": 1, "micro_batch": None, "mfu": None, "peak_over_predicted": None}]},
        "r_sweep": {"r1": {"val": None}, "r2": {"val": 4.2}, "stopped": "budget"},
        "compiled": {"grad_cosine": 1.0},  # a key missing
        "sdpa": {"skipped": "needs ~5s, 1s left"}, "gemm": {"error": "RuntimeError: boom"}}
    dc.res["checks"] = {"resume_matches_straight_run": False}
    dc.res.update(ok=False, errors=["gemm"], skipped=["sdpa"])
    dc.save()
    text = (tmp_path / "out" / "summary.txt").read_text()
    assert "resume: val - straight vs 5.1000 resumed" in text and '"r1": null, "r2": 4.2' in text
    assert "compiled: (no summary line: KeyError" in text and "FAILED ['resume_matches_straight_run']" in text
    assert "ERROR RuntimeError: boom" in text and "SKIPPED needs" in text and text.rstrip().endswith("skipped ['sdpa']")
    assert json.loads((tmp_path / "out" / "device_check.json").read_text())["ok"] is False
