"""The adapter protocol: what the orchestrator needs from a model to tune it.

An adapter is any object with these attributes and methods; subclassing `BaseAdapter` is a
convenience, not a requirement. The orchestrator calls `suggest` to draw a trial's parameters
(this is where the search space is declared), then `train` with those parameters on the trial's
device. `train` calls `report(epoch, value)` once per epoch, which may raise `optuna.TrialPruned`,
and returns the value to optimise. Nothing between `suggest` and `train` changes `batch_size`.
A `train` that also takes `checkpoint` gets the trial's `Checkpoint` handle (docs/checkpoints.md).

Optional (docs/fused.md): `train_fused(members, *, epochs, device, options)` trains several
trials of one shape as one fused model, each given as a `Member`, and returns one entry per
member, in order: its value, or what ended it (optuna.TrialPruned, an error); `fuse_key(params)`
beside it says which trials may share a group (those whose keys are equal); `fusing_pays_on`
(device kinds, default both "cpu" and "cuda") says where `--fuse auto` fuses it. A line printed
as `member K: TEXT` (`adapters.trial_log.write_member`, K the member's place in the list) goes,
without the prefix, to that member's own log; the rest of the group's output to the first's.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.record.outages.errors import is_outage
from orchestrator.record.outages.riding import ride_out, single_attempt

if TYPE_CHECKING:
    import optuna
    import torch
else:
    optuna = LazyImport("optuna")

# The study-wide static batch-size range. Every adapter declares `batch_size` over this range
# (log scale) so that every node shares one search space; the sampler maps proposals into the
# bounds that the planner derived for each GPU.
BATCH_SIZE_MIN = 64
BATCH_SIZE_MAX = 4096

Report = Callable[[int, float], None]

SEED_MAX = 2**32 - 1  # numpy's and torch's seeds

REQUIRED_ATTRIBUTES = ("name", "workload_class", "model_overhead_mb", "per_sample_mb", "direction")
REQUIRED_METHODS = ("suggest", "train")


@dataclass(frozen=True)
class MemoryModel:
    """VRAM of one trial: a fixed overhead plus a cost per sample in a batch, in MB. Of the
    overhead, `per_process_mb` is paid once by a process however many trials it trains (the CUDA
    context): once by a fused group (docs/fused.md); 0 counts it per member, an upper bound."""

    model_overhead_mb: float
    per_sample_mb: float
    per_process_mb: float = 0.0

    def planned_mb(self, batch_size: int) -> float:
        return self.model_overhead_mb + batch_size * self.per_sample_mb

    def fused_mb(self, batch_sizes: Sequence[int]) -> float:
        """One process training a trial at each of `batch_sizes` as one fused group."""
        once = min(max(self.per_process_mb, 0.0), self.model_overhead_mb)
        return once + sum(self.planned_mb(batch) - once for batch in batch_sizes)

    def scaled(self, ratio: float) -> MemoryModel:
        """Every part `ratio` times (what the trials measured over what this model said)."""
        return MemoryModel(
            self.model_overhead_mb * ratio, self.per_sample_mb * ratio, self.per_process_mb * ratio
        )


@dataclass(frozen=True)
class Range:
    """The values a numeric option accepts: finite, from `low` to `high` (None: no bound).

    An adapter declares one per option in `option_ranges`; `parse_options` checks every option
    against its range before anything is stored, and refuses NaN and infinity for every option."""

    low: float | None = None
    high: float | None = None
    above_low: bool = False  # low itself is refused: more than low

    def problem(self, value: float) -> str | None:
        """Why `value` is refused, as the end of a sentence; None when it is accepted."""
        if not math.isfinite(value):
            return "must be a finite number"
        if self.low is not None and (value <= self.low if self.above_low else value < self.low):
            bound = (
                f"more than {_number(self.low)}"
                if self.above_low
                else f"at least {_number(self.low)}"
            )
            upper = "" if self.high is None else f" and at most {_number(self.high)}"
            return f"must be {bound}{upper}"
        if self.high is not None and value > self.high:
            return f"must be at most {_number(self.high)}"
        return None


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True)
class InputFile:
    """A text option that names a file to read ("" for none): it must exist and be a file."""

    what: str = "a CSV file with a `close` column"

    def problem(self, value: str) -> str | None:
        if not value:
            return None
        path = Path(value)
        try:
            path.stat()
        except OSError as error:  # missing, or a name the file system refuses (too long, NUL)
            if isinstance(error, FileNotFoundError):
                return f"does not exist: give {self.what}"
            return f"cannot be used ({error.strerror or error}): give {self.what}"
        except ValueError:  # an embedded NUL character
            return f"is not a file name: give {self.what}"
        if path.is_dir():
            return (
                f"is a directory: give {self.what} (a file inside it, e.g. {path / 'prices.csv'})"
            )
        if not path.is_file():
            return f"does not exist: give {self.what}"
        if not os.access(path, os.R_OK):
            return f"cannot be read: give {self.what} that this user may read"
        return None


OptionCheck = Range | InputFile


class Checkpoint(Protocol):
    """The trial's checkpoint handle (orchestrator/record/checkpoints/handle.py): `load()` the
    state to go on from (None: start at epoch 0), `save(epoch, state)` after an epoch, written
    when `due(epoch)`."""

    def load(self) -> dict[str, Any] | None: ...

    def save(self, epoch: int, state: dict[str, Any]) -> None: ...

    def due(self, epoch: int) -> bool: ...


@dataclass(frozen=True)
class Member:
    """One trial of a fused group, as `train_fused` gets it (docs/fused.md)."""

    params: Mapping[str, Any]  # the trial's drawn parameters, as `train` gets them
    report: Report  # the trial's own: may raise optuna.TrialPruned
    checkpoint: Checkpoint | None  # the trial's own handle


@runtime_checkable
class Adapter(Protocol):
    name: str
    workload_class: str  # "rl" or "supervised"
    model_overhead_mb: float
    per_sample_mb: float
    direction: str  # "maximize" or "minimize"

    def suggest(self, trial: optuna.Trial, options: Mapping[str, Any]) -> dict[str, Any]: ...

    def train(
        self,
        params: Mapping[str, Any],
        *,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
        report: Report,
    ) -> float: ...


class BaseAdapter:
    """Shared behaviour: option parsing, the memory model, and `objective` from suggest + train."""

    name: str = ""
    workload_class: str = "supervised"
    model_overhead_mb: float = 500.0
    per_sample_mb: float = 0.02
    direction: str = "minimize"
    metric: str = "value"  # what the returned value is, in the user's words
    description: str = ""
    # Option name -> default value; `--option KEY=VALUE` is parsed to the default's type.
    options: Mapping[str, Any] = {}
    # Option name -> the values it accepts (Range, InputFile); optional, checked at parse time.
    option_ranges: Mapping[str, OptionCheck] = {}
    # A known-good value for every searched parameter, batch_size too: `run --enqueue-defaults`
    # runs it as the first trial, and calibration trains with it.
    default_params: Mapping[str, Any] = {}
    # Whether `train` uses torch. An adapter that says False (one that trains with another
    # library, or none) gets its device as a name ("cpu", "cuda:0"), and its trial processes
    # skip importing torch: about 1.5 s of CPU per command.
    uses_torch: bool = True
    # Where fusing its trials was measured to pay: `--fuse auto` fuses only on these kinds of
    # device ("cpu", "cuda"). `--fuse N` fuses wherever it is asked.
    fusing_pays_on: tuple[str, ...] = ("cpu", "cuda")

    def memory_model(self, options: Mapping[str, Any]) -> MemoryModel:
        return MemoryModel(self.model_overhead_mb, self.per_sample_mb)

    def suggest(self, trial: optuna.Trial, options: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def train(
        self,
        params: Mapping[str, Any],
        *,
        epochs: int,
        device: torch.device,
        options: Mapping[str, Any],
        report: Report,
    ) -> float:
        raise NotImplementedError

    def objective(
        self,
        trial: optuna.Trial,
        device: torch.device,
        epochs: int,
        options: Mapping[str, Any],
    ) -> float:
        """One trial: draw parameters, train, report every epoch (pruning works), return the value."""
        params = self.suggest(trial, options)
        report = reporter(trial)
        value = self.train(params, epochs=epochs, device=device, options=options, report=report)
        report.flush()  # type: ignore[attr-defined]
        return value


def reporter(trial: optuna.Trial) -> Report:
    """The `report` an adapter calls once per epoch: records the value, and raises
    `optuna.TrialPruned` when the study's pruner says the trial is not worth finishing.

    While the database is away the trial keeps training: the values wait in the reporter (no
    pruning decision is made without them) and go out with the next report once it is back, or
    with `report.flush()`, which the caller runs before it tells the result."""
    pending: list[tuple[int, float]] = []

    def deliver() -> None:
        while pending:
            epoch, value = pending[0]
            trial.report(value, epoch)
            pending.pop(0)

    def report(epoch: int, value: float) -> None:
        pending.append((epoch, value))
        try:
            with single_attempt():
                deliver()
                prune = trial.should_prune()
        except Exception as error:
            if not is_outage(error):
                raise
            return  # delivered later; the outage has its one line already
        if prune:
            raise optuna.TrialPruned(f"pruned at epoch {epoch}")

    def flush() -> None:
        ride_out(deliver, what=f"report the progress of trial {trial.number}")

    report.flush = flush  # type: ignore[attr-defined]
    return report


def memory_model_of(adapter: Any, options: Mapping[str, Any]) -> MemoryModel:
    """The adapter's memory model for these options (plain attributes where it has no method)."""
    method = getattr(adapter, "memory_model", None)
    if callable(method):
        return method(options)
    return MemoryModel(float(adapter.model_overhead_mb), float(adapter.per_sample_mb))


