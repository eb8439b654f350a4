"""Every run record names its data (issue: runs of two corpora must never pool by accident).

The trainer writes `data` (dataset, corpus, corpus version, digest) from the dataset's meta.json;
records older than the field name theirs through their preset; both runs tables carry `dataset`
and `corpus_version`; a fit (in Python and `looped fit`) refuses a table of several datasets
unless asked, and takes a table without the column as it is."""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from looped import fit as F
from looped import records
from looped.config import PRESETS
from looped.fit_cli import main as fit_main
from looped.law import FitError
from looped.studies import paper

REPO = Path(__file__).resolve().parents[1]
PROSE = {"dataset": "prose-bpe2048-T128", "corpus": "prose", "corpus_version": 2, "digest": None}
V3 = {"dataset": "prose3-bpe2048-T128", "corpus": "prose", "corpus_version": 3, "digest": "ab" * 32}


# ----------------------------------------------------------------------------- what a record says

@pytest.mark.usefixtures("one_thread")
def test_a_trained_record_names_its_data(tmp_path):
    """Two steps of the tiny preset on a copy of its dataset whose meta.json carries a digest (as
    corpus v3's will): the record's `data` is the meta's, and both tables read it back."""
    from looped.data import dataset
    from looped.train import TrainConfig, train
    built = dataset.prepare("tiny")
    copy = tmp_path / "data" / built.name
    shutil.copytree(built, copy)
    meta = json.loads((copy / "meta.json").read_text())
    (copy / "meta.json").write_text(json.dumps({**meta, "digest": "cd" * 32}))
    out = tmp_path / "runs" / "rec.json"
    rec = train(TrainConfig(preset="tiny", r=2, s=1, steps=2, quiet=True, compile=False, out=str(out),
                            data_dir=str(tmp_path / "data")))
    assert rec["schema"] == records.SCHEMA == 2
    assert rec["data"] == {"dataset": "shakespeare-bpe256-T32", "corpus": "shakespeare",
                           "corpus_version": meta.get("corpus_version"), "digest": "cd" * 32}
    assert rec["data"]["dataset"] == meta["name"] == dataset.dataset_name(PRESETS["tiny"])
    assert json.loads(out.read_text())["data"] == rec["data"]
    table = records.read_records(out.parent)
    assert table[["dataset", "corpus_version"]].to_dict("records") == [
        {"dataset": "shakespeare-bpe256-T32", "corpus_version": meta.get("corpus_version")}]
    assert list(F.load_runs(out.parent)["dataset"]) == ["shakespeare-bpe256-T32"]


def test_data_field_reads_a_datasets_meta():
    meta = {"name": "prose3-bpe2048-T128", "corpus": "prose", "corpus_version": 3, "digest": "ab" * 32,
            "splits": {}}
    assert records.data_field(meta) == V3
    assert records.data_field({"corpus": "shakespeare"}, "shakespeare-bpe1024-T128") == {
        "dataset": "shakespeare-bpe1024-T128", "corpus": "shakespeare", "corpus_version": None, "digest": None}


