"""Our own tables (orch_*), beside Optuna's in the same database, and the few reads and writes on them.

The schema is owned by the alembic chain in `migrations/`; these Table objects mirror it so code
and autogenerate agree. Every function takes an SQLAlchemy Engine: the caller decides where.
Every read and write rides out a database outage (`orchestrator.record.outages.riding`); an insert that is
retried first looks for the row its lost attempt may have committed, so none is written twice.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from orchestrator.imports import LazyImport
from orchestrator.record.outages.riding import retried, ride_out
from orchestrator.record.trials.slurm_task import slurm_task_of

if TYPE_CHECKING:
    from sqlalchemy.dialects import postgresql, sqlite
    from sqlalchemy.engine import Engine
    from sqlalchemy.schema import SchemaItem
else:
    postgresql = LazyImport("sqlalchemy.dialects.postgresql")
    sqlite = LazyImport("sqlalchemy.dialects.sqlite")

# Optuna owns alembic's default `alembic_version`; our chain keeps its revision here.
VERSION_TABLE = "orchestrator_alembic_version"

metadata = sa.MetaData()

workers = sa.Table(
    "orch_workers",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("study_name", sa.String(512), nullable=False, index=True),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("gpu_index", sa.Integer, nullable=True),
    sa.Column("gpu_name", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started_at", sa.DateTime, nullable=False),
    sa.Column("last_seen", sa.DateTime, nullable=False),
    sa.Column("stopped_at", sa.DateTime, nullable=True),
    # The Slurm job it ran under (JOBID, or ARRAYJOB_TASK as squeue shows it), its node, and how
    # often Slurm had requeued it: NULL for a worker started any other way.
    sa.Column("slurm_job", sa.String(64), nullable=True),
    sa.Column("slurm_node", sa.String(255), nullable=True),
    sa.Column("slurm_restarts", sa.Integer, nullable=True),
)

trial_vram = sa.Table(
    "orch_trial_vram",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("study_name", sa.String(512), nullable=False, index=True),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("gpu_index", sa.Integer, nullable=True),
    sa.Column("gpu_name", sa.String(255), nullable=False),
    sa.Column("batch_size", sa.Integer, nullable=True),
    sa.Column("vram_planned_mb", sa.Float, nullable=True),
    sa.Column("vram_peak_mb", sa.Float, nullable=True),
    sa.Column("concurrency", sa.Integer, nullable=True),
    sa.Column("oom", sa.Boolean, nullable=False, default=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("recorded_at", sa.DateTime, nullable=False),
    sa.Column("pid", sa.Integer, nullable=True),  # the trial process (one runs many trials)
    # How long the trial's ask waited for the study's budget lock, and held it.
    sa.Column("ask_wait_ms", sa.Float, nullable=True),
    sa.Column("ask_held_ms", sa.Float, nullable=True),
)

concurrency_events = sa.Table(
    "orch_concurrency_events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("study_name", sa.String(512), nullable=False, index=True),
    sa.Column("at", sa.DateTime, nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("gpu_index", sa.Integer, nullable=True),
    sa.Column("gpu_name", sa.String(255), nullable=False),
    sa.Column("from_slots", sa.Integer, nullable=False),
    sa.Column("to_slots", sa.Integer, nullable=False),
    sa.Column("reason", sa.String(16), nullable=False),  # start | rampup | oom | watchdog | degrade
    sa.Column("detail", sa.Text, nullable=True),
    # The memory our trials on that GPU may plan to hold at once, before and after (None: no limit).
    sa.Column("from_mb", sa.Float, nullable=True),
    sa.Column("to_mb", sa.Float, nullable=True),
)

memory_models = sa.Table(
    "orch_memory_models",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("adapter", sa.String(255), nullable=False),
    sa.Column("gpu_name", sa.String(255), nullable=False),
    sa.Column("model_overhead_mb", sa.Float, nullable=False),
    sa.Column("per_sample_mb", sa.Float, nullable=False),
    sa.Column("source", sa.String(32), nullable=False),  # calibration | trials
    sa.Column("samples", sa.Integer, nullable=False),
    sa.Column("measured_at", sa.DateTime, nullable=False),
    sa.UniqueConstraint("adapter", "gpu_name", name="uq_orch_memory_models_adapter_gpu"),
)

batch_limits = sa.Table(
    "orch_batch_limits",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("study_name", sa.String(512), nullable=False),
    sa.Column("gpu_name", sa.String(255), nullable=False),
    sa.Column("max_batch_size", sa.Integer, nullable=False),
    sa.Column("trial_number", sa.Integer, nullable=True),
    sa.Column("recorded_at", sa.DateTime, nullable=False),
    sa.UniqueConstraint("study_name", "gpu_name", name="uq_orch_batch_limits_study_gpu"),
)

TABLE_NAMES = frozenset(metadata.tables)


def include_object(
    obj: SchemaItem,
    name: str | None,
    type_: str,
    reflected: bool,
    compare_to: SchemaItem | None,
) -> bool:
    """Alembic's filter, an allow-list: a table that is not ours (Optuna's, a user's) is never
    created, altered or dropped by our migrations or their autogenerate."""
    if type_ == "table":
        return name in TABLE_NAMES
    table = getattr(obj, "table", None)
    return table is None or table.name in TABLE_NAMES


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def _insert_once(engine: Engine, table: sa.Table, values: dict[str, Any], *, what: str) -> int:
    """INSERT one row, riding out an outage. A connection lost at the commit leaves it unknown
    whether the row landed: each retry looks for it (every value equal) before inserting again."""
    attempts = 0

    def insert() -> int:
        nonlocal attempts
        attempts += 1
        with engine.begin() as conn:
            if attempts > 1:
                match = sa.and_(
                    *(
                        table.c[k].is_(None) if v is None else table.c[k] == v
                        for k, v in values.items()
                    )
                )
                found = conn.execute(sa.select(table.c.id).where(match).limit(1)).scalar()
                if found is not None:
                    return int(found)
            return int(conn.execute(table.insert().values(**values)).inserted_primary_key[0])

    return ride_out(insert, what=what)


# --- workers -------------------------------------------------------------------------------


def register_worker(
    engine: Engine,
    *,
    study_name: str,
    host: str,
    gpu_index: int | None,
    gpu_name: str,
    pid: int,
    environ: Mapping[str, str] = os.environ,
) -> int:
    """A worker's row; under Slurm with the job it runs under (read from its environment)."""
    stamp = now()
    slurm = slurm_task_of(environ)
    values = {
        "study_name": study_name,
        "host": host,
        "gpu_index": gpu_index,
        "gpu_name": gpu_name,
        "pid": pid,
        "started_at": stamp,
        "last_seen": stamp,
        "slurm_job": slurm.job if slurm else None,
        "slurm_node": slurm.node if slurm else None,
        "slurm_restarts": slurm.restarts if slurm else None,
    }
    return _insert_once(engine, workers, values, what="register this worker")