def uses_torch(adapter: Any) -> bool:
    """Whether the adapter trains with torch (an adapter that does not say: it does)."""
    return bool(getattr(adapter, "uses_torch", True))


def fusing_pays_on(adapter: Any, device_kind: str) -> bool:
    """Whether `--fuse auto` fuses the adapter's trials on this kind of device ("cpu", "cuda")."""
    return device_kind in tuple(getattr(adapter, "fusing_pays_on", ("cpu", "cuda")))


def train_alone(
    adapter: Any, member: Member, epochs: int, device: Any, options: Mapping[str, Any]
) -> float | BaseException:
    """A fused group's member trained by the adapter's own `train` (a group of one): its value,
    or what ended it, as `train_fused` returns an entry."""
    try:
        return adapter.train(
            member.params,
            epochs=epochs,
            device=device,
            options=options,
            report=member.report,
            checkpoint=member.checkpoint,
        )
    except Exception as error:
        return error


def option_defaults(adapter: Any) -> dict[str, Any]:
    return dict(getattr(adapter, "options", {}) or {})


def parse_options(adapter: Any, raw: Mapping[str, str] | list[str]) -> dict[str, Any]:
    """`KEY=VALUE` strings (or a mapping of strings) to typed options, with the adapter's defaults.

    An unknown key or a value of the wrong type is a UserError that lists what is accepted.
    """
    defaults = option_defaults(adapter)
    pairs: dict[str, str] = {}
    if isinstance(raw, Mapping):
        pairs = {str(k): str(v) for k, v in raw.items()}
    else:
        for item in raw:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise UserError(
                    f"--option {item!r} is not KEY=VALUE: write for example --option trial_seconds=2"
                )
            pairs[key.strip()] = value.strip()
    options = dict(defaults)
    checks = dict(getattr(adapter, "option_ranges", {}) or {})
    for key, text in pairs.items():
        if key not in defaults:
            accepted = ", ".join(sorted(defaults)) or "none"
            raise UserError(
                f"adapter {adapter.name!r} has no option {key!r}; its options are: {accepted}"
            )
        options[key] = _convert(adapter.name, key, text, defaults[key])
        problem = _option_problem(options[key], checks.get(key))
        if problem:
            default = f", default {defaults[key]!r}" if defaults[key] not in ("", None) else ""
            raise UserError(f"--option {key}={text} {problem} (adapter {adapter.name!r}{default})")
    return options


