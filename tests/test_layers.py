"""The package's three layers: core (looped/) <- studies (looped/studies/) <- report (looped/report/).

Imports flow one way: the core imports nothing from the other two, the studies nothing from the
report, and nothing in the package imports the report.  The module graph has no cycles."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "looped"
RANK = {"core": 0, "studies": 1, "report": 2}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in ("studies", "report") else "core"


def imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """The looped modules a file imports (at any depth, relative or absolute)."""
    here = module_name(path, package).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("looped")}
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if not target.startswith("looped"):
                continue
            found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names
                      if (package.parent / (f"{target}.{a.name}".replace(".", "/") + ".py")).exists()}
    return {m for m in found if (package.parent / (m.replace(".", "/") + ".py")).exists()
            or (package.parent / m.replace(".", "/") / "__init__.py").exists()}


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    return {module_name(p, package): imports(p, package) for p in package.rglob("*.py")}


def violations(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in g.items():
        for dep in deps:
            if layer(dep) != "core" and RANK[layer(dep)] > RANK[layer(mod)]:
                bad.append(f"{mod} ({layer(mod)}) imports {dep} ({layer(dep)})")
            if layer(dep) == "report" and layer(mod) == "report":
                continue
    return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))
    for v in g:
        if v not in index:
            visit(v)
    return out


def test_imports_flow_from_report_to_studies_to_core():
    assert violations(graph()) == []


def test_no_import_cycles():
    # package __init__ files re-export their children; they are not part of a cycle of code
    g = {m: {d for d in deps if not g_is_init(d)} for m, deps in graph().items() if not g_is_init(m)}
    assert cycles(g) == []


def g_is_init(module: str) -> bool:
    return (PACKAGE.parent / module.replace(".", "/") / "__init__.py").exists()


@pytest.mark.parametrize("bad", ["core_imports_report", "cycle"])
def test_the_check_catches_what_it_forbids(tmp_path, bad):
    pkg = tmp_path / "looped"
    for sub in ("", "studies", "report"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    if bad == "core_imports_report":
        (pkg / "fit.py").write_text("from .report import tables\n")
        (pkg / "report" / "tables.py").write_text("from .. import fit\n")
        assert violations(graph(pkg)) == ["looped.fit (core) imports looped.report.tables (report)"]
    else:
        (pkg / "law.py").write_text("def f():\n    from .fit import x\n")
        (pkg / "fit.py").write_text("from looped.law import f\n")
        assert violations(graph(pkg)) == []
        assert cycles(graph(pkg)) == [["looped.fit", "looped.law"]]


def test_every_core_module_has_its_api_page():
    """book/api_core.md documents every core module (autodoc), the command-line modules included
    (`looped.fit_cli` holds `looped fit` since it left looped.fit)."""
    import re
    page = (PACKAGE.parent / "book" / "api_core.md").read_text()
    documented = set(re.findall(r"automodule:: (\S+)", page))
    core = {m for m in graph() if layer(m) == "core" and m not in ("looped", "looped.__main__") and not g_is_init(m)}
    assert sorted(core - documented) == []
