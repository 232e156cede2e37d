"""Optuna's own sampler tests (vendored in test_samplers.py), run against PSOSampler.

By default only the tests that PSOSampler takes part in run: the rest of the file tests Optuna's
own samplers and takes about ten minutes. ORCHESTRATOR_OPTUNA_SUITE=all runs the whole file,
as it was checked before PSOSampler changes land.
"""

from __future__ import annotations

import os

import pytest

SUITE_ENV = "ORCHESTRATOR_OPTUNA_SUITE"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(SUITE_ENV) == "all":
        return
    here = os.path.dirname(__file__)
    ours, theirs = [], []
    for item in items:
        in_suite = str(item.path).startswith(here)
        (theirs if in_suite and "PSOSampler" not in item.nodeid else ours).append(item)
    if theirs:
        config.hook.pytest_deselected(items=theirs)
        items[:] = ours
