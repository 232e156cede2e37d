"""`--fuse N` with real processes: trials of one shape trained as one fused model by one trial
process (docs/fused.md), each still a trial of its own in the study.

The synthetic adapter's `train_fused` trains its members one epoch at a time together; its
`fuse_key` is the activation, so every member of a group has its first member's.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import re
import signal
import types
from collections import defaultdict
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import orchestrator
from adapters.study_adapter import resolve_adapter
from adapters.synthetic import synthetic_value
from orchestrator.launch import fused_members
from orchestrator.record.study.spec import StudySpec, load_spec
from orchestrator.run.pool.placement import CPU_AUTO_MEMBERS
from tests.api_objective import objective
from tests.cli_helpers import run_cli, start_cli
from tests.waiting import stored_study, wait_for

QUICK = ("--option", "trial_seconds=0.6", "--pruner", "none", "--sampler", "random")


def _groups(study: optuna.Study) -> dict[int, list[optuna.trial.FrozenTrial]]:
    """The trials of each trial process, by its pid."""
    groups: dict[int, list[optuna.trial.FrozenTrial]] = defaultdict(list)
    for trial in study.trials:
        groups[trial.user_attrs["pid"]].append(trial)
    return groups


def _assert_fused(group: list[optuna.trial.FrozenTrial], shape=("activation",)) -> None:
    """One group: each member names the others, and all share the first's `shape` params."""
    numbers = {t.number for t in group}
    for trial in group:
        assert set(trial.user_attrs.get("fused_with", [])) == numbers - {trial.number}, (
            trial.user_attrs
        )
    for name in shape:
        assert len({t.params[name] for t in group}) == 1, [t.params for t in group]


