"""Population-based training with its host killed alone, with real processes and real torch.

The `run` process is killed with SIGKILL mid-population while several segments train and save
checkpoints (its trial processes live on until they see their pipe's end), then the same
command runs again. The population must come out as if nothing had happened but the re-runs
the fault forces: every trial is a segment of it (no trial without its PBT attributes), each
killed segment is re-run once as the same segment (`retry_reason` "host gone", not a heartbeat
gone stale) and goes on from its own last checkpoint, no member trains a stretch twice, the
best lineage reaches the last epoch, the budget is exact with no failure counted, and `run`,
`best` and `status` name one best trial. The same on PostgreSQL with a `worker` killed alone while a
`run` goes on.

The model is tests/width_adapter.py (an MLP whose width is a parameter) without `--pbt-keep`:
a copied member whose width changed fails to load and is re-run too (`fail_reason`
`pbt_shape`), so both repairs meet in one population.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from orchestrator.record.checkpoints import lineage as names
from orchestrator.record.study.spec import count_trials
from orchestrator.record.trials.best import pick_best
from samplers._pbt import PLAN_KEY
from samplers._pbt_repairs import SHAPE_REASON
from tests.cli_helpers import run_cli, start_cli
from tests.test_host_death import ENV as HOST_ENV
from tests.test_host_death import GONE_WITHIN_S, TOLERATE, _kill_host_alone, _session
from tests.test_pbt_faults import ADAPTER, _no_stretch_twice, _reruns_of, _same_segment
from tests.waiting import stored_study, wait_for

# Interval 3: four segments a lineage, each 3 epochs of at least 1.5 s, and a budget of one whole
# population. The kill follows at once the read that saw segments saving, well within an epoch.
POPULATION, EPOCHS, TRIALS = 3, 12, 12
# The adapter is `tests.width_adapter`: commands started in another folder find it on the path.
ENV = {**HOST_ENV, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}


def _args(url: str, tmp_path: Path, *extra: str) -> tuple[str, ...]:
    return (
        "run", *ADAPTER, "--study", "pbt", "--sampler", "pbt", "--swarm-size", str(POPULATION),
        "--trials", str(TRIALS), "--epochs", str(EPOCHS), "--seed", "3", "--option",
        "epoch_seconds=1.5", "--artifacts", str(tmp_path / "artifacts"), "--storage", url, *extra,
    )  # fmt: skip


def _kill_alone(host) -> float:
    """`_kill_host_alone`, and whatever of its session outlived it killed after (a failed test
    leaves nothing running)."""
    try:
        return _kill_host_alone(host)
    finally:
        for pid in _session(host.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _saving(url: str, pids: set[int] | None = None) -> list[optuna.trial.FrozenTrial]:
    """Running segments (of processes in `pids`, if given) that saved a checkpoint of their own."""
    trials = stored_study(url, "pbt").get_trials(states=(TrialState.RUNNING,))
    return [
        t
        for t in trials
        if names.PBT_MEMBER in t.user_attrs
        and "checkpoint" in t.user_attrs  # set at a save of its own, never copied from a parent
        and (pids is None or t.user_attrs.get("pid") in pids)
    ]


def _mid_population(saving: list[optuna.trial.FrozenTrial], least: int):
    """`saving` when it has `least` segments, one of them past its lineage's first; else None."""
    if len(saving) >= least and any(t.user_attrs[names.PBT_GENERATION] >= 1 for t in saving):
        return saving
    return None


