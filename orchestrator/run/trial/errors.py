"""What each end of a trial's objective means: out of memory, a broken CUDA context, stopped,
timed out, the user's code saying stop (`sys.exit`), a NaN, or an error of its own.

`settle` and `fail_with` turn the objective's value or what it raised into its `RunResult`, so
that every end is an outcome told to the study, and none is mistaken for a lost process.
"""

from __future__ import annotations

import logging
import math
import sys
import traceback
from typing import TYPE_CHECKING

from orchestrator.imports import LazyImport
from orchestrator.record.store.storage_failures import StorageUnreachable
from orchestrator.run.trial.clock import TimedOut
from orchestrator.run.trial.signals import Interrupted

if TYPE_CHECKING:
    import optuna

    from orchestrator.run.trial.result import RunResult
else:
    optuna = LazyImport("optuna")

logger = logging.getLogger(__name__)


def settle(result: RunResult, value: object, number: int) -> None:
    """The objective returned `value`. NaN fails the trial (Optuna's own rule: a NaN cannot be
    compared, so it teaches the sampler nothing); inf and -inf are values Optuna accepts, stored
    as COMPLETE, and the pool warns of them once (they are never the best trial)."""

    number_value = float(value)  # type: ignore[arg-type]
    if math.isnan(number_value):
        result.state, result.fail_reason = optuna.trial.TrialState.FAIL, "nan"
        result.error = "the objective returned nan; the trial fails, as Optuna fails it"
        return
    result.state, result.value = optuna.trial.TrialState.COMPLETE, number_value


def fail_with(result: RunResult, caught: BaseException, number: int) -> bool:
    """Record in `result` why the objective failed; False for what is not the trial's to catch
    (KeyboardInterrupt, GeneratorExit), which the caller raises again.

    A database that stayed away past --storage-retry-seconds while the trial ran (its attributes,
    a report or a prune check could not be stored) is not the trial's either: failing it would
    spend a slot of the budget on a result nobody has. It is raised again; the run exits 75, the
    trial stays RUNNING, and the next start finds it lost and runs its parameters again."""

    if isinstance(caught, StorageUnreachable):
        return False
    if isinstance(caught, optuna.exceptions.UpdateFinishedTrialError):
        return False  # taken over while frozen: the runner says so (`late_outcome`)
    if isinstance(caught, oom_errors()) or is_cuda_out_of_memory(caught):
        first = str(caught).splitlines()[0] if str(caught) else ""
        result.oom, result.error = True, f"out of memory: {first}"
    elif isinstance(caught, Interrupted):
        result.interrupted, result.error = True, str(caught)
    elif isinstance(caught, TimedOut):
        result.timed_out, result.fail_reason, result.error = True, "timeout", f"timeout: {caught}"
    elif isinstance(caught, SystemExit):
        # The user's code saying stop: this trial fails, with no retry; the run goes on.
        result.fail_reason = "exit"
        result.error = f"the objective called sys.exit({caught.code!r}); the trial fails"
    elif isinstance(caught, Exception):
        result.error = f"{type(caught).__name__}: {caught}"
        result.cuda_error = is_cuda_error(caught)
        logger.warning("trial %d failed: %s", number, traceback.format_exc())  # to its log
    else:
        return False
    return True


def oom_errors() -> tuple[type[BaseException], ...]:
    """Torch's out-of-memory errors; none in a process that never imported torch (an adapter
    that uses none), where no error can be one of them."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    errors: list[type[BaseException]] = [torch.cuda.OutOfMemoryError]
    generic = getattr(torch, "OutOfMemoryError", None)
    if generic is not None and generic not in errors:
        errors.append(generic)
    return tuple(errors)


# When the GPU is truly full, cuBLAS, cuDNN or the context itself can fail with a RuntimeError
# instead of torch's OutOfMemoryError: the same event, and it gets the same treatment.
CUDA_OOM_MARKS = (
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
)


def is_cuda_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, RuntimeError) and any(mark in str(error) for mark in CUDA_OOM_MARKS)


CUDA_ERROR_MARKS = ("CUDA error", "CUBLAS_STATUS", "CUDNN_STATUS", "cuDNN error", "NCCL error")


def is_cuda_error(error: BaseException) -> bool:
    """A CUDA failure other than out-of-memory: after one, the process's context is suspect."""
    accelerator_error = getattr(sys.modules.get("torch"), "AcceleratorError", None)
    if accelerator_error is not None and isinstance(error, accelerator_error):
        return True
    return isinstance(error, RuntimeError) and any(mark in str(error) for mark in CUDA_ERROR_MARKS)
