"""Population-based training end to end: two workers on PostgreSQL share one population.

Real processes (`run` and `worker`, each with its own simulated GPU), the synthetic adapter
checkpointing through Optuna's artifact store, an exact budget of one full run (4 members x 3
segments). Every segment that has a parent must really go on from that parent's checkpoint.
"""

from __future__ import annotations

import json
import time

import optuna
import pytest
from optuna.trial import TrialState

from orchestrator.cli import main
from orchestrator.record.checkpoints import lineage as names
from tests.cli_helpers import run_cli, start_cli
from tests.waiting import stored_study, wait_for

pytestmark = pytest.mark.postgres

POPULATION, EPOCHS, SEGMENTS = 4, 6, 3  # interval: a quarter of 6 epochs, rounded up, is 2


def _study(url: str) -> optuna.Study:
    return stored_study(url, "pbt")


def _running(url: str) -> int:
    return sum(t.state == TrialState.RUNNING for t in _study(url).trials)


def _wait_until(predicate, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def test_two_workers_train_one_population_on_postgres_exactly(postgres_url, tmp_path, capsys):
    # The run takes one trial at a time, and its first segment ends only once the worker has
    # claimed one of its own, so both train however slowly a busy machine starts the worker.
    release = tmp_path / "release"
    common = ("--storage", postgres_url)
    first = start_cli(
        "run",
        "--adapter-path",
        "tests.gated_adapter:adapter",
        "--study",
        "pbt",
        "--sampler",
        "pbt",
        "--swarm-size",
        str(POPULATION),
        "--trials",
        str(POPULATION * SEGMENTS),
        "--epochs",
        str(EPOCHS),
        "--artifacts",
        str(tmp_path / "artifacts"),
        "--option",
        "trial_seconds=1.5",
        "--option",
        f"release={release}",
        "--gpus",
        "sim:24576",
        "--concurrency",
        "1",
        *common,
    )
    stored = lambda: _study(postgres_url).user_attrs.get("orchestrator")  # noqa: E731
    wait_for(stored, "the study", every=0.5, tolerate=(KeyError,))
    second = start_cli(
        "worker", "--study", "pbt", "--gpus", "sim:81920", "--concurrency", "2", *common
    )  # fmt: skip
    _wait_until(lambda: _running(postgres_url) > 1)
    release.touch()
    _, second_err = second.communicate(timeout=400)
    out, err = first.communicate(timeout=400)
    assert first.returncode == 0, err
    assert second.returncode == 0, second_err

    trials = {t.number: t for t in _study(postgres_url).trials}
    assert len(trials) == POPULATION * SEGMENTS  # exact: segments count towards the budget
    assert all(t.state == TrialState.COMPLETE for t in trials.values())
    assert len({t.user_attrs["gpu"] for t in trials.values()}) == 2  # both workers trained
    assert sorted({t.user_attrs[names.PBT_MEMBER] for t in trials.values()}) == [0, 1, 2, 3]
    exploited = 0
    for t in trials.values():
        a = t.user_attrs
        last = a[names.TRAIN_UNTIL_EPOCH]
        assert max(t.intermediate_values) == last  # it stopped at its segment's end
        if a[names.PBT_PARENT] is None:
            assert a[names.PBT_GENERATION] == 0 and last == 1
            continue
        parent = trials[a[names.PBT_PARENT]]
        assert a[names.CHECKPOINT_FROM] == parent.number
        assert a[names.PBT_GENERATION] == parent.user_attrs[names.PBT_GENERATION] + 1
        # It loaded the parent's checkpoint: training went on at the next epoch.
        assert a["resumed_from_epoch"] == parent.user_attrs[names.TRAIN_UNTIL_EPOCH]
        assert a[names.PBT_START_EPOCH] == a["resumed_from_epoch"] + 1
        assert last == a[names.PBT_START_EPOCH] + 1
        # The parent's curve came along; the epochs it trained itself follow on.
        for epoch in range(a[names.PBT_START_EPOCH]):
            assert t.intermediate_values[epoch] == parent.intermediate_values[epoch]
        if a[names.PBT_EXPLOITED]:
            exploited += 1
        else:
            assert t.params == parent.params
            assert a[names.PBT_MEMBER] == parent.user_attrs[names.PBT_MEMBER]
    assert exploited >= 1  # the bottom member copied a top one at least once

    shown = run_cli("best", "--study", "pbt", "--storage", postgres_url, "--format", "json")
    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout)
    lineage = record["lineage"]
    assert lineage["trials"][-1] == record["trial"]
    assert lineage["schedule"][0]["from"] == 0 and lineage["schedule"][-1]["until"] == EPOCHS
    assert lineage["weights"] is not None and "artifact_id" in lineage["weights"]

    # The text form names the lineage and its weights; run in one process after it, the JSON
    # form still finds the weights (the text form must leave the modules it reads as they were).
    for form in ("text", "json"):
        code = main(["best", "--study", "pbt", "--storage", postgres_url, "--format", form])
        assert code == 0
        out = capsys.readouterr().out
        if form == "text":
            assert f"lineage (trials {', '.join(map(str, lineage['trials']))}):" in out, out
            assert "weights: {" in out and "artifact_id" in out, out
        else:
            assert json.loads(out)["lineage"]["weights"] == lineage["weights"]
