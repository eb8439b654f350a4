#!/usr/bin/env bash
# The one-shot device check of `looped` on one GPU, no internet needed (see tools/gpu_check.py).
#   OUT=dir bash tools/device_check.sh [gpu_check.py options]
# Results, 4 small files in $OUT: device_check.json (every figure and check), summary.txt, log.txt,
# nvidia-smi.txt.  Data, checkpoints and the inductor cache go to $WORK (default /tmp/looped_device_check),
# never into $OUT.  Environment: PRESET (paper on a GPU, tiny on the CPU), S (10), COMPILE (1 on a GPU),
# BUDGET_S (420: wall seconds from this script's start, imports and compiles included; phases that would
# overrun are skipped), GRACE_S (60: a phase still running at BUDGET_S + GRACE_S is interrupted),
# PY (the repository's .venv if present, else python3).  Exit status: the check's (0: all checks hold).
# CPU dry run in seconds: PRESET=tiny COMPILE=0 OUT=/tmp/dc bash tools/device_check.sh
# Expected phase times on an H200 or H100 (paper preset; estimates, not yet measured), cumulative:
#   start, imports, CUDA init, nvidia-smi ............................. 10-15 s    15
#   env, gemm (clock warm-up; n = 4096, 8192) .......................... 5 s        20
#   data (synthetic rows), correctness (fp32 vs bf16) .................. 6-8 s      28
#   muon, sdpa ......................................................... 6-10 s     38
#   throughput eager r4, r1 (s = 10, 6 steps of 2^18 tokens) ........... 20-25 s    63
#   oom (real OOM: 128 rows at s = 10 r = 1, halved to what fits) ...... 15-25 s    88
#   grid (eager, s = 4, 14 x r = 1, 8) ................................. 25-35 s    123
#   resume (eager, 3 runs at s = 6) .................................... 15-20 s    143
#   compiled (cold compile, s = 10 r = 4) .............................. 60-150 s   203-293
#   throughput r4 compiled (inductor cache hit) ........................ 20-35 s    223-328
#   resume_compiled (s = 10 r = 4, 2 compiled runs from the cache) ..... 30-50 s    253-378
#   compiled_by_width (r = 1 at s = 4, 14; cold, each only if 70 s left)  0-140 s    <= 420
#   r_sweep (only if budget is left) ................................... 0-40 s     <= 420
# The budget (420 s) skips what no longer fits; the hard stop is BUDGET_S + GRACE_S (+20 s kill).
set -uo pipefail
DC_T0=$(date +%s.%N)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-/tmp/looped_device_check/out}
WORK=${WORK:-/tmp/looped_device_check/work}
mkdir -p "$OUT" "$WORK" || exit 2
case "$(cd "$WORK" && pwd -P)/" in "$(cd "$OUT" && pwd -P)/"*) echo "WORK must lie outside OUT" >&2; exit 2;; esac
PY=${PY:-$( [ -x "$REPO/.venv/bin/python" ] && echo "$REPO/.venv/bin/python" || echo python3 )}
BUDGET_S=${BUDGET_S:-420}
[ "${PRESET:-}" = tiny ] && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # toy shapes: one thread is fastest
export OUT WORK BUDGET_S DC_T0 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor TRITON_CACHE_DIR=$WORK/triton
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
smi() { nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,driver_version --format=csv; }
{ smi && nvidia-smi; } > "$OUT/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$OUT/nvidia-smi.txt"
HARD_S=$(awk -v b="$BUDGET_S" -v g="${GRACE_S:-60}" 'BEGIN { printf "%d", b + g }')
timeout -s INT -k 20 "$HARD_S" "$PY" "$REPO/tools/gpu_check.py" "$@" 2>&1 | tee "$OUT/log.txt"
rc=$?
{ echo "# after the check (exit $rc)"; smi 2>&1 || echo "no nvidia-smi"; } >> "$OUT/nvidia-smi.txt"
exit "$rc"
