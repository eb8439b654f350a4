"""The code style is checked, not hoped for: ruff (pyproject.toml: line length 120, pyflakes,
pycodestyle, import order) over the package, the tests, the tools and CI's scripts."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    out = subprocess.run([ruff, "check", "looped", "tests", "tools", ".ci"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]
