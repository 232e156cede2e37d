"""A finished trial's outcome kept on this host's disk until the study database has it.

A trial process writes its trial's outcome here (`keep`) before it tells the study, and removes
it (`done`) once the study has it all. When the database stays away past
--storage-retry-seconds the run exits 75 and the entry stays: the trial had finished training,
and its result must not be thrown away and trained again. The next `run` or `worker` on this
host with the same log folder delivers every entry (`deliver`) before it asks for a new trial:
a trial still RUNNING gets its reports, attributes and result; one the study has finished since
(failed as lost, or finished by another host) keeps that, and the entry is dropped, in one line
each.

The spool sits beside the trial logs, one JSON file per trial, readable by the user only (0600)
and written whole (to a temporary name, then renamed) so a crash mid-write never leaves half an
entry. Each entry carries the sha256 of its content (state, values, attributes, reports): an
entry that was edited, cut short or is not one of ours at all (unreadable JSON, an unknown
state) is set aside in `spool/rejected/` with one line naming the file, and is never stored, so
it can neither stop a later start nor become the study's best trial. Its trial, still RUNNING,
is failed as lost by the next look for stale trials and runs again.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.record.outages.riding import ride_out
from orchestrator.record.spool.entry import Kept, Rejected, entry_path, entry_text, parse
from orchestrator.record.store.optuna_private import storage_of, study_id_of, trial_id_of
from orchestrator.record.trials.logs import private_folder, trial_log_path

try:
    import fcntl
except ImportError:  # not POSIX: no file locks (see `_lock`)
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    import optuna
else:
    optuna = LazyImport("optuna")

logger = logging.getLogger(__name__)

SPOOL_FOLDER = "spool"
REJECTED_FOLDER = "rejected"


def spool_dir(log_dir: str | os.PathLike[str], study_name: str) -> Path:
    """Where a study's kept outcomes lie: beside its trial logs (see `trial_log_path`)."""
    return trial_log_path(log_dir, study_name, 0).parent / SPOOL_FOLDER


def _path(folder: Path, trial_id: int) -> Path:
    return entry_path(folder, trial_id)


def _make_folder(folder: Path) -> None:
    # The user's only: a kept outcome is the user's data. The study's folder above it is made
    # 0700 too (as the trial logs make it); chmod fixes a folder an earlier version made wider.
    private_folder(folder)
    with contextlib.suppress(OSError):
        os.chmod(folder, 0o700)


# Entries this process writes and still holds: path -> the open file holding its lock. Every
# `run` and `worker` of a host shares the folder, and one that starts must not deliver an entry
# whose trial process is alive and telling the study itself: the lock says the writer lives
# (the system drops it when the process ends, however it ends).
_held: dict[Path, int] = {}


def keep(folder: Path, kept: Kept, *, hold: bool = False) -> Path:
    """Write `kept` whole, for the user only (0600); its path. `hold`: keep the entry locked
    until `done` or `release`, so no start on this host delivers it meanwhile."""
    _make_folder(folder)
    path = _path(folder, kept.trial_id)
    partial = path.with_suffix(".partial")
    fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older partial file keeps its mode through O_CREAT
        if hold:
            _lock(fd, wait=True)  # before the rename: the entry is never seen unlocked
        data = memoryview(entry_text(kept).encode())
        while data:  # a write may take only part of it
            data = data[os.write(fd, data) :]
        os.fsync(fd)
        os.replace(partial, path)
    except BaseException:
        os.close(fd)
        # A full disk must not leave a half-written entry for a later start to read.
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
    if hold:
        release(folder, kept.trial_id)
        _held[path] = fd
    else:
        os.close(fd)
    return path


def release(folder: Path, trial_id: int) -> None:
    """Let go of the lock on an entry this process holds; the entry stays for a later start."""
    fd = _held.pop(_path(folder, trial_id), None)
    if fd is not None:
        os.close(fd)


def done(folder: Path, trial_id: int) -> None:
    """The study has the trial's outcome: its entry goes."""
    with contextlib.suppress(FileNotFoundError):
        _path(folder, trial_id).unlink()
    release(folder, trial_id)


def _lock(fd: int, *, wait: bool) -> bool:
    """Lock the open file `fd` for this process: whether it got the lock (without `wait`, False
    when another process holds it). Where there are no file locks (not POSIX, a filesystem
    without them), always True: keeping the outcome matters more than the lock."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError:
        return True  # a filesystem without locks (some NFS): the entry is kept all the same
    return True


@contextlib.contextmanager
def _delivering(path: Path) -> Iterator[bool]:
    """Whether this process may deliver the entry at `path` now: it is still there and no live
    process holds it (its trial process, or another start delivering it). Held meanwhile."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield False  # stored and removed meanwhile
        return
    try:
        yield _lock(fd, wait=False) and os.fstat(fd).st_nlink > 0
    finally:
        os.close(fd)


def unwritable(folder: Path) -> str | None:
    """Why outcomes cannot be kept in `folder` (made if missing), or None when they can."""
    try:
        _make_folder(folder)
        probe = folder / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        if folder.exists() and not folder.is_dir():
            return "a file is in its place"
        return error.strerror or str(error)
    return None


def read_spool(folder: Path) -> tuple[list[Kept], list[tuple[Path, str]]]:
    """The sound entries in `folder` by trial number, and each unsound file with why."""
    entries, unsound = [], []
    for path in sorted(folder.glob("trial-id-*.json")) if folder.is_dir() else []:
        try:
            entries.append(parse(path.read_text(errors="replace"), path))
        except Rejected as why:
            unsound.append((path, str(why)))
        except FileNotFoundError:
            pass  # delivered meanwhile by another process of this host
        except OSError as error:
            unsound.append((path, f"cannot be read ({error.strerror or error})"))
    return sorted(entries, key=lambda k: k.number), unsound


