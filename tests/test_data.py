"""looped.data.dataset and .packing: packing rules, shard integrity, caching, fixed-order reading.  No network."""
import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from looped.config import PRESETS
from looped.data import dataset as D
from looped.data import packing

BOS = 0


# ---------------------------------------------------------------------------------- packing

def doc(n, v):
    """A document of n tokens (BOS not included), all equal to v."""
    return [v] * n


def test_pack_largest_fit_then_crop_shortest():
    # with BOS the documents are 5, 4, 3 and 6 tokens long; rows hold 8
    a, b, c, d = doc(4, 1), doc(3, 2), doc(2, 3), doc(5, 4)
    st = {}
    rows = list(packing.pack([a, b, c, d], 8, BOS, buffer_size=10, stats=st))
    # row 1: the largest that fits 8 is d (6), not a although a came first; 2 left, nothing
    # fits, so the shortest (c, 3) is cropped to 2 and its last token dropped
    assert rows[0] == [0, 4, 4, 4, 4, 4, 0, 3]
    # row 2: a (5) fits; 3 left, b (4) does not: cropped to 3
    assert rows[1] == [0, 1, 1, 1, 1, 0, 2, 2]
    assert len(rows) == 2
    assert st == {"docs": 4, "rows": 2, "tokens_in": 18, "tokens_lost": 2, "cropped": 2}


def test_pack_exact_fill_ties_and_leftover():
    # 3+3 fills the row exactly; equal lengths are taken in arrival order
    rows = list(packing.pack([doc(2, 1), doc(2, 2), doc(5, 3), doc(2, 4)], 6, BOS, stats=(st := {})))
    assert rows == [[0, 3, 3, 3, 3, 3], [0, 1, 1, 0, 2, 2]]
    assert st["tokens_lost"] == 3  # the final partial row [0, 4, 4] is dropped
    assert st["tokens_in"] == st["rows"] * 6 + st["tokens_lost"]


def test_pack_long_document_is_cropped_to_one_row():
    rows = list(packing.pack([doc(20, 7)], 5, BOS, stats=(st := {})))
    assert rows == [[0, 7, 7, 7, 7]] and st["tokens_lost"] == 16 and st["cropped"] == 1


def test_pack_buffer_of_one_is_greedy_in_order():
    # with one buffered document there is no choice: the packer sees documents in order
    rows = list(packing.pack([doc(1, 1), doc(5, 2), doc(1, 3)], 4, BOS, buffer_size=1))
    assert rows == [[0, 1, 0, 2]]


def test_pack_invariants_random():
    rng = random.Random(0)
    # document i starts with its own id i+1 and continues with tokens >= 1000
    docs = [[i + 1] + [rng.randrange(1000, 1050) for _ in range(rng.randint(0, 14))] for i in range(500)]
    row_len = 17
    st = {}
    rows = list(packing.pack(docs, row_len, BOS, buffer_size=64, stats=st))
    assert rows == list(packing.pack(docs, row_len, BOS, buffer_size=64))  # deterministic
    assert all(len(r) == row_len and r[0] == BOS for r in rows)
    # split every row at its BOS tokens: each piece is a whole document or, if it ends the
    # row, a prefix of one (cropped); no document appears twice, so none continues elsewhere
    seen = set()
    for r in rows:
        starts = [j for j, t in enumerate(r) if t == BOS] + [row_len]
        for s, e in zip(starts, starts[1:]):
            piece = r[s + 1:e]
            if not piece:  # a crop to a lone BOS at the very end of a row (space was 1)
                assert e == row_len
                continue
            d = docs[piece[0] - 1]
            assert piece[0] not in seen
            seen.add(piece[0])
            assert piece == d if e < row_len else piece == d[:len(piece)]
    assert st["tokens_in"] == sum(len(d) + 1 for d in docs)
    assert st["tokens_in"] == len(rows) * row_len + st["tokens_lost"]


