"""What this process knows of the database's outages (one record, shared by its threads), and
what its outage lines name: the storage, and the command that resumes.

The lines are the host's: its `run` or `worker` process says when the database went away and
when it is back, with the time and level of every other line; its trial processes keep quiet
about it (`quiet_in_trial_processes`), or one outage would take a line per trial process."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from orchestrator.record.outages.errors import LOCKED, first_line
from orchestrator.record.store.location import (
    STORAGE_ENV,
    StorageLocation,
    mask_password,
    password_of,
)
from orchestrator.record.store.passwords import redact

# Every outage line comes from one logger, whichever module says it.
logger = logging.getLogger("orchestrator.record.outages.riding")


@dataclass
class Outages:
    """What this process knows of the database's outages; one per process (`OUTAGES`).

    Clock, sleep and jitter are injected so that tests run outages without waiting."""

    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2)
    # A wait for a free connection slot: a random part of the pause ("full jitter"), so that
    # the processes refused together do not all knock again at the same moment.
    spread: Callable[[float], float] = lambda pause: random.uniform(0.1 * pause, pause)
    log: logging.Logger = logger
    where: str = "the study database"
    resume: str = "the same command again"
    began_at: float | None = None  # the first failed call of the outage in progress
    ended_at: float | None = None  # when the last outage ended
    said_back_at: float | None = None  # when this process last said an outage was over
    outages: int = 0
    # What the line about a full server says: the server's limit (read when the storage was
    # opened) and the connections this host's processes may hold at once (its pool says).
    max_connections: int | None = None
    host_connections: int | None = None
    full_said: bool = False
    refusals: int = 0  # connections the server refused for want of a free slot
    refused_at: float | None = None  # the last refusal
    server_started: str | None = None  # the PostgreSQL server's start time, as last seen
    restart_seen_at: float | None = None  # when this process first saw that start (its clock)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _depth: threading.local = field(default_factory=threading.local, repr=False)

    def went_away(self, kind: str, error: BaseException, bound: float) -> float:
        """Note a failed call; the first of an outage logs one line. Returns when it began."""
        with self._lock:
            if self.began_at is None:
                self.began_at = self.clock()
                self.outages += 1
                what = "is locked by another process" if kind == LOCKED else "went away"
                self.log.warning(
                    "the database (%s) %s: %s; retrying for up to %.0f s",
                    self.where,
                    what,
                    first_line(error),
                    bound,
                )
            return self.began_at

    def server_at_limit(self, in_use: int, limit: int) -> None:
        """The server was seen with (nearly) every connection slot taken: processes of this
        host may be refused, quietly. Said once per process, as a refusal is."""
        self.max_connections = limit
        self._say_full(f"{in_use} of max_connections={limit} in use")

    def server_full(self, error: BaseException) -> None:
        """The server refused a connection: every slot is taken. Not an outage (the server is
        up, and a slot frees as soon as another client lets go): said once per process, with
        what to do about it."""
        with self._lock:
            self.refusals += 1
            self.refused_at = self.clock()
        limit = f"max_connections={self.max_connections or '?'}"
        self._say_full(f"{first_line(error)} ({limit})")

    def _say_full(self, what: str) -> None:
        with self._lock:
            if self.full_said:
                return
            self.full_said = True
        uses = (
            f"; this host uses up to {self.host_connections} (1 per trial process, 1 for itself)"
            if self.host_connections
            else ""
        )
        self.log.warning(
            "the database server (%s) has no connection free: %s%s; its clients wait for a "
            "free one, retrying with random pauses. Put PgBouncer (transaction mode) in front "
            "of the server so that many processes share few connections, or raise "
            "max_connections",
            self.where,
            what,
            uses,
        )

    def held_back(self) -> None:
        """A call got through, but only after a long wait: as if an outage had just ended (no
        line: nothing failed), so that heartbeats held as long get their grace period."""
        with self._lock:
            if self.began_at is None:
                self.ended_at = self.clock()

    def came_back(self) -> None:
        """A call worked: if an outage was on, it is over (one line)."""
        if self.began_at is None:
            return
        with self._lock:
            if self.began_at is None:
                return
            now = self.clock()
            self.log.warning(
                "the database (%s) is back after %.0f s", self.where, now - self.began_at
            )
            self.began_at, self.ended_at, self.said_back_at = None, now, now

    def quiet_for(self, seconds: float) -> bool:
        """No outage now and none ended in the last `seconds`: heartbeats are to be trusted."""
        if self.began_at is not None:
            return False
        # A server with no slot free refuses trial processes' heartbeats too: while this
        # process is refused, theirs may be, and a late heartbeat proves nothing.
        for since in (self.ended_at, self.refused_at):
            if since is not None and self.clock() - since < seconds:
                return False
        return True

    @contextlib.contextmanager
    def nested(self) -> Iterator[bool]:
        """True inside the outermost ride_out of this thread."""
        depth = getattr(self._depth, "value", 0)
        self._depth.value = depth + 1
        try:
            yield depth == 0
        finally:
            self._depth.value = depth
            if depth == 0:
                self._depth.memory = {}

    def retry_memory(self) -> dict[str, object]:
        """What calls keep across the retries of this thread's outermost ride_out, forgotten when
        it returns or gives up: the mark of an ask whose answer was lost, for the ask that a
        retried section makes again to look for."""
        if not hasattr(self._depth, "memory"):
            self._depth.memory = {}
        return self._depth.memory


OUTAGES = Outages()


def quiet_in_trial_processes() -> None:
    """A trial process rides out an outage without a word: its host's process says it once."""
    logger.setLevel(logging.ERROR)


