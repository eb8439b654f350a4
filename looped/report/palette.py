"""The book's palette: one colour per meaning, the same in every figure.

* **Number of recurrences r** (`R_COLORS`, Okabe-Ito, colour-blind safe): r = 1, the plain model,
  mid grey; the looped models blue (r = 2), bluish green (r = 4) and reddish purple (r = 8).
* **Source of an estimate**: ours black (`OURS_COLOR`: circles and solid lines, with our
  bootstrap intervals), the paper's orange (`PAPER_COLOR`: squares and dashed lines, its
  published interval as an orange band).  Neither is an r colour, so orange always means "the
  paper", never "r = 8"; a figure that colours by r codes the source by marker and line style
  instead, as its legend says.
* **Training budget** (`budget_color`, `budget_marker`): viridis at the budget's place on its grid,
  with one marker per budget, so a budget looks the same wherever it appears.
* Other greys (bands, reference lines, the legend's marker-only entries) and the pale fills of
  the architecture diagram carry no meaning of their own; an r outside the paper's four is light
  grey.

The axis style shared by the figure modules (`figures`, `fit_figures`, `law_figures`) lives here too.
Matplotlib is imported inside the functions that need it, so reading a colour or a symbol
plots nothing.  Imported inside a Jupyter kernel (a chapter), the module
also switches the kernel's inline figures to PNG at twice the resolution (`hidpi_inline_figures`),
so the book's figures stay sharp on high-density screens, and sets every figure's text at least
`MIN_TEXT_PX` (11 px) as the book shows it at 1280 px (`readable_text`): a figure wider than the
text column (`COLUMN_PX`, 672 px) is shrunk to it, so its text is drawn larger in points.
"""
from __future__ import annotations

import math
import sys
from functools import lru_cache

import pandas as pd

from ..studies.sweep.registry import GRID_FILES
from .formatting import eng

# one colour per r (colour-blind safe, Okabe-Ito): the plain model mid grey, the looped models
# blue, bluish green, reddish purple in order of r; no orange (the paper's) and no black (ours)
R_COLORS = {1: "#7f7f7f", 2: "#0072b2", 4: "#009e73", 8: "#cc79a7"}


BUDGET_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


# our estimates beside the published ones: black and Okabe-Ito orange, outside the r colours
OURS_COLOR, PAPER_COLOR = "#000000", "#e69f00"


LEGEND_FONTSIZE = 9       # the smallest text in a figure; panels are sized so this stays readable
# The book's column at 1280 px is COLUMN_PX wide (measured in the built book): an inline figure of
# w inches at d dpi is shown at min(1, COLUMN_PX / (w d)) of its size, so a text of p points is
# p * d / 72 * that many pixels.  `readable_text` raises every text to at least MIN_TEXT_PX.
COLUMN_PX, MIN_TEXT_PX = 672, 11.0


SYMBOLS = {"phi": "φ", "alpha": "α", "beta": "β"}


def r_color(r) -> str:
    """The colour of r in every figure (light grey for an r outside the paper's four)."""
    return R_COLORS.get(int(r), "0.75")


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
    import matplotlib  # deferred: matplotlib only to draw
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
    # deferred: matplotlib only to draw
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 3.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: eng(v, 3)))
    axis.set_minor_formatter(NullFormatter())


def shown_scale(fig) -> float:
    """The factor the book shrinks ``fig`` by at 1280 px (1 when it fits the column)."""
    width_px = fig.get_figwidth() * fig.dpi
    return min(1.0, COLUMN_PX / width_px)


def min_text_points(fig) -> float:
    """The smallest font size (points) that the book shows at MIN_TEXT_PX for this figure."""
    return MIN_TEXT_PX / (fig.dpi / 72 * shown_scale(fig))


def readable_text(fig):
    """``fig`` with every visible text smaller than `min_text_points` enlarged to it: tick and axis
    labels, titles, legends, annotations.  Text in an axes drawn without axes (a diagram whose
    boxes are sized to their labels) is left as it is.  Returns the figure."""
    from matplotlib.text import Text  # deferred: matplotlib only to draw
    floor = min_text_points(fig)
    for ax in fig.axes:   # tick labels are made at drawing time, from the axis' tick parameters
        if not ax.axison:
            continue
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            for which, ticks in (("major", axis.get_major_ticks()), ("minor", axis.get_minor_ticks())):
                if ticks and ticks[0].label1.get_fontsize() < floor:
                    ax.tick_params(axis=name, which=which, labelsize=floor)
    for text in fig.findobj(Text):
        if not text.get_visible() or not text.get_text().strip():
            continue
        ax = text.axes
        if ax is not None and not ax.axison and text not in (ax.title, ax._left_title, ax._right_title):
            continue
        if text.get_fontsize() < floor:
            text.set_fontsize(floor)
    return fig


def _readable_on_print() -> None:
    """Apply `readable_text` to every figure the kernel prints (its inline PNGs): wraps
    ``FigureCanvasBase.print_figure`` once, so it outlasts any later change of the inline formats."""
    from matplotlib.backend_bases import FigureCanvasBase  # deferred: matplotlib only to draw
    print_figure = FigureCanvasBase.print_figure
    if getattr(print_figure, "readable", False):
        return

    def readable_print_figure(self, *args, **kwargs):
        readable_text(self.figure)
        return print_figure(self, *args, **kwargs)
    readable_print_figure.readable, readable_print_figure.original = True, print_figure
    FigureCanvasBase.print_figure = readable_print_figure


def hidpi_inline_figures(fmt: str = "retina") -> bool:
    """Show the inline figures of the running Jupyter kernel as ``fmt`` ('retina': PNG at twice
    the figure's dpi, displayed at its nominal size; 'svg' or 'png' also work).  Returns whether
    a kernel was found; outside one (a script, the tests) it does nothing.  In a kernel every
    printed figure also gets `readable_text`.  Called when this
    module is imported, so every chapter that draws with the palette gets sharp figures without a
    line of its own, and the setting outlasts a later ``%matplotlib inline``."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "kernel"):
        return False
    try:
        from matplotlib_inline.config import InlineBackend  # deferred on purpose: only a notebook has it
    except ImportError:   # no inline backend installed: leave the kernel as it is
        return False
    cfg = InlineBackend.instance(parent=shell)
    cfg.shell = shell
    cfg.figure_formats = {fmt}      # its observer selects the formatters on the shell now
    from IPython.core.pylabtools import select_figure_formats  # deferred on purpose: only a notebook has it
    select_figure_formats(shell, cfg.figure_formats, **cfg.print_figure_kwargs)
    _readable_on_print()
    return True


hidpi_inline_figures()
