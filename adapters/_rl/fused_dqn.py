"""DQN trials trained as one fused group: the DQN adapter's `train_fused` and `fuse_key`.

docs/fused.md has the design; `adapters/_rl/fused` the maths of one fused gradient step. Here
is the entry (and the folds); the loop around the step, `adapters.dqn.learn`'s loop for N
members at once, is `fused_group`, each member's state `fused_members`, what the members step
together `fused_envs`. `adapters/dqn.py` hands them its config, network and replay
(`fused_group.Algorithm`): it imports these modules, so they do not import it back. In short:

- the members' networks, targets and Adam states are stacked rows (`fused.FusedAdam`); every
  per-member hyperparameter is a value per row, and a member's Adam step is the very kernel its
  trial runs alone (`FusedAdam.step_rows`);
- one act over all members (one batched forward; each member draws its exploration with its own
  generator, so its draws do not depend on the group);
- one vector environment of N x `num_envs` Gymnasium copies, each member's seeded as its own
  trial seeds them (trading: the members' own environments, stepped one after another);
- one n-step window over all members, each with its own n and gamma (`fused_envs.GroupWindow`);
- each member's own replay (`adapters.dqn.PrioritizedReplay`) and generator; a gradient step
  samples each member's batch into one padded buffer and takes one fused step;
- the replay ratio's cadence per member: a vector step owes each member its own gradient steps,
  and a fused step computes only the members that owe one (the others are not in it);
- the target refresh per member, after its own `target_update_period` steps;
- per epoch, each member is scored (Gymnasium: all members' evaluation episodes in one vector
  env), reports through its own `report`, and saves through its own `checkpoint` handle in the
  format `adapters/_rl/checkpoint.py` writes for one trial, so a member goes on alone with
  `train`, and a group member goes on from a trial's checkpoint.

A member whose `report` raises (optuna.TrialPruned, a checkpoint's TrainedUntil) or whose
checkpoint fails leaves the group at that epoch: its rows are cut out of every stacked tensor and
the others go on; what it raised is its entry. An error of the group's own step ends every member
still in it. A group of one is `train` itself.

Resumed members may stand at different epochs: each trains its own next epoch every round, and
leaves the group when it has trained its last.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from adapters import trial_log
from adapters._rl import frame as _rl
from adapters._rl.fused_group import Algorithm, learn_group, log
from adapters.base import BATCH_SIZE_MIN, Member

if TYPE_CHECKING:
    import torch

    from adapters.dqn import DQNConfig

BANDS = 6  # batch bands over the study's 64..4096: [64, 128), [128, 256), ..., [2048, 4096]


def batch_band(batch_size: int) -> int:
    """The band of a batch size: 0 for 64..127, 1 for 128..255, ..., 5 for 2048..4096. Within a
    band the largest batch is less than twice the smallest: a fused step pads at most 2x, and
    the members' replay-ratio cadences stay within 2x of each other (docs/fused.md)."""
    return min(max((int(batch_size) // BATCH_SIZE_MIN).bit_length() - 1, 0), BANDS - 1)


def fuse_key(hidden_size: int, batch_size: int) -> Hashable:
    """Which DQN trials may train as one group: equal hidden width and batch band."""
    return (int(hidden_size), batch_band(int(batch_size)))


def _group_key(config: DQNConfig) -> Hashable:
    """`fuse_key`, and the number of environments (fixed unless a trial's parameters set it):
    what the members of one group must share."""
    return (*fuse_key(config.hidden_size, config.batch_size), config.num_envs)


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
        raise ValueError(
            f"members of one fused DQN group need one fuse_key and num_envs, not {sorted(keys)}"
        )
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
    configs: list[DQNConfig],
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
