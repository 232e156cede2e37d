"""`orchestrator.imports.import_in_background`: a module a process needs later, imported now on a
thread of its own; a later import waits for it instead of importing twice, and a process that
ends mid-import waits for it too."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

from orchestrator.imports import import_in_background

SLOW = """
import time

time.sleep({seconds})
with open({count!r}, "a") as count:
    count.write("imported\\n")
"""


def _slow_module(folder: Path, name: str, seconds: float) -> Path:
    count = folder / f"{name}.count"
    (folder / f"{name}.py").write_text(SLOW.format(seconds=seconds, count=str(count)))
    return count


def test_a_later_import_waits_for_the_background_one_and_gets_the_same_module(
    tmp_path, monkeypatch
):
    count = _slow_module(tmp_path, "slow_module_a", 1.5)
    monkeypatch.syspath_prepend(str(tmp_path))
    thread = import_in_background("slow_module_a")
    assert not count.exists()  # the caller goes on while the module is still importing
    module = importlib.import_module("slow_module_a")  # waits for the thread's import
    assert module is sys.modules["slow_module_a"]
    assert count.read_text() == "imported\n"  # its body ran once
    thread.join(timeout=10)
    assert not thread.is_alive()
    monkeypatch.delitem(sys.modules, "slow_module_a")


def test_a_process_that_ends_mid_import_waits_for_it(tmp_path):
    count = _slow_module(tmp_path, "slow_module_b", 0.5)
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from orchestrator.imports import import_in_background\n"
        "import_in_background('slow_module_b')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert count.read_text() == "imported\n"
