"""Hide passwords in URLs before they reach a message, a log or an exported file."""

from __future__ import annotations

import re

# The password runs to the last "@" of the authority part (it may itself contain "@").
_PASSWORD = re.compile(
    r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)(?P<secret>[^/\s]*)(?P<tail>@)"
)


def redact(text: str) -> str:
    """`postgresql://user:secret@host/db` -> `postgresql://user:***@host/db`, anywhere in `text`."""
    return _PASSWORD.sub(lambda m: f"{m['head']}***{m['tail']}", text)
