"""The checkpoint handle a trial's `train` gets: `load()` the state to go on from, `save(epoch, state)`.

One handle per trial. `load()` returns the latest state this trial saved, else that of the trial
named by its `checkpoint_from` attribute (a re-run names the trial it replaces; population-based
training names the member it copies), following that trial's own `checkpoint_from` when it saved
none. When it resumes, the epochs already reported are copied into this trial (the pruner sees
one curve), `resumed_from_epoch` is recorded and the trial's log says so. A checkpoint that is
missing or cannot be read is one line in the log and a fresh start, never an error.

`save` writes every `every` epochs (0: never), and always at `train_until_epoch`; the trial keeps
its last `KEEP` checkpoints. A trial with `train_until_epoch` = E ends after epoch E was both
saved and reported (`TrainedUntil`), whichever of the two comes second.

A checkpoint is insurance: a save the store refuses (a full or read-only disk, a bucket away)
never ends the trial. Training goes on, the next save tries again, the trial's `checkpoint` still
names its latest usable one and `checkpoint_unsaved` the save that failed; its log says so once
(until a save works again), and `on_unsaved` hands the host one line naming the place and cause.
"""

from __future__ import annotations

import errno
import io
import json
import os
import uuid
from typing import TYPE_CHECKING, Any

from orchestrator.record.checkpoints import files as stored
from orchestrator.record.outages.errors import is_outage
from orchestrator.record.outages.riding import ride_out, single_attempt
from orchestrator.record.store.optuna_private import cached_trial_of, storage_of, trial_id_of
from orchestrator.record.trials import attr_names as names
from orchestrator.record.trials.attrs import set_user_attrs

if TYPE_CHECKING:
    from collections.abc import Callable

    import optuna

# Checkpoints a trial keeps while it runs: the latest, and the one before it, which a process
# copying this trial (a re-run, a member of a population) may be reading as the latest is written.
KEEP = 2
# How Optuna lists an uploaded artifact among a trial's system attributes (optuna.artifacts).
ARTIFACT_PREFIX = "artifacts:"


class TrainedUntil(Exception):  # an ending, as optuna.TrialPruned is
    """Epoch `train_until_epoch` was trained, saved and reported: the trial ends COMPLETE with
    the value reported there."""

    def __init__(self, epoch: int, value: float) -> None:
        super().__init__(f"trained until epoch {epoch}")
        self.epoch, self.value = epoch, value


def _say(line: str) -> None:
    print(line, flush=True)  # the trial's log (its stdout); a killed trial keeps what it wrote


