"""The book's voice, read from the committed executed chapters (tools/book_stats.py): the argument
is Markdown, code writes at most a few verdict labels, a reader can open most code cells, and no
page grows past a lecture: 2,500 words and 5 tables (the height, 8,000 px at 1280 px, is held
by .ci/check_html.py on the built book)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("book_stats", ROOT / "tools" / "book_stats.py")
book_stats = importlib.util.module_from_spec(spec)
spec.loader.exec_module(book_stats)


def test_code_writes_labels_not_prose_and_most_code_can_be_read():
    s = book_stats.stats()
    assert s["total"]["generated_words"] <= 100, s["total"]
    assert s["total"]["visible"] + s["total"]["toggleable"] >= s["total"]["code"] / 2, s["total"]


MAX_WORDS, MAX_TABLES = 2500, 5


def test_no_page_over_2500_words_or_5_tables():
    long = [p for p in book_stats.stats()["pages"] if p["words"] > MAX_WORDS or p["tables"] > MAX_TABLES]
    assert not long, "\n".join(f"{p['page']}: {p['words']} words, {p['tables']} tables" for p in long)


def test_a_generated_sentence_is_counted():
    md = {"output_type": "display_data", "metadata": {},
          "data": {"text/markdown": "The law misses our runs by three times their noise."}}
    label = {"output_type": "display_data", "metadata": {"scrapbook": {"name": "v", "mime_prefix": "p/"}},
             "data": {"p/text/plain": "'lies above'"}}
    assert book_stats.generated(md) == (10, 0)
    assert book_stats.generated(label) == (0, 0)      # a short verdict label is not prose


def test_tables_and_figures_count_only_what_the_reader_sees(tmp_path):
    table = {"output_type": "display_data", "metadata": {}, "data": {"text/html": "<table></table>"}}
    image = {"output_type": "display_data", "metadata": {}, "data": {"image/png": "iVBOR"}}
    cells = [dict(cell_type="code", metadata={"tags": tags}, source=["x"], outputs=[table, image])
             for tags in ([], ["hide-input"], ["remove-cell"], ["remove-output"])]
    cells.append(dict(cell_type="markdown", metadata={}, source=["```{figure} a.png\n:name: fig-a\n\nA.\n```\n"
                                                                 "```{literalinclude} ../looped/fit.py\n```\n"]))
    nb = tmp_path / "page.ipynb"
    nb.write_text(__import__("json").dumps({"cells": cells}))
    row = book_stats.page_stats(nb)
    assert (row["tables"], row["figures"], row["listings"]) == (2, 3, 1), row
    # a remove-output cell shows its code
    assert (row["code"], row["visible"], row["toggleable"], row["removed"]) == (4, 2, 1, 1), row
