"""Code that fits its box: no line a reader sees in a code box is longer than the box holds.

At 1280 px the book's narrowest code box (a cell input) is 634 px wide; tools/static/looped.css
sets code in 11.8 px monospace (0.602 em a character), so it holds 89 columns.  A visible line
longer than CODE_COLUMNS (88) is cut off at the box's edge (cell inputs and outputs scroll) or
wrapped (listings).  Checked: the source of visible code cells (no hide-/remove- tag) and of
toggleable ones (hide-input, hide-cell: a reader can open them; remove- cells never show), the
lines a ``{literalinclude}`` shows (read as Sphinx reads them), fenced code blocks in the text (not BibTeX
entries: copied rather than read, in a box that wraps), and the
printed outputs of cells whose output is shown (from the executed twin book/NN_x.ipynb).
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import SimpleNamespace

import yaml
from sphinx.directives.code import LiteralIncludeReader

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
_spec = importlib.util.spec_from_file_location("sphinx_typography", ROOT / "tools" / "sphinx_typography.py")
sphinx_typography = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sphinx_typography)
CODE_COLUMNS = sphinx_typography.CODE_COLUMNS
HIDDEN_INPUT = {"hide-input", "remove-input", "hide-cell", "remove-cell"}
REMOVED_INPUT = {"remove-input", "remove-cell"}
HIDDEN_OUTPUT = {"remove-output", "remove-cell"}
FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=fence)\s*$", re.S | re.M)


def pages() -> list[Path]:
    toc = (ROOT / "_toc.yml").read_text()
    stems = re.findall(r"(?:file|root):\s*book/(\S+)", toc)
    return [BOOK / f"{s}.md" for s in stems if (BOOK / f"{s}.md").exists()]


def _options(body: str) -> tuple[dict, str]:
    """A directive's options (YAML between --- lines, or :key: value lines) and its content."""
    if body.startswith("---\n"):
        head, _, rest = body[4:].partition("\n---\n")
        return yaml.safe_load(head) or {}, rest
    opts, lines = {}, body.split("\n")
    while lines and re.match(r"^:[\w-]+:", lines[0]):
        key, _, value = lines.pop(0)[1:].partition(":")
        value = value.strip()
        opts[key] = yaml.safe_load(value) if value[:1] in "[\"'" else value
    return opts, "\n".join(lines)


def literalinclude_lines(page: Path, info: str, body: str) -> list[str]:
    """The lines a {literalinclude} shows, read as Sphinx reads them."""
    opts, _ = _options(body)
    target = (page.parent / info.split("}", 1)[1].strip()).resolve()
    options = {k: v for k, v in opts.items() if k in ("pyobject", "start-at", "start-after", "end-before",
                                                         "end-at", "lines", "tab-width")}
    if "dedent" in opts:
        options["dedent"] = int(opts["dedent"]) if str(opts["dedent"]).strip() else None
    text, _ = LiteralIncludeReader(str(target), options, SimpleNamespace(source_encoding="utf-8-sig")).read()
    return text.splitlines()


def shown_code(page: Path) -> list[tuple[str, str]]:
    """(where, line) for every line of code a reader sees on ``page`` without opening anything."""
    out = []
    text = page.read_text()
    for m in FENCE.finditer(text):
        info, body = m.group("info").strip(), m.group("body")
        line0 = text.count("\n", 0, m.start()) + 1
        if info.startswith("{code-cell}"):
            opts, src = _options(body)
            if set(opts.get("tags") or []) & HIDDEN_INPUT:
                continue
            where = f"{page.name}:{line0} code cell"
            out += [(where, ln) for ln in src.splitlines()]
        elif info.startswith("{literalinclude}"):
            where = f"{page.name}:{line0} {info}"
            out += [(where, ln) for ln in literalinclude_lines(page, info, body)]
        elif info.startswith("{") or info == "bibtex":
            continue   # other directives (prose, figures, math); a BibTeX entry is copied, and its box wraps
        else:
            where = f"{page.name}:{line0} ```{info}"
            out += [(where, ln) for ln in body.splitlines()]
    return out


