"""PPO trials trained as one fused group: the PPO adapter's `train_fused` and `fuse_key`.

docs/fused.md ("PPO's fused loop") has the design. Here is the entry, the key and the folds;
the loop, `adapters.ppo.learn`'s loop for N members at once, is `fused_ppo_group`, its maths
`fused_ppo_maths`. `adapters/ppo.py` hands them its config and network
(`fused_ppo_group.Algorithm`): it imports these modules, so they do not import it back.

The members of one group share what decides *when* they act and update: hidden width (a
shape), the rollout's length in vector steps, the environments per member and the minibatch
size (so every member takes the same number of minibatches per pass, none padded). Everything
else is each member's own: first weights, generator (its action draws and its shuffles), its
environments' seeds, learning rate and its annealing, gamma, GAE's lambda, clip, value and
entropy weights, gradient clip, passes per rollout, Adam row, counts, reports, checkpoints.

A group of one is `train` itself.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from adapters import trial_log
from adapters._rl import frame as _rl
from adapters._rl.fused_group import log
from adapters._rl.fused_ppo_group import Algorithm, learn_group, rollout_length
from adapters.base import Member

if TYPE_CHECKING:
    import torch

    from adapters.ppo import PPOConfig


def fuse_key(hidden_size: int, batch_size: int, rollout_steps: int, num_envs: int) -> Hashable:
    """Which PPO trials may train as one group: equal hidden width, minibatch size, rollout
    length (in vector steps: members update at the same steps) and environments per member.

    The minibatch size is keyed exactly, not by band: the pool's group path fixes, for a
    group's other members, every parameter this key reads, so a band would never put two
    sizes in one pool group, and one size gives every member the same minibatches per pass
    with nothing padded (each member's loss is the sum over its own rows, as alone)."""
    steps = rollout_length(rollout_steps, batch_size, num_envs)
    return (int(hidden_size), int(batch_size), steps, int(num_envs))


def _group_key(config: PPOConfig) -> Hashable:
    return fuse_key(config.hidden_size, config.batch_size, config.rollout_steps, config.num_envs)


def train_fused(
    adapter: Any,
    algorithm: Algorithm,
    members: Sequence[Member],
    *,
    epochs: int,
    device: torch.device,
    options: Mapping[str, Any],
) -> list[float | BaseException]:
    """One entry per member, in order: its value, or what ended it (docs/fused.md)."""
    if len(members) == 1:  # a group of one is exactly a trial
        return [_alone(adapter, members[0], epochs, device, options)]
    keys = {_group_key(algorithm.config.from_params(m.params)) for m in members}
    if len(keys) > 1:
        raise ValueError(f"members of one fused PPO group need one fuse_key, not {sorted(keys)}")
    started = time.perf_counter()
    try:
        tasks = _rl.fold_tasks(options)  # bad options fail the group before any training
        configs = [algorithm.config.from_params(member.params) for member in members]
        steps_per_epoch = int(options["steps_per_epoch"])
    except Exception as error:  # every member's, as `train` raises it for a trial
        return [error] * len(members)
    if len(tasks) > 1:
        folds = (tasks, epochs, steps_per_epoch, device, started)
        return _train_folds(algorithm, members, configs, *folds)
    outcomes = learn_group(
        algorithm,
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


def _alone(
    adapter: Any, member: Member, epochs: int, device: torch.device, options: Mapping[str, Any]
) -> float | BaseException:
    """A member trained by the adapter's own `train`: its value, or what ended it."""
    try:
        return adapter.train(
            member.params,
            epochs=epochs,
            device=device,
            options=options,
            report=member.report,
            checkpoint=member.checkpoint,
        )
    except Exception as error:
        return error


def _train_folds(
    algorithm: Algorithm,
    members: Sequence[Member],
    configs: list[PPOConfig],
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
        outcomes = learn_group(
            algorithm,
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
