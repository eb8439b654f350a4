"""Imports sit at the top of a module: a function imports only a heavy dependency it defers on purpose
(torch, matplotlib, an optional extra, or a looped module that pulls torch in), and says so in a
comment; and no module imports another module's private (underscored) name."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "looped"
HEAVY = {"torch", "matplotlib", "matplotlib_inline", "seaborn", "tokenizers", "datasets", "pyarrow",
         "tiktoken", "IPython", "myst_nb", "tqdm", "pandas", "scipy"}
TORCH_MODULES = {"model", "runtime", "optim", "train", "dist", "memory", "checkpoint"}


def function_imports():
    """(file:line, imported module, commented?) of every import inside a function body."""
    for path in sorted(PKG.rglob("*.py")):
        lines = path.read_text().splitlines()
        seen = set()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in seen:
                    continue
                seen.add(id(node))
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    names = [node.module or ""] if node.module else [a.name for a in node.names]
                    names = [("." if node.level else "") + n for n in names]
                i, commented = node.lineno - 1, False   # a comment on the import block or just above it
                while i >= 0 and (re.match(r"\s*(import |from \S+ import )", lines[i]) or not lines[i].strip()):
                    commented |= "#" in lines[i]
                    i -= 1
                commented |= i >= 0 and lines[i].strip().startswith("#")
                yield f"{path.relative_to(PKG.parent)}:{node.lineno}", names, commented


def heavy(name: str) -> bool:
    if name.startswith("."):
        return name.lstrip(".").split(".")[-1] in TORCH_MODULES
    return name.split(".")[0] in HEAVY


def test_a_function_imports_only_a_heavy_dependency_and_says_why():
    light = [f"{where}: {names}" for where, names, _ in function_imports() if not all(map(heavy, names))]
    silent = [f"{where}: {names}" for where, names, commented in function_imports() if not commented]
    assert not light, "move these imports to the top of their module:\n" + "\n".join(light)
    assert not silent, "say why the import is deferred (a comment):\n" + "\n".join(silent)


def test_no_module_imports_another_modules_private_name():
    crossing = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("looped")):
                crossing += [f"{path.relative_to(PKG.parent)}:{node.lineno} imports {a.name}"
                             for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert not crossing, "\n".join(crossing)
