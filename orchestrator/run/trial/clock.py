"""`--trial-timeout`: the clock of one trial's training, kept inside its own trial process.

The clock lives in the trial process (SIGALRM), not in the pool: the process then ends its own
trial the way every other end is told (a FAIL with reason `timeout`, written whole, with its
retry counted), and the pool hears an ordinary outcome. Python runs the signal's handler between
bytecodes, so a training loop, a `time.sleep` or a data loader's wait are all cut short; one C
call that never returns (a wedged GPU kernel) is not, and the trial's heartbeat still tells the
study if its process is then killed.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any


class TimedOut(BaseException):
    """The trial trained past --trial-timeout. A BaseException, so that an adapter's
    `except Exception` cannot swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise `TimedOut` in the block once it has run `seconds` (None: no limit)."""
    if seconds is None:
        yield
        return

    def ring(signum: int, frame: Any) -> None:
        raise TimedOut(f"ran past --trial-timeout {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
