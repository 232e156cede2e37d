"""`--artifacts` and `optimize(artifacts=...)`: a place that cannot hold checkpoints is refused
before anything is stored, in one line that never shows a secret; a good one is stored absolute.

Each bad place is tried through `run` (exit 2, one line on stderr, nothing on stdout, no file
made) and through the Python API (a ValueError or TypeError in its own words, nothing made).
`s3://` and `gs://` without their extra: a package on the path that fails to import stands in
for the one not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import cli_env, run_cli

SECRET = "PW"  # must never be printed
ROOT = Path(__file__).resolve().parents[1]


def _missing_packages(tmp_path: Path) -> str:
    """A folder whose `boto3` and `google` fail to import, as when the extras are not installed."""
    shim = tmp_path / "shim"
    for package in ("boto3", "google"):
        (shim / package).mkdir(parents=True)
        (shim / package / "__init__.py").write_text(f"raise ImportError('no {package} here')\n")
    return str(shim)


# (what is wrong, the value, a part of the one line)
BAD = [
    ("a query with a secret", f"s3://bucket/x?secret={SECRET}", "carries a query"),
    ("a password", f"http://u:{SECRET}@h/x", "carries credentials"),
    ("a password holding a slash", f"s3://u:{SECRET}/x@bucket/x", "carries credentials"),
    ("a login as scp takes it", f"u:{SECRET}@host:/ckpt", "looks like user:password@host"),
    ("a folder in /proc", "/proc/orchestrator-ckpt", "cannot be made"),
    ("/proc itself", "/proc", "cannot be written"),
    ("a regular file", "notes.txt", "is a file, not a folder"),
    ("empty", "", "--artifacts is empty"),
    ("a newline in the name", "ck\npt", "holds a control character"),
    ("another scheme", "ftp://host/ckpt", "has scheme ftp://"),
    ("a file URL naming a host", "file://host/ckpt", "names a host"),
    ("a bucket scheme without a bucket", "s3://", "names no bucket"),
    ("s3 without its extra", "s3://bucket", "pip install 'gpu-study-orchestrator[s3]'"),
    ("gs without its extra", "gs://bucket", "pip install 'gpu-study-orchestrator[gcs]'"),
]


def _folder_with_a_file(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("a file, not a folder")
    return work


@pytest.mark.parametrize(("kind", "place", "expect"), BAD, ids=[b[0] for b in BAD])
def test_run_refuses_a_bad_place_in_one_line_storing_nothing(tmp_path, kind, place, expect):
    work = _folder_with_a_file(tmp_path)
    before = sorted(p.name for p in work.iterdir())
    env = cli_env(PYTHONPATH=os.pathsep.join([_missing_packages(tmp_path), str(ROOT)]))
    done = run_cli(
        "run", "synthetic", "--trials", "1", "--epochs", "1", "--gpus", "sim:24576",
        "--storage", "sqlite:///study.db", "--artifacts", place, cwd=work, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --artifacts"), done.stderr
    assert expect in lines[0], lines[0]
    assert SECRET not in done.stderr
    assert sorted(p.name for p in work.iterdir()) == before  # no database, no folder, no log
    assert not Path("/proc/orchestrator-ckpt").exists()


API_SCRIPT = """
import os, sys
import orchestrator
from tests.checkpoint_objective import objective

place = sys.argv[1]
try:
    orchestrator.optimize(
        objective, n_trials=1, storage="sqlite:///study.db", gpus="sim:24576",
        artifacts=int(place) if place.isdigit() else place,
    )
except (ValueError, TypeError) as error:
    print(type(error).__name__, str(error), sep="|")
"""


@pytest.mark.parametrize(("kind", "place", "expect"), BAD, ids=[b[0] for b in BAD])
def test_optimize_refuses_a_bad_place_without_showing_a_secret(tmp_path, kind, place, expect):
    work = _folder_with_a_file(tmp_path)
    before = sorted(p.name for p in work.iterdir())
    env = cli_env(PYTHONPATH=os.pathsep.join([_missing_packages(tmp_path), str(ROOT)]))
    done = subprocess.run(
        [sys.executable, "-c", API_SCRIPT, place],
        capture_output=True, text=True, cwd=work, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    kind_of_error, message = done.stdout.strip().split("|", 1)
    assert kind_of_error == "ValueError", done.stdout
    assert message.startswith("artifacts") and "\n" not in message, message
    assert expect.replace("--artifacts", "artifacts=''") in message, message
    assert SECRET not in done.stdout + done.stderr
    assert sorted(p.name for p in work.iterdir()) == before


def test_optimize_says_what_artifacts_takes_when_given_a_number(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", API_SCRIPT, "5"],
        capture_output=True, text=True, cwd=tmp_path, env=cli_env(PYTHONPATH=str(ROOT)),
        timeout=300,
    )  # fmt: skip
    assert done.stdout.strip() == (
        "TypeError|artifacts must be a folder (a str or a path), s3://BUCKET or gs://BUCKET, "
        "not int"
    ), done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_relative_folder_is_stored_absolute_and_best_finds_the_weights_elsewhere(tmp_path):
    import orchestrator

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    url = f"sqlite:///{tmp_path / 'study.db'}"
    done = run_cli(
        "run", "synthetic", "--trials", "1", "--epochs", "2", "--option", "trial_seconds=0.2",
        "--gpus", "sim:24576", "--storage", url, "--artifacts", "ckpt", cwd=work,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    best = run_cli("best", "--storage", url, "--format", "json", cwd=elsewhere)
    assert best.returncode == 0, best.stderr
    weights = json.loads(best.stdout)["weights"]
    assert weights is not None and Path(weights).parent == work / "ckpt", best.stdout
    saved = orchestrator.load_checkpoint(weights)  # the file `best` names, as documented
    assert sorted(saved) == ["epoch", "state"] and saved["epoch"] == 1
    assert saved["state"]["epoch"] == 1  # what the synthetic adapter saved


def test_load_checkpoint_says_which_file_and_why_and_loads_no_torch_until_called(tmp_path):
    import orchestrator
    from orchestrator.checkpoints import CheckpointUnreadable

    with pytest.raises(CheckpointUnreadable, match="cannot be read: No such file or directory"):
        orchestrator.load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "cut.pt").write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(CheckpointUnreadable, match="cut short or not one this tool saved"):
        orchestrator.load_checkpoint(tmp_path / "cut.pt")
    probe = "import sys, orchestrator; orchestrator.load_checkpoint; print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True,
        env=cli_env(PYTHONPATH=str(ROOT)), timeout=120,
    )  # fmt: skip
    assert done.stdout.strip() == "False", done.stdout + done.stderr
