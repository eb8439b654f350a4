"""The chapter "Is φ a constant?": its tables and its figure, from the committed results of
`looped robustness` (`looped.studies.robustness.read_results`).  The chapter writes its own words."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..studies.paper import PAPER_PHI_CI
from .formatting import power_of_ten
from .palette import LEGEND_FONTSIZE, OURS_COLOR, PAPER_COLOR, plain_log_axis

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


def synthetic_frame(results: dict) -> pd.DataFrame:
    """Recovery of a known φ over noise draws: design, noise, true φ, bias, SD, 95% interval coverage."""
    t = results["synthetic"]
    design, noise = zip(*(SCENARIOS[s] for s in t.scenario))
    return pd.DataFrame({"design": design, "noise": noise,
                         "noise_sd": t.noise, "phi_true": t.phi_true, "bias": t.bias, "sd": t.sd,
                         "coverage": t.coverage, "mean_width": t.mean_width, "draws": t.n_draws.astype(int)})


def plot_phi_vs_compute(axes, results: dict) -> None:
    """First axes: our φ per budget (the other parameters shared, 95% bootstrap bars) and over sliding
    windows of two budgets (lines); second: φ per budget and per two-budget window of the paper's
    published minima (the other five parameters held at its law).  Ours with the fitted trend
    φ₀ + φ₁ log₁₀ C and its cell-jackknife SE."""
    ours, paper = results["per_budget"], results["paper_per_budget"]
    trend = results["trend"].set_index("data")
    ax = axes[0]
    ax.errorbar(ours.budget, ours.phi, yerr=[ours.phi - ours.phi_lo, ours.phi_hi - ours.phi], fmt="o",
                color=OURS_COLOR, capsize=3, label="one φ per budget")
    for w in results["windows"].itertuples():
        ax.plot([w.budget_lo, w.budget_hi], [w.phi, w.phi], color=OURS_COLOR, alpha=0.5, lw=2)
    ax.plot([], [], color=OURS_COLOR, alpha=0.5, lw=2, label="two-budget windows")
    row = trend.loc["ours"]   # the paper's minima are not a line (U-shaped per budget): no trend drawn there
    c = np.geomspace(ours.budget.min(), ours.budget.max(), 20)
    ax.plot(c, row.phi0 + row.phi1 * np.log10(c), "--", color=OURS_COLOR,
            label=f"trend: {row.phi1:+.3f} per decade (SE {row.phi1_jack_se:.2f})")
    axes[1].plot(paper.budget, paper.phi, "s", color=PAPER_COLOR, label="one φ per budget (published minima)")
    for w in results["paper_windows"].itertuples():
        axes[1].plot([w.budget_lo, w.budget_hi], [w.phi, w.phi], color=PAPER_COLOR, alpha=0.5, lw=2)
    axes[1].plot([], [], color=PAPER_COLOR, alpha=0.5, lw=2, label="two-budget windows")
    axes[1].axhspan(*PAPER_PHI_CI, color=PAPER_COLOR, alpha=0.12, label=f"the paper's φ interval {list(PAPER_PHI_CI)}")
    for a, title in zip(axes, ("our runs", "the paper's 24 published minima")):
        a.set_xscale("log")
        plain_log_axis(a.xaxis)
        a.set_xlabel("training compute C (FLOPs)")
        a.set_title(title)
        a.legend(fontsize=LEGEND_FONTSIZE, loc="best")
    for a in axes:
        a.set_ylabel("φ")
