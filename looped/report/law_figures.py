"""Figures of what a law implies: its compute-optimal loss beside the published minima, the
effective size of a looped model against phi, and the compute-optimal frontier per r.  Drawn with
the palette of `looped.report.palette`; matplotlib is imported inside the functions.  Chapters reach
these through `looped.report.figures`, which re-exports them.
"""
from __future__ import annotations

import numpy as np

from ..law import compute_optimal, effective_size_vs_phi, frontier_gaps, predict
from ..studies.paper import PAPER_PHI, PAPER_PHI_CI
from .palette import LEGEND_FONTSIZE, OURS_COLOR, r_color


def plot_minima_laws(axes, minima_runs, laws: dict, budgets=None):
    """Two views of laws fitted to (or compared on) the published compute-optimal minima.

    Left: the published L* per budget and r (points) and each law's prediction at the same
    (N*, D*) (lines).  Right: each law's compute-optimal loss of the plain model (r = 1, paper
    widths, `looped.law.compute_optimal`) extrapolated over ``budgets``; the shaded span is the
    range of budgets the paper trained.  ``laws`` maps a label to a Law or FitResult."""

    left, right = axes
    styles = ["-", "--", ":", "-."]
    for r in sorted(minima_runs["r"].unique()):
        g = minima_runs[minima_runs["r"] == r].sort_values("budget")
        left.scatter(g["budget"], g["loss"], color=r_color(r), s=30, zorder=3)
        for (label, law), ls in zip(laws.items(), styles):
            left.plot(g["budget"], predict(law, g["n_once"], g["n_rec"], g["r"], g["tokens"]),
                      color=r_color(r), ls=ls, lw=1.2)
    for r in sorted(minima_runs["r"].unique()):
        left.scatter([], [], color=r_color(r), label=f"published L*, r = {int(r)}")
    for (label, _), ls in zip(laws.items(), styles):
        left.plot([], [], color="0.3", ls=ls, label=label)
    left.set_xscale("log")
    left.set_xlabel("training budget C (FLOPs)")
    left.set_ylabel("loss at the iso-FLOP minimum (nats/token)")
    left.legend(fontsize=LEGEND_FONTSIZE)
    budgets = np.logspace(17.5, 23, 23) if budgets is None else np.asarray(budgets, float)
    cmin, cmax = float(minima_runs["budget"].min()), float(minima_runs["budget"].max())
    right.axvspan(cmin, cmax, color="0.9", label="budgets of the paper's sweep")
    for (label, law), ls in zip(laws.items(), styles):
        co = compute_optimal(law, r=(1,), budgets=budgets, s_grid=np.arange(2, 400, 1.0))
        right.plot(co["budget"], co["loss_star"], color="0.2", ls=ls, label=f"{label} (E = {law.E:.2f})")
    right.set_xscale("log")
    right.set_xlabel("training budget C (FLOPs)")
    right.set_ylabel("compute-optimal loss, r = 1 (nats/token)")
    right.legend(fontsize=LEGEND_FONTSIZE)
    return axes


