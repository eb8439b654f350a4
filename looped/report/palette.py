"""The book's palette: one colour per number of recurrences r (`R_COLORS`, the same in every
figure), one colour and one marker per training budget (its place on its grid, so a budget looks
the same wherever it appears), our estimates against the published ones, and the axis style
shared by `looped.report.figures` and `looped.report.fit_figures`.  Matplotlib is imported inside
the two functions that need it: `looped.report.prose` reads the palette's symbols without plotting.
"""
from __future__ import annotations

import math
from functools import lru_cache

import pandas as pd

from ..studies.registry import GRID_FILES
from .formatting import eng

# one colour per r (colour-blind safe, Okabe-Ito): the plain model dark grey, looped models
# blue, green, vermillion in order of r
R_COLORS = {1: "#444444", 2: "#0072b2", 4: "#009e73", 8: "#d55e00"}


BUDGET_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


OURS_COLOR, PAPER_COLOR = "#4c72b0", "#dd8452"   # our estimates beside the published ones


LEGEND_FONTSIZE = 9       # the smallest text in a figure; panels are sized so this stays readable


_SYMBOLS = {"phi": "φ", "alpha": "α", "beta": "β"}


def r_color(r) -> str:
    """The colour of r in every figure (grey for an r outside the paper's four)."""
    return R_COLORS.get(int(r), "0.5")


@lru_cache(maxsize=None)
def _grid_budgets() -> tuple:
    """The sorted training budgets of each grid file (the paper's, ours), one tuple per grid."""

    return tuple(tuple(sorted(float(b) for b in pd.read_csv(p)["budget_flops"].unique()))
                 for p in GRID_FILES.values() if p.exists())


def _budget_position(budget: float, others=()) -> tuple[float, int]:
    """(place in [0, 1], index) of a budget on the grid it belongs to (the first grid whose range,
    widened by 3x, holds it), log-spaced; a budget on no grid is placed among `others`."""
    b = float(budget)
    for grid in _grid_budgets():
        if grid[0] / 3 <= b <= grid[-1] * 3:
            lo, hi = math.log(grid[0]), math.log(grid[-1])
            t = 0.0 if hi == lo else (math.log(b) - lo) / (hi - lo)
            idx = min(range(len(grid)), key=lambda i: abs(math.log(grid[i]) - math.log(b)))
            return min(max(t, 0.0), 1.0), idx
    pool = sorted({float(x) for x in others} | {b})
    i = pool.index(b)
    return (i / (len(pool) - 1) if len(pool) > 1 else 0.0), i


def budget_color(budget: float, others=()):
    """The colour of a training budget in every figure: viridis at the budget's place on its grid."""
    import matplotlib
    t, _ = _budget_position(budget, others)
    return matplotlib.colormaps["viridis"](0.05 + 0.85 * t)


def budget_marker(budget: float, others=()) -> str:
    """The marker of a training budget in every figure (by its index on its grid)."""
    return BUDGET_MARKERS[_budget_position(budget, others)[1] % len(BUDGET_MARKERS)]


def budget_colors(budgets) -> dict:
    """{budget: colour} for a set of budgets, sorted (`budget_color`)."""
    bs = sorted({float(b) for b in budgets})
    return {b: budget_color(b, bs) for b in bs}


def budget_markers(budgets) -> dict:
    """{budget: marker} for a set of budgets, sorted (`budget_marker`)."""
    bs = sorted({float(b) for b in budgets})
    return {b: budget_marker(b, bs) for b in bs}


def plain_log_axis(axis):
    """Label a log axis at 1 and 3 x 10^k with short numbers (3k, 10M) and no minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 3.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: eng(v, 3)))
    axis.set_minor_formatter(NullFormatter())
