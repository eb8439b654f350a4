"""The paper's optimizers (as its training setup describes them): MuonH for matrices, AdamW for the rest.

MuonH is Muon with a *hyperspherical* constraint: every matrix stays on the sphere of its
initial Frobenius norm, so its scale never drifts and the learning rate directly sets the
relative (angular) step size.  That is why the model's init has no zero matrices and why
there is no weight decay.  Learning rates transfer across width, batch and duration with the
HyperP rules below, so the s=10 sweep optimum (0.014) is used at every grid point.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from . import accounting
from .config import ModelConfig, width

# Polar Express (arXiv:2505.16932), one (a, b, c) per iteration, as the authors' code uses.
POLAR_EXPRESS_COEFFS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)

# Base learning rates at the HyperP reference (s = ref_s, B = preset batch, D = D_ref).
MATRIX_LR = 0.014
ADAM_LRS = {"embedding": 0.3, "head": 0.004, "norm": 0.005, "hyper": 0.01}
BATCH_EXPONENT = 0.558
TOKENS_EXPONENT = -0.32
WIDTH_EXPONENT = -0.5
FINAL_LR_FRACTION = 0.1
GROUP_NAMES = ("matrix", "embedding", "head", "norm", "hyper")


def polar_express(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Approximate the orthogonal polar factor U V^T of a matrix G = U S V^T (or of a stack
    of equally shaped matrices, shape (n, rows, cols): one batched matmul chain for all).

    X = G / (1.02 ||G||_F + 1e-6) puts every singular value in (0, 1); each iteration
    X <- a X + (b A + c A^2) X with A = X X^T applies an odd polynomial to the singular
    values, pushing them towards 1 (only approximately: tiny singular values stay below 1).
    Tall matrices are transposed so that A is the smaller Gram matrix.

    The authors run this in bfloat16, which is what we do on CUDA.  On CPU bf16 matmuls are
    far slower than fp32 (no tensor cores), so there we compute in float32; the result is
    slightly more accurate, which does not matter for an approximate orthogonaliser.
    Returns a tensor in the compute dtype (bf16 on CUDA, fp32 otherwise).
    """
    if G.ndim not in (2, 3):
        raise ValueError(f"polar_express needs a matrix or a stack of matrices, got shape {tuple(G.shape)}")
    if steps > len(POLAR_EXPRESS_COEFFS):
        raise ValueError(f"only {len(POLAR_EXPRESS_COEFFS)} Polar Express steps are defined")
    X = G.to(torch.bfloat16 if G.is_cuda else torch.float32)
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * 1.02 + 1e-6)
    for a, b, c in POLAR_EXPRESS_COEFFS[:steps]:
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X.mT if tall else X