def plot_effective_size_vs_phi(ax=None, preset: str = "paper", s: float = 32, r_values=(2, 4, 8),
                               phi: float = PAPER_PHI, phi_ci=PAPER_PHI_CI, marks=None, ours=None):
    """Loss-equivalent size of the r-loop sibling vs phi (solid), with its unique size (dashed)
    and compute-equivalent size (dotted), all relative to the plain model of the same width.
    `marks` maps labels to phi values drawn as thin grey vertical lines labelled at the bottom
    (e.g. the case studies); `ours` likewise, in our colour, dashed and labelled at the top."""
    import matplotlib.pyplot as plt  # deferred: matplotlib only to draw

    df = effective_size_vs_phi(preset, s=s, r_values=r_values)
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.axvspan(*phi_ci, color="0.85", alpha=0.6, lw=0, label=f"95% CI of φ [{phi_ci[0]}, {phi_ci[1]}]")
    ax.axvline(phi, color="0.3", lw=1.0, label=f"φ = {phi:g}")
    for label, value in (marks or {}).items():
        ax.axvline(value, color="0.55", lw=0.8, ls=(0, (1, 2)))
        ax.text(value, 0.04, f" {label}", rotation=90, fontsize=LEGEND_FONTSIZE, color="0.35", va="bottom",
                ha="left")   # right of the line: our phi may sit just left of a case study's
    # labelled above the curves (y > 1.07), the lower value's label to the left of its line
    for k, (label, value) in enumerate(sorted((ours or {}).items(), key=lambda kv: kv[1])):
        ax.axvline(value, color=OURS_COLOR, lw=1.0, ls="--")
        left = k == 0 and len(ours) > 1
        ax.text(value + (-0.01 if left else 0.01), 1.135, label, fontsize=LEGEND_FONTSIZE,
                color=OURS_COLOR, va="center", ha="right" if left else "left")
    for r in r_values:
        g = df[df.r == r]
        c = r_color(r)
        ax.plot(g.phi, g.loss_equivalent, color=c, lw=2, label=f"r = {r}: loss-equivalent $N_{{once}} + r^φ N_{{rec}}$")
        ax.plot(g.phi, g.unique, color=c, lw=1.2, ls="--")
        ax.plot(g.phi, g.compute_equivalent, color=c, lw=1.2, ls=":")
    ax.plot([], [], color="0.4", ls="--", lw=1.2, label="unique N (any φ)")
    ax.plot([], [], color="0.4", ls=":", lw=1.2, label="compute-equivalent N (any φ)")
    if ours:
        ax.plot([], [], color=OURS_COLOR, ls="--", lw=1.0, label="our φ (CPU runs)")
    ax.axhline(1.0, color="0.2", lw=0.6)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.2)
    ax.set_xlabel("φ (r passes of the shared block count as $r^φ$ copies)")
    ax.set_ylabel("size / unique N of the plain model")
    # below the axes: inside, it would cover the dotted compute-equivalent lines near the top
    ax.legend(fontsize=LEGEND_FONTSIZE, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    ax.grid(alpha=0.3)
    return ax


def plot_compute_optimal(axes, frontier, minima=None, paper_gaps=None, budget_range=None):
    """Four panels on `axes` (2 x 2): N*(C), D*(C), L*(C) and the loss gap to r = 1, the law's
    continuous frontier as lines (one per r), the published per-cell minima as markers,
    the paper's reported gap ranges as bands, and the paper's budget range shaded; one key for
    all four below them (``loc="outside lower center"``: make the figure with layout="constrained")."""
    fr = frontier_gaps(frontier)
    axes = list(getattr(axes, "flat", axes))
    cols = [("n_star", "unique non-embedding params N*"), ("tokens_star", "training tokens D*"),
            ("loss_star", "loss L* (nats/token)"), ("gap", "L*(r) − L*(r = 1) (nats/token)")]
    pub = {"n_star": "n_star", "tokens_star": "tokens_star", "loss_star": "loss_star_nats", "gap": "gap"}
    for ax, (col, label) in zip(axes, cols):
        if budget_range is not None:
            ax.axvspan(*budget_range, color="0.92", lw=0, zorder=0)
        for r, g in fr.groupby("r"):
            if col == "gap" and r == 1:
                continue
            c = r_color(r)
            ax.plot(g.budget, g[col], color=c, lw=1.8, label=f"r = {r} (law)")
            if minima is not None:
                m = minima[minima.r == r]
                ax.plot(m.budget, m[pub[col]], "o", color=c, ms=5, mfc="white", mew=1.4,
                        label=f"r = {r} (paper minima)")
        if col == "gap" and paper_gaps:
            lo_c, hi_c = budget_range if budget_range is not None else (fr.budget.min(), fr.budget.max())
            for r, (lo, hi) in paper_gaps.items():
                ax.fill_between([lo_c, hi_c], lo, hi, color=r_color(r), alpha=0.15, lw=0)
        ax.set_xscale("log")
        if col in ("n_star", "tokens_star"):
            ax.set_yscale("log")
        ax.set_xlabel("training compute C (FLOPs)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
    from matplotlib.lines import Line2D  # deferred: matplotlib only to draw
    from matplotlib.patches import Patch
    # one key for the four panels, below them (with a constrained layout): colour is r, the style the source
    keys = [Line2D([], [], color=r_color(r), lw=1.8, label=f"r = {r}") for r in sorted(fr.r.unique())]
    keys += [Line2D([], [], color="0.4", lw=1.8, label="the law's frontier")]
    keys += [k for k, shown in ((Line2D([], [], color="0.4", marker="o", ls="", mfc="white", mew=1.4,
                                        label="the paper's minima"), minima is not None),
                                (Patch(color="0.5", alpha=0.3, lw=0, label="the paper's reported gaps"), paper_gaps),
                                (Patch(fc="0.92", ec="0.75", label="the paper's budget range"),
                                 budget_range is not None)) if shown]
    axes[0].figure.legend(handles=keys, loc="outside lower center", ncol=4, fontsize=LEGEND_FONTSIZE, frameon=False)
    return axes


def plot_equal_loss_ratios(eq, ratios: dict, axes=None):
    """What the compute-optimal looped model reaching a target loss costs, as a ratio to the plain
    model reaching the same loss: one panel per column of `eq` (`looped.law.equal_loss_models`)
    named in `ratios` (column -> title), the target loss falling to the right, one line per r > 1,
    the dotted line parity.  Five ratios fill a 2 x 3 grid; the spare panel holds the key."""
    import matplotlib.pyplot as plt  # deferred: matplotlib only to draw

    if axes is None:
        _, axes = plt.subplots(2, 3, figsize=(7.6, 4.5), layout="constrained")
    axes = list(getattr(axes, "flat", axes))
    panels, spare = axes[:len(ratios)], axes[len(ratios):]
    for ax, (col, name) in zip(panels, ratios.items()):
        for r, g in eq[eq.r > 1].groupby("r"):
            ax.plot(g.target, g[col], "o-", color=r_color(r), label=f"r = {r}", ms=4)
        ax.axhline(1, color="0.4", ls=":", lw=1)
        ax.set_title(name, fontsize=10)
        ax.set_xlim(eq.target.max() + 0.05, eq.target.min() - 0.05)   # lower targets to the right
        ax.set_xlabel("target loss (nats)")
        ax.grid(alpha=0.3)
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel("looped / plain")
    for ax in spare:
        ax.axis("off")
    (spare[0] if spare else panels[0]).legend(*panels[0].get_legend_handles_labels(), loc="center",
                                              fontsize=10, frameon=False)
    return axes
