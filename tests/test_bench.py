"""`looped bench train`: the rows it prints and writes (timings are never asserted, only their
shape), the fast/eager ratio, and its failure paths."""
from __future__ import annotations

import json

import pytest

from looped.studies import bench

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bench_train_json_rows(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["train", "--preset", "tiny", "--sizes", "1,2", "--r", "1,2", "--steps", "1",
                       "--paths", "eager", "--micro-batch", "4", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["peak_flops"] > 0 and saved["preset"] == "tiny"
    rows = saved["rows"]
    assert [(x["s"], x["r"], x["path"]) for x in rows] == [(1, 1, "eager"), (1, 2, "eager"), (2, 1, "eager"),
                                                             (2, 2, "eager")]
    for x in rows:
        assert {"s", "r", "d_model", "path", "ms_per_step", "tokens_per_s", "mfu"} <= set(x)
        assert x["ms_per_step"] > 0 and x["tokens_per_s"] > 0 and 0 < x["mfu"]
    assert saved["speedups"] == []  # one path: nothing to compare
    assert "ms/step" in capsys.readouterr().out


def test_speedups_pair_the_two_paths():
    rows = [{"s": 6, "r": 1, "path": "eager", "ms_per_step": 80.0},
            {"s": 6, "r": 1, "path": "fast", "ms_per_step": 32.0},
            {"s": 6, "r": 4, "path": "fast", "ms_per_step": 30.0}]
    assert bench.speedups(rows) == {(6, 1): 2.5}


@pytest.mark.parametrize("args, match", [(["--paths", "turbo"], "unknown path"),
                                          (["--micro-batch", "3"], "do not split"),
                                          (["--r", "3"], "must divide")])
def test_bench_train_bad_input_is_one_line(args, match, capsys):
    assert bench.main(["train", "--preset", "tiny", "--sizes", "1", "--steps", "1", "--peak-flops", "1e9",
                       *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("looped bench train: error:") and match in err and "\n" not in err


def test_bench_profile_shares_sum_to_one(tmp_path, capsys):
    """The eager tiny step: attention and matrix multiplies are found by name, the shares add up."""
    out = tmp_path / "profile.json"
    assert bench.main(["profile", "--preset", "tiny", "--s", "2", "--r", "2", "--path", "eager", "--steps", "1",
                       "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    shares = saved["shares"]
    assert set(shares) == {"attention", "matrix multiplies", "fused elementwise (inductor kernels)", "other"}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["attention"] > 0 and shares["matrix multiplies"] > 0
    assert shares["fused elementwise (inductor kernels)"] == 0  # eager: nothing compiled
    assert saved["d_model"] == 16 and saved["command"].startswith("looped bench profile --preset tiny")
    assert "ms/step" in capsys.readouterr().out


def test_bench_profile_bad_input_is_one_line(capsys):
    assert bench.main(["profile", "--preset", "tiny", "--s", "1", "--r", "3", "--path", "eager"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("looped bench profile: error:") and "must divide" in err and "\n" not in err


def test_bench_train_takes_the_trainers_micro_batch(monkeypatch):
    """Without --micro-batch the benchmark splits each step as the trainer would (on a GPU the
    memory model's choice for the free memory), instead of the whole batch at once."""
    from looped import runtime
    from looped.studies import bench
    chosen = []
    monkeypatch.setattr(runtime, "first_micro_batch", lambda cfg, rows, device: chosen.append(rows) or rows // 2)
    rows, _ = bench.measure_train("tiny", sizes=(1,), r_values=(2,), steps=1, warmup=1, paths=("eager",),
                                  peak_flops=1e9)
    assert chosen and rows[0]["micro_batch"] == chosen[0] // 2
