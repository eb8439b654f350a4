"""A study as one value: `Study` holds a named study's grid, its resolved preset and its
folder of run records, and gives the tables read from them.

`Study("cpu-main")` (grid and preset from `looped.studies.sweep.registry`, records in runs/cpu-main);
`Study("cpu-main", folder=...)` reads another folder; `Study.at(folder)` is the records of a
folder named after it.  A relative folder is taken from the repository root once, here.  Every
table of its records is a view of the one reader `looped.records.runs_table` (its policy: every
record below the folder, every status, nested fields flattened, no cast).  The
tables: `records()` (every record, or the finished ones), `plan()` (every planned run's size,
tokens and compute), `table()` (the plan joined with the records), `fit_table()` (the runs the
joint law is fitted to), `cost()` (training compute and accelerator-hours) and
`learning_rates()`; beside them the bookkeeping of a run table (`status_counts`, `loss_pivot`,
`run_costs`) and of several GPU studies side by side (`gpu_costs`).  What the finished runs
show is in `looped.studies.sweep.iso_flop`.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ... import accounting as acc
from ...config import REPO, Preset, get_preset
from ...data.dataset import dataset_name
from ...data.packing import TOKEN_DTYPE
from ...fit import REQUIRED, load_runs
from ...memory import GPU_SPECS
from ...records import COLUMNS, cast, read_records
from . import iso_flop
from .cost import DEFAULT_GPU_MFU, plan
from .registry import STUDIES, Run, SweepError, load_study, study_folder


@dataclass(frozen=True)
class Study:
    """A study: its name, its grid's runs (empty for a folder without a named study), the preset
    they train with (resolved once, by `registry.load_study`) and its folder of run records
    (default runs/NAME; a relative folder is taken from the repository root)."""
    name: str
    folder: Path | str | None = None
    runs: tuple[Run, ...] = ()
    preset: Preset | None = None

    def __post_init__(self):
        if not self.runs and self.name in STUDIES:
            object.__setattr__(self, "runs", tuple(load_study(self.name)))
        if self.preset is None and self.runs:
            object.__setattr__(self, "preset", self.runs[0].preset)
        folder = study_folder(self.name) if self.folder is None else Path(self.folder)
        object.__setattr__(self, "folder", folder if folder.is_absolute() else REPO / folder)

    @classmethod
    def at(cls, folder) -> "Study":
        """The records in `folder`, as the study named after it (with that study's grid if it is a
        named one, else none)."""
        return cls(Path(folder).name, folder=folder)

    def records(self, ok: bool = False) -> pd.DataFrame:
        """Its run records (`looped.records.read_records`: `runs_table` in `COLUMNS`): every status,
        or with `ok` only the finished runs, typed by `looped.records.cast`.  A folder that does not
        exist yet (a sweep that has not started) has none."""
        rec = read_records(self.folder) if self.folder.is_dir() else pd.DataFrame(columns=COLUMNS)
        return cast(rec[rec.status == "ok"]) if ok else rec

    def fit_table(self, main_design: bool = True) -> pd.DataFrame:
        """The finished runs as the fitter reads them (`looped.fit.load_runs`: `runs_table` cast and
        checked, its warnings about unfinished runs silenced) and, with `main_design`, only the main
        design the joint law is fitted to (`iso_flop.main_design`).  A missing folder, or one
        without records, gives an empty table."""
        p = self.folder
        if not p.exists() or (p.is_dir() and not any(p.rglob("*.json"))):
            return pd.DataFrame(columns=list(REQUIRED) + ["budget"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs = load_runs(p)
        return iso_flop.main_design(runs)[0] if main_design else runs

    def plan(self, peak_flops: float = 1.0, mfu: float = 1.0) -> pd.DataFrame:
        """Every run of its grid with its size, tokens, steps and compute.

        This is ``looped.studies.sweep.cost.plan`` (what ``looped sweep STUDY --dry-run`` prints) plus the
        columns ``run_flops`` (training FLOPs per token times tokens: the budget up to whole steps)
        and ``tokens_per_param`` (tokens per unique non-embedding parameter).  ``est_seconds`` is
        the run's wall time at ``mfu`` of ``peak_flops``.
        """
        if not self.runs:
            raise SweepError(f"{self.name} has no grid: {', '.join(STUDIES)} have")
        table = plan(list(self.runs), peak_flops, mfu)
        table["run_flops"] = table["flops_per_token"].astype(float) * table["tokens"]
        table["tokens_per_param"] = table["tokens"] / table["n"]
        return table

    def table(self) -> pd.DataFrame:
        """The planned runs joined with the records in its folder.

        One row per planned run (``plan`` columns) with ``status`` ('ok', 'diverged',
        'failed', 'corrupt', or 'missing' where no record exists yet), ``loss`` (nats),
        ``wall_seconds`` and ``tokens_per_s`` from the record.  Records of runs outside the planned
        grid (e.g. an extra budget trained with ``looped sweep STUDY --grid FILE``) are appended
        from their own fields, with ``planned`` False.  A missing folder means no records.
        """

        table = self.plan().drop(columns=["est_seconds"])
        table["planned"] = True
        rec = self.records()
        cols = ["status", "loss", "wall_seconds", "tokens_per_s"]
        table = table.merge(rec[["run_id"] + cols], on="run_id", how="left")
        extra = rec[~rec.run_id.isin(table.run_id) & rec.budget.notna() & rec.n.notna()].copy()
        if len(extra):
            extra["planned"] = False
            num = ["budget", "s", "d_model", "n", "n_once", "n_rec", "flops_per_token", "tokens", "steps"]
            extra[num] = extra[num].astype(float)
            extra["r"] = extra["r"].astype(int)
            extra["run_flops"] = extra.flops_per_token * extra.tokens
            extra["tokens_per_param"] = extra.tokens / extra.n
            table = pd.concat([table, extra[[c for c in table.columns if c in extra.columns]]], ignore_index=True)
            table = table.sort_values(["budget", "r", "s"], kind="stable").reset_index(drop=True)
        table["status"] = table["status"].fillna("missing")
        for c in cols[1:]:
            table[c] = table[c].astype(float)
        return table

    def cost(self, peak_flops: float = GPU_SPECS["H200"][0], mfu: float = DEFAULT_GPU_MFU) -> pd.DataFrame:
        """Training compute of its grid per budget, then in total (a last row with budget 'total'):
        runs, total FLOPs, and accelerator-hours at an ASSUMED ``mfu`` of ``peak_flops`` (default:
        the H200's dense bf16 peak at ``DEFAULT_GPU_MFU``, the default of ``looped sweep --dry-run``;
        the validation passes and restarts are not included)."""
        plan_ = self.plan()
        rows = []
        for key, g in list(plan_.groupby("budget", sort=True)) + [("total", plan_)]:
            flops = g.run_flops.sum()
            rows.append({"budget": key, "runs": len(g), "flops": flops,
                         "gpu_hours": flops / (peak_flops * mfu) / 3600,
                         "longest_run_hours": g.run_flops.max() / (peak_flops * mfu) / 3600})
        return pd.DataFrame(rows)

    def learning_rates(self) -> pd.DataFrame:
        """Peak learning rates (``looped.optim.learning_rates``, HyperP transfer) of every run of its
        grid: one row per run with the matrix (MuonH), embedding, head and norm rates."""

        from ...optim import learning_rates  # deferred on purpose: it imports torch
        rows = []
        for run in self.runs:
            cfg = run.model_config()
            bt = self.preset.batch_tokens
            lrs = learning_rates(cfg, bt, acc.tokens_for_budget(cfg, run.budget, bt))
            rows.append(dict(budget=run.budget, r=run.r, s=run.s, d_model=cfg.d_model, **lrs))
        return pd.DataFrame(rows)


def status_counts(table):
    """Finished ('ok') runs over planned runs ('4/5'), one row per budget, one column per r."""
    g = table.assign(ok=table.status.eq("ok")).groupby(["budget", "r"])
    cell = (g.ok.sum().astype(int).astype(str) + "/" + g.size().astype(str)).unstack("r")
    cell.columns = [f"r={r}" for r in cell.columns]
    return cell.reset_index()


def loss_pivot(table, decimals: int = 3):
    """Final validation loss (nats) of every finished run: one row per (budget, s, d_model) planned,
    one column per r (NaN where the run has not finished)."""
    ok = table[table.status == "ok"]
    pv = ok.pivot_table(index=["budget", "s", "d_model"], columns="r", values="loss", aggfunc="first")
    full = table.pivot_table(index=["budget", "s", "d_model"], columns="r", values="n", aggfunc="first")
    pv = pv.reindex(index=full.index, columns=full.columns).round(decimals)
    pv.columns = [f"r={r}" for r in pv.columns]
    return pv.reset_index()


def run_costs(table):
    """Wall time of the finished runs per budget, then in total (a last row with budget 'total'),
    from the records: runs, summed wall seconds, training tokens, tokens/s (total tokens over
    total time) and the model FLOP/s that the accounting credits them with."""
    ok = table[(table.status == "ok") & table.wall_seconds.notna()].copy()
    ok["model_flops"] = ok.flops_per_token.astype(float) * ok.tokens
    rows = []
    for key, g in list(ok.groupby("budget", sort=True)) + [("total", ok)]:
        wall = g.wall_seconds.sum()
        rows.append({"budget": key, "runs": len(g), "wall_seconds": wall,
                     "wall_hours": wall / 3600, "tokens": g.tokens.sum(),
                     "tokens_per_s": g.tokens.sum() / wall if wall else float("nan"),
                     "model_gflops_per_s": g.model_flops.sum() / wall / 1e9 if wall else float("nan")})
    return pd.DataFrame(rows)


def gpu_costs(names, peak_flops: float = GPU_SPECS["H200"][0], mfu: float = DEFAULT_GPU_MFU) -> pd.DataFrame:
    """One row per study of `names`: its runs, training FLOPs and accelerator-hours at an ASSUMED
    ``mfu`` of ``peak_flops`` (as `Study.cost`), the days on one GPU and on one 8-GPU node
    (perfect data parallelism), and its longest run's tokens (B) with the GB of shards they take on disk."""
    rows = []
    for study in map(Study, names):
        total = study.cost(peak_flops, mfu).set_index("budget").loc["total"]
        tokens = float(study.plan().tokens.max())
        rows.append({"study": study.name, "runs": int(total.runs), "flops": total.flops,
                     "gpu_hours": total.gpu_hours, "days_1gpu": total.gpu_hours / 24,
                     "days_8gpu": total.gpu_hours / 8 / 24, "tokens_B": tokens / 1e9,
                     "shards_GB": tokens * np.dtype(TOKEN_DTYPE).itemsize / 1e9})
    return pd.DataFrame(rows)


