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
    from .config import REPO
    return REPO


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


# ----------------------------------------------------------------------------- case studies (chapters 5, 6)

def token_gain(study: str = "paper-truncated"):
    """Tokens a case-study run gets at its budget, against the linear-injection, full-backprop run
    of the same (budget, r, s): one row per run of the named study (`looped.sweep.STUDIES`).

    Columns budget, r, s, d_model, injection, bptt_k, flops_full, flops_variant (training FLOPs per
    token), tokens_full, tokens_variant (whole steps of the preset's batch, as the trainer runs
    them), ratio (tokens_variant / tokens_full) and flops_ratio (flops_full / flops_variant, the
    gain before rounding to whole steps).
    """
    import pandas as pd
    from .config import get_preset
    from .sweep import load_study
    rows = []
    for run in load_study(study):
        cfg = run.model_config()
        full = model_config(run.preset, r=run.r, s=run.s)
        bt = get_preset(run.preset).batch_tokens
        tv, tf = acc.tokens_for_budget(cfg, run.budget, bt), acc.tokens_for_budget(full, run.budget, bt)
        fv, ff = acc.flops_per_token(cfg), acc.flops_per_token(full)
        rows.append(dict(budget=run.budget, r=run.r, s=run.s, d_model=cfg.d_model, injection=cfg.injection,
                         bptt_k=cfg.k_bwd, flops_full=ff, flops_variant=fv, tokens_full=tf, tokens_variant=tv,
                         ratio=tv / tf, flops_ratio=ff / fv))
    return pd.DataFrame(rows)


def token_gain_summary(study: str = "paper-truncated"):
    """`token_gain` condensed per r and overall: runs, median / min / max of the token ratio."""
    import pandas as pd
    t = token_gain(study)
    parts = [(str(r), g) for r, g in t.groupby("r")] + [("all", t)]
    return pd.DataFrame([dict(r=k, runs=len(g), median=g["ratio"].median(), min=g["ratio"].min(),
                              max=g["ratio"].max(), flops_ratio_median=g["flops_ratio"].median())
                         for k, g in parts])


def truncation_check(preset: str = "tiny", s: float = 4, r: int = 8, k: int = 4, seed: int = 0):
    """Truncated backprop on a live model: which recurrences' states carry gradient, and whether
    the forward pass is unchanged.

    Builds the linear-injection model with `bptt_k=k` and its full-backprop twin (same weights),
    runs one training loss on random tokens and records, per recurrence, whether the state
    requires grad.  Returns (table with columns step, gets_gradient; the absolute difference
    between the two models' losses, which should be 0: truncation leaves the forward pass alone).
    """
    from dataclasses import replace

    import pandas as pd
    import torch
    from .model import LoopedGPT
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
    import pandas as pd
    import torch
    from .model import LoopedGPT
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


def case_study_cells(baseline_runs, variant_runs):
    """Per (budget, r > 1) cell: the best (lowest-loss) run of the baseline (linear injection,
    full backprop) and of the case study, and their difference (case study minus baseline, nats).
    Only cells present in both tables."""
    import pandas as pd
    out = []
    b = baseline_runs[baseline_runs["r"].astype(float) > 1]
    v = variant_runs[variant_runs["r"].astype(float) > 1]
    for (c, r), gv in v.groupby(["budget", "r"], sort=True):
        gb = b[(b["budget"] == c) & (b["r"] == r)]
        if not len(gb):
            continue
        ib, iv = gb["loss"].idxmin(), gv["loss"].idxmin()
        out.append(dict(budget=c, r=int(r), runs_baseline=len(gb), runs_variant=len(gv),
                        best_n_baseline=int(gb.loc[ib, "n_once"] + gb.loc[ib, "n_rec"]),
                        best_n_variant=int(gv.loc[iv, "n_once"] + gv.loc[iv, "n_rec"]),
                        loss_baseline=float(gb.loc[ib, "loss"]), loss_variant=float(gv.loc[iv, "loss"]),
                        delta=float(gv.loc[iv, "loss"] - gb.loc[ib, "loss"])))
    return pd.DataFrame(out, columns=["budget", "r", "runs_baseline", "runs_variant", "best_n_baseline",
                                      "best_n_variant", "loss_baseline", "loss_variant", "delta"])


def plot_case_study_isoflop(axes, baseline_runs, variant_runs, label: str, r_values=(2, 4, 8),
                            baseline_label: str = "linear injection, full backprop"):
    """Iso-FLOP curves, one panel per r: final loss against unique non-embedding parameters for
    every budget, the case study (solid, filled) beside the baseline runs (dashed, open)."""
    import numpy as np
    import seaborn as sns
    budgets = sorted(set(baseline_runs["budget"].astype(float)) | set(variant_runs["budget"].astype(float)))
    colors = dict(zip(budgets, sns.color_palette("viridis", max(len(budgets), 1))))
    axes = np.atleast_1d(axes)
    for ax, r in zip(axes, r_values):
        for c in budgets:
            for df, ls, fill, tag in ((baseline_runs, "--", "none", baseline_label), (variant_runs, "-", None, label)):
                g = df[(df["r"].astype(float) == r) & np.isclose(df["budget"].astype(float), c)]
                if not len(g):
                    continue
                g = g.assign(n=g["n_once"] + g["n_rec"]).sort_values("n")
                ax.plot(g["n"], g["loss"], ls=ls, marker="o", ms=5, color=colors[c],
                        mfc=colors[c] if fill is None else fill)
        ax.set_xscale("log")
        ax.set_title(f"r = {r}")
        ax.set_xlabel("unique non-embedding parameters N")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("final validation loss (nats/token)")
    handles = [axes[0].plot([], [], color=colors[c], marker="o", ls="-")[0] for c in budgets]
    labels = [f"C = {c:.3g} FLOPs" for c in budgets]
    handles += [axes[0].plot([], [], color="0.3", marker="o", ls="-")[0],
                axes[0].plot([], [], color="0.3", marker="o", mfc="none", ls="--")[0]]
    labels += [label, baseline_label]
    axes[-1].legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return axes


def plot_phi_comparison(ax, cs, paper_baseline: float, paper_variant: float):
    """phi of a case study (`looped.fit.CaseStudy`) and of its baseline, with bootstrap intervals
    where there are any, beside the paper's two values (Table 3)."""
    import numpy as np
    labels = ["baseline", cs.name]
    x = np.arange(2)
    ax.scatter(x + 0.12, [paper_baseline, paper_variant], marker="s", s=50, color="0.45",
               label="paper (Table 3)", zorder=3)
    fits = [(i, res) for i, res in enumerate((cs.baseline, cs.variant)) if res is not None and res.phi is not None]
    if fits:
        xs = [i - 0.12 for i, _ in fits]
        vals = [res.phi for _, res in fits]
        lo = [res.ci.get("phi", (res.phi, res.phi))[0] for _, res in fits]
        hi = [res.ci.get("phi", (res.phi, res.phi))[1] for _, res in fits]
        ax.errorbar(xs, vals, yerr=[np.subtract(vals, lo), np.subtract(hi, vals)], fmt="o", color="C0",
                    capsize=4, label="ours (95% bootstrap interval)", zorder=3)
    for i in sorted({0, 1} - {i for i, _ in fits}):
        ax.annotate("ours: not fitted\n(too few runs)", (i, paper_variant if i else paper_baseline),
                    xytext=(0, -28), textcoords="offset points", ha="center", fontsize=8, color="0.4")
    ax.set_xticks(x, labels)
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylabel(r"fitted $\varphi$")
    ax.grid(alpha=0.3, axis="y")
    ax.xaxis.grid(False)
    ax.legend(fontsize=8, loc="best")
    return ax


