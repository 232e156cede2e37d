"""The Python API's arguments, checked before anything is stored, in the API's own words.

`optimize(n_trials=0)` must be refused as `n_trials=0`, not as `--trials` nor after a study was
made; a host setting the API does not know as `optimize() got an unexpected keyword argument`,
not as `HostOptions.__init__()`. The rules themselves are the CLI's (host_options, the study's
settings); only their words change: `--concurrency 0 must be ...` reads `concurrency=0 must be`.
A wrong value is a ValueError, a wrong type or name a TypeError, as Optuna's own checks raise.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from adapters.objective import takes_handle
from orchestrator.errors import UserError
from orchestrator.record.checkpoints.place import WHAT, checked_location
from orchestrator.record.study.names import name_problem
from samplers import sampler_kind

DB_INT_MAX = 2**31 - 1  # trial numbers and report steps are 32-bit integers in the database
SEED_MAX = 2**32 - 1  # numpy's and torch's seeds (adapters.base.SEED_MAX)
MAX_GPU_MB = 1_048_576.0  # host_options.MAX_SIM_MB: more than any GPU holds
_FLAG = re.compile(r"--([a-z][a-z0-9-]*)(?: |=|:|$)")


def in_api_words(message: str) -> str:
    """`--log-dir X is a file` as `log_dir='X' is a file`: each flag as the keyword it is here."""

    def keyword(match: re.Match[str]) -> str:
        name = match.group(1).replace("-", "_")
        return f"{name}=" if match.group(0).endswith((" ", "=")) else f"{name}:"

    return _FLAG.sub(keyword, message)


@contextmanager
def said_as_api() -> Iterator[None]:
    """A UserError raised inside, from a check shared with the CLI, as a ValueError in API words."""
    try:
        yield
    except UserError as error:
        raise ValueError(in_api_words(str(error))) from None


def whole(name: str, value: Any, *, low: int, high: int = DB_INT_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r}: give a whole number, e.g. {name}={max(low, 1)}")
    if not low <= value <= high:
        bound = f"at least {low}" if value < low else f"at most {high:,}"
        raise ValueError(f"{name}={value} must be {bound}")
    return value


def check_arguments(
    *,
    n_trials: Any,
    epochs: Any,
    max_retries: Any,
    swarm_size: Any,
    seed: Any,
    study_name: Any,
    memory_model: Any,
    batch_sizes: Any,
    catch: Any,
    callbacks: Any = (),
    objective: Any = None,
    sampler: Any = None,
) -> tuple[type[BaseException], ...]:
    """Every argument of `optimize` that can be wrong on its own, and the objective for its
    sampler; the `catch` classes as a tuple."""
    _check_callbacks(callbacks)
    check_population(objective, sampler)
    whole("n_trials", n_trials, low=1)
    whole("epochs", epochs, low=1)
    whole("max_retries", max_retries, low=0, high=1000)
    whole("swarm_size", swarm_size, low=1, high=100_000)
    if seed is not None:
        whole("seed", seed, low=0, high=SEED_MAX)
    if study_name is not None:
        problem = name_problem(study_name)
        if problem:
            raise ValueError(f"study_name={_short(study_name)} {problem}")
    _check_memory_model(memory_model)
    _check_batch_sizes(batch_sizes)
    smallest = batch_sizes[0] if batch_sizes is not None else 0
    need = float(memory_model[0]) + float(memory_model[1]) * smallest
    if need > MAX_GPU_MB:
        raise ValueError(
            f"memory_model={_short(memory_model)}: one trial at batch size {smallest} needs "
            f"{need:,.0f} MB, more than any GPU holds"
        )
    return _catch_classes(catch)


def check_artifacts(artifacts: Any) -> str | None:
    """`artifacts=`: where checkpoints are kept, as stored (a folder made absolute), or None.
    The place is checked as `run --artifacts` checks it; the message never shows a secret."""
    if artifacts is None:
        return None
    if isinstance(artifacts, os.PathLike):
        artifacts = os.fspath(artifacts)
    if not isinstance(artifacts, str):  # its value is not shown: bytes may hold a password
        raise TypeError(
            f"artifacts must be a folder (a str or a path), s3://BUCKET or gs://BUCKET, "
            f"not {type(artifacts).__name__}"
        )
    if not artifacts.strip():
        raise ValueError(f"artifacts={artifacts!r} is empty: {WHAT}")
    with said_as_api():
        return checked_location(artifacts)


def _check_callbacks(callbacks: Any) -> None:
    """Functions, each called as callback(study, frozen_trial): refused before a trial runs, not
    when the first one ends."""
    try:
        items = None if callable(callbacks) else list(callbacks or ())
    except TypeError:
        items = None
    if items is None or not all(callable(item) for item in items):
        raise TypeError(
            f"callbacks={_short(callbacks)}: give a list of functions, each called as "
            "callback(study, frozen_trial) when a trial ends"
        )


def check_population(objective: Any, sampler: Any) -> None:
    """`sampler="pbt"` continues members from their checkpoints: the objective must take the
    checkpoint handle, its third argument (as `run --sampler pbt` asks of an adapter's train)."""
    if (
        isinstance(sampler, str)
        and sampler_kind(sampler).needs_checkpoints
        and not takes_handle(objective)
    ):
        name = getattr(objective, "__qualname__", repr(objective))
        raise ValueError(
            f"sampler={sampler!r} continues trials from checkpoints, and {name} takes none: write it "
            "as objective(trial, device, checkpoint) and save with checkpoint.save(epoch, state) "
            "(docs/checkpoints.md), or choose another sampler"
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}...({len(text)} characters)"


def _pair(name: str, value: Any) -> tuple[Any, Any]:
    if isinstance(value, str | bytes) or not hasattr(value, "__len__") or len(value) != 2:
        raise TypeError(f"{name}={_short(value)}: give two numbers, as in {name}=(300.0, 0.05)")
    return value[0], value[1]


def _check_memory_model(memory_model: Any) -> None:
    for part in _pair("memory_model", memory_model):
        number = _number(part)
        if number is None or not math.isfinite(number) or number < 0:
            raise ValueError(
                f"memory_model={_short(memory_model)}: (overhead MB, MB per sample) are two "
                "finite numbers of 0 or more, as in memory_model=(300.0, 0.05)"
            )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:  # an int past a float's range
        return math.inf


def _check_batch_sizes(batch_sizes: Any) -> None:
    if batch_sizes is None:
        return
    low, high = _pair("batch_sizes", batch_sizes)
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (low, high)) or not (
        1 <= low <= high <= DB_INT_MAX
    ):
        raise ValueError(
            f"batch_sizes={_short(batch_sizes)}: give (low, high), two whole numbers with "
            "1 <= low <= high, as in batch_sizes=(64, 4096)"
        )


