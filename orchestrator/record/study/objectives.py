"""What a study optimises: its objectives' names and directions, and a trial's values for them.

A study optimises what its objective returns (one value, or a sequence of them with one
direction each) and, when it names them, what the orchestrator measures of every trial anyway:

- `vram_peak_mb`: the GPU memory the trial's process held at its peak, in MB;
- `seconds`: the trial's wall time, from ask to tell (optuna-dashboard's duration).

Both are minimised. `run dqn --objectives sharpe,vram_peak_mb,seconds` asks for the Pareto front
of quality against GPU memory and time. A trial that runs out of memory has no value, but it
did answer a question (these parameters do not fit): it is told COMPLETE as infeasible, its
metric the worst there is, with the constraint `fits_gpu_memory` violated (Optuna 5's
`trial.set_constraint`: a positive value is violated, zero is met; every trial of such a study
sets it), so the samplers that read constraints (NSGA-II, TPE) and `study.best_trials` rank it
below every trial that fitted instead of never seeing it.

These are pure functions: the trial runner calls `told` with what it measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

VRAM_PEAK_MB = "vram_peak_mb"
SECONDS = "seconds"
MEASURED = (VRAM_PEAK_MB, SECONDS)  # what every trial records: always minimised
CONSTRAINT = "fits_gpu_memory"  # the trial's constraint (Optuna 5's `trial.set_constraint`)
DIRECTIONS = ("minimize", "maximize")


@dataclass(frozen=True)
class Told:
    """What to tell the study about a trial: its state, its values, its constraint violation."""

    state: str  # a TrialState name
    values: float | list[float] | None
    violation: float | None = None  # None: no constraint; > 0: infeasible


def parse_names(text: str, what: str) -> list[str]:
    """`a,b,c` as a list of names, or a ValueError saying what is wrong."""
    names = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not name for name in names):
        raise ValueError(f"{what} {text!r}: give names separated by commas, as in sharpe,seconds")
    if len(set(names)) != len(names):
        raise ValueError(f"{what} {text!r}: each name once")
    return names


def check_directions(directions: Sequence[str]) -> list[str]:
    """The directions, lower-cased, or a ValueError naming the one that is neither."""
    out = [str(d).strip().lower() for d in directions]
    for given, direction in zip(directions, out, strict=True):
        if direction not in DIRECTIONS:
            raise ValueError(f"direction {given!r}: each one is minimize or maximize")
    if not out:
        raise ValueError("directions: give at least one, minimize or maximize")
    return out


def plan_objectives(
    objectives: Sequence[str] | None,
    directions: Sequence[str] | None,
    *,
    metric: str,
    direction: str,
) -> tuple[list[str], list[str]]:
    """The study's objective names and directions, or a ValueError saying what does not fit.

    `directions` are those of the values the objective returns (default: its one `direction`);
    `objectives` name every objective, the objective's own values first, in order, then any of
    MEASURED. Without `objectives`, one value is called `metric` and several `metric 0`, ...
    """
    own = check_directions(directions) if directions else [direction]
    if not objectives:
        if len(own) == 1:
            return [metric], own
        return [f"{metric} {i}" for i in range(len(own))], own
    names = list(objectives)
    measured = [name for name in names if name in MEASURED]
    returned = [name for name in names if name not in MEASURED]
    first_measured = min((names.index(m) for m in measured), default=len(names))
    unknown = [name for name in names[first_measured:] if name not in MEASURED]
    if unknown:
        raise ValueError(
            f"objectives {','.join(names)}: {unknown[0]!r} is neither the objective's value nor "
            f"one of {', '.join(MEASURED)}"
        )
    if names[: len(returned)] != returned:
        raise ValueError(
            f"objectives {','.join(names)}: name the objective's own values first, then "
            f"{' or '.join(MEASURED)}"
        )
    if len(returned) != len(own):
        expected = metric if len(own) == 1 else f"{len(own)} names"
        raise ValueError(
            f"objectives {','.join(names)}: the objective returns {len(own)} value(s), so "
            f"start with {expected} ({'/'.join(own)}), then any of {', '.join(MEASURED)}"
        )
    if len(own) == 1 and returned[0] != metric:
        raise ValueError(
            f"objectives {','.join(names)}: the objective's value is {metric!r}: "
            f"start with {metric}, then any of {', '.join(MEASURED)}"
        )
    return names, own + ["minimize"] * len(measured)


def measures(objectives: Sequence[str] | None) -> bool:
    """Does the study optimise something the orchestrator measures?"""
    return any(name in MEASURED for name in objectives or ())


def told(
    *,
    objectives: Sequence[str] | None,
    directions: Sequence[str],
    state: str,
    value: Any,
    oom: bool,
    vram_peak_mb: float | None,
    seconds: float,
) -> Told:
    """What the study is told of a trial that ended in `state` with `value` (one number or a
    sequence), having held `vram_peak_mb` for `seconds`; see the module's rules."""
    several = len(directions) > 1
    if oom and measures(objectives):
        own = [math.inf if d == "minimize" else -math.inf for d in directions]
        values = _with_measured(own, objectives, directions, vram_peak_mb, seconds)
        return Told("COMPLETE", values, violation=1.0)
    if state != "COMPLETE":
        return Told(state, None)
    returned = [float(v) for v in value] if isinstance(value, Sequence) else [float(value)]
    if not measures(objectives):
        return Told(state, returned if several else returned[0])
    values = _with_measured(returned, objectives, directions, vram_peak_mb, seconds)
    return Told(state, values, violation=0.0)


def _with_measured(
    own: list[float],
    objectives: Sequence[str] | None,
    directions: Sequence[str],
    vram_peak_mb: float | None,
    seconds: float,
) -> list[float]:
    measured = {VRAM_PEAK_MB: float(vram_peak_mb or 0.0), SECONDS: float(seconds)}
    names = list(objectives or ())
    returned = own[: len(directions) - sum(1 for n in names if n in MEASURED)]
    return returned + [measured[name] for name in names if name in MEASURED]


def objective_value(value: Any) -> float | list[float]:
    """An objective's result as Optuna takes it: one float, or a list of floats."""
    several = several_values(value)
    return float(value) if several is None else several


def several_values(value: Any) -> list[float] | None:
    """The values of an objective that returned a sequence (a tuple, a list, an array); None
    for one number."""
    if isinstance(value, str | bytes) or not hasattr(value, "__len__"):
        return None
    if getattr(value, "ndim", 1) == 0:  # a numpy or torch scalar
        return None
    return [float(v) for v in value]


def unpruned_reporter(trial_number: int) -> Any:
    """The per-epoch `report` for a study of several objectives: Optuna keeps no intermediate
    values there (`trial.report` raises) and no pruner judges, so each epoch's value is a line
    in the trial's log instead."""

    def report(epoch: int, value: float) -> None:
        print(f"trial {trial_number} epoch {epoch}: {value:.6g}", flush=True)

    report.flush = lambda: None  # type: ignore[attr-defined]
    return report
