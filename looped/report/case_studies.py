"""One page for the two case-study chapters: truncated backpropagation and hyperconnections.

Both chapters follow the paper's Table 3 the same way: the variant's token gain at a fixed
budget, the law refitted on the variant's runs beside a baseline refitted at the same budgets,
the change in phi with its shared-resample bootstrap interval (both arms refitted on the same
resampled cells), the runs read in twin pairs with the law
held at the main fit (`looped.studies.case_studies.analysis`), and the best run of each (budget, r)
cell.  The helpers below build those tables, figures and numbers once; each chapter keeps its
own argument in Markdown and glues the numbers (`glue_all`).

Nothing in the package imports this module; the chapters do.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import memory
from ..fit import at_bounds
from ..solver import HI, LAW_PARAMS, LO
from ..studies.case_studies.analysis import read_results as read_paired
from ..studies.case_studies.protocol import CaseStudy, case_study_cells, case_study_runs, token_gain
from ..studies.paper import paper_table
from ..studies.sweep import cost, registry
from ..studies.sweep.study import Study
from .checks import CASE_STUDY_CHANGE, CASE_STUDY_FIT, checked
from .formatting import power_of_ten
from .palette import LEGEND_FONTSIZE, OURS_COLOR, SYMBOLS, r_color
from .synthesis import REJECT_Z
from .tables import Table

NAN = float("nan")


def paper_fits() -> pd.DataFrame:
    """The paper's fits (its Tables 2 and 3), one row per fit name, with phi and R^2."""
    return paper_table("fits").set_index("fit")


def gpu_cost(study: str, gpu: str = "H200") -> tuple[float, int]:
    """(GPU-hours, runs) of a named study on one ``gpu`` at the assumed model-FLOPs utilisation."""
    plan = Study(study).plan(memory.GPU_SPECS[gpu][0], cost.DEFAULT_GPU_MFU)
    return float(plan.est_seconds.sum() / 3600), len(plan)


def glue_all(values: dict) -> None:
    """Glue every value for the chapter's Markdown (``{glue:text}`name```), without showing it:
    numbers as floats (so a format such as ``:.3f`` applies), integers and strings as they are."""
    from myst_nb import glue  # deferred on purpose: only a notebook has it
    for name, value in values.items():
        if isinstance(value, (bool, np.bool_)):
            value = "yes" if value else "no"
        elif isinstance(value, (np.integer,)):
            value = int(value)
        elif isinstance(value, (float, np.floating)):
            value = float(value)
        glue(name, value, display=False)


# ------------------------------------------------------------------------ what a chapter reads

ARMS = {"truncated": (0, "truncated_matched"), "hyper": (1, "hyper")}   # arm -> (CASE_STUDIES index, paired key)


@dataclass(frozen=True)
class ChapterRuns:
    """The runs a case-study chapter reads under its parameters, and how far it may judge them."""
    main_runs: str        # the baseline arm's run folder
    study_runs: str       # the variant arm's run folder
    study: str            # the variant's named grid (its token accounting)
    analysed: bool        # the family's own runs, whose committed paired analysis has this arm
    reference_run: bool   # the parameters the prose and the checked references were written for


def chapter_runs(family: str, arm: str, main_runs=None, study_runs=None, study=None,
                 own_defaults: bool = True, fit_defaults: bool = True) -> ChapterRuns:
    """Resolve a case-study chapter's parameters: no folders named read the family's own studies
    (`own_defaults`: the chapter's other run parameters are at their defaults too); prose and
    references hold for the default family with the paper's fit settings (`fit_defaults`)."""
    index, key = ARMS[arm]
    main = registry.FAMILIES[family]["main"]
    variant = registry.CASE_STUDIES[main][index]
    family_run = own_defaults and (main_runs, study_runs, study) == (None, None, None)
    analysed = (family_run and registry.analysis_file("case_studies", family).exists()
                and key in read_paired(family=family)["studies"])
    return ChapterRuns(main_runs or f"runs/{main}", study_runs or f"runs/{variant}", study or variant, analysed,
                       family_run and family == registry.DEFAULT_FAMILY and fit_defaults)


# ------------------------------------------------------------------------------- token gain

