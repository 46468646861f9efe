"""`StopOnSignal`: a SIGTERM asks for a stop after the step; who takes a second one."""

from __future__ import annotations

import os
import signal

from trainers.events import StepInfo
from trainers.loop.preemption import StopOnSignal


def _step() -> StepInfo:
    return StepInfo(
        step=1,
        total_steps=2,
        loss=1.0,
        learning_rate=1e-3,
        seconds=0.1,
        tokens=1,
        elapsed_seconds=0.1,
    )


def test_one_process_hands_a_second_signal_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with StopOnSignal() as stop:
        assert not stop.on_step(_step())
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == "SIGTERM" and stop.on_step(_step())
        # The next one would act as without the callback (here: end pytest).
        assert signal.getsignal(signal.SIGTERM) == before
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_process_of_a_launched_run_takes_every_signal_as_the_first() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with StopOnSignal(once=False) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # torchrun passing on one it had too
        assert stop.received == "SIGTERM" and stop.on_step(_step())
        assert signal.getsignal(signal.SIGTERM) == stop._handle
    assert signal.getsignal(signal.SIGTERM) == before
