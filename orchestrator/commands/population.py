"""What `run --sampler pbt` checks before anything is stored."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.run.trial.checkpoints import takes_checkpoint
from samplers import sampler_kind

if TYPE_CHECKING:
    from orchestrator.record.study.spec import StudySpec


def check_population(spec: StudySpec, adapter: Any) -> None:
    """Population-based training continues members from checkpoints: an adapter whose `train`
    saves none would train every segment from epoch 0."""
    if sampler_kind(spec.sampler).needs_checkpoints and not takes_checkpoint(adapter.train):
        raise UserError(
            f"--sampler {spec.sampler} needs an adapter that checkpoints its training, and "
            f"{adapter.name!r} does not (its train takes no checkpoint=, docs/checkpoints.md): choose another "
            "--sampler"
        )
