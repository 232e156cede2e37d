"""Riding out a database outage: a lost connection is retried for a while, a real error is not.

A PostgreSQL restart, a failover or a network blip takes the database away for seconds. Every
storage call of a long-running process goes through `ride_out`, which

- tells a connection-level failure (refused, reset, closed, admin shutdown, SQLite busy) from a
  real error (integrity, data, programming): only the first is retried (`outages/errors`);
- retries with capped exponential backoff for at most `--storage-retry-seconds` in all;
- a server with no connection slot free ("too many clients") is not an outage: the server is
  up and a slot frees when another client lets go. The call is retried after short random
  pauses, without a bound, and the process says once what it is and what cures it;
- logs one line when the database goes away and one when it is back, however many calls and
  threads of the process wait at once (the state is shared per process: `outages/state`);
- after the bound, raises `StorageUnreachable` (`store/storage_failures`), whose one line says how
  long the database has been gone and the command that resumes.

A trial's heartbeat lives through an outage here too; `trials/stale` waits for one to be over.

A retry repeats the whole call. Calls nest: only the outermost `ride_out` retries, so a block
that must be redone whole (take the budget lock, count, ask) is wrapped once, outside.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from orchestrator.errors import UserError
from orchestrator.record.outages.errors import FULL, first_line, outage_kind
from orchestrator.record.outages.state import Outages, current
from orchestrator.record.store.storage_failures import StorageFull, StorageUnreachable, disk_full

logger = logging.getLogger(__name__)

T = TypeVar("T")

# --- the bound ----------------------------------------------------------------------------

RETRY_ENV = "ORCHESTRATOR_STORAGE_RETRY_SECONDS"
DEFAULT_RETRY_SECONDS = 300.0
FIRST_PAUSE_S = 0.5
LONGEST_PAUSE_S = 8.0
# A server with no connection slot free frees one as soon as any client lets go: knock again
# soon, at a random moment, and never count the wait against the outage bound.
FULL_FIRST_PAUSE_S = 0.05
FULL_LONGEST_PAUSE_S = 1.0


def set_retry_seconds(seconds: float) -> None:
    """The bound for this process and the trial processes it starts (they read the environment)."""
    os.environ[RETRY_ENV] = repr(float(seconds))


def retry_seconds(environ: Mapping[str, str] = os.environ) -> float:
    text = environ.get(RETRY_ENV)
    if not text:
        return DEFAULT_RETRY_SECONDS
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{RETRY_ENV}={text!r} must be a number of seconds, e.g. 300") from None
    if not (value >= 0 and value != float("inf")):
        raise UserError(f"{RETRY_ENV}={text!r} must be 0 or more seconds, e.g. 300")
    return value


# A call that took this long was held somewhere on the way (PgBouncer holds every call while
# the server behind it restarts, and nobody sees an error): the heartbeats sent meanwhile were
# held too, so the look for lost trials waits as after an outage.
HELD_CALL_S = 5.0

# --- the retry ----------------------------------------------------------------------------


def ride_out(
    call: Callable[[], T],
    *,
    what: str,
    bound: float | None = None,
    outages: Outages | None = None,
) -> T:
    """`call()`, retried while the database is away, for at most `bound` seconds in all.

    `what` says in a few words what the call does ("tell trial 12"), for the final line."""
    state = current(outages)
    with state.nested() as outermost:
        if not outermost:
            return call()  # the outermost ride_out retries the whole block
        limit = retry_seconds() if bound is None else bound
        pause, full_pause = FIRST_PAUSE_S, FULL_FIRST_PAUSE_S
        waited_here = False
        while True:
            began = state.clock()
            try:
                result = call()
            except Exception as error:
                kind = outage_kind(error)
                if kind is None:
                    if disk_full(error):  # one line naming the disk, not Optuna's guess
                        raise StorageFull(state.where, first_line(error)) from None
                    raise
                if kind == FULL:
                    state.server_full(error)
                    state.sleep(state.spread(full_pause))
                    full_pause = min(full_pause * 2, FULL_LONGEST_PAUSE_S)
                    continue
                waited_here = True
                began = state.went_away(kind, error, limit)
                waited = state.clock() - began
                if waited >= limit:
                    raise StorageUnreachable(
                        waited,
                        where=state.where,
                        what=what,
                        detail=first_line(error),
                        resume=state.resume,
                        kind=kind,
                    ) from None
                state.sleep(max(0.0, min(pause * state.jitter(), limit - waited)))
                pause = min(pause * 2, LONGEST_PAUSE_S)
                continue
            # Only a call that met the outage may end it: beside a locked SQLite file, reads
            # go on while every write waits.
            if waited_here:
                state.came_back()
            elif state.clock() - began >= HELD_CALL_S:
                state.held_back()
            return result


def when_a_connection_is_free(call: Callable[[], T], *, outages: Outages | None = None) -> T:
    """`call()`, retried while the server has no connection slot free, and only then: for what
    must fail at once when the database is away (a command opening its storage) but should wait
    its turn at a server that is merely full."""
    state = current(outages)
    pause = FULL_FIRST_PAUSE_S
    while True:
        try:
            return call()
        except Exception as error:
            if outage_kind(error) != FULL:
                raise
            state.server_full(error)
            state.sleep(state.spread(pause))
            pause = min(pause * 2, FULL_LONGEST_PAUSE_S)


def retried(what: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """A decorator: every call of the function rides out an outage (see `ride_out`)."""

    def decorate(function: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return ride_out(lambda: function(*args, **kwargs), what=what)

        return wrapper

    return decorate


# --- a trial's heartbeat during an outage -------------------------------------------------


class Heartbeat:
    """A trial's heartbeat that lives through an outage (Optuna's thread dies at the first error).

    While the database is away it keeps trying, quietly: the outage has its one line already.
    A real error ends it with one warning. A fused group's members beat in one thread (`add`)."""

    def __init__(
        self,
        storage: Any,
        trial_id: int,
        interval: float,
        *,
        outages: Outages | None = None,
    ) -> None:
        self._storage, self._interval = storage, interval
        self._trial_ids: tuple[int, ...] = (trial_id,)
        self._state = current(outages)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def add(self, trial_id: int) -> None:
        """Beat `trial_id` too, from the next beat on (its claim recorded its first)."""
        self._trial_ids = (*self._trial_ids, trial_id)  # a new tuple: the thread reads whole ones

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        failed = False
        while not self._stop.is_set():
            trial_id = self._trial_ids[0]
            try:
                with single_attempt(self._state):
                    for trial_id in self._trial_ids:
                        self._storage.record_heartbeat(trial_id)
            except Exception as error:
                kind = outage_kind(error)
                if kind is None:
                    logger.warning("heartbeat of trial id %d stopped: %s", trial_id, error)
                    return
                if kind == FULL:  # no slot free this moment: beat again soon
                    self._state.server_full(error)
                    self._stop.wait(self._state.spread(min(self._interval, FULL_LONGEST_PAUSE_S)))
                    continue
                failed = True
                self._state.went_away(kind, error, retry_seconds())
                self._stop.wait(min(self._interval, FIRST_PAUSE_S * 4))
                continue
            if failed:
                self._state.came_back()
                failed = False
            self._stop.wait(self._interval)


@contextlib.contextmanager
def single_attempt(outages: Outages | None = None) -> Iterator[None]:
    """Inside, storage calls are tried once: an outage raises at once instead of waiting.

    For what must not stop while the database is away, such as a trial's progress reports
    during training: the caller keeps them and delivers them later."""
    with current(outages).nested():
        yield
