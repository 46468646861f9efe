"""Hide passwords in URLs before they reach a message, a log, a store or an exported file."""

from __future__ import annotations

import logging
import re
from typing import Any

# The password runs to the last "@" of the authority part (it may itself contain "@").
_PASSWORD = re.compile(
    r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)(?P<secret>[^/\s]*)(?P<tail>@)"
)


def redact(text: str) -> str:
    """`postgresql://user:secret@host/db` -> `postgresql://user:***@host/db`, anywhere in `text`."""
    return _PASSWORD.sub(lambda m: f"{m['head']}***{m['tail']}", text)


def redact_values(value: Any) -> Any:
    """A copy of `value` (dicts, lists, tuples of plain values) with every string redacted.

    For anything written out whole: JSON outputs, study attributes, presets.
    """
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_values(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_values(item) for item in value)
    return value


def redact_log_records() -> None:
    """Redact the message of every log record this process creates, whatever its logger.

    Installed once by the command lines (`common.cli.run_cli`); it covers libraries' own
    loggers and handlers too (Optuna, MLflow, SQLAlchemy), which a filter on our handlers
    would miss.
    """
    make = logging.getLogRecordFactory()
    if getattr(make, "redacting", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: logging reports it itself later
            return record
        record.msg, record.args = redact(message), None
        return record

    factory.redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
