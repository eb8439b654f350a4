#!/usr/bin/env bash
# The second CPU study (corpus v3, preset prose3): one sweep process per core, every process going
# through the studies in priority order (the learning-rate check, the main grid, the two outer
# budgets, seed x order, the r = 1 controls and the additive anchor, then the case studies): the
# pure error comes before the case studies, which need it too.  Unsharded processes share a study's
# runs through per-run locks, so N processes finish a study together and then move on.  The
# learning-rate check's runs at the preset's multiplier are copied, not retrained (--reuse), both ways:
# the main grid adopts its r = 1 runs, and it adopts the main grid's r = 2 run.
# Resumable: run it again after any stop; finished records are kept and a run in flight resumes
# from its last checkpoint.  Logs: _build/cpu3-sweep/.
#   tools/cpu3_sweep.sh                      # all studies, one process per core
#   STUDIES="cpu3-lr" tools/cpu3_sweep.sh    # some of them
#   PROCESSES=1 tools/cpu3_sweep.sh
set -u
cd "$(dirname "$0")/.."
N="${PROCESSES:-$(nproc --all)}"   # (before OMP_NUM_THREADS=1, which nproc obeys)
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1   # one core per process: N processes, N cores
STUDIES="${STUDIES:-cpu3-lr cpu3-main cpu3-drift cpu3-replicates cpu3-controls cpu3-additive cpu3-truncated cpu3-matched cpu3-hyper}"
PY="${PYTHON:-.venv/bin/python}"
mkdir -p _build/cpu3-sweep
"$PY" -m looped data prepare --preset prose3 || exit 2   # build (or verify) the dataset once, first
for i in $(seq 1 "$N"); do
  (
    for study in $STUDIES; do
      echo "[$(date -u +%FT%TZ)] process $i: $study"
      reuse=runs/cpu3-lr; [ "$study" = cpu3-lr ] && reuse=runs/cpu3-main   # its preset-multiplier runs at r = 2 are main's
      "$PY" -m looped sweep "$study" --reuse "$reuse" || echo "[$(date -u +%FT%TZ)] process $i: $study exited $?"
    done
  ) >> "_build/cpu3-sweep/process-$$-$i.log" 2>&1 &
done
wait