def _option_problem(value: Any, check: OptionCheck | None) -> str | None:
    """Why an option's typed value is refused: NaN and infinity always, else its declared range."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return (check if isinstance(check, Range) else Range()).problem(float(value))
    if isinstance(check, InputFile) and isinstance(value, str):
        return check.problem(value)
    return None


_TYPE_WORDS = {bool: "true or false", int: "whole number", float: "number"}


def _convert(adapter_name: str, key: str, text: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        kind = _TYPE_WORDS.get(type(default), type(default).__name__)
        raise UserError(
            f"option {key}={text!r} of adapter {adapter_name!r} must be a {kind}, "
            f"e.g. --option {key}={default!r}"
        ) from None
    if default is None and text.lower() in ("", "none"):
        return None
    return text


def problems_with(adapter: Any) -> list[str]:
    """What the adapter lacks to meet the protocol (an empty list when it is usable)."""
    missing = [f"attribute {name!r}" for name in REQUIRED_ATTRIBUTES if not hasattr(adapter, name)]
    missing += [
        f"method {name!r}"
        for name in REQUIRED_METHODS
        if not callable(getattr(adapter, name, None))
    ]
    if not missing:
        if getattr(adapter, "workload_class", None) not in ("rl", "supervised"):
            missing.append("workload_class 'rl' or 'supervised'")
        if getattr(adapter, "direction", None) not in ("maximize", "minimize"):
            missing.append("direction 'maximize' or 'minimize'")
    return missing
