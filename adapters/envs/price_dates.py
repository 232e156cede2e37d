"""A price file's rows in time order: sorted by its date column, with no date twice.

The held-out part of a series ("the part no trial saw") is its last part, so it is later in time
only if the rows are in date order. A CSV whose header names a date column (`date`, `datetime`,
`timestamp` or `time`, any case) is sorted by it, with one line saying so when its rows were not
in order; a date that appears twice is refused, naming both lines, since two prices for one
moment make the returns between them meaningless. A file without a date column is taken in file
order, as it always was. Dates are ISO 8601 (`2024-01-31`, `2024-01-31T09:30:00+00:00`) or plain
numbers (seconds since the epoch, a day count), as spreadsheets and exchanges export them.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.errors import UserError

logger = logging.getLogger(__name__)

DATE_COLUMNS = ("date", "datetime", "timestamp", "time")  # the first one a header has is used
_said: set[str] = (
    set()
)  # files whose sorting this process said already (a line, not a line a trial)


def date_column(columns: list[str]) -> str | None:
    """The date column among a header's (lower-cased, stripped) names, or None."""
    return next((name for name in DATE_COLUMNS if name in columns), None)


def moment(text: str, *, path: Path, line: int, column: str) -> float:
    """A date cell as a number that sorts as time does; a UserError naming the line if it is
    none of the forms the module's doc lists."""
    text = text.strip()
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(number):
            return number
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(
            f"price file {path}, line {line}: {column} {text!r} is not a date: give ISO dates "
            f"such as 2024-01-31, or remove the {column} column to keep the file's order"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # naive dates compare among themselves
    return when.timestamp()


def in_date_order(
    values: list[float], moments: list[tuple[int, float, str]], *, path: Path, column: str
) -> list[float]:
    """`values` (one per row) in date order; `moments` is (line, moment, text) per row. Refuses
    a repeated date; says in one line when the order changed."""
    order = sorted(range(len(values)), key=lambda i: moments[i][1])
    for before, after in zip(order, order[1:], strict=False):
        if moments[before][1] == moments[after][1]:
            first, second = sorted((moments[before][0], moments[after][0]))
            raise UserError(
                f"price file {path}: {column} {moments[after][2].strip()!r} appears twice "
                f"(lines {first} and {second}): give one close price per {column}"
            )
    if order == list(range(len(values))):
        return values
    if str(path) not in _said:
        _said.add(str(path))
        logger.warning(
            "price file %s: its rows are not in %s order; they are sorted by %s, so the held-out "
            "part is the latest",
            path,
            column,
            column,
        )
    return [values[i] for i in order]
