"""The book's voice, read from the committed executed chapters (tools/book_stats.py): the argument
is Markdown, code writes at most a few verdict labels, a reader can open most code cells, and no
page grows past ~3,000 words or 8 tables."""
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


def test_no_page_over_3000_words_or_8_tables():
    for page in book_stats.stats()["pages"]:
        assert page["words"] <= 3000 and page["tables"] <= 8, page


def test_a_generated_sentence_is_counted():
    md = {"output_type": "display_data", "metadata": {},
          "data": {"text/markdown": "The law misses our runs by three times their noise."}}
    label = {"output_type": "display_data", "metadata": {"scrapbook": {"name": "v", "mime_prefix": "p/"}},
             "data": {"p/text/plain": "'lies above'"}}
    assert book_stats.generated(md) == (10, 0)
    assert book_stats.generated(label) == (0, 0)      # a short verdict label is not prose
