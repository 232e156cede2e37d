"""The cluster engines by name: Slurm, Kubernetes and docker compose, each a `ClusterEngine`.

A new engine is one module of `deploy/` with a class that has a `name` and a `render`, plus a line
here; tests/test_cluster_engines.py then checks that it starts the same worker as the others.
The interface itself lives in `deploy/engine.py`, which the engine modules import; the list is
here so that no engine module imports another.
"""

from __future__ import annotations

from orchestrator.deploy.compose import ComposeEngine
from orchestrator.deploy.engine import ClusterEngine
from orchestrator.deploy.kubernetes import KubernetesEngine
from orchestrator.deploy.slurm import SlurmEngine
from orchestrator.errors import UserError

# Each with its defaults: one GPU per Slurm node, the default image and Secret on Kubernetes.
ENGINES: dict[str, ClusterEngine] = {
    engine.name: engine for engine in (SlurmEngine(), KubernetesEngine(), ComposeEngine())
}


def engine_named(name: str) -> ClusterEngine:
    """The engine the user named, or a one-line error listing the others."""
    try:
        return ENGINES[name]
    except KeyError:
        raise UserError(
            f"no cluster engine {name!r}: choose one of {', '.join(sorted(ENGINES))}"
        ) from None
