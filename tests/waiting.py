"""Waiting in a test for something another process does: polled, with a deadline and its name."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    check: Callable[[], T],
    what: str = "the condition",
    *,
    timeout: float = 120.0,
    every: float = 0.2,
    tolerate: tuple[type[BaseException], ...] = (),
) -> T:
    """`check()`'s first true value; an error in `tolerate` counts as not yet (a study not created
    yet, a database file busy). Fails the test naming `what` once `timeout` seconds have passed."""
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
