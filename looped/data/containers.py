"""Readers for the containers the prose corpus ships in, so nothing is unpacked to disk: Debian
packages (an ar archive holding a tar), SWORD Bible/commentary modules (zlib blocks with verse
indexes) and R's lazy-load data (XDR serialisation); then the text inside them, cleaned into
documents.  Each reads only what `looped.data.corpus` needs and raises a one-line `DataError` on
anything else.
"""
from __future__ import annotations

import gzip
import hashlib
import html
import io
import lzma
import re
import struct
import tarfile
import zlib
from pathlib import Path
from typing import Iterable, Iterator

from ..config import DataError as SourceError


def deb_files(path: Path, want=lambda name: True) -> dict[str, bytes]:
    """{path: bytes} of the files in a .deb's data archive whose path satisfies `want`."""
    b = path.read_bytes()
    if b[:8] != b"!<arch>\n":
        raise SourceError(f"{path}: not a Debian package")
    i = 8
    while i + 60 <= len(b):
        name, size = b[i:i + 16].decode().strip().rstrip("/"), int(b[i + 48:i + 58])
        body = b[i + 60:i + 60 + size]
        i += 60 + size + (size & 1)
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise SourceError(f"{path}: zstd-compressed package, unsupported")
            try:
                with tarfile.open(fileobj=io.BytesIO(body)) as t:
                    return {m.name.lstrip("./"): t.extractfile(m).read()
                            for m in t if m.isfile() and want(m.name.lstrip("./"))}
            except (tarfile.TarError, EOFError, lzma.LZMAError, zlib.error) as e:
                raise SourceError(f"{path}: corrupt data archive ({e})") from None
    raise SourceError(f"{path}: no data archive (truncated?)")


