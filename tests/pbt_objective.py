"""An objective of three arguments that checkpoints its state: population-based training's test.

Its "model" is one number that moves towards 1 by `lr` each epoch; what it saves is that number
and the epoch, so a segment that went on from a checkpoint shows it in its first report.
"""

from __future__ import annotations


def objective(trial, device, checkpoint) -> float:
    lr = trial.suggest_float("lr", 0.01, 0.5, log=True)
    trial.suggest_int("batch_size", 64, 1024, log=True)
    state = checkpoint.load() or {"epoch": -1, "w": 0.0}
    w = state["w"]
    value = 1.0 - w
    for epoch in range(state["epoch"] + 1, 3):
        w += (1.0 - w) * lr
        value = 1.0 - w
        # Reported first: a segment's handle ends the trial at the save of its last epoch, with
        # the value reported there.
        trial.report(value, epoch)
        checkpoint.save(epoch, {"epoch": epoch, "w": w})
    return value
