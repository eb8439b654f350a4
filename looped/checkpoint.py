"""A training run's checkpoints: when they are due, and writing and reading them.

A checkpoint is due every `steps` optimizer steps or every `seconds` of training since the last
one, whichever comes first (0 turns a measure off).  Steps suit the CPU, where they are slow and
its sweeps have always checkpointed every 25; time suits a GPU, where 25 steps take 4-30 s and
a synchronous save that often would cost a study hours, so the GPU default is every 10 minutes.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from .io import atomic_open
from .options import TrainConfig, TrainError

DEFAULT_STEPS = {"cpu": 25, "cuda": 0}
DEFAULT_SECONDS = {"cpu": 0.0, "cuda": 600.0}


def now() -> float:
    """The cadence's clock (tests replace it)."""
    return time.perf_counter()


class Cadence:
    """When the next checkpoint is due: every `steps` steps, every `seconds` of training."""

    def __init__(self, steps: int, seconds: float):
        self.steps, self.seconds = steps, seconds
        self.since = now()

    @classmethod
    def of(cls, tc: TrainConfig, device: torch.device) -> Cadence:
        """The run's cadence: its own settings, else the device's defaults."""
        kind = "cuda" if device.type == "cuda" else "cpu"
        steps = DEFAULT_STEPS[kind] if tc.checkpoint_every is None else tc.checkpoint_every
        seconds = DEFAULT_SECONDS[kind] if tc.checkpoint_seconds is None else tc.checkpoint_seconds
        return cls(steps, seconds)

    def time_due(self) -> bool:
        return bool(self.seconds) and now() - self.since >= self.seconds

    def due(self, done: int, time_due: bool) -> bool:
        """After `done` steps; `time_due` is time_due() as every process agreed on it."""
        return time_due or bool(self.steps) and done % self.steps == 0

    def saved(self):
        self.since = now()


def save_checkpoint(path: Path, model, optimizers, step: int, state: dict):
    """Written straight to a temporary file, then renamed: no second copy in host memory."""
    with atomic_open(path) as f:
        torch.save({"model": model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
                    "step": step, "state": state}, f)


def load_checkpoint(path: Path, model, optimizers, expect: dict) -> tuple[int, dict]:
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
        if ck["state"]["run"] != expect:
            raise TrainError(f"checkpoint {path} belongs to a different run configuration; "
                             "delete it or pass another --checkpoint")
        model.load_state_dict(ck["model"])
        for o, sd in zip(optimizers, ck["optimizers"], strict=True):
            o.load_state_dict(sd)
        return int(ck["step"]), ck["state"]
    except TrainError:
        raise
    except Exception as e:  # a truncated or foreign file: say so, never train from garbage
        raise TrainError(f"checkpoint {path} is unreadable ({type(e).__name__}); "
                         "delete it to restart the run") from None
