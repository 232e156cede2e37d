"""A finished trial's outcome kept on this host's disk until the study database has it.

A trial process writes its trial's outcome here (`keep`) before it tells the study, and removes
it (`done`) once the study has it all. When the database stays away past
--storage-retry-seconds the run exits 75 and the entry stays: the trial had finished training,
and its result must not be thrown away and trained again. The next `run` or `worker` on this
host with the same log folder delivers every entry (`deliver`) before it asks for a new trial:
a trial still RUNNING gets its reports, attributes and result; one the study has finished since
(failed as lost by another host) keeps that, and the entry is dropped, in one line each.

The spool sits beside the trial logs, one JSON file per trial, written whole (to a temporary
name, then renamed) so a crash mid-write never leaves half an entry.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.record.optuna_private import storage_of, study_id_of, trial_id_of

if TYPE_CHECKING:
    import optuna

logger = logging.getLogger(__name__)

SPOOL_FOLDER = "spool"


@dataclass(frozen=True)
class Kept:
    """One trial's outcome as it is told to the study: all plain JSON values."""

    trial_id: int
    number: int
    state: str  # COMPLETE, PRUNED or FAIL
    values: list[float] | None
    user_attrs: dict[str, Any] = field(default_factory=dict)
    reports: list[tuple[int, float]] = field(default_factory=list)  # (epoch, value), in order


def spool_dir(log_dir: str | os.PathLike[str], study_name: str) -> Path:
    """Where a study's kept outcomes lie: beside its trial logs (see `trial_log_path`)."""
    from orchestrator.record.trial_logs import trial_log_path

    return trial_log_path(log_dir, study_name, 0).parent / SPOOL_FOLDER


def _path(folder: Path, trial_id: int) -> Path:
    return folder / f"trial-id-{trial_id}.json"


def keep(folder: Path, kept: Kept) -> Path:
    """Write `kept` whole; its path."""
    from orchestrator.record.trial_logs import private_folder

    private_folder(folder)  # 0700, as the trial logs beside it
    path = _path(folder, kept.trial_id)
    partial = path.with_suffix(".partial")
    with open(partial, "w") as out:
        json.dump(asdict(kept), out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)
    return path


def done(folder: Path, trial_id: int) -> None:
    """The study has the trial's outcome: its entry goes."""
    with contextlib.suppress(FileNotFoundError):
        _path(folder, trial_id).unlink()


def kept_in(folder: Path) -> list[Kept]:
    """The entries waiting in `folder`, by trial number (an unreadable one is named and left)."""
    entries = []
    for path in sorted(folder.glob("trial-id-*.json")) if folder.is_dir() else []:
        try:
            raw = json.loads(path.read_text())
            raw["reports"] = [tuple(pair) for pair in raw.get("reports", [])]
            entries.append(Kept(**raw))
        except (OSError, ValueError, TypeError) as error:
            logger.warning(
                "a kept trial outcome %s cannot be read (%s); it is left there", path, error
            )
    return sorted(entries, key=lambda k: k.number)


def deliver_kept(study: optuna.Study, log_dir: str | os.PathLike[str]) -> int:
    """Tell the study what its trials kept in the spool under `log_dir`; how many it took."""
    return deliver(study, spool_dir(log_dir, study.study_name))


def deliver(study: optuna.Study, folder: Path) -> int:
    """Tell the study every outcome kept in `folder`; how many it took. One line each."""
    from optuna.trial import TrialState

    from orchestrator.record.outage import ride_out

    taken = 0
    for kept in kept_in(folder):
        frozen = ride_out(lambda k=kept: _stored(study, k), what="read a kept trial")
        if frozen is None:
            logger.warning(
                "trial %d kept in %s is not a trial of this study's database; it is dropped",
                kept.number,
                folder,
            )
        elif frozen.state.name == kept.state:
            pass  # stored already (by another process of this host delivering it too)
        elif frozen.state != TrialState.RUNNING:
            logger.warning(
                "trial %d was %s meanwhile; the result kept while the database was away is dropped",
                kept.number,
                frozen.state.name,
            )
        else:
            ride_out(lambda k=kept, f=frozen: _tell(study, k, f), what=f"store trial {kept.number}")
            logger.warning(
                "trial %d: its result (%s), kept while the database was away, is stored now",
                kept.number,
                kept.state,
            )
            taken += 1
        done(folder, kept.trial_id)
    return taken


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
    from optuna.trial import TrialState

    storage = storage_of(study)
    if storage.get_trial(kept.trial_id).state != TrialState.RUNNING:
        return  # a ride_out retried after the commit: it is stored
    for epoch, value in kept.reports:
        if epoch not in frozen.intermediate_values:
            storage.set_trial_intermediate_value(kept.trial_id, int(epoch), float(value))
    for key, value in kept.user_attrs.items():
        storage.set_trial_user_attr(kept.trial_id, key, value)
    state = TrialState[kept.state]
    values = kept.values if state == TrialState.COMPLETE else None
    study.tell(kept.number, values, state=state)  # Optuna's own rules, as the trial would have
