"""Population-based training under faults: a re-run keeps its segment, a shape is learnt.

Two ways a segment is run again, both as the orchestrator's re-runs (`record/trials/retry.py`:
a WAITING trial with the failed one's params fixed and its `retry_history`, which the budget
does not count twice):

- **A re-queued segment** (its host or process lost, out of memory, stopped, timed out) is the
  same segment: `inherited` finds the plan of the trial it re-runs (back along its
  `retry_history`), and the sampler gives the re-run that plan (member, generation, parent,
  epochs) instead of planning a new segment. While it waits its member counts as busy.
- **A shape learnt.** A copied member whose perturbed params cannot load its parent's
  checkpoint (`load_state_dict`: "size mismatch", or missing keys for a layer count) names the
  parameters that shape the model: `culprits` reads them from the error and the params that
  changed. They are kept from then on (a study system attribute per name, `KEEP_PREFIX`, so
  every worker knows and two workers learning at once lose nothing) and the segment is re-run
  with its parent's values for them.

No decision here needs the trial runner: the sampler's `before_trial` and `after_trial` call in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from orchestrator.record.checkpoints import lineage as names
from orchestrator.record.store.optuna_private import storage_of, study_id_of, trial_id_of
from orchestrator.record.trials import attr_names
from orchestrator.record.trials.retry import requeue

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.study import Study
    from optuna.trial import FrozenTrial

# A study system attribute per parameter learnt to shape the weights: f"{KEEP_PREFIX}{name}".
KEEP_PREFIX = "pbt:keep:"
# What the trial's `fail_reason` says for a segment that could not load its parent's weights
# (a reason, not an error of the objective: `optimize` and `run` go on, and it is re-run).
SHAPE_REASON = "pbt_shape"
# torch's `load_state_dict` errors: a tensor of another shape, or another set of layers.
_LOAD_ERROR = re.compile(r"size mismatch|Error\(s\) in loading state_dict")
_SHAPES = re.compile(
    r"shape torch\.Size\(\[([\d, ]*)\]\) from checkpoint, "
    r"the shape in current model is torch\.Size\(\[([\d, ]*)\]\)"
)

# A segment's place in its lineage, which a re-run of it carries as it was.
SEGMENT_ATTRS = (
    names.PBT_MEMBER,
    names.PBT_GENERATION,
    names.PBT_PARENT,
    names.PBT_START_EPOCH,
    names.PBT_EXPLOITED,
    names.TRAIN_UNTIL_EPOCH,
)
MOVED_ON: dict[str, Any] = {}  # `rerun_plan`'s answer for a re-run whose member trained on


def rerun_plan(study: Study, trial: FrozenTrial, key: str) -> dict[str, Any] | None:
    """Give the re-run `trial` the plan (system attribute `key`) and the lineage's attributes
    of the segment it replaces: same member, generation, parent, epochs and params; it goes on
    from that trial's checkpoint (its `checkpoint_from`, set by the re-queue). The plan given;
    None when it re-runs no planned trial (it runs as it was given); `MOVED_ON` when its member
    trained on in another trial meanwhile (its fixed params are dropped: it needs a new plan)."""
    storage = storage_of(study)
    trials = storage.get_all_trials(study_id_of(study), deepcopy=False)
    found = inherited(trial, {t.number: t for t in trials}, key)
    if found is None:
        return None
    plan, source = found
    fixed = trial.system_attrs["fixed_params"]
    if moved_on(plan, trial, trials, key):
        fixed.clear()  # Optuna reads what it hands out from here after `before_trial`
        return MOVED_ON
    record = {**plan, "params": {**(plan.get("params") or source.params), **fixed}}
    storage.set_trial_system_attr(trial_id_of(trial), key, record)
    trial.system_attrs[key] = record
    for name in SEGMENT_ATTRS:
        if name in source.user_attrs:
            storage.set_trial_user_attr(trial_id_of(trial), name, source.user_attrs[name])
            trial.user_attrs[name] = source.user_attrs[name]
    return record


def learn_shape(study: Study, trial: FrozenTrial, key: str, keep: Sequence[str]) -> None:
    """A copied member that could not load its parent's checkpoint (told FAIL, not yet
    stored so): the parameters that changed its shape are kept from now on, and it is re-run
    with its parent's values for them (a re-run: the budget counts the segment once)."""
    storage, study_id = storage_of(study), study_id_of(study)
    frozen = storage.get_trial(trial_id_of(trial))  # with the error the runner stored
    plan = frozen.system_attrs.get(key)
    if not isinstance(plan, dict) or plan.get("parent") is None:
        return
    parent = storage.get_trial(
        storage.get_trial_id_from_study_id_trial_number(study_id, int(plan["parent"]))
    )
    kept = set(keep) | learnt_keep(storage.get_study_system_attrs(study_id))
    error = frozen.user_attrs.get(attr_names.ERROR, "")
    found = culprits(error, frozen.params, parent.params, frozen.distributions, kept)
    if not found:
        return
    for name in found:
        if name in kept:  # learnt meanwhile, from a sibling that failed as this one did
            continue
        learnt = {"trial": frozen.number, "from": parent.params[name], "to": frozen.params[name]}
        storage.set_study_system_attr(study_id, KEEP_PREFIX + name, learnt)
    storage.set_trial_user_attr(trial_id_of(trial), attr_names.FAIL_REASON, SHAPE_REASON)
    print(learnt_line(found, frozen, parent), flush=True)  # the trial's log, its last line
    back = {name: parent.params[name] for name in found}
    requeue(study, frozen, max_retries=None, params=back, reason=SHAPE_REASON)


