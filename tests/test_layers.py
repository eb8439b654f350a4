"""The package's three layers: core (looped/) <- studies (looped/studies/) <- report (looped/report/).

Imports flow one way: the core imports nothing from the other two, the studies nothing from the
report, and nothing in the package imports the report.  The data pipeline (looped/data/) is part
of the core: it imports only core modules, and among the other core modules only those that build
or read a dataset import it.  The module graph has no cycles."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "looped"
RANK = {"core": 0, "studies": 1, "report": 2}
DATA_MODULES = {"containers", "corpus", "dataset", "markup", "packing", "prose_v2", "prose_v3", "sources",
                "tokenizers"}  # looped/data/
DATA_USERS = {"looped.train", "looped.cli"}  # core modules that may import it


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in ("studies", "report") else "core"


def top(module: str) -> str:
    """The folder of the package a module sits in: 'data', 'studies', 'report', or '' (looped/)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ("data", "studies", "report") else ""


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
            found |= {f"{target}.{a.name}" for a in node.names}  # a module or sub-package imported by name
    return {m for m in found if is_module(m, package)}


def is_module(module: str, package: Path = PACKAGE) -> bool:
    path = package.parent / module.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    return {module_name(p, package): imports(p, package) for p in package.rglob("*.py")}


def violations(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in g.items():
        for dep in deps:
            if layer(dep) != "core" and RANK[layer(dep)] > RANK[layer(mod)]:
                bad.append(f"{mod} ({layer(mod)}) imports {dep} ({layer(dep)})")
            elif top(mod) == "data" and top(dep) in ("studies", "report"):
                bad.append(f"{mod} (data pipeline) imports {dep}")
            elif top(dep) == "data" and top(mod) == "" and mod not in DATA_USERS:
                bad.append(f"{mod} (core) imports {dep} (data pipeline)")
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


def test_the_data_pipeline_is_a_core_subpackage():
    """looped/data/ holds the pipeline's modules, all in the core layer and all in the graph the
    checks above walk; outside itself it imports core modules only, and the trainer imports it."""
    g = graph()
    assert (PACKAGE / "data" / "__init__.py").exists()
    data = {m for m in g if top(m) == "data"}
    assert data == {"looped.data"} | {f"looped.data.{m}" for m in DATA_MODULES}
    assert {layer(m) for m in data} == {"core"}
    outside = {d for m in data for d in g[m] if top(d) != "data"}
    assert outside and {top(d) for d in outside} == {""} and {layer(d) for d in outside} == {"core"}
    users = {m for m, deps in g.items() if top(m) != "data" and any(top(d) == "data" for d in deps)}
    assert "looped.train" in users and {m for m in users if top(m) == ""} <= DATA_USERS


@pytest.mark.parametrize("bad", ["core_imports_report", "cycle", "data_imports_studies", "core_imports_data"])
def test_the_check_catches_what_it_forbids(tmp_path, bad):
    pkg = tmp_path / "looped"
    for sub in ("", "data", "studies", "report"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    if bad == "core_imports_report":
        (pkg / "fit.py").write_text("from .report import tables\n")
        (pkg / "report" / "tables.py").write_text("from .. import fit\n")
        assert violations(graph(pkg)) == ["looped.fit (core) imports looped.report.tables (report)"]
    elif bad == "cycle":
        (pkg / "law.py").write_text("def f():\n    from .fit import x\n")
        (pkg / "fit.py").write_text("from looped.law import f\n")
        assert violations(graph(pkg)) == []
        assert cycles(graph(pkg)) == [["looped.fit", "looped.law"]]
    elif bad == "data_imports_studies":
        (pkg / "data" / "corpus.py").write_text("from .. import studies\nfrom ..report import tables\n")
        (pkg / "report" / "tables.py").write_text("")
        assert sorted(violations(graph(pkg))) == [
            "looped.data.corpus (core) imports looped.report.tables (report)",
            "looped.data.corpus (data pipeline) imports looped.report",
            "looped.data.corpus (data pipeline) imports looped.studies",
        ]
    else:
        (pkg / "data" / "dataset.py").write_text("from . import corpus\n")
        (pkg / "data" / "corpus.py").write_text("")
        (pkg / "train.py").write_text("from .data.dataset import Dataset\n")  # the trainer may
        (pkg / "fit.py").write_text("from .data import corpus\n")  # the fitter may not
        assert sorted(violations(graph(pkg))) == [
            "looped.fit (core) imports looped.data (data pipeline)",
            "looped.fit (core) imports looped.data.corpus (data pipeline)",
        ]


def test_every_core_module_has_its_api_page():
    """book/api_core.md documents every core module (autodoc), the command-line modules included
    (`looped.fit_cli` holds `looped fit` since it left looped.fit)."""
    import re
    page = (PACKAGE.parent / "book" / "api_core.md").read_text()
    documented = set(re.findall(r"automodule:: (\S+)", page))
    core = {m for m in graph() if layer(m) == "core" and m not in ("looped", "looped.__main__") and not g_is_init(m)}
    assert sorted(core - documented) == []


# looped/studies/ grouped by the question each chapter asks: each entry is a sub-package or one module,
# and an entry imports only entries before it (the base first).  A new module joins a question here.
QUESTIONS = ["sweep", "paper", "architecture", "bench", "simulate", "constancy", "case_studies", "external",
             "phi", "shape", "corpora"]
# the command each question's analysis answers to, and its results file (runs/analysis/FAMILY/NAME.json)
COMMAND_OF = {"sweep": ("sweep", "runs"), "bench": ("bench",), "constancy": ("constancy", "misfit"),
              "case_studies": ("case-studies",), "external": ("external",), "shape": ("shape",),
              "corpora": ("corpora",)}


def question(module: str) -> str | None:
    """The question a studies module belongs to: its sub-package or its own name."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "studies" else None


def question_violations(g: dict[str, set[str]], order=QUESTIONS) -> list[str]:
    bad = []
    for mod, deps in g.items():
        q = question(mod)
        if q is None:
            continue
        if q not in order:
            bad.append(f"{mod}: belongs to no question (add it to QUESTIONS)")
            continue
        for dep in deps:
            p = question(dep)
            if p is not None and p != q and (p not in order or order.index(p) > order.index(q)):
                bad.append(f"{mod} ({q}) imports {dep} ({p}), a later question")
    return bad


def test_studies_are_grouped_by_question():
    """Every studies module sits in one question, and questions import only the ones before them."""
    entries = {p.stem if p.suffix == ".py" else p.name for p in (PACKAGE / "studies").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert sorted(entries) == sorted(QUESTIONS)
    assert question_violations(graph()) == []


def test_question_packages_are_maps_not_code():
    """A question's __init__ says what it answers (chapter, command, results) and imports nothing, so
    importing one module of it never loads the rest."""
    for q in QUESTIONS:
        init = PACKAGE / "studies" / q / "__init__.py"
        if init.exists():
            tree = ast.parse(init.read_text())
            assert ast.get_docstring(tree), q
            assert len(tree.body) == 1, f"{q}/__init__.py holds code; keep it a docstring"


def test_one_name_per_question():
    """A command lives in its question's package, and what it writes is named after it; the map in
    looped/studies/README.md lists every module."""
    import re

    from looped import cli
    for q, commands in COMMAND_OF.items():
        for command in commands:
            module = cli.COMMANDS[command][0]
            assert question(module) == q, (command, module)
            source = (PACKAGE.parent / (module.replace(".", "/") + ".py")).read_text()
            for results in re.findall(r'(?:analysis_file\(|RESULTS = REPO / "runs" / "analysis" / )"([\w-]+)', source):
                assert results == command.replace("-", "_"), (command, results)
    owned = {m for cmds in COMMAND_OF.values() for m in cmds}
    assert sorted(set(cli.COMMANDS) - owned) == ["accounting", "data", "fit", "train"]   # the core's
    readme = (PACKAGE / "studies" / "README.md").read_text()
    for path in (PACKAGE / "studies").rglob("*.py"):
        rel = path.relative_to(PACKAGE / "studies").as_posix()
        assert path.name == "__init__.py" or f"`{rel}`" in readme, rel


def test_the_question_check_catches_a_later_import():
    g = {"looped.studies.sweep.study": {"looped.studies.phi.estimates"},
         "looped.studies.phi.estimates": {"looped.studies.sweep.study"},
         "looped.studies.stray": set()}
    assert question_violations(g) == [
        "looped.studies.sweep.study (sweep) imports looped.studies.phi.estimates (phi), a later question",
        "looped.studies.stray: belongs to no question (add it to QUESTIONS)"]
