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


def test_redact_values_walks_nested_data() -> None:
    from common.redact import redact_values

    value = {"a": ["http://u:pw@h", ("x", 1)], "b": {"c": "sqlite:///x.db"}, "n": None}
    assert redact_values(value) == {
        "a": ["http://u:***@h", ("x", 1)],
        "b": {"c": "sqlite:///x.db"},
        "n": None,
    }


def test_every_log_record_is_redacted(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from common.redact import redact_log_records

    factory = logging.getLogRecordFactory()
    try:
        redact_log_records()
        redact_log_records()  # installed once
        with caplog.at_level(logging.INFO):
            logging.getLogger("some.library").info("connecting to %s", "postgresql://u:pw@db/x")
        assert caplog.messages == ["connecting to postgresql://u:***@db/x"]
    finally:
        logging.setLogRecordFactory(factory)
