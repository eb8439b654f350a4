"""Parameter and FLOPs accounting: the x-axis of every plot and the compute axis of every run.

One set of formulas (the paper's accounting, checked against its Table 6) used by the trainer
(steps for a budget), the sweep (dry-run sizing), the fitter (compute-optimal allocation) and
the book.  Tests check them against the live model's parameter counts and against the paper's
published tables.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace

from .config import ConfigError, ModelConfig, model_config, size_note
from .io import add_json_option, destination_error, write_json


def block_params(d: int) -> int:
    """One transformer block: 4d^2 attention + 8d^2 MLP + two RMSNorm gains."""
    return 12 * d * d + 2 * d


def injection_params(cfg: ModelConfig) -> int:
    """Parameters of the injection layer (counted in N_rec)."""
    if cfg.injection == "linear":
        return 2 * cfg.d_model ** 2
    if cfg.injection == "hyperconnect":  # alpha (r x K), M (r x K x K), beta (r x K)
        return cfg.r * (cfg.lanes ** 2 + 2 * cfg.lanes)
    return 0


def n_rec(cfg: ModelConfig) -> int:
    """Unique parameters of the looped part (recurrent blocks + injection); 0 for a plain model."""
    if not cfg.looped:
        return 0
    return cfg.n_loop_layers * block_params(cfg.d_model) + injection_params(cfg)


def n_once(cfg: ModelConfig) -> int:
    """Unique non-embedding parameters run once per token (prelude, coda, the 3 model norms).

    For the plain model every block runs once, so N_once = N and N_rec = 0.
    """
    blocks = cfg.n_prelude + cfg.n_coda + (0 if cfg.looped else cfg.n_loop_layers)
    return blocks * block_params(cfg.d_model) + 3 * cfg.d_model


def n_params(cfg: ModelConfig) -> int:
    """N: unique non-embedding parameters (embedding and LM head excluded)."""
    return n_once(cfg) + n_rec(cfg)


def n_effective(n_once_: float, n_rec_: float, r: float, phi: float) -> float:
    """The paper's effective size N_once + r^phi N_rec (works on numpy arrays too)."""
    return n_once_ + r ** phi * n_rec_


def flops_per_token(cfg: ModelConfig) -> int:
    """Training FLOPs per token (forward + backward), the authors' code formula (Table 6)."""
    return sum(flops_breakdown(cfg).values())


def flops_breakdown(cfg: ModelConfig) -> dict[str, int]:
    """`flops_per_token` in its three parts: the block and injection weights, the LM head, and
    attention's score and value products (12dT per layer, which dominate narrow models).

    Recurrences outside the truncation window run forward only (2 FLOPs per weight,
    4dT attention per layer) instead of forward+backward (6 and 12dT).  Hyperconnections
    replace the 2d^2 injection by (K^2+2K)d mixing FLOPs.  The embedding lookup is free.
    """
    d, T = cfg.d_model, cfg.seq_len
    blk = block_params(d)
    once_layers = cfg.n_prelude + cfg.n_coda
    parts = {"weights": 6 * once_layers * blk, "head": 6 * cfg.padded_vocab * d,
             "attention": 12 * d * T * once_layers}
    if not cfg.looped:
        parts["weights"] += 6 * cfg.n_loop_layers * blk
        parts["attention"] += 12 * cfg.n_loop_layers * d * T
        return parts
    k_bwd = cfg.k_bwd
    k_fwd = cfg.r - k_bwd
    if cfg.injection == "hyperconnect":
        p_inj = (cfg.lanes ** 2 + 2 * cfg.lanes) * d
    else:
        p_inj = injection_params(cfg)
    parts["weights"] += (2 * k_fwd + 6 * k_bwd) * (cfg.n_loop_layers * blk + p_inj)
    parts["attention"] += (4 * k_fwd + 12 * k_bwd) * cfg.n_loop_layers * d * T
    return parts


def looped_flops_share(cfg: ModelConfig) -> float:
    """The share of the full-backprop training FLOPs per token spent in the recurrent block and
    the injection: the part truncated backpropagation makes cheaper (it cuts that part to 2/3
    when half the recurrences get gradient), hence the token gain at a fixed budget."""
    rec = cfg.n_loop_layers * block_params(cfg.d_model) + injection_params(cfg)
    part = 6 * cfg.r * rec + 12 * cfg.r * cfg.n_loop_layers * cfg.d_model * cfg.seq_len
    return part / flops_per_token(replace(cfg, bptt_k=None))


def injection_flops_share(cfg: ModelConfig) -> float:
    """The share of the full-backprop training FLOPs per token spent in the linear injection
    (6 r 2d^2): what dropping it for hyperconnections saves, before the lane mixing is added back."""
    return 6 * cfg.r * injection_params(cfg) / flops_per_token(replace(cfg, bptt_k=None))