class MuonH(torch.optim.Optimizer):
    """Muon on the hypersphere: orthogonalised Nesterov momentum, fixed Frobenius norm.

    Per matrix W with gradient g::

        buf <- lerp(buf, g, 1 - momentum);  g <- lerp(g, buf, momentum)     (Nesterov)
        X = polar_express(g);  update = X ||W_0||_F / ||X||_F
        W <- W - lr * update;  W <- W ||W_0||_F / ||W||_F

    ||W_0||_F is recorded at the first step and kept in the optimizer state (as a Python
    float), so a resumed run projects onto the same sphere.  Because ||update|| = ||W||, the
    relative step ||dW|| / ||W|| is about lr.  No weight decay (the norm is fixed anyway) and
    no gradient clipping (the update's norm does not depend on the gradient's).
    """

    def __init__(self, params, lr: float = MATRIX_LR, momentum: float = 0.95, ns_steps: int = 5,
                 batched: bool = True):
        if lr < 0 or not 0 <= momentum < 1:
            raise ValueError(f"invalid lr={lr} or momentum={momentum}")
        super().__init__(params, dict(lr=lr, momentum=momentum, ns_steps=ns_steps))
        self.batched = batched  # False: the matrix-by-matrix reference (same maths, slower)
        self._layouts: dict = {}  # see _layout
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"MuonH handles 2-D matrices only, got shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                (self._step_batched if self.batched else self._step_one_by_one)(group, params)
        return loss

    def _init_state(self, params):
        fresh = [p for p in params if not self.state[p]]
        if not fresh:
            return
        if self.batched:  # one host sync for all initial norms, at the first step only
            norms = torch.stack(torch._foreach_norm(fresh)).tolist()
        else:
            norms = [p.norm().item() for p in fresh]
        for p, norm in zip(fresh, norms):
            self.state[p].update(momentum_buffer=torch.zeros_like(p), w0_norm=norm)
        self._layouts.clear()

    def load_state_dict(self, state_dict):
        """Restore a checkpoint's state; the per-shape norm tensors are rebuilt from it on the next step."""
        super().load_state_dict(state_dict)
        self._layouts.clear()  # the initial norms now come from the checkpoint

    def _layout(self, params) -> tuple[torch.Tensor, list[tuple[list[int], torch.Tensor]]]:
        """The initial norms of `params` as one device tensor, and per shape the indices of its
        matrices and their norms: built once, because a tensor made from a Python list (or a
        tensor indexed by one) is a copy from pageable host memory, which on CUDA waits for
        the stream; rebuilt each step they cost 2-4 host syncs a step."""
        key = tuple(map(id, params))
        if key not in self._layouts:
            w0 = torch.tensor([self.state[p]["w0_norm"] for p in params], dtype=torch.float32,
                              device=params[0].device)
            by_shape: dict[tuple[int, int], list[int]] = {}
            for i, p in enumerate(params):
                by_shape.setdefault(tuple(sorted(p.shape)), []).append(i)
            self._layouts[key] = (w0, [(index, w0[index]) for index in by_shape.values()])
        return self._layouts[key]

    def _step_one_by_one(self, group, params):
        """The reference implementation: one Polar Express chain per matrix."""
        lr, momentum = group["lr"], group["momentum"]
        self._init_state(params)
        for p in params:
            state = self.state[p]
            buf, w0 = state["momentum_buffer"], state["w0_norm"]
            buf.lerp_(p.grad, 1 - momentum)
            g = p.grad.lerp(buf, momentum)
            X = polar_express(g, group["ns_steps"]).to(p.dtype)
            # no host sync: the step stays on the device
            p.sub_(X.mul_(lr * w0 / (X.norm() + 1e-12)))
            p.mul_(w0 / (p.norm() + 1e-12))

    def _step_batched(self, group, params):
        """The same update with every matrix of one shape orthogonalised in one batched chain.

        A step then costs a few dozen kernel launches instead of ~60 per matrix, which is what
        made small models launch-bound.  Tall matrices are transposed so that the (d, 4d) and
        (4d, d) MLP matrices share one stack.
        """
        lr, momentum = group["lr"], group["momentum"]
        self._init_state(params)
        bufs = [self.state[p]["momentum_buffer"] for p in params]
        grads = [p.grad for p in params]
        torch._foreach_lerp_(bufs, grads, 1 - momentum)
        nesterov = torch._foreach_lerp(grads, bufs, momentum)
        w0, shapes = self._layout(params)
        updates: list[torch.Tensor | None] = [None] * len(params)
        for index, w0_index in shapes:
            stack = torch.stack([nesterov[i].mT if params[i].size(0) > params[i].size(1) else nesterov[i]
                                 for i in index])
            X = polar_express(stack, group["ns_steps"]).float()
            X = X * (lr * w0_index / (X.norm(dim=(1, 2)) + 1e-12))[:, None, None]
            for j, i in enumerate(index):
                x = X[j].mT if params[i].size(0) > params[i].size(1) else X[j]
                updates[i] = x.to(params[i].dtype)
        torch._foreach_sub_(params, updates)
        norms = torch.stack(torch._foreach_norm(params))
        torch._foreach_mul_(params, list((w0 / (norms + 1e-12)).unbind(0)))


