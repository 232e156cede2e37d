"""Waiting in a test for something another process does: polled, with a deadline and its name,
and reading the study that process is storing."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import optuna

from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.migrate import open_storage

T = TypeVar("T")


# Beside other work (the whole suite, other people's runs: a load of 7-100 on 2 cores) a process
# the test waits on is slow, not hung, and a fixed deadline failed tests whose check held.
MOST_PATIENCE = 10.0


def patient(seconds: float) -> float:
    """A deadline of `seconds` on a quiet machine, stretched by the load per core (at most
    MOST_PATIENCE times): a wait on another process still ends when it hangs."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average here
        load = 1.0
    return seconds * min(MOST_PATIENCE, max(1.0, load))


def wait_for(
    check: Callable[[], T],
    what: str = "the condition",
    *,
    timeout: float = 120.0,
    every: float = 0.2,
    tolerate: tuple[type[BaseException], ...] = (),
) -> T:
    """`check()`'s first true value; an error in `tolerate` counts as not yet (a study not created
    yet, a database file busy). Fails the test naming `what` once `timeout` seconds have passed
    (stretched by the machine's load: `patient`)."""
    timeout = patient(timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
        except tolerate:
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def stored_study(url: str, name: str) -> optuna.Study:
    """Study `name` as another process is storing it, opened as the commands open a storage
    (under the schema's lock): a plain `optuna.load_study` on a database still being created
    creates its tables at the moment the command does, and one of the two fails (seen as
    `UNIQUE constraint failed: alembic_version.version_num`). KeyError until it is stored."""
    return optuna.load_study(study_name=name, storage=_storage(url))


@functools.cache
def _storage(url: str) -> Any:
    return open_storage(StorageLocation.parse(url))
