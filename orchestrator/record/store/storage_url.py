"""Storage URLs: which one a command uses, checking and normalising it, masking its password, where it points."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import UserError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

DEFAULT_STORAGE = "sqlite:///orchestrator.db"
STORAGE_ENV = "ORCHESTRATOR_STORAGE"


def resolve_storage_url(cli_value: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """`--storage` wins, then ORCHESTRATOR_STORAGE, then an SQLite file in the current directory."""
    for value in (cli_value, environ.get(STORAGE_ENV)):
        if value:
            return value
    return DEFAULT_STORAGE


def repair_url(url: str) -> str:
    """The URL with any '@' inside the user or password written as %40.

    SQLAlchemy ends the password at its first '@', so `u:Tr0ub@dor@host` would connect to the
    host "dor@host" and print the password's tail in the error. The host is what follows the
    last '@'; everything between '://' and it is credentials. (An SQLite path may hold an '@'.)
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.startswith("sqlite") or rest.count("@") < 2:
        return url
    credentials, _, location = rest.rpartition("@")
    return f"{scheme}://{credentials.replace('@', '%40')}@{location}"


GOOD_URLS = "use sqlite:///FILE.db or postgresql://USER:PASSWORD@HOST:PORT/DATABASE"


def parse_url(url: str) -> URL:
    """Parse and check a storage URL; a bad one is a UserError that says what a good one looks like."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(repair_url(url))
        port = parsed.port  # SQLAlchemy reads the port as it parses; check its range here
    except (ArgumentError, ValueError) as error:
        location = url.rpartition("@")[2]
        why = (
            "an IPv6 host needs its closing bracket, e.g. [::1]:5432"
            if "[" in location and "]" not in location
            else "its port is not a number"
            if "int()" in str(error)
            else "it is malformed"
        )
        raise UserError(f"the storage URL {mask_password(url)!r}: {why}; {GOOD_URLS}") from None
    if port is not None and not 0 < port < 65536:
        raise UserError(
            f"the storage URL {mask_password(url)!r} has port {port}: use 1-65535 (PostgreSQL's "
            "is 5432)"
        )
    parts = (parsed.username, parsed.password, parsed.host, parsed.database)
    if any("\x00" in str(part) for part in parts if part is not None):
        raise UserError(
            f"the storage URL {mask_password(url)!r} holds a NUL character (%00), which no "
            "database accepts: remove it"
        )
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise UserError(f"the storage URL {mask_password(url)!r} names {backend!r}: {GOOD_URLS}")
    if backend == "sqlite" and parsed.host:
        # sqlite://cli.db: two slashes make "cli.db" a host, which SQLite has no use for.
        raise UserError(
            f"the storage URL {url!r} names no SQLite file (two slashes make {parsed.host!r} a "
            f"host): use three, sqlite:///{parsed.host}{'/' + parsed.database if parsed.database else ''}"
        )
    if backend == "postgresql" and parsed.host and not _is_host(parsed.host):
        raise UserError(
            f"the storage URL {mask_password(url)!r} has no readable host: {GOOD_URLS} "
            "(an IPv6 address goes in brackets, [::1])"
        )
    return parsed


def _is_host(host: str) -> bool:
    # A name, an IPv4 address, or the inside of [IPv6] brackets; never a bracket or a space.
    return not any(char in host for char in "[]@ /\\?#")


def normalize_url(url: str) -> str:
    """A plain postgresql:// URL uses psycopg2, the driver we install (SQLAlchemy 2.1 would pick psycopg 3)."""
    parsed = parse_url(url)
    if parsed.drivername == "postgresql":
        return parsed.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    if parsed.get_backend_name() == "postgresql":
        return parsed.render_as_string(hide_password=False)
    return url


def mask_password(url: str) -> str:
    """The URL with any password replaced by ***, safe to print or log."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest or scheme.startswith("sqlite"):
        return url
    # By hand, not by SQLAlchemy: a URL that does not parse must be masked as well as one that does.
    credentials, _, location = rest.rpartition("@")
    user, colon, _password = credentials.partition(":")
    return f"{scheme}://{user}:***@{location}" if colon else url


def describe_location(url: str) -> str:
    """Where a storage is, in words a user can check: the file, or host and port."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        return f"SQLite file {parsed.database or ':memory:'}"
    return f"PostgreSQL at {parsed.host or 'localhost'}:{parsed.port or 5432}"


def is_sqlite(url: str) -> bool:
    return parse_url(url).get_backend_name() == "sqlite"


def sqlite_path(url: str) -> Path | None:
    """The file of an SQLite URL, or None for memory and other backends."""
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)
