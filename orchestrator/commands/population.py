"""What `run --sampler pbt` checks before anything is stored, and its `--pbt-keep` names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.run.trial.checkpoints import takes_checkpoint
from samplers import sampler_kind

if TYPE_CHECKING:
    from orchestrator.record.study.spec import StudySpec


def keep_names(text: str | None) -> list[str] | None:
    """`--pbt-keep width,hidden` as parameter names (None when not typed)."""
    if text is None:
        return None
    names = [name.strip() for name in text.split(",")]
    wrong = [name for name in names if not name.isidentifier()]
    if wrong or not names:
        shown = text if text.isprintable() else repr(text)
        raise UserError(
            f"--pbt-keep {shown}: give parameter names separated by commas, such as "
            "--pbt-keep width,hidden"
        )
    return list(dict.fromkeys(names))


def check_population(spec: StudySpec, adapter: Any) -> None:
    """Population-based training continues members from checkpoints: an adapter whose `train`
    saves none would train every segment from epoch 0."""
    kind = sampler_kind(spec.sampler)
    if spec.pbt_keep and not kind.needs_checkpoints:
        raise UserError(
            f"--pbt-keep is for --sampler pbt, and this study's sampler is {spec.sampler!r}: "
            "drop --pbt-keep or add --sampler pbt"
        )
    if kind.needs_checkpoints and not takes_checkpoint(adapter.train):
        raise UserError(
            f"--sampler {spec.sampler} needs an adapter that checkpoints its training, and "
            f"{adapter.name!r} does not (its train takes no checkpoint=, docs/checkpoints.md): choose another "
            "--sampler"
        )
