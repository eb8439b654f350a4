"""Named studies: grids as data (CSV rows of budget, r, s, injection, bptt_k and options).

The paper's grids are in runs/paper/grids.csv, ours in runs/prose_grids.csv (and the smoke test
in runs/cpu_grids.csv).  `load_study` turns a study's rows into `Run` objects, validating every
architecture before anything trains.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ...accounting import steps_for_budget
from ...config import DEFAULT_SEED, REPO, Preset, get_preset, model_config, run_name, shipped
from ...options import TrainConfig

GRID_FILES = {"paper": shipped("runs/paper/grids.csv"), "cpu": shipped("runs/cpu_grids.csv"),
              "gpu": shipped("runs/gpu_grids.csv"), "prose": shipped("runs/prose_grids.csv"),
              "prose3": shipped("runs/prose3_grids.csv")}
# study name -> (grid file key, study column value, preset)
STUDIES = {
    "paper-main": ("paper", "main", "paper"),
    "paper-truncated": ("paper", "truncated_bptt", "paper"),
    "paper-hyper": ("paper", "hyperconnections", "paper"),
    # Our CPU study in the law's regime and its case studies (runs/prose_grids.csv).
    "cpu-main": ("prose", "main", "prose"),
    "cpu-truncated": ("prose", "truncated_bptt", "prose"),
    "cpu-hyper": ("prose", "hyperconnections", "prose"),
    "cpu-smoke": ("cpu", "smoke", "cpu"),
    "gpu-main": ("gpu", "main", "paper"),
    # one GPU's case studies: the paper's protocol on gpu-main's two lower budgets
    "gpu-truncated": ("gpu", "truncated_bptt", "paper"),
    "gpu-hyper": ("gpu", "hyperconnections", "paper"),
    "prose-pilot": ("prose", "pilot", "prose"),
    "prose-lr": ("prose", "lr", "prose"),
    "prose-seeds": ("prose", "seeds", "prose"),
    "prose-batch": ("prose", "batch", "prose"),
    # Identification and noise: r = 1 controls for the case studies, truncated runs at their
    # pair's token count, seeds 43/44 (each with its own data order) in every arm, and two further
    # budgets (1.25e12 below the main four, 5e13 above).
    "cpu-controls": ("prose", "controls", "prose"),
    "cpu-matched": ("prose", "truncated_matched", "prose"),
    "cpu-replicates": ("prose", "replicates", "prose"),
    "cpu-drift": ("prose", "drift", "prose"),
    # Which r = 1 model anchors the hyperconnection comparison: the additive injection (u = s + e)
    # at r = 1 and 8 on cpu-hyper's points; and seed against data order (seed 43 under the fixed
    # order, seed 42 under a permuted one) at 8 replicated main-arm configurations.
    "cpu-additive": ("prose", "additive", "prose"),
    "cpu-order": ("prose", "order", "prose"),
    # The second CPU study, on corpus v3 (preset prose3; runs/prose3_grids.csv): the first study's
    # main, drift and case-study grids unchanged (phi on two corpora, like for like), a learning-rate
    # check, linear r = 1 controls at every main point (the main phi with either anchor), the
    # additive anchor, and seed x data order as a 2 x 2 design at 8 configurations.
    "cpu3-lr": ("prose3", "lr", "prose3"),
    "cpu3-main": ("prose3", "main", "prose3"),
    "cpu3-drift": ("prose3", "drift", "prose3"),
    "cpu3-controls": ("prose3", "controls", "prose3"),
    "cpu3-additive": ("prose3", "additive", "prose3"),
    "cpu3-replicates": ("prose3", "replicates", "prose3"),
    "cpu3-truncated": ("prose3", "truncated_bptt", "prose3"),
    "cpu3-matched": ("prose3", "truncated_matched", "prose3"),
    "cpu3-hyper": ("prose3", "hyperconnections", "prose3"),
}

CASE_STUDIES = {  # a main study -> its truncated-BPTT and hyperconnection case studies
    "cpu-main": ("cpu-truncated", "cpu-hyper"),
    "cpu3-main": ("cpu3-truncated", "cpu3-hyper"),
    "gpu-main": ("gpu-truncated", "gpu-hyper"),
    "paper-main": ("paper-truncated", "paper-hyper"),
}

# Our CPU studies come in families, one per corpus (cpu: corpus v2, cpu3: corpus v3); the part each
# study plays in the analyses, which take a family with `--family`.
FAMILIES = {
    "cpu": dict(corpus="v2", manifest="prose-corpus.json", lr="prose-lr", main="cpu-main",
                drift="cpu-drift", controls="cpu-controls", additive="cpu-additive",
                replicates=("prose-seeds", "cpu-replicates", "cpu-order"),
                arms=("cpu-main", "cpu-truncated", "cpu-hyper", "cpu-controls", "cpu-matched", "cpu-replicates")),
    "cpu3": dict(corpus="v3", manifest="prose3-bpe2048-T128.json", lr="cpu3-lr", main="cpu3-main",
                 drift="cpu3-drift", controls="cpu3-controls", additive="cpu3-additive",
                 replicates=("cpu3-replicates",),
                 arms=("cpu3-main", "cpu3-truncated", "cpu3-hyper", "cpu3-controls", "cpu3-matched",
                       "cpu3-replicates")),
}   # corpus: its label in the book; manifest: its dataset's, under runs/; lr: its learning-rate check;
#     replicates: every replicate run; arms: the folders the case studies' paired estimators read
DEFAULT_FAMILY = "cpu3"   # the family the commands and the book read unless told otherwise

# An analysis's options whose defaults are a family's studies: option -> (part, several folders?, what)
FAMILY_OPTIONS = {"runs": ("main", False, "runs of the main fit"),
                  "seeds": ("replicates", True, "replicate runs (absent ones skipped)"),
                  "drift": ("drift", True, "runs at further budgets (absent or empty ones skipped)"),
                  "controls": ("controls", False, "the linear r = 1 controls (skipped when absent)"),
                  "additive": ("additive", False, "the additive-injection runs at r = 1 and 8 (skipped when absent)")}


def add_family_options(ap, *options: str) -> None:
    """--family, and each of `options` (`FAMILY_OPTIONS`) with the family's study as its default."""
    ap.add_argument("--family", choices=FAMILIES, default=DEFAULT_FAMILY,
                    help=f"the CPU studies whose runs are the defaults below: cpu (corpus v2) or cpu3 (corpus v3); "
                         f"default {DEFAULT_FAMILY}")
    for option in options:
        part, several, what = FAMILY_OPTIONS[option]
        ap.add_argument(f"--{option}", nargs="*" if several else None,
                        help=f"{what}: folder{'s' if several else ''} or CSV; default: the family's {part}")


