"""Passwords in URLs never reach a message."""

import pytest

from common.redact import redact


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://hpo:s3cret@db:5432/optuna", "postgresql://hpo:***@db:5432/optuna"),
        ("postgresql+psycopg://u:p@ss@host/db", "postgresql+psycopg://u:***@host/db"),
        (
            "cannot reach http://user:tok3n@mlflow:5000 (refused); retry",
            "cannot reach http://user:***@mlflow:5000 (refused); retry",
        ),
        ("sqlite:///runs/optuna.db", "sqlite:///runs/optuna.db"),
        ("http://mlflow:5000", "http://mlflow:5000"),
    ],
)
def test_redact_hides_only_the_password(text: str, shown: str) -> None:
    assert redact(text) == shown
