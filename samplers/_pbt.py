"""PBTSampler: population-based training over an Optuna study, shared by every worker.

The population has no home process. Each trial is one segment of one member's training, and the
segment's plan (member, generation, parent, epochs, params) is written into the trial's system
attributes when the trial is asked for; any process, on any node, reads the population back from
the storage, so every worker of every node trains one population, as the swarm does.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import secrets
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from optuna.samplers import BaseSampler
from optuna.study import StudyDirection
from optuna.trial import TrialState

from orchestrator.record.budget.claim import AskStopped, ask_stopped
from orchestrator.record.checkpoints import lineage as names
from orchestrator.record.store.optuna_private import (
    distribution_contains,
    storage_of,
    study_id_of,
    trial_id_of,
)
from orchestrator.record.study.spec import load_spec
from samplers._lhs import lhs_point
from samplers._pbt_repairs import (
    MOVED_ON,
    inherited,
    learn_shape,
    learnt_keep,
    rerun_plan,
    retried_numbers,
)
from samplers._pbt_rules import (
    KEEP,
    PERTURBATION_FACTORS,
    QUANTILE,
    RESAMPLE_PROBABILITY,
    Plan,
    Segment,
    Settings,
    claims_read,
    default_interval,
    free_members,
    next_segment,
    pick_member,
    plan_record,
)
from samplers._space import from_unit

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.study import Study
    from optuna.trial import FrozenTrial

# System attribute of a segment: its plan, {"member", "generation", "start", "until", "parent",
# "params" (None: drawn afresh), "round"}. None: a claim withdrawn (another worker won it).
PLAN_KEY = "pbt"


class PBTSampler(BaseSampler):
    """Population-based training (Jaderberg et al. 2017), the asynchronous form of Ray Tune's.

    **Members and segments.** The population has ``population`` members. Each trial trains one
    member for ``interval`` epochs: from epoch 0 (a fresh member, its params from a Latin
    hypercube over the population) or from its parent's checkpoint (user attribute
    ``checkpoint_from``, the parent's trial number) up to ``train_until_epoch`` (the last epoch
    it trains, counted from 0 as reports are). The trial's
    value is the one reported at that epoch. ``pbt_member``, ``pbt_generation``, ``pbt_parent``
    and ``pbt_start_epoch`` say where it sits in its lineage.

    **Exploit and explore.** When a member's segment has ended, its next one is decided
    (``samplers._pbt_rules``): ranked by each member's latest value, a member in the bottom
    ``quantile`` continues from a top member's checkpoint with that member's params perturbed
    (each resampled with ``resample_probability``, else scaled by 0.8 or 1.2, or a choice moved
    to a neighbour); any other continues from its own checkpoint with its own params. A lineage
    that reached the last epoch starts again fresh; a failed or pruned segment is replaced by a
    new one from the member's latest complete segment. A re-queued segment (its process lost,
    out of memory, stopped) is re-run as the same segment.

    **Workers.** A member trains in one trial at a time. An ask picks a free member and claims
    it by writing its plan; a worker that finds a claim made at the same moment withdraws its
    own and picks again. With more trials in flight than members, an ask waits (keeping the
    trial's heartbeat) until a member is free.

    **Bounds.** Batch sizes are perturbed inside the study's distribution; the process's
    ``bounded`` wrapper (``samplers.bounded``) moves them into its GPU's bounds, and the pool
    admits the trial again by the bytes of the batch it got.

    Args:
        population: members of the population (at least 2).
        interval: epochs per segment; ``None``: a quarter of ``epochs``, rounded up.
        epochs: epochs of a whole lineage; ``None``: the study's stored epochs.
        quantile, resample_probability, factors: the exploit and explore rules (Ray Tune's
            defaults 0.25, 0.25, (1.2, 0.8)).
        keep: more parameters a copied member never perturbs, because they shape the weights
            its checkpoint holds (besides the built-in adapters' ``hidden_size`` and the usual
            names of a layer count, always kept). ``run --pbt-keep`` stores more with the
            study; a parameter whose change made a parent's checkpoint fail to load is learnt
            and kept too (``samplers._pbt_repairs``).
        seed: ``None`` derives one from the study's name and id, so every worker agrees.
        wait_seconds: how often a waiting ask looks for a free member.
    """

    def __init__(
        self,
        *,
        population: int = 8,
        interval: int | None = None,
        epochs: int | None = None,
        quantile: float = QUANTILE,
        resample_probability: float = RESAMPLE_PROBABILITY,
        factors: Sequence[float] = PERTURBATION_FACTORS,
        keep: Sequence[str] = KEEP,
        seed: int | None = None,
        wait_seconds: float = 0.5,
    ) -> None:
        _whole("population", population, 2)
        if interval is not None:
            _whole("interval", interval, 1)
        if epochs is not None:
            _whole("epochs", epochs, 1)
        if not (0 < quantile <= 0.5):
            raise ValueError(f"The `{quantile=}` must be in (0, 0.5]: a share of the population.")
        if not (0 <= resample_probability <= 1):
            raise ValueError(f"The `{resample_probability=}` must be in [0, 1].")
        if not factors or not all(isinstance(f, int | float) and f > 0 for f in factors):
            raise ValueError(f"The `{factors=}` must be positive numbers, such as (1.2, 0.8).")
        self._population = population
        self._interval = interval
        self._epochs = epochs
        self._rules = (float(quantile), float(resample_probability), tuple(map(float, factors)))
        if isinstance(keep, str) or not all(isinstance(k, str) for k in keep):
            raise ValueError(f"The `{keep=}` must be parameter names, such as ['width'].")
        self._keep = tuple(dict.fromkeys((*KEEP, *keep)))  # the usual shapes, and these
        self._seed = seed
        self._salt = 0
        self._wait = float(wait_seconds)

    @property
    def population(self) -> int:
        return self._population

    def reseed_rng(self) -> None:
        self._salt = secrets.randbits(64)

    def can_start_now(self, study: Study) -> bool:
        """Whether an ask now would find a free member instead of waiting for one. The ask
        looks first, under the budget lock on SQLite, and waits outside it while this is False
        (`record.budget.claim`); a fused group then takes no more members. A queued re-run
        counts: an ask takes it first, and it runs as its own segment."""
        trials = storage_of(study).get_all_trials(study_id_of(study), deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials):
            return True
        return bool(
            free_members(self._segments(study, -1, trials), self._settings(study).population)
        )

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        if "fixed_params" in trial.system_attrs:
            if retried_numbers(trial):  # a re-run (lost, stale, OOM, stopped): its own segment
                self._rerun(study, trial)
            return  # an enqueued trial runs as it was given
        self._start(study, trial, self._claim(study, trial))

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        if state == TrialState.FAIL:
            self._learn_shape(study, trial)

    def _start(self, study: Study, trial: FrozenTrial, plan: Plan) -> None:
        """Write the segment's plan into the trial's user attributes (and the frozen trial's)."""
        attrs = {
            names.PBT_MEMBER: plan.member,
            names.PBT_GENERATION: plan.generation,
            names.PBT_PARENT: plan.parent,
            names.PBT_START_EPOCH: plan.start,
            names.PBT_EXPLOITED: plan.exploited,
            names.TRAIN_UNTIL_EPOCH: plan.until - 1,  # the last epoch, counted from 0
        }
        if plan.parent is not None or names.CHECKPOINT_FROM in trial.user_attrs:
            attrs[names.CHECKPOINT_FROM] = plan.parent
        storage = storage_of(study)
        for key, value in attrs.items():
            storage.set_trial_user_attr(trial_id_of(trial), key, value)
        # The frozen trial Optuna holds was read before this call: later readers of it (the
        # sampling below, the trial runner) see the plan too.
        trial.user_attrs.update(attrs)

    # -- re-runs and shapes (samplers._pbt_repairs) ---------------------------------------------

    def _rerun(self, study: Study, trial: FrozenTrial) -> None:
        """A re-queued segment runs as the segment it replaces (`samplers._pbt_repairs`); one
        whose member trained on meanwhile is planned afresh instead, and so is the re-run of a
        trial lost before it was planned (while its ask waited for a free member: nothing
        fixed), or it would run outside the population."""
        record = rerun_plan(study, trial, PLAN_KEY)
        if record is MOVED_ON or (record is None and not trial.system_attrs["fixed_params"]):
            self._start(study, trial, self._claim(study, trial))
        elif record is not None:
            _PLANS[trial_id_of(trial)] = record

    def _learn_shape(self, study: Study, trial: FrozenTrial) -> None:
        learn_shape(study, trial, PLAN_KEY, self._keep)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        record = _plan_of(study, trial)
        if record is not None and isinstance(record.get("params"), dict):
            value = record["params"].get(param_name)
            if value is not None and distribution_contains(param_distribution, value):
                return value
        member = int(record["member"]) if record else trial.number % self._population
        round_ = int(record.get("round", 0)) if record else trial.number // self._population
        u = lhs_point(self._entropy(study), round_, member, param_name, self._population)
        return from_unit(param_distribution, u)

    # -- the claim ---------------------------------------------------------------------------

    def _claim(self, study: Study, trial: FrozenTrial) -> Plan:
        storage = storage_of(study)
        settings = self._settings(study)
        entropy = self._entropy(study)
        lost: set[int] = set()  # members another worker claimed at the same moment as this ask
        for attempt in itertools.count():
            segments = self._segments(study, exclude=trial.number)
            free = [m for m in free_members(segments, settings.population) if m not in lost]
            if not free:
                if ask_stopped():  # its process is stopping (its host gone): no member comes
                    raise AskStopped(trial_id_of(trial))
                _keep_alive(storage, trial)
                time.sleep(self._wait)
                lost.clear()  # the population has moved on: every member may be free again
                continue
            rng = np.random.default_rng([entropy, trial.number, attempt])
            member = pick_member(segments, free, rng)
            plan = next_segment(segments, member, settings, rng)
            record = plan_record(plan)
            storage.set_trial_system_attr(trial_id_of(trial), PLAN_KEY, record)
            if not self._contested(study, trial.number, member, claims_read(segments)):
                trial.system_attrs[PLAN_KEY] = record
                _PLANS[trial_id_of(trial)] = record
                return plan
            storage.set_trial_system_attr(trial_id_of(trial), PLAN_KEY, None)
            lost.add(member)
            time.sleep(float(rng.random()) * self._wait * 0.2)  # apart from the other claimer
        raise AssertionError("unreachable")

    def _contested(
        self, study: Study, number: int, member: int, known: set[tuple[int, int]]
    ) -> bool:
        """Whether another trial claimed `member` in a claim this ask did not read (`known`: the
        (trial, member) pairs of the segments it read): a claim made at the same moment as ours,
        both having read the member free. Both may see the other's claim and withdraw; neither
        keeps a member twice. Pairs, not trial numbers: a trial this ask read holding another
        member may since have withdrawn it and claimed this one (asks that wait and retry do)."""
        trials = storage_of(study).get_all_trials(study_id_of(study), deepcopy=False)
        for other in trials:
            plan = other.system_attrs.get(PLAN_KEY)
            if other.number == number or not isinstance(plan, dict):
                continue
            if int(plan["member"]) == member and (other.number, member) not in known:
                return True
        return False

    def _segments(
        self, study: Study, exclude: int, trials: Sequence[FrozenTrial] | None = None
    ) -> list[Segment]:
        if trials is None:
            trials = storage_of(study).get_all_trials(study_id_of(study), deepcopy=False)
        by_number = {t.number: t for t in trials}
        sign = -1.0 if study.directions[0] == StudyDirection.MAXIMIZE else 1.0
        found = []
        for trial in trials:
            if trial.number == exclude:
                continue
            plan = trial.system_attrs.get(PLAN_KEY)
            if PLAN_KEY not in trial.system_attrs and trial.state in _WAITING_OR_RUNNING:
                # A re-run not yet asked for: its member is busy, as the segment it replaces.
                plan = (inherited(trial, by_number, PLAN_KEY) or (None,))[0]
            if (segment := _segment(trial, plan, sign)) is not None:
                found.append(segment)
        return found

    def _settings(self, study: Study) -> Settings:
        epochs = self._epochs
        spec = load_spec(study)
        if epochs is None:
            if spec is None:
                raise ValueError(
                    "PBTSampler needs the epochs of a lineage: pass PBTSampler(epochs=...)."
                )
            epochs = spec.epochs
        interval = self._interval or default_interval(epochs)
        quantile, resample, factors = self._rules
        keep = set(self._keep) | set(getattr(spec, "pbt_keep", None) or ())
        keep |= learnt_keep(storage_of(study).get_study_system_attrs(study_id_of(study)))
        return Settings(
            self._population,
            min(interval, epochs),
            epochs,
            quantile,
            resample,
            factors,
            tuple(sorted(keep)),
        )

    def _entropy(self, study: Study) -> int:
        if self._seed is not None:
            entropy = self._seed
        else:
            text = f"{study.study_name}\0{study_id_of(study)}"
            entropy = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        return entropy ^ (self._salt << 64) if self._salt else entropy


_WAITING_OR_RUNNING = (TrialState.WAITING, TrialState.RUNNING)

# Plans claimed by this process, by trial id: the sampler object that samples a trial's params
# may be another one than the object that claimed it (a trial process makes one per trial).
_PLANS: dict[int, dict[str, Any]] = {}


def _plan_of(study: Study, trial: FrozenTrial) -> dict[str, Any] | None:
    found = _PLANS.get(trial_id_of(trial)) or trial.system_attrs.get(PLAN_KEY)
    if found is None:
        stored = storage_of(study).get_trial_system_attrs(trial_id_of(trial))
        found = stored.get(PLAN_KEY)
    return found if isinstance(found, dict) else None


def _segment(trial: FrozenTrial, plan: Any, sign: float) -> Segment | None:
    if not isinstance(plan, dict):
        return None
    states = {TrialState.RUNNING: "running", TrialState.WAITING: "running"}
    state = {**states, TrialState.COMPLETE: "complete"}.get(trial.state, "failed")
    score = None
    if state == "complete" and trial.values is not None and math.isfinite(trial.values[0]):
        score = sign * trial.values[0]
    if state == "complete" and score is None:
        state = "failed"  # a value that cannot be ranked does not continue its lineage
    return Segment(
        number=trial.number,
        member=int(plan["member"]),
        generation=int(plan["generation"]),
        start=int(plan["start"]),
        until=int(plan["until"]),
        state=state,
        score=score,
        params=trial.params,
        distributions=trial.distributions,
    )


def _keep_alive(storage: Any, trial: FrozenTrial) -> None:
    """A waiting ask keeps its trial's heartbeat, or another worker would fail it as lost."""
    beat = getattr(storage, "record_heartbeat", None)
    if beat is not None:
        with contextlib.suppress(Exception):  # a storage without heartbeats: nothing to keep
            beat(trial_id_of(trial))


def _whole(name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"The `{name}={value!r}` must be a whole number of at least {least}.")


__all__ = ["PBTSampler"]
