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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """Start `mlflow server` on a free loopback port; yield its base URL."""
    port = free_port()
    log = open(root / "mlflow-server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'server.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited: {(root / 'mlflow-server.log').read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("mlflow server did not answer /health within 120 s")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()


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
