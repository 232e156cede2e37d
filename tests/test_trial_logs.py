"""Each trial's output in a log file of its own; `run`'s stdout holds its result and nothing else."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import optuna
import pytest

from orchestrator.record.store.location import StorageLocation
from orchestrator.record.trials.logs import default_log_dir, last_lines, trial_log_path
from tests.cli_helpers import cli_env, run_cli

ROOT = Path(__file__).resolve().parents[1]


def _env():
    return cli_env(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def test_a_noisy_trial_writes_its_own_log_and_run_json_stays_json(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    done = run_cli(
        "run", "--adapter-path", "tests.noisy_adapter:adapter", "--trials", "3", "--epochs", "1",
        "--gpus", "none", "--option", "trial_seconds=0", "--pruner", "none", "--storage", url,
        "--json", env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # nothing but the result
    assert result["counted"] == 3
    assert "noisy:" not in done.stdout
    study = optuna.load_study(study_name="noisy", storage=url)
    for trial in study.trials:
        path = Path(trial.user_attrs["log_file"])
        assert path == tmp_path / "study-logs" / "noisy" / f"trial-{trial.number}.log"
        text = path.read_text()
        assert f"noisy: training batch {trial.params['batch_size']}" in text
        assert "noisy: a warning on stderr" in text and "noisy: from C" in text
        shown = run_cli("logs", "--study", "noisy", "--trial", str(trial.number), "--storage", url)
        assert shown.returncode == 0 and shown.stdout == text


def test_a_failed_trial_s_last_lines_are_in_run_s_log(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    done = run_cli(
        "run", "--adapter-path", "tests.noisy_adapter:adapter", "--trials", "1", "--epochs", "1",
        "--gpus", "none", "--option", "fail=1", "--pruner", "none", "--storage", url,
        "--log-dir", str(tmp_path / "logs"), env=_env(),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # every trial failed with the objective's error
    assert done.stderr.splitlines()[-1] == (
        "error: the first trial failed with RuntimeError: noisy: this model does not train; "
        "the trial's output: `python -m orchestrator logs --study noisy --trial 0` "
        f"({tmp_path / 'logs' / 'noisy' / 'trial-0.log'})"
    )
    assert "trial 0 failed: RuntimeError: noisy: this model does not train" in done.stderr
    assert f"the end of {tmp_path / 'logs' / 'noisy' / 'trial-0.log'}:" in done.stderr
    assert "    RuntimeError: noisy: this model does not train" in done.stderr  # its traceback


def test_logs_for_a_trial_that_is_not_there_is_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="empty", storage=url)
    shown = run_cli("logs", "--study", "empty", "--trial", "7", "--storage", url)
    assert shown.returncode == 2
    assert shown.stderr.count("\n") == 1 and "has no trial 7" in shown.stderr


def test_where_logs_go(tmp_path):
    assert default_log_dir(StorageLocation.parse("sqlite:////data/runs/dqn.db")) == Path(
        "/data/runs/dqn-logs"
    )
    assert (
        default_log_dir(StorageLocation.parse("postgresql://u@h/db"), cwd=tmp_path)
        == tmp_path / "orchestrator-logs"
    )
    assert trial_log_path("/logs", "dqn-l4", 3) == Path("/logs/dqn-l4/trial-3.log")
    odd = trial_log_path("/logs", "my study/1", 3)
    assert odd.parent.parent == Path("/logs") and odd.parent.name.startswith("my_study_1-")
    log = tmp_path / "t.log"
    log.write_text("one\n\ntwo\nthree\n")
    assert last_lines(log, 2) == ["two", "three"]
    assert last_lines(tmp_path / "missing.log") == []


def _logged_lines(url: str, study: str) -> list[str]:
    shown = run_cli("logs", "--study", study, "--trial", "0", "--storage", url)
    assert shown.returncode == 0, shown.stderr
    return [line for line in shown.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("adapter", "options", "metric"),
    [
        ("dqn", ["--option", "steps_per_epoch=256"], "sharpe"),
        ("tft", ["--option", "steps=400", "--option", "max_width=16", "--option",
                 "max_window=16", "--option", "max_depth=1"], "val_loss"),
    ],
)  # fmt: skip
def test_a_built_in_adapter_logs_each_epoch_and_its_value(tmp_path, adapter, options, metric):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    done = run_cli(
        "run", adapter, "--trials", "1", "--epochs", "3", *options, "--gpus", "sim:24576",
        "--pruner", "none", "--storage", url, env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    trial = optuna.load_study(study_name=adapter, storage=url).trials[0]
    lines = _logged_lines(url, adapter)
    # One line per evaluation, with its step, score and seconds so far; the value last.
    steps = [line for line in lines if line.startswith("step ")]
    assert len(steps) == 3, lines
    for step, line in enumerate(steps):
        score = trial.intermediate_values[step]
        assert re.fullmatch(rf"step {step}: {metric} {score:.6g} after .+ \(\d+\.\d s\)", line)
    assert re.fullmatch(rf"value: {metric} {trial.value:.6g}, .+ \(\d+\.\d s\)", lines[-1])
    assert len(lines) <= 6, lines  # no per-batch lines


def test_a_fused_members_lines_go_to_its_own_log_and_the_rest_to_the_group_s(tmp_path, capsys):
    import sys

    from adapters import trial_log
    from orchestrator.run.trial.member_logs import MemberLines, member_lines_to

    logs = [tmp_path / "trial-4.log", None, tmp_path / "trial-6.log"]
    with member_lines_to(logs):
        trial_log.write_member(0, "step 0: return 9.5 (1.0 s)")
        trial_log.write_member(1, "step 0: return 11 (1.0 s)")  # no log of its own: the group's
        trial_log.write_member(2, "value: return 20, the last epoch's score (2.0 s)")
        print("a library's warning")
        sys.stdout.write("member 2: step 1: ret")  # a line in two writes is still one line
        sys.stdout.write("urn 30 (1.5 s)\nmember 9: out of range\n")
        print("no newline at the end", end="")
    assert not isinstance(sys.stdout, MemberLines)  # put back
    assert logs[0].read_text() == "step 0: return 9.5 (1.0 s)\n"
    assert logs[2].read_text() == (
        "value: return 20, the last epoch's score (2.0 s)\nstep 1: return 30 (1.5 s)\n"
    )
    group = capsys.readouterr().out
    assert group == (
        "member 1: step 0: return 11 (1.0 s)\na library's warning\nmember 9: out of range\n"
        "no newline at the end"
    )
    with member_lines_to(logs[:1]):  # a sub-group of one: its lines as a single trial's
        trial_log.write_member(0, "value: return 9.5 (1.1 s)")
        print("step 1: return 9.7 (1.3 s)")  # it trains as `train` does, which prints plainly
    assert logs[0].read_text().splitlines()[-2:] == [
        "value: return 9.5 (1.1 s)",
        "step 1: return 9.7 (1.3 s)",
    ]
    assert capsys.readouterr().out == ""


def test_with_folds_each_fold_is_a_line_with_the_mean_so_far(capsys):
    import torch

    from adapters import dqn
    from adapters.base import parse_options

    options = parse_options(dqn.adapter, ["folds=2", "steps_per_epoch=64"])
    reported = []
    value = dqn.adapter.train(
        dict(dqn.adapter.default_params, batch_size=64), epochs=1, device=torch.device("cpu"),
        options=options, report=lambda step, score: reported.append((step, score)),
    )  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines  # a fold's own epochs report nothing: one line per fold
    for (step, mean), line in zip(reported, lines[:2], strict=True):
        assert line.startswith(f"step {step}: mean sharpe {mean:.6g} after fold {step + 1} of 2")
    assert lines[-1].startswith(f"value: sharpe {value:.6g}, the mean of 2 folds (")


def test_run_stops_when_its_first_three_trials_fail_alike(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    done = run_cli(
        "run", "--adapter-path", "tests.noisy_adapter:adapter", "--trials", "8", "--epochs", "1",
        "--gpus", "none", "--option", "fail=1", "--pruner", "none", "--storage", url,
        "--concurrency", "1", env=_env(),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("error: the first 3 trials all failed with RuntimeError: noisy: ")
    assert "Traceback" not in last
    trials = optuna.load_study(study_name="noisy", storage=url).trials
    assert len(trials) < 8  # it stopped, the budget is not spent on the same error
