"""The window guard's forecasts and stop decision, the recovery policy, checkpoint files.

No training here: a fake clock drives the guard, and checkpoint folders are written by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.errors import BadInputError, GaveUp
from trainers.events import EvalInfo, RunInfo, StepInfo
from trainers.loop import checkpoint
from trainers.loop.recovery import DivergenceMonitor, RecoveryState
from trainers.loop.window import WindowGuard
from trainers.spec import RecoverySpec, TrainSpec


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run_info(total: int, eval_interval: int = 10, checkpoint_interval: int = 20) -> RunInfo:
    return RunInfo(
        total_steps=total,
        trainable_parameters=1,
        total_parameters=1,
        device="cpu",
        precision="fp32",
        eval_interval=eval_interval,
        checkpoint_interval=checkpoint_interval,
    )


def _simulate(guard: WindowGuard, clock: FakeClock, total: int, step_s: float = 1.0) -> int:
    """Steps of `step_s`, evaluations (2 s) every 10 and saves (3 s) every 20 until a stop."""
    guard.on_train_begin(_run_info(total))
    for step in range(1, total + 1):
        clock.now += step_s
        guard.on_step(StepInfo(step, total, 1.0, 1e-3, step_s, 100, clock.now))
        forecast = guard.forecast(step)
        if step % 10 == 0:
            clock.now += 2.0
            guard.on_eval(EvalInfo(step, 1.0, 2.0))
        if step % 20 == 0 or forecast.should_stop:
            clock.now += 3.0
            guard.on_checkpoint(step, "x", 3.0)
        if forecast.should_stop:
            return step
    return total


def test_remaining_counts_steps_evals_and_saves() -> None:
    clock = FakeClock()
    guard = WindowGuard(clock=clock)
    _simulate(guard, clock, total=40)  # measures steps, evaluations and saves
    guard.on_train_begin(_run_info(100))
    forecast = guard.forecast(40)
    # Right after step 40 its evaluation and save are still to come: 60 steps x 1 s,
    # 7 evaluations (40, 50, ..., 100) x 2 s and 4 saves (40, 60, 80, 100) x 3 s.
    assert forecast.remaining_seconds == pytest.approx(60 + 7 * 2 + 4 * 3)
    assert forecast.progress == pytest.approx(0.4)
    assert forecast.on_track and not forecast.should_stop and forecast.recommendation is None


def test_a_run_that_fits_is_never_stopped() -> None:
    clock = FakeClock()
    guard = WindowGuard(window_seconds=200, margin_seconds=20, clock=clock)
    assert _simulate(guard, clock, total=100) == 100
    assert clock.now <= 180


@pytest.mark.parametrize("margin", [0.0, 15.0])
def test_a_run_that_does_not_fit_stops_before_the_deadline(margin: float) -> None:
    clock = FakeClock()
    guard = WindowGuard(window_seconds=100, margin_seconds=margin, clock=clock)
    stopped_at = _simulate(guard, clock, total=1000)
    assert stopped_at < 1000
    # After the final save the deadline still holds, and little of the window was wasted.
    assert clock.now <= 100 - margin
    assert clock.now > 100 - margin - 8


def test_behind_schedule_says_where_the_run_will_stop() -> None:
    clock = FakeClock()
    guard = WindowGuard(window_seconds=60, clock=clock)
    guard.on_train_begin(_run_info(100, eval_interval=0, checkpoint_interval=0))
    for step in range(1, 6):
        clock.now += 1.0
        guard.on_step(StepInfo(step, 100, 1.0, 1e-3, 1.0, 100, clock.now))
    forecast = guard.forecast(5)
    assert not forecast.on_track and not forecast.should_stop
    assert forecast.behind_seconds == pytest.approx(5 + 95 + 1 - 60)  # + the final evaluation
    assert 55 <= forecast.stop_step <= 60
    text = forecast.recommendation or ""
    assert "behind schedule by" in text and f"step {forecast.stop_step:,} of 100" in text
    assert "micro-batch" in text and "--resume" in text
    assert "BEHIND" in forecast.line()


def test_reports_every_n_steps_and_when_the_verdict_changes() -> None:
    clock = FakeClock()
    guard = WindowGuard(window_seconds=1000, report_every=5, clock=clock)
    guard.on_train_begin(_run_info(100))
    reported = []
    for step in range(1, 13):
        clock.now += 1.0
        guard.on_step(StepInfo(step, 100, 1.0, 1e-3, 1.0, 100, clock.now))
        if guard.should_report(guard.forecast(step)):
            reported.append(step)
    assert reported == [1, 5, 10]


def test_divergence_needs_several_bad_evaluations() -> None:
    monitor = DivergenceMonitor(ratio=1.5, evals=3)
    for step, loss in [(10, 2.0), (20, 1.0), (30, 1.6), (40, 1.7)]:
        assert monitor.observe(step, loss) is None
    reason = monitor.observe(50, 1.8)
    assert reason is not None and "diverged" in reason and "step 50" in reason
    assert monitor.best_step == 20
    monitor.forget_after(20)
    assert monitor.observe(30, 1.2) is None
    assert "nan" in (monitor.observe(40, float("nan")) or "")


def test_out_of_memory_halves_the_micro_batch_until_one() -> None:
    state = RecoveryState(micro_batch_size=8, gradient_accumulation_steps=2)
    for expected in (4, 2, 1):
        state.after_out_of_memory("CUDA out of memory", step=3)
        assert state.micro_batch_size == expected
        assert state.micro_batch_size * state.gradient_accumulation_steps == 16
    with pytest.raises(GaveUp, match="micro-batch 1"):
        state.after_out_of_memory("CUDA out of memory", step=3)
    assert len(state.recoveries) == 3 and "micro-batch 8 -> 4" in state.recoveries[0]


def test_rollbacks_lower_the_learning_rate_then_give_up() -> None:
    policy = RecoverySpec(enabled=True, max_rollbacks=2, lr_factor=0.5)
    state = RecoveryState(micro_batch_size=4, gradient_accumulation_steps=1)
    state.after_divergence("loss became nan", policy)
    state.after_divergence("loss became nan", policy)
    assert state.lr_scale == pytest.approx(0.25) and state.rollbacks == 2
    with pytest.raises(GaveUp, match="gave up after 2 rollback"):
        state.after_divergence("loss became nan", policy)
    assert RecoveryState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


def test_recovery_settings_round_trip_and_are_validated() -> None:
    spec = TrainSpec.from_dict(
        {"model": "m", "data": "d", "recovery": {"enabled": True, "max_rollbacks": 5}}
    )
    assert spec.recovery == RecoverySpec(enabled=True, max_rollbacks=5)
    assert TrainSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(BadInputError, match="lr_factor"):
        RecoverySpec(lr_factor=1.5)
    with pytest.raises(BadInputError, match="unknown recovery field"):
        TrainSpec.from_dict({"model": "m", "data": "d", "recovery": {"retries": 2}})
    with pytest.raises(BadInputError, match="keep_checkpoints"):
        TrainSpec(model="m", data="d", keep_checkpoints=0)


def _fake_checkpoint(out: Path, step: int, val_loss: float | None) -> Path:
    staging = checkpoint.new_staging(out, step)
    for name in (*checkpoint.REQUIRED, checkpoint.RNG_STATES[0]):
        if name != checkpoint.RUN_STATE:
            (staging / name).write_bytes(f"{name} at {step}".encode())
    return checkpoint.commit(staging, out, step, {"step": step, "val_loss": val_loss})


def test_rotation_keeps_the_last_k_and_the_best(tmp_path: Path) -> None:
    losses = {10: 3.0, 20: 1.0, 30: 2.0, 40: None, 50: 2.5}
    for step, loss in losses.items():
        _fake_checkpoint(tmp_path, step, loss)
    deleted = checkpoint.rotate(tmp_path, keep_last=2)
    assert sorted(p.name for p in deleted) == ["checkpoint-10", "checkpoint-30"]
    assert [s for s, _ in checkpoint.checkpoints(tmp_path)] == [20, 40, 50]
    assert not list(tmp_path.glob(".staging-*"))


def test_commit_replaces_a_checkpoint_of_the_same_step(tmp_path: Path) -> None:
    _fake_checkpoint(tmp_path, 10, 2.0)
    path = _fake_checkpoint(tmp_path, 10, 1.0)
    assert checkpoint.verify(path) is None
    assert checkpoint.read_run_state(path)["val_loss"] == 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-10"]


def test_verify_names_what_is_wrong(tmp_path: Path) -> None:
    path = _fake_checkpoint(tmp_path, 5, None)
    (path / "scheduler.pt").write_bytes(b"scheduler.pt at 6")  # same size, other content
    assert "sha256" in (checkpoint.verify(path) or "")
    (path / "optimizer.pt").unlink()
    assert "optimizer.pt is missing" in (checkpoint.verify(path) or "")
    (path / checkpoint.MANIFEST).write_text("{", encoding="utf-8")
    assert "manifest" in (checkpoint.verify(path) or "")
    assert checkpoint.latest_valid(tmp_path) is None
