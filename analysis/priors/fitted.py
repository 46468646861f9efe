"""The priors `analysis.plan` starts from, as fitted to published LoRA runs, and their file.

`analysis.priors.fit` fits them (`python -m benchmarks.published_runs --write-priors`)
and stores them in `published_priors.json`; this module reads them and turns them into the
time model's coefficients for a GPU. It imports nothing of the planning, so the planning can
import it.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from analysis.timemodel.gpus import KNOWN_GPUS, GpuSpec, peak_of
from analysis.timemodel.hardware import prior_coefficients
from analysis.timemodel.model import Coefficients, ModelProfile
from analysis.timemodel.run_setup import MemoryTerms

GIB = 2**30
PRIORS_FILE = "published_priors.json"


@dataclass(frozen=True)
class PublishedPriors:
    """What the fit to published runs gives a plan on a GPU it has not measured.

    Attributes:
        utilisation: Fraction of the dense peak per GPU name (`analysis.timemodel.gpus`) that had points.
        pooled_utilisation: For a GPU of a generation with no points: the median over all
            fitted points.
        micro_fixed_seconds: Per micro-step overhead beyond FLOPs (kernel launches, hooks).
        log_p10: Lower end of the duration band (log of actual / predicted).
        log_p90: Upper end.
        memory: The fitted memory terms.
        fitted_points: Names of the rows fitted (the rest were held out).
        timed_points: Those of them with a published speed: what the utilisation and the
            duration band were fitted to (the others fitted memory alone).
    """

    utilisation: dict[str, float]
    pooled_utilisation: float
    micro_fixed_seconds: float
    log_p10: float
    log_p90: float
    memory: MemoryTerms
    fitted_points: tuple[str, ...] = ()
    timed_points: tuple[str, ...] = ()

    def utilisation_source(self, gpu: GpuSpec) -> str:
        """Whose fitted utilisation `utilisation_for` gives `gpu`, in words."""
        if gpu.name in self.utilisation:
            return "its"
        return f"its generation's ({gpu.architecture})" if self._kin(gpu) else "the pooled"

    def utilisation_for(self, gpu: GpuSpec) -> float:
        """The GPU's fitted utilisation, else its generation's (median), else the pooled one.

        An H200 computes as an H100 does, so it borrows the H100's fitted speed rather than
        the pooled one, which the A100 runs dominate.
        """
        if gpu.name in self.utilisation:
            return self.utilisation[gpu.name]
        kin = self._kin(gpu)
        return statistics.median(kin) if kin else self.pooled_utilisation

    def _kin(self, gpu: GpuSpec) -> list[float]:
        """Fitted utilisations of the other GPUs of `gpu`'s generation."""
        return [
            value
            for name, value in self.utilisation.items()
            if gpu.architecture and _architecture(name) == gpu.architecture
        ]

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        data = dataclasses.asdict(self)
        data["fitted_points"] = list(self.fitted_points)
        data["timed_points"] = list(self.timed_points)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PublishedPriors:
        """Build from `to_dict` output."""
        return cls(
            utilisation={str(k): float(v) for k, v in data["utilisation"].items()},
            pooled_utilisation=float(data["pooled_utilisation"]),
            micro_fixed_seconds=float(data["micro_fixed_seconds"]),
            log_p10=float(data["log_p10"]),
            log_p90=float(data["log_p90"]),
            memory=MemoryTerms(**{k: float(v) for k, v in data["memory"].items()}),
            fitted_points=tuple(data.get("fitted_points", ())),
            timed_points=tuple(data.get("timed_points", data.get("fitted_points", ()))),
        )


def priors_path() -> Path:
    """Where the fitted priors are stored (inside the package)."""
    return Path(str(resources.files("analysis.priors").joinpath(PRIORS_FILE)))


def stored_profiles(path: str | Path | None = None) -> dict[tuple[str, Any], ModelProfile]:
    """The model profiles the stored fit used, keyed as `profile_for` caches them."""
    source = Path(path) if path is not None else priors_path()
    if not source.is_file():
        return {}
    stored = json.loads(source.read_text(encoding="utf-8")).get("profiles", [])
    return {
        (item["model"], item["targets"] if isinstance(item["targets"], str) else tuple(item["targets"])):
        ModelProfile(**item["profile"])
        for item in stored
    }  # fmt: skip


def profiles_to_store(cache: dict[tuple[str, Any], ModelProfile]) -> list[dict[str, Any]]:
    """`profile_for`'s cache as JSON-ready items (what `stored_profiles` reads)."""
    return [
        {"model": model, "targets": targets if isinstance(targets, str) else list(targets),
         "profile": dataclasses.asdict(profile)}
        for (model, targets), profile in sorted(cache.items(), key=lambda kv: str(kv[0]))
    ]  # fmt: skip


def load(path: str | Path | None = None) -> PublishedPriors | None:
    """The stored fit; None when there is none yet."""
    source = Path(path) if path is not None else priors_path()
    if not source.is_file():
        return None
    return PublishedPriors.from_dict(json.loads(source.read_text(encoding="utf-8")))


def coefficients(
    gpu: GpuSpec, priors: PublishedPriors, *, peak: float | None = None
) -> Coefficients:
    """The time model's prior coefficients for `gpu` with the fitted utilisation and band."""
    peak = peak if peak is not None else peak_of(gpu)
    base = prior_coefficients(gpu.hardware(), peak=peak)
    return with_utilisation(
        base, peak, priors.utilisation_for(gpu), priors.micro_fixed_seconds,
        log_p10=priors.log_p10, log_p90=priors.log_p90,
        source=f"published-fit:{gpu.name}",
    )  # fmt: skip


def with_utilisation(
    base: Coefficients,
    peak: float,
    utilisation: float,
    micro_fixed_seconds: float,
    *,
    log_p10: float,
    log_p90: float,
    source: str,
    attention_rate: float = 1.0,
) -> Coefficients:
    """`base` with its FLOP rates at `utilisation` of `peak` and the given band."""
    effective = peak * utilisation
    return dataclasses.replace(
        base,
        micro_fixed_seconds=micro_fixed_seconds,
        micro_seconds_per_flop=1.0 / effective,
        micro_seconds_per_adapter_flop=1.0 / effective,
        # Attention matmuls at half the rate of the weights' (the time model's prior).
        micro_seconds_per_attention_flop=2.0 * attention_rate / effective,
        eval_seconds_per_flop=1.0 / effective,
        systematic_log_p10=log_p10,
        systematic_log_p90=log_p90,
        source=source,
    )


def _architecture(name: str) -> str:
    """The generation of the known GPU `name` ("" for one the table does not know)."""
    return next((g.architecture for g in KNOWN_GPUS if g.name == name), "")
