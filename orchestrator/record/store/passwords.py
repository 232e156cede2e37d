"""Passwords: every one this process has seen is hidden from its messages, logs and tracebacks."""

from __future__ import annotations

import logging
import re
import sys
import traceback
from types import TracebackType
from typing import Any
from urllib.parse import quote, unquote

from orchestrator.record.store.location import mask_password, password_of

# Passwords seen in this process (in --storage, $ORCHESTRATOR_STORAGE, a trial's job), in every
# spelling they may take in a message: as typed, decoded, and percent-encoded.
_SECRETS: set[str] = set()
# A shorter password is hidden where a URL shows it, not in every word that happens to hold it.
SHORTEST_SECRET = 4
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
_PASSWORD_IN_DSN = re.compile(r"(password\s*=\s*)('[^']*'|\S+)", re.IGNORECASE)


def remember_secret(url: str | None) -> None:
    """Hide the password of `url` from every message and log line of this process from now on."""
    password = password_of(url)
    if not password:
        return
    plain = unquote(password)
    for form in {password, plain, quote(plain, safe=""), quote(plain)}:
        if len(form) >= SHORTEST_SECRET:
            _SECRETS.add(form)


def redact(text: str) -> str:
    """`text` with every URL's password and every remembered password replaced by ***."""
    if "://" in text:
        text = _URL_IN_TEXT.sub(_mask_match, text)
    if "password" in text.lower():
        text = _PASSWORD_IN_DSN.sub(r"\1***", text)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _mask_match(match: re.Match[str]) -> str:
    # Our own messages show the form of a URL: USER:PASSWORD is a placeholder, not a secret.
    url = match.group(0)
    return url if password_of(url) == "PASSWORD" else mask_password(url)


_redacting = False


def protect_output() -> None:
    """From now on, log records and uncaught tracebacks of this process are redacted.

    A log record factory, not a handler filter, so that a handler added later (a log file) gets
    redacted records too. Idempotent; every process that opens a storage calls it."""
    global _redacting
    if _redacting:
        return
    _redacting = True
    make_record = logging.getLogRecordFactory()

    def redacted_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        message = record.getMessage()
        safe = redact(message)
        if safe != message:
            record.msg, record.args = safe, ()
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)))
            record.exc_text = record.exc_text.rstrip("\n")
        return record

    logging.setLogRecordFactory(redacted_record)

    def redacted_excepthook(
        kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))

    sys.excepthook = redacted_excepthook
