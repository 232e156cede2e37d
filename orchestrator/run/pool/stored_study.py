"""The study as a GPU pool sees it: counts, stale trials, batch limits, the pool's own records.

Everything the pool reads or writes in the database goes through this one object, so the pool
loop can run on a simulated study too (`orchestrator.run.simulated`). Every read here costs
the same at 10 trials as at 10,000: counts and the best trial are aggregate queries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.imports import LazyImport
from orchestrator.planning.memory import save_learnt_model
from orchestrator.record.budget.counts import stored_count
from orchestrator.record.outages.riding import ride_out
from orchestrator.record.store import records
from orchestrator.record.store.optuna_private import study_id_of
from orchestrator.record.store.storage import heartbeat_settings
from orchestrator.record.trials import stale as stale_trials
from orchestrator.record.trials.best import best_of_study, pareto_front

if TYPE_CHECKING:
    import optuna
    from sqlalchemy.engine import Engine

    from orchestrator.planning.footprint import Footprint
    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.study.spec import BudgetCount, StudySpec
else:
    optuna = LazyImport("optuna")


@dataclass(frozen=True)
class Best:
    value: float
    number: int


class StoredStudy:
    def __init__(
        self,
        *,
        storage_location: StorageLocation,
        engine: Engine,
        study: optuna.Study,
        spec: StudySpec,
        adapter_name: str | None = None,
    ) -> None:
        self.storage_location = storage_location
        self.adapter_name = adapter_name  # the key of its memory models
        self.engine = engine
        self.study = study
        self.spec = spec
        self.name = study.study_name
        self.budget = spec.trials
        self.direction = spec.direction
        self._front = (-1, 0)  # (counted trials, the front's size) when last worked out

    def count(self) -> BudgetCount:
        return ride_out(
            lambda: stored_count(self.engine, study_id_of(self.study)), what="count the trials"
        )

    def fail_stale(self) -> None:
        """Fail trials whose process went silent and re-queue them (under the budget lock, so
        nobody counts the failure before its re-run is queued, and taken only when one looks
        lost). Not during an outage, nor for a grace period after it: until then no trial could
        record its heartbeat."""

        grace = heartbeat_settings()[1]
        stale_trials.look_for_lost_trials(self.storage_location, self.study, grace)

    def best(self) -> Best | None:
        def best_trial() -> Best | None:
            trial = best_of_study(self.study)  # one ordered query; finished trials are cached
            return None if trial is None else Best(float(trial.value), trial.number)

        return ride_out(best_trial, what="read the best trial")

    def front_size(self, counted: int) -> int | None:
        """How many trials are on the Pareto front of a study of several objectives (None for
        one objective). Read and worked out again only when `counted`, the trials that used up
        budget, has changed since the last time."""

        directions = self.spec.all_directions
        if len(directions) == 1:
            return None
        if counted != self._front[0]:
            done = ride_out(
                lambda: self.study.get_trials(
                    deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)
                ),
                what="read the completed trials",
            )
            self._front = (counted, len(pareto_front(done, directions)))
        return self._front[1]

    def batch_limit(self, gpu_name: str) -> int | None:
        return records.load_batch_limit(self.engine, study_name=self.name, gpu_name=gpu_name)

    def record_change(self, event: records.ConcurrencyEvent) -> None:
        records.record_concurrency_event(self.engine, study_name=self.name, event=event)

    def register_worker(self, *, host: str, gpu_index: int | None, gpu_name: str, pid: int) -> int:
        return records.register_worker(
            self.engine,
            study_name=self.name,
            host=host,
            gpu_index=gpu_index,
            gpu_name=gpu_name,
            pid=pid,
        )

    def touch_worker(self, worker_id: int, *, stopped: bool = False) -> None:
        records.touch_worker(self.engine, worker_id, stopped=stopped)

    def save_footprint(self, gpu_name: str, footprint: Footprint) -> None:
        """What this kind of GPU taught us about the adapter's memory, for the next admissions
        of every node (they read it when they plan) and for later runs; stored by the one writer
        of memory models, so an OOM's floor in it outlives the end-of-run refinement."""

        if self.adapter_name is None:
            return
        save_learnt_model(
            self.engine, adapter=self.adapter_name, gpu_name=gpu_name, footprints=[footprint]
        )
