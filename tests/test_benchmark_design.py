"""The time-model benchmarks predict configurations the probes never ran."""

from analysis.calibrate import PROBE_DESIGN
from benchmarks.time_model_accuracy import HELD_OUT

FACTORS = ("micro_batch_size", "gradient_accumulation_steps", "max_length", "lora_r")


def test_held_out_configurations_share_no_level_with_the_probes() -> None:
    assert len(HELD_OUT) >= 8
    for factor in FACTORS:
        probed = {getattr(p, factor) for p in PROBE_DESIGN}
        held = {getattr(h, factor) for h in HELD_OUT}
        assert not probed & held, f"{factor}: {sorted(probed & held)} is both probed and held out"


def test_probe_ranks_bracket_the_held_out_ranks() -> None:
    probed = [p.lora_r for p in PROBE_DESIGN]
    assert all(min(probed) < h.lora_r < max(probed) for h in HELD_OUT)
