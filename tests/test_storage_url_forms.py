"""Every PostgreSQL URL form the docs give and the commands print opens the study in plain Optuna.

The forms are collected from what a user reads: README.md and docs/deploy.md, every command's
`--help`, the files the cluster engines write (the Slurm script, the Kubernetes commands, the
compose file), what `status` prints, and the exit-75 line's resume advice. Each is then given the
test server's address and opened by a separate Python that imports Optuna and optuna-dashboard
only (not this package): `optuna.load_study`, optuna-dashboard's storage, `optuna.artifacts`.
Before psycopg 3 was a dependency, `postgresql://` stopped there at "No module named 'psycopg'".
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import build_parser
from orchestrator.deploy.engine import StudyWorkers
from orchestrator.deploy.engines import ENGINES
from orchestrator.deploy.kubernetes import Deployment, apply_commands
from orchestrator.planning.workloads import workload_class
from orchestrator.record.outages.state import resume_text
from tests.cli_helpers import cli_env, run_cli

ROOT = Path(__file__).resolve().parent.parent
SCHEME = re.compile(r"\bpostgresql(?:\+[a-z0-9]+)?(?=://)")

PLAIN_OPTUNA = """
import sys
import optuna
from optuna.artifacts import get_all_artifact_meta
from optuna_dashboard._storage_url import get_storage

url, name = sys.argv[1:]
study = optuna.load_study(study_name=name, storage=url)
dashboard = optuna.load_study(study_name=name, storage=get_storage(url))
assert "orchestrator" not in sys.modules
print(len(study.trials), len(dashboard.trials), len(get_all_artifact_meta(study)))
"""


def help_texts() -> str:
    parser = build_parser()
    (commands,) = (a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return "\n".join(sub.format_help() for sub in commands.choices.values())


def printed_schemes(status_out: str) -> set[str]:
    workers = StudyWorkers(study="s", workers=2, workload=workload_class("rl"), adapter="synthetic")
    texts = [
        (ROOT / "README.md").read_text(),
        (ROOT / "docs" / "deploy.md").read_text(),
        help_texts(),
        *(text for engine in ENGINES.values() for text in engine.render(workers).values()),
        "\n".join(apply_commands(Deployment("synthetic", workload_class("rl"), "s", 1), "k8s")),
        status_out,
        resume_text(["run", "synthetic", "--storage", "postgresql://a:pw@db/x"], {}),
    ]
    return {match for text in texts for match in SCHEME.findall(text)}


def with_scheme(url: str, scheme: str) -> str:
    return scheme + url[url.index("://") :]


@pytest.mark.postgres
def test_every_printed_url_form_opens_the_study_in_plain_optuna(postgres_url, tmp_path) -> None:
    plain = with_scheme(postgres_url, "postgresql")  # the README's form creates the study
    made = run_cli(
        "run", "synthetic", "--study", "forms", "--trials", "1", "--epochs", "1", "--gpus", "none",
        "--option", "trial_seconds=0", "--storage", plain,
        cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    status = run_cli("status", "--storage", plain, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    schemes = printed_schemes(status.stdout)
    # The forms a user meets: the README's, the compose file's and the tests', and psycopg 3's.
    assert {"postgresql", "postgresql+psycopg2"} <= schemes, schemes
    env = {k: v for k, v in cli_env().items() if k != "PYTHONPATH"}
    for scheme in sorted(schemes | {"postgresql+psycopg"}):
        url = with_scheme(postgres_url, scheme)
        opened = subprocess.run(
            [sys.executable, "-c", PLAIN_OPTUNA, url, "forms"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env=env,
        )
        assert opened.returncode == 0, (scheme, opened.stderr)
        assert opened.stdout.split()[:2] == ["1", "1"], (scheme, opened.stdout)
        # ... and our own commands open it as written, too.
        ours = run_cli("status", "--study", "forms", "--storage", url, cwd=tmp_path)
        assert ours.returncode == 0, (scheme, ours.stderr)


def test_the_resume_line_says_how_to_put_a_typed_url_in_the_environment() -> None:
    url = "postgresql://alice:s3cret-pw@db.example:5432/studies"
    argv = ["run", "synthetic", "--storage", url, "--trials", "12"]
    unset = resume_text(argv, {})
    assert "s3cret" not in unset
    command = 'python -m orchestrator run synthetic --storage "$ORCHESTRATOR_STORAGE" --trials 12'
    assert unset.startswith(f"`{command}` once the URL is in ORCHESTRATOR_STORAGE")
    assert "export ORCHESTRATOR_STORAGE='postgresql://alice:***@db.example:5432/studies'" in unset
    # Pasted as shown after that export (the password put back), it runs on that URL.
    assert resume_text(argv, {"ORCHESTRATOR_STORAGE": url}) == f"`{command}`"
    other = resume_text(argv, {"ORCHESTRATOR_STORAGE": "postgresql://bob:x@elsewhere/db"})
    assert "once the URL is in ORCHESTRATOR_STORAGE" in other
    # A URL without a password is pasted as typed, and needs nothing else.
    bare = resume_text(["worker", "--study", "s", "--storage", "postgresql://bob@db/x"], {})
    assert bare == "`python -m orchestrator worker --study s --storage postgresql://bob@db/x`"
    assert os.environ.get("ORCHESTRATOR_STORAGE") != url
