"""PBTSampler over a real Optuna study: segments, lineages, claims shared through the storage.

Training is a small known process here (a value that falls faster with a larger learning rate),
with its "checkpoint" kept per trial, so a test can check that every segment continued the
state of the trial it names. The real trial runner, its checkpoints and two worker processes on
PostgreSQL are tested in tests/test_pbt_study.py.
"""

from __future__ import annotations

import threading
import time

import optuna
import pytest

from orchestrator.record.checkpoints import lineage as names
from orchestrator.record.checkpoints.lineage import lineage_of, schedule
from samplers import PBTSampler, make_sampler
from samplers._pbt import PLAN_KEY
from samplers._pbt_rules import claims_read

optuna.logging.set_verbosity(optuna.logging.WARNING)


def train_segment(trial: optuna.Trial, saved: dict[int, tuple[int, float]], lock=None) -> float:
    """One segment: load the parent's (epoch, w), train to `train_until_epoch`, save."""
    lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
    trial.suggest_categorical("width", [16, 32, 64])
    attrs = trial.user_attrs
    parent = attrs.get(names.CHECKPOINT_FROM)
    epoch, w = saved[parent] if parent is not None else (0, 0.0)
    assert epoch == attrs[names.PBT_START_EPOCH]
    while epoch <= attrs[names.TRAIN_UNTIL_EPOCH]:  # counted from 0
        epoch += 1
        w += (1.0 - w) * min(lr, 0.5)
    saved[trial.number] = (epoch, w)
    return 1.0 - w


def check_lineages(study: optuna.Study, interval: int, epochs: int) -> None:
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    for t in trials.values():
        a = t.user_attrs
        parent = a[names.PBT_PARENT]
        if parent is None:
            assert a[names.PBT_GENERATION] == 0 and a[names.PBT_START_EPOCH] == 0
            assert names.CHECKPOINT_FROM not in a
        else:
            p = trials[parent].user_attrs
            assert a[names.CHECKPOINT_FROM] == parent
            assert a[names.PBT_GENERATION] == p[names.PBT_GENERATION] + 1
            assert a[names.PBT_START_EPOCH] == p[names.TRAIN_UNTIL_EPOCH] + 1
            if not a[names.PBT_EXPLOITED]:
                assert t.params == trials[parent].params
                assert a[names.PBT_MEMBER] == p[names.PBT_MEMBER]
        assert a[names.TRAIN_UNTIL_EPOCH] + 1 == min(a[names.PBT_START_EPOCH] + interval, epochs)


def test_a_population_trains_in_segments_and_the_bottom_copies_the_top():
    sampler = PBTSampler(population=4, interval=2, epochs=8, seed=1)
    study = optuna.create_study(sampler=sampler)
    saved: dict[int, tuple[int, float]] = {}
    for _ in range(16):  # four lineages of four segments
        trial = study.ask()
        study.tell(trial, train_segment(trial, saved))
    check_lineages(study, 2, 8)
    trials = study.get_trials()
    assert sum(t.user_attrs[names.PBT_EXPLOITED] for t in trials) >= 2
    assert sorted({t.user_attrs[names.PBT_MEMBER] for t in trials}) == [0, 1, 2, 3]
    best = study.best_trial
    lineage = lineage_of(best, {t.number: t for t in trials})
    rows = schedule(lineage)
    assert (
        rows[0]["from"] == 0 and rows[-1]["until"] == best.user_attrs[names.TRAIN_UNTIL_EPOCH] + 1
    )
    assert all(a["until"] == b["from"] for a, b in zip(rows, rows[1:], strict=False))
    assert lineage[-1].number == best.number


def test_a_failed_segment_is_replaced_from_the_members_last_checkpoint():
    study = optuna.create_study(sampler=PBTSampler(population=2, interval=2, epochs=6, seed=3))
    saved: dict[int, tuple[int, float]] = {}
    for _ in range(2):
        trial = study.ask()
        study.tell(trial, train_segment(trial, saved))
    failed = study.ask()
    train_segment(failed, saved)
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    again = study.ask()
    assert again.user_attrs[names.PBT_MEMBER] == failed.user_attrs[names.PBT_MEMBER]
    assert again.user_attrs[names.PBT_START_EPOCH] == failed.user_attrs[names.PBT_START_EPOCH]


