#!/usr/bin/env python3
"""Regenerate the nbval reference notebooks: book/NN_*.md (MyST) -> book/NN_*.ipynb, executed.

    python tools/notebooks.py                 # every chapter listed in _toc.yml
    python tools/notebooks.py 01_architecture # only these (names or paths)
    python tools/notebooks.py --check         # fail if an .ipynb's code or cell tags differ from its .md
    python tools/notebooks.py --sync 03_fit   # only the Markdown or tags changed: copy them, keep the outputs
    python tools/notebooks.py --sync --renamed 03_fit   # code changed in names only (a module moved):
                                              # copy it too, keep the outputs; nbval then checks them

Chapters are converted with jupytext and executed in place with papermill (kernel python3,
default parameters, cwd = book/, the same working directory that jupyter-book and nbval use).
Per-cell timings and timestamps are removed and cell ids are derived from the cells, so reruns only
change what the code printed.
The .ipynb files are generated: edit the .md, never the .ipynb.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"


def chapters() -> list[Path]:
    """Notebook chapters (MyST .md with a kernelspec) in _toc.yml order, commented lines excluded."""
    out = []
    for line in (ROOT / "_toc.yml").read_text().splitlines():
        m = re.match(r"\s*-?\s*file:\s*(\S+)", line)
        if m and not line.lstrip().startswith("#"):
            md = ROOT / (m.group(1) + ".md")
            if md.exists() and "kernelspec:" in md.read_text().split("\n---", 2)[0]:
                out.append(md)
    return out


def code_sources(nb) -> list[str]:
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"]


def code_tags(nb) -> list[list[str]]:
    return [list(c.metadata.get("tags", [])) for c in nb.cells if c.cell_type == "code"]


def sync(md: Path, renamed: bool = False) -> Path:
    """The .md's Markdown cells and tags, with the outputs of the executed .ipynb: for edits of the
    prose or of a cell's visibility, which do not change what the code prints.  ``renamed``: the code
    changed too, in names only (an import path, a renamed command), cell for cell; the outputs are
    kept and nbval, which reruns the code against them, is what checks that claim."""
    import jupytext
    import nbformat
    ipynb = md.with_suffix(".ipynb")
    old = nbformat.read(ipynb, as_version=4)
    nb = jupytext.read(md)
    if renamed and len(code_sources(nb)) != len(code_sources(old)):
        raise SystemExit(f"{md.name}: cells were added or removed; run `make notebooks`")
    if not renamed and code_sources(nb) != code_sources(old):
        raise SystemExit(f"{md.name}: its code changed; run `make notebooks` (--sync keeps outputs only)")
    executed = iter(c for c in old.cells if c.cell_type == "code")
    for cell in nb.cells:
        if cell.cell_type == "code":
            ran = next(executed)
            cell.outputs, cell.execution_count = ran.outputs, ran.execution_count
            cell.metadata = {**ran.metadata, "tags": cell.metadata.get("tags", [])}
            if not cell.metadata["tags"]:
                del cell.metadata["tags"]
    nb.metadata = old.metadata
    stable_ids(nb)
    nbformat.write(nb, ipynb)
    return ipynb


def strip_volatile(nb) -> None:
    nb.metadata.get("papermill", {}).pop("start_time", None)
    for key in ("end_time", "duration", "input_path", "output_path"):
        nb.metadata.get("papermill", {}).pop(key, None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        pm = cell.metadata.get("papermill")
        if pm is not None:
            for key in ("start_time", "end_time", "duration"):
                pm.pop(key, None)


def stable_ids(nb) -> None:
    """Cell ids from each cell's type and source (jupytext draws random ones), so a regenerated
    notebook's diff shows only what changed; a repeated cell gets a counter."""
    seen: dict[str, int] = {}
    for cell in nb.cells:
        h = hashlib.sha1(f"{cell.cell_type}\n{cell.source}".encode()).hexdigest()[:8]
        seen[h] = seen.get(h, 0) + 1
        cell.id = h if seen[h] == 1 else f"{h}-{seen[h]}"


def build(md: Path) -> Path:
    import jupytext
    import nbformat
    import papermill as pm
    ipynb = md.with_suffix(".ipynb")
    nb = jupytext.read(md)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    stable_ids(nb)
    nbformat.write(nb, ipynb)
    print(f"[notebooks] executing {ipynb.relative_to(ROOT)}", flush=True)
    # the chapter's tolerance-checked numbers become its new references (looped.report.checks.checked),
    # unless LOOPED_RECORD_CHECKS=0: then the outputs are regenerated against the recorded references
    os.environ.setdefault("LOOPED_RECORD_CHECKS", "1")
    t0 = time.monotonic()
    pm.execute_notebook(str(ipynb), str(ipynb), cwd=str(BOOK), kernel_name="python3",
                        progress_bar=False, log_output=False)
    record_runtime(md.stem, time.monotonic() - t0)
    nb = nbformat.read(ipynb, as_version=4)
    strip_volatile(nb)
    nbformat.write(nb, ipynb)
    return ipynb


def record_runtime(stem: str, seconds: float) -> None:
    """The chapter's execution time, for the intro's map of the book (book/checked/runtimes.json)."""
    path = BOOK / "checked" / "runtimes.json"
    times = json.loads(path.read_text()) if path.exists() else {}
    times[stem] = round(seconds, 1)
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")
    os.replace(tmp, path)


def check(mds: list[Path]) -> int:
    import jupytext
    import nbformat
    bad = 0
    for md in mds:
        ipynb = md.with_suffix(".ipynb")
        if not ipynb.exists():
            print(f"missing {ipynb.relative_to(ROOT)}: run `make notebooks`")
            bad += 1
            continue
        src, ran = jupytext.read(md), nbformat.read(ipynb, as_version=4)
        if code_sources(src) != code_sources(ran):
            print(f"stale {ipynb.relative_to(ROOT)}: its code differs from {md.name}; run `make notebooks`")
            bad += 1
        elif code_tags(src) != code_tags(ran):
            print(f"stale {ipynb.relative_to(ROOT)}: its cell tags differ from {md.name}; "
                  f"run `python tools/notebooks.py --sync {md.stem}`")
            bad += 1
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="chapters to rebuild (default: all in _toc.yml)")
    ap.add_argument("--check", action="store_true", help="only check that the .ipynb match the .md")
    ap.add_argument("--sync", action="store_true", help="copy Markdown and tags from the .md, keep outputs")
    ap.add_argument("--renamed", action="store_true", help="with --sync: copy code changed in names only too")
    a = ap.parse_args(argv)
    mds = chapters()
    if a.names:
        wanted = {Path(n).stem for n in a.names}
        mds = [m for m in mds if m.stem in wanted]
        missing = wanted - {m.stem for m in mds}
        if missing:
            print(f"not notebook chapters in _toc.yml: {', '.join(sorted(missing))}", file=sys.stderr)
            return 2
    if a.check:
        return check(mds)
    if a.sync:
        for md in mds:
            sync(md, renamed=a.renamed)
        return 0
    for md in mds:
        build(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