def test_chunk_documents_is_lossless_and_bounded():
    rng = random.Random(1)
    units = [list(range(rng.randint(1, 30))) for _ in range(200)]
    docs = D.chunk_documents(units, 16, random.Random(3))
    assert all(1 <= len(d) <= 16 for d in docs)
    assert sum(docs, []) == sum(units, [])
    assert docs == D.chunk_documents(units, 16, random.Random(3))


class CharTok:
    def encode_batch(self, texts):
        return [[ord(c) for c in t] for t in texts]


def test_validation_plays_never_reach_training():
    plays = {D.VAL_PLAYS[0]: "AAA\n\nAA", "comedies/x": "BBB\n\nB", "roman/y": "C"}
    docs = D.shakespeare_documents(CharTok(), 8, plays)
    train = "".join(chr(t) for d in docs["train"] for t in d)
    val = "".join(chr(t) for d in docs["val"] for t in d)
    assert "A" not in train and set(val) == {"A", "\n"}
    assert sorted(train.replace("\n", "")) == list("BBBBC")


def test_paragraphs_drop_markdown_hard_breaks():
    assert D.paragraphs("**A**  \nHi.  \nThere.\n\n\n_Exit_\n") == ["**A**\nHi.\nThere.\n\n", "_Exit_\n\n"]


# ---------------------------------------------------------------------------------- shards

@pytest.fixture
def shard(tmp_path):
    rows = np.arange(3 * 5).reshape(3, 5) % 11
    path = tmp_path / "s.bin"
    assert packing.write_shard(path, rows, 5, 11) == 3
    return path, rows


