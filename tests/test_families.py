"""`--family`: the analyses read either CPU study, the first (cpu, corpus v2) or the second (cpu3,
corpus v3), by the part each of its studies plays (looped.studies.sweep.registry.FAMILIES)."""
from __future__ import annotations

import json

import pytest

from looped import cli
from looped.config import REPO
from looped.studies import shape
from looped.studies.case_studies.paired import FOLDERS, load_arms
from looped.studies.sweep.registry import CASE_STUDIES, FAMILIES, STUDIES
from looped.studies.sweep.replicates import REPLICATE_STUDIES
from looped.studies.sweep.study import Study


def test_every_family_names_studies_that_exist_in_every_part():
    parts = set(FAMILIES["cpu"])
    for name, family in FAMILIES.items():
        assert set(family) == parts, name
        named = [family[p] for p in ("lr", "main", "drift", "controls", "additive")] + [*family["replicates"],
                                                                                    *family["arms"]]
        assert all(n in STUDIES for n in named), name
        assert set(CASE_STUDIES[family["main"]]) <= set(family["arms"])   # its case studies are arms
        assert (REPO / "runs" / family["manifest"]).exists(), name       # its corpus, as the book shows it
    assert FOLDERS == FAMILIES["cpu"]["arms"] and REPLICATE_STUDIES == FAMILIES["cpu"]["replicates"]


def test_shape_takes_a_familys_run_sets():
    assert shape.family_sets("cpu") == shape.SETS
    assert shape.family_sets("cpu3")[:3] == ("cpu3-main", "cpu3-truncated", "cpu3-hyper")
    assert shape.ARMS["cpu3-hyper"] == "cpu3-main" and shape.ARMS["cpu-truncated"] == "cpu-main"


def test_case_studies_read_the_second_studys_arms(tmp_path):
    out = tmp_path / "cs.json"
    assert cli.main(["case-studies", "--family", "cpu3", "--quick", "--out", str(out)]) == 0
    settings = json.loads(out.read_text())["settings"]
    main = len(Study("cpu3-main").fit_table(main_design=False))
    assert settings["family"] == "cpu3" and settings["runs"]["main"] >= main > 0
    assert all(r.startswith("C") for r in settings["run_ids"]["main"])
    assert sum(map(len, load_arms(folders=FAMILIES["cpu3"]["arms"]).values())) == sum(settings["runs"].values())


