"""When the objective's own errors end a run: Optuna's rule for the API, a stop for the CLI.

A trial runs in a process of its own, so its exception cannot travel back as it was raised; what
comes back is the trial's `error` attribute, `TypeName: message`. `optimize` follows
`study.optimize`: the first trial that failed with an error of the objective raises that error
in the caller (the same type when it can be made again from its message), unless its type is
one of `catch`. `run` and `worker` stop, exit status 1, when the first trials this run finished
all failed with the same error: a typo in the objective would otherwise fail the whole budget.
A trial that ran out of memory, timed out, returned NaN, called sys.exit or lost its process is
not the objective raising: those go on as they always did (re-queued, or failed and counted).
"""

from __future__ import annotations

import builtins
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.record.study.spec import count_trials
from orchestrator.record.trials import attr_names as names

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial
else:
    optuna = LazyImport("optuna")

FIRST_TRIALS = 3  # the CLI stops when this many first trials (or the whole budget) fail alike


class ObjectiveRaised(Exception):
    """Raised out of the pool's loop to stop it; `optimize` raises `error` in its place."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class FirstTrialsFailed(UserError):
    """The first trials of a run all failed with one error of the objective: exit status 1."""

    exit_status = 1


def objective_error(trial: FrozenTrial) -> str | None:
    """`TypeName: message` when the trial failed because the objective raised; else None."""
    attrs = trial.user_attrs
    if (
        trial.state != optuna.trial.TrialState.FAIL
        or attrs.get(names.OOM)
        or attrs.get(names.FAIL_REASON)
    ):
        return None
    error = attrs.get(names.ERROR)
    if not isinstance(error, str) or ": " not in error:
        return None  # a lost or woken process, said in words of ours
    type_name = error.partition(": ")[0]
    return error if type_name.isidentifier() else None


def error_class(type_name: str, module: str | None = None) -> type[BaseException] | None:
    """The exception class called `type_name`: a built-in, one of the objective's module, or a
    subclass of Exception loaded in this process; None when there is none, or several."""
    found = getattr(builtins, type_name, None)
    if not (isinstance(found, type) and issubclass(found, BaseException)) and module:
        found = getattr(sys.modules.get(module), type_name, None)
    if isinstance(found, type) and issubclass(found, BaseException):
        return found
    loaded = [cls for cls in _subclasses(Exception) if cls.__name__ == type_name]
    return loaded[0] if len(loaded) == 1 else None


def _subclasses(cls: type) -> list[type]:
    out, todo = [], [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            out.append(sub)
            todo.append(sub)
    return out


def rebuilt(error: str, trial_number: int, log_file: Any, module: str | None) -> BaseException:
    """The objective's exception made again from `TypeName: message`, noted with its trial and
    log; a RuntimeError with the whole text when the type cannot be made from a message."""
    type_name, _, message = error.partition(": ")
    cls = error_class(type_name, module)
    made: BaseException
    try:
        made = cls(message) if cls is not None else RuntimeError(error)
    except Exception:  # a class whose constructor takes other arguments
        made = RuntimeError(error)
    where = f"; its output: {log_file}" if log_file else ""
    made.add_note(f"trial {trial_number} raised this in its trial process{where}")
    return made


class RaiseAtFirstFailure:
    """A callback for the API, before the user's: the first trial the objective failed raises
    its error unless the error's type is one of `catch`."""

    def __init__(self, catch: Sequence[type[BaseException]], module: str | None) -> None:
        self.catch = tuple(catch)
        self.module = module

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        error = objective_error(trial)
        if error is None:
            return
        cls = error_class(error.partition(": ")[0], self.module)
        if cls is not None and issubclass(cls, self.catch):
            return
        log_file = trial.user_attrs.get(names.LOG_FILE)
        raise ObjectiveRaised(rebuilt(error, trial.number, log_file, self.module))


class StopWhenFirstTrialsFail:
    """A callback for `run` and `worker`: the first `count` trials that finish in this run all
    failed with the same error of the objective (`count` is at most the trials left to run)."""

    def __init__(self, study_name: str, count: int = FIRST_TRIALS) -> None:
        self.study_name = study_name
        self.count = max(1, count)
        self.first: list[tuple[int, str | None, Any]] = []

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if len(self.first) >= self.count:
            return
        log_file = trial.user_attrs.get(names.LOG_FILE)
        self.first.append((trial.number, objective_error(trial), log_file))
        if len(self.first) < self.count:
            return
        errors = {error for _, error, _ in self.first}
        if len(errors) != 1 or None in errors:
            return
        number, error, log_file = self.first[-1]
        error = str(error).splitlines()[0]  # one line: the log holds the rest
        where = f" ({log_file})" if log_file else ""
        each = "the first trial" if self.count == 1 else f"the first {self.count} trials all"
        raise FirstTrialsFailed(
            f"{each} failed with {error}; the trial's output: `python -m orchestrator logs "
            f"--study {shlex.quote(self.study_name)} --trial {number}`{where}"
        )


def watch_first_trials(study: optuna.Study | None, spec: Any, name: str) -> StopWhenFirstTrialsFail:
    """The watch for `run` and `worker`: three first trials, or as many as the budget has left."""
    done = count_trials(study.get_trials(deepcopy=False)).counted if study is not None else 0
    return StopWhenFirstTrialsFail(name, min(FIRST_TRIALS, spec.trials - done))
