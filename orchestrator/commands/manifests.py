"""`manifests ADAPTER --study NAME --workers N`: a cluster engine's files for N workers of a study.

Kubernetes YAML for the adapter's node pool by default; `--engine compose` (or `slurm`, or any
engine listed in `deploy/engines.py`) renders that engine's files for the same workers.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import adapters
from orchestrator.deploy.engine import StudyWorkers
from orchestrator.deploy.engines import ENGINES
from orchestrator.deploy.kubernetes import (
    DEFAULT_IMAGE,
    DEFAULT_STORAGE_SECRET,
    KubernetesEngine,
    apply_commands,
)
from orchestrator.errors import UserError
from orchestrator.flags.common import command_parser, study_name, whole_number
from orchestrator.planning.workloads import add_workloads_argument, workload_class


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "manifests",
        help="write Kubernetes YAML for N GPU workers of a study on the adapter's node pool",
        example="python -m orchestrator manifests dqn --study dqn-l4 --workers 4 "
        "--image registry.example.com/orchestrator:0.1.0 --out k8s/",
    )
    parser.add_argument("adapter", metavar="ADAPTER", help="the adapter the study tunes, e.g. dqn")
    parser.add_argument(
        "--study", required=True, metavar="NAME", type=study_name, help="the study the workers join"
    )
    parser.add_argument(
        "--workers",
        type=whole_number("--workers", high=10_000, example=4),
        required=True,
        metavar="N",
        help="worker pods, one GPU each",
    )
    parser.add_argument(
        "--engine",
        choices=sorted(ENGINES),
        default=KubernetesEngine.name,
        help="the cluster engine whose files to write (default: %(default)s)",
    )
    parser.add_argument(
        "--image",
        type=image_reference,
        help=f"Kubernetes: the container image (default: {DEFAULT_IMAGE})",
    )
    parser.add_argument(
        "--storage-secret",
        type=secret_name,
        metavar="NAME",
        help=f"Kubernetes: the Secret whose key `url` holds the storage URL "
        f"(default: {DEFAULT_STORAGE_SECRET})",
    )
    parser.add_argument(
        "--epochs",
        type=whole_number("--epochs", example=8),
        metavar="N",
        help="epochs per trial, applied to the study even if it exists "
        "(default: a stored study keeps its own, a new one gets the workload class's)",
    )
    parser.add_argument(
        "--trials",
        type=whole_number("--trials", example=40),
        metavar="N",
        help="the study's trial budget, shared by all workers",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="write the files here (Kubernetes: migrate.yaml, workers.yaml, dashboard.yaml; "
        "default: print them)",
    )
    add_workloads_argument(parser)
    parser.set_defaults(handler=manifests_command)


# A container image reference as Docker and Kubernetes read it: [registry[:port]/]name[:tag][@digest],
# with lower-case path components (github.com/distribution/reference's grammar).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_IMAGE = re.compile(
    rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{{32,}})?"
)
# A Secret's name: a DNS-1123 subdomain.
_SECRET = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*")


def image_reference(text: str) -> str:
    if len(text) > 255 or not _IMAGE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"--image {text!r} is not a container image reference: write "
            "[REGISTRY/]NAME[:TAG] in lower case, e.g. registry.example.com/orchestrator:0.1.0"
        )
    return text


def secret_name(text: str) -> str:
    if len(text) > 253 or not _SECRET.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"--storage-secret {text!r} is not a Kubernetes Secret name: use lower-case letters, "
            "digits, '-' and '.', e.g. orchestrator-storage"
        )
    return text


def manifests_command(args: argparse.Namespace) -> int:
    adapter = adapters.get(args.adapter)
    wc = workload_class(adapter.workload_class, args.workloads)
    workers = StudyWorkers(
        study=args.study,
        workers=args.workers,
        workload=wc,
        adapter=args.adapter,
        trials=args.trials,
        epochs=args.epochs,
    )
    if args.engine != KubernetesEngine.name:
        for flag, value in (("--image", args.image), ("--storage-secret", args.storage_secret)):
            if value is not None:
                raise UserError(f"{flag} is for --engine kubernetes: drop it for {args.engine}")
        _write(args, ENGINES[args.engine].render(workers), [])
        return 0
    engine = KubernetesEngine(
        image=args.image or DEFAULT_IMAGE,
        storage_secret=args.storage_secret or DEFAULT_STORAGE_SECRET,
    )
    deployment = engine.deployment(workers)
    summary = (
        f"{args.adapter} is {wc.name}: {args.workers} worker(s) on "
        f"{wc.node_selector_key}={wc.node_selector_value} ({wc.gpu_kind or 'GPU'}), "
        f"cpu {wc.cpu_request}/{wc.cpu_limit}, memory {wc.memory_request}/{wc.memory_limit}, "
        f"1 GPU, {deployment.epochs_in_words}"
    )
    notes = [summary]
    if args.epochs is None and wc.default_epochs != deployment.builtin_default_epochs:
        # Workers read the image's built-in table; the local workloads file does not travel.
        notes.append(
            f"note: workers do not see the workloads file's default_epochs = {wc.default_epochs}: "
            f"pass --epochs {wc.default_epochs} to use it"
        )
    _write(args, engine.render(workers), notes)
    if args.out is not None:
        print(f"slots per GPU: {wc.plan_command(args.adapter)}")
        print("next:")
        for command in apply_commands(deployment, args.out.rstrip("/")):
            print(f"  {command}")
    return 0


def _write(args: argparse.Namespace, files: dict[str, str], notes: list[str]) -> None:
    """The engine's files on stdout (YAML documents one after another, notes on stderr as
    comments), or into --out with the notes and the names written on stdout."""
    if args.out is None:
        sys.stdout.write("---\n".join(files.values()))
        for line in notes:
            print(f"# {line}", file=sys.stderr)
        return
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text, encoding="utf-8")
    except OSError as error:
        raise UserError(
            f"cannot write to {str(out)!r} ({error.strerror}): choose another --out"
        ) from None
    for line in notes:
        print(line)
    print(f"wrote {', '.join(str(out / name) for name in files)}")
