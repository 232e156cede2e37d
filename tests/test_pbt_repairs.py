"""PBTSampler under faults, over a real Optuna study: a re-queued segment is the same segment,
a parameter that changes the model's shape is learnt and kept, `keep` is honoured, and every
reader of "the best" applies one rule. Real torch makes the loading error.

The trial runner, trial processes killed with SIGKILL and the CLI are in tests/test_pbt_faults.py.
"""

from __future__ import annotations

import optuna
import pytest
import torch

from orchestrator.record.checkpoints import lineage as names
from orchestrator.record.trials.best import best_of_study, pick_best
from orchestrator.record.trials.retry import requeue
from samplers import PBTSampler
from samplers._pbt_repairs import KEEP_PREFIX, SHAPE_REASON, culprits, learnt_keep
from tests.test_pbt_sampler import check_lineages, train_segment

optuna.logging.set_verbosity(optuna.logging.WARNING)

WIDTHS = [16, 32, 64]


def _load_error(saved_width: int, width: int) -> str:
    """What the trial runner stores when a model of `width` loads a `saved_width` checkpoint."""
    try:
        torch.nn.Linear(4, width).load_state_dict(torch.nn.Linear(4, saved_width).state_dict())
    except RuntimeError as error:
        return f"RuntimeError: {error}"[:500]
    raise AssertionError("the shapes loaded")


def _source(study, trial, saved) -> int | None:
    """The trial whose state `trial` goes on from, as the checkpoint handle finds it: its
    `checkpoint_from`, and back along theirs past trials that saved nothing (a re-run's)."""
    source = trial.user_attrs.get(names.CHECKPOINT_FROM)
    while source is not None and source not in saved:
        source = study.trials[source].user_attrs.get(names.CHECKPOINT_FROM)
    return source


def _train(study, trial, saved) -> float:
    """One segment, as tests/test_pbt_sampler.train_segment, from the handle's source."""
    lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
    trial.suggest_categorical("width", WIDTHS)
    source = _source(study, trial, saved)
    epoch, w = saved[source] if source is not None else (0, 0.0)
    assert epoch == trial.user_attrs[names.PBT_START_EPOCH]
    while epoch <= trial.user_attrs[names.TRAIN_UNTIL_EPOCH]:
        epoch += 1
        w += (1.0 - w) * min(lr, 0.5)
    saved[trial.number] = (epoch, w)
    return 1.0 - w


def _shaped_segment(study, trial, saved, widths) -> None:
    """A segment whose model is `width` wide: loading a parent of another width fails, as
    torch's `load_state_dict` does, and the sampler hears of it at the tell."""
    width = trial.suggest_categorical("width", WIDTHS)
    source = _source(study, trial, saved)
    if source is not None and widths[source] != width:
        trial.set_user_attr("error", _load_error(widths[source], width))
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return
    widths[trial.number] = width
    study.tell(trial, _train(study, trial, saved))


def test_a_requeued_segment_is_the_same_segment_and_its_member_waits_for_it():
    sampler = PBTSampler(population=3, interval=2, epochs=6, seed=4)
    study = optuna.create_study(sampler=sampler)
    saved: dict[int, tuple[int, float]] = {}
    for _ in range(4):
        trial = study.ask()
        study.tell(trial, train_segment(trial, saved))
    lost = study.ask()  # its process dies mid-segment: failed, re-queued as the heartbeat does
    lost.suggest_float("lr", 1e-4, 1.0, log=True)
    lost.suggest_categorical("width", WIDTHS)
    study.tell(lost, state=optuna.trial.TrialState.FAIL)
    frozen = study.trials[lost.number]
    assert requeue(study, frozen, max_retries=2, reason="lost")
    # While the re-run waits, its member is busy: no other ask plans that member's segment.
    busy = sampler._segments(study, exclude=-1)
    assert any(s.member == lost.user_attrs[names.PBT_MEMBER] and s.state == "running" for s in busy)
    rerun = study.ask()  # the queued re-run comes first
    assert rerun.number != lost.number
    for key in (names.PBT_MEMBER, names.PBT_GENERATION, names.PBT_PARENT, names.PBT_START_EPOCH):
        assert rerun.user_attrs[key] == lost.user_attrs[key], key
    assert rerun.user_attrs[names.TRAIN_UNTIL_EPOCH] == lost.user_attrs[names.TRAIN_UNTIL_EPOCH]
    assert rerun.user_attrs[names.CHECKPOINT_FROM] == lost.number  # its checkpoint, then parent's
    study.tell(rerun, _train(study, rerun, saved))
    assert study.trials[rerun.number].params == frozen.params
    for _ in range(4):
        trial = study.ask()
        study.tell(trial, train_segment(trial, saved))
    members = [t.user_attrs[names.PBT_MEMBER] for t in study.trials]
    assert members.count(lost.user_attrs[names.PBT_MEMBER]) <= 4  # its segment ran once more


