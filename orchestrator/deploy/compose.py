"""Compose: one GPU per worker replica, claimed through lock files in a shared volume.

`python -m orchestrator.deploy.compose claim-gpu -- COMMAND...` is the compose worker's entrypoint:
Docker gives `count: 1` replicas the same first GPU, so every replica sees all GPUs and takes the
first one whose lock file it can hold, then runs COMMAND with `--gpus INDEX`.

`ComposeEngine` is the cluster engine for one GPU host: it renders docker-compose.yml for a study
(`compose_file`), the worker's command line from `engine.worker_argv`. The repository's own
docker-compose.yml is that file for the study its `.env` names (`repository_file`).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from orchestrator.deploy.engine import STORAGE_ENV, StudyWorkers, program, worker_argv
from orchestrator.errors import UserError
from orchestrator.gpu import select_devices

CLAIMS_DIR = "/var/lib/orchestrator/gpu-claims"
USER_ERROR_EXIT = 2  # what the CLI returns for a UserError


def claim_gpu(lock_dir: str | Path, gpu_count: int) -> tuple[int, int]:
    """Take the first of `gpu_count` GPUs that no other process holds: (index, open lock fd).

    The lock is an flock on `lock_dir/gpu-INDEX.lock`, shared by every replica through one volume;
    the kernel drops it when the holding process exits, so a crashed worker never leaves a stale claim.
    """
    if gpu_count < 1:
        raise UserError(
            "no GPU is visible in this container: install the NVIDIA Container Toolkit on the host "
            "and keep the worker's GPU reservation in docker-compose.yml"
        )
    Path(lock_dir).mkdir(parents=True, exist_ok=True)
    for index in range(gpu_count):
        fd = os.open(os.path.join(lock_dir, f"gpu-{index}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {os.uname().nodename}\n".encode())
        return index, fd
    raise UserError(
        f"all {gpu_count} GPUs of this host already have a worker: "
        f"scale to at most {gpu_count} with `docker compose up --scale worker={gpu_count}`"
    )


def _visible_gpu_count() -> int:
    _, devices = select_devices("auto")
    return len(devices)


def claim_gpu_main(argv: list[str]) -> int:
    """`claim-gpu [--locks DIR] [--gpu-count N] -- COMMAND...`: exec COMMAND --gpus INDEX, holding the lock."""
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.deploy.compose claim-gpu",
        description="Take a GPU no other replica holds, then run COMMAND with --gpus INDEX.",
    )
    parser.add_argument(
        "--locks", default=CLAIMS_DIR, metavar="DIR", help="lock files, shared by all replicas"
    )
    parser.add_argument(
        "--gpu-count", type=int, metavar="N", help="GPUs to share (default: those NVML sees)"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    try:
        count = args.gpu_count if args.gpu_count is not None else _visible_gpu_count()
        index, fd = claim_gpu(args.locks, count)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return USER_ERROR_EXIT
    print(f"worker takes GPU {index} of {count}", file=sys.stderr, flush=True)
    os.set_inheritable(fd, True)  # the lock lives as long as the command does
    os.execvp(command[0], [*command, "--gpus", str(index)])
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["claim-gpu"]:
        print(
            "usage: python -m orchestrator.deploy.compose claim-gpu [--locks DIR] -- COMMAND...",
            file=sys.stderr,
        )
        return USER_ERROR_EXIT
    return claim_gpu_main(argv[1:])


# docker-compose.yml with the worker's lines left out: @WORKERS@, @ENTRYPOINT@, @NOTE@, @COMMAND@.
_COMPOSE_FILE = """\
# One host with GPUs: PostgreSQL, the schema migration, optuna-dashboard and N GPU workers.
#   cp .env.example .env                       # then set POSTGRES_PASSWORD in .env
#   docker compose up -d --build --scale worker=@WORKERS@
# Every worker holds one GPU (see the worker's entrypoint); docs/deploy.md has the details.
name: orchestrator

x-orchestrator: &orchestrator
  build: .
  image: gpu-study-orchestrator:latest
  environment:
    @STORAGE_ENV@: "postgresql+psycopg2://orchestrator:${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD \
in .env (cp .env.example .env)}@postgres:5432/studies"

