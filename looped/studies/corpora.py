"""Phi on two corpora: the joint law fitted alike to two studies of one design that differ only in
their data (the first CPU study on corpus v2, `cpu-main`; the second on corpus v3, `cpu3-main`).

Each study is fitted on its own (a fit refuses a table that mixes datasets), under both counting
conventions (the paper's N without the LM head, and with it), with the same restarts, seed and
number of cell resamples.  The studies' runs are independent, so the difference in phi has as its
resampling distribution the differences of independent resamples: resample i of one study minus
resample i of the other.  While one study's sweep is unfinished, both are cut to the configurations
(budget, r, width) that both have finished (`matched`), so the two fits always see one design.
Numbers only; `looped corpora` writes them as JSON (`RESULTS`, read back by `read_results`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import REPO
from ..fit import fit
from ..io import atomic_write_bytes
from ..solver import LAW_PARAMS
from .constancy.analysis import count_embeddings
from .sweep.study import Study

CONVENTIONS = {"paper": False, "head counted": True}   # convention -> count the LM head in N_once
CONFIG = ["budget", "r", "s"]   # one configuration of the design
RESULTS = REPO / "runs" / "analysis" / "corpora.json"   # what `looped corpora` wrote, committed


def read_results(path=RESULTS) -> dict:
    """The committed results: the JSON, with ``fits`` and ``difference`` as tables."""
    raw = json.loads(Path(path).read_text())
    return {**raw, "fits": pd.DataFrame(raw["fits"]), "difference": pd.DataFrame(raw["difference"])}


def matched(tables: dict) -> dict:
    """{study: runs table} cut to the configurations every study has finished."""
    config = [c for c in CONFIG if all(c in t.columns for t in tables.values())]
    keys = [set(map(tuple, t[config].to_numpy().tolist())) for t in tables.values()]
    common = set.intersection(*keys) if keys else set()
    return {s: t[[tuple(k) in common for k in t[config].to_numpy().tolist()]].reset_index(drop=True)
            for s, t in tables.items()}


def convention_table(study: str, head: bool) -> pd.DataFrame:
    """The main-design runs of `study` as the fitter reads them, the head counted or not."""
    s = Study(study)
    df = s.fit_table()
    return count_embeddings(df, head=True, preset=s.preset.name) if head and len(df) else df


def corpus_fits(studies=("cpu-main", "cpu3-main"), bootstrap: int = 200, restarts: int = 500, seed: int = 0,
                boot_restarts: int | None = None, tables: dict | None = None) -> dict:
    """{"fits": one row per (study, convention): runs, dataset, every law parameter and its cell-
    bootstrap interval; "difference": per convention, phi(second) - phi(first) with its interval;
    "finished": each study's finished main-design runs before the cut to the `matched` design}.
    `tables` ({(study, convention): runs table}) replaces the records (tests, simulations)."""
    rows, boots = [], {}
    if tables is None:
        tables = {(s, c): convention_table(s, head) for s in studies for c, head in CONVENTIONS.items()}
    finished = {s: len(tables[(s, "paper")]) for s in studies}
    for conv in CONVENTIONS:
        tables.update({(s, conv): t for s, t in matched({s: tables[(s, conv)] for s in studies}).items()})
    for study in studies:
        for conv, head in CONVENTIONS.items():
            df = tables[(study, conv)]
            if len(df) < 8:   # too few finished runs to fit six parameters: reported, not fitted
                rows.append({"study": study, "convention": conv, "runs": len(df)})
                continue
            res = fit(df, restarts=restarts, seed=seed, bootstrap=bootstrap, boot_restarts=boot_restarts)
            row = {"study": study, "convention": conv, "runs": len(df),
                   "dataset": ", ".join(sorted(map(str, df["dataset"].dropna().unique()))) if "dataset" in df else ""}
            for name in LAW_PARAMS:
                row[name] = getattr(res, name)
                row[f"{name}_lo"], row[f"{name}_hi"] = res.ci.get(name, (np.nan, np.nan))
            rows.append(row)
            if res.boot_samples is not None:
                boots[(study, conv)] = res.boot_samples[:, LAW_PARAMS.index("phi")]
    diffs = []
    for conv in CONVENTIONS:
        a, b = (boots.get((s, conv)) for s in studies)
        fitted = {r["study"]: r for r in rows if r["convention"] == conv and "phi" in r}
        row = {"convention": conv, "dphi": np.nan, "lo": np.nan, "hi": np.nan, "resamples": 0}
        if len(fitted) == 2:
            row["dphi"] = fitted[studies[1]]["phi"] - fitted[studies[0]]["phi"]
        if len(fitted) == 2 and a is not None and b is not None:
            d = b - a   # independent studies: resample i of one against resample i of the other
            row.update(lo=float(np.percentile(d, 2.5)), hi=float(np.percentile(d, 97.5)), resamples=len(d))
        diffs.append(row)
    return {"studies": list(studies), "bootstrap": bootstrap, "restarts": restarts, "seed": seed,
            "finished": finished, "fits": rows, "difference": diffs}


def main(argv=None) -> int:
    """`looped corpora --out runs/analysis/corpora.json [--quick]`: phi on both corpora."""
    ap = argparse.ArgumentParser(prog="looped corpora", description="phi on two corpora with one design")
    ap.add_argument("--out", required=True, help="results file (JSON), e.g. runs/analysis/corpora.json")
    ap.add_argument("--studies", nargs=2, default=["cpu-main", "cpu3-main"], metavar=("FIRST", "SECOND"),
                    help="the two studies of one design (default: cpu-main cpu3-main); phi(SECOND) - phi(FIRST)")
    ap.add_argument("--quick", action="store_true", help="64 restarts and 20 resamples (CI)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fits and resamples (default 0)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    kw = dict(restarts=64, bootstrap=20, boot_restarts=4) if a.quick else dict(restarts=500, bootstrap=200)
    out = corpus_fits(tuple(a.studies), seed=a.seed, **kw)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    atomic_write_bytes(a.out, (json.dumps(out, indent=1, default=float) + "\n").encode())
    for d in out["difference"]:
        print(f"{d['convention']:>13}: phi({a.studies[1]}) - phi({a.studies[0]}) = {d['dphi']:+.3f} "
              f"[{d['lo']:+.3f}, {d['hi']:+.3f}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
