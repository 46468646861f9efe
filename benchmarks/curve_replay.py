"""Recorded learning curves replayed through the study's own decisions, with no training.

A replayed study draws `--study-size` recorded runs of a pool (seeded, without replacement)
and runs the study's code on them: a real Optuna study (in memory) with the study's pruner
(`hpo.pruners.make_pruner`), each trial reporting its run's recorded evaluations up to its
fidelity through the study's reporter (`hpo.objective.OptunaReporter`), predicted and scored
as a trial is (`hpo.final_loss.predict_final_loss`, `trial_score`), its rungs chosen as the
study chooses them (`hpo.pick.rung_candidates`), the export's pick (`hpo.pick.pick_trial`)
and its end predictions (`hpo.export.end_predictions`). Each trial is charged the share of
its run's recorded steps and seconds it adds (a rung continues from the checkpoint of the
trial before it, as the study does).

Not replayed: the loss-shape reference run (a run on a compressed schedule of its own: the
recorded curves never ran one), the time model and the search budget (the curves' own
recorded steps are the cost), and the sampler (the configurations are the recorded ones).

Pools: a file in the format of `benchmarks/data/qwen05b_dolly_lora_200.json` (`runs`, each
with `config` and `val_ce` at `eval_steps` of `total_steps`, `wall_clock_s`), or
`rank_fidelity.py`'s recorded tiny-model sets (`docs/measurements/rank-fidelity-*.json`: each
a pool of 8 configurations whose trials and full run were trained).

    python benchmarks/curve_replay.py --studies 200 --json hpo-runs/curve-replay.json
    python benchmarks/curve_replay.py --tiny-sets 'docs/measurements/rank-fidelity-*.json'
    python benchmarks/curve_replay.py --smoke
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.curves.correction import LossCorrection  # noqa: E402
from analysis.search.quality import QUALITY_FILE  # noqa: E402
from analysis.search.schedule import TrialCost, plan_search  # noqa: E402
from benchmarks._common import table, write_results  # noqa: E402
from common import files  # noqa: E402
from hpo.config import StudyConfig, TrialConfig  # noqa: E402
from hpo.export import end_predictions  # noqa: E402
from hpo.final_loss import predict_final_loss, study_peers, trial_curve, trial_score  # noqa: E402
from hpo.keys import FRACTION_ATTR, PROMOTED_FROM_ATTR, RUNG_ATTR
from hpo.objective import OptunaReporter  # noqa: E402
from hpo.pick import pick_trial, rung_candidates, rung_of, standing_trials
from hpo.pruners import make_pruner  # noqa: E402
from trainers.events import EvalInfo  # noqa: E402

DEFAULT_CURVES = Path(__file__).resolve().parent / "data" / "qwen05b_dolly_lora_200.json"
RUN_ATTR = "replay_run"  # a replayed trial's run: its index in the pool
BUDGETS = (0.3, 0.4, 0.5, 0.75, 1.0)  # search budgets (full runs) the default is planned into
NOT_REPLAYED = (
    "not replayed: the loss-shape reference run (the recorded runs never ran a compressed "
    "schedule of their own), the time model and search budget (recorded steps are the cost), "
    "the sampler (the configurations are the recorded ones)"
)


@dataclass(frozen=True)
class Run:
    """One recorded run: its evaluations on its schedule and how it ended."""

    steps: tuple[int, ...]
    losses: tuple[float, ...]
    total_steps: int
    scheduler: str
    warmup_ratio: float
    learning_rate: float
    batch: int
    seconds: float
    final: float


@dataclass(frozen=True)
class Pool:
    name: str
    runs: tuple[Run, ...]
    epochs: float | None = None  # the full runs' epochs where known: at most 1 caps the band
    label: str = ""  # the runs' model and data, in words


@dataclass(frozen=True)
class Strategy:
    """A study's search: its trials' fidelity, its rungs, its pruner and its score."""

    name: str
    trial: TrialConfig
    pruner: str
    objective: str
    fraction: float | None = None  # single-fidelity rows: the trials' share; else None
    trend: bool = True  # the last rung ranked by its loss one doubling on (as the study)
    trials: int | None = None  # trials of a study, where a budget holds fewer than it draws
    budget: float | None = None  # the search budget it was planned into, in full runs

    @classmethod
    def default(cls) -> Strategy:
        """What `hpo.study` does with its defaults."""
        defaults = {f.name: f.default for f in fields(StudyConfig) if f.name in ("pruner", "objective")}
        return cls("default", TrialConfig(), str(defaults["pruner"]), str(defaults["objective"]))

    @classmethod
    def named(cls, name: str, *, fraction: float, rungs: tuple[str, ...] = (), **kw: Any) -> Strategy:
        base = cls.default()
        trial = replace(base.trial, fraction=fraction, rungs=rungs or ("none",))
        values = {"pruner": base.pruner, "objective": base.objective, **kw}
        return cls(name, trial, values["pruner"], values["objective"], None if rungs else fraction)


def load_curves(path: Path) -> Pool:
    """A pool in the shared curves' format."""
    data = json.loads(path.read_text(encoding="utf-8"))
    total, steps = int(data["total_steps"]), tuple(int(s) for s in data["eval_steps"])
    runs = []
    for run in data["runs"]:
        config, losses = run["config"], tuple(float(v) for v in run["val_ce"])
        runs.append(
            Run(steps, losses, total, str(data.get("scheduler", "cosine")),
                float(config.get("warmup_frac", 0.0)), float(config["lr"]), int(config["batch"]),
                float(run.get("wall_clock_s", 0.0)), losses[-1])  # fmt: skip
        )
    label = f"{len(runs)} LoRA runs of {data.get('model', '?')} on {data.get('data', '?')}"
    return Pool(path.stem, tuple(runs), label=label)


