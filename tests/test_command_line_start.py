"""What the command line loads before it does any work: `--help` answers without the heavy packages.

The time itself is measured by benchmarks/bench_cli_start.py; this checks the behaviour that
keeps it small, in a fresh interpreter as a user's command runs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Each is loaded by the work of some command and by no command's help.
NOT_FOR_HELP = (
    "torch",
    "optuna",
    "sqlalchemy",
    "numpy",
    "alembic",
    "importlib.metadata",  # the adapters' entry points and --version only
    "hashlib",  # OpenSSL: a study made or a name hashed
    "orchestrator.api",  # the Python API, loaded on first use of orchestrator.optimize/plan
    "orchestrator.launch",
)


def _loaded_by(*argv: str) -> list[str]:
    code = (
        "import json, sys\n"
        "from orchestrator.cli import main\n"
        f"try:\n    main({list(argv)!r})\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps([m for m in {list(NOT_FOR_HELP)!r} if m in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [("--help",), ("run", "--help"), ("plan", "--help")])
def test_help_loads_none_of_the_heavy_packages(argv):
    assert _loaded_by(*argv) == []


def test_the_python_api_loads_when_first_used():
    code = (
        "import sys, orchestrator\n"
        "before = 'orchestrator.api' in sys.modules\n"
        "optimize = orchestrator.optimize\n"
        "print(before, 'orchestrator.api' in sys.modules, optimize.__module__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["False", "True", "orchestrator.api"]


def test_an_unknown_name_of_the_package_is_an_attribute_error():
    import orchestrator

    with pytest.raises(AttributeError, match="no attribute 'optimise'"):
        orchestrator.optimise  # noqa: B018
