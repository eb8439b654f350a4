"""The looped (depth-recurrent) transformer of the paper, at any size.

    x = norm_emb(wte(idx)); x = prelude(x); e = x
    for i in range(r): u = inject(e, state); u = loop(u); state = norm_loop(u)
    logits = softcap(head(norm_final(coda(state))))

The plain model (injection 'none', r=1) runs all its blocks once and applies the shared
loop norm once, after its last block, as the authors' code does.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig


def rms_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """RMSNorm with a learnable gain (init 1)."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x.float(), self.eps).type_as(x) * self.weight


def rotary_tables(seq_len: int, head_dim: int, base: float = 10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos()[None, None], angles.sin()[None, None]  # (1, 1, T, head_dim/2)


def apply_rotary(x, cos, sin):
    """Half-split RoPE: rotate the pair (x[:h], x[h:]) of each head."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


# ----------------------------------------------------------------------------- the loss tail
# softcap + cross-entropy over the vocabulary is transcendental-bound on a CPU: torch.tanh costs
# ~3.5 ns per logit there, more than the rest of the tail, and autograd's backward of the
# textbook form adds further passes.  The fused tail computes the same loss with one exp for the
# softcap (tanh(x) = 1 - 2 / (exp(2x) + 1)) and one for the softmax (no max subtraction is
# needed: the softcap bounds every logit by `cap`), and a hand-written backward,
# (softmax(z) - onehot) (1 - tanh^2), with one more exp.  It saves tanh (fp32, rows x vocab) and
# the row logsumexp: one such tensor instead of the textbook's two.  torch.compile traces it into
# the model's graph and fuses each half into a few loops: ~6 ms instead of ~12-18 ms for 1024
# rows x 1024 columns on one CPU thread (`looped bench train` measures the whole step).


class SoftcapCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, cap: float, vocab: int):
        t = 1.0 - 2.0 / (torch.exp(logits[:, :vocab].float() * (2.0 / cap)) + 1.0)
        lse = torch.exp(t * cap).sum(-1).log()
        loss = (lse - cap * t.gather(1, targets[:, None]).squeeze(1)).mean()
        ctx.save_for_backward(t, lse, targets)
        ctx.cap, ctx.padded, ctx.dtype = cap, logits.shape[1], logits.dtype
        return loss

    @staticmethod
    def backward(ctx, grad):
        t, lse, targets = ctx.saved_tensors
        onehot = torch.zeros_like(t).scatter_(1, targets[:, None], 1.0)
        d = (torch.exp(t * ctx.cap - lse[:, None]) - onehot) * (1.0 - t * t) * (grad / t.shape[0])
        return F.pad(d, (0, ctx.padded - t.shape[1])).to(ctx.dtype), None, None, None


def softcap_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, cap: float, vocab: int) -> torch.Tensor:
    """The fused tail: mean cross-entropy of cap * tanh(logits[:, :vocab] / cap) (rows x padded vocab)."""
    return SoftcapCrossEntropy.apply(logits, targets, float(cap), int(vocab))


def reference_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, cap: float, vocab: int) -> torch.Tensor:
    """The same loss written the textbook way (the eager reference step)."""
    z = cap * torch.tanh(logits.float()[:, :vocab] / cap)
    return F.cross_entropy(z, targets)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.c_q, self.c_k, self.c_v = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.c_proj = nn.Linear(d, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, D = x.shape
        q, k, v = (m(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
                   for m in (self.c_q, self.c_k, self.c_v))
        # RoPE, then parameter-free QK RMS norm (the paper's order).
        q, k = rms_norm(apply_rotary(q, cos, sin)), rms_norm(apply_rotary(k, cos, sin))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(head_dim)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, D))


class MLP(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d, bias=False)
        self.c_proj = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        # ReLU^2 as h * h, not square(): square is pow, which CUDA autocast runs in fp32 (keeping an
        # fp32 copy of the 4d-wide hidden for backward); mul is on no autocast list.  Same bits.
        h = F.relu(self.c_fc(x))
        return self.c_proj(h * h)


class Block(nn.Module):
    """Pre-norm block: x += Attn(norm(x)); x += MLP(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_attn, self.norm_mlp = RMSNorm(cfg.d_model), RMSNorm(cfg.d_model)
        self.attn, self.mlp = Attention(cfg), MLP(cfg.d_model)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm_attn(x), cos, sin)
        return x + self.mlp(self.norm_mlp(x))


class HyperConnections(nn.Module):
    """Static per-step lane mixing (Zhu et al.): read with alpha, update lanes with M and beta.

    Cyclic init (alpha_i = one-hot(i mod K), M_i = I, beta_i = 1) makes step i read
    e + s_0 + ... + s_{i-1}: a cumulative additive injection.
    """

    def __init__(self, r: int, lanes: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(r, lanes))
        self.mix = nn.Parameter(torch.eye(lanes).repeat(r, 1, 1))
        self.beta = nn.Parameter(torch.ones(r, lanes))
        with torch.no_grad():
            self.alpha[torch.arange(r), torch.arange(r) % lanes] = 1.0

    # einsum is on autocast's lower-precision list: the K x K mix runs outside autocast so the
    # lanes stay fp32, unrounded, like the linear injection's residual stream.
    @staticmethod
    def _fp32(x):  # autocast exists for cpu and cuda only (the FLOP counter runs on meta)
        return torch.autocast(x.device.type, enabled=False) if x.device.type in ("cpu", "cuda") \
            else contextlib.nullcontext()

    def read(self, i, lanes):  # sum_k alpha_ik lane_k; lanes: (K, B, T, D)
        alpha = self.alpha[i].to(lanes.dtype)
        with self._fp32(lanes):
            return torch.einsum("k,kbtd->btd", alpha, lanes)

    def write(self, i, lanes, state):  # lanes <- M_i lanes + beta_i (x) state
        mix, beta = self.mix[i].to(lanes.dtype), self.beta[i].to(lanes.dtype)
        with self._fp32(lanes):
            mixed = torch.einsum("jk,kbtd->jbtd", mix, lanes)
        return mixed + beta[:, None, None, None] * state


class LoopedGPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg.validate()
        d = cfg.d_model
        self.wte = nn.Embedding(cfg.padded_vocab, d)
        self.norm_emb, self.norm_loop, self.norm_final = RMSNorm(d), RMSNorm(d), RMSNorm(d)
        self.prelude = nn.ModuleList(Block(cfg) for _ in range(cfg.n_prelude))
        self.loop = nn.ModuleList(Block(cfg) for _ in range(cfg.n_loop_layers))
        self.coda = nn.ModuleList(Block(cfg) for _ in range(cfg.n_coda))
        self.inject = nn.Linear(2 * d, d, bias=False) if cfg.injection == "linear" else None
        self.hyper = HyperConnections(cfg.r, cfg.lanes) if cfg.injection == "hyperconnect" else None
        self.lm_head = nn.Linear(d, cfg.padded_vocab, bias=False)
        cos, sin = rotary_tables(cfg.seq_len, cfg.head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.fused_loss = False  # True: the fused softcap/cross-entropy tail (runtime.fast_model sets it)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        """The paper's init; no zero matrices, since MuonH keeps each one on its initial sphere."""
        d = self.cfg.d_model
        uniform_std = lambda w, std: w.uniform_(-math.sqrt(3) * std, math.sqrt(3) * std)
        nn.init.normal_(self.wte.weight, 0.0, 1.0)
        nn.init.normal_(self.lm_head.weight, 0.0, 0.001)
        for blk in [*self.prelude, *self.loop, *self.coda]:
            for lin in (blk.attn.c_q, blk.attn.c_k, blk.attn.c_v, blk.attn.c_proj, blk.mlp.c_fc):
                uniform_std(lin.weight, 1 / math.sqrt(d))
            uniform_std(blk.mlp.c_proj.weight, 1 / math.sqrt(4 * d))
        if self.inject is not None:  # W = [I | 0]: at init the recurrent state is ignored
            self.inject.weight.zero_()
            self.inject.weight[:, :d].copy_(torch.eye(d))

    def non_embedding_params(self) -> int:
        """N as the accounting defines it: everything except the embedding and the LM head."""
        skip = {id(self.wte.weight), id(self.lm_head.weight)}
        return sum(p.numel() for p in self.parameters() if id(p) not in skip)

    def _blocks(self, blocks, x, T):
        for blk in blocks:
            x = blk(x, self.cos[:, :, :T], self.sin[:, :, :T])
        return x

    def _recur(self, e, T):
        """The r recurrences of the shared block.

        The first r - k run without autograd (truncated BPTT).
        """
        cfg = self.cfg
        n_free = cfg.r - cfg.k_bwd
        if self.hyper is not None:  # K lanes, each starting as e
            lanes = e.unsqueeze(0).expand(cfg.lanes, *e.shape)
            for i in range(cfg.r):
                u = self.hyper.read(i, lanes)
                state = self.norm_loop(self._blocks(self.loop, u, T))
                lanes = self.hyper.write(i, lanes, state)
            return lanes.sum(0)
        if cfg.injection in ("linear", "passthrough"):
            state = e
        else:  # additive
            state = torch.zeros_like(e)
        for i in range(cfg.r):
            grad = torch.is_grad_enabled() and i >= n_free
            with torch.set_grad_enabled(grad):
                if cfg.injection == "linear":  # W [e; s], fp32 under autocast
                    u = self.inject(torch.cat([e, state], dim=-1)).to(e.dtype)
                elif cfg.injection == "additive":
                    u = state + e
                else:  # passthrough
                    u = state
                state = self.norm_loop(self._blocks(self.loop, u, T))
            if i < n_free:
                state = state.detach()
        return state

    def forward(self, idx, targets=None):
        """Logits for ``idx`` (B, T), or the mean loss given ``targets``."""
        cfg, T = self.cfg, idx.shape[1]
        if T > cfg.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than "
                             f"seq_len={cfg.seq_len}")
        x = self._blocks(self.prelude, self.norm_emb(self.wte(idx)), T)  # e
        if cfg.looped:
            x = self._blocks(self.coda, self._recur(x, T), T)
        else:  # r = 1: the middle blocks run once, no injection
            x = self._blocks(self.loop, x, T)
            x = self.norm_loop(self._blocks(self.coda, x, T))
        logits = self.lm_head(self.norm_final(x))
        if targets is None:  # soft-capped logits of the real vocabulary
            logits = logits.float()[..., :cfg.vocab_size]
            return cfg.softcap * torch.tanh(logits / cfg.softcap)
        fused = self.fused_loss
        tail = softcap_cross_entropy if fused else reference_cross_entropy
        flat = logits.view(-1, logits.size(-1))
        return tail(flat, targets.reshape(-1), cfg.softcap, cfg.vocab_size)
