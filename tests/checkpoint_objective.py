"""A plain Optuna objective that checkpoints through the handle `orchestrator.optimize` gives
as its third argument: its epoch and running total, so a re-run goes on where it was."""

from __future__ import annotations

EPOCHS = 3


def objective(trial, device, checkpoint) -> float:
    x = trial.suggest_float("x", -5.0, 5.0)
    state = checkpoint.load() or {"epoch": -1, "total": 0.0}
    total = state["total"]
    for epoch in range(state["epoch"] + 1, EPOCHS):
        total += (x - 1.0) ** 2
        trial.report(total, epoch)
        checkpoint.save(epoch, {"epoch": epoch, "total": total})
    return total


def objective_saving_first(trial, device, checkpoint) -> float:
    """The same, saving each epoch before reporting it."""
    x = trial.suggest_float("x", -5.0, 5.0)
    state = checkpoint.load() or {"epoch": -1, "total": 0.0}
    total = state["total"]
    for epoch in range(state["epoch"] + 1, EPOCHS):
        total += (x - 1.0) ** 2
        checkpoint.save(epoch, {"epoch": epoch, "total": total})
        trial.report(total, epoch)
    return total
