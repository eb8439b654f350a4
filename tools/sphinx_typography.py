"""Number typography for the whole book, applied once for every page.

* Glued numbers (myst-nb's ``{glue:text}``, an inline ``span.pasted-text``) print a true minus
  sign: a hyphen-minus that starts a number (not one inside a word, a range such as 384-768 or
  a date) becomes U+2212 "−".
* Glued numbers are set in the weight of the text around them: myst-nb's stylesheet makes every
  ``span.pasted-text`` bold; ``_static/looped.css`` inherits the weight instead, so a number is
  bold only where the author wrote ``**...**`` around it.
* The HTML tables of `looped.report.tables.Table` print the same true minus in their cells.
* Code boxes hold ``CODE_COLUMNS`` columns at the book's width (``_static/looped.css`` sets the
  monospace size of cell inputs, outputs and listings; tests/test_book_code.py holds the lines to
  it).
"""
from __future__ import annotations

import re
from pathlib import Path

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

MINUS = "\u2212"
# a hyphen-minus that starts a number: not after a word character, a dot or another minus
# ("cpu-3", "384-768", "2026-12"), and followed by a digit or ".5"
NUMBER_MINUS = re.compile(r"(?<![\w.\-\u2212])-(?=\.?\d)")
CODE_COLUMNS = 88
STATIC = Path(__file__).resolve().parent / "static"


TABLE_MARK = "<!-- looped-table -->"   # looped.report.tables.HTML_MARK: the HTML of a `Table`
STYLE = re.compile(r"(<style\b.*?</style>)", re.S | re.I)


def true_minus(text: str) -> str:
    """``text`` with each hyphen-minus that starts a number replaced by U+2212."""
    return NUMBER_MINUS.sub(MINUS, text)


def table_minus(html: str) -> str:
    """The same in the text of an HTML table (between tags; style sheets and attributes untouched)."""
    parts = STYLE.split(html)
    for i in range(0, len(parts), 2):   # the odd parts are <style> blocks
        parts[i] = re.sub(r">([^<]+)<", lambda m: ">" + true_minus(m.group(1)) + "<", parts[i])
    return "".join(parts)


class GluedMinus(SphinxPostTransform):
    """After myst-nb has pasted every glue (its post-transform runs at priority 5)."""

    default_priority = 200

    def run(self, **kwargs) -> None:
        for span in self.document.findall(nodes.inline):
            if "pasted-text" not in span["classes"]:
                continue
            for text in list(span.findall(nodes.Text)):
                new = true_minus(str(text))
                if new != str(text):
                    text.parent.replace(text, nodes.Text(new))
        for raw in self.document.findall(nodes.raw):   # the book's tables (after myst-nb chose HTML)
            if "html" in raw.get("format", "").split() and TABLE_MARK in raw.astext():
                raw.children[0] = nodes.Text(table_minus(raw.astext()))


def _static_path(app) -> None:
    if str(STATIC) not in app.config.html_static_path:
        app.config.html_static_path.append(str(STATIC))


def setup(app):
    app.add_post_transform(GluedMinus)
    app.connect("builder-inited", _static_path)
    app.add_css_file("looped.css", priority=900)   # after myst-nb's and the theme's sheets
    return {"parallel_read_safe": True, "parallel_write_safe": True}