def toggleable_code(page: Path) -> list[tuple[str, str]]:
    """(where, line) for every line of a code cell whose input is folded away (hide-input,
    hide-cell) but opens, in the same box, when a reader clicks it."""
    out = []
    text = page.read_text()
    for m in FENCE.finditer(text):
        info, body = m.group("info").strip(), m.group("body")
        if not info.startswith("{code-cell}"):
            continue
        opts, src = _options(body)
        tags = set(opts.get("tags") or [])
        if not tags & HIDDEN_INPUT or tags & REMOVED_INPUT:
            continue
        line0 = text.count("\n", 0, m.start()) + 1
        out += [(f"{page.name}:{line0} toggleable code cell", ln) for ln in src.splitlines()]
    return out


def shown_outputs(page: Path) -> list[tuple[str, str]]:
    """(where, line) for every line of printed output in the executed twin (text a cell prints,
    or text/plain where nothing richer is shown), for cells whose output is shown."""
    twin = page.with_suffix(".ipynb")
    if not twin.exists():
        return []
    out = []
    for i, cell in enumerate(json.loads(twin.read_text())["cells"]):
        if cell["cell_type"] != "code" or set(cell.get("metadata", {}).get("tags", [])) & HIDDEN_OUTPUT:
            continue
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if o.get("output_type") == "stream":
                text = "".join(o.get("text", ""))
            elif "text/plain" in data and not any(k.startswith(("text/html", "image/", "text/markdown"))
                                                  for k in data) and not o.get("metadata", {}).get("scrapbook"):
                text = "".join(data["text/plain"])
            else:
                continue
            out += [(f"{twin.name} cell {i} output", ln) for ln in text.splitlines()]
    return out


def too_long(lines: list[tuple[str, str]]) -> list[str]:
    return [f"{where}: {len(ln.expandtabs(4))} columns: {ln.strip()[:70]}"
            for where, ln in lines if len(ln.expandtabs(4).rstrip()) > CODE_COLUMNS]


def test_visible_code_fits_the_box():
    long = [p for page in pages() for p in too_long(shown_code(page))]
    assert not long, f"{len(long)} visible code line(s) over {CODE_COLUMNS} columns:\n" + "\n".join(long)


def test_toggleable_code_fits_the_box():
    long = [p for page in pages() for p in too_long(toggleable_code(page))]
    assert not long, f"{len(long)} toggleable code line(s) over {CODE_COLUMNS} columns:\n" + "\n".join(long)


def test_printed_output_fits_the_box():
    long = [p for page in pages() for p in too_long(shown_outputs(page))]
    assert not long, f"{len(long)} output line(s) over {CODE_COLUMNS} columns:\n" + "\n".join(long)


def test_the_reader_finds_what_is_shown(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text("class A:\n    def f(self, x):\n        return x + 1\n\n    def g(self):\n        pass\n")
    page = tmp_path / "page.md"
    long = "y = " + "1 + " * 30 + "1"
    page.write_text(
        "# T\n\n```{code-cell} ipython3\n:tags: [hide-input]\n\n" + long + "\n```\n\n"
        "```{code-cell} ipython3\n---\ntags: [nbval-check-output]\n---\n" + long + "\n```\n\n"
        "```{literalinclude} mod.py\n:pyobject: A.f\n:dedent: 4\n```\n\n"
        "```bash\nlooped sweep --study cpu-main\n```\n\n"
        "```{code-cell} ipython3\n:tags: [remove-cell]\n\n" + long + "\n```\n")
    shown = [ln for _, ln in shown_code(page)]
    assert shown == [long, "def f(self, x):", "    return x + 1", "looped sweep --study cpu-main"], shown
    assert len(too_long(shown_code(page))) == 1 and "page.md:9 code cell" in too_long(shown_code(page))[0]
    assert [ln for _, ln in toggleable_code(page) if ln] == [long]   # hide-input opens; remove-cell never shows
    assert "page.md:3 toggleable code cell" in too_long(toggleable_code(page))[0]
