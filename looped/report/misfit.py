"""Where the law misses our runs, what anchors phi, and which convention sets it beside the paper's:
the tables and the claims of chapters 3 and 4 from `looped misfit` (`looped.studies.constancy.misfit`).

The claims are functions of the results, so a test can feed them results computed from perturbed
records and see them fail.  The chapters write their own words around them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

MODELS = {  # the ladder's models, as the reader should read them (parameters in the table)
    "law": "the law",
    "kappa_r_phi": "κ·rᵠ (a free factor on the recurrent parameters)",
    "looped_level": "a free level for the looped runs",
    "per_r_phi": "one φ per r",
    "per_budget_phi": "one φ per budget",
    "per_r_level": "a free level per r",
    "per_r_laws": "a separate Chinchilla law per r",
    "cell_levels": "a free level per (budget, r) cell",
}
ANCHORS = {("main", "plain"): "all main runs, plain r = 1 runs (the paper's construction)",
           ("main", "looped_level"): "all main runs, a free level for the looped runs",
           ("controls", "plain"): "the controls' budgets, plain r = 1 runs",
           ("controls", "looped_level"): "the controls' budgets, a free level for the looped runs",
           ("controls", "linear"): "the controls' budgets, linear r = 1 controls in place of the plain runs",
           ("every", "linear"): "all main runs, linear r = 1 controls in place of the plain runs"}


def ladder_frame(res: dict) -> pd.DataFrame:
    """The ladder as the chapter shows it: model, parameters, residual SD, its ratio to the pure
    error, F, and the share of the law's excess misfit the model removes."""
    lad, pe = res["ladder"], res["pure_error"]["seed_sd"]
    return pd.DataFrame({"model": lad["model"].map(MODELS), "parameters": lad["n_params"],
                         "resid_sd": lad["resid_sd"], "over_pure_error": lad["resid_sd"] / pe, "F": lad["F"],
                         "excess_share": lad["excess_share"], "phi": lad["phi"]})


def anchor_frame(res: dict) -> pd.DataFrame:
    """φ under each r = 1 anchor, with its interval, and the free level where there is one."""
    a = res["anchors"]
    n_runs = a.set_index(["design", "anchor"])["n_runs"]
    if n_runs.get(("controls", "plain")) == n_runs.get(("main", "plain")):   # controls at every budget:
        a = a[~((a["design"] == "controls") & (a["anchor"] != "linear"))]   # its refits repeat the main ones
        a = a.assign(design=a["design"].replace("controls", "every"))
    names = [ANCHORS[(d, k)] for d, k in zip(a["design"], a["anchor"])]
    return pd.DataFrame({"fit": names, "runs": a["n_runs"], "phi": a["phi"], "phi_lo": a["phi_lo"],
                         "phi_hi": a["phi_hi"], "level": a["level"], "level_lo": a["level_lo"],
                         "level_hi": a["level_hi"]}).reset_index(drop=True)   # rows dropped above: 0..n-1 again


def numbers(res: dict) -> dict:
    """The numbers the chapters quote, by name."""
    lad, pe = res["ladder"].set_index("model"), res["pure_error"]["seed_sd"]
    a = res["anchors"].set_index(["design", "anchor"])
    c = res["conventions"].set_index(["data", "head"])
    out = {f"F_{m}": float(lad.loc[m, "F"]) for m in lad.index}
    out |= {f"ratio_{m}": float(lad.loc[m, "resid_sd"] / pe) for m in lad.index}
    out |= {f"share_{m}": float(lad.loc[m, "excess_share"]) for m in lad.index}
    for (d, k), row in a.iterrows():
        for col in ("phi", "phi_lo", "phi_hi", "level", "level_lo", "level_hi"):
            out[f"anchor_{d}_{k}_{col}"] = float(row[col])
    for (d, h), row in c.iterrows():
        for col in ("phi", "phi_lo", "phi_hi"):
            out[f"{d}_{'head' if h else 'nohead'}_{col}"] = float(row[col])
    roles = res["roles"].set_index(["model", "role"])["mean"]
    out["cell_roles_max"] = float(roles.loc["cell_levels"].abs().max())
    out["law_roles_max"] = float(roles.loc["law"].abs().max())
    out["share_levels_beyond_laws"] = out["share_cell_levels"] - out["share_per_r_laws"]   # cell levels, not per-r laws
    out["share_within_cells"] = 1 - out["share_cell_levels"]                               # what free levels leave
    main = a.loc[("main", "plain")]
    out["half_width"] = float(main.phi_hi - main.phi_lo) / 2
    out["gap_nohead"] = out["ours_nohead_phi"] - out["paper_minima_nohead_phi"]
    out["gap_head"] = out["ours_head_phi"] - out["paper_minima_head_phi"]
    return out


def misfit_claims(res: dict) -> dict:
    """Chapter 4's sentences on the ladder, each with whether the results support it."""
    n = numbers(res)
    return {
        "no model of the ladder fits to within the pure error": min(n[k] for k in n if k.startswith("F_")) > 2,
        "separate laws per r still miss by more than twice the pure error": n["ratio_per_r_laws"] > 2,
        "tying the r's together is about half of the law's misfit": 0.3 < n["share_per_r_laws"] < 0.75,
        "with every cell's level free, the misfit is still more than 1.5 times the pure error":
            n["ratio_cell_levels"] > 1.5,
        "with the levels free, the narrowest/interior/widest pattern is a few thousandths of a nat":
            n["cell_roles_max"] < 0.005 < n["law_roles_max"],
    }


def anchor_claims(res: dict) -> dict:
    """The sentences on the r = 1 anchor, each with whether the results support it."""
    n = numbers(res)
    moved = n["anchor_main_looped_level_phi"] - n["anchor_main_plain_phi"]
    return {
        "the looped runs' free level is positive, its interval above zero": n["anchor_main_looped_level_level_lo"] > 0,
        "it moves φ up by more than the half-width of the main interval": moved > n["half_width"],
        "the linear r = 1 controls raise φ at their budgets":   # (no controls yet: not claimed)
            n.get("anchor_controls_linear_phi", np.nan) > n.get("anchor_controls_plain_phi", np.nan),
    }


def injection_claims(cost: pd.DataFrame) -> dict:
    """The sentences on what the linear r = 1 controls measure (`lack_of_fit.injection_cost`)."""
    slope = (np.polyfit(np.log(cost["d_model"].to_numpy(float)), cost["cost"].to_numpy(float), 1)[0]
             if len(cost) > 1 else np.nan)   # no controls yet: nothing is claimed
    return {"the controls measure a positive cost of the linear injection at r = 1":
                bool(len(cost) and (cost["cost"] > 0).all()),
            "growing with width": bool(slope > 0)}


def convention_claims(res: dict) -> dict:
    """The sentences on counting the LM head on both sides, each with whether the results support it."""
    n = numbers(res)
    return {
        "counting the head lowers the paper's φ too": n["paper_minima_head_phi"] < n["paper_minima_nohead_phi"],
        "like for like, ours stays above the paper's minima": n["gap_head"] > 0 and n["gap_nohead"] > 0,
        "counting the head closes less than half of the gap": n["gap_head"] > n["gap_nohead"] / 2,
    }