# ----------------------------------------------------------------------------- what phi buys (chapter 7)

LOOP_COLORS = {1: "#333333", 2: "#1b9e77", 4: "#d95f02", 8: "#7570b3"}


def effective_size_vs_phi(preset: str = "paper", s: float = 32, r_values=(2, 4, 8), phis=None):
    """Sizes of the r-loop sibling of the plain model at width s, as fractions of the plain
    model's unique N, for a range of phi: unique (phi-free), loss-equivalent N_once + r^phi N_rec,
    compute-equivalent (the plain model with the same training FLOPs per token, phi-free)."""
    import numpy as np
    import pandas as pd
    from .fit import effective_sizes
    phis = np.linspace(0.0, 1.0, 101) if phis is None else np.asarray(phis, float)
    rows = []
    for r in r_values:
        e = effective_sizes(preset, r=r, s=s, phi=0.0)
        for phi in phis:
            rows.append(dict(r=r, phi=float(phi), unique=e["unique_ratio"],
                             loss_equivalent=(e["n_once"] + r ** phi * e["n_rec"]) / e["plain_unique"],
                             compute_equivalent=e["compute_equivalent_ratio"]))
    return pd.DataFrame(rows)


def plot_effective_size_vs_phi(ax=None, preset: str = "paper", s: float = 32, r_values=(2, 4, 8),
                               phi: float = PAPER_PHI, phi_ci=(0.41, 0.53), marks=None):
    """Loss-equivalent size of the r-loop sibling vs phi (solid), with its unique size (dashed)
    and compute-equivalent size (dotted), all relative to the plain model of the same width.
    `marks` maps labels to phi values drawn as thin vertical lines (e.g. the case studies)."""
    import matplotlib.pyplot as plt
    df = effective_size_vs_phi(preset, s=s, r_values=r_values)
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.axvspan(*phi_ci, color="0.85", alpha=0.6, lw=0, label=f"95% CI of φ [{phi_ci[0]}, {phi_ci[1]}]")
    ax.axvline(phi, color="0.3", lw=1.0, label=f"φ = {phi:g}")
    for label, value in (marks or {}).items():
        ax.axvline(value, color="0.55", lw=0.8, ls=(0, (1, 2)))
        ax.text(value, 0.04, f" {label}", rotation=90, fontsize=7.5, color="0.35", va="bottom", ha="right")
    for r in r_values:
        g = df[df.r == r]
        c = LOOP_COLORS.get(r)
        ax.plot(g.phi, g.loss_equivalent, color=c, lw=2, label=f"r = {r}: loss-equivalent $N_{{once}} + r^φ N_{{rec}}$")
        ax.plot(g.phi, g.unique, color=c, lw=1.2, ls="--")
        ax.plot(g.phi, g.compute_equivalent, color=c, lw=1.2, ls=":")
    ax.plot([], [], color="0.4", ls="--", lw=1.2, label="unique N (any φ)")
    ax.plot([], [], color="0.4", ls=":", lw=1.2, label="compute-equivalent N (any φ)")
    ax.axhline(1.0, color="0.2", lw=0.6)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.2)
    ax.set_xlabel("φ (r passes of the shared block count as $r^φ$ copies)")
    ax.set_ylabel("size / unique N of the plain model")
    ax.legend(fontsize=7.5, loc="upper left", ncol=1, framealpha=0.9)
    ax.grid(alpha=0.3)
    return ax


def published_minima(preset: str = "paper", law=None):
    """The paper's 24 iso-FLOP minima (compute_optimal_minima.csv) with the tokens the accounting
    gives at N* (D = C / F at the width where N = N*), tokens per unique parameter, the loss gap
    to r = 1 at the same budget, and (if `law` is given) the law's loss at that N* and D."""
    import numpy as np
    from .fit import predict, runs_from_minima, FitResult, _law_dict
    t = paper_table("compute_optimal_minima")
    runs = runs_from_minima(t, preset=preset)
    out = t.rename(columns={"budget_flops": "budget"}).copy()
    out["n_star"] = out["n_star_unique_millions"] * 1e6
    out["tokens_star"] = runs["tokens"].to_numpy()
    out["d_model"] = runs["d_model"].to_numpy()
    out["tokens_per_param"] = out["tokens_star"] / out["n_star"]
    base = out[out.r == 1].set_index("budget")["loss_star_nats"]
    out["gap"] = out["loss_star_nats"] - out["budget"].map(base)
    if law is not None:
        res = FitResult(**_law_dict(law), r2=np.nan, huber=np.nan, n_runs=0, restarts=0)
        out["law_loss_at_n_star"] = predict(res, runs["n_once"], runs["n_rec"], runs["r"], runs["tokens"])
    return out


def frontier_gaps(frontier):
    """Loss gap of every r to r = 1 at the same budget on a compute-optimal frontier table."""
    base = frontier[frontier.r == 1].set_index("budget")["loss_star"]
    return frontier.assign(gap=frontier["loss_star"] - frontier["budget"].map(base))


