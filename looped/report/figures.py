"""Figures for the book: the architecture, the accounting and the run tables (iso-FLOP curves,
minima, costs, case-study curves), drawn with the palette of `looped.report.palette`.  The figures of
fitted laws live in `looped.report.fit_figures`, those of what a law implies in
`looped.report.law_figures`; all are re-exported here, the one module chapters import.  Matplotlib
and seaborn are imported inside the functions, so importing this module is cheap.  Every function
draws on axes it is given (or makes its own) and returns them.
"""
from __future__ import annotations

import numpy as np

from ..accounting import flops_per_token, n_once, n_rec
from ..config import R_VALUES, model_config
from ..law import as_law, parabola
from ..studies.architecture import accounting_grid
from ..studies.paper import PAPER_PHI
from .fit_figures import (  # noqa: F401
    plot_bootstrap,
    plot_neff_collapse,
    plot_phi_forest,
    plot_phi_profile,
    plot_predicted_vs_observed,
    plot_residuals,
)
from .formatting import power_of_ten
from .law_figures import (  # noqa: F401
    plot_compute_optimal,
    plot_effective_size_vs_phi,
    plot_equal_loss_ratios,
    plot_minima_laws,
)
from .palette import (  # noqa: F401
    BUDGET_MARKERS,
    LEGEND_FONTSIZE,
    OURS_COLOR,
    PAPER_COLOR,
    R_COLORS,
    SYMBOLS,
    budget_color,
    budget_colors,
    budget_marker,
    budget_markers,
    plain_log_axis,
    r_color,
)

# Text of the chapter figures drawn about 9 inches wide: the book shows them at about 690 px (1280-px
# window), so 1 pt is about 1.07 px and 11 pt stays at least 11 px.
FIGURE_TEXT = 11


def plot_gaps_vs_budget(ax, by_budget, noise: float | None = None, style: str = "o-", label: str = "",
                        **kw):
    """Loss gap to r = 1 against the budget relative to the smallest one (log axis), one line per
    r (`by_budget`: budgets as index, r as columns such as 2 or 'r=2'), so grids decades apart
    share one axis and per-decade slopes compare.  ``noise`` (nats): a band of +-noise around
    each line, in its colour."""
    x = np.asarray(by_budget.index, float)
    for col in by_budget.columns:
        r = int(str(col).split("=")[-1])
        y = by_budget[col].to_numpy(float)
        ax.plot(x / x.min(), y, style, color=r_color(r), label=f"r = {r}{label}", **kw)
        if noise is not None and np.isfinite(noise):
            ax.fill_between(x / x.min(), y - noise, y + noise, color=r_color(r), alpha=0.15, lw=0)
    ax.set_xscale("log")
    plain_log_axis(ax.xaxis)
    ax.set_xlabel("budget / smallest budget")
    return ax


def _box(ax, x, y, w, h, text, color, fontsize=9):
    from matplotlib.patches import FancyBboxPatch  # deferred: matplotlib only to draw
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=color, ec="0.25", lw=1.0))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)


def _arrow(ax, x0, y0, x1, y1, **kw):
    ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                arrowprops=dict(arrowstyle="-|>", color=kw.pop("color", "0.2"), lw=kw.pop("lw", 1.2), **kw))


