"""What the reader sees in the executed chapters (the committed reference notebooks, which the book
renders): every table is a `looped.report.tables.Table`, fits the page and shows no index column
without a name; no visible output is a monospace table or an empty box; no number in prose is
printed as '1e+13'."""
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from looped.report.tables import HTML_MARK, MAX_WIDTH_CHARS, Table

BOOK = Path(__file__).resolve().parents[1] / "book"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
HIDDEN = {"remove-cell", "remove-output"}


class _Cells(HTMLParser):
    """The header and body rows of an HTML table: [(tag, text, colspan, css class)] per row."""

    def __init__(self):
        super().__init__()
        self.rows, self.cell, self.in_caption, self.in_style = [], None, False, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.cell = [tag, "", int(a.get("colspan", 1)), a.get("class", "")]
        elif tag == "caption":
            self.in_caption = True
        elif tag == "style":
            self.in_style = True
        elif tag == "br" and self.cell is not None:
            self.cell[1] += " "

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(tuple(self.cell))
            self.cell = None
        elif tag == "caption":
            self.in_caption = False
        elif tag == "style":
            self.in_style = False

    def handle_data(self, data):
        if self.cell is not None and not self.in_style:
            self.cell[1] += data


def width_chars(html: str) -> int:
    """The narrowest a rendered table can be drawn, in characters: per column its longest word,
    plus two for the padding (the rule of `Table.width_chars`)."""
    parser = _Cells()
    parser.feed(html)
    widths: dict[int, int] = {}
    for row in parser.rows:
        col = 0
        for tag, text, span, css in row:
            if span == 1:   # cells wrap at spaces only: a column is as wide as its longest word
                widths[col] = max(widths.get(col, 1), max((len(w) for w in text.split()), default=0))
            col += span
    return sum(w + 2 for w in widths.values())


def outputs():
    """(notebook, cell index, tags, output) for every output of every code cell."""
    for nb in NOTEBOOKS:
        cells = json.loads(nb.read_text())["cells"]
        for i, cell in enumerate(cells):
            for out in cell.get("outputs", []):
                yield nb.stem, i, set(cell.get("metadata", {}).get("tags", [])), out


def text_of(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def test_table_text_and_html_come_from_one_frame():
    frame = pd.DataFrame({"fit": ["a", "b"], "runs": [12, 15], "budget": [1e13, 2.5e13]})
    table = Table(frame, "two fits")
    assert table.text.splitlines()[0] == "two fits"
    assert "2.5×10¹³" in table.text and "2.5×10¹³" in table._repr_html_()
    assert table._repr_html_().startswith(HTML_MARK) and table.width_chars() == width_chars(table._repr_html_())


def test_a_fitted_column_is_printed_as_its_check():
    frame = pd.DataFrame({"fit": ["a"], "phi": [0.4567]})
    text = Table(frame, tolerances={"phi": 0.01}, check="x/y", label="fit", active=False).text
    assert "a phi  0.4567 (no reference for these parameters)" in text and "0.457" not in text.splitlines()[0]


def test_a_fitted_column_without_a_check_key_is_refused():
    with pytest.raises(ValueError, match="check key"):
        Table(pd.DataFrame({"phi": [0.5]}), tolerances={"phi": 0.01})


def test_every_table_a_reader_sees_is_a_looped_table_that_fits_the_page():
    bad = []
    for nb, i, tags, out in outputs():
        html = text_of(out.get("data", {}).get("text/html", ""))
        if "<table" not in html or tags & HIDDEN:
            continue
        if not html.startswith(HTML_MARK):
            bad.append(f"{nb} cell {i}: a table not built by looped.report.tables.Table")
        elif width_chars(html) > MAX_WIDTH_CHARS:
            bad.append(f"{nb} cell {i}: {width_chars(html)} characters wide (> {MAX_WIDTH_CHARS})")
        elif 'class="blank' in html and 'class="index_name' not in html:
            bad.append(f"{nb} cell {i}: an index column without a name")
    assert not bad, "\n".join(bad)


def test_no_visible_output_is_a_monospace_table_or_an_empty_box():
    bad = []
    for nb, i, tags, out in outputs():
        if tags & HIDDEN:
            continue
        if out.get("output_type") == "stream":
            text = text_of(out.get("text", ""))
            if not text.strip():
                bad.append(f"{nb} cell {i}: an empty output box")
            aligned = [ln for ln in text.splitlines() if len(re.findall(r"\S+", ln)) >= 4 and "  " in ln.strip()]
            if len(aligned) >= 3:
                bad.append(f"{nb} cell {i}: a table printed as monospace text")
        data = out.get("data", {})
        if "text/plain" in data and len(data) == 1 and out.get("output_type") != "stream":
            if len(text_of(data["text/plain"]).splitlines()) >= 3:
                bad.append(f"{nb} cell {i}: a plain-text result of several lines")
    assert not bad, "\n".join(bad)


def test_no_number_in_prose_is_printed_with_an_exponent():
    pattern = re.compile(r"\d\.?\d*e[+-]\d")
    bad = []
    for nb, i, tags, out in outputs():
        data = out.get("data", {})
        for mime in ("text/markdown", "application/papermill.record/text/markdown"):   # shown, or glued into prose
            if mime in data and pattern.search(text_of(data[mime])):
                bad.append(f"{nb} cell {i}: {pattern.search(text_of(data[mime])).group()} in {mime}")
    for md in BOOK.glob("*.md"):
        prose = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
        prose = re.sub(r"`[^`]*`|\$[^$]*\$", "", prose)
        bad += [f"{md.name}: {m.group()}" for m in pattern.finditer(prose)]
    assert not bad, "\n".join(bad)


def test_numbers_laid_out_otherwise_are_checked_under_their_recorded_names():
    frame = pd.DataFrame({"estimate": ["fit", "2.5%"], "phi": [0.45, 0.40], "alpha": [0.2, 0.1]})
    table = Table(frame, measured={"phi": 0.45, "phi_lo": 0.40}, tolerances={"phi": 0.01, "phi_lo": 0.03},
                  exact=["estimate"], check="x/y", active=False)
    lines = table.text.splitlines()
    assert lines[0].split() == ["estimate"] and lines[1].strip() == "fit"
    assert any(line.startswith("phi_lo") for line in lines) and "0.2" not in table.text
    only_rows = Table(frame, exact=frame[frame.estimate == "fit"][["estimate", "phi"]])
    assert "2.5%" not in only_rows.text and "0.450" in only_rows.text


def test_a_claim_that_no_longer_holds_fails_the_reference_run_and_is_noted_elsewhere():
    from looped.report import checks
    assert checks.claims({"phi lies above the paper's": True}) is None
    with pytest.raises(checks.ClaimFailed, match="lies below"):
        checks.claims({"phi lies above the paper's": True, "phi_2 lies below phi_8": False})
    note = checks.claims({"phi_2 lies below phi_8": False}, active=False)
    assert "phi_2 lies below phi_8" in note.data and "reference runs" in note.data
