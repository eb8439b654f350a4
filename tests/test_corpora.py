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
