"""A study and what is stored with it: the adapter, the budget, epochs, repeats and options.

`run` writes this spec into the study's user attributes (optuna-dashboard shows it), so that
`worker --study NAME` on another node joins with nothing else to type. The budget arithmetic is
pure: which trials count towards `--trials N`, and whether a worker may ask for another.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.record.store.optuna_private import storage_of, study_id_of

if TYPE_CHECKING:
    import hashlib
    import secrets

    import optuna
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial

    from orchestrator.record.store import optuna_objects
    from orchestrator.record.study import drift
else:
    optuna = LazyImport("optuna")
    # Read when a study is saved or its pickles loaded; every `--help` loads this module (the
    # flags build a StudySpec), so these wait for first use.
    drift = LazyImport("orchestrator.record.study.drift")
    optuna_objects = LazyImport("orchestrator.record.store.optuna_objects")
    # OpenSSL's hashes (and hmac, with secrets) load with them: paid when a study is made or
    # named, not by every --help
    hashlib = LazyImport("hashlib")
    secrets = LazyImport("secrets")

SPEC_ATTR = "orchestrator"
PICKLED = ("sampler_pickle", "pruner_pickle")  # StudySpec's fields kept in system attributes
PICKLES_ATTR = "orchestrator:objects"


@dataclass(frozen=True)
class StudySpec:
    adapter: str  # a registered adapter's name, or module:attribute when adapter_path is set
    trials: int  # the study's total budget, over every worker on every node
    epochs: int
    direction: str
    options: dict[str, Any] = field(default_factory=dict)
    adapter_path: bool = False
    sampler: str = "pso"
    seed: int | None = None
    swarm_size: int = 20  # PSOSampler's default (record may not import samplers; a test ties them)
    pbt_keep: list[str] | None = None  # --sampler pbt: parameters never perturbed (docs/pbt.md)
    max_retries: int = 2  # how often an OOM'd or lost trial's parameters are re-run
    pruner: str = "median"  # one of PRUNERS; see pruner_for and docs/pruners.md
    mlflow_uri: str | None = (
        None  # where trials are logged as MLflow runs (orchestrator.record.trials.tracking)
    )
    objective: bool = False  # `adapter` is a plain objective(trial, device): orchestrator.optimize
    metric: str | None = None  # what the value is, for an objective (adapters name their own)
    # A study of several objectives: each one's direction and name, the objective's own values
    # first, then what the orchestrator measures (orchestrator.record.study.objectives). None: one.
    directions: list[str] | None = None
    objectives: list[str] | None = None
    # An Optuna sampler or pruner object given to `optimize`, pickled (base64): each trial
    # process rebuilds it. Kept in the study's system attributes, not with the rest
    # (optuna-dashboard shows user attributes, and a pickle says nothing to a reader).
    sampler_pickle: str | None = None
    pruner_pickle: str | None = None
    grid: dict[str, list[Any]] | None = None  # --sampler grid: each parameter's values
    # Training runs per trial, with the adapter's seed option seed, seed + 1, ...; the trial's
    # value is their mean (adapters/repeats.py). Part of what a trial means: resume keeps it.
    repeats: int = 1
    # A trial's checkpoint after every N epochs (0: none); where they are kept, None: beside the
    # SQLite file (orchestrator/record/checkpoints/files.py). Neither changes what a trial means.
    checkpoint_every: int = 1
    artifacts: str | None = None
    # Trials of the budget that re-run the recommended configuration (orchestrator/intensify.py).
    intensify: int = 0
    # --fuse: the most trials of one shape one process trains as one fused model (docs/fused.md;
    # 1: a process per trial; "auto": the planner's choice per GPU). How trials run, not what
    # they mean: it may change on any resume.
    fuse: int | str = 1

    @property
    def all_directions(self) -> list[str]:
        """One direction per objective."""
        return list(self.directions) if self.directions else [self.direction]

    def to_attr(self) -> dict[str, Any]:
        """What is stored in the study's user attributes (the pickles go to system attributes)."""
        return {k: v for k, v in asdict(self).items() if k not in PICKLED}

    @classmethod
    def from_attr(cls, value: dict[str, Any]) -> StudySpec:
        known = {name for name in cls.__dataclass_fields__}
        return cls(**{key: val for key, val in value.items() if key in known})

    @classmethod
    def new(cls, **values: Any) -> StudySpec:
        """A spec of these values; one given as None (not typed) takes the default above."""
        return cls(**{key: val for key, val in values.items() if val is not None})

    def updated(self, **changes: Any) -> StudySpec:
        return replace(self, **{key: val for key, val in changes.items() if val is not None})


