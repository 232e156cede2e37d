"""Kubernetes objects per workload class: the workers, the migration, the dashboard.

The manifests are plain dictionaries built by pure functions, so tests can validate them against
the Kubernetes API models and check the routing without a cluster:

- `worker_job`: an Indexed Job of N workers on the class's node pool, one GPU each. A Job, not a
  Deployment: a study has a budget, and a worker exits 0 when it is spent. A Deployment restarts
  every exited container (restartPolicy Always is its only choice), so finished workers would
  crash-loop; a Job counts them as done. Indexed gives each worker a stable number
  (JOB_COMPLETION_INDEX) and a retry budget of its own, so one bad node does not fail the study.
- `migration_job`: the one-off `db upgrade`, applied and waited for before the workers.
- `dashboard_deployment` + `dashboard_service`: optuna-dashboard on the same storage, which does
  run forever, so a Deployment suits it.

The storage URL always comes from a Secret (env ORCHESTRATOR_STORAGE); it is never written here.
`KubernetesEngine` is the `ClusterEngine` that renders these files; the worker's command line is
`engine.worker_argv`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator.deploy.engine import StudyWorkers, program, worker_argv
from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.planning.workloads import WORKLOAD_CLASSES
from orchestrator.record.store.location import STORAGE_ENV

if TYPE_CHECKING:
    import yaml

    from orchestrator.planning.workloads import WorkloadClass
else:
    yaml = LazyImport("yaml")

APP = "gpu-study-orchestrator"
DEFAULT_IMAGE = f"{APP}:latest"
DEFAULT_STORAGE_SECRET = "orchestrator-storage"
STORAGE_SECRET_KEY = "url"
DASHBOARD_PORT = 8080
RUN_AS_USER = 10001  # the Dockerfile's non-root user
# A worker that gets SIGTERM lets running trials finish for a while, then re-queues them.
WORKER_GRACE_SECONDS = 120
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class Deployment:
    """What the user asked to deploy: one adapter's study, N workers, and where things come from."""

    adapter: str
    workload: WorkloadClass
    study: str
    workers: int
    image: str = DEFAULT_IMAGE
    storage_secret: str = DEFAULT_STORAGE_SECRET
    # None: workers leave a stored study's epochs alone; a new one gets its class's default.
    epochs: int | None = None
    trials: int | None = None  # None: the budget already stored with the study

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise UserError(f"--workers {self.workers}: give at least 1 worker")
        if self.epochs is not None and self.epochs < 1:
            raise UserError(f"--epochs {self.epochs}: give at least 1 epoch")
        if self.trials is not None and self.trials < 1:
            raise UserError(f"--trials {self.trials}: give at least 1 trial")
        if not self.study.strip():
            raise UserError("--study is empty: name the study, e.g. --study dqn-l4")
        if not _SECRET_NAME.match(self.storage_secret):
            raise UserError(
                f"--storage-secret {self.storage_secret!r} is not a Kubernetes name: "
                "use lowercase letters, digits and '-', e.g. orchestrator-storage"
            )

    @property
    def epochs_in_words(self) -> str:
        """What epochs the workers train for, as the summary and the Job's annotation say it."""
        if self.epochs is not None:
            return f"{self.epochs} epochs per trial"
        return (
            f"the study's stored epochs per trial ({self.builtin_default_epochs} for a new study)"
        )

    @property
    def builtin_default_epochs(self) -> int:
        """The default a worker's `run` applies: the image's built-in table, not a local file."""
        builtin = WORKLOAD_CLASSES.get(self.workload.name)
        return builtin.default_epochs if builtin else self.workload.default_epochs

    @property
    def base_name(self) -> str:
        return object_name(self.study)


_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def object_name(study: str, limit: int = 40) -> str:
    """A Kubernetes object name (DNS-1123 label) for a study name, with room for suffixes."""
    name = re.sub(r"[^a-z0-9-]+", "-", study.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)[:limit].strip("-")
    return name or "study"


