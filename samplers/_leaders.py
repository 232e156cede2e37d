"""A particle's guides in a study of several objectives: a leader from the archive, and its own best.

The archive is the study's non-dominated COMPLETE trials (feasible ones first: see
`samplers._pareto.front`), at most `size` of them, the most crowded dropped first. It is not
stored anywhere of its own: every process rebuilds it from the trials in the storage, as it
rebuilds the single-objective swarm's bests, so all workers share one archive.

- **Leader** (the social pull): a binary tournament on crowding distance among the archive's
  members that have the parameter, drawn from the trial's own random stream (SMPSO, OMOPSO).
  The draw does not depend on the parameter, so all parameters of a trial follow one leader.
- **Personal best** (the cognitive pull): the particle's latest trial that none of its other
  trials dominates. Keeping the latest of equals lets a particle move along the front.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from samplers._pareto import crowding_distance, front, tournament, trim

if TYPE_CHECKING:
    from samplers._history import Record


@dataclass(frozen=True)
class Archive:
    members: list[Record]
    crowding: np.ndarray


def archive(records: list[Record], size: int) -> Archive:
    """The non-dominated trials among `records` (each with `values`), at most `size`."""
    if not records:
        return Archive([], np.zeros(0))
    values = np.array([r.values for r in records], dtype=float)
    violations = np.array([r.violation for r in records], dtype=float)
    chosen = front(values, violations)
    chosen = chosen[trim(values[chosen], size)]
    return Archive([records[i] for i in chosen], crowding_distance(values[chosen]))


def leader(members: Archive, name: str, rng: np.random.Generator) -> Record | None:
    """The archive member that leads this trial's parameter `name` (None: no member has it)."""
    candidates = [i for i, record in enumerate(members.members) if name in record.params]
    if not candidates:
        return None
    return members.members[candidates[tournament(members.crowding[candidates], rng)]]


def personal_best(records: list[Record], name: str) -> Record | None:
    """The particle's latest COMPLETE trial with `name` that its other trials do not dominate."""
    own = [r for r in records if r.values is not None and name in r.params]
    if not own:
        return None
    values = np.array([r.values for r in own], dtype=float)
    violations = np.array([r.violation for r in own], dtype=float)
    return own[int(front(values, violations).max())]
