"""Run records: one JSON file per finished (or failed) run, and the table a study's folder reads as.

A record is what `looped.train.train` writes; a folder of them is a study.  `iter_records` is
the one place record files are opened, and `runs_table` the one folder -> table reader (its
policy is in its docstring): `read_records` (the study table, `COLUMNS`) and the fitter's
`looped.fit.load_runs` (which casts and checks it) are views of it, and
`looped.studies.sweep.study.Study` serves them.

Every record names the data its run trained on: from schema 2 on, the trainer writes the field
``data`` (dataset directory name, corpus, corpus version and the dataset's digest, from its
meta.json); an older record's data is inferred from its preset (`record_data`).  Both tables carry
it as the columns ``dataset`` and ``corpus_version``, so runs of two corpora are never pooled
unnoticed (`looped.fit.fit` refuses a table of several datasets unless asked).

pandas is imported where a table is built (the trainer imports this module for its record's
fields).
"""
from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from .config import PRESETS

if TYPE_CHECKING:
    import pandas as pd


class RecordError(ValueError):
    """A folder that is not a folder of run records."""


COLUMNS = ["run_id", "study", "status", "budget", "r", "s", "injection", "bptt_k", "d_model", "n", "n_once",
           "n_rec", "flops_per_token", "tokens", "steps", "loss", "wall_seconds", "tokens_per_s", "mfu",
           "lr_scale", "seed", "batch_tokens", "data_order", "dataset", "corpus_version"]

RUN_COLUMNS = ("r", "n_once", "n_rec", "tokens", "loss")  # what the fitter needs of every run
# The one type policy of a runs table (`cast`): counts are integers, everything measured is a float.
INTEGER_COLUMNS = ("r", "bptt_k", "d_model", "seed", "steps", "batch_tokens")
FLOAT_COLUMNS = ("budget", "s", "n", "n_once", "n_rec", "flops_per_token", "tokens", "loss",
                 "wall_seconds", "tokens_per_s", "mfu", "lr_scale")

SCHEMA = 2  # the record's layout; 2 added `data` (records of schema 1 name their data through their preset)
DATA_KEYS = ("dataset", "corpus", "corpus_version", "digest")
DATA_COLUMNS = ("dataset", "corpus_version")  # what the tables show of it

# The data of the records written before `data` existed (schema 1), by preset: the corpus of
# `looped.data.dataset`'s rule of that time (the dataset name is corpus-tokenizer-T), and the
# prose corpus at version 2 (`looped.data.corpus.VERSION` then), which every committed prose run
# trained on.  Frozen on purpose: a later corpus or naming rule must not relabel old runs (the
# tests check it against `looped.data.dataset.dataset_name`; records.py may not import the data
# pipeline, tests/test_layers.py).
LEGACY_DATA = {"cpu": ("shakespeare", None), "tiny": ("shakespeare", None), "prose": ("prose", 2),
               "paper": ("fineweb-edu", None)}


def data_field(meta: dict, name: str | None = None) -> dict:
    """A record's ``data`` from its dataset's meta.json: the dataset directory's name (``name`` where
    the meta lacks one), the corpus, its version and the dataset's digest (None where meta.json has
    none)."""
    return {"dataset": meta.get("name") or name, "corpus": meta.get("corpus"),
            "corpus_version": meta.get("corpus_version"), "digest": meta.get("digest")}


def legacy_data(preset: str | None, vocab_size: int | None = None, seq_len: int | None = None) -> dict | None:
    """The ``data`` of a record written before the field existed, from its preset (and its model's
    vocabulary and context, default the preset's): e.g. prose -> prose-bpe2048-T128, corpus version
    2; cpu -> shakespeare-bpe1024-T128; paper -> fineweb-edu-llama2-T2048.  None for a preset the
    rule does not know (its runs stay unnamed)."""
    if preset not in LEGACY_DATA:
        return None
    corpus, version = LEGACY_DATA[preset]
    vocab_size = vocab_size or PRESETS[preset].vocab_size
    seq_len = seq_len or PRESETS[preset].seq_len
    tokenizer = "llama2" if corpus == "fineweb-edu" else f"bpe{vocab_size}"
    return {"dataset": f"{corpus}-{tokenizer}-T{seq_len}", "corpus": corpus, "corpus_version": version,
            "digest": None}


def record_data(rec: dict) -> dict | None:
    """The data a record's run trained on: its ``data`` field, else (a record older than the field)
    inferred from its preset by `legacy_data`; None where neither says."""
    data = rec.get("data")
    if isinstance(data, dict) and data.get("dataset"):
        return {k: data.get(k) for k in DATA_KEYS}
    config = rec.get("config") if isinstance(rec.get("config"), dict) else {}
    preset = rec.get("preset") or config.get("preset")
    return legacy_data(preset, config.get("vocab_size"), config.get("seq_len")) if isinstance(preset, str) else None


