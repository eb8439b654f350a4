"""The reader of another lab's looped runs (`looped.studies.external.runs`) and its analysis
(`looped.studies.external.analysis`), on the committed tables under runs/external/qlabs-scaling-exponents/."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from looped.cli import main as looped_main
from looped.fit import FitError
from looped.studies.external import analysis as X
from looped.studies.external import runs as XR


@pytest.fixture(scope="module")
def ladder():
    return XR.ladder_runs()


@pytest.fixture(scope="module")
def grid():
    return XR.grid_runs(best=False)


def test_the_committed_data_carry_their_licence():
    assert "MIT License" in (XR.DATA / "LICENSE").read_text()
    assert all((XR.DATA / f).is_file() for f in XR.FILES.values())


def test_our_reading_of_their_formula_reproduces_compute_flops(ladder, grid):
    """Their convention (4w^2 + 2wh blocks, h = 4w up to a multiple of 384, head 50,304 w, causal
    attention 6 w T per executed layer on the ladders, none on the grid): within TOL_THEIRS."""
    for df in (ladder, grid):
        assert np.abs(df.their_formula_ratio - 1).max() < XR.TOL_THEIRS


def test_our_accounting_with_causal_attention_is_within_the_stated_tolerance(ladder, grid):
    """Our accounting (4w MLP, full 12 w T attention) halved in attention is within TOL_OURS of theirs;
    exact where their MLP rounding is nil (d divisible by 3), and never above theirs by more than norms."""
    for df in (ladder, grid):
        assert (df.our_causal_ratio > 1 - 1e-3).all() and (df.our_causal_ratio < 1 + XR.TOL_OURS).all()
    exact = ladder[ladder.depth % 3 == 0]
    assert np.abs(exact.our_causal_ratio - 1).max() < 1e-3
    # full (non-causal) attention: our per-token count exceeds theirs on the ladders
    assert (ladder.flops_per_token * ladder.tokens > ladder.budget).all()


def test_the_reader_recovers_their_design(ladder):
    """Tokens = steps x 524,288 = 5 (plain) or 6 (others) x (N + embedding and head); loop_2 stores
    the plain arm's N at each depth; untied_2 and deep_vanilla have the same N and tokens."""
    k = ladder.tokens / (ladder.n_once + ladder.n_rec + ladder.embedding)
    assert np.allclose(k[ladder.arm == "vanilla"], 5, rtol=1e-3)
    assert np.allclose(k[ladder.arm != "vanilla"], 6, rtol=1e-3)
    by = ladder.set_index(["arm", "depth"])
    n = by.n_once + by.n_rec
    assert np.allclose(n.loc["loop_2"], n.loc["vanilla"].loc[n.loc["loop_2"].index])
    assert np.allclose(n.loc["untied_2"], n.loc["deep_vanilla"]) and (by.loc["loop_2"].r == 2).all()
    steps = pd.read_csv(XR.DATA / XR.FILES["steps"]).dropna()
    assert all(XR.split(int(d)) == (int(p), int(c), int(o)) for d, p, c, o in
               steps[["depth", "layers_prelude", "layers_core", "layers_coda"]].itertuples(index=False))


def test_the_grid_keeps_the_best_weight_decay(grid):
    best = XR.grid_runs()
    assert len(best) == len(grid.groupby(["depth", "r"]))
    assert np.allclose(best.set_index(["depth", "r"]).loss, grid.groupby(["depth", "r"]).loss.min())
    assert (best.tokens == XR.GRID_STEPS * XR.BATCH_TOKENS).all()


def test_looped_fit_accepts_the_exported_tables(tmp_path):
    assert X.main(["--export", str(tmp_path)]) == 0
    for name in ("ladder_runs.csv", "grid_runs.csv"):
        out = tmp_path / (name + ".json")
        assert looped_main(["fit", str(tmp_path / name), "--restarts", "20", "--json", str(out)]) == 0
        res = json.loads(out.read_text())
        assert res["kind"] == "joint" and res["n_runs"] == len(pd.read_csv(tmp_path / name))
    done = subprocess.run([sys.executable, "-m", "looped", "fit", str(tmp_path / "grid_runs.csv"), "--restarts", "10",
                           "--fix", "B=915.82,beta=0.36863"], capture_output=True, text=True)
    assert done.returncode == 0 and "phi" in done.stdout


@pytest.mark.parametrize("damage", ["drop_column", "bad_number", "not_csv"])
def test_a_malformed_table_is_a_one_line_error(tmp_path, damage, capsys):
    folder = tmp_path / "data"
    shutil.copytree(XR.DATA, folder)
    path = folder / XR.FILES["ladder"]
    if damage == "drop_column":
        pd.read_csv(path).drop(columns="val_loss").to_csv(path, index=False)
    elif damage == "bad_number":
        df = pd.read_csv(path).astype({"val_loss": object})
        df.loc[3, "val_loss"] = "n/a"
        df.to_csv(path, index=False)
    else:
        path.write_bytes(b"\x00\xff\x00 binary")
    with pytest.raises(FitError):
        XR.ladder_runs(folder)
    assert X.main(["--data", str(folder), "--export", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("looped external: error:") and "\n" not in err


def test_matched_loss_phi_follows_its_definition(ladder):
    """Placing the loop run at its matched N* on the reference ladder: N_once + 2^phi N_rec = N*, and
    with no token correction the reference's interpolated loss at N* is the loop's loss."""
    loop = next(ladder[(ladder.arm == "loop_2") & (ladder.depth == 10)].itertuples())
    ref = ladder[ladder.arm == "untied_2"]
    m = X.matched_phi(loop, ref, "linear", 0.0)
    assert loop.n_once + 2 ** m["phi"] * loop.n_rec == pytest.approx(m["n_star"], rel=1e-9)
    xs = np.log((ref.n_once + ref.n_rec).to_numpy())
    assert X._interp(np.log(m["n_star"]), xs, ref.loss.to_numpy(), "linear") == pytest.approx(loop.loss, abs=1e-9)
    # a plain run relabelled as r = 2 with all but one parameter in the loop, against its own ladder: phi = 0
    plain = ladder[ladder.arm == "vanilla"]
    run = next(plain[plain.depth == 10].itertuples())
    run = run._replace(n_once=1.0, n_rec=run.n_once - 1.0, r=2)
    assert X.matched_phi(run, plain, "linear", 0.0)["phi"] == pytest.approx(0.0, abs=1e-6)


def test_reduced_analysis_matches_the_committed_results(tmp_path):
    """CI's reduced rerun of `looped external`: the law-free numbers are exact, the fitted ones close."""
    committed = X.read_results()
    out = tmp_path / "quick.json"
    assert X.main(["--quick", "--out", str(out)]) == 0
    quick = X.read_results(out)
    assert quick["settings"]["quick"] and not committed["settings"]["quick"]
    # equal values; r is written 1 since runs tables type it as a count (records.cast), 1.0 in older results
    pd.testing.assert_frame_equal(quick["matched"], committed["matched"], check_dtype=False)
    pd.testing.assert_frame_equal(quick["grid"]["matched"], committed["grid"]["matched"], check_dtype=False)
    assert quick["grid"]["fit"]["phi"] == pytest.approx(committed["grid"]["fit"]["phi"], abs=0.02)
    # the two-arm joint fit is barely identified (the appendix's point): phi only within the committed profile interval
    lo, hi = X.profile_interval(committed["identification"]["phi_profile_loop2_untied2"], "phi", n=14, k=6)
    assert lo <= quick["identification"]["joint_loop2_untied2"]["phi"] <= hi
