"""Shared pytest setup for the unit tests in tests/ (the chapter notebooks are checked by nbval,
`make test-nbval`, not collected here)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")  # no display on CI
os.environ.pop("LOOPED_FIT_CACHE", None)  # unit tests fit afresh (the Makefile sets it for the chapters)

REPO_ROOT = Path(__file__).resolve().parents[1]


def pytest_ignore_collect(collection_path, config):
    # never collect notebooks or the book's build tree as tests from here
    if collection_path.suffix == ".ipynb" or "_build" in collection_path.parts:
        return True
    return None


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def one_thread():
    """Training tests run single-threaded: faster on a shared 2-core machine, and bit-stable."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