def test_committed_records_name_the_prose_corpus_v2():
    """The CPU study's records predate the field: their preset names prose v2."""
    path = sorted((REPO / "runs" / "cpu-main").glob("*.json"))[0]
    rec = json.loads(path.read_text())
    assert "data" not in rec and rec["preset"] == "prose"
    assert records.record_data(rec) == PROSE
    table = records.read_records(REPO / "runs" / "cpu-main")
    assert set(table["dataset"]) == {"prose-bpe2048-T128"} and set(table["corpus_version"]) == {2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # (files it skips are not what this test is about)
        runs = F.load_runs(REPO / "runs" / "cpu-main")
    assert set(runs["dataset"]) == {"prose-bpe2048-T128"} and set(runs["corpus_version"]) == {2}


@pytest.mark.parametrize("preset", ["cpu", "tiny", "prose", "paper"])
def test_the_legacy_rule_is_the_data_pipelines(preset):
    """An old record's inferred dataset is the directory `looped data prepare` builds for its preset
    (records.py keeps the rule as of schema 1, since it may not import the data pipeline)."""
    from looped.data.dataset import dataset_name
    p = PRESETS[preset]
    rec = {"preset": preset, "config": {"preset": preset, "vocab_size": p.vocab_size, "seq_len": p.seq_len}}
    data = records.record_data(rec)
    assert data["dataset"] == dataset_name(p)
    assert records.record_data({"preset": preset}) == data        # no config: the preset's own sizes
    assert data["digest"] is None and data["corpus_version"] == (2 if preset == "prose" else None)
    assert {"cpu": "shakespeare-bpe1024-T128", "tiny": "shakespeare-bpe256-T32", "prose": "prose-bpe2048-T128",
            "paper": "fineweb-edu-llama2-T2048"}[preset] == data["dataset"]


def test_a_record_without_a_known_preset_is_unnamed():
    assert records.record_data({"run_id": "x", "status": "failed"}) is None
    assert records.record_data({"preset": "someone-elses"}) is None
    assert "dataset" not in records.flat_record({"r": 1, "loss": 3.0})
    assert records.record_data({"preset": "prose", "data": V3}) == V3   # the field wins over the preset


# ----------------------------------------------------------------------------- fits

@pytest.fixture(scope="module")
def runs():
    return paper.synthetic_runs(seed=8).head(40)


def two_datasets(runs):
    return runs.assign(dataset=["prose-bpe2048-T128" if i % 4 else "prose3-bpe2048-T128" for i in range(len(runs))])


def test_fit_refuses_runs_of_two_datasets(runs):
    with pytest.raises(FitError, match=r"2 datasets \(prose-bpe2048-T128: 30 runs, prose3-bpe2048-T128: 10 runs\)"
                                       r".*allow_mixed_data=True") as e:
        F.fit(two_datasets(runs), restarts=5)
    assert "\n" not in str(e.value)
    mixed = F.fit(two_datasets(runs), restarts=5, allow_mixed_data=True)
    plain = F.fit(runs, restarts=5)                              # no dataset column: one unnamed dataset
    one = F.fit(runs.assign(dataset="prose-bpe2048-T128"), restarts=5)
    assert mixed.n_runs == plain.n_runs == one.n_runs == 40
    assert mixed.phi == pytest.approx(plain.phi) and one.phi == pytest.approx(plain.phi)
    partly = runs.assign(dataset=[None] * 20 + ["prose-bpe2048-T128"] * 20)   # unnamed runs are not counted
    assert F.fit(partly, restarts=5).n_runs == 40
    assert F.fit(two_datasets(runs), restarts=5, per_r=True, allow_mixed_data=True).per_r


def run(argv, capsys):
    code = fit_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_refuses_runs_of_two_datasets(runs, tmp_path, capsys):
    csv = tmp_path / "mixed.csv"
    two_datasets(runs).to_csv(csv, index=False)
    code, out, err = run([csv, "--restarts", "5"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("looped fit: error: the runs were trained on 2 datasets")
    assert "prose-bpe2048-T128: 30 runs" in err and "prose3-bpe2048-T128: 10 runs" in err
    assert "--allow-mixed-data" in err
    code, out, err = run([csv, "--restarts", "5", "--allow-mixed-data"], capsys)
    assert code == 0 and "40 runs" in out, err
    code, out, err = run([csv, "--restarts", "5", "--dataset", "prose3-bpe2048-T128"], capsys)
    assert code == 0 and "10 runs" in out, err
    code, out, err = run([csv, "--dataset", "nope"], capsys)
    assert code == 2 and "no runs of that dataset" in err
    plain = tmp_path / "plain.csv"
    runs.to_csv(plain, index=False)
    code, out, err = run([plain, "--restarts", "5"], capsys)    # no dataset column: fitted as before
    assert code == 0 and "40 runs" in out, err
    code, out, err = run([plain, "--dataset", "x"], capsys)
    assert code == 2 and "no dataset column" in err


def test_cli_refuses_a_folder_of_old_and_new_records(runs, tmp_path, capsys):
    """Old prose records (named through their preset) beside records of corpus v3 (named by `data`)."""
    for i, row in enumerate(runs.to_dict("records")):
        rec = {"schema": 1, "run_id": f"run{i}", "status": "ok", "preset": "prose", "r": row["r"],
               "n_once": row["n_once"], "n_rec": row["n_rec"], "tokens": row["tokens"], "loss": row["loss"],
               "budget": row["budget"], "s": row["s"]}
        if i % 2:
            rec.update(schema=2, preset="prose3", data=V3)
        (tmp_path / f"run{i}.json").write_text(json.dumps(rec))
    code, out, err = run([tmp_path, "--restarts", "5"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "prose-bpe2048-T128: 20 runs" in err and "prose3-bpe2048-T128: 20 runs" in err
    code, out, err = run([tmp_path, "--restarts", "5", "--allow-mixed-data"], capsys)
    assert code == 0 and "40 runs" in out, err
