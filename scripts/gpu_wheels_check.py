"""The two Python halves of `scripts/gpu_wheels.sh --check`.

    python scripts/gpu_wheels_check.py image-deps .whl   # the image's packages they declare
    python scripts/gpu_wheels_check.py outside .whl      # installed, yet not in image or .whl
    python scripts/gpu_wheels_check.py round-trip SITE   # under CPython 3.12, with SITE first

`image-deps` prints the distributions the wheels in the folder require that the device image
already has (KINDS.md's list of the device tool), less torch and triton: what a scratch venv
needs to stand in for the image. `round-trip` imports what a study imports from the wheels,
checks each came from SITE (not from elsewhere on the path), and writes and reads back an
Optuna and an MLflow SQLite store.
"""

from __future__ import annotations

import re
import sys
import tempfile
import zipfile
from pathlib import Path

KINDS = Path("/work/.library/device/KINDS.md")
NOT_NEEDED_FOR_THE_CHECK = {"torch", "triton"}  # gigabytes; bitsandbytes is not imported


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages() -> set[str]:
    """The distributions the device image holds (KINDS.md's package list), normalised."""
    names = KINDS.read_text().split("Packages: ")[1].strip().rstrip(".").replace(",", " ").split()
    return {norm(n) for n in names}


def outside(folder: Path) -> list[str]:
    """Distributions installed in this interpreter that neither the image nor the wheels in
    `folder` hold (`scripts/gpu_image_smoke.sh`: what the lease would not find there)."""
    import importlib.metadata as md

    carried = {norm(w.name.split("-")[0]) for w in folder.glob("*.whl")}
    installed = {norm(d.metadata["Name"]) for d in md.distributions()}
    # hpo: this checkout's egg-info, on the path when run from the repository
    return sorted(installed - image_packages() - carried - {"pip", "setuptools", "hpo"})


def image_deps(folder: Path) -> list[str]:
    image = image_packages()
    carried: set[str] = set()
    wanted: set[str] = set()
    for wheel in folder.glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            meta = z.read(meta_name).decode()
        found = re.search(r"^Name: (.+)$", meta, re.M)
        if found:
            carried.add(norm(found.group(1)))
        for line in meta.splitlines():
            if line.startswith("Requires-Dist: ") and "extra ==" not in line:
                dep = re.match(r"[A-Za-z0-9_.-]+", line[len("Requires-Dist: ") :])
                if dep:
                    wanted.add(norm(dep.group(0)))
    return sorted((wanted & image) - carried - NOT_NEEDED_FOR_THE_CHECK)


def round_trip(site: str) -> None:
    import alembic
    import datasets
    import mlflow
    import mlflow.system_metrics.metrics.gpu_monitor  # noqa: F401  what a study's runs sample
    import optuna
    import sqlalchemy

    for module in (optuna, mlflow, sqlalchemy, alembic, datasets):
        assert str(module.__file__).startswith(site), module.__file__
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/optuna.db"
        study = optuna.create_study(storage=url, study_name="check")
        study.optimize(lambda t: t.suggest_float("x", 0, 1) ** 2, n_trials=3)
        assert len(optuna.load_study(study_name="check", storage=url).trials) == 3
        client = mlflow.MlflowClient(f"sqlite:///{tmp}/mlflow.db")
        run = client.create_run(client.create_experiment("check"))
        client.log_metric(run.info.run_id, "loss", 1.5)
        assert client.get_run(run.info.run_id).data.metrics["loss"] == 1.5
    print(
        f"python {sys.version.split()[0]}: optuna {optuna.__version__}, mlflow "
        f"{mlflow.__version__}, sqlalchemy {sqlalchemy.__version__}: both stores round-trip"
    )


if __name__ == "__main__":
    if sys.argv[1] == "image-deps":
        print(" ".join(image_deps(Path(sys.argv[2]))))
    elif sys.argv[1] == "outside":
        if not KINDS.exists():  # the device tool's list is not on this machine
            print(f"{KINDS} not here: what the image lacks is not checked")
        else:
            print("installed here but in neither the image's list nor .whl/:",
                  ", ".join(outside(Path(sys.argv[2]))) or "none")  # fmt: skip
    else:
        round_trip(sys.argv[2])
