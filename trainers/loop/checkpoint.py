"""Checkpoint folders with integrity: manifest, atomic commit, verification, rotation.

A checkpoint is `<output_dir>/checkpoint-<step>` in the layout transformers' Trainer resumes
from (adapter weights as safetensors, `optimizer.pt`, `scheduler.pt`, `rng_state.pth`,
`trainer_state.json`) plus `run_state.json` (step, metrics, recovery state) and
`manifest.json` (size and sha256 of every other file). It is written into a hidden staging
folder and renamed into place, so a reader sees a whole checkpoint or none. The Trainer loads
the `.pt`/`.pth` files with `torch.load(weights_only=True)`, so nothing is unpickled beyond
tensors and plain containers.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from common.files import replace_folder, sha256_file

log = logging.getLogger(__name__)

PREFIX = "checkpoint-"
MANIFEST = "manifest.json"
RUN_STATE = "run_state.json"
MANIFEST_FORMAT = 1
# What a resume needs; anything missing makes the checkpoint invalid.
REQUIRED = (
    "adapter_model.safetensors",
    "adapter_config.json",
    "optimizer.pt",
    "scheduler.pt",
    "trainer_state.json",
    RUN_STATE,
)
# The random-number state: one file for one process, one per process (`rng_state_<rank>.pth`)
# for a run on several.
RNG_STATES = ("rng_state.pth", "rng_state_0.pth")
_STAGING_PREFIX = ".staging-"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")


def new_staging(output_dir: str | Path, step: int) -> Path:
    """A fresh hidden folder in `output_dir` to write the checkpoint of `step` into."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    # mkdir (not mkdtemp) so the folder gets the usual permissions from the umask.
    staging = out / f"{_STAGING_PREFIX}{step}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    return staging


def commit(staging: Path, output_dir: str | Path, step: int, run_state: dict[str, Any]) -> Path:
    """Write `run_state.json` and the manifest into `staging`, then rename it into place.

    Files are flushed to disk before the rename, so a crash leaves either the previous
    checkpoints or the new one, never a half-written folder under a checkpoint name.

    Returns:
        The checkpoint folder, ``<output_dir>/checkpoint-<step>``.
    """
    (staging / RUN_STATE).write_text(json.dumps(run_state, indent=2) + "\n", encoding="utf-8")
    files = {}
    for path in sorted(p for p in staging.rglob("*") if p.is_file()):
        files[path.relative_to(staging).as_posix()] = {
            "bytes": path.stat().st_size,
            "sha256": sha256_file(path, sync=True),
        }
    manifest = {
        "format": MANIFEST_FORMAT,
        "step": step,
        "val_loss": run_state.get("val_loss"),
        "created": time.time(),
        "files": files,
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    _fsync_dir(staging)
    target = checkpoint_path(output_dir, step)
    # A resumed or rolled-back run reaches this step again; `clean_staging` sweeps a leftover.
    aside = target.with_name(f"{_STAGING_PREFIX}old-{step}-{os.getpid()}")
    replace_folder(staging, target, aside=aside)
    _fsync_dir(target.parent)
    return target


def checkpoint_path(output_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of `step` lives."""
    return Path(output_dir) / f"{PREFIX}{step}"


def verify(path: str | Path) -> str | None:
    """Why the checkpoint at `path` cannot be trusted, or None when it is whole."""
    folder = Path(path)
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files: dict[str, dict[str, Any]] = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"no readable manifest ({type(exc).__name__})"
    missing = [name for name in REQUIRED if name not in files]
    if not any(name in files for name in RNG_STATES):
        missing.append(RNG_STATES[0])
    if missing:
        return f"manifest lacks {', '.join(missing)}"
    for name, expected in files.items():
        file = folder / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != expected.get("bytes"):
            return f"{name} has {file.stat().st_size} bytes, manifest says {expected.get('bytes')}"
        if sha256_file(file) != expected.get("sha256"):
            return f"{name} does not match its sha256"
    return None


def checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Every `checkpoint-<step>` folder in `output_dir`, oldest step first (unverified)."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = []
    for child in out.iterdir():
        match = _NAME.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_valid(output_dir: str | Path, *, at_most_step: int | None = None) -> Path | None:
    """The newest checkpoint that passes `verify`; broken newer ones are skipped with a warning.

    Args:
        output_dir: The run's output folder.
        at_most_step: Only consider checkpoints saved at or before this step.
    """
    for step, path in reversed(checkpoints(output_dir)):
        if at_most_step is not None and step > at_most_step:
            continue
        problem = verify(path)
        if problem is None:
            return path
        log.warning("checkpoint %s is not usable (%s); trying the previous one", path, problem)
    return None


def read_run_state(path: str | Path) -> dict[str, Any]:
    """The `run_state.json` of a checkpoint (plain JSON: step, metrics, recovery state)."""
    state: dict[str, Any] = json.loads((Path(path) / RUN_STATE).read_text(encoding="utf-8"))
    return state


def rotate(output_dir: str | Path, keep_last: int) -> list[Path]:
    """Delete checkpoints except the newest `keep_last` and the best by validation loss.

    Returns:
        The deleted folders.
    """
    found = checkpoints(output_dir)
    keep = {path for _, path in found[-keep_last:]}
    best = _best(found)
    if best is not None:
        keep.add(best)
    deleted = [path for _, path in found if path not in keep]
    for path in deleted:
        shutil.rmtree(path, ignore_errors=True)
    return deleted


def discard_after(output_dir: str | Path, step: int) -> list[Path]:
    """Delete checkpoints newer than `step` (the branch a rollback abandons)."""
    doomed = [path for s, path in checkpoints(output_dir) if s > step]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def clean_staging(output_dir: str | Path) -> None:
    """Remove staging folders a crashed save left behind (one writer per output folder)."""
    out = Path(output_dir)
    if out.is_dir():
        for child in out.glob(f"{_STAGING_PREFIX}*"):
            shutil.rmtree(child, ignore_errors=True)


def best_checkpoint(output_dir: str | Path) -> Path | None:
    """The kept checkpoint with the lowest validation loss measured at its own step."""
    return _best(checkpoints(output_dir))


def _best(found: list[tuple[int, Path]]) -> Path | None:
    """The checkpoint with the lowest validation loss measured at its own step."""
    best: tuple[float, Path] | None = None
    for _, path in found:
        try:
            loss = json.loads((path / MANIFEST).read_text(encoding="utf-8")).get("val_loss")
        except (OSError, ValueError):
            continue
        if isinstance(loss, (int, float)) and (best is None or loss < best[0]):
            best = (float(loss), path)
    return best[1] if best else None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not every platform opens folders
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
