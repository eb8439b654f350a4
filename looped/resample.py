"""The one resampler of `looped`: a block bootstrap over cells, optionally within strata.

Every interval in the package comes from `cell_resample`: the fits resample (budget, r) cells
(`looped.fit`, the law's variants), the paired fits resample pairs within their (budget, r) cell,
or whole widths within their budget.  A resample is a row of run multiplicities, so a refit only
reweights the objective.
"""
from __future__ import annotations

import numpy as np


def cells(df, by=("budget", "r")) -> np.ndarray:
    """Each row's cell id, the cells numbered in sorted order (so row order does not matter)."""
    return df.groupby(list(by), sort=True).ngroup().to_numpy()


def cell_resample(cell, rng: np.random.Generator, n_boot: int, within=None) -> np.ndarray:
    """(n_boot, n) multiplicities of the n rows: their cells (`cell`, ids 0..k-1) drawn with
    replacement, k at a time; with `within` (k,) a stratum per cell, each stratum's cells drawn
    among themselves (in sorted stratum order), so every stratum keeps its number of cells."""
    cell = np.asarray(cell)
    k = int(cell.max()) + 1
    if within is None:
        draws = rng.integers(0, k, size=(n_boot, k))
        counts = np.stack([np.bincount(d, minlength=k) for d in draws]) if n_boot else np.zeros((0, k), int)
        return counts[:, cell].astype(float)
    within, counts, rows = np.asarray(within), np.zeros((n_boot, k)), np.arange(n_boot)[:, None]
    for s in np.unique(within):
        members = np.flatnonzero(within == s)
        np.add.at(counts, (rows, members[rng.integers(0, len(members), (n_boot, len(members)))]), 1.0)
    return counts[:, cell]
