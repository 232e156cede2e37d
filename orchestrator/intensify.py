"""`--intensify N`: N of the study's trials re-run its recommended configuration.

The recommendation (`samplers/_model/recommend.py`) is the configuration the study's model
expects best; one run of it is one noisy draw. As SMAC's intensification does, a share of the
budget goes to running the current incumbent again: same parameters, and for an adapter with a
`seed` option the next seeds (`seed_offset`: the adapter's seed plus the runs its
configuration has had, times `--repeats`, as `adapters/repeats.seeded` counts them). The model
then sees one configuration observed several times, and its expected value stands on more than
one run.

When: the re-runs are spread evenly over the second half of the budget (the first half finds
configurations worth re-running). Re-run k is due once the study has claimed `schedule()[k]`
of its trials; once the room left in the budget is no more than the re-runs still owed, every
one of them is queued at once. The pool learns of a finished trial about a second after its
process has asked for the next one, so with more trials running at once than the second half
of the budget holds, the claims can outrun the schedule: then fewer than N re-run (never
more), and the log says so.

How, with several workers on several hosts: each host's pool calls `Intensifier` as its trials
finish. It fits the model outside any lock, then, under the study's budget lock (the one every
ask takes), counts again what is claimed and what is queued (trials marked `intensify_of`) and
queues the re-runs still due with Optuna's `enqueue_trial`: a queued trial is handed to one
process only, and the count under the lock keeps the re-runs at N across every host, inside
the budget.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.record.store.locks import locked
from orchestrator.record.study.spec import BudgetCount, count_trials
from orchestrator.record.trials import attr_names as names

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from orchestrator.record.store.location import StorageLocation
    from orchestrator.record.study.spec import StudySpec
    from samplers._model import recommend
else:
    optuna = LazyImport("optuna")
    recommend = LazyImport("samplers._model.recommend")

logger = logging.getLogger(__name__)


def intensify_problem(intensify: int, spec: StudySpec) -> str | None:
    """What is wrong with re-running the recommendation `intensify` times in this study, in
    words that follow `--intensify N` (or `intensify=N`); None when nothing is."""
    if intensify == 0:
        return None
    if intensify < 0:
        return "must be 0 or more: the trials of the budget that re-run the recommended trial"
    if len(spec.all_directions) > 1:
        return (
            "needs a study of one objective: several objectives have a front of trials, "
            "no one recommended trial to re-run"
        )
    if spec.sampler == "pbt":
        return (
            "does not apply to population-based training: its members already train on "
            "from the best ones; leave it out"
        )
    if intensify >= spec.trials:
        return (
            f"must be less than the budget of {spec.trials} trials: the re-runs need fresh "
            f"trials to choose from; give at most {spec.trials - 1}, or a bigger budget"
        )
    return None


def check_intensify(spec: StudySpec) -> None:
    """A one-line UserError for a spec whose `intensify` cannot be run (`run --intensify N`)."""
    problem = intensify_problem(spec.intensify, spec)
    if problem:
        raise UserError(f"--intensify {spec.intensify} {problem}")


def schedule(budget: int, intensify: int) -> list[int]:
    """Claimed trials at which each re-run is due: evenly over the second half of the budget,
    the last one a share of it before the end (the trials running at once claim ahead of those
    that finish, and a re-run queued after the last claim has no room)."""
    start = max(1, min(math.ceil(budget / 2), budget - intensify))
    span = budget - start
    return [start + (k * span) // (intensify + 1) for k in range(intensify)]


def owed_now(budget: int, intensify: int, queued: int, count: BudgetCount) -> int:
    """How many re-runs to queue now, given the count and the re-runs queued so far: those
    whose point the claims have reached; every one still owed once the room left is no more
    than they need."""
    claimed = count.counted + count.running + count.waiting
    room, left = budget - claimed, intensify - queued
    if room <= 0 or left <= 0:
        return 0
    due = sum(1 for point in schedule(budget, intensify) if point <= claimed) - queued
    if room <= left:
        due = left
    return max(0, min(due, room, left))


def queued_reruns(trials: Sequence[FrozenTrial]) -> int:
    """The re-runs queued in the study so far, on any host (a failed one's retry is the same
    re-run: it does not carry the mark)."""
    return sum(1 for t in trials if names.INTENSIFY_OF in t.user_attrs)


class Intensifier:
    """Called as `callback(study, trial)` for each trial that finishes on this host (the pool's
    callbacks, `launch.run_pool`): queues the re-runs that are due (see the module)."""

    def __init__(self, location: StorageLocation, spec: StudySpec) -> None:
        self.location = location
        self.spec = spec
        self.seeded = "seed" in spec.options  # else a re-run is the same run again
        self.said = False  # whether the log has said the budget ran out first

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        trials = study.get_trials(deepcopy=False)
        queued, count = queued_reruns(trials), count_trials(trials)
        owed = owed_now(self.spec.trials, self.spec.intensify, queued, count)
        if owed == 0:
            self._say_if_short(queued, count)
            return
        found = recommend.recommendation(trials, self.spec.all_directions)
        if found is None:
            return
        queued = locked(
            self.location,
            f"budget:{study.study_name}",
            lambda: self._queue(study, found.trial),
            what="queue a re-run of the recommended trial",
        )
        for number, offset in queued:
            logger.info(
                "re-running the recommended trial #%d (%s): trial #%d",
                found.trial.number,
                f"seed offset {offset}" if self.seeded else "same parameters",
                number,
            )

    def _say_if_short(self, queued: int, count: BudgetCount) -> None:
        claimed = count.counted + count.running + count.waiting
        if claimed >= self.spec.trials and queued < self.spec.intensify and not self.said:
            self.said = True
            logger.warning(
                "--intensify %d: only %d re-runs of the recommended trial were queued before "
                "the budget's last trial was asked for (more trials ran at once than its "
                "second half holds)",
                self.spec.intensify,
                queued,
            )

    def _queue(self, study: optuna.Study, incumbent: FrozenTrial) -> list[tuple[int, int]]:
        """Under the budget lock: count again, queue what is owed; (trial number, seed offset)
        of each re-run queued."""
        trials = study.get_trials(deepcopy=False)
        queued = queued_reruns(trials)
        owed = owed_now(self.spec.trials, self.spec.intensify, queued, count_trials(trials))
        runs = sum(1 for t in trials if incumbent.params in (t.params, _fixed(t)))
        made = []
        for k in range(owed):
            attrs: dict[str, Any] = {names.INTENSIFY_OF: incumbent.number}
            offset = (runs + k) * max(1, self.spec.repeats)
            if self.seeded:
                attrs[names.SEED_OFFSET] = offset
            study.enqueue_trial(dict(incumbent.params), user_attrs=attrs)
            made.append((len(trials) + k, offset))
        return made


def _fixed(trial: FrozenTrial) -> dict[str, Any] | None:
    """The parameters a queued trial will run with (a waiting trial has no params yet)."""
    return trial.system_attrs.get("fixed_params")


def callbacks_for(location: StorageLocation, spec: StudySpec) -> list[Callable[..., None]]:
    """The pool's callbacks for this study's `intensify` (none when it is 0)."""
    return [Intensifier(location, spec)] if spec.intensify > 0 else []
