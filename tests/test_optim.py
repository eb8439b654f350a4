"""Tests of the optimizers and learning-rate rules (the paper's training recipe, Section 4)."""
import copy

import pytest
import torch

from looped import accounting
from looped.config import model_config
from looped.model import LoopedGPT
from looped.optim import MuonH, build_optimizers, learning_rates, lr_multiplier, param_groups, polar_express, set_lr


@pytest.mark.parametrize("shape", [(64, 64), (32, 128), (128, 32)])
def test_polar_express_singular_values_near_one(shape):
    torch.manual_seed(0)
    G = torch.randn(*shape) * 3.7
    X = polar_express(G)
    assert X.shape == G.shape and X.dtype == torch.float32  # fp32 on CPU
    sv = torch.linalg.svdvals(X)
    assert sv.max() < 1.25
    if shape[0] == shape[1]:
        # A random square matrix has singular values near 0 that five steps cannot lift.
        assert (sv > 0.7).float().mean() > 0.9
    else:
        assert sv.min() > 0.7
    # Orthogonalisation keeps the singular vectors: X is close to U V^T.
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    assert torch.linalg.norm(X - U @ Vh) / torch.linalg.norm(U @ Vh) < 0.3


def tiny(**kw):
    return LoopedGPT(model_config("tiny", **{"r": 4, "s": 4, **kw}))


def test_muonh_keeps_initial_norm_and_step_is_about_lr():
    torch.manual_seed(0)
    mats = [torch.nn.Parameter(torch.randn(16, 48) * 0.2), torch.nn.Parameter(torch.randn(64, 16))]
    w0 = [m.detach().norm().item() for m in mats]
    lr = 0.02
    opt = MuonH([dict(params=mats, lr=lr, initial_lr=lr)])
    for _ in range(5):
        before = [m.detach().clone() for m in mats]
        for m in mats:
            m.grad = torch.randn_like(m)
        opt.step()
        for m, b, n0 in zip(mats, before, w0):
            assert abs(m.norm().item() / n0 - 1) < 1e-5
            rel = ((m - b).norm() / b.norm()).item()
            assert 0.8 * lr < rel < 1.2 * lr
    for m, n0 in zip(mats, w0):
        assert opt.state[m]["w0_norm"] == pytest.approx(n0)


def test_muonh_rejects_vectors():
    with pytest.raises(ValueError):
        MuonH([torch.nn.Parameter(torch.ones(4))])


@pytest.mark.parametrize("kw", [dict(r=1), dict(r=4), dict(r=4, injection="hyperconnect")])
def test_param_groups_partition(kw):
    model = tiny(**kw)
    groups = param_groups(model)
    ids = [id(p) for ps in groups.values() for p in ps]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    names = {id(p): n for n, p in model.named_parameters()}
    where = {names[id(p)]: k for k, ps in groups.items() for p in ps}
    for name, key in where.items():
        leaf = name.split(".")[-2] if name.endswith("weight") else name.split(".")[-1]
        if name == "wte.weight":
            assert key == "embedding"
        elif name == "lm_head.weight":
            assert key == "head"
        elif name.startswith("hyper."):
            assert key == "hyper"
        elif leaf.startswith("norm"):
            assert key == "norm"
        else:
            assert key == "matrix" and leaf in {"c_q", "c_k", "c_v", "c_proj", "c_fc", "inject"}, name
    assert ("inject.weight" in where) == (kw.get("injection", "linear") == "linear" and kw["r"] > 1)
    assert (len(groups["hyper"]) == 3) == (kw.get("injection") == "hyperconnect")
    n_blocks = 1 + 1 + 8 // kw["r"]
    assert len(groups["norm"]) == 3 + 2 * n_blocks
    assert len(groups["matrix"]) == 6 * n_blocks + ("inject.weight" in where)


