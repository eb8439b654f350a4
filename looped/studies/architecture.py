"""The iso-depth architecture and its accounting, checked against each other and the paper.

Tables of parameters and FLOPs per (width s, recurrences r), the paper's Table 6 recomputed,
live models counted against the accounting, and the properties of the initialisation that the
paper relies on (linear injection ignores r at init; truncated backprop leaves the forward
pass alone; the cyclic hyperconnection init equals a cumulative additive injection).  The
tables need no torch (the book's figures import them); the live checks import it when they run.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from .. import accounting as acc
from ..config import R_VALUES, get_preset, model_config
from .paper import PAPER_PHI, paper_table


def accounting_grid(preset: str = "paper", s_values=None, r_values=R_VALUES, phi: float = PAPER_PHI):
    """N, N_once, N_rec, N_eff and training FLOPs/token for every (s, r), one row each."""
    if s_values is None:
        s_values = sorted(paper_table("unique_params")["s"].unique())
    rows = []
    for s in s_values:
        for r in r_values:
            cfg = model_config(preset, r=r, s=s)
            n_o, n_r = acc.n_once(cfg), acc.n_rec(cfg)
            rows.append(dict(s=s, d_model=cfg.d_model, r=r, n=acc.n_params(cfg), n_once=n_o, n_rec=n_r,
                             n_eff=acc.n_effective(n_o, n_r, r, phi), flops_per_token=acc.flops_per_token(cfg)))
    return pd.DataFrame(rows)


def _decimals(values) -> int:
    """Decimals printed in a published column (the most any cell shows)."""
    best = 0
    for v in values:
        text = repr(float(v))
        if "e" in text:
            continue
        best = max(best, len(text.split(".")[1].rstrip("0")))
    return best


def table6_comparison():
    """The paper's Table 6 recomputed: unique params (millions) and FLOPs/token per (s, r).

    Returns a frame with the published and recomputed cells side by side, the recomputed value
    rounded the way the paper prints it (millions to 1 decimal; FLOPs to 4 significant digits),
    whether the two agree at that precision, and how far the exact FLOPs lie from the printed
    ones in units of the last printed digit (0.5 is the most plain rounding can explain).
    """
    params = paper_table("unique_params")
    flops = paper_table("train_flops_per_token")
    grid = accounting_grid(s_values=sorted(params["s"].unique()))
    df = (params.merge(flops, on=["s", "r"]).merge(grid[["s", "r", "d_model", "n", "flops_per_token"]],
                                                   on=["s", "r"], suffixes=("", "_ours")))
    dec = _decimals(params["n_unique_nonembedding_millions"])
    df["params_M_ours"] = (df["n"] / 1e6).round(dec)
    df["flops_ours"] = [float(f"{v:.4g}") for v in df["flops_per_token"]]
    # distance of the exact value from the printed one, in units of the last printed digit
    unit = 10.0 ** (np.floor(np.log10(df["train_flops_per_token"])) - 3)
    df["flops_err_units"] = (df["flops_per_token"] - df["train_flops_per_token"]).abs() / unit
    df["params_match"] = np.isclose(df["params_M_ours"], df["n_unique_nonembedding_millions"], rtol=0, atol=1e-9)
    df["flops_match"] = np.isclose(df["flops_ours"], df["train_flops_per_token"], rtol=1e-12, atol=0)
    df["d_match"] = df["d_model"] == df["d_model_ours"]
    return pd.DataFrame({
        "s": df["s"], "r": df["r"], "d_model": df["d_model"],
        "params_M_paper": df["n_unique_nonembedding_millions"], "params_M_ours": df["params_M_ours"],
        "flops_paper": df["train_flops_per_token"], "flops_ours": df["flops_ours"],
        "flops_exact": df["flops_per_token"], "flops_err_units": df["flops_err_units"],
        "params_match": df["params_match"] & df["d_match"], "flops_match": df["flops_match"],
    })


def live_parameter_check(preset: str = "tiny", s: float = 4, r_values=R_VALUES,
                         injections=("linear", "additive", "passthrough", "hyperconnect")):
    """Build each model for real and compare its parameter count with the accounting's N."""
    import torch  # deferred on purpose: torch only where a model runs

    from ..model import LoopedGPT

    rows = []
    torch.manual_seed(0)
    for r in r_values:
        for inj in (("none",) if r == 1 else ()) + tuple(injections):
            cfg = model_config(preset, r=r, s=s, injection=inj)
            live = LoopedGPT(cfg).non_embedding_params()
            rows.append(
                dict(
                    r=r,
                    injection=inj,
                    d_model=cfg.d_model,
                    layers=f"{cfg.n_prelude}-{cfg.n_loop_layers}x{r}-{cfg.n_coda}",
                    n_accounting=acc.n_params(cfg),
                    n_live=live,
                    equal=acc.n_params(cfg) == live,
                )
            )
    return pd.DataFrame(rows)


