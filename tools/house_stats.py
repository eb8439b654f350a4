#!/usr/bin/env python3
"""Figures about the shape of the package, for before/after notes (prints numbers, checks nothing).

    python tools/house_stats.py chapters [ROOT]   # looped modules, studies modules and questions per chapter
    python tools/house_stats.py imports [ROOT]    # function-level imports (all, and of looped modules)
    python tools/house_stats.py trainer           # train()'s length; data-pipeline calls inside it and before it

ROOT is a checkout (default: this one), so an older commit can be measured from a `git worktree`.
`trainer` runs `looped sweep cpu-smoke` (one tiny run, about a minute) with the dataset built from
nothing in a temporary $LOOPED_DATA, and counts calls into looped/data/ inside `train()` and outside.
"""
from __future__ import annotations

import ast
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def chapter_modules(root: Path) -> list[tuple[str, int, int, int]]:
    """(chapter, looped modules it imports, of them in looped.studies, studies questions reached)."""
    known = {p.relative_to(root).with_suffix("").as_posix().replace("/", ".") for p in (root / "looped").rglob("*.py")}
    is_module = lambda m: m in known or f"{m}.__init__" in known
    rows = []
    for md in sorted((root / "book").glob("*.md")):
        text = md.read_text()
        if "kernelspec" not in text[:500]:
            continue
        mods = set()
        for m in re.finditer(r"^\s*from (looped[\w.]*) import ([^\n(]+(?:\([^)]*\))?)", text, flags=re.M):
            for name in (n.split(" as ")[0].strip(" ()\n") for n in m.group(2).replace("\n", " ").split(",")):
                mods.add(f"{m.group(1)}.{name}" if is_module(f"{m.group(1)}.{name}") else m.group(1))
        mods |= set(re.findall(r"^\s*import (looped[\w.]*)", text, flags=re.M))
        studies = {m for m in mods if m.startswith("looped.studies.")}
        rows.append((md.stem, len(mods), len(studies), len({m.split(".")[2] for m in studies})))
    return rows


class _FunctionImports(ast.NodeVisitor):
    """Import statements whose nearest enclosing scope is a function (each counted once)."""

    def __init__(self):
        self.depth, self.found = 0, []

    def visit_FunctionDef(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node):
        if self.depth:
            self.found.append(node)

    visit_ImportFrom = visit_Import


def function_imports(root: Path) -> tuple[int, int, int]:
    """(function-level imports, of them of looped modules, modules in the package)."""
    found, files = [], list((root / "looped").rglob("*.py"))
    for path in files:
        v = _FunctionImports()
        v.visit(ast.parse(path.read_text()))
        found += v.found
    ours = sum(isinstance(n, ast.ImportFrom) and (n.level > 0 or (n.module or "").startswith("looped"))
               for n in found)
    return len(found), ours, len(files)


def trainer() -> dict:
    """train()'s length, and the data pipeline's calls inside train() and before it in one sweep run."""
    os.environ["LOOPED_DATA"] = tempfile.mkdtemp()   # the dataset is built from nothing
    import looped
    try:
        from looped.studies.sweep import runner
    except ImportError:   # a checkout from before looped/studies/ was grouped by question
        from looped.studies import sweep as runner
    package = Path(looped.__file__).parent
    tree = ast.parse((package / "train.py").read_text())
    length = next(n.end_lineno - n.lineno + 1 for n in tree.body
                  if isinstance(n, ast.FunctionDef) and n.name == "train")
    depth, inside, before = [0], [], []

    def profile(frame, event, arg):
        code = frame.f_code
        if not code.co_filename.startswith(str(package)):
            return
        is_train = code.co_filename == str(package / "train.py") and code.co_name == "train"
        if event == "call":
            depth[0] += is_train
            if code.co_filename.startswith(str(package / "data")):
                (inside if depth[0] else before).append(code.co_name)
        elif event == "return":
            depth[0] -= is_train

    out = Path(tempfile.mkdtemp()) / "cpu-smoke"
    sys.setprofile(profile)
    try:
        runner.main(["cpu-smoke", "--out", str(out), "--no-compile"])
    finally:
        sys.setprofile(None)
    return dict(train_lines=length, data_calls_in_train=len(inside), data_functions_in_train=len(set(inside)),
                data_calls_before_train=len(before), data_functions_before_train=len(set(before)))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    what, root = (argv + [""])[0], Path(argv[1]) if len(argv) > 1 else ROOT
    if what == "chapters":
        print(f"{'chapter':22} looped studies questions")
        for stem, n, s, q in chapter_modules(root):
            print(f"{stem:22} {n:6d} {s:7d} {q:9d}")
    elif what == "imports":
        n, ours, files = function_imports(root)
        print(f"{n} function-level imports ({ours} of looped modules) in {files} modules")
    elif what == "trainer":
        for k, v in trainer().items():
            print(f"{k}: {v}")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