def load_tiny_set(path: Path) -> Pool | None:
    """A `rank_fidelity.py` set: each configuration's longest trial, then its full run's
    later evaluations; None for a file that is not one."""
    data = json.loads(path.read_text(encoding="utf-8"))
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all("full_run_curve" in r for r in rows):
        return None  # not a set, or one recorded before sets kept their full runs' curves
    runs = []
    for row in rows:
        total, batch = int(row["full_run_steps"]), int(row["effective_batch_size"])
        trials = row.get("trials") or {}
        longest = max(trials.items(), key=lambda kv: float(kv[0]))[1] if trials else {}
        points = {int(r["step"]): float(r["loss"]) for r in longest.get("eval_records", [])}
        curve = row["full_run_curve"]
        reach = max(points, default=0)
        points.update(
            {int(s): float(v) for s, v in zip(curve["steps"], curve["losses"], strict=True) if int(s) > reach}
        )
        steps = tuple(sorted(s for s in points if 1 <= s <= total))
        runs.append(
            Run(steps, tuple(points[s] for s in steps), total, str(row["scheduler"]),
                float(row["warmup_ratio"]), float(row["learning_rate"]), batch,
                float(row.get("full_run_seconds", 0.0)), float(row["full_run_loss"]))  # fmt: skip
        )
    return Pool(path.stem, tuple(runs), epochs=1.0)  # the study's default: one epoch


@dataclass
class Outcome:
    """One replayed study: what it picked, what it spent, how well it predicted."""

    finals: list[float]
    picked: float
    scores: list[float]  # the study's order of its configurations (rank: lower is better)
    cost_steps: float  # full-run equivalents of training (sum of the shares trained)
    cost_seconds: float  # the recorded seconds charged / the mean full run's of the draw
    errors: list[float] = field(default_factory=list)  # p50 / final - 1, per standing trial
    inside: list[bool] = field(default_factory=list)
    above: list[bool] = field(default_factory=list)  # the outcome above p90 (a miss upward)
    half_widths: list[float] = field(default_factory=list)  # 100 x ln(p90 / p50)
    low_half_widths: list[float] = field(default_factory=list)  # 100 x ln(p50 / p10)
    rungs: list[int] = field(default_factory=list)  # each standing trial's rung (0: the first)
    picked_band: tuple[float, bool, float, float] | None = None  # the pick's: error, inside, widths


