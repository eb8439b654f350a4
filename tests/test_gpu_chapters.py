"""The heavy chapters at GPU scale without a GPU: papermill runs them with the parameters their
own comments document, on law-generated records of the GPU studies (`looped.studies.simulate`:
the paper's joint fit plus 0.01-nat noise, the real accounting of every run)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from looped.studies.simulate import write_law_records

BOOK = Path(__file__).resolve().parents[1] / "book"
CPU_WORDS = re.compile(r"CPU stud", re.I)


def run_chapter(chapter: str, out: Path, **parameters) -> dict:
    papermill = pytest.importorskip("papermill")
    papermill.execute_notebook(str(BOOK / f"{chapter}.ipynb"), str(out), parameters=parameters, cwd=str(BOOK),
                               kernel_name="python3", progress_bar=False)
    return json.loads(out.read_text())


def texts(nb: dict):
    """Everything a reader sees: markdown cells and every text or markdown output (glued values too)."""
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            yield "".join(cell["source"])
        for o in cell.get("outputs", []):
            yield "".join(o.get("text", ""))
            for key, value in o.get("data", {}).items():
                if "text" in key and "html" not in key:
                    yield "".join(value) if isinstance(value, list) else str(value)


@pytest.fixture(scope="module")
def gpu_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    write_law_records("gpu-main", root / "gpu-main", noise=0.01, seed=0)
    return root


def test_sweep_chapter_runs_on_the_one_gpu_study(gpu_runs, tmp_path):
    nb = run_chapter("03_sweep", tmp_path / "03.ipynb", study="gpu-main", runs_dir=str(gpu_runs / "gpu-main"))
    said = "\n".join(texts(nb))
    assert "the one-GPU study `gpu-main`" in said
    assert not CPU_WORDS.search(said), CPU_WORDS.search(said)
    assert "gpu-main: ok 68" in said
