"""A study's name: what the database holds, and the one folder of its own it gets on disk.

A study name is any text the database stores (up to 512 characters), but a folder name is not:
`..` would put a study's trial logs and spool in the parent of the log folder, `c/d` would make a
sub-folder, and `c/d` and `c?d` would share one if unsafe characters were only replaced. So a
name made only of letters, digits, `-`, `_` and inner dots is its own folder, as it always was;
any other name gets a readable slug of it plus a short hash of the whole name, which keeps two
names apart and every folder inside the log root and short enough for the file system.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import hashlib
else:
    hashlib = LazyImport("hashlib")  # OpenSSL's hashes: loaded when a name is hashed, not by --help

STUDY_NAME_MAX = 512  # Optuna's studies.study_name column
_SLUG_MAX = 80  # the readable part of a folder name; with the hash well under NAME_MAX (255)
_PLAIN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,79}")
# What a folder made from a slug ends with: a plain name that looks like one is hashed too,
# so that no plain name can be the folder of another study's unsafe name.
_HASHED = re.compile(r".*-[0-9a-f]{10}")


def name_problem(name: object) -> str | None:
    """Why `name` cannot name a study (empty, several lines, longer than the database holds),
    in words that follow the name as typed; None when it can."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not text"
    if not name.strip():
        return "is empty: name the study, e.g. dqn-l4"
    if any(not char.isprintable() for char in name):
        return "holds a control character (a newline, a tab): use letters, digits, '-' and '_'"
    if len(name) > STUDY_NAME_MAX:
        return f"is {len(name)} characters long: the database holds at most {STUDY_NAME_MAX}"
    return None


def study_folder(name: str) -> str:
    """The name of the study's own folder under the log root: never `.`, `..`, a path, or
    another study's folder."""
    if _PLAIN.fullmatch(name) and not _HASHED.fullmatch(name) and not name.endswith("."):
        return name
    slug = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_")[:_SLUG_MAX] or "study"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{slug}-{digest}"