def _assert_population_kept(url: str, killed: list[optuna.trial.FrozenTrial]) -> None:
    """The population after the host's death and the next command: see the module's docstring.
    `killed`: the trials running when the host died."""
    study = stored_study(url, "pbt")
    found = {t.number: t for t in study.trials}
    count = count_trials(study.trials)
    assert (count.complete, count.failed, count.running, count.waiting) == (TRIALS, 0, 0, 0)
    killed_numbers = {t.number for t in killed}
    for t in (t for t in found.values() if t.state == TrialState.FAIL):
        (rerun,) = _reruns_of(found, t.number)
        assert names.PBT_MEMBER in rerun.user_attrs  # no ghost trials
        reason = rerun.user_attrs["retry_reason"]
        if t.number in killed_numbers:
            assert reason == "host gone", (t.number, reason)  # not found stale later
        else:  # nothing but the host's death and a width learnt made a re-run
            assert reason == SHAPE_REASON == t.user_attrs.get("fail_reason"), (t.number, reason)
        if names.PBT_MEMBER in t.user_attrs:
            _same_segment(rerun, t)
        else:  # stopped while its ask waited for a free member: re-run as a new segment
            assert t.number in killed_numbers and not t.params, t
            assert rerun.state == TrialState.COMPLETE
    assert all(names.PBT_MEMBER in t.user_attrs for t in found.values() if t.state.name != "FAIL")
    for victim in killed:
        stopped = found[victim.number]
        assert stopped.state == TrialState.FAIL, stopped
        if names.PBT_MEMBER in stopped.user_attrs:
            _resumed_as_itself(found, stopped)
    assert any(
        found[t.number].user_attrs.get("checkpoint", {}).get("epoch", 0) >= 1 for t in killed
    )
    complete = [t for t in found.values() if t.state == TrialState.COMPLETE]
    _no_stretch_twice(complete)
    assert {t.user_attrs[names.PBT_MEMBER] for t in complete} == set(range(POPULATION))
    # The best lineage reaches the last epoch (`_assert_one_best`), not each: with more trial
    # processes than members, a member whose lineage ended first may take up another while a
    # member a segment behind (a shape re-run delays one so) has not asked for its last one,
    # and the budget is spent before it does.
    assert any(_ends(t) for t in complete)


def _resumed_as_itself(found, stopped: optuna.trial.FrozenTrial) -> None:
    """A segment stopped by its host's death was re-run with its params, training again only
    what its process had not saved: from its own last checkpoint, else from its parent's (the
    epoch before its first), else from the start. Its log says why in one line."""
    (rerun,) = _reruns_of(found, stopped.number)
    assert rerun.state == TrialState.COMPLETE
    # A segment killed before its process suggested anything has no params yet: its plan's.
    planned = stopped.params or stopped.system_attrs[PLAN_KEY]["params"]
    assert planned is None or rerun.params == planned, (rerun.params, planned)
    own = stopped.user_attrs.get("checkpoint", {}).get("epoch")
    start = stopped.user_attrs[names.PBT_START_EPOCH]
    saved = own if own is not None else (start - 1 if start else None)
    assert own is None or own >= start
    assert rerun.user_attrs.get("resumed_from_epoch") == saved, (saved, rerun.user_attrs)
    log = Path(stopped.user_attrs["log_file"]).read_text()
    assert "Traceback" not in log and log.count("its host process") == 1, log


def _ends(trial: optuna.trial.FrozenTrial) -> bool:
    return trial.user_attrs[names.TRAIN_UNTIL_EPOCH] == EPOCHS - 1


def _assert_one_best(url: str, *outputs: str) -> None:
    """The last lines of each command (`outputs`), `best`, `status` and the rule over the stored
    trials: one trial."""
    named = [re.findall(r"best trial #(\d+)", out) for out in outputs]
    assert all(named), outputs
    best = run_cli("best", "--study", "pbt", "--storage", url, "--format", "json", env=ENV)
    assert best.returncode == 0, best.stderr
    status = run_cli("status", "--study", "pbt", "--storage", url, "--json", env=ENV)
    assert status.returncode == 0, status.stderr
    expected = pick_best(stored_study(url, "pbt").trials, ["minimize"])
    assert expected is not None and _ends(expected)
    assert {int(found[-1]) for found in named} == {json.loads(best.stdout)["trial"]}
    assert json.loads(best.stdout)["trial"] == expected.number
    assert (json.loads(status.stdout).get("best") or {}).get("number") == expected.number


