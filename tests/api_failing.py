"""Objectives as Optuna users write them, some of them wrong: what `optimize` must raise."""

from __future__ import annotations


class NotConverging(Exception):
    """An error type of the user's own module."""


def one_argument(trial) -> float:
    x = trial.suggest_float("x", -5.0, 5.0)
    return (x - 1.0) ** 2


def always_raises(trial, device) -> float:
    trial.suggest_float("x", -5.0, 5.0)
    raise NotConverging(f"loss went to nan at step {trial.number}")


def raises_value_error_on_even(trial, device) -> float:
    x = trial.suggest_float("x", -5.0, 5.0)
    if trial.number % 2 == 0:
        raise ValueError("even trials fail")
    return x


def two_objectives_reporting(trial, device):
    x = trial.suggest_float("x", -5.0, 5.0)
    trial.report(x, 0)
    return x, -x


def wrong_batch_range(trial, device) -> float:
    batch = trial.suggest_int("batch_size", 16, 128)
    return float(batch)