def kept_in(folder: Path) -> list[Kept]:
    """The sound entries waiting in `folder`, by trial number."""
    return read_spool(folder)[0]


def set_aside(path: Path, why: str) -> None:
    """Move an unsound spool file to `rejected/` beside it, in one line naming it and why."""
    rejected = path.parent / REJECTED_FOLDER
    try:
        _make_folder(rejected)
        os.replace(path, rejected / path.name)
    except FileNotFoundError:
        return  # set aside meanwhile by another process of this host
    except OSError as error:
        logger.warning(
            "the kept trial outcome %s %s; it is not stored, and cannot be moved to %s (%s): "
            "delete it",
            path,
            why,
            rejected,
            error.strerror or error,
        )
        return
    logger.warning(
        "the kept trial outcome %s %s; it is not stored (set aside in %s)",
        path,
        why,
        rejected,
    )


def deliver_kept(study: optuna.Study, log_dir: str | os.PathLike[str]) -> int:
    """Say at once when this host cannot keep outcomes under `log_dir` (one line: a trial log
    would be the only place it shows), then tell the study what its trials kept there; how many
    it took."""
    folder = spool_dir(log_dir, study.study_name)
    problem = unwritable(folder)
    if problem is not None:
        logger.warning(
            "the spool folder %s is not writable (%s): a trial that finishes while the database "
            "is away cannot keep its result and trains again; give --log-dir a writable folder",
            folder,
            problem,
        )
    return deliver(study, folder)


def deliver(study: optuna.Study, folder: Path) -> int:
    """Tell the study every outcome kept in `folder`; how many it took. One line each; an
    unsound file is set aside, never stored, and never stops the start."""
    entries, unsound = read_spool(folder)
    for path, why in unsound:
        set_aside(path, why)
    taken = 0
    for kept in entries:
        with _delivering(_path(folder, kept.trial_id)) as mine:
            if not mine:
                continue  # its trial process is alive and tells the study itself
            try:
                taken += _deliver_one(study, folder, kept)
            except ValueError as error:  # Optuna refuses the values (not the study's directions)
                set_aside(_path(folder, kept.trial_id), f"cannot be stored ({error})")
                continue
            done(folder, kept.trial_id)
    return taken


def _deliver_one(study: optuna.Study, folder: Path, kept: Kept) -> bool:
    """Store one entry, saying what became of it in one line: whether the study took it."""
    frozen = ride_out(lambda: _stored(study, kept), what="read a kept trial")
    if frozen is None:
        logger.warning(
            "trial %d kept in %s is not a trial of this study's database; it is dropped",
            kept.number,
            folder,
        )
        return False
    if frozen.state.name == kept.state:
        return False  # stored already (by another process of this host delivering it too)
    if frozen.state.is_finished() or not _told(study, kept, frozen):
        logger.warning(
            "trial %d was finished meanwhile (%s, by another host or as lost); the result "
            "kept while the database was away is dropped",
            kept.number,
            _state_now(study, kept, frozen),
        )
        return False
    logger.warning(
        "trial %d: its result (%s), kept while the database was away, is stored now",
        kept.number,
        kept.state,
    )
    return True


def _state_now(study: optuna.Study, kept: Kept, frozen: Any) -> str:
    if frozen.state.is_finished():
        return str(frozen.state.name)
    now = ride_out(lambda: storage_of(study).get_trial(kept.trial_id), what="read a kept trial")
    return str(now.state.name)


def _told(study: optuna.Study, kept: Kept, frozen: Any) -> bool:
    """Store `kept` for its RUNNING trial: True, or False when another process finished the
    trial between the look and the write (Optuna refuses to change a finished trial)."""
    try:
        ride_out(lambda: _tell(study, kept, frozen), what=f"store trial {kept.number}")
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    now = ride_out(lambda: storage_of(study).get_trial(kept.trial_id), what="read a kept trial")
    return bool(now.state.name == kept.state)


def _stored(study: optuna.Study, kept: Kept) -> Any:
    """The study's trial the entry names, or None (another database with a study of this name)."""
    try:
        frozen = storage_of(study).get_trial(kept.trial_id)
    except KeyError:
        return None
    trials = storage_of(study).get_all_trials(study_id_of(study), deepcopy=False)
    ids = {trial_id_of(t) for t in trials}
    return frozen if frozen.number == kept.number and kept.trial_id in ids else None


def _tell(study: optuna.Study, kept: Kept, frozen: Any) -> None:
    storage = storage_of(study)
    if storage.get_trial(kept.trial_id).state != optuna.trial.TrialState.RUNNING:
        return  # a ride_out retried after the commit, or another host finished it: the caller looks
    for epoch, value in kept.reports:
        if epoch not in frozen.intermediate_values:
            storage.set_trial_intermediate_value(kept.trial_id, int(epoch), float(value))
    for key, value in kept.user_attrs.items():
        storage.set_trial_user_attr(kept.trial_id, key, value)
    state = optuna.trial.TrialState[kept.state]
    values = kept.values if state == optuna.trial.TrialState.COMPLETE else None
    try:
        study.tell(kept.number, values, state=state)  # Optuna's own rules, as the trial would have
    except ValueError as error:
        if storage.get_trial(kept.trial_id).state.is_finished():  # "Cannot tell a FAIL trial."
            raise optuna.exceptions.UpdateFinishedTrialError(str(error)) from None
        raise