class Replay:
    """One study of `draw` (indices into `pool.runs`) under `strategy`."""

    def __init__(self, pool: Pool, draw: Sequence[int], strategy: Strategy) -> None:
        self.pool, self.draw, self.strategy = pool, list(draw), strategy
        self.study = optuna.create_study(
            pruner=make_pruner(strategy.pruner, evals=strategy.trial.evals),
            sampler=optuna.samplers.RandomSampler(seed=0),
        )
        self.cost_steps = 0.0
        self.cost_seconds = 0.0

    def run(self) -> Outcome:
        rungs = self.strategy.trial.promotions
        for index in self.draw[: self.strategy.trials]:
            self._trial(self.study.ask(), index, self.strategy.trial.fraction)
        for depth, (keep, fraction) in enumerate(rungs, start=1):
            for before in rung_candidates(self.study.get_trials(deepcopy=False), depth, keep):
                attrs = {PROMOTED_FROM_ATTR: before.number, RUNG_ATTR: depth, FRACTION_ATTR: fraction}
                self.study.enqueue_trial({}, user_attrs={**attrs, RUN_ATTR: before.user_attrs[RUN_ATTR]})
                trial = self.study.ask()
                self._trial(trial, int(before.user_attrs[RUN_ATTR]), fraction, before)
        return self._outcome(len(rungs))

    def _trial(
        self,
        trial: optuna.Trial,
        index: int,
        fraction: float,
        before: optuna.trial.FrozenTrial | None = None,
    ) -> None:
        """Report the run's evaluations up to `fraction` as the study's objective does."""
        run = self.pool.runs[index]
        trial.set_user_attr(RUN_ATTR, index)
        stop = min(run.total_steps, max(1, round(fraction * run.total_steps)))
        # The recorded evaluation nearest the trial's end stands for it (the study evaluates
        # at its trials' own ends; the recorded runs only every few steps): the trial is
        # charged up to there.
        stop = min(run.steps, key=lambda s: (abs(s - stop), s))
        start = 0
        if before is not None:
            start = int(before.user_attrs.get("replay_stop", 0))
        reached = [i for i, s in enumerate(run.steps) if s <= stop] or [0]
        reporter = OptunaReporter(
            trial, stop_after_steps=stop, evals=self.strategy.trial.evals, prune=before is None
        )
        last = start
        for i in reached:
            step = run.steps[i]
            last = step
            if step > start and reporter.on_eval(EvalInfo(step=step, loss=run.losses[i], seconds=0.0)):
                break
        share = max(last - start, 0) / run.total_steps
        self.cost_steps += share
        self.cost_seconds += share * run.seconds
        trial.set_user_attr("replay_stop", last)
        records = [
            {"step": s, "samples_seen": s * run.batch, "loss": v}
            for s, v in zip(run.steps, run.losses, strict=True)
            if s <= last
        ] or [{"step": run.steps[0], "samples_seen": run.steps[0] * run.batch, "loss": run.losses[0]}]
        curve = trial_curve(
            records, scheduler=run.scheduler, warmup_ratio=run.warmup_ratio,
            learning_rate=run.learning_rate, full_run_steps=run.total_steps,
        )  # fmt: skip
        assert curve is not None
        others = [t.user_attrs for t in self.study.get_trials(deepcopy=False) if t.number != trial.number]
        final = predict_final_loss(
            curve,
            peers=study_peers(others, self.study.user_attrs),
            full_run_samples=run.total_steps * run.batch,
            correction=LossCorrection(),
            full_run_epochs=self.pool.epochs,
        )
        for key, value in final.user_attrs().items():
            trial.set_user_attr(key, value)
        if reporter.pruned_at is not None:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return
        rungs = self.strategy.trial.promotions
        value, scored_by = trial_score(
            final,
            objective=self.strategy.objective,
            multi_objective=False,
            last_rung=self.strategy.trend and bool(rungs) and rung_of(trial) == len(rungs),
        )
        trial.set_user_attr("scored_by", scored_by)
        self.study.tell(trial, value)

    def _outcome(self, depth: int) -> Outcome:
        runs = self.pool.runs
        finals = [runs[i].final for i in self.draw]
        picked, _ = pick_trial(self.study)
        standing = {int(t.user_attrs[RUN_ATTR]): t for t in standing_trials(self.study)}
        # The study's order of its configurations: the furthest rung first, then its score.
        order = sorted(standing.values(), key=lambda t: (-rung_of(t), t.value, t.number))
        rank = {int(t.user_attrs[RUN_ATTR]): r for r, t in enumerate(order)}
        scores = [float(rank.get(i, len(order))) for i in self.draw]
        mean_seconds = statistics.mean(runs[i].seconds for i in self.draw) or 1.0
        outcome = Outcome(
            finals, runs[int(picked.user_attrs[RUN_ATTR])].final, scores,
            self.cost_steps, self.cost_seconds / mean_seconds,
        )  # fmt: skip
        for number, prediction in end_predictions(self.study).items():
            trial = next(t for t in standing.values() if t.number == number)
            band, actual = prediction.final.band(), runs[int(trial.user_attrs[RUN_ATTR])].final
            outcome.errors.append(band["p50"] / actual - 1)
            outcome.inside.append(band["p10"] <= actual <= band["p90"])
            outcome.above.append(actual > band["p90"])
            outcome.half_widths.append(100 * math.log(band["p90"] / band["p50"]))
            outcome.low_half_widths.append(100 * math.log(band["p50"] / band["p10"]))
            outcome.rungs.append(rung_of(trial))
            if number == picked.number:  # the band the preset carries
                outcome.picked_band = (
                    band["p50"] / actual - 1, band["p10"] <= actual <= band["p90"],
                    outcome.half_widths[-1], outcome.low_half_widths[-1],
                )  # fmt: skip
        return outcome


