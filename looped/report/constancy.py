"""The chapter "Is φ a constant?": its tables and its figures, from the committed results of
`looped constancy` (`looped.studies.constancy.analysis.read_results`).  The chapter writes its own words."""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import norm

from ..studies.paper import PAPER_PHI_CI
from .fit_figures import plot_phi_forest
from .formatting import power_of_ten
from .palette import OURS_COLOR, PAPER_COLOR

VARIANTS = {  # robustness_table's variants, as the reader should read them
    "paper": "the paper's law and accounting",
    "head_in_n_once": "LM head counted in N",
    "embedding_and_head_in_n_once": "embedding and LM head counted in N",
    "without_r2": "without r = 2",
    "without_r8": "without r = 8",
    "without_lowest_budget": "without the lowest budget",
    "without_highest_budget": "without the highest budget",
    "cell_interiors": "iso-FLOP cell interiors only",
    "per_r_phi_2": "one φ per r: φ₂",
    "per_r_phi_4": "one φ per r: φ₄",
    "per_r_phi_8": "one φ per r: φ₈",
    "kappa_r_phi": "extra multiplier: κ·rᵠ·N_rec",
}
GROUPS = {  # the refits of the forest, in groups, the main fit first; one φ per r last: three exponents, not one φ
    "how N is counted": ("paper", "head_in_n_once", "embedding_and_head_in_n_once"),
    "which runs": ("without_r2", "without_r8", "without_lowest_budget", "without_highest_budget", "cell_interiors",
                   "with_drift_budgets"),
    "form of the law": ("kappa_r_phi",),
    "three exponents,\nnot refits of one": ("per_r_phi_2", "per_r_phi_4", "per_r_phi_8"),
}
FOREST_FONTSIZE = 12   # the refit forest's labels (points; about 1 px per point at the column's width)
SCENARIOS = {"ours_white": ("our design", "white"), "ours_cell": ("our design", "per cell + white"),
             "paper_white": ("the paper's design", "white"), "paper_cell": ("the paper's design", "per cell + white")}


def paper_side(lo: float, hi: float) -> str:
    """Where an interval of φ lies against the paper's: 'above', 'below', or 'overlaps' it.  An
    overlap is not agreement: a wide interval overlaps almost anything."""
    return "above" if lo > PAPER_PHI_CI[1] else "below" if hi < PAPER_PHI_CI[0] else "overlaps"


def added_budgets(results: dict) -> list:
    """The budgets beyond the main runs that joined the φ-against-compute fits (the drift study)."""
    return sorted(set(results["per_budget"].budget) - set(results["lobo"].budget))


def _budgets_text(budgets) -> str:
    return " and ".join(power_of_ten(b) for b in budgets)


def robustness_frame(results: dict) -> pd.DataFrame:
    """One row per refit: φ, its 95% interval and its width, R², RMSE, runs, and where the interval
    lies against the paper's (`paper_side`)."""
    t = results["robustness"]
    names = VARIANTS | {"with_drift_budgets": f"with C = {_budgets_text(added_budgets(results))} added"}
    return pd.DataFrame({"refit": t.variant.map(names).fillna(t.variant), "phi": t.phi, "phi_lo": t.phi_lo,
                         "phi_hi": t.phi_hi, "width": t.phi_hi - t.phi_lo, "r2": t.r2, "rmse": t.rmse,
                         "n_runs": t.n_runs,
                         "against the paper's": [paper_side(lo, hi) for lo, hi in zip(t.phi_lo, t.phi_hi)]})


