"""One trial's training run with several seeds, scored on their mean.

One training run of an RL agent says little: the same parameters, retrained with another seed,
can score anywhere from good to below zero. `--repeats N` trains a trial's parameters N times,
with the adapter's `seed` option set to seed, seed + 1, ..., seed + N - 1, and the trial's value
is the mean: that is what the sampler sees. Each seed's score and the spread are kept with the
trial.

The pruner sees the mean too: the first N - 1 runs keep what they report to themselves, and the
last run reports, at each step, the mean of every run's value at that step. So a trial can only
be pruned during its last run: pruning saves less, but never judges a trial on one seed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from adapters.base import Report
from orchestrator.errors import UserError

MAX_REPEATS = 100
# The trial user attributes a repeated trial keeps: each seed's score (seed order), their spread.
REPEAT_VALUES_ATTR = "repeat_values"
REPEAT_STD_ATTR = "repeat_std"


@dataclass
class Repeated:
    """What the runs of one trial scored: the mean is the trial's value."""

    values: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float:
        """The population standard deviation over seeds (0 for one run)."""
        return statistics.pstdev(self.values) if len(self.values) > 1 else 0.0


def check_repeats(adapter: Any, repeats: int) -> None:
    """A one-line UserError unless `repeats` runs of `adapter` can differ by their seed."""
    if not 1 <= repeats <= MAX_REPEATS:
        raise UserError(f"--repeats {repeats} must be from 1 to {MAX_REPEATS}")
    if repeats > 1 and "seed" not in (getattr(adapter, "options", None) or {}):
        raise UserError(
            f"--repeats {repeats} needs an adapter with a `seed` option, and {adapter.name!r} "
            "has none: give it `options = {'seed': 0}` and seed its training with it"
        )


def seeded(options: Mapping[str, Any], offset: int) -> dict[str, Any]:
    """The options of the run `offset` seeds after the study's own."""
    return {**options, "seed": int(options.get("seed", 0)) + offset}


def train_repeated(
    train: Callable[..., float],
    params: Mapping[str, Any],
    *,
    repeats: int,
    epochs: int,
    device: Any,
    options: Mapping[str, Any],
    report: Report,
) -> Repeated:
    """`repeats` runs of `train` (an adapter's), the last one reporting the mean at each step."""
    if repeats == 1:
        value = train(params, epochs=epochs, device=device, options=options, report=report)
        return Repeated([float(value)])
    earlier: list[dict[int, float]] = []
    result = Repeated()
    for offset in range(repeats):
        steps: dict[int, float] = {}
        last = offset == repeats - 1

        def record(
            step: int, value: float, steps: dict[int, float] = steps, last: bool = last
        ) -> None:
            steps[step] = value
            if last:
                seen = [run[step] for run in earlier if step in run] + [value]
                report(step, statistics.fmean(seen))

        value = train(
            params, epochs=epochs, device=device, options=seeded(options, offset), report=record
        )
        result.values.append(float(value))
        earlier.append(steps)
        if not math.isfinite(result.values[-1]):
            break  # a mean with NaN or infinity in it says nothing more after more runs
    return result
