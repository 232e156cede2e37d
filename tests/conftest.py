"""Shared fixtures: a real SQLite file and a real PostgreSQL database per test.

PostgreSQL comes from ORCHESTRATOR_TEST_POSTGRES (a server URL; each test makes its own database
and drops it). Unset outside CI, those tests skip with the reason; under CI=true they fail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# Every property test of the suite: how fast examples are made or run is no part of what it
# asserts. Beside other work (a load of 7-100 on 2 cores) Hypothesis's own checks failed tests
# whose property held ("FailedHealthCheck: Input generation is slow", a deadline exceeded):
# no deadline per example, and no health check on generation speed. A test's own @settings
# still sets its examples; anything it does not set comes from here.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

POSTGRES_ENV = "ORCHESTRATOR_TEST_POSTGRES"


def _server_url() -> str | None:
    url = os.environ.get(POSTGRES_ENV)
    if url:
        return url
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {POSTGRES_ENV} is unset: CI must test against a real PostgreSQL")
    pytest.skip(f"{POSTGRES_ENV} is unset: set it to a PostgreSQL server URL to run this test")
    return None


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A URL to a brand-new PostgreSQL database, dropped after the test."""
    import sqlalchemy as sa

    server = _server_url()
    assert server is not None
    name = f"orch_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as error:
        admin.dispose()
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"PostgreSQL at {POSTGRES_ENV} does not answer: {error.orig}")
    url = sa.engine.make_url(server).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def storage_url(request) -> str:
    """Each test that takes this runs once on an SQLite file and once on PostgreSQL."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("postgres_url")


# The files that take longest (seconds of a whole run on 2 cores, pytest --durations), started
# first: pytest-xdist hands out whole files (--dist loadfile) in collection order, and one of
# these handed out last kept one worker busy for minutes after the others had finished. Order
# only: every test still runs, and a file missing here runs after these, in its usual order.
SLOWEST_FIRST = (
    "test_slurm_cluster.py",  # 129
    "test_pool_processes.py",  # 120
    "test_pbt_faults.py",  # 119
    "test_pbt_host_death.py",  # 112
    "test_budget_race.py",  # 93
    "test_admission_processes.py",  # 93
    "test_fused_pool.py",  # 86
    "test_connection_limit.py",  # 86
    "test_host_death.py",  # 84
    "test_machine_faults.py",  # 76
    "test_checkpoint_resume.py",  # 76
    "test_outage_run.py",  # 74
    "test_trust_cli.py",  # 59
    "test_trial_logs.py",  # 58
    "test_qmc_seed.py",  # 55
    "test_user_adapters.py",  # 43
    "test_run_cli.py",  # 39
    "test_trial_lifecycle.py",  # 37
    "test_misbehaving_objectives.py",  # 37
    "test_gpu_check.py",  # 36
    "test_sampler_distributed.py",  # 35
    "test_checkpoint_faults.py",  # 34
    "test_storage_handoff.py",  # 34
    "test_intensify.py",  # 33
    "test_pgbouncer_restart.py",  # 31
    "test_recommendation_shown.py",  # 30
    "test_sqlite_faults.py",  # 30
    "test_settings_drift.py",  # 29
)


def pytest_configure(config) -> None:
    # pytest-xdist 3.7 and later hand out the files with the most tests first unless told not
    # to, which undid the order above: the slowest files, of few tests each, ran last.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items) -> None:
    def rank(item) -> int:
        name = item.path.name
        return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests keep their order


def pytest_sessionstart(session) -> None:
    """Compile the project's modules once, where PYTHONDONTWRITEBYTECODE would have each of the
    suite's hundreds of commands and fork servers compile them again (0.2 s of CPU each; Python
    still reads the compiled files the flag forbids it to write). In the controller only: the
    xdist workers start after it."""
    if os.environ.get("PYTEST_XDIST_WORKER") is not None:
        return
    import compileall
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for package in ("orchestrator", "adapters", "samplers", "tests", "examples"):
        compileall.compile_dir(root / package, quiet=2, workers=1)
