"""The API pages (book/api_*.md, autodoc) show no path of the machine that built them: a default
computed from the checkout (``path=RESULTS``, ``repo=REPO``) is shown as written in the source,
by ``autodoc_preserve_defaults`` in _config.yml."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
from pathlib import Path, PurePath

import yaml
from sphinx.ext.autodoc.preserve_defaults import update_defvalue

import looped

ROOT = Path(__file__).resolve().parents[1]


def _callables():
    """(qualified name, callable) for every function, class and method defined in looped."""
    for info in pkgutil.walk_packages(looped.__path__, "looped."):
        if info.name.endswith("__main__"):
            continue
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            if getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isfunction(obj):
                yield f"{mod.__name__}.{name}", obj
            elif inspect.isclass(obj):
                yield f"{mod.__name__}.{name}", obj
                for attr, member in vars(obj).items():
                    if inspect.isfunction(member):
                        yield f"{mod.__name__}.{name}.{attr}", member


def _leaks(value) -> bool:
    return isinstance(value, PurePath) or (isinstance(value, str) and str(ROOT) in value)


def _as_autodoc_shows(func):
    """The signature autodoc prints for ``func`` with autodoc_preserve_defaults (on a copy, so the
    module's function keeps its own signature)."""
    copy = types.FunctionType(func.__code__, func.__globals__, func.__name__, func.__defaults__, func.__closure__)
    copy.__kwdefaults__, copy.__qualname__, copy.__module__ = func.__kwdefaults__, func.__qualname__, func.__module__
    app = types.SimpleNamespace(config=types.SimpleNamespace(autodoc_preserve_defaults=True))
    update_defvalue(app, copy, False)
    return str(inspect.signature(copy))


def test_the_book_shows_defaults_as_written():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["sphinx"]["config"]["autodoc_preserve_defaults"] is True


def test_no_signature_prints_the_checkout_path():
    found = 0
    for name, obj in _callables():
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            continue
        if not any(_leaks(p.default) for p in sig.parameters.values()):
            continue
        # a class's signature is its generated __init__ (a dataclass): autodoc cannot recover its
        # source defaults, so a path default there would print as a value
        assert inspect.isfunction(obj), f"{name}: a path-valued default in a class signature; use None"
        found += 1
        shown = _as_autodoc_shows(obj)
        assert str(ROOT) not in shown and "PosixPath" not in shown, f"{name}{shown}"
    assert found >= 1     # the check looks at something: read_results(path=RESULTS) and the like
