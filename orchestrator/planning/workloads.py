"""Workload classes: what kind of hardware a model wants, and its defaults.

RL training is CPU-bound (environment simulation) and small on the GPU; supervised models are
GPU-bound. The planner caps CPU-bound work at the host's cores; the deployment manifests route
each class to its node pool with its own CPU and memory. One table, read by both.

The defaults below can be overridden field by field from a TOML file, named by `--workloads FILE`
or by the ORCHESTRATOR_WORKLOADS environment variable:

    [rl]
    node_selector_value = "gpu-l4"
    cpu_limit = "3500m"

    [supervised]
    default_epochs = 20
"""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError

WORKLOADS_ENV = "ORCHESTRATOR_WORKLOADS"

# The default routes by Scaleway's node pool label; any node label works (`node_selector_key`).
POOL_LABEL = "k8s.scaleway.com/pool-name"


class UnknownWorkloadClass(UserError, ValueError):
    """A class name that is not in the table (a ValueError too, as it always was)."""


@dataclass(frozen=True)
class WorkloadClass:
    name: str
    cpu_bound: bool  # concurrent trials on a host never exceed its usable cores
    default_epochs: int
    # Where its workers run on Kubernetes: a nodeSelector of one label.
    node_selector_key: str = POOL_LABEL
    node_selector_value: str = ""
    gpu_kind: str = ""  # the GPU of that pool, in words ("L4"), for people and docs
    gpu_memory_mb: int = 0  # that GPU's VRAM: what `plan ADAPTER --gpus sim:MB` sizes slots for
    # Kubernetes quantities, per worker pod (one GPU each).
    cpu_request: str = "1000m"
    cpu_limit: str = "2000m"
    memory_request: str = "8Gi"
    memory_limit: str = "16Gi"

    @property
    def node_selector(self) -> dict[str, str]:
        return {self.node_selector_key: self.node_selector_value}

    def plan_command(self, adapter: str) -> str:
        """The command that shows how many trials fit on one GPU of this class's pool."""
        return f"python -m orchestrator plan {adapter} --gpus sim:{self.gpu_memory_mb}"


WORKLOAD_CLASSES: dict[str, WorkloadClass] = {
    # RL is CPU-bound and uses under 1 GB of VRAM: the cheaper L4 pool, most of an L4 node's
    # 7800m allocatable CPU (3000m requested lets two RL workers share a node), 8 epochs.
    "rl": WorkloadClass(
        name="rl",
        cpu_bound=True,
        default_epochs=8,
        node_selector_value="ci-compile",
        gpu_kind="L4",
        gpu_memory_mb=24576,
        cpu_request="3000m",
        cpu_limit="3800m",
        memory_request="8Gi",
        memory_limit="16Gi",
    ),
    # Supervised models are GPU-bound: the L40S pool (48 GB VRAM), little CPU so that 3-4
    # workers share a node, more memory for the data, 15 epochs.
    "supervised": WorkloadClass(
        name="supervised",
        cpu_bound=False,
        default_epochs=15,
        node_selector_value="ci-training",
        gpu_kind="L40S",
        gpu_memory_mb=49152,
        cpu_request="1000m",
        cpu_limit="2000m",
        memory_request="16Gi",
        memory_limit="40Gi",
    ),
}

_FIELD_TYPES: dict[str, type] = {
    "cpu_bound": bool,
    "default_epochs": int,
    "node_selector_key": str,
    "node_selector_value": str,
    "gpu_kind": str,
    "gpu_memory_mb": int,
    "cpu_request": str,
    "cpu_limit": str,
    "memory_request": str,
    "memory_limit": str,
}
assert set(_FIELD_TYPES) == {f.name for f in fields(WorkloadClass)} - {"name"}

