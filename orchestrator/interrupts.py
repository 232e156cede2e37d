"""Ctrl-C and SIGTERM while a command starts or ends: one line and the shell's status, no traceback.

While the pool runs it handles both signals itself (run/pool/signals): running trials finish or
are re-queued, and the command exits 130 for Ctrl-C and 143 for SIGTERM, as a shell reports a
process stopped by either. Before that (Python importing torch and Optuna, the storage opening,
the plan) and after it, nothing is half done that a stop could spoil: the command says
`interrupted` or `terminated` and exits with the same statuses.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Terminated(BaseException):
    """SIGTERM, raised where the command is (as Python raises KeyboardInterrupt for Ctrl-C)."""


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


def install() -> None:
    """SIGTERM raises Terminated, from now on in this process (the pool sets its own meanwhile)."""
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _terminated)


def status_of(stop: BaseException) -> int:
    """The exit status for a stop: 130 for Ctrl-C, 143 for SIGTERM."""
    return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)


def say(stop: BaseException) -> int:
    """Say the stop on one line; its exit status."""
    try:
        sys.stderr.write("terminated\n" if isinstance(stop, Terminated) else "interrupted\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed: the status still says it
        pass
    return status_of(stop)


@contextmanager
def stopped_quietly() -> Iterator[None]:
    """A stop inside the block ends the process with one line and 130 or 143."""
    try:
        yield
    except (KeyboardInterrupt, Terminated) as stop:
        # A second Ctrl-C while saying the first must not print a traceback either.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise SystemExit(say(stop)) from None
