"""summary.txt of the device check (tools/gpu_check.py): one line per phase from its record.

Pure Python (no torch): the text depends only on device_check.json's content (what each phase
recorded), the wall budget and the spec peak.  Every number goes through `f`, and a
phase whose line cannot be written (a diverged run's None where a figure was expected, a key its
record lacks) says so instead of losing the file.
"""
from __future__ import annotations

import json


def f(x, fmt=".3f") -> str:
    """`x` formatted with `fmt`; "-" for None, and str(x) where the format does not apply."""
    try:
        return "-" if x is None else format(x, fmt)
    except (TypeError, ValueError):
        return str(x)


def summary(r: dict, budget_s: float, spec: float | None) -> str:
    """The text of summary.txt for the check's results `r` (device_check.json's content), its wall
    budget in seconds and the device's spec peak (FLOP/s, None where unknown)."""
    e = r.get("env") or {}
    lines = [f"device {e.get('device')}  torch {e.get('torch')}  cuda {e.get('cuda')}  "
             f"elapsed {r.get('elapsed_s')}s of {budget_s:.0f}s  spec {f(spec, '.3g')} FLOP/s",
             f"GEMM TFLOP/s (median) {json.dumps(r.get('gemm_tflops', {}))}"]
    for k, v in r["phases"].items():
        try:
            lines += phase_lines(k, v)
        except Exception as ex:  # noqa: BLE001 - the summary must survive any phase's record
            lines.append(f"{k}: (no summary line: {type(ex).__name__}: {ex})"[:300])
    lines.append("mfu_eager_by_width " + json.dumps(r.get("mfu_eager_by_width")))
    lines.append("mfu_compiled_by_width " + json.dumps(r.get("mfu_compiled_by_width")))
    bad = [k for k, v in r["checks"].items() if not v]
    lines.append(f"checks {sum(r['checks'].values())}/{len(r['checks'])} pass" + (f"; FAILED {bad}" if bad else ""))
    if "ok" in r:
        lines.append(f"OK {r['ok']}  errors {r['errors']}  skipped {r['skipped']}"
                     + (f"  INTERRUPTED {r['interrupted']}" if "interrupted" in r else ""))
    return "\n".join(lines) + "\n"


def phase_lines(k: str, v: dict) -> list[str]:
    """The summary lines of phase `k` (its record `v`)."""
    lines = []
    if "skipped" in v or "error" in v:
        lines.append(f"{k}: {'SKIPPED ' + v['skipped'] if 'skipped' in v else 'ERROR ' + v['error'][:200]}")
    elif k.startswith("throughput"):
        lines.append(f"{k:24s} micro {f(v['micro_batch'], '3d')}  tok/s {f(v['tokens_per_s'], ',.0f')}  MFU spec "
                     f"{f(v['mfu_vs_spec'])} gemm {f(v['mfu_vs_gemm'])}  first step "
                     f"{f(v['first_step_s'], '.1f')}s  peak/pred {f(v['peak_over_predicted'], '.2f')}")
    elif k in ("correctness", "compiled"):
        lines.append(f"{k}: loss rel diff {f(v['loss_rel_diff'], '.2e')}, grad cosine {f(v['grad_cosine'], '.5f')}")
    elif k == "muon":
        muon = [f(x, ".4f") for x in v["muon_step_cosine_vs_fp32"]]
        lines.append(f"polar express cos vs exact {f(v['cosine_device_vs_exact'], '.4f')} (fp32 "
                     f"{f(v['cosine_fp32_vs_exact'], '.4f')}); MuonH step cos vs fp32 {muon}")
    elif k == "sdpa":
        lines.append(f"sdpa ops {v['sdpa_ops']} kernels {v['attention_kernels'][:3]}")
    elif k.startswith("resume"):
        lines.append(f"{k}: val {f(v['val_straight'], '.4f')} straight vs {f(v['val_resumed'], '.4f')} "
                     f"resumed, max curve diff {f(v['max_curve_diff_after_resume'], '.2e')}")
    elif k == "oom":
        lines.append(f"oom: {v['status']}, micro-batch history {v['micro_batch_history']}, "
                     f"{f(v['wall_s'], '.1f')}s, allocated after {f(v['allocated_after'], ',.0f')} B")
    elif k in ("grid", "compiled_by_width"):
        for x in v["rows"]:
            lines.append(f"{k} s={f(x['s'], '<4g')} r={x['r']} micro {f(x['micro_batch'], '3d')}  "
                         f"MFU {f(x['mfu'])}  peak/pred {f(x['peak_over_predicted'], '.2f')}")
    elif k == "r_sweep":
        lines.append("r_sweep val " + json.dumps({q: None if w.get("val") is None else round(w["val"], 3)
                                                  for q, w in v.items() if isinstance(w, dict)}))
    return lines
