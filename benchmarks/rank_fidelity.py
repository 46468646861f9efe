"""Does the study's score rank configurations the way their full runs end?

Configurations are drawn from the default space with the learning rate restricted to its
upper decade (where the hard choices are). Each one runs, side by side:

- as the old trial: 30 optimizer steps with their own decay to zero, evaluated at the
  profile's own max_length (the loss after a fixed number of steps: the old objective);
- as the new trial: the first `trial_fraction` of its own full run (same schedule, same
  data order), evaluated at the study's one validation length, its curve extrapolated to
  the full run's end (`hpo.final_loss`);
- as its full run (1 epoch), whose final validation loss on the same samples is the verdict.

Reported: the Spearman rank correlation of each objective with the full runs' final
losses, the median and p90 error of the predicted final loss and the share of full runs
inside the p10-p90 band (raw, and with the loss correction fitted leave-one-out from the
other configurations' full runs: what the study's feedback loop gives once full runs have
reported back), and the regret of each objective's pick (its full-run loss minus the best).

    python benchmarks/rank_fidelity.py [--configs 12] [--pretrain-steps 0] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.learning_curve import LossCorrection, fit_loss_correction  # noqa: E402
from benchmarks._common import machine, table, write_json  # noqa: E402
from hpo.config import StudyConfig  # noqa: E402
from hpo.final_loss import predict_final_loss  # noqa: E402
from hpo.prepare import prepare  # noqa: E402
from hpo.runspec import train_spec  # noqa: E402
from search_spaces import load_space, sample  # noqa: E402
from trainers.loop.run import train  # noqa: E402
from trainers.tiny import default_tiny_model  # noqa: E402

OLD_TRIAL_STEPS = 30  # the old objective: validation loss after 30 optimizer steps
LR_UPPER_DECADE = (5e-4, 5e-3)


def draw_configs(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` configurations from the default space, learning rate in its upper decade."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(None)
    space = dataclasses.replace(
        space, domains={**space.domains, "learning_rate": _loguniform(*LR_UPPER_DECADE)}
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    return [sample(study.ask(), space) for _ in range(n)]


def _loguniform(low: float, high: float) -> Any:
    from search_spaces.domains import parse_domain

    return parse_domain("learning_rate", {"loguniform": [low, high]})


def run_config(
    config: StudyConfig, params: dict[str, Any], prepared: Any, work: Path, index: int
) -> dict[str, Any]:
    """The old trial, the new trial and the full run of one configuration."""
    common = {"model": prepared.model_path, "data": prepared.data_path}
    full_spec = train_spec(
        config, params, **common, full_run=True, output_dir=str(work / f"full-{index}")
    )
    full_spec = dataclasses.replace(full_spec, eval_interval=0, checkpoint_interval=0)
    trial_spec = train_spec(
        config,
        params,
        **common,
        full_run=False,
        train_samples=prepared.train_samples,
        output_dir=str(work / f"trial-{index}"),
    )
    old_spec = dataclasses.replace(
        full_spec,
        output_dir=str(work / f"old-{index}"),
        max_steps=OLD_TRIAL_STEPS,
        eval_max_length=None,  # the profile's own length, as before
    )
    started = time.perf_counter()
    old = train(old_spec)
    trial = train(trial_spec)
    full = train(full_spec)
    final = predict_final_loss(
        trial.eval_records,
        full_run_samples=prepared.train_samples * config.epochs,
        correction=LossCorrection(),
        seed=index,
    )
    assert final is not None and full.final_eval_loss is not None and old.final_eval_loss
    return {
        "config": index,
        "profile": params["profile"],
        "effective_batch_size": full_spec.effective_batch_size,
        "max_length": full_spec.max_length,
        "learning_rate": params["learning_rate"],
        "lora_r": params["lora_r"],
        "full_run_steps": full.final_step,
        "trial_steps": trial.final_step,
        "old_objective": old.final_eval_loss,
        "loss_at_fidelity": final.last_loss,
        "predicted_p10": final.fit.p10,
        "predicted_p50": final.fit.p50,
        "predicted_p90": final.fit.p90,
        "curve_method": final.fit.method,
        "trial_curve": [list(p) for p in final.points],
        "full_run_loss": full.final_eval_loss,
        "seconds": time.perf_counter() - started,
    }


def score(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank agreement, prediction error, band coverage and regret over the rows."""
    full = np.array([r["full_run_loss"] for r in rows])
    best = float(full.min())

    def regret(key: str) -> float:
        pick = min(range(len(rows)), key=lambda i: rows[i][key])
        return float(full[pick] - best)

    def rank_of_pick(key: str) -> int:
        pick = min(range(len(rows)), key=lambda i: rows[i][key])
        return int(np.sum(full < full[pick])) + 1

    for i, row in enumerate(rows):  # the correction each row would get from the others
        others = [(r["predicted_p50"], r["full_run_loss"]) for j, r in enumerate(rows) if j != i]
        corrected = fit_loss_correction(others).apply(_fit_of(row))
        row.update(
            corrected_p10=corrected.p10, corrected_p50=corrected.p50, corrected_p90=corrected.p90
        )
    raw_err = [abs(r["predicted_p50"] / r["full_run_loss"] - 1) * 100 for r in rows]
    cor_err = [abs(r["corrected_p50"] / r["full_run_loss"] - 1) * 100 for r in rows]
    return {
        "spearman": float(spearmanr([r["predicted_p50"] for r in rows], full).statistic),
        "spearman_baseline": float(spearmanr([r["old_objective"] for r in rows], full).statistic),
        "spearman_loss_at_fidelity": float(
            spearmanr([r["loss_at_fidelity"] for r in rows], full).statistic
        ),
        "median_abs_pct_error": float(np.median(cor_err)),
        "p90_abs_pct_error": float(np.percentile(cor_err, 90)),
        "median_abs_pct_error_uncorrected": float(np.median(raw_err)),
        "p90_abs_pct_error_uncorrected": float(np.percentile(raw_err, 90)),
        "band_coverage": float(
            np.mean([r["corrected_p10"] <= r["full_run_loss"] <= r["corrected_p90"] for r in rows])
        ),
        "band_coverage_uncorrected": float(
            np.mean([r["predicted_p10"] <= r["full_run_loss"] <= r["predicted_p90"] for r in rows])
        ),
        "regret": regret("predicted_p50"),
        "regret_baseline": regret("old_objective"),
        "pick_rank": rank_of_pick("predicted_p50"),
        "pick_rank_baseline": rank_of_pick("old_objective"),
        "best_full_run_loss": best,
    }