def draws(pool: Pool, study_size: int, studies: int, seed: int) -> list[list[int]]:
    """`studies` seeded draws of `study_size` runs without replacement (the whole pool, once,
    where it holds no more)."""
    n = len(pool.runs)
    if n <= study_size:
        return [list(range(n))]
    rng = np.random.default_rng(seed)
    return [sorted(int(i) for i in rng.choice(n, study_size, replace=False)) for _ in range(studies)]


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    from scipy.stats import spearmanr

    value = spearmanr(a, b).statistic
    return float(value) if np.isfinite(value) else 0.0


def row(strategy: Strategy, outcomes: list[Outcome], study_size: int) -> dict[str, Any]:
    """The JSON row of one strategy over its studies."""
    hits, regrets, shares, ranks = [], [], [], []
    for o in outcomes:
        ordered = sorted(o.finals)
        hits.append(o.picked <= ordered[1] if len(ordered) > 1 else True)
        regrets.append(o.picked - ordered[0])
        spread = ordered[-1] - ordered[0]
        shares.append((o.picked - ordered[0]) / spread if spread > 0 else 0.0)
        ranks.append(spearman(o.scores, o.finals))
    errors = [abs(e) for o in outcomes for e in o.errors]
    inside = [x for o in outcomes for x in o.inside]
    above = [x for o in outcomes for x in o.above]
    widths = [w for o in outcomes for w in o.half_widths]
    lows = [w for o in outcomes for w in o.low_half_widths]
    return {
        "strategy": strategy.name,
        "fraction": strategy.fraction,
        "trial_fraction": strategy.trial.fraction,
        "rungs": [f"{k}@{f:g}" for k, f in strategy.trial.promotions],
        "pruner": strategy.pruner,
        "study_size": study_size,
        "studies": len(outcomes),
        "search_cost_full_runs": statistics.mean(o.cost_steps for o in outcomes),
        "search_cost_full_run_seconds": statistics.mean(o.cost_seconds for o in outcomes),
        "pick_in_best_two": statistics.mean(hits),
        "regret": statistics.mean(regrets),
        "regret_share_of_range": statistics.mean(shares),
        "spearman": statistics.median(ranks),
        "median_abs_pct_error": 100 * statistics.median(errors) if errors else None,
        "band_coverage": statistics.mean(inside) if inside else None,
        # Which side misses: above p90 (the rest of the misses lie below p10).
        "band_above_p90": statistics.mean(above) if above else None,
        "median_band_halfwidth_pct": statistics.median(widths) if widths else None,
        "median_band_low_halfwidth_pct": statistics.median(lows) if lows else None,
        "by_rung": _by_rung(outcomes),
        **_picked(outcomes),
    }