def test_shard_roundtrip(shard):
    path, rows = shard
    data, info = packing.read_shard(path)
    assert data.dtype == np.uint16 and np.array_equal(data, rows)
    assert info["row_len"] == 5 and info["vocab_size"] == 11 and info["n_tokens"] == 15
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # atomic write


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:-1], "truncated"),
    (lambda b: b[:30], "truncated header"),
    (lambda b: b[:-2] + bytes([b[-2] ^ 1]) + b[-1:], "checksum"),
    (lambda b: b"NOTLOOP\x00" + b[8:], "bad magic"),
    (lambda b: b[:8] + (99).to_bytes(4, "little") + b[12:], "version 99"),
])
def test_shard_damage_is_reported_with_the_file_name(shard, damage, message):
    path, _ = shard
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(D.DataError, match=message) as e:
        packing.read_shard(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_shard_rejects_large_vocab_and_bad_ids(tmp_path):
    with pytest.raises(D.DataError, match="uint16"):
        packing.write_shard(tmp_path / "a.bin", [[1, 2]], 2, 65536)
    with pytest.raises(D.DataError, match="outside"):
        packing.write_shard(tmp_path / "b.bin", [[1, 20]], 2, 10)


def test_missing_shard(tmp_path):
    with pytest.raises(D.DataError, match="cannot read"):
        packing.read_shard(tmp_path / "nope.bin")


# ---------------------------------------------------------------------------------- reading

def fake_dataset(root: Path, train_shards, val_rows, row_len=4, vocab=100) -> Path:
    root.mkdir()
    names = []
    for i, rows in enumerate(train_shards):
        packing.write_shard(root / f"train-{i:03d}.bin", rows, row_len, vocab)
        names.append(f"train-{i:03d}.bin")
    packing.write_shard(root / "val-000.bin", val_rows, row_len, vocab)
    meta = {"recipe": D.RECIPE, "seq_len": row_len - 1, "vocab_size": vocab, "bos_id": 0,
            "splits": {"train": {"shards": names}, "val": {"shards": ["val-000.bin"]}}}
    (root / "meta.json").write_text(json.dumps(meta))
    return root


def test_dataset_reads_fixed_order_across_shards(tmp_path):
    rows = np.arange(10 * 4).reshape(10, 4) % 100
    ds = D.Dataset(fake_dataset(tmp_path / "d", [rows[:3], rows[3:7], rows[7:]], rows[:2]))
    assert ds.n_rows("train") == 10 and ds.n_rows("val") == 2 and ds.seq_len == 3 and ds.bos_id == 0
    R = 3
    steps = [ds.rows("train", i * R, R) for i in range(3)]
    assert all(s.dtype == torch.int64 and s.shape == (R, 4) for s in steps)
    assert torch.equal(torch.cat(steps), torch.from_numpy(rows[:9]))
    assert torch.equal(ds.rows("train", 2, 6), torch.from_numpy(rows[2:8]))  # spans 3 shards
    with pytest.raises(D.DataError, match="only 10 exist"):
        ds.rows("train", 9, 3)
    assert torch.equal(ds.validation_rows(), torch.from_numpy(rows[:2]))
    assert ds.validation_rows(1).shape == (1, 4)
    with pytest.raises(D.DataError, match="no split"):
        ds.rows("test", 0, 1)


def test_dataset_rejects_corrupt_shard(tmp_path):
    path = fake_dataset(tmp_path / "d", [np.ones((2, 4))], np.ones((1, 4)))
    b = bytearray((path / "train-000.bin").read_bytes())
    b[-1] ^= 0xFF
    (path / "train-000.bin").write_bytes(bytes(b))
    with pytest.raises(D.DataError, match="train-000.bin: checksum"):
        D.Dataset(path)


# ---------------------------------------------------------------------------------- tokenizers

def test_gpt2_bpe_works_offline():
    tok = D.gpt2_tiktoken()
    assert tok.vocab_size == 50257 and tok.bos_id == 50256
    assert tok.encode_batch(["Hello world", " the"]) == [[15496, 995], [262]]
    assert tok.decode([15496, 995]) == "Hello world"


def test_train_bpe_is_deterministic_and_has_one_bos(tmp_path):
    texts = ["to be, or not to be, that is the question\n\n"] * 20 + ["whether 'tis nobler\n\n"] * 5
    t1, t2 = D.train_bpe(iter(texts), 300), D.train_bpe(iter(texts), 300)
    t1.save(tmp_path)
    assert t1.tok.to_str() == t2.tok.to_str()
    assert t1.bos_id == 0 and t1.vocab_size <= 300
    ids = t1.encode_batch(texts[:1])[0]
    assert 0 not in ids and t1.decode(ids) == texts[0]
    assert D.load_tokenizer(tmp_path / "tokenizer.json").encode_batch(texts[:1])[0] == ids


# ---------------------------------------------------------------------------------- fineweb path

def write_corpus(d: Path):
    rng = random.Random(0)
    words = "the cat sat on a mat while scholars read about looped transformers".split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 60))) for _ in range(400)]
    d.mkdir()
    with open(d / "a.jsonl", "w") as f:
        for t in texts[:200]:
            f.write(json.dumps({"text": t, "id": 1}) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": texts[200:]}), d / "b.parquet")
    return texts


def test_fineweb_texts_local_files_and_iterables(tmp_path):
    texts = write_corpus(tmp_path / "fw")
    assert list(D.fineweb_texts(tmp_path / "fw")) == texts
    assert list(D.fineweb_texts(tmp_path / "fw" / "b.parquet", limit=3)) == texts[200:203]
    assert list(D.fineweb_texts(iter(["x", "y"]))) == ["x", "y"]
    with pytest.raises(D.DataError, match="no such file"):
        list(D.fineweb_texts(tmp_path / "missing"))


SMALL = replace(PRESETS["paper"], seq_len=16, vocab_size=50257)  # the paper's pipeline, tiny rows


def test_paper_pipeline_on_local_files(tmp_path, monkeypatch):
    write_corpus(tmp_path / "fw")
    preset = SMALL
    path = D.prepare(preset, tmp_path / "data", source=tmp_path / "fw", tokenizer="gpt2", shard_rows=50)
    assert path.name == "fineweb-edu-gpt2-T16"
    ds = D.Dataset(path)
    meta = ds.meta
    assert ds.bos_id == 50256 and ds.vocab_size == 50257 and meta["corpus"] == "fineweb-edu"
    assert len(meta["splits"]["train"]["shards"]) > 1 and ds.n_rows("val") > 0
    rows = ds.rows("train", 0, ds.n_rows("train"))
    assert (rows[:, 0] == 50256).all() and rows.shape[1] == 17
    # a local tokenizer.json (stand-in for Llama-2's, so its digest stands in for Llama-2's) works the same way
    tok = D.train_bpe(D.fineweb_texts(tmp_path / "fw"), 300)
    tok.save(tmp_path)
    from looped.data import tokenizers

    monkeypatch.setattr(
        tokenizers, "LLAMA2_DIGEST", tokenizers.vocabulary_digest(D.load_tokenizer(tmp_path / "tokenizer.json"))
    )
    path2 = D.prepare(replace(preset, vocab_size=32001), tmp_path / "data", source=tmp_path / "fw",
                      tokenizer=tmp_path / "tokenizer.json")
    assert path2.name == "fineweb-edu-llama2-T16" and D.Dataset(path2).bos_id == 0


def test_paper_pipeline_token_budget_and_iterable_source(tmp_path):
    texts = write_corpus(tmp_path / "fw")
    path = D.prepare(SMALL, tmp_path / "data", source=iter(texts), tokenizer="gpt2", max_tokens=300,
                     buffer_size=10)
    meta = D.Dataset(path).meta
    full = D.prepare(SMALL, tmp_path / "full", source=texts, tokenizer="gpt2").joinpath("meta.json")
    n_full = json.loads(full.read_text())["splits"]["train"]["tokens"]
    assert 300 <= meta["splits"]["train"]["tokens"] < n_full
    assert meta["source"] == "an in-memory list of texts"


def test_paper_preset_fails_cleanly_without_tokenizer(tmp_path):
    with pytest.raises(D.DataError, match="missing.json"):
        D.prepare("paper", tmp_path, source=iter(["a"]), tokenizer=tmp_path / "missing.json")
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # no half-built directory


# ---------------------------------------------------------------------------------- prepare / CLI

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return D.prepare("tiny", root), root


def test_prepare_tiny(tiny):
    path, root = tiny
    assert path == root / "shakespeare-bpe256-T32"
    assert sorted(p.name for p in path.iterdir()) == ["meta.json", "tokenizer.json", "train-000.bin", "val-000.bin"]
    ds = D.Dataset(path)
    meta = ds.meta
    assert ds.seq_len == 32 and ds.vocab_size == 256 and meta["train_plays"] == 36
    assert ds.n_rows("train") > 10_000 and ds.n_rows("val") > 1000
    for split in ("train", "val"):
        assert meta["splits"][split]["waste"] < 0.05
    rows = ds.rows("train", 0, 64)
    assert (rows[:, 0] == ds.bos_id).all() and int(rows.max()) < 256
    assert "\n" in ds.decode(rows[0])


def test_prepare_reuses_valid_and_rebuilds_corrupt(tmp_path):
    write_corpus(tmp_path / "fw")
    kw = dict(source=tmp_path / "fw", tokenizer="gpt2")
    root = tmp_path / "data"
    path = D.prepare(SMALL, root, **kw)
    mtime = (path / "meta.json").stat().st_mtime_ns
    assert D.prepare(SMALL, root, **kw) == path and (path / "meta.json").stat().st_mtime_ns == mtime
    before = D.Dataset(path).rows("train", 0, 8)
    b = bytearray((path / "val-000.bin").read_bytes())
    b[100] ^= 1
    (path / "val-000.bin").write_bytes(bytes(b))
    assert D.check_dataset(path) is None
    assert D.prepare(SMALL, root, **kw) == path
    assert torch.equal(D.Dataset(path).rows("train", 0, 8), before)  # the same bytes again
    assert [p.name for p in root.iterdir() if p.is_dir()] == [path.name]  # no temp dirs left


def test_concurrent_prepare_builds_once(tmp_path):
    write_corpus(tmp_path / "fw")
    code = ("import sys; from dataclasses import replace; from looped import config; from looped.data import dataset; "
            "p = replace(config.PRESETS['paper'], seq_len=16, vocab_size=50257); "
            "print(dataset.prepare(p, sys.argv[1], source=sys.argv[2], tokenizer='gpt2'))")
    env = {**os.environ, "PYTHONPATH": str(Path(D.__file__).parent.parent.parent)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "data"), str(tmp_path / "fw")],
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and outs[0] == outs[1]
    assert [p.name for p in (tmp_path / "data").iterdir() if p.is_dir()] == ["fineweb-edu-gpt2-T16"]
    assert D.check_dataset(Path(outs[0])) is not None


