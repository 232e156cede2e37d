"""Population-based training keeps its population under faults and on a user's own model.

Real `run` processes, real trial processes, real torch (tests/width_adapter.py: an MLP whose
width is the parameter `width`, checkpointing its `state_dict`):

- without `--pbt-keep`, the first copied member whose width changed cannot load its parent's
  checkpoint ("size mismatch"): `width` is learnt and kept, that segment is re-run with its
  parent's width, every segment ends COMPLETE and the budget is exact;
- with `--pbt-keep width` no copied member ever changes its width;
- a segment's trial process killed with SIGKILL mid-population is re-run as the same segment,
  the population reaches its last epoch with no segment outside it, and `run`, `best` and
  `status` name the same best trial (a budget that is not a multiple of the population).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import optuna
from optuna.trial import TrialState

from orchestrator.record.checkpoints import lineage as names
from orchestrator.record.trials.best import pick_best
from samplers._pbt_repairs import KEEP_PREFIX, SHAPE_REASON
from tests.cli_helpers import run_cli, start_cli

ADAPTER = ("--adapter-path", "tests.width_adapter:adapter")


def _run(url: str, tmp_path, *extra: str, population: int, epochs: int, trials: int):
    return start_cli(
        "run",
        *ADAPTER,
        "--study",
        "pbt",
        "--sampler",
        "pbt",
        "--swarm-size",
        str(population),
        "--epochs",
        str(epochs),
        "--trials",
        str(trials),
        "--seed",
        "3",
        "--gpus",
        "sim:24576",
        "--artifacts",
        str(tmp_path / "artifacts"),
        "--storage",
        url,
        *extra,
    )


def _trials(url: str) -> dict[int, optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="pbt", storage=url)
    return {t.number: t for t in study.trials}


def _reruns_of(trials, number: int) -> list:
    return [t for t in trials.values() if t.system_attrs.get("retry_history", [None])[-1] == number]


def _same_segment(rerun, failed) -> None:
    for key in (names.PBT_MEMBER, names.PBT_GENERATION, names.PBT_PARENT, names.PBT_START_EPOCH):
        assert rerun.user_attrs[key] == failed.user_attrs[key], key
    assert rerun.user_attrs[names.TRAIN_UNTIL_EPOCH] == failed.user_attrs[names.TRAIN_UNTIL_EPOCH]


def _each_re_run_once(found, failed) -> None:
    """Every failed segment was re-run once, as the same segment, and that re-run completed."""
    for t in failed:
        (rerun,) = _reruns_of(found, t.number)
        _same_segment(rerun, t)
        assert rerun.state == TrialState.COMPLETE or rerun in failed


def _no_stretch_twice(complete) -> None:
    """No member went on from its own checkpoint twice (a duplicate of a lost segment would).
    A copy may repeat: a member whose lineage reached the last epoch takes up the best one that
    can still train, which may be one another member copied before."""
    stretches = [
        (t.user_attrs[names.PBT_MEMBER], t.user_attrs[names.PBT_PARENT])
        for t in complete
        if t.user_attrs[names.PBT_PARENT] is not None and not t.user_attrs[names.PBT_EXPLOITED]
    ]
    assert len(stretches) == len(set(stretches)), stretches


def test_a_width_that_cannot_load_is_learnt_kept_and_its_segment_re_run(sqlite_url, tmp_path):
    # Interval 2: four segments a lineage. A bottom member copies only a donor that trained as
    # far as itself, so some interleavings of 12 segments copy no one; 18 go past the lineages'
    # end, where a finished member takes up the best one that can still train (a copy).
    population, epochs, trials = 3, 8, 18
    run = _run(sqlite_url, tmp_path, population=population, epochs=epochs, trials=trials)
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err
    found = _trials(sqlite_url)
    study = optuna.load_study(study_name="pbt", storage=sqlite_url)
    learnt = study._storage.get_study_system_attrs(study._study_id)
    assert KEEP_PREFIX + "width" in learnt, "no copied member changed its width"
    lines = [line for line in (out + err).splitlines() if "kept from now on" in line]
    assert lines and all("width" in line for line in lines), lines
    failed = [t for t in found.values() if t.state == TrialState.FAIL]
    _each_re_run_once(found, failed)  # a process lost on a busy machine is re-run alike
    shape = [t for t in failed if t.user_attrs.get("fail_reason") == SHAPE_REASON]
    assert shape  # the segment whose width changed
    for t in shape:
        assert "size mismatch" in t.user_attrs["error"]
        (rerun,) = _reruns_of(found, t.number)
        parent = found[t.user_attrs[names.PBT_PARENT]]
        assert rerun.params["width"] == parent.params["width"] != t.params["width"]
    complete = [t for t in found.values() if t.state == TrialState.COMPLETE]
    assert len(complete) == trials  # exact: a learnt shape costs the budget nothing
    assert len(found) == trials + len(failed)
    _no_stretch_twice(complete)
    last_failure = max(t.number for t in shape)
    for t in complete:  # once learnt, width is kept
        if t.user_attrs[names.PBT_PARENT] is not None and t.number > last_failure:
            assert t.params["width"] == found[t.user_attrs[names.PBT_PARENT]].params["width"]


def test_pbt_keep_names_parameters_never_perturbed(sqlite_url, tmp_path):
    bad = run_cli(
        "run", *ADAPTER, "--sampler", "pbt", "--pbt-keep", "width,2x", "--storage", sqlite_url
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "--pbt-keep width,2x" in bad.stderr and "Traceback" not in bad.stderr
    alone = run_cli("run", *ADAPTER, "--pbt-keep", "width", "--storage", sqlite_url)
    assert alone.returncode == 2 and "--sampler pbt" in alone.stderr, alone.stderr
    assert len(alone.stderr.strip().splitlines()) == 1
    assert optuna.get_all_study_names(sqlite_url) == []  # nothing stored

    run = _run(sqlite_url, tmp_path, "--pbt-keep", "width", population=3, epochs=4, trials=9)
    _, err = run.communicate(timeout=600)
    assert run.returncode == 0, err
    study = optuna.load_study(study_name="pbt", storage=sqlite_url)
    assert study.user_attrs["orchestrator"]["pbt_keep"] == ["width"]  # `worker` reads it there
    found = {t.number: t for t in study.trials}
    failed = [t for t in found.values() if t.state == TrialState.FAIL]
    assert not [t for t in failed if "size mismatch" in t.user_attrs.get("error", "")]
    _each_re_run_once(found, failed)  # a process lost on a busy machine is re-run alike
    assert sum(t.state == TrialState.COMPLETE for t in found.values()) == 9
    exploited = [t for t in found.values() if t.user_attrs[names.PBT_EXPLOITED]]
    assert exploited
    for t in exploited:
        assert t.params["width"] == found[t.user_attrs[names.PBT_PARENT]].params["width"]


def _killable(url: str):
    """A running segment that continues a parent and has trained an epoch of its own."""
    try:
        trials = _trials(url)
    except Exception:  # the study is being made
        return None
    for t in trials.values():
        start = t.user_attrs.get(names.PBT_START_EPOCH)
        running = t.state == TrialState.RUNNING and isinstance(t.user_attrs.get("pid"), int)
        if running and start and start in t.intermediate_values:
            return t
    return None


def test_a_killed_segment_is_re_run_as_itself_and_every_reader_names_one_best(sqlite_url, tmp_path):
    population, epochs, trials = 3, 6, 10  # interval 2; 10 is not a multiple of 3
    run = _run(
        sqlite_url,
        tmp_path,
        "--option",
        "epoch_seconds=1.5",
        population=population,
        epochs=epochs,
        trials=trials,
    )
    deadline = time.monotonic() + 400
    victim = None
    while victim is None:
        assert time.monotonic() < deadline and run.poll() is None, "no segment to kill"
        time.sleep(0.3)
        victim = _killable(sqlite_url)
    os.kill(victim.user_attrs["pid"], signal.SIGKILL)
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err

    found = _trials(sqlite_url)
    killed = found[victim.number]
    assert killed.state == TrialState.FAIL
    _each_re_run_once(found, [t for t in found.values() if t.state == TrialState.FAIL])
    (rerun,) = _reruns_of(found, killed.number)
    assert rerun.params == killed.params
    # It went on from the killed trial's checkpoint (or its parent's): not from epoch 0.
    assert rerun.user_attrs["resumed_from_epoch"] >= killed.user_attrs[names.PBT_START_EPOCH] - 1
    assert all(names.PBT_MEMBER in t.user_attrs for t in found.values())  # no ghost trials
    complete = [t for t in found.values() if t.state == TrialState.COMPLETE]
    assert len(complete) == trials
    _no_stretch_twice(complete)
    assert max(t.user_attrs[names.TRAIN_UNTIL_EPOCH] for t in complete) == epochs - 1

    # One best: `run`'s outcome, `best`, `status` and the rule over the stored trials.
    named = re.search(r"best trial #(\d+)", out)
    assert named, out
    best = run_cli("best", "--study", "pbt", "--storage", sqlite_url, "--format", "json")
    assert best.returncode == 0, best.stderr
    status = run_cli("status", "--study", "pbt", "--storage", sqlite_url, "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    status_best = shown.get("best") or {}
    expected = pick_best(list(found.values()), ["minimize"])
    assert expected is not None
    assert expected.user_attrs[names.TRAIN_UNTIL_EPOCH] == epochs - 1
    assert int(named.group(1)) == json.loads(best.stdout)["trial"] == expected.number
    assert status_best.get("number") == expected.number, shown
