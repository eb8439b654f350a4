"""Is a study in the law's regime?  The checks a new grid must pass before its sweep starts,
and the scorecard of the finished study.

A scaling-law fit only means something where the runs behave like the paper's: every iso-FLOP
curve has its minimum strictly inside the widths trained, the compute-optimal model sees a
sensible number of tokens per parameter (the paper's minima sit at roughly 8-24; Section 4),
the models are far from the token-frequency floor (the unigram entropy), the learning rate
transferred by HyperP is close to the best one at the reference width, and the fit's residuals
are compared with the loss spread that seeds alone produce.  These functions read the pilot,
LR-sweep and seed-noise studies (`looped sweep prose-pilot`, `prose-lr`, `prose-seeds`) and
return one small table per question; the sweep chapter of the book shows them.  Once the study
has run, `rerun_targets`, `leave_one_r_out`, `lr_explains`, `scale_comparison` and
`beside_the_paper` score it against the targets set beforehand and set it beside the paper (the
fitting chapter).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..config import REPO, get_preset
from ..fit import fit
from ..law import residuals
from ..records import COLUMNS, read_records
from .analysis import iso_flop_cells, main_design, study_table
from .estimate import cpu_estimate
from .registry import STUDIES, load_study
from .replicates import spread


def pilot_optima(study: str = "prose-pilot", runs_dir=None, tokens_per_param=(10.0, 40.0)) -> pd.DataFrame:
    """Per (budget, r) cell of a pilot: the iso-FLOP vertex (unique params N*, d_model of the
    nearest trained width, tokens per unique parameter) and whether it is bracketed by the
    widths trained and, for r = 1, inside the `tokens_per_param` window (a looped model shares
    its parameters, so at equal compute it sees more tokens per unique parameter: the window is
    a criterion for the plain model only)."""
    table = study_table(study, runs_dir)
    cells = iso_flop_cells(table)
    ok = table[(table.status == "ok") & table.loss.notna()]
    rows = []
    for c in cells.itertuples():
        g = ok[(ok.budget == c.budget) & (ok.r == c.r)]
        if not c.fitted or g.empty:
            rows.append(dict(budget=c.budget, r=c.r, finished=c.finished, fitted=False))
            continue
        n_unique = g.n_once + g.n_rec
        nearest = g.iloc[int(np.argmin(np.abs(np.log(n_unique.to_numpy()) - np.log(c.n_star))))]
        lo, hi = tokens_per_param
        rows.append(dict(budget=c.budget, r=c.r, finished=c.finished, fitted=True, n_star=c.n_star,
                         d_nearest=int(nearest.d_model), tokens_per_param=c.tokens_per_param,
                         best_loss=float(g.loss.min()), inside=bool(c.inside and c.opens_up),
                         in_window=bool(lo <= c.tokens_per_param <= hi) if c.r == 1 else None))
    return pd.DataFrame(rows)


def lr_sweep(study: str = "prose-lr", runs_dir=None, tolerance: float = 0.01) -> pd.DataFrame:
    """Per r: the final loss at each multiplier of HyperP's transferred learning rates, the best
    multiplier, whether multiplier 1 (the transfer as the paper states it) is within `tolerance`
    nats of the best, and the gap at the study preset's default multiplier (`Preset.lr_scale`,
    which an LR sweep that finds the transfer off re-bases)."""
    default = get_preset(STUDIES[study][2]).lr_scale if study in STUDIES else 1.0
    rec = _ok_records(study, runs_dir)
    rows = []
    for r, g in rec.groupby("r", sort=True):
        by_lr = g.groupby("lr_scale").loss.mean().sort_index()
        best = float(by_lr.idxmin())
        at_one = float(by_lr.get(1.0, np.nan))
        rows.append(dict(r=int(r), **{f"lr x{m:g}": v for m, v in by_lr.items()}, best_multiplier=best,
                         gap_at_1=at_one - float(by_lr.min()), transfer_ok=bool(at_one - by_lr.min() <= tolerance),
                         preset_multiplier=default,
                         gap_at_preset=float(by_lr.get(default, np.nan)) - float(by_lr.min())))
    return pd.DataFrame(rows)


def seed_spread(study: str = "prose-seeds", runs_dir=None) -> pd.DataFrame:
    """Per configuration (budget, r, s): the final losses of its seeds, their standard deviation
    and range (`replicates.spread`): the noise floor that a fit's residuals cannot go below."""
    rec = _ok_records(study, runs_dir)
    return spread(rec, ["budget", "r", "s"]).drop(columns="ss").astype({"r": int}) if len(rec) else pd.DataFrame()