def hyperp_reference_tokens(cfg: ModelConfig) -> int:
    """D_ref of the HyperP learning-rate transfer: 10 tokens per "code-effective" parameter of
    the preset's reference model (s = ref_s; r=4 for looped models, the plain model for r=1).

    The authors' code counts a looped model's parameters with the loop unrolled (blocks as
    20 unique layers plus r injections); for the paper preset this gives 1,016,083,200
    tokens (looped) and 983,315,200 (plain).
    """
    p = cfg.preset
    d = model_config(p, r=1, s=p.ref_s).d_model
    unrolled = p.effective_depth * block_params(d) + 3 * d
    if cfg.looped:
        unrolled += 4 * 2 * d * d
    return 10 * unrolled


def steps_for_budget(cfg: ModelConfig, budget: float, batch_tokens: int) -> int:
    """Optimizer steps that spend a FLOPs budget at a fixed batch size (at least one)."""
    if budget <= 0 or batch_tokens <= 0:
        raise ConfigError("budget and batch_tokens must be positive")
    return max(1, round(budget / (flops_per_token(cfg) * batch_tokens)))


def tokens_for_budget(cfg: ModelConfig, budget: float, batch_tokens: int) -> int:
    """Training tokens D that a budget buys: whole steps of `batch_tokens`."""
    return steps_for_budget(cfg, budget, batch_tokens) * batch_tokens


def summary(cfg: ModelConfig, budget: float | None = None, batch_tokens: int | None = None) -> dict:
    """Every accounting figure of one configuration, as the CLI and run records print it."""
    out = {"preset": cfg.preset.name, "s": cfg.s, "r": cfg.r, "injection": cfg.injection,
           "lanes": cfg.lanes if cfg.injection == "hyperconnect" else None, "bptt_k": cfg.k_bwd,
           "d_model": cfg.d_model, "n_head": cfg.n_head, "seq_len": cfg.seq_len,
           "n": n_params(cfg), "n_once": n_once(cfg), "n_rec": n_rec(cfg),
           "flops_per_token": flops_per_token(cfg)}
    if budget is not None:
        bt = batch_tokens or cfg.preset.batch_tokens
        out.update(budget=budget, batch_tokens=bt, steps=steps_for_budget(cfg, budget, bt),
                   tokens=tokens_for_budget(cfg, budget, bt))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="looped accounting",
                                 description="Parameter and FLOPs accounting of one configuration.")
    ap.add_argument("--preset", default="paper", help="model preset: paper, prose, cpu or tiny (default: paper)")
    ap.add_argument("--r", type=int, default=1, help="recurrences per forward pass; r divides the loop depth "
                                                     "(default: 1)")
    ap.add_argument("--size", "-s", type=float, default=10, help="width knob s (paper: d = 64 s; default: 10)")
    ap.add_argument("--injection", default=None, help="none, linear, additive, passthrough or hyperconnect "
                                                      "(default: none for r = 1, else linear)")
    ap.add_argument("--lanes", type=int, default=2, help="hyperconnection lanes (default: 2)")
    ap.add_argument("--bptt-k", type=int, default=None, help="backpropagate through the last k recurrences only "
                                                              "(default: all r)")
    ap.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the preset's)")
    ap.add_argument("--budget", type=float, default=None, help="training FLOPs budget C: adds steps and tokens")
    ap.add_argument("--batch-tokens", type=int, default=None, help="tokens per optimizer step (default: the "
                                                                   "preset's)")
    add_json_option(ap, "the figures")
    a = ap.parse_args(argv)
    try:
        for flag, value, low in (("--seq-len", a.seq_len, 1), ("--batch-tokens", a.batch_tokens, 1)):
            if value is not None and value < low:
                raise ConfigError(f"{flag} must be >= {low}, got {value}")
        if a.budget is not None and not (math.isfinite(a.budget) and a.budget > 0):
            raise ConfigError(f"--budget must be a finite number > 0, got {a.budget:g}")
        error = destination_error(a.json, "--json")
        if error:
            raise ConfigError(error)
        extra = {"seq_len": a.seq_len} if a.seq_len is not None else {}
        cfg = model_config(a.preset, r=a.r, s=a.size, injection=a.injection, lanes=a.lanes,
                           bptt_k=a.bptt_k, **extra)
        if a.batch_tokens is not None and a.batch_tokens % cfg.seq_len:
            raise ConfigError(f"--batch-tokens {a.batch_tokens} must be a multiple of the sequence length "
                              f"{cfg.seq_len}")
        out = summary(cfg, a.budget, a.batch_tokens)
    except ConfigError as e:
        print(f"looped accounting: error: {e}", file=sys.stderr)
        return 2
    note = size_note(cfg.preset, cfg.s)
    if note:
        print(f"looped accounting: warning: {note}", file=sys.stderr)
    if a.json is not None:
        write_json(a.json, out)
    if a.json != "-":
        for k, v in out.items():
            print(f"{k:>16}  {v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{k:>16}  {v}")
    return 0
