"""Is r^phi the right shape?  The law's four mappings of r (`looped.mapping`: power, linear, bounded,
free) fitted to every run set we have and scored on loop counts they never saw.

Per run set (`run_sets`): every mapping fitted to all its runs (`in_sample`: RMSE, AICc and BIC of the
log-loss residuals, parameters counted; `phi_equivalent`: the phi with r^phi = m(r) per r, 95% cell-
bootstrap percentiles), and, where it has three looped r or more, held-out-r splits (`splits`: each
r > 1 left out in turn, and r <= r_max / 2 extrapolated to the rest).  A split is scored by the RMSE of
log loss (what the fit's Huber objective measures) on the held-out runs, with 95% intervals on each
mapping's score and on the power law's score minus it (> 0: the mapping predicts better), all from the
same resamples: the fit's cell bootstrap of the training runs (one seed, so every mapping sees the same
draws) with the held-out cells resampled beside it.  The free mapping cannot price an r it never saw;
its held-out row is the floor of any mapping ('oracle'): the held-out r's own phi fitted to the held-out
runs, the rest of the law from the free fit of the training runs.  Every fit is `looped.fit.fit`.
`run_all`; `looped shape --out runs/analysis/FAMILY/shape.json`.  Numbers only.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import REPO
from ..fit import FitError, at_bounds, fit
from ..io import atomic_write_json, json_ready
from ..mapping import MAPPINGS, Mapping
from ..resample import cell_resample, cells
from ..solver import RunArrays, law_loss, solve_restarts
from .case_studies.protocol import case_study_runs
from .external.runs import BATCH_TOKENS, DATA, GRID_STEPS, grid_runs, ladder_runs
from .paper import PAPER_DIR, PAPER_LAW, runs_from_minima
from .sweep.registry import CASE_STUDIES, DEFAULT_FAMILY, FAMILIES, add_family_options, analysis_file
from .sweep.study import Study

FULL = dict(restarts=500, bootstrap=200, boot_restarts=4, oracle_restarts=16)
QUICK = dict(restarts=40, bootstrap=12, boot_restarts=2, oracle_restarts=4)
PRICED = ("power", "linear", "bounded")        # the mappings that price an r they never saw
EXTERNAL = ("qlabs-grid", "qlabs-ladders", "paper-minima")   # the run sets that are not ours


def family_sets(family: str = "cpu") -> tuple:
    """A CPU family's run sets: its main study, its two case studies (their matched-token control is
    not an arm), and the sets that are not ours."""
    main = FAMILIES[family]["main"]
    return (main, *CASE_STUDIES[main], *EXTERNAL)


SETS = family_sets("cpu")
ARMS = {arm: main for main in (f["main"] for f in FAMILIES.values()) for arm in CASE_STUDIES[main]}   # arm -> main
GRID_POOL_TOKENS = 100e6                       # the grid's token pool (their README)
HELD_FIX = {"B": PAPER_LAW.B, "beta": PAPER_LAW.beta}    # one D for every grid run: the data term is a constant


# ----------------------------------------------------------------------------- the run sets

def _pool(df) -> float:
    """Training tokens of the runs' one dataset (its committed manifest under runs/, by name), or NaN."""
    names = set(df["dataset"].dropna()) if "dataset" in df.columns else set()
    for path in sorted((REPO / "runs").glob("*.json")) if len(names) == 1 else ():
        meta = json.loads(path.read_text())
        if meta.get("name") in names and "splits" in meta:
            return float(meta["splits"]["train"]["tokens"])
    return math.nan


