"""`looped` as a package: the wheel carries what the commands need outside a checkout (issue 38).

The slow test builds the wheel from the files the package declares (pyproject.toml, looped/,
the grids and the paper's tables under runs/), installs it with pip into a fresh venv and runs
`looped --version`, `looped fit` and `looped sweep gpu-main --dry-run` from a folder outside the
checkout.  The base install has no torch (issue 51: the fitter alone pulled 5.7 GB of CUDA
torch), so the fresh venv sees the dependencies of .venv through a folder of links to every
distribution there but looped's own and the [train] extra's (torch, tokenizers, tqdm); pip runs
with --no-index, so a dependency the base wheel should not have (torch, say) fails the install
instead of being downloaded, and `looped train` there must name the extra in one line.  About
20-30 s on two cores: marked slow (`pytest -m slow tests/test_package.py`).
"""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

import looped
from looped import config

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_grids_and_tables_the_code_reads_are_declared_package_data():
    """Every file looped.config.shipped is asked for in the package is in the wheel's package data."""
    from looped.studies import paper
    from looped.studies.sweep import registry
    tool = PYPROJECT["tool"]["setuptools"]
    data = tool["package-data"]
    declared = set()
    for package, patterns in data.items():
        folder = REPO / tool["package-dir"][package]
        declared |= {p.resolve() for pattern in patterns for p in folder.glob(pattern)}
    wanted = {Path(p).resolve() for p in registry.GRID_FILES.values()} | set(paper.PAPER_DIR.glob("*.csv"))
    assert wanted and wanted <= declared, wanted - declared
    assert config.CHECKOUT == REPO and config.shipped("runs/gpu_grids.csv") == REPO / "runs" / "gpu_grids.csv"


def test_metadata_declares_what_the_code_imports():
    """Third-party imports of the core and the studies are runtime dependencies; the report's and
    the paper preset's data sources are extras; requires-python matches the pins (>= 3.11)."""
    project = PYPROJECT["project"]
    names = lambda reqs: {re.split(r"[<>=!~;\[ ]", r)[0].lower().replace("-", "_") for r in reqs}  # noqa: E731
    runtime = names(project["dependencies"])
    extras = set().union(*(names(v) for v in project["optional-dependencies"].values()))
    stdlib = {m.lower() for m in sys.stdlib_module_names} | {"looped"}
    imported = {}
    for path in (REPO / "looped").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for mod in (m.split(".")[0].lower() for m in mods):
                if mod not in stdlib:
                    imported.setdefault(mod, set()).add(str(path.relative_to(REPO)))
    for mod, where in imported.items():
        assert mod in runtime | extras, f"{mod} (imported in {where}) is not declared"
    assert runtime == {"numpy", "pandas", "scipy"}   # the base install: fit, read and size runs, no torch
    assert names(project["optional-dependencies"]["train"]) == {"torch", "tokenizers", "tqdm"}
    assert project["requires-python"] == ">=3.11" and project["license"] == "MIT"
    assert (REPO / "LICENSE").read_text().startswith("MIT License")
    assert "arXiv:2604.21106" in (REPO / "CITATION.cff").read_text()
    torch_pin = next(r for r in (REPO / "requirements.txt").read_text().split() if r.startswith("torch=="))
    assert torch_pin == "torch==2.13.0" and torch_pin in project["optional-dependencies"]["train"]


def test_the_cli_names_the_extra_of_every_optional_library():
    """looped.cli.EXTRAS (what a command missing a library tells the user to install) is the extras
    of pyproject.toml, library by library."""
    from looped.cli import EXTRAS
    extras = PYPROJECT["project"]["optional-dependencies"]
    declared = {re.split(r"[<>=!~;\[ ]", r)[0].lower().replace("-", "_"): extra
                for extra, reqs in extras.items() for r in reqs}
    assert EXTRAS == {k: v for k, v in declared.items() if k in EXTRAS}
    assert {k for k, v in declared.items() if v in ("train", "paper")} <= set(EXTRAS)


def _sources(dest: Path) -> Path:
    """The files a build reads (what an sdist would hold), copied away from the checkout."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, dest / name)
    shutil.copytree(REPO / "looped", dest / "looped", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "runs").mkdir()
    for grid in (REPO / "runs").glob("*.csv"):
        shutil.copy(grid, dest / "runs" / grid.name)
    shutil.copytree(REPO / "runs" / "paper", dest / "runs" / "paper")
    return dest


TRAINING = ("torch", "tokenizers", "tqdm", "triton", "nvidia", "functorch", "torchgen")  # the [train] extra's


def _is_training(name: str) -> bool:
    return name.split("-")[0].split(".")[0].lower().startswith(TRAINING)


def _fresh_venv(root: Path) -> Path:
    """A venv without looped and without the [train] extra's libraries whose python sees this
    environment's other distributions (links)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "env")], check=True, timeout=120)
    env_python = root / "env" / "bin" / "python"
    _link(root, env_python, "deps", lambda name: not _is_training(name))
    return env_python