# Kubernetes quantities: a decimal number with an optional SI or binary suffix.
_QUANTITY = re.compile(r"^(?P<number>\d+(\.\d+)?)(?P<suffix>m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIX = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
# A label key: optional DNS-subdomain prefix and "/", then a name of at most 63 characters.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")


def parse_quantity(text: str) -> float:
    """A Kubernetes quantity ("3800m", "16Gi", "2") as a number (cores, bytes)."""
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity such as 3800m, 2, 16Gi or 512Mi")
    return float(match["number"]) * _SUFFIX[match["suffix"]]


def workloads_file(
    path: str | Path | None = None, environ: Mapping[str, str] = os.environ
) -> Path | None:
    """The overrides file in force: `--workloads FILE`, else $ORCHESTRATOR_WORKLOADS, else none."""
    chosen = path or environ.get(WORKLOADS_ENV)
    return Path(chosen) if chosen else None


def load_workload_classes(
    path: str | Path | None = None, environ: Mapping[str, str] = os.environ
) -> dict[str, WorkloadClass]:
    """The workload classes: the defaults, with the overrides file's fields on top."""
    source = workloads_file(path, environ)
    if source is None:
        return dict(WORKLOAD_CLASSES)

    try:
        with open(source, "rb") as handle:
            overrides = tomllib.load(handle)
    except FileNotFoundError:
        raise UserError(
            f"workloads file {str(source)!r} does not exist: fix --workloads or ${WORKLOADS_ENV}"
        ) from None
    except IsADirectoryError:
        raise UserError(
            f"workloads file {str(source)!r} is a folder: name a TOML file in --workloads or "
            f"${WORKLOADS_ENV}"
        ) from None
    except UnicodeDecodeError:
        raise UserError(
            f"workloads file {str(source)!r} is not a text file: name a TOML file in --workloads "
            f"or ${WORKLOADS_ENV}"
        ) from None
    except OSError as error:
        raise UserError(
            f"workloads file {str(source)!r} cannot be read ({error.strerror or error}): fix "
            f"--workloads or ${WORKLOADS_ENV}"
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"workloads file {str(source)!r} is not valid TOML: {error}") from None
    return apply_overrides(WORKLOAD_CLASSES, overrides, source=str(source))


def apply_overrides(
    classes: Mapping[str, WorkloadClass], overrides: Mapping[str, Any], *, source: str = "overrides"
) -> dict[str, WorkloadClass]:
    """Each `[class]` table's fields replace the defaults; anything unknown or ill-typed is a UserError."""
    result = dict(classes)
    for class_name, table in overrides.items():
        if class_name not in classes:
            raise UserError(
                f"{source}: unknown workload class [{class_name}]: use "
                + " or ".join(f"[{name}]" for name in sorted(classes))
            )
        if not isinstance(table, Mapping):
            raise UserError(f"{source}: {class_name} must be a table, written [{class_name}]")
        changes: dict[str, Any] = {}
        for key, value in table.items():
            expected = _FIELD_TYPES.get(key)
            if expected is None:
                raise UserError(
                    f"{source}: [{class_name}] has no field {key!r}; its fields are: "
                    + ", ".join(_FIELD_TYPES)
                )
            # TOML has real booleans, so a bool is never taken for an int here.
            if type(value) is not expected:
                raise UserError(
                    f"{source}: [{class_name}] {key} = {value!r} must be a {expected.__name__}"
                )
            changes[key] = value
        result[class_name] = replace(classes[class_name], **changes)
        problem = check_workload_class(result[class_name])
        if problem:
            raise UserError(f"{source}: [{class_name}] {problem}")
    return result


def check_workload_class(wc: WorkloadClass) -> str | None:
    """What is wrong with a class, in one line, or None."""
    if wc.default_epochs < 1:
        return f"default_epochs = {wc.default_epochs} must be at least 1"
    if wc.gpu_memory_mb < 0:
        return f"gpu_memory_mb = {wc.gpu_memory_mb} must be the GPU's VRAM in MB, e.g. 24576"
    if not _LABEL_KEY.match(wc.node_selector_key):
        return f"node_selector_key = {wc.node_selector_key!r} is not a Kubernetes label key"
    if not _LABEL_VALUE.match(wc.node_selector_value):
        return f"node_selector_value = {wc.node_selector_value!r} is not a Kubernetes label value"
    for resource, unit in (("cpu", "3800m or 2"), ("memory", "16Gi or 512Mi")):
        request_field, limit_field = f"{resource}_request", f"{resource}_limit"
        amounts = {}
        for name in (request_field, limit_field):
            text = getattr(wc, name)
            try:
                amounts[name] = parse_quantity(text)
            except ValueError:
                return f"{name} = {text!r} is not a quantity such as {unit}"
        if amounts[request_field] > amounts[limit_field]:
            return (
                f"{request_field} = {getattr(wc, request_field)!r} is more than "
                f"{limit_field} = {getattr(wc, limit_field)!r}: Kubernetes refuses that"
            )
    return None


def workload_class(
    name: str, path: str | Path | None = None, environ: Mapping[str, str] = os.environ
) -> WorkloadClass:
    """The class called `name`, with the overrides of `path` or $ORCHESTRATOR_WORKLOADS if any."""
    classes = load_workload_classes(path, environ)
    try:
        return classes[name]
    except KeyError:
        raise UnknownWorkloadClass(
            f"unknown workload class {name!r}: use one of {', '.join(sorted(classes))}"
        ) from None


def add_workloads_argument(parser: argparse.ArgumentParser) -> None:
    """`--workloads FILE`, for every command that reads workload classes."""
    parser.add_argument(
        "--workloads",
        metavar="FILE",
        help=f"TOML file that overrides the workload classes' defaults (default: ${WORKLOADS_ENV})",
    )
