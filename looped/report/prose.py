"""Sentences the book glues into its pages, written from numbers the package computes."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..config import R_VALUES
from ..fit import at_bounds
from ..law import as_law, residuals
from ..solver import HI, LO
from ..studies.iso_flop import gap_side, gaps_by_budget, same_width_pairs
from ..studies.paper import PAPER_PHI, PAPER_PHI_CI, paper_fits, paper_table


def residual_pattern(cells: "pd.DataFrame") -> str:
    """One sentence (Markdown) on `residual_cells`: which r the law misses most on average and
    whether it misses it the same way at every budget (a mis-priced architecture) or not."""
    by_r = cells.mean()
    worst = by_r.abs().idxmax()
    column = cells[worst].dropna()
    text = f"The largest average misfit is at r = {int(worst)}, {by_r[worst]:+.3f} nats over its budgets"
    if len(column) > 1 and ((column > 0).all() or (column < 0).all()):
        return (text + f", with the same sign at every budget: the law {'over' if by_r[worst] > 0 else 'under'}"
                f"estimates how well r = {int(worst)} does at each of them, rather than missing one budget.")
    return text + ", with a sign that changes between budgets."


def interval_vs_paper(lo: float, hi: float) -> str:
    """Where a 95% interval of phi lies against the paper's [0.41, 0.53]: the one place the book
    says it (the verdict, the comparison with the paper, the key results)."""
    plo, phi_ = PAPER_PHI_CI
    if lo > phi_:
        return f"lies entirely above the paper's [{plo:g}, {phi_:g}], by {lo - phi_:.3f} at the closest ends"
    if hi < plo:
        return f"lies entirely below the paper's [{plo:g}, {phi_:g}], by {plo - hi:.3f} at the closest ends"
    return f"overlaps the paper's [{plo:g}, {phi_:g}]"


def joint_fit_verdict(joint, restricted: dict, runs, label: str = "our CPU study") -> str:
    """The chapter's verdict on a joint fit (Markdown, under 80 words): phi and its 95% interval
    against the paper's and against 0 and 1, what holding phi at 0 or 1 (``restricted``:
    {0.0: fit, 1.0: fit}) costs in R^2 beside the paper's costs, a parameter on the edge of the
    search box, and the residuals on ``runs`` against the paper's.  The law's form (one law per r,
    the gaps, the budget halves) is read by `law_form_reading`.  ``joint`` None: no fit yet."""
    if joint is None:
        return (f"No fit of {label} is shown yet: the sweep folder holds too few finished runs.  Rerun the "
                "chapter once its sweep (`looped sweep STUDY`) has finished.")
    paper = paper_fits()
    p_cost = [float(paper.loc["phi_free", "r2"] - paper.loc[k, "r2"]) for k in ("phi_fixed_0", "phi_fixed_1")]
    lo, hi = joint.ci["phi"]
    ends = [str(e) for e, out in ((0, lo > 0), (1, hi < 1)) if out]
    excludes = f"it excludes {' and '.join(ends)}" if ends else "it excludes neither 0 nor 1"
    text = (f"On the {joint.n_runs} runs of {label}, $\\varphi = {joint.phi:.3f}$ (95% interval {lo:.3f} to "
            f"{hi:.3f}), which {interval_vs_paper(lo, hi)}; {excludes}.  ")
    cost = [joint.r2 - restricted[v].r2 for v in (0.0, 1.0)]
    text += (f"Fixing $\\varphi$ at 0 or 1 changes $R^2$ by {-cost[0]:+.4f} and {-cost[1]:+.4f} "
             f"(paper: {-p_cost[0]:+.4f} and {-p_cost[1]:+.4f}).  ")
    bounds = at_bounds(joint)
    if bounds:
        text += f"{', '.join(bounds)} ended on the edge of the search box: a bound, not a measurement.  "
    resid = residuals(joint, runs)
    rmse, p_rmse = float(np.sqrt(np.mean(resid ** 2))), float(paper_table("joint_fit_residuals")["rmse"].mean())
    size = ("much larger than" if rmse > 2 * p_rmse else "larger than" if rmse > 1.25 * p_rmse else
            "about as large as" if rmse >= 0.8 * p_rmse else "smaller than")
    return text + f"The residuals (RMSE {rmse:.3f} nats) are {size} the paper's (about {p_rmse:.2f})."


def law_form_reading(joint, per_r: dict | None = None, gaps=None, paper_gaps=None, halves: dict | None = None) -> str:
    """How well the law's form holds (Markdown): one Chinchilla law per architecture (``per_r``)
    against the joint law, the model-free same-width loss gaps (``gaps``, ``paper_gaps``:
    `same_width_gaps` of our runs and of the paper's law on its grid) and the budget halves
    (``halves``: `phi_fits.half_fits`), each beside the paper's published numbers."""
    paper = paper_fits()
    p_arch = paper.loc[[f"chinchilla_r{r}" for r in R_VALUES], "r2"].astype(float)
    p_half = float(paper.loc["phi_free_high_half_budgets", "phi"] - paper.loc["phi_free_low_half_budgets", "phi"])
    parts = []
    if per_r:
        r2s = [res.r2 for res in per_r.values()]
        span = f"$R^2$ {min(r2s):.3f} to {max(r2s):.3f} (paper: {p_arch.mean():.3f})"
        if min(r2s) < 0.99:
            parts.append(f"The law's form itself is the weak point: even one Chinchilla law per architecture reaches "
                         f"only {span}.")
        elif min(r2s) - joint.r2 > 0.005:
            parts.append(f"One Chinchilla law per architecture fits well, {span}: what the joint law loses comes "
                         f"from tying the architectures together through $r^\\varphi$ with shared exponents.")
        else:
            parts.append(f"One Chinchilla law per architecture reaches {span}, hardly better than the joint law.")
    if gaps is not None and len(gaps) and paper_gaps is not None:
        ours = ", ".join(f"{g:+.3f} at $r = {r}$" for r, g in gaps["mean_gap"].items())
        theirs = ", ".join(f"{g:+.2f}" for g in paper_gaps["mean_gap"].values)
        side = gap_side(gaps, paper_gaps)
        parts.append(f"Without any law, a looped model loses {ours} nats against the plain model of its width and "
                     f"budget (the paper's law: {theirs})" + (f", so looping costs our models {side} than it costs "
                     f"at scale; the gaps and $\\varphi$ need not move together, since a gap also depends on the "
                     f"law's other parameters." if side else "."))
    if halves and len(halves) == 2:
        (_, low), (_, high) = halves["lower"], halves["upper"]
        better = (f"; the law fits the larger budgets {'much ' if high.r2 - low.r2 > 0.05 else ''}better"
                  if high.r2 - low.r2 > 0.02 else "")
        parts.append(f"The budget halves give $\\varphi$ = {low.phi:.3f} (lower, $R^2$ {low.r2:.3f}) and "
                     f"{high.phi:.3f} (upper, $R^2$ {high.r2:.3f}), a change of {high.phi - low.phi:+.3f} against "
                     f"{p_half:+.2f} in the paper{better}.")
    return "  ".join(parts)


def gaps_reading(runs, paper_runs, law, paper_law) -> str:
    """What the same-width gaps do with the budget and why larger gaps need not mean a smaller
    phi (Markdown): for the largest r, the mean gap at the lowest and highest budget in ``runs``
    (ours, fitted by ``law``) and in ``paper_runs`` (the paper's grid under ``paper_law``), then
    the gap split into the size term's slope per e-fold of N_eff times the log N_eff ratio.
    ``law``, ``paper_law``: a Law or a fit result."""
    law, paper_law = as_law(law), as_law(paper_law)

    def ends(table):
        column = table[table.columns.max()].dropna()
        return column.iloc[0], column.iloc[-1]

    def trend(first, last):
        return "grows" if last - first > 0.01 else "shrinks" if first - last > 0.01 else "changes little"

    ours, paper = gaps_by_budget(runs), gaps_by_budget(paper_runs)
    r = int(ours.columns.max())
    (o0, o1), (p0, p1) = ends(ours), ends(paper)
    text = (f"From the lowest to the highest budget the r = {r} gap goes from {o0:+.3f} to {o1:+.3f} nats in our "
            f"runs (it {trend(o0, o1)}) and from {p0:+.3f} to {p1:+.3f} in the paper's law on its grid (it "
            f"{trend(p0, p1)}).  ")
    split = []
    for pairs, fitted in ((same_width_pairs(runs, law), law), (same_width_pairs(paper_runs, paper_law), paper_law)):
        at_r = pairs[pairs["r"] == r]
        slope = float(fitted.size_slope(np.exp(np.log(at_r["n_eff"]).mean())))
        split.append((float(at_r["log_ratio"].mean()), slope))
    (lo, so), (lp, sp) = split
    # plain Unicode: math in a Markdown output is not rendered on the page
    return text + (f"A larger gap need not mean a smaller φ: a gap is about the size term's fall per e-fold "
                   f"of N_eff, α·A·N_eff^(−α), times the log of the two "
                   f"models' N_eff ratio.  At r = {r} our φ puts that ratio at {lo:.2f} "
                   f"e-folds against {lp:.2f} on the paper's grid, but at our model sizes the size term falls "
                   f"{so:.2f} nats per e-fold against {sp:.2f} at the paper's, so the products are {lo * so:.3f} and "
                   f"{lp * sp:.3f} nats.")


def lr_explains(table: pd.DataFrame, r: int, misfit: float) -> str:
    """One sentence (Markdown): can a learning rate that suits architecture `r` less explain a
    mean residual of `misfit` nats at that r?  Reads the `lr_sweep` row of r: if the preset's
    multiplier is within half the misfit of the best multiplier tried, the learning rate cannot
    account for it."""
    rows = table[table.r == r] if len(table) else table
    if not len(rows):
        return f"The learning-rate check has no runs at r = {r}, so it cannot say whether the rate explains the misfit."
    row = rows.iloc[0]
    gap = float(row.gap_at_preset)
    small = gap < abs(misfit) / 2
    return (f"At r = {r} the learning-rate check finds the preset's multiplier ({row.preset_multiplier:g}) "
            f"{gap:.3f} nats above the best of those tried ({row.best_multiplier:g}), against a misfit of "
            f"{misfit:+.3f} nats: a learning rate that suits r = {r} less "
            + ("cannot account for it." if small else "may account for part of it."))


def targets_summary(targets: pd.DataFrame) -> str:
    """One sentence (Markdown) on `rerun_targets`: how many were met and which were missed,
    each with the value measured, so a miss is named rather than averaged away."""
    met = targets[targets.met.astype(bool)]
    missed = targets[~targets.met.astype(bool)]
    text = f"The study meets {len(met)} of the {len(targets)} targets"
    if not len(missed):
        return text + "."
    return text + "; it misses " + "; ".join(f"{row.target} ({row.measured}, aim {row.aim})"
                                             for row in missed.itertuples()) + "."


def beside_the_paper(joint) -> str:
    """One or two sentences (Markdown) setting our phi and its interval beside the paper's 0.459
    [0.41, 0.53]: overlap or not, by how much, and whether the interval runs into the edge of
    the fit's search box (resamples that cannot pin phi at all)."""
    if joint is None or "phi" not in joint.ci:
        return "There is no bootstrapped fit of our runs to set beside the paper's yet."
    lo, hi = joint.ci["phi"]
    text = (f"Our φ = {joint.phi:.3f}, 95% interval [{lo:.3f}, {hi:.3f}], against the paper's {PAPER_PHI:g}: "
            f"the interval {interval_vs_paper(lo, hi)}.")
    edges = [v for v, edge in ((lo, float(LO[5])), (hi, float(HI[5]))) if abs(v - edge) < 1e-6]
    if edges:
        samples = getattr(joint, "boot_samples", None)
        count = (f" ({int(np.sum(np.abs(samples[:, 5] - edges[0]) < 1e-6))} of {len(samples)} resamples end there)"
                 if samples is not None else "")
        text += (f"  The interval reaches the edge of the fit's search box (φ = {edges[0]:g}){count}: some resamples "
                 f"of our cells cannot pin φ at all, so that end measures how little those resamples fix φ rather "
                 f"than a plausible value.")
    return text
