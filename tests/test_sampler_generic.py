"""Optuna's own generic sampler suites, run against PSOSampler and the bounded wrapper."""

from __future__ import annotations

import optuna
import pytest
from optuna.testing.pytest_samplers import (
    BasicSamplerTestCase,
    MultiObjectiveSamplerTestCase,
    RelativeSamplerTestCase,
)

from samplers import PSOSampler, bounded

optuna.logging.set_verbosity(optuna.logging.WARNING)


class TestPSOSamplerBasic(BasicSamplerTestCase):
    @pytest.fixture
    def sampler(self):
        # A small swarm, so that the suite's short studies get past the Latin-hypercube start.
        return lambda: PSOSampler(swarm_size=4, seed=0)


class TestPSOSamplerRelative(RelativeSamplerTestCase):
    @pytest.fixture
    def sampler(self):
        return lambda: PSOSampler(swarm_size=4, seed=0)


class TestPSOSamplerMultiObjective(MultiObjectiveSamplerTestCase):
    @pytest.fixture
    def sampler(self):
        return lambda: PSOSampler(swarm_size=4, seed=0)


class TestBoundedQMCRelative(RelativeSamplerTestCase):
    """The wrapper must not break a relative sampler of Optuna's."""

    @pytest.fixture
    def sampler(self):
        return lambda: bounded(optuna.samplers.QMCSampler(seed=0), {"x": (0.5, 8)})


class TestBoundedTPERelative(RelativeSamplerTestCase):
    @pytest.fixture
    def sampler(self):
        return lambda: bounded(
            optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=1),
            {"x": (0.5, 8)},
        )
