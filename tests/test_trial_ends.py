"""What each end of an objective becomes (pure, no process): NaN, inf, sys.exit, the trial's
timeout, an error of its own; the clock of --trial-timeout; the spool's entries on disk."""

from __future__ import annotations

import time

import pytest
from optuna.trial import TrialState

from orchestrator.record.spool import spool
from orchestrator.record.store.storage_failures import StorageUnreachable
from orchestrator.run.messages import Recycling, TrialOutcome
from orchestrator.run.trial.clock import TimedOut, time_limit
from orchestrator.run.trial.errors import fail_with, settle
from orchestrator.run.trial.result import RunResult
from orchestrator.run.trial.worker import recycle_reason


def _fresh() -> RunResult:
    return RunResult(TrialState.FAIL)


def test_nan_fails_and_inf_completes():
    nan, inf = _fresh(), _fresh()
    settle(nan, float("nan"), 0)
    settle(inf, float("-inf"), 1)
    assert nan.state == TrialState.FAIL and nan.fail_reason == "nan" and nan.value is None
    assert inf.state == TrialState.COMPLETE and inf.value == float("-inf")


@pytest.mark.parametrize(
    ("error", "reason", "says"),
    [
        (SystemExit(3), "exit", "the objective called sys.exit(3)"),
        (TimedOut("ran past --trial-timeout 2 s"), "timeout", "timeout: ran past"),
        (ValueError("bad"), None, "ValueError: bad"),
    ],
)
def test_each_error_is_an_outcome(error, reason, says):
    result = _fresh()
    assert fail_with(result, error, 0)
    assert result.fail_reason == reason and says in result.error
    assert result.timed_out == (reason == "timeout")


def test_what_is_not_the_trials_to_catch_is_raised_again():
    assert not fail_with(_fresh(), KeyboardInterrupt(), 0)
    # The database away past the bound mid-trial: not a failure of the trial, which stays
    # RUNNING for the next start to re-run (a FAIL kept and stored later spent a budget slot).
    away = StorageUnreachable(
        6, where="PostgreSQL at db:5432", what="report", detail="refused", resume="run it again"
    )
    result = _fresh()
    assert not fail_with(result, away, 0)
    assert result.error is None and result.fail_reason is None and not result.interrupted


def test_the_clock_cuts_a_sleep_short_and_is_gone_after():
    started = time.monotonic()
    with pytest.raises(TimedOut), time_limit(0.2):
        time.sleep(30)
    assert time.monotonic() - started < 10
    with time_limit(None):
        time.sleep(0.01)  # no limit: nothing rings


def test_a_trial_that_timed_out_makes_way_for_a_fresh_process():
    outcome = TrialOutcome(1, "FAIL", timed_out=True)
    reason = recycle_reason(Recycling(), outcome, trials_done=1, resident_mb=None, baseline_mb=None)
    assert reason == "trial timed out"


def test_a_kept_outcome_reads_back_whole_and_goes_when_done(tmp_path):
    folder = spool.spool_dir(tmp_path, "my study")
    kept = spool.Kept(7, 3, "COMPLETE", [0.25], {"oom": False}, [(0, 0.5), (1, 0.25)])
    spool.keep(folder, kept)
    (folder / "trial-id-9.partial").write_text("{")  # a write cut short: never read
    assert spool.kept_in(folder) == [kept]
    spool.done(folder, 7)
    assert spool.kept_in(folder) == []


def test_delivery_tells_a_running_trial_and_drops_what_is_not_this_studys(sqlite_url, tmp_path):
    import optuna

    study = optuna.create_study(study_name="s", storage=sqlite_url)
    running, finished = study.ask(), study.ask()
    study.tell(finished, 1.0)
    folder = spool.spool_dir(tmp_path, "s")
    spool.keep(
        folder, spool.Kept(running._trial_id, 0, "COMPLETE", [0.5], {"oom": False}, [(0, 2.0)])
    )
    spool.keep(folder, spool.Kept(finished._trial_id, 1, "FAIL", None))  # finished meanwhile
    spool.keep(folder, spool.Kept(999, 5, "COMPLETE", [0.1]))  # another database's trial
    assert spool.deliver(study, folder) == 1
    zero, one = study.trials
    assert zero.state == TrialState.COMPLETE and zero.value == 0.5
    assert zero.intermediate_values == {0: 2.0} and zero.user_attrs == {"oom": False}
    assert one.state == TrialState.COMPLETE and one.value == 1.0  # its own end is kept
    assert spool.kept_in(folder) == []
