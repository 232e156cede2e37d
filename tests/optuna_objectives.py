"""Objectives as Optuna users write them, for the tests of Optuna's contract through `optimize`."""

from __future__ import annotations


def quadratic(trial, device) -> float:
    x = trial.suggest_float("x", -5.0, 5.0)
    trial.report((x - 1.0) ** 2 + 1.0, 0)
    return (x - 1.0) ** 2


def two_values(trial, device) -> tuple[float, float]:
    """Two objectives that pull apart: the front is x in [0, 2]."""
    x = trial.suggest_float("x", -5.0, 5.0)
    return x**2, (x - 2.0) ** 2


def draws_its_own_batch(trial, device) -> float:
    batch = trial.suggest_int("batch_size", 16, 128)
    return float(batch)
