"""The prose corpora's source files: what is pinned, where its registry keeps it, fetching and
checking.

A `Source` is one archive: a Debian package (corpus v3 pins trixie's versions and fetches them by
the `Filename:` and `SHA256:` of trixie's `Packages` index, the pool folder being the *source*
package's name) or, for corpus v2 only, a PyPI sdist.  The Debian mirror keeps only versions a
current suite lists, so when a pinned version leaves trixie (a rebuild, a point release), `fetch`
takes the version trixie lists now, checked against the index, and records it as a substitute;
the corpus then accepts it only if the text it yields matches the pinned `text_sha256`
(`looped.data.corpus.documents`).  `registry_problems` is the CI check: every pinned file still
listed, by name, version and SHA256, from the index alone (seconds, no package download).
"""
from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..config import REPO, DataError

SourceError = DataError  # a missing, corrupt or changed source: one line, exit 2
MIRROR = os.environ.get("LOOPED_DEBIAN_MIRROR", "https://deb.debian.org/debian")
SUITE = "trixie"
SUBSTITUTES = "substitutes.json"  # in the sources folder: pinned file -> the file fetched in its place


@dataclass(frozen=True)
class Source:
    name: str        # short name used in document ids and the README
    package: str
    version: str
    sha256: str      # of the archive file
    licence: str
    registry: str = "debian"  # or "pypi"
    suite: str = SUITE        # the Debian suite whose index lists it (v2's pins: bookworm)
    # corpus v3 (looped.data.prose_v3): where the archive keeps it, what it yields and how to read it
    pool: str = ""          # trixie's `Filename:` (the pool folder is the *source* package's name)
    kind: str = ""          # kind of text, for the composition table
    reader: str = ""        # html | info | troff | dictd | text | fortune | crawl | json | sword | austen
    files: str = ""         # regex on the paths inside the .deb that hold the text
    min_words: int = 10     # the shortest paragraph kept (GCIDE: 30, its longer senses only)
    text_sha256: str = ""   # digest of the documents it yields: the pin that survives a repackaging

    @property
    def filename(self) -> str:
        if self.pool:
            return self.pool.rsplit("/", 1)[-1]
        if self.registry == "pypi":
            return f"{self.package}-{self.version}.tar.gz"
        return f"{self.package}_{self.version}_all.deb"


def default_sources_dir() -> Path:
    env = os.environ.get("LOOPED_SOURCES")
    return Path(env) if env else REPO / "data" / "sources"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# Debian's Packages index

def parse_index(text: str) -> dict[str, list[dict]]:
    """{package: [its stanzas]} of a Debian `Packages` file (Package, Version, Filename, SHA256...)."""
    out: dict[str, list[dict]] = {}
    for stanza in text.split("\n\n"):
        d = dict(re.findall(r"^([A-Za-z0-9-]+): (.*)$", stanza, re.M))
        if "Package" in d:
            out.setdefault(d["Package"], []).append(d)
    return out


def packages_index(suite: str = SUITE, mirror: str = MIRROR, timeout: float = 60) -> dict[str, list[dict]]:
    """The suite's index of architecture-independent packages (binary-all, ~4.5 MB xz)."""
    url = f"{mirror}/dists/{suite}/main/binary-all/Packages.xz"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return parse_index(lzma.decompress(r.read()).decode("utf-8", "replace"))
    except (OSError, lzma.LZMAError) as e:
        raise SourceError(f"cannot read Debian's {suite} index {url} ({e})") from None


def locate(s: Source, index: dict[str, list[dict]]) -> dict | None:
    """The index stanza of the pinned version, else the one the suite lists now (a substitute),
    else None (the package left the suite)."""
    stanzas = index.get(s.package, [])
    pinned = [d for d in stanzas if d.get("Version") == s.version and d.get("SHA256") == s.sha256]
    if not s.text_sha256:  # no pin by content (v2): only the pinned file itself will do
        stanzas = []
    return (pinned or stanzas or [None])[0]


def registry_problems(sources, index: dict[str, list[dict]]) -> list[str]:
    """One line per pinned Debian source that the index no longer lists as pinned (name, version,
    SHA256), saying what it lists instead."""
    out = []
    for s in sources:
        if s.registry != "debian":
            continue
        d = locate(s, index)
        if d is None:
            out.append(f"{s.name}: {s.package} is no longer in Debian {s.suite}")
        elif (d.get("Version"), d.get("SHA256")) != (s.version, s.sha256) or (s.pool and d.get("Filename") != s.pool):
            out.append(f"{s.name}: {SUITE} lists {s.package} {d.get('Version')} ({d.get('Filename')}, sha256 "
                       f"{d.get('SHA256', '')[:12]}), pinned {s.version} (sha256 {s.sha256[:12]})")
    return out


