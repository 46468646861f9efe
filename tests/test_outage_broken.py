"""A server killed in the middle of its answer is an outage, not a refused record.

Seen in CI (test_outage.py, a server killed while a trial's record was in flight): the
response's body was cut short, MLflow raised "Connection broken: IncompleteRead(0 bytes
read, 414 more expected)", and the study stopped instead of spooling the record. A real
HTTP exchange with a server that announces a body and closes before sending it.
"""

from __future__ import annotations

import socket
import threading

import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from common.outage import is_outage, outage_reason
from tests.servers import free_port


def _cut_short(port: int, ready: threading.Event, answered: list[bytes]) -> None:
    with socket.create_server(("127.0.0.1", port)) as server:
        ready.set()
        server.settimeout(30)
        connection, _ = server.accept()
        with connection:
            answered.append(connection.recv(65536))
            connection.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 414\r\n\r\n"
            )


def test_an_answer_cut_short_is_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    port = free_port()
    ready, answered = threading.Event(), list[bytes]()
    thread = threading.Thread(target=_cut_short, args=(port, ready, answered), daemon=True)
    thread.start()
    assert ready.wait(10)
    client = MlflowClient(tracking_uri=f"http://127.0.0.1:{port}")
    with pytest.raises(MlflowException) as caught:
        client.set_terminated("0" * 32)
    thread.join(10)
    assert answered and b"/api/2.0/mlflow/runs/" in answered[0]  # it reached the server
    assert "IncompleteRead" in str(caught.value) or "Connection broken" in str(caught.value)
    assert is_outage(caught.value)
    assert outage_reason(caught.value) in ("connection broken", "connection aborted", "no answer")


def test_a_refused_record_is_not_an_outage() -> None:
    assert not is_outage(MlflowException("Invalid value 'x' for parameter 'run_id'"))