@retried("record that this worker is alive")
def touch_worker(engine: Engine, worker_id: int, *, stopped: bool = False) -> None:
    stamp = now()
    values: dict[str, Any] = {"last_seen": stamp}
    if stopped:
        values["stopped_at"] = stamp
    with engine.begin() as conn:
        conn.execute(workers.update().where(workers.c.id == worker_id).values(**values))


# --- concurrency events --------------------------------------------------------------------


@dataclass(frozen=True)
class ConcurrencyEvent:
    at: dt.datetime
    host: str
    gpu_index: int | None
    gpu_name: str
    from_slots: int  # trials of the typical footprint that the memory allowed, before and after
    to_slots: int
    reason: str
    detail: str | None
    from_mb: float | None = None
    to_mb: float | None = None


def record_concurrency_event(engine: Engine, *, study_name: str, event: ConcurrencyEvent) -> None:
    values = {
        "study_name": study_name,
        "at": event.at,
        "host": event.host,
        "gpu_index": event.gpu_index,
        "gpu_name": event.gpu_name,
        "from_slots": event.from_slots,
        "to_slots": event.to_slots,
        "reason": event.reason,
        "detail": event.detail,
        "from_mb": event.from_mb,
        "to_mb": event.to_mb,
    }
    _insert_once(engine, concurrency_events, values, what="record a change of slots")


@retried("read the changes of slots")
def list_concurrency_events(engine: Engine, study_name: str) -> list[ConcurrencyEvent]:
    query = (
        sa.select(concurrency_events)
        .where(concurrency_events.c.study_name == study_name)
        .order_by(concurrency_events.c.at, concurrency_events.c.id)
    )
    with engine.connect() as conn:
        return [
            ConcurrencyEvent(
                at=row.at,
                host=row.host,
                gpu_index=row.gpu_index,
                gpu_name=row.gpu_name,
                from_slots=row.from_slots,
                to_slots=row.to_slots,
                reason=row.reason,
                detail=row.detail,
                from_mb=row.from_mb,
                to_mb=row.to_mb,
            )
            for row in conn.execute(query)
        ]


