"""The entry of an RL adapter's `train_fused` (docs/fused.md), shared by DQN and PPO: a group
of one is the adapter's own `train`; members of one key train together, through the
algorithm's group loop, once or fold by fold; each member's entry is its value or what ended
it. The loops themselves are the algorithms' (`fused_group` for DQN, `fused_ppo_group`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adapters import trial_log
from adapters._rl import frame as _rl
from adapters._rl.fused_group import log
from adapters.base import Member, train_alone

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Group:
    """What the shared entry needs of one algorithm's fused training."""

    name: str  # as an error says it: "DQN"
    config: Any  # its config class, with `from_params`
    key: Callable[[Any], Hashable]  # what the members of one group must share, from a config
    learn: Callable[..., list[Any]]  # its group loop: (configs, task, *, epochs, ...) -> runs


def train_fused(
    adapter: Any,
    group: Group,
    members: Sequence[Member],
    *,
    epochs: int,
    device: torch.device,
    options: Mapping[str, Any],
) -> list[float | BaseException]:
    """One entry per member, in order: its value, or what ended it (docs/fused.md)."""
    if len(members) == 1:  # a group of one is exactly a trial
        return [train_alone(adapter, members[0], epochs, device, options)]
    keys = {group.key(group.config.from_params(m.params)) for m in members}
    if len(keys) > 1:
        raise ValueError(
            f"members of one fused {group.name} group need one fuse_key, not {sorted(keys)}"
        )
    started = time.perf_counter()
    try:
        tasks = _rl.fold_tasks(options)  # bad options fail the group before any training
        configs = [group.config.from_params(member.params) for member in members]
        steps_per_epoch = int(options["steps_per_epoch"])
    except Exception as error:  # every member's, as `train` raises it for a trial
        return [error] * len(members)
    if len(tasks) > 1:
        folds = (tasks, epochs, steps_per_epoch, device, started)
        return _train_folds(group, members, configs, *folds)
    outcomes = group.learn(
        configs,
        tasks[0],
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        device=device,
        reports=[member.report for member in members],
        checkpoints=[member.checkpoint for member in members],
    )
    entries: list[float | BaseException] = []
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, BaseException):
            entries.append(outcome)
            continue
        how = "the last epoch's score"
        log(index, trial_log.value_line(tasks[0].metric, outcome.value, _since(started), how))
        entries.append(outcome.value)
    return entries


def _train_folds(
    group: Group,
    members: Sequence[Member],
    configs: list[Any],
    tasks: list[_rl.Task],
    epochs: int,
    steps_per_epoch: int,
    device: torch.device,
    started: float,
) -> list[float | BaseException]:
    """Walk-forward folds, as `RLAdapter.train` runs them: each fold trains afresh (the group
    together), and each member reports its running mean after every fold (a step is a fold)."""
    metric = tasks[0].metric
    entries: list[float | BaseException | None] = [None] * len(members)
    scores: list[list[float]] = [[] for _ in members]
    for fold, task in enumerate(tasks):
        going = [i for i, entry in enumerate(entries) if entry is None]
        if not going:
            break
        outcomes = group.learn(
            [configs[i] for i in going],
            task,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            device=device,
            reports=[None] * len(going),
            checkpoints=[None] * len(going),
        )
        for i, outcome in zip(going, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                entries[i] = outcome
                continue
            scores[i].append(outcome.value)
            mean = sum(scores[i]) / len(scores[i])
            done = f"fold {fold + 1} of {len(tasks)} scored {outcome.value:.6g}"
            log(i, trial_log.evaluation_line(fold, f"mean {metric}", mean, _since(started), done))
            try:
                members[i].report(fold, mean)
            except Exception as error:  # pruned after this fold: it leaves the group
                entries[i] = error
    for i, entry in enumerate(entries):
        if entry is None:
            mean = sum(scores[i]) / len(scores[i])
            how = f"the mean of {len(tasks)} folds"
            log(i, trial_log.value_line(metric, mean, _since(started), how))
            entries[i] = mean
    return [entry for entry in entries if entry is not None]


def _since(started: float) -> float:
    return time.perf_counter() - started
