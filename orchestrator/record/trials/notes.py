"""A trial's optuna-dashboard note: what a person looks for first, at the top of the trial's page.

The dashboard lists user attributes in a box far down the page, alphabetically, so `vram_peak_mb`
sits below the fold, under an OOM's long `error`. Its markdown note is drawn near the top:
`trial_note` builds one from what the trial recorded (pure), `write_trial_note` stores it where
optuna-dashboard keeps notes (the study's system attributes, in chunks of 2,045 characters, with a
version per note), from any process, on SQLite or PostgreSQL.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.record.store.optuna_private import (
    rdb_storage_of,
    storage_of,
    study_id_of,
    trial_id_of,
)
from orchestrator.record.trials import attr_names as names

if TYPE_CHECKING:
    import optuna
    import sqlalchemy as sa
    from optuna.trial import FrozenTrial
    from optuna_dashboard import _note as dashboard_note
else:
    dashboard_note = LazyImport("optuna_dashboard._note")
    optuna = LazyImport("optuna")
    sa = LazyImport("sqlalchemy")

logger = logging.getLogger(__name__)

LOG_FILE_ATTR = "log_file"  # the user attribute that holds a trial's log file, where it has one
MAX_REASON = 300  # characters of an error shown in the note; the whole one is in `error`


def trial_note(trial: FrozenTrial, *, metric: str = "value") -> str:
    """The note's markdown, from the trial's state, value and user attributes."""
    attrs = trial.user_attrs
    lines = [f"### Trial {trial.number}: {_outcome(trial, metric)}", ""]
    lines.append(f"- **GPU**: {_gpu(attrs)}")
    lines.append(f"- **VRAM**: {_vram(attrs)}")
    lines.append(f"- **batch size**: {_batch(trial.params, attrs)}")
    if attrs.get(names.CONCURRENCY) is not None:
        slots = int(attrs[names.CONCURRENCY])
        lines.append(
            f"- **slots**: {slots} {'trial' if slots == 1 else 'trials'} at once on this GPU"
        )
    lines.append(f"- **out of memory**: {_oom(attrs)}")
    if attrs.get(names.ERROR) and not attrs.get(names.OOM):
        lines.append(f"- **error**: {_short(attrs['error'])}")
    if attrs.get("enqueued_from"):
        lines.append(f"- **parameters from**: {attrs['enqueued_from']}")
    if attrs.get(names.INTENSIFY_OF) is not None:  # orchestrator/intensify.py
        seeds = attrs.get(names.SEED_OFFSET)
        again = "" if seeds is None else f", seeds from the study's seed + {seeds}"
        lines.append(
            f"- **re-run of**: the recommended trial {attrs[names.INTENSIFY_OF]} "
            f"(`--intensify`): the same parameters{again}"
        )
    if attrs.get(LOG_FILE_ATTR):
        # Absolute: the dashboard may run from another directory than the trials did.
        lines.append(f"- **log**: `{Path(attrs[LOG_FILE_ATTR]).resolve()}`")
    return "\n".join(lines) + "\n"


def _outcome(trial: FrozenTrial, metric: str) -> str:
    state = trial.state.name
    if state == "PRUNED" and trial.intermediate_values:  # its value, if any, is this epoch's
        last = max(trial.intermediate_values)
        value = trial.intermediate_values[last]
        return f"PRUNED at epoch {last} ({metric} {value:.6g})"
    if trial.values is not None:  # `values`: reading `value` of several objectives raises
        if len(trial.values) == 1:
            return f"{state}, {metric} {trial.values[0]:.6g}"
        return f"{state}, " + ", ".join(f"{v:.6g}" for v in trial.values)
    return state


def _gpu(attrs: Mapping[str, Any]) -> str:
    name = attrs.get(names.GPU) or "not recorded"
    where = []
    if attrs.get(names.GPU_INDEX) is not None:
        where.append(f"#{attrs['gpu_index']}")
    if attrs.get(names.HOST):
        where.append(f"on {attrs['host']}")
    return f"{name} ({' '.join(where)})" if where else str(name)


def _vram(attrs: Mapping[str, Any]) -> str:
    peak, planned = (
        _number(attrs.get(names.VRAM_PEAK_MB)),
        _number(attrs.get(names.VRAM_PLANNED_MB)),
    )
    if peak is None and planned is None:
        return "not measured"
    parts = []
    if peak is not None:
        parts.append(f"{peak:,.0f} MB peak")
    if planned is not None:
        parts.append(f"{planned:,.0f} MB planned")
    text = " of ".join(parts)
    if peak is not None and planned:
        text += f" ({peak / planned:.2f}x the plan)"
    return text


def _batch(params: Mapping[str, Any], attrs: Mapping[str, Any]) -> str:
    size = params.get(names.BATCH_SIZE)
    bounds = attrs.get(names.BATCH_BOUNDS)
    text = str(size) if size is not None else "none"
    if isinstance(bounds, list | tuple) and len(bounds) == 2:
        text += f" (this GPU's bounds {bounds[0]}..{bounds[1]})"
    if attrs.get("batch_size_fitted_from") is not None:
        text += f", brought in from {attrs['batch_size_fitted_from']}"
    return text


def _oom(attrs: Mapping[str, Any]) -> str:
    if not attrs.get(names.OOM):
        return "no"
    reason = _short(attrs.get(names.ERROR) or "out of memory")
    return f"**yes**: {reason}"


def _short(text: Any) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 3] + "..."


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def write_trial_note(
    study: optuna.Study, trial: FrozenTrial, *, metric: str = "value"
) -> str | None:
    """Build the trial's note and save it as its optuna-dashboard note; the markdown written.

    Called by the trial process after `tell`, when the trial's outcome is already stored: a note
    that cannot be written (the storage gone for a moment) costs a warning, never the trial."""
    try:
        body = trial_note(trial, metric=metric)
        save_trial_note(study, trial_id_of(trial), body)
    except Exception as error:  # SQLAlchemyError, or a record the note cannot read
        logger.warning("no dashboard note for trial %d: %s", trial.number, error)
        return None
    return body


def save_trial_note(study: optuna.Study, trial_id: int, body: str) -> None:
    """Store a note as optuna-dashboard does (`optuna_dashboard.save_note` takes a live Trial,
    which a finished trial no longer is): read this trial's note keys, then write the version and
    the chunks; chunks of a longer earlier note are blanked, as the dashboard does."""
    storage, study_id = storage_of(study), study_id_of(study)
    save_note(storage, study_id, trial_id, _note_attrs(storage, study_id, trial_id), body)


def save_note(
    storage: Any, study_id: int, trial_id: int | None, existing: dict[str, Any], body: str
) -> None:
    """Write `body` as the note of a trial (or, with `trial_id` None, of the study) in
    optuna-dashboard's layout, given the note keys `existing` already among the study's system
    attributes: the next version, the chunks, and blanks over a longer earlier note's chunks."""
    version = int(existing.get(dashboard_note.note_ver_key(trial_id), 0)) + 1
    storage.set_study_system_attr(study_id, dashboard_note.note_ver_key(trial_id), version)
    chunks = dashboard_note.split_body(body, trial_id)
    for key, text in chunks.items():
        storage.set_study_system_attr(study_id, key, text)
    prefix = dashboard_note.note_str_key_prefix(trial_id)
    old = sum(1 for key in existing if key.startswith(prefix))
    for i in range(len(chunks), old):
        storage.set_study_system_attr(study_id, f"{prefix}{i}", "")


def _note_attrs(storage: Any, study_id: int, trial_id: int) -> dict[str, Any]:
    """This trial's note keys among the study's system attributes. On a database only its own
    rows are read, so the cost stays flat as the study (and its notes) grow; elsewhere, all."""
    backend = rdb_storage_of(storage)  # load_study wraps an RDBStorage in a cache
    prefix = f"dashboard:{trial_id}:"
    if not isinstance(backend, optuna.storages.RDBStorage):
        attrs = storage.get_study_system_attrs(study_id)
        return {k: v for k, v in attrs.items() if k.startswith(prefix)}
    query = sa.text(  # Optuna's own table; the prefix holds no LIKE wildcard but ':'
        "SELECT key, value_json FROM study_system_attributes "
        "WHERE study_id = :study AND key LIKE :prefix"
    )
    with backend.engine.connect() as conn:
        rows = conn.execute(query, {"study": study_id, "prefix": prefix + "%"}).all()
    return {key: json.loads(value) for key, value in rows if key.startswith(prefix)}
