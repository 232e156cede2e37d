"""The `tft` adapter's data: a price series' returns cut into training and held-out windows.

The prices are the trading environment's (synthetic by default, `--data prices.csv` with a
`close` column otherwise). Their log returns are standardised by the training part alone; the
first part of the series trains, the later fifth is held out, and an input window never crosses
the split. Batches draw windows from one shuffle after another, so every batch has the size the
planner sized its memory for.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from adapters.envs.prices import load_prices, synthetic_prices
from orchestrator.errors import UserError
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import numpy as np
    import torch
else:
    np = LazyImport("numpy")
    torch = LazyImport("torch")

VALIDATION_FRACTION = 0.2  # the later fifth of the series is held out


def load_close_prices(data: str, steps: int, seed: int) -> np.ndarray:
    """The trading environment's prices: the `close` column of the CSV at `data`, else its
    seeded regime-switching synthetic series of `steps` prices (see adapters/envs/prices.py)."""
    if data:
        return load_prices(data)
    return synthetic_prices(steps, seed=seed)


def standardised_returns(prices: np.ndarray) -> np.ndarray:
    """Log returns scaled by the training part's standard deviation (no peeking ahead)."""
    returns = np.diff(np.log(prices))
    train_end = int(len(returns) * (1.0 - VALIDATION_FRACTION))
    train = returns[:train_end]
    scale = float(train.std()) or 1.0
    return ((returns - float(train.mean())) / scale).astype(np.float32)


def split_windows(length: int, window: int, horizon: int) -> tuple[list[int], list[int]]:
    """Window start indices: training targets lie before the split, validation inputs after it."""
    span = window + horizon
    split = int(length * (1.0 - VALIDATION_FRACTION))
    train = list(range(0, split - span + 1))
    val = list(range(split, length - span + 1))
    if len(train) < 1 or len(val) < 1:
        raise UserError(
            f"the series has {length + 1} prices: too short for window {window} + horizon "
            f"{horizon}; give --option steps=4000 or a longer --data file"
        )
    return train, val


def windows_fit(length: int, window: int, horizon: int) -> bool:
    """Whether `length` returns give a training window and a held-out one (see split_windows)."""
    try:
        split_windows(length, window, horizon)
    except UserError:
        return False
    return True


def steps_per_epoch(windows: int, batch_size: int) -> int:
    """Gradient steps in one epoch: the fewest full batches that see every training window.

    Every step uses exactly `batch_size` windows, as the planner assumed when it sized the
    trial's memory, so a batch larger than the series repeats windows within the step. An epoch
    is then about one pass over the data (one step when the batch holds them all): comparable
    work for every batch size, and the pruner compares trials at comparable points.
    """
    return max(1, math.ceil(windows / batch_size))


class ShuffledStream:
    """Window indices from one shuffle after another, wrapping around: batches take the next
    `n`, crossing from one shuffle into the next (and epochs with it), so no batch is short
    and every window is used equally often."""

    def __init__(self, windows: int, seed: int) -> None:
        self.windows = windows
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.pending = torch.empty(0, dtype=torch.long)

    def take(self, n: int) -> torch.Tensor:
        if len(self.pending) < n:
            shuffles = -(-(n - len(self.pending)) // self.windows)
            fresh = [
                torch.randperm(self.windows, generator=self.generator) for _ in range(shuffles)
            ]
            self.pending = torch.cat([self.pending, *fresh])
        taken, self.pending = self.pending[:n], self.pending[n:]
        return taken
