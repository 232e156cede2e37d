"""A population-based-training lineage: the names its trials carry, and its schedule.

Each segment of population-based training is one trial. The sampler (`samplers._pbt`) writes
these user attributes when it starts one (optuna-dashboard shows them); the trial runner reads
`checkpoint_from` and `train_until_epoch`, and `best` and the report follow `pbt_parent` back to
the first segment to give the winning lineage's schedule: which params ran over which epochs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.record.trials import attr_names

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

PBT_MEMBER = "pbt_member"  # the population member this segment trains
PBT_GENERATION = "pbt_generation"  # segments before it in its lineage (0: a fresh start)
PBT_PARENT = "pbt_parent"  # the trial whose checkpoint it continues (None: a fresh start)
PBT_START_EPOCH = "pbt_start_epoch"  # epochs its parent had trained (0: none)
PBT_EXPLOITED = "pbt_exploited"  # True: it copied another member and perturbed its params
# What the trial runner reads and writes (the checkpoints' contract, docs/checkpoints.md):
# `train_until_epoch` is the last epoch a segment trains, counted from 0 as reports are.
CHECKPOINT = attr_names.CHECKPOINT
CHECKPOINT_FROM = attr_names.CHECKPOINT_FROM
TRAIN_UNTIL_EPOCH = attr_names.TRAIN_UNTIL_EPOCH
RESUMED_FROM_EPOCH = attr_names.RESUMED_FROM_EPOCH


def is_segment(trial: FrozenTrial) -> bool:
    return PBT_GENERATION in trial.user_attrs


def epochs_trained(trial: FrozenTrial) -> int:
    """How many epochs the segment's lineage has trained when it ends: `train_until_epoch` + 1
    (reports count epochs from 0); for a trial without one, its last report + 1."""
    until = trial.user_attrs.get(TRAIN_UNTIL_EPOCH)
    if isinstance(until, int) and not isinstance(until, bool):
        return until + 1
    return trial.last_step + 1 if trial.last_step is not None else 0


def lineage_of(trial: FrozenTrial, by_number: Mapping[int, FrozenTrial]) -> list[FrozenTrial]:
    """The segments that led to `trial`, the first one first, `trial` last; [trial] when it is
    not a segment. A parent that is missing (deleted, another study) ends the walk."""
    chain = [trial]
    seen = {trial.number}
    while True:
        parent = chain[-1].user_attrs.get(PBT_PARENT)
        if not isinstance(parent, int) or parent in seen or parent not in by_number:
            break
        seen.add(parent)
        chain.append(by_number[parent])
    return chain[::-1]


def schedule(lineage: Iterable[FrozenTrial]) -> list[dict[str, Any]]:
    """The lineage's hyperparameters over epochs: one row per stretch of equal params, each
    {"from": epoch, "until": epoch, "params": {...}, "trials": [numbers]} (epochs `from` + 1 to
    `until` trained with `params`)."""
    rows: list[dict[str, Any]] = []
    for segment in lineage:
        start = int(segment.user_attrs.get(PBT_START_EPOCH, 0) or 0)
        until = epochs_trained(segment)
        params = dict(segment.params)
        if rows and rows[-1]["params"] == params and rows[-1]["until"] == start:
            rows[-1]["until"] = until
            rows[-1]["trials"].append(segment.number)
            continue
        rows.append({"from": start, "until": until, "params": params, "trials": [segment.number]})
    return rows


def weights_of(trial: FrozenTrial) -> dict[str, Any] | None:
    """Where the trial's latest checkpoint is ({"artifact_id", "epoch"}), or None."""
    found = trial.user_attrs.get(CHECKPOINT)
    return found if isinstance(found, dict) else None


def schedule_text(rows: list[dict[str, Any]]) -> list[str]:
    """The schedule as lines: `epochs 1-5   lr=0.001 batch_size=64   (trials 0, 4)`."""
    lines = []
    for row in rows:
        params = " ".join(f"{k}={_short(v)}" for k, v in sorted(row["params"].items()))
        trials = ", ".join(str(n) for n in row["trials"])
        lines.append(f"epochs {row['from'] + 1}-{row['until']}  {params}  (trials {trials})")
    return lines


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