def plot_compute_optimal(axes, frontier, minima=None, paper_gaps=None, budget_range=None):
    """Four panels on `axes` (2 x 2): N*(C), D*(C), L*(C) and the loss gap to r = 1, the law's
    continuous frontier as lines (one per r), the published per-cell minima as markers,
    the paper's reported gap ranges as bands, and the paper's budget range shaded."""
    fr = frontier_gaps(frontier)
    axes = list(getattr(axes, "flat", axes))
    cols = [("n_star", "unique non-embedding params N*"), ("tokens_star", "training tokens D*"),
            ("loss_star", "loss L* (nats/token)"), ("gap", "L*(r) - L*(r = 1) (nats/token)")]
    pub = {"n_star": "n_star", "tokens_star": "tokens_star", "loss_star": "loss_star_nats", "gap": "gap"}
    for ax, (col, label) in zip(axes, cols):
        if budget_range is not None:
            ax.axvspan(*budget_range, color="0.92", lw=0, zorder=0)
        for r, g in fr.groupby("r"):
            if col == "gap" and r == 1:
                continue
            c = LOOP_COLORS.get(r)
            ax.plot(g.budget, g[col], color=c, lw=1.8, label=f"r = {r} (law)")
            if minima is not None:
                m = minima[minima.r == r]
                ax.plot(m.budget, m[pub[col]], "o", color=c, ms=5, mfc="white", mew=1.4,
                        label=f"r = {r} (paper minima)")
        if col == "gap" and paper_gaps:
            lo_c, hi_c = budget_range if budget_range is not None else (fr.budget.min(), fr.budget.max())
            for r, (lo, hi) in paper_gaps.items():
                ax.fill_between([lo_c, hi_c], lo, hi, color=LOOP_COLORS.get(r), alpha=0.15, lw=0)
            ax.fill_between([], [], [], color="0.5", alpha=0.3, label="paper's reported ranges")
        ax.set_xscale("log")
        if col in ("n_star", "tokens_star"):
            ax.set_yscale("log")
        ax.set_xlabel("training compute C (FLOPs)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7, ncol=2, loc="upper left")
    axes[3].legend(fontsize=7, loc="upper right")
    return axes


def equal_loss_models(law, targets, preset: str = "paper", r_values=R_VALUES):
    """For each target loss and r: the compute-optimal model of the law that reaches it
    (looped.fit.compute_optimal_for_loss) and what it costs to store and to run.

    Columns: training budget C; width d; unique non-embedding N (memory of the blocks);
    stored = N + embedding + LM head (2 x padded vocab x d); weights_per_token = N_once +
    r N_rec + LM head (weights a token's forward pass multiplies by); forward_flops =
    training FLOPs per token / 3 (full backprop costs exactly three forward passes in the
    accounting: 2 FLOPs per weight touched plus 4dT per effective layer for attention at the
    training context); kv_per_token = 2 x effective depth x d cached values (every recurrence
    keeps its own keys and values).  The columns ending in ``_ratio`` divide by the r = 1 model
    of the same target."""
    import pandas as pd
    from .config import get_preset
    from .fit import compute_optimal_for_loss
    p = get_preset(preset)
    vocab = model_config(preset, r=1, s=p.ref_s).padded_vocab
    out = []
    for t in ([targets] if isinstance(targets, (int, float)) else targets):
        df = compute_optimal_for_loss(law, float(t), preset=preset, r=tuple(r_values))
        df["stored"] = df["n_star"] + 2 * vocab * df["d_model"]
        df["weights_per_token"] = df["n_once"] + df["r"] * df["n_rec"] + vocab * df["d_model"]
        df["forward_flops"] = df["flops_per_token"] / 3
        df["kv_per_token"] = 2 * p.effective_depth * df["d_model"]
        base = df[df.r == 1].iloc[0]
        for col in ("budget", "n_star", "stored", "weights_per_token", "forward_flops", "kv_per_token"):
            df[f"{col}_ratio"] = df[col] / base[col]
        out.append(df)
    return pd.concat(out, ignore_index=True)


# ----------------------------------------------------------------------------- the iso-depth sweep (chapter 3)

H200_BF16_DENSE_PEAK = 989e12  # FLOP/s: the vendor's dense bf16 tensor-core figure (no sparsity)


def _eng(x: float, digits: int = 3) -> str:
    """A count in engineering notation for tables: 1370000 -> '1.37M'."""
    if x is None or x != x:
        return "-"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.{digits}g}{suffix}"
    return f"{x:.{digits}g}"


def _num(v: float) -> str:
    """3 significant digits without an exponent below 10^5: 4.72, 58.1, 1240."""
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def _span(values, fmt=_eng) -> str:
    """'lo-hi' of a column (one value if they coincide)."""
    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}-{fmt(hi)}"


def study_plan(study: str = "cpu-main", peak_flops: float = 1.0, mfu: float = 1.0):
    """Every run of a named study with its size, tokens, steps and compute.

    This is ``looped.sweep.plan`` (what ``looped sweep STUDY --dry-run`` prints) plus the
    columns ``run_flops`` (training FLOPs per token times tokens: the budget up to whole steps)
    and ``tokens_per_param`` (tokens per unique non-embedding parameter).  ``est_seconds`` is
    the run's wall time at ``mfu`` of ``peak_flops``.
    """
    from .sweep import load_study, plan
    table = plan(load_study(study), peak_flops, mfu)
    table["run_flops"] = table["flops_per_token"].astype(float) * table["tokens"]
    table["tokens_per_param"] = table["tokens"] / table["n"]
    return table


def plan_summary(table):
    """One row per budget of a study plan: widths, model sizes, tokens, steps, tokens/param.

    Ranges run over the widths of the budget (and over r where marked); N is unique
    non-embedding parameters, D training tokens per run.
    """
    import pandas as pd
    rows = []
    for budget, g in table.groupby("budget", sort=True):
        plain = g[g.r == g.r.min()]
        deepest = g[g.r == g.r.max()]
        rows.append({
            "budget C": f"{budget:.3g}",
            "runs": len(g),
            "widths s": ", ".join(f"{s:g}" for s in sorted(g.s.unique())),
            "d_model": _span(g.d_model, lambda v: f"{int(v)}"),
            f"N (r={int(plain.r.iloc[0])})": _span(plain.n),
            f"N (r={int(deepest.r.iloc[0])})": _span(deepest.n),
            "D per run": _span(g.tokens),
            "steps": _span(g.steps, lambda v: f"{int(v)}"),
            f"D/N (r={int(plain.r.iloc[0])})": _span(plain.tokens_per_param, _num),
        })
    return pd.DataFrame(rows)


def preset_comparison(names=("paper", "cpu")):
    """The knobs of two presets side by side (rows: depth, width rule, heads, T, vocab, batch)."""
    import pandas as pd
    from .config import get_preset
    out = {}
    for name in names:
        p = get_preset(name)
        out[name] = {
            "layers (prelude + loop + coda)": f"{p.n_prelude} + {p.loop_depth} + {p.n_coda} = {p.effective_depth}",
            "d_model": f"{p.width_per_s} s, rounded up to a multiple of {p.width_round}",
            "attention heads": f"d / {p.head_dim} (one head of dim d below d = {p.head_dim})",
            "sequence length T": f"{p.seq_len:,}",
            "vocabulary (padded)": f"{p.vocab_size:,} ({-(-p.vocab_size // p.vocab_pad) * p.vocab_pad:,})",
            "tokens per optimizer step": f"{p.batch_tokens:,} ({p.batch_tokens // p.seq_len} rows)",
            "HyperP reference width": f"s = {p.ref_s:g} (d = {model_config(p, r=1, s=p.ref_s).d_model})",
            "validation tokens": f"{p.eval_tokens:,}",
        }
    return pd.DataFrame(out)


def flops_shares(preset: str = "cpu", s_values=(1, 2, 4, 6), r: int = 1):
    """Where a training token's FLOPs go at a few widths: the 6N of the unique non-embedding
    weights, the LM head (6 V d) and the attention scores (12 d T per layer).

    The three shares add up to 1 for full backpropagation (injection FLOPs count as weights).
    """
    import pandas as pd
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


