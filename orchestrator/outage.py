"""Riding out a database outage: tell a lost connection from a real error, retry the first.

(Being written: the retry loop follows.)
"""

from __future__ import annotations

import os

RETRY_ENV = "ORCHESTRATOR_STORAGE_RETRY_SECONDS"
DEFAULT_RETRY_SECONDS = 300.0


def set_retry_seconds(seconds: float) -> None:
    """The bound for this process and the trial processes it starts (they read the environment)."""
    os.environ[RETRY_ENV] = repr(float(seconds))
