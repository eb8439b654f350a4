#!/usr/bin/env python3
"""Replay a chapter's code the way nbval does and print what its checked cells output, as JSON.

    python tests/nbval_replay.py 03_fit --out a.json             # plain replay
    python tests/nbval_replay.py 03_fit --jitter 3 --out b.json  # input losses times (1 + 1e-12 u), u ~ U(-1, 1)

Used by tests/test_nbval_stability.py: the chapter's code cells (from the MyST source, default
parameters, working directory book/) run one after another in an IPython shell, and for every
cell tagged ``nbval-check-output`` the text that nbval compares (stdout and stderr streams,
plain-text and papermill-record data of displayed values) is collected and sanitized with
tests/nbval_sanitize.cfg.  With ``--jitter SEED`` the measured losses that enter the chapters
(run records, the paper's published minima and tables, the synthetic runs) are multiplied by
(1 + 1e-12 u) before any cell sees them: a checked output must not depend on rounding errors.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
RELATIVE_JITTER = 1e-12
LOSS_COLUMN = re.compile(r"(^|_)loss($|_)")   # loss, val_loss_nats, loss_star_nats, ...: measured losses


def sanitizers() -> list[tuple[re.Pattern, str]]:
    """The (regex, replacement) pairs of tests/nbval_sanitize.cfg, read the way nbval reads them."""
    text = (ROOT / "tests" / "nbval_sanitize.cfg").read_text()
    return [
        (re.compile(rx), rep) for rx, rep in re.findall(r"^regex: (.*)$\n^replace: (.*)$", text, flags=re.MULTILINE)
    ]


def sanitize(text: str, patterns) -> str:
    for rx, rep in patterns:
        text = rx.sub(rep, text)
    return text


def checked_text(outputs: list[dict], patterns) -> str:
    """The compared part of a cell's outputs (nbval: streams joined, then every data mimetype
    except images), as one sanitized string."""
    stream = "".join(o["text"] for o in outputs if o.get("output_type") == "stream")
    parts = [stream] if stream else []
    for o in outputs:
        for mime, val in sorted((o.get("data") or {}).items()):
            if not mime.startswith("image/"):
                parts.append(f"[{mime}] " + (val if isinstance(val, str) else "".join(val)))
    return sanitize("\n".join(parts), patterns)


def reference(stem: str) -> list[str]:
    """The checked cells' compared text in the committed reference notebook book/STEM.ipynb."""
    nb = json.loads((BOOK / f"{stem}.ipynb").read_text())
    patterns = sanitizers()
    out = []
    for c in nb["cells"]:
        if c["cell_type"] == "code" and "nbval-check-output" in c.get("metadata", {}).get("tags", []):
            outs = [dict(o, text="".join(o["text"])) if "text" in o else o for o in c.get("outputs", [])]
            out.append(checked_text(outs, patterns))
    return out


def install_jitter(seed: int) -> None:
    """Multiply every measured loss that enters a chapter by (1 + 1e-12 u), u ~ U(-1, 1)."""
    import numpy as np
    import pandas as pd

    from looped import records
    from looped.studies import paper
    rng = np.random.default_rng(seed)

    def jitter_frame(df):
        if not isinstance(df, pd.DataFrame) or not len(df):
            return df
        df = df.copy()
        for col in df.columns:
            if LOSS_COLUMN.search(str(col)) and pd.api.types.is_float_dtype(df[col]):
                v = df[col].to_numpy(float)
                df[col] = v * (1 + RELATIVE_JITTER * rng.uniform(-1, 1, len(v)))
        return df

    def wrap(module, name):
        original = getattr(module, name)

        def jittered(*args, **kwargs):
            return jitter_frame(original(*args, **kwargs))
        setattr(module, name, jittered)

    wrap(paper, "runs_from_minima")      # the paper's 24 minima as runs (chapter 3)
    wrap(paper, "paper_table")           # the paper's tables: minima L*, ablation losses, residuals
    wrap(paper, "synthetic_runs")        # synthetic runs (chapter 3)
    original_records = records.iter_records   # every run record read (study tables, fits: chapters 2-6)

    def jittered_records(*args, **kwargs):
        for path, rec in original_records(*args, **kwargs):
            if isinstance(rec, dict) and isinstance(rec.get("loss"), float):
                rec["loss"] *= 1 + RELATIVE_JITTER * rng.uniform(-1, 1)
            yield path, rec
    records.iter_records = jittered_records


def replay(stem: str, jitter: int | None = None, stop_after: int | None = None) -> list[str]:
    """The checked cells' compared text, in order, from running book/STEM.md's code cells
    (all of them, or code cells 0 to ``stop_after``)."""
    import jupytext
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    os.environ["MPLBACKEND"] = "Agg"
    nb = jupytext.read(BOOK / f"{stem}.md")
    os.chdir(BOOK)
    sys.path.insert(0, str(BOOK))
    if jitter is not None:
        install_jitter(jitter)
    shell = InteractiveShell.instance(colors="NoColor")
    shell.enable_gui = lambda gui=None: None   # `%matplotlib inline` outside a kernel: figures stay on Agg
    results = []   # a cell's last expression (a Table): kept as the kernel keeps it, every mimetype, no "Out[n]:"
    shell.displayhook.write_output_prompt = lambda: None
    shell.displayhook.write_format_data = lambda data, md=None: results.append(data)
    patterns = sanitizers()
    out = []
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        if stop_after is not None and i > stop_after:
            break
        results.clear()
        with capture_output() as cap:
            res = shell.run_cell(cell.source, store_history=True)
        if not res.success:
            err = res.error_in_exec or res.error_before_exec
            raise RuntimeError(f"{stem} code cell {i} failed: {type(err).__name__}: {err}\n{cap.stdout[-2000:]}")
        if "nbval-check-output" in cell.metadata.get("tags", []):
            outputs = []
            if cap.stdout or cap.stderr:
                outputs.append({"output_type": "stream", "text": cap.stdout + cap.stderr})
            for o in cap.outputs:
                outputs.append({"output_type": "display_data", "data": dict(o.data)})
            outputs += [{"output_type": "execute_result", "data": dict(data)} for data in results]
            out.append(checked_text(outputs, patterns))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("chapter", help="chapter stem, e.g. 03_fit")
    ap.add_argument("--jitter", type=int, default=None, help="seed of the relative 1e-12 loss jitter")
    ap.add_argument("--stop-after", type=int, default=None, help="run code cells 0 to this index only")
    ap.add_argument("--out", required=True, help="JSON file for the checked cells' text")
    a = ap.parse_args(argv)
    out = Path(a.out).resolve()
    out.write_text(json.dumps(replay(a.chapter, a.jitter, a.stop_after)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
