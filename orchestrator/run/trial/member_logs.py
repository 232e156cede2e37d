"""A fused group's printed lines, each in its own member's log.

The members of a group share one process, so its output (file descriptors 1 and 2) goes to the
first member's log (`run/trial/runner.output_to`): C libraries, warnings and tracebacks land
there. What the adapter prints for one member, `member K: TEXT` (`adapters.trial_log.write_member`,
K its place in the list `train_fused` got), is the member's own: while `train_fused` runs, this
process's `sys.stdout` sends each such line, without the prefix, to that member's log, so that
`logs --trial N` shows a member's epochs and value as it shows a single trial's. Every other
line goes on to the group's output as before. Each line is written at once (the log file opened,
appended to and closed): a process killed mid-group leaves every line it printed.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from adapters.trial_log import MEMBER_LINE


class MemberLines(io.TextIOBase):
    """A `sys.stdout` that puts `member K: TEXT` lines in member K's log (`logs[K]`), and the
    rest, or a member's line where it has no log, in `group` (the stream it stands in for)."""

    def __init__(self, group: TextIO, logs: Sequence[Path | None]) -> None:
        super().__init__()
        self._group, self._logs, self._partial = group, list(logs), ""
        # An adapter's threads print too: one line at a time (re-entrant: a signal handler that
        # prints runs in the thread that may hold it)
        self._lock = threading.RLock()

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
            for line in lines:
                self._route(line)
        return len(text)

    def _route(self, line: str) -> None:
        found = MEMBER_LINE.fullmatch(line)
        index = int(found[1]) if found else -1
        if found is None and len(self._logs) == 1:
            # A sub-group of one trains as a single trial and prints as one: all its own.
            index, found_text = 0, line
        else:
            found_text = None if found is None else found[2]
        path = self._logs[index] if 0 <= index < len(self._logs) else None
        if path is not None and found_text is not None:
            try:
                with open(path, "a", encoding="utf-8") as log:
                    log.write(found_text + "\n")
                return
            except OSError:
                pass  # its log cannot be written: the group's output keeps the line
        self._group.write(line + "\n")
        self._group.flush()

    def flush(self) -> None:
        self._group.flush()

    def close_partial(self) -> None:
        """What was printed without a newline at the end goes to the group's output."""
        with self._lock:
            if self._partial:
                self._group.write(self._partial)
                self._partial = ""
            self._group.flush()

    def fileno(self) -> int:
        return self._group.fileno()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._group, "encoding", "utf-8")


@contextlib.contextmanager
def member_lines_to(logs: Sequence[Path | None]) -> Iterator[None]:
    """While the block runs, `member K: TEXT` printed here goes to `logs[K]` (a sub-group of
    one member too: its lines read as a single trial's, without the prefix)."""
    group = sys.stdout
    router = MemberLines(group, logs)
    sys.stdout = router
    try:
        yield
    finally:
        router.close_partial()
        sys.stdout = group


def append_line(path: Path, line: str) -> None:
    """One line at the end of a member's log, written at once (a process killed next keeps it);
    where the log cannot be written, the group's output keeps the line."""
    try:
        with open(path, "a", encoding="utf-8") as log:
            log.write(line + "\n")
    except OSError:
        print(line, flush=True)