def holds_records(path) -> bool:
    """A runs table (a file), or a folder with at least one run record: a study whose sweep has
    begun makes its folder (and checkpoints) before it finishes a run, and such a folder is absent."""
    p = Path(path)
    return p.is_file() or (p.is_dir() and any(p.glob("*.json")))


def family_defaults(a, *options: str) -> None:
    """Fill each of `options` left unset on the command line with the folders of `a.family`'s studies."""
    family = FAMILIES[a.family]
    for option in options:
        if getattr(a, option) is None:
            names = family[FAMILY_OPTIONS[option][0]]
            folders = [str(study_folder(n)) for n in ((names,) if isinstance(names, str) else names)]
            setattr(a, option, folders if FAMILY_OPTIONS[option][1] else folders[0])

class SweepError(RuntimeError):
    pass


@dataclass(frozen=True)
class Run:
    study: str
    preset: Preset  # resolved by load_study
    budget: float
    r: int
    s: float
    injection: str
    lanes: int
    bptt_k: int | None
    lr_scale: float | None = None  # optional grid column: an LR sweep's multiplier (None: the preset's)
    seed: int = DEFAULT_SEED  # optional grid column: a seed-noise study's seed
    batch_tokens: int | None = None  # optional grid column: tokens per step (None: the preset's)
    data_order: int | None = None  # optional grid column: seed of the data order (None: fixed order)
    match_tokens: bool = False  # optional grid column: train for the tokens the untruncated model
                                # gets at this budget (so a truncated run's pair differs only in N_eff)

    def train_config(self, **kw):
        return TrainConfig(preset=self.preset, r=self.r, s=self.s, injection=self.injection, lanes=self.lanes,
                           bptt_k=self.bptt_k, budget=self.budget, steps=self.steps, study=self.study,
                           lr_scale=self.lr_scale, seed=self.seed, batch_tokens=self.batch_tokens,
                           data_order=self.data_order, **kw)

    @property
    def steps(self) -> int | None:
        """Set only for matched-token runs: the steps of the same model with full backprop."""
        if not self.match_tokens:
            return None
        full = model_config(self.preset, r=self.r, s=self.s, injection=self.injection, lanes=self.lanes)
        return steps_for_budget(full, self.budget, self.tokens_per_step)

    def model_config(self):
        return model_config(self.preset, r=self.r, s=self.s, injection=self.injection, lanes=self.lanes,
                            bptt_k=self.bptt_k)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_tokens or self.preset.batch_tokens

    @property
    def run_id(self) -> str:
        return run_name(self.model_config(), self.budget, self.steps, lr_scale=self.lr_scale, seed=self.seed,
                        batch_tokens=self.batch_tokens, data_order=self.data_order)


def study_folder(name: str) -> Path:
    """The folder of a study's run records: runs/NAME in the repository (`looped.studies.sweep.study.Study.folder`'s
    default; the one place it is spelled)."""
    return REPO / "runs" / name