def test_learning_rates_paper_numbers():
    cfg = model_config("paper", r=4, s=10)
    d_ref = accounting.hyperp_reference_tokens(cfg)
    assert d_ref == 1_016_083_200
    lrs = learning_rates(cfg, 2 ** 18, d_ref)
    assert lrs["matrix"] == pytest.approx(0.014)
    assert lrs == pytest.approx({"matrix": 0.014, "embedding": 0.3, "head": 0.004, "norm": 0.005,
                                 "hyper": 0.01})
    half = learning_rates(cfg, 2 ** 18, d_ref // 2)
    assert half["matrix"] / lrs["matrix"] == pytest.approx(2 ** 0.32)
    assert half["embedding"] == pytest.approx(lrs["embedding"])  # no duration factor for AdamW
    wide = learning_rates(model_config("paper", r=4, s=40), 2 ** 18, d_ref)  # d = 2560 = 4 x 640
    for k in ("embedding", "head", "norm", "hyper"):
        assert wide[k] == pytest.approx(lrs[k] / 2)
    assert wide["matrix"] == pytest.approx(lrs["matrix"])
    big = learning_rates(cfg, 2 ** 19, d_ref)
    for k in lrs:
        assert big[k] / lrs[k] == pytest.approx(2 ** 0.558)
    plain = model_config("paper", r=1, s=10)
    assert learning_rates(plain, 2 ** 18, 983_315_200)["matrix"] == pytest.approx(0.014)


def test_schedule_is_linear_from_one_to_a_tenth():
    n = 11
    m = [lr_multiplier(i, n) for i in range(n)]
    assert m[0] == 1.0 and m[-1] == pytest.approx(0.1)
    assert all(a - b == pytest.approx(0.09) for a, b in zip(m, m[1:]))
    assert lr_multiplier(0, 1) == 1.0


def test_build_optimizers_and_set_lr():
    cfg = model_config("tiny", r=4, s=4, injection="hyperconnect")
    model = LoopedGPT(cfg)
    opts = build_optimizers(model, cfg, 256, 10_000)
    assert [type(o).__name__ for o in opts] == ["MuonH", "AdamW"]
    names = [g["name"] for o in opts for g in o.param_groups]
    assert names == ["matrix", "embedding", "head", "norm", "hyper"]
    lrs = learning_rates(cfg, 256, 10_000)
    set_lr(opts, 0.5)
    for o in opts:
        for g in o.param_groups:
            assert g["initial_lr"] == pytest.approx(lrs[g["name"]])
            assert g["lr"] == pytest.approx(0.5 * lrs[g["name"]])
    adam = opts[1]
    assert adam.defaults["betas"] == (0.8, 0.95) and adam.defaults["eps"] == 1e-10
    assert adam.defaults["weight_decay"] == 0.0
    plain = build_optimizers(tiny(r=1), model_config("tiny", r=1, s=4), 256, 10_000)
    assert [g["name"] for g in plain[1].param_groups] == ["embedding", "head", "norm"]


def _train_steps(model, opts, n, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        idx = torch.randint(0, model.cfg.vocab_size, (2, 16), generator=g)
        loss = model(idx, idx)
        loss.backward()
        for o in opts:
            o.step()
        model.zero_grad(set_to_none=True)
    return loss.item()


def test_state_dict_round_trip_keeps_initial_norm():
    torch.manual_seed(0)
    cfg = model_config("tiny", r=4, s=4)
    model = LoopedGPT(cfg)
    opts = build_optimizers(model, cfg, 256, 10_000)
    w0 = {n: p.norm().item() for n, p in model.named_parameters() if p.ndim == 2}
    _train_steps(model, opts, 2, seed=1)
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opts = copy.deepcopy([o.state_dict() for o in opts])  # state_dict() aliases live tensors

    # Resume in a fresh model and fresh optimizers: ||W0|| must come from the checkpoint.
    torch.manual_seed(123)
    model2 = LoopedGPT(cfg)
    model2.load_state_dict(saved_model)
    opts2 = build_optimizers(model2, cfg, 256, 10_000)
    for o, s in zip(opts2, saved_opts):
        o.load_state_dict(s)
    names2 = {id(p): n for n, p in model2.named_parameters()}
    for p in opts2[0].param_groups[0]["params"]:
        assert opts2[0].state[p]["w0_norm"] == pytest.approx(w0[names2[id(p)]], rel=1e-6)
    _train_steps(model, opts, 2, seed=2)
    _train_steps(model2, opts2, 2, seed=2)
    for (n, p), p2 in zip(model.named_parameters(), model2.parameters()):
        torch.testing.assert_close(p, p2)
        if n in w0 and n != "lm_head.weight" and n != "wte.weight":
            assert p2.norm().item() == pytest.approx(w0[n], rel=1e-5)


def test_optimizers_reduce_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    cfg = model_config("tiny", r=4, s=4)
    model = LoopedGPT(cfg)
    opts = build_optimizers(model, cfg, 256, 10_000)
    idx = torch.randint(0, cfg.vocab_size, (4, 32))
    losses = []
    for step in range(15):
        set_lr(opts, lr_multiplier(step, 15))
        loss = model(idx, idx)
        loss.backward()
        for o in opts:
            o.step()
        model.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses


def test_muonh_steps_build_no_tensors_from_host_data():
    """After its first step MuonH makes no tensor from Python data (`lift_fresh` is the op torch
    records for one): on CUDA each would be a copy from pageable memory that waits for the GPU,
    2-4 host syncs a step.  A checkpoint's norms, loaded later, are used (and then kept) too."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class HostData(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func is torch.ops.aten.lift_fresh.default
            return func(*args, **(kwargs or {}))

    cfg = model_config("tiny", r=4, s=4)  # square, wide and tall matrices
    muon = build_optimizers(LoopedGPT(cfg), cfg, 256, 10_000)[0]
    params, g = muon.param_groups[0]["params"], torch.Generator().manual_seed(0)

    def step():
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        muon.step()
    step()
    with HostData() as watch:
        step()
        step()
    assert watch.count == 0
    saved = copy.deepcopy(muon.state_dict())
    saved["state"][0]["w0_norm"] *= 2
    muon.load_state_dict(saved)
    step()
    assert params[0].norm().item() == pytest.approx(saved["state"][0]["w0_norm"], rel=1e-5)


def test_set_fast_switches_built_optimizers_to_the_reference_step():
    from looped.optim import set_fast
    cfg = model_config("tiny", r=4, s=4)
    model = LoopedGPT(cfg)
    switched, ref = (build_optimizers(model, cfg, 256, 10_000, fast=fast) for fast in (True, False))
    set_fast(switched, False)
    assert switched[0].batched is ref[0].batched is False
    foreach = [[g["foreach"] for g in opts[1].param_groups] for opts in (switched, ref)]
    assert foreach[0] == foreach[1] == [False] * 3
