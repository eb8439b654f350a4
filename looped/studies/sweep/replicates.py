"""Replicate runs: the pure error (the loss's spread between seeds of one configuration) and the
shift between the data-order protocols.

Our seed-42 runs read the training rows in a fixed order; their replicates (seeds 43, 44) each
read the same rows in their own permuted order.  A group for the pure error is therefore one
configuration under one protocol, so that a systematic difference between the protocols (which
`protocol_shift` measures) is not counted as noise.  A configuration includes its tokens: a
truncated run and its matched-token twin share every other field, and pooling them as replicates
counted their 1.27x tokens as seed noise.  `pure_error` is the book's one pure error (the main
fit's design points, every replicate study).  Numbers only.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ...fit import validate_runs
from .registry import FAMILIES
from .study import Study

CONFIG = ("budget", "r", "s", "injection", "bptt_k", "tokens")   # a replicate group: same config, other seed
REPLICATE_STUDIES = FAMILIES["cpu"]["replicates"]   # the folders holding replicate runs



def replicate_tables(root="runs", studies=REPLICATE_STUDIES) -> list[pd.DataFrame]:
    """The replicate studies' finished runs under `root` (relative: to the repository root), each read
    as the fitter reads it (`Study.fit_table`, every design); a study without records gives none."""
    return [t for t in (Study.at(Path(root) / n).fit_table(main_design=False) for n in studies) if len(t)]

def _config_key(runs) -> pd.Series:
    """One string per configuration (budget, r, s, injection, bptt_k), equal across tables (1 == 1.0)."""
    norm = lambda v: f"{v:g}" if isinstance(v, (int, float, np.number)) else str(v)  # noqa: E731
    key = [c for c in CONFIG if c in runs.columns]
    return runs[key].apply(lambda row: "|".join(norm(v) for v in row), axis=1)


def _replicates(*tables) -> pd.DataFrame:
    """The runs of `tables` with config key, protocol ('fixed' data order or 'permuted') and seed;
    a record in several tables counts once."""
    runs = pd.concat([t for t in tables if t is not None and len(t)], ignore_index=True)
    runs = runs.assign(**{c: runs[c] if c in runs.columns else math.nan for c in ("seed", "data_order")})
    runs = runs.assign(_l=runs["loss"].round(12), config=_config_key(runs),
                       protocol=np.where(runs["data_order"].notna(), "permuted", "fixed"))
    return runs.drop_duplicates(["config", "seed", "data_order", "_l"]).reset_index(drop=True)


def spread(runs, by) -> pd.DataFrame:
    """Per group of runs that differ only in their seed (columns `by`): seeds, mean loss, its SD
    (ddof 1; NaN for a lone run), range and ss (sum of squared deviations, what `replicate_sd` pools)."""
    g = runs.groupby(list(by), sort=True)["loss"]
    return pd.DataFrame({"seeds": g.size(), "mean": g.mean(), "std": g.std(ddof=1), "range": g.max() - g.min(),
                         "ss": g.apply(lambda v: ((v - v.mean()) ** 2).sum())}).reset_index()


def replicate_sd(*tables, design=None) -> dict:
    """Pooled within-group SD of the loss (pure error): groups are runs of one configuration under
    one protocol (the fixed data order, or each seed with its own permuted order), so a systematic
    difference between the protocols is not counted as noise.  `design`: only configurations that
    are its design points (the runs a law was fitted to)."""
    runs = _replicates(*tables)
    if design is not None:
        runs = runs[runs["config"].isin(set(_config_key(validate_runs(design))))]
    groups = spread(runs, ["config", "protocol"])
    n, ss = groups["seeds"], float(groups["ss"].sum())
    dof = int((n[n > 1] - 1).sum())
    return dict(seed_sd=math.sqrt(ss / dof) if dof else math.nan, df_pe=dof, n_groups=int((n > 1).sum()),
                n_replicate_runs=int(n[n > 1].sum()))


def pure_error(main, *seed_tables) -> dict:
    """The pure error the book reads everywhere (lack of fit, pair noise, simulations):
    `replicate_sd` of the main runs and the replicate tables on the main runs' design points."""
    return replicate_sd(main, *seed_tables, design=main)


def protocol_shift(*tables) -> dict:
    """The fixed-order run (seed 42) against the mean of its permuted-order replicates at each
    configuration that has both: mean shift (replicates minus fixed, nats), its SE, t, and in how
    many configurations the replicates lie below."""
    runs = _replicates(*tables)
    per = runs.groupby(["config", "protocol"])["loss"].mean().unstack()
    if not {"fixed", "permuted"} <= set(per.columns):
        return dict(shift=math.nan, se=math.nan, t=math.nan, n_configs=0, n_below=0)
    d = (per["permuted"] - per["fixed"]).dropna()
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else math.nan
    return dict(shift=float(d.mean()), se=se, t=float(d.mean() / se), n_configs=len(d), n_below=int((d < 0).sum()))


def seed_and_order(*tables) -> dict:
    """Attribute the protocol shift (the `cpu-order` design): at each configuration with seed 42
    and seed 43 each under the fixed order and under its own permuted order, the effect of the
    order (permuted minus fixed, per seed) and of the seed (43 minus 42, per order).  Each is the
    mean over configurations in nats with its SE, t and count; n_configs 0 until such runs exist."""
    runs = _replicates(*tables)
    runs = runs.assign(seed=runs["seed"].fillna(42).astype(int))
    cell = runs.groupby(["config", "seed", "protocol"])["loss"].mean().unstack(["seed", "protocol"])
    need = [(42, "fixed"), (42, "permuted"), (43, "fixed"), (43, "permuted")]
    full = cell[[c for c in need if c in cell.columns]].dropna() if set(need) <= set(cell.columns) else cell.iloc[:0]

    def effect(d):
        n = len(d)
        se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
        return dict(mean=float(d.mean()) if n else math.nan, se=se, t=float(d.mean()) / se if n > 1 else math.nan, n=n)

    if not len(full):
        return dict(n_configs=0)
    return dict(n_configs=len(full),
                order_at_seed42=effect(full[(42, "permuted")] - full[(42, "fixed")]),
                order_at_seed43=effect(full[(43, "permuted")] - full[(43, "fixed")]),
                seed_at_fixed_order=effect(full[(43, "fixed")] - full[(42, "fixed")]),
                seed_at_permuted_order=effect(full[(43, "permuted")] - full[(42, "permuted")]))
