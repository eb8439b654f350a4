"""The options of one training run, defined once: `TrainConfig`.

Every field carries its help text and `cli`, where it is a command-line option: "train" (a
`looped train` flag), "sweep" (also a `looped sweep` flag passed to every run, and so written
into its SLURM script) or None (set by code: the sweep itself, the tests).  `add_options` builds
the argparse flags from the fields, `given_options` reads back the flags that were given (a flag
not given leaves the field's default in force) and `option_argv` writes options back as flags.
Free of torch, so that `looped sweep` sets up CUDA's allocator before torch is imported.
"""
from __future__ import annotations

import argparse
import math
import sys
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .config import DEFAULT_SEED, ConfigError, Preset, get_preset, model_config, run_name, size_note


class TrainError(RuntimeError):
    """A run that cannot start or continue (bad checkpoint, existing record, too little data)."""


def option(default, help: str, cli: str | None = "train", flags: tuple[str, ...] = ()):
    return field(default=default, metadata={"help": help, "cli": cli, "flags": flags})


@dataclass
class TrainConfig:
    preset: str | Preset = option("cpu", "model and data preset (cpu, prose, paper, tiny); held resolved")
    r: int = option(1, "recurrences per forward pass (under torchrun spell it --recurrences: torchrun "
                       "rejects --r as an ambiguous abbreviation of its own options)", flags=("--r", "--recurrences"))
    s: float = option(8, "size knob: the width d_model grows with s", flags=("--size", "-s"))
    injection: str | None = option(None, "none, linear, additive, passthrough or hyperconnect "
                                         "(default: none for r = 1, else linear)")
    lanes: int = option(2, "hyperconnection lanes")
    bptt_k: int | None = option(None, "backpropagate through the last k recurrences only (default: all)")
    budget: float | None = option(None, "training FLOPs; or give --steps")
    steps: int | None = option(None, "optimizer steps; with --budget too, the budget only names the cell")
    batch_tokens: int | None = option(None, "tokens per optimizer step (default: the preset's)")
    micro_batch: int | None = option(None, "rows per forward pass per process (default: the whole batch on "
                                            "the CPU; on a GPU looped.memory's choice for its free memory, the "
                                            "one `looped sweep --dry-run` prints, halved on out-of-memory)", "sweep")
    seed: int = option(DEFAULT_SEED, "seed of the initialisation")
    data_order: int | None = option(None, "seed a permutation of the run's step blocks (default: the fixed "
                                          "row order every run reads)")
    lr_scale: float | None = option(None, "multiplier on HyperP's learning rates (default: the preset's, 1 "
                                          "but where an LR sweep re-based it)")
    out: str | None = option(None, "run record path (JSON); none: no record")
    study: str = option("adhoc", "study name written into the record")
    checkpoint: str | None = option(None, "checkpoint path (default: ckpt/NAME.pt beside the record)")
    checkpoint_every: int | None = option(None, "optimizer steps between checkpoints, 0: none by steps "
                                                "(default: 25 on the CPU, 0 on a GPU)", "sweep")
    checkpoint_seconds: float | None = option(None, "seconds of training between checkpoints, 0: none by "
                                                    "time (default: 600 on a GPU, 0 on the CPU)", "sweep")
    resume: bool = option(True, "continue from the checkpoint if one exists")
    overwrite: bool = option(False, "replace an existing record")
    eval_tokens: int | None = option(None, "validation tokens of the final loss (default: the preset's)")
    log_every: int = option(10, "steps between points of the recorded loss curve")
    compile: bool = option(True, "the fast path: torch.compile + batched optimizers; --no-compile runs the "
                                 "plain eager reference step (also the fallback where inductor cannot "
                                 "compile)", "sweep")
    data_dir: str | None = option(None, "folder of prepared datasets (default: $LOOPED_DATA or data/)", "sweep")
    quiet: bool = option(False, "no progress bar")
    peak_flops: float | None = option(None, "MFU denominator in FLOP/s (default: a known GPU's spec, else "
                                            "a measured matmul)", "sweep")
    stop_after: int | None = option(None, "stop (as if killed) after this many steps: for tests", None)

    def __post_init__(self):
        """What can be checked before anything is built: every bad value is a ConfigError (one
        line, exit 2 on the command line), never a default put in its place.  A preset given by
        name (the command line) is looked up here, once: the options hold the Preset itself."""
        self.preset = get_preset(self.preset)
        by_name = {f.name: f for f in fields(self)}
        for name, low, strict in LIMITS:
            value = getattr(self, name)
            if value is None:
                continue
            flag = flags(by_name[name])[0]
            if not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ConfigError(f"{flag} must be a finite number, got {value!r}")
            if value < low or strict and value == low:
                raise ConfigError(f"{flag} must be {'>' if strict else '>='} {low:g}, got {value:g}")
        if self.micro_batch is not None and not (self.micro_batch >= 1 and self.micro_batch == int(self.micro_batch)):
            raise ConfigError(f"--micro-batch must be >= 1, got {self.micro_batch!r}: a step's rows do not split "
                              "into micro-batches of that size (leave it out for the automatic one)")
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            if Path(self.data_dir).exists():
                raise ConfigError(f"--data-dir {self.data_dir} is not a folder")
            raise ConfigError(f"--data-dir {self.data_dir} does not exist (a mistyped path would build a new "
                              f"dataset there): create it, or `looped data prepare --preset {self.preset.name} "
                              f"--data-dir {self.data_dir}`")
        note = size_note(self.preset, self.s)
        if note:  # not silently: the record keeps s, with the d_model it trained
            print(f"looped: warning: {note}; the record keeps s {self.s:g} with that d_model", file=sys.stderr)

    def to_dict(self) -> dict:
        """The options as a run record writes them, the preset by its name."""
        return {**asdict(self), "preset": self.preset.name}

    def model_config(self):
        return model_config(self.preset, r=self.r, s=self.s, injection=self.injection,
                            lanes=self.lanes, bptt_k=self.bptt_k)