def init_invariance(preset: str = "tiny", s: float = 4, r: int = 4, seed: int = 0) -> float:
    """Largest absolute logit difference between running the same linear-injection model r times and once.

    With W = [I | 0] every recurrence reads only e, so all recurrences compute the same thing
    and r is invisible at initialisation.
    """
    import torch  # deferred on purpose: torch only where a model runs

    from ..model import LoopedGPT

    torch.manual_seed(seed)
    cfg = model_config(preset, r=r, s=s, injection="linear")
    many = LoopedGPT(cfg).eval()
    once = LoopedGPT(replace(cfg, r=1)).eval()
    once.load_state_dict(many.state_dict())
    idx = torch.randint(0, cfg.vocab_size, (2, min(16, cfg.seq_len)), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return float((many(idx) - once(idx)).abs().max())


def truncation_check(preset: str = "tiny", s: float = 4, r: int = 8, k: int = 4, seed: int = 0):
    """Truncated backprop on a live model: which recurrences' states carry gradient, and whether
    the forward pass is unchanged.

    Builds the linear-injection model with `bptt_k=k` and its full-backprop twin (same weights),
    runs one training loss on random tokens and records, per recurrence, whether the state
    requires grad.  Returns (table with columns step, gets_gradient; the absolute difference
    between the two models' losses, which should be 0: truncation leaves the forward pass alone).
    """
    import torch  # deferred on purpose: torch only where a model runs

    from ..model import LoopedGPT

    torch.manual_seed(seed)
    cfg = model_config(preset, r=r, s=s, bptt_k=k)
    trunc = LoopedGPT(cfg)
    full = LoopedGPT(replace(cfg, bptt_k=None))
    full.load_state_dict(trunc.state_dict())
    states = []
    trunc.norm_loop.register_forward_hook(lambda mod, args, out: states.append(bool(out.requires_grad)))
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, cfg.vocab_size, (2, min(16, cfg.seq_len)), generator=g)
    tgt = torch.randint(0, cfg.vocab_size, idx.shape, generator=g)
    lt = trunc(idx, tgt)
    lt.backward()
    with torch.no_grad():
        lf = full(idx, tgt)
    table = pd.DataFrame({"step": range(1, r + 1), "gets_gradient": states[:r]})
    return table, float((lt.detach() - lf).abs())


def hyperconnection_check(preset: str = "tiny", s: float = 4, r: int = 4, lanes: int = 2, seed: int = 0):
    """The cyclic hyperconnection init on a live model equals a cumulative additive injection.

    Records the input u_i of the recurrent block at every step i of a freshly initialised
    hyperconnection model and compares it with e + s_0 + ... + s_{i-1} recomputed from the same
    blocks (e: prelude output, s_j: normalised block outputs); the coda should receive
    K (e + s_0 + ... + s_{r-1}).  Returns (table with columns step, reads_lane, max_abs_diff;
    the largest absolute difference between the coda's input and K times e plus all states).
    """
    import torch  # deferred on purpose: torch only where a model runs

    from ..model import LoopedGPT

    torch.manual_seed(seed)
    cfg = model_config(preset, r=r, s=s, injection="hyperconnect", lanes=lanes)
    m = LoopedGPT(cfg).eval()
    seen, coda_in = [], []
    m.loop[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()))
    m.coda[0].register_forward_pre_hook(lambda mod, args: coda_in.append(args[0].detach().clone()))
    idx = torch.randint(0, cfg.vocab_size, (2, min(16, cfg.seq_len)), generator=torch.Generator().manual_seed(seed))
    T = idx.shape[1]
    with torch.no_grad():
        m(idx)
        inputs = seen[:r]
        e, states, rows = inputs[0], [], []
        for i in range(r):
            u = e + sum(states) if states else e
            rows.append(dict(step=i + 1, reads_lane=int(m.hyper.alpha[i].argmax()) + 1,
                             max_abs_diff=float((inputs[i] - u).abs().max())))
            states.append(m.norm_loop(m._blocks(m.loop, u, T)))
        coda = float((coda_in[0] - lanes * (e + sum(states))).abs().max())
    return pd.DataFrame(rows), coda


def preset_comparison(names=("paper", "cpu")):
    """The knobs of two presets side by side (rows: depth, width rule, heads, T, vocab, batch), one
    column per preset after the column ``setting`` (short cells: the table fits a book page)."""

    out = {}
    for name in names:
        p = get_preset(name)
        out[name] = {
            "prelude + loop + coda": f"{p.n_prelude} + {p.loop_depth} + {p.n_coda} = {p.effective_depth} layers",
            "d_model": f"{p.width_per_s} s, rounded up to a multiple of {p.width_round}",
            "attention heads": f"d / {p.head_dim}, at least one",
            "sequence length T": f"{p.seq_len:,}",
            "vocabulary (padded)": f"{p.vocab_size:,} ({-(-p.vocab_size // p.vocab_pad) * p.vocab_pad:,})",
            "tokens per step": f"{p.batch_tokens:,} ({p.batch_tokens // p.seq_len} rows)",
            "HyperP reference width": f"s = {p.ref_s:g} (d = {model_config(p, r=1, s=p.ref_s).d_model})",
            "validation tokens": f"{p.eval_tokens:,}",
            "learning rates": "HyperP's transfer" if p.lr_scale == 1 else f"{p.lr_scale:g} x HyperP's transfer",
        }
    return pd.DataFrame(out).rename_axis("setting").reset_index()


def flops_shares(preset: str = "cpu", s_values=(1, 2, 4, 6), r: int = 1):
    """Where a training token's FLOPs go at a few widths: the 6N of the unique non-embedding
    weights, the LM head (6 V d) and the attention scores (12 d T per layer).

    The three shares add up to 1 for full backpropagation (injection FLOPs count as weights).
    """
    rows = []
    for s in s_values:
        cfg = model_config(preset, r=r, s=s)
        f = acc.flops_per_token(cfg)
        head = 6 * cfg.padded_vocab * cfg.d_model
        layers = cfg.n_prelude + cfg.n_coda + cfg.n_loop_layers * cfg.r
        attn = 12 * cfg.d_model * cfg.seq_len * layers
        rows.append(dict(preset=preset, s=s, d_model=cfg.d_model, r=r, flops_per_token=f,
                         weights=(f - head - attn) / f, lm_head=head / f, attention=attn / f))
    return pd.DataFrame(rows)