# --- per-trial VRAM ------------------------------------------------------------------------


def record_trial_vram(engine: Engine, *, study_name: str, trial_number: int, **values: Any) -> None:
    row = {"study_name": study_name, "trial_number": trial_number, "recorded_at": now(), **values}
    _insert_once(engine, trial_vram, row, what=f"record the VRAM of trial {trial_number}")


@retried("read the VRAM of the trials")
def list_trial_vram(engine: Engine, study_name: str) -> list[dict[str, Any]]:
    query = (
        sa.select(trial_vram)
        .where(trial_vram.c.study_name == study_name)
        .order_by(trial_vram.c.trial_number, trial_vram.c.id)
    )
    with engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(query)]


# --- memory models and batch limits --------------------------------------------------------


@dataclass(frozen=True)
class MeasuredMemoryModel:
    model_overhead_mb: float
    per_sample_mb: float
    source: str
    samples: int
    measured_at: dt.datetime


def _insert(engine: Engine, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
    """INSERT with ON CONFLICT, in the dialect at hand (both PostgreSQL and SQLite have it)."""
    if engine.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


@retried("store a measured memory model")
def save_memory_model(
    engine: Engine,
    *,
    adapter: str,
    gpu_name: str,
    model_overhead_mb: float,
    per_sample_mb: float,
    source: str,
    samples: int,
) -> None:
    """Store (or replace) the measured memory model of an adapter on one kind of GPU.

    One statement, so that workers finishing at once on several nodes cannot collide. Its one
    caller is `orchestrator.planning.memory.save_learnt_model`, which decides what is stored."""
    values = {
        "model_overhead_mb": model_overhead_mb,
        "per_sample_mb": per_sample_mb,
        "source": source,
        "samples": samples,
        "measured_at": now(),
    }
    statement = _insert(engine, memory_models).values(adapter=adapter, gpu_name=gpu_name, **values)
    statement = statement.on_conflict_do_update(index_elements=["adapter", "gpu_name"], set_=values)
    with engine.begin() as conn:
        conn.execute(statement)


@retried("read a measured memory model")
def load_memory_model(engine: Engine, *, adapter: str, gpu_name: str) -> MeasuredMemoryModel | None:
    query = sa.select(memory_models).where(
        (memory_models.c.adapter == adapter) & (memory_models.c.gpu_name == gpu_name)
    )
    with engine.connect() as conn:
        row = conn.execute(query).first()
    if row is None:
        return None
    return MeasuredMemoryModel(
        model_overhead_mb=row.model_overhead_mb,
        per_sample_mb=row.per_sample_mb,
        source=row.source,
        samples=row.samples,
        measured_at=row.measured_at,
    )


@retried("record a GPU's batch-size limit")
def lower_batch_limit(
    engine: Engine, *, study_name: str, gpu_name: str, max_batch_size: int, trial_number: int | None
) -> None:
    """Record that batches above max_batch_size do not fit this GPU; a limit only ever goes down.

    One statement (insert, or keep the lower of the two), so concurrent trials cannot lose one."""
    statement = _insert(engine, batch_limits).values(
        study_name=study_name,
        gpu_name=gpu_name,
        max_batch_size=max_batch_size,
        trial_number=trial_number,
        recorded_at=now(),
    )
    lower = statement.excluded.max_batch_size < batch_limits.c.max_batch_size
    statement = statement.on_conflict_do_update(
        index_elements=["study_name", "gpu_name"],
        set_={
            "max_batch_size": sa.case(
                (lower, statement.excluded.max_batch_size), else_=batch_limits.c.max_batch_size
            ),
            "trial_number": sa.case(
                (lower, statement.excluded.trial_number), else_=batch_limits.c.trial_number
            ),
            "recorded_at": sa.case(
                (lower, statement.excluded.recorded_at), else_=batch_limits.c.recorded_at
            ),
        },
    )
    with engine.begin() as conn:
        conn.execute(statement)


@retried("read a GPU's batch-size limit")
def load_batch_limit(engine: Engine, *, study_name: str, gpu_name: str) -> int | None:
    query = sa.select(batch_limits.c.max_batch_size).where(
        (batch_limits.c.study_name == study_name) & (batch_limits.c.gpu_name == gpu_name)
    )
    with engine.connect() as conn:
        return conn.execute(query).scalar()
