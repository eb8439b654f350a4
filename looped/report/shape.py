"""The page "Is r^φ the right shape?": its tables, figure and verdict labels, from the committed results
of `looped shape` (`looped.studies.shape.read_results`).  The page writes its own words."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..studies.paper import PAPER_PHI, PAPER_PHI_CI
from .palette import OURS_COLOR, PAPER_COLOR

MAPPINGS = {"power": "power rᵠ", "linear": "linear r", "bounded": "bounded", "free": "free (one φ per r)"}
SETS = {"cpu-main": "ours: main study", "cpu-truncated": "ours: truncated BPTT", "cpu-hyper": "ours: hyperconnections",
        "qlabs-grid": "other lab: loop grid", "qlabs-ladders": "other lab: ladders", "paper-minima": "paper: 24 minima"}
SETS |= {k.replace("cpu-", "cpu3-"): v.replace("ours:", "ours (v3):") for k, v in SETS.items() if k.startswith("cpu-")}
STYLE = {  # every estimate here is a fit of ours: black and greys, told apart by line and marker
    "power": dict(color=OURS_COLOR, ls="-", marker="o"), "linear": dict(color="0.6", ls=":", marker=""),
    "bounded": dict(color=OURS_COLOR, ls="--", marker="^"), "free": dict(color="0.45", ls="none", marker="s")}
SCALE = 1000      # held-out RMSE of log loss, shown in thousandths (about 0.1% of the loss each)
YLIM = (-0.3, 1.9)   # φ-equivalents; an interval past the frame is cut there


def side(lo: float, hi: float) -> str:
    """Where an interval of a score difference (power's RMSE minus another's) lies: 'better' (above 0:
    the other mapping predicts better), 'worse' (below 0) or 'undecided' (it straddles 0)."""
    return "better" if lo > 0 else "worse" if hi < 0 else "undecided"


def extrapolation(results: dict) -> pd.DataFrame:
    """Each run set's extrapolation split (the r above half the largest, held out), one row per mapping."""
    h = results["heldout"]
    return h[h.extrapolation.astype(bool)]


def verdicts(results: dict, mapping: str = "bounded") -> pd.Series:
    """Per run set with held-out splits, how `mapping` does against the power law where it extrapolates:
    'better', 'worse' or 'undecided' (`side` of the bootstrap interval of the difference)."""
    x = extrapolation(results)
    x = x[x.mapping == mapping].set_index("set")
    return pd.Series({s: side(r.gain_lo, r.gain_hi) for s, r in x.iterrows()}, name=mapping)


def overall(labels) -> str:
    """One label for several run sets' verdicts (`verdicts`) on a mapping against the power law."""
    s = set(labels)
    if s == {"undecided"}:
        return "within the noise on every run set"
    if len(s) == 1:
        return f"{s.pop()} on every run set"
    if {"better", "worse"} <= s:
        return "better on some run sets and worse on others"
    return f"{(s - {'undecided'}).pop()} on some run sets, within the noise on the rest"


def phi_frame(results: dict) -> tuple[pd.DataFrame, dict]:
    """The φ-equivalents as the reader sees them, one row per (run set, mapping) and a column per r
    ('0.641 [0.552, 0.805]'), and the same numbers by name for the checks ('<set> <mapping> r=<r> phi')."""
    t = results["phi_equivalent"].query("mapping != 'linear'")
    cells = t.assign(text=[f"{p:.3f} [{lo:.2f}, {hi:.2f}]" for p, lo, hi in zip(t.phi, t.lo, t.hi)],
                     r=t.r.map(lambda r: f"r = {r:g}"))
    frame = cells.pivot_table(index=["set", "mapping"], columns="r", values="text", aggfunc="first", sort=False)
    frame = frame[sorted(frame.columns, key=lambda c: float(c[4:]))].fillna("").reset_index().rename_axis(columns=None)
    frame = frame.assign(set=frame.set.map(SETS), mapping=frame.mapping.map(MAPPINGS))
    measured = {f"{x.set} {x.mapping} r={x.r:g} {k}": getattr(x, k) for x in t.itertuples()
                for k in ("phi", "lo", "hi")}
    return frame.rename(columns={"set": "run set"}), measured


def heldout_phi_frame(results: dict) -> pd.DataFrame:
    """At each extrapolation's held-out r, the φ-equivalent each mapping fitted to the smaller r predicts,
    and the held-out runs' own (the free mapping's row)."""
    x = extrapolation(results)[["set", "split"]].drop_duplicates()
    h = results["heldout_phi"].merge(x, on=["set", "split"])
    t = h.pivot_table(index=["set", "r"], columns="mapping", values="phi", sort=False).reset_index()
    return t.assign(set=t.set.map(SETS))[["set", "r", "power", "bounded", "free"]]


