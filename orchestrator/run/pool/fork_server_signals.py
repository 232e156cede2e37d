"""Imported only by the fork server that trial processes are forked from: it ignores SIGTERM.

Slurm (and a container runtime, and `kill` on a process group) sends SIGTERM to every process
of a job at once: the worker, its trial processes, and the fork server between them. The
worker and its trial processes use their grace period (a trial is stopped and re-queued). The
fork server must outlive them: multiprocessing reads a forked process's exit code through the
server, so a server that died on the signal makes every trial process it forked look as if it
had exited with code 255 while it is still re-queuing its trial. Ignoring SIGTERM here costs
nothing: the server leaves on its own when the process that started it is gone. A forked
process installs its own handler first thing (`run.trial.signals.install_signal_handlers`).

Nothing else may import this module: the process that imports it stops answering SIGTERM.
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)