def test_a_re_run_of_a_trial_lost_before_it_was_planned_is_a_segment_of_the_population():
    # A trial whose process was lost while its ask waited for a free member (killed, or its
    # host gone) had no plan and no params yet: its re-run is planned as any new segment, not
    # run as a trial outside the population (no member, params drawn for nothing).
    sampler = PBTSampler(population=2, interval=2, epochs=4, seed=4)
    study = optuna.create_study(sampler=sampler)
    saved: dict[int, tuple[int, float]] = {}
    for _ in range(2):
        trial = study.ask()
        study.tell(trial, train_segment(trial, saved))
    storage = study._storage
    unplanned = storage.create_new_trial(study._study_id)  # its ask, before the sampler's plan
    storage.set_trial_state_values(unplanned, optuna.trial.TrialState.FAIL)
    assert requeue(study, storage.get_trial(unplanned), max_retries=2, reason="lost")
    rerun = study.ask()
    assert study.trials[rerun.number].system_attrs["retry_history"] == [2]
    assert rerun.user_attrs[names.PBT_GENERATION] == 1, rerun.user_attrs
    study.tell(rerun, train_segment(rerun, saved))
    trial = study.ask()
    study.tell(trial, train_segment(trial, saved))
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(t.user_attrs[names.PBT_MEMBER] for t in done) == [0, 0, 1, 1]
    assert all(t.user_attrs[names.TRAIN_UNTIL_EPOCH] == 3 for t in done[2:])


def test_a_width_that_cannot_load_is_learnt_kept_and_the_segment_re_run():
    sampler = PBTSampler(population=4, interval=1, epochs=6, seed=11, wait_seconds=0.01)
    study = optuna.create_study(sampler=sampler)
    saved: dict[int, tuple[int, float]] = {}
    widths: dict[int, int] = {}
    budget = 24
    while True:
        done = [t for t in study.trials if t.state.is_finished()]
        retried = {
            t.system_attrs["retry_history"][-1]
            for t in study.trials
            if t.system_attrs.get("retry_history")
        }
        if len([t for t in done if t.number not in retried]) >= budget:
            break
        _shaped_segment(study, study.ask(), saved, widths)
    learnt = learnt_keep(study._storage.get_study_system_attrs(study._study_id))
    assert learnt == {"width"}
    record = study._storage.get_study_system_attrs(study._study_id)[KEEP_PREFIX + "width"]
    failed = study.trials[record["trial"]]
    assert failed.user_attrs["fail_reason"] == SHAPE_REASON
    assert failed.state == optuna.trial.TrialState.FAIL
    reruns = [
        t for t in study.trials if t.system_attrs.get("retry_history", [None])[-1] == failed.number
    ]
    assert len(reruns) == 1
    rerun = reruns[0]
    parent = study.trials[failed.user_attrs[names.PBT_PARENT]]
    assert rerun.params["width"] == parent.params["width"] == record["from"]
    assert rerun.user_attrs[names.PBT_MEMBER] == failed.user_attrs[names.PBT_MEMBER]
    assert rerun.state == optuna.trial.TrialState.COMPLETE
    # From then on no copied member changes its width: only that one segment ever failed.
    assert [t.number for t in study.trials if t.state == optuna.trial.TrialState.FAIL] == [
        failed.number
    ]
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == budget
    for t in complete:
        if t.user_attrs[names.PBT_PARENT] is not None and t.number > failed.number:
            assert t.params["width"] == study.trials[t.user_attrs[names.PBT_PARENT]].params["width"]


