"""What this product imports: its own packages, and heavy ones deferred until first used.

Our three other import packages, `adapters`, `samplers` and `migrations`, are always ours and
never a folder of the same name in the user's working directory. Python looks in the current
directory (or the script's) first, so a user's own `adapters/` would be imported instead of ours.
Importing `orchestrator` (which every command, the Python API and every trial process do first)
loads the three from beside `orchestrator` itself, with the current directory set aside for that
moment only (a user's own modules, such as an `--adapter-path` target, are still found there
afterwards). Each package carries a marker, so a same-named package from another distribution
(PyPI's `adapters`, say) is named in one clear line instead of failing somewhere later.

Heavy third-party packages (torch, optuna, numpy, plotly, matplotlib, ...) are deferred in one
way, `LazyImport`: a module names them at its top and they load on first attribute access, so
`--help` and a command that never trains or draws do not pay for them. Annotations see the real
module through an `if TYPE_CHECKING:` import of the same name:

    if TYPE_CHECKING:
        import torch
    else:
        torch = LazyImport("torch")
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import types
from pathlib import Path
from typing import Any

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


class LazyImport(types.ModuleType):
    """A module imported on first attribute access (Optuna's `_LazyImport`, as ours).

    `torch = LazyImport("torch")` at a module's top costs nothing; `torch.zeros(...)` imports torch
    then, and every later access reads the real module's attributes straight from this one's
    (copied once, so a training loop pays nothing per access).
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._name = name

    def _load(self) -> types.ModuleType:
        module = importlib.import_module(self._name)
        self.__dict__.update(module.__dict__)
        return module

    def __getattr__(self, item: str) -> Any:
        return getattr(self._load(), item)


def import_in_background(*names: str) -> threading.Thread:
    """Import `names` now, on a thread of their own, for a process that needs them later and has
    a core to spare meanwhile: a later import of one waits for this one (Python's per-module
    import lock) instead of importing it twice. Not a daemon thread: a process that ends while
    the import is under way waits for it, rather than tear a half-imported module down."""

    def load() -> None:
        for name in names:
            importlib.import_module(name)

    thread = threading.Thread(target=load, name=f"import {', '.join(names)}")
    thread.start()
    return thread
