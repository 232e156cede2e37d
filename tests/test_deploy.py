"""Kubernetes manifests per workload class: valid against the API models, routed to the right pool."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.client import ApiClient, V1Deployment, V1Job, V1Service
from kubernetes.utils import parse_quantity

import adapters
from orchestrator.cli import build_parser, main
from orchestrator.deploy.compose import claim_gpu
from orchestrator.deploy.kubernetes import (
    GPU_RESOURCE,
    Deployment,
    manifests,
    object_name,
    to_yaml,
    worker_args,
)
from orchestrator.errors import UserError
from orchestrator.planning.workloads import WORKLOADS_ENV, workload_class
from orchestrator.record.store.location import STORAGE_ENV
from orchestrator.record.study.spec import StudySpec
from tests.waiting import patient

REPO = Path(__file__).resolve().parents[1]
MODELS = {"Job": V1Job, "Deployment": V1Deployment, "Service": V1Service}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
SEED_000 = {
    "rl": {
        "pool": ("k8s.scaleway.com/pool-name", "ci-compile"),
        "requests": {"cpu": "3000m", "memory": "8Gi"},
        "limits": {"cpu": "3800m", "memory": "16Gi"},
        "epochs": 8,
    },
    "supervised": {
        "pool": ("k8s.scaleway.com/pool-name", "ci-training"),
        "requests": {"cpu": "1000m", "memory": "16Gi"},
        "limits": {"cpu": "2000m", "memory": "40Gi"},
        "epochs": 15,
    },
}


@pytest.fixture(autouse=True)
def _no_user_overrides(monkeypatch) -> None:
    monkeypatch.delenv(WORKLOADS_ENV, raising=False)


def loaded_adapters() -> dict[str, object]:
    """Every installed adapter that loads, by name; the built-in dqn and tft must be among them."""
    found = {
        entry.name: entry.adapter for entry in adapters.discover() if entry.adapter is not None
    }
    assert {"dqn", "tft"} <= set(found), f"dqn and tft must load; found {sorted(found)}"
    return found


def deployment_for(name: str, **kwargs) -> Deployment:
    adapter = adapters.get(name)
    base = {
        "adapter": name,
        "workload": workload_class(adapter.workload_class),
        "study": f"{name}-study",
        "workers": 3,
    }
    return Deployment(**{**base, **kwargs})


def validate(obj: dict) -> None:
    """Strict Kubernetes API model validation (unknown fields and wrong types fail), and a lossless round trip."""
    model = MODELS[obj["kind"]].model_validate(obj)
    assert ApiClient().sanitize_for_serialization(model) == obj


def worker_container(deployment: Deployment) -> dict:
    job = manifests(deployment)["workers.yaml"][0]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("name", ["dqn", "tft"])
def test_every_object_validates_against_the_kubernetes_api(name: str) -> None:
    files = manifests(deployment_for(name, trials=100))
    assert list(files) == ["migrate.yaml", "workers.yaml", "dashboard.yaml"]
    kinds = [obj["kind"] for objects in files.values() for obj in objects]
    assert kinds == ["Job", "Job", "Deployment", "Service"]
    for objects in files.values():
        for obj in objects:
            validate(obj)
            assert DNS_LABEL.match(obj["metadata"]["name"])
            # What kubectl reads is the YAML: it must give back the same objects.
        assert list(yaml.safe_load_all(to_yaml(objects))) == objects


def test_the_validator_catches_a_misspelt_field_and_a_wrong_type() -> None:
    job = manifests(deployment_for("dqn"))["workers.yaml"][0]
    misspelt = yaml.safe_load(to_yaml([job]))
    misspelt["spec"]["template"]["spec"]["nodeSelecter"] = misspelt["spec"]["template"]["spec"].pop(
        "nodeSelector"
    )
    with pytest.raises(Exception, match="nodeSelecter"):
        validate(misspelt)
    wrong_type = yaml.safe_load(to_yaml([job]))
    wrong_type["spec"]["completions"] = "3"
    with pytest.raises(Exception, match="completions"):
        validate(wrong_type)


def test_every_adapter_lands_on_its_class_pool_with_seed_000s_numbers() -> None:
    found = loaded_adapters()
    for name, adapter in found.items():
        expected = SEED_000[adapter.workload_class]
        deployment = deployment_for(name)
        job = manifests(deployment)["workers.yaml"][0]
        pod = job["spec"]["template"]["spec"]
        key, value = expected["pool"]
        assert pod["nodeSelector"] == {key: value}, name
        (container,) = pod["containers"]
        assert container["resources"]["requests"] == {**expected["requests"], GPU_RESOURCE: "1"}, (
            name
        )
        assert container["resources"]["limits"] == {**expected["limits"], GPU_RESOURCE: "1"}, name
        # No --epochs: `run` gives a new study the class default itself.
        assert "--epochs" not in container["args"], name
        assert deployment.builtin_default_epochs == expected["epochs"], name
        assert f"({expected['epochs']} for a new study)" in deployment.epochs_in_words, name
        assert job["metadata"]["labels"]["orchestrator/workload-class"] == adapter.workload_class
    assert found["dqn"].workload_class == "rl"
    assert found["tft"].workload_class == "supervised"


def test_requests_never_exceed_limits() -> None:
    for name in ("dqn", "tft"):
        files = manifests(deployment_for(name))
        for objects in files.values():
            for obj in objects:
                if obj["kind"] == "Service":
                    continue
                for container in obj["spec"]["template"]["spec"]["containers"]:
                    requests, limits = (
                        container["resources"]["requests"],
                        container["resources"]["limits"],
                    )
                    for resource, amount in requests.items():
                        assert parse_quantity(amount) <= parse_quantity(limits[resource])


def test_n_workers_are_an_indexed_job_of_n_pods_with_one_gpu_each() -> None:
    job = manifests(deployment_for("dqn", workers=7))["workers.yaml"][0]
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 7, 7)
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it
    assert (
        spec["backoffLimitPerIndex"] >= 1
    )  # a pod that loses the race to create the study retries


def test_the_storage_url_comes_from_the_secret_and_is_never_inline() -> None:
    deployment = deployment_for("tft", storage_secret="team-db")
    text = "".join(to_yaml(objects) for objects in manifests(deployment).values())
    assert "postgresql" not in text and "sqlite" not in text
    for objects in manifests(deployment).values():
        for obj in objects:
            if obj["kind"] == "Service":
                continue
            (container,) = obj["spec"]["template"]["spec"]["containers"]
            (storage,) = [env for env in container["env"] if env["name"] == STORAGE_ENV]
            assert storage == {
                "name": STORAGE_ENV,
                "valueFrom": {"secretKeyRef": {"name": "team-db", "key": "url"}},
            }
            assert "--storage" not in container["args"]


def test_containers_run_as_the_images_non_root_user() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    uid = int(re.search(r"^USER (\d+)", dockerfile, re.MULTILINE).group(1))
    for objects in manifests(deployment_for("dqn")).values():
        for obj in objects:
            if obj["kind"] != "Service":
                pod = obj["spec"]["template"]["spec"]
                assert pod["securityContext"]["runAsNonRoot"] is True
                assert pod["securityContext"]["runAsUser"] == uid


def test_the_worker_and_the_other_commands_parse_with_the_real_cli() -> None:
    parser = build_parser()
    for objects in manifests(deployment_for("dqn", trials=50, epochs=4)).values():
        for obj in objects:
            if obj["kind"] == "Service":
                continue
            (container,) = obj["spec"]["template"]["spec"]["containers"]
            assert container["command"] == ["python", "-m", "orchestrator"]
            args = parser.parse_args(container["args"])
            assert callable(args.handler)
    run = parser.parse_args(worker_args(deployment_for("dqn", trials=50, epochs=4)))
    assert (run.command, run.adapter, run.study, run.trials, run.epochs, run.gpus) == (
        "run",
        "dqn",
        "dqn-study",
        50,
        4,
        "auto",
    )


def test_workers_keep_the_epochs_stored_with_a_study_unless_told_otherwise() -> None:
    # A study created by `run dqn --epochs 2`; pods of `manifests dqn` then join it.
    stored = StudySpec(adapter="dqn", trials=20, epochs=2, direction="maximize")
    parser = build_parser()
    joined = parser.parse_args(worker_args(deployment_for("dqn")))
    assert stored.updated(epochs=joined.epochs, trials=joined.trials).epochs == 2
    # `manifests --epochs 5` is the user's choice for the study: the workers apply it.
    told = parser.parse_args(worker_args(deployment_for("dqn", epochs=5)))
    assert stored.updated(epochs=told.epochs).epochs == 5


def test_the_dashboard_is_a_deployment_behind_a_cluster_ip_service() -> None:
    deployment, service = manifests(deployment_for("dqn"))["dashboard.yaml"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][:1] == ["dashboard"]
    assert "resources" in container and GPU_RESOURCE not in container["resources"]["limits"]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]


def test_migration_runs_db_upgrade_once() -> None:
    (job,) = manifests(deployment_for("tft"))["migrate.yaml"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["db", "upgrade"]
    assert "completions" not in job["spec"]  # one pod


@settings(deadline=None, max_examples=60)
@given(st.text(min_size=1, max_size=80).filter(lambda s: s.strip()))
def test_any_study_name_gives_valid_object_names(study: str) -> None:
    name = object_name(study)
    assert DNS_LABEL.match(name)
    assert DNS_LABEL.match(name + "-dashboard") and len(name + "-dashboard") <= 63


def test_bad_deployments_are_user_errors() -> None:
    wc = workload_class("rl")
    for kwargs, message in [
        ({"workers": 0}, "at least 1 worker"),
        ({"epochs": 0}, "at least 1 epoch"),
        ({"storage_secret": "My_Secret"}, "not a Kubernetes name"),
        ({"study": "  "}, "--study is empty"),
    ]:
        with pytest.raises(UserError, match=message):
            Deployment(**{"adapter": "dqn", "workload": wc, "study": "s", "workers": 1, **kwargs})


# --- the command ---------------------------------------------------------------------------


def test_manifests_command_writes_three_files_and_the_next_commands(tmp_path, capsys) -> None:
    out = tmp_path / "k8s"
    code = main(
        [
            "manifests",
            "dqn",
            "--study",
            "DQN on L4",
            "--workers",
            "4",
            "--image",
            "reg.example/o:1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "dqn is rl: 4 worker(s) on k8s.scaleway.com/pool-name=ci-compile (L4)" in printed
    assert "python -m orchestrator plan dqn --gpus sim:24576" in printed
    assert "kubectl wait --for=condition=complete --timeout=10m job/dqn-on-l4-migrate" in printed
    (job,) = yaml.safe_load_all((out / "workers.yaml").read_text())
    validate(job)
    assert job["spec"]["completions"] == 4
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "reg.example/o:1"
    assert container["args"][:4] == ["run", "dqn", "--study", "DQN on L4"]
    assert sorted(p.name for p in out.iterdir()) == [
        "dashboard.yaml",
        "migrate.yaml",
        "workers.yaml",
    ]


def test_manifests_command_prints_yaml_and_honours_a_workloads_file(
    tmp_path, capsys, monkeypatch
) -> None:
    overrides = tmp_path / "w.toml"
    overrides.write_text(
        '[supervised]\nnode_selector_value = "l40s"\nmemory_limit = "44Gi"\ndefault_epochs = 12\n'
    )
    assert (
        main(
            ["manifests", "tft", "--study", "tft", "--workers", "2", "--workloads", str(overrides)]
        )
        == 0
    )
    printed = capsys.readouterr()
    objects = list(yaml.safe_load_all(printed.out))
    (job,) = [obj for obj in objects if obj["metadata"]["name"] == "tft-workers"]
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"k8s.scaleway.com/pool-name": "l40s"}
    assert pod["containers"][0]["resources"]["limits"]["memory"] == "44Gi"
    # The file does not travel to the pods: no --epochs, and a note saying how to use its 12.
    assert "--epochs" not in pod["containers"][0]["args"]
    assert "pass --epochs 12 to use it" in printed.err
    # The same file through the environment.
    monkeypatch.setenv(WORKLOADS_ENV, str(overrides))
    assert main(["manifests", "tft", "--study", "tft", "--workers", "1"]) == 0
    assert "l40s" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["manifests", "nope", "--study", "s", "--workers", "1"], "unknown adapter 'nope'"),
        (["manifests", "dqn", "--study", "s", "--workers", "0"], "--workers 0 must be at least 1"),
        (
            [
                "manifests",
                "dqn",
                "--study",
                "s",
                "--workers",
                "1",
                "--workloads",
                "/nonexistent.toml",
            ],
            "does not exist",
        ),
    ],
)
def test_manifests_command_bad_input_is_one_line(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_manifests_command_cannot_write_says_so(tmp_path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert (
        main(["manifests", "dqn", "--study", "s", "--workers", "1", "--out", str(blocker / "sub")])
        == 2
    )
    assert "choose another --out" in capsys.readouterr().err


# --- compose: one GPU per replica ----------------------------------------------------------


def test_each_claim_takes_a_different_gpu_until_none_is_left(tmp_path) -> None:
    first, fd0 = claim_gpu(tmp_path, 2)
    second, fd1 = claim_gpu(tmp_path, 2)
    assert (first, second) == (0, 1)
    with pytest.raises(UserError, match="all 2 GPUs of this host already have a worker"):
        claim_gpu(tmp_path, 2)
    os.close(fd0)  # the worker on GPU 0 exits: its GPU is free again
    again, fd2 = claim_gpu(tmp_path, 2)
    assert again == 0
    for fd in (fd1, fd2):
        os.close(fd)
    with pytest.raises(UserError, match="no GPU is visible"):
        claim_gpu(tmp_path, 0)


def test_claim_gpu_runs_the_command_with_its_gpu_and_holds_it_while_it_runs(tmp_path) -> None:
    child = "import sys; print(' '.join(sys.argv[1:]), flush=True); sys.stdin.read()"
    command = [
        sys.executable,
        "-m",
        "orchestrator.deploy.compose",
        "claim-gpu",
        "--locks",
        str(tmp_path),
        "--gpu-count",
        "2",
    ]
    process = subprocess.Popen(
        [*command, "--", sys.executable, "-c", child, "worker", "--study", "s"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert process.stdout.readline().strip() == "worker --study s --gpus 0"
        index, fd = claim_gpu(tmp_path, 2)  # GPU 0 is held by the running command
        assert index == 1
        os.close(fd)
    finally:
        _, stderr = process.communicate(input="", timeout=patient(10))
    assert process.returncode == 0
    assert "worker takes GPU 0 of 2" in stderr
    index, fd = claim_gpu(tmp_path, 2)  # released when the command ended
    assert index == 0
    os.close(fd)


def test_claim_gpu_with_every_gpu_taken_exits_2_in_one_line(tmp_path) -> None:
    _, fd = claim_gpu(tmp_path, 1)
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator.deploy.compose",
                "claim-gpu",
                "--locks",
                str(tmp_path),
                "--gpu-count",
                "1",
                "--",
                "true",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=patient(30),
        )
    finally:
        os.close(fd)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--scale worker=1" in result.stderr


def test_the_kubernetes_engine_renders_the_three_files_as_yaml() -> None:
    from orchestrator.deploy.engine import StudyWorkers
    from orchestrator.deploy.kubernetes import KubernetesEngine

    engine = KubernetesEngine(image="registry.example.com/orch:1", storage_secret="team-db")
    workers = StudyWorkers(
        study="dqn-study", workers=3, workload=workload_class("rl"), adapter="dqn", trials=9
    )
    expected = deployment_for(
        "dqn", trials=9, image="registry.example.com/orch:1", storage_secret="team-db"
    )
    assert engine.render(workers) == {
        name: to_yaml(objects) for name, objects in manifests(expected).items()
    }
    joining = StudyWorkers(study="s", workers=1, workload=workload_class("rl"))
    with pytest.raises(UserError, match="give the study's adapter"):
        engine.render(joining)