def _by_rung(outcomes: list[Outcome]) -> dict[str, dict[str, float]]:
    """Each rung's end predictions: median |error|, coverage and the band's sides (%)."""
    out: dict[str, dict[str, float]] = {}
    for rung in sorted({r for o in outcomes for r in o.rungs}):
        at = [(o, i) for o in outcomes for i, r in enumerate(o.rungs) if r == rung]
        out[str(rung)] = {
            "predictions": len(at),
            "median_abs_pct_error": 100 * statistics.median(abs(o.errors[i]) for o, i in at),
            "band_coverage": statistics.mean(o.inside[i] for o, i in at),
            "band_above_p90": statistics.mean(o.above[i] for o, i in at),
            "median_band_halfwidth_pct": statistics.median(o.half_widths[i] for o, i in at),
            "median_band_low_halfwidth_pct": statistics.median(o.low_half_widths[i] for o, i in at),
        }
    return out


def _picked(outcomes: list[Outcome]) -> dict[str, Any]:
    """The same of the picked configuration's end prediction alone: the preset's band."""
    bands = [o.picked_band for o in outcomes if o.picked_band is not None]
    if not bands:
        return {}
    return {
        "pick_median_abs_pct_error": 100 * statistics.median(abs(b[0]) for b in bands),
        "pick_band_coverage": statistics.mean(b[1] for b in bands),
        "pick_median_band_halfwidth_pct": statistics.median(b[2] for b in bands),
        "pick_median_band_low_halfwidth_pct": statistics.median(b[3] for b in bands),
    }


def within_budget(budget: float, study_size: int) -> Strategy:
    """The default schedule as the study plans it into `budget` full runs of search (a
    trial's cost all training: the recorded curves have no start-up)."""
    base = Strategy.default()
    plan = plan_search(
        TrialCost(fixed=0.0, per_fidelity=3600.0), budget_hours=budget, source="replay",
        n_trials=study_size, max_fidelity=base.trial.fraction, full_run_steps=750,
        evals=base.trial.evals, full_run_hours_p50=1.0, rungs=base.trial.promotions,
    )  # fmt: skip
    rungs = tuple(f"{k}@{f:g}" for k, f in plan.rungs) or ("none",)
    trial = replace(base.trial, fraction=plan.fidelity, rungs=rungs)
    name = f"default within {budget:g} full runs"
    return replace(base, name=name, trial=trial, trials=plan.trials, budget=budget)


def strategies(fractions: Sequence[float], study_size: int = 12) -> list[Strategy]:
    """The default, single-fidelity rows, and the schedules it was chosen among."""
    out = [Strategy.default()]
    out += [within_budget(b, study_size) for b in BUDGETS]
    out += [Strategy.named(f"{f:g} of the run", fraction=f) for f in fractions]
    out += [Strategy.named("before: 0.1 of the run, hyperband", fraction=0.1, pruner="hyperband")]
    out += [
        Strategy.named("0.1, best 3 to 0.3", fraction=0.1, rungs=("3@0.3",)),
        Strategy.named("0.02, best 6 to 0.1, best 2 to 0.4", fraction=0.02, rungs=("6@0.1", "2@0.4")),
        Strategy.named("0.1, best 4 to 0.3, best 2 to 0.6", fraction=0.1, rungs=("4@0.3", "2@0.6")),
        replace(Strategy.default(), name="default, last rung by its loss at fidelity", trend=False),
    ]  # fmt: skip
    return out


def replay(pool: Pool, strategy: Strategy, draw_list: list[list[int]]) -> list[Outcome]:
    return [Replay(pool, draw, strategy).run() for draw in draw_list]


def _chosen(name: str, only: str | None) -> bool:
    if only is None:
        return True
    items = [i.strip() for i in only.split(",") if i.strip()]
    return any(name == i[1:] if i.startswith("=") else i in name for i in items)


def write_quality(pool: Pool, rows: list[dict[str, Any]], chosen: list[Strategy]) -> None:
    """The default schedule's pick by budget, for `analysis.search.quality`."""
    budgets = []
    for strategy, r in zip(chosen, rows, strict=True):
        if strategy.name == "default" or strategy.budget is not None:
            budgets.append({"full_runs": r["search_cost_full_runs"], "pick_in_best_two": r["pick_in_best_two"],
                            "regret_share_of_range": r["regret_share_of_range"], "strategy": strategy.name})  # fmt: skip
    payload = {
        "written_by": "benchmarks/curve_replay.py --write-quality",
        "curves": pool.label,
        "study_size": rows[0]["study_size"],
        "studies": rows[0]["studies"],
        "budgets": sorted(budgets, key=lambda b: b["full_runs"]),
    }
    files.write_json(QUALITY_FILE, payload)
    print(f"wrote {QUALITY_FILE}")


