"""Figures and small tables for the book; the chapters call these so their cells stay short.

Nothing here is needed to train or fit.  Matplotlib, pandas and torch are imported inside the
functions that use them, so `import looped.plots` is cheap.
"""
from __future__ import annotations

from pathlib import Path

from . import accounting as acc
from .config import model_config

R_VALUES = (1, 2, 4, 8)
PAPER_PHI = 0.459  # the paper's joint fit (95% CI [0.41, 0.53])


def repo_root() -> Path:
    """The repository root (the folder holding `looped/`), whatever the working directory."""
    return Path(__file__).resolve().parents[1]


def paper_table(name: str):
    """One of the published tables copied to runs/paper/ (see runs/paper/README.md)."""
    import pandas as pd
    return pd.read_csv(repo_root() / "runs" / "paper" / f"{name}.csv")


# ----------------------------------------------------------------------------- accounting tables

def accounting_grid(preset: str = "paper", s_values=None, r_values=R_VALUES, phi: float = PAPER_PHI):
    """N, N_once, N_rec, N_eff and training FLOPs/token for every (s, r), one row each."""
    import pandas as pd
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
    import numpy as np
    import pandas as pd
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
    import pandas as pd
    import torch
    from .model import LoopedGPT
    rows = []
    torch.manual_seed(0)
    for r in r_values:
        for inj in (("none",) if r == 1 else ()) + tuple(injections):
            cfg = model_config(preset, r=r, s=s, injection=inj)
            live = LoopedGPT(cfg).non_embedding_params()
            rows.append(dict(r=r, injection=inj, d_model=cfg.d_model, layers=f"{cfg.n_prelude}-{cfg.n_loop_layers}x{r}-{cfg.n_coda}",
                             n_accounting=acc.n_params(cfg), n_live=live, equal=acc.n_params(cfg) == live))
    return pd.DataFrame(rows)


def init_invariance(preset: str = "tiny", s: float = 4, r: int = 4, seed: int = 0) -> float:
    """Largest absolute logit difference between running the same linear-injection model r times and once.

    With W = [I | 0] every recurrence reads only e, so all recurrences compute the same thing
    and r is invisible at initialisation.
    """
    from dataclasses import replace

    import torch
    from .model import LoopedGPT
    torch.manual_seed(seed)
    cfg = model_config(preset, r=r, s=s, injection="linear")
    many = LoopedGPT(cfg).eval()
    once = LoopedGPT(replace(cfg, r=1)).eval()
    once.load_state_dict(many.state_dict())
    idx = torch.randint(0, cfg.vocab_size, (2, min(16, cfg.seq_len)), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return float((many(idx) - once(idx)).abs().max())


# ----------------------------------------------------------------------------- figures

def _box(ax, x, y, w, h, text, color, fontsize=9):
    from matplotlib.patches import FancyBboxPatch
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=color, ec="0.25", lw=1.0))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)


def _arrow(ax, x0, y0, x1, y1, **kw):
    ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                arrowprops=dict(arrowstyle="-|>", color=kw.pop("color", "0.2"), lw=kw.pop("lw", 1.2), **kw))


