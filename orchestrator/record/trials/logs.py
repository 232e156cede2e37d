"""Each trial's stdout and stderr in a file of its own, and `run`'s own stdout kept for its result.

A trial process sends what it prints outside a trial to stderr (`keep_stdout_clean`), so
`run --json > out.json` holds the JSON and nothing else; while a trial runs, both its streams
(Python's and any C library's: the file descriptors themselves) go to
`LOG_DIR/STUDY/trial-N.log` (`captured`). The path is the trial's `log_file` user attribute;
`python -m orchestrator logs --study S --trial N` prints it, and a failed trial's last lines
appear in `run`'s log.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from orchestrator.record.study.names import study_folder

if TYPE_CHECKING:
    from orchestrator.record.store.location import StorageLocation

LOG_DIR_SUFFIX = "-logs"


def default_log_dir(location: StorageLocation, cwd: Path | None = None) -> Path:
    """Beside an SQLite file (`study.db` -> `study-logs/`), else `orchestrator-logs/` here."""
    path = location.sqlite_path
    if path is not None:
        return path.with_name(path.stem + LOG_DIR_SUFFIX)
    return (cwd or Path.cwd()) / ("orchestrator" + LOG_DIR_SUFFIX)


def trial_log_path(log_dir: str | os.PathLike[str], study_name: str, number: int) -> Path:
    """`LOG_DIR/FOLDER/trial-N.log`, FOLDER the study's own (record/study/names.study_folder)."""
    return Path(log_dir) / study_folder(study_name) / f"trial-{number}.log"


def private_folder(path: str | os.PathLike[str]) -> Path:
    """`path` as a folder, each one this makes readable by this user only (0700, whatever the
    umask): trial logs and kept outcomes may hold what a model printed, data and scores.
    A folder that already exists is left as its owner set it (a --log-dir of /tmp, say)."""
    folder = Path(path)
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    for made in reversed(missing):  # the outermost first
        try:
            made.mkdir(mode=0o700)
        except FileExistsError:  # another process made it a moment ago
            continue
        os.chmod(made, 0o700)
    return folder


def reserve_stdout() -> TextIO:
    """A stream on this process's stdout as it is now, for the command's result alone; from now
    on anything else printed to stdout (an adapter's import, a library) goes to stderr."""
    sys.stdout.flush()
    try:
        out, err = sys.stdout.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test capturing output)
        return sys.stdout
    result = os.fdopen(os.dup(out), "w", encoding="utf-8")
    os.dup2(err, out)
    return result


def keep_stdout_clean() -> None:
    """From now on this process's stdout is its stderr (the supervisor's stdout is its result)."""
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())


@contextlib.contextmanager
def captured(path: Path) -> Iterator[None]:
    """Send this process's stdout and stderr to `path` (appending) while the block runs."""
    private_folder(path.parent)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def last_lines(path: str | os.PathLike[str], count: int = 5) -> list[str]:
    """The last `count` lines of a log file that are not blank ([] if it cannot be read)."""
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - 64 * 1024))
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return []
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return lines[-count:]