def drift_frame(by_corpus: dict) -> pd.DataFrame:
    """The drift of φ with compute on each corpus ({corpus: `looped constancy` results}), one row each:
    runs and budgets fitted (the main grid and the drift budgets joined), the slope φ₁ per decade, and
    its two calibrated scales (jackknife over cells; simulation on the design), each with its z."""
    rows = []
    for corpus, res in by_corpus.items():
        t, cal = res["trend"].set_index("data").loc["ours"], res["drift_calibration"]
        rows.append({"corpus": corpus, "runs": int(t.n_runs), "budgets": int(t.n_budgets),
                     "phi1": float(t.phi1), "jack_se": float(t.phi1_jack_se), "jack_z": float(t.phi1_jack_z),
                     "sim_se": float(cal["se"]), "sim_z": float(cal["z"]), "sim_noise": float(cal["noise"])})
    return pd.DataFrame(rows)


def drift_verdict(jack_z: float, sim_z: float) -> str:
    """The label of a drift by its weaker calibrated scale (two-sided): resolved at 1%, or only suggested."""
    p = 2 * norm.sf(min(abs(jack_z), abs(sim_z)))
    return "resolved at the 1% level by both scales" if p < 0.01 else "suggested, not resolved"


SEED_ORDER_EFFECTS = {"order42": "order_at_seed42", "order43": "order_at_seed43",
                      "seed_fixed": "seed_at_fixed_order", "seed_perm": "seed_at_permuted_order"}


def seed_order_effects(seed_order: dict) -> pd.DataFrame:
    """The four effects of a seed x data-order design (`replicates.seed_and_order`), one row each
    under its short name: mean (nats), se, t, n."""
    return pd.DataFrame([dict(effect=name, **seed_order[key]) for name, key in SEED_ORDER_EFFECTS.items()])


def synthetic_frame(results: dict) -> pd.DataFrame:
    """Recovery of a known φ over noise draws: design, noise, true φ, bias, SD, 95% interval coverage."""
    t = results["synthetic"]
    design, noise = zip(*(SCENARIOS[s] for s in t.scenario))
    return pd.DataFrame({"design": design, "noise": noise,
                         "noise_sd": t.noise, "phi_true": t.phi_true, "bias": t.bias, "sd": t.sd,
                         "coverage": t.coverage, "mean_width": t.mean_width, "draws": t.n_draws.astype(int)})


def plot_refit_forest(results: dict, ax=None):
    """The refits of `robustness_frame` as a forest (`fit_figures.plot_phi_forest`): one row per refit,
    its φ and 95% interval, in the groups of `GROUPS` (a rule between groups, the group's name to
    the right; a refit in none comes last), the main fit (the paper's law and accounting) in bold
    with a thin line at its φ, the paper's φ and interval as the band.  Its text is set at
    `FOREST_FONTSIZE` points or more, so that at the book's column width (about 8 inches) it
    reads at 11 px or more."""
    group_of = {v: g for g, variants in GROUPS.items() for v in variants}
    rank = {v: i for i, v in enumerate(group_of)}
    variant = results["robustness"].variant.to_numpy()
    frame = robustness_frame(results).assign(group=[group_of.get(v, "other") for v in variant],
                                             rank=[rank.get(v, len(rank)) for v in variant])
    frame = frame.sort_values("rank", kind="stable")
    frame["refit"] = ["main fit (the paper's counting)" if i == 0 else t for i, t in enumerate(frame.refit)]
    entries = frame.assign(source="ours")[["refit", "source", "phi", "phi_lo", "phi_hi"]]
    ax = plot_phi_forest(entries.set_axis(["label", "source", "phi", "lo", "hi"], axis=1), ax=ax)
    main = frame.iloc[0]
    ax.axvline(main.phi, color=OURS_COLOR, lw=0.8, alpha=0.45, zorder=1, label=f"our main fit: φ = {main.phi:.3f}")
    ax.tick_params(axis="both", labelsize=FOREST_FONTSIZE)
    ax.xaxis.label.set_fontsize(FOREST_FONTSIZE)
    for text in ax.texts:                       # the "to -2.46" ends of cut intervals, with a true minus
        text.set_fontsize(max(text.get_fontsize(), FOREST_FONTSIZE - 1))
        text.set_text(text.get_text().replace("to -", "to \u2212"))
    ax.get_yticklabels()[0].set_fontweight("bold")
    y = -np.arange(len(frame))      # the forest's rows, top down
    for g, rows in frame.reset_index(drop=True).groupby("group", sort=False):
        top, bottom = y[rows.index[0]], y[rows.index[-1]]
        if rows.index[0] > 0:
            ax.axhline(top + 0.5, color="0.3", lw=0.9)
        ax.text(1.02, (top + bottom) / 2, g, transform=ax.get_yaxis_transform(), ha="left", va="center",
                fontsize=FOREST_FONTSIZE - 1, color="0.3", style="italic")
    ax.legend(fontsize=FOREST_FONTSIZE - 1, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
              frameon=False)
    return ax


