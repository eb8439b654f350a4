"""The scorecard of a finished study: what a faithful small-scale rerun should reach, beside
what ours reached (`rerun_targets`), and the joint law refitted without each looped r in turn
(`leave_one_r_out`).  The checks made before the study ran are in `looped.studies.sweep.pilot`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ...fit import fit
from ...law import residuals
from ..sweep.iso_flop import iso_flop_cells, main_design


def rerun_targets(table: pd.DataFrame, joint, halves: dict | None = None, seed_std: float | None = None,
                  r2_min: float = 0.99, rmse_max: float = 0.03, noise_factor: float = 3.0,
                  phi_width_max: float = 0.3) -> pd.DataFrame:
    """What a faithful small-scale rerun should reach, beside what ours reached: one row per
    target (aim, measured, met), so a chapter reports a miss as plainly as a hit.

    `table` is the study's run table (`Study.table()`, every status), `joint` the joint
    fit with bootstrap intervals on its finished runs, `halves` `phi_fits.half_fits` with
    bootstrap, `seed_std` the largest seed spread (`pilot.seed_spread`).  Cells must bracket their
    minimum (the iso-FLOP parabola's vertex inside the widths trained and a minimum); residuals
    are in nats; the halves agree when each half's phi lies in the other's 95% interval."""
    rows = []

    def add(target, aim, measured, met):
        rows.append({"target": target, "aim": aim, "measured": measured, "met": bool(met)})

    bad = table[table.status.isin(["diverged", "failed", "corrupt"])]
    missing = int((table.status == "missing").sum())
    add("runs finished without divergence or failure", "all",
        f"{int((table.status == 'ok').sum())} of {len(table)} ok, {len(bad)} diverged or failed"
        + (f", {missing} not run" if missing else ""), len(bad) == 0 and missing == 0)
    cells = iso_flop_cells(table)
    bracketed = cells.fitted.astype(bool) & cells.inside.eq(True) & cells.opens_up.eq(True)
    add("(budget, r) cells that bracket their minimum", "all",
        f"{int(bracketed.sum())} of {len(cells)}", bool(bracketed.all()))
    if joint is None:
        return pd.DataFrame(rows)
    runs, _ = main_design(table)
    rmse = float(np.sqrt(np.mean(residuals(joint, runs) ** 2)))
    add("joint fit R² (raw nats)", f"≥ {r2_min}", f"{joint.r2:.4f}", joint.r2 >= r2_min)
    add("residual RMSE (nats)", f"≤ {rmse_max}", f"{rmse:.4f}", rmse <= rmse_max)
    if seed_std is not None and np.isfinite(seed_std):
        add("residual RMSE / seed noise (std)", f"≤ {noise_factor:g}", f"{rmse / seed_std:.1f}",
            rmse <= noise_factor * seed_std)
    if "phi" in joint.ci:
        lo, hi = joint.ci["phi"]
        add("width of phi's 95% interval", f"≤ {phi_width_max}", f"{hi - lo:.3f}", hi - lo <= phi_width_max)
    if halves and len(halves) == 2 and all("phi" in fit.ci for _, fit in halves.values()):
        (_, low), (_, high) = halves["lower"], halves["upper"]
        agree = (low.ci["phi"][0] <= high.phi <= low.ci["phi"][1]
                 and high.ci["phi"][0] <= low.phi <= high.ci["phi"][1])
        add("budget halves' phi inside each other's intervals", "yes",
            f"{low.phi:.3f} [{low.ci['phi'][0]:.3f}, {low.ci['phi'][1]:.3f}] vs "
            f"{high.phi:.3f} [{high.ci['phi'][0]:.3f}, {high.ci['phi'][1]:.3f}]", agree)
    return pd.DataFrame(rows)


def leave_one_r_out(runs: pd.DataFrame, restarts: int = 500, seed: int = 0) -> pd.DataFrame:
    """The joint law refitted without each looped r in turn (and with all runs, first row): phi,
    R^2 and residual RMSE.  If dropping one architecture brings the fit close to the targets,
    the misfit is that architecture's; if every row stays short, the shared exponents of the law
    are what the runs disagree with."""
    rows = []
    for drop in [None] + sorted(int(r) for r in runs["r"].unique() if r > 1):
        sub = runs if drop is None else runs[runs["r"] != drop].reset_index(drop=True)
        res = fit(sub, restarts=restarts, seed=seed)
        rows.append({"fit": "all runs" if drop is None else f"without r = {drop}", "runs": len(sub), "phi": res.phi,
                     "r2": res.r2, "rmse": float(np.sqrt(np.mean(residuals(res, sub) ** 2)))})
    return pd.DataFrame(rows)