def study_table(study: str = "cpu-main", runs_dir=None):
    """The planned runs of a study joined with the records found in ``runs_dir``.

    One row per planned run (``study_plan`` columns) with ``status`` ('ok', 'diverged',
    'failed', 'corrupt', or 'missing' where no record exists yet), ``loss`` (nats),
    ``wall_seconds`` and ``tokens_per_s`` from the record.  Records of runs outside the planned
    grid (e.g. an extra budget trained with ``looped sweep STUDY --grid FILE``) are appended
    from their own fields, with ``planned`` False.  A missing folder means no records.
    """
    import pandas as pd
    from .sweep import COLUMNS, read_records
    table = study_plan(study).drop(columns=["est_seconds"])
    table["planned"] = True
    runs_dir = repo_root() / "runs" / study if runs_dir is None else Path(runs_dir)
    rec = read_records(runs_dir) if runs_dir.is_dir() else None
    cols = ["status", "loss", "wall_seconds", "tokens_per_s"]
    if rec is None or rec.empty:
        rec = pd.DataFrame(columns=COLUMNS)
    table = table.merge(rec[["run_id"] + cols], on="run_id", how="left")
    extra = rec[~rec.run_id.isin(table.run_id) & rec.budget.notna() & rec.n.notna()].copy()
    if len(extra):
        extra["planned"] = False
        num = ["budget", "s", "d_model", "n", "n_once", "n_rec", "flops_per_token", "tokens", "steps"]
        extra[num] = extra[num].astype(float)
        extra["r"] = extra["r"].astype(int)
        extra["run_flops"] = extra.flops_per_token * extra.tokens
        extra["tokens_per_param"] = extra.tokens / extra.n
        table = pd.concat([table, extra[[c for c in table.columns if c in extra.columns]]], ignore_index=True)
        table = table.sort_values(["budget", "r", "s"], kind="stable").reset_index(drop=True)
    table["status"] = table["status"].fillna("missing")
    for c in cols[1:]:
        table[c] = table[c].astype(float)
    return table


def status_counts(table):
    """Finished ('ok') runs over planned runs, per budget (rows) and r (columns)."""
    g = table.assign(ok=table.status.eq("ok")).groupby(["budget", "r"])
    cell = (g.ok.sum().astype(int).astype(str) + "/" + g.size().astype(str)).unstack("r")
    cell.index = [f"{b:.3g}" for b in cell.index]
    cell.index.name = "budget"
    cell.columns = [f"r={r}" for r in cell.columns]
    return cell


def loss_pivot(table, decimals: int = 3):
    """Final validation loss (nats) of every finished run: rows (budget, s, d_model), columns r."""
    ok = table[table.status == "ok"]
    pv = ok.pivot_table(index=["budget", "s", "d_model"], columns="r", values="loss", aggfunc="first")
    full = table.pivot_table(index=["budget", "s", "d_model"], columns="r", values="n", aggfunc="first")
    pv = pv.reindex(index=full.index, columns=full.columns).round(decimals)
    pv.columns = [f"r={r}" for r in pv.columns]
    pv.index = pv.index.set_levels([[f"{b:.3g}" for b in pv.index.levels[0]]] + list(pv.index.levels[1:]))
    return pv


def iso_flop_cells(table, min_runs: int = 3):
    """Iso-FLOP minima of a study's finished runs, one row per (budget, r) cell.

    ``looped.fit.iso_flop_minima`` fits the parabola of loss in log N (N unique) per cell with
    at least ``min_runs`` finished runs and returns its vertex (``n_star``, ``loss_star``) and
    whether it lies inside the cell's width bracket (``inside``) and is a minimum
    (``opens_up``).  Added here: ``tokens_per_param`` at the vertex, the finished and planned
    run counts, whether the cell's best run is its narrowest or widest (``best_at``), and
    ``fitted`` (False for cells skipped for having too few runs; their vertex columns are NaN).
    """
    import pandas as pd
    from .fit import iso_flop_minima
    ok = table[(table.status == "ok") & table.loss.notna()]
    keep = ["budget", "r", "n_once", "n_rec", "tokens", "loss", "s", "status"]
    minima = iso_flop_minima(ok[keep]) if len(ok) else pd.DataFrame(
        columns=["budget", "r", "n_runs", "n_star", "loss_star", "tokens_star", "inside", "opens_up"])
    rows = []
    for (budget, r), g in table.groupby(["budget", "r"], sort=True):
        done = g[(g.status == "ok") & g.loss.notna()].sort_values("n")
        row = dict(budget=budget, r=int(r), planned=len(g), finished=len(done))
        if len(done):
            best = done.loc[done.loss.idxmin()]
            row["best_s"] = float(best.s)
            row["best_at"] = ("narrowest" if best.n == done.n.min() else "widest" if best.n == done.n.max()
                              else "interior") if len(done) >= 3 else "-"
        hit = minima[(minima.budget == budget) & (minima.r == r)] if len(minima) else minima
        row["fitted"] = len(done) >= min_runs and len(hit) > 0
        if row["fitted"]:
            m = hit.iloc[0]
            row.update(n_star=m.n_star, loss_star=m.loss_star, tokens_star=m.tokens_star,
                       tokens_per_param=m.tokens_star / m.n_star, inside=bool(m.inside),
                       opens_up=bool(m.opens_up))
        rows.append(row)
    cols = ["budget", "r", "planned", "finished", "fitted", "best_s", "best_at", "n_star", "loss_star",
            "tokens_star", "tokens_per_param", "inside", "opens_up"]
    return pd.DataFrame(rows).reindex(columns=cols)


def paper_minima():
    """The paper's 24 published iso-FLOP minima with what the accounting adds to them.

    From ``runs/paper/compute_optimal_minima.csv`` (N* in millions, L* in nats):
    ``tokens_star`` is the budget divided by the training FLOPs per token of the iso-depth
    model whose unique N equals N* (``looped.fit.runs_from_minima``), and ``inside`` says
    whether N* lies within the range of N that the paper's main grid trained in that cell.
    """
    from .fit import runs_from_minima
    pub = paper_table("compute_optimal_minima")
    derived = runs_from_minima(pub)
    out = pub.rename(columns={"budget_flops": "budget", "n_star_unique_millions": "n_star_M",
                              "loss_star_nats": "loss_star"})
    out["n_star"] = out["n_star_M"] * 1e6
    out["tokens_star"] = derived["tokens"].to_numpy()
    out["tokens_per_param"] = out["tokens_star"] / out["n_star"]
    grid = study_plan("paper-main").groupby(["budget", "r"]).n.agg(["min", "max"]).reset_index()
    out = out.merge(grid, on=["budget", "r"], how="left")
    out["inside"] = (out["n_star"] >= out["min"]) & (out["n_star"] <= out["max"])
    return out.drop(columns=["min", "max"])


