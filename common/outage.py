"""Whether a tracking server answers now, and the bounded wait for it before a process exits.

A server that was killed refuses connections at once, but one that is starting, stopped or
cut off by the network accepts them and says nothing: a write sent to it waits for MLflow's
HTTP timeout (30 s). So while records wait in the spool, the writer asks the server's
`/health` with a short timeout before it sends them; a silent server costs the writer's
thread `PROBE_TIMEOUT_SECONDS` per try, not a write's timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from common.redact import redact

PROBE_TIMEOUT_SECONDS = 2.0
# How long a study waits, before it exits, for a tracking server that does not answer.
EXIT_WAIT_SECONDS = 30.0
log = logging.getLogger(__name__)


class Sender(Protocol):
    """What the exit wait needs of the writer (`common.mlflow_writer.MlflowWriter`)."""

    tracking_uri: str

    def send_waiting(self) -> int:
        """Try now to send what waits; returns what still waits."""


def answers(tracking_uri: str, *, timeout: float = PROBE_TIMEOUT_SECONDS) -> bool:
    """Whether the tracking server's `/health` answers within `timeout` (a local store: True)."""
    if not tracking_uri.startswith(("http://", "https://")):
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
