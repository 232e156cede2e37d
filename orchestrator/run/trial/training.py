"""A trial's training: the adapter's `train` once, or with `--repeats N` once per seed.

With N > 1 the adapter trains with seeds seed .. seed + N - 1 (adapters/repeats.py); the
trial's value, what the sampler and the pruner see, is their mean, and each seed's score and
their spread are kept with the trial as user attributes (`repeat_values`, `repeat_std`).
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from adapters.repeats import REPEAT_STD_ATTR, REPEAT_VALUES_ATTR, seeded, train_repeated
from orchestrator.record.checkpoints.handle import TrainedUntil
from orchestrator.record.trials import attr_names as names
from orchestrator.record.trials.attrs import set_user_attrs
from orchestrator.run.trial.checkpoints import reporting_to, takes_checkpoint

if TYPE_CHECKING:
    import optuna

    from orchestrator.record.study.spec import StudySpec
    from orchestrator.run.trial.context import TrialContext


def train(
    ctx: TrialContext,
    spec: StudySpec,
    trial: optuna.Trial,
    params: dict[str, Any],
    report: Any,
    checkpoint: Any = None,
) -> Any:
    """The adapter's training run; with `--repeats N`, N runs with seeds seed .. seed + N - 1,
    their mean the value the study (and its pruner) sees, each run's score and the spread kept
    with the trial (adapters/repeats.py).

    A single run gets the trial's checkpoint handle when its `train` takes `checkpoint=`; a run
    stopped at `train_until_epoch` returns the value reported there. Repeated runs train from
    scratch: N seeds are N states, and a trial's checkpoint is one."""
    options = _seeded_options(spec, trial)
    if spec.repeats <= 1:
        extra: dict[str, Any] = {}
        saves = checkpoint is not None and takes_checkpoint(ctx.adapter.train)
        if saves:
            extra["checkpoint"] = checkpoint
        if checkpoint is not None:
            report = reporting_to(checkpoint, report, saves)
        try:
            return ctx.adapter.train(
                params,
                epochs=spec.epochs,
                device=ctx.training_device(),
                options=options,
                report=report,
                **extra,
            )
        except TrainedUntil as stop:  # train_until_epoch: a segment ends with its last value
            return stop.value

    runs = train_repeated(
        ctx.adapter.train,
        params,
        repeats=spec.repeats,
        epochs=spec.epochs,
        device=ctx.training_device(),
        options=options,
        report=report,
    )
    set_user_attrs(trial, repeat_attrs(runs.values))
    return runs.mean


def _seeded_options(spec: StudySpec, trial: optuna.Trial) -> dict[str, Any]:
    """The adapter's options; for a re-run of `--intensify` (orchestrator/intensify.py), with
    the seeds its `seed_offset` says, so that it is a new draw of its configuration."""
    offset = trial.user_attrs.get(names.SEED_OFFSET)
    if not offset or "seed" not in spec.options:
        return spec.options
    return seeded(spec.options, int(offset))


def repeat_attrs(values: list[float]) -> dict[str, Any]:
    """What a repeated trial keeps: each seed's score, in seed order, and their spread."""

    spread = statistics.pstdev(values) if len(values) > 1 else 0.0
    return {REPEAT_VALUES_ATTR: list(values), REPEAT_STD_ATTR: spread}
