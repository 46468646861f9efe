"""Print the MLflow UI address of the study runs, for `make ui` to show before the server starts.

    python scripts/mlflow_ui_url.py --backend-store-uri sqlite:////abs/mlflow.db --port 5000

With the database there and the experiment named in mlflow.yaml in it, the address opens
that experiment's runs; otherwise it opens the list of experiments.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def experiment_id(backend_store_uri: str, name: str) -> str | None:
    """The id of experiment `name` in the store, or None (no database yet, no such experiment)."""
    if backend_store_uri.startswith("sqlite:///"):
        if not Path(backend_store_uri.removeprefix("sqlite:///")).is_file():
            return None  # opening it would create an empty database
    from mlflow.tracking import MlflowClient

    try:
        experiment = MlflowClient(tracking_uri=backend_store_uri).get_experiment_by_name(name)
    except Exception:  # an unreadable store: the server will say what is wrong
        return None
    return experiment.experiment_id if experiment else None


def ui_url(host: str, port: int, experiment: str | None) -> str:
    """The runs view of `experiment`, or the experiments list when it is None."""
    base = f"http://{host}:{port}/#/experiments"
    return f"{base}/{experiment}/runs?workflowType=machine_learning" if experiment else base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend-store-uri", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--config", default=str(ROOT / "mlflow.yaml"))
    args = parser.parse_args()
    config = yaml.safe_load(Path(args.config).read_text(encoding="utf-8")) or {}
    name = str(config.get("experiment_name", "hpo-lora"))
    found = experiment_id(args.backend_store_uri, name)
    where = f"experiment '{name}'" if found else f"no experiment '{name}' yet: all experiments"
    print(f"MLflow UI ({where}): {ui_url(args.host, args.port, found)}", flush=True)


if __name__ == "__main__":
    main()
