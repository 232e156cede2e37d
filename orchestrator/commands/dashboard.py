"""`dashboard`: optuna-dashboard on the same storage, on localhost unless the user says otherwise."""

from __future__ import annotations

import argparse
import errno
import socket
import sys
from typing import TYPE_CHECKING

from orchestrator.errors import UserError
from orchestrator.flags.common import add_storage_argument, command_parser, whole_number
from orchestrator.imports import LazyImport
from orchestrator.record.store.location import StorageLocation

if TYPE_CHECKING:
    import optuna_dashboard

    from orchestrator.show import queries
else:
    optuna_dashboard = LazyImport("optuna_dashboard")
    # Ours, loaded when the command runs: cli.py imports this module for every `--help`.
    queries = LazyImport("orchestrator.show.queries")

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = command_parser(
        subparsers,
        "dashboard",
        help="start optuna-dashboard on the study storage (each trial's VRAM shows on its page)",
        example="python -m orchestrator dashboard --storage sqlite:///orchestrator.db --port 8080",
    )
    add_storage_argument(parser)
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 exposes it to the network)",
    )
    parser.add_argument(
        "--port",
        type=whole_number("--port", high=65535, example=8080),
        default=8080,
        help="port to listen on (default 8080)",
    )
    parser.set_defaults(handler=dashboard_command)


def check_port_free(host: str, port: int) -> None:
    """A UserError, in one line, when host:port cannot be listened on."""
    if not 0 < port < 65536:
        raise UserError(f"--port {port} is not a port number: use 1-65535, for example --port 8080")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise UserError(
            f"--host {host!r} is not an address of this machine ({error.strerror})"
        ) from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # The same option the dashboard's server sets, so a port in TIME_WAIT is not called busy.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise UserError(
                    f"port {port} on {host} is in use: choose another with --port, e.g. --port {port + 1}"
                ) from None
            raise UserError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None


def dashboard_command(args: argparse.Namespace) -> int:
    location = StorageLocation.resolve(args.storage)
    check_port_free(args.host, args.port)
    storage = queries.open_for_reading(location)
    if args.host not in LOCAL_HOSTS:
        print(
            f"note: listening on {args.host}, not localhost, as you chose with --host: anyone who "
            "can reach this machine can see and change the studies (the dashboard has no login)",
            file=sys.stderr,
        )
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"optuna-dashboard on http://{shown}:{args.port}/ for {location.masked} (Ctrl-C stops it)",
        flush=True,
    )
    try:
        optuna_dashboard.run_server(storage, host=args.host, port=args.port)
    except OSError as error:
        raise UserError(
            f"cannot listen on {args.host}:{args.port}: {error.strerror or error}"
        ) from None
    return 0
