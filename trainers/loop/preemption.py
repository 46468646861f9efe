"""Stop a run cleanly when the machine is about to be taken away.

Schedulers and clouds send SIGTERM before they reclaim a machine: Kubernetes and Slurm on
eviction or preemption, spot and preemptible instances when they shut down. The default
action kills the process and loses every step since the last checkpoint. `StopOnSignal`
turns the signal into a clean stop instead: the run finishes the optimizer step under way,
saves a checkpoint and returns, and the command exits as resumable. In a run of one process
a second signal acts as it would have without this (the handler is removed after the first);
a process of a data-parallel run takes every one as the first, since torchrun passes on one
that the process may have had already.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence
from types import FrameType
from typing import Any

from trainers.events import StepInfo, TrainingCallback

log = logging.getLogger(__name__)


class StopOnSignal(TrainingCallback):
    """A callback that asks the run to stop after the signal arrived.

    Use as a context manager around the run (handlers can only be set from the main
    thread); `received` names the signal, e.g. "SIGTERM", or is None.
    """

    def __init__(
        self, signals: Sequence[signal.Signals] = (signal.SIGTERM,), *, once: bool = True
    ) -> None:
        """`once=False`: later signals are taken as the first was (a process of a launched
        run, whose launcher or torchrun may pass on one it also got itself)."""
        self.signals = tuple(signals)
        self.once = once
        self.received: str | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> StopOnSignal:
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        first = self.received is None
        self.received = sig.name
        if self.once:
            signal.signal(sig, self._previous.pop(sig, signal.SIG_DFL))
        if first:
            log.warning("%s received: stopping after this step with a checkpoint", sig.name)

    stop_status = "stopped_by_signal"

    def stop_reason(self, hook: str) -> str:
        return self.received or "signal"

    def on_step(self, info: StepInfo) -> bool:
        return self.received is not None
