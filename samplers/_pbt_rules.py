"""Population-based training's decisions, as pure functions of the population's segments.

A member of the population trains in segments of `interval` epochs; each segment is one trial.
When a member's segment has ended, its next one is decided here: the member continues from its
own checkpoint, or (when it ranks in the bottom quantile) copies a top member's checkpoint and
perturbs that member's hyperparameters. The rules are Ray Tune's PopulationBasedTraining's:
quantile 0.25 (at most half the population on each side), resample with probability 0.25,
otherwise scale a number by 0.8 or 1.2 and move a choice to a neighbouring one.

No I/O and no Optuna storage here: `samplers._pbt` reads the segments from the storage, and
asks these functions what the next segment is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from samplers._space import from_unit

QUANTILE = 0.25
RESAMPLE_PROBABILITY = 0.25
PERTURBATION_FACTORS = (1.2, 0.8)
# Parameters that shape a model's weights: a checkpoint cannot be loaded into another shape, so
# a copied member keeps its donor's value (the built-in adapters' width is `hidden_size`).
KEEP = ("hidden_size", "hidden_layers", "num_layers", "n_layers")


@dataclass(frozen=True)
class Segment:
    """One trial of the population: a stretch of one member's training."""

    number: int  # the trial's number
    member: int
    generation: int  # segments before it in its lineage (0: a fresh start)
    start: int  # epochs already trained when it began (its parent's checkpoint epoch)
    until: int  # the epoch it trains to
    state: str  # "running", "complete" or "failed" (pruned and failed alike)
    score: float | None  # the value at `until`, to minimise; None unless complete and finite
    params: Mapping[str, Any]
    distributions: Mapping[str, BaseDistribution]


@dataclass(frozen=True)
class Plan:
    """What a new segment does."""

    member: int
    generation: int
    start: int  # the epoch its parent's checkpoint holds (0: trains from scratch)
    until: int
    parent: int | None  # the trial whose checkpoint it loads; None: a fresh start
    params: dict[str, Any] | None  # None: drawn afresh (a new member)
    exploited: bool = False  # it copied another member's checkpoint and perturbed its params
    fresh_round: int = 0  # a fresh start: how many fresh starts this member had before


@dataclass(frozen=True)
class Settings:
    population: int
    interval: int  # epochs per segment
    epochs: int  # epochs of a whole lineage
    quantile: float = QUANTILE
    resample_probability: float = RESAMPLE_PROBABILITY
    factors: tuple[float, ...] = PERTURBATION_FACTORS
    keep: tuple[str, ...] = KEEP  # never perturbed: they shape the checkpoint


def default_interval(epochs: int) -> int:
    """Epochs per segment when none is given: a lineage of four segments (at least 1 epoch)."""
    return max(1, math.ceil(epochs / 4))


def by_member(segments: Sequence[Segment]) -> dict[int, list[Segment]]:
    """Each member's segments, oldest first."""
    found: dict[int, list[Segment]] = {}
    for segment in sorted(segments, key=lambda s: s.number):
        found.setdefault(segment.member, []).append(segment)
    return found


def latest_complete(segments: Sequence[Segment]) -> Segment | None:
    done = [s for s in segments if s.state == "complete"]
    return done[-1] if done else None


def free_members(segments: Sequence[Segment], population: int) -> list[int]:
    """Members with no segment running: a new segment may start for each of them."""
    members = by_member(segments)
    return [m for m in range(population) if not members.get(m) or members[m][-1].state != "running"]


def pick_member(segments: Sequence[Segment], free: Sequence[int], rng: np.random.Generator) -> int:
    """The free member furthest behind (fewest epochs in its latest complete segment; of those,
    one whose last segment failed), a tie drawn at random: the population moves on together,
    and a failed segment is replaced first."""
    members = by_member(segments)

    def behind(member: int) -> tuple[int, int]:
        own = members.get(member, [])
        done = latest_complete(own)
        failed = bool(own) and own[-1].state == "failed"
        return (0 if done is None else done.until, 0 if failed else 1)

    first = min(behind(m) for m in free)
    tied = [m for m in free if behind(m) == first]
    return int(tied[int(rng.integers(len(tied)))])


