"""Numbered tables from code cells, and appendix numbers "A.1" for figures, tables and equations.

Tables.  A chapter's tables are the HTML a code cell displays (`looped.report.tables.Table`, with
its own ``<caption>``).  Sphinx numbers only its own table nodes, so a cell names its table with
myst-nb's figure option, a name that starts with ``tab-`` and no caption::

    ```{code-cell} ipython3
    ---
    mystnb:
      figure:
        name: tab-fit-params
    ---
    Table(frame, "Fitted parameters")
    ```

The figure myst-nb wraps around that output becomes a numbered table here: it counts with the
book's other tables ("Table 3.1"), its number is written at the start of the table's own caption,
and {numref}`tab-fit-params` links to it.

Appendices.  Pages outside the numbered chapters whose name starts with ``appendix_`` get a
letter in the order of the table of contents (A, B, ...): their figures, tables and equations are
numbered A.1, A.2, ... instead of one count that runs on across the appendices, and the letter
stands before the page's title, on the page and in the navigation ("A. Rerunning at paper
scale"), as a chapter's number does.
"""
from __future__ import annotations

import html
import re
import string

from docutils import nodes
from sphinx.transforms import SphinxTransform

TABLE_PREFIX = "tab-"
APPENDIX = re.compile(r"(^|/)appendix_[^/]*$")
CAPTION = re.compile(r"(<caption\b[^>]*>)(.*?)</caption>", re.S | re.I)


class output_table(nodes.General, nodes.Element):
    """The output of a code cell that displays a captioned HTML table, numbered as a table."""


def _html_outputs(node: nodes.Element) -> list[nodes.raw]:
    return [r for r in node.findall(nodes.raw) if "html" in r.get("format", "").split()]


def table_title(node: nodes.Element) -> str:
    """The text of the table's <caption> (the numbered title Sphinx needs), else ''."""
    for raw in _html_outputs(node):
        m = CAPTION.search(raw.astext())
        if m:
            return html.unescape(re.sub(r"<[^>]+>", "", m.group(2))).strip()
    return ""


class CellTables(SphinxTransform):
    """A myst-nb figure named tab-... becomes an `output_table`."""

    default_priority = 500

    def apply(self, **kwargs) -> None:
        for fig in list(self.document.findall(nodes.figure)):
            if not any(n.startswith(TABLE_PREFIX) for n in fig["names"]):
                continue
            table = output_table("", *fig.children, ids=fig["ids"], names=fig["names"],
                                 classes=fig["classes"] + ["output-table"])
            table.source, table.line = fig.source, fig.line
            fig.replace_self(table)
            for i in table["ids"]:
                self.document.ids[i] = table


def visit_output_table_html(self, node: output_table) -> None:
    number = self.builder.fignumbers.get("table", {}).get(node["ids"][0] if node["ids"] else "")
    if number:
        prefix = self.config.numfig_format["table"] % ".".join(map(str, number))
        for raw in _html_outputs(node):
            text = raw.astext()
            if CAPTION.search(text):
                new = CAPTION.sub(lambda m: f'{m.group(1)}<span class="caption-number">{prefix} </span>'
                                            f'<span class="caption-text">{m.group(2)}</span></caption>', text, count=1)
                raw.children[0] = nodes.Text(new)
                break
    self.body.append(self.starttag(node, "div", CLASS="output-table"))


def depart_output_table_html(self, node: output_table) -> None:
    self.body.append("</div>\n")


def visit_passthrough(self, node) -> None:
    pass


def depart_passthrough(self, node) -> None:
    pass


def _toc_order(env) -> list[str]:
    """Every document in reading order (depth first through the toctrees from the root)."""
    order, seen = [], set()

    def walk(doc):
        if doc in seen:
            return
        seen.add(doc)
        order.append(doc)
        for child in env.toctree_includes.get(doc, []):
            walk(child)
    walk(env.config.root_doc)
    return order


def appendix_numbers(app, env) -> list[str]:
    """Renumber each appendix's figures, tables and equations as (letter, n), and number its title."""
    changed = []
    letters = iter(string.ascii_uppercase)
    env.looped_appendix_letters = {}
    for doc in _toc_order(env):
        if not APPENDIX.search(doc) or env.toc_secnumbers.get(doc):
            continue
        letter = next(letters)
        env.looped_appendix_letters[doc] = letter
        for ref in env.tocs[doc].findall(nodes.reference):   # the page's own entry in the navigation
            if not ref.get("anchorname"):
                if ref.get("secnumber") != (letter,):
                    ref["secnumber"] = (letter,)
                    changed += sorted(env.found_docs)   # every page's navigation shows it
                break
        for figtype, numbers in env.toc_fignumbers.get(doc, {}).items():
            if figtype == "section":
                continue
            for n, fig_id in enumerate(sorted(numbers, key=lambda i: numbers[i]), start=1):
                if numbers[fig_id] != (letter, n):
                    numbers[fig_id] = (letter, n)
                    changed.append(doc)
    return sorted(set(changed))


def appendix_title(app, doctree, docname) -> None:
    """The appendix's letter before its page title (the H1)."""
    letter = getattr(app.env, "looped_appendix_letters", {}).get(docname)
    section = next(iter(doctree.findall(nodes.section)), None)
    if letter and section is not None and isinstance(section[0], nodes.title):
        section[0]["secnumber"] = (letter,)


def setup(app):
    app.add_enumerable_node(output_table, "table", lambda node: table_title(node),
                            html=(visit_output_table_html, depart_output_table_html),
                            latex=(visit_passthrough, depart_passthrough),
                            text=(visit_passthrough, depart_passthrough))
    app.add_transform(CellTables)
    app.connect("env-get-updated", appendix_numbers, priority=900)
    app.connect("doctree-resolved", appendix_title)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
