"""One spool entry: a finished trial's outcome as it is kept on disk, and how a file is judged.

An entry is JSON: the trial's id and number, its state, values, attributes and reports, and the
sha256 of all of them as canonical JSON. `parse` takes a file's text back to a `Kept` only when
every part is sound: readable JSON with exactly an entry's fields, the checksum matching, a state
a trial process keeps, values a COMPLETE trial needs, reports as (epoch, value) pairs, and the
trial id its file name gives. Anything else is `Rejected` with why, in words, so a file that was
edited, cut short or never was ours is set aside instead of stored (`orchestrator.record.spool.spool`).
The checksum finds an edit or a damaged disk; the folder being the user's only (0700, files
0600) is what keeps others out.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CHECKSUM = "sha256"
STATES = ("COMPLETE", "PRUNED", "FAIL")  # the ends a trial process keeps (not re-queued ones)


@dataclass(frozen=True)
class Kept:
    """One trial's outcome as it is told to the study: all plain JSON values."""

    trial_id: int
    number: int
    state: str  # COMPLETE, PRUNED or FAIL
    values: list[float] | None
    user_attrs: dict[str, Any] = field(default_factory=dict)
    reports: list[tuple[int, float]] = field(default_factory=list)  # (epoch, value), in order


class Rejected(ValueError):
    """A spool file that is not an entry this tool wrote, or was changed since: why, in words."""


def entry_path(folder: Path, trial_id: int) -> Path:
    """Where the entry of the trial with database id `trial_id` lies in `folder`."""
    return folder / f"trial-id-{trial_id}.json"


def checksum(content: dict[str, Any]) -> str:
    """The sha256 of an entry's content as canonical JSON (sorted keys, no spaces): the same
    content gives the same text, whatever order or spacing a file holds it in."""
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def entry_text(kept: Kept) -> str:
    """What `keep` writes: the entry's content and its checksum."""
    content = json.loads(json.dumps(asdict(kept)))  # tuples as the lists a reader sees
    return json.dumps({**content, CHECKSUM: checksum(content)})


def parse(text: str, path: Path) -> Kept:
    """The entry a spool file holds; `Rejected` saying why when it is not a sound one."""
    try:
        raw = json.loads(text)
    except ValueError as error:
        raise Rejected(f"is not readable JSON ({error})") from None
    if not isinstance(raw, dict):
        raise Rejected("is not a kept trial outcome (not a JSON object)")
    content = {key: value for key, value in raw.items() if key != CHECKSUM}
    if set(content) != {f.name for f in Kept.__dataclass_fields__.values()}:
        raise Rejected("is not a kept trial outcome (its fields are not an entry's)")
    if raw.get(CHECKSUM) != checksum(content):
        raise Rejected("does not match its checksum (changed or cut short since it was written)")
    kept = Kept(**{**content, "reports": _reports(content["reports"])})
    if kept.state not in STATES:
        raise Rejected(f"holds an unknown state {kept.state!r} (one of {', '.join(STATES)})")
    if not (_whole(kept.trial_id) and _whole(kept.number)) or path != entry_path(
        path.parent, kept.trial_id
    ):
        raise Rejected("names a trial other than its file name's")
    if kept.state == "COMPLETE" and not (
        isinstance(kept.values, list) and kept.values and all(map(_number, kept.values))
    ):
        raise Rejected("holds a COMPLETE trial without its values")
    if not isinstance(kept.user_attrs, dict):
        raise Rejected("holds attributes that are not a JSON object")
    return kept


def _reports(raw: Any) -> list[tuple[int, float]]:
    if not isinstance(raw, list) or not all(
        isinstance(pair, list) and len(pair) == 2 and _whole(pair[0]) and _number(pair[1])
        for pair in raw
    ):
        raise Rejected("holds reports that are not (epoch, value) pairs")
    return [(int(epoch), float(value)) for epoch, value in raw]


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    # inf is a value Optuna stores; NaN never reaches a COMPLETE entry (it fails the trial).
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and not (isinstance(value, float) and math.isnan(value))
    )
