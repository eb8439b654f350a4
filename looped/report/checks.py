"""Machine-independent checks for the chapters' nbval-checked cells.

nbval compares the text a checked cell prints with the committed reference notebook, character
for character.  Counts, verdicts and accounting numbers are exact on every machine, so they are
printed as they are.  A fitted or bootstrapped number is not: another CPU picks another BLAS
kernel, sums in another order, and an ill-conditioned fit moves in the third digit.  Such a
number is therefore not printed into a checked cell; the cell prints its reference value and
tolerance instead, and `compare` raises when the number falls outside:

    >>> print(compare({"phi": 0.4391}, {"phi": (0.439, 0.01)}))
    phi  within 0.01 of the reference 0.439

so the printed text is identical wherever the check passes, and the cell fails (an error, which
nbval reports) wherever it does not.  The readable tables with the numbers themselves are printed
by unchecked cells next to the checked ones.

Reference values hold for a chapter's default parameters only; run with other parameters (a
GPU sweep through papermill), a chapter passes ``active=False`` and `compare` prints the
measured values without judging them.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ..config import REPO
from ..io import atomic_write_json

__all__ = ["ClaimFailed", "ReferenceMismatch", "claims", "compare", "checked", "near", "tolerance_text"]

# Tolerances of fitted laws: how far a number may move on another machine (another BLAS kernel,
# another summation order) without a change in the code or the data.  Bootstrap percentiles of
# ill-conditioned parameters (A, B) move most; a changed formula or a lost run moves far more.
FIT_POINT = {"A": "10%", "alpha": 0.01, "B": "10%", "beta": 0.01, "E": 0.02, "phi": 0.01, "r2": 1e-4}
FIT_INTERVAL = {f"{p}_{end}": tol for p, tol in (("A", "20%"), ("alpha", 0.03), ("B", "20%"), ("beta", 0.03),
                                                 ("E", 0.1), ("phi", 0.03)) for end in ("lo", "hi")}
PER_R_FIT = {"A": "10%", "alpha": 0.02, "B": "10%", "beta": 0.02, "E": 0.05, "r2": 1e-3}  # 5-parameter fits of few runs

REFERENCE_DIR = REPO / "book" / "checked"   # one JSON of reference values per chapter
RECORD_ENV = "LOOPED_RECORD_CHECKS"          # "1": record the measured values as the references


class ReferenceMismatch(AssertionError):
    """A checked number lies outside the tolerance of its reference value."""


class ClaimFailed(AssertionError):
    """A sentence of a chapter's prose no longer follows from the numbers it was written for."""


def claims(said: dict, active: bool = True):
    """Guard the sentences of a chapter: ``said`` maps what the Markdown says (a short quote) to
    whether the numbers still support it.  On the run the prose was written for (``active``) a
    false claim raises `ClaimFailed`, so a rebuild cannot publish it; on any other run (a GPU
    study through papermill) it returns a note (Markdown, shown by the cell) naming the sentences
    that do not hold there.  Returns None, so the cell shows nothing, when every claim holds."""
    false = [what for what, holds in said.items() if not bool(holds)]
    if not false:
        return None
    if active:
        raise ClaimFailed("the text says " + "; ".join(repr(w) for w in false)
                          + ", which the numbers no longer support")
    from IPython.display import Markdown  # deferred on purpose: only a notebook has it
    return Markdown("**Note:** the text around this cell was written for our reference runs; on these runs it does "
                    "not hold that " + "; ".join(false) + ".")


def tolerance_text(tol) -> str:
    """0.01 -> '0.01'; '5%' (relative) stays '5%'."""
    return tol if isinstance(tol, str) else f"{tol:g}"


def _allowed(reference: float, tol) -> float:
    if isinstance(tol, str):
        if not tol.endswith("%"):
            raise ValueError(f"a relative tolerance is written like '5%', got {tol!r}")
        return abs(reference) * float(tol[:-1]) / 100.0
    return float(tol)


def _shown(value) -> str:
    try:
        return f"{float(value):.6g}"
    except (TypeError, ValueError):
        return repr(value)


