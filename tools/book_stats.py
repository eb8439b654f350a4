#!/usr/bin/env python3
"""The book's shape, read from the executed chapters (book/*.ipynb): words, tables, figures, code.

    python tools/book_stats.py          # one row per page and the totals
    python tools/book_stats.py --json   # the same as JSON (tests/test_book_voice.py reads it)
    python tools/book_stats.py --markdown [px.json]   # a Markdown table, with each page's height
                                                      # from .ci/check_html.py's screenshots/px.json

Words written by code: Markdown that a cell displays, plus glued strings of more than three
words (a short label such as "overlaps" is a verdict, not prose).  Words on the page: the
Markdown cells (code blocks, directives' options and HTML comments left out) plus those.
Tables: Markdown tables in the text plus HTML tables in the outputs the reader sees (not those of
remove-cell / remove-output cells, which nbval checks).  Figures: images in the shown outputs
plus {figure} directives and Markdown images.  Code cells are "visible", "toggleable" (hide-input
/ hide-cell) or "removed" (remove-input / remove-cell); at least half should be readable
(visible or toggleable).  Listings: `{literalinclude}` blocks of the package's source.
Pages without an executed twin (the intro, the conclusion) are read from their Markdown.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"

FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.S | re.M)
COMMENT = re.compile(r"<!--.*?-->", re.S)
OPTION = re.compile(r"^:\w[\w-]*:.*$", re.M)
ROLE = re.compile(r"\{glue:\w+\}`[^`]*`")          # a glued value counts once, where it is produced
HTML_TABLE = re.compile(r"<table\b", re.I)
FIGURE = re.compile(r"^(```|:::)\{figure\}|!\[[^\]]*\]\([^)]+\)", re.M)
LISTING = re.compile(r"^```\{literalinclude\}", re.M)
HIDDEN_OUTPUT = {"remove-cell", "remove-output"}


def words(text: str) -> int:
    return len(re.findall(r"[A-Za-z0-9φβα][\w'’.,%-]*", text))


def markdown_words(src: str) -> tuple[int, int]:
    """(words, Markdown tables) of a Markdown cell's prose."""
    src = COMMENT.sub(" ", src)
    body = FENCE.sub(" ", src)
    body = re.sub(r"^:::.*$", " ", body, flags=re.M)          # colon-fence lines are not words
    tables = len(re.findall(r"^\|[ :-]+\|[ |:-]*$", body, re.M))
    body = OPTION.sub(" ", ROLE.sub(" ", body))
    body = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$", " ", body, flags=re.S)   # math is not words
    return words(body), tables


def code_visibility(cell) -> str:
    tags = set(cell.get("metadata", {}).get("tags", []))
    if tags & {"remove-input", "remove-cell"}:
        return "removed"
    if tags & {"hide-input", "hide-cell"}:
        return "toggleable"
    return "visible"


def generated(output) -> tuple[int, int]:
    """(words written by code, HTML tables) of one cell output."""
    glue = output.get("metadata", {}).get("scrapbook")
    prefix = glue.get("mime_prefix", "") if glue else ""
    data = {k[len(prefix):]: v for k, v in output.get("data", {}).items() if k.startswith(prefix)}
    n_words, n_tables = 0, len(HTML_TABLE.findall("".join(data.get("text/html", ""))))
    md = "".join(data.get("text/markdown", ""))
    if md:
        n_words += words(COMMENT.sub(" ", md))
    elif glue and "text/plain" in data and not data.get("text/html") and "image/png" not in data:
        text = "".join(data["text/plain"]).strip()
        if text[:1] in "'\"":                                   # a glued str (its repr)
            n = words(text.strip("'\""))
            n_words += n if n > 3 else 0
    return n_words, n_tables


def _markdown_cells(md_path: Path) -> list[dict]:
    """A MyST page without an executed twin, as Markdown cells (its code cells are not counted)."""
    text = md_path.read_text()
    text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)            # front matter
    return [dict(cell_type="markdown", source=[text], metadata={})]


def page_stats(path: Path) -> dict:
    cells = json.loads(path.read_text())["cells"] if path.suffix == ".ipynb" else _markdown_cells(path)
    row = dict(page=path.stem, words=0, generated_words=0, tables=0, figures=0,
               code=0, visible=0, toggleable=0, removed=0, listings=0)
    for cell in cells:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            w, t = markdown_words(src)
            row["words"] += w
            row["tables"] += t
            row["figures"] += len(FIGURE.findall(src))
            row["listings"] += len(LISTING.findall(src))
        elif cell["cell_type"] == "code":
            row["code"] += 1
            row[code_visibility(cell)] += 1
            shown = not set(cell.get("metadata", {}).get("tags", [])) & HIDDEN_OUTPUT
            for out in cell.get("outputs", []):
                w, t = generated(out)
                row["generated_words"] += w
                if shown:
                    row["tables"] += t
                    row["figures"] += any(k.startswith("image/") for k in out.get("data", {}))
    row["words"] += row["generated_words"]
    return row


def pages() -> list[Path]:
    """Every page of the book in the table of contents, except the API and bibliography pages: its
    executed twin (book/NN_x.ipynb) where there is one, else its Markdown."""
    toc = (ROOT / "_toc.yml").read_text()
    stems = [s for s in re.findall(r"(?:file|root):\s*book/(\S+)", toc) if not s.startswith("api")]
    found = [BOOK / f"{s}.ipynb" if (BOOK / f"{s}.ipynb").exists() else BOOK / f"{s}.md" for s in stems]
    return [p for p in found if p.exists() and p.stem not in ("bibliography",)]


def stats() -> dict:
    rows = [page_stats(p) for p in pages()]
    total = {k: sum(r[k] for r in rows) for k in rows[0] if k != "page"}
    return dict(pages=rows, total=total)


if __name__ == "__main__":
    s = stats()
    if "--json" in sys.argv:
        print(json.dumps(s, indent=1))
        sys.exit(0)
    if "--markdown" in sys.argv:
        rest = sys.argv[sys.argv.index("--markdown") + 1:]
        px = json.loads(Path(rest[0]).read_text()) if rest else {}
        print("| page | px | words | tables | figures | code cells visible / toggleable / removed | listings |")
        print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
        for r in s["pages"]:
            h = f"{px[r['page']][1]:,}" if r["page"] in px else "-"
            print(f"| {r['page']} | {h} | {r['words']:,} | {r['tables']} | {r['figures']} | "
                  f"{r['visible']} / {r['toggleable']} / {r['removed']} | {r['listings']} |")
        sys.exit(0)
    cols = ["words", "generated_words", "tables", "figures", "code", "visible", "toggleable", "removed",
            "listings"]
    print(f"{'page':22s}" + "".join(f"{c:>11.11s}" for c in cols))
    for r in s["pages"] + [dict(page="total", **s["total"])]:
        print(f"{r['page']:22s}" + "".join(f"{r[c]:>11d}" for c in cols))
    t = s["total"]
    print(f"readable code cells: {(t['visible'] + t['toggleable']) / t['code']:.0%}")