def minima_exponents(minima, min_cells: int = 2):
    """Least-squares slope a of log N* against log C per r (N* grows as C^a), over the cells of
    ``minima`` (columns budget, r, n_star; rows with ``inside`` False or NaN N* are left out)."""
    import numpy as np
    import pandas as pd
    m = minima.dropna(subset=["n_star"])
    if "inside" in m.columns:
        m = m[m["inside"].astype(bool)]
    rows = []
    for r in R_VALUES:
        g = m[m.r == r]
        a = float(np.polyfit(np.log(g.budget.astype(float)), np.log(g.n_star.astype(float)), 1)[0]) \
            if g.budget.nunique() >= min_cells else float("nan")
        rows.append(dict(r=r, cells=len(g), exponent=a))
    return pd.DataFrame(rows)


def _plain_log_axis(axis):
    """Label a log axis at 1 and 3 x 10^k with short numbers (3k, 10M) and no minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 3.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: _eng(v, 3)))
    axis.set_minor_formatter(NullFormatter())


def _budget_colors(budgets):
    import seaborn as sns
    budgets = sorted(budgets)
    return dict(zip(budgets, sns.color_palette("viridis", max(len(budgets), 2))[:len(budgets)] if len(budgets) > 1
                    else sns.color_palette("viridis", 2)[:1]))


def plot_iso_flop_curves(table, axes=None, min_runs: int = 3, unit: str = "nats"):
    """The paper's Figure 2 layout: one panel per r, loss against unique N (log axis), one
    colour per budget, the parabola in log N of each cell with >= ``min_runs`` finished runs
    and its vertex (a star when it lies inside the bracket and is a minimum, a cross otherwise).
    """
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.lines import Line2D
    r_values = sorted(table.r.unique())
    if axes is None:
        _, axes = plt.subplots(1, len(r_values), figsize=(3.4 * len(r_values), 3.6), sharey=True)
    axes = np.atleast_1d(axes)
    colors = _budget_colors(table.budget.unique())
    ok = table[(table.status == "ok") & table.loss.notna()]
    for ax, r in zip(axes, r_values):
        for budget, color in colors.items():
            g = ok[(ok.r == r) & (ok.budget == budget)].sort_values("n")
            if g.empty:
                continue
            ax.plot(g.n, g.loss, "o", color=color, ms=5, label=f"C = {budget:.3g}")
            if len(g) >= min_runs:
                u = np.log(g.n.to_numpy(float))
                c2, c1, c0 = np.polyfit(u, g.loss.to_numpy(float), 2)
                uu = np.linspace(u.min() - 0.15, u.max() + 0.15, 100)
                ax.plot(np.exp(uu), c0 + c1 * uu + c2 * uu ** 2, "-", color=color, lw=1.4, alpha=0.8)
                if c2 != 0:
                    us = -c1 / (2 * c2)
                    good = c2 > 0 and u.min() <= us <= u.max()
                    if good:
                        ax.plot(np.exp(us), c0 + c1 * us + c2 * us ** 2, "*", color=color, ms=14,
                                mec="black", mew=0.7, zorder=5)
                    else:
                        ax.plot(g.n.iloc[g.loss.to_numpy().argmin()], g.loss.min(), "x", color="black",
                                ms=8, mew=1.5, zorder=5)
        ax.set_xscale("log")
        _plain_log_axis(ax.xaxis)
        ax.set_title(f"r = {r}")
        ax.set_xlabel("unique non-embedding params N")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel(f"final validation loss ({unit})")
    handles = [Line2D([], [], color=c, marker="o", ls="-", label=f"C = {b:.3g} FLOPs") for b, c in colors.items()]
    handles += [Line2D([], [], color="0.5", marker="*", ms=12, mec="black", ls="", label="parabola vertex (inside)"),
                Line2D([], [], color="black", marker="x", ms=8, ls="", label="best run (vertex outside)")]
    axes[-1].legend(handles=handles, fontsize=7.5, loc="best")
    return axes


def plot_minima_vs_budget(paper, ours=None, axes=None):
    """The paper's published minima per r against the budget: N* (left), L* (middle), and the
    tokens per unique parameter at the minimum (right) with our CPU minima beside the paper's."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    pal = dict(zip(R_VALUES, sns.color_palette("deep", len(R_VALUES))))
    for r in R_VALUES:
        g = paper[paper.r == r].sort_values("budget")
        axes[0].plot(g.budget, g.n_star / 1e6, "o-", color=pal[r], label=f"r = {r}")
        axes[1].plot(g.budget, g.loss_star, "o-", color=pal[r], label=f"r = {r}")
        axes[2].plot(g.budget, g.tokens_per_param, "o-", color=pal[r], label=f"paper, r = {r}")
        if ours is not None and len(ours):
            o = ours[(ours.r == r) & ours.inside.fillna(False).astype(bool) & ours.opens_up.fillna(False).astype(bool)]
            if len(o):
                axes[2].plot(o.budget, o.tokens_per_param, "s--", color=pal[r], mfc="white",
                             label=f"ours, r = {r}")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("training budget C (FLOPs)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_yscale("log")
    _plain_log_axis(axes[0].yaxis)
    axes[0].set_ylabel("N* (millions of unique params)")
    axes[1].set_ylabel("L* (nats/token, FineWeb-Edu)")
    axes[2].set_yscale("log")
    _plain_log_axis(axes[2].yaxis)
    axes[2].set_ylabel("tokens per unique param at N*")
    axes[0].legend(fontsize=8)
    axes[2].legend(fontsize=7, ncol=2, loc="upper right")
    return axes


def run_costs(table):
    """Wall time of the finished runs per budget and in total (from the records): runs, summed
    wall seconds, training tokens, tokens/s (total tokens over total time) and the model
    FLOP/s that the accounting credits them with."""
    import pandas as pd
    ok = table[(table.status == "ok") & table.wall_seconds.notna()].copy()
    ok["model_flops"] = ok.flops_per_token.astype(float) * ok.tokens
    rows = []
    for key, g in list(ok.groupby("budget", sort=True)) + [("total", ok)]:
        wall = g.wall_seconds.sum()
        rows.append({"budget": key if key == "total" else f"{key:.3g}", "runs": len(g), "wall_seconds": wall,
                     "wall_hours": wall / 3600, "tokens": g.tokens.sum(),
                     "tokens_per_s": g.tokens.sum() / wall if wall else float("nan"),
                     "model_gflops_per_s": g.model_flops.sum() / wall / 1e9 if wall else float("nan")})
    return pd.DataFrame(rows)


def plot_run_costs(table, axes=None):
    """Wall seconds per finished run against its optimizer steps (left, one colour per budget)
    and the model FLOP/s it achieved against its width (right, one colour per r)."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    ok = table[(table.status == "ok") & table.wall_seconds.notna()]
    colors = _budget_colors(table.budget.unique())
    for budget, color in colors.items():
        g = ok[ok.budget == budget]
        if len(g):
            axes[0].scatter(g.steps, g.wall_seconds, color=color, s=22, label=f"C = {budget:.3g}")
    pal = dict(zip(R_VALUES, sns.color_palette("deep", len(R_VALUES))))
    for r in R_VALUES:
        g = ok[ok.r == r]
        if len(g):
            axes[1].scatter(g.d_model, g.tokens_per_s * g.flops_per_token / 1e9, color=pal[r], s=22,
                            label=f"r = {r}")
    axes[0].set_xlabel("optimizer steps")
    axes[0].set_ylabel("wall time per run (s)")
    axes[1].set_xlabel("d_model")
    axes[1].set_ylabel("model FLOP/s achieved (GFLOP/s)")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return axes


def study_compute(study: str = "paper-main", peak_flops: float = H200_BF16_DENSE_PEAK, mfu: float = 0.3):
    """Training compute of a study per budget: runs, total FLOPs, and accelerator-hours at an
    ASSUMED ``mfu`` of ``peak_flops`` (default: the H200's dense bf16 peak at 30% MFU, the
    default of ``looped sweep --dry-run``; the validation passes and restarts are not included)."""
    import pandas as pd
    plan_ = study_plan(study)
    rows = []
    for key, g in list(plan_.groupby("budget", sort=True)) + [("total", plan_)]:
        flops = g.run_flops.sum()
        rows.append({"budget": key if key == "total" else f"{key:.3g}", "runs": len(g), "flops": flops,
                     "gpu_hours": flops / (peak_flops * mfu) / 3600,
                     "longest_run_hours": g.run_flops.max() / (peak_flops * mfu) / 3600})
    return pd.DataFrame(rows)


def loss_gaps_to_plain(table, paper=None, min_runs: int = 3):
    """How much loss looping costs at equal compute: for each budget, the best loss at r
    minus the best loss at r = 1 (nats; negative means the looped model did better).

    Ours: the lowest final loss among the finished runs of a (budget, r) cell, for cells with at
    least ``min_runs`` finished runs.  With ``paper`` (``paper_minima()``): the published L*
    differences as well.  One row per (source, budget), one column per looped r.
    """
    import pandas as pd
    ok = table[(table.status == "ok") & table.loss.notna()]
    g = ok.groupby(["budget", "r"]).loss
    best = g.min().where(g.size() >= min_runs).unstack("r")
    frames = [(best.sub(best[1], axis=0) if 1 in best.columns else best * float("nan")).assign(source="ours (best run)")]
    if paper is not None:
        ls = paper.pivot(index="budget", columns="r", values="loss_star")
        frames.append(ls.sub(ls[1], axis=0).assign(source="paper (L*)"))
    out = pd.concat(frames).reset_index()
    out["budget"] = [f"{b:.3g}" for b in out["budget"]]
    cols = [r for r in R_VALUES if r != 1 and r in out.columns]
    return out[["source", "budget"] + cols].rename(columns={r: f"r={r}" for r in cols})


def iso_flop_display(cells):
    """``iso_flop_cells`` rounded for printing: runs finished/planned, the best run's width, the
    vertex (N*, L*, tokens per param) of the cells that bracket their minimum, and the flag."""
    import pandas as pd
    rows = []
    for c in cells.itertuples():
        fitted = bool(c.fitted)
        vertex = fitted and bool(c.opens_up) and bool(c.inside)
        rows.append({
            "budget": f"{c.budget:.3g}", "r": c.r, "runs": f"{c.finished}/{c.planned}",
            "best s": "-" if c.finished == 0 else f"{c.best_s:g}",
            "best run at": c.best_at if isinstance(c.best_at, str) else "-",
            "N*": _eng(c.n_star) if vertex else "-",
            "L*": f"{c.loss_star:.3f}" if vertex else "-",
            "D*/N*": _num(c.tokens_per_param) if vertex else "-",
            "bracketed": ("yes" if (c.inside and c.opens_up) else "no") if fitted else "skipped (< 3 runs)",
        })
    return pd.DataFrame(rows)


def study_learning_rates(study: str = "cpu-main"):
    """Peak learning rates (``looped.optim.learning_rates``, HyperP transfer) of every run of a
    study: one row per run with the matrix (MuonH), embedding, head and norm rates."""
    import pandas as pd
    from .optim import learning_rates
    from .sweep import load_study
    from .config import get_preset
    rows = []
    for run in load_study(study):
        cfg = run.model_config()
        bt = get_preset(run.preset).batch_tokens
        lrs = learning_rates(cfg, bt, acc.tokens_for_budget(cfg, run.budget, bt))
        rows.append(dict(budget=run.budget, r=run.r, s=run.s, d_model=cfg.d_model, **lrs))
    return pd.DataFrame(rows)


def learning_rate_summary(studies=("paper-main", "cpu-main")):
    """Range of each peak learning rate over the runs of each budget of the given studies."""
    import pandas as pd
    rows = []
    for study in studies:
        lr = study_learning_rates(study)
        for budget, g in lr.groupby("budget", sort=True):
            rows.append({"study": study, "budget": f"{budget:.3g}",
                         **{k: _span(g[k], lambda v: f"{v:.4f}") for k in ("matrix", "embedding", "head", "norm")}})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- fitting phi (chapter 4)

LAW_PARAMS = ("A", "alpha", "B", "beta", "E", "phi")
_R_COLORS = {1: "#4c72b0", 2: "#55a868", 4: "#dd8452", 8: "#c44e52"}
_BUDGET_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def study_runs(runs_dirs):
    """Run records of one or more sweep folders as one table (`looped.sweep.read_records`).

    Relative folders are taken from the repository root.  A folder that does not exist yet (a
    sweep that has not started) contributes nothing.  Every status is kept; the column
    ``folder`` names the folder a record came from.
    """
    import pandas as pd

    from .sweep import COLUMNS, read_records
    frames = []
    for folder in ([runs_dirs] if isinstance(runs_dirs, (str, Path)) else list(runs_dirs)):
        path = Path(folder)
        path = path if path.is_absolute() else repo_root() / path
        if path.is_dir():
            frames.append(read_records(path).assign(folder=str(folder)))
    if not frames:
        return pd.DataFrame(columns=COLUMNS + ["folder"])
    return pd.concat(frames, ignore_index=True)


def main_design(runs):
    """Split a runs table into the main-study design the joint law is fitted to and the rest.

    Kept: finished runs (status ``ok``) of the plain model (r = 1) and of looped models with the
    default linear injection and full backpropagation (``bptt_k == r``).  Returns
    ``(kept, dropped)``; ``dropped`` has a ``reason`` column.
    """
    import numpy as np
    ok = runs["status"].astype(str) == "ok"
    r = runs["r"].astype(float)
    inj = runs["injection"].astype(str)
    k = runs["bptt_k"].astype(float)
    design = (r == 1) | ((inj == "linear") & np.isclose(k, r))
    reason = np.where(~ok, "status " + runs["status"].astype(str), "not the main design")
    kept = runs[ok & design].reset_index(drop=True)
    dropped = runs[~(ok & design)].assign(reason=reason[~(ok & design).to_numpy()]).reset_index(drop=True)
    for col in ("budget", "r", "s", "n_once", "n_rec", "tokens", "loss"):
        kept[col] = kept[col].astype(float)
    kept["r"] = kept["r"].astype(int)
    return kept, dropped


def budget_halves(budgets):
    """Lower and upper halves of a set of training budgets, as two sorted lists.

    An even number of budgets is split in the middle (the paper's six: three and three).  With
    an odd number the middle budget belongs to both halves (three budgets: the lowest two and
    the highest two), so that each half still spans more than one iso-FLOP curve.
    """
    b = sorted(set(float(x) for x in budgets))
    h = (len(b) + 1) // 2
    return b[:h], b[len(b) - h:]


def paper_fits():
    """The paper's published fits (``runs/paper/fits.csv``), indexed by the ``fit`` column."""
    return paper_table("fits").set_index("fit")


def law_row(res, ci: bool = True) -> dict:
    """One fitted law as a flat dict: the six parameters, R^2, the Huber sum, the number of runs
    and, with ``ci``, the bootstrap percentiles as ``<param>_lo`` / ``<param>_hi`` (NaN where
    there are none).  A parameter that was held fixed is reported at its fixed value."""
    nan = float("nan")
    out = {}
    for p in LAW_PARAMS:
        v = getattr(res, p)
        out[p] = nan if v is None else float(v)
    out.update(r2=float(res.r2), huber=float(res.huber), n_runs=int(res.n_runs))
    if ci:
        for p in LAW_PARAMS:
            lo, hi = res.ci.get(p, (nan, nan))
            out[f"{p}_lo"], out[f"{p}_hi"] = float(lo), float(hi)
    return out


def _fmt(col: str, v) -> str:
    """The printed precision of one table cell, chosen by its column name (stable across machines:
    the weakly identified A and B get three significant digits, exponents, E and phi three
    decimals, R^2 four)."""
    import math
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, (bool,)):
        return str(v)
    base = col.split("_lo")[0].split("_hi")[0].split(" ")[0]
    if base in ("A", "B"):
        return f"{float(v):.3g}"
    if base in ("r2", "R^2", "R2"):
        return f"{float(v):.4f}"
    if base in ("huber", "huber_x1e5"):
        return f"{float(v):.3g}"
    if base in ("n_runs", "n", "r", "runs", "cells", "pairs"):
        return f"{int(v)}"
    if base in ("budget", "budgets"):
        return f"{float(v):.3g}"
    return f"{float(v):.3f}"


def format_table(df, index: bool = True) -> str:
    """A table as text with the precision of `_fmt` per column (a column's name, or the last
    level of a two-level name, picks the format).  Missing values print as ``-``."""
    import pandas as pd
    out = pd.DataFrame(index=df.index)
    for col in df.columns:
        name = col[-1] if isinstance(col, tuple) else col
        out[col] = [_fmt(str(name), v) for v in df[col]]
    if isinstance(df.columns, pd.MultiIndex):
        out.columns = pd.MultiIndex.from_tuples(list(df.columns))
    return out.to_string(index=index)


def side_by_side(ours, paper, keys=("ours", "paper")):
    """Two tables with the same row index next to each other under a top column level
    ``ours | paper``; rows present in only one of them are kept (missing cells are NaN)."""
    import pandas as pd
    return pd.concat([ours, paper], axis=1, keys=list(keys))


def params_comparison(res, paper: dict, paper_ci: dict | None = None, ci: bool = True):
    """Parameter-by-parameter table of a fit against published values.

    Rows A, alpha, B, beta, E, phi and R^2; columns ``ours`` (with ``2.5%`` / ``97.5%`` bootstrap
    percentiles when ``ci``) and ``paper`` (with the paper's interval where it gives one,
    ``paper_ci`` = {param: (lo, hi)})."""
    import pandas as pd
    nan = float("nan")
    row = law_row(res)
    rows = []
    for p in LAW_PARAMS + ("R^2",):
        key = "r2" if p == "R^2" else p
        r = {"ours": row[key]}
        if ci:
            r["2.5%"] = row.get(f"{key}_lo", nan)
            r["97.5%"] = row.get(f"{key}_hi", nan)
        r["paper"] = paper.get(key, nan)
        lo, hi = (paper_ci or {}).get(key, (nan, nan))
        r["paper 2.5%"], r["paper 97.5%"] = lo, hi
        rows.append(r)
    df = pd.DataFrame(rows, index=list(LAW_PARAMS) + ["R^2"])
    df.index.name = "param"
    return df


def format_params(df) -> str:
    """Text of a `params_comparison` table, each row printed with its parameter's precision."""
    lines = []
    width = max(len(c) for c in df.columns)
    width = max(width, 9)
    lines.append(f"{'param':<6}" + "".join(f" {c:>{width}}" for c in df.columns))
    for p, row in df.iterrows():
        lines.append(f"{p:<6}" + "".join(f" {_fmt(p if p != 'R^2' else 'r2', v):>{width}}" for v in row))
    return "\n".join(lines)


def residuals_by_r(res, runs):
    """Residuals (observed minus predicted loss, nats) of a fitted law, summarised per r: number
    of runs, mean residual, largest absolute residual and RMSE (the paper's per-r table)."""
    import numpy as np
    import pandas as pd
    from .fit import residuals
    df = pd.DataFrame({"r": runs["r"].astype(int).to_numpy(), "res": residuals(res, runs)})
    g = df.groupby("r")["res"]
    out = pd.DataFrame({"n_runs": g.size(), "mean_residual": g.mean(),
                        "max_abs_residual": g.apply(lambda x: float(np.abs(x).max())),
                        "rmse": g.apply(lambda x: float(np.sqrt(np.mean(np.square(x)))))})
    return out


def _budget_markers(budgets):
    return {b: _BUDGET_MARKERS[i % len(_BUDGET_MARKERS)] for i, b in enumerate(sorted(set(budgets)))}


def _scatter_by_r_and_budget(ax, runs, x, y, marks):
    """One point per run: colour is r, marker is the budget; plus legend-only handles."""
    import numpy as np
    for r in sorted(runs["r"].unique()):
        for b, m in marks.items():
            sel = (runs["r"].to_numpy() == r) & np.isclose(runs["budget"].to_numpy(float), b)
            if sel.any():
                ax.scatter(np.asarray(x)[sel], np.asarray(y)[sel], color=_R_COLORS.get(int(r), "0.5"),
                           marker=m, s=30, edgecolor="white", lw=0.4, zorder=3)
    for r in sorted(runs["r"].unique()):
        ax.scatter([], [], color=_R_COLORS.get(int(r), "0.5"), marker="o", label=f"r = {int(r)}")
    for b, m in marks.items():
        ax.scatter([], [], color="0.4", marker=m, label=f"C = {b:.2g} FLOPs")


def plot_residuals(ax, res, runs, title: str | None = None):
    """Residuals of a fitted law against unique non-embedding parameters N (log axis): colour is
    r, marker is the training budget; the grey band is +-1 RMSE of all runs."""
    import numpy as np
    from .fit import residuals
    resid = residuals(res, runs)
    n = (runs["n_once"] + runs["n_rec"]).to_numpy(float)
    marks = _budget_markers(runs["budget"])
    rmse = float(np.sqrt(np.mean(resid ** 2)))
    ax.axhspan(-rmse, rmse, color="0.85", alpha=0.6, lw=0, label=f"+-RMSE ({rmse:.3f} nats)")
    ax.axhline(0, color="0.3", lw=0.8)
    _scatter_by_r_and_budget(ax, runs, n, resid, marks)
    ax.set_xscale("log")
    ax.set_xlabel("unique non-embedding parameters N")
    ax.set_ylabel("observed - predicted loss (nats)")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_predicted_vs_observed(ax, res, runs, title: str | None = None):
    """Observed final loss against the fitted law's prediction for every run (colour r, marker
    budget), with the identity line."""
    import numpy as np
    from .fit import predict
    pred = predict(res, runs["n_once"], runs["n_rec"], runs["r"], runs["tokens"])
    obs = runs["loss"].to_numpy(float)
    marks = _budget_markers(runs["budget"])
    lo, hi = float(min(pred.min(), obs.min())), float(max(pred.max(), obs.max()))
    pad = 0.04 * (hi - lo)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="0.3", lw=0.8, ls="--", label="observed = predicted")
    _scatter_by_r_and_budget(ax, runs, pred, obs, marks)
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_aspect("equal")
    ax.set_xlabel("predicted loss (nats/token)")
    ax.set_ylabel("observed validation loss (nats/token)")
    ax.legend(fontsize=7, loc="upper left")
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_bootstrap(ax, res, param: str = "phi", paper=None, label: str = "ours"):
    """Histogram of the bootstrap resamples of one parameter, with the point estimate and the
    2.5/97.5 percentile band; ``paper`` = (value, lo, hi) adds the published estimate and interval."""
    import numpy as np
    from .fit import REPORT
    samples = np.asarray(res.boot_samples)[:, REPORT.index(param)]
    lo, hi = res.ci[param]
    ax.hist(samples, bins=30, color="#4c72b0", alpha=0.55, label=f"{label}: {len(samples)} resamples")
    ax.axvspan(lo, hi, color="#4c72b0", alpha=0.12, label=f"{label} 95% interval [{lo:.2f}, {hi:.2f}]")
    ax.axvline(getattr(res, param), color="#4c72b0", lw=2, label=f"{label} fit {getattr(res, param):.3f}")
    if paper is not None:
        v, plo, phi_ = paper
        ax.axvspan(plo, phi_, color="#dd8452", alpha=0.15, label=f"paper 95% interval [{plo}, {phi_}]")
        ax.axvline(v, color="#dd8452", lw=2, ls="--", label=f"paper {v}")
    ax.set_xlabel(f"bootstrap estimate of {param}")
    ax.set_ylabel("resamples")
    ax.legend(fontsize=7)
    return ax


