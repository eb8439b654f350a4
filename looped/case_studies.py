"""The paper's two case studies (Table 3): truncated backpropagation through the recurrences
and hyperconnections, each refitted beside a baseline at the same budgets.

`case_study_runs` builds the two runs tables, `case_study` fits both (`CaseStudy`),
`case_study_cells` compares the best runs cell by cell, and `token_gain` says how many more
tokens a cheaper variant trains on at the same budget.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import accounting as acc
from .config import model_config
from .fit import REQUIRED, FitError, FitResult, fit, is_chinchilla, load_runs, validate_runs

if TYPE_CHECKING:
    import pandas as pd


def _as_runs(runs):
    """A runs table from a DataFrame, a CSV / record folder, or None; a missing folder, a folder
    without records or None give an empty table (a sweep that has not started yet)."""
    import pandas as pd

    empty = pd.DataFrame(columns=list(REQUIRED) + ["budget"])
    if runs is None:
        return empty
    if isinstance(runs, pd.DataFrame):
        return validate_runs(runs) if len(runs) else empty
    p = Path(runs)
    if not p.exists() or (p.is_dir() and not any(p.rglob("*.json"))):
        return empty
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_runs(p)


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
    with r > 1 (only r in `study_r` when given).  `budgets` defaults to the budgets present in
    the case-study runs (to all budgets of the main study while there are none).  Both inputs may be DataFrames or record folders / CSV files.
    Returns (baseline, variant), each sorted by (budget, r, size).
    """
    import pandas as pd

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
        import pandas as pd
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


def case_study_cells(baseline_runs, variant_runs):
    """Per (budget, r > 1) cell: the best (lowest-loss) run of the baseline (linear injection,
    full backprop) and of the case study, and their difference (case study minus baseline, nats).
    Only cells present in both tables."""
    import pandas as pd
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
    of the same (budget, r, s): one row per run of the named study (`looped.sweep.STUDIES`).

    Columns budget, r, s, d_model, injection, bptt_k, flops_full, flops_variant (training FLOPs per
    token), tokens_full, tokens_variant (whole steps of the preset's batch, as the trainer runs
    them), ratio (tokens_variant / tokens_full) and flops_ratio (flops_full / flops_variant, the
    gain before rounding to whole steps).
    """
    import pandas as pd
    from .config import get_preset
    from .sweep import load_study
    rows = []
    for run in load_study(study):
        cfg = run.model_config()
        full = model_config(run.preset, r=run.r, s=run.s)
        bt = get_preset(run.preset).batch_tokens
        tv, tf = acc.tokens_for_budget(cfg, run.budget, bt), acc.tokens_for_budget(full, run.budget, bt)
        fv, ff = acc.flops_per_token(cfg), acc.flops_per_token(full)
        rows.append(dict(budget=run.budget, r=run.r, s=run.s, d_model=cfg.d_model, injection=cfg.injection,
                         bptt_k=cfg.k_bwd, flops_full=ff, flops_variant=fv, tokens_full=tf, tokens_variant=tv,
                         ratio=tv / tf, flops_ratio=ff / fv))
    return pd.DataFrame(rows)


def token_gain_summary(study: str = "paper-truncated"):
    """`token_gain` condensed per r and overall: runs, median / min / max of the token ratio."""
    import pandas as pd
    t = token_gain(study)
    parts = [(str(r), g) for r, g in t.groupby("r")] + [("all", t)]
    return pd.DataFrame([dict(r=k, runs=len(g), median=g["ratio"].median(), min=g["ratio"].min(),
                              max=g["ratio"].max(), flops_ratio_median=g["flops_ratio"].median())
                         for k, g in parts])


# ------------------------------------------------------------------ text read from a case study

def edge_notes(cs: CaseStudy) -> list:
    """Sentences flagging estimates of a case study that sit on the edge of the fitting box
    (log E = -3, i.e. E = e^-3 = 0.050 nats; phi = -3 or 3): a parameter there is a bound of the
    protocol, not an estimate, and a bootstrap percentile there means that part of the resamples
    ran into the edge, so the interval is open on that side.  Empty when nothing is on an edge."""
    from .fit import HI, LO, LAW_PARAMS, at_bounds
    notes = []
    for label, res in (("baseline", cs.baseline), (cs.name, cs.variant)):
        if res is None:
            continue
        for p in at_bounds(res):
            v = getattr(res, p)
            where = ("at the lower edge of the fitting box, e⁻³ ≈ 0.050 nats" if p == "E"
                     else f"at {v:.3f}, on the edge of the fitting box")
            notes.append(f"the {label} fit puts {_SYMBOL.get(p, p)} {where}: a bound, not an estimate")
        i = LAW_PARAMS.index("phi")
        lo, hi = res.ci.get("phi", (float("nan"), float("nan")))
        for end, v, box in (("lower", lo, LO[i]), ("upper", hi, HI[i])):
            if v == v and abs(v - box) < 1e-3:
                notes.append(f"the {end} end of the {label} fit's φ interval, {v:.3f}, is the edge of the fitting "
                             f"box: some resamples ran into it, so the interval is open on that side")
    return notes


_SYMBOL = {"phi": "φ", "alpha": "α", "beta": "β"}


def verdict(cs: CaseStudy, paper_delta: float, study: str = "") -> str:
    """A paragraph (Markdown) reading a case study's change in phi beside the paper's: direction,
    agreement with the paper's sign, the paired interval and any estimates on the box edge."""
    if not cs.ok:
        return (f"Our case-study fit is not available: {cs.note}.  Rerun this chapter once the "
                f"`{study or cs.name}` sweep has finished.")
    d = cs.delta_phi
    agrees = "agrees with" if (d > 0) == (paper_delta > 0) else "goes against"
    ci = cs.delta_phi_ci
    if ci is None:
        certainty = "There is no paired interval, since the two tables do not cover the same cells."
    elif ci[1] < 0 or ci[0] > 0:
        certainty = (f"The paired bootstrap interval, [{ci[0]:+.3f}, {ci[1]:+.3f}], excludes zero, "
                     "so our data resolve the direction.")
    else:
        certainty = (f"The paired bootstrap interval, [{ci[0]:+.3f}, {ci[1]:+.3f}], contains zero: our "
                     "runs do not resolve the direction.")
    text = (f"On our CPU study the {cs.name} refit gives a {'lower' if d < 0 else 'higher'} φ than the baseline, "
            f"by {abs(d):.3f}; this {agrees} the paper's direction ({paper_delta:+.3f}).  {certainty}")
    (b_lo, b_hi), (v_lo, v_hi) = (res.ci.get("phi", (float("nan"),) * 2) for res in (cs.baseline, cs.variant))
    if (v_hi - v_lo) > 2 * (b_hi - b_lo):   # False when either interval is missing (nan)
        text += (f"  The {cs.name} fit pins φ down far less well than the baseline: its own 95% interval, "
                 f"[{v_lo:.3f}, {v_hi:.3f}], is {(v_hi - v_lo) / (b_hi - b_lo):.0f} times as wide as the baseline's, "
                 f"so on these budgets its runs constrain φ only loosely.")
    notes = edge_notes(cs)
    if notes:
        text += "  Note that " + "; ".join(notes) + "."
    return text