# (field, lowest value, whether the lowest value itself is refused): the numeric options' ranges
LIMITS = (("r", 1, False), ("s", 0, True), ("lanes", 1, False), ("bptt_k", 1, False), ("budget", 0, True),
          ("steps", 1, False), ("batch_tokens", 1, False), ("seed", 0, False),
          ("data_order", 0, False), ("lr_scale", 0, True), ("checkpoint_every", 0, False),
          ("checkpoint_seconds", 0, False), ("eval_tokens", 1, False), ("log_every", 1, False),
          ("peak_flops", 0, True), ("stop_after", 1, False))


def run_id(tc: TrainConfig) -> str:
    """A readable, unique name for a run within a study."""
    return run_name(tc.model_config(), tc.budget, tc.steps, tc.lr_scale, tc.seed, tc.batch_tokens, tc.data_order)


def cli_fields(passthrough: bool = False) -> list:
    """The user-facing fields: all of them (`looped train`), or those `looped sweep` passes on."""
    return [f for f in fields(TrainConfig) if f.metadata["cli"] in (("sweep",) if passthrough else ("train", "sweep"))]


def flags(f) -> tuple[str, ...]:
    return f.metadata["flags"] or ("--" + f.name.replace("_", "-"),)


def add_options(ap, passthrough: bool = False):
    """The fields as flags on `ap` (a parser or an argument group); see cli_fields."""
    hints = typing.get_type_hints(TrainConfig)
    for f in cli_fields(passthrough):
        kind = next(t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None))
        shown = "" if f.default is None else f" (default: {f.default})"
        kw = (dict(action=argparse.BooleanOptionalAction) if kind is bool
              else dict(type=kind, metavar=f.name.upper()))
        ap.add_argument(*flags(f), dest=f.name, default=argparse.SUPPRESS, help=f.metadata["help"] + shown, **kw)


def given_options(namespace: argparse.Namespace, passthrough: bool = False) -> dict:
    """The options (of cli_fields) a parsed command line set: a flag not given is absent here too."""
    return {f.name: getattr(namespace, f.name) for f in cli_fields(passthrough) if hasattr(namespace, f.name)}


def option_argv(options: dict) -> list[str]:
    """`options` (field -> value) as the flags that set them: what a SLURM script passes on."""
    by_name, argv = {f.name: f for f in fields(TrainConfig)}, []
    for name, value in options.items():
        flag = flags(by_name[name])[0]
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv
