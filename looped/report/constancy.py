"""The chapter "Is φ a constant?": its tables, its figure and its sentences, from the committed
results of `looped robustness` (`looped.studies.robustness.read_results`)."""
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


def overlaps_paper(lo: float, hi: float) -> bool:
    return lo <= PAPER_PHI_CI[1] and hi >= PAPER_PHI_CI[0]


def added_budgets(results: dict) -> list:
    """The budgets beyond the main runs that joined the φ-against-compute fits (the drift study)."""
    return sorted(set(results["per_budget"].budget) - set(results["lobo"].budget))


def _budgets_text(budgets) -> str:
    return " and ".join(power_of_ten(b) for b in budgets)


def robustness_frame(results: dict) -> pd.DataFrame:
    """One row per refit: φ, its 95% interval, R², RMSE, runs, and whether the interval meets the paper's."""
    t = results["robustness"]
    names = VARIANTS | {"with_drift_budgets": f"with C = {_budgets_text(added_budgets(results))} added"}
    return pd.DataFrame({"refit": t.variant.map(names).fillna(t.variant), "phi": t.phi, "phi_lo": t.phi_lo,
                         "phi_hi": t.phi_hi, "r2": t.r2, "rmse": t.rmse, "n_runs": t.n_runs,
                         "meets the paper's": [overlaps_paper(lo, hi) for lo, hi in zip(t.phi_lo, t.phi_hi)]})


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
    published minima (the other five parameters held at its law).  Each panel with its fitted trend φ₀ + φ₁ log₁₀ C."""
    ours, paper = results["per_budget"], results["paper_per_budget"]
    trend = results["trend"].set_index("data")
    ax = axes[0]
    ax.errorbar(ours.budget, ours.phi, yerr=[ours.phi - ours.phi_lo, ours.phi_hi - ours.phi], fmt="o",
                color=OURS_COLOR, capsize=3, label="one φ per budget")
    for w in results["windows"].itertuples():
        ax.plot([w.budget_lo, w.budget_hi], [w.phi, w.phi], color=OURS_COLOR, alpha=0.5, lw=2)
    ax.plot([], [], color=OURS_COLOR, alpha=0.5, lw=2, label="two-budget windows")
    for a, data, budgets, color in ((ax, "ours", ours.budget, OURS_COLOR), (axes[1], "paper_minima", paper.budget,
                                                                            PAPER_COLOR)):
        row = trend.loc[data]
        c = np.geomspace(budgets.min(), budgets.max(), 20)
        a.plot(c, row.phi0 + row.phi1 * np.log10(c), "--", color=color,
               label=f"trend: {row.phi1:+.3f} per decade")
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


def reading(results: dict) -> dict:
    """The chapter's findings, one Markdown sentence each, written from the numbers."""
    t, s = robustness_frame(results), results["summary"]
    base = t.iloc[0]
    moved = [row.refit for _, row in t.iloc[1:].iterrows() if row["meets the paper's"] != base["meets the paper's"]]
    per_r = results["robustness"].set_index("variant").loc[["per_r_phi_2", "per_r_phi_4", "per_r_phi_8"]]
    apart = per_r.phi_hi.iloc[0] < per_r.phi_lo.iloc[1:].max()
    trend = results["trend"].set_index("data")
    ours, paper = trend.loc["ours"], trend.loc["paper_minima"]

    def sign(lo, hi):
        return "lies below zero" if hi < 0 else "lies above zero" if lo > 0 else "spans zero"

    # the jackknife over 4 budgets can exclude zero where the cell bootstrap does not: say which one counts
    jackknife_only = (sign(ours.phi1_jack_lo, ours.phi1_jack_hi) != "spans zero"
                      and sign(ours.phi1_boot_lo, ours.phi1_boot_hi) == "spans zero")
    gof = results["by_r"].set_index("r")
    worst = gof["mean"].abs().idxmax()
    syn = synthetic_frame(results)
    return {
        "convention": (
            f"Our φ is {base.phi:.3f} [{base.phi_lo:.3f}, {base.phi_hi:.3f}], "
            + ("an interval that meets" if base["meets the paper's"] else "an interval that misses")
            + f" the paper's [{PAPER_PHI_CI[0]:g}, {PAPER_PHI_CI[1]:g}].  "
            + (f"That comparison flips under {len(moved)} of the {len(t) - 1} other refits: "
               + "; ".join(moved) + "." if moved else "No other refit changes that comparison.")),
        "form": (
            f"One φ per r gives φ₂ = {per_r.phi.iloc[0]:.3f}, φ₄ = {per_r.phi.iloc[1]:.3f}, "
            f"φ₈ = {per_r.phi.iloc[2]:.3f}"
            + (", and φ₂'s interval lies below the others': a single rᵠ does not describe how our r = 2 "
               "models use their passes." if apart else ", with overlapping intervals.")),
        "noise": (
            f"The residual RMSE, {s['rmse']:.3f} nats, is {s['rmse_over_seed_sd']:.1f} times the seed noise "
            f"({s['seed_sd']:.3f} nats from {s['n_replicate_runs']} replicate runs in {s['n_groups']} groups); "
            f"the lack-of-fit test gives F = {s['F']:.1f} on ({s['df1']}, {s['df_pe']}) degrees of freedom, "
            f"p = {_p_text(s['p_value'])}.  The largest mean residual by r is {gof.loc[worst, 'mean']:+.3f} nats at "
            f"r = {int(worst)}."),
        "position": _position_sentence(results["by_role"].set_index("role")["mean"]),
        "drift": (
            f"Across our budgets φ changes by {ours.phi1:+.3f} per decade of compute (block bootstrap "
            f"[{ours.phi1_boot_lo:+.3f}, {ours.phi1_boot_hi:+.3f}], which "
            f"{sign(ours.phi1_boot_lo, ours.phi1_boot_hi)}); "
            f"across the paper's published minima by {paper.phi1:+.3f} per decade "
            f"([{paper.phi1_boot_lo:+.3f}, {paper.phi1_boot_hi:+.3f}], which "
            f"{sign(paper.phi1_boot_lo, paper.phi1_boot_hi)}).  Leaving out one of our budgets at a time gives "
            f"φ₁ from {min(ours.phi1_jack):+.3f} to {max(ours.phi1_jack):+.3f}"
            + (f"; the jackknife interval built on that, [{ours.phi1_jack_lo:+.3f}, {ours.phi1_jack_hi:+.3f}], "
               "excludes zero, but it measures only how φ₁ depends on which budgets are fitted, not the noise of "
               "the runs within them, so the block bootstrap, which resamples the cells, is the interval we read."
               if jackknife_only else "."))
        + _holdout_sentence(results, t),
        "recovery": (
            "On data drawn from a known law with our measured noise, the fit recovers φ with bias "
            + ", ".join(f"{r.bias:+.3f} ({r.design}, {r.noise} noise, coverage {r.coverage:.0%})"
                        for r in syn.itertuples())
            + f" over {int(syn.draws.min())} draws each: on our design the protocol alone would pin a constant φ to "
            f"a standard deviation of {syn[syn.design == 'our design'].sd.max():.3f}."),
        "meaning": _meaning(s["p_value"], [m for m in moved if "counted in N" in m], apart, ours),
        "pending": _pending_sentence(results),
        "key": key_findings(results),
    }


