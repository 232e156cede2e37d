"""A finished trial's outcome, kept on this host's disk from before it is told to the study until
the study has it all (`orchestrator.record.spool.spool` holds the entries and delivers them later).

When the database stays away past --storage-retry-seconds, telling gives up and the run exits
75; the entry stays, and the next `run` or `worker` on this host stores it before it asks for a
new trial, so a trial that finished training is not trained again. Outcomes that are re-queued
instead (out of memory, stopped, timed out) are not kept: their re-run is the way on.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.record.spool import spool
from orchestrator.record.store.optuna_private import trial_id_of
from orchestrator.record.store.storage_failures import StorageUnreachable

if TYPE_CHECKING:
    import optuna
    from optuna.trial import TrialState

    from adapters.base import Report
    from orchestrator.run.trial.context import TrialContext
    from orchestrator.run.trial.result import RunResult

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Told:
    """What the study is told of a trial's end: its state, its value(s), its attributes."""

    state: TrialState
    values: Any
    attrs: dict[str, Any] = field(default_factory=dict)


def noted(result: RunResult, report: Report) -> Report:
    """`report`, noting each (epoch, value) in `result` for the spool."""

    def noting(epoch: int, value: float) -> None:
        result.reports.append((int(epoch), float(value)))
        report(epoch, value)

    return noting


def _keeps(result: RunResult) -> bool:
    return not (result.oom or result.interrupted or result.timed_out)


@contextlib.contextmanager
def kept_until_told(
    ctx: TrialContext, trial: optuna.Trial, result: RunResult, told: Told
) -> Iterator[None]:
    """Keep the outcome on disk, send the reports an outage held back, and run the block that
    tells the study; the entry goes when it worked or failed for any reason but the database
    staying away (that one is what the entry is for)."""

    folder = None
    if ctx.config.settings.log_dir is not None and _keeps(result):
        folder = spool.spool_dir(ctx.config.settings.log_dir, ctx.config.study_name)
        values = told.values
        kept = spool.Kept(
            trial_id=trial_id_of(trial),
            number=trial.number,
            state=told.state.name,
            values=None
            if values is None
            else list(values)
            if isinstance(values, list)
            else [values],
            user_attrs=dict(told.attrs),
            reports=list(result.reports),
        )
        try:
            spool.keep(folder, kept, hold=True)  # no start on this host delivers it meanwhile
        except OSError as error:  # a full or read-only disk: tell the study without it
            logger.warning("trial %d: cannot keep its outcome on disk: %s", trial.number, error)
            folder = None
    try:
        if result.flush is not None:
            result.flush()
        yield
    except StorageUnreachable:
        if folder is not None:
            spool.release(folder, trial_id_of(trial))  # the entry stays for the next start here
        raise
    except BaseException:
        if folder is not None:
            spool.done(folder, trial_id_of(trial))
        raise
    if folder is not None:
        spool.done(folder, trial_id_of(trial))