def quantiles(scores: Mapping[int, float], fraction: float) -> tuple[list[int], list[int]]:
    """(bottom, top) members by score (lower is better), as Ray Tune's PBT splits them: the
    fraction of the members rounded up, at most half of them on each side."""
    if len(scores) <= 1:
        return [], []
    ranked = sorted(scores, key=lambda m: (scores[m], m))
    size = math.ceil(len(ranked) * fraction)
    size = min(size, len(ranked) // 2)
    if size == 0:
        return [], []
    return ranked[-size:], ranked[:size]


def next_segment(
    segments: Sequence[Segment], member: int, settings: Settings, rng: np.random.Generator
) -> Plan:
    """The next segment of `member`, which has none running.

    A member with no complete segment starts fresh. The others are ranked by the latest
    complete segment of each member that can still train (its lineage has epochs to go): in the
    bottom quantile a member exploits a top one that trained at least as far (copies its
    checkpoint and explores its params); anywhere else it continues from its own checkpoint
    with its own params. A member whose
    lineage reached the last epoch takes up the best member that can still train, as an exploit
    (with workers training at different speeds some lineages finish first, and the budget is
    better spent on the best lineage than on a fresh start that cannot catch up); when none can,
    it starts afresh."""
    members = by_member(segments)
    own = members.get(member, [])
    base = latest_complete(own)
    fresh_round = sum(1 for s in own if s.generation == 0 and s.state == "complete")
    fresh = Plan(
        member, 0, 0, min(settings.interval, settings.epochs), None, None, False, fresh_round
    )
    if base is None:
        return fresh
    latest = {m: latest_complete(ss) for m, ss in members.items() if m < settings.population}
    scores = {
        m: s.score
        for m, s in latest.items()
        if s is not None and s.score is not None and s.until < settings.epochs
    }
    if base.until >= settings.epochs:
        if not scores:
            return fresh
        best = min(scores, key=lambda m: (scores[m], m))
        return _exploit(member, latest[best], settings, rng)
    bottom, top = quantiles(scores, settings.quantile)
    # A donor behind the member (workers train at different speeds) would throw its epochs
    # away and train a stretch of them again: only one at least as far is copied.
    top = [m for m in top if (donor := latest[m]) is not None and donor.until >= base.until]
    if member in bottom and top:
        return _exploit(member, latest[int(rng.choice(top))], settings, rng)
    until = min(base.until + settings.interval, settings.epochs)
    return Plan(member, base.generation + 1, base.until, until, base.number, dict(base.params))


def _exploit(
    member: int, donor: Segment | None, settings: Settings, rng: np.random.Generator
) -> Plan:
    """`member` goes on from `donor`'s checkpoint with `donor`'s params explored."""
    assert donor is not None
    params = explore(donor.params, donor.distributions, settings, rng)
    until = min(donor.until + settings.interval, settings.epochs)
    return Plan(member, donor.generation + 1, donor.until, until, donor.number, params, True)


def explore(
    params: Mapping[str, Any],
    distributions: Mapping[str, BaseDistribution],
    settings: Settings,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """`params` perturbed, one parameter at a time: resampled with `resample_probability`, else
    a number scaled by one of `factors` and a choice moved to a neighbour, always inside its
    distribution. Parameters in `settings.keep`, and those whose distribution has one value,
    stay as they are."""
    out = dict(params)
    for name in sorted(params):
        dist = distributions.get(name)
        if dist is None or dist.single() or name in settings.keep:
            continue
        if rng.random() < settings.resample_probability:
            out[name] = resample(dist, rng)
        else:
            out[name] = perturb(dist, params[name], settings.factors, rng)
    return out


def resample(dist: BaseDistribution, rng: np.random.Generator) -> Any:
    """A value drawn afresh from the distribution (log-uniform where it is log)."""
    return from_unit(dist, float(rng.random()))


def perturb(
    dist: BaseDistribution, value: Any, factors: Sequence[float], rng: np.random.Generator
) -> Any:
    """`value` scaled by a factor drawn from `factors`, or a choice moved one place either way."""
    if isinstance(dist, CategoricalDistribution):
        choices = list(dist.choices)
        if value not in choices:
            return choices[int(rng.integers(len(choices)))]
        index = choices.index(value) + (1 if rng.random() < 0.5 else -1)
        return choices[min(max(index, 0), len(choices) - 1)]
    factor = float(factors[int(rng.integers(len(factors)))])
    if isinstance(dist, IntDistribution):
        return _scaled_int(dist, int(value), factor)
    assert isinstance(dist, FloatDistribution)
    scaled = min(max(float(value) * factor, dist.low), dist.high)
    if dist.step is not None:
        steps = round((scaled - dist.low) / dist.step)
        scaled = min(dist.low + steps * dist.step, dist.high)
    return scaled


def _scaled_int(dist: IntDistribution, value: int, factor: float) -> int:
    """An integer scaled and snapped to its step. One too small to change by the factor (a
    batch of 2 times 0.8 is still 2) moves one step the factor's way: otherwise it never would."""
    step = dist.step
    target = value * factor
    snapped = dist.low + round((target - dist.low) / step) * step
    if snapped == value:
        snapped = value + (step if factor > 1 else -step)
    return int(min(max(snapped, dist.low), dist.high - (dist.high - dist.low) % step))


def claims_read(segments: Sequence[Segment]) -> set[tuple[int, int]]:
    """The claims an ask read, as (trial, member) pairs: what `_contested` does not count."""
    return {(s.number, s.member) for s in segments}


def plan_record(plan: Plan) -> dict[str, Any]:
    """A plan as the trial's system attribute stores it."""
    return {
        "member": plan.member,
        "generation": plan.generation,
        "start": plan.start,
        "until": plan.until,
        "parent": plan.parent,
        "params": plan.params,
        "round": plan.fresh_round,
    }