def run_sets(names=SETS, external=DATA) -> dict:
    """name -> dict(runs, fix, design, pool): the runs table, the parameters held (the grid's data term),
    'iso-depth' or 'iso-parameter' (r at fixed unique parameters), and the token pool (NaN: not known
    or not repeated).  The case-study arms are the main study's r = 1 runs with the arm's r > 1
    (`case_study_runs`); the ladders are the two-loop arm and its untied copies; the paper's minima are
    its 24 iso-FLOP minima as runs (`runs_from_minima`)."""
    out = {}
    mains = {ARMS.get(n, n) for n in names if n in ARMS or n in CASE_STUDIES}   # each arm needs its main study
    main = {m: Study(m).fit_table() for m in mains}
    for name in names:
        if name in main:
            df, fix, design = main[name], None, "iso-depth"
        elif name in ARMS:
            df, fix, design = case_study_runs(main[ARMS[name]], Study(name).folder)[1], None, "iso-depth"
        elif name == "qlabs-grid":
            df, fix, design = grid_runs(external), HELD_FIX, "iso-parameter"
        elif name == "qlabs-ladders":
            lad = ladder_runs(external)
            df, fix, design = lad[lad.arm.isin(["loop_2", "untied_2"])], None, "iso-depth"
        elif name == "paper-minima":
            df, fix, design = runs_from_minima(PAPER_DIR / "compute_optimal_minima.csv"), None, "iso-depth"
        else:
            known = (*(f["main"] for f in FAMILIES.values()), *ARMS, *EXTERNAL)
            raise FitError(f"unknown run set {name!r}: choose from {', '.join(known)}")
        if df is None or not len(df):
            continue
        df = df.sort_values(["budget", "r", "n_once", "n_rec"], kind="stable").reset_index(drop=True)
        pool = GRID_POOL_TOKENS if name == "qlabs-grid" else _pool(df)
        out[name] = dict(runs=df, fix=fix, design=design, pool=pool)
    return out


def regime(name: str, s: dict) -> dict:
    """The numbers that place a run set: design, runs, r, budgets, tokens per unique non-embedding
    parameter, and passes over the token pool of its longest run (NaN where the pool is not known)."""
    df = s["runs"]
    tpp = df.tokens / (df.n_once + df.n_rec)
    return dict(set=name, design=s["design"], n_runs=len(df), r_levels=sorted(map(float, df.r.unique())),
                n_budgets=int(df.budget.nunique()), tokens_per_param_min=float(tpp.min()),
                tokens_per_param_max=float(tpp.max()), epochs=float(df.tokens.max() / s["pool"]),
                tokens_max=float(df.tokens.max()))


def splits(r_values) -> list[tuple[str, tuple, bool]]:
    """(label, held-out r, whether it is the extrapolation) of a run set with three looped r or more: each
    r > 1 left out in turn, and the extrapolation, the r above r_max / 2 held out together (the largest
    r's own split when it is the only one above)."""
    looped = sorted({float(r) for r in r_values if r > 1})
    if len(looped) < 3:
        return []
    far = tuple(r for r in looped if r > looped[-1] / 2)
    out = [(f"r = {r:g}", (r,), (r,) == far) for r in looped]
    return out + [(f"r >= {far[0]:g}", far, True)] * (len(far) > 1)


# ----------------------------------------------------------------------------- scores

def _rmse(e, w=None) -> np.ndarray:
    """RMSE of the last axis of e, weighted by w (multiplicities)."""
    w = np.ones(e.shape[-1]) if w is None else w
    return np.sqrt((w * e * e).sum(-1) / w.sum(-1))


def log_errors(res, df, thetas=None) -> np.ndarray:
    """log observed - log predicted loss of every run of df (rows: the fit, or each of `thetas`)."""
    if thetas is None:
        return np.log(df.loss.to_numpy(float)) - np.log(res.predict(df))
    return np.stack([np.log(df.loss.to_numpy(float)) - np.log(res.predict(df, th)) for th in thetas])


