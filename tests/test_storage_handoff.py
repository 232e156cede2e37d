"""Trial processes never hold the study database's password in their environment: the URL comes
in their first message, not from $ORCHESTRATOR_STORAGE. An objective that prints its whole
environment (os.environ and /proc/self/environ) on a PostgreSQL URL with a password leaves the
password in no trial log, no spool file, no output of `run` or `logs`. Real `run` processes,
forked from the fork server and spawned, on a role with a password on the shared PostgreSQL."""

from __future__ import annotations

import os
import textwrap
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.cli_helpers import cli_env, run_cli

ROOT = Path(__file__).resolve().parents[1]

ADAPTER = textwrap.dedent(
    """
    import os
    from adapters.base import BATCH_SIZE_MAX, BATCH_SIZE_MIN, BaseAdapter

    class EnvironmentPrinter(BaseAdapter):
        name = "environment-printer"
        workload_class = "supervised"
        model_overhead_mb = 100.0
        per_sample_mb = 0.01
        direction = "minimize"
        metric = "loss"
        uses_torch = False
        options = {}

        def suggest(self, trial, options):
            return {
                "x": trial.suggest_float("x", 0.0, 1.0),
                "batch_size": trial.suggest_int(
                    "batch_size", BATCH_SIZE_MIN, BATCH_SIZE_MAX, log=True
                ),
            }

        def train(self, params, *, epochs, device, options, report):
            for key, value in sorted(os.environ.items()):
                print(f"{key}={value}")
            with open("/proc/self/environ", "rb") as environ:
                print(environ.read().replace(b"\\0", b"\\n").decode(errors="replace"))
            report(0, params["x"])
            return params["x"]

    adapter = EnvironmentPrinter()
    """
)


@pytest.fixture
def url_with_password(postgres_url):
    """The test's database, reached as a role of its own with a password."""
    role, password = f"orch_secret_{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    database = sa.engine.make_url(postgres_url).database
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'"))
        conn.execute(sa.text(f'ALTER DATABASE "{database}" OWNER TO {role}'))
    url = sa.engine.make_url(postgres_url).set(username=role, password=password)
    try:
        yield url.render_as_string(hide_password=False), password
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{database}" OWNER TO postgres'))
            conn.execute(sa.text(f"DROP OWNED BY {role}"))
            conn.execute(sa.text(f"DROP ROLE {role}"))
        admin.dispose()


@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_an_objective_printing_its_environment_shows_no_password(
    url_with_password, tmp_path, start
):
    url, password = url_with_password
    (tmp_path / "envprint.py").write_text(ADAPTER)
    path = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = cli_env(
        PYTHONPATH=path,
        ORCHESTRATOR_STORAGE=url,  # no --storage: the URL is in the environment
        ORCHESTRATOR_TRIAL_START=start,
        ENVIRONMENT_SEEN="yes-it-was-printed",
    )
    logs = tmp_path / "logs"
    ran = run_cli(
        "run", "--adapter-path", "envprint:adapter", "--study", "env", "--trials", "2",
        "--epochs", "1", "--pruner", "none", "--concurrency", "1", "--gpus", "none",
        "--log-dir", str(logs),
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    shown = run_cli("logs", "--study", "env", "--trial", "1", env=env, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    # The objective did print its environment, to its log and through `logs`:
    assert "ENVIRONMENT_SEEN=yes-it-was-printed" in shown.stdout, shown.stdout
    written = [p for p in logs.rglob("*") if p.is_file()]
    assert any("ENVIRONMENT_SEEN=yes-it-was-printed" in p.read_text() for p in written)
    for where, text in [
        ("run's output", ran.stdout + ran.stderr),
        ("logs' output", shown.stdout + shown.stderr),
        *((str(p), p.read_text(errors="replace")) for p in written),
    ]:
        assert password not in text, where
        assert "ORCHESTRATOR_STORAGE=" not in text, where
