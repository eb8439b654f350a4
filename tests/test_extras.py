"""The base install fits without torch, and a command that needs an extra says which (issue 51).

`pip install looped` brings numpy, pandas and scipy; `looped[train]` adds torch (pinned as
requirements.txt pins it), tokenizers and tqdm.  Here each command runs in a subprocess whose
import system refuses the [train] extra's libraries, as a fresh venv without them would; the slow
test in test_package.py installs the built wheel into such a venv for real.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]

# what a venv without the [train] extra looks like to Python: the module cannot be found
WITHOUT_TRAIN = """
import sys
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "tokenizers", "tqdm"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NotInstalled())
"""


def run_python(code: str, cwd=REPO, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("LOOPED_FIT_CACHE", None)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=timeout)


def looped_without_train(*args, cwd=REPO):
    return run_python(WITHOUT_TRAIN + f"from looped.cli import main\nsys.exit(main({list(args)!r}))", cwd=cwd)


def small_csv(path: Path) -> Path:
    from looped.studies.paper import synthetic_runs
    synthetic_runs(seed=8).head(30).to_csv(path, index=False)
    return path


def test_the_fit_path_imports_no_torch(tmp_path):
    """`looped fit` end to end (CLI, loader, solver, bootstrap) leaves torch unimported."""
    csv = small_csv(tmp_path / "runs.csv")
    done = run_python("import sys\nfrom looped import cli\n"
                      f"rc = cli.main(['fit', {str(csv)!r}, '--restarts', '5', '--bootstrap', '2'])\n"
                      "print(rc, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tokenizers', 'tqdm')))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stdout


def test_fit_runs_and_reads_runs_without_the_train_extra(tmp_path):
    csv = small_csv(tmp_path / "runs.csv")
    fitted = looped_without_train("fit", str(csv), "--restarts", "5")
    assert fitted.returncode == 0 and "joint law fit: 30 runs" in fitted.stdout, fitted.stderr
    table = looped_without_train("runs", str(REPO / "runs" / "cpu-main"), "--csv", str(tmp_path / "t.csv"))
    assert table.returncode == 0, table.stderr
    assert len(pd.read_csv(tmp_path / "t.csv")) == 76
    dry = looped_without_train("sweep", "gpu-main", "--dry-run", "--out", str(tmp_path / "none"))
    assert dry.returncode == 0 and "68 runs (68 to do)" in dry.stdout, dry.stderr
    assert not (tmp_path / "none").exists()


def test_a_training_command_without_torch_names_the_extra_in_one_line(tmp_path):
    for args in (("train", "--preset", "cpu", "--steps", "1"), ("sweep", "cpu-main"),
                 ("data", "prepare", "--preset", "cpu", "--data-dir", str(tmp_path / "d"))):
        done = looped_without_train(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"looped {args[0]}: error: this needs "), (args, lines)
        assert "pip install 'looped[train]' (torch==2.13.0" in lines[0]
    assert not (tmp_path / "d").exists()   # data prepare stopped before it made its folder
    helped = looped_without_train("data", "--help")
    assert helped.returncode == 0 and "usage: looped data" in helped.stdout


def test_only_the_trainer_needs_torch_and_the_figures_draw_without_it(tmp_path):
    """Without the [train] libraries every module imports but the trainer's own six, and a figure of a
    study's runs is drawn (matplotlib is the [report] extra's)."""
    code = WITHOUT_TRAIN + f"""
import importlib, pkgutil, looped
missing = []
for m in pkgutil.walk_packages(looped.__path__, "looped."):
    if not m.name.endswith("__main__"):
        try:
            importlib.import_module(m.name)
        except ModuleNotFoundError as e:
            missing.append(m.name)
print(sorted(missing))
import matplotlib
matplotlib.use("Agg")
from looped.report.figures import plot_iso_flop_curves
from looped.records import read_records
axes = plot_iso_flop_curves(read_records({str(REPO / "runs" / "cpu-main")!r}))
axes.flat[0].figure.savefig({str(tmp_path / "iso.png")!r})
"""
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[0] == str(sorted(f"looped.{m}" for m in (
        "checkpoint", "dist", "model", "optim", "runtime", "train")))
    assert (tmp_path / "iso.png").stat().st_size > 10_000


def test_the_readme_names_the_extras_as_pyproject_declares_them():
    import tomllib
    readme = " ".join((REPO / "README.md").read_text().split())
    train = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    assert "torch==2.13.0" in train and "loose lower bounds on numpy, pandas and scipy and nothing else" in readme
    assert '`".[train]"` brings torch (`==2.13.0`, the version `requirements.txt` pins), tokenizers and tqdm' in readme