def draw_topology(ax=None, r: int = 4, preset: str = "paper", injection: str | None = None, lanes: int = 2,
                  bptt_k: int | None = None):
    """Boxes-and-arrows diagram of the prelude / recurrent block / coda model, with its loop arrow.

    `injection=None` is the preset default: the plain model for r=1, linear injection otherwise.
    """
    import matplotlib.pyplot as plt  # deferred: matplotlib only to draw
    cfg = model_config(preset, r=r, s=10, injection=injection, lanes=lanes, bptt_k=bptt_k)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.2))
    # pale fills name the kind of block only; the loop arrow takes the colour of r (`r_color`)
    colors = dict(io="#e8e8e8", once="#9ecae1", rec="#d9cce6", inj="#c7e9c0", norm="#f0f0f0")
    y = 0.0
    xs = dict(emb=0.6, pre=2.0, inj=3.6, rec=5.3, norm=6.8, coda=8.3, head=9.7)
    _box(ax, xs["emb"], y, 1.25, 0.8, "embed\n+ RMSNorm", colors["io"])
    _box(ax, xs["pre"], y, 1.2, 0.8, f"prelude\n{cfg.n_prelude} blocks", colors["once"])
    inj_text = {"linear": "inject\nW[e; s]", "additive": "inject\ns + e", "passthrough": "inject\ns",
                "hyperconnect": f"read lanes\n(K={cfg.lanes})", "none": ""}[cfg.injection]
    if cfg.looped:
        _box(ax, xs["inj"], y, 1.2, 0.8, inj_text, colors["inj"])
        _box(ax, xs["rec"], y, 1.4, 0.8, f"recurrent\n{cfg.n_loop_layers} blocks", colors["rec"])
        _box(ax, xs["norm"], y, 1.0, 0.8, "shared\nRMSNorm", colors["norm"])
        for a, b, wa, wb in (("pre", "inj", 1.2, 1.2), ("inj", "rec", 1.2, 1.4), ("rec", "norm", 1.4, 1.0),
                             ("norm", "coda", 1.0, 1.2)):
            _arrow(ax, xs[a] + wa / 2, y, xs[b] - wb / 2, y)
        # the loop: from the shared norm back to the injection, run r times
        ax.annotate("", xy=(xs["inj"], y + 0.42), xytext=(xs["norm"], y + 0.42),
                    arrowprops=dict(arrowstyle="-|>", color=r_color(cfg.r), lw=2.0,
                                    connectionstyle="arc3,rad=0.55"))
        grad = "" if cfg.k_bwd == cfg.r else f", gradient through last {cfg.k_bwd}"
        ax.text((xs["inj"] + xs["norm"]) / 2, y + 1.45, f"state s, repeated r = {cfg.r} times{grad}",
                ha="center", va="center", fontsize=9, color=r_color(cfg.r))
        # e, the prelude output, feeds every injection
        ax.annotate("", xy=(xs["inj"], y - 0.42), xytext=(xs["pre"] + 0.3, y - 0.42),
                    arrowprops=dict(arrowstyle="-|>", color="0.45", lw=1.0, ls="--",
                                    connectionstyle="arc3,rad=0.5"))
        ax.text(
            (xs["pre"] + xs["inj"]) / 2 + 0.15, y - 1.05, "e (prelude output)", ha="center", fontsize=8, color="0.35"
        )
    else:
        _box(
            ax, (xs["inj"] + xs["norm"]) / 2, y, 3.6, 0.8, f"{cfg.n_loop_layers} plain blocks, run once", colors["once"]
        )
        _arrow(ax, xs["pre"] + 0.6, y, xs["inj"] - 0.6, y)
        _arrow(ax, xs["norm"] + 0.5, y, xs["coda"] - 0.6, y)
    _box(ax, xs["coda"], y, 1.2, 0.8, f"coda\n{cfg.n_coda} blocks", colors["once"])
    _box(ax, xs["head"], y, 1.25, 0.8, "RMSNorm\n+ LM head", colors["io"])
    _arrow(ax, xs["emb"] + 0.625, y, xs["pre"] - 0.6, y)
    _arrow(ax, xs["coda"] + 0.6, y, xs["head"] - 0.625, y)
    ax.set_xlim(-0.1, 10.4)
    ax.set_ylim(-1.2, 1.65) if cfg.looped else ax.set_ylim(-0.5, 0.5)  # just the drawing: no empty bands
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"r = {cfg.r}: {cfg.n_prelude} + {cfg.n_loop_layers}x{cfg.r} + {cfg.n_coda} = "
                 f"{cfg.n_prelude + cfg.n_loop_layers * cfg.r + cfg.n_coda} effective layers "
                 f"(injection: {cfg.injection})", fontsize=10)
    return ax


