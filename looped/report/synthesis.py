"""The conclusion's synthesis: every estimate of φ in the book and every change of φ its case
studies report, each with its 95% interval and the paper's value beside it, in one figure.

Nothing is retyped: the rows come from the fits and committed results the chapters read
(`looped.studies.phi.estimates.our_phi_fits` and `phi_estimates`, `looped constancy`, `looped misfit`,
`looped case-studies`, the case-study refits of `looped.studies.case_studies.protocol.case_study`), under the
chapters' own names.  The conclusion writes its own words.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..studies.paper import PAPER_PHI, PAPER_PHI_CI
from ..studies.phi.estimates import phi_estimates
from .constancy import VARIANTS
from .formatting import power_of_ten
from .palette import LEGEND_FONTSIZE, OURS_COLOR, PAPER_COLOR

REJECT_Z = 3   # chapter 6's rule: a model whose r = 1 pairs lie more than 3 SE from zero is rejected
COLUMNS = ["group", "label", "source", "phi", "lo", "hi", "verdict"]
NAN = float("nan")


def _row(group, label, source, phi, lo=NAN, hi=NAN, verdict=False) -> dict:
    return dict(group=group, label=label, source=source, phi=float(phi), lo=float(lo), hi=float(hi),
                verdict=bool(verdict))


def phi_rows(fits: dict, robustness: dict, misfit: dict) -> pd.DataFrame:
    """Every estimate of φ in the book, one row per (estimate, source), in reading groups.

    ``fits``: `our_phi_fits` (joint fit, budget halves, case-study refits; the paper's
    published values beside them via `phi_estimates`); ``robustness``: `looped.studies.constancy.analysis.read_results`
    (chapter 4's refits and one φ per budget); ``misfit``: `looped.studies.constancy.misfit.read_results`
    (the counting conventions, with the paper's minima refitted, and the r = 1 anchors).
    Columns: group, label, source ('paper' or 'ours'), phi, lo, hi (NaN where no interval),
    verdict (the main fit)."""
    est = {(r.label, r.source): r for r in phi_estimates(fits).itertuples()}
    conv = misfit["conventions"].set_index(["data", "head"])
    refit = robustness["robustness"].set_index("variant")
    anchors = misfit["anchors"].set_index(["design", "anchor"])
    rows = []

    def both(group, label, key, verdict=False):
        for source in ("paper", "ours"):
            e = est.get((key, source))
            if e is not None and e.phi == e.phi:
                rows.append(_row(group, label, source, e.phi, e.lo, e.hi, verdict and source == "ours"))

    def ours(group, label, phi, lo, hi):
        rows.append(_row(group, label, "ours", phi, lo, hi))

    g = "main fit, how N is counted (ch. 3, 4)"
    both(g, "joint fit, the paper's counting", "joint fit", verdict=True)
    for head, label in ((False, "the paper's 24 minima, refitted"), (True, "LM head counted in N")):
        p = conv.loc[("paper_minima", head)]
        rows.append(_row(g, label, "paper", p.phi, p.phi_lo, p.phi_hi))
        if head:
            o = conv.loc[("ours", head)]
            ours(g, label, o.phi, o.phi_lo, o.phi_hi)
    v = refit.loc["embedding_and_head_in_n_once"]
    ours(g, VARIANTS["embedding_and_head_in_n_once"], v.phi, v.phi_lo, v.phi_hi)

    g = "which runs (ch. 3, 4)"
    both(g, "lower budgets", "lower budgets")
    both(g, "upper budgets", "upper budgets")
    for key in ("without_r2", "without_r8", "without_lowest_budget", "without_highest_budget", "cell_interiors"):
        if key in refit.index:
            v = refit.loc[key]
            ours(g, VARIANTS[key], v.phi, v.phi_lo, v.phi_hi)

    g = "one budget at a time (ch. 4)"
    for b in robustness["per_budget"].itertuples():
        ours(g, f"C = {power_of_ten(b.budget)} FLOPs", b.phi, b.phi_lo, b.phi_hi)

    g = "form of the law, r = 1 anchor (ch. 4)"
    v = refit.loc["kappa_r_phi"]
    ours(g, VARIANTS["kappa_r_phi"], v.phi, v.phi_lo, v.phi_hi)
    for key, label in ((("main", "looped_level"), "a free level for the looped runs"),
                       (("controls", "plain"), "lower budgets, plain r = 1 runs"),
                       (("controls", "linear"), "lower budgets, linear r = 1 controls")):
        if key in anchors.index:
            a = anchors.loc[key]
            ours(g, label, a.phi, a.phi_lo, a.phi_hi)

    g = "one φ per r (ch. 4)"
    for r in (2, 4, 8):
        v = refit.loc[f"per_r_phi_{r}"]
        ours(g, VARIANTS[f"per_r_phi_{r}"].split(": ")[-1], v.phi, v.phi_lo, v.phi_hi)

    g = "case studies, the paper's protocol (ch. 5, 6)"
    both(g, "case-study baseline", "case-study baseline")
    both(g, "truncated backprop", "truncated BPTT")
    both(g, "hyperconnections", "hyperconnections")
    out = pd.DataFrame(rows, columns=COLUMNS)
    seen, drop = {}, []
    paper_labels = set(out[out.source == "paper"].label)
    for i, r in out[out.source == "ours"].iterrows():   # one fit under two names: drawn once, or named
        key = (round(r.phi, 9), round(r.lo, 9), round(r.hi, 9))
        if key not in seen:
            seen[key] = r.label
        elif r.label in paper_labels:                   # kept beside the paper's value, with its twin's name
            out.loc[out.label == r.label, "label"] = f"{r.label} (= {seen[key]})"
        else:
            drop.append(i)
    return out.drop(index=drop).reset_index(drop=True)


def dphi_rows(truncated, hyper, paired: dict, paper: pd.DataFrame) -> pd.DataFrame:
    """Every change of φ the case studies report, one row per (estimator, source).

    ``truncated``, ``hyper``: the chapters' `CaseStudy` refits (the paper's protocol, with the
    shared-resample interval); ``paired``: `looped.studies.case_studies.analysis.read_results` (twin
    pairs, the law held at the main fit); ``paper``: the paper's fits (`case_studies.paper_fits`),
    whose Δφ stands beside the protocol row.  ``verdict`` marks the estimate each chapter's rule
    reads: truncation at matched tokens, hyperconnections with an offset per width and the
    linear r = 1 anchor."""
    rows = []

    def protocol(group, cs, variant_fit):
        base = paper.loc["baseline_four_lower_budgets", "phi"]
        rows.append(_row(group, "each arm refitted (the paper's protocol)", "paper",
                         paper.loc[variant_fit, "phi"] - base))
        if cs is not None and cs.ok:
            lo, hi = cs.delta_phi_ci or (NAN, NAN)
            rows.append(_row(group, "each arm refitted (the paper's protocol)", "ours", cs.delta_phi, lo, hi))

    def estimate(study: str, name: str) -> pd.Series:
        return paired["studies"][study]["estimates"].set_index("estimator").loc[name]

    g = "truncated backprop (ch. 5)"
    protocol(g, truncated, "truncated_bptt")
    for study, label, verdict in (("truncated", "twins, same budget", False),
                                  ("truncated_matched", "twins, matched tokens", True)):
        if study in paired["studies"]:   # (a family whose case studies have not run has none)
            e = estimate(study, "paired")
            rows.append(_row(g, label, "ours", e.estimate, e.lo, e.hi, verdict))

    g = "hyperconnections (ch. 6)"
    protocol(g, hyper, "hyperconnections_2lanes")
    hyper_paired = paired["studies"].get("hyper")
    models = hyper_paired["models"].set_index("model") if hyper_paired else pd.DataFrame()
    for key, label, verdict in (("width_linear", "twins, offset per width, linear anchor", True),
                                ("width_plain", "twins, offset per width, plain anchor", False),
                                ("none_linear", "twins, no offset", False)):
        if key in models.index:
            m = models.loc[key]
            rejected = abs(m.r1_z) > REJECT_Z
            rows.append(_row(g, label + (" (rejected)" if rejected else ""), "ours", m.estimate, m.lo, m.hi,
                             verdict and not rejected))
    return pd.DataFrame(rows, columns=COLUMNS)


def verdicts(paired: dict, paper: pd.DataFrame) -> pd.DataFrame:
    """Each case study's verdict estimate in one family's `looped case-studies` results, the one its
    chapter's rule reads (truncation: the twins at matched tokens; hyperconnections: an offset per width
    and the linear r = 1 anchor, unless its r = 1 pairs reject it), beside the paper's change of φ.
    Columns: case_study, dphi, lo, hi, paper_dphi, status ('read', 'not run', or 'rejected' by the
    r = 1 pairs); dphi, lo, hi NaN unless read."""
    base = paper.loc["baseline_four_lower_budgets", "phi"]
    rows = []
    for name, study, fit in (("truncated backprop", "truncated_matched", "truncated_bptt"),
                             ("hyperconnections", "hyper", "hyperconnections_2lanes")):
        e, status = pd.Series({"estimate": NAN, "lo": NAN, "hi": NAN}), "not run"
        res = paired["studies"].get(study)
        if res is not None and study == "hyper":
            m = res["models"].set_index("model").loc["width_linear"]
            e, status = (m, "read") if abs(m.r1_z) <= REJECT_Z else (e, "rejected")
        elif res is not None:
            e, status = res["estimates"].set_index("estimator").loc["paired"], "read"
        rows.append({"case_study": name, "dphi": float(e.estimate), "lo": float(e.lo), "hi": float(e.hi),
                     "paper_dphi": float(paper.loc[fit, "phi"] - base), "status": status})
    return pd.DataFrame(rows)


def verdict_reading(row) -> str:
    """What one verdict estimate says, in the words appendix C compares across corpora: where its
    interval lies against zero and against the paper's change; 'not analysed' or 'rejected' where
    there is no estimate to read."""
    if row["status"] != "read":
        return {"not run": "not analysed"}.get(row["status"], row["status"])
    side = "below zero" if row["hi"] < 0 else "above zero" if row["lo"] > 0 else "holds zero"
    paper = "holds" if row["lo"] <= row["paper_dphi"] <= row["hi"] else "excludes"
    return f"{side}, {paper} the paper's"


def carry_over(cases: pd.DataFrame, first: str = "v2", second: str = "v3") -> pd.DataFrame:
    """Each case study's verdict on two corpora (`verdicts` rows indexed by (corpus, case_study)):
    the reading of each, and whether the verdict carries over: both intervals on the same side of
    the paper's change (holding it or not) and overlapping each other, so that neither corpus
    contradicts the other ('carries over', 'does not carry over', or 'not analysed' while either
    corpus lacks it; a model its controls reject carries nothing over)."""
    rows = []
    for name in cases.loc[first].index:
        x, y = cases.loc[(first, name)], cases.loc[(second, name)]
        a, b = verdict_reading(x), verdict_reading(y)
        if "not analysed" in (a, b):
            same = "not analysed"
        else:
            agree = ("read", "read") == (x["status"], y["status"]) and a.split(", ")[1] == b.split(", ")[1]
            same = "carries over" if agree and x["lo"] <= y["hi"] and y["lo"] <= x["hi"] else "does not carry over"
        rows.append({"case_study": name, first: a, second: b, "verdict": same})
    return pd.DataFrame(rows).set_index("case_study")


def summary(phis: pd.DataFrame, dphis: pd.DataFrame) -> dict:
    """The counts the conclusion states: our distinct estimates of φ (the per-r exponents, which
    are not one φ, left out), how many lie above the paper's interval (point)
    and how many intervals lie entirely above it; and for each case study whether the paper's
    Δφ lies inside the interval of each of our estimators."""
    one_phi = phis[(phis.source == "ours") & (phis.group != "one φ per r (ch. 4)")]
    one_phi = one_phi.drop_duplicates(["phi", "lo", "hi"])      # a fit drawn under two names counts once
    out = {"n_ours": len(one_phi), "n_above": int((one_phi.phi > PAPER_PHI_CI[1]).sum()),
           "n_below": int((one_phi.phi < PAPER_PHI_CI[0]).sum()),
           "n_entirely_above": int((one_phi.lo > PAPER_PHI_CI[1]).sum()),
           "phi_min": float(one_phi.phi.min()), "phi_max": float(one_phi.phi.max())}
    for group, rows in dphis.groupby("group", sort=False):
        paper = rows[rows.source == "paper"].phi.iloc[0]
        key = "trunc" if group.startswith("truncated") else "hc"
        for r in rows[rows.source == "ours"].itertuples():
            out[f"{key}: {r.label}: contains the paper's"] = bool(r.lo <= paper <= r.hi)
    return out


def _forest(ax, rows: pd.DataFrame, frame: tuple, reference=None):
    """One panel: a row per label (the paper's square above our circle where both exist), under
    a header row per group (its name, italic, a rule above it), intervals cut at ``frame`` with
    their end written beside them, verdict rows' labels in bold.  Returns {(group, label): y}."""
    left, right = frame
    layout = []
    for g in dict.fromkeys(rows.group):
        layout.append((g, None))
        layout.extend((g, lab) for lab in dict.fromkeys(rows[rows.group == g].label))
    y_of = {key: -i for i, key in enumerate(layout)}
    style = {"paper": (PAPER_COLOR, "s", 0.18), "ours": (OURS_COLOR, "o", -0.18)}
    if reference is not None:
        value, band = reference
        if band is not None:
            ax.axvspan(*band, color=PAPER_COLOR, alpha=0.12, lw=0)
        ax.axvline(value, color=PAPER_COLOR, lw=1.1, ls="--")
    for (g, lab), y0 in y_of.items():
        if lab is None:
            if y0 < 0:
                ax.axhline(y0 + 0.5, color="0.3", lw=0.8)
            continue
        if y0 % 2 == 0:
            ax.axhspan(y0 - 0.5, y0 + 0.5, color="0.5", alpha=0.07, lw=0)
        here = rows[(rows.group == g) & (rows.label == lab)]
        single = here.source.nunique() == 1
        for r in here.itertuples():
            color, marker, dy = style[r.source]
            y = y0 + (0.0 if single else dy)
            if r.lo == r.lo and r.hi == r.hi:
                ax.plot([max(r.lo, left), min(r.hi, right)], [y, y], color=color, lw=1.8, solid_capstyle="butt")
                for end, edge, m, ha, dx in ((r.lo, left, "<", "left", 7), (r.hi, right, ">", "right", -7)):
                    if (end < edge) if m == "<" else (end > edge):
                        ax.plot(edge, y, marker=m, color=color, ms=5, clip_on=False, zorder=4)
                        ax.annotate(f"to {end:.2f}".replace("-", "\u2212"), (edge, y), xytext=(dx, 2),
                                    textcoords="offset points", ha=ha, va="bottom", fontsize=LEGEND_FONTSIZE - 1,
                                    color=color)
            ax.plot(r.phi, y, marker=marker, color=color, ms=6, mec="white", mew=0.6, ls="", zorder=3)
    ax.set_yticks(list(y_of.values()), [g if lab is None else lab for g, lab in y_of])
    for tick, (g, lab) in zip(ax.get_yticklabels(), y_of):
        if lab is None:
            tick.set(style="italic", color="0.3")
        elif rows[(rows.group == g) & (rows.label == lab)].verdict.any():
            tick.set_fontweight("bold")
    ax.set_ylim(-len(layout) + 0.5, 0.5)
    ax.set_xlim(left, right)
    ax.tick_params(axis="both", labelsize=10)
    ax.tick_params(axis="y", length=0)
    ax.grid(alpha=0.3, axis="x")
    ax.yaxis.grid(False)
    return y_of


def _frame(rows: pd.DataFrame, fixed=(), pad: float = 0.08) -> tuple:
    """The x range: every point (and ``fixed`` values) with a margin; interval ends beyond it are cut."""
    vals = [*rows.phi.dropna(), *fixed]
    return min(vals) - pad, max(vals) + pad


def plot_every_phi(phis: pd.DataFrame, dphis: pd.DataFrame, axes=None):
    """The synthesis figure: above, every estimate of φ (`phi_rows`) with the paper's joint φ and
    interval as the orange band and φ = 0, 1 dotted; below, every change of φ (`dphi_rows`), the
    paper's Δφ as an orange square on each case study's protocol row and a dashed orange line
    through its group, zero solid.  Returns the two axes."""
    import matplotlib.pyplot as plt  # deferred: matplotlib only to draw
    n_phi, n_dphi = (t.groupby(["group", "label"]).ngroups + t.group.nunique() for t in (phis, dphis))  # + headers
    if axes is None:
        _, axes = plt.subplots(2, 1, figsize=(7.6, 0.25 * (n_phi + n_dphi) + 2.4),
                               gridspec_kw={"height_ratios": [n_phi + 1.2, n_dphi + 1.6]})
    top, bottom = axes
    _forest(top, phis, _frame(phis, (0.0, 1.0), 0.1), reference=(PAPER_PHI, PAPER_PHI_CI))
    for v in (0.0, 1.0):
        top.axvline(v, color="0.55", lw=0.7, ls=":")
    top.set_xlabel("fitted φ ($r$ passes of the shared block count as $r^φ$ unique copies)", fontsize=10)
    y_of = _forest(bottom, dphis, _frame(dphis, (0.0,), 0.1))
    bottom.axvline(0.0, color="0.3", lw=0.9)
    for g, rows in dphis[dphis.source == "paper"].groupby("group", sort=False):
        ys = [y for (grp, lab), y in y_of.items() if grp == g and lab is not None]
        bottom.plot([rows.phi.iloc[0]] * 2, [min(ys) - 0.45, max(ys) + 0.45], color=PAPER_COLOR, lw=1.1, ls="--")
    bottom.set_xlabel("change of φ, variant minus baseline (Δφ)", fontsize=10)
    handles = [top.plot([], [], color=PAPER_COLOR, marker="s", lw=1.8,
                        label="the paper (95% interval where published)")[0],
               top.plot([], [], color=OURS_COLOR, marker="o", lw=1.8, label="ours, 95% bootstrap interval")[0],
               top.fill_between([], [], color=PAPER_COLOR, alpha=0.12, label="the paper's joint φ and interval")]
    bottom.legend(handles=handles, fontsize=LEGEND_FONTSIZE, loc="upper center", ncol=2, frameon=False,
                  bbox_to_anchor=(0.5, -0.32 * 8 / (n_dphi + 1.6)))
    return top, bottom


def figure_values(phis: pd.DataFrame, dphis: pd.DataFrame) -> pd.DataFrame:
    """The figure's values in one frame (for the nbval-checked table): label, source, estimate,
    interval, the panel ('φ' or 'Δφ')."""
    both = pd.concat([phis.assign(panel="φ"), dphis.assign(panel="Δφ")], ignore_index=True)
    both["name"] = both.panel + " | " + both.group.str.split(" [(]").str[0] + " | " + both.label + " | " + both.source
    return both[["name", "phi", "lo", "hi"]].replace({np.nan: None}).astype({"phi": float, "lo": float, "hi": float})
