"""What `run` checks of the adapter's options and the study's search before any database is
opened or any study stored: the options as typed, a memory model that fits some GPU, the
objectives and the grid, the sampler for the study's objectives, the swarm's size."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from adapters.base import parse_options
from orchestrator.errors import UserError
from orchestrator.flags.objectives import grid_of, objectives_of
from orchestrator.flags.trust import check_trust_flags
from orchestrator.host_options import check_model_fits_a_gpu
from orchestrator.imports import LazyImport
from samplers import sampler_kind

if TYPE_CHECKING:
    from orchestrator import api
    from orchestrator.record.study.spec import StudySpec
else:
    api = LazyImport("orchestrator.api")  # what the Python API checks, loaded when `run` runs


def checked_options(args: argparse.Namespace, adapter: Any) -> dict[str, Any]:
    """The adapter's options as typed (--env and --data among them), and the flags that depend
    on the adapter, checked before any database is opened."""
    raw_options = list(args.option)
    for flag in ("env", "data"):
        value = getattr(args, flag)
        if value is not None:
            if flag not in (getattr(adapter, "options", {}) or {}):
                raise UserError(f"adapter {adapter.name!r} takes no --{flag}")
            raw_options.append(f"{flag}={value}")
    options = parse_options(adapter, raw_options)
    check_options = getattr(adapter, "check_options", None)
    if callable(check_options):
        check_options(options)
    check_model_fits_a_gpu(adapter, options)
    check_trust_flags(args, adapter)
    objectives_of(args, adapter, options)  # the directions and the grid
    grid_of(args, adapter, options)
    return options


def check_spec(spec: StudySpec) -> None:
    """The sampler for this many objectives, the pruner: said before the study is stored."""
    try:
        api.check_spec(spec)
    except ValueError as error:
        raise UserError(str(error)) from None


def check_swarm(spec: StudySpec) -> None:
    swarm = sampler_kind(spec.sampler).swarm  # ("swarm", "particles"), or None: no swarm
    if swarm is not None and spec.swarm_size < 2:
        group, members = swarm
        raise UserError(f"--swarm-size {spec.swarm_size}: a {group} needs at least 2 {members}")
