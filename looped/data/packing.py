"""Packing: token documents -> BOS-aligned best-fit rows -> checksummed uint16 shards.

`pack` fills rows of T+1 tokens with whole documents (best fit from a buffer, the rest cropped);
`write_shard`/`read_shard` store them with a 64-byte header (magic, version, sizes, crc32), so a
damaged or foreign file is refused rather than trained on.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import os
import struct
import zlib
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from ..config import DataError
from ..io import atomic_open

# ----------------------------------------------------------------------------------------------
# Packing

def pack(docs: Iterable[Sequence[int]], row_len: int, bos_id: int, buffer_size: int = 1000,
         stats: dict | None = None) -> Iterator[list[int]]:
    """BOS-aligned best-fit packing (the paper's rows of T+1 tokens), streaming.

    Every document gets a BOS in front and a row never continues a document from the previous
    row, so every row starts with BOS and a model never sees text without its beginning.
    Documents wait in a buffer of `buffer_size`; to fill a row we repeatedly take the LARGEST
    buffered document that fits the space left (ties: the earliest), and when none fits we
    crop the SHORTEST one to fill the row exactly and drop its tail.  A final partial row is
    dropped.  `stats` (if given) receives docs, rows, tokens_in (with BOS), tokens_lost,
    cropped.  Deterministic: the output depends only on the inputs.
    """
    if row_len < 2:
        raise ValueError("row_len must be >= 2")
    st = {"docs": 0, "rows": 0, "tokens_in": 0, "tokens_lost": 0, "cropped": 0}
    by_len: dict[int, list[list[int]]] = {}  # length -> documents of that length (FIFO)
    lengths: list[int] = []                   # sorted distinct lengths present in the buffer
    n_buf = 0
    stream = iter(docs)

    def refill():
        nonlocal n_buf
        while n_buf < buffer_size:
            d = next(stream, None)
            if d is None:
                return
            if len(d) == 0:
                continue
            d = [bos_id, *d]
            st["docs"] += 1
            st["tokens_in"] += len(d)
            if len(d) not in by_len:
                by_len[len(d)] = []
                bisect.insort(lengths, len(d))
            by_len[len(d)].append(d)
            n_buf += 1

    def take(n: int) -> list[int]:
        nonlocal n_buf
        bucket = by_len[n]
        d = bucket.pop(0)
        if not bucket:
            del by_len[n]
            lengths.remove(n)
        n_buf -= 1
        return d

    row: list[int] = []
    try:
        while True:
            refill()
            if not n_buf:
                break
            space = row_len - len(row)
            i = bisect.bisect_right(lengths, space) - 1
            if i >= 0:
                row += take(lengths[i])
            else:  # nothing fits: crop the shortest document to fill the row
                d = take(lengths[0])
                row += d[:space]
                st["tokens_lost"] += len(d) - space
                st["cropped"] += 1
            if len(row) == row_len:
                st["rows"] += 1
                yield row
                row = []
        st["tokens_lost"] += len(row)
    finally:
        if stats is not None:
            stats.update(st)


# ----------------------------------------------------------------------------------------------
# Shards: header (64 bytes, little-endian) + uint16 payload

MAGIC = b"LOOPEDT\x00"
VERSION = 1
_HEADER = struct.Struct("<8sIQIII")  # magic, version, n_tokens, row_len, vocab_size, crc32
HEADER_BYTES = 64
TOKEN_DTYPE = "<u2"   # every token id is 2 bytes on disk


def write_shard(path: str | os.PathLike, rows, row_len: int, vocab_size: int) -> int:
    """Write rows (array-like (n, row_len) or an iterable of rows) atomically; returns rows."""
    if vocab_size >= 65536:  # ids must fit uint16 (kept strict: 65535 is free for a sentinel)
        raise DataError(f"{path}: vocab_size {vocab_size} is too large for uint16 shards (max 65535)")
    arr = np.asarray(list(rows) if not isinstance(rows, np.ndarray) else rows, dtype=np.int64)
    arr = arr.reshape(-1, row_len)
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        raise DataError(f"{path}: token ids outside [0, {vocab_size})")
    payload = arr.astype(TOKEN_DTYPE).tobytes()
    header = _HEADER.pack(MAGIC, VERSION, arr.size, row_len, vocab_size, zlib.crc32(payload))
    with atomic_open(path) as f:
        f.write(header.ljust(HEADER_BYTES, b"\x00"))
        f.write(payload)
    return len(arr)


def read_shard(path: str | os.PathLike, verify: bool = True) -> tuple[np.ndarray, dict]:
    """Memory-map a shard as (rows, row_len) uint16 after checking its header (and, with
    `verify`, the payload's crc32).  Any mismatch raises DataError naming the file."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
    except OSError as e:
        raise DataError(f"{path}: cannot read shard ({e.strerror})") from None
    if len(head) < HEADER_BYTES:
        raise DataError(f"{path}: truncated header ({size} bytes)")
    magic, version, n_tokens, row_len, vocab, crc = _HEADER.unpack_from(head)
    if magic != MAGIC:
        raise DataError(f"{path}: not a looped token shard (bad magic {magic!r})")
    if version != VERSION:
        raise DataError(f"{path}: shard format version {version}, this code reads {VERSION}")
    if row_len < 1 or n_tokens % row_len:
        raise DataError(f"{path}: corrupt header ({n_tokens} tokens is not a multiple of row length {row_len})")
    if size != HEADER_BYTES + 2 * n_tokens:
        raise DataError(f"{path}: size {size} bytes, header promises {HEADER_BYTES + 2 * n_tokens} (truncated?)")
    if n_tokens == 0:
        data = np.zeros((0, row_len), dtype=TOKEN_DTYPE)
    else:
        data = np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(n_tokens // row_len, row_len))
    if verify and zlib.crc32(data) != crc:
        raise DataError(f"{path}: checksum mismatch (corrupt payload)")
    return data, {"n_tokens": n_tokens, "row_len": row_len, "vocab_size": vocab, "crc32": crc}


def files_digest(files: dict[str, str]) -> str:
    """One sha256 for a dataset's tokenizer and shards (its files' sha256, by name): what a run
    record and the committed manifest name it by."""
    return hashlib.sha256("".join(f"{k} {v}\n" for k, v in sorted(files.items())).encode()).hexdigest()


def verify_manifest(meta: dict, manifest: Path) -> str:
    """Compare a built dataset with its committed manifest (runs/<dataset>.json); one line."""
    want = json.loads(manifest.read_text())
    if want.get("digest") == meta.get("digest"):
        return f"identical to the committed manifest {manifest.name} (digest {meta['digest'][:16]})"
    bad = sorted(k for k in set(want.get("files", {})) | set(meta.get("files", {}))
                 if want.get("files", {}).get(k) != meta.get("files", {}).get(k))
    raise DataError(f"this build differs from the committed manifest {manifest.name} (digest "
                    f"{str(meta.get('digest'))[:16]}, committed {str(want.get('digest'))[:16]}; "
                    f"files {', '.join(bad[:4])})")