def label_value(text: str) -> str:
    """A label value (at most 63 characters of [A-Za-z0-9-_.], alphanumeric at both ends)."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63]
    return value.strip("-_.")


def _labels(d: Deployment, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": APP,
        "app.kubernetes.io/instance": d.base_name,
        "app.kubernetes.io/component": component,
    }


def _storage_env(d: Deployment) -> list[dict[str, Any]]:
    return [
        {
            "name": STORAGE_ENV,
            "valueFrom": {"secretKeyRef": {"name": d.storage_secret, "key": STORAGE_SECRET_KEY}},
        },
        {"name": "PYTHONUNBUFFERED", "value": "1"},  # log lines reach `kubectl logs` at once
    ]


def _security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def _pod_security_context() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER}


def _container(
    d: Deployment,
    name: str,
    args: list[str],
    *,
    resources: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """`python -m orchestrator ARGS` in the image, on the study's storage, as a non-root user."""
    return {
        "name": name,
        "image": d.image,
        "imagePullPolicy": "IfNotPresent",
        "command": program(),
        "args": args,
        "env": _storage_env(d),
        **extra,
        # Without a GPU (the migration, the dashboard) a container asks for little.
        "resources": resources
        or {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"cpu": "1", "memory": "1Gi"},
        },
        "securityContext": _security_context(),
    }


def worker_args(d: Deployment) -> list[str]:
    """A worker's command line after `python -m orchestrator`.

    Every pod runs `run ADAPTER --study NAME`, which creates the study with its settings or joins
    it as it is stored, so no pod depends on another having started first. A pod that loses the
    race to create the study fails once and its index is retried (backoffLimitPerIndex), joining.
    `run` applies an explicit --epochs to a stored study, so it is passed only when the user gave
    one: otherwise a study made with `--epochs 2` would be changed to the class default.
    """
    # The pod holds exactly one GPU (the device plugin shows it alone), so auto finds that one.
    argv = worker_argv(d.study, adapter=d.adapter, epochs=d.epochs, trials=d.trials, gpus="auto")
    return argv[len(program()) :]  # the container's command is the program, its args the rest


def worker_job(d: Deployment) -> dict[str, Any]:
    """N workers of the adapter's class, on its node pool, one GPU each."""
    wc = d.workload
    labels = {
        **_labels(d, "worker"),
        "orchestrator/workload-class": wc.name,
        "orchestrator/adapter": label_value(d.adapter),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{d.base_name}-workers",
            "labels": labels,
            "annotations": {
                "orchestrator/study": d.study,
                "orchestrator/gpu-kind": wc.gpu_kind,
                "orchestrator/epochs": d.epochs_in_words,
                "orchestrator/plan": wc.plan_command(d.adapter),
            },
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": d.workers,
            "parallelism": d.workers,
            "backoffLimitPerIndex": 3,
            "podFailurePolicy": {
                "rules": [
                    {
                        # A drained or preempted node is not the worker's fault: retry freely.
                        "action": "Ignore",
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    },
                ]
            },
            "ttlSecondsAfterFinished": 86400,
            "template": {"metadata": {"labels": labels}, "spec": _worker_pod(d)},
        },
    }


def _worker_pod(d: Deployment) -> dict[str, Any]:
    """One worker's pod: one GPU, the class's CPU and memory, a /dev/shm big enough for torch."""
    wc = d.workload
    container = _container(
        d,
        "worker",
        worker_args(d),
        resources={
            "requests": {"cpu": wc.cpu_request, "memory": wc.memory_request, GPU_RESOURCE: "1"},
            "limits": {"cpu": wc.cpu_limit, "memory": wc.memory_limit, GPU_RESOURCE: "1"},
        },
        # Trial processes share tensors through /dev/shm, which is 64 MiB in a pod by default.
        volumeMounts=[{"name": "dshm", "mountPath": "/dev/shm"}],
    )
    return {
        "restartPolicy": "Never",  # podFailurePolicy needs it; the Job makes a replacement pod
        "nodeSelector": wc.node_selector,
        # GPU pools are commonly tainted so that only pods asking for a GPU land there.
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": WORKER_GRACE_SECONDS,
        "securityContext": _pod_security_context(),
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}],
    }


