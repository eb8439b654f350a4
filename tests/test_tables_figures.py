"""Table formatting and the book's palette."""
import dataclasses
import math

import pandas as pd

from looped.config import R_VALUES
from looped.report import case_studies, figures, formatting, tables
from looped.studies.paper import PAPER_BUDGETS


def test_number_text_has_no_raw_floats():
    assert formatting.number_text(3e10, "budget") == "3×10¹⁰"
    assert formatting.number_text(2.15e19, "budget") == "2.15×10¹⁹"
    assert formatting.number_text(47517696.0, "n") == "47,517,696"
    assert formatting.number_text(72.0, "runs") == "72"
    assert formatting.number_text(109318.18, "n_star") == "109,318"          # not 1.093e+05
    assert formatting.number_text(0.45912, "phi") == "0.459"
    assert formatting.number_text(float("nan"), "phi") == "-"
    assert formatting.number_text(True) == "yes"
    assert formatting.power_of_ten(1e21) == "10²¹"
    assert formatting.power_of_ten(9.996e9, 3) == "10¹⁰"
    assert formatting.p_value_text(3.17e-5) == "3.2×10⁻⁵" and formatting.p_value_text(0.0123) == "0.012"


def test_html_table_groups_ours_and_paper():
    df = pd.DataFrame({"s": [10, 16], "params_M_ours": [47.5, 120.2], "params_M_paper": [47.5, 120.2],
                       "budget": [1e18, 4.64e17]})
    html = tables.html_table(df, pairs=True, caption="Table 6").to_html()
    assert "params M" in html and "ours" in html and "paper" in html and "Table 6" in html
    assert "4.64×10¹⁷" in html and "budget C (FLOPs)" in html
    assert "e+" not in html and ">0<" not in html      # no exponent, no 0..n-1 index


def test_a_missing_cell_reads_as_a_dash_under_a_format_string_too():
    """An outer merge of ours and the paper's leaves cells empty; '{:.3f}' must not print them as 'nan'."""
    t = tables.Table(pd.DataFrame({"budget": [1e12, 1e18], "phi": [0.907, math.nan]}), "x", formats={"phi": "{:.3f}"})
    assert "nan" not in t.text and "nan" not in t._repr_html_()
    assert t.cells.iloc[:, 1].tolist() == ["0.907", "-"]


def test_a_bare_column_beside_its_papers_is_labelled_ours():
    """`phi` next to `phi_paper` sits under "φ: ours | paper"; a column without a sibling keeps an empty label."""
    df = pd.DataFrame({"r": [1], "phi": [0.64], "phi_lo": [0.55], "phi_paper": [0.46], "n_runs": [19]})
    cols = list(tables.group_pairs(df, ("lo", "paper")).columns)
    assert cols == [("r", ""), ("phi", "ours"), ("phi", "lo"), ("phi", "paper"), ("n_runs", "")]


def test_one_colour_per_r_and_per_budget():
    assert set(R_VALUES) <= set(figures.R_COLORS) and len(set(figures.R_COLORS.values())) == len(figures.R_COLORS)
    all_cpu = figures.budget_colors([2.5e12, 5e12, 1e13, 2.5e13])     # cpu-main and its case studies' budgets
    lower = figures.budget_colors([2.5e12, 5e12])
    assert all(lower[b] == all_cpu[b] for b in lower)        # a budget keeps its colour in every figure
    paper = figures.budget_colors(PAPER_BUDGETS)
    assert len(set(paper.values())) == len(PAPER_BUDGETS)
    assert len(set(figures.budget_markers(PAPER_BUDGETS).values())) == len(PAPER_BUDGETS)


def test_figures_draw(tmp_path):
    import matplotlib.pyplot as plt

    from looped.fit import fit
    from looped.studies.paper import PAPER_DIR, PAPER_LAW, runs_from_minima
    minima = runs_from_minima(PAPER_DIR / "compute_optimal_minima.csv")
    refit = fit(minima, restarts=10)
    fig, axes = plt.subplots(2, 2)
    figures.plot_minima_laws(axes[0], minima, {"paper": PAPER_LAW, "refit": refit}, budgets=[1e18, 1e19])
    figures.plot_residuals(axes[1, 0], PAPER_LAW, minima)
    figures.plot_predicted_vs_observed(axes[1, 1], refit, minima)
    fig.savefig(tmp_path / "f.png")
    plt.close(fig)
    assert figures.r_color(4) == figures.R_COLORS[4] and figures.r_color(3) == "0.75"


