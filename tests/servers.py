"""Real servers for tests: an `mlflow server` and a PostgreSQL cluster on loopback."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MlflowServer:
    """An `mlflow server` on a fixed loopback port that can be killed and started again.

    Its backend store and artifacts stay in `root`, so a restart serves the same runs.
    """

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def start(self, timeout: float = 120) -> None:
        """Start the server and wait until it answers /health."""
        self._log = open(self.root / "mlflow-server.log", "a")  # noqa: SIM115 - closed in stop
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                f"sqlite:///{self.root / 'server.db'}",
                "--artifacts-destination",
                str(self.root / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while not self.answers():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited: {(self.root / 'mlflow-server.log').read_text()[-2000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not answer /health within {timeout:.0f} s")
            time.sleep(0.5)

    def answers(self) -> bool:
        """Whether /health answers now."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGKILL with `kill`: an outage, not a shutdown)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 9 if kill else 15)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(timeout=20)
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None


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