def _stopped_by_the_kill(url: str, before: list[optuna.trial.FrozenTrial]):
    """The trials failed since `before` (read just before the kill) but for a width learnt."""
    ended = {t.number for t in before if t.state.is_finished()}
    return [
        t
        for t in stored_study(url, "pbt").trials
        if t.state == TrialState.FAIL
        and t.number not in ended
        and t.user_attrs.get("fail_reason") != SHAPE_REASON
    ]


# On two GPUs a run starts more trial processes than there are members: the extra ones wait
# for a member to be free before they ask (outside the study's lock; an ask that waited inside
# it once never heard its host was gone, and held the lock for ever). The kill comes while
# segments save and those processes wait: one run stops both kinds of trial process (on one
# GPU every trial process is a segment, a subset of what is stopped here).
def test_a_run_killed_alone_mid_population_leaves_its_segments_to_the_next_run(
    sqlite_url, tmp_path
):
    args = _args(sqlite_url, tmp_path, "--gpus", "sim:24576,sim:24576")
    host = start_cli(*args, env=ENV)

    def saving():
        trials = stored_study(sqlite_url, "pbt").trials
        return _mid_population(_saving(sqlite_url), 2) and trials

    before = wait_for(
        saving,
        "two segments saving, one past its lineage's first",
        timeout=400,
        tolerate=TOLERATE,
    )
    seconds = _kill_alone(host)
    assert seconds < GONE_WITHIN_S, f"the trial processes outlived their host by {seconds:.1f} s"
    killed = _stopped_by_the_kill(sqlite_url, before)
    assert killed  # and none left RUNNING, to be found stale later:
    assert not stored_study(sqlite_url, "pbt").get_trials(states=(TrialState.RUNNING,))

    again = run_cli(*args, timeout=600, env=ENV)
    assert again.returncode == 0, again.stderr
    # Nothing counted as failed; the killed segments (and any width learnt) said as re-run.
    done = re.search(
        rf"{TRIALS}/{TRIALS} trials done \({TRIALS} complete, 0 pruned, 0 failed; (\d+) failed and "
        r"re-run\)",
        again.stdout,
    )
    assert done and int(done[1]) >= len(killed), again.stdout
    _assert_population_kept(sqlite_url, killed)
    _assert_one_best(sqlite_url, again.stdout)


@pytest.mark.postgres
def test_a_worker_killed_alone_mid_population_leaves_its_segments_to_the_study(
    postgres_url, tmp_path
):
    # In tmp_path: a study on a database server keeps its trials' logs in the working folder.
    first = start_cli(
        *_args(postgres_url, tmp_path, "--gpus", "sim:24576", "--concurrency", "1"),
        cwd=tmp_path,
        env=ENV,
    )
    wait_for(lambda: stored_study(postgres_url, "pbt"), "the study", tolerate=TOLERATE)
    worker = (
        "worker", "--study", "pbt", "--storage", postgres_url, "--gpus", "sim:81920",
        "--concurrency", "2",
    )  # fmt: skip
    doomed = start_cli(*worker, cwd=tmp_path, env=ENV)

    def worker_saving():
        before = stored_study(postgres_url, "pbt").trials  # first: the kill follows `saving`
        saving = _mid_population(_saving(postgres_url, set(_session(doomed.pid))), 1)
        return saving and (saving, before)

    saving, before = wait_for(
        worker_saving, "a worker's segment saving past its lineage's first", timeout=400
    )
    seconds = _kill_alone(doomed)
    assert seconds < GONE_WITHIN_S, f"the trial processes outlived their host by {seconds:.1f} s"
    killed = _stopped_by_the_kill(postgres_url, before)
    assert {t.number for t in saving} <= {t.number for t in killed}

    again = run_cli(*worker, cwd=tmp_path, timeout=600, env=ENV)
    out, err = first.communicate(timeout=600)
    assert again.returncode == 0, again.stderr
    assert first.returncode == 0, err
    _assert_population_kept(postgres_url, killed)
    _assert_one_best(postgres_url, out, again.stdout)
