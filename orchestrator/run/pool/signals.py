"""Ctrl-C and SIGTERM while the pool runs: counted by the handler, acted on by the loop.

A handler never cuts the loop's bookkeeping in half: it only counts, and the loop takes each
signal at the top of a pass. Two signals not yet taken mean the loop is stuck (riding out a
database outage, say) and the user asked twice: the handler then stops at once.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
first_signal: int | None = None  # the first stop signal any pool of this process received


class StopSignals:
    """The stop signals this pool has received and not yet acted on."""

    def __init__(self) -> None:
        self.waiting = 0

    def received(self, signum: int, frame: FrameType | None) -> None:
        global first_signal
        first_signal = first_signal or signum  # the command's exit status: 130 or 143
        self.waiting += 1
        if self.waiting > 1:
            raise KeyboardInterrupt("stopped by a second signal")

    def take(self) -> bool:
        """Take one waiting signal; False when none waits."""
        if self.waiting <= 0:
            return False
        self.waiting -= 1
        return True

    @contextmanager
    def handled(self) -> Iterator[None]:
        """Count the stop signals while the block runs; the handlers before it come back after."""
        previous = {sig: signal.signal(sig, self.received) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
