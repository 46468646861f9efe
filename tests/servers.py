"""Real servers for tests: an `mlflow server` and a PostgreSQL cluster on loopback.

Any other server a test starts (optuna-dashboard, `make ui`) goes through the same
`start_logged`, `wait_until_served` and `stop_group`. The module-scoped fixtures over these
(`tracking_server`, `postgres`) are in tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def only_finished_run(tracking_uri: str, experiment_name: str) -> tuple[Any, Any]:
    """The MLflow client of `tracking_uri` and the one run of `experiment_name`, finished."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    return client, run


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_logged(command: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start `command` in a process group of its own, its output appended to `log`.

    A file, not a pipe: a pipe nobody reads fills up and stalls the server.
    """
    with log.open("ab") as out:
        return subprocess.Popen(
            command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def http_status(url: str, timeout: float) -> int | None:
    """The HTTP status `url` answers with now (None: no answer, or an error status)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except OSError:
        return None


def wait_until_served(
    url: str, proc: subprocess.Popen[bytes], log: Path, seconds: float = 120
) -> int:
    """The HTTP status of `url` once it answers; the server must stay up meanwhile."""
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {log.read_text()[-2000:]}")
        status = http_status(url, timeout=5)
        if status is not None:
            return status
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer within {seconds:.0f} s")
        time.sleep(0.3)


def stop_group(proc: subprocess.Popen[bytes], *, kill: bool = False) -> None:
    """End the process group `proc` leads (SIGTERM, or SIGKILL with `kill` or after 20 s)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)


class MlflowServer:
    """An `mlflow server` on a fixed loopback port that can be killed and started again.

    Its backend store and artifacts stay in `root`, so a restart serves the same runs.
    """

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> None:
        """Start the server and wait until it answers /health."""
        command = [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", f"sqlite:///{self.root / 'server.db'}",
            "--artifacts-destination", str(self.root / "artifacts"),
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
        ]  # fmt: skip
        log = self.root / "mlflow-server.log"
        self.proc = start_logged(command, log, cwd=self.root)
        wait_until_served(f"{self.url}/health", self.proc, log, timeout)

    def answers(self) -> bool:
        """Whether /health answers now."""
        return http_status(f"{self.url}/health", timeout=2) == 200

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGKILL with `kill`: an outage, not a shutdown)."""
        if self.proc is not None:
            stop_group(self.proc, kill=kill)
            self.proc = None


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """Start `mlflow server` on a free loopback port; yield its base URL."""
    server = MlflowServer(root)
    try:
        server.start()
        yield server.url
    finally:
        server.stop()


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    return None


@contextlib.contextmanager
def postgres_server(root: Path) -> Iterator[str]:
    """Start a throw-away PostgreSQL cluster on a free loopback port; yield its URL.

    Runs as the current user when that is not root, else as the `postgres` system user.
    """
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        raise RuntimeError("PostgreSQL is not installed (scripts/install-postgres.sh installs it)")
    prefix: list[str] = []
    own_root = None
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root; its user must reach the folder, which pytest's
        # private temporary folders do not allow.
        prefix = ["runuser", "-u", "postgres", "--"]
        own_root = Path(tempfile.mkdtemp(prefix="hpo-pg-"))
        own_root.chmod(0o777)
        root = own_root
    data = root / "pgdata"
    port = free_port()
    env = {**os.environ, "LC_ALL": "C"}
    subprocess.run(
        [*prefix, initdb, "-D", str(data), "-U", "hpo", "--auth=trust", "-E", "UTF8"],
        check=True,
        capture_output=True,
        env=env,
    )
    options = (
        f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c max_connections=60 -c fsync=off"
    )
    subprocess.run(
        [
            *prefix,
            pg_ctl,
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(root / "pg.log"),
            "-w",
            "start",
        ],
        check=True,
        capture_output=True,
        env=env,
    )
    try:
        yield f"postgresql://hpo:unused-secret@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
            env=env,
        )
        if own_root is not None:
            shutil.rmtree(own_root, ignore_errors=True)
