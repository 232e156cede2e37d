"""Which prices a trading agent trains on, is selected on, and is finally tested on.

A price series is cut in time order into three parts:

    [ train ............ | validation | test ]
      the first 60%        the next 20%  the last 20%

A trial trains on the training part and is scored on the validation part: that score is what
the study optimises and selects on. The test part is never seen by any trial; it scores only
the trial the study selected (and `best --confirm`), so its figure is not biased upward by the
selection. Choosing the best of many noisy trials on the part it is then quoted on would be.

Walk-forward folds (`--option folds=K`) cut the validation part into K consecutive windows;
fold k trains on everything before its window and is scored on the window, and the trial's
value is the mean over folds. The test part stays last and untouched whatever K is. With K=1
this is the plain three-way split.

Only plain integers here: no numpy, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import UserError

TEST_FRACTION = 0.2
VALIDATION_FRACTION = 0.2
MAX_FOLDS = 10
# A scored window needs enough decisions for its Sharpe ratio to mean something.
MIN_SCORED_PRICES = 16


@dataclass(frozen=True)
class Period:
    """Prices [start, end) of the series, in index order."""

    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Fold:
    """One walk-forward step: train on `train`, score on `validation`, which follows it."""

    train: Period
    validation: Period


@dataclass(frozen=True)
class Periods:
    folds: tuple[Fold, ...]
    test: Period

    @property
    def before_test(self) -> Period:
        """Everything a final model may learn from: the training and validation parts."""
        return Period(0, self.test.start)


def trading_periods(length: int, folds: int = 1, *, window: int = 0) -> Periods:
    """The folds and the test period of a series of `length` prices.

    `window` is the number of past returns an observation needs: the first training part must
    leave room for it. A UserError says what to change when the series is too short for `folds`.
    """
    if not 1 <= folds <= MAX_FOLDS:
        raise UserError(f"--option folds={folds} must be from 1 to {MAX_FOLDS}")
    test_start = length - int(length * TEST_FRACTION)
    validation_start = test_start - int(length * VALIDATION_FRACTION)
    block = (test_start - validation_start) // folds
    if block < MIN_SCORED_PRICES or length - test_start < MIN_SCORED_PRICES:
        raise UserError(
            f"{length} prices are too few for {folds} fold(s): each validation window needs "
            f"{MIN_SCORED_PRICES} prices; use fewer folds or a longer series"
        )
    if validation_start < window + 2:
        raise UserError(f"{length} prices leave too little to train on: give a longer series")
    starts = [validation_start + k * block for k in range(folds)]
    ends = [*starts[1:], test_start]  # the last window takes what the division left over
    cut = tuple(
        Fold(train=Period(0, start), validation=Period(start, end))
        for start, end in zip(starts, ends, strict=True)
    )
    return Periods(folds=cut, test=Period(test_start, length))