CELL_NOISE = 0.01
"""Nats: differences between best runs below this are within seed-to-seed scatter (the CPU
study's seed check in the sweep chapter measures a standard deviation of about 0.011)."""


def cells_vs_phi(cells, cs: CaseStudy, what: str) -> str:
    """A paragraph (Markdown) setting the cell-by-cell comparison (`case_study_cells`) against the
    fitted change in phi, written from the numbers: where the variant wins, whether its advantage
    grows or shrinks steadily with r, what the law would then expect of phi, and whether the fit
    agrees.  ``what`` names the variant's runs ("truncated", "hyperconnection")."""
    if not len(cells):
        return "No (budget, r) cell has runs of both kinds yet."
    by_r = cells.groupby("r")["delta"].mean()
    r_lo, r_hi = int(by_r.index.min()), int(by_r.index.max())
    better = int((cells["delta"] < 0).sum())
    gain_lo, gain_hi = -by_r.loc[r_lo], -by_r.loc[r_hi]
    text = (f"The {what} runs reach the lower best loss in {better} of {len(cells)} cells; averaged "
            f"over budgets, the difference is " + ", ".join(f"{v:+.3f} nats at r = {int(r)}" for r, v in by_r.items())
            + ".  ")
    gains = (-by_r).to_numpy()
    steps = np.diff(gains)
    fitted = ""
    if cs.ok:
        ci = cs.delta_phi_ci
        fitted = (f"  The fitted change in φ, {cs.delta_phi:+.3f}"
                  + (", has a paired interval that contains zero." if ci is not None and ci[0] <= 0 <= ci[1] else "."))
    if abs(gain_hi - gain_lo) < CELL_NOISE and np.ptp(gains) < 2 * CELL_NOISE:
        return text + (f"The advantage is the same at every r to within the seed-to-seed scatter of single runs "
                       f"(about {CELL_NOISE} nats), which under the law says little about φ: a change in φ shows up "
                       f"as an advantage that grows (φ up) or shrinks (φ down) with r." + fitted)
    if abs(gain_hi - gain_lo) >= CELL_NOISE and np.all(steps > -CELL_NOISE) and gain_hi > gain_lo:
        grows = True
    elif abs(gain_hi - gain_lo) >= CELL_NOISE and np.all(steps < CELL_NOISE) and gain_hi < gain_lo:
        grows = False
    else:
        best = int(by_r.index[int(np.argmax(gains))])
        return text + (f"The advantage does not change steadily with r (it is largest at r = {best}), so the cells "
                       f"show no clear sign of a change in φ, which would make it grow (φ up) or shrink (φ down) "
                       f"with r." + fitted)
    text += (f"The advantage {'grows' if grows else 'shrinks'} with r (from {gain_lo:+.3f} to {gain_hi:+.3f} nats "
             f"in favour of the {what} runs), which under the law is the signature of a {'higher' if grows else 'lower'} φ: "
             f"the more recurrences, the {'more' if grows else 'less'} the change is worth.")
    if not cs.ok:
        return text
    consistent = (cs.delta_phi > 0) == grows
    ci = cs.delta_phi_ci
    unresolved = ci is not None and ci[0] <= 0 <= ci[1]
    if consistent:
        return text + f"  The fitted change in φ, {cs.delta_phi:+.3f}, points the same way."
    text += (f"  The fitted change in φ, {cs.delta_phi:+.3f}, points the other way.  The two views weigh different "
             f"things: the cells compare single best runs, while the refit moves all six parameters of the law at "
             f"once (here E goes from {cs.baseline.E:.3f} to {cs.variant.E:.3f} nats, α from "
             f"{cs.baseline.alpha:.3f} to {cs.variant.alpha:.3f}), and φ trades off against them.")
    if unresolved:
        text += ("  Since the paired interval of the change contains zero, the fit does not establish a direction "
                 "at all; the cell-by-cell differences are the more direct reading of these runs.")
    return text


