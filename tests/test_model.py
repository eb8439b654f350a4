"""Model behaviour the paper's argument relies on."""
from dataclasses import replace

import pytest
import torch

from looped.config import model_config
from looped.model import LoopedGPT

torch.set_num_threads(1)


def tokens(cfg, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g)


def test_linear_injection_ignores_state_at_init():
    """W = [I | 0]: every recurrence sees only e, so r=1 and r=4 give the same logits."""
    torch.manual_seed(0)
    cfg4 = model_config("tiny", r=4, s=4)
    m4 = LoopedGPT(cfg4)
    m1 = LoopedGPT(replace(cfg4, r=1))
    m1.load_state_dict(m4.state_dict())
    idx = tokens(cfg4)
    torch.testing.assert_close(m1(idx), m4(idx), rtol=0, atol=1e-5)
    with torch.no_grad():  # once W mixes in the state, the recurrences matter
        m4.inject.weight.add_(0.05 * torch.randn_like(m4.inject.weight))
    assert (m1(idx) - m4(idx)).abs().max() > 1e-3


def capture_inputs(module):
    seen = []
    module.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()))
    return seen


@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_hyperconnection_cyclic_init_is_cumulative_additive(lanes):
    """Step i reads e + s_0 + ... + s_{i-1}; the coda receives K (e + sum of all states)."""
    torch.manual_seed(1)
    cfg = model_config("tiny", r=4, s=4, injection="hyperconnect", lanes=lanes)
    m = LoopedGPT(cfg)
    idx = tokens(cfg)
    prelude_out = capture_inputs(m.loop[0])  # the first loop block of step i sees u_i
    coda_in = capture_inputs(m.coda[0])
    m(idx)
    loop_inputs = list(prelude_out)  # the manual replay below triggers the hook again
    e = loop_inputs[0]
    T = idx.shape[1]
    with torch.no_grad():
        total, states = e.clone(), []
        for i in range(cfg.r):
            u = e + sum(states) if states else e
            torch.testing.assert_close(loop_inputs[i], u, rtol=1e-5, atol=1e-5)
            states.append(m.norm_loop(m._blocks(m.loop, u, T)))
            total = total + states[-1]
    torch.testing.assert_close(coda_in[0], lanes * total, rtol=1e-4, atol=1e-4)


def test_truncated_bptt_only_last_k_recurrences_get_gradient():
    torch.manual_seed(2)
    cfg = model_config("tiny", r=8, s=4, bptt_k=3)
    m = LoopedGPT(cfg)
    states = []
    m.norm_loop.register_forward_hook(lambda mod, args, out: states.append(out))
    m(tokens(cfg), tokens(cfg, seed=1)).backward()
    assert [s.requires_grad for s in states] == [False] * 5 + [True] * 3
    for p in m.prelude.parameters():  # the prelude still learns, through e in the last k steps
        assert p.grad is not None and p.grad.abs().sum() > 0
    assert m.inject.weight.grad.abs().sum() > 0


def test_truncation_changes_gradient_not_forward():
    torch.manual_seed(3)
    full_cfg = model_config("tiny", r=4, s=4)
    full, trunc = LoopedGPT(full_cfg), LoopedGPT(replace(full_cfg, bptt_k=2))
    trunc.load_state_dict(full.state_dict())
    with torch.no_grad():
        full.inject.weight.add_(0.05 * torch.randn_like(full.inject.weight))
        trunc.inject.weight.copy_(full.inject.weight)
    idx, tgt = tokens(full_cfg), tokens(full_cfg, seed=1)
    lf, lt = full(idx, tgt), trunc(idx, tgt)
    torch.testing.assert_close(lf, lt)
    lf.backward(), lt.backward()
    assert not torch.allclose(full.loop[0].mlp.c_fc.weight.grad, trunc.loop[0].mlp.c_fc.weight.grad)
    torch.testing.assert_close(full.lm_head.weight.grad, trunc.lm_head.weight.grad)