def draw_topology(ax=None, r: int = 4, preset: str = "paper", injection: str | None = None, lanes: int = 2,
                  bptt_k: int | None = None):
    """Boxes-and-arrows diagram of the prelude / recurrent block / coda model, with its loop arrow.

    `injection=None` is the preset default: the plain model for r=1, linear injection otherwise.
    """
    import matplotlib.pyplot as plt
    cfg = model_config(preset, r=r, s=10, injection=injection, lanes=lanes, bptt_k=bptt_k)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.2))
    colors = dict(io="#e8e8e8", once="#9ecae1", rec="#fdae6b", inj="#c7e9c0", norm="#f0f0f0")
    y = 0.0
    xs = dict(emb=0.6, pre=2.0, inj=3.6, rec=5.3, norm=6.8, coda=8.3, head=9.7)
    _box(ax, xs["emb"], y, 1.0, 0.8, "embed\n+ RMSNorm", colors["io"])
    _box(ax, xs["pre"], y, 1.2, 0.8, f"prelude\n{cfg.n_prelude} blocks", colors["once"])
    inj_text = {"linear": "inject\nW[e; s]", "additive": "inject\ns + e", "passthrough": "inject\ns",
                "hyperconnect": f"read lanes\n(K={cfg.lanes})", "none": ""}[cfg.injection]
    if cfg.looped:
        _box(ax, xs["inj"], y, 1.2, 0.8, inj_text, colors["inj"])
        _box(ax, xs["rec"], y, 1.4, 0.8, f"recurrent\n{cfg.n_loop_layers} blocks", colors["rec"])
        _box(ax, xs["norm"], y, 1.0, 0.8, "shared\nRMSNorm", colors["norm"])
        for a, b, wa, wb in (("pre", "inj", 1.2, 1.2), ("inj", "rec", 1.2, 1.4), ("rec", "norm", 1.4, 1.0),
                             ("norm", "coda", 1.0, 1.2)):
            _arrow(ax, xs[a] + wa / 2, y, xs[b] - wb / 2, y)
        # the loop: from the shared norm back to the injection, run r times
        ax.annotate("", xy=(xs["inj"], y + 0.42), xytext=(xs["norm"], y + 0.42),
                    arrowprops=dict(arrowstyle="-|>", color="#d95f02", lw=2.0,
                                    connectionstyle="arc3,rad=0.55"))
        grad = "" if cfg.k_bwd == cfg.r else f", gradient through last {cfg.k_bwd}"
        ax.text((xs["inj"] + xs["norm"]) / 2, y + 1.45, f"state s, repeated r = {cfg.r} times{grad}",
                ha="center", va="center", fontsize=9, color="#d95f02")
        # e, the prelude output, feeds every injection
        ax.annotate("", xy=(xs["inj"], y - 0.42), xytext=(xs["pre"] + 0.3, y - 0.42),
                    arrowprops=dict(arrowstyle="-|>", color="0.45", lw=1.0, ls="--",
                                    connectionstyle="arc3,rad=0.5"))
        ax.text((xs["pre"] + xs["inj"]) / 2 + 0.15, y - 1.05, "e (prelude output)", ha="center", fontsize=8, color="0.35")
    else:
        _box(ax, (xs["inj"] + xs["norm"]) / 2, y, 3.6, 0.8, f"{cfg.n_loop_layers} plain blocks, run once", colors["once"])
        _arrow(ax, xs["pre"] + 0.6, y, xs["inj"] - 0.6, y)
        _arrow(ax, xs["norm"] + 0.5, y, xs["coda"] - 0.6, y)
    _box(ax, xs["coda"], y, 1.2, 0.8, f"coda\n{cfg.n_coda} blocks", colors["once"])
    _box(ax, xs["head"], y, 1.0, 0.8, "RMSNorm\n+ LM head", colors["io"])
    _arrow(ax, xs["emb"] + 0.5, y, xs["pre"] - 0.6, y)
    _arrow(ax, xs["coda"] + 0.6, y, xs["head"] - 0.5, y)
    ax.set_xlim(-0.1, 10.4)
    ax.set_ylim(-1.4, 1.8)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"r = {cfg.r}: {cfg.n_prelude} + {cfg.n_loop_layers}x{cfg.r} + {cfg.n_coda} = "
                 f"{cfg.n_prelude + cfg.n_loop_layers * cfg.r + cfg.n_coda} effective layers "
                 f"(injection: {cfg.injection})", fontsize=10)
    return ax


def plot_accounting_vs_r(ax=None, s_values=(6, 10, 20, 34), phi: float = PAPER_PHI, preset: str = "paper"):
    """FLOPs/token, unique N and N_eff relative to the plain r=1 model at the same width."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    grid = accounting_grid(preset, s_values=s_values, phi=phi)
    base = grid[grid.r == 1].set_index("s")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    palette = dict(zip(("training FLOPs / token", f"effective N (phi = {phi})", "unique N"), sns.color_palette("deep", 3)))
    styles = dict(zip(s_values, ("-", "--", "-.", ":")))
    for s in s_values:
        g = grid[grid.s == s]
        for label, col in zip(palette, ("flops_per_token", "n_eff", "n")):
            ax.plot(g.r, g[col] / base.loc[s, col], marker="o", ms=4, color=palette[label], ls=styles[s],
                    label=label if s == s_values[0] else None)
    for s in s_values:
        ax.plot([], [], color="0.4", ls=styles[s], label=f"s = {s} (d = {int(base.loc[s, 'd_model'])})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(R_VALUES), [str(r) for r in R_VALUES])
    ax.set_xlabel("recurrences r (iso-depth: 20 effective layers)")
    ax.set_ylabel("relative to the plain model (r = 1)")
    ax.set_ylim(0, 1.1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return ax