def _fit_of(row: dict[str, Any]) -> Any:
    from analysis.learning_curve import CurveFit

    p10, p50, p90 = row["predicted_p10"], row["predicted_p50"], row["predicted_p90"]
    return CurveFit(
        method="power_law", reason="", a=p50, b=0.0, c=0.0, x0=1.0, target=1.0,
        p10=p10, p50=p50, p90=p90, n_points=0, residual_sd=0.0, last_loss=p50,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=12, help="configurations (>= 10)")
    parser.add_argument("--pretrain-steps", type=int, default=0, help="0: a fresh tiny model")
    parser.add_argument("--data", default="prompt_completion", help="bundled data set")
    parser.add_argument("--trial-fraction", type=float, default=0.1)
    parser.add_argument("--trial-evals", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from trainers.data.paths import demo_data_path

    with tempfile.TemporaryDirectory(prefix="hpo-rank-") as folder:
        work = Path(folder)
        model = default_tiny_model(pretrain_steps=args.pretrain_steps)
        config = StudyConfig(
            model=str(model),
            data=str(demo_data_path(args.data)),
            work_dir=str(work),
            trial_fraction=args.trial_fraction,
            trial_evals=args.trial_evals,
            eval_samples=200,  # every run scored on the same 200 validation samples
            epochs=1.0,
            device="cpu",
            seed=args.seed,
        )
        prepared = prepare(config)
        config = dataclasses.replace(config, eval_max_length=prepared.eval_max_length)
        rows = []
        for index, params in enumerate(draw_configs(args.configs, args.seed)):
            rows.append(run_config(config, params, prepared, work, index))
            print(f"config {index}: {_brief(rows[-1])}", flush=True)
    result = score(rows)
    headers = ["#", "profile", "eff.batch", "lr", "old obj", "pred p50", "p10-p90", "full run"]
    print(
        table(
            headers,
            [
                [
                    r["config"],
                    r["profile"],
                    r["effective_batch_size"],
                    f"{r['learning_rate']:.2g}",
                    r["old_objective"],
                    r["predicted_p50"],
                    f"{r['corrected_p10']:.3f}-{r['corrected_p90']:.3f}",
                    r["full_run_loss"],
                ]
                for r in rows
            ],
        )  # fmt: skip
    )
    for key, value in result.items():
        print(f"{key:34s} {value:.4g}" if isinstance(value, float) else f"{key:34s} {value}")
    write_json(
        args.json,
        {
            **result,
            "rows": rows,
            "pretrain_steps": args.pretrain_steps,
            "data": args.data,
            "trial_fraction": args.trial_fraction,
            "machine": machine(),
        },
    )
    return 0


def _brief(row: dict[str, Any]) -> str:
    return (
        f"{row['profile']} batch {row['effective_batch_size']} lr {row['learning_rate']:.2g}: "
        f"old {row['old_objective']:.3f}, predicted {row['predicted_p50']:.3f} "
        f"({row['curve_method']}), full run {row['full_run_loss']:.3f} in {row['seconds']:.0f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
