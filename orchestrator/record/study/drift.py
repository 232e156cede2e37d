"""Settings that drift: what a run asks of a stored study that differs from what it was run with.

A study's trials can be compared only if every one ran under the same settings: epochs, sampler,
seed, swarm, pruner, the objective's direction and metric, and the adapter's options (an
objective's batch-size range among them: its search space). A run that resumes a study, or a
second run that starts on it at the same moment, with any of them changed would make one study
of two; so it is refused with one line naming what differs, unless the user asks for
`--update-settings`, which is recorded with the time and the host (and `status` shows it).

What may change on any resume, because it says how much is run and how, not what a trial means:
the budget (`--trials`) and how much of it re-runs the recommended trial (`--intensify`), how
often a lost or OOM'd trial is re-run (`--max-retries`), where trials are tracked
(`--mlflow-uri`), how often and where trials are checkpointed (`--checkpoint-every`,
`--artifacts`), how many trials one process trains fused (`--fuse`), and the memory model an adapter's options declare (it tells admission how many
trials fit at once, never what a trial computes).

`differences` is pure; `check_stored` and `record_update` read and write the study's attributes.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from orchestrator.errors import UserError

if TYPE_CHECKING:
    import optuna


# Every setting of StudySpec is part of what a trial means unless it is named here: a setting
# added later is guarded from the start.
CHANGEABLE = frozenset(
    {"trials", "max_retries", "mlflow_uri", "checkpoint_every", "artifacts", "intensify", "fuse"}
)
# A sampler or pruner object given to `optimize` is stored pickled, and its pickle holds its
# random state: two equal samplers pickle differently, so the pickles are not compared.
NOT_COMPARED = frozenset({"sampler_pickle", "pruner_pickle"})
ADMISSION_OPTIONS = frozenset({"overhead_mb", "per_sample_mb"})
# The settings only some samplers read, and the samplers that read them: the `settings` of each
# declaration in samplers/_factory.py (record may not import samplers; a test ties them).
SAMPLER_SETTINGS = {"swarm_size": frozenset({"pso"})}
UPDATES_ATTR = "orchestrator_settings_updates"  # a list of {time, host, changes}
NOT_SET = "(not set)"


class Settings(Protocol):
    """What drift compares: a study's settings, `record/study/spec.StudySpec`, named by its
    shape: `spec.save_spec` checks drift here, so this module reads nothing of `spec`."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # a dataclass: each field is a setting
    sampler: str
    options: dict[str, Any]


@dataclass(frozen=True)
class Drift:
    """One setting asked for now that differs from the stored one."""

    setting: str  # as the user types it: "--epochs", "--option trial_seconds"
    stored: Any
    wanted: Any

    def __str__(self) -> str:
        return f"{self.setting} {_shown(self.wanted)} (stored: {_shown(self.stored)})"

    def as_attr(self) -> dict[str, Any]:
        return {"setting": self.setting, "from": self.stored, "to": self.wanted}


def differences(stored: Settings, wanted: Settings) -> list[Drift]:
    """The settings that change what a trial means, where `wanted` differs from `stored`."""
    drifts: list[Drift] = []
    for item in fields(stored):
        name = item.name
        if name in CHANGEABLE or name in NOT_COMPARED or name == "options":
            continue
        readers = SAMPLER_SETTINGS.get(name)
        if readers is not None and not readers & {stored.sampler, wanted.sampler}:
            continue  # a setting neither sampler reads (only the swarm has particles)
        before, after = getattr(stored, name), getattr(wanted, name, None)
        # None asks for nothing (a seed not given keeps the stored one, or QMC's derived one).
        if after is not None and before != after:
            drifts.append(Drift(_flag(name), before, after))
    return drifts + _option_differences(stored.options, wanted.options)


def _option_differences(stored: dict[str, Any], wanted: dict[str, Any]) -> list[Drift]:
    drifts = []
    for key in sorted(set(stored) | set(wanted)):
        if key in ADMISSION_OPTIONS:
            continue
        before, after = stored.get(key, NOT_SET), wanted.get(key, NOT_SET)
        if before != after:
            drifts.append(Drift(f"--option {key}", before, after))
    return drifts


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _shown(value: Any) -> str:
    return NOT_SET if value is None else str(value)


def drift_message(name: str, drifts: list[Drift]) -> str:
    """The one line that refuses a drift: what differs, and the two ways on."""
    said = ", ".join(str(drift) for drift in drifts)
    return (
        f"study {name!r} was run with other settings: {said}; leave them as stored, start a new "
        "study (--study NEW, or another study_name), or change them for the trials still to run "
        "with --update-settings"
    )


def update_entry(drifts: list[Drift], *, host: str, when: dt.datetime) -> dict[str, Any]:
    """What is recorded of one `--update-settings`: when, where, and each setting's change."""
    return {
        "time": when.isoformat(timespec="seconds"),
        "host": host,
        "changes": [drift.as_attr() for drift in drifts],
    }


def check_stored(
    study: optuna.Study, stored: Settings | None, wanted: Settings, *, update_settings: bool
) -> None:
    """Refuse `wanted` if the study already holds (`stored`) other settings that matter, or
    record the update when the user asked for one; a study with no settings yet takes any."""
    if stored is None:
        return
    drifts = differences(stored, wanted)
    if not drifts:
        return
    if not update_settings:
        raise UserError(drift_message(study.study_name, drifts))
    record_update(study, drifts)


def record_update(study: optuna.Study, drifts: list[Drift]) -> None:
    """Append this update to the study's record of them (optuna-dashboard shows it as well)."""
    entry = update_entry(drifts, host=socket.gethostname(), when=dt.datetime.now(dt.UTC))
    earlier = study.user_attrs.get(UPDATES_ATTR)
    updates = list(earlier) if isinstance(earlier, list) else []
    # The JSON round trip keeps the stored values plain (an option may hold a Path or a tuple).
    study.set_user_attr(UPDATES_ATTR, json.loads(json.dumps([*updates, entry], default=str)))


def stored_updates(study: optuna.Study) -> list[dict[str, Any]]:
    """The study's recorded settings updates, oldest first."""
    value = study.user_attrs.get(UPDATES_ATTR)
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, list) else []