def test_workers_asking_at_once_never_train_one_member_twice():
    """Four threads, a population of three: asks wait for a free member, and no two running
    segments share one."""
    study = optuna.create_study(
        sampler=PBTSampler(population=3, interval=1, epochs=4, seed=5, wait_seconds=0.01)
    )
    saved: dict[int, tuple[int, float]] = {}
    running: dict[int, int] = {}
    guard = threading.Lock()
    overlaps: list[int] = []
    budget = iter(range(18))

    def worker() -> None:
        while next(budget, None) is not None:
            trial = study.ask()
            member = trial.user_attrs[names.PBT_MEMBER]
            with guard:
                if member in running:
                    overlaps.append(member)
                running[member] = trial.number
            time.sleep(0.005)
            value = train_segment(trial, saved)
            with guard:
                running.pop(member, None)
            study.tell(trial, value)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert overlaps == []
    assert len(study.trials) == 18
    check_lineages(study, 1, 4)


def test_a_rival_that_moved_to_the_member_since_it_was_read_is_seen():
    """The race check compares (trial, member) pairs: ask A read trial B holding member 1; B then
    lost member 1 to a race and claimed member 2, the one A is claiming. Comparing trial numbers
    only, A took B for a claim it had read and kept member 2 as B did: two trials on one member."""
    sampler = PBTSampler(population=3, interval=1, epochs=4, seed=5)
    study = optuna.create_study(sampler=sampler)
    a, b = study.ask(), study.ask()  # two members claimed, one free
    (free,) = {0, 1, 2} - {a.user_attrs[names.PBT_MEMBER], b.user_attrs[names.PBT_MEMBER]}
    known = claims_read(sampler._segments(study, exclude=a.number))  # A's read, before its claim
    storage = study._storage
    plan = dict(storage.get_trial(b._trial_id).system_attrs[PLAN_KEY], member=free)
    storage.set_trial_system_attr(b._trial_id, PLAN_KEY, plan)  # B now claims the free member
    assert sampler._contested(study, a.number, free, known)
    assert not sampler._contested(study, a.number, a.user_attrs[names.PBT_MEMBER], known)


def test_an_ask_can_start_while_a_member_is_free_or_a_re_run_is_queued():
    """A trial process waits before it asks while every member trains (`can_start_now`); a
    queued re-run is asked first and runs as its own segment, so it never waits."""
    sampler = PBTSampler(population=2, interval=1, epochs=4, seed=5)
    study = optuna.create_study(sampler=sampler)
    first = study.ask()
    assert sampler.can_start_now(study)  # one member still free
    second = study.ask()
    assert not sampler.can_start_now(study)  # both train
    study.enqueue_trial(second.params)  # a trial queued while both train, as a re-run is
    assert sampler.can_start_now(study)
    study.tell(first, 0.5)


def test_made_by_name_with_the_population_from_the_swarm_size():
    sampler = make_sampler("pbt", seed=0, swarm_size=6, bounds={"batch_size": (8, 32)})
    assert sampler.sampler.population == 6
    with pytest.raises(ValueError, match="one objective"):
        make_sampler("pbt", seed=0, n_objectives=2)
    with pytest.raises(ValueError, match="population"):
        PBTSampler(population=1)


def test_best_gives_the_winning_lineage_and_the_report_draws_the_population():
    from orchestrator.record.trials.best import best_lineage
    from orchestrator.show.report.lineage import lineage_section

    study = optuna.create_study(sampler=PBTSampler(population=3, interval=2, epochs=6, seed=2))
    saved: dict[int, tuple[int, float]] = {}
    for _ in range(9):
        trial = study.ask()
        study.tell(trial, train_segment(trial, saved))
    trials = study.get_trials()
    best = study.best_trial
    found = best_lineage(trials, best.number)
    assert found is not None and found["trials"][-1] == best.number
    assert found["trials"][0] in {
        t.number for t in trials if t.user_attrs[names.PBT_PARENT] is None
    }
    assert found["schedule"][-1]["until"] == 6
    html_lines = "\n".join(lineage_section(trials, found))
    assert html_lines.count("<title>trial ") == 9
    assert "The best lineage" in html_lines
    plain = optuna.create_study()
    plain.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert best_lineage(plain.trials, plain.best_trial.number) is None
    assert lineage_section(plain.trials, None) == []


def test_run_refuses_pbt_for_an_adapter_without_checkpoints(tmp_path, capsys):
    from orchestrator.cli import main

    url = f"sqlite:///{tmp_path / 'study.db'}"
    argv = ["run", "--adapter-path", "tests.noisy_adapter:adapter", "--sampler", "pbt"]
    assert main([*argv, "--storage", url, "--gpus", "sim:24576"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoints its training" in err[0]
