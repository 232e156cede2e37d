"""--repeats: a trial trains with several seeds; the sampler and the pruner see the mean."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.repeats import Repeated, check_repeats, train_repeated
from orchestrator.errors import UserError


class Seeded:
    """A stand-in adapter whose score at each epoch depends on its seed and the epoch."""

    name = "seeded"
    options = {"seed": 0}

    def __init__(self) -> None:
        self.seeds: list[int] = []

    def train(self, params, *, epochs, device, options, report) -> float:
        seed = int(options["seed"])
        self.seeds.append(seed)
        value = 0.0
        for epoch in range(epochs):
            value = params["x"] * (epoch + 1) + seed
            report(epoch, value)
        return value


def test_repeats_train_with_consecutive_seeds_and_score_their_mean():
    adapter = Seeded()
    reports: list[tuple[int, float]] = []
    result = train_repeated(
        adapter.train,
        {"x": 1.0},
        repeats=3,
        epochs=2,
        device=None,
        options={"seed": 10},
        report=lambda step, value: reports.append((step, value)),
    )
    assert adapter.seeds == [10, 11, 12]
    assert result.values == [12.0, 13.0, 14.0]
    assert result.mean == pytest.approx(13.0)
    assert result.std == pytest.approx((2 / 3) ** 0.5)
    # The pruner sees each step once, as the mean over the seeds at that step.
    assert reports == [(0, pytest.approx(12.0)), (1, pytest.approx(13.0))]


def test_one_repeat_is_the_plain_run():
    adapter = Seeded()
    reports: list[Any] = []
    result = train_repeated(
        adapter.train,
        {"x": 2.0},
        repeats=1,
        epochs=2,
        device=None,
        options={"seed": 0},
        report=lambda s, v: reports.append((s, v)),
    )
    assert result.values == [4.0] and reports == [(0, 2.0), (1, 4.0)]
    assert Repeated([1.0]).std == 0.0


def test_repeats_need_a_seed_option_and_a_sane_count():
    check_repeats(Seeded(), 5)

    class NoSeed:
        name = "noseed"
        options: dict[str, Any] = {}

    with pytest.raises(UserError, match="needs an adapter with a `seed` option"):
        check_repeats(NoSeed(), 2)
    check_repeats(NoSeed(), 1)
    with pytest.raises(UserError, match="from 1 to 100"):
        check_repeats(Seeded(), 0)