def token_gain_summary(study: str = "paper-truncated") -> pd.DataFrame:
    """`token_gain` condensed per r and overall: runs, median / min / max of the token ratio."""
    t = token_gain(study)
    parts = [(str(r), g) for r, g in t.groupby("r")] + [("all", t)]
    return pd.DataFrame([dict(r=k, runs=len(g), median=g["ratio"].median(), min=g["ratio"].min(),
                              max=g["ratio"].max(), flops_ratio_median=g["flops_ratio"].median())
                         for k, g in parts])


def token_gains(studies, caption: str, digits: int = 3) -> tuple[Table, dict]:
    """The token gain of several named studies in one table (`token_gain_summary` of each, one
    block of rows per study), and the summaries by study, indexed by r ('all' for every run)."""
    summaries = {name: token_gain_summary(name) for name in studies}
    frame = pd.concat([t.assign(study=name) for name, t in summaries.items()], ignore_index=True)
    cols = ("median", "min", "max", "flops_ratio_median")
    table = Table(frame[["study", "r", "runs", *cols]], caption, headers={"flops_ratio_median": "FLOPs ratio (median)"},
                  formats={c: f"{{:.{digits}f}}" for c in cols})
    return table, {name: t.set_index("r") for name, t in summaries.items()}


# ------------------------------------------------------------------------------- refits

def reproduced(cs: CaseStudy, paper_delta: float) -> str:
    """A short verdict (at most three words) on a case study's change in phi against the paper's,
    for a results table, the same rule for every case study: 'yes' (the paired interval excludes
    zero on the paper's side), 'no (opposite sign)' (it excludes zero on the other side),
    'unresolved (spans 0)' when the interval contains zero, 'unresolved (unpaired)' when there
    is no paired interval, and 'not fitted'."""
    if not cs.ok:
        return "not fitted"
    ci = cs.delta_phi_ci
    if ci is None:
        return "unresolved (unpaired)"
    if ci[0] <= 0 <= ci[1]:
        return "unresolved (spans 0)"
    return "yes" if (cs.delta_phi > 0) == (paper_delta > 0) else "no (opposite sign)"


def edge_notes(cs: CaseStudy) -> list:
    """Notes flagging estimates of a case study that sit on the edge of the fitting box
    (log E = -3, i.e. E = e^-3 = 0.050 nats; phi = -3 or 3): a parameter there is a bound of the
    protocol, not an estimate, and a bootstrap percentile there means that part of the resamples
    ran into the edge, so the interval is open on that side.  Empty when nothing is on an edge."""
    notes = []
    for label, res in (("baseline", cs.baseline), (cs.name, cs.variant)):
        if res is None:
            continue
        for p in at_bounds(res):
            v = getattr(res, p)
            where = ("at the lower edge of the fitting box, e⁻³ ≈ 0.050 nats" if p == "E"
                     else f"at {v:.3f}, on the edge of the fitting box")
            notes.append(f"the {label} fit puts {SYMBOLS.get(p, p)} {where}: a bound, not an estimate")
        i = LAW_PARAMS.index("phi")
        lo, hi = res.ci.get("phi", (NAN, NAN))
        for end, v, box in (("lower", lo, LO[i]), ("upper", hi, HI[i])):
            if v == v and abs(v - box) < 1e-3:
                notes.append(f"the {end} end of the {label} fit's φ interval, {v:.3f}, is the edge of the fitting "
                             f"box: some resamples ran into it, so the interval is open on that side")
    return notes


def fit_numbers(cs: CaseStudy) -> dict:
    """A case study's fitted phi, its baseline's, their change and its paired interval (NaN where
    a fit was skipped or the bootstraps are not paired)."""
    has_base = cs.baseline is not None and cs.baseline.phi is not None
    lo, hi = cs.delta_phi_ci or (NAN, NAN)
    return {"base_phi": float(cs.baseline.phi) if has_base else NAN,
            "phi": float(cs.variant.phi) if cs.ok else NAN,
            "dphi": float(cs.delta_phi) if cs.ok else NAN, "dphi_lo": lo, "dphi_hi": hi}