def batch_comparison(study: str = "prose-batch", runs_dir=None) -> pd.DataFrame:
    """Final loss per (budget, r, width) at each batch size the study trained, side by side, and
    each larger batch's loss minus the smallest batch's: how much the tokens per step move the
    loss, and whether every width alike (if not, they move the iso-FLOP optimum too).  The
    learning rates follow HyperP's batch rule, so this compares the recipes a user would get."""
    keys = ["budget", "r", "s", "d_model"]
    rec = _ok_records(study, runs_dir)
    if rec.empty:
        return pd.DataFrame(columns=keys)
    rec["batch_tokens"] = rec["batch_tokens"].astype(int)
    wide = rec.pivot_table(index=keys, columns="batch_tokens", values="loss").dropna()
    sizes = sorted(wide.columns)
    wide.columns = [f"loss at {b:,}" for b in sizes]
    for b in sizes[1:]:
        wide[f"{b:,} minus {sizes[0]:,}"] = wide[f"loss at {b:,}"] - wide[f"loss at {sizes[0]:,}"]
    out = wide.reset_index()
    out[["r", "d_model"]] = out[["r", "d_model"]].astype(int)
    return out


def grid_shape(study: str = "cpu-main") -> pd.DataFrame:
    """Per budget of a study's grid: the widths d_model trained, the recurrences, the number of
    runs and their FLOPs (what `looped sweep STUDY --dry-run` lists run by run)."""
    rows = {}
    for run in load_study(study):
        row = rows.setdefault(run.budget, {"budget": run.budget, "widths": set(), "r": set(), "runs": 0})
        row["widths"].add(run.model_config().d_model)
        row["r"].add(run.r)
        row["runs"] += 1
    return pd.DataFrame([{**row, "widths": ", ".join(map(str, sorted(row["widths"]))),
                          "r": ", ".join(map(str, sorted(row["r"]))), "flops": row["budget"] * row["runs"]}
                         for _, row in sorted(rows.items())])


def study_cost(studies=("cpu-main", "cpu-truncated", "cpu-hyper"), processes: int = 2,
               timing_from=("prose-pilot", "prose-lr", "prose-seeds", "prose-batch")) -> pd.DataFrame:
    """Estimated hours of each study on this machine's CPU, split over `processes` (one per
    core): `estimate.cpu_estimate`, i.e. wall time fitted to the finished fast-path runs of the
    `timing_from` studies (the design runs by default, so the estimate does not drift while the
    study itself runs; None: the study's own runs once it has some), for the whole study and for
    the runs not yet recorded."""
    sources = None if timing_from is None else [REPO / "runs" / name for name in timing_from]
    rows = []
    for study in studies:
        runs = load_study(study)
        est = cpu_estimate(runs, REPO / "runs" / study, peak_flops=float("nan"), processes=processes,
                           timing_from=sources)
        rows.append({"study": study, "runs": len(runs), "flops": est["flops"],
                     f"hours_on_{processes}_processes": est["hours_wall_all"], "to_do": est["todo"],
                     "hours_left": est["hours_wall"], "timed_from": est["basis"]})
    return pd.DataFrame(rows)


def _ok_records(study: str, runs_dir=None) -> pd.DataFrame:
    folder = REPO / "runs" / study if runs_dir is None else Path(runs_dir)
    rec = read_records(folder) if folder.is_dir() else pd.DataFrame(columns=COLUMNS)
    rec = rec[rec.status == "ok"].copy()
    for col in ("loss", "budget", "s", "lr_scale", "d_model", "r"):
        if col in rec:
            rec[col] = rec[col].astype(float)
    if "seed" in rec:
        rec["seed"] = rec["seed"].astype(int)
    return rec