def param_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Split a LoopedGPT's parameters by optimizer treatment (keys: GROUP_NAMES).

    matrix: every nn.Linear except the LM head (block attention/MLP and the injection W);
    embedding: wte; head: lm_head; norm: RMSNorm gains; hyper: hyperconnection scalars.
    Classification goes by module type, and we assert that every parameter lands in exactly
    one group, so a new module type fails loudly instead of silently going untrained.
    """
    from .model import HyperConnections, RMSNorm  # torch-heavy; keep import local
    head = model.lm_head
    groups: dict[str, list[nn.Parameter]] = {k: [] for k in GROUP_NAMES}
    for module in model.modules():
        if module is head:
            key = "head"
        elif isinstance(module, nn.Embedding):
            key = "embedding"
        elif isinstance(module, nn.Linear):
            key = "matrix"
        elif isinstance(module, RMSNorm):
            key = "norm"
        elif isinstance(module, HyperConnections):
            key = "hyper"
        else:
            continue
        groups[key].extend(module.parameters(recurse=False))
    seen = [id(p) for ps in groups.values() for p in ps]
    assert len(seen) == len(set(seen)), "a parameter landed in two optimizer groups"
    assert set(seen) == {id(p) for p in model.parameters()}, "a parameter has no optimizer group"
    assert all(p.ndim == 2 for p in groups["matrix"]), "MuonH groups must hold matrices only"
    return groups


def learning_rates(cfg: ModelConfig, batch_tokens: int, tokens: int) -> dict[str, float]:
    """Per-group peak learning rates with the paper's HyperP transfer.

    matrix (MuonH): 0.014 (B/B_ref)^0.558 (D/D_ref)^-0.32; the MuonH step is relative, so no
    width factor.  AdamW groups: base LR (d/d_ref)^-0.5 (B/B_ref)^0.558, no duration factor.
    B_ref is the preset's default batch (2^18 for the paper), d_ref its reference width
    (640 for the paper) and D_ref = accounting.hyperp_reference_tokens(cfg).  For the paper
    preset this is exactly the paper's formula; for the small presets it transfers the
    paper's optimum to their own reference point (an assumption, not something the paper
    tested).
    """
    if batch_tokens <= 0 or tokens <= 0:
        raise ValueError("batch_tokens and tokens must be positive")
    p = cfg.preset
    batch = (batch_tokens / p.batch_tokens) ** BATCH_EXPONENT
    duration = (tokens / accounting.hyperp_reference_tokens(cfg)) ** TOKENS_EXPONENT
    wide = (cfg.d_model / width(p, p.ref_s)) ** WIDTH_EXPONENT
    lrs = {"matrix": MATRIX_LR * batch * duration}
    lrs.update({k: v * wide * batch for k, v in ADAM_LRS.items()})
    return lrs


def build_optimizers(model: nn.Module, cfg: ModelConfig, batch_tokens: int,
                     tokens: int, fast: bool = True) -> list[torch.optim.Optimizer]:
    """[MuonH over the matrices, AdamW over everything else], one named group per key.

    Each group carries 'name' and 'initial_lr' (the peak LR that `set_lr` scales).  Empty
    groups (e.g. 'hyper' without hyperconnections) are omitted.  AdamW uses the fused CUDA
    kernel when every parameter is on CUDA.  Elsewhere `fast` selects the multi-tensor
    (foreach) AdamW and the shape-batched MuonH; `fast=False` is the one-tensor-at-a-time
    reference step (same maths, many more kernel launches).
    """
    groups, lrs = param_groups(model), learning_rates(cfg, batch_tokens, tokens)
    optimizers: list[torch.optim.Optimizer] = []
    if groups["matrix"]:
        optimizers.append(MuonH([dict(params=groups["matrix"], lr=lrs["matrix"],
                                      initial_lr=lrs["matrix"], name="matrix")], batched=fast))
    adam = [dict(params=groups[k], lr=lrs[k], initial_lr=lrs[k], name=k)
            for k in GROUP_NAMES if k != "matrix" and groups[k]]
    if adam:
        fused = {"fused": True} if all(p.is_cuda for g in adam for p in g["params"]) else {"foreach": fast}
        optimizers.append(torch.optim.AdamW(adam, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0, **fused))
    return optimizers


def set_fast(optimizers, fast: bool) -> None:
    """Switch built optimizers between the batched step and the one-tensor-at-a-time reference
    (as `build_optimizers(fast=...)` would have built them; fused CUDA AdamW stays fused)."""
    for opt in optimizers:
        if isinstance(opt, MuonH):
            opt.batched = fast
        elif not opt.defaults.get("fused"):
            for group in opt.param_groups:
                group["foreach"] = fast


def lr_multiplier(step: int, total_steps: int) -> float:
    """No warmup; linear decay from 1.0 at step 0 to 0.1 at step total_steps - 1.

    A one-step run uses 1.0; steps outside [0, total_steps - 1] are clamped.
    """
    if total_steps <= 1:
        return 1.0
    frac = min(max(step, 0), total_steps - 1) / (total_steps - 1)
    return 1.0 - (1.0 - FINAL_LR_FRACTION) * frac


def set_lr(optimizers, multiplier: float) -> None:
    """Set every group's lr to initial_lr * multiplier (call before each optimizer step)."""
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * multiplier
