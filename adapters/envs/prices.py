"""Price series for the trading environment: a seeded synthetic generator, or a user's CSV.

The synthetic generator switches between three regimes, each lasting a random number of steps:

- trend: log returns with a constant drift (up or down, drawn per segment) plus noise;
- mean reversion: an Ornstein-Uhlenbeck log price pulled back towards its level at the start
  of the segment, so successive returns are negatively correlated;
- volatility burst: no drift, three times the usual noise.

`regime="mixed"` (the default) draws the regime of every segment at random; naming one regime
makes every segment that regime (the learning checks use `"trend"`). The same seed always gives
the same series. Only numpy is used, so the series is identical on every device.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import TYPE_CHECKING

from adapters.envs.price_dates import date_column, in_date_order, moment
from orchestrator.errors import UserError
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import numpy as np
else:
    np = LazyImport("numpy")

REGIMES = ("trend", "mean_reversion", "volatile")
REGIME_CHOICES = ("mixed", *REGIMES)

BASE_VOLATILITY = 0.01  # per-step standard deviation of log returns (about 16% a year, daily)
TREND_DRIFT = 0.003  # per-step drift of a trend segment, in log return
REVERSION_SPEED = 0.15  # fraction of the distance to the anchor recovered per step
BURST_VOLATILITY = 3.0 * BASE_VOLATILITY
SEGMENT_STEPS = (100, 400)  # a regime lasts between these many steps
START_PRICE = 100.0
# Enough for a training part and a held-out part that each span several observation windows.
MIN_CSV_PRICES = 200


def synthetic_prices(length: int = 10_000, *, seed: int = 0, regime: str = "mixed") -> np.ndarray:
    """`length` close prices (float64, all positive) from the regime-switching generator."""
    if regime not in REGIME_CHOICES:
        raise UserError(f"regime {regime!r} is unknown: use one of {', '.join(REGIME_CHOICES)}")
    if length < 2:
        raise UserError(f"a price series needs at least 2 prices, not {length}")
    rng = np.random.default_rng(seed)
    log_price = np.empty(length)
    log_price[0] = math.log(START_PRICE)
    t = 1
    while t < length:
        steps = min(int(rng.integers(SEGMENT_STEPS[0], SEGMENT_STEPS[1] + 1)), length - t)
        kind = REGIMES[int(rng.integers(len(REGIMES)))] if regime == "mixed" else regime
        noise = rng.standard_normal(steps)
        if kind == "trend":
            drift = TREND_DRIFT * (1.0 if rng.random() < 0.5 else -1.0)
            log_price[t : t + steps] = log_price[t - 1] + np.cumsum(drift + BASE_VOLATILITY * noise)
        elif kind == "mean_reversion":
            anchor = log_price[t - 1]
            level = anchor
            for i in range(steps):  # an AR(1) recursion: each step depends on the previous one
                level = level + REVERSION_SPEED * (anchor - level) + BASE_VOLATILITY * noise[i]
                log_price[t + i] = level
        else:
            log_price[t : t + steps] = log_price[t - 1] + np.cumsum(BURST_VOLATILITY * noise)
        t += steps
    return np.exp(log_price)


def load_prices(path: str | Path) -> np.ndarray:
    """The `close` column of a CSV file as float64 prices, in date order when the file has a
    date column (`adapters.envs.price_dates`: sorted, repeated dates refused), else file order.

    Any problem is a UserError naming the file and what is wrong with it: a missing file, no
    header or no `close` column, a value that is not a number, a price that is not positive,
    a date that is not one or appears twice, or fewer than `MIN_CSV_PRICES` rows.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"price file {path} does not exist: give a CSV with a `close` column")
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            values, moments, column = _read_rows(csv.DictReader(handle), path)
    except UnicodeDecodeError:
        raise UserError(f"price file {path} is not a UTF-8 text CSV") from None
    except csv.Error as error:
        raise UserError(f"price file {path} is not a valid CSV: {error}") from None
    if len(values) < MIN_CSV_PRICES:
        raise UserError(
            f"price file {path} has {len(values)} prices; at least {MIN_CSV_PRICES} are needed "
            "to train on one part and score on a later part"
        )
    if column is not None:
        values = in_date_order(values, moments, path=path, column=column)
    return np.asarray(values, dtype=np.float64)


def _read_rows(
    reader: csv.DictReader[str], path: Path
) -> tuple[list[float], list[tuple[int, float, str]], str | None]:
    """Each row's close price and, when the header has a date column, its (line, moment, text);
    and that column's name."""
    columns = [name.strip().lower() for name in (reader.fieldnames or [])]
    if "close" not in columns:
        found = ", ".join(columns) if columns else "no header"
        raise UserError(f"price file {path} has no `close` column (found: {found})")
    key = (reader.fieldnames or [])[columns.index("close")]
    column = date_column(columns)
    date_key = None if column is None else (reader.fieldnames or [])[columns.index(column)]
    values: list[float] = []
    moments: list[tuple[int, float, str]] = []
    for row_number, row in enumerate(reader, start=2):
        text = (row.get(key) or "").strip()
        try:
            value = float(text)
        except ValueError:
            raise UserError(
                f"price file {path}, line {row_number}: close {text!r} is not a number"
            ) from None
        if not math.isfinite(value) or value <= 0.0:
            raise UserError(
                f"price file {path}, line {row_number}: close {text!r} must be a positive price"
            )
        values.append(value)
        if date_key is not None and column is not None:
            when = row.get(date_key) or ""
            moments.append(
                (row_number, moment(when, path=path, line=row_number, column=column), when)
            )
    return values, moments, column
