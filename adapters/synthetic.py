"""A known objective with a chosen duration and memory model: try and test the orchestrator in seconds.

The value is a shifted quadratic bowl over a few parameters of every kind the samplers handle
(linear and log floats, a log-scale int `batch_size`, a categorical), so the optimum is known:
x=1, y=-2, learning_rate=1e-3, batch_size=512, activation="gelu" gives 0. One trial sleeps
`trial_seconds` in total, split over its epochs, and reports a value per epoch that approaches
the final one, so pruners have something to work with; `noise` adds a seeded draw to each.

It checkpoints its epoch and its random generator after each epoch (through the handle,
docs/checkpoints.md), so a resume can be tried in seconds: a resumed trial reports the curve an
uninterrupted one would have.

With `--fuse N` it trains up to N trials of one activation together (`train_fused`,
docs/fused.md): one pause per epoch for the whole group, each member reporting, pruned and
checkpointed on its own.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from adapters.base import (
    BATCH_SIZE_MAX,
    BATCH_SIZE_MIN,
    SEED_MAX,
    BaseAdapter,
    MemoryModel,
    Range,
    Report,
)
from orchestrator.errors import UserError

if TYPE_CHECKING:
    import optuna

ACTIVATION_PENALTY = {"gelu": 0.0, "relu": 0.5, "tanh": 1.0}


def synthetic_value(params: Mapping[str, Any]) -> float:
    """The objective itself: 0 at the optimum, larger everywhere else."""
    return (
        (params["x"] - 1.0) ** 2
        + (params["y"] + 2.0) ** 2
        + (math.log10(params["learning_rate"]) + 3.0) ** 2
        + 0.1 * (math.log2(params["batch_size"]) - 9.0) ** 2
        + ACTIVATION_PENALTY[params["activation"]]
    )


class SyntheticAdapter(BaseAdapter):
    name = "synthetic"
    workload_class = "supervised"  # GPU-bound in the planner's eyes: not capped by CPU cores
    model_overhead_mb = 500.0
    per_sample_mb = 0.02
    direction = "minimize"
    metric = "loss"
    description = "a known quadratic objective with a chosen trial duration and memory model"
    uses_torch = False  # it sleeps: its trial processes need not import torch
    options = {
        "trial_seconds": 0.5,
        "overhead_mb": 500.0,
        "per_sample_mb": 0.02,
        "context_mb": 0.0,  # of overhead_mb, what a process pays once (a fused group: once)
        "noise": 0.0,
    }
    option_ranges = {
        "trial_seconds": Range(0, 86_400),  # a sleep: negative is an error, a day is plenty
        "noise": Range(0),
        "overhead_mb": Range(0),
        "per_sample_mb": Range(0),
        "context_mb": Range(0),
    }
    default_params = {
        "x": 0.0,
        "y": 0.0,
        "learning_rate": 1e-2,
        "batch_size": 256,
        "activation": "relu",
    }

    def memory_model(self, options: Mapping[str, Any]) -> MemoryModel:
        return MemoryModel(
            float(options.get("overhead_mb", self.model_overhead_mb)),
            float(options.get("per_sample_mb", self.per_sample_mb)),
            float(options.get("context_mb", 0.0)),
        )

    def check_options(self, options: Mapping[str, Any]) -> None:
        overhead = float(options.get("overhead_mb", self.model_overhead_mb))
        if float(options.get("context_mb", 0.0)) > overhead:
            raise UserError(
                f"--option context_mb={options['context_mb']:g} is more than overhead_mb="
                f"{overhead:g}, of which it is a part: give a context_mb of at most overhead_mb"
            )

    def suggest(self, trial: optuna.Trial, options: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "x": trial.suggest_float("x", -5.0, 5.0),
            "y": trial.suggest_float("y", -5.0, 5.0),
            "learning_rate": trial.suggest_float("learning_rate", 1e-5, 1e-1, log=True),
            "batch_size": trial.suggest_int("batch_size", BATCH_SIZE_MIN, BATCH_SIZE_MAX, log=True),
            "activation": trial.suggest_categorical("activation", list(ACTIVATION_PENALTY)),
        }

    def train(
        self,
        params: Mapping[str, Any],
        *,
        epochs: int,
        device: str,  # its name: this adapter uses no torch
        options: Mapping[str, Any],
        report: Report,
        checkpoint: Any = None,
    ) -> float:
        final = synthetic_value(params)
        epochs = max(1, epochs)
        pause = float(options.get("trial_seconds", 0.0)) / epochs
        noise = float(options.get("noise", 0.0))
        rng = random.Random(params_seed(params))
        start = 0
        state = None if checkpoint is None else checkpoint.load()
        if state is not None:  # go on after the saved epoch, with the generator as it was
            start = int(state["epoch"]) + 1
            version, internal, gauss = state["rng"]
            rng.setstate((version, tuple(internal), gauss))
        for epoch in range(start, epochs):
            time.sleep(pause)
            # Converges to the final value from above, like a loss curve.
            value = final + (epochs - 1 - epoch) / epochs + noise * rng.gauss(0.0, 1.0)
            report(epoch, value)  # first: a checkpoint's epoch is always one the trial reported
            if checkpoint is not None:
                checkpoint.save(epoch, {"epoch": epoch, "rng": list(rng.getstate())})
        return final

    def fuse_key(self, params: Mapping[str, Any]) -> Any:
        """Which trials may train fused: those of one activation (its stand-in for a shape)."""
        return params["activation"]

    def train_fused(
        self,
        members: Sequence[Any],
        *,
        epochs: int,
        device: str,
        options: Mapping[str, Any],
    ) -> list[float | BaseException]:
        """Train several trials together, one epoch at a time: each epoch's pause is paid once
        for the group (what fusing buys), then each member reports its own value and saves its
        own checkpoint. A member whose report raises (pruned) leaves; the others go on. Each
        member's curve is the one `train` would report for it alone."""
        epochs = max(1, epochs)
        pause = float(options.get("trial_seconds", 0.0)) / epochs
        noise = float(options.get("noise", 0.0))
        runs = [_Run.start(member, epochs) for member in members]
        for epoch in range(min(run.epoch for run in runs), epochs):
            if all(run.entry is not None for run in runs):
                break  # every member was pruned or failed: nothing left to train
            time.sleep(pause)
            for run in runs:
                if run.entry is None and run.epoch <= epoch:
                    run.step(epoch, epochs, noise)
        return [run.final if run.entry is None else run.entry for run in runs]


