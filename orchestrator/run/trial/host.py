"""A trial process's link to its host (the `run` or `worker` process): the pipe, watched for the
host's death, and the process's name as an operator sees it.

A host killed alone (the kernel's OOM killer, a crash in the host) leaves its trial processes
running: they are children of the fork server, not of the host (`run/pool/trial_start`), and
the server itself exits only once it sees the host gone. What tells a trial process is its
pipe: the host's end closes when the host dies, whoever its parent is, and a thread here waits
for that (poll, no wake-ups meanwhile). The trial then stops at once and is re-queued with its
checkpoints kept, as a preempted one is (`run/trial/signals.host_gone`): the next `run` or
`worker` of its study, on any node, resumes it. A send or receive that finds the pipe broken
says the same. (A parent-death signal would tell of the fork server's death, which follows the
host's only once the server notices; and where trials are spawned, of the death of the host's
thread that started them, which need not be the host's.)

The process is named `trial-N:STUDY` while it runs trial N (`/proc/PID/comm`, 15 bytes:
`ps`, `top` and `pgrep` show it), `idle:STUDY` between trials. The name holds no whitespace:
Slurm's process tracking (proctrack/linuxproc) reads `/proc/PID/stat` with sscanf's `%s`, and a
name with a space makes it skip the process and all it started, so scancel's SIGTERM never
reached the trials and they ran on to their end instead of stopping and being re-queued.
"""

from __future__ import annotations

import contextlib
import select
import sys
import threading
from typing import TYPE_CHECKING, Any

from orchestrator.run.trial.signals import Interrupted, host_gone, host_gone_from_thread

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

PIPE_ERRORS = (EOFError, OSError)  # BrokenPipeError and ConnectionResetError are OSErrors
NAME_BYTES = 15  # the kernel keeps a process's name in 16 bytes, with its NUL


class HostLink:
    """The trial process's end of its pipe to the host: a send or receive that finds the host
    gone stops the trial (`signals.host_gone`) instead of raising a pipe's error."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def send(self, message: Any) -> None:
        try:
            self.conn.send(message)
        except PIPE_ERRORS:
            host_gone()  # raises Interrupted where the trial may be stopped now

    def recv(self) -> Any:
        try:
            return self.conn.recv()
        except PIPE_ERRORS:
            host_gone()
            raise Interrupted("its host process is gone") from None

    def watch(self) -> None:
        """Stop the trial (or the idle process) once the host's end of the pipe is closed."""
        fd = self.conn.fileno()
        threading.Thread(target=_wait_for_hang_up, args=(fd,), name="host", daemon=True).start()


def _wait_for_hang_up(fd: int) -> None:
    poller = select.poll()
    # Only the hang-up: data from the host is the main thread's to read, and must not wake this.
    poller.register(fd, getattr(select, "POLLRDHUP", 0))
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        for _, mask in events:
            if mask & select.POLLNVAL:  # this process closed the pipe itself: nothing to say
                return
            host_gone_from_thread()
            return


def name_process(text: str) -> None:
    """Name this process `text` (its first 15 bytes) where `ps` and `pgrep` look. Linux only;
    elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    text = "_".join(text.split())  # no whitespace: Slurm's tracking must still see the process
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_name = 15
        name = text.encode()[:NAME_BYTES].decode(errors="ignore").encode()  # whole characters
        libc.prctl(pr_set_name, name, 0, 0, 0)


def trial_name(number: int, study_name: str) -> str:
    return f"trial-{number}:{study_name}"


def idle_name(study_name: str) -> str:
    return f"idle:{study_name}"