def budget_facts(cs: CaseStudy, main_runs) -> dict:
    """Which budgets a case study covers against its main study: their number, the lowest and the
    highest (as powers of ten), the main study's number, whether they are its lowest ones, and
    the runs the baseline refits."""
    main_budgets = sorted(case_study_runs(main_runs, None)[0]["budget"].unique())
    rest = set(main_budgets) - set(cs.budgets)
    ends = (power_of_ten(min(cs.budgets)), power_of_ten(max(cs.budgets))) if cs.budgets else ("-", "-")
    return {"n_budgets": len(cs.budgets), "n_main_budgets": len(main_budgets),
            "budget_lo": ends[0], "budget_hi": ends[1],
            "lower": len(cs.budgets) < len(main_budgets) and all(b <= min(rest) for b in cs.budgets),
            "baseline_runs": len(cs.baseline_runs)}


def fits_table(studies, check: str, change_check: str, active: bool = True) -> tuple[Table, pd.DataFrame]:
    """The refits of one or more case studies beside the paper's Table 3, and the change in phi
    of each with its shared-resample bootstrap interval, in one table (and its frame).

    ``studies``: one (CaseStudy, change label, baseline label, (paper baseline fit, paper variant
    fit)) per case study; the change label names its change in the checks (None for a single
    one), a paper fit name may be None (no such fit in the paper).  The fitted numbers are
    checked against the recorded references ``check`` (the fits) and ``change_check`` (the
    changes in phi), both 'chapter/cell'."""
    paper = paper_fits()
    rows, measured, tolerances, changes, change_tol, notes = [], {}, {}, {}, {}, []
    for cs, change_label, base_label, keys in studies:
        fits = cs.table().assign(fit=[base_label, cs.name])
        for row, key in zip(fits.to_dict("records"), keys):
            row.update(paper_phi=paper.loc[key, "phi"] if key else NAN, paper_r2=paper.loc[key, "r2"] if key else NAN)
            rows.append(row)
            for col, tol in CASE_STUDY_FIT.items():
                measured[f"{row['fit']} {col}"], tolerances[f"{row['fit']} {col}"] = row[col], tol
        lo, hi = cs.delta_phi_ci or (NAN, NAN)
        paper_delta = paper.loc[keys[1], "phi"] - paper.loc[keys[0], "phi"] if all(keys) else NAN
        rows.append({"fit": f"Δφ = {cs.name} − {base_label}", "phi": cs.delta_phi if cs.ok else NAN,
                     "phi_lo": lo, "phi_hi": hi, "paper_phi": paper_delta})
        prefix = f"{change_label} " if change_label else ""
        for col, value in (("change in phi", cs.delta_phi if cs.ok else NAN), ("change lo", lo), ("change hi", hi)):
            changes[prefix + col] = value
            if value == value:   # what was measured
                change_tol[prefix + col] = CASE_STUDY_CHANGE[col]
        notes.append(f"note ({cs.name}): {cs.note or 'both fits done'}")
    frame = pd.DataFrame(rows)[["fit", "runs", "phi", "phi_lo", "phi_hi", "paper_phi", "alpha", "beta", "E", "r2",
                                "paper_r2"]]
    dash = lambda fmt: lambda v: "-" if v != v else fmt.format(v)   # noqa: E731
    table = Table(frame, "Refits on the case-study budgets beside the paper's Table 3 (which gives no intervals); "
                  "the Δφ rows: the change in φ with its shared-resample bootstrap 95% interval",
                  headers={"phi_lo": "φ 2.5%", "phi_hi": "φ 97.5%", "paper_phi": "paper φ", "paper_r2": "paper R²"},
                  formats={"paper_phi": dash("{:.3f}"), "runs": dash("{:.0f}"), "paper_r2": dash("{:.4f}")},
                  check=check, tolerances=tolerances, measured=measured,
                  exact=["fit", "runs", "paper_phi", "paper_r2"],
                  active=active, notes=[checked(change_check, changes, change_tol, active=active), *notes])
    return table, frame


# ------------------------------------------------------------------------------- pairs

# The paired analysis runs on every run of each arm, seed-43/44 replicates included, so its "paper's
# protocol" row is not the refit of the seed-42 runs the chapter shows above it.
ESTIMATOR_LABELS = {"paper": "the paper's protocol (each arm refitted), replicates included",
                    "paired": "paired, law held at the main fit",
                    "paired_offset": "paired, plus one offset for every r"}