def heldout_frame(results: dict, sets=None) -> pd.DataFrame:
    """One row per (run set, split, mapping): held-out runs, RMSE of log loss and its 95% interval, and
    power's RMSE minus it with its interval (x SCALE), and the verdict of that interval."""
    h = results["heldout"]
    h = h[h.set.isin(sets)] if sets is not None else h
    return pd.DataFrame({"run set": h.set.map(SETS), "held out": h.split, "mapping": h.mapping.map(MAPPINGS),
                         "n_test": h.n_test, "rmse": SCALE * h.rmse, "rmse_lo": SCALE * h.rmse_lo,
                         "rmse_hi": SCALE * h.rmse_hi, "gain": SCALE * h.gain, "gain_lo": SCALE * h.gain_lo,
                         "gain_hi": SCALE * h.gain_hi,
                         "against power": ["" if m == "power" else side(lo, hi)
                                           for m, lo, hi in zip(h.mapping, h.gain_lo, h.gain_hi)]})


def ic_frame(results: dict) -> pd.DataFrame:
    """In-sample fits per run set and mapping: free parameters, RMSE of log loss (x SCALE), and AICc and
    BIC relative to the power law's (negative: preferred over it)."""
    t = results["in_sample"]
    base = t[t.mapping == "power"].set_index("set")
    return pd.DataFrame({"run set": t.set.map(SETS), "mapping": t.mapping.map(MAPPINGS), "n_runs": t.n_runs, "k": t.k,
                         "rmse": SCALE * t.rmse, "d_aicc": t.aicc - t.set.map(base.aicc),
                         "d_bic": t.bic - t.set.map(base.bic)})


def regime_frame(results: dict) -> pd.DataFrame:
    """Where each run set sits: design, runs, loop counts, tokens per unique parameter, passes over its pool."""
    g = results["regime"]
    return pd.DataFrame({"run set": g.set.map(SETS), "design": g.design, "runs": g.n_runs,
                         "r": g.r_levels.map(lambda v: ", ".join(f"{x:g}" for x in v)),
                         "tpp": [f"{lo:.0f}-{hi:.0f}" if lo >= 1 else f"{lo:.1f}-{hi:.0f}"
                                 for lo, hi in zip(g.tokens_per_param_min, g.tokens_per_param_max)],
                         "epochs": g.epochs.astype(float)})


def plot_phi_equivalents(results: dict, axes, sets) -> None:
    """One panel per run set: each mapping's φ-equivalent per r (the φ with r^φ = its multiplier) and its
    95% interval, beside the paper's constant φ and its interval (orange)."""
    phi = results["phi_equivalent"]
    for ax, name in zip(np.ravel(axes), sets):
        t = phi[phi.set == name]
        ax.set_title(SETS[name], fontsize=12)
        if t.empty:   # a study that has not run yet (the second CPU study's case studies)
            ax.text(0.5, 0.5, "no runs yet", ha="center", va="center", transform=ax.transAxes)
            continue
        ax.axhspan(*PAPER_PHI_CI, color=PAPER_COLOR, alpha=0.15, lw=0)
        ax.axhline(PAPER_PHI, color=PAPER_COLOR, ls="--", lw=1.2, label="the paper's φ")
        for i, (m, style) in enumerate(STYLE.items()):
            u = t[t.mapping == m].sort_values("r")
            x = u.r * 2 ** ((i - 1.5) * 0.03)             # side by side, so the intervals do not hide each other
            if m != "linear":
                ax.errorbar(x, u.phi, yerr=[u.phi - u.lo, u.hi - u.phi], color=style["color"], ls="none", lw=1,
                            capsize=2)
            ax.plot(x, u.phi, label=MAPPINGS[m], ms=5, mfc="white" if m == "free" else style["color"], **style)
        ax.set_xscale("log", base=2)
        ax.set_ylim(*YLIM)
        rs = sorted(t.r.unique())
        ax.set_xticks(rs, [f"{r:g}" for r in rs])
        ax.set_xlim(min(rs) / 1.3, max(rs) * 1.3)
        ax.minorticks_off()
        ax.set_xlabel("r")
    first = np.ravel(axes)[0]
    first.set_ylabel("φ-equivalent")
    first.figure.legend(*first.get_legend_handles_labels(), loc="outside lower center", ncol=5,
                        fontsize=11, frameon=False)       # 11 pt: about 11 px on a 9-inch figure