def test_default_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOPED_DATA", str(tmp_path))
    assert D.default_data_dir() == tmp_path
    monkeypatch.delenv("LOOPED_DATA")
    assert D.default_data_dir() == Path(D.__file__).resolve().parent.parent.parent / "data"


def test_cli(tiny, capsys):
    path, root = tiny
    assert D.main(["prepare", "--preset", "tiny", "--data-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert str(path) in out and "packing waste" in out
    assert D.main(["prepare", "--preset", "nope", "--data-dir", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown preset" in err


def test_the_paper_preset_takes_only_llama2s_vocabulary(tmp_path, monkeypatch):
    """Any copy of Llama-2's tokenizer.json is accepted (ungated ones too), anything else is refused
    in one line; the check compares the vocabulary and merges' digests, not file bytes."""
    from looped.data import tokenizers
    texts = write_corpus(tmp_path / "fw")
    tok = D.train_bpe(D.fineweb_texts(tmp_path / "fw"), 300)
    tok.save(tmp_path)
    stand_in = D.load_tokenizer(tmp_path / "tokenizer.json")
    with pytest.raises(D.DataError, match="not Llama-2's tokenizer .its vocabulary differs"):
        D.prepare("paper", tmp_path / "data", source=texts, tokenizer=tmp_path / "tokenizer.json")
    assert not [p for p in (tmp_path / "data").iterdir() if p.is_dir()]  # no half-built dataset
    # the same file passes once its digest is the expected one (as a real Llama-2 copy's is)
    monkeypatch.setattr(tokenizers, "LLAMA2_DIGEST", tokenizers.vocabulary_digest(stand_in))
    tokenizers.check_llama2(stand_in, "stand-in")
    digest = tokenizers.vocabulary_digest(stand_in)
    assert digest == tokenizers.vocabulary_digest(D.load_tokenizer(tmp_path / "tokenizer.json"))
    assert len(digest["vocab"]) == len(digest["merges"]) == 64 and digest["vocab_size"] <= 300


def test_a_llama2_copy_with_another_digest_passes_on_its_encodings(tmp_path, monkeypatch):
    """The second route: a tokenizer whose digest differs (another converter's merge order) but
    which has Llama-2's size and encodes the fixed texts to Llama-2's ids is accepted; one id off
    and it is refused in one line.  A small local BPE stands in for Llama-2 (nothing downloaded)."""
    from looped.data import tokenizers
    write_corpus(tmp_path / "fw")
    D.train_bpe(D.fineweb_texts(tmp_path / "fw"), 300).save(tmp_path)
    stand_in = D.load_tokenizer(tmp_path / "tokenizer.json")
    texts = [t for t, _ in tokenizers.LLAMA2_ENCODINGS]
    ids = stand_in.encode_batch(texts)
    assert len(texts) >= 10 and all(i < 32000 for _, v in tokenizers.LLAMA2_ENCODINGS for i in v)
    monkeypatch.setattr(tokenizers, "LLAMA2_DIGEST", {**tokenizers.vocabulary_digest(stand_in), "merges": "0" * 64})
    monkeypatch.setattr(tokenizers, "LLAMA2_ENCODINGS", list(zip(texts, ids)))
    tokenizers.check_llama2(stand_in, "reordered copy")  # digest differs, encodings agree
    wrong = [list(v) for v in ids]
    wrong[0][0] += 1
    monkeypatch.setattr(tokenizers, "LLAMA2_ENCODINGS", list(zip(texts, wrong)))
    with pytest.raises(D.DataError, match="merge list differs.*does not encode the reference texts") as e:
        tokenizers.check_llama2(stand_in, "reordered copy")
    assert "\n" not in str(e.value)