def oracle(res, test, V, restarts: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The floor of any mapping on the held-out runs: each held-out r's phi fitted to them (weighted by
    each resample's V), A, alpha, B, beta, E held at the training fit's (and its resamples').  One
    batched solve; returns (log errors of the full fit, (B,) resampled RMSEs) and the held-out phis."""
    mp = Mapping.of("free", test.r)
    data = mp.design(RunArrays.from_frame(test))
    lo, hi = mp.box()
    five = np.vstack([np.asarray(res.theta[:5])[None, :], res.boot_theta[:, :5]])      # (1 + B, 5)
    rng = np.random.default_rng(seed)
    starts = np.repeat(np.c_[five, np.zeros((len(five), len(mp.names)))], restarts, axis=0)
    starts[:, 5:] = rng.uniform(lo[5:], hi[5:], size=(len(starts), len(mp.names)))
    weights = np.repeat(np.vstack([np.ones(len(test)), V]), restarts, axis=0)
    group = np.repeat(np.arange(len(five)), restarts)
    free = np.r_[np.zeros(5, bool), np.ones(len(mp.names), bool)]
    sols = solve_restarts(data, starts, free, weights, group, len(five), polish=1, lo=lo, hi=hi)
    e = np.stack([data.logL - np.log(law_loss(th, data)) for th, _, _ in sols])
    return e[0], _rmse(e[1:], V), np.array(sols[0][0][5:])


def heldout(df, held, s: dict, fix=None, seed: int = 0, index: int = 0) -> tuple[list, list]:
    """One split: every mapping fitted to the runs at other r (the fit's cell bootstrap), scored on the
    runs at `held`.  Returns (score rows, rows of the phi-equivalent each mapping gives the held-out r)."""
    is_test = df.r.isin(held).to_numpy()
    train, test = df[~is_test].reset_index(drop=True), df[is_test].reset_index(drop=True)
    V = cell_resample(cells(test), np.random.default_rng([seed, 49, index]), s["bootstrap"])
    kw = dict(restarts=s["restarts"], seed=seed, fix=fix, bootstrap=s["bootstrap"], boot_restarts=s["boot_restarts"])
    scores, phis, free_fit = {}, [], None
    for m in (*PRICED, "free"):
        res = fit(train, mapping=m, **kw)
        if m == "free":
            free_fit = res
            continue
        e = log_errors(res, test)
        scores[m] = (e, _rmse(log_errors(res, test, res.boot_theta), V),
                     float(np.sqrt(np.mean((test.loss - res.predict(test)) ** 2))))
        phis += [dict(mapping=m, r=r, phi=float(res.phi_equivalent(r))) for r in held]
    e, boot, c = oracle(free_fit, test, V, s["oracle_restarts"], seed)
    pred = np.exp(np.log(test.loss.to_numpy(float)) - e)
    scores["free"] = (e, boot, float(np.sqrt(np.mean((test.loss - pred) ** 2))))
    phis += [dict(mapping="free", r=r, phi=float(v)) for r, v in zip(sorted(held), c)]
    base = scores["power"][1]
    rows = []
    for m, (e, boot, nats) in scores.items():
        d = base - boot
        rows.append(dict(mapping=m, n_train=len(train), n_test=len(test), rmse=float(_rmse(e)),
                         rmse_lo=float(np.percentile(boot, 2.5)), rmse_hi=float(np.percentile(boot, 97.5)),
                         rmse_nats=nats, gain=float(_rmse(scores["power"][0]) - _rmse(e)),
                         gain_lo=float(np.percentile(d, 2.5)), gain_hi=float(np.percentile(d, 97.5)),
                         p_better=float(np.mean(d > 0))))
    return rows, phis


def in_sample(df, s: dict, fix=None, seed: int = 0) -> tuple[list, list]:
    """Every mapping fitted to all the runs: (fit rows: k free parameters, RMSE of log loss and in nats,
    AICc and BIC of the log residuals, parameters, those on the box's edge; phi-equivalent rows per r)."""
    rows, phis = [], []
    n, levels = len(df), sorted(float(r) for r in df.r.unique() if r > 1)
    for m in MAPPINGS:
        res = fit(df, mapping=m, restarts=s["restarts"], seed=seed, fix=fix, bootstrap=s["bootstrap"],
                  boot_restarts=s["boot_restarts"])
        e, k = log_errors(res, df), len(res.free)
        ll = n * math.log(float(e @ e) / n)
        rows.append(dict(mapping=m, n_runs=n, k=k, rmse=float(_rmse(e)),
                         rmse_nats=float(np.sqrt(np.mean((df.loss - res.predict(df)) ** 2))), huber=res.huber,
                         aicc=ll + 2 * k + 2 * k * (k + 1) / max(n - k - 1, 1), bic=ll + k * math.log(n),
                         params=dict(res.mapping_params), at_bounds=at_bounds(res)))
        mp = res.mapping_of()
        for r in levels:
            boot = (res.boot_samples[:, 5 + mp.levels.index(r)] if m == "free"   # NaN where r was not drawn
                    else np.array([mp.phi_equivalent(r, th[5:]) for th in res.boot_theta]))
            boot = boot[np.isfinite(boot)]
            phis.append(dict(mapping=m, r=r, phi=float(res.phi_equivalent(r)),
                             lo=float(np.percentile(boot, 2.5)), hi=float(np.percentile(boot, 97.5))))
    return rows, phis


# ----------------------------------------------------------------------------- all of it

def run_all(settings=None, names=SETS, seed: int = 0, external=DATA, log=None) -> dict:
    """Every run set's regime, in-sample fits, phi-equivalents and held-out splits (tables of rows)."""
    s = dict(FULL if settings is None else settings)
    tables = {k: [] for k in ("regime", "in_sample", "phi_equivalent", "heldout", "heldout_phi")}
    seconds = {}
    for name, rs in run_sets(names, external).items():
        t0 = time.perf_counter()
        df, fix = rs["runs"], rs["fix"]
        tables["regime"].append(regime(name, rs))
        fits, phis = in_sample(df, s, fix, seed)
        tables["in_sample"] += [dict(set=name, **row) for row in fits]
        tables["phi_equivalent"] += [dict(set=name, **row) for row in phis]
        for i, (label, held, extrapolation) in enumerate(splits(df.r)):
            rows, phis = heldout(df, held, s, fix, seed, i)
            tables["heldout"] += [dict(set=name, split=label, held=list(held), extrapolation=extrapolation, **row)
                                  for row in rows]
            tables["heldout_phi"] += [dict(set=name, split=label, **row) for row in phis]
        seconds[name] = time.perf_counter() - t0
        if log:
            log(f"looped shape: {name} done ({seconds[name]:.0f} s)")
    return {**{k: pd.DataFrame(v) for k, v in tables.items()}, "seconds": seconds, "settings": s,
            "paper": {"phi": PAPER_LAW.phi}, "grid": {"steps": GRID_STEPS, "batch_tokens": BATCH_TOKENS}}


def read_results(path=None, family: str = DEFAULT_FAMILY) -> dict:
    """The results of `looped shape` in `path` (default: the family's committed ones): every table as a
    DataFrame, the rest as written."""
    raw = json.loads(Path(path or analysis_file("shape", family)).read_text())
    return {k: pd.DataFrame(v) if isinstance(v, list) else v for k, v in raw.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="looped shape", description="Is r^phi the right shape? Held-out-r tests "
                                 "of the power, linear, bounded and free mappings on every run set.")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--quick", action="store_true", help="few restarts and resamples (CI)")
    add_family_options(ap)   # whose runs
    ap.add_argument("--sets", nargs="*", help=f"run sets (default: the family's and the others: {', '.join(SETS)})")
    ap.add_argument("--external", default=str(DATA), help="folder of the qlabs tables")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fits and resamples (default 0)")
    a = ap.parse_args(argv)
    a.sets = list(family_sets(a.family)) if a.sets is None else a.sets
    t0 = time.perf_counter()
    try:
        out = run_all(QUICK if a.quick else FULL, a.sets, a.seed, a.external,
                      log=lambda m: print(m, file=sys.stderr, flush=True))
    except FitError as e:
        print(f"looped shape: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    out["settings"] = dict(out["settings"], quick=a.quick, seed=a.seed, family=a.family, sets=a.sets,
                           total_seconds=time.perf_counter() - t0)
    atomic_write_json(a.out, json_ready(out), allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
