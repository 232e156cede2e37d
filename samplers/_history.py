"""The swarm as the storage holds it: trials parsed into particle records, and the bests.

Finished trials never change, so their parsed records are kept between samples (one cache per
study in a sampler object); running and waiting trials are parsed afresh every time.
"""

from __future__ import annotations

import bisect
import math
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from optuna.trial import TrialState

from orchestrator.record.store.optuna_private import trial_id_of
from orchestrator.record.trials.attr_names import OOM
from samplers._space import to_unit

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial

# System attributes: "pso" = {"p": particle, "x": {name: [position, velocity]}} from a relative
# sample; "pso:NAME" = [particle, position, velocity] from a sample of one parameter.
RECORD_KEY = "pso"
# Where Optuna's samplers keep a trial's constraint values (`constraints_func`'s results).
CONSTRAINTS_KEY = "constraints"
PARAM_KEY_PREFIX = "pso:"
_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


@dataclass
class Record:
    """One trial as the swarm sees it."""

    number: int
    state: TrialState
    score: float | None  # the value to minimise; None unless COMPLETE with a number
    particle: int | None  # None: the trial moved no particle (enqueued, or another sampler's)
    moves: dict[str, Any]  # name -> [position, velocity] the sampler recorded (never mutated)
    params: dict[str, Any]
    distributions: dict[str, BaseDistribution]
    oom: bool
    # Several objectives: every value to minimise (None unless COMPLETE with numbers), and the
    # sum of the positive values of the trial's constraints (Optuna's "constraints" attribute).
    values: tuple[float, ...] | None = None
    violation: float = 0.0

    def evaluated(self, name: str) -> float:
        """The unit coordinate of the value this trial really ran with."""
        return to_unit(self.distributions[name], self.params[name])


def parse(trial: FrozenTrial, sign: float | tuple[float, ...]) -> Record:
    """The trial as the swarm sees it; `sign` is -1 for a maximised objective, one per objective
    (a tuple) in a study of several."""
    system_attrs = trial.system_attrs
    record = system_attrs.get(RECORD_KEY)
    particle = int(record["p"]) if isinstance(record, dict) else None
    # The stored dict is used as it is (never mutated): a cold start parses every trial.
    moves: dict[str, Any] = record["x"] if isinstance(record, dict) else {}
    merged: dict[str, Any] | None = None
    for key, value in system_attrs.items():
        if key.startswith(PARAM_KEY_PREFIX):
            merged = dict(moves) if merged is None else merged
            merged[key[len(PARAM_KEY_PREFIX) :]] = value[1:]
            particle = int(value[0])
    if merged is not None:
        moves = merged
    values, score = None, None
    if isinstance(sign, tuple):
        values = _signed_values(trial, sign)
    elif trial.state == TrialState.COMPLETE and math.isfinite(trial.value):
        score = sign * trial.value
    return Record(
        number=trial.number,
        state=trial.state,
        score=score,
        particle=particle,
        moves=moves,
        params=trial.params,
        distributions=trial.distributions,
        oom=trial.state == TrialState.FAIL and trial.user_attrs.get(OOM) is True,
        values=values,
        violation=_violation(system_attrs.get(CONSTRAINTS_KEY)),
    )


def _signed_values(trial: FrozenTrial, sign: tuple[float, ...]) -> tuple[float, ...] | None:
    if trial.state != TrialState.COMPLETE or trial.values is None:
        return None
    if len(trial.values) != len(sign) or not all(math.isfinite(v) for v in trial.values):
        return None
    return tuple(s * v for s, v in zip(sign, trial.values, strict=True))


def _violation(constraints: Any) -> float:
    # Optuna's convention: constraint values <= 0 are satisfied; a positive one is violated.
    if not isinstance(constraints, list | tuple):
        return 0.0
    return float(sum(max(0.0, float(c)) for c in constraints))


def rounded(encoded: np.ndarray) -> tuple:
    """A model input as a set member: values that encode alike to 9 decimals are one point."""
    return tuple(np.round(encoded, 9).tolist())


def _rank_key(record: Record) -> tuple[float, int]:
    assert record.score is not None
    return record.score, record.number


