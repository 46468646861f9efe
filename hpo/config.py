"""The study configuration: YAML (`--config`) + command-line overrides -> one validated object.

The tree: `StudyConfig` holds the search's own fields and its parts, `trial` (a trial's
share of the data, its evaluations, promotion), `full_run` (the preset's schedule), `budget`
(a YAML section of its own) and `tracking` (MLflow). Only `budget` is nested in the YAML; the
other parts keep flat keys (``trial_fraction``), as flags do (``--trial-fraction``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from analysis.search.schedule import DEFAULT_RUNGS, DEFAULT_TRIAL_FRACTION, parse_rungs
from analysis.timemodel.interconnect import DEFAULT_LINK, LINKS
from common.checks import require, require_choice, require_int
from common.config import from_mapping, knob, part, same_as, to_mapping
from common.errors import BadInputError
from common.files import read_yaml
from common.redact import redact_values
from common.workdir import WorkDir
from trainers.run_options import RunTracking, RunWindow
from trainers.spec import (
    STUDY_EVAL_SAMPLES,
    STUDY_FULL_CHECKPOINT_INTERVAL,
    STUDY_FULL_EVAL_INTERVAL,
    TrainSpec,
)

SAMPLERS = ("tpe", "nsga2", "gp", "cmaes", "random", "skopt")
# What a study minimises: the trial's loss (`objective`), and optionally its full run's
# predicted hours or cost as a second objective (a Pareto front).
OBJECTIVE_AXES = ("loss", "hours", "cost")
_SINGLE_OBJECTIVE_SAMPLERS = ("cmaes", "skopt")
PRUNERS = ("hyperband", "successive_halving", "median", "none")
OBJECTIVES = ("predicted_full_run_loss", "loss_at_fidelity")
TRACKING_OUTAGES = ("spool", "fail")  # a tracking server that does not answer at start
# Fields of earlier versions: a trial's fidelity is now a share of its full run's data.
_RENAMED = {
    "trial_max_steps": "trial_fraction, the share of the full run's data a trial trains on",
    "eval_interval": "trial_evals, the evaluations per trial",
}
REPO_MLFLOW_YAML = Path(__file__).resolve().parent.parent / "mlflow.yaml"
_MLFLOW_DEFAULTS = {
    "tracking_uri": "sqlite:///{work_dir}/mlflow.db",
    "experiment_name": "hpo-lora",
    "server": {"host": "127.0.0.1", "port": 5000},
}


@dataclass(frozen=True)
class Budget(RunWindow):
    """The window a full run must fit into, and what an hour costs."""

    where: ClassVar[str] = "budget."

    price_per_hour: float = knob(
        0.0,
        "Price of one GPU (the machine a trial runs on) per hour, for the cost estimate: a "
        "full run on gpus_per_run GPUs costs that many times more per hour.",
        at_least=0,
        ask="One GPU's price per hour (0 if free)",
    )
    max_memory_gb: float | None = knob(
        None, "Memory limit in GB. Default: the device's memory.", above=0
    )
    search_hours: float | None = knob(
        None,
        "GPU-hours the search may spend, all workers together (trials, the probe). The study "
        "plans its trials into them and ends when they are spent.",
        above=0,
    )
    search_budget_pct: float | None = knob(
        None,
        "The search's GPU-hours as a percentage of the full run's predicted p50 in "
        "GPU-hours (its hours x gpus_per_run; with search_hours: the smaller). Default: 50 % "
        "once that is an hour or more (analysis/search/schedule.py says why); below that, no "
        "budget.",
        above=0,
        at_most=1000,
    )

    gpus_per_run: int = knob(
        1,
        "GPUs the full run trains on, data-parallel on one node (trainers.train --gpus N). "
        "The window, memory (per GPU) and cost (N x price x hours) are judged for the full "
        "run on N; each trial trains on one GPU with the accumulation x N, the same effective "
        "batch and steps, so it stays the start of its full run. To search N instead, give "
        "the space a gpus: {choice: [1, 2, 4, 8]} and leave this at 1.",
        at_least=1,
        ask="GPUs the full run trains on (data-parallel, one node)",
    )
    interconnect: str = knob(
        DEFAULT_LINK,
        f"The link between the full run's GPUs: {' | '.join(LINKS)} (the gradient "
        "all-reduce's speed; read only with gpus_per_run > 1).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int("budget.gpus_per_run", self.gpus_per_run, 1)
        require_choice("budget.interconnect", self.interconnect, tuple(LINKS))

    @property
    def available_seconds(self) -> float:
        return self.window_hours * 3600 - self.safety_margin_minutes * 60


@dataclass(frozen=True)
class TrialConfig:
    """What one trial trains: a share of its full run, with evenly spaced evaluations."""

    fraction: float = knob(
        DEFAULT_TRIAL_FRACTION,
        "Share of its full run's training data a trial trains on (the fidelity): every "
        "configuration sees the same data.",
        above=0,
        at_most=1,
    )
    evals: int = knob(
        6, "Evaluations per trial, evenly spaced: the learning curve's points.", at_least=1
    )
    rungs: tuple[str, ...] = knob(
        DEFAULT_RUNGS,
        "Successive halving in data fraction, after the trials: K@F sends the K best "
        "configurations of the rung before on to F of their full run, each continuing from "
        "its last checkpoint (comma-separated, in order; none: no rungs). The last rung is "
        "scored by its loss one doubling on (its last loss plus its drop since half its "
        "data).",
        key="rungs",
    )
    promote: int = knob(
        0,
        "Continue the K best trials to promote_fraction of their full run, as new points of "
        "the same configuration (one rung: replaces rungs).",
        key="promote",
        at_least=0,
    )
    promote_fraction: float = knob(
        0.3,
        "Share of the full run a promoted trial trains on.",
        key="promote_fraction",
        above=0,
        at_most=1,
    )
    # Off since the rungs (docs/curve-replay.md): the last rung's curves go through part of
    # their own decay, which identifies the loss law's annealing term as a reference did, and
    # a reference of 0.3 (the best share on the tiny models, docs/rank-fidelity-history.md)
    # costs a fifth of the whole default search.
    reference_fraction: float = knob(
        0.0,
        "Once the first trials finished, run the best so far once more as a run of this share "
        "of its full run's steps with a decay of its own: the study's loss law learns the "
        "decay's effect from it (0: no reference run; its time counts in the search budget).",
        key="reference_fraction",
        at_least=0,
        at_most=1,
    )

    def __post_init__(self) -> None:
        require_int("trial_evals", self.evals, 1)
        require(
            0 < self.fraction <= 1,
            f"trial_fraction must be in (0, 1], but got trial_fraction={self.fraction!r}",
        )
        if isinstance(self.rungs, (str, list)):  # YAML may hold "6@0.12,2@0.44" or a list
            value = self.rungs.split(",") if isinstance(self.rungs, str) else self.rungs
            object.__setattr__(self, "rungs", tuple(str(v).strip() for v in value))
        parse_rungs(self._rungs(), self.fraction)  # a bad rung stops the config here
        require_int("promote", self.promote, 0)
        require(
            0 < self.promote_fraction <= 1
            and (self.promote == 0 or self.fraction < self.promote_fraction),
            f"promote_fraction must be in (trial_fraction, 1], but got "
            f"promote_fraction={self.promote_fraction!r}",
        )
        require(
            0 <= self.reference_fraction <= 1,
            f"reference_fraction must be in [0, 1], but got "
            f"reference_fraction={self.reference_fraction!r}",
        )

    @property
    def promotions(self) -> tuple[tuple[int, float], ...]:
        """The rungs after the trials, (K, F) each: `promote` where given, else `rungs`."""
        if self.promote:
            return ((self.promote, self.promote_fraction),)
        return parse_rungs(self._rungs(), self.fraction)

    def _rungs(self) -> tuple[str, ...]:
        """`rungs`; the default ones only where they go beyond the trial fraction (a longer
        trial fraction keeps the default rungs above it, or none)."""
        if self.rungs != DEFAULT_RUNGS:
            return self.rungs
        beyond = tuple(r for r in DEFAULT_RUNGS if float(r.partition("@")[2]) > self.fraction)
        return beyond or ("none",)


@dataclass(frozen=True)
class FullRunConfig:
    """The full run a preset describes: its length, evaluations and checkpoints."""

    epochs: float = knob(1.0, "Epochs of the full run the preset describes.", key="epochs", above=0)
    eval_interval: int = knob(
        STUDY_FULL_EVAL_INTERVAL,
        "Steps between evaluations in the full run.",
        at_least=1,
    )
    checkpoint_interval: int = knob(
        STUDY_FULL_CHECKPOINT_INTERVAL,
        "Steps between checkpoints in the full run.",
        at_least=0,
    )

    def __post_init__(self) -> None:
        require(self.epochs > 0, f"epochs must be > 0, but got epochs={self.epochs!r}")
        require_int("full_eval_interval", self.eval_interval, 1)
        require_int("full_checkpoint_interval", self.checkpoint_interval, 0)


@dataclass(frozen=True)
class TrackingConfig(RunTracking):
    """Where the study's MLflow records go, and what it does when the server does not answer."""

    outage: str = knob(
        "spool",
        "A tracking server that does not answer at start: spool (start all the same; records "
        "wait under the work dir and are sent when it answers) | fail (stop with one line). "
        "Mid-study, records always wait on disk.",
    )
    exit_wait_seconds: float = knob(
        30.0,
        "Before the study exits, how long to wait for a tracking server that does not answer "
        "to take the records waiting on disk (0: do not wait; what is left is sent by "
        "python -m hpo.tracking --replay).",
        at_least=0,
    )

    def __post_init__(self) -> None:
        # Before the parent's bounds check, which names the field without its YAML prefix.
        require(
            self.exit_wait_seconds >= 0,
            f"tracking_exit_wait_seconds must be >= 0, but got "
            f"tracking_exit_wait_seconds={self.exit_wait_seconds!r}",
        )
        super().__post_init__()
        require_choice("tracking_outage", self.outage, TRACKING_OUTAGES)


