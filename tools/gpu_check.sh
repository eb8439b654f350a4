#!/usr/bin/env bash
# The device check on one GPU (no internet needed): OUT=dir bash tools/gpu_check.sh [gpu_check.py options]
# Writes $OUT/gpu_check.json (figures and checks), $OUT/log.txt and $OUT/nvidia-smi.txt.
# Run from anywhere; the repository's .venv is used when present.  See tools/gpu_check.py --help.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$REPO/gpu_check_out}
mkdir -p "$OUT"
PY=${PY:-$( [ -x "$REPO/.venv/bin/python" ] && echo "$REPO/.venv/bin/python" || echo python3 )}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$OUT/inductor-cache}
export PYTHONDONTWRITEBYTECODE=1
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv && nvidia-smi; } \
  > "$OUT/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$OUT/nvidia-smi.txt"
"$PY" "$REPO/tools/gpu_check.py" --out "$OUT" "$@" 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
