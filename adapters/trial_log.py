"""The lines a built-in adapter writes to its trial's log: one per evaluation, one for the value.

A trial's stdout is its log file (`orchestrator.record.trials.logs`), read with
`python -m orchestrator logs --study S --trial N`. What a person wants there is how the score
moved and how long it took, not every batch: so one line each time the trial reports a score
(the step Optuna stores it under, the score, the seconds since the trial started, what the
adapter did meanwhile) and a last line with the value the trial returns.
"""

from __future__ import annotations

import math
import re

# A line of one member of a fused group: "member K: TEXT", K its place in `train_fused`'s list.
# The pool writes TEXT to that member's own log (orchestrator/run/trial/member_logs.py).
MEMBER_LINE = re.compile(r"member (\d+): (.*)", re.DOTALL)


def _score(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else str(value)


def evaluation_line(step: int, metric: str, value: float, seconds: float, done: str = "") -> str:
    """`step 2: sharpe 0.41 after 36,000 env steps (4.2 s)`."""
    after = f" after {done}" if done else ""
    return f"step {step}: {metric} {_score(value)}{after} ({seconds:.1f} s)"


def value_line(metric: str, value: float, seconds: float, how: str = "") -> str:
    """`value: sharpe 0.41, the last epoch's (12.6 s)`: the trial's result, last in its log."""
    detail = f", {how}" if how else ""
    return f"value: {metric} {_score(value)}{detail} ({seconds:.1f} s)"


def write(line: str) -> None:
    """One line to the trial's log, at once (a trial that is killed keeps what it wrote)."""
    print(line, flush=True)


def write_member(index: int, line: str) -> None:
    """One line of a fused group's member `index` (its place in the members `train_fused` got):
    the pool puts it in that member's own log without the prefix; outside the pool (a script
    calling `train_fused`) the prefix says whose it is."""
    write(f"member {index}: {line}")
