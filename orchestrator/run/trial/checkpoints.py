"""A trial's checkpoints on the trial process's side: the handle it trains with, and the tidying
after it was told.

The handle (orchestrator/record/checkpoints/handle.py) is made from the study's settings
(`--checkpoint-every`, `--artifacts`) and the trial's own attributes (`checkpoint_from`,
`train_until_epoch`), read fresh from the storage: a sampler may have set them after the ask.

What a trial keeps when it ends (bounded disk):
- re-queued (out of memory, stopped, timed out): its checkpoints, for the re-run;
- ended at `train_until_epoch`: its latest, which the next segment of its lineage copies;
- complete and among the study's leaders (`leaders`: the best configurations by the study's
  model, and the best observed trial): its latest, its final weights (`best` says where); a
  trial that is no longer among them loses its own;
- anything else: none.
A trial that resumed from a failed one (a re-run) also drops that one's, once it saved its own.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.record.checkpoints import files as stored
from orchestrator.record.checkpoints.handle import ARTIFACT_PREFIX, CheckpointHandle
from orchestrator.record.checkpoints.lineage import is_segment
from orchestrator.record.checkpoints.place import shown
from orchestrator.record.store.optuna_private import storage_of, study_id_of, trial_id_of
from orchestrator.record.trials import attr_names as names
from orchestrator.record.trials.best import directions_of, pick_best
from orchestrator.run.trial.signals import hold_stop, release_stop

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import optuna
    from optuna.trial import FrozenTrial

    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.study.spec import StudySpec
    from orchestrator.run.messages import Channel
    from samplers._model import recommend
else:
    optuna = LazyImport("optuna")
    recommend = LazyImport("samplers._model.recommend")

logger = logging.getLogger(__name__)

# The study's kept final weights, one system attribute per trial that kept them: the artifact's
# id, None once dropped. One key per trial: two trials ending at once never overwrite each other.
KEPT_WEIGHTS_PREFIX = "orchestrator:weights:"
# What a study kept before: the best observed trial's alone, {"trial": n, "artifact_id": id}.
BEST_WEIGHTS_ATTR = "orchestrator:best_weights"
# How many of the model's best configurations keep their final weights. What `recommend` names
# moves among the first few as trials come in: kept for each of them, its weights are there
# whichever the study ends on, and the disk holds at most this many files and one more.
LEADERS_KEPT = 3
_said: set[str] = set()  # the lines this process wrote about a store that is off
_told_host: set[str] = set()  # the lines about failed saves this process handed to its host


def open_handle(
    study: optuna.Study,
    trial: optuna.Trial,
    spec: StudySpec,
    storage_location: StorageLocation,
    saves: bool = True,
    tell_host: Callable[[str], None] | None = None,
) -> Any:
    """The trial's handle: its store, cadence, where it resumes from and where it ends. An
    adapter that does not save (`saves` False) gets no store: no folder is made for it.
    `tell_host` takes the host's line when a save fails (the pool says it once per host)."""
    location = (spec.artifacts or stored.default_location(storage_location)) if saves else None
    store = None
    if location is not None:
        try:
            store = stored.open_store(location)
        except Exception as error:  # a bucket's client that cannot be made here
            _say_once(f"checkpoints are off: {shown(location)} cannot hold them ({error})")
    elif saves and spec.checkpoint_every > 0:
        _say_once(  # once per process: the trial's log says why nothing resumes
            "checkpoints are off: a study on a database server keeps them where --artifacts "
            "says (a folder every node shares, s3://BUCKET or gs://BUCKET)"
        )
    attrs = storage_of(study).get_trial(trial_id_of(trial)).user_attrs
    source, until = attrs.get(names.CHECKPOINT_FROM), attrs.get(names.TRAIN_UNTIL_EPOCH)
    handle = CheckpointHandle(
        study,
        trial,
        store=store,
        every=spec.checkpoint_every,
        source=source if isinstance(source, int) and not isinstance(source, bool) else None,
        until=until if isinstance(until, int) and not isinstance(until, bool) else None,
        location=None if location is None else shown(location),  # stored before it was checked
    )
    if tell_host is not None:
        handle.on_unsaved = _once_per_process(tell_host)
    return handle


def tell_host(channel: Channel) -> Callable[[str], None]:
    """A line for the host's own log, sent over the trial's pipe: ("say", line)."""
    return lambda line: channel.send(("say", line))


def _say_once(line: str) -> None:
    if line not in _said:
        _said.add(line)
        print(line, flush=True)


def _once_per_process(tell_host: Callable[[str], None]) -> Callable[[str], None]:
    """`tell_host` for lines this process has not handed on before (the host dedupes again)."""

    def tell(line: str) -> None:
        if line not in _told_host:
            _told_host.add(line)
            with contextlib.suppress(OSError, ValueError):  # the pool gone: the log said it
                tell_host(line)

    return tell


def takes_checkpoint(train: Callable[..., Any]) -> bool:
    """Whether an adapter's `train` accepts `checkpoint=` (older adapters do not: they still run)."""
    try:
        parameters = inspect.signature(train).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.name == "checkpoint" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters
    )


