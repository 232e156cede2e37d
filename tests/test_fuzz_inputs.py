"""Hundreds of malformed inputs through every command and the Python API: each gets one line
(exit status 2 for a command, a ValueError or TypeError for the API), no traceback, and nothing
stored changes.

The command-line inputs are made from each command's own parser: every flag that checks its
value (a number, a storage URL, a GPU list, a study name, a choice) is given each value of a
pool of malformed ones that its check refuses, so a flag added later is fuzzed too. Then the
inputs that only the command itself can judge: adapters, options, config and parameter files,
grids, objectives, studies that do not exist. All run in this process, as tests/test_bad_inputs.py
runs its cases, in a folder holding a stored study as its default storage.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import optuna
import pytest

import orchestrator
from orchestrator.cli import build_parser, main
from tests import api_failing
from tests.test_bad_inputs import (  # noqa: F401
    STUDY_DB,
    _dump,
    _files,
    isolated_environment,
    make_study_folder,
)

# Values some check of some flag refuses; each flag gets those its own check refuses.
MALFORMED = (
    "", " ", "abc", "-1", "0", "1.5", "nan", "inf", "-inf", "1e400", "99999999999999999999",
    "0x10", "1e3", "1,5", "\x00", "a\nb", "\t", "💥", "s" * 600, "sim:", "sim:abc", "sim:-1",
    "sim:1e30", "sim:0", "sim:24576,0", "0,0", "-3", "all", "mysql://u@h/db", "nonsense",
    "postgresql://u:s3cret@h:99999/db", "postgresql://u:s3cret@h:abc/db", "sqlite://x.db",
    "postgresql://[::1/db", "postgresql://u:s3cret@ho st/db", "UPPER CASE:!!", "Bad_Name",
    "missing.csv", "prices", "0:lots",
)  # fmt: skip


PER_FLAG = 7


def _refuses(action: argparse.Action, value: str) -> bool:
    if action.choices is not None and action.type is None:
        return value not in action.choices
    try:
        action.type(value)  # type: ignore[misc]
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return True
    return False


def _typed_actions() -> list[tuple[str, argparse.Action]]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if callable(action.type) or action.choices is not None:
                found.append((name, action))
    return found


def flag_cases() -> list[tuple[str, ...]]:
    """(command, flag=value) for each flag's refused values, and an unknown or mistyped flag
    for every command."""
    cases: list[tuple[str, ...]] = []
    for i, (command, action) in enumerate(_typed_actions()):
        refused = [value for value in MALFORMED if _refuses(action, value)]
        # At most PER_FLAG values each, a different slice of the pool for each flag, so that
        # every value is tried somewhere and the whole test stays fast.
        start = (i * PER_FLAG) % max(1, len(refused))
        for value in (refused[start:] + refused[:start])[:PER_FLAG]:
            if action.option_strings:
                cases.append((command, f"{action.option_strings[0]}={value}"))
            elif value and not value.startswith("-"):  # a positional choice, as typed
                cases.append((command, value))
    for command in sorted({command for command, _ in _typed_actions()} | {"adapters"}):
        cases.append((command, "--bogus"))
        cases.append((command, "--storag=sqlite:///x.db"))
    return cases


FILES = {
    "binary.toml": bytes(range(256)) * 2,
    "bad.toml": b"trials = = 3\n",
    "unknown.toml": b"trails = 3\n",
    "trials-text.toml": b'trials = "many"\n',
    "trials-zero.toml": b"trials = 0\n",
    "gpus-number.toml": b"gpus = 5\n",
    "options-number.toml": b"options = 5\n",
    "option-unknown.toml": b"[options]\nbogus = 1\n",
    "bad.yaml": b"trials: [1, 2\n",
    "list.yaml": b"- 1\n- 2\n",
    "params-binary.yaml": b"\xff\xfe\x00garbage" * 10,
    "params-bad.yaml": b"{x: [1, 2\n",
    "params-scalar.yaml": b"42\n",
    "params-scalars.yaml": b"- 1\n- 2\n",
    "params-unknown.yaml": b"nope: 1\n",
    "params-range.yaml": b"x: 100\n",
    "params-choice.yaml": b"activation: bogus\n",
    "params-text.yaml": b"x: abc\n",
    "params-empty.yaml": b"",
    "params-empty-entry.yaml": b"- {}\n",
}

RUN = ("run", "synthetic")
HANDLER_CASES: list[tuple[str, ...]] = [
    *[("run", name) for name in ("nosuch", "../synthetic", "syn thetic", "💥", "SYNTHETIC")],
    ("run", "--adapter-path", "nosuchmodule:adapter"),
    ("run", "--adapter-path", "os:path"),
    ("run", "--adapter-path", "no-colon"),
    *[
        (*RUN, "--option", option)
        for option in (
            "trial_seconds",
            "=1",
            "trial_seconds=abc",
            "trial_seconds=nan",
            "trial_seconds=-1",
            "trial_seconds=1e400",
            "bogus=1",
            "overhead_mb=inf",
            "per_sample_mb=1e308",
            "per_sample_mb=-1",
            "overhead_mb=1e9",
            "trial_seconds=",
            " =1",
        )
    ],  # fmt: skip
    *[("plan", "synthetic", "--option", option) for option in ("bogus=1", "overhead_mb=nan", "x")],
    *[(*RUN, "--config", name) for name in FILES if not name.startswith("params")],
    (*RUN, "--config", "missing.toml"),
    (*RUN, "--config", "study.ini"),
    *[(*RUN, "--study", "fresh", "--enqueue", name) for name in FILES if name.startswith("params")],
    (*RUN, "--study", "fresh", "--enqueue", "missing.yaml"),
    *[
        (*RUN, "--study", "fresh", "--sampler", "grid", "--grid", grid)
        for grid in ("x=abc", "x=", "=1", "nope=1", "x=100", "activation=bogus", "x")
    ],
    (*RUN, "--study", "fresh", "--grid", "x=1"),
    *[
        (*RUN, "--study", "fresh", *flags)
        for flags in (
            ("--directions", "maximize,minimize"),
            ("--directions", "up"),
            ("--directions", ","),
            ("--objectives", "loss,bogus"),
            ("--objectives", "seconds,loss"),
            ("--objectives", "loss,loss"),
            ("--sampler", "cmaes", "--objectives", "loss,seconds"),
            ("--sampler", "qmc", "--objectives", "loss,seconds"),
            ("--sampler", "pso", "--swarm-size", "1"),
            ("--sampler", "pbt", "--swarm-size", "1"),
            ("--sampler", "pbt", "--objectives", "loss,seconds"),
            ("--sampler", "pbt", "--directions", "maximize,minimize"),
        )
    ],
    *[
        (*command, "--workloads", name)
        for command in (RUN, ("plan", "synthetic"), ("manifests", "dqn", "--study", "s"))
        for name in ("binary.toml", "prices", "bad.toml", "unknown.toml", "missing.toml")
    ],
    (*RUN, "--env", "CartPole-v1"),
    (*RUN, "--data", "prices/close.csv"),
    (*RUN, "--epochs", "6"),  # a stored study resumed with other settings
    ("run", "tft", "--study", "synthetic"),
    (*RUN, "--storage", "sqlite://"),
    (*RUN, "--storage", "sqlite:///notadb.db"),
    (*RUN, "--log-dir", "prices/close.csv"),
    (*RUN, "--gpus", "3"),
    (*RUN, "--workloads", "missing.toml"),
    (*RUN, "--mlflow-uri", "::::"),
    (*RUN, "--trials", "1"),  # fewer than the study counts
    ("worker", "--study", "nosuch"),
    ("worker",),
    ("status", "--study", "nosuch"),
    ("status", "--storage", "sqlite:///nowhere/x.db"),
    ("best", "--study", "nosuch"),
    ("report", "--study", "nosuch"),
    ("logs", "--study", "nosuch", "--trial", "0"),
    ("logs", "--study", "synthetic", "--trial", "99"),
    ("logs", "--study", "synthetic"),
    ("plan", "nosuch"),
    ("plan", "synthetic", "--workloads", "missing.toml"),
    ("manifests", "nosuch", "--study", "s", "--workers", "1"),
    ("manifests", "dqn", "--study", "s"),
    ("slurm", "synthetic", "--nodes", "1", "--gpus-per-node", "1", "--dry-run"),
    ("slurm", "synthetic", "--nodes", "1", "--gpus-per-node", "1", "--storage", "sqlite:///x.db"),
    ("slurm", "--nodes", "1", "--gpus-per-node", "1"),
    ("slurm", "nosuch", "--nodes", "1", "--gpus-per-node", "1", "--dry-run"),
    ("slurm", "synthetic", "--nodes", "1", "--gpus-per-node", "1", "--time", "1h"),
    *[
        ("slurm", "--study", "synthetic", "--nodes", "1", "--gpus-per-node", "1", *setting)
        for setting in (
            ("--trials", "3"),
            ("--epochs", "2"),
            ("--option", "trial_seconds=1"),
            ("--sampler", "random"),
            ("--seed", "3"),
            ("--artifacts", "ckpt"),
            ("--checkpoint-every", "2"),
            ("--enqueue-defaults",),
            ("--update-settings",),
            ("--pruner", "none"),
            ("--max-retries", "2"),
            ("--repeats", "2"),
        )
    ],  # fmt: skip
    *[
        ("slurm", "synthetic", "--nodes", "1", "--gpus-per-node", "1", "--dry-run", *setting)
        for setting in (
            ("--option", "bogus=1"),
            ("--option", "trial_seconds=-1"),
            ("--env", "CartPole-v1"),
            ("--data", "prices/close.csv"),
            ("--sampler", "grid", "--grid", "x=abc"),
            ("--objectives", "loss,bogus"),
            ("--study", "fresh", "--enqueue", "params-bad.yaml"),
        )
    ],  # fmt: skip
    ("db",),
]


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz")
    make_study_folder(folder)
    for name, content in FILES.items():
        (folder / name).write_bytes(content)
    (folder / "study.ini").write_text("[x]\n")
    return folder


def _problem(argv: tuple[str, ...], capsys) -> str | None:
    """What is wrong with the answer to argv (None: one line, exit 2, nothing on stdout)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    if code != 2 or out or err.count("\n") != 1 or not err.startswith("error: "):
        return f"{argv!r}: exit {code}, stdout {out[-200:]!r}, stderr {err[-400:]!r}"
    if "Traceback" in err or "s3cret" in err:
        return f"{argv!r}: {err!r}"
    return None