# What `--pruner` accepts; docs/pruners.md says when to use which.
PRUNERS = ("median", "hyperband", "halving", "patient", "wilcoxon", "none")
# Each rung of Hyperband and successive halving keeps the best 1/3 of the trials that reach it
# (Hyperband's paper and Optuna's HyperbandPruner use 3; Ray Tune's ASHA defaults to 4).
REDUCTION_FACTOR = 3
MEDIAN_STARTUP_TRIALS = 5  # trials that finish before the median rule judges anyone


def patience_for(epochs: int) -> int:
    """Epochs without improvement that the patient pruner waits: a fifth of them, at least 1."""
    return max(1, epochs // 5)


def pruner_for(spec: StudySpec) -> optuna.pruners.BasePruner:
    """The pruner named in the spec. Pruners hold no state in the storage, so every process
    builds its own from the spec; epochs are the resource (the adapter reports once per epoch)."""
    if spec.pruner_pickle is not None:
        return optuna_objects.unpickled(spec.pruner_pickle)
    if spec.pruner not in PRUNERS:
        raise UserError(
            f"study's pruner {spec.pruner!r} is unknown to this version; "
            f"choose one with --pruner {'|'.join(PRUNERS)}"
        )
    epochs = max(1, spec.epochs)
    warmup = max(1, epochs // 4)  # a quarter of the epochs pass before the median judges
    pruners = optuna.pruners
    if spec.pruner == "median":
        return pruners.MedianPruner(n_startup_trials=MEDIAN_STARTUP_TRIALS, n_warmup_steps=warmup)
    if spec.pruner == "hyperband":
        return pruners.HyperbandPruner(
            min_resource=1, max_resource=epochs, reduction_factor=REDUCTION_FACTOR
        )
    if spec.pruner == "halving":
        return pruners.SuccessiveHalvingPruner(
            min_resource=1, reduction_factor=REDUCTION_FACTOR, min_early_stopping_rate=0
        )
    if spec.pruner == "patient":
        median = pruners.MedianPruner(n_startup_trials=MEDIAN_STARTUP_TRIALS, n_warmup_steps=warmup)
        return pruners.PatientPruner(median, patience=patience_for(epochs), min_delta=0.0)
    if spec.pruner == "wilcoxon":
        return pruners.WilcoxonPruner(p_threshold=0.1, n_startup_steps=2)
    return pruners.NopPruner()


# The samplers whose processes agree only through the study's one seed, which they cannot derive
# themselves: those declared `seed_from_study` in samplers/_factory.py (record may not import
# samplers; a test ties them).
SEED_FROM_STUDY = frozenset({"qmc"})


def load_spec(study: optuna.Study) -> StudySpec | None:
    value = study.user_attrs.get(SPEC_ATTR)
    if not isinstance(value, dict):
        return None
    spec = StudySpec.from_attr(value)
    pickles = storage_of(study).get_study_system_attrs(study_id_of(study)).get(PICKLES_ATTR)
    if isinstance(pickles, dict):
        spec = replace(spec, **{k: v for k, v in pickles.items() if k in PICKLED})
    if spec.seed is None and spec.sampler in SEED_FROM_STUDY:
        # A study stored before seeds were drawn: QMC's points form one sequence only if every
        # process scrambles it alike, so each derives the same seed from the study itself.
        spec = replace(spec, seed=derived_seed(study.study_name, study_id_of(study)))
    return spec


SEED_LIMIT = 2**32  # seeds are 0 .. 2**32 - 1, what numpy, torch and Optuna's samplers take


def draw_seed() -> int:
    """A seed for a study whose user gave none: drawn once, stored with the study's settings, so
    that every process on every node samples from one sequence (QMC) and the study can be rerun."""
    return secrets.randbelow(SEED_LIMIT)


def derived_seed(study_name: str, study_id: int) -> int:
    digest = hashlib.sha256(f"{study_name}\0{study_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def save_spec(study: optuna.Study, spec: StudySpec, *, update_settings: bool = False) -> None:
    """Store the spec; settings that would change what the study's trials mean are refused
    unless `update_settings` (record/study/drift.py: `run`, `optimize`, and a run that
    raced another to create the study all meet this one check)."""
    drift.check_stored(study, load_spec(study), spec, update_settings=update_settings)
    # JSON round trip: user attributes must be JSON-serialisable, and we want a clear error if not.
    study.set_user_attr(SPEC_ATTR, json.loads(json.dumps(spec.to_attr())))
    pickles = {key: getattr(spec, key) for key in PICKLED}
    stored = storage_of(study).get_study_system_attrs(study_id_of(study)).get(PICKLES_ATTR)
    if any(pickles.values()) or stored:
        storage_of(study).set_study_system_attr(study_id_of(study), PICKLES_ATTR, pickles)


def study_names(storage: BaseStorage) -> list[str]:
    return sorted(summary.study_name for summary in storage.get_all_studies())


def load_existing_study(storage: BaseStorage, name: str, storage_label: str) -> optuna.Study:
    """The study called `name`, or a UserError that lists the studies that do exist."""
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = study_names(storage)
        have = (
            ", ".join(names)
            if names
            else "none yet (start one with `python -m orchestrator run ADAPTER`)"
        )
        raise UserError(f"no study {name!r} in {storage_label}; studies there: {have}") from None


# --- the budget ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetCount:
    complete: int = 0
    pruned: int = 0
    failed: int = 0  # failed and not re-queued: final
    retried: int = 0  # failed, with a WAITING copy that re-runs its parameters
    running: int = 0
    waiting: int = 0

    @property
    def counted(self) -> int:
        """Trials that have used up budget for good."""
        return self.complete + self.pruned + self.failed

    def may_ask(self, budget: int) -> bool:
        # A waiting trial is already inside the budget: asking hands it over, it adds nothing.
        return self.waiting > 0 or self.counted + self.running < budget

    def finished(self, budget: int) -> bool:
        return self.counted >= budget and self.running == 0


def retried_trial_numbers(trials: Iterable[FrozenTrial]) -> set[int]:
    """Numbers of failed trials whose parameters were re-queued (Optuna's retry_history format)."""
    retried: set[int] = set()
    for trial in trials:
        history = trial.system_attrs.get("retry_history")
        if history:
            retried.add(int(history[-1]))
    return retried


def count_trials(trials: Iterable[FrozenTrial]) -> BudgetCount:
    trials = list(trials)
    retried = retried_trial_numbers(trials)
    counts = dict.fromkeys(("complete", "pruned", "failed", "retried", "running", "waiting"), 0)
    for trial in trials:
        if trial.state == optuna.trial.TrialState.COMPLETE:
            counts["complete"] += 1
        elif trial.state == optuna.trial.TrialState.PRUNED:
            counts["pruned"] += 1
        elif trial.state == optuna.trial.TrialState.FAIL:
            counts["retried" if trial.number in retried else "failed"] += 1
        elif trial.state == optuna.trial.TrialState.RUNNING:
            counts["running"] += 1
        elif trial.state == optuna.trial.TrialState.WAITING:
            counts["waiting"] += 1
    return BudgetCount(**counts)


def set_metric_names(study: optuna.Study, spec: StudySpec, metric: str | None = None) -> None:
    """Name the study's values where people look (optuna-dashboard says "sharpe", not
    "Objective 0"): the spec's objectives, else its one metric (`metric`: the adapter's)."""
    names = list(spec.objectives or [metric or spec.metric or "value"])
    if len(names) == len(study.directions) and study.metric_names != names:
        study.set_metric_names(names)