def record_status(path: Path) -> str | None:
    """'ok' / 'diverged' / 'failed' for a readable record, 'corrupt' for an unreadable one."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text()).get("status", "corrupt")
    except (OSError, ValueError):
        return "corrupt"


def run_state(out: Path, run_id: str) -> str:
    """What a dry run shows for one run: its record's status, 'running' while another process
    holds its lock, else ''.  Looks without creating anything."""
    status = record_status(Path(out) / f"{run_id}.json")
    if status:
        return status
    lock = Path(out) / "ckpt" / f"{run_id}.lock"
    if not lock.exists():
        return ""
    try:
        with open(lock) as handle:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return "running"
    except OSError:
        pass
    return ""


def iter_records(folder: str | Path, recursive: bool = False) -> Iterator[tuple[Path, object]]:
    """(path, parsed JSON) for every ``*.json`` file of a folder (and of its subfolders with
    ``recursive``), in sorted order; the JSON is None where the file cannot be read or parsed."""
    folder = Path(folder)
    for path in sorted(p for p in (folder.rglob if recursive else folder.glob)("*.json") if p.is_file()):
        try:
            yield path, json.loads(path.read_text())
        except (OSError, ValueError):   # unreadable, not UTF-8 or not JSON
            yield path, None


def flat_record(rec: dict) -> dict:
    """A record's scalar fields in one flat dict: the nested parts "config", "result", "results"
    and "metrics" lifted to the top level (top-level keys win), ``budget_flops`` read as
    ``budget`` and ``val_loss`` / ``final_val_loss`` as ``loss`` where those are absent, and the
    run's ``dataset`` and ``corpus_version`` (`record_data`) where it names its data."""
    flat = {}
    for sub in ("config", "result", "results", "metrics"):
        if isinstance(rec.get(sub), dict):
            flat.update({k: v for k, v in rec[sub].items() if not isinstance(v, (dict, list))})
    flat.update({k: v for k, v in rec.items() if not isinstance(v, (dict, list))})
    if "budget" not in flat and "budget_flops" in flat:
        flat["budget"] = flat["budget_flops"]
    if "loss" not in flat:
        for alt in ("val_loss", "final_val_loss"):
            if alt in flat:
                flat["loss"] = flat[alt]
                break
    data = record_data(rec)
    if data:
        for k in DATA_COLUMNS:
            flat.setdefault(k, data[k])
    return flat


def runs_table(folder: str | Path) -> "pd.DataFrame":
    """The one table of a folder of run records; every other reader is a view of it.

    The policy: every ``*.json`` file of the folder and of its subfolders, in sorted path order,
    one row each; every status (an unreadable file is a row with status 'corrupt'); a record's
    fields flattened by `flat_record` (nested parts lifted, old names mapped, its data named), plus
    ``file`` (the record's file name); no type cast (the values as the JSON gives them: casting is
    the job of the table's reader, `looped.fit.validate_runs` for the fitter).  A JSON file with
    neither a run_id nor any of the run columns `RUN_COLUMNS` (a manifest, a config) is no row;
    their names are in ``attrs["ignored"]``.  Raises RecordError for a path that is not a folder."""
    import pandas as pd  # deferred on purpose: see the module docstring
    folder = Path(folder)
    if not folder.is_dir():
        raise RecordError(f"{folder} is not a folder of run records")
    rows, ignored = [], []
    for path, rec in iter_records(folder, recursive=True):
        flat = flat_record(rec) if isinstance(rec, dict) else {}
        if rec is None:
            rows.append({"run_id": path.stem, "status": "corrupt", "file": path.name})
        elif "run_id" in flat or any(k in flat for k in RUN_COLUMNS):
            flat.setdefault("file", path.name)
            rows.append(flat)
        else:
            ignored.append(str(path.relative_to(folder)))
    table = pd.DataFrame(rows)
    table.attrs["ignored"] = ignored
    return table


def read_records(folder: str | Path) -> "pd.DataFrame":
    """The study table of a folder: `runs_table` in the columns `COLUMNS` (every status; an
    unreadable file is a row with status 'corrupt')."""
    return study_columns(runs_table(folder))


def cast(table: "pd.DataFrame") -> "pd.DataFrame":
    """A runs table with its numbers typed by the one policy: `FLOAT_COLUMNS` as floats and
    `INTEGER_COLUMNS` as integers where every value is a whole number (a column with a gap or a
    fraction stays float).  Text columns and columns it does not know are left as they are."""
    import pandas as pd  # deferred on purpose: see the module docstring
    table = table.copy()
    for col in FLOAT_COLUMNS + INTEGER_COLUMNS:
        if col in table.columns:
            values = pd.to_numeric(table[col], errors="coerce").astype(float)
            whole = col in INTEGER_COLUMNS and values.notna().all() and (values % 1 == 0).all()
            table[col] = values.astype(int) if whole else values
    return table


def study_columns(table: "pd.DataFrame") -> "pd.DataFrame":
    """A runs table in the study table's `COLUMNS` (a column no record has is all None)."""
    table = table.assign(**{c: None for c in COLUMNS if c not in table.columns})[COLUMNS]
    table.attrs = {}
    return table