@dataclass
class FinishedTrials:
    """Parsed finished trials of one study, with the indexes the swarm reads."""

    sign: float | tuple[float, ...]
    storage: weakref.ref
    study_id: int
    by_id: dict[int, Record] = field(default_factory=dict)
    ranked: list[Record] = field(default_factory=list)  # COMPLETE, best first
    by_particle: dict[int, list[Record]] = field(default_factory=dict)  # ascending number
    ranked_by_particle: dict[int, list[Record]] = field(
        default_factory=dict
    )  # COMPLETE, best first
    out_of_memory: list[Record] = field(default_factory=list)  # FAIL with oom=True
    frontier: int = 0  # trials[:frontier] of the study are all finished and parsed
    frontier_id: int | None = None  # the trial id at trials[frontier - 1]
    space: dict[str, BaseDistribution] | None = None  # intersection over COMPLETE and PRUNED
    seen: dict[tuple[str, ...], set[tuple]] = field(default_factory=dict)
    # Per space of the screen: the model inputs of the finished trials by number, their rounded
    # tuples, and how many of `by_id` (in the order they were added) have been read.
    encoded: dict[Any, tuple[dict[int, np.ndarray], set[tuple], int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, trial_id: int, record: Record) -> None:
        self.by_id[trial_id] = record
        if record.score is not None:
            bisect.insort(self.ranked, record, key=_rank_key)
        if record.particle is not None:
            bisect.insort(
                self.by_particle.setdefault(record.particle, []), record, key=lambda r: r.number
            )
            if record.score is not None:
                bisect.insort(
                    self.ranked_by_particle.setdefault(record.particle, []), record, key=_rank_key
                )
        self._add_to_space_and_seen(record)

    def add_many(self, items: list[tuple[int, Record]]) -> None:
        """Add many records at once: one sort instead of an insertion each (a cold start)."""
        if len(items) < 64:
            for trial_id, record in items:
                self.add(trial_id, record)
            return
        records = [record for _, record in items]
        for trial_id, record in items:
            self.by_id[trial_id] = record
            self._add_to_space_and_seen(record)
        scored = [r for r in records if r.score is not None]
        self.ranked = sorted([*self.ranked, *scored], key=_rank_key)
        for particle in {r.particle for r in records if r.particle is not None}:
            mine = [r for r in records if r.particle == particle]
            self.by_particle[particle] = sorted(
                [*self.by_particle.get(particle, []), *mine], key=lambda r: r.number
            )
            self.ranked_by_particle[particle] = sorted(
                [
                    *self.ranked_by_particle.get(particle, []),
                    *(r for r in mine if r.score is not None),
                ],
                key=_rank_key,
            )

    def _add_to_space_and_seen(self, record: Record) -> None:
        if record.oom:
            self.out_of_memory.append(record)
        if record.state in (TrialState.COMPLETE, TrialState.PRUNED):
            if self.space is None:
                self.space = dict(record.distributions)
            else:
                self.space = {
                    name: dist
                    for name, dist in self.space.items()
                    if record.distributions.get(name) == dist
                }
        for names, values in self.seen.items():
            if all(name in record.params for name in names):
                values.add(tuple(record.params[name] for name in names))


class SwarmView:
    """The finished trials (cached) and the running ones (fresh) of one snapshot."""

    def __init__(self, finished: FinishedTrials, others: list[Record]) -> None:
        self._finished = finished
        self._others = others

    @property
    def several(self) -> bool:
        """Whether the study has several objectives (its records carry `values`, not `score`)."""
        return isinstance(self._finished.sign, tuple)

    @property
    def ranked(self) -> list[Record]:
        return self._finished.ranked

    @property
    def relative_space(self) -> dict[str, BaseDistribution]:
        space = self._finished.space or {}
        return {name: dist for name, dist in sorted(space.items()) if not dist.single()}

    def out_of_memory(self) -> list[Record]:
        """The trials that failed with `oom: true`."""
        return self._finished.out_of_memory

    def running(self) -> list[Record]:
        """The trials of this snapshot that are still running (or waiting), by number."""
        return self._others

    def encodings(self, shape: Any) -> tuple[dict[int, np.ndarray], set[tuple]]:
        """The model inputs of every finished trial with all of `shape`'s parameters, by trial
        number, and their rounded tuples (the points a candidate may not repeat)."""
        finished = self._finished
        key = (shape.names, shape.dists, shape.bounds)
        with finished.lock:
            by_number, keys, done = finished.encoded.get(key, ({}, set(), 0))
            records = list(finished.by_id.values())[done:]
            points = [r for r in records if shape.holds(r)]
            if points:
                encoded = shape.encode_many([r.params for r in points])
                by_number.update(zip((r.number for r in points), encoded, strict=True))
                keys.update(map(tuple, np.round(encoded, 9).tolist()))  # as `rounded` makes
            finished.encoded[key] = (by_number, keys, done + len(records))
            return dict(by_number), set(keys)

    def particle_records(self, particle: int) -> list[Record]:
        """Every trial of `particle`, in ascending number."""
        records = self._finished.by_particle.get(particle, [])
        extra = [r for r in self._others if r.particle == particle]
        if not extra:
            return records
        return sorted([*records, *extra], key=lambda r: r.number)

    def personal_best(self, particle: int, name: str) -> Record | None:
        """The best complete trial of `particle` that has parameter `name`."""
        for record in self._finished.ranked_by_particle.get(particle, []):
            if name in record.params:
                return record
        return None

    def complete(self) -> list[Record]:
        """Every COMPLETE trial with values for all objectives (a study of several), by number."""
        finished = self._finished
        with finished.lock:
            return sorted(
                (r for r in finished.by_id.values() if r.values is not None),
                key=lambda r: r.number,
            )

    def best_number(self, name: str) -> int | None:
        """The number of the best complete trial that has parameter `name`."""
        for record in self._finished.ranked:
            if name in record.params:
                return record.number
        return None

    def seen(self, names: tuple[str, ...]) -> set[tuple]:
        """Every value tuple of `names` that a trial in the storage has."""
        finished = self._finished
        with finished.lock:
            if names not in finished.seen:
                finished.seen[names] = {
                    tuple(r.params[name] for name in names)
                    for r in finished.by_id.values()
                    if all(name in r.params for name in names)
                }
            values = set(finished.seen[names])
        values.update(
            tuple(r.params[name] for name in names)
            for r in self._others
            if all(name in r.params for name in names)
        )
        return values


class History:
    """Per-study caches of finished trials, for one sampler object (thread-safe)."""

    def __init__(self) -> None:
        self._studies: dict[tuple[int, int], FinishedTrials] = {}
        self._lock = threading.Lock()

    def view(
        self,
        storage: BaseStorage,
        study_id: int,
        trials: Sequence[FrozenTrial],
        sign: float | tuple[float, ...],
    ) -> SwarmView:
        finished = self._finished(storage, study_id, sign)
        others = []
        with finished.lock:
            # Trials come in the order they were created; skip the leading run that is all
            # finished and parsed already. A list with another trial at the frontier (a subset,
            # such as a Hyperband bracket) is read in full.
            start = finished.frontier
            if start > len(trials) or (
                start and trial_id_of(trials[start - 1]) != finished.frontier_id
            ):
                start = 0
            advancing = True
            new: list[tuple[int, Record]] = []
            for trial in trials[start:]:
                if trial_id_of(trial) not in finished.by_id:
                    record = parse(trial, sign)
                    if trial.state not in _FINISHED:
                        others.append(record)
                        advancing = False
                        continue
                    new.append((trial_id_of(trial), record))
                if advancing:
                    start += 1
            finished.add_many(new)
            if start:
                finished.frontier, finished.frontier_id = start, trial_id_of(trials[start - 1])
        return SwarmView(finished, others)

    def _finished(
        self, storage: BaseStorage, study_id: int, sign: float | tuple[float, ...]
    ) -> FinishedTrials:
        key = (id(storage), study_id)
        with self._lock:
            cached = self._studies.get(key)
            # id() can be reused by a new storage once the old one is gone: check it is the same.
            if cached is None or cached.storage() is not storage or cached.sign != sign:
                cached = FinishedTrials(sign=sign, storage=weakref.ref(storage), study_id=study_id)
                self._studies[key] = cached
            return cached
