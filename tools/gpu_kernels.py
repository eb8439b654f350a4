"""The device check's kernel phases (tools/gpu_check.py): the model's numerics on the device
without the trainer, on the check's own rows and weights.

  gemm         bf16 GEMM at two sizes after a ~1 s clock warm-up (CUDA events), vs the spec
  correctness  same weights, same rows: fp32 eager (TF32 off) vs bf16 eager
  muon, sdpa   Polar Express and a MuonH step on the device vs fp32/fp64 references; the SDPA kernel
  compiled     bf16 eager vs the compiled step (runtime.fast_model), loss and gradients

`KernelPhases` is a part of gpu_check.DeviceCheck (its `a`, `plan`, `spec`, `res`, `data_root`,
`preset`, `rows` and `check`); gpu_check puts the repository on sys.path before importing it.
"""
from __future__ import annotations

import copy
import time

import numpy as np
import torch

from looped import runtime
from looped.config import model_config
from looped.data import dataset
from looped.model import LoopedGPT
from looped.optim import MuonH, polar_express

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")


def sync():
    if CUDA:
        torch.cuda.synchronize()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm() + 1e-300))


class KernelPhases:
    """The phases that exercise kernels directly (see the module's docstring)."""

    def gemm(self):
        """Median of 5 timings x 20 products, after ~1 s of products to raise the idle SM clock."""
        out, dt = {}, (torch.bfloat16 if CUDA else torch.float32)
        for n in self.plan["gemm_n"]:
            a, b = (torch.randn(n, n, device=DEV, dtype=dt) for _ in range(2))
            t = time.time()
            while time.time() - t < (1.0 if CUDA else 0.1):
                a @ b
                sync()
            times = []
            for _ in range(5):
                if CUDA:
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    for _ in range(20):
                        a @ b
                    e1.record()
                    e1.synchronize()
                    times.append(e0.elapsed_time(e1) / 1e3 / 20)
                else:
                    t = time.perf_counter()
                    for _ in range(2):
                        a @ b
                    times.append((time.perf_counter() - t) / 2)
            flops = 2 * n ** 3 / float(np.median(times))
            out[f"n{n}"] = {"dtype": str(dt), "tflops_median": flops / 1e12,
                            "tflops_best": 2 * n ** 3 / min(times) / 1e12,
                            "fraction_of_spec": flops / self.spec if self.spec else None}
            self.gemm_flops = flops
            del a, b
        self.res["gemm_tflops"] = {k: float(f"{v['tflops_median']:.4g}") for k, v in out.items()}
        return out

    def batch(self, n):
        return dataset.Dataset(self.data_root / dataset.dataset_name(self.preset)).rows("train", 0, n).to(DEV)

    @staticmethod
    def loss_and_grads(model, call, b, bf16):
        model.zero_grad(set_to_none=True)
        with torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=bf16):
            loss = call(b[:, :-1], b[:, 1:])
        loss.backward()
        grads = [p.grad.float().flatten() for p in model.parameters() if p.grad is not None]
        return float(loss.detach()), torch.cat(grads)

    def correctness(self):
        """Same weights, same rows: fp32 eager with TF32 off vs bf16 autocast eager."""
        cfg = model_config(self.a.preset, r=4, s=self.s)
        b = self.batch(min(8, runtime.first_micro_batch(cfg, self.rows, DEV)))
        torch.manual_seed(0)
        model = LoopedGPT(cfg).to(DEV)
        old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            l32, g32 = self.loss_and_grads(model, model, b, False)
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
        l16, g16 = self.loss_and_grads(model, model, b, True)
        out = {"r": 4, "s": self.s, "rows": b.shape[0], "loss_fp32": l32, "loss_bf16": l16,
               "loss_rel_diff": abs(l16 - l32) / l32, "grad_cosine": cosine(g16, g32),
               "grad_rel_err": float((g16 - g32).norm() / g32.norm()), "finite": bool(torch.isfinite(g16).all())}
        self.check("bf16_eager_matches_fp32", out["loss_rel_diff"] < 1e-2 and out["grad_cosine"] > 0.99
                   and out["finite"])
        return out

    def muon(self):
        """Polar Express on the device (bf16 on CUDA) and in fp32 (on the CPU) vs the exact polar
        factor U V^T (fp64 SVD); one MuonH step on the device vs the fp32 CPU reference step."""
        d = model_config(self.a.preset, r=1, s=self.s).d_model
        torch.manual_seed(0)
        g = torch.randn(4, d, 4 * d)
        u, _, vh = torch.linalg.svd(g.double(), full_matrices=False)
        exact = u @ vh
        dev_pe, fp32_pe = polar_express(g.to(DEV)).double().cpu(), polar_express(g.float()).double()
        out = {"shape": list(g.shape), "device_dtype": str(polar_express(g[:1].to(DEV)).dtype),
               "cosine_device_vs_exact": cosine(dev_pe, exact), "cosine_fp32_vs_exact": cosine(fp32_pe, exact),
               "cosine_device_vs_fp32": cosine(dev_pe, fp32_pe),
               "singular_values_device": [float(x) for x in torch.linalg.svdvals(dev_pe).aminmax()]}
        ws = [torch.randn(d, d), torch.randn(4 * d, d), torch.randn(d, 4 * d)]
        gs = [torch.randn_like(w) for w in ws]

        def muon_step(device, batched):
            ps = [torch.nn.Parameter(w.clone().to(device)) for w in ws]
            for p, gr in zip(ps, gs):
                p.grad = gr.clone().to(device)
            MuonH(ps, lr=0.02, batched=batched).step()
            return [p.detach().double().cpu() - w.double() for p, w in zip(ps, ws)]
        out["muon_step_cosine_vs_fp32"] = [cosine(x, y) for x, y in zip(muon_step(DEV, True), muon_step("cpu", False))]
        self.check("polar_express_close_to_exact_polar", out["cosine_device_vs_exact"] > 0.98
                   and out["cosine_device_vs_fp32"] > 0.99)
        self.check("muon_step_matches_fp32", min(out["muon_step_cosine_vs_fp32"]) > 0.99)
        return out

    def sdpa(self):
        """Which scaled-dot-product-attention op (on CUDA: which kernels) a forward+backward ran."""
        from torch.profiler import ProfilerActivity, profile
        cfg = model_config(self.a.preset, r=1, s=self.s)
        model, b = LoopedGPT(cfg).to(DEV), self.batch(1)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
        with profile(activities=acts) as prof:
            with torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=CUDA):
                model(b[:, :-1], b[:, 1:]).backward()
            sync()
        names = {e.key for e in prof.key_averages()}
        ops = sorted(n for n in names if n.startswith("aten::_scaled_dot_product") or n.startswith("aten::_flash")
                     or n.startswith("aten::_efficient") or n.startswith("aten::_cudnn_attention"))
        out = {"sdpa_ops": ops}
        out["attention_kernels"] = sorted(n[:100] for n in names if not n.startswith("aten::") and any(
            k in n.lower() for k in ("flash", "fmha", "attention", "sdpa", "cudnn")))[:8]
        if CUDA:
            self.check("sdpa_fused_kernel_on_gpu", bool(ops) and not any("math" in n for n in ops))
        return out

    def compiled_step(self):
        """bf16 eager vs the fast path (runtime.fast_model: fused loss tail + torch.compile) on the
        trainer's micro-batch at s = 10, r = 4, same weights and rows; the throughput phase that
        follows reuses this compile through inductor's cache."""
        cfg = model_config(self.a.preset, r=4, s=self.s)
        b = self.batch(runtime.first_micro_batch(cfg, self.rows, DEV))
        torch.manual_seed(0)
        model = LoopedGPT(cfg).to(DEV)
        le, ge = self.loss_and_grads(model, model, b, CUDA)
        twin = copy.deepcopy(model)
        fast = runtime.fast_model(twin)
        t = time.time()
        lc, gc_ = self.loss_and_grads(twin, fast, b, CUDA)
        sync()
        first = time.time() - t
        t = time.time()
        lc2, _ = self.loss_and_grads(twin, fast, b, CUDA)
        sync()
        out = {"rows": b.shape[0], "bf16": CUDA, "loss_eager": le, "loss_compiled": lc, "loss_compiled_again": lc2,
               "loss_rel_diff": abs(lc - le) / le, "grad_cosine": cosine(gc_, ge),
               "compile_first_call_s": round(first, 1), "second_call_s": round(time.time() - t, 3)}
        self.check("compiled_step_matches_eager", out["loss_rel_diff"] < 5e-3 and out["grad_cosine"] > 0.99)
        return out
