"""Where `--artifacts` says checkpoints go, checked before anything is stored, and stored absolute.

A place is a folder (made if missing; `file:///folder` says the same), `s3://BUCKET[/prefix]` or
`gs://BUCKET[/prefix]`. It is refused, in one line that never shows a secret, when it is empty,
holds a control character, carries credentials or a query (a checkpoint's address is shown in
logs, `best` and the dashboard: a password must not travel with it; boto3 and gcloud find their
own credentials), has another scheme, names no bucket, needs a package that is not installed, or
is a folder that cannot be made or written (a file, a read-only disk, `/proc`). A folder is
stored absolute: `worker`, `best` and every trial process read it from their own folders.

The check makes nothing it leaves behind: a folder it had to make to try a write is removed again.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import tempfile
from pathlib import Path

from orchestrator.errors import UserError

# The package each bucket's scheme needs (Optuna's Boto3ArtifactStore, GCSArtifactStore) and
# the extra that installs it.
BUCKETS = {"s3": ("boto3", "s3"), "gs": ("google.cloud.storage", "gcs")}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
WHAT = "give a folder every node can write, s3://BUCKET or gs://BUCKET"


def shown(location: str) -> str:
    """`location` as a message may show it: credentials, a query and a fragment masked, and
    control characters escaped (a message is one line)."""
    found = _SCHEME.match(location)
    text = location
    if found:
        head, rest = location[: found.end()], location[found.end() :]
        if "@" in rest:  # the host follows the last @: a password may hold / or ?
            rest = "***@" + rest.rsplit("@", 1)[1]
        for mark in "?#":
            if mark in rest:
                rest = rest.split(mark, 1)[0] + mark + "***"
        text = head + rest
    elif _looks_like_login(location):
        text = "***@" + location.split("@", 1)[1]
    return ascii(text)[1:-1] if _has_control(text) else text


def checked_location(location: str) -> str:
    """The place as it is stored: an absolute folder, or the bucket's URL. A UserError that
    names `--artifacts` (masked) and says what to do when it cannot hold checkpoints."""
    problem = _problem(location)
    if problem:
        words = ["--artifacts", shown(location).strip(), problem]
        raise UserError(" ".join(word for word in words if word))
    found = _SCHEME.match(location)
    if found and found.group(1).lower() in BUCKETS:
        return location.rstrip("/")
    folder = location[len("file://") :] if found else location
    path = Path(os.path.abspath(os.path.expanduser(folder)))
    why = folder_problem(path)
    if why:
        raise UserError(f"--artifacts {path} {why}")
    return str(path)


def _problem(location: str) -> str | None:
    """What is wrong with the text itself, before any folder is looked at."""
    if not location.strip():
        return f"is empty: {WHAT}"
    if _has_control(location):
        return f"holds a control character (a newline?): {WHAT}, its name on one line"
    found = _SCHEME.match(location)
    if found is None:
        if _looks_like_login(location):
            return "looks like user:password@host: give a folder every node mounts, or a bucket"
        return None
    scheme, rest = found.group(1).lower(), location[found.end() :]
    if "@" in rest:
        return (
            "carries credentials: give them to boto3 or gcloud as usual (their environment "
            "or config files), never in the URL"
        )
    if "?" in rest or "#" in rest:
        return "carries a query: give the bucket and its prefix alone, as in s3://BUCKET/prefix"
    if scheme == "file":
        return None if rest.startswith("/") else "names a host: give file:///FOLDER, a local path"
    if scheme not in BUCKETS:
        return f"has scheme {scheme}://: {WHAT} (or file:///FOLDER)"
    if not rest.strip("/"):
        return f"names no bucket: give {scheme}://BUCKET"
    return _package_problem(scheme)


def _package_problem(scheme: str) -> str | None:
    module, extra = BUCKETS[scheme]
    try:
        importlib.import_module(module)
    except Exception:  # missing, or broken as it loads: either way no store can be made
        return (
            f"needs {module}, which cannot be imported here: "
            f"pip install 'gpu-study-orchestrator[{extra}]'"
        )
    return None


def folder_problem(folder: Path) -> str | None:
    """Why `folder` cannot hold checkpoints (made if missing, a file written and removed there),
    or None. Whatever this makes to find out, it removes."""
    if folder.exists() and not folder.is_dir():
        return "is a file, not a folder: give a folder (it is made if missing)"
    made: list[Path] = []
    try:
        for part in reversed([folder, *folder.parents]):
            if not part.exists():
                part.mkdir()
                made.append(part)
    except OSError as error:
        _remove(made)
        return f"cannot be made ({_cause(error)}): give a folder this user can make or write"
    try:
        handle, probe = tempfile.mkstemp(prefix=".orchestrator-probe-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        return f"cannot be written ({_cause(error)}): make it writable, or give another folder"
    finally:
        _remove(made)
    return None


def _remove(made: list[Path]) -> None:
    for part in reversed(made):  # the deepest first
        with contextlib.suppress(OSError):
            part.rmdir()


def _cause(error: OSError) -> str:
    return os.strerror(error.errno) if error.errno else type(error).__name__


def _has_control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def _looks_like_login(text: str) -> bool:
    """`user:password@host:/path`, as scp takes it: a plain folder name never starts so."""
    first = text.split("/", 1)[0]
    return "@" in first and ":" in first.split("@", 1)[0]