@dataclass(frozen=True)
class StudyConfig:
    """Everything `python -m hpo.study` needs. Defaults give the embedded demo study."""

    model: str | None = knob(None, "Local model folder. Default: the tiny demo model.")
    data: str | None = knob(
        None,
        "Training data: a JSONL, Parquet, CSV or JSON file, a folder of such files (a Hub "
        "dataset's, its train split) or a Dataset.save_to_disk folder (docs: Your data "
        "formats). Default: the bundled demo data.",
    )
    space: str | None = knob(
        None,
        "Search-space YAML. Default: the model family's (search_spaces/families/, by "
        "model_type), else search_spaces/default.yaml.",
    )
    profiles: tuple[str, ...] | None = knob(
        None,
        "Profiles allowed, comma-separated. Default: all.",
    )
    objective: str = knob(
        "predicted_full_run_loss",
        "What a trial scores: predicted_full_run_loss (its full run's final validation loss, "
        "extrapolated from its curve) | loss_at_fidelity (its last validation loss).",
    )
    objectives: tuple[str, ...] = knob(
        ("loss",),
        "What the study minimises: loss, or a Pareto front of loss and the full run's "
        "predicted hours or cost (loss,hours | loss,cost). Multi-objective studies are not "
        "pruned by learning curve; the window and memory still bound them.",
    )
    trial: TrialConfig = part(TrialConfig, TrialConfig.__doc__, flat=True, prefix="trial_")
    eval_samples: int = same_as(TrainSpec, "eval_samples", default=STUDY_EVAL_SAMPLES)
    max_length: int | None = knob(
        None,
        "Tokens per training sample (a longer one is cut; with padding-free packing, the most "
        "tokens of a packed sequence), for every profile that sets none. Default: the data's "
        "p99 token length, capped by the model's context.",
        at_least=1,
    )
    eval_max_length: int | None = knob(
        None,
        "Tokens per validation sample, for every run of the study. Default: the data's p99 "
        "token length, capped by the model's context.",
        at_least=1,
    )
    full_run: FullRunConfig = part(FullRunConfig, FullRunConfig.__doc__, flat=True, prefix="full_")
    probe_seconds: float = knob(
        0.0,
        "Before the first trial, when the work dir holds no calibration for this hardware and "
        "model: train the probe design (as python -m analysis.calibrate --probe) for about "
        "this many seconds (at least 3 runs) and calibrate from it; later studies reuse it. "
        "0: no probe, the trials alone calibrate.",
        at_least=0,
    )
    budget: Budget = part(Budget, "The window a full run must fit into, and what an hour costs.")
    sampler: str = knob("tpe", f"Optuna sampler: {' | '.join(SAMPLERS)}.")
    # The rungs after the trials halve the configurations; a pruner inside trials of 0.02
    # of the run would compare them at a fraction of a percent of it (docs/curve-replay.md).
    pruner: str = knob("none", f"Optuna pruner inside each trial: {' | '.join(PRUNERS)}.")
    n_trials: int = knob(10, "Trials in the study (all workers, all runs).", at_least=1)
    timeout: float | None = knob(None, "Seconds this worker may spend. Default: no limit.", above=0)
    seed: int = knob(0, "Random seed of the sampler and the trials.")
    storage: str | None = knob(None, "Optuna storage URL. Default: SQLite in the work dir.")
    heartbeat_seconds: int = knob(
        30,
        "Worker heartbeat (server storages): a silent worker's trial is retried.",
        at_least=1,
    )
    grace_seconds: int = knob(
        120,
        "Silence after which a worker counts as dead (longer than heartbeat_seconds).",
        at_least=2,
    )
    study_name: str = knob("hpo-demo", "Study name (same name + storage = resume).")
    work_dir: str = knob("hpo-runs", "Where databases, caches and presets go.")
    tracking: TrackingConfig = part(
        TrackingConfig,
        TrackingConfig.__doc__,
        flat=True,
        prefix="tracking_",
    )
    reuse_base_model: bool = knob(
        True,
        "Keep the base model, tokenizer and tokenized data in memory between a worker's "
        "trials and swap only the LoRA adapter (false: load them for every trial, as a full "
        "run does).",
    )
    allow_quantization: bool = knob(
        False,
        "Let the search propose QLoRA (an NF4 base) where the space has a quantization key; "
        "without it only where the base in the run's precision does not fit the device's "
        "memory.",
    )
    device: str = same_as(TrainSpec, "device")
    precision: str = same_as(TrainSpec, "precision")
    validation_fraction: float = same_as(TrainSpec, "validation_fraction")
    validation_split: str | None = same_as(TrainSpec, "validation_split")
    data_columns: str | None = same_as(TrainSpec, "data_columns")

    def __post_init__(self) -> None:
        for name in ("objectives", "profiles"):
            value = getattr(self, name)
            if isinstance(value, (list, str)):
                object.__setattr__(self, name, tuple([value] if isinstance(value, str) else value))
        require_int("eval_samples", self.eval_samples, 1)
        require_int("n_trials", self.n_trials, 1)
        require_int("max_length", self.max_length, 1, optional=True)
        require_int("eval_max_length", self.eval_max_length, 1, optional=True)
        require_int("heartbeat_seconds", self.heartbeat_seconds, 1)
        require(
            isinstance(self.grace_seconds, int) and self.grace_seconds > self.heartbeat_seconds,
            f"grace_seconds must be longer than heartbeat_seconds, but got {self.grace_seconds=}",
        )
        require(
            self.probe_seconds >= 0, f"probe_seconds must be >= 0, but got {self.probe_seconds=}"
        )
        require_choice("objective", self.objective, OBJECTIVES)
        self._check_objectives()
        require(
            self.timeout is None or self.timeout > 0,
            f"timeout must be > 0, but got {self.timeout=}",
        )
        require_choice("sampler", self.sampler, SAMPLERS)
        require_choice("pruner", self.pruner, PRUNERS)
        require(bool(self.study_name), "study_name must not be empty")
        require(
            0 < self.validation_fraction < 1,
            f"validation_fraction must be in (0, 1), but got {self.validation_fraction=}",
        )
        self._check_paths()

    def _check_paths(self) -> None:
        for name in ("model", "space"):  # data: `open_source` below says what it is not
            value = getattr(self, name)
            if value is not None and not Path(value).exists():
                raise BadInputError(f"{name}: path not found: {value}")
        if self.model is not None and not (Path(self.model) / "config.json").is_file():
            raise BadInputError(
                f"model: {self.model} is not a transformers model folder (no config.json)"
            )
        if self.space is not None and Path(self.space).is_dir():
            raise BadInputError(f"space: {self.space} is a directory, not a file")
        from trainers.data.sources import open_source, parse_columns

        if self.data is not None:
            open_source(self.data)  # a data file of a known type, or a folder of them or saved
        parse_columns(self.data_columns)

    def _check_objectives(self) -> None:
        axes = self.objectives
        require(
            isinstance(axes, tuple) and all(isinstance(a, str) for a in axes),
            f"objectives must be a list of names, but got objectives={axes!r}",
        )
        require(
            axes in (("loss",), ("loss", "hours"), ("loss", "cost")),
            f"objectives must be [loss], [loss, hours] or [loss, cost], but got {list(axes)}",
        )
        require(
            "cost" not in axes or self.budget.price_per_hour > 0,
            "objectives [loss, cost] needs budget.price_per_hour > 0 (the cost of an hour)",
        )
        require(
            not self.multi_objective or self.sampler not in _SINGLE_OBJECTIVE_SAMPLERS,
            f"sampler {self.sampler} models one objective; with objectives {list(axes)} use "
            "tpe, nsga2, gp or random",
        )

    @property
    def gpus(self) -> int:
        """GPUs the full run trains on (`trainers.run_spec.RunSettings`): the budget's."""
        return self.budget.gpus_per_run

    @property
    def multi_objective(self) -> bool:
        """Loss and hours (or cost): the study keeps a Pareto front instead of one best."""
        return len(self.objectives) > 1

    @property
    def storage_url(self) -> str:
        if self.storage:
            return self.storage
        return WorkDir(self.work_dir).optuna_url

    def to_dict(self) -> dict[str, Any]:
        """Plain values, flat as in the YAML, without the storage URL, passwords in URLs hidden
        (`***`).

        This is what a study stores and logs; the connection itself uses the real URLs.
        """
        out = redact_values(to_mapping(self))
        out.pop("storage")
        out["profiles"] = list(self.profiles) if self.profiles else None
        out["objectives"] = list(self.objectives)
        out["rungs"] = list(self.trial.rungs)  # as JSON stores it
        return out


