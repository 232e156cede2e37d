"""A trial process's stop (SIGTERM) while it trains: raised even when Python runs the handler
inside a finalizer, which drops what it raises (seen as a stop lost in SQLAlchemy's weakref
callbacks, the trial then training to its end and its process killed)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TRAINING = textwrap.dedent(
    """
    import os, signal, sys, time
    from orchestrator.run.trial.signals import Interrupted, install_signal_handlers, interruptible

    install_signal_handlers()

    class Finalized:
        def __del__(self):
            {finalizer}
            for _ in range(10_000):  # bytecodes: the handler runs here, inside the finalizer
                pass

    try:
        with interruptible():
            Finalized()  # dropped at once: its finalizer runs inside the training
            time.sleep({seconds})
        print("trained to the end")
    except Interrupted:
        print("stopped")
    """
)


def _train(finalizer: str, seconds: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", TRAINING.format(finalizer=finalizer, seconds=seconds)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=25,  # under the training's 30 s: a stop that was lost times out here
    )


def test_a_stop_that_lands_in_a_finalizer_still_stops_the_training() -> None:
    done = _train("os.kill(os.getpid(), signal.SIGTERM)")
    assert done.stdout == "stopped\n", done.stderr
    assert "Interrupted" not in done.stderr  # taken up again, not reported as dropped


def test_another_error_in_a_finalizer_is_reported_as_python_does() -> None:
    done = _train("raise ValueError('a finalizer of the model')", seconds=0.1)
    assert done.stdout == "trained to the end\n", done.stderr
    assert "Exception ignored" in done.stderr
    assert "ValueError: a finalizer of the model" in done.stderr


def test_a_spawned_trial_process_sets_its_handlers_before_the_heavy_imports() -> None:
    # A spawned trial process imports the module of `serve` before `serve` sets its signal
    # handlers: a Ctrl-C in that time is a traceback, so the module loads none of the packages
    # that take most of a second; they load when the first trial runs.
    code = (
        "import sys, orchestrator.run.trial.worker\n"
        "print(sorted(m for m in ('optuna', 'sqlalchemy', 'numpy', 'torch') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
