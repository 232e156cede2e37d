"""Re-running a failed trial's parameters: after an OOM, an interruption, or a lost process.

A re-run is a WAITING trial with the failed one's parameters fixed, in the same `retry_history`
format as Optuna's RetryHeartbeatStaleTrialCallback, so the budget can tell a failure that was
re-queued from one that is final. Unlike Optuna's callback it does not copy the failed trial's
system attributes: those hold the sampler's bookkeeping for the old trial, not the new one.
Both ride out a database outage, and a re-run is never queued twice (looked for and added
under the budget lock).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.record.budget import section as budget_section
from orchestrator.record.outages.riding import ride_out
from orchestrator.record.store.locks import locked
from orchestrator.record.store.optuna_private import rdb_storage_of, storage_of
from orchestrator.record.store.storage import location_of
from orchestrator.record.study.spec import load_spec
from orchestrator.record.trials import attr_names as names

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial
else:
    optuna = LazyImport("optuna")


def retry_history(trial: FrozenTrial) -> list[int]:
    return [int(n) for n in trial.system_attrs.get("retry_history", [])]


def requeue(
    study: optuna.Study,
    trial: FrozenTrial,
    *,
    max_retries: int | None,
    params: Mapping[str, Any] | None = None,
    reason: str,
    system_attrs: Mapping[str, Any] | None = None,
) -> bool:
    """Queue a re-run of `trial` (with `params` replacing some of its own, and `system_attrs`
    of its own); False when out of retries."""
    history = [*retry_history(trial), trial.number]
    if max_retries is not None and len(history) > max_retries:
        return False
    # One re-run per failure: a trial both interrupted by its host and later found stale (or
    # found stale by two hosts) would otherwise run twice, and its re-runs take the study past
    # its budget (the count leaves out each re-queued failure once).
    if ride_out(lambda: is_requeued(study, trial.number), what="read the trials"):
        return True
    rerun = optuna.trial.create_trial(
        state=optuna.trial.TrialState.WAITING,
        system_attrs={
            "fixed_params": {**trial.params, **(params or {})},
            "failed_trial": history[0],
            "retry_history": history,
            **(system_attrs or {}),
        },
        user_attrs=_rerun_attrs(trial, reason),
    )

    def add_once() -> None:
        # Looked for and added in one section under the budget lock, where the look for lost
        # trials re-queues too: a trial re-queued by its own process (stopped, out of memory) as
        # another host found it stale got a re-run from each, one trial past the budget. Redone
        # whole after a lost connection, it finds a re-run whose commit landed.
        if not is_requeued(study, trial.number):
            study.add_trial(rerun)

    backend = rdb_storage_of(storage_of(study))
    if budget_section.current() is not None or not isinstance(
        backend, optuna.storages.RDBStorage
    ):  # inside the look for lost trials' section (the lock held), or a storage in memory
        ride_out(add_once, what=f"re-queue trial {trial.number}")
    else:
        locked(
            location_of(backend),
            f"budget:{study.study_name}",
            add_once,
            what=f"re-queue trial {trial.number}",
        )
    return True


def _rerun_attrs(trial: FrozenTrial, reason: str) -> dict[str, Any]:
    """What a re-run of `trial` carries: it trains on from the last checkpoint of the trial it
    replaces, on any node, and ends where that one was to end. An --intensify re-run's retry
    trains on the same seeds (a retry at offset 0 would be the configuration's first draw
    again); it does not carry `intensify_of`, so the re-runs are counted once
    (orchestrator/intensify.py)."""
    attrs = {
        names.RETRY_OF: trial.number,
        names.RETRY_REASON: reason,
        names.CHECKPOINT_FROM: trial.number,
    }
    for kept in (names.TRAIN_UNTIL_EPOCH, names.SEED_OFFSET):
        if kept in trial.user_attrs:
            attrs[kept] = trial.user_attrs[kept]
    return attrs


def is_requeued(study: optuna.Study, number: int) -> bool:
    """Does a re-run of trial `number` exist?"""
    return any(retry_history(other)[-1:] == [number] for other in study.get_trials(deepcopy=False))


def stale_trial_callback(study: optuna.Study, trial: FrozenTrial) -> None:
    """Heartbeat callback: a trial whose process died is re-run, within the study's retry limit."""
    spec = ride_out(lambda: load_spec(study), what="read the study's settings")
    requeue(study, trial, max_retries=spec.max_retries if spec else 2, reason="lost")
