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
