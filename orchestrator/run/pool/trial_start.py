"""How a trial process starts: forked from a fork server, or spawned.

Forked from multiprocessing's fork server, which imports torch, Optuna and the trial code once
(`PRELOAD`), so that 19 processes cost one import of torch, not 19. The server never touches
CUDA: it only imports, and importing torch does not initialise CUDA; each process picks its GPU
and starts CUDA after the fork, as a spawned one does. Where there is no fork server (not POSIX),
or `ORCHESTRATOR_TRIAL_START=spawn` says so, each process is spawned and imports everything
itself. A forked process takes the environment and the working directory its supervisor has
when it starts the process, not those of the server's start. Neither has the study database's
URL ($ORCHESTRATOR_STORAGE, with its password) in its environment: the user's code runs there,
and the URL comes in the process's first message instead (`trial_environment`).

For an adapter that uses no torch (`uses_torch = False`) the server leaves torch out: 1.5 s of
CPU a command saves. One server serves a whole process, so a later study that trains with torch
in the same process (two `optimize` calls) restarts it with torch, once none of its trial
processes is alive; otherwise its processes import torch themselves.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
from collections.abc import Iterator, Mapping
from multiprocessing import forkserver, util
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.record.store.location import STORAGE_ENV
from orchestrator.record.store.optuna_private import RDB_MODELS_MODULE

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

START_ENV = "ORCHESTRATOR_TRIAL_START"  # "spawn": no fork server (default: it where there is one)
# What the fork server imports once for every trial process. Nothing here initialises CUDA
# (tests/test_trial_start.py checks it in a process forked from the server); a module missing
# from this install is skipped by the server.
PRELOAD = (
    "numpy",
    "torch",
    # torch.optim's optimisers import TorchDynamo when the first one is made (its decorators
    # disable compiling): 1.1-1.5 s of CPU in each trial process, paid once here.
    "torch._dynamo",
    "sqlalchemy",
    "psycopg2",
    "optuna",
    # Before `adapters` and `samplers`: importing the package loads ours, never a same-named
    # folder in the working directory (orchestrator/imports.py).
    "orchestrator",
    "adapters",
    "samplers",
    "orchestrator.record.store.storage",
    "orchestrator.record.study.spec",
    "orchestrator.gpu.sim",
    "orchestrator.run.trial.context",
    "orchestrator.run.trial.worker",
    "orchestrator.run.pool.processes",
    "orchestrator.run.pool.trial_start",  # the entry point, `started_here`
    "orchestrator.run.pool.fork_server_signals",  # the server outlives a SIGTERM sent to the job
    # What each process would import on its way to its first trial, 0.35 s of CPU a process:
    # Optuna's RDBStorage imports its tables and alembic (with mako and pygments) when opened,
    # SQLAlchemy its ORM and the database's dialect when it connects.
    "sqlalchemy.orm",
    "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.postgresql.psycopg2",
    RDB_MODELS_MODULE,
    "alembic.command",
    "alembic.config",
    "alembic.migration",
    "alembic.script",
    "numpy.random",
    "multiprocessing.connection",
    "multiprocessing.sharedctypes",
    "multiprocessing.synchronize",
    "orchestrator.run.trial.runner",
    "orchestrator.record.store.records",  # named lazily by the runner: loaded by its first trial
    "orchestrator.record.budget.claim",
    "orchestrator.record.trials.retry",
    "orchestrator.record.trials.logs",
    "orchestrator.record.trials.tracking",
    "adapters.study_adapter",
    "samplers._factory",
    "samplers._bounded",  # named lazily by the trial's samplers, as the records are
    "samplers._pso",
    # Loaded as each trial ends, 0.1-0.2 s of CPU a process: its checkpoint store (Optuna's
    # artifact stores, which import boto3 where it is installed) and its dashboard note
    # (optuna-dashboard's package, its web app included, comes with `_note`).
    "optuna.artifacts",
    "optuna_dashboard._note",
    # Which trials keep their final weights is the study's model's call, made as a trial ends
    # (run/trial/checkpoints.py). Its solvers (scipy, 0.4 s of CPU) are left to the processes
    # that fit it: a study of fewer than 10 configurations never does, and every command would
    # pay them in its server.
    "samplers._model.recommend",
)


def start_method(environ: Mapping[str, str] = os.environ, available: tuple[str, ...] = ()) -> str:
    """How trial processes start: "forkserver" where there is one, unless the environment
    asks for "spawn"."""

    chosen = environ.get(START_ENV, "").strip().lower()
    if chosen not in ("", "spawn", "forkserver"):
        raise UserError(f"{START_ENV}={chosen!r} must be spawn or forkserver (or unset)")
    methods = available or tuple(mp.get_all_start_methods())
    if chosen == "spawn" or "forkserver" not in methods:
        return "spawn"
    return "forkserver"


def preload(uses_torch: bool) -> list[str]:
    """What the fork server imports for trials of an adapter that does or does not use torch."""
    return [name for name in PRELOAD if uses_torch or name.split(".")[0] != "torch"]


_server_has_torch: list[bool] = []  # [whether the fork server this process started imports torch]


def trial_process_context(uses_torch: bool = True) -> Any:
    """The multiprocessing context trial processes start from (see the module's doc)."""
    method = start_method()
    context = mp.get_context(method)
    if method == "forkserver":
        _fork_server_for(context, uses_torch)
    return context


def _fork_server_for(context: Any, uses_torch: bool) -> None:
    """Set what the fork server imports, before it starts: torch or not. A running server without
    torch is restarted with it for trials that use torch, when none of its processes is alive (a
    server with torch serves trials that use none as well)."""

    server = forkserver._forkserver  # multiprocessing's one server (private: no public handle)
    running = server._forkserver_pid is not None
    if running and uses_torch and _server_has_torch == [False] and not mp.active_children():
        _stop_fork_server()
        server._stop()  # its pipe closed, its pid reaped, its socket removed
        running = False
    if not running:
        context.set_forkserver_preload(preload(uses_torch))
        _server_has_torch[:] = [uses_torch]


def started_here(environ: dict[str, str], cwd: str, target: Any, *args: Any) -> None:
    """A trial process's entry point: the environment and working directory its supervisor had
    when it started the process (a forked one has the server's), then `target(*args)`."""
    os.environ.clear()
    os.environ.update(environ)
    with contextlib.suppress(OSError):
        os.chdir(cwd)
    target(*args)


def trial_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a trial process gets: its supervisor's, less the study database's URL.
    A trial process gets the URL in its first message (`WorkerConfig`), never from its
    environment: the user's code runs there, and an objective that prints or logs its
    environment would put a password in its trial log, where `logs` shows it."""

    return {key: value for key, value in environ.items() if key != STORAGE_ENV}


@contextlib.contextmanager
def _storage_url_hidden() -> Iterator[None]:
    """This process's environment without the database's URL while a process is started from it:
    a spawned process and the fork server are new programs that take the environment as it is
    when they start (and keep it in /proc/PID/environ, which clearing `os.environ` later would
    not change). Put back after."""

    hidden = os.environ.pop(STORAGE_ENV, None)
    try:
        yield
    finally:
        if hidden is not None:
            os.environ[STORAGE_ENV] = hidden


def start_process(context: Any, target: Any, *args: Any) -> BaseProcess:
    """Start `target(*args)` in a trial process of `context`, with this process's environment
    less the database's URL (`trial_environment`)."""
    environ = trial_environment(os.environ)
    process = context.Process(
        target=started_here, args=(environ, os.getcwd(), target, *args), daemon=False
    )
    with _storage_url_hidden():  # the fork server may start here, on the first process
        process.start()
    return process


def start_fork_server_now() -> None:
    """Start the fork server without waiting for its imports, and end it at this process's exit."""

    with _storage_url_hidden():
        forkserver.ensure_running()
    if not _stop_at_exit:
        _stop_at_exit.append(util.Finalize(None, _stop_fork_server, exitpriority=1))


_stop_at_exit: list[Any] = []


def _stop_fork_server() -> None:
    """At this process's exit (after `_dismiss_all` and every pool's close), end its fork server
    at once. Left alone it exits only once it has imported all of `PRELOAD`: a command that
    failed before its first trial (a storage that refused it) would leave it importing torch for
    seconds of CPU. It ignores SIGTERM (fork_server_signals), so it is killed; trial processes
    forked from it are its children, not ours, and were told to go before this runs.
    multiprocessing keeps the server's pid in a private attribute and offers no public way to
    stop it."""

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
