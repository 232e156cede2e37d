"""Stop signals in a trial process: SIGTERM cuts short only what may be cut short.

The supervisor stops a trial with SIGTERM (after the grace period, or before it is admitted).
It raises `Interrupted` only while the objective trains or the process waits for work; at any
other moment it is remembered, so asking, telling and writing records are never cut in half.

Python runs a signal's handler between bytecodes, which may be inside a finalizer (a `__del__`,
a weakref callback: SQLAlchemy's registries have them) that the garbage collector runs in the
middle of training. An exception raised there is printed and dropped, and the training would go
on to its end. So a dropped `Interrupted` arms the stop again and sends SIGTERM once more, from
a thread, so that it lands after the finalizer returns.

A host process that is gone (`orchestrator.run.trial.host` sees its pipe's end) stops the trial
the same way: `host_gone` from the pipe's reader, a SIGTERM from the thread that watches it. Its
`Interrupted` says so, and the trial is re-queued as a preempted one is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

RESEND_AFTER_S = 0.05  # long enough to be out of the finalizer, short beside any training step


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
    inside = False  # in an interruptible block (armed, holding, or its stop on its way out)
    host_gone = False  # the stop is its host process's death, not a signal the host sent


HOST_GONE = "its host process is gone"


def _why(signum: int = signal.SIGTERM.value) -> str:
    return HOST_GONE if _Stop.host_gone else f"stopped by signal {signum}"


def _on_sigterm(signum: int, frame: Any) -> None:
    _Stop.requested = True
    if _Stop.armed:
        _Stop.armed = False
        raise Interrupted(_why(signum))


def host_gone() -> None:
    """Its host process is gone (its pipe is closed): stop as a SIGTERM stops, raising
    `Interrupted` here if the trial may be cut short now."""
    _Stop.host_gone = True
    _on_sigterm(signal.SIGTERM.value, None)


def host_gone_from_thread() -> None:
    """`host_gone`, seen from a thread: the stop is raised in the main thread by a SIGTERM."""
    _Stop.host_gone = True
    os.kill(os.getpid(), signal.SIGTERM)


def is_host_gone() -> bool:
    return _Stop.host_gone


def _on_unraisable(unraisable: Any, passed_on: Any = sys.unraisablehook) -> None:
    """A stop that a finalizer dropped: armed again, and sent again once out of the finalizer."""
    if not isinstance(unraisable.exc_value, Interrupted) or not _Stop.inside or _Stop.holding:
        passed_on(unraisable)
        return
    _Stop.armed = True
    resend = threading.Timer(RESEND_AFTER_S, os.kill, (os.getpid(), signal.SIGTERM))
    resend.daemon = True
    resend.start()


def install_signal_handlers() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the supervisor, which decides
    signal.signal(signal.SIGTERM, _on_sigterm)
    sys.unraisablehook = _on_unraisable


def stop_requested() -> bool:
    return _Stop.requested


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """The block a SIGTERM may cut short (the objective, or waiting for the next job)."""
    if _Stop.requested:  # the signal came while the trial was being set up
        raise Interrupted(_why())
    _Stop.armed = _Stop.inside = True
    try:
        yield
    finally:
        _Stop.armed = _Stop.holding = _Stop.inside = False


def hold_stop() -> None:
    """From here to `release_stop`, a part a SIGTERM must not cut (an epoch reported and not yet
    checkpointed): a stop that comes is remembered and raised at the release."""
    if _Stop.armed:
        _Stop.armed, _Stop.holding = False, True


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A part a SIGTERM must not cut inside an interruptible block (a fused member's end, told
    while the others train on): a stop that comes meanwhile is raised after it. A hold already
    in force (an epoch not yet saved) stays: only the hold taken here is released."""
    mine = _Stop.armed
    hold_stop()
    try:
        yield
    finally:
        if mine:
            release_stop()


def release_stop() -> None:
    if not _Stop.holding:
        return
    _Stop.holding, _Stop.armed = False, True
    if _Stop.requested:
        _Stop.armed = False
        raise Interrupted(_why())