COLUMNS = [
    ("strategy", "strategy"), ("cost", "search_cost_full_runs"), ("best 2", "pick_in_best_two"),
    ("regret", "regret"), ("regret/range", "regret_share_of_range"), ("spearman", "spearman"),
    ("|err| %", "median_abs_pct_error"), ("coverage", "band_coverage"),
    ("half-width %", "median_band_halfwidth_pct"), ("below %", "median_band_low_halfwidth_pct"),
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--curves", type=Path, default=DEFAULT_CURVES, help="Recorded curves (JSON).")
    parser.add_argument("--tiny-sets", default=None, help="A glob of rank_fidelity.py sets to replay too.")
    parser.add_argument("--study-size", type=int, default=12, help="Configurations per study (12).")
    parser.add_argument("--studies", type=int, default=100, help="Studies per strategy (100).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--subset", choices=("even", "odd"), default=None,
        help="Replay only the runs of even (odd) index: a half held out from the other.",
    )  # fmt: skip
    parser.add_argument("--fractions", default="0.1,0.2", help="Single-fidelity rows (0.1,0.2).")
    parser.add_argument(
        "--only", default=None,
        help="Comma-separated: replay only the strategies whose name has one of these "
        "(=NAME: exactly that name).",
    )  # fmt: skip
    parser.add_argument("--json", default=None, help="Write the rows here.")
    parser.add_argument(
        "--write-quality", action="store_true",
        help=f"Write the default's pick by budget to {QUALITY_FILE.name} (the plan reads it).",
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="Two studies of 6, seconds: the suite runs it.")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.smoke:
        args.studies, args.study_size = 2, 6
    if args.study_size < 2 or args.studies < 1:
        print("curve_replay: --study-size must be >= 2 and --studies >= 1", file=sys.stderr)
        return 2
    if not args.curves.is_file():
        print(f"curve_replay: --curves: no such file: {args.curves}", file=sys.stderr)
        return 2
    fractions = [float(f) for f in args.fractions.split(",") if f.strip()]
    chosen = [s for s in strategies(fractions, args.study_size) if _chosen(s.name, args.only)]
    pools = [load_curves(args.curves)]
    if args.tiny_sets:
        pools += [p for path in sorted(glob.glob(args.tiny_sets)) if (p := load_tiny_set(Path(path)))]
    payload: dict[str, Any] = {"not_replayed": NOT_REPLAYED, "seed": args.seed, "pools": {}}
    print(NOT_REPLAYED)
    real, tiny = pools[0], pools[1:]
    if args.subset:
        keep = tuple(r for i, r in enumerate(real.runs) if i % 2 == (args.subset == "odd"))
        real = replace(real, name=f"{real.name} ({args.subset} runs)", runs=keep)
    started = time.perf_counter()
    rows = []
    draw_list = draws(real, args.study_size, args.studies, args.seed)
    for strategy in chosen:
        rows.append(row(strategy, replay(real, strategy, draw_list), min(args.study_size, len(real.runs))))
    payload["pools"][real.name] = {"runs": len(real.runs), "rows": rows}
    print(f"\n{real.name}: {len(draw_list)} studies of {args.study_size}")
    print(table([c for c, _ in COLUMNS], [[r[k] for _, k in COLUMNS] for r in rows]))
    if tiny:
        tiny_rows = []
        for strategy in chosen:
            outcomes = [o for p in tiny for o in replay(p, strategy, draws(p, args.study_size, 1, args.seed))]
            tiny_rows.append(row(strategy, outcomes, args.study_size))
        payload["pools"]["tiny-model sets"] = {"sets": [p.name for p in tiny], "rows": tiny_rows}
        print(f"\nrecorded tiny-model sets: {len(tiny)} studies (one per set)")
        print(table([c for c, _ in COLUMNS], [[r[k] for _, k in COLUMNS] for r in tiny_rows]))
    payload["rows"] = rows
    payload["seconds"] = time.perf_counter() - started
    if args.write_quality:
        write_quality(real, rows, chosen)
    write_results(args.json, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
