"""A study's trials for the read-only views, in a few flat queries instead of Optuna's ORM.

`status`, `best` and `report` read every trial once. Optuna's `get_all_trials` builds an ORM
object per row of every trial table (at 3,000 trials of 15 epochs, about 90,000 objects and
seconds of work); these queries fetch the same rows as plain tuples from Optuna's own table
definitions and assemble FrozenTrials directly, so the views cost little more at 3,000 trials
than at 14. System attributes are read for the keys the views use only (`SYSTEM_KEYS`), and
intermediate values only when asked for (the report's learning curves).
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from orchestrator.record.store.optuna_private import rdb_models

if TYPE_CHECKING:
    import optuna
    import sqlalchemy as sa
    from optuna.distributions import BaseDistribution
    from optuna.trial import FrozenTrial
    from sqlalchemy.engine import Engine
else:
    optuna = LazyImport("optuna")
    sa = LazyImport("sqlalchemy")

SYSTEM_KEYS = ("retry_history", "fixed_params")


def read_trials(
    engine: Engine, study_id: int, *, intermediate_values: bool = False
) -> list[FrozenTrial]:
    """Every trial of the study, in number order."""
    models = rdb_models()

    trials = models.TrialModel.__table__
    of_study = sa.select(trials.c.trial_id).where(trials.c.study_id == study_id)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                trials.c.trial_id,
                trials.c.number,
                trials.c.state,
                trials.c.datetime_start,
                trials.c.datetime_complete,
            )
            .where(trials.c.study_id == study_id)
            .order_by(trials.c.number)
        ).all()
        parts = _parts(conn, of_study, intermediate_values)
    return [_frozen(row, parts) for row in rows]


def _parts(conn: Any, of_study: Any, intermediate_values: bool) -> dict[str, dict[int, Any]]:
    models = rdb_models()

    def by_trial(table: sa.Table, *columns: str, where: Any = None) -> dict[int, list[tuple]]:
        query = sa.select(table.c.trial_id, *(table.c[name] for name in columns)).where(
            table.c.trial_id.in_(of_study)
        )
        if where is not None:
            query = query.where(where)
        grouped: dict[int, list[tuple]] = defaultdict(list)
        for trial_id, *rest in conn.execute(query):
            grouped[trial_id].append(tuple(rest))
        return grouped

    params = models.TrialParamModel.__table__
    system = models.TrialSystemAttributeModel.__table__
    parts = {
        "values": by_trial(models.TrialValueModel.__table__, "objective", "value", "value_type"),
        "params": by_trial(params, "param_id", "param_name", "param_value", "distribution_json"),
        "user": by_trial(models.TrialUserAttributeModel.__table__, "key", "value_json"),
        "system": by_trial(system, "key", "value_json", where=system.c.key.in_(SYSTEM_KEYS)),
        "intermediate": {},
    }
    if intermediate_values:
        parts["intermediate"] = by_trial(
            models.TrialIntermediateValueModel.__table__,
            "step",
            "intermediate_value",
            "intermediate_value_type",
        )
    return parts


def _frozen(row: Any, parts: dict[str, dict[int, Any]]) -> optuna.trial.FrozenTrial:
    models = rdb_models()
    trial_id = row.trial_id
    values = _values(parts["values"].get(trial_id, []))
    params, dists = {}, {}
    for _, name, internal, dist_json in sorted(parts["params"].get(trial_id, [])):
        dist = _distribution(dist_json)
        params[name], dists[name] = dist.to_external_repr(internal), dist
    to_value = models.TrialIntermediateValueModel.stored_repr_to_intermediate_value
    return optuna.trial.FrozenTrial(
        number=row.number,
        state=row.state,
        value=None,
        values=values,
        datetime_start=_local(row.datetime_start),
        datetime_complete=_local(row.datetime_complete),
        params=params,
        distributions=dists,
        user_attrs={key: json.loads(text) for key, text in parts["user"].get(trial_id, [])},
        system_attrs={key: json.loads(text) for key, text in parts["system"].get(trial_id, [])},
        intermediate_values={
            step: to_value(value, kind)
            for step, value, kind in parts["intermediate"].get(trial_id, [])
        },
        trial_id=trial_id,
    )


def _values(stored: list[tuple]) -> list[float] | None:
    models = rdb_models()

    if not stored:
        return None
    values = [0.0] * len(stored)
    for objective, value, kind in stored:
        values[objective] = models.TrialValueModel.stored_repr_to_value(value, kind)
    return values


@lru_cache(maxsize=256)
def _distribution(dist_json: str) -> BaseDistribution:
    """Every trial of a study repeats the same few distributions: parse each once."""
    return optuna.distributions.json_to_distribution(dist_json)


def _local(moment: dt.datetime | None) -> dt.datetime | None:
    """Stored as naive UTC; Optuna hands trials out in naive local time, and so do we."""
    if moment is None:
        return None
    return moment.replace(tzinfo=dt.UTC).astimezone().replace(tzinfo=None)
