"""The heavy chapters at GPU scale without a GPU: papermill runs them with the parameters their
own comments document, on law-generated records of the GPU studies (`looped.studies.simulate`:
the paper's joint fit plus 0.01-nat noise, the real accounting of every run)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from looped.studies.simulate import write_law_records

BOOK = Path(__file__).resolve().parents[1] / "book"


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
    for i, study in enumerate(("gpu-main", "gpu-truncated", "gpu-hyper")):
        write_law_records(study, root / study, noise=0.01, seed=i)
    return root


def glued(nb: dict, name: str):
    """A value the chapter glued (myst-nb keeps it as an output with the glue name in its metadata)."""
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            if o.get("metadata", {}).get("scrapbook", {}).get("name") == name:
                data = o["data"]
                return next(v for k, v in data.items() if k.endswith("text/plain"))
    raise KeyError(name)


QUICK = {"restarts": 60, "bootstrap": 20}  # the chapters' fits, reduced to CI's time


def test_sweep_chapter_runs_on_the_one_gpu_study(gpu_runs, tmp_path):
    nb = run_chapter("02_sweep", tmp_path / "03.ipynb", study="gpu-main", runs_dir=str(gpu_runs / "gpu-main"))
    said = "\n".join(texts(nb))
    assert "gpu-main: ok 68" in said   # the prose is written for our runs; its claims are checked, not judged here


def test_fit_chapter_recovers_the_law_that_made_the_runs(gpu_runs, tmp_path):
    nb = run_chapter("03_our_phi", tmp_path / "04.ipynb", runs_dirs=[str(gpu_runs / "gpu-main")], **QUICK)
    said = "\n".join(texts(nb))
    # the prose is written for our CPU runs; on these runs its claim cells say which sentences fail
    assert "written for our reference runs" in said and "about three times the paper's" in said
    assert glued(nb, "cpu_vs_paper") == "'overlaps'"   # the prose's label follows these runs' interval
    phi, lo, hi = (float(glued(nb, k)) for k in ("cpu_phi", "cpu_phi_lo", "cpu_phi_hi"))
    assert lo <= 0.459 <= hi and abs(phi - 0.459) < 0.05, (phi, lo, hi)  # the paper's law made these runs


@pytest.mark.parametrize("chapter, study", [("05_truncation", "gpu-truncated"), ("06_hyperconnections", "gpu-hyper")])
def test_case_study_chapters_run_on_the_one_gpu_studies(gpu_runs, tmp_path, chapter, study):
    nb = run_chapter(chapter, tmp_path / f"{chapter}.ipynb", main_runs=str(gpu_runs / "gpu-main"),
                     study_runs=str(gpu_runs / study), study=study, **QUICK)
    # the paired analysis is committed for our runs only: on another study the verdict says so, and the
    # paragraphs written for our runs carry a note wherever their claims do not hold
    verdict = glued(nb, "repro_trunc_paired" if study == "gpu-truncated" else "repro_hc_paired")
    assert "not computed" in verdict
    assert "written for our reference runs" in "\n".join(texts(nb))
