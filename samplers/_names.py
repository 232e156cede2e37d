"""The samplers' names, apart from the samplers: `run --sampler` offers them without loading Optuna."""

from __future__ import annotations

# Every name `make_sampler` knows, the default first: the one list (`run --sampler` offers it).
SAMPLER_NAMES = ("pso", "tpe", "random", "qmc", "cmaes", "nsga2", "grid", "pbt")
# The samplers that model a single objective only: asked for more, they refuse.
SINGLE_OBJECTIVE_ONLY = ("qmc", "cmaes", "pbt")
