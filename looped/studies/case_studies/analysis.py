"""`looped case-studies`: the paired estimators of `looped.studies.case_studies.paired` on our case studies, checked by
simulation on our design, written to runs/analysis/FAMILY/case_studies.json for chapters 5 and 6.

The simulation draws both arms from the main fit's law with a known dphi, adds the main fit's real
log residuals at each (budget, r, s) (shared by a variant run and its baseline twin, as the law's
misfit is) and seed noise at the book's pure error (`replicates.pure_error`: the main fit's
design points, every replicate study), and refits every estimator: bias, SD and coverage of its
95% interval (for hyperconnections also the headline model, one offset per width).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from ...fit import FitError, FitResult, validate_runs
from ...io import atomic_write_json, json_ready
from ...law import synthetic_losses
from ...solver import HUBER_DELTA
from ..sweep.registry import DEFAULT_FAMILY, FAMILIES, add_family_options, analysis_file
from ..sweep.replicates import pure_error, replicate_tables
from .paired import (
    load_arms,
    main_law,
    main_of,
    paired_difference,
    paired_estimate,
    paired_gains,
    pairs,
    paper_protocol,
    run_key,
    same_runs,
    token_term_check,
)

STUDIES = ("truncated_matched", "truncated", "hyper")   # matched first: truncation's headline
QUICK = dict(restarts=20, bootstrap=40, boot_restarts=2, n_reps=4, sim_bootstrap=30)
FULL = dict(restarts=100, bootstrap=1000, boot_restarts=5, n_reps=100, sim_bootstrap=200)

ESTIMATORS = ("paper", "paired", "paired_offset")
# The hyperconnection models: (offset, r = 1 anchor).  The offset is what the variant changes at
# every r alike; the r = 1 controls measure it, as one number or one per width, against the
# linear-injection r = 1 model (the baseline's own injection) or the plain r = 1 model.
HYPER_MODELS = {"none_linear": (False, "linear"), "constant_linear": (True, "linear"),
                "width_linear": ("width", "linear"), "constant_plain": (True, "plain"),
                "width_plain": ("width", "plain")}
# The estimate each case study's verdict reads (study, estimator), and why: truncation at matched
# tokens (the variant differs from its twin only in what backprop sees), hyperconnections with
# one offset per width pinned by the r = 1 controls (the model that fits the pairs to their noise).
HEADLINE = {"truncated": ("truncated_matched", "paired"), "hyper": ("hyper", "width_linear")}


def read_results(path=None, family: str = DEFAULT_FAMILY) -> dict:
    """The results of `looped case-studies` in `path` (default: the family's committed ones), per case
    study: its estimates of dphi (one row per estimator, and the offset), its paired gains by r (variant
    minus baseline log-loss), the simulation of the estimators at the headline dphi, the hyperconnection
    models (one row each: dphi, interval, residual SD, the r = 1 pairs' mean residual and z) and
    truncation's split (unmatched, matched and their difference on shared configurations; the data-term
    check); plus the settings, the main fit and the run time in seconds."""
    raw = json.loads(Path(path or analysis_file("case_studies", family)).read_text())
    out = {"settings": raw["settings"], "main_fit": raw["main_fit"], "seconds": raw["seconds"], "studies": {}}
    for name, st in raw["studies"].items():
        if "paired" not in st:
            continue
        out["studies"][name] = {
            "estimates": pd.DataFrame([dict(estimator=k, **st[k]) for k in ESTIMATORS]),
            "offset": st["offset_log"], "pairs": st["pairs"], "gains_by_r": pd.DataFrame(st["gains_by_r"]),
            "simulation": pd.DataFrame(raw["simulation"].get(name, {}).get("summary", [])),
            "models": pd.DataFrame([dict(model=m, anchor=v["anchor"], offset_form=v["offset_form"], **v["dphi"],
                                         resid_sd=v["resid_sd"], **{f"r1_{k}": x for k, x in (v["r1"] or {}).items()})
                                    for m, v in st.get("models", {}).items()]),
            "split": st.get("split"), "token_check": st.get("token_check")}
    return out


# ------------------------------------------------------------------ simulation

def law_residuals(law: FitResult, main_df) -> dict:
    """{(budget, r, s): mean log-loss residual of the main fit} (observed minus law)."""
    df = validate_runs(main_df)
    res = np.log(df["loss"].to_numpy(float) / main_of(law).predict(df["n_once"], df["n_rec"], df["r"], df["tokens"]))
    by = pd.Series(res).groupby(pd.Series(run_key(df))).mean()   # replicates: their mean
    return {k: float(v) for k, v in by.items()}


def synthetic(law: FitResult, df, dphi=0.0, offset=0.0, resid=None, noise_sd=0.0, rng=None):
    """A copy of runs table `df` with losses from the law (phi + dphi, log-loss shift offset), plus
    the shared log residual of each (budget, r, s) in `resid` and independent noise in nats."""
    out = validate_runs(df).copy()
    law = main_of(law)
    shared = np.array([(resid or {}).get(k, 0.0) for k in run_key(out)])
    out["loss"] = synthetic_losses(law.replace(phi=law.phi + dphi), out, rng, noise=noise_sd or None,
                                   log_shifts=(offset, shared))
    return out


def parallel_map(fn, tasks: list, jobs: int = 1) -> list:
    """[fn(t) for t in tasks], on `jobs` forked processes when jobs > 1 (results in task order).  The
    fitter is single-threaded numpy, so processes, not threads, use the other cores."""
    if jobs <= 1 or len(tasks) <= 1:
        return [fn(t) for t in tasks]
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(min(jobs, len(tasks))) as pool:
        return pool.map(fn, tasks, chunksize=1)


def _estimate_rep(task) -> list[dict]:
    """Every estimator on one simulated replication (m, v, c): one task of simulate_estimators."""
    rep, m, v, c, kw, width = task
    law = main_law(m, **kw)
    ests = {"paired": paired_estimate(m, v, c, False, law, **kw)["dphi"]}
    both = paired_estimate(m, v, c, True, law, **kw)
    ests["paired_offset"], ests["paired_offset:offset"] = both["dphi"], both["offset"]
    ests["paper"] = paper_protocol(m, v, **kw)
    if width:
        ests["width_linear"] = paired_estimate(m, v, c, "width", law, **kw)["dphi"]
    return [dict(rep=rep, estimator=name, **asdict(e)) for name, e in ests.items()]


def simulate_estimators(main_df, variant_df, true_dphi, n_reps=None, seed=0, controls=None, true_offset=0.0,
                        noise_sd=0.011, quick=False, restarts=None, bootstrap=None, boot_restarts=None, width=False,
                        jobs=1):
    """Bias, SD, RMSE and 95% coverage of the paired (with and without offset) and paper-protocol
    estimators on our design: both arms from the main fit's law with a known dphi (and offset),
    the main fit's real log residuals shared at each (budget, r, s), and seed noise (nats).
    `width`: also the model with one offset per width ('width_linear', against `controls`).
    n_reps / restarts / bootstrap default to FULL, or to QUICK (few of each) with `quick`.
    `jobs` processes refit the replications; the numbers do not depend on it (every draw is made
    here, in order, and each refit is seeded by its replication).
    One row per estimator ('paired_offset:offset' is the offset); attrs['raw'] holds every rep."""
    cfg = QUICK if quick else FULL
    n_reps, restarts, bootstrap = (
        n_reps or cfg["n_reps"],
        restarts or cfg["restarts"],
        bootstrap or cfg["sim_bootstrap"],
    )
    boot_restarts = cfg["boot_restarts"] if boot_restarts is None else boot_restarts
    law0 = main_law(main_df, restarts, seed)
    resid, rng, tasks = law_residuals(law0, main_df), np.random.default_rng(seed), []
    for rep in range(n_reps):
        m = synthetic(law0, main_df, resid=resid, noise_sd=noise_sd, rng=rng)
        v = synthetic(law0, variant_df, true_dphi, true_offset, resid, noise_sd, rng)
        c = None if controls is None or not len(controls) else synthetic(law0, controls, 0.0, 0.0, resid, noise_sd, rng)
        kw = dict(restarts=restarts, bootstrap=bootstrap, boot_restarts=boot_restarts, seed=seed + rep)
        tasks.append((rep, m, v, c, kw, width))
    rows = [row for rep_rows in parallel_map(_estimate_rep, tasks, jobs) for row in rep_rows]
    raw = pd.DataFrame(rows)
    raw["true"] = np.where(raw["estimator"].str.endswith(":offset"), true_offset, true_dphi)
    raw["covered"] = (raw["lo"] <= raw["true"]) & (raw["true"] <= raw["hi"])
    err = raw["estimate"] - raw["true"]
    summary = raw.assign(err=err, sq=err ** 2, width=raw["hi"] - raw["lo"]).groupby("estimator", sort=False).agg(
        true=("true", "first"), bias=("err", "mean"), sd=("estimate", "std"), rmse=("sq", "mean"),
        coverage=("covered", "mean"), mean_se=("se", "mean"), mean_width=("width", "mean"),
        at_bound=("at_bound", "mean"), n_reps=("rep", "count")).reset_index()
    summary["rmse"] = np.sqrt(summary["rmse"])
    summary.attrs["raw"] = raw
    return summary


# ------------------------------------------------------------------ command line


def main(argv=None) -> int:
    """`looped case-studies --out runs/analysis/cpu3/case_studies.json [--family cpu3] [--quick] [--runs runs]`."""
    ap = argparse.ArgumentParser(prog="looped case-studies", description="Paired case-study estimators.")
    ap.add_argument("--out", required=True,
                    help="results file to write (JSON), e.g. runs/analysis/cpu3/case_studies.json")
    ap.add_argument("--runs", default="runs", help="folder holding the record folders of every arm (default: runs)")
    add_family_options(ap)   # whose arms
    ap.add_argument("--quick", action="store_true", help="few restarts, resamples and simulation reps")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fits, resamples and simulation (default 0)")
    ap.add_argument(
        "--seed-sd", type=float, default=None, help="simulation noise (nats); default: measured, else 0.011"
    )
    ap.add_argument("--reps", type=int, default=None, help="simulation replications (default: 100, --quick 4)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="processes refitting the simulation's replications (default 1; the numbers do not change)")
    ap.add_argument("--same-runs-as", default=None, metavar="JSON",
                    help="a results file of this command: rerun on exactly the runs it used (sweeps add runs)")
    ap.add_argument("--true-dphi", type=float, default=None, help="default: each study's paired estimate")
    a = ap.parse_args(argv)
    if a.jobs < 1:
        ap.error(f"--jobs must be at least 1, not {a.jobs}")
    t0, cfg = time.perf_counter(), dict(QUICK if a.quick else FULL)
    if a.reps:
        cfg["n_reps"] = a.reps
    kw = dict(restarts=cfg["restarts"], bootstrap=cfg["bootstrap"], boot_restarts=cfg["boot_restarts"], seed=a.seed)
    try:
        arms = load_arms(a.runs, FAMILIES[a.family]["arms"])
        if a.same_runs_as:
            arms = same_runs(arms, a.same_runs_as)
        main_df, ctl = arms["main"], arms["control_linear"]
        seeds = replicate_tables(a.runs, FAMILIES[a.family]["replicates"])   # read as load_arms reads the arms
        pe = pure_error(main_df, *seeds)   # the book's one pure error: never a run and its other-token twin
        measured = pe["seed_sd"]
        noise = a.seed_sd if a.seed_sd is not None else (measured if np.isfinite(measured) else 0.011)
        law = main_law(main_df, **kw)
        out = {"settings": dict(cfg, seed=a.seed, family=a.family, seed_sd=noise, seed_sd_measured=measured,
                                df_pe=pe["df_pe"],
                                quick=a.quick, huber_delta=HUBER_DELTA, runs={k: len(v) for k, v in arms.items()},
                                run_ids={k: sorted(map(str, v["run_id"])) for k, v in arms.items()}),
               "main_fit": {k: getattr(law, k) for k in ("A", "alpha", "B", "beta", "E", "phi", "r2", "n_runs")},
               "studies": {}, "simulation": {}}
        if len(ctl):
            out["studies"]["linear_r1"] = {"gains_by_budget": paired_gains(pairs(main_df, ctl), ("budget",))}
        for name in STUDIES:
            var = arms[name]
            if not len(var):
                continue
            print(f"looped case-studies: {name} ({len(var)} runs) after {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
            if name == "hyper" and len(arms["control_hyper"]):
                var = pd.concat([var, arms["control_hyper"]], ignore_index=True)
            P = pairs(main_df, var, ctl)
            one, both = (paired_estimate(main_df, var, ctl, o, law, **kw) for o in (False, True))
            res = {"pairs": len(P), "unmatched": P.attrs["unmatched"], "paired": one["dphi"],
                   "paired_offset": both["dphi"], "offset_log": both["offset"],
                   "resid_sd": one["resid_sd"], "resid_sd_offset": both["resid_sd"]}
            res["paper"] = paper_protocol(main_df, arms[name], **kw)
            if name == "hyper":
                res["models"] = {
                    m: dict(paired_estimate(main_df, var, ctl if anchor == "linear" else None, off, law, **kw),
                            offset_form=str(off), anchor=anchor) for m, (off, anchor) in HYPER_MODELS.items()}
            if name == "truncated" and len(arms["truncated_matched"]):
                res["split"] = paired_difference(main_df, arms["truncated"], arms["truncated_matched"], law,
                                                 kw["bootstrap"], a.seed)
                res["token_check"] = token_term_check(arms["truncated"], arms["truncated_matched"], law)
            res.update(gains_by_r=paired_gains(P, ("r",)), gains_by_budget=paired_gains(P, ("budget",)),
                       gains_by_budget_r=paired_gains(P, ("budget", "r")))
            out["studies"][name] = res
            if name in ("truncated", "hyper"):
                head = out["studies"].get(HEADLINE[name][0], res)
                head = head["models"][HEADLINE[name][1]]["dphi"] if "models" in head else head[HEADLINE[name][1]]
                true = a.true_dphi if a.true_dphi is not None else float(np.clip(head.estimate, -1, 1))
                t1 = time.perf_counter()
                sim = simulate_estimators(main_df, var, true, cfg["n_reps"], a.seed, ctl, 0.0, noise, a.quick,
                                          width=name == "hyper", jobs=a.jobs)
                out["simulation"][name] = {"true_dphi": true, "seconds": time.perf_counter() - t1, "summary": sim}
    except FitError as e:
        print(f"looped case-studies: error: {e}", file=sys.stderr)
        return 2
    out["seconds"] = time.perf_counter() - t0
    atomic_write_json(a.out, json_ready(out), allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
