"""A known objective with a chosen duration and memory model: try and test the orchestrator in seconds.

The value is a shifted quadratic bowl over a few parameters of every kind the samplers handle
(linear and log floats, a log-scale int `batch_size`, a categorical), so the optimum is known:
x=1, y=-2, learning_rate=1e-3, batch_size=512, activation="gelu" gives 0. One trial sleeps
`trial_seconds` in total, split over its epochs, and reports a value per epoch that approaches
the final one, so pruners have something to work with.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from adapters.base import (
    BATCH_SIZE_MAX,
    BATCH_SIZE_MIN,
    BaseAdapter,
    MemoryModel,
    Range,
    Report,
)

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
    options = {"trial_seconds": 0.5, "overhead_mb": 500.0, "per_sample_mb": 0.02}
    option_ranges = {
        "trial_seconds": Range(0, 86_400),  # a sleep: negative is an error, a day is plenty
        "overhead_mb": Range(0),
        "per_sample_mb": Range(0),
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
    ) -> float:
        final = synthetic_value(params)
        epochs = max(1, epochs)
        pause = float(options.get("trial_seconds", 0.0)) / epochs
        for epoch in range(epochs):
            time.sleep(pause)
            # Converges to the final value from above, like a loss curve.
            report(epoch, final + (epochs - 1 - epoch) / epochs)
        return final


adapter = SyntheticAdapter()
