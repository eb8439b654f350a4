"""The paper's two case studies (Table 3): truncated backpropagation through the recurrences
and hyperconnections, each refitted beside a baseline at the same budgets.

`case_study_runs` builds the two runs tables, `case_study` fits both (`CaseStudy`),
`runs_per_cell` counts their runs, `case_study_cells` compares the best runs cell by cell, and
`token_gain` says how many more tokens a cheaper variant trains on at the same budget.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ... import accounting as acc
from ...config import model_config
from ...fit import REQUIRED, FitError, FitResult, fit, is_chinchilla, validate_runs
from ..sweep.registry import load_study
from ..sweep.study import Study

if TYPE_CHECKING:
    import pandas as pd


def _as_runs(runs):
    """A runs table from a DataFrame, a CSV / record folder (`Study.at(folder).fit_table`: relative
    to the repository root), or None; a missing folder, a folder without records or None give an
    empty table (a sweep that has not started yet)."""
    if isinstance(runs, pd.DataFrame) and len(runs):
        return validate_runs(runs)
    if runs is None or isinstance(runs, pd.DataFrame):
        return pd.DataFrame(columns=list(REQUIRED) + ["budget"])
    return Study.at(runs).fit_table(main_design=False)


def _in_budgets(df, budgets) -> np.ndarray:
    b = df["budget"].to_numpy(float)
    return np.isclose(b[:, None], np.asarray(budgets, float)[None, :], rtol=1e-6, atol=0).any(1)


def _sorted_cells(df):
    """Rows ordered by (budget, r, width): the bootstrap then numbers the cells the same way in
    every table that holds the same cells, so two fits with one seed draw paired resamples."""
    keys = [c for c in ("budget", "r", "n_once", "n_rec") if c in df.columns]
    return df.sort_values(keys, kind="stable").reset_index(drop=True)


def case_study_runs(main, study, budgets=None, study_r=None):
    """The two runs tables of a case study (the paper's case-study protocol, Table 3).

    baseline: every run of the main study at the case-study budgets (all r);
    variant: the main study's plain r = 1 runs at those budgets plus the case study's runs
    with r > 1.  With `study_r`, both keep only r = 1 and the r in `study_r`, so that the two
    fits cover the same cells (a variant without r = 2 is set against a baseline without it).
    `budgets` defaults to the budgets present in the case-study runs (to all budgets of the main
    study while there are none).  Both inputs
    may be DataFrames or record folders / CSV files.  Returns (baseline, variant), each sorted
    by (budget, r, size).
    """

    main, study = _as_runs(main), _as_runs(study)
    for name, df in (("main", main), ("case study", study)):
        if len(df) and "budget" not in df.columns:
            raise FitError(f"{name} runs need a budget column")
    study = study[study["r"].astype(float) > 1] if len(study) else study
    if study_r is not None and len(study):
        study = study[study["r"].astype(float).isin([float(r) for r in study_r])]
    if budgets is None:   # the case study's budgets; all of the main study's while it has no runs
        src = study if len(study) else main
        budgets = sorted(src["budget"].astype(float).unique()) if len(src) else []
    budgets = [float(b) for b in budgets]
    base = main[_in_budgets(main, budgets)] if len(main) and budgets else main.iloc[0:0]
    if study_r is not None and len(base):
        base = base[base["r"].astype(float).isin([1.0] + [float(r) for r in study_r])]
    study = study[_in_budgets(study, budgets)] if len(study) and budgets else study.iloc[0:0]
    plain = base[base["r"].astype(float) == 1]
    variant = pd.concat([plain, study], ignore_index=True) if len(study) else plain.iloc[0:0]
    return _sorted_cells(base), _sorted_cells(variant)


@dataclass
class CaseStudy:
    """A case-study refit beside its baseline (see `case_study`).  A fit that was skipped for
    lack of runs is None, with the reason in `note`."""
    name: str
    budgets: list
    baseline_runs: "pd.DataFrame"
    variant_runs: "pd.DataFrame"
    baseline: FitResult | None
    variant: FitResult | None
    note: str = ""
    study_runs: int = 0

    @property
    def ok(self) -> bool:
        """Both fits were done and phi is identifiable in both."""
        return (self.baseline is not None and self.variant is not None
                and self.baseline.phi is not None and self.variant.phi is not None)

    @property
    def delta_phi(self) -> float | None:
        """phi(variant) - phi(baseline)."""
        return self.variant.phi - self.baseline.phi if self.ok else None

    @property
    def paired(self) -> bool:
        """Both tables hold the same (budget, r) cells, so the two bootstraps (same seed) drew
        the same cells: their phi samples are paired and `delta_phi_ci` is meaningful."""
        if not self.ok or self.baseline.boot_samples is None or self.variant.boot_samples is None:
            return False
        cells = lambda df: sorted(set(zip(df["budget"].astype(float), df["r"].astype(float))))  # noqa: E731
        return cells(self.baseline_runs) == cells(self.variant_runs)

    @property
    def delta_phi_ci(self) -> tuple | None:
        """(2.5%, 97.5%) percentiles of the paired bootstrap differences of phi, when paired."""
        if not self.paired:
            return None
        d = self.variant.boot_samples[:, 5] - self.baseline.boot_samples[:, 5]
        lo, hi = np.percentile(d, [2.5, 97.5])
        return float(lo), float(hi)

    def table(self) -> "pd.DataFrame":
        """One row per fit (baseline, variant): runs, phi with its bootstrap interval, alpha,
        beta, E, A, B, R^2; NaN where a fit was skipped."""
        rows = []
        for label, res, runs in (("baseline", self.baseline, self.baseline_runs),
                                 (self.name, self.variant, self.variant_runs)):
            row = {"fit": label, "runs": len(runs)}
            for k in ("phi", "phi_lo", "phi_hi", "alpha", "beta", "E", "A", "B", "r2"):
                row[k] = float("nan")
            if res is not None:
                for k in ("alpha", "beta", "E", "A", "B", "r2"):
                    row[k] = getattr(res, k)
                if res.phi is not None:
                    row["phi"] = res.phi
                    row["phi_lo"], row["phi_hi"] = res.ci.get("phi", (float("nan"), float("nan")))
            rows.append(row)
        return pd.DataFrame(rows)


def case_study(main, study, name: str = "case study", budgets=None, study_r=None, restarts: int = 500,
               seed: int = 0, bootstrap: int = 0, boot_restarts: int | None = None,
               min_runs: int = 12, min_study_runs: int = 6, min_budgets: int = 2,
               reuse: CaseStudy | None = None) -> CaseStudy:
    """The paper's case-study protocol: refit all six parameters on the case study's runs
    (r > 1) plus the main study's r = 1 runs, and refit the baseline on the main study's runs
    at the same budgets (see `case_study_runs`).  Both fits use the same restarts and seed.

    A fit is skipped (None, with a reason in `note`) when its table has fewer than `min_runs`
    runs, lacks looped runs or covers fewer than `min_budgets` budgets (at one budget the tokens
    are a function of the width, so the N and D terms of the law cannot be told apart), and the
    case-study fit also when the case study contributes fewer than `min_study_runs` runs: a
    study whose sweep has not (fully) run yet.
    With `bootstrap` > 0 and the same (budget, r) cells in both tables, the two bootstraps are
    paired (`CaseStudy.delta_phi_ci`).  `reuse`: another case study on the same main runs; its
    baseline fit is reused when it covers the same budgets and runs (two case studies, or one
    with and without r = 2, then share one baseline), and refitted otherwise (e.g. while one of
    two sweeps is still running and their finished budgets differ).
    """
    base, var = case_study_runs(main, study, budgets, study_r)
    budgets = sorted(base["budget"].astype(float).unique()) if len(base) else []
    n_study = int((var["r"].astype(float) > 1).sum()) if len(var) else 0
    notes = []

    def attempt(df, label, extra_ok=True, why=""):
        if not extra_ok:
            notes.append(f"{label}: {why}; fit skipped")
            return None
        if len(df) < min_runs or is_chinchilla(df):
            have = f"{len(df)} run(s)" + ("" if len(df) == 0 or not is_chinchilla(df) else ", none looped")
            notes.append(f"{label}: {have}, need at least {min_runs} with looped runs; fit skipped")
            return None
        n_budgets = df["budget"].astype(float).nunique()
        if n_budgets < min_budgets:
            notes.append(f"{label}: runs at {n_budgets} budget(s), need at least {min_budgets}; fit skipped")
            return None
        return fit(df, restarts=restarts, seed=seed, bootstrap=bootstrap, boot_restarts=boot_restarts)

    same = (reuse is not None and reuse.baseline is not None and [float(b) for b in reuse.budgets] == budgets
            and len(reuse.baseline_runs) == len(base) == reuse.baseline.n_runs)
    baseline = reuse.baseline if same else attempt(base, "baseline")
    variant = attempt(var, name, n_study >= min_study_runs,
                      f"{n_study} case-study run(s) with r > 1, need at least {min_study_runs}")
    return CaseStudy(name=name, budgets=budgets, baseline_runs=base, variant_runs=var, baseline=baseline,
                     variant=variant, note="; ".join(notes), study_runs=n_study)


def runs_per_cell(cs: CaseStudy) -> pd.DataFrame:
    """Runs per (budget, r) cell of the two fits of a case study: one row per (fit, budget),
    columns fit, budget and one per r (its count, 0 where a fit has no run in that cell)."""
    parts = {"baseline": cs.baseline_runs, cs.name: cs.variant_runs}
    rs = sorted({int(r) for df in parts.values() for r in df["r"].astype(float)})
    rows = []
    for label, df in parts.items():
        if len(df):
            counts = (df.groupby([df["budget"].astype(float), df["r"].astype(float).astype(int)]).size()
                      .unstack(fill_value=0).reindex(columns=rs, fill_value=0))
            rows += [{"fit": label, "budget": b, **row.astype(int).to_dict()} for b, row in counts.iterrows()]
    return pd.DataFrame(rows, columns=["fit", "budget", *rs])


def case_study_cells(baseline_runs, variant_runs):
    """Per (budget, r > 1) cell: the best (lowest-loss) run of the baseline (linear injection,
    full backprop) and of the case study, and their difference (case study minus baseline, nats).
    Only cells present in both tables."""
    out = []
    b = baseline_runs[baseline_runs["r"].astype(float) > 1]
    v = variant_runs[variant_runs["r"].astype(float) > 1]
    for (c, r), gv in v.groupby(["budget", "r"], sort=True):
        gb = b[(b["budget"] == c) & (b["r"] == r)]
        if not len(gb):
            continue
        ib, iv = gb["loss"].idxmin(), gv["loss"].idxmin()
        out.append(dict(budget=c, r=int(r), runs_baseline=len(gb), runs_variant=len(gv),
                        best_n_baseline=int(gb.loc[ib, "n_once"] + gb.loc[ib, "n_rec"]),
                        best_n_variant=int(gv.loc[iv, "n_once"] + gv.loc[iv, "n_rec"]),
                        loss_baseline=float(gb.loc[ib, "loss"]), loss_variant=float(gv.loc[iv, "loss"]),
                        delta=float(gv.loc[iv, "loss"] - gb.loc[ib, "loss"])))
    return pd.DataFrame(out, columns=["budget", "r", "runs_baseline", "runs_variant", "best_n_baseline",
                                      "best_n_variant", "loss_baseline", "loss_variant", "delta"])


def token_gain(study: str = "paper-truncated"):
    """Tokens a case-study run gets at its budget, against the linear-injection, full-backprop run
    of the same (budget, r, s): one row per run of the named study (`looped.studies.sweep.registry.STUDIES`).

    Columns budget, r, s, d_model, injection, bptt_k, flops_full, flops_variant (training FLOPs per
    token), tokens_full, tokens_variant (whole steps of the preset's batch, as the trainer runs
    them), ratio (tokens_variant / tokens_full) and flops_ratio (flops_full / flops_variant, the
    gain before rounding to whole steps).
    """

    rows = []
    for run in load_study(study):
        cfg = run.model_config()
        full = model_config(run.preset, r=run.r, s=run.s)
        bt = run.preset.batch_tokens
        tv, tf = acc.tokens_for_budget(cfg, run.budget, bt), acc.tokens_for_budget(full, run.budget, bt)
        fv, ff = acc.flops_per_token(cfg), acc.flops_per_token(full)
        rows.append(dict(budget=run.budget, r=run.r, s=run.s, d_model=cfg.d_model, injection=cfg.injection,
                         bptt_k=cfg.k_bwd, flops_full=ff, flops_variant=fv, tokens_full=tf, tokens_variant=tv,
                         ratio=tv / tf, flops_ratio=ff / fv))
    return pd.DataFrame(rows)


CELL_NOISE = 0.01
"""Nats: differences between best runs below this are within seed-to-seed scatter (the CPU
study's seed runs measure a standard deviation of about 0.011)."""
