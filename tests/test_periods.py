"""Train, validation and test parts of a price series, and walk-forward folds over them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.envs.periods import MAX_FOLDS, trading_periods
from orchestrator.errors import UserError


def test_three_parts_in_time_order():
    periods = trading_periods(10_000)
    (fold,) = periods.folds
    assert (fold.train.start, fold.train.end) == (0, 6_000)
    assert (fold.validation.start, fold.validation.end) == (6_000, 8_000)
    assert (periods.test.start, periods.test.end) == (8_000, 10_000)
    assert (periods.before_test.start, periods.before_test.end) == (0, 8_000)


@given(length=st.integers(200, 20_000), folds=st.integers(1, MAX_FOLDS))
def test_folds_walk_forward_and_never_reach_the_test(length, folds):
    try:
        periods = trading_periods(length, folds, window=32)
    except UserError:
        return  # too short for this many folds: said in one line
    assert len(periods.folds) == folds
    previous_end = None
    for fold in periods.folds:
        assert fold.train.start == 0 and fold.train.end == fold.validation.start
        assert fold.validation.length >= 16
        if previous_end is not None:
            assert fold.validation.start == previous_end  # consecutive windows
        previous_end = fold.validation.end
    assert previous_end == periods.test.start  # the test part follows, untouched
    assert periods.test.end == length


def test_too_many_folds_for_a_short_series_says_what_to_do():
    with pytest.raises(UserError, match="use fewer folds or a longer series"):
        trading_periods(200, 5)
    with pytest.raises(UserError, match="from 1 to 10"):
        trading_periods(10_000, 0)