def paired_estimates(res: dict) -> pd.DataFrame:
    """A case study's estimates of the change in phi (`looped.studies.case_studies.analysis.read_results`), one row
    per estimator, beside how each did in the simulation at that change (bias, coverage)."""
    est = res["estimates"].set_index("estimator")
    sim = res["simulation"].set_index("estimator") if len(res["simulation"]) else pd.DataFrame()
    rows = []
    for key, label in ESTIMATOR_LABELS.items():
        e = est.loc[key]
        s = sim.loc[key] if key in sim.index else {}
        rows.append({"estimator": label, "dphi": e.estimate, "lo": e.lo, "hi": e.hi, "runs": int(e.n),
                     "sim_bias": s.get("bias", np.nan), "sim_coverage": s.get("coverage", np.nan)})
    return pd.DataFrame(rows)


def interval_end(v: float) -> str:
    """An end of a Δφ interval as printed: signed to three decimals, '-' where none, and
    'below −3' where it is the edge of the fitting box (φ = −3): resamples ran into the edge, so
    the interval is open on that side and −3 is not its end."""
    if v != v:
        return "-"
    if abs(v - LO[LAW_PARAMS.index("phi")]) < 1e-3:
        return "below −3"
    return f"{v:+.3f}"


def estimates_table(settings: dict, caption: str) -> Table:
    """The paired estimates of the change in phi of one or more paired analyses (``settings``:
    {label: `read_results` study}), one block of rows per setting, with how each estimator did in
    simulation where it was simulated ('-' where not).  An interval end on the fitting box's edge
    is printed 'below −3' (`interval_end`)."""
    frame = pd.concat([paired_estimates(res).assign(setting=label) for label, res in settings.items()],
                      ignore_index=True)
    signed = lambda v: "-" if v != v else f"{v:+.3f}"   # noqa: E731
    return Table(frame[["setting", "estimator", "dphi", "lo", "hi", "runs", "sim_bias", "sim_coverage"]], caption,
                 headers={"dphi": "Δφ", "lo": "2.5%", "hi": "97.5%", "sim_bias": "simulated bias",
                          "sim_coverage": "simulated coverage"},
                 formats={"dphi": signed, "sim_bias": signed, "lo": interval_end, "hi": interval_end}
                 | {"sim_coverage": lambda v: "-" if v != v else f"{v:.0%}"})


def plot_paired_gains(ax, series: dict, markers=("o", "^", "D"), pure_error: float | None = None):
    """The paired gain by r (variant minus baseline loss of twin runs, nats) with its 95% interval,
    one series per paired analysis (``series``: {label: its ``gains_by_r`` table}).  Points are
    coloured by r (`looped.report.palette.R_COLORS`); the series differ by marker and line style
    (circles joined by a solid line, triangles by a dashed one), set slightly apart so their
    intervals do not overlap.  A dotted line marks no change; with ``pure_error`` (nats), a grey
    band of ±√2 times it around zero shows the seed noise of one pair's difference."""
    styles = ("-", "--", ":")
    if pure_error is not None and pure_error == pure_error:
        band = np.sqrt(2) * pure_error
        ax.axhspan(-band, band, color="0.85", lw=0, zorder=0,
                   label=f"±√2 × pure error ({band:.3f}): one pair's seed noise")
    n = len(series)
    for j, ((label, gains), marker) in enumerate(zip(series.items(), markers)):
        g = gains.sort_values("r")
        x = np.log2(g["r"].astype(float)) + 0.12 * (j - (n - 1) / 2)
        ax.plot(x, g["mean"], color="0.45", lw=1.0, ls=styles[j % 3], zorder=1)
        for xi, row in zip(x, g.itertuples()):
            ax.errorbar(xi, row.mean, yerr=[[row.mean - row.lo], [row.hi - row.mean]], fmt=marker, ms=7,
                        color=r_color(row.r), mec=OURS_COLOR, mew=0.6, capsize=3, zorder=3)
        ax.plot([], [], color="0.45", ls=styles[j % 3], marker=marker, mfc="white", mec=OURS_COLOR, label=label)
    ax.axhline(0, color="0.55", lw=0.8, ls=":")
    rs = sorted({int(r) for g in series.values() for r in g["r"]})
    ax.set_xticks(np.log2(rs), [f"r = {r}" for r in rs])
    ax.set_ylabel("paired gain: variant − baseline loss (nats)")
    ax.grid(alpha=0.3, axis="y")
    ax.xaxis.grid(False)
    ax.legend(fontsize=LEGEND_FONTSIZE, loc="best")
    return ax


