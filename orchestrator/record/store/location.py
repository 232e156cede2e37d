"""Where a study's storage is: its URL read and checked once, into the value every layer is given.

A command or the Python API makes one `StorageLocation` from what the user gave (`--storage`,
$ORCHESTRATOR_STORAGE, the default file, an `optimize(storage=...)` string) and passes it down:
nothing below parses the URL again. This module is the only one that parses and checks one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.imports import LazyImport

if TYPE_CHECKING:
    import sqlalchemy as sa
else:
    sa = LazyImport("sqlalchemy")

DEFAULT_STORAGE = "sqlite:///orchestrator.db"
STORAGE_ENV = "ORCHESTRATOR_STORAGE"
GOOD_URLS = "use sqlite:///FILE.db or postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
# PostgreSQL URLs opened with psycopg2 here (see StorageLocation.parse): plain, and psycopg 3's.
PSYCOPG2_FORMS = ("postgresql", "postgresql+psycopg")


@dataclass(frozen=True)
class StorageLocation:
    """A checked storage URL. Picklable (a trial process is given one); its password never
    shows in `repr` or `str`, which are the masked URL."""

    text: str = field(repr=False)  # as the user wrote it
    url: str = field(repr=False)  # what our SQLAlchemy and Optuna open: psycopg2 for PostgreSQL
    backend: str  # "sqlite" or "postgresql"
    host: str | None = None
    port: int | None = None
    database: str | None = None

    @classmethod
    def parse(cls, text: str) -> StorageLocation:
        """Check and read `text`; a bad URL is a UserError that says what a good one looks like."""
        parsed = _checked(text)
        backend = parsed.get_backend_name()
        url = text
        if parsed.drivername in PSYCOPG2_FORMS:
            # Our processes talk to PostgreSQL through psycopg2 whatever the URL names: the
            # outage rules (record/outages/errors.py) read its exceptions and SQLSTATE codes.
            # Plain Optuna and optuna-dashboard open the URL as written: postgresql:// is psycopg
            # 3 under SQLAlchemy 2.1, which this package installs too (README, dependencies).
            url = parsed.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
        elif backend == "postgresql":
            url = parsed.render_as_string(hide_password=False)
        return cls(text, url, backend, parsed.host, parsed.port, parsed.database)

    @classmethod
    def resolve(
        cls, flag: str | StorageLocation | None, environ: Mapping[str, str] = os.environ
    ) -> StorageLocation:
        """`--storage` wins, then ORCHESTRATOR_STORAGE, then an SQLite file in the current directory."""
        if isinstance(flag, StorageLocation):
            return flag
        return cls.parse(chosen_url(flag, environ))

    @property
    def is_sqlite(self) -> bool:
        return self.backend == "sqlite"

    @property
    def sqlite_path(self) -> Path | None:
        """The file of an SQLite URL, or None for memory and other backends."""
        if not self.is_sqlite or not self.database or self.database == ":memory:":
            return None
        return Path(self.database)

    @property
    def masked(self) -> str:
        """The URL with any password replaced by ***, safe to print or log."""
        return mask_password(self.text)

    def describe(self) -> str:
        """Where the storage is, in words a user can check: the file, or host and port."""
        if self.is_sqlite:
            return f"SQLite file {self.database or ':memory:'}"
        return f"PostgreSQL at {self.host or 'localhost'}:{self.port or 5432}"

    def __str__(self) -> str:
        return self.masked

    def __repr__(self) -> str:
        return f"StorageLocation({self.masked!r})"


def chosen_url(flag: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """The URL text `--storage`, ORCHESTRATOR_STORAGE or the default gives, unchecked."""
    for value in (flag, environ.get(STORAGE_ENV)):
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


def password_of(url: str | None) -> str | None:
    """The password written in `url` (by the same rule as repair_url), or None."""
    scheme, sep, rest = (url or "").partition("://")
    if not sep or "@" not in rest or scheme.startswith("sqlite"):
        return None
    _user, colon, password = rest.rpartition("@")[0].partition(":")
    return password if colon and password else None


def mask_password(url: str) -> str:
    """The URL with any password replaced by ***, safe to print or log."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest or scheme.startswith("sqlite"):
        return url
    # By hand, not by SQLAlchemy: a URL that does not parse must be masked as well as one that does.
    credentials, _, location = rest.rpartition("@")
    user, colon, _password = credentials.partition(":")
    return f"{scheme}://{user}:***@{location}" if colon else url


def _checked(url: str) -> Any:
    """SQLAlchemy's reading of `url` (an sqlalchemy.engine.URL), checked to be one we can open."""
    try:
        parsed = sa.engine.make_url(repair_url(url))
        port = parsed.port  # SQLAlchemy reads the port as it parses; check its range here
    except (sa.exc.ArgumentError, ValueError) as error:
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
    _check_backend(url, parsed)
    return parsed


def _check_backend(url: str, parsed: Any) -> None:
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


def _is_host(host: str) -> bool:
    # A name, an IPv4 address, or the inside of [IPv6] brackets; never a bracket or a space.
    return not any(char in host for char in "[]@ /\\?#")
