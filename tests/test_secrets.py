"""A password never appears in stdout, stderr or a log file, whatever it holds and whatever fails.

A property over generated passwords (with '@', ':', '/', '%', spaces, unicode; written as typed
and percent-encoded) and every command's error paths, run through `main()` with a log file
attached; then real processes with fixed nasty passwords, their stderr going to a log file; and
a real run on PostgreSQL (trust authentication ignores the password) with its trial processes.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from tests.cli_helpers import cli_env

ALPHABET = st.sampled_from("@:/% ?#&=+") | st.characters(
    codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp")
)
PASSWORDS = st.text(alphabet=ALPHABET, min_size=6, max_size=24).filter(lambda p: p.strip() == p)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def error_paths(url: str, port: int, folder: Path) -> list[tuple[list[str], dict[str, str]]]:
    """Every command, each made to fail with `url` on its command line or in the environment."""
    bad_port = url.replace("127.0.0.1:1/", "127.0.0.1:abc/")
    return [
        (["status", "--storage", url], {}),
        (["status", "--study", "s", "--storage", url], {}),
        (["best", "--study", "s", "--storage", url], {}),
        (["report", "--study", "s", "--out", "report", "--storage", url], {}),
        (["dashboard", "--port", str(port), "--storage", url], {}),
        (["db", "upgrade", "--storage", url], {}),
        (["db", "current", "--storage", url], {}),
        (["run", "synthetic", "--gpus", "none", "--storage", url], {}),
        (["worker", "--study", "s", "--gpus", "none", "--storage", url], {}),
        (["plan", "synthetic", "--gpus", "sim:24576", "--storage", url], {}),
        (["adapters", "--storage", url], {}),  # a flag it does not take
        (["manifests", "dqn", "--study", "s", "--workers", "1", "--stor", url], {}),
        (["run", "synthetic", "--storag", url], {}),  # a misspelt flag
        (["run", "synthetic", "--trials", "many", "--storage", url], {}),
        (["run", "synthetic", "--storage", bad_port], {}),
        (["status"], {"ORCHESTRATOR_STORAGE": url}),
        (["run", "synthetic", "--config", write_config(folder, url), "--gpus", "none"], {}),
        (["run", "synthetic", "--gpus", "none"], {"ORCHESTRATOR_STORAGE": bad_port}),
    ]


def write_config(folder: Path, url: str) -> str:
    """A --config file that holds the URL; its path."""
    import json

    path = folder / "secret.toml"
    path.write_text(f"storage = {json.dumps(url, ensure_ascii=False)}\n", encoding="utf-8")
    return str(path)


def spellings(password: str) -> set[str]:
    """The password and the forms it may take in a message: as typed, encoded, decoded."""
    from urllib.parse import unquote

    return {password, quote(password, safe=""), unquote(password)} - {""}


def _run_all(url: str, port: int, monkeypatch, capsys, log_path: Path) -> str:
    """Run every error path of `url`; everything printed or logged, as one text."""
    root = logging.getLogger()
    handler = logging.FileHandler(log_path, encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    root.addHandler(handler)
    level, root.level = root.level, logging.DEBUG
    texts = []
    try:
        for argv, env in error_paths(url, port, log_path.parent):
            with monkeypatch.context() as scoped:
                scoped.delenv("ORCHESTRATOR_STORAGE", raising=False)
                for key, value in env.items():
                    scoped.setenv(key, value)
                code = main([*argv, "--verbose"] if argv[0] == "run" else argv)
            out, err = capsys.readouterr()
            assert code == 2, (argv, out, err)
            texts += [out, err]
    finally:
        root.removeHandler(handler)
        handler.close()
        root.level = level
    return "\n".join(texts) + log_path.read_text(encoding="utf-8")


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # `run` starts a spare trial process before it opens the storage; in this one test process
    # each failing run would leave one until the end. Real processes are tested below.
    monkeypatch.setattr("orchestrator.run.pool.processes.prestart", lambda count=1, **_: [])
    return tmp_path


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(password=PASSWORDS, encoded=st.booleans())
def test_no_password_is_ever_printed_or_logged(password, encoded, folder, monkeypatch, capsys):
    written = quote(password, safe="") if encoded else password
    url = f"postgresql://alice:{written}@127.0.0.1:1/studies"
    port = _free_port()
    # The same commands with a plain password: a generated one that happens to be a word of
    # the messages ("storage") proves nothing either way.
    baseline = _run_all(
        "postgresql://alice:Placeholder9@127.0.0.1:1/studies",
        port,
        monkeypatch,
        capsys,
        folder / "baseline.log",
    )
    assume(not any(form in baseline for form in spellings(password) | spellings(written)))
    seen = _run_all(url, port, monkeypatch, capsys, folder / "run.log")
    for form in spellings(password) | spellings(written):
        assert form not in seen, f"{form!r} was printed or logged"


NASTY = ["Tr0ub@dorXsecret9", "p@ss:w/rd%40 sp ace", "пароль@секрет/1", "100%sure@now"]


def _each_command_with_a_password(folder: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    """Every command of `error_paths` once, each with the next of NASTY in turn: every command
    and every password pass through real processes (all pairs run in process, above)."""
    runs = []
    for index, password in enumerate(NASTY):
        url = f"postgresql://alice:{password}@127.0.0.1:1/studies"  # as typed; encoded: above
        (folder / str(index)).mkdir()
        paths = error_paths(url, _free_port(), folder / str(index))
        runs += [(password, argv, env) for argv, env in paths[index :: len(NASTY)]]
    return runs


def test_real_processes_never_print_it_nor_log_it(tmp_path):
    """What a user and a log collector see: stdout, and stderr written to a file."""
    runs = _each_command_with_a_password(tmp_path)
    assert len(runs) == len(error_paths("postgresql://a:b@h:1/s", 1, tmp_path / "0"))  # each once
    for password, argv, env in runs:
        log = tmp_path / "stderr.log"
        with open(log, "w", encoding="utf-8") as stderr:
            done = subprocess.run(
                [sys.executable, "-m", "orchestrator", *argv],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                cwd=tmp_path,
                env=cli_env(**env),
                timeout=120,
            )
        seen = done.stdout + log.read_text(encoding="utf-8")
        assert done.returncode == 2, (argv, seen)
        assert "Traceback" not in seen, seen
        for form in spellings(password):
            assert form not in seen, (argv, form, seen)


def test_a_real_run_with_its_trial_processes_never_shows_it(postgres_url, tmp_path):
    """Trust authentication ignores the password: the run works, and logs every decision."""
    from sqlalchemy.engine import make_url

    password = "Tr0ub@dor/Xsecret9%"
    server = make_url(postgres_url)
    url = f"postgresql://{server.username}:{password}@{server.host}:{server.port}/{server.database}"
    log = tmp_path / "run.log"
    with open(log, "w", encoding="utf-8") as stderr:
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", "run", "synthetic", "--trials", "3",
             "--option", "trial_seconds=0.1", "--epochs", "1", "--gpus", "sim:24576",
             "--storage", url, "--verbose"],
            stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=tmp_path, env=cli_env(),
            timeout=300,
        )  # fmt: skip
    seen = done.stdout + log.read_text(encoding="utf-8")
    assert done.returncode == 0, seen
    assert "3/3 trials done" in done.stdout
    for form in spellings(password) | {"Xsecret9"}:
        assert form not in seen, form
