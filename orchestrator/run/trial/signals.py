"""Stop signals in a trial process: SIGTERM cuts short only what may be cut short.

The supervisor stops a trial with SIGTERM (after the grace period, or before it is admitted).
It raises `Interrupted` only while the objective trains or the process waits for work; at any
other moment it is remembered, so asking, telling and writing records are never cut in half.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any


class Interrupted(BaseException):
    """The supervisor asked this trial to stop (SIGTERM after its grace period).

    A BaseException, so that an adapter's `except Exception` cannot swallow it."""


class _Stop:
    """SIGTERM raises Interrupted only while the objective runs or the process idles (`armed`);
    at any other moment it is remembered, so asking, telling and writing records are never cut
    in half."""

    armed = False
    requested = False
    holding = False  # armed, but held back until an epoch's checkpoint is saved (hold_stop)


def _on_sigterm(signum: int, frame: Any) -> None:
    _Stop.requested = True
    if _Stop.armed:
        _Stop.armed = False
        raise Interrupted(f"stopped by signal {signum}")


def install_signal_handlers() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the supervisor, which decides
    signal.signal(signal.SIGTERM, _on_sigterm)


def stop_requested() -> bool:
    return _Stop.requested


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """The block a SIGTERM may cut short (the objective, or waiting for the next job)."""
    if _Stop.requested:  # the signal came while the trial was being set up
        raise Interrupted(f"stopped by signal {signal.SIGTERM.value}")
    _Stop.armed = True
    try:
        yield
    finally:
        _Stop.armed = _Stop.holding = False


def hold_stop() -> None:
    """From here to `release_stop`, a part a SIGTERM must not cut (an epoch reported and not yet
    checkpointed): a stop that comes is remembered and raised at the release."""
    if _Stop.armed:
        _Stop.armed, _Stop.holding = False, True


def release_stop() -> None:
    if not _Stop.holding:
        return
    _Stop.holding, _Stop.armed = False, True
    if _Stop.requested:
        _Stop.armed = False
        raise Interrupted(f"stopped by signal {signal.SIGTERM.value}")
