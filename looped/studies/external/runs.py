"""Another lab's looped runs as our runs table: the qlabs-eng/scaling-exponents tables (Chen et
al., arXiv 2609.19107, MIT; ``runs/external/qlabs-scaling-exponents/``), read and checked.

Width w = 128 d with d heads of 128, a prelude / core / coda split of the d layers, 524,288
tokens per step, sequence 2,048, GPT-2 vocabulary padded to 50,304.  N counts their blocks as
4w^2 attention + 2w h MLP, with their MLP width h = 4w rounded up to a multiple of 384 (what their
``compute_flops`` implies; norms are parameter-free); embedding and head are excluded, as in the
paper.  Our FLOPs (`looped.accounting`, 4w MLP, 12 w T attention per layer, both directions of
every pair counted) are checked against theirs (causal attention, 6 w T per layer).  The analyses
on these tables are `looped.studies.external.analysis`.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ... import accounting as acc
from ...config import REPO, ModelConfig
from ...fit import FitError, validate_runs

DATA = REPO / "runs" / "external" / "qlabs-scaling-exponents"
BATCH_TOKENS, SEQ_LEN, VOCAB, VOCAB_PAD, HEAD_DIM = 524_288, 2048, 50_257, 64, 128
GRID_STEPS = 1900                 # every run of the data-constrained grid
MLP_MULTIPLE = 384                # their MLP width: 4w rounded up to a multiple of this
TOL_THEIRS = 1e-4                 # our reading of their formula against compute_flops (relative)
TOL_OURS = 0.06                   # our accounting (4w MLP), attention halved (causal), against compute_flops
ARMS = {"vanilla": "plain", "deep_vanilla": "deeper plain", "untied_2": "untied copies", "loop_2": "two-loop"}
COLUMNS = {"ladder": ("arm", "depth", "compute_flops", "val_loss"),
           "steps": ("arm", "depth", "steps", "layers_prelude", "layers_core", "layers_coda", "loops"),
           "grid": ("depth", "loops", "weight_decay", "compute_flops", "val_loss")}
FILES = {"ladder": "fineweb_ladders.csv", "steps": "ladder_steps.csv", "grid": "loop_grid.csv"}

def read_table(path, kind: str) -> pd.DataFrame:
    """One of their CSV files, checked: FitError (one line) if unreadable, a column is missing or a
    number is missing / non-finite where one is needed (the split columns may be empty for plain arms)."""
    p = Path(path)
    if not p.is_file():
        raise FitError(f"{p}: no such file")
    try:
        df = pd.read_csv(p)
    except Exception as e:  # noqa: BLE001 - any parse failure is a one-line input error
        raise FitError(f"{p}: unreadable ({(str(e).strip().splitlines() or [type(e).__name__])[0]})") from None
    missing = [c for c in COLUMNS[kind] if c not in df.columns]
    if missing:
        raise FitError(f"{p}: missing column(s) {', '.join(missing)}")
    optional = ("layers_prelude", "layers_core", "layers_coda")
    for c in COLUMNS[kind]:
        if c == "arm":
            continue
        v = pd.to_numeric(df[c], errors="coerce")
        bad = ~np.isfinite(v.to_numpy(float)) & ~(df[c].isna() & (c in optional))
        if bad.any() or (v.dropna() < 0).any():
            i = int(np.flatnonzero(bad | (v < 0).to_numpy())[0])
            raise FitError(f"{p}: column {c} has a missing, negative or non-numeric value ({df[c].iloc[i]!r}, row {i})")
        df[c] = v
    return df


def split(depth: int) -> tuple[int, int, int]:
    """Their prelude / core / coda split of d layers (about d/3 each; the rule behind ladder_steps.csv)."""
    pre = depth // 3
    core = math.ceil((depth - pre) / 2)
    return pre, core, depth - pre - core


def mlp_hidden(w: int) -> int:
    return int(math.ceil(4 * w / MLP_MULTIPLE) * MLP_MULTIPLE)


def block(w: int) -> int:
    """Their block: 4w^2 attention + 2w h MLP (norms without parameters)."""
    return 4 * w * w + 2 * w * mlp_hidden(w)


def config(depth: int, pre: int, core: int, coda: int, loops: int) -> ModelConfig:
    """Our ModelConfig of one of their models (plain: every layer in the loop slot, run once;
    looped: the core run `loops` times with a parameter-free injection, as their FLOPs count none)."""
    w = 128 * depth
    if loops == 1:
        return ModelConfig(d_model=w, head_dim=HEAD_DIM, n_prelude=0, n_loop_layers=pre + core + coda, n_coda=0,
                           r=1, injection="none", seq_len=SEQ_LEN, vocab_size=VOCAB, vocab_pad=VOCAB_PAD).validate()
    return ModelConfig(d_model=w, head_dim=HEAD_DIM, n_prelude=pre, n_loop_layers=core, n_coda=coda, r=loops,
                       injection="additive", seq_len=SEQ_LEN, vocab_size=VOCAB, vocab_pad=VOCAB_PAD).validate()


def _row(study, arm, depth, pre, core, coda, loops, steps, loss, their_flops, attention=True) -> dict:
    w, blk = 128 * depth, block(128 * depth)
    executed = pre + coda + loops * core
    cfg = config(depth, pre, core, coda, loops)
    parts = acc.flops_breakdown(cfg)
    theirs = 6 * (executed * blk + cfg.padded_vocab * w) + (6 * executed * w * SEQ_LEN if attention else 0)
    ours = parts["weights"] + parts["head"] + (parts["attention"] / 2 if attention else 0)
    tokens = steps * BATCH_TOKENS
    return dict(study=study, arm=arm, depth=depth, s=depth, d_model=w, r=loops, layers_prelude=pre, layers_core=core,
                layers_coda=coda, executed_layers=executed, n_once=(pre + coda + (core if loops == 1 else 0)) * blk,
                n_rec=0 if loops == 1 else core * blk, steps=steps, tokens=tokens, loss=loss, budget=their_flops,
                flops_per_token=acc.flops_per_token(cfg), their_formula_ratio=their_flops / (theirs * tokens),
                our_causal_ratio=their_flops / (ours * tokens), embedding=2 * cfg.padded_vocab * w)


def ladder_runs(folder=DATA) -> pd.DataFrame:
    """The four ladders with known steps as our runs table (study 'qlabs-ladder', one row per arm and depth).
    untied_2 is two untied copies of the core (r = 1, every layer unique); deep_vanilla has its executed depth."""
    folder = Path(folder)
    lad, st = read_table(folder / FILES["ladder"], "ladder"), read_table(folder / FILES["steps"], "steps")
    m = lad.merge(st, on=["arm", "depth"], how="inner")
    if m.empty:
        raise FitError(f"{folder}: no (arm, depth) of {FILES['ladder']} has steps in {FILES['steps']}")
    split_of = {int(x.depth): (int(x.layers_prelude), int(x.layers_core), int(x.layers_coda))
                for x in m[m.arm == "untied_2"].itertuples()}
    rows = []
    for x in m.itertuples():
        d = int(x.depth)
        if x.arm in ("loop_2", "untied_2"):
            pre, core, coda = int(x.layers_prelude), int(x.layers_core), int(x.layers_coda)
            loops = int(x.loops)
            if x.arm == "untied_2":     # two untied copies: a plain stack of pre + 2 core + coda
                pre, core, coda = 0, pre + 2 * core + coda, 0
        elif x.arm == "deep_vanilla":   # a plain stack with untied_2's executed layers
            p, c, cd = split_of.get(d, split(d))
            pre, core, coda, loops = 0, p + 2 * c + cd, 0, 1
        else:
            pre, core, coda, loops = 0, d, 0, 1
        rows.append(_row("qlabs-ladder", x.arm, d, pre, core, coda, loops, int(x.steps), float(x.val_loss),
                         float(x.compute_flops)))
    return validate_runs(pd.DataFrame(rows), "ladder")


def grid_runs(folder=DATA, best: bool = True) -> pd.DataFrame:
    """The data-constrained grid as our runs table (study 'qlabs-grid'); best: the lowest loss over weight
    decay per (depth, loops), with `wd_at_edge` where that weight decay is the smallest or largest tried."""
    g = read_table(Path(folder) / FILES["grid"], "grid")
    rows = []
    for x in g.itertuples():
        pre, core, coda = split(int(x.depth))
        row = _row("qlabs-grid", f"loops_{int(x.loops)}", int(x.depth), pre, core, coda, int(x.loops), GRID_STEPS,
                   float(x.val_loss), float(x.compute_flops), attention=False)
        rows.append(dict(row, weight_decay=float(x.weight_decay)))
    df = pd.DataFrame(rows)
    if best:
        key = ["depth", "r"]
        lo, hi = df.groupby(key).weight_decay.transform("min"), df.groupby(key).weight_decay.transform("max")
        df = df.assign(wd_at_edge=(df.weight_decay == lo) | (df.weight_decay == hi),
                       n_wd=df.groupby(key).loss.transform("size"))
        df = df.loc[df.groupby(key).loss.idxmin()].sort_values(key)
    return validate_runs(df.reset_index(drop=True), "grid")


def flops_check(ladder: pd.DataFrame, grid: pd.DataFrame) -> dict:
    """compute_flops against our reading of their formula and against our accounting with causal attention."""
    both = pd.concat([ladder, grid])
    return {"max_their_formula_dev": float((both.their_formula_ratio - 1).abs().max()),
            "our_causal_ratio_min": float(both.our_causal_ratio.min()),
            "our_causal_ratio_max": float(both.our_causal_ratio.max()),
            "tol_their_formula": TOL_THEIRS, "tol_ours": TOL_OURS, "mlp_multiple": MLP_MULTIPLE}


def export(folder, out) -> list[Path]:
    """The runs tables as CSV files `looped fit` reads: ladder_runs.csv and grid_runs.csv (best weight decay)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "ladder_runs.csv", out / "grid_runs.csv"]
    ladder_runs(folder).to_csv(paths[0], index=False)
    grid_runs(folder).to_csv(paths[1], index=False)
    return paths
