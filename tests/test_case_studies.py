"""looped.studies.case_studies.protocol helpers that need no fit."""
from __future__ import annotations

import pandas as pd

from looped.studies.case_studies.protocol import CaseStudy, runs_per_cell


def _runs(cells):
    """A runs table with one row per run: cells maps (budget, r) to a run count."""
    return pd.DataFrame([{"budget": b, "r": r, "loss": 4.0} for (b, r), n in cells.items() for _ in range(n)])


def test_runs_per_cell_counts_each_fit_by_budget_and_r():
    base = _runs({(1e13, 1): 2, (1e13, 2): 3, (2e13, 1): 1, (2e13, 4): 2})
    variant = _runs({(1e13, 1): 2, (1e13, 4): 1})
    cs = CaseStudy(name="variant", budgets=[1e13, 2e13], baseline_runs=base, variant_runs=variant,
                   baseline=None, variant=None)
    table = runs_per_cell(cs)
    assert list(table.columns) == ["fit", "budget", 1, 2, 4]
    assert table.values.tolist() == [["baseline", 1e13, 2, 3, 0], ["baseline", 2e13, 1, 0, 2],
                                     ["variant", 1e13, 2, 0, 1]]
    empty = CaseStudy(name="v", budgets=[], baseline_runs=base.iloc[0:0], variant_runs=base.iloc[0:0],
                      baseline=None, variant=None)
    assert runs_per_cell(empty).empty


def test_a_variant_without_r2_is_set_against_a_baseline_without_r2():
    """`study_r` restricts both tables to the same cells, so their bootstraps stay paired."""
    from looped.studies.case_studies.protocol import case_study_runs
    sized = dict(n_once=1e5, n_rec=1e5, tokens=1e7)
    main = _runs({(1e13, 1): 2, (1e13, 2): 2, (1e13, 4): 2, (1e13, 8): 2}).assign(**sized)
    study = _runs({(1e13, 2): 2, (1e13, 4): 2, (1e13, 8): 2}).assign(**sized)
    base, variant = case_study_runs(main, study, study_r=(4, 8))
    assert sorted(base.r.unique()) == sorted(variant.r.unique()) == [1, 4, 8]
    base, variant = case_study_runs(main, study)
    assert sorted(base.r.unique()) == sorted(variant.r.unique()) == [1, 2, 4, 8]
