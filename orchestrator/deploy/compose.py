"""Compose: one GPU per worker replica, claimed through lock files in a shared volume.

`python -m orchestrator.deploy.compose claim-gpu -- COMMAND...` is the compose worker's entrypoint:
Docker gives `count: 1` replicas the same first GPU, so every replica sees all GPUs and takes the
first one whose lock file it can hold, then runs COMMAND with `--gpus INDEX`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from orchestrator.errors import UserError

CLAIMS_DIR = "/var/lib/orchestrator/gpu-claims"
USER_ERROR_EXIT = 2  # what the CLI returns for a UserError


def claim_gpu(lock_dir: str | Path, gpu_count: int) -> tuple[int, int]:
    """Take the first of `gpu_count` GPUs that no other process holds: (index, open lock fd).

    The lock is an flock on `lock_dir/gpu-INDEX.lock`, shared by every replica through one volume;
    the kernel drops it when the holding process exits, so a crashed worker never leaves a stale claim.
    """
    import fcntl

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
    from orchestrator.gpu import select_devices

    _, devices = select_devices("auto")
    return len(devices)


def claim_gpu_main(argv: list[str]) -> int:
    """`claim-gpu [--locks DIR] [--gpu-count N] -- COMMAND...`: exec COMMAND --gpus INDEX, holding the lock."""
    import argparse

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


if __name__ == "__main__":
    raise SystemExit(main())
