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