def migration_job(d: Deployment) -> dict[str, Any]:
    """`db upgrade` once: Optuna's tables, then ours. Workers start after it completes."""
    labels = _labels(d, "migrate")
    container = _container(d, "migrate", ["db", "upgrade"])
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{d.base_name}-migrate", "labels": labels},
        "spec": {
            "backoffLimit": 4,
            "activeDeadlineSeconds": 600,
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "securityContext": _pod_security_context(),
                    "containers": [container],
                },
            },
        },
    }


def dashboard_deployment(d: Deployment) -> dict[str, Any]:
    """optuna-dashboard on the study's storage; no GPU, so it runs on any node."""
    labels = _labels(d, "dashboard")
    container = _container(
        d,
        "dashboard",
        # 0.0.0.0 inside the pod so the Service reaches it; the Service itself stays in-cluster.
        ["dashboard", "--host", "0.0.0.0", "--port", str(DASHBOARD_PORT)],
        ports=[{"name": "http", "containerPort": DASHBOARD_PORT}],
        # A TCP probe: the dashboard's static files answer 500 to clients that send no Accept-Encoding.
        readinessProbe={
            "tcpSocket": {"port": "http"},
            "initialDelaySeconds": 5,
            "periodSeconds": 10,
        },
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{d.base_name}-dashboard", "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"securityContext": _pod_security_context(), "containers": [container]},
            },
        },
    }


def dashboard_service(d: Deployment) -> dict[str, Any]:
    """A ClusterIP Service: reach it with `kubectl port-forward`, or put your own Ingress in front."""
    labels = _labels(d, "dashboard")
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{d.base_name}-dashboard", "labels": labels},
        "spec": {
            "type": "ClusterIP",
            "selector": labels,
            "ports": [{"name": "http", "port": DASHBOARD_PORT, "targetPort": "http"}],
        },
    }


def manifests(d: Deployment) -> dict[str, list[dict[str, Any]]]:
    """File name -> the objects in it, in the order they are applied."""
    return {
        "migrate.yaml": [migration_job(d)],
        "workers.yaml": [worker_job(d)],
        "dashboard.yaml": [dashboard_deployment(d), dashboard_service(d)],
    }


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """Objects as one multi-document YAML text, keys in the order written above."""

    class Dumper(yaml.SafeDumper):
        # Shared label dictionaries would otherwise come out as &id001 anchors and aliases.
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return yaml.dump_all(objects, Dumper=Dumper, sort_keys=False, default_flow_style=False)


def apply_commands(d: Deployment, out: str) -> list[str]:
    """The kubectl commands that start what `manifests` wrote to `out`, in order."""
    return [
        f"kubectl create secret generic {d.storage_secret} "
        f"--from-literal={STORAGE_SECRET_KEY}='postgresql://USER:PASSWORD@HOST:5432/DATABASE'",
        f"kubectl apply -f {out}/migrate.yaml",
        f"kubectl wait --for=condition=complete --timeout=10m job/{d.base_name}-migrate",
        f"kubectl apply -f {out}/workers.yaml -f {out}/dashboard.yaml",
        f"kubectl port-forward svc/{d.base_name}-dashboard {DASHBOARD_PORT}:{DASHBOARD_PORT}",
    ]


@dataclass(frozen=True)
class KubernetesEngine:
    """The cluster engine for Kubernetes: an Indexed Job of one-GPU pods, after the migration."""

    name: ClassVar[str] = "kubernetes"
    image: str = DEFAULT_IMAGE
    storage_secret: str = DEFAULT_STORAGE_SECRET

    def render(self, workers: StudyWorkers) -> dict[str, str]:
        """migrate.yaml, workers.yaml and dashboard.yaml, in the order they are applied."""
        objects = manifests(self.deployment(workers))
        return {name: to_yaml(items) for name, items in objects.items()}

    def deployment(self, workers: StudyWorkers) -> Deployment:
        """What the manifests are made from, and what `manifests` says of them."""
        if workers.adapter is None:
            # Every pod runs `run ADAPTER`, so that none depends on another creating the study.
            raise UserError("Kubernetes workers run `run ADAPTER`: give the study's adapter")
        return Deployment(
            adapter=workers.adapter,
            workload=workers.workload,
            study=workers.study,
            workers=workers.workers,
            image=self.image,
            storage_secret=self.storage_secret,
            epochs=workers.epochs,
            trials=workers.trials,
        )
