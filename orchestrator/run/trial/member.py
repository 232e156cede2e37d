"""A member of a fused group (docs/fused.md): whether a study's trials can be fused, which of a
member's parameters set the group's shape, and a member's report.

The adapter's `train_fused` gets its members as `adapters.base.Member`: a trial in everything
but its process (its own parameters, `report` and checkpoint handle).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.imports import LazyImport
from samplers import sampler_kind

if TYPE_CHECKING:
    import optuna

    from orchestrator.record.study.spec import StudySpec
else:
    optuna = LazyImport("optuna")


def unfused_because(adapter: Any, spec: StudySpec) -> str | None:
    """Why this study's trials cannot be trained fused, in a few words; None when they can."""
    kind = sampler_kind(spec.sampler)
    if not callable(getattr(adapter, "train_fused", None)):
        return f"adapter {getattr(adapter, 'name', '?')!r} has no train_fused"
    if spec.repeats > 1:
        return "--repeats trains each trial several times, one model each"
    if spec.intensify > 0:
        return "--intensify re-runs train with seeds of their own"
    if kind.needs_grid:
        return f"--sampler {spec.sampler} hands out its trials one at a time"
    return None


class _Reading(Mapping[str, Any]):
    """Parameters that note which of them are read."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.params, self.read = params, set()

    def __getitem__(self, name: str) -> Any:
        self.read.add(name)
        return self.params[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)


def shape_of(adapter: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters the adapter's `fuse_key` reads, with these values: fixing them makes
    every member's key this one's (an adapter without `fuse_key` fuses any members)."""
    fuse_key = getattr(adapter, "fuse_key", None)
    if not callable(fuse_key):
        return {}
    reading = _Reading(params)
    fuse_key(reading)
    return {name: params[name] for name in sorted(reading.read)}


def ended_when_pruned(report: Any, end: Any) -> Any:
    """`report`, which ends its member as soon as it is pruned: the study hears PRUNED at the
    epoch the pruner judged (the dashboard, `status` and the pruner's next judgements of the
    others see it then), not when the group's last member is done."""

    def report_epoch(epoch: int, value: float) -> None:
        try:
            report(epoch, value)
        except optuna.TrialPruned:
            end()
            raise

    return report_epoch
