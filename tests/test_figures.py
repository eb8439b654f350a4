"""The forest plot of every phi and the N_eff collapse figure, on small synthetic inputs."""
import math
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from looped.fit import FitResult  # noqa: E402
from looped.law import Law  # noqa: E402
from looped.report import figures  # noqa: E402
from looped.studies.paper import PAPER_PHI  # noqa: E402


def _law(phi):
    return FitResult(Law(A=28.0, alpha=0.2, B=900.0, beta=0.37, E=1.57, phi=phi), r2=1.0, huber=0.0, n_runs=0,
                     restarts=0)


def _runs(phi=0.5):
    """Two budgets, r = 1 and 4, four widths each: losses from a law with the given phi."""
    rows = []
    for budget in (1e17, 1e18):
        for r in (1, 4):
            for d in (256, 512, 1024, 2048):
                n_rec = 0.0 if r == 1 else 96.0 * d * d / r          # eight blocks, shared by r passes
                n_once = 24.0 * d * d + (96.0 * d * d if r == 1 else 0.0)
                tokens = budget / (6 * (n_once + r * n_rec))
                rows.append(dict(budget=budget, r=r, n_once=n_once, n_rec=n_rec, tokens=tokens))
    df = pd.DataFrame(rows)
    law = _law(phi)
    neff = df.n_once + df.r ** phi * df.n_rec
    df["loss"] = law.E + law.A * neff ** -law.alpha + law.B * df.tokens ** -law.beta
    return df


ENTRIES = [("joint fit", "paper", 0.459, 0.41, 0.53), ("joint fit", "ours", 0.9, 0.7, 1.1),
           ("halves", "paper", 0.44, math.nan, math.nan), ("halves", "ours", math.nan, math.nan, math.nan),
           ("case study", "ours", 0.8, -3.0, 1.2)]


def _markers(ax, marker):
    return [ln for ln in ax.lines if ln.get_marker() == marker and len(ln.get_xdata()) == 1
            and ln.get_label().startswith("_")]


def test_phi_forest_one_row_per_fit_and_point_per_estimate():
    fig, ax = plt.subplots()
    figures.plot_phi_forest(ENTRIES, ax=ax)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["joint fit", "halves", "case study"]
    assert len(_markers(ax, "s")) == 2                 # the paper's two estimates
    assert len(_markers(ax, "o")) == 2                 # ours: the not-fitted one is text, not a point
    texts = [t.get_text() for t in ax.texts]
    assert "ours: not fitted" in texts
    assert any(t.startswith("to -3.00 (box edge)") for t in texts)      # cut at the frame, end written
    assert ax.get_xlim()[0] > -3.0
    assert "φ" in ax.get_xlabel()
    assert any(np.allclose(ln.get_xdata(), PAPER_PHI) for ln in ax.lines if ln.get_linestyle() == "--")
    plt.close(fig)


def test_phi_forest_takes_a_dataframe_and_rejects_bad_input():
    df = pd.DataFrame(ENTRIES, columns=["label", "source", "phi", "lo", "hi"])
    ax = figures.plot_phi_forest(df)
    assert len(ax.get_yticks()) == 3
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="unknown source"):
        figures.plot_phi_forest([("joint fit", "theirs", 0.5, 0.4, 0.6)])
    with pytest.raises(ValueError, match="no estimates"):
        figures.plot_phi_forest(df.iloc[0:0])
    with pytest.raises(ValueError, match="missing column"):
        figures.plot_phi_forest(df.drop(columns=["hi"]))
    with pytest.raises(ValueError, match="lo > hi"):
        figures.plot_phi_forest([("joint fit", "ours", 0.5, 0.6, 0.4)])
    plt.close("all")


