"""Corpus v2: the prose corpus of our first CPU study (the `prose` preset), kept so that study
stays documented and rebuildable.

Five Debian packages (scripture, commentary, Austen; their bookworm pins) and PyPI's `bigbench`
1.0.0 sdist, which supplied half the words: Wikipedia passages (Quoref, DROP, SQuAD and
SQuAD-shifts contexts, paragraph_segmentation's English articles) and Gutenberg fiction
(authorship_verification).  `bigbench` 1.0.0 has since left PyPI, so v2 builds only from a saved
copy of its archive (sha256 below) placed in $LOOPED_SOURCES; corpus v3 (`prose_v3`) is the one
anyone can rebuild.
"""
from __future__ import annotations

import html
import json
import tarfile
import zlib
from pathlib import Path
from typing import Iterator

from .containers import bigbench_task
from .sources import Source, SourceError

BIGBENCH = "bigbench-1.0.0.tar.gz"

SOURCES = (
    Source("web", "sword-text-web", "426.0-1",
           "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1", "public domain", suite="bookworm"),
    Source("kjv", "sword-text-kjv", "14.3-1",
           "9f463f28ce665f6f528fc723179722bced880a4c5485f7a41bf742838315de57", "public domain", suite="bookworm"),
    Source("tdavid", "sword-comm-tdavid", "2.1-1",
           "bcbfad701c5c4a061475b58309cebc42755a59e87478c8355227c5e046412b3f", "public domain", suite="bookworm"),
    Source("mhcc", "sword-comm-mhcc", "2.0-1",
           "06f748215de78ff48fdfdee93e3ffc5af6318b976485f7aedf22309236967e35", "public domain", suite="bookworm"),
    Source("austen", "r-cran-janeaustenr", "1.0.0-1",
           "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95",
           "novels public domain; package MIT", suite="bookworm"),
    Source("bigbench", "bigbench", "1.0.0",
           "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2",
           "Apache-2.0 archive; passages CC BY-SA (Wikipedia) / public domain (Gutenberg)", "pypi"),
)

# bigbench tasks we read (path under bigbench/benchmark_tasks/ -> extractor), and their origin
BIGBENCH_TASKS = {
    "authorship_verification/non_swapped/task.json": "gutenberg",
    "authorship_verification/swapped/task.json": "gutenberg",
    "natural_instructions/subtask001_quoref_question_generation/task.json": "passage",
    "natural_instructions/subtask002_quoref_answer_generation/task.json": "passage",
    "natural_instructions/subtask026_drop_question_generation/task.json": "passage",
    "natural_instructions/subtask027_drop_answer_type_generation/task.json": "passage",
    "natural_instructions/subtask028_drop_answer_generation/task.json": "passage",
    "squad_shifts/squaddev_v1.1.json": "squad",
    "squad_shifts/new_wiki_v1.0.json": "squad",
    "paragraph_segmentation/task.json": "paragraphs",
}


def bigbench_documents(path: Path) -> Iterator[tuple[str, list[str]]]:
    """Documents of the selected tasks, read straight from the sdist (no unpacking)."""
    try:
        with tarfile.open(path, "r:gz") as t:
            found = set()
            for m in t:
                task = m.name.split("/benchmark_tasks/", 1)[-1]
                if m.isfile() and task in BIGBENCH_TASKS:
                    found.add(task)
                    j = json.load(t.extractfile(m))
                    name = task.split("/")[0] if "natural_instructions" not in task else task.split("_")[2]
                    for key, paras in bigbench_task(BIGBENCH_TASKS[task], task, j):
                        yield f"bigbench/{name}/{key}", [html.unescape(x) for x in paras]
    except (tarfile.TarError, EOFError, OSError, zlib.error, ValueError, KeyError) as e:
        raise SourceError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    if len(found) != len(BIGBENCH_TASKS):
        raise SourceError(f"{path}: tasks missing: {', '.join(sorted(set(BIGBENCH_TASKS) - found))}")
