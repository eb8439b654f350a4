"""looped.studies.corpora: phi on two corpora, recovered from synthetic runs of one design."""
import numpy as np
import pandas as pd

from looped.fit import fit, load_runs
from looped.studies import corpora
from looped.studies.constancy.analysis import count_embeddings
from looped.studies.simulate import law_records


def _table(law, seed, noise=0.004):
    recs = pd.DataFrame(law_records("cpu3-main", law=law, noise=noise, seed=seed))
    return recs[["r", "n_once", "n_rec", "tokens", "loss", "budget", "s", "d_model", "preset"]].assign(
        injection=[("none" if r == 1 else "linear") for r in recs.r])


def test_a_known_difference_in_phi_is_recovered_with_its_interval():
    base = fit(load_runs("runs/cpu-main"), restarts=64).law
    a, b = base.replace(phi=0.45), base.replace(phi=0.75)
    tables = {}
    for study, law, seed in (("one", a, 1), ("two", b, 2)):
        df = _table(law, seed)
        tables[(study, "paper")] = df
        tables[(study, "head counted")] = count_embeddings(df, head=True, preset="prose3")
    out = corpora.corpus_fits(("one", "two"), bootstrap=40, restarts=64, boot_restarts=4, tables=tables)
    fits = pd.DataFrame(out["fits"]).set_index(["study", "convention"])
    assert abs(fits.loc[("one", "paper"), "phi"] - 0.45) < 0.1 and abs(fits.loc[("two", "paper"), "phi"] - 0.75) < 0.1
    d = pd.DataFrame(out["difference"]).set_index("convention")
    assert d.loc["paper", "lo"] < 0.3 < d.loc["paper", "hi"] and d.loc["paper", "lo"] > 0   # 0.3 inside, 0 outside
    assert np.isfinite(d.loc["head counted", "dphi"]) and d.loc["paper", "resamples"] == 40


def test_a_study_without_enough_runs_is_reported_not_fitted():
    tables = {(s, c): pd.DataFrame(columns=["r", "n_once", "n_rec", "tokens", "loss", "budget"])
              for s in ("one", "two") for c in corpora.CONVENTIONS}
    out = corpora.corpus_fits(("one", "two"), bootstrap=0, restarts=8, tables=tables)
    assert [r["runs"] for r in out["fits"]] == [0, 0, 0, 0] and all(np.isnan(d["dphi"]) for d in out["difference"])


def test_an_unfinished_study_is_compared_on_the_configurations_both_have():
    law = fit(load_runs("runs/cpu-main"), restarts=64).law
    full = _table(law, 3)
    part = full.iloc[::2].reset_index(drop=True)   # a sweep half done
    tables = {(s, c): t for s, t in (("full", full), ("half", part)) for c in corpora.CONVENTIONS}
    out = corpora.corpus_fits(("full", "half"), bootstrap=0, restarts=16, tables=tables)
    assert out["finished"] == {"full": len(full), "half": len(part)}
    assert [r["runs"] for r in out["fits"]] == [len(part)] * 4   # both fitted on the same design
    d = pd.DataFrame(out["difference"]).set_index("convention")
    assert abs(d.loc["paper", "dphi"]) < 1e-9   # the same runs: the same phi


def test_the_command_writes_what_read_results_reads(tmp_path):
    out = tmp_path / "corpora.json"
    assert corpora.main(["--out", str(out), "--quick"]) == 0
    res = corpora.read_results(out)
    assert set(res["fits"].study) == {"cpu-main", "cpu3-main"} and set(res["difference"].convention) == {
        "paper", "head counted"}
    assert res["fits"].runs.nunique() == 1 and res["finished"]["cpu-main"] == 76