def sword_entries(blocks_index: bytes, blocks: bytes, verses: bytes) -> list[str]:
    """The texts of a SWORD zText/zCom module (one testament), in verse order, links skipped.

    `*.?zs`: per block (uint32 offset, compressed size, size); `*.?zz`: the zlib blocks;
    `*.?zv`: per verse (uint32 block, uint32 offset, then a uint16 (zText/zCom) or uint32
    (zCom4) size).  The entry width is found by checking both against the blocks.
    """
    out = []
    for i in range(len(blocks_index) // 12):
        off, csize, _ = struct.unpack_from("<III", blocks_index, 12 * i)
        out.append(zlib.decompress(blocks[off:off + csize]))
    for width, fmt in ((10, "<IIH"), (12, "<III")):
        if len(verses) % width:
            continue
        ents = [struct.unpack_from(fmt, verses, width * j) for j in range(len(verses) // width)]
        if all(n == 0 or (b < len(out) and o + n <= len(out[b])) for b, o, n in ents):
            break
    else:
        raise SourceError("SWORD verse index matches neither the 10- nor the 12-byte layout")
    seen, texts = set(), []
    for b, o, n in ents:
        if n and (b, o) not in seen:  # a linked verse points at an entry already read
            seen.add((b, o))
            texts.append(out[b][o:o + n].decode("utf-8", "replace"))
    return texts


class _RData:
    """A reader of R's XDR serialisation, enough for the character vectors of janeaustenr."""

    def __init__(self, b: bytes):
        if b[:2] != b"X\n":
            raise SourceError("not XDR-serialised R data")
        self.b, self.i, self.refs = b, 2, []
        version = self.int()
        self.i += 8
        if version == 3:
            n = self.int()
            self.i += n

    def int(self) -> int:
        v = struct.unpack_from(">i", self.b, self.i)[0]
        self.i += 4
        return v

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        if t in (254, 253, 242, 241, 251, 247, 252):  # NULL and the special environments
            return None
        if t == 255:  # a reference to an earlier symbol
            return self.refs[(flags >> 8 or self.int()) - 1]
        if t == 1:  # symbol
            s = self.item()
            self.refs.append(s)
            return s
        if t == 2:  # pairlist (attributes): [(tag, value), ...]
            if flags & (1 << 9):
                self.item()
            tag = self.item() if flags & (1 << 10) else None
            car, cdr = self.item(), self.item()
            return [(tag, car)] + (cdr or [])
        if t == 9:  # one string
            n = self.int()
            if n < 0:
                return None
            self.i += n
            return self.b[self.i - n:self.i].decode("utf-8", "replace")
        if t in (10, 13):
            n = self.int()
            v = list(struct.unpack_from(f">{n}i", self.b, self.i))
            self.i += 4 * n
        elif t == 14:
            n = self.int()
            v = list(struct.unpack_from(f">{n}d", self.b, self.i))
            self.i += 8 * n
        elif t in (16, 19, 20):
            v = [self.item() for _ in range(self.int())]
        else:
            raise SourceError(f"unsupported R data type {t}")
        if flags & (1 << 9):
            attrs = dict(self.item())
            if t == 19 and "names" in attrs:
                return dict(zip(attrs["names"], v))
        return v


def r_lazyload(rdx: bytes, rdb: bytes) -> dict:
    """{name: value} of an R package's lazy-load database (data/Rdata.rdx + .rdb, zlib)."""
    index = _RData(gzip.decompress(rdx)).item()
    out = {}
    for name, (off, length) in index["variables"].items():
        out[name] = _RData(zlib.decompress(rdb[off + 4:off + length])).item()
    return out


# ----------------------------------------------------------------------------------------------
# The text inside: SWORD's OSIS markup, Austen's chapters, BIG-bench passages

_NOTE = re.compile(r"<note\b[^>]*>.*?</note>", re.S)
_TITLE = re.compile(r"<title\b[^>]*>(.*?)</title>", re.S)
_BREAK = re.compile(r"<(?:div\b[^>]*type=\"x-p\"[^>]*|p\b[^>]*|/p|item\b[^>]*|row\b[^>]*|lg\b[^>]*)/?>")
_LINE = re.compile(r"<(?:lb|l)\b[^>]*/?>")
_CHAPTER = re.compile(r"<chapter\b[^>]*\bsID=\"([^\"]+)\"[^>]*/>")
_TAG = re.compile(r"<[^>]+>")


def tidy(text: str) -> str:
    """Collapse spaces, drop spaces before punctuation, keep line breaks."""
    text = text.replace("\u00a0", " ").replace("\ufffd", " ")
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r" ([,.;:!?])", r"\1", text)
    return re.sub(r" *\n *", "\n", text).strip()


def split_paragraphs(text: str) -> list[str]:
    return [p for p in (tidy(x) for x in re.split(r"\n\s*\n", text)) if p]


def osis_documents(entries: Iterable[str], name: str) -> list[tuple[str, list[str]]]:
    """OSIS entries (in verse order) -> [(id, paragraphs)], one document per chapter.
    Footnotes are dropped, titles become their own paragraph, x-p/p/item/row are breaks."""
    docs, cur, key = [], [], f"{name}/intro"

    def close():
        paras = split_paragraphs(html.unescape(" ".join(cur)))
        if paras:
            docs.append((key, paras))

    for raw in entries:
        raw = _NOTE.sub(" ", raw)
        raw = _TITLE.sub(lambda m: f"\n\n{m.group(1)}\n\n", raw)
        raw = _BREAK.sub("\n\n", raw)
        raw = _LINE.sub("\n", raw)
        for k, piece in enumerate(_CHAPTER.split(raw)):  # odd pieces are chapter ids
            if k % 2:
                close()
                cur, key = [], f"{name}/{piece}"
            else:
                cur.append(_TAG.sub("", piece))
    close()
    return docs


def austen_documents(novels: dict[str, list[str]]) -> list[tuple[str, list[str]]]:
    """Each chapter of each novel is a document; lines are re-joined into paragraphs."""
    docs = []
    for title, lines in novels.items():
        text = "\n".join(x or "" for x in lines).replace("_", "")
        parts = re.split(r"\n(?=(?:CHAPTER|Chapter) [0-9IVXLC]+\.?\n)", text)
        for k, part in enumerate(parts):
            paras = [re.sub(r"\s*\n\s*", " ", p) for p in split_paragraphs(part)]
            if paras:
                docs.append((f"austen/{title}/{k}", paras))
    return docs


_PASSAGE = re.compile(r"^\s*Passage:\s*(.*?)\s*(?:\n\s*(?:Question|Answer|Answer type)\s*:.*)?$", re.S)


def bigbench_task(kind: str, task: str, j: dict) -> Iterator[tuple[str, list[str]]]:
    """Documents of one bigbench task file."""
    if kind == "gutenberg":  # the reference passage and every candidate passage
        for e in j["examples"]:
            for t in [e["input"], *e.get("target_scores", {})]:
                t = t.strip().strip('"').strip()
                if len(t.split()) > 50:
                    yield hashlib.sha1(t.encode()).hexdigest()[:12], [tidy(t)]
    elif kind == "passage":  # Quoref / DROP: "Passage: ...\nQuestion: ..."
        for e in j["examples"]:
            m = _PASSAGE.match(e["input"])
            if m:
                paras = [tidy(p) for p in m.group(1).split("\n") if p.strip()]
                yield hashlib.sha1(m.group(1).encode()).hexdigest()[:12], paras
    elif kind == "squad":  # SQuAD: data[].paragraphs[].context, one document per article
        for art in j["data"]:
            paras = [tidy(p["context"]) for p in art["paragraphs"]]
            yield art.get("title") or hashlib.sha1(paras[0].encode()).hexdigest()[:12], paras
    elif kind == "paragraphs":  # one sentence per line, target marks paragraph ends; English only
        for e in j["examples"]:
            sents, ends = e["input"].strip("\n").split("\n"), e["target"].split()
            if len(sents) != len(ends) or not _is_english(e["input"]):
                continue
            paras, cur = [], []
            for s, end in zip(sents, ends):
                cur.append(s.strip())
                if end == "1":
                    paras.append(" ".join(cur))
                    cur = []
            paras += [" ".join(cur)] if cur else []
            yield hashlib.sha1(sents[0].encode()).hexdigest()[:12], [tidy(p) for p in paras if p]
    else:
        raise ValueError(kind)


_EN = frozenset("the of and to in a is that was for it with as on by his he at from are this were be an "
                "which or have had not but their they has its".split())


def _is_english(text: str) -> bool:
    words = re.findall(r"[a-zäöüßéèàçñ]+", text.lower())
    return sum(w in _EN for w in words) > 0.2 * max(1, len(words))
