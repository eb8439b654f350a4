"""The book's palette: one colour per meaning, and sharp inline figures in a kernel."""
from __future__ import annotations

import base64
import re
import struct
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from matplotlib.colors import to_rgb  # noqa: E402

from looped.report import palette  # noqa: E402

REPORT = Path(palette.__file__).parent


def test_sources_and_r_have_their_own_colours():
    r_cols = {to_rgb(c) for c in palette.R_COLORS.values()}
    sources = {to_rgb(palette.OURS_COLOR), to_rgb(palette.PAPER_COLOR)}
    assert len(r_cols) == len(palette.R_COLORS) and len(sources) == 2
    assert not r_cols & sources                      # orange is the paper's, never an r's
    assert to_rgb(palette.r_color(3)) not in r_cols | sources   # an r outside the four: its own grey

    def hue_gap(a, b):   # how far apart two colours are, in RGB
        return max(abs(x - y) for x, y in zip(to_rgb(a), to_rgb(b)))
    # no r colour is a near twin of a source colour (the old orange r = 8 against the orange paper)
    assert min(hue_gap(r, s) for r in palette.R_COLORS.values()
               for s in (palette.OURS_COLOR, palette.PAPER_COLOR)) > 0.4


def test_figure_modules_take_their_colours_from_the_palette():
    """Saturated colours come from the palette only: a hex literal in the figure modules is a pale
    fill (the architecture diagram's block kinds), never a colour that could read as r or a source."""
    for name in ("figures.py", "fit_figures.py", "law_figures.py", "constancy.py"):
        for hexcol in re.findall(r'"(#[0-9a-fA-F]{6})"', (REPORT / name).read_text()):
            assert min(to_rgb(hexcol)) > 0.55, f"{name}: {hexcol} is not a pale fill; use looped.report.palette"


def _unwrap_print_figure():
    """Undo the kernel's wrapping of print_figure (`palette.hidpi_inline_figures`) after a test."""
    from matplotlib.backend_bases import FigureCanvasBase
    FigureCanvasBase.print_figure = getattr(FigureCanvasBase.print_figure, "original",
                                            FigureCanvasBase.print_figure)


def test_hidpi_inline_figures_outside_a_kernel_does_nothing(monkeypatch):
    import IPython
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    assert palette.hidpi_inline_figures() is False


def test_hidpi_inline_figures_in_a_kernel_gives_2x_png(monkeypatch):
    import IPython
    from IPython.core.interactiveshell import InteractiveShell
    from matplotlib.figure import Figure
    from matplotlib_inline.config import InlineBackend

    shell = InteractiveShell.instance()
    try:
        monkeypatch.setattr(shell, "kernel", object(), raising=False)
        monkeypatch.setattr(IPython, "get_ipython", lambda: shell)   # as inside a kernel
        assert palette.hidpi_inline_figures() is True
        fig = Figure(figsize=(3, 2), dpi=100)      # no pyplot: nothing to close
        fig.subplots().plot([0, 1], [0, 1])
        data, meta = shell.display_formatter.format(fig)
        width = meta["image/png"]["width"]          # displayed at its nominal size ...
        png = data["image/png"]
        raw = base64.b64decode(png) if isinstance(png, str) else png
        pixels = struct.unpack(">I", raw[16:20])[0]  # ... drawn with twice the pixels
        assert pixels >= 2 * width - 2
    finally:
        _unwrap_print_figure()
        InlineBackend.clear_instance()
        InteractiveShell.clear_instance()


def test_figure_text_is_at_least_11_px_as_the_book_shows_it():
    from matplotlib.figure import Figure
    wide, narrow = Figure(figsize=(9.3, 4), dpi=100), Figure(figsize=(6, 3), dpi=100)
    assert abs(palette.shown_scale(wide) - 672 / 930) < 1e-9 and palette.shown_scale(narrow) == 1.0
    for fig in (wide, narrow):
        ax = fig.subplots()
        ax.plot([0, 1], [0, 1], label="a line")
        ax.set_xlabel("x", fontsize=8)
        ax.set_title("title", fontsize=30)
        ax.legend(fontsize=6)
        inset = fig.add_axes((0.7, 0.7, 0.2, 0.2))
        inset.set_axis_off()
        box = inset.text(0.5, 0.5, "a diagram's box", fontsize=7)   # sized with its box: left alone
        palette.readable_text(fig)
        floor = palette.min_text_points(fig)
        shown_px = floor * fig.dpi / 72 * palette.shown_scale(fig)
        assert abs(shown_px - palette.MIN_TEXT_PX) < 1e-9
        assert ax.xaxis.label.get_fontsize() == max(8, floor)
        assert ax.get_legend().get_texts()[0].get_fontsize() == max(6, floor)
        assert min(t.get_fontsize() for t in ax.get_xticklabels() + ax.get_yticklabels()) >= floor - 1e-9
        assert ax.title.get_fontsize() == 30 and box.get_fontsize() == 7
    assert palette.min_text_points(wide) > palette.min_text_points(narrow)


def test_a_kernel_prints_figures_with_readable_text(monkeypatch):
    import IPython
    from IPython.core.interactiveshell import InteractiveShell
    from matplotlib.backend_bases import FigureCanvasBase
    from matplotlib.figure import Figure
    from matplotlib_inline.config import InlineBackend

    shell = InteractiveShell.instance()
    try:
        monkeypatch.setattr(shell, "kernel", object(), raising=False)
        monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
        assert palette.hidpi_inline_figures() is True
        assert palette.hidpi_inline_figures() is True             # wrapped once, not twice
        assert FigureCanvasBase.print_figure.readable
        assert not getattr(FigureCanvasBase.print_figure.original, "readable", False)
        fig = Figure(figsize=(9.3, 3), dpi=100)
        ax = fig.subplots()
        ax.set_ylabel("loss", fontsize=7)
        shell.display_formatter.format(fig)
        assert ax.yaxis.label.get_fontsize() == palette.min_text_points(fig)
    finally:
        _unwrap_print_figure()
        InlineBackend.clear_instance()
        InteractiveShell.clear_instance()
