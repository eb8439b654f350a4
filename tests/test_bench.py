"""`looped bench train`: the rows it prints and writes (timings are never asserted, only their
shape), the fast/eager ratio, and its failure paths."""
from __future__ import annotations

import json

import pytest

from looped import bench

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