def plot_minima_laws(axes, minima_runs, laws: dict, budgets=None):
    """Two views of laws fitted to (or compared on) the published compute-optimal minima.

    Left: the published L* per budget and r (points) and each law's prediction at the same
    (N*, D*) (lines).  Right: each law's compute-optimal loss of the plain model (r = 1, paper
    widths, `looped.fit.compute_optimal`) extrapolated over ``budgets``; the shaded span is the
    range of budgets the paper trained.  ``laws`` maps a label to a FitResult."""
    import numpy as np
    from .fit import compute_optimal, predict
    left, right = axes
    styles = ["-", "--", ":", "-."]
    for r in sorted(minima_runs["r"].unique()):
        g = minima_runs[minima_runs["r"] == r].sort_values("budget")
        left.scatter(g["budget"], g["loss"], color=_R_COLORS.get(int(r), "0.5"), s=30, zorder=3)
        for (label, law), ls in zip(laws.items(), styles):
            left.plot(g["budget"], predict(law, g["n_once"], g["n_rec"], g["r"], g["tokens"]),
                      color=_R_COLORS.get(int(r), "0.5"), ls=ls, lw=1.2)
    for r in sorted(minima_runs["r"].unique()):
        left.scatter([], [], color=_R_COLORS.get(int(r), "0.5"), label=f"published L*, r = {int(r)}")
    for (label, _), ls in zip(laws.items(), styles):
        left.plot([], [], color="0.3", ls=ls, label=label)
    left.set_xscale("log")
    left.set_xlabel("training budget C (FLOPs)")
    left.set_ylabel("loss at the iso-FLOP minimum (nats/token)")
    left.legend(fontsize=7)
    budgets = np.logspace(17.5, 23, 23) if budgets is None else np.asarray(budgets, float)
    cmin, cmax = float(minima_runs["budget"].min()), float(minima_runs["budget"].max())
    right.axvspan(cmin, cmax, color="0.9", label="budgets of the paper's sweep")
    for (label, law), ls in zip(laws.items(), styles):
        co = compute_optimal(law, r=(1,), budgets=budgets, s_grid=np.arange(2, 400, 1.0))
        right.plot(co["budget"], co["loss_star"], color="0.2", ls=ls, label=f"{label} (E = {law.E:.2f})")
    right.set_xscale("log")
    right.set_xlabel("training budget C (FLOPs)")
    right.set_ylabel("compute-optimal loss, r = 1 (nats/token)")
    right.legend(fontsize=7)
    return axes


