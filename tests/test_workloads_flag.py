"""`run`, `worker` and `plan` read `--workloads FILE`, as docs/deploy.md says they do."""

from __future__ import annotations

import optuna

from orchestrator.cli import main
from orchestrator.planning.workloads import WORKLOADS_ENV
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.study.spec import SPEC_ATTR
from tests.cli_helpers import run_cli


def test_plan_reads_the_workloads_file(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(WORKLOADS_ENV, raising=False)
    overrides = tmp_path / "workloads.toml"
    overrides.write_text("[supervised]\ncpu_bound = true\n")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    assert main(["plan", "synthetic", "--gpus", "sim:24576", "--storage", storage]) == 0
    assert "supervised is GPU-bound" in capsys.readouterr().out
    argv = ["plan", "synthetic", "--gpus", "sim:24576", "--storage", storage]
    assert main([*argv, "--workloads", str(overrides)]) == 0
    assert "supervised is CPU-bound" in capsys.readouterr().out


def test_run_reads_the_workloads_file(tmp_path):
    (tmp_path / "workloads.toml").write_text("[supervised]\ndefault_epochs = 3\n")
    done = run_cli(
        "run", "synthetic", "--trials", "1", "--option", "trial_seconds=0.1", "--gpus",
        "sim:24576", "--workloads", "workloads.toml", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    study = optuna.load_study(
        study_name="synthetic",
        storage=StorageLocation.parse(f"sqlite:///{tmp_path / 'orchestrator.db'}").url,
    )
    assert study.user_attrs[SPEC_ATTR]["epochs"] == 3  # the file's default, not the class's 15


def test_the_docs_name_every_command_that_reads_it():
    from pathlib import Path

    deploy = (Path(__file__).resolve().parents[1] / "docs" / "deploy.md").read_text()
    assert "`run`, `worker`, `plan` and `manifests` all take `--workloads FILE`" in deploy
