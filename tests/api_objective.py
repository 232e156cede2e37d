"""A plain Optuna objective, as a user has one: what `orchestrator.optimize` is tested with."""

from __future__ import annotations


def objective(trial, device) -> float:
    x = trial.suggest_float("x", -5.0, 5.0)
    batch = trial.suggest_int("batch_size", 64, 4096, log=True)
    print(f"objective: x={x:.3f} batch={batch} on {device}")
    for epoch in range(2):
        trial.report((x - 1.0) ** 2 + 1.0 - epoch, epoch)
    return (x - 1.0) ** 2