def reporting_to(
    handle: CheckpointHandle, report: Callable[[int, float], None], saves: bool
) -> Any:
    """`report`, which also ends the trial once `train_until_epoch` was reported (and saved).

    Between an epoch's report and its checkpoint a stop waits (it comes at the save): a trial
    stopped there would lose an epoch it had finished."""

    def report_epoch(epoch: int, value: float) -> None:
        release_stop()  # the adapter did not save the last epoch held for: wait no longer
        if saves and handle.due(epoch):
            hold_stop()  # from before the value is stored: a stop after it would lose the epoch
        report(epoch, value)
        handle.reported(epoch, value, saves=saves)

    handle.on_saved = release_stop

    for name in ("flush",):  # the reporter's extras stay reachable
        if hasattr(report, name):
            setattr(report_epoch, name, getattr(report, name))
    return report_epoch


def tidy(study: optuna.Study, trial: optuna.Trial, handle: Any, state: str, requeued: bool) -> None:
    """Drop the checkpoints nothing will read again (see the module's docstring)."""
    store = getattr(handle, "_store", None)
    if handle is None or store is None:
        return
    own = list(handle.saved)
    keep: list[str] = []
    if requeued:
        keep = [c.artifact_id for c in own]
    elif own and state == "COMPLETE" and handle.until is not None:
        keep = [own[-1].artifact_id]  # a segment: the next of its lineage copies it
    elif own and state == "COMPLETE":
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        kept = leaders(done, directions_of(study))
        if trial.number in kept:
            keep = [own[-1].artifact_id]
        _keep_weights_of(study, store, kept, done, trial.number, keep)
    for checkpoint in own:
        if checkpoint.artifact_id not in keep:
            stored.remove(store, checkpoint.artifact_id)
    for artifact_id in handle.unnamed:  # written while the database was away, never named
        stored.remove(store, artifact_id)
    if own and handle.source is not None:
        _drop_failed_source(study, store, handle.source)


def leaders(done: Sequence[FrozenTrial], directions: Sequence[str]) -> set[int]:
    """The numbers of the completed trials whose final weights the study keeps: its best observed
    trial and its `LEADERS_KEPT` best configurations by the model (`recommend.ranked`: what the
    study recommends is one of them); none for several objectives. Population-based training:
    the best trial by its lineage rule, whose weights `best` names."""
    best = pick_best(done, directions)
    if best is None:
        return set()
    if any(is_segment(t) for t in done):
        return {best.number}
    try:
        ranked = recommend.ranked(done, directions)[:LEADERS_KEPT]
    except (ValueError, ArithmeticError) as error:  # no model: the best observed alone
        logger.warning("keeping the best observed trial's weights alone: %s", error)
        ranked = []
    return {best.number, *(t.number for t, _ in ranked)}


def _keep_weights_of(
    study: optuna.Study,
    store: Any,
    kept: set[int],
    done: Sequence[FrozenTrial],
    number: int,
    mine: list[str],
) -> None:
    """Note this trial's kept weights (`mine`), and drop those of the trials no longer among the
    leaders. Only trials this process sees completed are judged: one told a moment ago
    elsewhere is not dropped for a view that does not hold it yet."""
    storage, study_id = storage_of(study), study_id_of(study)
    if mine:
        storage.set_study_system_attr(study_id, f"{KEPT_WEIGHTS_PREFIX}{number}", mine[0])
    complete = {t.number: t for t in done}
    attrs = storage.get_study_system_attrs(study_id)
    for other, (key, artifact_id) in _kept_weights(attrs).items():
        trial = complete.get(other)
        # A segment keeps its checkpoint for the segments that copy it.
        if other in kept or trial is None or names.TRAIN_UNTIL_EPOCH in trial.user_attrs:
            continue
        stored.remove(store, artifact_id)
        storage.set_study_system_attr(study_id, key, None)


def _kept_weights(attrs: dict[str, Any]) -> dict[int, tuple[str, str]]:
    """{trial number: (its system attribute's key, artifact id)} of the weights a study keeps,
    with what a study made before kept (the best observed trial's, under one key)."""
    kept: dict[int, tuple[str, str]] = {}
    before = attrs.get(BEST_WEIGHTS_ATTR)
    if (
        isinstance(before, dict)
        and isinstance(before.get("artifact_id"), str)
        and isinstance(before.get("trial"), int)
    ):
        kept[before["trial"]] = (BEST_WEIGHTS_ATTR, before["artifact_id"])
    for key, value in attrs.items():
        number = key[len(KEPT_WEIGHTS_PREFIX) :]
        if key.startswith(KEPT_WEIGHTS_PREFIX) and number.isdigit() and isinstance(value, str):
            kept[int(number)] = (key, value)
    return kept


def _drop_failed_source(study: optuna.Study, store: Any, source: int) -> None:
    """A re-run that saved its own no longer needs what the failed trials it replaces saved: the
    one it names, and back along their `checkpoint_from` while they failed (a re-run stopped
    before its first save handed on its source's)."""

    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    number: Any = source
    while isinstance(number, int) and number in by_number:
        trial = by_number.pop(number)  # popped: a loop of names ends
        if trial.state != optuna.trial.TrialState.FAIL:
            return
        for key in trial.system_attrs:
            if key.startswith(ARTIFACT_PREFIX):
                stored.remove(store, key[len(ARTIFACT_PREFIX) :])
        number = trial.user_attrs.get(names.CHECKPOINT_FROM)
