"""Each study has one folder of its own for its trial logs and spool: inside the log root, never
shared with another study, whatever its name, and readable by its user only."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest

from orchestrator.record.spool.spool import spool_dir
from orchestrator.record.study.names import study_folder
from orchestrator.record.trials.logs import private_folder, trial_log_path
from tests.cli_helpers import cli_env, run_cli

ROOT = Path(__file__).resolve().parents[1]
ENV = cli_env(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
ODD_NAMES = ["..", ".", "c/d", "c?d", "c_d", "../../etc", "x" * 300, "s" * 512, "a:b", "-"]


def test_every_name_gets_a_folder_of_its_own_inside_the_root(tmp_path):
    root = tmp_path / "logs"
    folders = [trial_log_path(root, name, 0).parent for name in ODD_NAMES]
    assert len(set(folders)) == len(ODD_NAMES)  # never shared
    for folder in folders:
        assert folder.parent == root  # never outside the root, never a sub-folder
        assert folder.name not in (".", "..") and len(folder.name) < 255
    assert study_folder("dqn-l4") == "dqn-l4"  # a plain name is its own folder, as before
    assert spool_dir(root, "..").parent == trial_log_path(root, "..", 0).parent


def test_folders_made_for_logs_are_0700_whatever_the_umask(tmp_path):
    old = os.umask(0o000)
    try:
        made = private_folder(tmp_path / "root" / "study")
    finally:
        os.umask(old)
    assert made.is_dir()
    assert (tmp_path / "root").stat().st_mode & 0o777 == 0o700
    assert made.stat().st_mode & 0o777 == 0o700
    tmp_path.chmod(0o755)
    private_folder(tmp_path)  # a folder that exists (a --log-dir of /tmp) is left as it is
    assert tmp_path.stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("names", [("c/d", "c?d"), ("..", ".")])
def test_two_studies_with_look_alike_names_keep_their_own_logs(tmp_path, names):
    """Real runs: `..` and `.` write nothing beside the log root; `logs --study c/d` shows c/d's."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    root = tmp_path / "study-logs"
    for name in names:
        done = run_cli(
            "run", "--adapter-path", "tests.noisy_adapter:adapter", "--study", name, "--trials", "1", "--epochs", "1",
            "--gpus", "sim:24576", "--option", "trial_seconds=0", "--storage", url, "-q",
            "--pruner", "none", cwd=tmp_path, env=ENV,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    made = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("study.db"))
    assert made == ["study-logs"]  # nothing beside the log root
    assert len(list(root.iterdir())) == 2
    for name in names:
        trial = optuna.load_study(study_name=name, storage=url).trials[0]
        path = Path(trial.user_attrs["log_file"])
        assert path.parent.parent == root
        assert path.parent.stat().st_mode & 0o777 == 0o700
        shown = run_cli("logs", "--study", name, "--trial", "0", "--storage", url)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == path.read_text()
        assert shown.stdout.count("noisy: training batch") == 1  # its own trial's, no other's