# ------------------------------------------------------------------------------- cells

def cells_table(cs: CaseStudy, baseline: str, variant: str) -> tuple[Table, pd.DataFrame, pd.Series]:
    """The best run of each (budget, r) cell, the variant (short name ``variant``) against the
    baseline (``baseline``), as a table, its frame (`case_study_cells`) and the mean difference
    per r over the budgets (negative: the variant reached the lower loss)."""
    cells = case_study_cells(cs.baseline_runs, cs.variant_runs)
    table = Table(cells[["budget", "r", "best_n_baseline", "best_n_variant", "loss_baseline", "loss_variant", "delta"]],
                  f"The best run of each (budget, r) cell: {variant} against {baseline}",
                  formats={"loss_baseline": "{:.3f}", "loss_variant": "{:.3f}", "delta": "{:+.3f}"},
                  headers={"best_n_baseline": f"best N, {baseline}", "best_n_variant": f"best N, {variant}",
                           "loss_baseline": f"best loss, {baseline}", "loss_variant": f"best loss, {variant}"},
                  notes=[] if len(cells) else ["no cell has runs of both kinds yet"])
    by_r = cells.groupby("r")["delta"].mean() if len(cells) else pd.Series(dtype=float)
    return table, cells, by_r


def cost_trend_claims(trend: dict) -> dict:
    """Chapter 5's sentence on truncation's cost at matched tokens against r (`paired.gain_trend`
    of the twin pairs, from the records): a lower φ would make the cost grow with r."""
    return {"no resolved rise of the cost with r": not (trend["slope"] > 0 and trend["t"] >= 2)}


def cost_trend_labels(trend: dict) -> dict:
    """How chapter 5 reads that slope: its direction, and whether abs(t) >= 2 resolves it."""
    return {"cost_trend_direction": "falls" if trend["slope"] < 0 else "rises",
            "cost_trend_resolved": "resolved" if abs(trend["t"]) >= 2 else "not resolved"}


def token_labels(tokens: dict) -> dict:
    """Chapter 5's reading of the law's data term on the twin pairs (`paired.token_term_check`): how
    much it over- (or under-) prices the extra tokens, and whether abs(t) >= 2 resolves that."""
    over = tokens["predicted"] / tokens["observed"] - 1
    return {"token_overprice": abs(over), "token_prices": "overprices" if over > 0 else "underprices",
            "token_resolved": "resolved" if abs(tokens["t"]) >= 2 else "not resolved"}


def noise_claims(models: pd.DataFrame, pair_noise: float) -> dict:
    """Chapter 6's sentences on the offset models (`paired_study.read_results`' models table)
    against the pair noise (√2 times the pure error, from the records) and the r = 1 controls."""
    m = models.set_index("model") if "model" in models.columns else models
    return {"the per-width model fits close to pair noise": m.loc["width_linear", "resid_sd"] < 1.5 * pair_noise,
            "the model without an offset does not": m.loc["none_linear", "resid_sd"] > 3 * pair_noise,
            "the controls accept the linear per-width model": abs(m.loc["width_linear", "r1_z"]) <= REJECT_Z}


def anchor_labels(models: pd.DataFrame) -> dict:
    """Chapter 6's reading of the plain r = 1 anchor: what its controls say of its two models
    ('reject' or 'accept' both, or 'split on' them, by the 3-SE rule), and whether the anchor
    decides the sign (the linear and plain per-width intervals on two sides of zero, or not)."""
    m = models.set_index("model") if "model" in models.columns else models
    z = m.loc[["width_plain", "constant_plain"], "r1_z"].abs()
    said = "reject" if (z > REJECT_Z).all() else "accept" if (z <= REJECT_Z).all() else "split on"
    lin, plain = m.loc["width_linear"], m.loc["width_plain"]
    lower = [row["hi"] < 0 for row in (lin, plain)]
    effect = ("with either anchor they lower it" if all(lower)
              else "the anchor decides whether they lower it" if any(lower) else "with neither anchor do they lower it")
    return {"hc_plain_controls": said, "hc_anchor_effect": effect}