def plot_accounting_vs_r(ax=None, s_values=(6, 10, 20, 34), phi: float = PAPER_PHI, preset: str = "paper"):
    """FLOPs/token, unique N and N_eff relative to the plain r=1 model at the same width."""
    import matplotlib.pyplot as plt  # deferred: matplotlib only to draw

    grid = accounting_grid(preset, s_values=s_values, phi=phi)
    base = grid[grid.r == 1].set_index("s")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    # three quantities, told apart by grey level, marker and line style: the palette's colours
    # mean r and the source of an estimate, neither of which this figure shows
    style = {"training FLOPs / token": dict(color="0.15", marker="o", ls="-"),
             f"effective N (φ = {phi})": dict(color="0.45", marker="s", ls="--"),
             "unique N": dict(color="0.65", marker="^", ls=":")}
    # one line per width, all in one style: the ratios hardly depend on the width, so they overlap
    for s in s_values:
        g = grid[grid.s == s]
        for label, col in zip(style, ("flops_per_token", "n_eff", "n")):
            ax.plot(g.r, g[col] / base.loc[s, col], ms=4.5, lw=1.4, **style[label],
                    label=label if s == s_values[0] else None)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(R_VALUES), [str(r) for r in R_VALUES])
    ax.set_xlabel("recurrences r (iso-depth: 20 effective layers)")
    ax.set_ylabel("relative to the plain model (r = 1)")
    ax.set_ylim(0, 1.1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LEGEND_FONTSIZE, loc="lower left",
              title=f"widths s = {', '.join(f'{s:g}' for s in s_values)} overlap", title_fontsize=LEGEND_FONTSIZE)
    return ax


def plot_iso_flop_curves(table, axes=None, min_runs: int = 3, unit: str = "nats"):
    """The paper's Figure 2 layout: one panel per r, loss against unique N (log axis), one
    colour per budget, the parabola in log N of each cell with >= ``min_runs`` finished runs
    and its vertex (a star when it lies inside the bracket and is a minimum, a cross otherwise).
    """
    import matplotlib.pyplot as plt  # deferred: matplotlib only to draw
    from matplotlib.lines import Line2D
    r_values = sorted(table.r.unique())
    if axes is None:
        _, axes = plt.subplots(1, len(r_values), figsize=(3.4 * len(r_values), 3.6), sharey=True)
    axes = np.atleast_1d(axes).ravel()
    colors = budget_colors(table.budget.unique())
    ok = table[(table.status == "ok") & table.loss.notna()]
    outside = 0   # cells whose vertex is not a minimum inside the widths trained
    for ax, r in zip(axes, r_values):
        for budget, color in colors.items():
            g = ok[(ok.r == r) & (ok.budget == budget)].sort_values("n")
            if g.empty:
                continue
            ax.plot(g.n, g.loss, "o", color=color, ms=5, label=f"C = {budget:.3g}")
            if len(g) >= min_runs:
                u = np.log(g.n.to_numpy(float))
                (c2, c1, c0), us, ys = parabola(u, g.loss.to_numpy(float))
                uu = np.linspace(u.min() - 0.15, u.max() + 0.15, 100)
                ax.plot(np.exp(uu), c0 + c1 * uu + c2 * uu ** 2, "-", color=color, lw=1.4, alpha=0.8)
                if c2 != 0:
                    if c2 > 0 and u.min() <= us <= u.max():
                        ax.plot(np.exp(us), ys, "*", color=color, ms=14, mec="black", mew=0.7, zorder=5)
                    else:
                        outside += 1
                        ax.plot(g.n.iloc[g.loss.to_numpy().argmin()], g.loss.min(), "x", color="black",
                                ms=8, mew=1.5, zorder=5)
        ax.set_xscale("log")
        plain_log_axis(ax.xaxis)
        ax.set_title(f"r = {r}")
        ax.set_xlabel("unique params N" if _in_a_row(ax) else "unique non-embedding params N")
        ax.grid(alpha=0.3, which="both")
    for ax in axes:
        if _first_col(ax):
            ax.set_ylabel(f"final validation loss ({unit})")
    handles = [
        Line2D([], [], color=c, marker="o", ls="-", label=f"C = {power_of_ten(b)} FLOPs") for b, c in colors.items()
    ]
    handles += [Line2D([], [], color="0.5", marker="*", ms=12, mec="black", ls="", label="parabola vertex (inside)")]
    if outside:   # the key names only the markers drawn
        handles.append(Line2D([], [], color="black", marker="x", ms=8, ls="", label="best run (vertex outside)"))
    if len(axes) == 4:  # 2 x 2: one legend below the panels
        axes[0].figure.legend(handles=handles, loc="lower center", ncol=3, fontsize=FIGURE_TEXT, frameon=False)
    else:
        axes[-1].legend(handles=handles, fontsize=LEGEND_FONTSIZE, loc="best")
    return axes


