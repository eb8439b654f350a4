"""The book's plumbing: every chapter in _toc.yml exists, each notebook chapter has a committed,
up-to-date nbval reference with at least one checked cell, and the config excludes generated files."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("book_notebooks", ROOT / "tools" / "notebooks.py")
notebooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(notebooks)

TOC_FILES = [m.group(1) for line in (ROOT / "_toc.yml").read_text().splitlines()
             if (m := re.match(r"\s*-?\s*(?:file|root):\s*(\S+)", line)) and not line.lstrip().startswith("#")]
CHAPTERS = notebooks.chapters()


def test_toc_entries_exist():
    assert "book/intro" in TOC_FILES
    missing = [f for f in TOC_FILES if not (ROOT / f"{f}.md").exists()]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"


def test_config_excludes_generated_notebooks():
    text = (ROOT / "_config.yml").read_text()
    for pattern in ('"book/*.ipynb"', '"_build"', '".venv"', '"README.md"'):
        assert pattern in text


@pytest.mark.parametrize("md", CHAPTERS, ids=[m.stem for m in CHAPTERS])
def test_chapter_reference_notebook(md):
    ipynb = md.with_suffix(".ipynb")
    assert ipynb.exists(), f"run `make notebooks` to create {ipynb.name}"
    nb = json.loads(ipynb.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    assert notebooks.check([md]) == 0, f"{ipynb.name} is stale: run `make notebooks`"
    checked = [c for c in nb["cells"] if "nbval-check-output" in c.get("metadata", {}).get("tags", [])]
    assert checked, f"{md.name} has no cell tagged nbval-check-output"
    assert all(c.get("outputs") for c in checked), f"{ipynb.name} has a checked cell without outputs"
    errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{ipynb.name} was saved with an error output"


def test_make_analysis_regenerates_every_chapter_that_reads_the_analyses():
    """`make analysis` reruns runs/analysis/*.json, then regenerates the chapters that read them."""
    rule = re.search(r"^analysis:.*?\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    listed = set(re.search(r"tools/notebooks.py (.*)", rule).group(1).split())
    # either form: `from looped.studies.constancy.analysis import read_results` or `constancy.read_results()`
    analyses = r"(constancy\.analysis|constancy\.misfit|case_studies\.analysis|shape|corpora)"
    aliases = r"(constancy|misfit_analysis|case_study_analysis|shape|corpora)"   # a chapter's name for such a module
    readers = {md.stem for md in CHAPTERS
               if re.search(rf"studies\.{analyses} import[^\n]*read_results|\b{aliases}\.read_results\(",
                            md.read_text())}
    assert readers and listed == readers


def test_regenerated_notebooks_keep_their_cell_ids():
    """Cell ids come from the cells, not from chance: a regenerated notebook diffs only where it changed."""
    import nbformat
    def nb():
        return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_markdown_cell("# A"),
                                               nbformat.v4.new_code_cell("x = 1")])
    a, b = nb(), nb()
    notebooks.stable_ids(a)
    notebooks.stable_ids(b)
    ids = [c.id for c in a.cells]
    assert ids == [c.id for c in b.cells] and len(set(ids)) == 3 and ids[2] == ids[0] + "-2"
    nbformat.validate(a)


def test_a_renamed_sync_copies_code_keeps_outputs_and_refuses_new_cells(tmp_path):
    """`tools/notebooks.py --sync --renamed`: an import path renamed in the .md reaches the .ipynb with
    the executed outputs kept (nbval then checks them); a cell added or removed needs a rerun."""
    import nbformat
    md = tmp_path / "ch.md"
    header = (ROOT / "book" / "01_architecture.md").read_text().split("\n---\n", 1)[0] + "\n---\n\n"   # a chapter's
    md.write_text(header + "# A\n\n```{code-cell} ipython3\nfrom old.place import f\nprint(1)\n```\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A"),
                                         nbformat.v4.new_code_cell("from old.place import f\nprint(1)")])
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nbformat.write(nb, md.with_suffix(".ipynb"))
    md.write_text(md.read_text().replace("old.place", "new.place"))
    with pytest.raises(SystemExit, match="code changed"):
        notebooks.sync(md)
    notebooks.sync(md, renamed=True)
    cell = [c for c in nbformat.read(md.with_suffix(".ipynb"), as_version=4).cells if c.cell_type == "code"][0]
    assert cell.source.startswith("from new.place") and cell.outputs[0]["text"] == "1\n"
    md.write_text(md.read_text() + "\n```{code-cell} ipython3\nprint(2)\n```\n")
    with pytest.raises(SystemExit, match="added or removed"):
        notebooks.sync(md, renamed=True)
