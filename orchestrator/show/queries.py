"""The views' reads of a storage: Optuna's trials and our orch_* tables, turned into the views' values."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.record.budget.counts import stored_count
from orchestrator.record.store.locks import schema_lock
from orchestrator.record.store.optuna_private import replace_trial_reads, study_id_of
from orchestrator.record.store.storage import create_storage, location_of
from orchestrator.record.store.storage_failures import unreachable
from orchestrator.record.study.final_scores import valued_trials
from orchestrator.record.study.spec import (
    count_trials,
    load_existing_study,
    load_spec,
    retried_trial_numbers,
    study_names,
)
from orchestrator.record.trials.best import best_lineage, directions_of, pick_best
from orchestrator.record.trials.reader import read_trials
from orchestrator.show.recommended import recommended_of
from orchestrator.show.views import (
    MULTI_OBJECTIVE,
    BestTrial,
    MemoryLine,
    StudyDetail,
    StudyRow,
    Worker,
    best_of,
    direction_of,
    oom_events,
    plan_lines,
    states_of,
    study_row,
    vram_by_gpu,
    vram_rows,
)

if TYPE_CHECKING:
    import optuna
    import sqlalchemy as sa
    from optuna.storages import RDBStorage
    from optuna.trial import FrozenTrial

    from orchestrator.record.store import migrate, records
    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.store.records import ConcurrencyEvent
else:
    optuna = LazyImport("optuna")
    sa = LazyImport("sqlalchemy")
    # Our tables and their migrations import SQLAlchemy as they load: deferred like it, so that
    # a command importing these reads keeps its `--help` free of SQLAlchemy.
    migrate = LazyImport("orchestrator.record.store.migrate")
    records = LazyImport("orchestrator.record.store.records")


def open_for_reading(location: StorageLocation) -> RDBStorage:
    """The storage at `location`, for reading: an SQLite file that does not exist is an error,
    not a new file."""
    path = location.sqlite_path
    if path is not None and not path.exists():
        raise UserError(
            f"no study database at {location.describe()}: start a study with "
            "`python -m orchestrator run ADAPTER`, or point --storage at an existing one"
        )
    storage = create_storage(location)
    bring_our_tables_up_to_date(storage)
    return storage


def bring_our_tables_up_to_date(storage: RDBStorage) -> None:
    """A database written by an earlier version has our tables at an older revision: bring them
    to this version's (new columns only, nothing stored is lost), as `run` would. One with none
    of our tables (Optuna's alone) is left as it is: the views read what is there."""
    revision = migrate.current_revision(storage)
    if revision is None or revision == migrate.head_revision():
        return
    with schema_lock(location_of(storage)):
        if migrate.current_revision(storage) != migrate.head_revision():
            migrate.upgrade_orchestrator_schema(storage)


@contextmanager
def _guarded(storage: RDBStorage) -> Iterator[None]:
    """Turn a database error during a read into the one-line 'cannot reach' message."""
    try:
        yield
    except sa.exc.SQLAlchemyError as error:
        raise unreachable(location_of(storage), error) from None


def the_study(storage: RDBStorage, name: str | None, label: str, command: str) -> str:
    """The study named, or the storage's only one; one line when it holds none, or several."""
    if name:
        return name

    with _guarded(storage):
        names = study_names(storage)
    if len(names) == 1:
        return names[0]
    if not names:
        raise UserError(
            f"no study in {label} yet: start one with `python -m orchestrator run ADAPTER`"
        )
    shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    raise UserError(
        f"{label} holds {len(names)} studies ({shown}): choose one with "
        f"`python -m orchestrator {command} --study NAME`"
    )


def list_studies(storage: RDBStorage) -> list[StudyRow]:
    """Every study with its counts and best trial: aggregate queries, no trial read in full."""
    rows = []
    with _guarded(storage):
        for study in sorted(storage.get_all_studies(), key=lambda s: s.study_name):
            directions = [d.name.lower() for d in study.directions]  # a FrozenStudy's
            count = stored_count(storage.engine, study_id_of(study))
            best = _stored_best(storage, study_id_of(study), direction_of(directions))
            rows.append(
                study_row(study.study_name, dict(study.user_attrs), directions, count, best)
            )
    return rows


def _stored_best(storage: RDBStorage, study_id: int, direction: str) -> BestTrial | None:
    if direction == MULTI_OBJECTIVE:
        return None
    try:
        trial = storage.get_best_trial(study_id)  # one ordered query, one trial read
    except ValueError:
        return None
    best = best_of([trial], direction)
    if best is None and trial.value is not None and not math.isfinite(trial.value):
        # Optuna's order puts an infinite value first; the best is among the finite ones.
        best = best_of(read_trials(storage.engine, study_id), direction)
    return best


def _has_table(storage: RDBStorage, name: str) -> bool:
    return sa.inspect(storage.engine).has_table(name)


def list_workers(storage: RDBStorage, study_name: str) -> list[Worker]:
    workers = records.workers
    if not _has_table(storage, workers.name):
        return []
    query = (
        sa.select(workers)
        .where(workers.c.study_name == study_name)
        .order_by(workers.c.started_at, workers.c.id)
    )
    with storage.engine.connect() as conn:
        return [
            Worker(
                host=row.host,
                gpu_index=row.gpu_index,
                gpu_name=row.gpu_name,
                pid=row.pid,
                started_at=row.started_at,
                last_seen=row.last_seen,
                stopped_at=row.stopped_at,
                slurm_job=row.slurm_job,
                slurm_node=row.slurm_node,
                slurm_restarts=row.slurm_restarts,
            )
            for row in conn.execute(query)
        ]


def measured_lines(
    storage: RDBStorage, adapter: str | None, gpus: Iterable[str]
) -> list[MemoryLine]:
    """Memory models measured on these kinds of GPU for this adapter (orch_memory_models)."""
    if adapter is None or not _has_table(storage, records.memory_models.name):
        return []
    lines = []
    for gpu in sorted(set(gpus)):
        model = records.load_memory_model(storage.engine, adapter=adapter, gpu_name=gpu)
        if model is not None:
            lines.append(MemoryLine(gpu, model.model_overhead_mb, model.per_sample_mb, "measured"))
    return lines


def recorded_vram(storage: RDBStorage, study_name: str) -> list[dict[str, Any]]:
    """The study's orch_trial_vram rows (none in a database without our tables)."""
    if not _has_table(storage, records.trial_vram.name):
        return []
    return records.list_trial_vram(storage.engine, study_name)


def recorded_concurrency(storage: RDBStorage, study_name: str) -> list[ConcurrencyEvent]:
    """The study's concurrency changes from orch_concurrency_events."""
    if not _has_table(storage, records.concurrency_events.name):
        return []
    return records.list_concurrency_events(storage.engine, study_name)


def study_detail(
    storage: RDBStorage,
    name: str,
    storage_label: str,
    trials: list[FrozenTrial] | None = None,
) -> StudyDetail:
    """Everything `status --study`, `best` and `report` show about one study (`trials`: its
    trials, when the caller has read them already)."""
    with _guarded(storage):  # Optuna's study and trials, then our orch_* tables
        study = load_existing_study(storage, name, storage_label)
        spec = load_spec(study)
        if trials is None:
            trials = read_trials(storage.engine, study_id_of(study))
        directions = directions_of(study)
        rows = vram_rows(trials, recorded_vram(storage, name))
        events = recorded_concurrency(storage, name)
        workers_seen = list_workers(storage, name)
        adapter = spec.adapter if spec else None
        lines = plan_lines(rows) + measured_lines(storage, adapter, (r.gpu for r in rows))
    direction = direction_of(directions)
    count = count_trials(trials)
    best = best_of(trials, direction)
    return StudyDetail(
        name=name,
        adapter=adapter,
        direction=direction,
        budget=spec.trials if spec else None,
        epochs=spec.epochs if spec else None,
        sampler=spec.sampler if spec else None,
        states=states_of(trials),
        counted=count.counted,
        retried=count.retried,
        best=best,
        workers=workers_seen,
        concurrency_events=events,
        ooms=oom_events(trials, retried_trial_numbers(trials)),
        vram=rows,
        vram_by_gpu=vram_by_gpu(rows),
        memory_lines=lines,
        directions=directions,
        lineage=best_lineage(trials, best.number if best else None),
        recommended=recommended_of(trials, directions) if best is not None else None,
        valued=valued_trials(trials),
        metric=(study.metric_names or ["value"])[0] if len(directions) == 1 else "value",
    )


def load_study_trials(storage: RDBStorage, name: str, storage_label: str) -> optuna.Study:
    """The study for Optuna's own plots: a snapshot of its trials, read once in flat queries.

    Optuna's plotting functions ask a study for its trials many times over and deep-copy them
    each time; at 3,000 trials that alone took the report past 20 s. The snapshot is an
    in-memory study that hands out the trials read once, without copying them."""
    with _guarded(storage):
        study = load_existing_study(storage, name, storage_label)
        trials = read_trials(storage.engine, study_id_of(study), intermediate_values=True)
    return snapshot_study(study, trials)


def snapshot_study(study: optuna.Study, trials: list[FrozenTrial]) -> optuna.Study:
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created in memory"
    try:
        snapshot = optuna.create_study(study_name=study.study_name, directions=study.directions)
    finally:
        optuna.logging.set_verbosity(verbosity)
    for key, value in study.user_attrs.items():  # the study's settings: its metric, its spec
        snapshot.set_user_attr(key, value)
    if study.metric_names:  # what each objective is called (optuna's set_metric_names)
        snapshot.set_metric_names(study.metric_names)

    def get_trials(deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list:
        return [t for t in trials if states is None or t.state in states]

    directions = directions_of(study)

    def best_trial(deepcopy: bool = True) -> FrozenTrial:
        best = pick_best(trials, directions)
        if best is None:  # what Optuna's own study raises
            raise ValueError("No trials are completed yet.")
        return best

    # Instance attributes win over the class's methods (and over `trials`, `best_trial`,
    # `best_value` and `best_params`, which call them).
    replace_trial_reads(snapshot, get_trials, best_trial)
    return snapshot


def trial_log_file(storage: RDBStorage, study_name: str, number: int, storage_label: str) -> str:
    """Where trial `number` of the study kept its own output; one line when there is no such
    trial, or it kept no log."""
    study = load_existing_study(storage, study_name, storage_label)
    try:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id_of(study), number)
    except KeyError:
        raise UserError(
            f"study {study_name!r} has no trial {number}: `python -m orchestrator status "
            f"--study {study_name}` lists its trials"
        ) from None
    path = storage.get_trial(trial_id).user_attrs.get("log_file")
    if not path:
        raise UserError(
            f"trial {number} of {study_name!r} kept no log (it did not run, or ran before "
            "trials kept logs)"
        )
    return path