def same_width_gaps(runs):
    """Model-free view of what looping costs: for every (budget, width s) at which both the plain
    model and a looped model were trained, the looped model's loss minus the plain model's
    (nats; same width, hence almost the same FLOPs per token and tokens).  Summarised per r:
    number of matched pairs, mean, smallest and largest gap."""
    import pandas as pd
    plain = runs[runs["r"] == 1][["budget", "s", "loss"]].rename(columns={"loss": "plain"})
    looped = runs[runs["r"] > 1][["budget", "s", "r", "loss"]]
    m = looped.merge(plain, on=["budget", "s"])
    m["gap"] = m["loss"] - m["plain"]
    g = m.groupby("r")["gap"]
    out = pd.DataFrame({"pairs": g.size(), "mean_gap": g.mean(), "min_gap": g.min(), "max_gap": g.max()})
    out.index = out.index.astype(int)
    return out


def at_bounds(res, tol: float = 1e-6) -> list:
    """Names of the free parameters of a fit that ended on the edge of the search box (the
    optimum lies outside the box; such a value is a bound, not an estimate)."""
    import numpy as np
    from .fit import HI, LO, REPORT
    th = np.asarray(res.theta, float)
    if th.size != len(REPORT):
        return []
    return [p for i, p in enumerate(REPORT)
            if p in res.free and (abs(th[i] - LO[i]) < tol or abs(th[i] - HI[i]) < tol)]
