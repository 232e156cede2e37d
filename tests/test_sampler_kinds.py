"""Each sampler's declaration (samplers/_factory.SamplerKind): every name has one, the places
that stored settings are read agree with it, reading one loads no Optuna, and a sampler declared
anew is honoured by every reader without any of them naming it."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

import adapters
from orchestrator.cli import build_parser
from orchestrator.commands import run as run_command
from orchestrator.commands.population import check_population
from orchestrator.commands.run_checks import check_swarm
from orchestrator.errors import UserError
from orchestrator.flags.objectives import grid_of
from orchestrator.record.study import drift
from orchestrator.record.study import spec as study_spec
from orchestrator.record.study.spec import StudySpec
from orchestrator.run.trial.context import TrialContext
from samplers import _factory
from samplers._factory import (
    SAMPLER_KINDS,
    SAMPLER_NAMES,
    SINGLE_OBJECTIVE_ONLY,
    UNDECLARED,
    Asked,
    SamplerKind,
    make_sampler,
    process_seed,
    sampler_kind,
)

SETTINGS = {item.name for item in dataclasses.fields(StudySpec)}


def test_every_name_has_one_declaration_under_its_own_name() -> None:
    assert tuple(SAMPLER_KINDS) == SAMPLER_NAMES
    assert SAMPLER_NAMES[0] == StudySpec.sampler  # the default first, as `run --sampler` says
    assert all(kind.name == name for name, kind in SAMPLER_KINDS.items())
    assert all(sampler_kind(name) is SAMPLER_KINDS[name] for name in SAMPLER_NAMES)
    assert SINGLE_OBJECTIVE_ONLY == ("qmc", "cmaes", "pbt")
    for kind in SAMPLER_KINDS.values():
        assert set(kind.settings) <= SETTINGS, kind.name
        assert kind.default_pruner in (None, *study_spec.PRUNERS), kind.name
        assert kind.swarm is None or "swarm_size" in SETTINGS


def test_a_name_none_declares_reads_as_undeclared_and_is_not_made() -> None:
    """A user's own Optuna sampler is stored under its class's name, and no --sampler typed is
    None: both read as a sampler with no rules of its own, and neither can be made by name."""
    for name in (None, "", "TPESampler"):
        kind = sampler_kind(name)
        assert kind is UNDECLARED
        assert not (kind.kept or kind.needs_grid or kind.needs_checkpoints or kind.swarm)
        assert kind.default_pruner is None
    with pytest.raises(ValueError, match="Unknown sampler 'TPESampler': choose one of pso, tpe"):
        make_sampler("TPESampler", seed=0)
    with pytest.raises(ValueError, match="choose one of pso"):
        UNDECLARED.make(Asked(0, 0, None, None, None))


def test_the_study_settings_agree_with_the_declarations() -> None:
    """record/ may not import the samplers, so what it keeps of their rules is tied here."""
    declared = {
        setting: frozenset(k.name for k in SAMPLER_KINDS.values() if setting in k.settings)
        for kind in SAMPLER_KINDS.values()
        for setting in kind.settings
    }
    assert declared == drift.SAMPLER_SETTINGS
    seeded = frozenset(k.name for k in SAMPLER_KINDS.values() if k.seed_from_study)
    assert seeded == study_spec.SEED_FROM_STUDY


def test_reading_a_declaration_loads_no_optuna() -> None:
    code = (
        "import sys\n"
        "from samplers import sampler_kind, SAMPLER_NAMES\n"
        "assert [sampler_kind(n).kept for n in SAMPLER_NAMES]\n"
        "print(sorted(m for m in ('optuna', 'numpy', 'samplers._pso', 'samplers._pbt')"
        " if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


# --- a sampler declared anew --------------------------------------------------------------------


class Made:
    """What a planted declaration makes: the `Asked` it was given."""

    def __init__(self, asked: Asked) -> None:
        self.asked = asked


def _plant(monkeypatch: pytest.MonkeyPatch, **rules: Any) -> SamplerKind:
    kind = SamplerKind("walk", Made, **rules)  # type: ignore[arg-type]
    monkeypatch.setitem(SAMPLER_KINDS, "walk", kind)
    return kind


def _spec(**changes: Any) -> StudySpec:
    return StudySpec(adapter="synthetic", trials=4, epochs=1, direction="minimize", **changes)


def test_a_planted_sampler_is_made_with_the_seed_it_declares(monkeypatch) -> None:
    _plant(monkeypatch, several_objectives=False)
    made: Any = make_sampler("walk", seed=10, independent_seed_offset=3, swarm_size=4)
    own = process_seed(10, 3)
    assert (made.asked.seed, made.asked.own_seed, made.asked.swarm_size) == (own, own, 4)
    with pytest.raises(ValueError, match="'walk' optimises one objective only.*nsga2"):
        make_sampler("walk", seed=0, n_objectives=2)
    _plant(monkeypatch, shared_seed=True)
    made = make_sampler("walk", seed=10, independent_seed_offset=3)
    assert (made.asked.seed, made.asked.own_seed) == (10, own)
    with pytest.raises(ValueError, match="Unknown sampler 'nope': choose one of .*pbt, walk"):
        make_sampler("nope", seed=0)


def test_a_planted_sampler_s_swarm_and_checkpoints_are_checked(monkeypatch) -> None:
    _plant(monkeypatch, swarm=("flock", "birds"), needs_checkpoints=True)
    with pytest.raises(UserError, match="^--swarm-size 1: a flock needs at least 2 birds$"):
        check_swarm(_spec(sampler="walk", swarm_size=1))
    check_swarm(_spec(sampler="walk", swarm_size=2))
    no_checkpoints = SimpleNamespace(name="plain", train=lambda params, epochs, device: 0.0)
    with pytest.raises(UserError, match="^--sampler walk needs an adapter that checkpoints"):
        check_population(_spec(sampler="walk"), no_checkpoints)
    _plant(monkeypatch)
    check_swarm(_spec(sampler="walk", swarm_size=1))
    check_population(_spec(sampler="walk"), no_checkpoints)


def _run_args(sampler: str) -> argparse.Namespace:
    args = build_parser().parse_args(["run", "synthetic"])
    args.sampler = sampler  # past argparse's choices, fixed when the parser was built
    return args


def test_a_planted_sampler_s_pruner_and_grid_are_read_by_run(monkeypatch) -> None:
    adapter = adapters.get("synthetic")
    _plant(monkeypatch, default_pruner="wilcoxon", needs_grid=True)
    args = _run_args("walk")
    args.grid = ["x=0.25,0.75"]
    walked = grid_of(args, adapter, {})
    assert walked["grid"]["x"] == [0.25, 0.75] and walked["trials"] >= 2
    _plant(monkeypatch, default_pruner="wilcoxon")
    assert grid_of(_run_args("walk"), adapter, {}) == {}
    with pytest.raises(UserError, match="^--grid is the grid of --sampler grid"):
        grid_of(args, adapter, {})
    assert run_command._new_spec(_run_args("walk"), adapter, {}).pruner == "wilcoxon"
    args = _run_args("walk")
    args.pruner = "median"
    assert run_command._new_spec(args, adapter, {}).pruner == "median"
    assert run_command._new_spec(_run_args("tpe"), adapter, {}).pruner == StudySpec.pruner
    assert run_command._new_spec(_run_args("pbt"), adapter, {}).pruner == "none"


@pytest.mark.parametrize("kept", [True, False])
def test_a_trial_process_keeps_a_planted_sampler_only_if_it_says_so(monkeypatch, kept) -> None:
    _plant(monkeypatch, kept=kept)
    # The context's sampler_for reads the spec and its kept samplers only.
    ctx: Any = SimpleNamespace(spec=_spec(sampler="walk", seed=7), _samplers={})
    first = TrialContext.sampler_for(ctx, (8, 32), 1)
    second = TrialContext.sampler_for(ctx, (8, 32), 2)
    assert (first is second) is kept
    assert first.asked.bounds == {"batch_size": (8, 32)}
    assert second.asked.own_seed == (
        7 if kept else process_seed(7, 2)
    )  # kept: made once, with no offset
    assert _factory.sampler_kind("walk").kept is kept


def test_studies_of_neighbouring_seeds_draw_apart() -> None:
    """A study seeded 4 must not be the study seeded 3 one trial later: each trial's sampler is
    seeded by (study seed, trial number), never by their sum."""
    seeds = {(s, n): process_seed(s, n) for s in range(5) for n in range(50)}
    assert len(set(seeds.values())) == len(seeds)
    assert process_seed(7, 0) == 7  # a sampler made once for the study keeps its seed