def _fuzz(cases, folder: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(folder)
    before, files = _dump(folder / STUDY_DB), _files(folder)
    wrong = []
    for argv in cases:
        problem = _problem(argv, capsys)
        if problem and "exit 0" in problem:
            raise AssertionError(f"accepted, and ran: {problem}")
        if problem is None and _files(folder) != files:
            problem = f"{argv!r}: made {sorted(_files(folder) - files)}"
        if problem:
            wrong.append(problem)
    assert _dump(folder / STUDY_DB) == before, "the stored study changed"
    assert not wrong, f"{len(wrong)} of {len(cases)}:\n" + "\n".join(wrong)


def test_there_are_at_least_700_malformed_inputs_and_every_command_gets_some():
    cases = flag_cases() + HANDLER_CASES
    assert len(cases) >= 300
    assert len(cases) + len(API_CASES) >= 700
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {case[0] for case in cases} == set(commands)


def test_every_flag_s_malformed_values_are_one_line_exit_2(
    template,
    tmp_path,
    monkeypatch,
    capsys,
    isolated_environment,  # noqa: F811
):
    folder = tmp_path / "study"
    shutil.copytree(template, folder)
    _fuzz(flag_cases(), folder, monkeypatch, capsys)


def test_inputs_only_the_command_can_judge_are_one_line_exit_2(
    template,
    tmp_path,
    monkeypatch,
    capsys,
    isolated_environment,  # noqa: F811
):
    folder = tmp_path / "study"
    shutil.copytree(template, folder)
    _fuzz(HANDLER_CASES, folder, monkeypatch, capsys)


NAN = float("nan")
API_CASES: list[dict] = [
    *[{"n_trials": v} for v in (0, -1, "3", 1.5, None, True, 2**40)],
    *[{"epochs": v} for v in (0, -2, "1", 2.5, 2**40)],
    *[{"seed": v} for v in (-1, 2**33, "7", 1.5)],
    *[{"max_retries": v} for v in (-1, 10**6, "1")],
    *[{"swarm_size": v} for v in (0, "4", 10**7)],
    *[{"study_name": v} for v in ("", " ", "a\nb", "x" * 600, 5)],
    *[{"memory_model": v} for v in ((1.0,), "ab", (NAN, 0), (-1, 0), (0, float("inf")), None)],
    *[{"memory_model": (0.0, 1e308), "batch_sizes": (64, 128)}],
    *[{"batch_sizes": v} for v in ((0, 10), (10, 5), (1.5, 3), "ab", (True, 5), (1, 2, 3))],
    *[{"directions": v} for v in ("minimize", ["up"], [])],
    *[{"direction": v} for v in ("up", "")],
    *[{"objectives": v} for v in (["bogus"], "value,value", ",")],
    *[{"sampler": v} for v in ("nope", 5, "")],
    *[{"sampler": "cmaes", "directions": ["minimize", "minimize"]}],
    *[{"pruner": v} for v in ("nope", 5)],
    *[{"catch": v} for v in ("ValueError", [1], (ValueError, "x"))],
    *[{"concurrency": v} for v in (0, -1, "2", 1.5)],
    *[{"grace": v} for v in (-1.0, NAN, "x", 1e15)],
    *[{"timeout": v} for v in (0, -5, "x", NAN)],
    *[{"trial_timeout": v} for v in (0, "x")],
    *[{"sim_memory_scale": v} for v in (0, NAN, "1")],
    *[{"recycle_after": v} for v in (0, "3")],
    *[{"storage_retry_seconds": v} for v in (-1, NAN)],
    *[{"gpus": v} for v in ("sim:abc", 5, "7", "sim:-1", "all", "")],
    *[{"log_dir": v} for v in (5, "prices/close.csv")],
    *[{"storage": v} for v in ("nonsense", "sqlite://", "mysql://u@h/db", "sqlite://x.db")],
    *[{"callbacks": v} for v in ([1], 1, "abc", [print, None], print)],
    {"sampler": "pbt"},  # the objective takes no checkpoint handle: PBT would restart members
    {"bogus": 1},
    {"quiet": "yes"},
]


def test_the_api_refuses_each_malformed_argument_in_one_line_before_storing(
    template, tmp_path, monkeypatch
):
    folder = tmp_path / "study"
    shutil.copytree(template, folder)
    monkeypatch.chdir(folder)
    url = f"sqlite:///{folder / 'api.db'}"
    wrong = []
    for arguments in API_CASES:
        call = {"n_trials": 2, "storage": url, "gpus": "sim:24576", **arguments}
        try:
            orchestrator.optimize(api_failing.one_argument, **call)
        except (ValueError, TypeError) as error:
            message = str(error)
            if "\n" in message or not message or "HostOptions" in message:
                wrong.append(f"{arguments!r}: {message!r}")
        except Exception as error:  # anything else is what this test finds
            wrong.append(f"{arguments!r}: {type(error).__name__}: {error}")
        else:
            wrong.append(f"{arguments!r}: accepted")
    assert len(API_CASES) >= 90
    assert not wrong, f"{len(wrong)} of {len(API_CASES)}:\n" + "\n".join(wrong)
    stored = optuna.get_all_study_summaries(url) if (folder / "api.db").exists() else []
    assert not stored, [s.study_name for s in stored]
