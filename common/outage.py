"""Whether a tracking server answers now, whether an error says it did not, and the bounded
wait for it before a process exits.

A server that was killed refuses connections at once, but one that is starting, stopped or
cut off by the network accepts them and says nothing: a write sent to it waits for MLflow's
HTTP timeout (30 s). So while records wait in the spool, the writer asks the server's
`/health` with a short timeout before it sends them; a silent server costs the writer's
thread `PROBE_TIMEOUT_SECONDS` per try, not a write's timeout.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Protocol

from common.errors import BadInputError
from common.redact import redact

PROBE_TIMEOUT_SECONDS = 2.0
# How long a study waits, before it exits, for a tracking server that does not answer.
EXIT_WAIT_SECONDS = 30.0
log = logging.getLogger(__name__)


class TrackingUnreachable(BadInputError):
    """The tracking server does not answer (refused, timed out, or a gateway error)."""


def is_http(tracking_uri: str) -> bool:
    """Whether the store is an MLflow server reached over HTTP(S)."""
    return tracking_uri.startswith(("http://", "https://"))


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` says the tracking server did not answer, rather than refused a record.

    MLflow wraps the HTTP client's errors in its own exception: the cause chain and the
    message are read both.
    """
    import http.client

    import requests

    # A server killed in the middle of its answer breaks the response: a chunked body cut
    # short (IncompleteRead, wrapped by urllib3 and requests) says it did not answer too.
    broken = (requests.exceptions.ChunkedEncodingError, http.client.IncompleteRead)
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (requests.ConnectionError, requests.Timeout, ConnectionError, *broken)):
            return True
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    return any(marker in text for marker in _OUTAGE_MARKERS)


_OUTAGE_MARKERS = (
    "Max retries exceeded",
    "Connection refused",
    "Connection aborted",
    "Connection broken",
    "Read timed out",
    "RemoteDisconnected",
    "error code 502",
    "error code 503",
    "error code 504",
)


def outage_reason(exc: BaseException) -> str:
    """A few words on how the server did not answer: `connection refused`, `HTTP 503`."""
    text = str(exc)
    for reason in (
        "Connection refused",
        "Read timed out",
        "Connection aborted",
        "Connection broken",
    ):
        if reason in text:
            return reason.lower()
    for code in ("502", "503", "504"):
        if f"error code {code}" in text:
            return f"HTTP {code}"
    return "no answer"


def fail_fast_http() -> None:
    """MLflow's HTTP client retries a refused connection for minutes by default.

    A writer that spools what the server does not take needs to know in seconds; a value
    the user set in the environment wins.
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


class Sender(Protocol):
    """What the exit wait needs of the writer (`common.mlflow_writer.MlflowWriter`)."""

    tracking_uri: str

    def send_waiting(self) -> int:
        """Try now to send what waits; returns what still waits."""


def answers(tracking_uri: str, *, timeout: float = PROBE_TIMEOUT_SECONDS) -> bool:
    """Whether the tracking server's `/health` answers within `timeout` (a local store: True)."""
    if not is_http(tracking_uri):
        return True
    import requests

    try:
        response = requests.get(f"{tracking_uri.rstrip('/')}/health", timeout=timeout)
    except requests.RequestException:
        return False
    return response.status_code == 200


def send_before_exit(
    writer: Sender,
    wait_seconds: float = EXIT_WAIT_SECONDS,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Send what waits in `writer`'s spool, waiting up to `wait_seconds` for the server.

    Said in one line when there is anything to wait for; tried once a second.

    Returns:
        Records still waiting (the server did not answer in time).
    """
    waiting = writer.send_waiting()
    if not waiting or wait_seconds <= 0:
        return waiting
    log.warning(
        "%d MLflow records wait for %s; waiting up to %.0f s for it to answer before exiting",
        waiting,
        redact(writer.tracking_uri),
        wait_seconds,
    )
    deadline = clock() + wait_seconds
    while waiting and clock() < deadline:
        sleep(min(1.0, max(0.0, deadline - clock())))
        waiting = writer.send_waiting()
    return waiting
