"""How the views write values for a person or a script: UTC times, MB, plurals, JSON-ready values."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import asdict, is_dataclass
from typing import Any


def to_utc(moment: dt.datetime | None) -> dt.datetime | None:
    """Optuna stamps trials in local time; our rows are naive UTC. Bring both to naive UTC."""
    if moment is None:
        return None
    return moment.astimezone(dt.UTC).replace(tzinfo=None)


def to_jsonable(value: Any) -> Any:
    """Dataclasses, datetimes and NaN-free floats in a shape json.dumps takes."""
    if is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def mb_text(value: float | None) -> str:
    """MB as a person reads them in a table: '1,638', or '-' when unknown."""
    return "-" if value is None else f"{value:,.0f}"


def plural(n: int, one: str, many: str | None = None) -> str:
    """'1 epoch', '15 epochs'; `many` for words that do not just take an s."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