# ----------------------------------------------------------------------------------------------
# Fetching and checking the files

def _substitutes(src: Path) -> dict:
    try:
        return json.loads((src / SUBSTITUTES).read_text())
    except (OSError, ValueError):
        return {}


def find_source(s: Source, src: Path, verify: bool = True) -> Path | None:
    """The file that stands for `s` in `src`, None if there is none: the pinned one (sha256
    checked with `verify`), or a substitute that `fetch` took from the index because the pinned
    version had left it.  A corrupt file is an error."""
    p = src / s.filename
    if p.is_file() and (not verify or sha256(p) == s.sha256):
        return p
    sub = _substitutes(src).get(s.filename)
    if sub and (src / sub["filename"]).is_file() and (not verify or sha256(src / sub["filename"]) == sub["sha256"]):
        return src / sub["filename"]
    if p.is_file():
        raise SourceError(f"{p}: sha256 mismatch (corrupt or incomplete download); delete it and run `make corpus`")
    return None


def source_path(s: Source, src: Path, verify: bool = True) -> Path:
    p = find_source(s, src, verify)
    if p is None:
        raise SourceError(f"{src}: no {s.filename}")
    return p


def check_sources(src: str | os.PathLike | None, sources, verify: bool = True, needed_by: str = "the prose corpus",
                  hint: str = "run `make corpus`") -> Path:
    """The sources folder if every source of `sources` is there (and, with `verify`, intact)."""
    src = Path(src) if src is not None else default_sources_dir()
    missing = [s.filename for s in sources if find_source(s, src, verify) is None]
    if missing:
        raise SourceError(f"{needed_by}: sources missing in {src} ({', '.join(missing)}): {hint}")
    return src


def _download_url(url: str, dest: Path, expect: str) -> None:
    tmp = dest.with_name(f".{dest.name}.part")
    try:
        with urllib.request.urlopen(url, timeout=120) as r, open(tmp, "wb") as f:
            shutil.copyfileobj(r, f)
        if sha256(tmp) != expect:
            raise SourceError(f"{url}: sha256 differs from the index's")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _download_pypi(s: Source, dest: Path) -> None:
    tmp = dest / f".{s.filename}.part"
    tmp.mkdir(exist_ok=True)
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"{s.package}=={s.version}", "-d", str(tmp)], check=True, capture_output=True)
        os.replace(tmp / s.filename, dest / s.filename)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fetch(sources, dest: str | os.PathLike | None = None, verbose: bool = True, index=None) -> Path:
    """Download whatever source is missing or corrupt into `dest` (Debian files through the
    suite's index; PyPI files with pip); returns `dest`."""
    dest = Path(dest) if dest is not None else default_sources_dir()
    dest.mkdir(parents=True, exist_ok=True)
    subs = _substitutes(dest)
    for s in sources:
        try:
            if find_source(s, dest) is not None:
                continue
        except SourceError:  # corrupt: fetch it again
            pass
        t0 = time.time()
        if s.registry == "pypi":
            try:
                _download_pypi(s, dest)
            except (OSError, subprocess.CalledProcessError):
                raise SourceError(f"{s.package} {s.version} is no longer on PyPI") from None
            name = s.filename
        else:
            index = packages_index(s.suite) if index is None else index
            d = locate(s, index)
            if d is None:
                raise SourceError(f"{s.name}: {s.package} {s.version} is no longer in Debian {s.suite}: put a saved "
                                  f"copy of {s.filename} (sha256 {s.sha256[:12]}…) in {dest}, or any version of "
                                  f"{s.package} whose text has the pinned digest")
            name = d["Filename"].rsplit("/", 1)[-1]
            try:
                _download_url(f"{MIRROR}/{d['Filename']}", dest / name, d["SHA256"])
            except OSError as e:
                raise SourceError(f"cannot download {MIRROR}/{d['Filename']} ({e}); rerun `make corpus` when "
                                  "the mirror answers, or set LOOPED_DEBIAN_MIRROR to another Debian mirror") from None
            if name != s.filename or d["SHA256"] != s.sha256:
                subs[s.filename] = {"filename": name, "version": d["Version"], "sha256": d["SHA256"]}
                (dest / SUBSTITUTES).write_text(json.dumps(subs, indent=1) + "\n")
                print(f"{s.name}: pinned {s.version} has left {SUITE}; fetched {d['Version']} in its place "
                      "(accepted only if its text matches the pin)", file=sys.stderr)
        if verbose:
            print(f"fetched {name} ({(dest / name).stat().st_size / 1e6:.1f} MB, {time.time() - t0:.0f}s)",
                  file=sys.stderr)
    return dest