def glance(results: dict) -> dict:
    """The intro's "results at a glance" rows from this chapter: φ with the LM head counted, φ's
    change per decade of compute (ours beside the paper's minima) and the recovery of a known φ on
    the paper's design over many noise draws (worst bias, lowest coverage), each with a verdict:
    recovered when every coverage is at least 90% and every bias below its SD."""
    t = robustness_frame(results).set_index("refit")
    head = t.loc[VARIANTS["head_in_n_once"]]
    trend = results["trend"].set_index("data")
    ours, paper = trend.loc["ours"], trend.loc["paper_minima"]
    spans_zero = [row.phi1_boot_lo <= 0 <= row.phi1_boot_hi for row in (ours, paper)]
    agree = (ours.phi1_boot_lo <= paper.phi1 <= ours.phi1_boot_hi
             or paper.phi1_boot_lo <= ours.phi1 <= paper.phi1_boot_hi)
    drift = "not resolved (both intervals contain 0)" if all(spans_zero) else "yes" if agree else "no"
    numbers = {"head_phi": head.phi, "head_phi_lo": head.phi_lo, "head_phi_hi": head.phi_hi,
               "drift": ours.phi1, "drift_lo": ours.phi1_boot_lo, "drift_hi": ours.phi1_boot_hi,
               "paper_drift": paper.phi1, "paper_drift_lo": paper.phi1_boot_lo, "paper_drift_hi": paper.phi1_boot_hi}
    syn = synthetic_frame(results)
    paper_design = syn[syn.design == "the paper's design"]
    numbers |= {"syn_worst_bias": paper_design.bias.abs().max(), "syn_min_coverage": paper_design.coverage.min(),
                "syn_draws": paper_design.draws.min()}
    recovered = paper_design.coverage.min() >= 0.9 and (paper_design.bias.abs() < paper_design.sd).all()
    verdicts = {"repro_head": "yes" if head["meets the paper's"] else "no", "repro_drift": drift,
                "repro_recovery": "yes" if recovered else "no"}
    return {k: float(v) for k, v in numbers.items()} | verdicts