def data_margin(preset: str, manifest: Path | None = None) -> dict:
    """How far the training split of a preset's dataset outlasts the longest planned run of its
    studies: runs never repeat data.  ``manifest`` is the dataset's meta.json (default the
    committed runs/<dataset>.json)."""
    name = dataset_name(get_preset(preset))
    meta = json.loads(Path(manifest or REPO / "runs" / f"{name}.json").read_text())
    names = [n for n, (_, _, p) in STUDIES.items() if p == preset]
    longest = max((Study(n).plan().assign(study=n) for n in names), key=lambda t: t.tokens.max())
    row = longest.loc[longest.tokens.idxmax()]
    train = meta["splits"]["train"]["tokens"]
    return {"dataset": name, "train_tokens": train, "study": row.study, "run_id": row.run_id,
            "run_tokens": int(row.tokens), "margin": train / row.tokens, "studies": len(names)}


if __name__ == "__main__":  # python -m looped.studies.sweep.study margin [PRESET]: printed by `make corpus`
    import sys
    m = data_margin(sys.argv[2] if len(sys.argv) > 2 else "prose3")
    print(f"{m['dataset']}: {m['train_tokens'] / 1e6:.2f}M training tokens; the longest run of its "
          f"{m['studies']} studies ({m['study']} {m['run_id']}) reads {m['run_tokens'] / 1e6:.2f}M: "
          f"{m['margin']:.2f}x margin, no data repeated")