def plot_minima_vs_budget(paper, ours=None, axes=None):
    """The paper's published minima per r against the budget: N*, L*, and the tokens per unique
    parameter at the minimum with the shown study's bracketed minima beside the paper's; a fourth
    axis, if given, holds the legend.

    The third panel puts each study's budgets relative to its own smallest, so two grids five
    decades apart share one axis instead of leaving it empty in between."""
    import matplotlib.pyplot as plt  # deferred: matplotlib only to draw
    from matplotlib.lines import Line2D
    if axes is None:
        _, axes = plt.subplots(2, 2, figsize=(9, 7.2))
    axes = np.atleast_1d(axes).ravel()
    for r in R_VALUES:
        g = paper[paper.r == r].sort_values("budget")
        axes[0].plot(g.budget, g.n_star / 1e6, "o-", color=r_color(r), label=f"r = {r}")
        axes[1].plot(g.budget, g.loss_star, "o-", color=r_color(r), label=f"r = {r}")
        axes[2].plot(g.budget / paper.budget.min(), g.tokens_per_param, "o-", color=r_color(r))
        if ours is not None and len(ours):
            o = ours[(ours.r == r) & ours.inside.fillna(False).astype(bool) & ours.opens_up.fillna(False).astype(bool)]
            if len(o):
                axes[2].plot(o.budget / ours.budget.min(), o.tokens_per_param, "s--", color=r_color(r), mfc="white")
    for ax in axes[:3]:
        ax.set_xscale("log")
        ax.set_xlabel("training budget C (FLOPs)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_yscale("log")
    plain_log_axis(axes[0].yaxis)
    axes[0].set_ylabel("N* (millions of unique params)")
    axes[1].set_ylabel("L* (nats/token, FineWeb-Edu)")
    axes[2].set_xlabel("budget / the study's smallest budget")
    plain_log_axis(axes[2].xaxis)
    axes[2].set_yscale("log")
    plain_log_axis(axes[2].yaxis)
    axes[2].set_ylabel("tokens per unique param at N*")
    handles = [Line2D([], [], color=r_color(r), lw=2, label=f"r = {r}") for r in R_VALUES]
    handles += [
        Line2D([], [], color="0.3", marker="o", ls="-", label="the paper's minima"),
        Line2D([], [], color="0.3", marker="s", mfc="white", ls="--", label="the study shown (bracketed cells)"),
    ]
    if len(axes) > 3:  # a legend panel
        axes[3].axis("off")
        axes[3].legend(handles=handles, loc="center", fontsize=FIGURE_TEXT, frameon=False)
    else:   # one row of three panels: the legend below them
        axes[0].figure.legend(handles=handles, loc="lower center", ncol=3, fontsize=FIGURE_TEXT,
                              frameon=False)
    return axes


def plot_run_costs(table, axes=None):
    """Wall seconds per finished run against its optimizer steps (left, one colour per budget)
    and the model FLOP/s it achieved against its width (right, one colour per r)."""
    import matplotlib.pyplot as plt  # deferred: matplotlib only to draw
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    ok = table[(table.status == "ok") & table.wall_seconds.notna()]
    colors = budget_colors(table.budget.unique())
    for budget, color in colors.items():
        g = ok[ok.budget == budget]
        if len(g):
            axes[0].scatter(g.steps, g.wall_seconds, color=color, s=22, label=f"C = {budget:.3g}")
    for r in R_VALUES:
        g = ok[ok.r == r]
        if len(g):
            axes[1].scatter(g.d_model, g.tokens_per_s * g.flops_per_token / 1e9, color=r_color(r), s=22,
                            label=f"r = {r}")
    axes[0].set_xlabel("optimizer steps")
    axes[0].set_ylabel("wall time per run (s)")
    axes[1].set_xlabel("d_model")
    axes[1].set_ylabel("model FLOP/s achieved (GFLOP/s)")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return axes


def plot_case_study_isoflop(axes, baseline_runs, variant_runs, label: str, r_values=(2, 4, 8),
                            baseline_label: str = "linear injection, full backprop", legend_ax=None):
    """Iso-FLOP curves, one panel per r: final loss against unique non-embedding parameters for
    every budget, the case study (solid, filled) beside the baseline runs (dashed, open).  The
    legend goes into ``legend_ax`` (e.g. the spare panel of a 2x2 grid, switched off) when given,
    else to the right of the last panel."""
    budgets = sorted(set(baseline_runs["budget"].astype(float)) | set(variant_runs["budget"].astype(float)))
    colors = budget_colors(budgets)
    axes = np.atleast_1d(axes)
    for ax, r in zip(axes, r_values):
        for c in budgets:
            for df, ls, fill, tag in ((baseline_runs, "--", "none", baseline_label), (variant_runs, "-", None, label)):
                g = df[(df["r"].astype(float) == r) & np.isclose(df["budget"].astype(float), c)]
                if not len(g):
                    continue
                g = g.assign(n=g["n_once"] + g["n_rec"]).sort_values("n")
                ax.plot(g["n"], g["loss"], ls=ls, marker="o", ms=5, color=colors[c],
                        mfc=colors[c] if fill is None else fill)
        ax.set_xscale("log")
        plain_log_axis(ax.xaxis)   # the case studies span less than a decade: no crowded minor labels
        ax.set_title(f"r = {r}")
        ax.set_xlabel("unique non-embedding parameters N")
        ax.grid(alpha=0.3)
    for ax in axes:
        spec = ax.get_subplotspec()
        if spec is None or spec.is_first_col():
            ax.set_ylabel("final validation loss (nats/token)")
    handles = [axes[0].plot([], [], color=colors[c], marker="o", ls="-")[0] for c in budgets]
    labels = [f"C = {power_of_ten(c)} FLOPs" for c in budgets]
    handles += [axes[0].plot([], [], color="0.3", marker="o", ls="-")[0],
                axes[0].plot([], [], color="0.3", marker="o", mfc="none", ls="--")[0]]
    labels += [label, baseline_label]
    if legend_ax is not None:
        legend_ax.axis("off")
        legend_ax.legend(handles, labels, fontsize=LEGEND_FONTSIZE + 1, loc="center")
    else:
        axes[-1].legend(handles, labels, fontsize=LEGEND_FONTSIZE, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return axes


def plot_loss_curves(records, budget: float, axes=None, smooth: int = 5):
    """Training-loss curves of one budget's finished runs (`records`: run-record dicts): one panel
    per r, one colour per width (light: narrow, dark: wide), loss against tokens seen, log-log,
    each curve a moving average over `smooth` logged points (single batches are noisy)."""
    import matplotlib.pyplot as plt  # deferred: matplotlib only to draw
    from matplotlib.lines import Line2D
    runs = [rec for rec in records if rec.get("status") == "ok" and rec.get("train_loss_curve")
            and rec.get("budget") and abs(rec["budget"] / budget - 1) < 1e-6]
    r_values = sorted({int(rec["r"]) for rec in runs}) or list(R_VALUES)
    if axes is None:
        _, axes = plt.subplots(2, 2, figsize=(9, 7.2), sharex=True, sharey=True)
    axes = np.atleast_1d(axes).ravel()
    widths = sorted({float(rec["s"]) for rec in runs})
    cmap = plt.get_cmap("viridis_r")
    color = {s: cmap(0.15 + 0.7 * i / max(1, len(widths) - 1)) for i, s in enumerate(widths)}
    for ax, r in zip(axes, r_values):
        for rec in sorted((x for x in runs if int(x["r"]) == r), key=lambda x: x["s"]):
            steps, loss = np.array(rec["train_loss_curve"], float).T
            keep = steps > 0   # step 0 is the untrained model: no tokens seen yet
            steps, loss = steps[keep], loss[keep]
            if smooth > 1 and len(loss) > smooth:
                loss = np.convolve(loss, np.ones(smooth) / smooth, mode="valid")
                steps = steps[smooth // 2: smooth // 2 + len(loss)]
            ax.plot(steps * rec["batch_tokens"], loss, color=color[float(rec["s"])], lw=1.3)
        _r_panel(ax, r, ylog=True)
        if _in_a_row(ax):   # narrow panels: a label per decade
            from matplotlib.ticker import LogLocator  # deferred: matplotlib only to draw
            ax.xaxis.set_major_locator(LogLocator(base=10))
    _label_grid(axes, "training tokens seen", "training loss (nats)")
    handles = [Line2D([], [], color=color[s], lw=2, label=f"s = {s:g}") for s in widths]
    axes[0].figure.legend(handles=handles, loc="lower center", ncol=min(6, len(handles)) or 1,
                          fontsize=FIGURE_TEXT, frameon=False)
    return axes


def _in_a_row(ax) -> bool:
    """More than two panels side by side: labels must be short."""
    spec = ax.get_subplotspec()
    return spec is not None and spec.get_gridspec().ncols > 2


def _first_col(ax) -> bool:
    spec = ax.get_subplotspec()
    return spec is None or spec.is_first_col()


def _label_grid(axes, xlabel: str, ylabel: str):
    """Axis labels of a grid of panels (a flat list): x on the bottom row, y on the left column."""
    for ax in axes:
        spec = ax.get_subplotspec()
        if spec is None or spec.is_last_row():
            ax.set_xlabel(xlabel)
        if _first_col(ax):
            ax.set_ylabel(ylabel)


def _r_panel(ax, r: int, ylog: bool = False):
    """One r's panel: log N (and optionally log loss) axes with plain tick labels, a title, a grid."""
    ax.set_xscale("log")
    plain_log_axis(ax.xaxis)
    if ylog:
        ax.set_yscale("log")
        plain_log_axis(ax.yaxis)
    ax.set_title(f"r = {r}")
    ax.grid(alpha=0.3, which="both")


def plot_law_iso_flop(law, minima, budgets, axes=None, preset: str = "paper", s_range=(3, 40)):
    """The paper's Figure 2 redrawn from a law: for each r (one panel) and budget (one colour), the
    law's loss against unique N over the preset's widths (D = C / FLOPs per token), with the
    published minima (N*, L*) as stars.  `minima`: `paper_minima()` columns budget, r, n_star,
    loss_star."""
    import matplotlib.pyplot as plt  # deferred: matplotlib only to draw
    from matplotlib.lines import Line2D

    law = as_law(law)
    if axes is None:
        _, axes = plt.subplots(2, 2, figsize=(9, 8), sharey=True)
    axes = np.atleast_1d(axes).ravel()
    colors = budget_colors(budgets)
    widths = np.linspace(*s_range, 120)
    for ax, r in zip(axes, R_VALUES):
        cfgs = [model_config(preset, r=r, s=float(s)) for s in widths]
        no, nr = (np.array([f(c) for c in cfgs], float) for f in (n_once, n_rec))
        fl = np.array([flops_per_token(c) for c in cfgs], float)
        for budget, color in colors.items():
            ax.plot(no + nr, law.predict(no, nr, r, budget / fl), color=color, lw=1.4)
            star = minima[(minima.r == r) & np.isclose(minima.budget, budget)]
            ax.plot(star.n_star, star.loss_star, "*", color=color, ms=13, mec="black", mew=0.7, zorder=5)
        _r_panel(ax, r)
    _label_grid(axes, "unique non-embedding params N", "loss (nats/token)")
    handles = [Line2D([], [], color=c, lw=2, label=f"C = {power_of_ten(b)} FLOPs") for b, c in colors.items()]
    handles.append(Line2D([], [], color="0.5", marker="*", ms=12, mec="black", ls="", label="published minimum"))
    axes[0].figure.legend(handles=handles, loc="lower center", ncol=4, fontsize=LEGEND_FONTSIZE + 1, frameon=False)
    return axes