def _power_of_ten_axis(axis):
    """A log axis labelled at 1 and 3 x 10^k as powers of ten (10¹³, 3×10¹⁸), no minor labels."""
    # deferred on purpose: matplotlib only when a figure is drawn
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 3.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: power_of_ten(v)))
    axis.set_minor_formatter(NullFormatter())


def plot_phi_vs_compute(axes, results: dict) -> None:
    """First axes: our φ per budget (the other parameters shared, 95% bootstrap bars) and over sliding
    windows of two budgets (lines), with the fitted trend φ₀ + φ₁ log₁₀ C and its cell-jackknife SE;
    second: φ per budget and per two-budget window of the paper's published minima (the other
    five parameters held at its law).  The paper's φ interval as a band in both, budgets as powers
    of ten; one key for both panels below them (``loc="outside lower center"``: make the figure
    with layout="constrained" and a shared y-axis)."""
    ours, paper = results["per_budget"], results["paper_per_budget"]
    trend = results["trend"].set_index("data")
    ax = axes[0]
    ax.errorbar(ours.budget, ours.phi, yerr=[ours.phi - ours.phi_lo, ours.phi_hi - ours.phi], fmt="o",
                color=OURS_COLOR, capsize=3, label="ours: one φ per budget (95% interval)")
    for w in results["windows"].itertuples():
        ax.plot([w.budget_lo, w.budget_hi], [w.phi, w.phi], color=OURS_COLOR, alpha=0.5, lw=2)
    ax.plot([], [], color=OURS_COLOR, alpha=0.5, lw=2, label="ours: two-budget windows")
    row = trend.loc["ours"]   # the paper's minima are not a line (U-shaped per budget): no trend drawn there
    c = np.geomspace(ours.budget.min(), ours.budget.max(), 20)
    ax.plot(c, row.phi0 + row.phi1 * np.log10(c), "--", color=OURS_COLOR,
            label=f"ours: trend {row.phi1:+.3f} per decade (SE {row.phi1_jack_se:.2f})".replace("-", "\u2212"))
    axes[1].plot(paper.budget, paper.phi, "s", color=PAPER_COLOR, label="paper's minima: one φ per budget")
    for w in results["paper_windows"].itertuples():
        axes[1].plot([w.budget_lo, w.budget_hi], [w.phi, w.phi], color=PAPER_COLOR, alpha=0.5, lw=2)
    axes[1].plot([], [], color=PAPER_COLOR, alpha=0.5, lw=2, label="paper's minima: two-budget windows")
    for a, title in zip(axes, ("our runs", "the paper's 24 published minima")):
        band = a.axhspan(*PAPER_PHI_CI, color=PAPER_COLOR, alpha=0.12, lw=0)
        a.set_xscale("log")
        _power_of_ten_axis(a.xaxis)
        a.set_xlabel("training compute C (FLOPs)")
        a.set_title(title, fontsize=FOREST_FONTSIZE)
    axes[0].set_ylabel("φ")
    band.set_label(f"the paper's φ interval {list(PAPER_PHI_CI)}")
    handles, labels = zip(*(h for a in axes for h in sorted(zip(*a.get_legend_handles_labels()),   # points first
                                                            key=lambda h: "one φ per budget" not in h[1])))
    axes[0].figure.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=FOREST_FONTSIZE - 1,
                          frameon=False)
