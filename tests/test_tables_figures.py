"""Table formatting and the book's palette."""
import pandas as pd

from looped import figures, tables
from looped.paper import PAPER_BUDGETS, R_VALUES


def test_number_text_has_no_raw_floats():
    assert tables.number_text(3e10, "budget") == "3×10¹⁰"
    assert tables.number_text(2.15e19, "budget") == "2.15×10¹⁹"
    assert tables.number_text(47517696.0, "n") == "47,517,696"
    assert tables.number_text(72.0, "runs") == "72"
    assert tables.number_text(0.45912, "phi") == "0.459"
    assert tables.number_text(float("nan"), "phi") == "-"
    assert tables.number_text(True) == "yes"
    assert tables.power_of_ten(1e21) == "10²¹"
    assert tables.power_of_ten(9.996e9, 3) == "10¹⁰"


def test_html_table_groups_ours_and_paper():
    df = pd.DataFrame({"s": [10, 16], "params_M_ours": [47.5, 120.2], "params_M_paper": [47.5, 120.2],
                       "budget": [1e18, 4.64e17]})
    html = tables.html_table(df, pairs=True, caption="Table 6").to_html()
    assert "params M" in html and "ours" in html and "paper" in html and "Table 6" in html
    assert "4.64×10¹⁷" in html and "budget C (FLOPs)" in html
    assert "e+" not in html and ">0<" not in html      # no exponent, no 0..n-1 index


def test_one_colour_per_r_and_per_budget():
    assert set(R_VALUES) <= set(figures.R_COLORS) and len(set(figures.R_COLORS.values())) == len(figures.R_COLORS)
    all_cpu = figures.budget_colors([3e10, 1e11, 3e11, 1e12])
    lower = figures.budget_colors([3e10, 1e11, 3e11])
    assert all(lower[b] == all_cpu[b] for b in lower)        # a budget keeps its colour in every figure
    paper = figures.budget_colors(PAPER_BUDGETS)
    assert len(set(paper.values())) == len(PAPER_BUDGETS)
    assert len(set(figures.budget_markers(PAPER_BUDGETS).values())) == len(PAPER_BUDGETS)


def test_figures_draw(tmp_path):
    import matplotlib.pyplot as plt

    from looped.fit import FitResult
    from looped.paper import PAPER_DIR, PAPER_LAW, runs_from_minima
    minima = runs_from_minima(PAPER_DIR / "compute_optimal_minima.csv")
    law = FitResult(**PAPER_LAW, r2=1.0, huber=0.0, n_runs=116, restarts=0)
    fig, axes = plt.subplots(2, 2)
    figures.plot_minima_laws(axes[0], minima, {"paper": law}, budgets=[1e18, 1e19])
    figures.plot_residuals(axes[1, 0], law, minima)
    figures.plot_predicted_vs_observed(axes[1, 1], law, minima)
    fig.savefig(tmp_path / "f.png")
    plt.close(fig)
    assert figures.r_color(4) == figures.R_COLORS[4] and figures.r_color(3) == "0.5"