def test_neff_collapse_three_panels_and_a_legend():
    runs = _runs(0.5)
    axes = figures.plot_neff_collapse(runs, _law(0.5))
    assert len(axes) == 4 and not axes[3].axison                  # the fourth panel holds the legend
    titles = [ax.get_title() for ax in axes[:3]]
    assert titles[0].startswith("φ = 0 (unique N)") and "(fitted)" in titles[1]
    assert titles[2].startswith("φ = 1 (every pass counted)")
    cells = runs.groupby(["budget", "r"]).ngroups
    for ax in axes[:3]:
        drawn = [ln for ln in ax.lines if len(ln.get_xdata()) and ln.get_linestyle() == "-"]
        assert len(drawn) == cells and sum(len(ln.get_xdata()) for ln in drawn) == len(runs)
        assert {ln.get_color() for ln in drawn} == {figures.R_COLORS[1], figures.R_COLORS[4]}
        assert ax.get_xscale() == "log"
    # at phi = 1 every looped run sits at the N_eff of its unrolled model, at phi = 0 at its unique N
    looped = runs[runs.r == 4].sort_values(["budget", "n_once"])
    x1 = np.sort(np.concatenate([ln.get_xdata() for ln in axes[2].lines if ln.get_color() == figures.R_COLORS[4]
                                 and len(ln.get_xdata())]))
    np.testing.assert_allclose(x1, np.sort(looped.n_once + 4 * looped.n_rec))
    rmse = [float(t.split("RMSE ")[1].split()[0]) for t in titles]
    assert rmse[1] == 0.0 and min(rmse[0], rmse[2]) > 0.001        # at the law's phi the runs lie on its curve
    # less the data term, every run at the law's phi sits on the dashed curve E + A N_eff^-alpha
    law = _law(0.5)
    for ln in (ln for ln in axes[1].lines if len(ln.get_xdata()) and ln.get_linestyle() == "-"):
        x, y = np.asarray(ln.get_xdata(), float), np.asarray(ln.get_ydata(), float)
        np.testing.assert_allclose(y, law.E + law.A * x ** -law.alpha, rtol=1e-9)
    assert sum(ln.get_linestyle() == "--" for ln in axes[1].lines if len(ln.get_xdata())) == 1
    # one x-range for all panels, holding every run of every panel
    limits = {ax.get_xlim() for ax in axes[:3]}
    assert len(limits) == 1
    (lo, hi), = limits
    assert lo < (looped.n_once + looped.n_rec).min() and hi > (looped.n_once + 4 * looped.n_rec).max()
    plt.close(axes[0].figure)


def test_neff_collapse_given_axes_and_bad_input():
    runs = _runs()
    fig, axes = plt.subplots(1, 3)
    out = figures.plot_neff_collapse(runs, _law(0.5), axes=axes)
    assert len(out) == 3 and out[2].get_legend() is not None
    plt.close(fig)
    with pytest.raises(ValueError, match="no phi"):
        figures.plot_neff_collapse(runs, _law(None))
    with pytest.raises(ValueError, match="missing column"):
        figures.plot_neff_collapse(runs.drop(columns=["tokens"]), _law(0.5))
    with pytest.raises(ValueError, match="no runs"):
        figures.plot_neff_collapse(runs.iloc[0:0], _law(0.5))
    fig, axes = plt.subplots(1, 2)
    with pytest.raises(ValueError, match="need 3 axes"):
        figures.plot_neff_collapse(runs, _law(0.5), axes=axes)
    plt.close("all")


def test_loss_curves_draw_one_budgets_runs_per_r():
    import matplotlib.pyplot as plt

    from looped import records
    from looped.report import figures
    recs = [rec for _, rec in records.iter_records(Path(__file__).resolve().parents[1] / "runs" / "cpu-main") if rec]
    fig, axes = plt.subplots(2, 2)
    figures.plot_loss_curves(recs, 2.5e12, axes)
    per_panel = [len(ax.lines) for ax in axes.ravel()]
    assert per_panel == [4, 4, 4, 4]   # the four widths of each (2.5e12, r) cell
    assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in axes.ravel())
    plt.close(fig)


def test_bootstrap_histogram_counts_box_edge_resamples_without_drawing_them():
    import matplotlib.pyplot as plt

    from looped.fit import FitResult
    from looped.law import Law
    from looped.report import fit_figures
    boot = np.zeros((200, 6))
    boot[:, 5] = np.r_[np.random.default_rng(0).normal(0.64, 0.07, 199), -3.0]   # one resample on the edge
    res = FitResult(Law(A=1, alpha=0.3, B=1, beta=0.3, E=1, phi=0.64), r2=0.99, huber=0, n_runs=10, restarts=1,
                    ci={"phi": (0.55, 0.80)})
    res.boot_samples = boot
    fig, ax = plt.subplots()
    fit_figures.plot_bootstrap(ax, res, "phi", paper=(0.459, 0.41, 0.53))
    assert ax.get_xlim()[0] > 0  # the edge at -3 does not stretch the axis
    assert "1 at the box edge (not drawn)" in ax.get_legend().get_texts()[0].get_text()
    plt.close(fig)


def test_the_papers_figure_2_from_its_law():
    """Each panel holds one law curve per budget and the published minima sit close to their curve."""
    import matplotlib.pyplot as plt

    from looped.report import figures
    from looped.studies.paper import PAPER_BUDGETS, PAPER_LAW, paper_minima
    minima = paper_minima()
    fig, axes = plt.subplots(2, 2)
    figures.plot_law_iso_flop(PAPER_LAW, minima, PAPER_BUDGETS, axes)
    for ax in axes.ravel():
        curves = [ln for ln in ax.lines if ln.get_linestyle() == "-"]
        stars = [ln for ln in ax.lines if ln.get_marker() == "*"]
        assert len(curves) == len(stars) == len(PAPER_BUDGETS)
        for curve, star in zip(curves, stars):   # the law misses its own minima by at most ~0.025 nats
            x, y = curve.get_data()
            assert abs(np.interp(np.log(star.get_xdata()[0]), np.log(x), y) - star.get_ydata()[0]) < 0.03
    plt.close(fig)