def key_findings(results: dict) -> str:
    """Two plain-text sentences (no Markdown: other pages paste them) for the book's key results and
    chapter 4's verdict: which parameter counts flip the comparison with the paper, the misfit against
    the seed noise, and the drift of φ with compute with its interval."""
    t, s = robustness_frame(results), results["summary"]
    base = t.iloc[0]
    counts = t[t.refit.str.contains("counted in N") & (t["meets the paper's"] != base["meets the paper's"])]
    if len(counts):
        row = counts.iloc[0]
        what = row.refit.replace(" counted in N", "")
        text = (f"Whether our interval meets the paper's depends on how parameters are counted: with the {what} "
                f"counted in N, φ = {row.phi:.3f} [{row.phi_lo:.3f}, {row.phi_hi:.3f}], which "
                + ("meets" if row["meets the paper's"] else "misses") + " it.  ")
    else:
        text = "The comparison with the paper holds under every way of counting parameters we tried.  "
    ours = results["trend"].set_index("data").loc["ours"]
    resolved = not ours.phi1_boot_lo <= 0 <= ours.phi1_boot_hi
    interval = f"[{ours.phi1_boot_lo:+.3f}, {ours.phi1_boot_hi:+.3f}]"
    return text + (f"The law misses our runs by {s['rmse_over_seed_sd']:.1f} times their seed noise, and φ "
                   f"{'falls' if ours.phi1 < 0 else 'rises'} by {abs(ours.phi1):.3f} per decade of compute across our "
                   "budgets, a drift " + (f"whose 95% bootstrap interval, {interval}, excludes zero." if resolved else
                                          f"not resolved (95% bootstrap interval {interval})."))


