"""The one error type a user can fix: the CLI prints its message on one line and exits 2
(or the status a subclass names, such as an outage that outlasted its bound)."""

from __future__ import annotations


class UserError(Exception):
    """Something the user typed or set up is wrong; the message says what to do."""

    exit_status = 2
