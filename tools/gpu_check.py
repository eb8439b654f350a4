#!/usr/bin/env python
"""The one-shot device check of `looped` on one GPU (no internet): run it through tools/device_check.sh.

Results go to OUT (device_check.json with every figure, summary.txt); data, checkpoints and the
inductor cache go to WORK, never to OUT.  A wall budget (BUDGET_S, counted from the wrapper's
start, so imports and compiles are in it) skips any phase whose estimate no longer fits.  Phases:

  gemm         bf16 GEMM at n = 4096 and 8192 after a ~1 s clock warm-up (CUDA events), vs the spec
  data         synthetic Markov-chain tokens, written as the preset's prepared dataset (in WORK)
  correctness  s = 10, r = 4, same weights and rows: fp32 eager (TF32 off) vs bf16 eager
  muon, sdpa   Polar Express and a MuonH step on the device vs fp32/fp64 references; the SDPA kernel
  throughput   the real trainer, r = 1 and 4 at s = 10: tokens/s, MFU (vs spec and vs the GEMM),
               peak memory vs looped.memory's prediction; step 0 and compile excluded
  oom          a real CUDA out-of-memory: s = 10, r = 1 started at the whole 128-row step must halve
               to what fits, give the memory back and finish (simulated on the CPU)
  grid         eager MFU at gpu-main's widths (s = 4, 14; r = 1, 8): `mfu_eager_by_width`
  resume       straight run vs stopped at half way and resumed from the checkpoint
  compiled     bf16 eager vs the compiled step (loss, gradients), then compiled throughput (r = 4),
               a compiled stop-and-resume on that shape (inductor's cache), compiled r = 1 at
               s = 4 and 14 while the budget lasts: `mfu_compiled_by_width`
  r_sweep      if time is left: r = 1, 2, 4, 8 at s = 6 for 100 steps, loss curves

Exit status 0 when no phase raised and every check holds (a skipped phase is no failure).
On the CPU, `PRESET=tiny COMPILE=0 OUT=/tmp/dc bash tools/device_check.sh` runs it all in
seconds (tests/test_gpu_check.py does).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

T0 = float(os.environ.get("DC_T0") or time.time())  # the wrapper's start: the budget includes imports
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its parts, also when loaded by path (the tests)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gpu_kernels import CUDA, DEV, KernelPhases  # noqa: E402
from gpu_summary import summary  # noqa: E402

from looped import accounting, memory, runtime  # noqa: E402
from looped import train as trainer  # noqa: E402
from looped.config import get_preset, model_config  # noqa: E402
from looped.data import dataset, packing  # noqa: E402
from looped.model import LoopedGPT  # noqa: E402
from looped.options import TrainConfig  # noqa: E402

# Sizes per preset: the paper's at T = 2048 on the GPU, a toy version for the CPU.
#   est: seconds a phase is expected to take on its device (the budget guard's estimate)
PLANS = {
    "paper": dict(s=10, gemm_n=(4096, 8192), timed=5, grid_s=(4, 14), grid_steps=4, small_s=6, small_rows=32,
                  resume_steps=30, compiled_resume_steps=12, compiled_s=(4, 14), sweep_steps=100, sweep_log=10,
                  loss_fall=2.0,
                  est=dict(gemm=8, data=5, correctness=15, muon=5, sdpa=5, throughput=20, oom=25, grid_run=12,
                           resume=30, compiled=150, compiled_r4=45, compiled_resume=50, compiled_width=70,
                           sweep_run=40)),
    "tiny": dict(s=2, gemm_n=(256, 512), timed=2, grid_s=(2, 4), grid_steps=2, small_s=2, small_rows=8,
                 resume_steps=12, compiled_resume_steps=6, compiled_s=(4,), sweep_steps=20, sweep_log=5,
                 loss_fall=0.05,
                 est=dict(gemm=1, data=1, correctness=1, muon=1, sdpa=1, throughput=1, oom=2, grid_run=1, resume=2,
                          compiled=60, compiled_r4=45, compiled_resume=45, compiled_width=45, sweep_run=1)),
}
MEMORY_BAND = (0.85, 1.15)  # eager peak / predicted peak, two-sided


class DeviceCheck(KernelPhases):
    """The check: plumbing (budget, phases, results), the trainer's phases here, the kernel phases
    in gpu_kernels.KernelPhases, summary.txt from gpu_summary."""

    def __init__(self, a):
        self.a, self.out, self.work = a, Path(a.out), Path(a.work)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.preset = get_preset(a.preset)
        self.plan = PLANS["paper" if a.preset == "paper" else "tiny"]
        self.s = a.size or self.plan["s"]
        self.T = self.preset.seq_len
        self.rows = self.preset.batch_tokens // self.T  # rows per optimizer step
        self.data_root = self.work / "data"
        spec = memory.gpu_spec(torch.cuda.get_device_name(), memory.device_total_bytes()) if CUDA else None
        self.spec = spec[1] if spec else None
        self.gemm_flops = None  # the measured bf16 peak (fp32 on the CPU), n = largest
        self.res = {"config": {"preset": a.preset, "s": self.s, "budget_s": a.budget_s, "compile": a.compile,
                               "out": str(self.out), "work": str(self.work), "spec_key": spec and spec[0],
                               "spec_flops": self.spec},
                    "env": {}, "phases": {}, "checks": {}, "mfu_eager_by_width": {}, "mfu_compiled_by_width": {},
                    "mfu_main_width": {"s": self.s}}

    # ------------------------------------------------------------------ plumbing
    def left(self) -> float:
        return self.a.budget_s - (time.time() - T0)

    def log(self, *msg):
        print(f"[{time.time() - T0:6.1f}s]", *msg, flush=True)

    def save(self):
        self.res["elapsed_s"] = round(time.time() - T0, 1)
        for name, text in (("device_check.json", json.dumps(self.res, indent=1, default=str) + "\n"),
                           ("summary.txt", self.summary())):
            tmp = self.out / f".{name}.tmp"
            tmp.write_text(text)
            os.replace(tmp, self.out / name)

    def phase(self, name, fn, *args, est=None):
        est = self.plan["est"][name] if est is None else est
        if self.left() < est:
            self.res["phases"][name] = {"skipped": f"needs ~{est:.0f}s, {self.left():.0f}s left"}
            self.log("SKIP", name, self.res["phases"][name]["skipped"])
            return self.save()
        self.log("BEGIN", name)
        self.current = name
        t = time.time()
        try:
            self.res["phases"][name] = {**(fn(*args) or {}), "seconds": round(time.time() - t, 1)}
        except Exception as e:  # noqa: BLE001 - a device check records what broke and goes on
            self.res["phases"][name] = {"seconds": round(time.time() - t, 1),
                                        "error": f"{type(e).__name__}: {str(e)[:800]}",
                                        "trace": traceback.format_exc()[-3000:]}
        gc.collect()
        if CUDA:
            torch.cuda.empty_cache()
        self.log("END", name, json.dumps(self.res["phases"][name], default=str)[:500])
        self.save()

    def check(self, name, ok: bool):
        self.res["checks"][name] = bool(ok)

    def train(self, **kw) -> dict:
        """One run of the real trainer on the synthetic data (eager unless compile=True)."""
        kw = {"preset": self.a.preset, "data_dir": str(self.data_root), "quiet": True, "compile": False,
              "peak_flops": self.spec or self.gemm_flops, "eval_tokens": 8 * self.T, **kw}
        return trainer.train(TrainConfig(**kw))

    # ------------------------------------------------------------------ phases
    def env(self):
        e = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
             "numpy": np.__version__, "device": runtime.device_name(DEV), "threads": torch.get_num_threads()}
        if CUDA:
            p = torch.cuda.get_device_properties(DEV)
            e.update(capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count, total_memory_bytes=p.total_memory,
                     free_memory_bytes=memory.device_free_bytes(DEV), flash_sdp=torch.backends.cuda.flash_sdp_enabled(),
                     cudnn_sdp=getattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: None)(),
                     mem_efficient_sdp=torch.backends.cuda.mem_efficient_sdp_enabled())
        self.res["env"] = e
        return e

    def data(self):
        """A first-order Markov chain over `active` ids (4 successors, p = .55/.25/.15/.05: entropy
        floor 1.11 nats), BOS at position 0, written under the preset's dataset name in WORK."""
        p, T, plan = self.preset, self.T, self.plan
        d = self.data_root / dataset.dataset_name(p)
        n_train = max((1 + plan["timed"]) * self.rows, plan["grid_steps"] * self.rows,
                      plan["small_rows"] * max(plan["resume_steps"], plan["sweep_steps"]))
        n_val = 16
        meta = dataset.check_dataset(d)
        if meta and meta.get("corpus") == "synthetic-markov" and meta["splits"]["train"]["rows"] >= n_train:
            return {"reused": str(d)}
        rng = np.random.default_rng(0)
        active = min(2048, p.vocab_size - 1)
        succ = rng.integers(1, active + 1, size=(active + 1, 4))
        cum = np.cumsum([0.55, 0.25, 0.15, 0.05])

        def make(n):
            x = np.empty((n, T + 1), np.int64)
            x[:, 0] = 0
            x[:, 1] = cur = rng.integers(1, active + 1, n)
            for t in range(2, T + 1):
                x[:, t] = cur = succ[cur, np.minimum(np.searchsorted(cum, rng.random(n)), 3)]
            return x
        d.mkdir(parents=True, exist_ok=True)
        splits = {}
        for split, n in (("train", n_train), ("val", n_val)):
            packing.write_shard(d / f"{split}-000.bin", make(n), T + 1, p.vocab_size)
            splits[split] = {"shards": [f"{split}-000.bin"], "rows": n, "tokens": n * (T + 1), "docs": n, "waste": 0.0}
        (d / "meta.json").write_text(json.dumps({
            "recipe": dataset.RECIPE, "name": d.name, "preset": p.name, "seq_len": T, "row_len": T + 1,
            "corpus": "synthetic-markov", "tokenizer": "none", "bos_id": 0, "vocab_size": p.vocab_size,
            "splits": splits}, indent=1))
        if not dataset.check_dataset(d):
            raise RuntimeError("dataset.check_dataset rejects the synthetic dataset")
        return {"dir": str(d), "train_rows": n_train, "val_rows": n_val, "active_ids": active,
                "entropy_floor_nats": 1.11, "unigram_nats": round(math.log(active), 3)}

    def throughput(self, r, compiled):
        """The real trainer, 1 + timed steps of the preset's batch with the automatic micro-batch."""
        cfg = model_config(self.a.preset, r=r, s=self.s)
        t = time.time()
        rec = self.train(r=r, s=self.s, steps=1 + self.plan["timed"], compile=compiled, log_every=1)
        out = self.speed(rec, cfg)
        out.update(compile=rec["compile"], compile_error=rec["compile_error"], wall_s=round(time.time() - t, 1),
                   first_step_s=rec["first_step_seconds"], loss_curve=rec["train_loss_curve"])
        path = "compiled" if compiled else "eager"
        self.res["mfu_main_width"].setdefault(path, {})[f"r{r}"] = out["mfu"]
        if compiled:
            self.res["mfu_compiled_by_width"].setdefault(f"s{self.s:g}", {})[f"r{r}"] = out["mfu"]
        ratio = out["peak_over_predicted"]
        if ratio is not None:  # CUDA only: on the CPU the peak is the process's resident size
            # the prediction is the eager step's (looped.memory): two-sided there; the compiled
            # step saves fewer activations, so there the prediction must be an upper bound
            lo = MEMORY_BAND[0] if not compiled else 0.2
            self.check(f"memory_vs_prediction_r{r}_{path}", lo <= ratio <= MEMORY_BAND[1])
        if compiled:
            eager = self.res["phases"].get(f"throughput_r{r}_eager", {}).get("loss_curve")
            if eager:
                d = max(abs(x[1] - y[1]) for x, y in zip(eager, rec["train_loss_curve"]))
                out["max_curve_diff_vs_eager"] = d
                self.check(f"compiled_curve_matches_eager_r{r}", d < 5e-2)
            self.check(f"compiled_path_ran_r{r}", rec["compile"])
        self.check(f"throughput_r{r}_{path}_ok", rec["status"] == "ok")
        return out

    def speed(self, rec, cfg):
        tok_s, f = rec["tokens_per_s"], accounting.flops_per_token(cfg)
        pred = memory.predict_peak(cfg, rec["micro_batch"])["peak_bytes"]
        peak = rec["peak_memory_bytes"] if rec["peak_memory_scope"] == "run" else None
        mfu_spec = tok_s * f / self.spec if tok_s and self.spec else None
        mfu_gemm = tok_s * f / self.gemm_flops if tok_s and self.gemm_flops else None
        mfu = mfu_spec if self.spec else mfu_gemm
        return {"r": cfg.r, "s": rec["s"], "d_model": cfg.d_model, "status": rec["status"],
                "micro_batch": rec["micro_batch"], "micro_batch_history": rec["micro_batch_history"],
                "tokens_per_s": tok_s, "flops_per_token": f, "mfu_vs_spec": mfu_spec, "mfu_vs_gemm": mfu_gemm,
                "mfu": float(f"{mfu:.4g}") if mfu else None, "peak_memory_bytes": peak, "predicted_peak_bytes": pred,
                "peak_over_predicted": peak / pred if peak else None}

    def grid(self):
        """Eager MFU of the real trainer (preset batch, automatic micro-batch) at gpu-main's widths."""
        rows = []
        for s in self.plan["grid_s"]:
            for r in (1, 8):
                if self.left() < self.plan["est"]["grid_run"] * (1 + s / 10):
                    return {"rows": rows, "stopped": "budget"}
                cfg = model_config(self.a.preset, r=r, s=s)
                rows.append(self.speed(self.train(r=r, s=s, steps=self.plan["grid_steps"]), cfg))
                self.res["mfu_eager_by_width"].setdefault(f"s{s:g}", {})[f"r{r}"] = rows[-1]["mfu"]
        self.res["mfu_basis"] = "spec" if self.spec else "measured GEMM"
        self.check("grid_runs_ok", all(x["status"] == "ok" for x in rows))
        return {"rows": rows}

    def resume(self, compiled=False):
        """r = 4: N steps straight (eager) vs N/2, a checkpoint, a stop, and a resume to N.  The
        compiled stop and resume run the `compiled` phase's shape (s = 10, its micro-batch, one
        micro-batch a step), so inductor's cache spares them a cold compile."""
        p = self.plan
        if compiled:
            s, n = self.s, p["compiled_resume_steps"]
            rows = trainer.first_micro_batch(model_config(self.a.preset, r=4, s=s), self.rows, DEV)
        else:
            s, n, rows = p["small_s"], p["resume_steps"], p["small_rows"]
        half, ck = n // 2, self.work / "resume.pt"
        ck.unlink(missing_ok=True)
        kw = dict(r=4, s=s, steps=n, batch_tokens=rows * self.T, log_every=1, checkpoint_seconds=0)
        a = self.train(**kw)
        first = self.train(**kw, compile=compiled, checkpoint=str(ck), checkpoint_every=half, stop_after=half)
        saved = ck.stat().st_size if ck.exists() else None
        b = self.train(**kw, compile=compiled, checkpoint=str(ck), checkpoint_every=half)
        ck.unlink(missing_ok=True)
        ca, cb = dict(map(tuple, a["train_loss_curve"])), dict(map(tuple, b["train_loss_curve"]))
        diffs = [abs(ca[k] - cb[k]) for k in cb if k in ca and k >= half and None not in (ca[k], cb[k])]
        diff = max(diffs) if diffs else None
        # GPU kernels (flash's dq, atomics) are not bitwise deterministic; compiled vs eager is bf16 rounding
        tol = 5e-2 if compiled else 2e-2 if CUDA else 1e-4
        ok = first.get("status") == "stopped" and bool(saved) and b["status"] == "ok" and diff is not None \
            and diff < tol and None not in (a["loss"], b["loss"]) and abs(a["loss"] - b["loss"]) < tol \
            and b["compile"] == compiled
        self.check("resume_matches_straight_run" + ("_compiled" if compiled else ""), ok)
        return {"s": s, "steps": n, "rows": rows, "compiled": b["compile"], "stopped_at": first.get("step"),
                "checkpoint_bytes": saved, "val_straight": a["loss"], "val_resumed": b["loss"],
                "max_curve_diff_after_resume": diff, "curve_straight": a["train_loss_curve"][::max(1, n // 10)]}

    def oom(self):
        """A forced out-of-memory: the run starts at the whole step (the paper's 128 rows at s = 10,
        r = 1: about 4x what fits) and the trainer must halve, redo the step and finish, with the
        memory given back.  On the CPU a forward above a quarter of the rows raises instead."""
        first_mb, forward, rows = trainer.first_micro_batch, LoopedGPT.forward, self.rows
        trainer.first_micro_batch = lambda cfg, n, device: n

        def simulated(model, idx, targets=None):
            if targets is not None and model.training and idx.shape[0] > max(1, rows // 4):
                raise torch.OutOfMemoryError("CUDA out of memory (simulated on the CPU)")
            return forward(model, idx, targets)
        if not CUDA:
            LoopedGPT.forward = simulated
        before = torch.cuda.memory_allocated() if CUDA else None
        t = time.time()
        try:
            rec = self.train(r=1, s=self.s, steps=2, log_every=1)
        finally:
            trainer.first_micro_batch, LoopedGPT.forward = first_mb, forward
        wall = time.time() - t
        gc.collect()
        after = torch.cuda.memory_allocated() if CUDA else None
        hist = rec["micro_batch_history"]
        cfg = model_config(self.a.preset, r=1, s=self.s)
        out = {"status": rec["status"], "micro_batch_history": hist, "halvings": len(hist) - 1,
               "wall_s": round(wall, 1), "first_step_s": rec["first_step_seconds"],
               "allocated_before": before, "allocated_after": after,
               "predicted_micro_batch": trainer.first_micro_batch(cfg, rows, DEV),
               "peak_memory_bytes": rec["peak_memory_bytes"] if rec["peak_memory_scope"] == "run" else None}
        self.check("oom_halves_and_finishes", rec["status"] == "ok" and len(hist) > 1 and hist[-1][1] < rows)
        if CUDA:  # what the run held is back (a sweep's next run chooses from the free memory)
            total = torch.cuda.get_device_properties(DEV).total_memory
            self.check("oom_memory_returned", after - before < 0.02 * total)
        return out

    def compiled_by_width(self):
        """Compiled MFU of the real trainer at r = 1 and other widths (each a cold compile), while
        the budget lasts: the dry run's cost assumes the compiled step."""
        rows, p = [], self.plan
        for s in p["compiled_s"]:
            if self.left() < p["est"]["compiled_width"]:
                return {"rows": rows, "stopped": "budget"}
            rec = self.train(r=1, s=s, steps=1 + p["timed"], compile=True, log_every=1)
            rows.append({**self.speed(rec, model_config(self.a.preset, r=1, s=s)), "compile": rec["compile"],
                         "first_step_s": rec["first_step_seconds"]})
            self.res["mfu_compiled_by_width"].setdefault(f"s{s:g}", {})["r1"] = rows[-1]["mfu"]
        self.check("compiled_by_width_ran", all(x["status"] == "ok" and x["compile"] for x in rows))
        return {"rows": rows}

    def r_sweep(self):
        """What a reader sees: r = 1, 2, 4, 8 at a small width on the chain, eager, loss curves."""
        p, out = self.plan, {}
        for r in (1, 2, 4, 8):
            if self.left() < p["est"]["sweep_run"]:
                out["stopped"] = "budget"
                break
            rec = self.train(r=r, s=p["small_s"], steps=p["sweep_steps"], batch_tokens=p["small_rows"] * self.T,
                             log_every=p["sweep_log"])
            curve = [x[1] for x in rec["train_loss_curve"] if x[1] is not None]
            out[f"r{r}"] = {"status": rec["status"], "val": rec["loss"], "curve": rec["train_loss_curve"],
                            "tokens_per_s": rec["tokens_per_s"], "loss_fall": curve[0] - curve[-1]}
            self.check(f"r_sweep_r{r}_loss_falls", rec["status"] == "ok" and curve[0] - curve[-1] > p["loss_fall"])
        return out

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        est = self.plan["est"]
        self.phase("env", self.env, est=-math.inf)  # always
        self.phase("gemm", self.gemm)
        self.phase("data", self.data)
        if {"error", "skipped"} & set(self.res["phases"]["data"]):
            return self.finish()  # nothing below runs without the dataset
        self.phase("correctness", self.correctness)
        self.phase("muon", self.muon)
        self.phase("sdpa", self.sdpa)
        for r in (4, 1):
            self.phase(f"throughput_r{r}_eager", self.throughput, r, False, est=est["throughput"])
        self.phase("oom", self.oom)
        self.phase("grid", self.grid, est=est["grid_run"] * 2)
        self.phase("resume", self.resume)
        if self.a.compile:
            self.phase("compiled", self.compiled_step)
            self.phase("throughput_r4_compiled", self.throughput, 4, True, est=est["compiled_r4"])
            self.phase("resume_compiled", self.resume, True, est=est["compiled_resume"])
            self.phase("compiled_by_width", self.compiled_by_width, est=est["compiled_width"])
        self.phase("r_sweep", self.r_sweep, est=est["sweep_run"])
        return self.finish()

    def finish(self) -> int:
        self.res["errors"] = [k for k, v in self.res["phases"].items() if "error" in v]
        self.res["skipped"] = [k for k, v in self.res["phases"].items() if "skipped" in v]
        self.res["ok"] = not self.res["errors"] and all(self.res["checks"].values()) and "interrupted" not in self.res
        self.save()
        self.log("DONE", "ok" if self.res["ok"] else "FAILED", json.dumps({"errors": self.res["errors"]}))
        return 0 if self.res["ok"] else 1

    def summary(self) -> str:
        """summary.txt (gpu_summary.summary): a line per phase, surviving any phase's record."""
        return summary(self.res, self.a.budget_s, self.spec)

def parse(argv=None):
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=env("OUT") or "/tmp/looped_device_check/out", help="results (a few small files)")
    ap.add_argument("--work", default=env("WORK") or "/tmp/looped_device_check/work",
                    help="data, checkpoints (and the inductor cache, set by the wrapper)")
    ap.add_argument("--preset", default=env("PRESET") or ("paper" if CUDA else "tiny"))
    ap.add_argument("--size", "-s", type=float, default=float(env("S")) if env("S") else None,
                    help="width of the s = 10 phases (default: 10 for paper, 2 otherwise)")
    ap.add_argument("--budget-s", type=float, default=float(env("BUDGET_S") or 420),
                    help="wall budget in seconds from the wrapper's start; phases that would overrun are skipped")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction,
                    default=(env("COMPILE") or ("1" if CUDA else "0")) == "1", help="the compiled phases")
    a = ap.parse_args(argv)
    out, work = Path(a.out).resolve(), Path(a.work).resolve()
    if work == out or out in work.parents:
        ap.error(f"WORK ({work}) must lie outside OUT ({out})")
    return a


def main(argv=None) -> int:
    dc = DeviceCheck(parse(argv))
    try:
        return dc.run()
    except KeyboardInterrupt:  # the wrapper's hard time limit (SIGINT): keep what was measured
        dc.res["interrupted"] = f"in phase {getattr(dc, 'current', None)} at {time.time() - T0:.0f}s"
        dc.finish()
        return 124


if __name__ == "__main__":
    sys.exit(main())
