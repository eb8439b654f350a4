"""Numbers as the book prints them: counts in engineering notation, budgets as powers of ten, the
law's parameters with the precision their identification supports, whole numbers with thousands
separators.  Every table and sentence of the book formats its numbers here."""

from __future__ import annotations

import math

from ..solver import LAW_PARAMS


def eng(x: float, digits: int = 3) -> str:
    """A count in engineering notation for tables: 1370000 -> '1.37M'; from 10^15 a power of ten."""
    if x is None or x != x:
        return "-"
    if abs(x) >= 1e15:   # '1e+06T' reads worse than '10¹⁸'
        return power_of_ten(x, digits)
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.{digits}g}{suffix}"
    return f"{x:.{digits}g}"


def short_number(v: float) -> str:
    """3 significant digits without an exponent below 10^5: 4.72, 58.1, 1240."""
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def span(values, fmt=eng) -> str:
    """'lo-hi' of a column (one value if they coincide)."""
    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}-{fmt(hi)}"


def cell_text(col: str, v) -> str:
    """The printed precision of one table cell, chosen by its column name (stable across machines:
    the weakly identified A and B get three significant digits, exponents, E and phi three
    decimals, R^2 four)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, (bool,)):
        return str(v)
    base = col.split("_lo")[0].split("_hi")[0].split(" ")[0]
    if base in ("A", "B"):   # three significant digits, never '1.06e+03'
        x = float(f"{float(v):.3g}")
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{float(v):.3g}"
    if base in ("r2", "R^2", "R2"):
        return f"{float(v):.4f}"
    if base in ("huber", "huber_x1e5"):
        return f"{float(v):.3g}"
    if base in ("n_runs", "n", "r", "runs", "cells", "pairs"):
        return f"{int(v)}"
    if base in ("budget", "budgets"):
        return f"{float(v):.3g}"
    return f"{float(v):.3f}"


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def runtime_text(seconds: float) -> str:
    """A chapter's execution time as the intro's map states it: 'under a minute' or 'about N
    minutes' (to the nearest half minute)."""
    if not seconds == seconds or seconds < 0:
        return "an unmeasured time"
    if seconds < 60:
        return "under a minute"
    half = round(seconds / 30) / 2
    return f"about {half:g} minute" + ("" if half == 1 else "s")


def power_of_ten(v: float, digits: int = 3, fixed: bool = False) -> str:
    """A number as mantissa x 10^k with a superscript exponent: 3e10 -> '3×10¹⁰', 2.15e19 -> '2.15×10¹⁹';
    ``fixed`` keeps trailing zeros, as a table that promises ``digits`` digits prints them: '4.750×10⁸'."""
    if v == 0:
        return "0"
    k = math.floor(math.log10(abs(v)))
    m = float(f"{v / 10**k:.{digits}g}")
    if abs(m) >= 10:
        m, k = m / 10, k + 1
    mant = f"{m:.{digits - 1}f}" if fixed else f"{m:g}"
    return (f"{mant}×" if mant != "1" else "") + "10" + str(k).translate(_SUPERSCRIPT)


def p_value_text(p: float) -> str:
    """A p-value for prose: two significant digits, as a power of ten below 0.001 ('3.2×10⁻⁵')."""
    return power_of_ten(p, 2) if p < 1e-3 else f"{p:.2g}"


def number_text(v, column: str = "") -> str:
    """One cell for an HTML table: '-' for missing, yes/no for booleans, budgets and FLOPs as powers
    of ten, whole numbers with thousands separators (47,517,696), the law's parameters with the
    precision of `cell_text`, other numbers to four significant digits (whole from 1e4) without an
    exponent between 1e-3 and 1e6."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, (bool,)) or type(v).__name__ == "bool_":
        return "yes" if v else "no"
    if isinstance(v, str):
        return v
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    name = str(column[-1] if isinstance(column, tuple) else column)
    base = name.split("_lo")[0].split("_hi")[0]
    if ("budget" in name and not name.startswith("n_")) or name.startswith("flops") or name.endswith("flops"):
        return power_of_ten(x, 4)
    if base in LAW_PARAMS or base in ("r2", "R^2", "huber"):
        return cell_text(base, x)
    if x.is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    if abs(x) >= 1e6 or abs(x) < 1e-3:
        return power_of_ten(x, 4)
    if abs(x) >= 1e4:  # '{:.4g}' would print 1.093e+05; a whole number reads better
        return f"{x:,.0f}"
    return f"{x:.4g}"