def _inside(value, reference: float, tol) -> bool:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return False
    if math.isnan(reference):
        return math.isnan(v)
    return math.isfinite(v) and abs(v - reference) <= _allowed(reference, tol)


def near(name: str, value, reference: float, tol, active: bool = True, width: int = 0) -> str:
    """One checked number as stable text: ``'phi  within 0.01 of the reference 0.439'``.

    ``tol`` is absolute (a number) or relative (a string such as ``'5%'``).  Raises
    `ReferenceMismatch` (an AssertionError) when ``|value - reference| > tol``.  With
    ``active=False`` (parameters other than the ones the reference was recorded with) nothing is
    judged and the measured value is printed instead.
    """
    label = f"{name:<{width}}"
    if not active:
        try:
            shown = f"{float(value):.4g}"
        except (TypeError, ValueError):
            shown = repr(value)
        return f"{label}  {shown} (no reference for these parameters)"
    if not _inside(value, reference, tol):
        raise ReferenceMismatch(f"{name} = {_shown(value)} is not within {tolerance_text(tol)} "
                                f"of the reference {reference:g}")
    return f"{label}  within {tolerance_text(tol)} of the reference {reference:g}"


def compare(measured: dict, reference: dict, active: bool = True) -> str:
    """Several checked numbers, one line each (see `near`), in the order of ``reference``.

    ``reference`` maps a name to ``(reference value, tolerance)``; every name must be in
    ``measured``.  All lines are checked before raising, so the error lists every number that
    is off, not only the first.
    """
    missing = [k for k in reference if k not in measured]
    if missing:
        raise KeyError(f"no measured value for {', '.join(missing)}")
    width = max((len(k) for k in reference), default=0)
    lines, bad = [], []
    for name, (ref, tol) in reference.items():
        try:
            lines.append(near(name, measured[name], ref, tol, active=active, width=width))
        except ReferenceMismatch as e:
            bad.append(str(e))
    if bad:
        raise ReferenceMismatch("; ".join(bad))
    return "\n".join(lines)


def checked(key: str, measured: dict, tolerances: dict, active: bool = True) -> str:
    """`compare` against reference values recorded with the chapter, not typed into it.

    ``key`` is ``"chapter/cell"``; the references live in ``book/checked/<chapter>.json``.  When
    the chapter's notebook is regenerated (`make notebooks` sets ``LOOPED_RECORD_CHECKS=1``) the
    measured values (6 significant digits) are recorded as the new references, exactly as the
    notebook's other outputs become its new nbval references; every later run (nbval, the book)
    checks against them with ``tolerances`` (name -> absolute tolerance, or '5%').  With
    ``active=False`` nothing is recorded or judged.
    """
    chapter, _, cell = key.partition("/")
    if not chapter or not cell:
        raise ValueError(f"a check key is 'chapter/cell', got {key!r}")
    path = REFERENCE_DIR / f"{chapter}.json"
    store = json.loads(path.read_text()) if path.exists() else {}
    if active and os.environ.get(RECORD_ENV) == "1":
        store[cell] = {k: _rounded(measured[k]) for k in tolerances}
        atomic_write_json(path, store, sort_keys=True)
    if not active:
        return compare(measured, {k: (math.nan, tol) for k, tol in tolerances.items()}, active=False)
    if cell not in store or set(tolerances) - set(store[cell]):
        raise ReferenceMismatch(f"no recorded reference for {key} ({Path(path).name}); regenerate the "
                                "chapter's notebook with `make notebooks`")
    return compare(measured, {k: (store[cell][k], tol) for k, tol in tolerances.items()})


def _rounded(value) -> float:
    v = float(value)
    return v if not math.isfinite(v) else float(f"{v:.6g}")


# A case study's refit (few runs, two budgets) and its change in phi: looser than the main fit.
CASE_STUDY_FIT = {"phi": 0.02, "phi_lo": 0.05, "phi_hi": 0.05, "alpha": 0.02, "beta": 0.02, "E": 0.05, "r2": 1e-3}
CASE_STUDY_CHANGE = {"change in phi": 0.02, "change lo": 0.05, "change hi": 0.05}
