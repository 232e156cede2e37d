"""Users' own adapters: the docs' example package through its entry point, --adapter-path, and
broken third-party adapters that are named in one line and stop nothing else."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest

import adapters
from orchestrator.errors import UserError
from tests.waiting import patient

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "my_model_adapter"

BROKEN_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "broken-adapters"
version = "0.0.1"

[project.entry-points."orchestrator.adapters"]
cannot_import = "module_that_does_not_exist:adapter"
half_done = "half_done:adapter"

[tool.setuptools]
py-modules = ["half_done"]
"""

HALF_DONE = """\
class HalfDone:  # no train(): does not meet the protocol
    name = "half_done"
    workload_class = "supervised"
    model_overhead_mb = 100.0
    per_sample_mb = 0.01
    direction = "minimize"

    def suggest(self, trial, options):
        return {}


adapter = HalfDone()
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The docs' example package and a broken one, pip-installed into a folder of their own."""
    tmp = tmp_path_factory.mktemp("user-adapters")
    example = tmp / "my_model_adapter"
    shutil.copytree(
        EXAMPLE, example, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__")
    )
    broken = tmp / "broken"
    broken.mkdir()
    (broken / "pyproject.toml").write_text(BROKEN_PYPROJECT)
    (broken / "half_done.py").write_text(HALF_DONE)
    target = tmp / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(example),
            str(broken),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp,
    )
    return target


def _env(*paths: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (ROOT, *paths))}


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=150,
    )


def test_adapters_lists_the_entry_point_and_names_broken_ones_in_one_line(site, tmp_path):
    result = _cli(["adapters"], _env(site), tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    (mine,) = [line for line in lines if line.startswith("my_mlp ")]
    assert "supervised" in mine and "400 MB + 0.01 MB/sample" in mine
    assert "entry point (my-model-adapter)" in mine
    for name in ("dqn", "ppo", "synthetic", "tft"):  # the built-ins still list
        assert any(line.startswith(name + " ") and "built-in" in line for line in lines)
    (cannot,) = [line for line in lines if line.startswith("cannot_import")]
    assert "ModuleNotFoundError" in cannot and "module_that_does_not_exist" in cannot
    (half,) = [line for line in lines if line.startswith("half_done")]
    assert "missing method 'train'" in half and "entry point (broken-adapters)" in half
    assert "Traceback" not in result.stdout + result.stderr

    rows = {
        row["name"]: row
        for row in json.loads(_cli(["adapters", "--json"], _env(site), tmp_path).stdout)
    }
    assert rows["my_mlp"]["error"] is None and rows["my_mlp"]["per_sample_mb"] == 0.01
    assert rows["half_done"]["error"].startswith("missing")


def test_a_broken_adapter_stops_only_itself(site, tmp_path):
    env = _env(site)
    refused = _cli(
        ["run", "cannot_import", "--storage", f"sqlite:///{tmp_path / 's.db'}"], env, tmp_path
    )
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "cannot_import" in refused.stderr
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import adapters; print(adapters.get('tft').name, adapters.get('my_mlp').name)",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=patient(60),
    )
    assert check.stdout.split() == ["tft", "my_mlp"], check.stderr


def test_built_in_entry_point_and_adapter_path_routes_each_run_a_study(site, tmp_path):
    """`run tft`, the installed entry point, and --adapter-path on the example's source, at once."""
    common = ["--trials", "1", "--epochs", "2", "--gpus", "none", "--quiet"]
    installed = tmp_path / "installed.db"
    by_path = tmp_path / "by_path.db"
    built_in = tmp_path / "built_in.db"
    small = ["--option", "max_width=32", "--option", "max_window=24", "--option", "max_depth=1"]
    runs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "run",
                "tft",
                *common,
                *small,
                "--storage",
                f"sqlite:///{built_in}",
            ],
            env=_env(),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "run",
                "my_mlp",
                *common,
                "--storage",
                f"sqlite:///{installed}",
            ],
            env=_env(site),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "run",
                "--adapter-path",
                "my_model_adapter:adapter",
                *common,
                "--study",
                "quick",
                "--storage",
                f"sqlite:///{by_path}",
            ],
            env=_env(EXAMPLE),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
    ]
    outputs = []
    for run in runs:
        out, err = run.communicate(timeout=150)
        assert run.returncode == 0, err[-2000:]
        outputs.append(out)
    # --quiet prints only the result: the best validation loss and its parameters.
    tft = optuna.load_study(study_name="tft", storage=f"sqlite:///{built_in}")
    assert f"val_loss = {tft.best_value:.6g}" in outputs[0]
    assert sorted(tft.best_trial.intermediate_values) == [0, 1]
    assert tft.best_value == min(tft.best_trial.intermediate_values.values())
    for path, name in ((installed, "my_mlp"), (by_path, "quick")):
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{path}")
        (trial,) = study.trials
        assert trial.state == optuna.trial.TrialState.COMPLETE
        assert sorted(trial.intermediate_values) == [0, 1]
        assert trial.value == trial.intermediate_values[1]
        assert {"learning_rate", "batch_size", "hidden"} == set(trial.params)


def test_load_path_returns_the_object_or_one_line_saying_why(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "half_done.py").write_text(HALF_DONE)
    (tmp_path / "as_class.py").write_text(
        "from my_model_adapter import MyMLPAdapter\n\nclass Wider(MyMLPAdapter):\n    name = 'wider'\n"
    )
    assert adapters.load_path("my_model_adapter:adapter").name == "my_mlp"
    assert adapters.load_path("as_class:Wider").name == "wider"  # a class is instantiated
    for target, reason in [
        ("half_done:adapter", "missing method 'train'"),
        ("my_model_adapter:nothing_here", "AttributeError"),
        ("no_such_module_at_all:adapter", "ModuleNotFoundError"),
        ("my_model_adapter", "not module:attribute"),
    ]:
        with pytest.raises(UserError, match=reason) as caught:
            adapters.load_path(target)
        assert "\n" not in str(caught.value)


def test_example_module_stays_short_enough_to_read_in_the_docs():
    source = (EXAMPLE / "my_model_adapter.py").read_text()
    assert len(source.splitlines()) <= 50
    docs = (ROOT / "docs" / "own-model.md").read_text()
    # The page shows the example as it is: every line of the module appears in it.
    for line in textwrap.dedent(source).splitlines():
        assert line in docs