MODES = [dict(r=1), dict(r=2), dict(r=8), dict(r=4, injection="additive"), dict(r=4, injection="passthrough"),
         dict(r=4, injection="hyperconnect"), dict(r=4, bptt_k=2), dict(r=1, injection="linear")]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(f"{k}{v}" for k, v in m.items()))
def test_forward_backward_every_mode(mode):
    torch.manual_seed(4)
    cfg = model_config("tiny", s=4, **mode)
    m = LoopedGPT(cfg)
    logits = m(tokens(cfg))
    assert logits.shape == (2, cfg.seq_len, cfg.vocab_size) and logits.dtype == torch.float32
    assert logits.abs().max() <= cfg.softcap
    loss = m(tokens(cfg), tokens(cfg, seed=1))
    assert torch.isfinite(loss) and abs(loss.item() - torch.log(torch.tensor(cfg.vocab_size)).item()) < 0.5
    loss.backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None]
    assert not missing, missing


def test_init_statistics():
    """The paper's init: N(0,1) embedding, N(0,1e-3) head, uniform matrices with std 1/sqrt(d)."""
    torch.manual_seed(5)
    cfg = model_config("cpu", r=4, s=8)
    m = LoopedGPT(cfg)
    d = cfg.d_model
    assert m.wte.weight.std().item() == pytest.approx(1.0, rel=0.05)
    assert m.lm_head.weight.std().item() == pytest.approx(1e-3, rel=0.05)
    assert m.loop[0].attn.c_q.weight.std().item() == pytest.approx(d ** -0.5, rel=0.05)
    assert m.loop[0].mlp.c_proj.weight.std().item() == pytest.approx((4 * d) ** -0.5, rel=0.05)
    assert m.loop[0].attn.c_proj.weight.abs().sum() > 0  # not zero-initialised
    torch.testing.assert_close(m.inject.weight[:, :d], torch.eye(d))
    assert m.inject.weight[:, d:].abs().sum() == 0


def test_sequence_longer_than_context_is_rejected():
    cfg = model_config("tiny", r=2, s=4)
    with pytest.raises(ValueError, match="longer than seq_len"):
        LoopedGPT(cfg)(torch.zeros(1, cfg.seq_len + 1, dtype=torch.long))


def test_relu_squared_is_bit_identical_to_square():
    """The MLP squares with h * h (CUDA autocast would run pow in fp32): on the CPU, fp32 and
    bf16 autocast, the loss and every gradient equal the square() form bit for bit."""
    import torch.nn.functional as F

    from looped.model import MLP

    def loss_and_grads(square: bool, autocast: bool):
        torch.manual_seed(0)
        cfg = model_config("tiny", r=2, s=2)
        m = LoopedGPT(cfg)
        if square:
            for mlp in (mod for mod in m.modules() if isinstance(mod, MLP)):
                mlp.forward = lambda x, mlp=mlp: mlp.c_proj(F.relu(mlp.c_fc(x)).square())
        x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len + 1), generator=torch.Generator().manual_seed(1))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = m(x[:, :-1], x[:, 1:])
        loss.backward()
        return [loss.detach(), *(p.grad for p in m.parameters())]

    for autocast in (False, True):
        new, old = loss_and_grads(False, autocast), loss_and_grads(True, autocast)
        assert all(torch.equal(a, b) for a, b in zip(new, old, strict=True)), autocast


def test_hyperconnection_lanes_stay_fp32_under_autocast():
    """The lane mix runs outside autocast: under bf16 autocast read and write give the fp32
    result exactly, not the bf16-rounded einsum's."""
    from looped.model import HyperConnections
    torch.manual_seed(0)
    hc = HyperConnections(r=4, lanes=2)
    with torch.no_grad():
        for p in hc.parameters():
            p.add_(0.1 * torch.randn_like(p))
        lanes, state = torch.randn(2, 2, 8, 16), torch.randn(2, 8, 16)
        ref = hc.read(1, lanes), hc.write(1, lanes, state)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = hc.read(1, lanes), hc.write(1, lanes, state)
    for a, b in zip(got, ref):
        assert a.dtype == torch.float32 and torch.equal(a, b)