def test_eight_trials_run_fused_four_at_a_time_within_the_budget(storage_url):
    """On SQLite and on PostgreSQL: each claim is a single ask's, under the budget lock."""
    done = run_cli(
        "run", "synthetic", "--fuse", "4", "--trials", "8", "--epochs", "3", *QUICK,
        "--gpus", "sim:24576", "--storage", storage_url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    study = stored_study(storage_url, "synthetic")
    assert len(study.trials) == 8  # the budget exact: no trial claimed past it
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    for trial in study.trials:
        assert "fused_with" in trial.user_attrs
        assert trial.value == pytest.approx(synthetic_value(trial.params))
        assert sorted(trial.intermediate_values) == [0, 1, 2]  # its own report, every epoch
        assert trial.user_attrs["vram_peak_mb"] > 0  # its share of the group's
    groups = _groups(study)
    assert all(len(group) <= 4 for group in groups.values())
    assert max(len(group) for group in groups.values()) > 1, groups
    for group in groups.values():
        _assert_fused(group)
    assert load_spec(study).fuse == 4  # stored: a worker joining the study reads it


def test_fuse_auto_takes_the_trials_each_gpu_packs_into_one_process(sqlite_url):
    """--fuse auto on a simulated GPU whose plan packs 3 trials by their bytes: groups of up to
    3, stored as auto, so a resume or another worker chooses again for its own GPUs."""
    done = run_cli(
        "run", "synthetic", "--fuse", "auto", "--trials", "6", "--epochs", "2", *QUICK,
        "--gpus", "sim:8000", "--option", "overhead_mb=2000", "--storage", sqlite_url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    packs = int(re.search(r"at most (\d+) at once", done.stderr)[1])
    assert f"--fuse auto: up to {packs} trials per process on sim:0 " in done.stderr, done.stderr
    study = stored_study(sqlite_url, "synthetic")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 6
    sizes = sorted(1 + len(t.user_attrs.get("fused_with", [])) for t in study.trials)
    assert 1 < max(sizes) <= packs, (sizes, packs)
    assert load_spec(study).fuse == "auto"


def test_a_group_pays_what_a_process_pays_once_once(sqlite_url):
    """Trials of 2,000 MB alone, 1,500 of them the process's own (context_mb): a simulated GPU of
    6,400 MB usable runs 3 such processes, but one process trains all 6 trials of the study
    (1,500 + 6 x 500 = 4,500 MB held in the ledger), none out of memory, and the members'
    planned shares add up to the group's."""
    done = run_cli(
        "run", "synthetic", "--fuse", "auto", "--trials", "6", "--epochs", "2", *QUICK,
        "--gpus", "sim:8000", "--option", "overhead_mb=2000", "--option", "per_sample_mb=0",
        "--option", "context_mb=1500", "--storage", sqlite_url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "at most 3 at once" in done.stderr, done.stderr
    assert "--fuse auto: up to 6 trials per process on sim:0 " in done.stderr, done.stderr
    study = stored_study(sqlite_url, "synthetic")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 6
    assert not any(t.user_attrs.get("oom") for t in study.trials)
    (group,) = _groups(study).values()
    _assert_fused(group)
    planned = sum(t.user_attrs["vram_planned_mb"] for t in group)
    assert planned == pytest.approx(4500.0, rel=0.01), [t.user_attrs for t in group]


def test_a_group_that_would_not_fit_is_cut_before_it_starts(sqlite_url):
    """--fuse 6 of trials of 2,000 MB on a simulated GPU of 6,400 MB usable: a group of 6 would
    wait for the GPU to empty and then run out of memory; the pool starts groups of at most 3
    (said once), and no trial runs out of memory."""
    done = run_cli(
        "run", "synthetic", "--fuse", "6", "--trials", "6", "--epochs", "2", *QUICK,
        "--gpus", "sim:8000", "--option", "overhead_mb=2000", "--option", "per_sample_mb=0",
        "--storage", sqlite_url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = "a fused group of 6 would not fit in 6,400 MB usable by its estimate: groups here take 3"
    assert done.stderr.count(line) == 1, done.stderr
    study = stored_study(sqlite_url, "synthetic")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 6
    assert not any(t.user_attrs.get("oom") for t in study.trials)
    groups = list(_groups(study).values())
    assert all(len(group) <= 3 for group in groups), groups
    assert max(len(group) for group in groups) >= 2  # still fused
    for group in groups:
        if len(group) > 1:
            _assert_fused(group)


def test_fuse_auto_fuses_only_where_the_adapter_says_fusing_pays(caplog):
    """tft's fused groups measured slower than its trials one after another on a CPU: auto
    leaves them unfused there (and says so), as it fuses DQN's on the same CPU."""
    caplog.set_level(logging.INFO, logger="orchestrator.launch")
    cpu = types.SimpleNamespace(device=None, slots=2)
    spec = StudySpec("tft", trials=8, epochs=2, direction="minimize")
    assert fused_members(resolve_adapter(spec), spec, "auto", [cpu]) == 1
    assert "one trial per process on cpu (fusing does not pay there)" in caplog.text
    dqn = StudySpec("dqn", trials=8, epochs=2, direction="maximize")
    assert fused_members(resolve_adapter(dqn), dqn, "auto", [cpu]) == CPU_AUTO_MEMBERS
    assert fused_members(resolve_adapter(spec), spec, 4, [cpu]) == 4  # asked: fused anyway


def test_without_a_gpu_the_groups_share_the_budget_over_the_cores(sqlite_url):
    """8 DQN trials, --fuse 8, no GPU: a group per core the plan gives (two here), each with its
    share of the budget, not one group of 8 on one core while the others idle."""
    done = run_cli(
        "run", "dqn", "--env", "CartPole-v1", "--fuse", "8", "--trials", "8", "--epochs", "1",
        "--option", "steps_per_epoch=300", "--gpus", "none", "--seed", "1",
        "--storage", sqlite_url, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    slots = _cpu_slots(done.stderr)
    study = stored_study(sqlite_url, "dqn")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 8
    sizes = sorted(len(group) for group in _groups(study).values())
    share = math.ceil(8 / slots)
    assert max(sizes) <= share and len(sizes) == math.ceil(8 / share), (slots, sizes)
    for group in _groups(study).values():
        _assert_fused(group, shape=("hidden_size", "batch_size"))
        assert len({t.params["learning_rate"] for t in group}) == len(group)  # the rest drawn
    for trial in study.trials:  # each member's epoch and value in its own log, as a trial's
        lines = Path(trial.user_attrs["log_file"]).read_text().splitlines()
        assert f"step 0: return {trial.intermediate_values[0]:.6g}" in "\n".join(lines), lines
        assert any(line.startswith(f"value: return {trial.value:.6g}, ") for line in lines), lines
        assert not any(line.startswith("member ") for line in lines), lines


def _cpu_slots(stderr: str) -> int:
    """How many trials at once the host's plan gives its CPU, as its first line says."""
    found = re.search(r"no GPU \(CPU only\): (?:up to )?(\d+) trials? at", stderr)
    assert found, stderr
    return int(found[1])


def test_a_pruned_member_leaves_its_group_while_the_others_complete(tmp_path):
    # Four members of one activation, the first at the optimum: successive halving keeps only
    # the best third at its first rung, so the other three are pruned there.
    queue = tmp_path / "queue.yaml"
    queue.write_text(
        "- {x: 1.0, y: -2.0, learning_rate: 0.001, batch_size: 512, activation: gelu}\n"
        "- {x: 3.0, y: -2.0, learning_rate: 0.001, batch_size: 512, activation: gelu}\n"
        "- {x: 1.0, y: 2.0, learning_rate: 0.001, batch_size: 512, activation: gelu}\n"
        "- {x: -4.0, y: 0.0, learning_rate: 0.001, batch_size: 512, activation: gelu}\n"
    )
    url = f"sqlite:///{tmp_path / 'study.db'}"
    done = run_cli(
        "run", "synthetic", "--fuse", "4", "--trials", "4", "--epochs", "6", "--enqueue",
        str(queue), "--option", "trial_seconds=1.2", "--pruner", "halving", "--gpus", "none",
        "--storage", url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    study = stored_study(url, "synthetic")
    (group,) = _groups(study).values()  # one process trained all four
    _assert_fused(group)
    best, *others = sorted(study.trials, key=lambda t: t.number)
    assert best.state == TrialState.COMPLETE and best.value == pytest.approx(0.0)
    assert sorted(best.intermediate_values) == list(range(6))
    epoch = datetime.timedelta(seconds=1.2 / 6)
    for trial in others:
        assert trial.state == TrialState.PRUNED, trial
        assert len(trial.intermediate_values) < 6  # it left; the best trained on
        # Told PRUNED at its rung, not with the group: the best slept through 3 epochs more.
        assert trial.datetime_complete <= best.datetime_complete - 3 * epoch, (trial, best)
        log = Path(trial.user_attrs["log_file"]).read_text()
        assert f"trial {trial.number}: PRUNED" in log, log


def test_a_population_trains_fused_each_segment_from_its_parent(tmp_path):
    """PBT with --fuse 4: a process claims only members that are free (it never waits for one it
    holds), each segment trains from its parent's checkpoint to its own last epoch inside its
    group and completes with that epoch's value, and no member trains in two groups at once."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    done = run_cli(
        "run", "synthetic", "--sampler", "pbt", "--swarm-size", "4", "--fuse", "4", "--trials",
        "12", "--epochs", "6", "--option", "trial_seconds=1.2", "--gpus", "sim:24576",
        "--artifacts", str(tmp_path / "artifacts"), "--storage", url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    trials = stored_study(url, "synthetic").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 12
    # Some process held several members at once: fused where they shared the activation (the
    # synthetic shape, which a population's members draw apart), each alone beside the others
    # where they did not.
    logs = [Path(t.user_attrs["log_file"]).read_text() for t in trials]
    assert any(" trains fused with " in log or ", beside trials " in log for log in logs)
    by_number = {t.number: t for t in trials}
    for trial in trials:
        attrs = trial.user_attrs
        until = attrs["train_until_epoch"]
        assert trial.value == trial.intermediate_values[until]  # its last epoch's value
        parent = attrs["pbt_parent"]
        if parent is not None:
            assert attrs["pbt_start_epoch"] == by_number[parent].user_attrs["train_until_epoch"] + 1
            assert attrs["resumed_from_epoch"] == attrs["pbt_start_epoch"] - 1
        group = [by_number[n] for n in attrs.get("fused_with", [])]
        members = [attrs["pbt_member"], *(t.user_attrs["pbt_member"] for t in group)]
        assert len(set(members)) == len(members), members  # a member once in a group
    for one in trials:  # and never in two groups at once (a trial trains from its admission)
        for other in trials:
            same = one.user_attrs["pbt_member"] == other.user_attrs["pbt_member"]
            if same and one.number != other.number:
                first, then = sorted((one, other), key=lambda t: t.user_attrs["admitted_at"])
                started = datetime.datetime.fromisoformat(then.user_attrs["admitted_at"])
                assert first.datetime_complete <= started.astimezone().replace(tzinfo=None), (
                    one,
                    other,
                )


def test_fuse_1_is_a_process_per_trial_and_a_resume_may_fuse(sqlite_url):
    first = run_cli(
        "run", "synthetic", "--fuse", "1", "--trials", "2", "--epochs", "2", *QUICK,
        "--concurrency", "1", "--gpus", "none", "--storage", sqlite_url,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    study = stored_study(sqlite_url, "synthetic")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    assert not any("fused_with" in t.user_attrs for t in study.trials)
    assert load_spec(study).fuse == 1
    # How trials run, not what they mean: a resume changes it without --update-settings.
    again = run_cli(
        "run", "synthetic", "--fuse", "2", "--trials", "4", *QUICK, "--gpus", "none",
        "--storage", sqlite_url,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    study = stored_study(sqlite_url, "synthetic")
    assert len(study.trials) == 4 and load_spec(study).fuse == 2
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    assert all("fused_with" in t.user_attrs for t in study.trials[2:])


def test_an_objective_without_train_fused_runs_unfused_and_says_so_once(sqlite_url, caplog):
    """`optimize(..., fuse=4)` takes the host's setting as `run` does (as text too, as
    `--fuse` and a config file take it); a plain objective has no `train_fused`, so its trials
    run a process each, with one line saying why."""
    caplog.set_level(logging.WARNING, logger="orchestrator")
    study = orchestrator.optimize(
        objective, n_trials=2, storage=sqlite_url, gpus="none", epochs=2, pruner="none", fuse=" 4"
    )
    said = [r.getMessage() for r in caplog.records if "--fuse 4" in r.getMessage()]
    assert len(said) == 1 and "has no train_fused" in said[0], said
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    assert not any("fused_with" in t.user_attrs for t in study.trials)
    assert load_spec(study).fuse == 4  # stored with the study, as `run --fuse` stores it


def test_a_killed_group_process_leaves_its_members_re_run_to_completion(sqlite_url):
    runner = start_cli(
        "run", "synthetic", "--fuse", "4", "--trials", "4", "--epochs", "6", "--option",
        "trial_seconds=6", "--pruner", "none", "--sampler", "random", "--gpus", "sim:24576",
        "--storage", sqlite_url,
    )  # fmt: skip

    def group_saved():
        trials = stored_study(sqlite_url, "synthetic").trials
        saved = [t.user_attrs.get("checkpoint", {}).get("epoch", -1) for t in trials]
        return trials if len(trials) == 4 and min(saved) >= 1 else None

    tolerate = (KeyError, IndexError, optuna.exceptions.StorageInternalError)
    group = wait_for(
        group_saved, "a group with two checkpoints each", timeout=120, tolerate=tolerate
    )
    (pid,) = {t.user_attrs["pid"] for t in group}  # one process holds the whole group
    os.kill(pid, signal.SIGKILL)
    _, stderr = runner.communicate(timeout=240)
    assert runner.returncode == 0, stderr
    study = stored_study(sqlite_url, "synthetic")
    killed = [t for t in study.trials if t.number < 4]
    assert all(t.state == TrialState.FAIL for t in killed), [t.state for t in killed]
    reruns = [t for t in study.trials if t.number >= 4]
    assert sorted(t.user_attrs["retry_of"] for t in reruns) == [0, 1, 2, 3]
    assert all(t.state == TrialState.COMPLETE for t in reruns), [t.state for t in reruns]
    for rerun in reruns:  # each from its own checkpoint, its curve whole
        assert rerun.user_attrs["resumed_from_epoch"] >= 1
        assert sorted(rerun.intermediate_values) == list(range(6))


def test_a_group_that_runs_out_of_memory_is_split_in_halves(sqlite_url):
    """Four members really need 3x their estimate: the group of four runs out of memory on a
    simulated 8 GB GPU; each member is re-run once, in a group of two (which fits), and the
    GPU's groups stay at most two."""
    done = run_cli(
        "run", "synthetic", "--fuse", "4", "--trials", "4", "--epochs", "2", "--option",
        "trial_seconds=0.6", "--option", "overhead_mb=1000", "--option", "per_sample_mb=0",
        "--pruner", "none", "--sampler", "random", "--gpus", "sim:8000",
        "--sim-memory-scale", "3", "--storage", sqlite_url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "a fused group of 4 ran out of memory" in done.stderr, done.stderr
    # The progress line and the result count the same thing: trials that ran out of memory.
    assert "4 OOMs, 4 retries" in done.stderr and "4 out-of-memory" in done.stdout, done
    study = stored_study(sqlite_url, "synthetic")
    first = [t for t in study.trials if t.number < 4]
    assert all(t.state == TrialState.FAIL and t.user_attrs["oom"] for t in first), first
    assert len(_groups(study)[first[0].user_attrs["pid"]]) == 4  # one group of four
    reruns = [t for t in study.trials if t.number >= 4]
    assert sorted(t.user_attrs["retry_of"] for t in reruns) == [0, 1, 2, 3]  # each once
    assert all(t.state == TrialState.COMPLETE for t in reruns), [t.state for t in reruns]
    by_number = {t.number: t for t in reruns}
    halves = {tuple(sorted([t.number, *t.user_attrs.get("fused_with", [])])) for t in reruns}
    # Two groups of two: the pool starts none of the members while the first group's process
    # is still re-queuing them (it started one alone under load: groups of 1, 1 and 2).
    assert sorted(n for half in halves for n in half) == sorted(by_number), halves
    assert sorted(len(half) for half in halves) == [2, 2], halves
    for half in halves:
        _assert_fused([by_number[n] for n in half])
        assert all(by_number[n].system_attrs["fuse_at_most"] == 2 for n in half)


def test_a_stopped_group_re_queues_every_member(sqlite_url):
    """SIGTERM past --grace stops the group's one training call: each member is failed and
    queued again, as a single trial stopped mid-training is."""
    runner = start_cli(
        "run", "synthetic", "--fuse", "3", "--trials", "3", "--epochs", "10", "--option",
        "trial_seconds=30", "--pruner", "none", "--sampler", "random", "--grace", "0",
        "--gpus", "sim:24576", "--storage", sqlite_url,
    )  # fmt: skip

    def group_training():
        trials = stored_study(sqlite_url, "synthetic").trials
        return len(trials) == 3 and all(t.intermediate_values for t in trials)

    tolerate = (KeyError, IndexError, optuna.exceptions.StorageInternalError)
    try:
        wait_for(group_training, "a group of three training", timeout=120, tolerate=tolerate)
        runner.send_signal(signal.SIGTERM)
        _, stderr = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
    assert runner.returncode == 143, stderr
    study = stored_study(sqlite_url, "synthetic")
    stopped = [t for t in study.trials if t.number < 3]
    assert all(t.state == TrialState.FAIL for t in stopped), [t.state for t in stopped]
    queued = [t for t in study.trials if t.state == TrialState.WAITING]
    assert sorted(t.user_attrs["retry_of"] for t in queued) == [0, 1, 2]


def test_a_member_of_another_shape_trains_alone_and_says_so_in_its_own_log(sqlite_url, tmp_path):
    """Three queued trials claimed by one process, two of one activation (the synthetic shape)
    and one of another: the two train fused and name each other, the third trains alone after
    them, as a single trial: no `fused_with`, its log saying whom it sat beside."""
    import yaml

    sets = [{"activation": a, "batch_size": 64} for a in ("relu", "relu", "tanh")]
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(sets))
    logs = tmp_path / "logs"
    done = run_cli(
        "run", "synthetic", "--fuse", "4", "--trials", "3", "--epochs", "2", *QUICK,
        "--concurrency", "1", "--gpus", "none", "--enqueue", str(path), "--log-dir", str(logs),
        "--storage", sqlite_url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    trials = stored_study(sqlite_url, "synthetic").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert len({t.user_attrs["pid"] for t in trials}) == 1  # one process claimed all three
    relu = [t.number for t in trials if t.params["activation"] == "relu"]
    (tanh,) = (t for t in trials if t.params["activation"] == "tanh")
    for trial in trials:
        others = [n for n in relu if n != trial.number] if trial.number in relu else None
        assert trial.user_attrs.get("fused_with") == others, trial.user_attrs
    alone = next(logs.rglob(f"trial-{tanh.number}.log")).read_text()
    pid = tanh.user_attrs["pid"]
    assert f"trial {tanh.number}: trains alone in process {pid}, beside trials {relu}" in alone
    assert "trains fused with" not in alone and f"trial {tanh.number}: COMPLETE" in alone


def test_re_runs_queued_in_mixed_shapes_are_claimed_by_groups_of_one_shape(sqlite_url):
    """Re-runs come back in the order their groups ended, shapes interleaved (relu, tanh, relu,
    tanh): a group trains the shape of its first re-run and leaves the others queued for a group
    of their own, so each shape trains fused, in a process of its own, not as two halves of one."""
    from optuna.trial import create_trial

    from orchestrator.record.trials.retry import requeue

    first = run_cli(
        "run", "synthetic", "--fuse", "4", "--trials", "1", "--epochs", "2", *QUICK,
        "--gpus", "none", "--storage", sqlite_url,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    study = stored_study(sqlite_url, "synthetic")
    done = study.trials[0]
    for activation in ("relu", "tanh", "relu", "tanh"):
        params = dict(done.params, activation=activation)
        study.add_trial(
            create_trial(state=TrialState.FAIL, params=params, distributions=done.distributions)
        )
        requeue(study, study.trials[-1], max_retries=None, reason="interrupted")
    again = run_cli(
        "run", "synthetic", "--fuse", "4", "--trials", "5", "--epochs", "2", *QUICK,
        "--concurrency", "1", "--gpus", "none", "--storage", sqlite_url,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    trials = stored_study(sqlite_url, "synthetic").trials
    reruns = [t for t in trials if t.system_attrs.get("retry_history")]
    assert [t.state for t in reruns] == [TrialState.COMPLETE] * 4
    by_shape = defaultdict(list)
    for trial in reruns:
        by_shape[trial.params["activation"]].append(trial)
    for group in by_shape.values():
        _assert_fused(group)

    def admitted(trial: optuna.trial.FrozenTrial) -> datetime.datetime:
        at = datetime.datetime.fromisoformat(trial.user_attrs["admitted_at"])
        return at.astimezone().replace(tzinfo=None)  # as Optuna's datetime_complete, local

    # Two groups one after the other, not one group of two halves admitted at once.
    earlier, later = sorted(by_shape.values(), key=lambda g: min(map(admitted, g)))
    assert max(t.datetime_complete for t in earlier) <= min(map(admitted, later)), by_shape


def test_a_re_run_without_the_shape_s_parameters_has_its_shape_drawn():
    """A re-run of a trial lost before it had parameters brings none: its shape is still to
    draw, so it neither sets a group's shape nor is queued again for one."""
    import types as pytypes

    from orchestrator.run.trial.group_seats import rerun_key

    def trial(fixed: dict, history: list[int]) -> object:
        frozen = pytypes.SimpleNamespace(system_attrs={"retry_history": history})
        return pytypes.SimpleNamespace(_fixed_params=fixed, _cached_frozen_trial=frozen)

    adapter = resolve_adapter(
        StudySpec(adapter="synthetic", trials=1, epochs=1, direction="minimize")
    )
    assert rerun_key(adapter, trial({"activation": "tanh", "x": 1.0}, [3])) == "tanh"
    assert rerun_key(adapter, trial({}, [3])) is None  # lost before it drew
    assert rerun_key(adapter, trial({"x": 1.0}, [3])) is None  # enqueued without its shape
    assert rerun_key(adapter, trial({"activation": "tanh"}, [])) is None  # enqueued, not a re-run
