"""What a study's finished runs show without a law, and the split the law is fitted to.

Iso-FLOP minima per (budget, r) cell (the paper's parabola in log N) and how they move with the
budget, loss gaps of looped models to the plain model at the same width and at the best width,
the main-design split the joint law is fitted to (`main_design`), and residual summaries of a
fit per r.  The run tables these read come from `looped.studies.sweep.study.Study`; the fits behind
every estimate of phi are in `looped.studies.phi.estimates`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ...config import R_VALUES
from ...fit import FitError, validate_runs
from ...law import parabola, residuals
from ...records import cast


def main_design(runs):
    """Split a runs table into the main-study design the joint law is fitted to and the rest.

    Kept: finished runs (status ``ok``) of the plain model (r = 1) and of looped models with the
    default linear injection and full backpropagation (``bptt_k == r``).  Returns
    ``(kept, dropped)``; ``dropped`` has a ``reason`` column.
    """
    ok = runs["status"].astype(str) == "ok"
    r = runs["r"].astype(float)
    inj = runs["injection"].astype(str)
    k = runs["bptt_k"].astype(float)
    design = (r == 1) | ((inj == "linear") & np.isclose(k, r))
    reason = np.where(~ok, "status " + runs["status"].astype(str), "not the main design")
    kept = runs[ok & design].reset_index(drop=True)
    dropped = runs[~(ok & design)].assign(reason=reason[~(ok & design).to_numpy()]).reset_index(drop=True)
    return cast(kept), dropped


def budget_halves(budgets):
    """Lower and upper halves of a set of training budgets, as two sorted lists.

    An even number of budgets is split in the middle (the paper's six: three and three).  With
    an odd number the middle budget belongs to both halves (three budgets: the lowest two and
    the highest two), so that each half still spans more than one iso-FLOP curve.
    """
    b = sorted(set(float(x) for x in budgets))
    h = (len(b) + 1) // 2
    return b[:h], b[len(b) - h:]


def iso_flop_minima(df) -> "pd.DataFrame":
    """Per (budget, r) cell with >= 3 runs: the parabola of loss in log N (N = n_once + n_rec,
    unique params) and its vertex.  Columns budget, r, n_runs, n_star, loss_star, tokens_star
    (tokens interpolated log-linearly in log N at the vertex), inside (vertex within the
    cell's range of N), opens_up (positive curvature; otherwise the vertex is a maximum)."""

    df = validate_runs(df)
    if "budget" not in df.columns:
        raise FitError("iso-FLOP minima need a budget column")
    rows = []
    for (c, r), g in df.groupby(["budget", "r"], sort=True):
        if len(g) < 3:
            continue
        u = np.log(g["n_once"].to_numpy() + g["n_rec"].to_numpy())
        y = g["loss"].to_numpy()
        (c2, _, _), us, ls = parabola(u, y)
        opens = c2 > 0
        k1, k0 = np.polyfit(u, np.log(g["tokens"].to_numpy()), 1)
        rows.append(dict(budget=c, r=int(r) if float(r).is_integer() else r, n_runs=len(g),
                         n_star=float(np.exp(us)), loss_star=float(ls), tokens_star=float(np.exp(k0 + k1 * us)),
                         inside=bool(u.min() <= us <= u.max()), opens_up=bool(opens)))
    return pd.DataFrame(rows, columns=["budget", "r", "n_runs", "n_star", "loss_star", "tokens_star",
                                       "inside", "opens_up"])


def iso_flop_cells(table, min_runs: int = 3):
    """Iso-FLOP minima of a study's finished runs, one row per (budget, r) cell.

    `iso_flop_minima` fits the parabola of loss in log N (N unique) per cell with
    at least ``min_runs`` finished runs and returns its vertex (``n_star``, ``loss_star``) and
    whether it lies inside the cell's width bracket (``inside``) and is a minimum
    (``opens_up``).  Added here: ``tokens_per_param`` at the vertex, the finished and planned
    run counts, whether the cell's best run is its narrowest or widest (``best_at``), and
    ``fitted`` (False for cells skipped for having too few runs; their vertex columns are NaN).
    """
    ok = table[(table.status == "ok") & table.loss.notna()]
    keep = ["budget", "r", "n_once", "n_rec", "tokens", "loss", "s", "status"]
    minima = iso_flop_minima(ok[keep]) if len(ok) else pd.DataFrame(
        columns=["budget", "r", "n_runs", "n_star", "loss_star", "tokens_star", "inside", "opens_up"])
    rows = []
    for (budget, r), g in table.groupby(["budget", "r"], sort=True):
        done = g[(g.status == "ok") & g.loss.notna()].sort_values("n")
        row = dict(budget=budget, r=int(r), planned=len(g), finished=len(done))
        if len(done):
            best = done.loc[done.loss.idxmin()]
            row["best_s"] = float(best.s)
            row["best_at"] = ("narrowest" if best.n == done.n.min() else "widest" if best.n == done.n.max()
                              else "interior") if len(done) >= 3 else "-"
        hit = minima[(minima.budget == budget) & (minima.r == r)] if len(minima) else minima
        row["fitted"] = len(done) >= min_runs and len(hit) > 0
        if row["fitted"]:
            m = hit.iloc[0]
            row.update(n_star=m.n_star, loss_star=m.loss_star, tokens_star=m.tokens_star,
                       tokens_per_param=m.tokens_star / m.n_star, inside=bool(m.inside),
                       opens_up=bool(m.opens_up))
        rows.append(row)
    cols = ["budget", "r", "planned", "finished", "fitted", "best_s", "best_at", "n_star", "loss_star",
            "tokens_star", "tokens_per_param", "inside", "opens_up"]
    return pd.DataFrame(rows).reindex(columns=cols)


def minima_exponents(minima, min_cells: int = 2):
    """Least-squares slope a of log N* against log C per r (N* grows as C^a), over the cells of
    ``minima`` (columns budget, r, n_star; rows with ``inside`` False or NaN N* are left out)."""
    m = minima.dropna(subset=["n_star"])
    if "inside" in m.columns:
        m = m[m["inside"].astype(bool)]
    rows = []
    for r in R_VALUES:
        g = m[m.r == r]
        a = float(np.polyfit(np.log(g.budget.astype(float)), np.log(g.n_star.astype(float)), 1)[0]) \
            if g.budget.nunique() >= min_cells else float("nan")
        rows.append(dict(r=r, cells=len(g), exponent=a))
    return pd.DataFrame(rows)


def same_width_pairs(runs, law=None):
    """Every (budget, width s) at which both the plain model and a looped model were trained:
    budget, s, r, the looped model's loss minus the plain model's (``gap``, nats; same width,
    hence almost the same FLOPs per token and tokens) and, given a ``law``, the log of the plain
    model's N_eff over the looped one's (``log_ratio``) and their geometric-mean N_eff."""
    cols = ["budget", "s", "loss", "n_once", "n_rec"]
    plain = runs[runs["r"] == 1][cols].rename(columns={c: f"{c}_plain" for c in cols[2:]})
    m = runs[runs["r"] > 1][cols + ["r"]].merge(plain, on=["budget", "s"])
    m["gap"] = m["loss"] - m["loss_plain"]
    if law is not None:
        n_looped = law.effective_n(m["n_once"], m["n_rec"], m["r"])
        n_plain = m["n_once_plain"] + m["n_rec_plain"]
        m["log_ratio"], m["n_eff"] = np.log(n_plain / n_looped), np.sqrt(n_plain * n_looped)
    return m[["budget", "s", "r", "gap"] + (["log_ratio", "n_eff"] if law is not None else [])]


def gap_split(runs, law, r: int) -> tuple[float, float]:
    """Why a same-width gap at ``r`` has the size it has: a gap is about the size term's fall per
    e-fold of N_eff (`Law.size_slope` at the pairs' geometric-mean N_eff) times the log of the
    plain model's N_eff over the looped one's.  Returns (mean log ratio, slope); their product
    approximates the mean gap.  ``law``: a Law."""
    pairs = same_width_pairs(runs, law)
    at_r = pairs[pairs["r"] == r]
    return float(at_r["log_ratio"].mean()), float(law.size_slope(np.exp(np.log(at_r["n_eff"]).mean())))


def gaps_by_budget(runs) -> "pd.DataFrame":
    """Mean same-width gap (`same_width_pairs`) per budget (rows) and r (columns)."""
    table = same_width_pairs(runs).groupby(["budget", "r"])["gap"].mean().unstack("r")
    table.columns = table.columns.astype(int)
    return table


def same_width_gaps(runs):
    """Model-free view of what looping costs: the gaps of `same_width_pairs` summarised per r:
    number of matched pairs, mean, smallest and largest gap."""
    g = same_width_pairs(runs).groupby("r")["gap"]
    out = pd.DataFrame({"pairs": g.size(), "mean_gap": g.mean(), "min_gap": g.min(), "max_gap": g.max()})
    out.index = out.index.astype(int)
    return out


def gap_side(gaps, paper_gaps) -> "str | None":
    """'more' when looping costs our runs more than the paper's law predicts at every r (mean
    same-width gaps of `same_width_gaps`), 'less' when less at every r, None when it varies."""
    ref = paper_gaps["mean_gap"].reindex(gaps.index)
    return "less" if (gaps["mean_gap"] < ref).all() else "more" if (gaps["mean_gap"] > ref).all() else None


def residuals_by_r(res, runs):
    """Residuals (observed minus predicted loss, nats) of a fitted law, summarised per r: number
    of runs, mean residual, largest absolute residual and RMSE (the paper's per-r table)."""

    df = pd.DataFrame({"r": runs["r"].astype(int).to_numpy(), "res": residuals(res, runs)})
    g = df.groupby("r")["res"]
    out = pd.DataFrame({"n_runs": g.size(), "mean_residual": g.mean(),
                        "max_abs_residual": g.apply(lambda x: float(np.abs(x).max())),
                        "rmse": g.apply(lambda x: float(np.sqrt(np.mean(np.square(x)))))})
    return out


def loss_gaps_to_plain(table, paper=None, min_runs: int = 3):
    """How much loss looping costs at equal compute: for each budget, the best loss at r
    minus the best loss at r = 1 (nats; negative means the looped model did better).

    Ours: the lowest final loss among the finished runs of a (budget, r) cell, for cells with at
    least ``min_runs`` finished runs.  With ``paper`` (``paper_minima()``): the published L*
    differences as well.  One row per (source, budget), one column per looped r.
    """
    ok = table[(table.status == "ok") & table.loss.notna()]
    g = ok.groupby(["budget", "r"]).loss
    best = g.min().where(g.size() >= min_runs).unstack("r")
    ours = best.sub(best[1], axis=0) if 1 in best.columns else best * float("nan")
    frames = [ours.assign(source="ours (best run)")]
    if paper is not None:
        ls = paper.pivot(index="budget", columns="r", values="loss_star")
        frames.append(ls.sub(ls[1], axis=0).assign(source="paper (L*)"))
    out = pd.concat(frames).reset_index()
    cols = [r for r in R_VALUES if r != 1 and r in out.columns]
    return out[["source", "budget"] + cols].rename(columns={r: f"r={r}" for r in cols})