def rerun_targets(table: pd.DataFrame, joint, halves: dict | None = None, seed_std: float | None = None,
                  r2_min: float = 0.99, rmse_max: float = 0.03, noise_factor: float = 3.0,
                  phi_width_max: float = 0.3) -> pd.DataFrame:
    """What a faithful small-scale rerun should reach, beside what ours reached: one row per
    target (aim, measured, met), so a chapter reports a miss as plainly as a hit.

    `table` is the study's run table (`analysis.study_table`, every status), `joint` the joint
    fit with bootstrap intervals on its finished runs, `halves` `phi_fits.half_fits` with
    bootstrap, `seed_std` the largest seed spread (`seed_spread`).  Cells must bracket their
    minimum (the iso-FLOP parabola's vertex inside the widths trained and a minimum); residuals
    are in nats; the halves agree when each half's phi lies in the other's 95% interval."""
    rows = []

    def add(target, aim, measured, met):
        rows.append({"target": target, "aim": aim, "measured": measured, "met": bool(met)})

    bad = table[table.status.isin(["diverged", "failed", "corrupt"])]
    missing = int((table.status == "missing").sum())
    add("runs finished without divergence or failure", "all",
        f"{int((table.status == 'ok').sum())} of {len(table)} ok, {len(bad)} diverged or failed"
        + (f", {missing} not run" if missing else ""), len(bad) == 0 and missing == 0)
    cells = iso_flop_cells(table)
    bracketed = cells.fitted.astype(bool) & cells.inside.eq(True) & cells.opens_up.eq(True)
    add("(budget, r) cells that bracket their minimum", "all",
        f"{int(bracketed.sum())} of {len(cells)}", bool(bracketed.all()))
    if joint is None:
        return pd.DataFrame(rows)
    runs, _ = main_design(table)
    rmse = float(np.sqrt(np.mean(residuals(joint, runs) ** 2)))
    add("joint fit R² (raw nats)", f"≥ {r2_min}", f"{joint.r2:.4f}", joint.r2 >= r2_min)
    add("residual RMSE (nats)", f"≤ {rmse_max}", f"{rmse:.4f}", rmse <= rmse_max)
    if seed_std is not None and np.isfinite(seed_std):
        add("residual RMSE / seed noise (std)", f"≤ {noise_factor:g}", f"{rmse / seed_std:.1f}",
            rmse <= noise_factor * seed_std)
    if "phi" in joint.ci:
        lo, hi = joint.ci["phi"]
        add("width of phi's 95% interval", f"≤ {phi_width_max}", f"{hi - lo:.3f}", hi - lo <= phi_width_max)
    if halves and len(halves) == 2 and all("phi" in fit.ci for _, fit in halves.values()):
        (_, low), (_, high) = halves["lower"], halves["upper"]
        agree = (low.ci["phi"][0] <= high.phi <= low.ci["phi"][1]
                 and high.ci["phi"][0] <= low.phi <= high.ci["phi"][1])
        add("budget halves' phi inside each other's intervals", "yes",
            f"{low.phi:.3f} [{low.ci['phi'][0]:.3f}, {low.ci['phi'][1]:.3f}] vs "
            f"{high.phi:.3f} [{high.ci['phi'][0]:.3f}, {high.ci['phi'][1]:.3f}]", agree)
    return pd.DataFrame(rows)


def leave_one_r_out(runs: pd.DataFrame, restarts: int = 500, seed: int = 0) -> pd.DataFrame:
    """The joint law refitted without each looped r in turn (and with all runs, first row): phi,
    R^2 and residual RMSE.  If dropping one architecture brings the fit close to the targets,
    the misfit is that architecture's; if every row stays short, the shared exponents of the law
    are what the runs disagree with."""
    rows = []
    for drop in [None] + sorted(int(r) for r in runs["r"].unique() if r > 1):
        sub = runs if drop is None else runs[runs["r"] != drop].reset_index(drop=True)
        res = fit(sub, restarts=restarts, seed=seed)
        rows.append({"fit": "all runs" if drop is None else f"without r = {drop}", "runs": len(sub), "phi": res.phi,
                     "r2": res.r2, "rmse": float(np.sqrt(np.mean(residuals(res, sub) ** 2)))})
    return pd.DataFrame(rows)