def _holdout_sentence(results: dict, frame: pd.DataFrame) -> str:
    """How well the main fit predicts the budgets it never saw, and φ once they are added ('' if none)."""
    held = results["holdout"]
    if not len(held):
        return ""
    n_main, text = len(results["lobo"]), ""
    for h in held.itertuples():
        noise = f", {h.rmse_over_seed_sd:.1f} times the seed noise" if np.isfinite(h.rmse_over_seed_sd) else ""
        text += (f"  Fitted to our {n_main} main budgets alone, the law predicts the {int(h.n_runs)} runs at "
                 f"C = {power_of_ten(h.budget)}, a budget it never saw, with a mean error of {h.mean_error:+.3f} "
                 f"nats (RMSE {h.rmse:.3f}{noise}).")
    added = frame[results["robustness"].variant.eq("with_drift_budgets").to_numpy()]
    if len(added):
        row = added.iloc[0]
        text += (f"  With {'it' if len(held) == 1 else 'them'} added, φ = {row.phi:.3f} "
                 f"[{row.phi_lo:.3f}, {row.phi_hi:.3f}].")
    return text


def _pending_sentence(results: dict) -> str:
    """Which runs this analysis used, and what is still to land (from the command's settings)."""
    st, s = results["settings"], results["summary"]
    text = f"This analysis used {int(s['n_replicate_runs'])} replicate runs for the seed noise"
    planned, done = st.get("n_drift_planned"), int(st.get("n_drift_runs", 0))
    if planned and done >= planned:
        return text + f" and all {done} runs of the larger budget (`cpu-drift`)."
    if not planned:   # drift runs from a folder or table that is not a named study
        return text + (f" and {done} runs at further budgets." if done else ".")
    joined = int(st.get("n_drift_joined", 0))
    so_far = (f") has {done} of its {planned} runs so far"
              + ("" if joined else ", not yet one at every r, so they are predicted but not yet fitted")
              if done else f", {planned} runs) has no finished run yet")
    return text + (f"; the larger budget (`cpu-drift`{so_far}.  Rerun `looped robustness` once it is complete: "
                   "a fifth budget is what would settle the drift.")


def _p_text(p: float) -> str:
    """A p-value for prose: two digits, as a power of ten below 0.001 (never '1e-10')."""
    return f"{p:.2g}" if p >= 1e-3 else power_of_ten(p, 2)


def _position_sentence(mean) -> str:
    """Where in the iso-FLOP cell the law misses: the edges and the interior, by their mean residual."""
    edges, inside = mean.drop("interior"), mean["interior"]
    if (edges > 0).all() and inside < 0:
        return (f"The narrowest and widest runs of each cell lie above the law on average "
                f"({edges['narrowest']:+.3f} and {edges['widest']:+.3f} nats), the interior ones below it "
                f"({inside:+.3f}): the observed iso-FLOP valleys are curvier than the law's.")
    return (f"Mean residuals by position in the cell: narrowest {edges['narrowest']:+.3f}, interior {inside:+.3f}, "
            f"widest {edges['widest']:+.3f} nats.")


def _meaning(p_value: float, counting: list, apart: bool, trend) -> str:
    """The chapter's conclusion, from the tests above: what our φ is, and what it is not."""
    fits = p_value >= 0.05
    text = ("Our φ summarises a law that fits our runs to within their seed noise" if fits else
            "Our φ summarises a law that does not fit our runs to within their seed noise")
    text += (", and its comparison with the paper's turns on how parameters are counted." if counting else
             ", and its comparison with the paper's holds under every way of counting parameters tried here.")
    no_drift = trend.phi1_boot_lo <= 0 <= trend.phi1_boot_hi
    doubts = [what for what, ok in (("one exponent for every r", not apart), ("no drift with compute", no_drift))
              if not ok]
    if doubts:
        text += f"  Our data question the law's premise{'s' if len(doubts) > 1 else ''} of {' and of '.join(doubts)}"
        text += ("; a drift with compute is suggested but not resolved (the trend's interval contains zero)."
                 if no_drift else ".")
        if apart:   # what would settle it
            text += ("  More values of r (3, 6, 16) would show whether the exponent changes smoothly with r or only "
                     "r = 2 stands apart.")
    else:
        text += ("  Neither premise of the law, one exponent for every r and no drift with compute, is rejected by "
                 "our data, though both tests are weak.")
    return text