@pytest.mark.parametrize("command", ["constancy", "misfit", "case-studies", "shape"])
def test_an_unknown_family_is_one_line_and_exit_2(command, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--family", "cpu4", "--out", "/tmp/never.json"])
    assert e.value.code == 2 and "invalid choice: 'cpu4'" in capsys.readouterr().err


def test_an_analysis_defaults_to_its_familys_studies_and_keeps_what_is_given():
    import argparse

    from looped.studies.sweep.registry import DEFAULT_FAMILY, add_family_options, family_defaults, study_folder
    ap = argparse.ArgumentParser()
    add_family_options(ap, "runs", "seeds", "drift", "controls", "additive")
    a = ap.parse_args(["--family", "cpu", "--controls", "my/controls.csv"])   # the other family, by name
    family_defaults(a, "runs", "seeds", "drift", "controls", "additive")
    assert a.runs == str(study_folder("cpu-main"))
    assert a.seeds == [str(study_folder(s)) for s in FAMILIES["cpu"]["replicates"]]
    assert a.drift == [str(study_folder("cpu-drift"))] and a.additive == str(study_folder("cpu-additive"))
    assert a.controls == "my/controls.csv"
    b = ap.parse_args(["--seeds"])   # given empty: no replicate runs, not the default ones
    family_defaults(b, "seeds")
    assert b.seeds == [] and b.family == DEFAULT_FAMILY


def test_each_familys_results_have_one_place_the_book_reads():
    """`make analysis` writes runs/analysis/FAMILY/NAME.json; read_results reads the default family's, or
    another family's by name; an unknown family is one clear error."""
    from looped.studies.constancy import analysis as constancy
    from looped.studies.sweep.registry import DEFAULT_FAMILY, analysis_file
    assert analysis_file("case-studies", "cpu3").as_posix().endswith("runs/analysis/cpu3/case_studies.json")
    assert analysis_file("constancy").parent.name == DEFAULT_FAMILY
    assert analysis_file("constancy", "cpu").exists()   # the first study's, committed
    assert constancy.read_results(family="cpu")["settings"]["runs"] == "runs/cpu-main"
    with pytest.raises(ValueError, match="unknown family 'cpu4'"):
        analysis_file("constancy", "cpu4")


# The chapters that read our CPU studies or their analyses; each takes the family as a parameter.
FAMILY_CHAPTERS = ("02_sweep", "03_our_phi", "03_phi_limits", "04_constancy", "04_shape", "05_truncation",
                   "06_hyperconnections", "07_what_phi_buys", "08_conclusion")


def _family_default(chapter: str) -> str | None:
    import re
    text = (REPO / "book" / f"{chapter}.md").read_text()
    cell = re.search(r":tags: \[parameters[^\]]*\]\n(.*?)```", text, re.S)
    found = re.search(r'^family = "(\w+)"', cell.group(1), re.M) if cell else None
    return found.group(1) if found else None


def test_every_chapter_on_our_studies_reads_one_family_the_commands_read_too():
    """One book, one family: every chapter that reads our CPU studies takes `family`, all default to
    the same one, and it is the family the analysis commands read when none is named."""
    from looped.studies.sweep.registry import DEFAULT_FAMILY
    assert {c: _family_default(c) for c in FAMILY_CHAPTERS} == dict.fromkeys(FAMILY_CHAPTERS, DEFAULT_FAMILY)



def test_a_case_study_chapter_judges_only_the_default_familys_own_runs():
    """No folders named: the family's own studies, analysed once its committed results hold the arm;
    the prose and references are judged only on the default family with the paper's fit settings."""
    from looped.report.case_studies import chapter_runs
    from looped.studies.case_studies.analysis import read_results
    from looped.studies.sweep.registry import DEFAULT_FAMILY
    for family, f in FAMILIES.items():
        for arm, index, key in (("truncated", 0, "truncated_matched"), ("hyper", 1, "hyper")):
            run = chapter_runs(family, arm)
            variant = CASE_STUDIES[f["main"]][index]
            assert (run.main_runs, run.study_runs, run.study) == (f"runs/{f['main']}", f"runs/{variant}", variant)
            assert run.analysed == (key in read_results(family=family)["studies"])
            assert run.reference_run == (family == DEFAULT_FAMILY)
            assert not chapter_runs(family, arm, fit_defaults=False).reference_run
            named = chapter_runs(family, arm, study_runs="/elsewhere/runs", study="gpu-hyper")
            assert (named.study_runs, named.study, named.analysed, named.reference_run) == (
                "/elsewhere/runs", "gpu-hyper", False, False)
            assert not chapter_runs(family, arm, own_defaults=False).analysed

@pytest.mark.slow
@pytest.mark.parametrize("chapter", FAMILY_CHAPTERS)
def test_each_chapter_runs_on_the_other_family(chapter, tmp_path):
    """papermill -p family OTHER: the chapter reads the other family's runs and committed analyses and
    runs to the end (its sentences, written for the default family, become notes where they fail)."""
    from test_gpu_chapters import run_chapter

    from looped.studies.sweep.registry import DEFAULT_FAMILY
    other = next(f for f in FAMILIES if f != DEFAULT_FAMILY)
    if chapter == "08_conclusion":   # it sets every case study's verdict beside the others
        from looped.studies.case_studies.analysis import read_results
        if not read_results(family=other)["studies"]:
            pytest.skip(f"the {other} family's case studies have not run yet")
    quick = {"restarts": 60, "bootstrap": 20} if "restarts" in (REPO / "book" / f"{chapter}.md").read_text() else {}
    nb = run_chapter(chapter, tmp_path / f"{chapter}.ipynb", family=other, **quick)
    assert not [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]


def test_a_study_whose_sweep_has_begun_but_finished_nothing_is_absent(tmp_path):
    """A sweep makes its study's folder (and checkpoints) before its first record: the analyses skip
    such a folder as they skip a missing one, instead of stopping with 'no run-record JSON files'."""
    from looped.studies.sweep.registry import holds_records
    begun = tmp_path / "cpu3-replicates"
    (begun / "ckpt").mkdir(parents=True)
    (begun / "ckpt" / "C2.5e12_r1_s2_order43.pt").write_bytes(b"")
    table = tmp_path / "runs.csv"
    table.write_text("r,n_once,n_rec,tokens,loss\n")
    assert not holds_records(begun) and not holds_records(tmp_path / "absent") and holds_records(table)
    first = Study("cpu3-main").folder / f"{Study('cpu3-main').runs[0].run_id}.json"
    (begun / first.name).write_text(first.read_text())
    assert holds_records(begun)


def test_misfit_runs_beside_a_replicate_sweep_that_has_not_finished_a_run(tmp_path, capsys):
    from looped.studies.constancy import misfit
    begun = tmp_path / "cpu3-replicates"
    (begun / "ckpt").mkdir(parents=True)
    out = tmp_path / "misfit.json"
    assert misfit.main(["--family", "cpu3", "--quick", "--seeds", str(begun), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["settings"]["seeds"] == []


@pytest.mark.slow
def test_constancy_runs_beside_a_replicate_sweep_that_has_not_finished_a_run(tmp_path):
    """What stopped `looped constancy --family cpu3` when cpu3-replicates had begun (a minute)."""
    from looped.studies.constancy import analysis
    begun = tmp_path / "cpu3-replicates"
    (begun / "ckpt").mkdir(parents=True)
    out = tmp_path / "constancy.json"
    assert analysis.main(["--family", "cpu3", "--quick", "--seeds", str(begun), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["settings"]["seeds"] == []