class CheckpointHandle:
    """What `train(..., checkpoint=...)` gets; an objective of `orchestrator.optimize` gets it as
    its third argument."""

    def __init__(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        *,
        store: Any | None,
        every: int,
        source: int | None = None,
        until: int | None = None,
        location: str | None = None,
    ) -> None:
        self._study, self._trial, self._store = study, trial, store
        self.location = location  # where the store keeps them, as the lines show it (masked)
        self.every, self.source, self.until = max(0, int(every)), source, until
        self.saved: list[stored.Checkpoint] = []  # this trial's own, oldest first
        self.resumed_epoch: int | None = None  # the epoch of the state `load` returned
        self._reported: dict[int, float] = {}
        self.unnamed: list[str] = []  # written during an outage, not yet named by the trial
        self.on_saved: Callable[[], None] = lambda: None  # after each save (the trial runner's)
        self.on_unsaved: Callable[[str], None] = lambda line: None  # the host's line, each failure
        self.failing: str | None = None  # why the last save failed, until one works again
        self._tried_at: int | None = None  # the last epoch a save was tried at
        # Where its lines go: the trial's log (stdout); a fused member's, its own log.
        self.say: Callable[[str], None] = _say

    # --- the adapter's side ---------------------------------------------------------------

    def load(self) -> dict[str, Any] | None:
        """The state to go on from (training continues at `resumed_epoch + 1`), or None."""
        if self.saved:
            return self._read(self.saved[-1], copy=False)
        if self.source is None:
            return None
        found = stored.latest(self._study, self.source)
        if found is None:
            self.say(f"trial {self.source} left no checkpoint: training starts at epoch 0")
            return None
        if self._store is None:
            self.say("this study keeps no checkpoints (no --artifacts): training starts at epoch 0")
            return None
        return self._read(found, copy=True)

    def due(self, epoch: int) -> bool:
        """Whether `save(epoch, ...)` writes: an adapter may skip building a state that is not."""
        self._past_the_end(epoch)
        if self._store is None:
            return False
        return epoch == self.until or (self.every > 0 and (epoch + 1) % self.every == 0)

    def save(self, epoch: int, state: dict[str, Any]) -> None:
        """Keep `state` as it is after `epoch` (counted from 0, as reports are), when due."""
        self._past_the_end(epoch)
        if self.due(epoch):
            self._write(epoch, state)
        self._maybe_stop(epoch)
        self.on_saved()

    # --- the trial runner's side ------------------------------------------------------------

    def reported(self, epoch: int, value: float, *, saves: bool) -> None:
        """The adapter reported `value` at `epoch`; `saves`: it saves through this handle."""
        self._reported[epoch] = value
        if epoch == self.until and (not saves or self._store is None or self._tried_at == epoch):
            raise TrainedUntil(epoch, value)  # saved, or tried and failed: it will not come

    def _maybe_stop(self, epoch: int) -> None:
        if epoch != self.until:
            return
        value = self._reported.get(epoch)
        if value is None:  # an objective that reports through the trial itself
            frozen = storage_of(self._study).get_trial(trial_id_of(self._trial))
            value = frozen.intermediate_values.get(epoch)
        if value is not None:
            raise TrainedUntil(epoch, value)

    def _past_the_end(self, epoch: int) -> None:
        """An objective that saved its last epoch before reporting it (`trial.report`, which this
        handle does not see) ends at its next call here, before that epoch's state is kept."""
        if self.until is not None and epoch > self.until:
            self._maybe_stop(self.until)

    # --- reading and writing ------------------------------------------------------------------

    def _read(self, found: stored.Checkpoint, *, copy: bool) -> dict[str, Any] | None:
        try:
            state = stored.read(self._store, found)
        except stored.CheckpointUnreadable as why:
            self.say(
                f"the checkpoint of trial {found.trial} at epoch {found.epoch} could not be read "
                f"({why}): training starts at epoch 0"
            )
            return None
        if copy:
            self._copy_curve(found)
        set_user_attrs(self._trial, {names.RESUMED_FROM_EPOCH: found.epoch})
        self.resumed_epoch = found.epoch
        self.say(
            f"resumed from the checkpoint of trial {found.trial} at epoch {found.epoch}: "
            f"training goes on at epoch {found.epoch + 1}"
        )
        return state

    def _copy_curve(self, found: stored.Checkpoint) -> None:
        """The epochs the checkpoint's trial reported up to its epoch, reported here too."""
        storage = storage_of(self._study)
        source = next(t for t in self._study.get_trials(deepcopy=False) if t.number == found.trial)
        own = trial_id_of(self._trial)
        curve = {s: v for s, v in source.intermediate_values.items() if s <= found.epoch}

        def copy() -> None:
            for step, value in sorted(curve.items()):
                storage.set_trial_intermediate_value(own, step, value)

        ride_out(copy, what=f"carry the curve of trial {found.trial} over")
        cached_trial_of(self._trial).intermediate_values.update(curve)  # as report keeps it

    def _write(self, epoch: int, state: dict[str, Any]) -> None:
        """Write the file, then name it in the trial's attributes. While the database is away
        training goes on: the file is kept unnamed, and the next save that is named drops it."""
        artifact_id = str(uuid.uuid4())
        # Encoding is the adapter's state: its errors are its own. Writing is the store's.
        body = io.BytesIO(stored.encode(epoch, state))
        self._tried_at = epoch
        try:
            self._store.write(artifact_id, body)
        except Exception as error:  # the store's: a full or read-only disk, a bucket away
            self._unsaved(epoch, error)
            return
        if self.failing is not None:
            self.failing = None
            self.say(f"epoch {epoch}: checkpoints are saved again in {self.location}")
        try:
            with single_attempt():
                self._name(artifact_id, epoch)
        except Exception as error:
            if not is_outage(error):
                raise
            self.unnamed.append(artifact_id)
            return
        for unnamed in self.unnamed:
            stored.remove(self._store, unnamed)
        self.unnamed.clear()
        self.saved.append(stored.Checkpoint(self._trial.number, artifact_id, int(epoch)))
        while len(self.saved) > KEEP:  # only once the new one is named: never none to go on from
            stored.remove(self._store, self.saved.pop(0).artifact_id)

    def _unsaved(self, epoch: int, error: Exception) -> None:
        """A save the store refused: one line in the trial's log (until one works again), the
        host's line handed on, and the failure in the trial's record."""
        cause = cause_of(error)
        if self.failing is None:
            latest = f"epoch {self.saved[-1].epoch}" if self.saved else "none of its own yet"
            self.say(
                f"epoch {epoch}: the checkpoint could not be saved in {self.location} ({cause}): "
                f"training goes on and the next save tries again; its latest usable checkpoint: "
                f"{latest}"
            )
        self.failing = cause
        self.on_unsaved(unsaved_line(self.location, error))
        try:
            with single_attempt():
                set_user_attrs(
                    self._trial, {names.CHECKPOINT_UNSAVED: {"epoch": epoch, "error": cause}}
                )
        except Exception as failed:  # the database away too: the log said it
            if not is_outage(failed):
                raise

    def _name(self, artifact_id: str, epoch: int) -> None:
        """List the artifact with the trial as Optuna does (its dashboard shows it), and make it
        the trial's `checkpoint`."""
        meta = {  # Optuna's ArtifactMeta
            "artifact_id": artifact_id,
            "filename": f"checkpoint-{self._trial.number}-epoch-{epoch}.pt",
            "mimetype": "application/octet-stream",
            "encoding": None,
        }
        storage = storage_of(self._study)
        key = ARTIFACT_PREFIX + artifact_id
        storage.set_trial_system_attr(trial_id_of(self._trial), key, json.dumps(meta))
        set_user_attrs(
            self._trial, {names.CHECKPOINT: {"artifact_id": artifact_id, "epoch": epoch}}
        )


def cause_of(error: BaseException) -> str:
    """Why a save failed, the same words in every process (no file name in them)."""
    if isinstance(error, OSError) and error.errno:
        return f"{os.strerror(error.errno)}, errno {errno.errorcode.get(error.errno, error.errno)}"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:160] if text else ''}".rstrip(": ")


def unsaved_line(location: str | None, error: BaseException) -> str:
    """The host's one line about saves that fail in `location` for this cause."""
    code = getattr(error, "errno", None)
    advice = {
        errno.ENOSPC: "; free some space there",
        errno.EDQUOT: "; free some space there",
        errno.EROFS: "; make it writable",
        errno.EACCES: "; make it writable by this user",
        errno.EPERM: "; make it writable by this user",
    }.get(code if isinstance(code, int) else -1, "")
    return (
        f"checkpoints cannot be saved in {location} ({cause_of(error)}): trials train on without "
        f"them and try again at each save{advice}"
    )
