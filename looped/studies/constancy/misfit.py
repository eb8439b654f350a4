"""`looped misfit`: where the law misses our runs, and what that leaves of phi.

ladder: the law and freer models, up to a free level for every (budget, r) cell, each fitted by
the one solver (`looped.fit`, `law_variants.fit_multi`) to the main runs, with its residual SD
against the book's pure error (`replicates.pure_error`): the lack-of-fit F on (n - p, df_pe), and
the share of the law's excess sum of squares (above the pure error) each model removes.
anchors: phi with the plain r = 1 anchor (the paper's construction: plain r = 1 runs beside
linear-injection looped runs), with one free level for the looped runs, and, at the budgets of
the linear r = 1 controls, with those controls in place of the plain r = 1 runs.
conventions: phi on the paper's 24 published minima and on our runs, the LM head uncounted and
counted in N_once, each fitted the same way on both sides.
`python -m looped.studies.constancy.misfit --out runs/analysis/FAMILY/misfit.json`.  Numbers only.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from ...config import model_config, repo_relative
from ...fit import FitError, fit, load_runs, validate_runs
from ...io import atomic_write_json, json_numbers, json_ready, json_table
from ...solver import RunArrays, law_loss
from ..paper import PAPER_DIR, runs_from_minima
from ..sweep.registry import DEFAULT_FAMILY, add_family_options, analysis_file, family_defaults, holds_records
from ..sweep.replicates import pure_error
from .analysis import cell_position, count_embeddings
from .variants import NAN2, fit_multi, fit_residuals, onehot

LADDER = ("law", "kappa_r_phi", "looped_level", "per_r_phi", "per_budget_phi", "per_r_level", "per_r_laws",
          "cell_levels")
# boot_restarts None: `looped.fit`'s literal protocol, as `looped constancy` fits the same runs (the same intervals)
FULL = dict(restarts=500, multi_restarts=200, bootstrap=200, boot_restarts=None, multi_boot_restarts=8)
QUICK = dict(restarts=40, multi_restarts=12, bootstrap=12, boot_restarts=2, multi_boot_restarts=2)
MINIMA_BOOT_RESTARTS = 10   # the paper's minima resampled as chapter 3 fits them (warm starts), so it is that fit


def read_results(path=None, family: str = DEFAULT_FAMILY) -> dict:
    """The results of `looped misfit` in `path` (default: the family's committed ones): ladder, anchors,
    conventions and roles as DataFrames; pure_error, settings and additive_anchor (its points a DataFrame)
    as dicts."""
    raw = json.loads(Path(path or analysis_file("misfit", family)).read_text())
    out = {k: json_table(raw[k]) for k in ("ladder", "anchors", "conventions", "roles")}
    additive = raw.get("additive_anchor", {"n": 0})   # (results written before it was measured: none)
    if "points" in additive:
        additive = dict(additive, points=pd.DataFrame(additive["points"]))
    return dict(out, pure_error=json_numbers(raw["pure_error"]), settings=raw["settings"], additive_anchor=additive)


def _levels(mask, names) -> dict:
    """{name: indicator column}: one free log-loss level per name (mask: (n, k) booleans)."""
    return {n: np.asarray(mask[:, i], float) for i, n in enumerate(names)}


def _multi_resid(df, X, levels, m, kappa=False) -> np.ndarray:
    """Observed - predicted loss (nats) of a `fit_multi` result."""
    S = np.column_stack(list(levels.values())) if levels else None
    d = RunArrays.from_frame(df).design(X, kappa, S)
    return d.loss - law_loss(m.theta, d)


def ladder(df, pe: dict, restarts=500, multi_restarts=200, seed=0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per model of LADDER: model, n_params, ss (nats^2), resid_sd = sqrt(ss / (n - p)),
    rmse, F = resid_sd^2 / pure error^2, df1, df2, p_value, excess_share (the share of the law's
    excess ss, ss - df1 pe^2, that the model removes), phi (NaN where several).  And the mean
    residual by role in its cell (narrowest, interior, widest) under the law and the cell levels."""
    df = validate_runs(df, need=("budget", "s"))
    ones, kw = np.ones((len(df), 1)), dict(restarts=multi_restarts, seed=seed)
    r, looped = df["r"].to_numpy(float), df["r"].to_numpy(float) > 1
    e, phi, n_params = {}, {}, {}

    def add(name, resid, value, p):
        e[name], phi[name], n_params[name] = resid, value, p

    def multi(name, X, levels=None, kappa=False, label="phi"):
        m = fit_multi(df, X, [label] if X.shape[1] == 1 else [f"phi_{i}" for i in range(X.shape[1])], kappa=kappa,
                      levels=levels, **kw)
        add(name, _multi_resid(df, X, levels or {}, m, kappa), m.params.get("phi", math.nan),
            5 + X.shape[1] + kappa + len(levels or {}))

    law = fit(df, restarts=restarts, seed=seed)
    add("law", fit_residuals(law, df), law.phi, 6)
    multi("kappa_r_phi", ones, kappa=True)
    multi("looped_level", ones, {"looped": looped.astype(float)})
    for name, col in (("per_r_phi", "r"), ("per_budget_phi", "budget")):
        multi(name, onehot(df[col], sorted(set(df.loc[looped, col])))[0])
    R, rs = onehot(r, sorted(set(r[looped])))
    multi("per_r_level", ones, _levels(R > 0, [f"level_r{v:g}" for v in rs]))
    sep = fit(df, restarts=restarts, seed=seed, per_r=True)
    e_sep = np.zeros(len(df))
    for v, f in sep.per_r.items():
        rows = np.flatnonzero(r == float(v))
        e_sep[rows] = df["loss"].to_numpy(float)[rows] - f.predict(df.iloc[rows])
    add("per_r_laws", e_sep, math.nan, 5 * len(sep.per_r))
    C, names = onehot(df.groupby(["budget", "r"], sort=True).ngroup())
    multi("cell_levels", ones, _levels(C[:, 1:] > 0, [f"cell_{int(c)}" for c in names[1:]]))   # cell 0's level: E's
    n, s2 = len(df), pe["seed_sd"] ** 2
    rows = []
    for name in LADDER:
        ss, p = float(e[name] @ e[name]), n_params[name]
        F = ss / (n - p) / s2
        rows.append(dict(model=name, n_params=p, ss=ss, resid_sd=math.sqrt(ss / (n - p)), rmse=math.sqrt(ss / n),
                         F=F, df1=n - p, df2=pe["df_pe"], p_value=float(stats.f.sf(F, n - p, pe["df_pe"])),
                         phi=phi[name]))
    out = pd.DataFrame(rows)
    excess = out["ss"] - out["df1"] * s2
    out["excess_share"] = 1 - excess / excess.iloc[0]
    pos, size = cell_position(df)
    role = np.where(pos == 0, "narrowest", np.where(pos == size - 1, "widest", "interior"))
    roles = []
    for name in ("law", "cell_levels"):
        g = pd.Series(e[name]).groupby(role)
        roles += [dict(model=name, role=k, n=int(v.size), mean=float(v.mean()),
                       se=float(v.std(ddof=1) / math.sqrt(v.size))) for k, v in g]
    return out, pd.DataFrame(roles)


def anchors(df, controls=None, restarts=500, multi_restarts=200, bootstrap=200, boot_restarts=None,
            multi_boot_restarts=8, seed=0):
    """phi under each r = 1 anchor, one row per (design, anchor): design 'main' (every main run) or
    'controls' (the main runs at the budgets of the linear r = 1 controls); anchor 'plain' (the
    paper's construction), 'looped_level' (one free log-loss level for the r > 1 runs) or 'linear'
    (the linear r = 1 controls in place of the plain r = 1 runs).  Columns: design, anchor, n_runs,
    phi, phi_lo, phi_hi (95% cell bootstrap), level, level_lo, level_hi (log-loss), rmse."""
    df = validate_runs(df, need=("budget", "s"))
    designs = {"main": df}
    if controls is not None and len(controls):
        ctl = validate_runs(controls, need=("budget", "s"))
        ctl = ctl[(ctl["r"] == 1) & (ctl["injection"].astype(str) == "linear")]
        sub = df[df["budget"].isin(set(ctl["budget"]))].reset_index(drop=True)
        designs["controls"] = sub
        linear = pd.concat([sub[sub["r"] > 1], ctl], ignore_index=True)
    rows = []
    for design, runs in designs.items():
        if design == "controls" and len(runs) == len(df):   # controls at every budget: the main fits again
            rows += [dict(row, design=design) for row in rows if row["design"] == "main"]
        else:
            kw = dict(restarts=multi_restarts, seed=seed, bootstrap=bootstrap, boot_restarts=multi_boot_restarts)
            plain = fit(runs, restarts=restarts, seed=seed, bootstrap=bootstrap, boot_restarts=boot_restarts)
            rows.append(dict(design=design, anchor="plain", n_runs=len(runs), phi=plain.phi,
                             **dict(zip(("phi_lo", "phi_hi"), plain.ci.get("phi", NAN2))),
                             rmse=float(np.sqrt(np.mean(fit_residuals(plain, runs) ** 2)))))
            lv = {"looped": (runs["r"].to_numpy(float) > 1).astype(float)}
            m = fit_multi(runs, np.ones((len(runs), 1)), ["phi"], levels=lv, **kw)
            rows.append(dict(design=design, anchor="looped_level", **m.row("phi"),
                             level=m.params["looped"],
                             **dict(zip(("level_lo", "level_hi"), m.ci.get("looped", NAN2)))))
        if design == "controls":
            lin = fit(linear, restarts=restarts, seed=seed, bootstrap=bootstrap, boot_restarts=boot_restarts)
            rows.append(dict(design=design, anchor="linear", n_runs=len(linear), phi=lin.phi,
                             **dict(zip(("phi_lo", "phi_hi"), lin.ci.get("phi", NAN2))),
                             rmse=float(np.sqrt(np.mean(fit_residuals(lin, linear) ** 2)))))
    cols = ["design", "anchor", "n_runs", "phi", "phi_lo", "phi_hi", "level", "level_lo", "level_hi", "rmse"]
    return pd.DataFrame(rows).reindex(columns=cols)


def injection_cost(df, controls) -> pd.DataFrame:
    """What the linear injection costs at r = 1: each linear r = 1 control against the plain r = 1
    main run of its (budget, s).  Columns: budget, s, d_model, cost (nats, linear minus plain); no rows
    until such controls exist."""
    if controls is None or not len(controls):
        return pd.DataFrame(columns=["budget", "s", "d_model", "cost"], dtype=float)
    df, ctl = validate_runs(df, need=("budget", "s")), validate_runs(controls, need=("budget", "s"))
    ctl = ctl[(ctl["r"] == 1) & (ctl["injection"].astype(str) == "linear")]
    both = ctl.merge(df[df["r"] == 1], on=["budget", "s"], suffixes=("_lin", "_plain"))
    return pd.DataFrame({"budget": both["budget"], "s": both["s"], "d_model": both["d_model_lin"],
                         "cost": both["loss_lin"] - both["loss_plain"]})


def additive_anchor(df, controls, additive) -> dict:
    """Which r = 1 model anchors the looped runs: at each (budget, s) with all four runs, the additive
    injection against the linear one at r = 8 (additive runs vs the main runs) and at r = 1 (additive
    runs vs the linear controls).  If the two injections differ by as much at r = 1 as at r = 8, the
    difference in differences is zero and the linear r = 1 control is as good an anchor as the
    additive one.  Each contrast: mean (nats, additive minus linear), its SE, t and points; the
    per-point table is ``points``.  Empty (n 0) until such runs exist."""
    cols = ["budget", "s"]
    pick = lambda t, r, inj: t[(t["r"] == r) & (t["injection"].astype(str) == inj)][cols + ["loss"]]  # noqa: E731
    tables = [validate_runs(t, need=cols) if t is not None and len(t) else None for t in (df, controls, additive)]
    if any(t is None for t in tables):
        return dict(n=0)
    df, ctl, add = tables
    parts = {"lin1": pick(ctl, 1, "linear"), "add1": pick(add, 1, "additive"), "lin8": pick(df, 8, "linear"),
             "add8": pick(add, 8, "additive")}
    points = None
    for name, t in parts.items():
        t = t.groupby(cols, as_index=False)["loss"].mean().rename(columns={"loss": name})
        points = t if points is None else points.merge(t, on=cols)
    if points is None or not len(points):
        return dict(n=0)
    points = points.assign(at_r1=points.add1 - points.lin1, at_r8=points.add8 - points.lin8)
    points = points.assign(did=points.at_r8 - points.at_r1)

    def contrast(d):
        n = len(d)
        se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
        return dict(mean=float(d.mean()), se=se, t=float(d.mean()) / se if n > 1 else math.nan, n=n)
    return dict(n=len(points), at_r1=contrast(points.at_r1), at_r8=contrast(points.at_r8),
                difference=contrast(points.did), points=points)


def paper_minima(head: bool = False) -> pd.DataFrame:
    """The paper's 24 published minima as runs (`runs_from_minima`), the LM head (padded
    vocabulary x width) counted in N_once with `head`."""
    runs = runs_from_minima(PAPER_DIR / "compute_optimal_minima.csv")
    if not head:
        return runs
    vocab = model_config("paper", r=1, s=1).padded_vocab
    return runs.assign(n_once=runs["n_once"] + vocab * runs["d_model"])


def conventions(df, restarts=500, bootstrap=200, boot_restarts=None, seed=0) -> pd.DataFrame:
    """phi with the LM head uncounted and counted, on the paper's 24 minima and on our runs, each
    side fitted the same way (the minima's bootstrap resamples its 24 points, with warm starts as
    chapter 3 does, at most MINIMA_BOOT_RESTARTS random ones; ours its cells, as `looped constancy`).
    Columns: data ('paper_minima', 'ours'), head (bool), phi, phi_lo, phi_hi, n_runs."""
    rows = []
    for data, head in (("paper_minima", False), ("paper_minima", True), ("ours", False), ("ours", True)):
        runs = paper_minima(head) if data == "paper_minima" else count_embeddings(df) if head else df
        br = boot_restarts if data == "ours" else min(boot_restarts or MINIMA_BOOT_RESTARTS, MINIMA_BOOT_RESTARTS)
        res = fit(runs.reset_index(drop=True), restarts=restarts, seed=seed, bootstrap=bootstrap, boot_restarts=br)
        lo, hi = res.ci.get("phi", NAN2)
        rows.append(dict(data=data, head=head, phi=res.phi, phi_lo=lo, phi_hi=hi, n_runs=len(runs)))
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="looped misfit", description="Where the law misses our runs; phi's anchor "
                                 "and counting conventions.")
    add_family_options(ap, "runs", "seeds", "controls", "additive")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--quick", action="store_true", help="few restarts and resamples (CI)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fits and resamples (default 0)")
    a = ap.parse_args(argv)
    family_defaults(a, "runs", "seeds", "controls", "additive")
    s, t0 = dict(QUICK if a.quick else FULL), time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            main = load_runs(a.runs)
            seeds = [load_runs(p) for p in a.seeds if holds_records(p)]
            ctl, add = (load_runs(p) if holds_records(p) else None for p in (a.controls, a.additive))
        pe = pure_error(validate_runs(main, need=("budget",)), *seeds)
        lad, roles = ladder(main, pe, s["restarts"], s["multi_restarts"], a.seed)
        print(f"looped misfit: ladder done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        anc = anchors(main, ctl, seed=a.seed, **s)
        print(f"looped misfit: anchors done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        conv = conventions(main, s["restarts"], s["bootstrap"], s["boot_restarts"], a.seed)
        additive = additive_anchor(main, ctl, add)
    except FitError as e:
        print(f"looped misfit: error: {e}", file=sys.stderr)
        return 2
    out = dict(ladder=lad, roles=roles, anchors=anc, additive_anchor=additive, conventions=conv, pure_error=pe,
               settings=dict(s, quick=a.quick, seed=a.seed, family=a.family, runs=repo_relative(a.runs),
                             seeds=[repo_relative(p) for p in a.seeds if holds_records(p)],
                             controls=repo_relative(a.controls), additive=repo_relative(a.additive),
                             seconds=time.perf_counter() - t0))
    atomic_write_json(a.out, json_ready(out), allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
