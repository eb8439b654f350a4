"""The device check (tools/gpu_check.py) end to end on the CPU with the tiny preset, as a
subprocess through its shell wrapper: every phase runs, the JSON has its figures, every check
passes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_gpu_check_runs_end_to_end_on_the_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PY": sys.executable, "OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh"), "--preset", "tiny", "--steps", "20"],
                          env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (tmp_path / "log.txt").exists() and (tmp_path / "nvidia-smi.txt").exists()
    phases = res["phases"]
    assert set(phases) == {"env", "gemm", "data", "dtypes", "throughput_r1_eager", "throughput_r4_eager", "train"}
    assert not res["errors"] and res["ok"]
    assert all(res["checks"].values()) and {"bf16_matches_fp32", "training_loss_falls",
                                            "checkpoint_written_and_resumed"} <= set(res["checks"])
    assert phases["gemm"]["flops_per_s"] > 0
    assert len(phases["dtypes"]["curves"]["bf16"]) == len(phases["dtypes"]["curves"]["fp32"]) == 8
    for r in (1, 4):
        t = phases[f"throughput_r{r}_eager"]
        assert t["status"] == "ok" and t["tokens_per_s"] > 0 and t["predicted_peak_bytes"] > 0
    train = phases["train"]
    assert train["status"] == "ok" and train["stopped_at"] == 10 and train["checkpoint_bytes"] > 0
    assert train["loss_fall"] > 0.05  # (its duration is not asserted: this machine is shared)


def test_gpu_check_budget_guard_skips_phases(tmp_path):
    done = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh"), "--preset", "tiny", "--budget-s", "0.5"],
                          env={**os.environ, "OUT": str(tmp_path), "PY": sys.executable, "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=120)
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    assert "skipped" in res["phases"]["train"] and done.returncode in (0, 1)
