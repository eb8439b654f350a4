"""Figures of fitted laws: residuals, bootstrap distributions, phi against its interval and its
profile, every estimate of phi as a forest, and the collapse onto N_eff (what a law implies, its
frontier and effective sizes, is drawn by `looped.report.law_figures`).  Drawn with the
palette of `looped.report.palette`; matplotlib is imported inside the functions.  Chapters reach these
through `looped.report.figures`, which re-exports them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..accounting import n_effective
from ..law import as_law, predict, residuals
from ..solver import HI, LAW_PARAMS, LO
from ..studies.paper import PAPER_PHI, PAPER_PHI_CI
from ..studies.phi.estimates import rmse_at_phi
from .formatting import power_of_ten
from .palette import LEGEND_FONTSIZE, OURS_COLOR, PAPER_COLOR, SYMBOLS, budget_markers, plain_log_axis, r_color


def _scatter_by_r_and_budget(ax, runs, x, y, marks):
    """One point per run: colour is r, marker is the budget; plus legend-only handles."""
    for r in sorted(runs["r"].unique()):
        for b, m in marks.items():
            sel = (runs["r"].to_numpy() == r) & np.isclose(runs["budget"].to_numpy(float), b)
            if sel.any():
                ax.scatter(np.asarray(x)[sel], np.asarray(y)[sel], color=r_color(r),
                           marker=m, s=30, edgecolor="white", lw=0.4, zorder=3)
    for r in sorted(runs["r"].unique()):
        ax.scatter([], [], color=r_color(r), marker="o", label=f"r = {int(r)}")
    for b, m in marks.items():
        ax.scatter([], [], color="0.4", marker=m, label=f"C = {power_of_ten(b)} FLOPs")


def plot_residuals(ax, res, runs, title: str | None = None, against: str = "N", legend: bool = True):
    """Residuals of a fitted law against unique non-embedding parameters N, or against the
    training tokens D (``against="D"``), on a log axis: colour is r, marker is the training
    budget; the grey band is +-1 RMSE of all runs.  ``legend=False`` leaves the legend to the caller
    (the handles stay on ``ax``)."""

    resid = residuals(res, runs)
    x = {"N": (runs["n_once"] + runs["n_rec"]).to_numpy(float), "D": runs["tokens"].to_numpy(float)}[against]
    marks = budget_markers(runs["budget"])
    rmse = float(np.sqrt(np.mean(resid ** 2)))
    ax.axhspan(-rmse, rmse, color="0.85", alpha=0.6, lw=0, label=f"±RMSE ({rmse:.3f} nats)")
    ax.axhline(0, color="0.3", lw=0.8)
    _scatter_by_r_and_budget(ax, runs, x, resid, marks)
    ax.set_xscale("log")
    ax.set_xlabel({"N": "unique non-embedding parameters N", "D": "training tokens D"}[against])
    ax.set_ylabel("observed − predicted loss (nats)")
    if legend:
        ax.legend(fontsize=LEGEND_FONTSIZE, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_predicted_vs_observed(ax, res, runs, title: str | None = None, legend: bool = True):
    """Observed final loss against the fitted law's prediction for every run (colour r, marker
    budget), with the identity line; ``legend=False`` leaves the legend to the caller."""
    pred = predict(res, runs["n_once"], runs["n_rec"], runs["r"], runs["tokens"])
    obs = runs["loss"].to_numpy(float)
    marks = budget_markers(runs["budget"])
    lo, hi = float(min(pred.min(), obs.min())), float(max(pred.max(), obs.max()))
    pad = 0.04 * (hi - lo)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="0.3", lw=0.8, ls="--", label="observed = predicted")
    _scatter_by_r_and_budget(ax, runs, pred, obs, marks)
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_aspect("equal")
    ax.set_xlabel("predicted loss (nats/token)")
    ax.set_ylabel("observed validation loss (nats/token)")
    if legend:
        ax.legend(fontsize=LEGEND_FONTSIZE, loc="lower right")   # below the diagonal: no points there
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_bootstrap(ax, res, param: str = "phi", paper=None, label: str = "ours"):
    """Histogram of the bootstrap resamples of one parameter, with the point estimate and the
    2.5/97.5 percentile band; ``paper`` = (value, lo, hi) adds the published estimate and interval."""

    i = LAW_PARAMS.index(param)
    samples = np.asarray(res.boot_samples)[:, i]
    lo, hi = res.ci[param]
    # resamples that ended on the fitting box's edge carry no estimate: count them, do not let them set the axis
    edge = np.isclose(samples, LO[i], atol=1e-6) | np.isclose(samples, HI[i], atol=1e-6)
    if param in ("A", "B", "E"):   # the box is in log space for these
        edge = np.isclose(np.log(samples), LO[i], atol=1e-6) | np.isclose(np.log(samples), HI[i], atol=1e-6)
    note = f", {int(edge.sum())} at the box edge (not drawn)" if edge.any() else ""
    ax.hist(samples[~edge], bins=30, color=OURS_COLOR, alpha=0.55, label=f"{label}: {len(samples)} resamples{note}")
    ax.axvspan(lo, hi, color=OURS_COLOR, alpha=0.12, label=f"{label} 95% interval [{lo:.2f}, {hi:.2f}]")
    ax.axvline(getattr(res, param), color=OURS_COLOR, lw=2, label=f"{label} fit {getattr(res, param):.3f}")
    if paper is not None:
        v, plo, phi_ = paper
        ax.axvspan(plo, phi_, color=PAPER_COLOR, alpha=0.15, label=f"paper 95% interval [{plo}, {phi_}]")
        ax.axvline(v, color=PAPER_COLOR, lw=2, ls="--", label=f"paper {v}")
    ax.set_xlabel(f"bootstrap estimate of {SYMBOLS.get(param, param)}")
    ax.set_ylabel("resamples")
    # beside the axes, not on the histogram's peak
    ax.legend(fontsize=LEGEND_FONTSIZE, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
    return ax


def plot_phi_profile(ax, profiles: dict, marks: dict | None = None):
    """Fit objective against a fixed phi (`looped.studies.phi.estimates.phi_profile`), one curve per data set
    (``profiles``: label -> profile table), each relative to its own minimum; ``marks``: label ->
    (value, lo, hi) drawn as a vertical line with its interval as a band (e.g. the paper's estimate).
    Colours follow the palette: a profile whose label names the paper (the paper's data) and the
    marks are the paper's orange, the first other profile is ours (black), any further one grey."""
    others = iter([OURS_COLOR, "0.45", "0.7"])
    for label, prof in profiles.items():
        c = PAPER_COLOR if "paper" in label.lower() else next(others, "0.7")
        ax.plot(prof["phi"], prof["relative"], "o-", ms=3.5, lw=1.5, color=c, label=label)
    for label, (v, lo, hi) in (marks or {}).items():
        ax.axvspan(lo, hi, color=PAPER_COLOR, alpha=0.15, lw=0)
        ax.axvline(v, color=PAPER_COLOR, lw=1.5, ls="--", label=label)
    ax.axhline(1.0, color="0.6", lw=0.6)
    ax.set_xlabel("φ held fixed")
    ax.set_ylabel("Huber objective / its minimum")
    ax.legend(fontsize=LEGEND_FONTSIZE)
    return ax


def plot_phi_forest(entries, ax=None, reference: float = PAPER_PHI, reference_ci=PAPER_PHI_CI):
    """Forest plot of estimates of phi: one row per estimate, a point with its 95% interval as a
    horizontal bar (a point alone where there is none), the paper's (orange squares) just above
    ours (black circles) in the band of each fit (centred when only one source is given), a
    vertical line and band at the paper's joint estimate and interval, and thin lines at phi = 0
    and 1.

    ``entries``: a DataFrame or a list of (label, source, phi, lo, hi) rows, source 'paper' or
    'ours' (`looped.studies.phi.estimates.phi_estimates`); fits keep the order of their first row.  A NaN phi
    is written as "not fitted"; an interval reaching far past the estimates is cut at the frame,
    with its end written beside it.  Raises ValueError on an empty table, a missing column, an
    unknown source or an interval whose ends are the wrong way round."""
    import matplotlib.pyplot as plt  # deferred on purpose: matplotlib only when a figure is drawn

    cols = ["label", "source", "phi", "lo", "hi"]
    df = entries.copy() if isinstance(entries, pd.DataFrame) else pd.DataFrame(list(entries), columns=cols)
    if missing := [c for c in cols if c not in df.columns]:
        raise ValueError(f"phi forest: missing column(s) {', '.join(missing)}")
    if not len(df):
        raise ValueError("phi forest: no estimates to draw")
    if bad := sorted(set(df["source"]) - {"paper", "ours"}):
        raise ValueError(f"phi forest: unknown source(s) {bad}; use 'paper' or 'ours'")
    df[["phi", "lo", "hi"]] = df[["phi", "lo", "hi"]].astype(float)
    if (df["lo"] > df["hi"]).any():
        raise ValueError("phi forest: an interval has lo > hi")
    labels = list(dict.fromkeys(df["label"]))
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.55 * len(labels) + 1.6))
    ref = [v for v in (*df["phi"], reference) if v == v]
    left, right = min(min(ref), 0.0) - 0.25, max(max(ref), 1.0) + 0.25
    ends = [v for v in (*df["lo"], *df["hi"]) if v == v]
    left = min([left] + [v - 0.05 for v in ends if v > left - 0.4])   # a little past the frame: widen it
    right = max([right] + [v + 0.05 for v in ends if v < right + 0.4])
    ax.axvspan(*reference_ci, color=PAPER_COLOR, alpha=0.12, lw=0)
    ax.axvline(reference, color=PAPER_COLOR, lw=1.2, ls="--", label=f"paper's joint φ = {reference:g} "
               f"[{reference_ci[0]:g}, {reference_ci[1]:g}]")
    for v in (0.0, 1.0):
        ax.axvline(v, color="0.55", lw=0.7, ls=":")
    box = (LO[LAW_PARAMS.index("phi")], HI[LAW_PARAMS.index("phi")])
    shift = 0.17 if df["source"].nunique() > 1 else 0.0   # two sources share a row: the paper's above
    style = {"paper": (PAPER_COLOR, "s", shift), "ours": (OURS_COLOR, "o", -shift)}
    for i, label in enumerate(labels):
        y0 = -i
        if i % 2 == 0:
            ax.axhspan(y0 - 0.5, y0 + 0.5, color="0.5", alpha=0.07, lw=0)
        for row in df[df["label"] == label].itertuples():
            color, marker, dy = style[row.source]
            y = y0 + dy
            if row.phi != row.phi:
                ax.text(left + 0.02, y, f"{row.source}: not fitted", va="center", fontsize=LEGEND_FONTSIZE,
                        color="0.4")
                continue
            if row.lo == row.lo and row.hi == row.hi:
                ax.plot([max(row.lo, left), min(row.hi, right)], [y, y], color=color, lw=1.8, solid_capstyle="butt")
                for end, edge, m, ha in ((row.lo, left, "<", "left"), (row.hi, right, ">", "right")):
                    if (end < edge) if m == "<" else (end > edge):
                        note = " (box edge)" if min(abs(end - b) for b in box) < 1e-3 else ""
                        ax.plot(edge, y, marker=m, color=color, ms=6, clip_on=False, zorder=4)
                        ax.annotate(f"to {end:.2f}{note}", (edge, y), xytext=(7 if m == "<" else -7, 3),
                                    textcoords="offset points", ha=ha, va="bottom", fontsize=LEGEND_FONTSIZE,
                                    color=color)
            ax.plot(row.phi, y, marker=marker, color=color, ms=6.5, mec="white", mew=0.6, ls="", zorder=3)
    for src, key in (("paper", "paper (95% interval where published)"), ("ours", "ours, 95% block-bootstrap interval")):
        if (df["source"] == src).any():   # a key only for the sources drawn
            ax.plot([], [], color=style[src][0], marker=style[src][1], lw=1.8, label=key)
    ax.set_yticks([-i for i in range(len(labels))], labels)
    ax.set_ylim(-len(labels) + 0.5, 0.5)
    ax.set_xlim(left, right)
    ax.set_xlabel(f"fitted {SYMBOLS['phi']} (r passes of the shared block count as $r^{SYMBOLS['phi']}$ copies)")
    ax.grid(alpha=0.3, axis="x")
    ax.yaxis.grid(False)
    ax.legend(fontsize=LEGEND_FONTSIZE, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    return ax


def plot_neff_collapse(runs, law, axes=None, phis=None):
    """The runs against the effective size N_once + r^phi N_rec (`looped.accounting.n_effective`)
    at phi = 0 (unique N), at the law's fitted phi and at phi = 1 (every pass counted), one panel
    each: colour is r (`R_COLORS`), marker the budget, a thin line joins the runs of one
    (budget, r) cell, and the dashed curve is the law's size term E + A N_eff^-alpha.

    The loss is drawn less the law's data term B D^-beta: at one budget the tokens follow the
    width, and at phi = 1 the looped models and the plain model of the same width sit at about
    the same N_eff, so the raw losses would line up near phi = 1 whatever phi the data hold.
    Less that term, the runs of every r and budget fall onto the one curve at the phi that
    describes them, and each title gives their RMSE around it (`looped.studies.phi.estimates.rmse_at_phi`).
    Only phi changes from panel to panel; the other parameters are the law's.

    ``runs``: columns r, n_once, n_rec, tokens, loss, budget; ``law``: a Law or FitResult with
    phi (``phis`` replaces the three values).  ``axes``: three panels, or four (the fourth holds
    the legend); default a 2 x 2 grid.  Raises ValueError for a law without phi (Chinchilla), a
    missing column or no runs."""
    import matplotlib.pyplot as plt  # deferred on purpose: matplotlib only when a figure is drawn

    if missing := [c for c in ("r", "n_once", "n_rec", "tokens", "loss", "budget") if c not in runs.columns]:
        raise ValueError(f"N_eff collapse: missing column(s) {', '.join(missing)}")
    if not len(runs):
        raise ValueError("N_eff collapse: no runs to draw")
    runs = runs.reset_index(drop=True)
    p = as_law(law)
    fitted = p.phi
    if fitted is None and phis is None:
        raise ValueError("N_eff collapse: the law has no phi (a Chinchilla law); pass phis")
    phis = [0.0, float(fitted), 1.0] if phis is None else [float(v) for v in phis]
    if axes is None:
        _, axes = plt.subplots(2, 2, figsize=(7.4, 6.6), sharey=True)
    axes = list(np.ravel(axes))
    if len(axes) < len(phis):
        raise ValueError(f"N_eff collapse: {len(phis)} values of phi need {len(phis)} axes, got {len(axes)}")
    marks = budget_markers(runs["budget"])
    size_part = runs["loss"].to_numpy(float) - p.B * runs["tokens"].to_numpy(float) ** -p.beta
    names = {0.0: "unique N", 1.0: "every pass counted"}
    x_by_phi = {phi: n_effective(runs["n_once"].to_numpy(float), runs["n_rec"].to_numpy(float),
                                 runs["r"].to_numpy(float), phi) for phi in phis}
    # one x-range for every panel, so the eye sees N_eff spread out as phi grows
    x_lo, x_hi = min(x.min() for x in x_by_phi.values()), max(x.max() for x in x_by_phi.values())
    for ax, phi in zip(axes, phis):
        x_all = x_by_phi[phi]
        for (b, r), g in runs.groupby(["budget", "r"]):
            x, y = x_all[g.index.to_numpy()], size_part[g.index.to_numpy()]
            order = np.argsort(x)
            ax.plot(x[order], y[order], color=r_color(r), lw=0.9, alpha=0.7, marker=marks[float(b)], ms=4.5,
                    mec="white", mew=0.4)
        xx = np.geomspace(x_lo, x_hi, 100)
        ax.plot(xx, p.E + p.A * xx ** -p.alpha, color="black", lw=1.2, ls="--", zorder=4)
        ax.set_xlim(x_lo / 1.15, x_hi * 1.15)
        rmse = rmse_at_phi(p, runs, [phi])[phi]
        what = "fitted" if fitted is not None and phi == float(fitted) else names.get(phi, "")
        ax.set_title(f"φ = {phi:.3g}" + (f" ({what})" if what else "") + f"\nRMSE {rmse:.3f} nats", fontsize=10)
        ax.set_xscale("log")
        plain_log_axis(ax.xaxis)   # short labels at 1 and 3 x 10^k: a range under a decade gets no crowded minor labels
        ax.set_xlabel("$N_\\mathrm{eff} = N_\\mathrm{once} + r^φ N_\\mathrm{rec}$")
        ax.grid(alpha=0.3, which="both")
        spec = ax.get_subplotspec()
        if spec is None or spec.is_first_col():
            ax.set_ylabel("loss $-\\,B D^{-β}$ (nats/token)")
    rs = sorted(runs["r"].unique())
    handles = [axes[0].plot([], [], color=r_color(r), marker="o", lw=0.9)[0] for r in rs]
    labels = [f"r = {int(r)}" for r in rs]
    handles += [axes[0].plot([], [], color="0.4", marker=m, ls="")[0] for m in marks.values()]
    labels += [f"C = {power_of_ten(b)} FLOPs" for b in marks]
    handles.append(axes[0].plot([], [], color="black", ls="--", lw=1.2)[0])
    labels.append("the law: $E + A N_\\mathrm{eff}^{-α}$")
    if len(axes) > len(phis):
        axes[len(phis)].axis("off")
        axes[len(phis)].legend(handles, labels, fontsize=LEGEND_FONTSIZE + 1, loc="center")
    else:
        axes[len(phis) - 1].legend(handles, labels, fontsize=LEGEND_FONTSIZE, loc="upper right")
    return axes
