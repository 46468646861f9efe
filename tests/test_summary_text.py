"""The study's summary line names what the best trial's score is."""

from __future__ import annotations

import pytest

from hpo.summary import StudySummary, parent_note, print_summary


def _summary(scored_by: str | None) -> StudySummary:
    return StudySummary(
        study_name="s", states={"complete": 1, "pruned": 0, "failed": 0}, best_value=4.5,
        best_params={}, best_trial=3, best_estimate={}, preset_path="p.yaml",
        mlflow_experiment_id="1", mlflow_parent_run_id="r", elapsed_seconds=1.0,
        tracking_uri="sqlite:///m.db", best_scored_by=scored_by,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("scored_by", "says"),
    [
        ("prediction", "its full run's predicted final validation loss"),
        (None, "its full run's predicted final validation loss"),  # a study from before
        ("loss_at_fidelity", "its validation loss at the trials' share of the data"),
        (
            "loss_one_doubling_on",
            "its validation loss one doubling on from its last rung's share of the data",
        ),
    ],
)
def test_the_best_score_is_named_for_what_it_is(
    scored_by: str | None, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    print_summary(_summary(scored_by), {})
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("best trial"))
    assert line == f"best trial 3: score 4.5000 ({says}" + (
        ", before correction)" if "predicted" in says else ")"
    )


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("sqlite:///m.db", " --tracking-uri sqlite:///m.db"),
        ("http://u:s3cret@h:5000", " --tracking-uri 'http://u:***@h:5000'"),  # fill it in
        ("", ""),
    ],
)
def test_the_full_run_command_reports_back_to_the_studys_store(
    uri: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = _summary("prediction")
    summary.tracking_uri = uri
    print_summary(summary, {})
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("train it"))
    assert line == f"train it: python -m trainers.train --preset p.yaml{says}"
    assert "s3cret" not in line


@pytest.mark.parametrize(
    ("curves", "correction", "says"),
    [
        (10, None, "joint, 6 points with 9 other curves; no full run reported yet"),
        (None, None, "joint, 6 points; no full run reported yet"),  # a study from before
        (10, {"scale": 0.9, "runs": 2}, "joint, 6 points with 9 other curves; corrected by 2 "
         "full runs"),
        (10, {"scale": 0.95, "runs": 1, "curve_runs": 1}, "joint, 6 points with 9 other "
         "curves; corrected by 1 full runs; 1 of its full runs' curves in the fit"),
        (10, {"scale": 1.0, "runs": 0, "curve_runs": 2}, "joint, 6 points with 9 other "
         "curves; 2 of its full runs' curves in the fit"),
    ],
)  # fmt: skip
def test_the_final_loss_line_says_how_many_curves_it_was_fitted_with(
    curves: int | None, correction: dict[str, float] | None, says: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    summary = _summary("prediction")
    summary.best_estimate = {
        "final_val_loss": {"p10": 1.5, "p50": 2.0, "p90": 2.5},
        "final_val_loss_method": "joint", "final_val_loss_points": 6,
        **({"final_val_loss_curves": curves} if curves else {}),
        **({"loss_correction": correction} if correction else {}),
    }  # fmt: skip
    print_summary(summary, {})
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("full run's"))
    assert line.endswith(f"(p10-p90 1.5000 to 2.5000; {says})")


def test_a_pick_whose_full_run_reported_back_says_what_it_measured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    summary = _summary("prediction")
    summary.picked_by = "measured: its full run ended at 1.9000"
    summary.measured_full_runs = {3: 1.9, 5: 2.25}
    summary.best_estimate = {
        "final_val_loss": {"p10": 1.5, "p50": 2.0, "p90": 2.5},
        "final_val_loss_measured": {"loss": 1.9, "run_id": "abc"},
    }
    print_summary(summary, {})
    assert "best trial 3, its full run measured 1.9, predicted final loss 2" in parent_note(summary)
    out = capsys.readouterr().out.splitlines()
    assert (
        "  picked against the full runs that reported back (trial 3 1.9000, trial 5 2.2500): "
        "measured: its full run ended at 1.9000"
    ) in out
    measured = out.index("full run's final validation loss: 1.9000 measured by its full run "
                         "(MLflow run abc)")  # fmt: skip
    assert out[measured + 1].startswith(
        "full run's final validation loss: 2.0000 predicted from its trial (p10-p90"
    )
    assert not any(line.startswith("train it") for line in out)  # trained already
    assert (
        "trained already (MLflow run abc); to train it again: python -m trainers.train "
        "--preset p.yaml --tracking-uri sqlite:///m.db"
    ) in out


def test_a_pick_whose_full_run_stopped_early_says_it_was_its_best_checkpoint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    summary = _summary("prediction")
    summary.picked_by = "measured: its full run stopped early; its best, at step 1,200, was 1.9000"
    summary.measured_full_runs = {3: 1.9}
    summary.best_estimate = {
        "final_val_loss": {"p10": 1.5, "p50": 2.0, "p90": 2.5},
        "final_val_loss_measured": {"loss": 1.9, "run_id": "abc", "best_step": 1200},
    }
    print_summary(summary, {})
    out = capsys.readouterr().out.splitlines()
    assert (
        "full run's validation loss: 1.9000 measured by its full run at its best checkpoint "
        "(step 1,200), where early stopping ended it (MLflow run abc)"
    ) in out
    assert not any(line.startswith("full run's final validation loss: 1.9") for line in out)


def test_a_run_that_stopped_early_reads_its_best_evaluation_against_the_band() -> None:
    from trainers.result import TrainResult
    from trainers.run_summary import loss_line

    band = {"p10": 1.5, "p50": 2.0, "p90": 2.5}
    result = TrainResult(
        device="cpu", precision="fp32", runtime_reason="test", trainable_parameters=1,
        total_parameters=2, lora_targets=["q"], lora_parameters_per_rank=1, n_layers=1,
        hidden_size=8, vocab_size=16, micro_batch_size=1, gradient_accumulation_steps=1,
        max_length=8, lora_r=1, gradient_checkpointing=False, total_steps=2000,
        status="stopped_early", final_step=900,
    )  # fmt: skip
    result.final_eval_loss, result.best_val_loss, result.best_step = 2.6, 1.8, 600
    assert loss_line(result, band) == (
        "validation loss: predicted 2.0000 (p10-p90 1.5000 to 2.5000) at the schedule's end, "
        "best 1.8000 at step 600 of 2,000 before it stopped early (x0.90, inside p10-p90)"
    )
    result.status = "stopped_by_window"  # its best is where the window cut it: no line
    assert loss_line(result, band) is None
    result.status = "finished"  # a finished run: its final evaluation, as the law predicts
    assert loss_line(result, band) == (
        "final validation loss: predicted 2.0000 (p10-p90 1.5000 to 2.5000), measured 2.6000 "
        "(x1.30, above p90)"
    )