def reproduced(cs: CaseStudy, paper_delta: float) -> str:
    """A short verdict on a case study's change in phi against the paper's, for a results table:
    'yes' (same sign, paired interval excludes zero), 'direction only (interval contains 0)' (or
    '(no paired interval)' when the two tables hold different cells), 'no (opposite sign...)' or
    'not fitted'."""
    if not cs.ok:
        return "not fitted"
    ci = cs.delta_phi_ci
    why = "no paired interval" if ci is None else "interval contains 0"
    unresolved = ci is None or ci[0] <= 0 <= ci[1]
    if (cs.delta_phi > 0) == (paper_delta > 0):
        return f"direction only ({why})" if unresolved else "yes"
    return "no (opposite sign" + (f", {why})" if unresolved else ")")


def checked_fits(key: str, fits, cs, active: bool = True) -> str:
    """The nbval check of a case study's fit table (`fits`: one row per fit with runs, phi,
    phi_lo, phi_hi, alpha, beta, E, r2) and of its change in phi: run counts exactly, fitted
    numbers within tolerances of the recorded references (`looped.checks.checked`)."""
    from . import checks
    lines = ["fits: " + ", ".join(f"{row.fit}: {int(row.runs)} runs" for row in fits.itertuples())]
    tol = {"phi": 0.02, "phi_lo": 0.05, "phi_hi": 0.05, "alpha": 0.02, "beta": 0.02, "E": 0.05, "r2": 1e-3}
    measured = {f"{row.fit} {k}": getattr(row, k) for row in fits.itertuples() for k in tol}
    tolerances = {f"{row.fit} {k}": t for row in fits.itertuples() for k, t in tol.items()}
    if cs.ok:
        measured["change in phi"], tolerances["change in phi"] = cs.delta_phi, 0.02
        if cs.delta_phi_ci:
            measured["change lo"], measured["change hi"] = cs.delta_phi_ci
            tolerances["change lo"] = tolerances["change hi"] = 0.05
    lines.append(checks.checked(key, measured, tolerances, active=active))
    return "\n".join(lines)