def _link(root: Path, env_python: Path, folder: str, keep) -> None:
    """Let `env_python` see this environment's distributions whose entry names `keep` accepts
    (never looped's own), through a folder of links and a .pth file."""
    deps = root / folder
    deps.mkdir()
    here = Path(sysconfig.get_paths()["purelib"])
    for entry in here.iterdir():
        if not re.match(r"(__editable__\.?_*looped|looped[-.])", entry.name) and entry.name != "looped" \
                and keep(entry.name):
            (deps / entry.name).symlink_to(entry)
    purelib = subprocess.run([str(env_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / f"_looped_test_{folder}.pth").write_text(f"{deps}\n")


@pytest.mark.slow
def test_the_wheel_works_outside_the_checkout(tmp_path):
    (tmp_path / "src").mkdir()
    src = _sources(tmp_path / "src")
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            str(src), "-w", str(dist)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("looped-*.whl")
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(f"looped-{looped.__version__}.dist-info/METADATA").decode()
    requires = re.findall(r"^Requires-Dist: (.*)$", metadata, re.M)
    assert not [r for r in requires if r.startswith("torch") and "extra ==" not in r], requires
    assert any(r.startswith("torch==2.13.0") and 'extra == "train"' in r for r in requires), requires
    python = _fresh_venv(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOOPED_FIT_CACHE", "VIRTUAL_ENV")}
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-index", str(wheel)],
                             capture_output=True, text=True, timeout=300, env=env)
    assert install.returncode == 0, install.stdout + install.stderr
    installed = re.search(r"Successfully installed (.*)", install.stdout).group(1).split()
    assert installed == [f"looped-{looped.__version__}"], installed  # no other torch, nothing else

    work = tmp_path / "elsewhere"
    work.mkdir()
    paper_runs = __import__("looped.studies.paper", fromlist=["synthetic_runs"]).synthetic_runs(seed=8).head(30)
    paper_runs.to_csv(work / "my_runs.csv", index=False)
    bin_ = python.parent

    def looped_(*args):
        p = subprocess.run([str(bin_ / "looped"), *args], cwd=work, capture_output=True, text=True, timeout=300,
                           env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout

    where = subprocess.run([str(python), "-c", "import looped, looped.config as c; "
                            "print(looped.__file__); print(c.CHECKOUT); print(c.REPO)"],
                           cwd=work, capture_output=True, text=True, env=env, check=True).stdout.split("\n")
    assert where[0].startswith(str(tmp_path / "env")) and where[1] == "None" and where[2] == str(work)
    no_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True, env=env)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    train = subprocess.run([str(bin_ / "looped"), "train", "--preset", "cpu"], cwd=work, capture_output=True,
                           text=True, timeout=300, env=env)
    assert train.returncode == 2 and train.stderr.count("\n") == 1, train.stderr
    assert "pip install 'looped[train]'" in train.stderr
    assert looped_("--version") == f"looped {looped.__version__}\n"
    fitted = looped_("fit", "my_runs.csv", "--restarts", "20")
    assert "joint law fit: 30 runs" in fitted and "phi" in fitted
    dry = looped_("sweep", "gpu-main", "--dry-run")
    assert re.search(r"^68 runs \(68 to do\)", dry, re.M), dry[-500:]
    assert "usage: looped bench fit" in looped_("bench", "fit", "--help")   # reads the paper's tables
    assert "usage: looped data" in looped_("data", "--help")                # the looped.data sub-package
    assert sorted(p.name for p in work.iterdir()) == ["my_runs.csv"]          # a dry run writes nothing

    _link(tmp_path, python, "train", _is_training)    # as `pip install 'looped[train]'` would add them
    repo = tmp_path / "a-repository"  # run from inside another git repository: its commit is not ours
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", "commit", "-q",
                    "--allow-empty", "-m", "x"], cwd=repo, check=True)
    commit = subprocess.run([str(python), "-c", "from looped.runtime import git_commit; print(git_commit())"],
                            cwd=repo, capture_output=True, text=True, env=env, timeout=300)
    assert commit.stdout.strip() == "None", commit.stdout + commit.stderr
