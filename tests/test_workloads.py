"""Workload classes: the built-in defaults, and a user's TOML overrides (file or environment)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as kubernetes_parse

from orchestrator.errors import UserError
from orchestrator.planning.workloads import (
    WORKLOAD_CLASSES,
    WORKLOADS_ENV,
    WorkloadClass,
    apply_overrides,
    load_workload_classes,
    parse_quantity,
    workload_class,
)

NO_ENV: dict[str, str] = {}


def test_defaults_are_seed_000s_numbers() -> None:
    rl = workload_class("rl", environ=NO_ENV)
    assert (rl.cpu_bound, rl.default_epochs) == (True, 8)
    assert rl.node_selector == {"k8s.scaleway.com/pool-name": "ci-compile"}
    assert (rl.gpu_kind, rl.gpu_memory_mb) == ("L4", 24576)
    assert (rl.cpu_request, rl.cpu_limit, rl.memory_request, rl.memory_limit) == (
        "3000m",
        "3800m",
        "8Gi",
        "16Gi",
    )

    sup = workload_class("supervised", environ=NO_ENV)
    assert (sup.cpu_bound, sup.default_epochs) == (False, 15)
    assert sup.node_selector == {"k8s.scaleway.com/pool-name": "ci-training"}
    assert (sup.gpu_kind, sup.gpu_memory_mb) == ("L40S", 49152)
    assert (sup.cpu_request, sup.cpu_limit, sup.memory_request, sup.memory_limit) == (
        "1000m",
        "2000m",
        "16Gi",
        "40Gi",
    )
    assert parse_quantity(rl.cpu_limit) == pytest.approx(3.8)
    assert rl.plan_command("dqn") == "python -m orchestrator plan dqn --gpus sim:24576"


def test_the_original_constructor_and_errors_still_work() -> None:
    wc = WorkloadClass(name="x", cpu_bound=True, default_epochs=3)
    assert (wc.name, wc.cpu_bound, wc.default_epochs) == ("x", True, 3)
    with pytest.raises(ValueError, match="unknown workload class 'gpu'"):
        workload_class("gpu", environ=NO_ENV)
    with pytest.raises(UserError):  # the CLI prints it in one line
        workload_class("gpu", environ=NO_ENV)


def test_a_toml_file_overrides_only_the_fields_it_names(tmp_path) -> None:
    path = tmp_path / "workloads.toml"
    path.write_text(
        '[rl]\nnode_selector_key = "cloud.google.com/gke-nodepool"\nnode_selector_value = "l4-pool"\n'
        'cpu_limit = "3500m"\ndefault_epochs = 5\n\n[supervised]\nmemory_limit = "48Gi"\n'
    )
    classes = load_workload_classes(path, environ=NO_ENV)
    assert classes["rl"].node_selector == {"cloud.google.com/gke-nodepool": "l4-pool"}
    assert (classes["rl"].cpu_limit, classes["rl"].default_epochs) == ("3500m", 5)
    assert classes["rl"].cpu_request == "3000m"  # untouched
    assert classes["supervised"].memory_limit == "48Gi"
    assert classes["supervised"].default_epochs == 15
    assert WORKLOAD_CLASSES["rl"].default_epochs == 8  # the defaults themselves never change


def test_the_environment_names_the_file_and_an_explicit_path_wins(tmp_path) -> None:
    from_env = tmp_path / "env.toml"
    from_env.write_text("[supervised]\ndefault_epochs = 30\n")
    explicit = tmp_path / "flag.toml"
    explicit.write_text("[supervised]\ndefault_epochs = 40\n")
    environ = {WORKLOADS_ENV: str(from_env)}
    assert workload_class("supervised", environ=environ).default_epochs == 30
    assert workload_class("supervised", explicit, environ=environ).default_epochs == 40


def test_workload_class_reads_the_real_environment(tmp_path, monkeypatch) -> None:
    path = tmp_path / "w.toml"
    path.write_text("[rl]\ndefault_epochs = 6\n")
    monkeypatch.setenv(WORKLOADS_ENV, str(path))
    assert workload_class("rl").default_epochs == 6  # what run and plan see without a flag


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[gpu]\ncpu_limit = '1'\n", "unknown workload class [gpu]"),
        ("[rl]\ncpu = '1'\n", "has no field 'cpu'"),
        ("[rl]\ndefault_epochs = true\n", "must be a int"),
        ("[rl]\ndefault_epochs = '8'\n", "must be a int"),
        ("[rl]\ndefault_epochs = 0\n", "at least 1"),
        ("[rl]\ncpu_request = '4000m'\n", "more than cpu_limit"),
        ("[supervised]\nmemory_limit = '40 GB'\n", "not a quantity"),
        ("[rl]\nnode_selector_value = 'l4 pool'\n", "not a Kubernetes label value"),
        ("[rl]\nnode_selector_key = '/pool'\n", "not a Kubernetes label key"),
        ("rl = 3\n", "must be a table"),
        ("[rl\n", "not valid TOML"),
    ],
)
def test_bad_overrides_say_what_is_wrong_in_one_line(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=re.escape(message)) as caught:
        load_workload_classes(path, environ=NO_ENV)
    assert "\n" not in str(caught.value)


def test_a_missing_file_names_the_flag_and_the_variable(tmp_path) -> None:
    with pytest.raises(UserError, match=f"does not exist: fix --workloads or \\${WORKLOADS_ENV}"):
        load_workload_classes(tmp_path / "nope.toml", environ=NO_ENV)


def test_apply_overrides_accepts_a_mapping() -> None:
    classes = apply_overrides(
        WORKLOAD_CLASSES, {"rl": {"gpu_kind": "A10G", "gpu_memory_mb": 23028}}
    )
    assert classes["rl"].plan_command("ppo") == "python -m orchestrator plan ppo --gpus sim:23028"


QUANTITIES = st.one_of(
    st.builds(
        lambda n, s: f"{n}{s}",
        st.integers(0, 10**6),
        st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "Ti"]),
    ),
    st.builds(lambda a, b: f"{a}.{b}", st.integers(0, 999), st.integers(0, 999)),
)


@settings(deadline=None, max_examples=200)
@given(QUANTITIES)
def test_quantities_parse_as_kubernetes_parses_them(text: str) -> None:
    assert parse_quantity(text) == pytest.approx(float(kubernetes_parse(text)))


def test_a_bad_quantity_is_refused() -> None:
    for text in ("", "1.5.2", "3 m", "8GB", "-1"):
        with pytest.raises(ValueError, match="not a Kubernetes quantity"):
            parse_quantity(text)
