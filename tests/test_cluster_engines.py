"""Every cluster engine through the one interface: the same worker command line, the storage kept off it.

The worker lines are read back from what each engine renders (YAML containers and services, shell
or Procfile lines), not asked of the engine, so an engine that builds its own line is caught.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from orchestrator.cli import build_parser, main
from orchestrator.deploy.compose import repository_file
from orchestrator.deploy.engine import (
    GPUS_FLAG,
    STORAGE_ENV,
    ClusterEngine,
    StudyWorkers,
    program,
    worker_argv,
)
from orchestrator.deploy.engines import ENGINES, engine_named
from orchestrator.errors import UserError
from orchestrator.planning.workloads import WORKLOADS_ENV, workload_class

REPO = Path(__file__).resolve().parents[1]
SECRET = "postgresql://orch:s3cr3t-pw@db.example:5432/studies"
STUDIES = ["syn", "my study; rm -rf /", 'it\'s $HOME "quoted"']


@pytest.fixture(autouse=True)
def _no_user_overrides(monkeypatch) -> None:
    monkeypatch.delenv(WORKLOADS_ENV, raising=False)
    monkeypatch.setenv(STORAGE_ENV, SECRET)  # an engine must not copy it from here


def request(study: str = "syn", **values: Any) -> StudyWorkers:
    base = {"workers": 3, "workload": workload_class("rl"), "adapter": "dqn", "trials": 40}
    return StudyWorkers(study=study, **{**base, **values})


# --- reading the worker's line back from rendered files --------------------------------------


def _from_yaml(text: str) -> list[list[str]]:
    """Kubernetes containers (command + args) and compose services (after claim-gpu's `--`)."""
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError:
        return []
    found: list[list[str]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("command"), list) and isinstance(node.get("args"), list):
                found.append([*node["command"], *node["args"]])
            elif isinstance(node.get("entrypoint"), list) and isinstance(node.get("command"), list):
                entrypoint = node["entrypoint"]
                after = entrypoint[entrypoint.index("--") + 1 :] if "--" in entrypoint else []
                # Compose hands the container `$` where the file says `$$`.
                found.append([part.replace("$$", "$") for part in [*after, *node["command"]]])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for document in documents:
        walk(document)
    return found


def _from_lines(text: str) -> list[list[str]]:
    """Shell or Procfile lines that run `... -m orchestrator ...`, from the interpreter on."""
    found = []
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for at in range(1, len(words) - 1):
            if words[at : at + 2] == ["-m", "orchestrator"]:
                found.append(words[at - 1 :])
                break
    return found


def worker_lines(files: dict[str, str]) -> list[list[str]]:
    """Every `run` or `worker` command line in the rendered files (not `db upgrade`, `dashboard`)."""
    lines = []
    for text in files.values():
        for argv in _from_yaml(text) + _from_lines(text):
            if argv[1:3] == ["-m", "orchestrator"] and argv[3:4] in (["run"], ["worker"]):
                lines.append(argv)
    return lines


def without_engine_choices(argv: list[str]) -> list[str]:
    """The line less what each engine chooses: the interpreter's path and the `--gpus` value."""
    rest = argv[1:]
    if GPUS_FLAG in rest:
        at = rest.index(GPUS_FLAG)
        rest = rest[:at] + rest[at + 2 :]
    return rest


def assert_same_worker(engines: dict[str, ClusterEngine], workers: StudyWorkers) -> None:
    """Every engine's rendering starts the worker `worker_argv` builds, and a line the CLI reads."""
    expected = without_engine_choices(
        worker_argv(
            workers.study, adapter=workers.adapter, trials=workers.trials, epochs=workers.epochs
        )
    )
    parser = build_parser()
    for name, engine in engines.items():
        lines = worker_lines(engine.render(workers))
        assert lines, f"found no worker command line in what {name!r} renders: teach worker_lines"
        for argv in lines:
            assert without_engine_choices(argv) == expected, name
            assert "--storage" not in argv, name
    # The line the CLI reads (Slurm's `--gpus "$gpus"` is only known on the node).
    args = parser.parse_args(expected[2:])
    assert (args.command, args.study) == (expected[2], workers.study)
    assert getattr(args, "trials", None) == workers.trials
    assert getattr(args, "epochs", None) == workers.epochs


# --- the registered engines ------------------------------------------------------------------


def test_slurm_kubernetes_and_compose_are_registered_engines() -> None:
    assert set(ENGINES) == {"slurm", "kubernetes", "compose"}
    for name, engine in ENGINES.items():
        assert isinstance(engine, ClusterEngine)
        assert engine.name == name and engine_named(name) is engine


@pytest.mark.parametrize("study", STUDIES)
@pytest.mark.parametrize(
    "values", [{}, {"epochs": 4}, {"trials": None}, {"adapter": "tft", "trials": 7, "epochs": 2}]
)
def test_every_engine_renders_the_same_worker_command_line(study: str, values: dict) -> None:
    assert_same_worker(ENGINES, request(study, **values))


def test_a_worker_that_joins_a_stored_study_is_the_same_line_or_refused() -> None:
    joining = request("syn", adapter=None, trials=None)
    rendering = {}
    for name, engine in ENGINES.items():
        try:
            rendering[name] = engine.render(joining)
        except UserError:
            continue  # an engine whose workers must be able to create the study
    assert {"slurm", "compose"} <= set(rendering)
    assert_same_worker({name: ENGINES[name] for name in rendering}, joining)
    for files in rendering.values():
        (argv,) = worker_lines(files)
        assert without_engine_choices(argv) == ["-m", "orchestrator", "worker", "--study", "syn"]


def test_no_engine_writes_the_storage_and_every_one_names_its_variable() -> None:
    for name, engine in ENGINES.items():
        text = "".join(engine.render(request()).values())
        assert "s3cr3t" not in text and "db.example" not in text, name
        assert STORAGE_ENV in text, name  # where the worker finds the storage instead


def test_an_unknown_engine_is_one_line_naming_the_others() -> None:
    with pytest.raises(UserError, match="no cluster engine 'nomad': choose one of compose"):
        engine_named("nomad")


def test_the_repository_compose_file_is_what_the_compose_engine_renders() -> None:
    assert (REPO / "docker-compose.yml").read_text() == repository_file()


# --- a planted engine ------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcfileEngine:
    """A minimal engine: one Procfile line per worker, each on its own GPU."""

    name: ClassVar[str] = "procfile"
    build_own_line: bool = False  # what the interface exists to prevent

    def render(self, workers: StudyWorkers) -> dict[str, str]:
        lines = []
        for index in range(workers.workers):
            argv = worker_argv(
                workers.study,
                adapter=workers.adapter,
                trials=workers.trials,
                epochs=workers.epochs,
                gpus=str(index),
            )
            if self.build_own_line:  # the budget before the study: a line of its own making
                argv = [*program(), "run", str(workers.adapter), "--trials", str(workers.trials)]
                argv += ["--study", workers.study]
            lines.append(f"worker{index}: {shlex.join(argv)}")
        return {"Procfile": "\n".join(lines) + "\n"}


def test_a_planted_engine_works_through_the_interface(monkeypatch) -> None:
    monkeypatch.setitem(ENGINES, ProcfileEngine.name, ProcfileEngine())
    planted = engine_named("procfile")
    assert isinstance(planted, ClusterEngine)
    files = planted.render(request("my study; rm -rf /", workers=2))
    assert list(files) == ["Procfile"]
    assert [argv[-2:] for argv in worker_lines(files)] == [["--gpus", "0"], ["--gpus", "1"]]
    assert_same_worker(ENGINES, request("my study; rm -rf /", workers=2))


def test_an_engine_that_builds_its_own_line_is_caught() -> None:
    with pytest.raises(AssertionError, match="procfile"):
        assert_same_worker({"procfile": ProcfileEngine(build_own_line=True)}, request())


def test_the_planted_engine_is_a_choice_of_the_command_line(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setitem(ENGINES, ProcfileEngine.name, ProcfileEngine())
    argv = ["manifests", "dqn", "--study", "syn", "--workers", "2", "--engine", "procfile"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    assert f"wrote {tmp_path / 'Procfile'}" in capsys.readouterr().out
    written = {"Procfile": (tmp_path / "Procfile").read_text()}
    assert [argv[-2:] for argv in worker_lines(written)] == [["--gpus", "0"], ["--gpus", "1"]]


# --- the command line's way to every engine --------------------------------------------------


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_manifests_writes_what_each_engine_renders(name: str, tmp_path, capsys) -> None:
    argv = ["manifests", "dqn", "--study", "syn", "--workers", "3", "--trials", "40"]
    assert main([*argv, "--engine", name]) == 0
    printed = capsys.readouterr().out
    assert main([*argv, "--engine", name, "--out", str(tmp_path)]) == 0
    files = ENGINES[name].render(request())
    assert {path.name: path.read_text() for path in tmp_path.iterdir()} == files
    assert printed == "---\n".join(files.values())


def test_a_kubernetes_flag_with_another_engine_is_one_line(capsys) -> None:
    argv = ["manifests", "dqn", "--study", "syn", "--workers", "3", "--engine", "compose"]
    assert main([*argv, "--image", "registry.example.com/orchestrator:1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --image is for --engine kubernetes: drop it for compose"
    )