def _catch_classes(catch: Any) -> tuple[type[BaseException], ...]:
    classes = (catch,) if isinstance(catch, type) else tuple(catch or ())
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise TypeError(
                f"catch={_short(catch)}: give exception classes, as in catch=(ValueError,)"
            )
    return classes


# What each host setting holds (None is "not set" for those that may be left out).
_HOST_KINDS = {
    "gpus": (str,),
    "sim_memory_scale": (int, float),
    "concurrency": (int, type(None)),
    "fuse": (int, str, type(None)),  # a number, or "auto"
    "timeout": (int, float, type(None)),
    "trial_timeout": (int, float, type(None)),
    "grace": (int, float),
    "recycle_after": (int, type(None)),
    "recycle_memory_mb": (int, float),
    "fresh_process": (bool,),
    "log_dir": (str, type(None)),
    "storage_retry_seconds": (int, float),
    "workloads": (str, type(None)),
    "json": (bool,),
    "quiet": (bool, type(None)),
    "verbose": (bool,),
}


def check_host(host: dict[str, Any], known: Callable[[], list[str]]) -> None:
    """The host settings passed as keywords: names `optimize` takes and values of their kind
    (their ranges are checked as `run`'s, by host_options)."""
    names = known()
    unknown = sorted(set(host) - set(names))
    if unknown:
        raise TypeError(
            f"optimize() got an unexpected keyword argument {unknown[0]!r}; the host's settings "
            f"it takes: {', '.join(names)}"
        )
    for name, value in host.items():
        kinds = _HOST_KINDS.get(name)
        if name == "log_dir" and isinstance(value, os.PathLike):
            continue
        wrong_bool = isinstance(value, bool) and bool not in (kinds or ())
        if kinds is not None and (wrong_bool or not isinstance(value, kinds)):
            wanted = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
            raise TypeError(f"{name}={_short(value)}: give {wanted}")
