"""Is a study in the law's regime?  The checks a new grid must pass before its sweep starts.

A scaling-law fit only means something where the runs behave like the paper's: every iso-FLOP
curve has its minimum strictly inside the widths trained, the compute-optimal model sees a
sensible number of tokens per parameter (the paper's minima sit at roughly 8-24; Section 4),
the models are far from the token-frequency floor (the unigram entropy), the learning rate
transferred by HyperP is close to the best one at the reference width, and the fit's residuals
are compared with the loss spread that seeds alone produce.  These functions read the pilot,
LR-sweep and seed-noise studies (`looped sweep prose-pilot`, `prose-lr`, `prose-seeds`) and
return one small table per question; the sweep chapter of the book shows them.  `grid_shape` and
`study_cost` size a grid before it runs.  The scorecard of the finished study is in
`looped.studies.phi.targets`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .cost import cpu_estimate
from .iso_flop import iso_flop_cells
from .replicates import spread
from .study import Study


def pilot_optima(study: str = "prose-pilot", runs_dir=None, tokens_per_param=(10.0, 40.0)) -> pd.DataFrame:
    """Per (budget, r) cell of a pilot: the iso-FLOP vertex (unique params N*, d_model of the
    nearest trained width, tokens per unique parameter) and whether it is bracketed by the
    widths trained and, for r = 1, inside the `tokens_per_param` window (a looped model shares
    its parameters, so at equal compute it sees more tokens per unique parameter: the window is
    a criterion for the plain model only)."""
    table = Study(study, runs_dir).table()
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


def lr_sweep(study: str = "prose-lr", runs_dir=None, tolerance: float = 0.01, by=("r",)) -> pd.DataFrame:
    """Per r (or per configuration, ``by=("budget", "r", "s")``): the final loss at each multiplier
    of HyperP's transferred learning rates, the best multiplier, whether multiplier 1 (the transfer
    as the paper states it) is within `tolerance` nats of the best, and the gap at the study
    preset's default multiplier (`Preset.lr_scale`, which an LR sweep that finds the transfer off
    re-bases)."""
    handle = Study(study, runs_dir)
    default = handle.preset.lr_scale if handle.preset else 1.0
    rec = handle.records(ok=True)
    rows = []
    for key, g in rec.groupby(list(by), sort=True):
        key = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        by_lr = g.groupby("lr_scale").loss.mean().sort_index()
        best = float(by_lr.idxmin())
        at_one = float(by_lr.get(1.0, np.nan))
        rows.append(dict(**{k: int(v) if k in ("r", "s") else v for k, v in key.items()},
                         **{f"lr x{m:g}": v for m, v in by_lr.items()}, best_multiplier=best,
                         gap_at_1=at_one - float(by_lr.min()), transfer_ok=bool(at_one - by_lr.min() <= tolerance),
                         preset_multiplier=default,
                         gap_at_preset=float(by_lr.get(default, np.nan)) - float(by_lr.min())))
    return pd.DataFrame(rows)


def seed_spread(study: str = "prose-seeds", runs_dir=None) -> pd.DataFrame:
    """Per configuration (budget, r, s): the final losses of its seeds, their standard deviation
    and range (`replicates.spread`): the noise floor that a fit's residuals cannot go below."""
    rec = Study(study, runs_dir).records(ok=True)
    return spread(rec, ["budget", "r", "s"]).drop(columns="ss").astype({"r": int}) if len(rec) else pd.DataFrame()


def batch_comparison(study: str = "prose-batch", runs_dir=None) -> pd.DataFrame:
    """Final loss per (budget, r, width) at each batch size the study trained, side by side, and
    each larger batch's loss minus the smallest batch's: how much the tokens per step move the
    loss, and whether every width alike (if not, they move the iso-FLOP optimum too).  The
    learning rates follow HyperP's batch rule, so this compares the recipes a user would get."""
    keys = ["budget", "r", "s", "d_model"]
    rec = Study(study, runs_dir).records(ok=True)
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
    for run in Study(study).runs:
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
    core): `cost.cpu_estimate`, i.e. wall time fitted to the finished fast-path runs of the
    `timing_from` studies (the design runs by default, so the estimate does not drift while the
    study itself runs; None: the study's own runs once it has some), for the whole study and for
    the runs not yet recorded."""
    sources = None if timing_from is None else [Study(name).folder for name in timing_from]
    rows = []
    for study in map(Study, studies):
        est = cpu_estimate(list(study.runs), study.folder, peak_flops=float("nan"), processes=processes,
                           timing_from=sources)
        rows.append({"study": study.name, "runs": len(study.runs), "flops": est["flops"],
                     f"hours_on_{processes}_processes": est["hours_wall_all"], "to_do": est["todo"],
                     "hours_left": est["hours_wall"], "timed_from": est["basis"]})
    return pd.DataFrame(rows)
