"""The book's one pure error: replicate groups never pool a run with its other-token twin, and
chapter 4 (constancy.json), chapters 5 and 6 (case_studies.json) and the records agree on it."""
import json
import warnings

import numpy as np
import pandas as pd
import pytest

from looped.studies.case_studies import analysis as paired_study
from looped.studies.constancy import analysis as robustness
from looped.studies.sweep.registry import DEFAULT_FAMILY, FAMILIES, analysis_file
from looped.studies.sweep.replicates import pure_error, replicate_sd, replicate_tables
from looped.studies.sweep.study import Study


def _records(family=DEFAULT_FAMILY):
    """One family's main runs and replicate tables, as its chapters read them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main = Study(FAMILIES[family]["main"]).fit_table(main_design=False)
        seeds = replicate_tables(studies=FAMILIES[family]["replicates"])
    return main, seeds


def test_a_run_and_its_other_token_twin_are_not_replicates():
    """A truncated run and its matched-token twin share budget, r, s, injection, bptt_k, seed and
    order; they differ in tokens, so they are no replicate pair (the bug that gave 0.0308 nats)."""
    base = dict(budget=2.5e12, r=4, s=3, injection="linear", bptt_k=2, n_once=1e5, n_rec=2e5, seed=42)
    twins = pd.DataFrame([dict(base, tokens=1.0e6, loss=4.90), dict(base, tokens=1.27e6, loss=4.86)])
    assert replicate_sd(twins)["df_pe"] == 0
    seeds = pd.DataFrame([dict(base, tokens=1.0e6, loss=4.91, seed=43, data_order=43),
                          dict(base, tokens=1.0e6, loss=4.93, seed=44, data_order=44)])
    pe = replicate_sd(twins, seeds)
    assert pe["df_pe"] == 1 and pe["seed_sd"] == pytest.approx(np.std([4.91, 4.93], ddof=1))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_book_reads_one_pure_error_everywhere(family):
    """case_studies.json (chapters 5 and 6), constancy.json (chapter 4) and the records agree on the pure
    error, and the paired simulation drew its noise at it, in each family."""
    main, seeds = _records(family)
    now = pure_error(main, *seeds)
    paired = json.loads(analysis_file("case_studies", family).read_text())["settings"]
    chapter4 = robustness.read_results(family=family)["summary"]
    assert paired["seed_sd"] == pytest.approx(now["seed_sd"], rel=1e-9)
    assert chapter4["seed_sd"] == pytest.approx(now["seed_sd"], rel=1e-9) and chapter4["df_pe"] == now["df_pe"]
    assert now["seed_sd"] < 0.012   # a pooled twin of other tokens would put it near 0.03


def test_the_case_study_guards_fail_on_perturbed_records():
    """Chapter 6's pair-noise guard, computed from the records, fails when the replicates agree far
    better than they do; chapter 5's guard on truncation's cost fails when the matched twins' cost
    grows with r."""
    from looped.report import case_studies as page
    from looped.studies.case_studies.paired import gain_trend, load_arms, pairs
    main, seeds = _records()
    models = paired_study.read_results()["studies"]["hyper"]["models"]
    noise = np.sqrt(2) * pure_error(main, *seeds)["seed_sd"]
    assert all(page.noise_claims(models, noise).values())
    both = pd.concat([main.assign(_src=0), *[t.assign(_src=1) for t in seeds]], ignore_index=True)
    group = [both[c].astype(str) for c in ("budget", "r", "s", "injection", "bptt_k", "tokens")]
    group.append(both["data_order"].notna() if "data_order" in both else both["_src"] * 0)
    mean = both.groupby(group)["loss"].transform("mean")
    both["loss"] = mean + 0.1 * (both["loss"] - mean)                                # replicates 10x closer
    tight = pure_error(both[both._src == 0], both[both._src == 1])["seed_sd"]
    assert tight < 0.2 * pure_error(main, *seeds)["seed_sd"]
    assert not page.noise_claims(models, np.sqrt(2) * tight)["the per-width model fits close to pair noise"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arms = load_arms(folders=FAMILIES[DEFAULT_FAMILY]["arms"])
    matched = arms["truncated_matched"]
    assert all(page.cost_trend_claims(gain_trend(pairs(arms["main"], matched))).values())
    grows = matched.assign(loss=matched["loss"] + 0.01 * np.log2(matched["r"]))
    assert not any(page.cost_trend_claims(gain_trend(pairs(arms["main"], grows))).values())
    assert page.cost_trend_labels(gain_trend(pairs(arms["main"], grows))) == {
        "cost_trend_direction": "rises", "cost_trend_resolved": "resolved"}


def test_the_paired_chapters_notice_records_the_analysis_has_not_seen():
    """unused_runs counts the records of the study folders that the committed `looped case-studies` did
    not use: 0 now, 1 once a sweep adds a run (the chapters' staleness guard fails)."""
    from looped.studies.case_studies.paired import load_arms, unused_runs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arms = load_arms(folders=FAMILIES[DEFAULT_FAMILY]["arms"])
    assert unused_runs(arms, analysis_file("case_studies")) == 0
    extra = arms["main"].iloc[[0]].assign(run_id="a-new-run")
    assert unused_runs(dict(arms, main=pd.concat([arms["main"], extra])), analysis_file("case_studies")) == 1
