"""The study settings `run` takes and stores with a study: its size (`--trials`, `--epochs`, the
adapter's options) and its search (`--sampler`, `--seed`, `--pruner`, `--enqueue`...).

`run` and `slurm` both declare them from here: `slurm` creates the study with them before it
submits workers that read them from the storage, so the two commands take the same settings, spelt
and checked the same way.
"""

from __future__ import annotations

import argparse

from orchestrator.flags.common import (
    SEED_MAX,
    add_swarm_size_argument,
    input_file,
    whole_number,
)
from orchestrator.flags.objectives import add_objective_arguments
from orchestrator.flags.trust import add_confirm_arguments, add_repeats_argument
from orchestrator.record.study.spec import PRUNERS, StudySpec
from samplers import SAMPLER_NAMES


def add_size_arguments(parser: argparse.ArgumentParser, *, confirm: bool = False) -> None:
    """How big the study is and what each trial trains on (`confirm`: `--confirm`, which `run`
    does once the study ends, among them)."""
    parser.add_argument(
        "--trials",
        type=whole_number("--trials", example=40),
        metavar="N",
        help="the study's total budget of trials (resuming keeps it)",
    )
    parser.add_argument(
        "--epochs",
        type=whole_number("--epochs", example=8),
        metavar="N",
        help="epochs per trial (default: the workload class's)",
    )
    parser.add_argument(
        "--env",
        metavar="ENV",
        help="RL adapters: trading (default) or a Gymnasium id such as CartPole-v1",
    )
    add_repeats_argument(parser)
    if confirm:
        add_confirm_arguments(parser, at_the_end=True)
    parser.add_argument(
        "--intensify",
        type=whole_number("--intensify", low=0, example=4),
        metavar="N",
        help="spend N of the budget's trials re-running the recommended trial (its parameters, "
        "the next seeds), spread over the second half (default 0; docs/see-a-study.md)",
    )
    parser.add_argument(
        "--data",
        metavar="CSV",
        type=input_file("--data", "a CSV file with a `close` column"),
        help="prices from a CSV file with a close column (default: synthetic)",
    )


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """How the study searches: sampler, pruner, retries, what runs first, where it is tracked."""
    parser.add_argument(
        "--sampler",
        choices=SAMPLER_NAMES,
        help=f"{StudySpec.sampler} (default), pbt (population-based training, "
        "--swarm-size members; docs/pbt.md) or one of Optuna's samplers",
    )
    parser.add_argument(
        "--seed",
        type=whole_number("--seed", low=0, high=SEED_MAX, example=7),
        help="sampler seed (default: one is drawn and stored with the study)",
    )
    add_swarm_size_argument(parser)
    parser.add_argument(
        "--pbt-keep",
        metavar="NAMES",
        help="with --sampler pbt: parameters never perturbed because they shape the model's "
        "weights, comma-separated (width,hidden; docs/pbt.md)",
    )
    add_objective_arguments(parser)
    parser.add_argument(
        "--pruner",
        choices=PRUNERS,
        help=f"stop poor trials early: {', '.join(PRUNERS)} "
        f"(default {StudySpec.pruner}; docs/pruners.md)",
    )
    parser.add_argument(
        "--max-retries",
        type=whole_number("--max-retries", low=0, high=1000, example=2),
        metavar="N",
        help=f"re-runs of an OOM'd or lost trial (default {StudySpec.max_retries})",
    )
    parser.add_argument(
        "--update-settings",
        action="store_true",
        help="resume a study with other epochs, sampler, seed, pruner or options than it was run "
        "with (recorded with the time and host; `status` shows it); without it they are refused",
    )
    parser.add_argument(
        "--enqueue-defaults",
        action="store_true",
        help="run the adapter's known-good parameters (its default_params) as the first trial",
    )
    parser.add_argument(
        "--enqueue",
        metavar="PARAMS.yaml",
        help="run these parameters first: a YAML mapping, or a list of mappings (once per study)",
    )
    parser.add_argument(
        "--mlflow-uri",
        metavar="URI",
        help="log every trial as an MLflow run (default: $MLFLOW_TRACKING_URI; needs the mlflow extra)",
    )
