"""No password anywhere: a study and its full run with passwords in both URLs.

A real PostgreSQL server (a role with a password) holds the study, a real `mlflow server`
over HTTP tracks it with `http://alice:PASSWORD@...`; afterwards both databases are dumped
and every file the commands wrote, their JSON and their console output are searched.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import optuna
import psycopg
import pytest

from tests.cli import run_module
from tests.servers import mlflow_server, postgres_server

PG_PASSWORD = "pg-Pa55word-zq"
MLFLOW_PASSWORD = "mlflow-Pa55word-zq"


def _postgres_dump(server_url: str, database: str) -> str:
    """Every row of every table of `database`, as text."""
    url = server_url.rsplit("/", 1)[0] + f"/{database}"
    with psycopg.connect(url) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            ).fetchall()
        ]
        rows = [
            str(row[0])
            for table in tables
            for row in conn.execute(f'SELECT t::text FROM "{table}" t').fetchall()
        ]
    return "\n".join(rows)


def _sqlite_dump(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return "\n".join(conn.iterdump())


def _files_text(*folders: Path) -> dict[str, str]:
    return {
        str(path): path.read_bytes().decode("utf-8", errors="replace")
        for folder in folders
        for path in folder.rglob("*")
        if path.is_file()
    }


@pytest.mark.timeout(900)
def test_no_password_in_stores_files_or_output(tiny_model_dir: Path, tmp_path: Path) -> None:
    server_root = tmp_path / "mlflow"
    server_root.mkdir()
    work = tmp_path / "work"
    with postgres_server(tmp_path / "pg") as pg, mlflow_server(server_root) as mlflow_url:
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE alice LOGIN PASSWORD '{PG_PASSWORD}'")
            conn.execute("CREATE DATABASE optuna_secret OWNER alice")
        port = pg.rsplit(":", 1)[1].split("/")[0]
        storage = f"postgresql://alice:{PG_PASSWORD}@127.0.0.1:{port}/optuna_secret"
        tracking = mlflow_url.replace("http://", f"http://alice:{MLFLOW_PASSWORD}@")
        study = run_module(
            "hpo.study", "--no-progress", "--model", str(tiny_model_dir), "--work-dir", str(work),
            "--storage", storage, "--tracking-uri", tracking, "--study-name", "secret",
            "--n-trials", "2", "--trial-fraction", "0.015", "--trial-evals", "2",
            "--eval-samples", "8", "--profiles", "fast", "--pruner", "none", "--rungs", "none",
            "--json", str(tmp_path / "study.json"),
            cwd=tmp_path, timeout=600,
        )  # fmt: skip
        assert study.returncode == 0, study.stderr[-3000:]
        preset = json.loads((tmp_path / "study.json").read_text())["preset_path"]
        full = run_module(
            "trainers.train", "--preset", preset, "--output-dir", str(tmp_path / "full"),
            "--max-steps", "2", "--quiet", "--tracking-uri", tracking,
            "--json", str(tmp_path / "full.json"),
            cwd=tmp_path, timeout=600,
        )  # fmt: skip
        assert full.returncode == 0, full.stderr[-3000:]
        stored = optuna.load_study(study_name="secret", storage=storage).user_attrs["hpo_config"]
        optuna_dump = _postgres_dump(pg, "optuna_secret")
    mlflow_dump = _sqlite_dump(server_root / "server.db")

    # The URLs were there to leak: stored and shown with the password hidden.
    assert stored["tracking_uri"] == tracking.replace(MLFLOW_PASSWORD, "***")
    assert "alice:***@" in mlflow_dump  # the parent run's tracking_uri param
    places = {
        "study console": study.stdout + study.stderr,
        "full run console": full.stdout + full.stderr,
        "optuna database": optuna_dump,
        "mlflow database": mlflow_dump,
        **_files_text(tmp_path / "work", tmp_path / "full", server_root / "artifacts"),
        "study json": (tmp_path / "study.json").read_text(),
        "full run json": (tmp_path / "full.json").read_text(),
    }
    for password in (PG_PASSWORD, MLFLOW_PASSWORD):
        leaks = [place for place, text in places.items() if password in text]
        assert not leaks, f"{password} found in {leaks}"
    # MLflow's own "View run ... at: URL" lines (one per run) are silenced.
    assert "View run" not in study.stdout + full.stdout