class _Run:
    """One member of a fused group: its target, its generator and where it stands."""

    def __init__(self, member: Any, final: float, rng: random.Random, epoch: int) -> None:
        self.member, self.final, self.rng, self.epoch = member, final, rng, epoch
        self.entry: BaseException | None = None  # what ended it early

    @classmethod
    def start(cls, member: Any, epochs: int) -> _Run:
        """From scratch, or after its checkpoint's epoch with the generator as it was."""
        rng = random.Random(params_seed(member.params))
        state = None if member.checkpoint is None else member.checkpoint.load()
        start = 0
        if state is not None:
            start = int(state["epoch"]) + 1
            version, internal, gauss = state["rng"]
            rng.setstate((version, tuple(internal), gauss))
        return cls(member, synthetic_value(member.params), rng, start)

    def step(self, epoch: int, epochs: int, noise: float) -> None:
        value = self.final + (epochs - 1 - epoch) / epochs + noise * self.rng.gauss(0.0, 1.0)
        try:
            self.member.report(epoch, value)
            if self.member.checkpoint is not None:
                self.member.checkpoint.save(
                    epoch, {"epoch": epoch, "rng": list(self.rng.getstate())}
                )
        except Exception as error:  # optuna.TrialPruned among them: this member alone ends
            self.entry = error
        self.epoch = epoch + 1


def params_seed(params: Mapping[str, Any]) -> int:
    """A seed from the parameters: the same trial draws the same noise on any node."""
    text = json.dumps(dict(params), sort_keys=True, default=str)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") % SEED_MAX


adapter = SyntheticAdapter()
