"""tools/house_stats.py: the figures of a before/after note count what they say they count."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("house_stats", ROOT / "tools" / "house_stats.py")
house_stats = importlib.util.module_from_spec(spec)
spec.loader.exec_module(house_stats)


def test_function_imports_count_each_import_once(tmp_path):
    pkg = tmp_path / "looped"
    pkg.mkdir()
    (pkg / "a.py").write_text("import os\n\ndef f():\n    import json\n    def g():\n        from . import b\n")
    (pkg / "b.py").write_text("def h():\n    from looped import a  # ours\n    import numpy\n")
    assert house_stats.function_imports(tmp_path) == (4, 2, 2)


def test_chapter_modules_reads_every_notebook_chapter():
    rows = {stem: (n, s, q) for stem, n, s, q in house_stats.chapter_modules(ROOT)}
    assert {"01_architecture", "04_constancy", "appendix_corpus"} <= set(rows)
    n, s, q = rows["03_phi_limits"]
    assert n >= s >= q >= 1   # a chapter reaches fewer questions than modules