services:
  postgres:
    image: postgres:16-bookworm
    env_file: .env  # POSTGRES_PASSWORD; the file is not committed
    environment:
      POSTGRES_USER: orchestrator
      POSTGRES_DB: studies
    volumes:
      - pgdata:/var/lib/postgresql/data
    ports:
      - "${POSTGRES_BIND:-127.0.0.1}:5432:5432"
    healthcheck:
      test: ["CMD-SHELL", "pg_isready -U orchestrator -d studies"]
      interval: 5s
      timeout: 5s
      retries: 12
      start_period: 10s
    restart: unless-stopped

  migrate:
    <<: *orchestrator
    command: ["db", "upgrade"]
    depends_on:
      postgres:
        condition: service_healthy
    restart: "no"

  dashboard:
    <<: *orchestrator
    # 0.0.0.0 inside the container; the published port is bound to 127.0.0.1 on the host.
    command: ["dashboard", "--host", "0.0.0.0", "--port", "8080"]
    ports:
      - "127.0.0.1:${DASHBOARD_PORT:-8080}:8080"
    depends_on:
      migrate:
        condition: service_completed_successfully
    restart: unless-stopped

  worker:
    <<: *orchestrator
    # Docker hands every `count: 1` replica the same first GPU, so each replica sees all GPUs and
    # claims a free one (a lock file in the shared volume), then runs with --gpus INDEX.
    entrypoint:
@ENTRYPOINT@
    # @NOTE@
    command: @COMMAND@
    volumes:
      - gpu-claims:@CLAIMS_DIR@
    shm_size: 2gb  # trial processes share tensors through /dev/shm
    stop_grace_period: 2m  # running trials finish or are re-queued
    depends_on:
      migrate:
        condition: service_completed_successfully
    restart: on-failure:3
    deploy:
      resources:
        reservations:
          devices:
            - driver: nvidia
              count: all
              capabilities: [gpu]

volumes:
  pgdata:
  gpu-claims:
"""
_CLAIM_GPU = ["python", "-m", "orchestrator.deploy.compose", "claim-gpu", "--locks", CLAIMS_DIR]


def compose_file(argv: list[str], workers: int) -> str:
    """docker-compose.yml whose worker replicas run `argv` (claim-gpu adds --gpus INDEX).

    `argv` is written as compose reads it: a `$` in it is compose's variable, as in the
    repository's file; `ComposeEngine.render` doubles a literal one.
    """
    head = program()
    if argv[: len(head)] != head:
        raise ValueError(f"a compose worker runs the image's `{' '.join(head)}`, not {argv[:3]}")
    # The entrypoint ends with the program; the service's command is what follows it.
    entrypoint = [*_CLAIM_GPU, "--", *head]
    note = (
        "`worker` joins the study as it is stored."
        if argv[len(head)] == "worker"
        else "`run` creates the study with its settings or joins it as stored."
    )
    replacements = {
        "@WORKERS@": str(workers),
        "@STORAGE_ENV@": STORAGE_ENV,
        "@ENTRYPOINT@": "\n".join(f"      - {part}" for part in entrypoint),
        "@NOTE@": note,
        "@COMMAND@": json.dumps(argv[len(head) :]),  # a JSON list is a YAML flow sequence
        "@CLAIMS_DIR@": CLAIMS_DIR,
    }
    text = _COMPOSE_FILE
    for marker, value in replacements.items():
        text = text.replace(marker, value)
    return text


def repository_file() -> str:
    """The repository's docker-compose.yml: the study, adapter and budget come from `.env`."""
    argv = worker_argv("${STUDY:-dqn}", adapter="${ADAPTER:-dqn}", trials="${TRIALS:-200}")
    return compose_file(argv, workers=2)


def _literal(text: str) -> str:
    """Text compose reads as itself: it takes `$` for a variable anywhere, and `$$` for a `$`."""
    return text.replace("$", "$$")


@dataclass(frozen=True)
class ComposeEngine:
    """The cluster engine for one GPU host: a worker replica per GPU, with docker compose."""

    name: ClassVar[str] = "compose"

    def render(self, workers: StudyWorkers) -> dict[str, str]:
        """docker-compose.yml for the study; `--scale worker=N` in its first lines starts N."""
        adapter = None if workers.adapter is None else _literal(workers.adapter)
        argv = worker_argv(
            _literal(workers.study), adapter=adapter, trials=workers.trials, epochs=workers.epochs
        )
        return {"docker-compose.yml": compose_file(argv, workers.workers)}


if __name__ == "__main__":
    raise SystemExit(main())
