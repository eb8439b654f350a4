"""The book's local Sphinx extensions, function by function (no build): true minus signs in glued
numbers and table cells (tools/sphinx_typography.py), and the numbered tables of code cells
(tools/sphinx_numbering.py)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml
from docutils import nodes

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


typography, numbering = _load("sphinx_typography"), _load("sphinx_numbering")


@pytest.mark.parametrize("text, shown", [
    ("-0.285", "−0.285"),
    ("[-0.109, +0.102]", "[−0.109, +0.102]"),
    ("z = -2.0 to -.5", "z = −2.0 to −.5"),
    ("384-768", "384-768"),              # a range
    ("cpu-3 and 2026-12-06", "cpu-3 and 2026-12-06"),
    ("−0.3", "−0.3"),                    # already a true minus
    ("--1", "--1"),
])
def test_true_minus(text, shown):
    assert typography.true_minus(text) == shown


def test_table_minus_changes_cells_not_styles():
    html = ('<!-- looped-table --><style>#T td { margin: -0.5em; }</style>'
            '<table id="T-1"><tr><td class="x-1">-0.013</td><td>2-4</td></tr></table>')
    out = typography.table_minus(html)
    assert "margin: -0.5em" in out and 'id="T-1"' in out and 'class="x-1"' in out
    assert ">−0.013<" in out and ">2-4<" in out


def test_table_title_is_the_caption_text():
    raw = nodes.raw("", '<table><caption>Fitted <b>φ</b> &amp; E</caption></table>', format="html")
    table = numbering.output_table("", nodes.container("", raw))
    assert numbering.table_title(table) == "Fitted φ & E"
    assert numbering.table_title(numbering.output_table("", nodes.container())) == ""


def test_the_book_loads_the_extensions():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]
    assert {"sphinx_typography", "sphinx_numbering"} <= set(config["local_extensions"])
    assert "sphinx.ext.viewcode" in config["extra_extensions"]
    css = (ROOT / "tools" / "static" / "looped.css").read_text()
    assert "span.pasted-text" in css and "font-weight: inherit" in css
    assert typography.CODE_COLUMNS == 88
