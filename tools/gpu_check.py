#!/usr/bin/env python
"""First-contact device check of `looped` on one GPU with no internet; writes OUT/gpu_check.json.

Phases (each recorded, errors captured, skipped when the time budget would overrun):
  env          torch/CUDA versions, device, memory, SDPA backends
  gemm         bf16 GEMM peak (n = 8192, CUDA events) against the spec
  data         synthetic Markov-chain tokens written as the preset's prepared dataset
  dtypes       bf16-autocast vs fp32 (TF32 off) loss over the first steps, same init and data
  throughput   tokens/s, MFU (spec peak) and peak memory (vs looped.memory's prediction) of the
               real trainer at s for each r, eager and compiled; step 0 (and compile) excluded
  train        a few hundred steps of the real trainer: falling loss, a mid-run checkpoint
               (stop, then resume from it to the end)

Uses only the public API of looped: train.train/TrainConfig, model, optim, accounting, memory,
data (to write the dataset).  The same script runs on the CPU with a small preset, e.g.
    python tools/gpu_check.py --preset tiny --steps 20 --out /tmp/gc
(CI does that: tests/test_gpu_check.py).  On a GPU box: `OUT=dir bash tools/gpu_check.sh`.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from looped import accounting, data, memory, optim, packing  # noqa: E402
from looped import train as trainer  # noqa: E402
from looped.config import get_preset, model_config  # noqa: E402
from looped.model import LoopedGPT  # noqa: E402


class Check:
    def __init__(self, args):
        self.a = args
        self.t0 = time.time()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.cuda = self.dev.type == "cuda"
        self.preset = get_preset(args.preset)
        self.T = self.preset.seq_len
        self.res = {"config": vars(args).copy(), "phases": {}, "checks": {}}
        self.spec = args.spec_flops or self._spec()
        self.res["config"]["spec_flops"] = self.spec
        self.data_root = self.out / "data"

    # ------------------------------------------------------------------ plumbing
    def _spec(self):
        if not self.cuda:
            return None
        spec = memory.gpu_spec(
            torch.cuda.get_device_name(self.dev), torch.cuda.get_device_properties(self.dev).total_memory
        )
        return spec[1] if spec else None

    def left(self):
        return self.a.budget_s - (time.time() - self.t0)

    def save(self):
        self.res["elapsed_s"] = round(time.time() - self.t0, 1)
        tmp = self.out / ".gpu_check.json.tmp"
        tmp.write_text(json.dumps(self.res, indent=1, default=str) + "\n")
        os.replace(tmp, self.out / "gpu_check.json")

    def log(self, *msg):
        print(f"[{time.time() - self.t0:6.1f}s]", *msg, flush=True)

    def phase(self, name, est_s, fn, *args):
        if self.left() < est_s:
            self.res["phases"][name] = {"skipped": f"needs ~{est_s:.0f}s, {self.left():.0f}s left"}
            self.log("SKIP", name)
            self.save()
            return None
        self.log("BEGIN", name)
        t = time.time()
        try:
            out = fn(*args) or {}
            self.res["phases"][name] = {"seconds": round(time.time() - t, 1), **out}
        except Exception as e:  # noqa: BLE001 - a device check records what broke and goes on
            self.res["phases"][name] = {"seconds": round(time.time() - t, 1),
                                        "error": f"{type(e).__name__}: {str(e)[:800]}",
                                        "trace": traceback.format_exc()[-3000:]}
        finally:
            gc.collect()
            if self.cuda:
                torch.cuda.empty_cache()
        self.log("END", name, json.dumps(self.res["phases"][name], default=str)[:600])
        self.save()
        return self.res["phases"][name]

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    def reset_peak(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.dev)

    def peak(self):
        return int(torch.cuda.max_memory_allocated(self.dev)) if self.cuda else None

    def rows(self):
        return self.preset.batch_tokens // self.T

    def micro(self, cfg, rows):
        if self.a.micro_batch:
            return self.a.micro_batch
        free = memory.device_free_bytes(self.dev)
        return rows if free is None else memory.auto_micro_batch(cfg, rows, free)

    # ------------------------------------------------------------------ phases
    def env(self):
        out = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
               "device": trainer.device_name(self.dev), "threads": torch.get_num_threads()}
        if self.cuda:
            p = torch.cuda.get_device_properties(self.dev)
            out.update(capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                       total_memory_bytes=p.total_memory, free_memory_bytes=memory.device_free_bytes(self.dev),
                       flash_sdp=torch.backends.cuda.flash_sdp_enabled(),
                       mem_efficient_sdp=torch.backends.cuda.mem_efficient_sdp_enabled(),
                       cudnn_sdp=getattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: None)())
        return out

    def gemm(self):
        n = self.a.gemm_n if self.cuda else min(self.a.gemm_n, 512)
        dt = torch.bfloat16 if self.cuda else torch.float32
        a, b = (torch.randn(n, n, device=self.dev, dtype=dt) for _ in range(2))
        for _ in range(3):
            a @ b
        self.sync()
        reps = 20 if self.cuda else 3
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                a @ b
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t = time.perf_counter()
            for _ in range(reps):
                a @ b
            seconds = time.perf_counter() - t
        flops = 2 * n ** 3 * reps / seconds
        self.res["gemm_flops"] = flops
        return {"n": n, "dtype": str(dt), "flops_per_s": flops, "spec": self.spec,
                "fraction_of_spec": flops / self.spec if self.spec else None}

    def synthetic_data(self):
        """A first-order Markov chain over ACTIVE ids (4 successors, p = .55/.25/.15/.05: entropy
        floor 1.11 nats), BOS at position 0, written under the preset's dataset name."""
        p, T = self.preset, self.T
        name = data.dataset_name(p)
        d = self.data_root / name
        rows = self.rows()
        need = max(self.a.steps, 8) * max(rows, self.a.train_rows) + 16 * rows
        n_train, n_val = need, max(32, 4 * rows)
        meta = data.check_dataset(d)
        if meta and meta.get("corpus") == "synthetic-markov" and meta["splits"]["train"]["rows"] >= n_train:
            return {"reused": str(d)}
        rng = np.random.default_rng(0)
        active = min(self.a.active, p.vocab_size - 1)
        succ = rng.integers(1, active + 1, size=(active + 1, 4))
        cp = np.cumsum([0.55, 0.25, 0.15, 0.05])

        def make(n):
            x = np.empty((n, T + 1), np.int64)
            x[:, 0] = 0
            cur = rng.integers(1, active + 1, n)
            x[:, 1] = cur
            for t in range(2, T + 1):
                cur = succ[cur, np.minimum(np.searchsorted(cp, rng.random(n)), 3)]
                x[:, t] = cur
            return x
        d.mkdir(parents=True, exist_ok=True)
        splits = {}
        for split, n in (("train", n_train), ("val", n_val)):
            packing.write_shard(d / f"{split}-000.bin", make(n), T + 1, p.vocab_size)
            splits[split] = {"shards": [f"{split}-000.bin"], "rows": n, "tokens": n * (T + 1), "docs": n,
                             "waste": 0.0}
        (d / "meta.json").write_text(json.dumps({
            "recipe": data.RECIPE, "name": name, "preset": p.name, "seq_len": T, "row_len": T + 1,
            "corpus": "synthetic-markov", "tokenizer": "none", "bos_id": 0, "vocab_size": p.vocab_size,
            "splits": splits}, indent=1))
        if not data.check_dataset(d):
            raise RuntimeError("data.check_dataset rejects the synthetic dataset")
        self.res["unigram_nats"] = math.log(active)
        return {"dir": str(d), "train_rows": n_train, "val_rows": n_val, "active_ids": active,
                "entropy_floor_nats": 1.11, "unigram_nats": round(math.log(active), 3)}

    def dtypes(self):
        """Same init, same rows: bf16 autocast vs fp32 (TF32 off) over the first steps."""
        cfg = model_config(self.preset, r=self.a.r_train, s=self.a.size)
        ds = data.Dataset(data.prepare(self.preset, data_dir=self.data_root))
        rows = min(self.rows(), self.a.dtype_rows)
        micro = min(rows, self.micro(cfg, rows) // 2 or 1)  # fp32 activations are larger
        curves = {}
        old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        for mode in ("bf16", "fp32"):
            torch.manual_seed(0)
            model = LoopedGPT(cfg).to(self.dev)
            opts = optim.build_optimizers(model, cfg, rows * self.T, rows * self.T * 1000)
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
            losses = []
            for step in range(self.a.dtype_steps):
                total = 0.0
                for a in range(rows // micro):
                    b = ds.rows("train", step * rows + a * micro, micro).to(self.dev)
                    with torch.autocast(self.dev.type, dtype=torch.bfloat16, enabled=mode == "bf16"):
                        loss = model(b[:, :-1], b[:, 1:]) / (rows // micro)
                    loss.backward()
                    total += loss.detach()
                for o in opts:
                    o.step()
                    o.zero_grad(set_to_none=True)
                losses.append(float(total))
            curves[mode] = losses
            del model, opts
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
        diff = [abs(x - y) for x, y in zip(curves["bf16"], curves["fp32"])]
        rel = max(d / abs(f) for d, f in zip(diff, curves["fp32"]))
        ok = rel <= 0.02
        self.res["checks"]["bf16_matches_fp32"] = ok
        return {"r": cfg.r, "s": cfg.s, "rows": rows, "micro_batch": micro, "curves": curves,
                "max_abs_diff": max(diff), "max_rel_diff": rel, "ok": ok}

    def throughput(self, r, compiled):
        cfg = model_config(self.preset, r=r, s=self.a.size)
        rows = self.rows()
        micro = self.micro(cfg, rows)
        self.reset_peak()
        t = time.time()
        rec = trainer.train(trainer.TrainConfig(
            preset=self.preset.name, r=r, s=self.a.size, steps=1 + self.a.timed, micro_batch=micro,
            compile=compiled, data_dir=str(self.data_root), quiet=True, peak_flops=self.spec,
            eval_tokens=self.T * micro, log_every=1))
        peak = self.peak()
        pred = memory.predict_peak(cfg, micro)
        f = accounting.flops_per_token(cfg)
        tok_s = rec.get("tokens_per_s")
        out = {"r": r, "s": self.a.size, "d_model": cfg.d_model, "compile": compiled, "micro_batch": micro,
               "accumulation": rows // micro, "status": rec["status"], "wall_s": round(time.time() - t, 1),
               "first_step_s": rec.get("first_step_seconds"), "tokens_per_s": tok_s, "flops_per_token": f,
               "mfu_vs_spec": tok_s * f / self.spec if tok_s and self.spec else None,
               "mfu_vs_gemm": tok_s * f / self.res["gemm_flops"] if tok_s and self.res.get("gemm_flops") else None,
               "record_mfu": rec.get("mfu"), "record_micro_batch": rec.get("micro_batch"),
               "peak_memory_bytes": peak, "record_peak_memory_bytes": rec.get("peak_memory_bytes"),
               "predicted_peak_bytes": pred["peak_bytes"],
               "peak_over_predicted": peak / pred["peak_bytes"] if peak else None,
               "loss_curve": rec.get("train_loss_curve")}
        if peak:
            self.res["checks"][f"memory_within_prediction_r{r}_{'compiled' if compiled else 'eager'}"] = \
                peak <= 1.05 * pred["peak_bytes"]
        return out

    def train_run(self):
        """STEPS steps; stopped at half way (the checkpoint), then resumed from it to the end."""
        cfg = model_config(self.preset, r=self.a.r_train, s=self.a.size)
        rows = min(self.rows(), self.a.train_rows)
        micro = self.micro(cfg, rows)
        record, ckpt = self.out / "train_record.json", self.out / "train_ckpt.pt"
        record.unlink(missing_ok=True)
        ckpt.unlink(missing_ok=True)
        half = max(1, self.a.steps // 2)
        kw = dict(preset=self.preset.name, r=self.a.r_train, s=self.a.size, steps=self.a.steps,
                  batch_tokens=rows * self.T, micro_batch=micro, compile=self.a.compile_train,
                  data_dir=str(self.data_root), out=str(record), checkpoint=str(ckpt), checkpoint_every=half,
                  quiet=True, peak_flops=self.spec, log_every=max(1, self.a.steps // 20),
                  eval_tokens=self.T * min(rows, 64))
        self.reset_peak()
        t = time.time()
        first = trainer.train(trainer.TrainConfig(**kw, stop_after=half))
        ckpt_bytes = ckpt.stat().st_size if ckpt.exists() else None
        rec = trainer.train(trainer.TrainConfig(**kw))
        curve = [loss for _, loss in rec["train_loss_curve"] if loss is not None]
        unigram = self.res.get("unigram_nats") or math.log(min(self.a.active, self.preset.vocab_size - 1))
        fall = curve[0] - curve[-1] if len(curve) > 1 else 0.0
        need = 2.0 if self.preset.name == "paper" else 0.05
        ok_loss = rec["status"] == "ok" and fall > need and rec["loss"] is not None and \
            (self.preset.name != "paper" or rec["loss"] < unigram - 0.5)
        ok_ckpt = first.get("status") == "stopped" and bool(ckpt_bytes) and not ckpt.exists()
        self.res["checks"]["training_loss_falls"] = ok_loss
        self.res["checks"]["checkpoint_written_and_resumed"] = ok_ckpt
        return {"r": self.a.r_train, "s": self.a.size, "rows": rows, "micro_batch": micro, "steps": self.a.steps,
                "compile": self.a.compile_train, "stopped_at": first.get("step"), "checkpoint_bytes": ckpt_bytes,
                "status": rec["status"], "val_loss": rec["loss"], "loss_fall": fall, "unigram_nats": unigram,
                "curve": rec["train_loss_curve"], "tokens_per_s": rec.get("tokens_per_s"),
                "mfu": rec.get("mfu"), "peak_memory_bytes": self.peak(), "wall_s": round(time.time() - t, 1),
                "ok": ok_loss and ok_ckpt}

    def run(self):
        a = self.a
        self.phase("env", 1, self.env)
        self.phase("gemm", 5, self.gemm)
        self.phase("data", 5, self.synthetic_data)
        self.phase("dtypes", a.est_dtypes, self.dtypes)
        for compiled in a.compile_modes:
            for r in a.r_list:
                est = a.est_throughput * (3 if compiled else 1)
                self.phase(f"throughput_r{r}_{'compiled' if compiled else 'eager'}", est, self.throughput, r, compiled)
        self.phase("train", a.est_train, self.train_run)
        failed = [k for k, v in self.res["phases"].items() if "error" in v]
        self.res["errors"] = failed
        self.res["ok"] = not failed and all(self.res["checks"].values())
        self.save()
        self.log("DONE", json.dumps({"checks": self.res["checks"], "errors": failed}))
        return 0 if self.res["ok"] else 1


def parse(argv=None):
    gpu = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", str(REPO / "gpu_check_out")))
    ap.add_argument("--preset", default="paper" if gpu else "tiny")
    ap.add_argument("--size", "-s", type=float, default=None, help="width s (default 10 for paper, else 2)")
    ap.add_argument("--r-list", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--r-train", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300 if gpu else 20, help="training-run steps")
    ap.add_argument("--train-rows", type=int, default=32, help="rows per step of the training run")
    ap.add_argument("--timed", type=int, default=5, help="timed steps per throughput run (after step 0)")
    ap.add_argument("--dtype-steps", type=int, default=8)
    ap.add_argument("--dtype-rows", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=None, help="default: looped.memory.auto_micro_batch")
    ap.add_argument("--compile-modes", default=None,
                    help="comma list of eager,compiled for the throughput runs (default both on a GPU, "
                         "eager on the CPU, where inductor takes ~40 s per shape)")
    ap.add_argument("--compile-train", action=argparse.BooleanOptionalAction, default=gpu)
    ap.add_argument("--spec-flops", type=float, default=None, help="MFU denominator (default: the part's spec)")
    ap.add_argument("--gemm-n", type=int, default=8192)
    ap.add_argument("--active", type=int, default=2048, help="token ids the synthetic chain uses")
    ap.add_argument("--budget-s", type=float, default=600, help="skip phases that would overrun this")
    a = ap.parse_args(argv)
    if a.size is None:
        a.size = 10.0 if a.preset == "paper" else 2.0
    modes = a.compile_modes or ("eager,compiled" if gpu else "eager")
    a.compile_modes = [{"eager": False, "compiled": True}[m.strip()] for m in modes.split(",") if m.strip()]
    big = a.preset == "paper"
    a.est_dtypes, a.est_throughput, a.est_train = (40, 25, 150) if big else (2, 1, 3)
    return a


def main(argv=None) -> int:
    torch.manual_seed(0)
    return Check(parse(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