def test_html_table_is_stable_and_takes_other_pairs():
    df = pd.DataFrame({"budget": [1e18], "r": [4], "N*_law": [12.3], "N*_paper": [11.9]})
    first = tables.html_table(df, pairs=("law", "paper")).to_html()
    assert first == tables.html_table(df, pairs=("law", "paper")).to_html()   # no random ids: reruns diff cleanly
    assert "law" in first and "paper" in first and "N*_law" not in first


def _case_study(delta_boot, base_E=math.exp(-3), lo_phi=0.5):
    """A CaseStudy with two fake fits whose paired bootstrap differences are `delta_boot`."""
    import numpy as np

    from looped.fit import FitResult
    from looped.law import Law
    from looped.solver import LO
    from looped.studies.case_studies.protocol import CaseStudy
    cells = pd.DataFrame({"budget": [1e11, 1e11, 3e11], "r": [1, 2, 2]})

    def fake(phi, E, boot_phi):
        res = FitResult(Law(A=5.0, alpha=0.2, B=100.0, beta=0.3, E=E, phi=phi), r2=0.95, huber=1e-3, n_runs=3,
                        restarts=1)
        res.theta = np.array([np.log(5.0), 0.2, np.log(100.0), 0.3, np.log(E), phi])
        res.boot_samples = np.zeros((len(boot_phi), 6))
        res.boot_samples[:, 5] = boot_phi
        res.ci = {"phi": (lo_phi, phi + 0.2)}
        return res

    base = fake(1.0, base_E, np.full(len(delta_boot), 1.0))
    var = fake(1.0 + float(np.median(delta_boot)), 1.8, 1.0 + np.asarray(delta_boot))
    var.ci = {"phi": (float(LO[5]), 1.5)}
    return CaseStudy(name="variant", budgets=[1e11, 3e11], baseline_runs=cells, variant_runs=cells,
                     baseline=base, variant=var)


def test_case_study_texts_follow_the_numbers():
    cs = _case_study([-0.4, -0.2, -0.1, 0.3])                      # negative change, interval contains zero
    # one rule for both case studies: an interval that contains zero resolves nothing, whatever the sign
    assert case_studies.reproduced(cs, paper_delta=+0.19) == "unresolved (spans 0)"
    assert case_studies.reproduced(cs, paper_delta=-0.07) == "unresolved (spans 0)"
    unpaired = dataclasses.replace(cs, variant_runs=cs.variant_runs.head(2))   # the tables hold other cells
    assert unpaired.delta_phi_ci is None
    assert case_studies.reproduced(unpaired, paper_delta=-0.07) == "unresolved (unpaired)"
    notes = " ".join(case_studies.edge_notes(cs))
    assert "E at the lower edge" in notes and "lower end of the variant fit's φ interval" in notes
    assert case_studies.reproduced(_case_study([-0.3, -0.2, -0.1, -0.05]), paper_delta=-0.07) == "yes"


def test_phi_profile_has_its_minimum_near_the_fitted_phi(tmp_path):
    import matplotlib.pyplot as plt
    import numpy as np

    from looped.studies.paper import PAPER_DIR, runs_from_minima
    from looped.studies.phi import estimates as phi_fits
    minima = runs_from_minima(PAPER_DIR / "compute_optimal_minima.csv")
    prof = phi_fits.phi_profile(minima, phis=np.array([0.0, 0.45, 1.0]), restarts=20)
    assert list(prof.columns) == ["phi", "huber", "r2", "relative"]
    assert prof.loc[prof["huber"].idxmin(), "phi"] == 0.45 and prof["relative"].min() == 1.0
    fig, ax = plt.subplots()
    figures.plot_phi_profile(ax, {"minima": prof}, marks={"paper": (0.459, 0.41, 0.53)})
    fig.savefig(tmp_path / "p.png")
    plt.close(fig)


def test_runtime_text():
    from looped.report.formatting import runtime_text
    assert runtime_text(25) == "under a minute"
    assert runtime_text(60) == "about 1 minute"
    assert runtime_text(158) == "about 2.5 minutes" and runtime_text(322) == "about 5.5 minutes"
    assert runtime_text(float("nan")) == "an unmeasured time"


def test_power_of_ten_keeps_the_promised_digits_when_fixed():
    assert formatting.power_of_ten(4.75e8, 4, fixed=True) == "4.750×10⁸"
    assert formatting.power_of_ten(4.75e8, 4) == "4.75×10⁸"