def mlflow_defaults(path: Path = REPO_MLFLOW_YAML) -> dict[str, Any]:
    """Tracking URI, experiment name and server host/port from `mlflow.yaml`."""
    values = dict(_MLFLOW_DEFAULTS)
    if path.is_file():
        loaded = read_yaml(path)
        values.update(loaded)
    return values


def load_config(path: str | None = None, overrides: dict[str, Any] | None = None) -> StudyConfig:
    """YAML file (optional) + overrides -> validated config.

    Args:
        path: The study YAML, if any.
        overrides: Field values (flat keys, as in the YAML) that replace the YAML's; None
            values are ignored. Budget fields may come flat (``window_hours``) or nested
            (``budget: {window_hours: ...}``).
    """
    values: dict[str, Any] = read_yaml(Path(path)) if path else {}
    budget = dict(values.pop("budget", None) or {})
    budget_fields = {f.name for f in dataclasses.fields(Budget)}
    given = dict(overrides or {})
    nested = given.pop("budget", None)
    given.update(nested if isinstance(nested, dict) else {})
    for key, value in given.items():
        if value is None:
            continue
        if key in budget_fields:
            budget[key] = value
        else:
            values[key] = value
    values["budget"] = budget
    defaults = mlflow_defaults()
    values.setdefault("tracking_uri", defaults["tracking_uri"])
    values.setdefault("experiment_name", defaults["experiment_name"])
    work_dir = Path(str(values.get("work_dir", "hpo-runs"))).resolve()
    values["tracking_uri"] = str(values["tracking_uri"]).replace("{work_dir}", str(work_dir))
    return from_mapping(StudyConfig, values, "config", renamed=_RENAMED)
