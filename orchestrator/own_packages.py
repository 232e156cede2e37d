"""Our three other import packages, `adapters`, `samplers` and `migrations`, and never a folder of
the same name in the user's working directory.

Python looks in the current directory (or the script's) first, so a user's own `adapters/` would
be imported instead of ours. Importing this package (which every command, the Python API and
every trial process do first) loads the three from beside `orchestrator` itself, with the
current directory set aside for that moment only (a user's own modules, such as an
`--adapter-path` target, are still found there afterwards). Each package carries a marker, so a
same-named package from another distribution (PyPI's `adapters`, say) is named in one clear line
instead of failing somewhere later.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

OWN_PACKAGES = ("adapters", "samplers", "migrations")
MARKER = "__gpu_study_orchestrator__"  # set in each of our packages' __init__
HOME = Path(__file__).absolute().parent.parent  # where our packages sit beside `orchestrator`


class ForeignPackage(ImportError):
    """A package we need is another distribution's."""


def load_own_packages() -> None:
    cwd = {"", os.getcwd(), str(Path(sys.argv[0]).resolve().parent) if sys.argv[0] else ""}
    saved = list(sys.path)
    kept = [entry for entry in saved if entry not in cwd and Path(entry or ".").resolve() != HOME]
    sys.path[:] = [str(HOME), *kept]
    try:
        for name in OWN_PACKAGES:
            module = sys.modules.get(name) or importlib.import_module(name)
            if not getattr(module, MARKER, False):
                where = getattr(module, "__file__", None) or list(getattr(module, "__path__", []))
                raise ForeignPackage(
                    f"the package {name!r} at {where} is not gpu-study-orchestrator's: another "
                    f"distribution installed one under that name; `pip uninstall` it (`pip show "
                    f"-f` names its owner) or install this project in a virtual environment of "
                    f"its own"
                )
    finally:
        sys.path[:] = saved
