"""Send MLflow records that waited on disk (`python -m hpo.tracking --replay DIR`)."""

from __future__ import annotations

import logging
from pathlib import Path

from common.errors import BadInputError
from common.mlflow_writer import MlflowWriter, drain
from common.outage import TrackingUnreachable, outage_reason
from common.redact import redact
from common.spool import Spool, SpoolBusy, spool_folders

log = logging.getLogger(__name__)


def replay(folder: str | Path, tracking_uri: str | None = None) -> tuple[int, int]:
    """Send the records waiting in a spool folder (or in every spool folder under it).

    Args:
        folder: A spool folder, or the folder that holds them (a study's ``mlflow-spool``).
        tracking_uri: Where to send them; default: the URI the spool recorded.

    Returns:
        Records sent, and records still waiting (the server stopped answering again).

    Raises:
        BadInputError: No spool there; a URI that the spool does not hold (its password is
            hidden there: pass it); a server that does not answer.
    """
    folders = spool_folders(Path(folder))
    if not folders:
        raise BadInputError(f"{folder}: no MLflow spool here (records.jsonl or meta.json)")
    sent = waiting = 0
    for path in folders:
        try:
            spool = Spool(path)
        except SpoolBusy:
            log.warning("%s is being sent by a live process: left to it", path)
            continue
        try:
            uri = tracking_uri or spool.tracking_uri
            if not uri or "***" in uri:
                raise BadInputError(
                    f"{path}: the spool does not hold a usable tracking URI ({uri or 'none'}); "
                    "pass --tracking-uri"
                )
            writer = MlflowWriter(uri)
            done, outage = drain(writer, spool)
            sent += done
            if outage is not None:
                raise TrackingUnreachable(
                    f"MLflow tracking server {redact(uri)} does not answer "
                    f"({outage_reason(outage)}); {spool.waiting} records still wait in {path}"
                )
            waiting += spool.waiting
        finally:
            spool.close()
    return sent, waiting