def analysis_file(name: str, family: str = DEFAULT_FAMILY) -> Path:
    """Where `looped NAME --family FAMILY` writes its results for the book (`make analysis`), committed:
    runs/analysis/FAMILY/NAME.json, NAME with underscores (the one place it is spelled)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose from {', '.join(FAMILIES)}")
    return REPO / "runs" / "analysis" / family / f"{name.replace('-', '_')}.json"


def parse_injection(name: str) -> tuple[str, int]:
    """Grid spelling -> (injection, lanes): 'hyperconnect_2lanes' -> ('hyperconnect', 2)."""
    if name.startswith("hyperconnect"):
        digits = "".join(ch for ch in name if ch.isdigit())
        return "hyperconnect", int(digits or 2)
    return name, 2


GRID_COLUMNS = ("study", "budget_flops", "r", "s", "injection", "bptt_k")
# + optional lr_scale, seed, batch_tokens, data_order, match_tokens


def load_study(name: str, grid: str | Path | None = None, preset: str | None = None) -> list[Run]:
    """The runs of a named study, trained with its own preset; or, with `grid` (a CSV with
    GRID_COLUMNS), the rows of that file whose study column is `name`, trained with `preset`
    (default cpu).  Every run carries the preset resolved here, the one look-up of its name."""
    if grid is None:
        if name not in STUDIES:
            raise SweepError(f"unknown study {name!r}; choose from {', '.join(STUDIES)}")
        key, column_value, own = STUDIES[name]
        if preset not in (None, own):
            raise SweepError(f"study {name} trains with preset {own!r}; --preset {preset} applies to --grid runs")
        grid, preset = GRID_FILES[key], own
    else:
        column_value, preset = name, preset or "cpu"
    preset = get_preset(preset)  # ConfigError for an unknown preset
    try:
        table = pd.read_csv(grid)
    except (OSError, ValueError) as e:
        raise SweepError(f"cannot read grid {grid}: {e}") from None
    missing = [c for c in GRID_COLUMNS if c not in table.columns]
    if missing:
        raise SweepError(f"grid {grid} lacks column(s) {', '.join(missing)}")
    rows = table[table.study == column_value]
    if rows.empty:
        raise SweepError(f"grid {grid} has no rows with study {column_value!r}")
    runs, lines = [], {}
    for row in rows.itertuples():
        line = row.Index + 2  # the file's line: the header is line 1

        def num(col, kind=float, low=None, optional=True):
            value = getattr(row, col, None)
            if optional and (value is None or (isinstance(value, float) and value != value)):
                return None
            try:
                x = float(value)
            except (TypeError, ValueError):
                raise SweepError(f"grid {grid}, line {line}: {col} {value!r} is not a number") from None
            if x != x or x in (float("inf"), float("-inf")):
                raise SweepError(f"grid {grid}, line {line}: {col} {value!r} is not a finite number")
            if kind is int and x != int(x):
                raise SweepError(f"grid {grid}, line {line}: {col} {value!r} is not a whole number")
            if low is not None and x < low or col in ("budget_flops", "s", "lr_scale") and x <= 0:
                raise SweepError(f"grid {grid}, line {line}: {col} {value!r} must be "
                                 + (f">= {low}" if low is not None else "positive"))
            return kind(x)

        if not isinstance(row.injection, str):
            raise SweepError(f"grid {grid}, line {line}: injection {row.injection!r} is not a name")
        injection, lanes = parse_injection(row.injection)
        r_, k = num("r", int, 1, False), num("bptt_k", int, 1, False)
        extra = {key: value for key, value in (
            ("lr_scale", num("lr_scale")), ("seed", num("seed", int, 0)), ("batch_tokens", num("batch_tokens", int, 1)),
            ("data_order", num("data_order", int, 0)), ("match_tokens", num("match_tokens", int, 0)))
            if value is not None}
        if "match_tokens" in extra:
            extra["match_tokens"] = bool(extra["match_tokens"])
        run = Run(name, preset, num("budget_flops", float, None, False), r_, num("s", float, None, False), injection,
                  lanes, None if k >= r_ else k, **extra)
        if run in lines:
            raise SweepError(f"grid {grid}, lines {lines[run]} and {line} are the same run")
        lines[run] = line
        runs.append(run)
    # Records are keyed by run_id (budget to 3 significant digits): two different rows with one
    # id would silently share a record, the second skipped as done.  This also validates every
    # row's architecture (ConfigError) before anything runs.
    seen: dict[str, Run] = {}
    for run in runs:
        other = seen.setdefault(run.run_id, run)
        if other != run:
            raise SweepError(f"grid rows {other} and {run} share the run id {run.run_id!r}")
    return runs