def retried_numbers(trial: FrozenTrial) -> list[int]:
    """The trials `trial` re-runs, the one it replaces last ([] for any other trial)."""
    return [int(n) for n in trial.system_attrs.get("retry_history", [])]


def inherited(
    trial: FrozenTrial, by_number: Mapping[int, FrozenTrial], key: str
) -> tuple[dict[str, Any], FrozenTrial] | None:
    """The plan (system attribute `key`) of the latest trial `trial` re-runs that had one, with
    that trial; None when `trial` is no re-run or none of those it re-runs was planned."""
    for number in reversed(retried_numbers(trial)):
        source = by_number.get(number)
        plan = None if source is None else source.system_attrs.get(key)
        if isinstance(plan, dict):
            return plan, source
    return None


def moved_on(
    plan: Mapping[str, Any], rerun: FrozenTrial, trials: Sequence[FrozenTrial], key: str
) -> bool:
    """Whether the member of the re-run's plan trained on in another trial meanwhile (asked for
    between its segment failing and the re-run being queued): the re-run would repeat it."""
    chain = {rerun.number, *retried_numbers(rerun)}
    failed = min(chain)
    for other in trials:
        theirs = other.system_attrs.get(key)
        if other.number in chain or other.number < failed or not isinstance(theirs, dict):
            continue
        if int(theirs["member"]) != int(plan["member"]):
            continue
        if other.state in (TrialState.RUNNING, TrialState.COMPLETE):
            return True
    return False


def learnt_keep(system_attrs: Mapping[str, Any]) -> set[str]:
    """The parameters the study learnt shape the weights (from its system attributes)."""
    return {key[len(KEEP_PREFIX) :] for key in system_attrs if key.startswith(KEEP_PREFIX)}


def culprits(
    error: str,
    child: Mapping[str, Any],
    parent: Mapping[str, Any],
    distributions: Mapping[str, BaseDistribution],
    kept: set[str],
) -> list[str]:
    """The parameters whose change made the child's `load_state_dict` fail, from its `error`.

    Those whose parent and child values are the two sides of a mismatched dimension ("shape
    [16, 4] from checkpoint, ... in current model is [32, 4]" names a width that went from 16 to
    32); failing that, those changed though `kept` (kept already: learnt after this child was
    planned, from a sibling's failure); failing that, every changed one that is not a float, as
    a width or a layer count is not; failing that, every changed one. [] when the error is no
    loading error or nothing changed (the child's own code is at fault, not a parameter)."""
    if not isinstance(error, str) or not _LOAD_ERROR.search(error):
        return []
    changed = sorted(
        name
        for name, value in child.items()
        if name in parent
        and parent[name] != value
        and name != attr_names.BATCH_SIZE  # a batch size shapes no weight
    )
    pairs = set()
    for before, after in _SHAPES.findall(error):
        old, new = _dims(before), _dims(after)
        if len(old) == len(new):
            pairs |= {(a, b) for a, b in zip(old, new, strict=True) if a != b}
    named = [n for n in changed if (_whole(parent[n]), _whole(child[n])) in pairs]
    if named:
        return named
    if meanwhile := [n for n in changed if n in kept]:
        return meanwhile
    whole = [n for n in changed if not isinstance(distributions.get(n), FloatDistribution)]
    return whole or changed


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.replace(" ", "").split(",") if d]


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def learnt_line(names: Sequence[str], trial: FrozenTrial, parent: FrozenTrial) -> str:
    """The one line that says what was learnt."""
    changes = ", ".join(f"{n} {parent.params[n]} -> {trial.params[n]}" for n in names)
    them = "it shapes" if len(names) == 1 else "they shape"
    return (
        f"population-based training: trial {trial.number} could not load the checkpoint of "
        f"trial {parent.number} ({changes}): {them} the model's weights, so "
        f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} kept from now on "
        f"(as --pbt-keep would) and trial {trial.number} runs again with its parent's value"
    )
