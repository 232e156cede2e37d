"""Whether a study's trials can be trained fused (docs/fused.md).

The adapter's `train_fused` gets its members as `adapters.base.Member`: a trial in everything
but its process (its own parameters, `report` and checkpoint handle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samplers import sampler_kind

if TYPE_CHECKING:
    from orchestrator.record.study.spec import StudySpec


def unfused_because(adapter: Any, spec: StudySpec) -> str | None:
    """Why this study's trials cannot be trained fused, in a few words; None when they can."""
    kind = sampler_kind(spec.sampler)
    if not callable(getattr(adapter, "train_fused", None)):
        return f"adapter {getattr(adapter, 'name', '?')!r} has no train_fused"
    if spec.repeats > 1:
        return "--repeats trains each trial several times, one model each"
    if spec.intensify > 0:
        return "--intensify re-runs train with seeds of their own"
    if kind.needs_grid or kind.needs_checkpoints:
        return f"--sampler {spec.sampler} hands out its trials one at a time"
    return None