def current(outages: Outages | None = None) -> Outages:
    """`outages` when given (a test's own), else this process's record, `OUTAGES`."""
    return outages or OUTAGES


def note_storage(location: StorageLocation, outages: Outages | None = None) -> None:
    """Name the storage in the outage lines of this process."""
    current(outages).where = location.describe()


def note_connections(
    *,
    max_connections: int | None = None,
    host_connections: int | None = None,
    outages: Outages | None = None,
) -> None:
    """What the line about a full server says: the server's limit, this host's connections."""
    state = current(outages)
    if max_connections is not None:
        state.max_connections = max_connections
    if host_connections is not None:
        state.host_connections = host_connections


def note_command(
    argv: list[str], outages: Outages | None = None, environ: Mapping[str, str] = os.environ
) -> None:
    """The command that resumes after an outage: this one again (it resumes)."""
    current(outages).resume = resume_text(argv, environ)


def resume_text(argv: list[str], environ: Mapping[str, str] = os.environ) -> str:
    """What the exit-75 line says after "resume with": the command in backticks, and, where it
    reads the URL from $ORCHESTRATOR_STORAGE but the URL was typed on the command line (the
    variable unset or another URL), how to put it there: the URL with its password masked, since
    a password is never printed, and pasting `--storage "$ORCHESTRATOR_STORAGE"` with the
    variable unset would run on the default SQLite file instead."""
    command = resume_command(argv)
    typed = _typed_storage(argv)
    if STORAGE_FROM_ENV not in command or typed is None or environ.get(STORAGE_ENV) == typed:
        return f"`{command}`"
    return (
        f"`{command}` once the URL is in {STORAGE_ENV}: "
        f"export {STORAGE_ENV}={shlex.quote(mask_password(typed))} with your password in "
        "place of *** (it is never printed)"
    )


def _typed_storage(argv: list[str]) -> str | None:
    """The --storage URL on the command line, if any (the last one, as argparse takes it)."""
    found = None
    for index, arg in enumerate(argv):
        if arg == "--storage" and index + 1 < len(argv):
            found = argv[index + 1]
        elif arg.startswith("--storage="):
            found = arg.partition("=")[2]
    return found


# What a storage URL holding a password becomes in the resume command: the shell reads it from
# the environment, so the command can be pasted as it is shown and shows no password.
STORAGE_FROM_ENV = f'"${STORAGE_ENV}"'


def resume_command(argv: list[str]) -> str:
    """`python -m orchestrator ARGV`, quoted for a shell, with a --storage URL that holds a
    password replaced by "$ORCHESTRATOR_STORAGE" (anything else secret is redacted)."""
    words, rest = ["python", "-m", "orchestrator"], list(argv)
    while rest:
        arg = rest.pop(0)
        flag, equals, value = arg.partition("=")
        if arg == "--storage" and rest and password_of(rest[0]):
            rest.pop(0)
            words += ["--storage", STORAGE_FROM_ENV]
        elif flag == "--storage" and equals and password_of(value):
            words += ["--storage", STORAGE_FROM_ENV]
        else:
            words.append(shlex.quote(arg))
    return redact(" ".join(words))