def test_keep_is_honoured():
    study = optuna.create_study(
        sampler=PBTSampler(population=4, interval=1, epochs=5, seed=2, keep=["width"])
    )
    saved: dict[int, tuple[int, float]] = {}
    for _ in range(20):
        trial = study.ask()
        study.tell(trial, train_segment(trial, saved))
    check_lineages(study, 1, 5)
    trials = study.trials
    exploited = [t for t in trials if t.user_attrs[names.PBT_EXPLOITED]]
    assert len(exploited) >= 3
    for t in exploited:
        parent = trials[t.user_attrs[names.PBT_PARENT]]
        assert t.params["width"] == parent.params["width"]
    assert any(
        t.params["lr"] != trials[t.user_attrs[names.PBT_PARENT]].params["lr"] for t in exploited
    )
    with pytest.raises(ValueError, match="parameter names"):
        PBTSampler(keep="width")


def test_culprits_are_read_from_the_shapes_in_the_error():
    dists = {
        "width": optuna.distributions.IntDistribution(8, 128),
        "hidden": optuna.distributions.IntDistribution(8, 128),
        "lr": optuna.distributions.FloatDistribution(1e-4, 1.0, log=True),
    }
    error = _load_error(16, 32)
    parent = {"width": 16, "hidden": 40, "lr": 0.01}
    child = {"width": 32, "hidden": 48, "lr": 0.02}
    assert culprits(error, child, parent, dists, set()) == ["width"]
    # Shapes that name no parameter: the whole numbers that changed, never a float.
    assert culprits(error, {**child, "width": 16}, parent, dists, set()) == ["hidden"]
    assert culprits("ValueError: bad", child, parent, dists, set()) == []
    assert culprits(error, parent, parent, dists, set()) == []


def test_a_width_learnt_from_a_sibling_meanwhile_is_still_the_culprit():
    # Two copied members of one parent, planned before either failed, fail to load it at the
    # same moment (seen with two GPUs): the first one's failure keeps width. The second's is
    # width's too, not that of the other param that changed (a float), which would be kept for
    # nothing while its re-run failed to load again and counted against the budget.
    dists = {
        "width": optuna.distributions.IntDistribution(4, 64, log=True),
        "lr": optuna.distributions.FloatDistribution(1e-3, 0.3, log=True),
    }
    parent = {"width": 7, "lr": 0.078}
    child = {"width": 6, "lr": 0.093}
    assert culprits(_load_error(7, 6), child, parent, dists, {"width"}) == ["width"]
    assert culprits("RuntimeError: size mismatch", child, parent, dists, {"width"}) == ["width"]


def test_every_reader_of_the_best_takes_the_lineages_trained_furthest():
    """A budget that is not a whole number of runs of the population: a short lineage has the
    better value, and is not the best."""
    study = optuna.create_study(sampler=PBTSampler(population=3, interval=2, epochs=6, seed=8))
    saved: dict[int, tuple[int, float]] = {}
    for _ in range(7):
        trial = study.ask()
        study.tell(trial, train_segment(trial, saved))
    trials = study.trials
    furthest = max(t.user_attrs[names.TRAIN_UNTIL_EPOCH] for t in trials)
    # The best value anywhere: a segment short of the furthest epoch, made the best by hand.
    short = next(t for t in trials if t.user_attrs[names.TRAIN_UNTIL_EPOCH] < furthest)
    low = min(t.value for t in trials) - 1.0
    study.add_trial(
        optuna.trial.create_trial(
            params=short.params,
            distributions=short.distributions,
            value=low,
            user_attrs=short.user_attrs,
        )
    )
    picked = pick_best(study.trials, ["minimize"])
    assert picked is not None and picked.user_attrs[names.TRAIN_UNTIL_EPOCH] == furthest
    assert best_of_study(study).number == picked.number
