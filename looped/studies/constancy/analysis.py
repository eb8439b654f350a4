"""How robust is phi?  The joint law refitted under other accountings, subsets and freer forms,
per budget, against the seed noise, and on synthetic data from a known law.

    L = E + A (N_once + kappa r^phi N_rec)^(-alpha) + B D^(-beta)      (kappa = 1: the paper's law)

robustness_table (variants), goodness_of_fit (seed SD, lack-of-fit F, residual patterns,
leave-one-budget-out), synthetic_recovery (bias, SD, coverage of phi), and phi_vs_compute (per
budget, windows, the paper's minima, trend: `looped.studies.constancy.drift`); `run_all` runs them all,
`python -m looped.studies.constancy.analysis --out F`.  Runs at a further budget (`--drift`, the cpu-drift
study) are predicted by the main fit, refitted with the main runs, and join the phi-against-compute
fits once they have a run at every r.
Numbers only.  Forms `looped.fit` can express (transformed columns, subsets) are fitted by it;
the others (several phis, a free kappa) by `law_variants.fit_multi`: the same objective and solver
on a design with more columns, block bootstrap over (budget, r) cells.  Residuals: observed - predicted loss, nats.
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
from scipy import stats

from ...config import model_config, repo_relative
from ...fit import FitError, fit, load_runs, validate_runs
from ...io import atomic_write_json, json_numbers, json_ready, json_table
from ...law import Law, synthetic_losses
from ...resample import cells
from ...solver import LAW_PARAMS
from ..paper import PAPER_LAW, design_of, paper_grid, paper_table
from ..sweep.registry import (
    DEFAULT_FAMILY,
    STUDIES,
    add_family_options,
    analysis_file,
    family_defaults,
    holds_records,
    load_study,
)
from ..sweep.replicates import REPLICATE_STUDIES, protocol_shift, pure_error, replicate_sd, seed_and_order  # noqa: F401
from .drift import add_budgets, phi_vs_compute, power, trend_simulation
from .variants import NAN2, fit_multi, fit_residuals, fit_row, onehot, rmse

HOLDOUT_COLUMNS = ["budget", "n_runs", "mean_error", "rmse", "rmse_over_seed_sd"]


def read_results(path=None, family: str = DEFAULT_FAMILY) -> dict:
    """The results of `looped constancy` in `path` (default: the family's committed ones): every table as
    a DataFrame (the synthetic recoveries as one table of their summaries), the summaries and settings as
    dicts."""
    raw = json.loads(Path(path or analysis_file("constancy", family)).read_text())
    gof, pvc = raw["goodness_of_fit"], raw["phi_vs_compute"]
    out = {"robustness": json_table(raw["robustness"]), "summary": json_numbers(gof["summary"]),
           "settings": raw["settings"],
           "synthetic": json_table([dict(scenario=k, **v["summary"]) for k, v in raw["synthetic"].items()]),
           "drift_calibration": json_numbers(raw.get("drift_calibration", {}))}
    out.update({k: json_table(gof[k]) for k in ("by_r", "by_position", "by_role", "lobo", "residuals")})
    out["holdout"] = pd.DataFrame(gof.get("holdout", []), columns=HOLDOUT_COLUMNS)
    out.update({k: json_table(pvc[k]) for k in ("per_budget", "windows", "paper_per_budget", "paper_windows",
                                                "trend")})
    return out


# ----------------------------------------------------------------------------- inputs


def embedding_params(df, preset: str = "prose") -> np.ndarray:
    """V d per run (padded vocabulary x width): one untied matrix, the LM head or the embedding."""
    out = []
    for _, x in df.iterrows():
        if all(pd.notna(x.get(c)) for c in ("d_model", "vocab_size", "vocab_pad")):
            out.append(math.ceil(x["vocab_size"] / x["vocab_pad"]) * x["vocab_pad"] * x["d_model"])
        else:   # no accounting in the record: rebuild the model from its preset
            cfg = model_config(x.get("preset", preset) if pd.notna(x.get("preset")) else preset, r=int(x["r"]),
                               s=float(x["s"]), injection=x.get("injection") if pd.notna(x.get("injection")) else None)
            out.append(cfg.padded_vocab * cfg.d_model)
    return np.asarray(out, float)


def count_embeddings(df, head: bool = True, embedding: bool = False, preset: str = "prose") -> pd.DataFrame:
    """The runs with the LM head (and the embedding) counted in N_once."""
    return df.assign(n_once=df["n_once"] + (int(head) + int(embedding)) * embedding_params(df, preset))


def cell_position(df) -> tuple[np.ndarray, np.ndarray]:
    """(rank by N within the run's (budget, r) cell, 0 = narrowest; the cell's size)."""
    n, keys = df["n_once"] + df["n_rec"], [df["budget"], df["r"]]
    return n.groupby(keys).rank(method="first").to_numpy(int) - 1, n.groupby(keys).transform("size").to_numpy()


def cell_interiors(df) -> pd.DataFrame:
    """Each cell without its narrowest and widest run (the parabola's arms)."""
    pos, size = cell_position(df)
    return df[(pos > 0) & (pos < size - 1)].reset_index(drop=True)


def paper_design() -> pd.DataFrame:
    """The paper's main grid with N_once, N_rec and D from the accounting (preset 'paper')."""
    return paper_grid("main")


# ----------------------------------------------------------------------------- 1. variants

def robustness_table(df, restarts=500, bootstrap=200, seed=0, boot_restarts=None, multi_restarts=200,
                     multi_boot_restarts=8, preset="prose", drift=None) -> pd.DataFrame:
    """One row per variant: variant, phi, phi_lo, phi_hi (95% cell-bootstrap percentiles), r2 (raw
    nats), rmse (loss-space residual RMSE, nats), n_runs, huber, kappa, kappa_lo, kappa_hi.  With
    `drift` runs, a last row 'with_drift_budgets': the law refitted with them added (add_budgets)."""
    df = validate_runs(df, need=("budget",))
    joined, added = add_budgets(df, drift)
    b = sorted(df["budget"].unique())
    subsets = {"paper": df, "head_in_n_once": count_embeddings(df, preset=preset),
               "embedding_and_head_in_n_once": count_embeddings(df, embedding=True, preset=preset),
               **{f"without_r{r}": df[df["r"] != r] for r in (2, 8) if (df["r"] == r).any()},
               "without_lowest_budget": df[df["budget"] != b[0]], "without_highest_budget": df[df["budget"] != b[-1]],
               "cell_interiors": cell_interiors(df)}
    rows = [dict(variant=name, **fit_row(fit(sub.reset_index(drop=True), restarts=restarts, seed=seed,
                                             bootstrap=bootstrap, boot_restarts=boot_restarts), sub))
            for name, sub in subsets.items()]
    kw = dict(restarts=multi_restarts, seed=seed, bootstrap=bootstrap, boot_restarts=multi_boot_restarts)
    X, levels = onehot(df["r"], sorted(v for v in df["r"].unique() if v > 1))
    m = fit_multi(df, X, [f"phi_{v:g}" for v in levels], **kw)
    rows += [dict(variant=f"per_r_phi_{v:g}", **m.row(f"phi_{v:g}")) for v in levels]
    m = fit_multi(df, np.ones((len(df), 1)), ["phi"], kappa=True, **kw)
    rows.append(dict(variant="kappa_r_phi", **m.row("phi"), kappa=m.params["kappa"],
                     **dict(zip(("kappa_lo", "kappa_hi"), m.ci.get("kappa", NAN2)))))
    if len(added):
        rows.append(dict(variant="with_drift_budgets", **fit_row(fit(joined, restarts=restarts, seed=seed,
                                                                     bootstrap=bootstrap, boot_restarts=boot_restarts),
                                                                 joined)))
    return pd.DataFrame(rows, columns=["variant", "phi", "phi_lo", "phi_hi", "r2", "rmse", "n_runs", "huber",
                                       "kappa", "kappa_lo", "kappa_hi"])


# ----------------------------------------------------------------------------- 2. goodness of fit

def _by(e, keys, name) -> pd.DataFrame:
    g = pd.DataFrame({name: keys, "e": e}).groupby(name)["e"]
    return pd.DataFrame({"n": g.size(), "mean": g.mean(), "se": g.std(ddof=1) / np.sqrt(g.size()),
                         "rmse": g.apply(rmse)}).reset_index()


def goodness_of_fit(df, seed_df=None, restarts=500, seed=0, n_params=6, drift=None) -> dict:
    """summary: rmse, resid_sd = sqrt(SS / (n - n_params)), replicate_sd's numbers, the lack-of-fit
    F = resid_sd^2 / seed_sd^2 (df1 = n - n_params, df2 = df_pe, p_value), phi, r2, law;
    by_r, by_position (0 = narrowest of its cell), by_role (narrowest/interior/widest): n, mean,
    se, rmse of the residuals; lobo: fit without budget b, predict b (budget, n_runs, mean_error,
    rmse, phi); holdout: the fit predicting each budget of the `drift` runs it never saw (budget,
    n_runs, mean_error, rmse, rmse_over_seed_sd); residuals: one row per run."""
    df = validate_runs(df, need=("budget", "s"))
    res = fit(df, restarts=restarts, seed=seed)
    e, n = fit_residuals(res, df), len(df)
    seeds = None if seed_df is None else validate_runs(seed_df)
    rep = pure_error(df, seeds)
    var = float(e @ e) / (n - n_params)
    F = var / rep["seed_sd"] ** 2 if rep["df_pe"] else math.nan
    cell_means = pd.Series(e).groupby(cells(df)).mean()
    summ = dict(
        rmse=rmse(e),
        cell_sd=float(cell_means.std(ddof=1)),   # SD of the (budget, r) cells' mean residual: the misfit's scale
        seed42=protocol_shift(df, seeds),
        seed_order=seed_and_order(df, seeds),   # the cpu-order runs, once trained
        resid_sd=math.sqrt(var),
        **rep,
        rmse_over_seed_sd=rmse(e) / rep["seed_sd"],
        F=F,
        df1=n - n_params,
        df2=rep["df_pe"],
        p_value=float(stats.f.sf(F, n - n_params, rep["df_pe"])) if rep["df_pe"] else math.nan,
        phi=res.phi,
        r2=res.r2,
        n_runs=n,
        law={k: getattr(res, k) for k in LAW_PARAMS},
    )
    pos, size = cell_position(df)
    role = np.where(pos == 0, "narrowest", np.where(pos == size - 1, "widest", "interior"))
    lobo = []
    for b in sorted(df["budget"].unique()):
        rb, test = (
            fit(df[df["budget"] != b].reset_index(drop=True), restarts=restarts, seed=seed),
            df[df["budget"] == b],
        )
        eb = fit_residuals(rb, test)
        lobo.append(dict(budget=b, n_runs=len(test), mean_error=float(eb.mean()), rmse=rmse(eb), phi=rb.phi))
    held = []   # the budgets this fit never saw
    for b, g in ([] if drift is None or not len(drift) else validate_runs(drift, need=("budget",)).groupby("budget")):
        eh = fit_residuals(res, g)
        held.append(dict(budget=b, n_runs=len(g), mean_error=float(eh.mean()), rmse=rmse(eh),
                         rmse_over_seed_sd=rmse(eh) / rep["seed_sd"]))
    return dict(
        summary=summ,
        by_r=_by(e, df["r"].to_numpy(), "r"),
        by_position=_by(e, pos, "position"),
        by_role=_by(e, role, "role"),
        lobo=pd.DataFrame(lobo),
        holdout=pd.DataFrame(held, columns=HOLDOUT_COLUMNS),
        residuals=df[["budget", "r", "s", "loss"]].assign(pred=df["loss"] - e, resid=e, position=pos, role=role),
    )


# ----------------------------------------------------------------------------- 3. synthetic recovery

def synthetic_recovery(design_df, law: dict, n_draws=50, noise=0.01, kind="white", cell_noise=None,
                       restarts=100, bootstrap=100, boot_restarts=None, seed=0) -> dict:
    """Losses from `law` (A, alpha, B, beta, E, phi) on a design (budget, r, n_once, n_rec, tokens)
    plus white noise of SD `noise` nats and, kind='cell', one offset per (budget, r) cell of SD
    `cell_noise` (default `noise`); each draw refitted with a cell bootstrap.  summary: phi_true,
    mean, bias, sd, rmse, coverage (of the 95% interval), mean_width, ...; draws: draw, phi,
    phi_lo, phi_hi, covered."""
    if kind not in ("white", "cell"):
        raise FitError(f"kind must be 'white' or 'cell', got {kind!r}")
    if n_draws < 1:
        raise FitError("n_draws must be at least 1")
    design = validate_runs(pd.DataFrame(design_df).assign(loss=1.0), need=("budget",))
    truth, cell = Law.from_dict(law), cells(design)
    rng, sd_cell = np.random.default_rng(seed), (noise if cell_noise is None else cell_noise) * (kind == "cell")
    rows = []
    for i in range(n_draws):
        y = synthetic_losses(truth, design, rng, noise=noise, cell_sd=sd_cell, cells=cell)
        res = fit(
            design.assign(loss=y), restarts=restarts, seed=seed + i, bootstrap=bootstrap, boot_restarts=boot_restarts
        )
        lo, hi = res.ci.get("phi", NAN2)
        rows.append(dict(draw=i, phi=res.phi, phi_lo=lo, phi_hi=hi, covered=bool(lo <= law["phi"] <= hi)))
    d = pd.DataFrame(rows)
    err = d["phi"] - law["phi"]
    return dict(summary=dict(phi_true=law["phi"], mean=float(d["phi"].mean()), bias=float(err.mean()),
                             sd=float(d["phi"].std(ddof=1)) if n_draws > 1 else math.nan, rmse=rmse(err),
                             coverage=float(d["covered"].mean()) if bootstrap else math.nan,
                             mean_width=float((d["phi_hi"] - d["phi_lo"]).mean()), n_draws=n_draws,
                             n_runs=len(design), noise=noise, cell_noise=sd_cell, kind=kind), draws=d)


# ----------------------------------------------------------------------------- 4. command line

FULL = dict(restarts=500, bootstrap=200, boot_restarts=None, multi_restarts=200, multi_boot_restarts=8,
            draws=50, synth_restarts=100, synth_bootstrap=100, synth_boot_restarts=8, trend_draws=200)
QUICK = dict(restarts=50, bootstrap=20, boot_restarts=4, multi_restarts=16, multi_boot_restarts=2,
             draws=20, synth_restarts=50, synth_bootstrap=10, synth_boot_restarts=2, trend_draws=20)

def run_all(df, seed_df, s: dict, seed=0, drift=None, planned=None) -> dict:
    """Every study with settings `s` (FULL or QUICK), `drift` runs where each study uses them; the
    seconds each took under 'seconds'.  `planned`: the design of the drift study once complete
    (budget, r, n_once, n_rec, tokens), for the trend's SE and power with its budgets added."""
    kw = dict(restarts=s["restarts"], bootstrap=s["bootstrap"], seed=seed, boot_restarts=s["boot_restarts"],
              multi_restarts=s["multi_restarts"], multi_boot_restarts=s["multi_boot_restarts"])
    out, sec, t = {}, {}, time.perf_counter()

    def lap(name, value):   # one line on stderr per finished study: minutes of work are not silent
        nonlocal t
        out[name], sec[name], t = value, time.perf_counter() - t, time.perf_counter()
        print(f"looped constancy: {name.replace('_', ' ')} done ({sec[name]:.0f} s)", file=sys.stderr, flush=True)

    lap("goodness_of_fit", goodness_of_fit(df, seed_df, restarts=s["restarts"], seed=seed, drift=drift))
    lap("robustness", robustness_table(df, drift=drift, **kw))
    lap("phi_vs_compute", phi_vs_compute(df, drift=drift, **kw))
    g = out["goodness_of_fit"]["summary"]
    noise = g["seed_sd"] if math.isfinite(g["seed_sd"]) else g["rmse"]
    trend = out["phi_vs_compute"]["trend"].set_index("data").loc["ours"]
    sim = trend_simulation(add_budgets(df, drift)[0], g["law"], g["cell_sd"], noise, s["trend_draws"], seed=seed)
    cal = dict(sim, phi1=trend.phi1, z=trend.phi1 / sim["se"], jack_se=trend.phi1_jack_se,
               power_at_estimate=power(trend.phi1, sim["se"]), power_at_half=power(trend.phi1 / 2, sim["se"]))
    if planned is not None and len(planned):
        future = pd.concat([df, planned.assign(loss=1.0)], ignore_index=True)
        sim = trend_simulation(future, g["law"], g["cell_sd"], noise, s["trend_draws"], seed=seed)
        cal["planned"] = dict(se=sim["se"], budgets=sorted(set(planned["budget"])),
                              power_at_estimate=power(trend.phi1, sim["se"]),
                              power_at_half=power(trend.phi1 / 2, sim["se"]))
    lap("drift_calibration", cal)
    pres = paper_table("joint_fit_residuals")      # the paper's residual RMSE as its noise
    scenarios = {"ours": (df, g["law"], noise, g["cell_sd"]),
                 "paper": (paper_design(), PAPER_LAW.to_dict(),
                           float(np.sqrt((pres["n_runs"] * pres["rmse"] ** 2).sum() / pres["n_runs"].sum())), None)}
    lap("synthetic", {f"{name}_{kind}": synthetic_recovery(
        des[["budget", "r", "n_once", "n_rec", "tokens"]], law, n_draws=s["draws"], noise=nz, kind=kind,
        cell_noise=cell, restarts=s["synth_restarts"], bootstrap=s["synth_bootstrap"],
        boot_restarts=s["synth_boot_restarts"], seed=seed)
        for name, (des, law, nz, cell) in scenarios.items() for kind in ("white", "cell")})
    return dict(out, seconds=sec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="looped constancy", description="Is phi a constant? Other forms, lack of "
                                 "fit, drift with compute.")
    add_family_options(ap, "runs", "seeds", "drift")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--quick", action="store_true", help="small restarts, bootstrap and draws (CI)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fits, resamples and simulations (default 0)")
    a = ap.parse_args(argv)
    family_defaults(a, "runs", "seeds", "drift")
    settings, t0 = dict(QUICK if a.quick else FULL), time.perf_counter()
    seeds, drifts = [p for p in a.seeds if holds_records(p)], [p for p in a.drift if holds_records(p)]
    try:
        tables, main = [load_runs(p) for p in seeds], load_runs(a.runs)
        drift = pd.concat([load_runs(p) for p in drifts], ignore_index=True) if drifts else None
        planned = [design_of(load_study(Path(p).name)) for p in a.drift if Path(p).name in STUDIES]
        out = run_all(main, pd.concat(tables, ignore_index=True) if tables else None, settings, seed=a.seed,
                      drift=drift, planned=pd.concat(planned, ignore_index=True) if planned else None)
    except FitError as e:
        print(f"looped constancy: error: {e}", file=sys.stderr)
        return 2
    joined = add_budgets(validate_runs(main, need=("budget",)), drift)[1]
    studies = [Path(p).name for p in a.drift if Path(p).name in STUDIES]    # how many runs each will have
    out["settings"] = dict(settings, quick=a.quick, seed=a.seed, family=a.family, runs=repo_relative(a.runs),
                           seeds=[repo_relative(p) for p in seeds], drift=[repo_relative(p) for p in drifts],
                           n_drift_runs=0 if drift is None else len(drift), n_drift_joined=len(joined),
                           n_drift_planned=sum(len(load_study(n)) for n in studies) if studies else None,
                           total_seconds=time.perf_counter() - t0)
    atomic_write_json(a.out, json_ready(out), allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
