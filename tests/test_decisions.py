"""The decisions package: time, cost and energy to train; compare; scaling; sensitivity."""

import json
import math
import subprocess
import sys

import pytest

from planner import errors
from planner.decisions.train import Power, StepTimeBand, training_run


def run(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, timeout=300)


# ---- time, cost and energy to train ----------------------------------------------------------------------

def test_training_run_matches_deepseek_v3_reported_arithmetic():
    # DeepSeek-V3 tech report, Table 1 and §1 (shared/reference/modern-training.md, "Cost" row): 180K H800
    # GPU-hours per trillion tokens = 3.7 days on 2,048 GPUs; 2,788K GPU-hours cost $5.576M at $2 per GPU-hour.
    # A step time chosen so that 1e12 tokens take 180K GPU-hours on 2,048 GPUs must give those figures.
    tokens, per_step, gpus = 1e12, 15_360 * 4096, 2048
    steps = math.ceil(tokens / per_step)
    step = 180e3 * 3600 / gpus / steps
    r = training_run(tokens=tokens, global_batch_size=15_360, seq_length=4096, step_seconds=step, num_gpus=gpus,
                     power=Power(700.0, "test"), price_per_gpu_hour=2.0)
    assert r.steps == steps
    assert r.gpu_hours == pytest.approx(180e3)
    assert r.wall_days == pytest.approx(3.66, abs=0.01)  # "3.7 days"
    assert r.cost == pytest.approx(360e3)
    total = training_run(tokens=1, global_batch_size=1, seq_length=1, step_seconds=2_788e3 * 3600 / gpus,
                         num_gpus=gpus, power=Power(None, "none"), price_per_gpu_hour=2.0)
    assert total.cost == pytest.approx(5.576e6)
    assert total.gpu_energy_kwh is None


def test_energy_is_gpus_times_board_power_times_wall_clock_and_pue_scales_it():
    # 16,384 GPUs x 700 W for 10 days = 16,384 x 0.7 kW x 240 h = 2,752,512 kWh (hand arithmetic)
    r = training_run(tokens=1e6, global_batch_size=1, seq_length=1e6 // 100, step_seconds=864_000 / 100,
                     num_gpus=16_384, power=Power(700.0, "H100 datasheet"), pue=1.2)
    assert r.wall_days == pytest.approx(10.0)
    assert r.gpu_energy_kwh == pytest.approx(2_752_512)
    assert r.facility_energy_kwh == pytest.approx(2_752_512 * 1.2)


def test_the_error_band_carries_through_every_quantity():
    band = StepTimeBand(0.9, 1.25, "test band")
    r = training_run(tokens=1e9, global_batch_size=8, seq_length=1024, step_seconds=2.0, num_gpus=64,
                     power=Power(400.0, "A100"), price_per_gpu_hour=1.5, band=band)
    for key, b in r.bounds().items():
        v = r.quantities()[key]
        if v is None:  # facility energy without a PUE
            assert b is None
            continue
        assert b == (pytest.approx(0.9 * v), pytest.approx(1.25 * v))
    doc = r.as_json()
    assert doc["gpu_hours"]["high"] == pytest.approx(1.25 * r.gpu_hours)
    assert doc["error_band"]["source"] == "test band"
    with pytest.raises(ValueError):
        StepTimeBand(1.1, 1.2, "lower above 1")


def test_catalog_power_has_a_source_for_every_gpu():
    import yaml

    from cluster_specs import load_gpu
    from tests.conftest import ROOT

    names = yaml.safe_load((ROOT / "cluster_specs" / "gpus.yaml").read_text())
    for name in names:
        gpu = load_gpu(name)
        assert gpu.board_power_watts and 100 <= gpu.board_power_watts <= 1200, name
        assert gpu.board_power_source.startswith(("NVIDIA", "HGX")), name  # a named document
    assert load_gpu("H100-SXM").board_power_watts == 700  # NVIDIA H100 SXM datasheet "up to 700 W"
    assert load_gpu("A100-SXM4-80GB").board_power_watts == 400  # NVIDIA A100 SXM datasheet "400 W"


def test_plan_tokens_json_and_text():
    args = ["plan", "-c", "dgx-a100-80gb", "-n", "2", "-m", "llama2-7b", "-b", "64", "-s", "4096", "--no-solver",
            "--tokens", "1e11", "--gpu-hour-price", "2.5"]
    proc = run(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    from planner.contract import PlanDocument

    PlanDocument.model_validate(doc)
    t = doc["training_run"]
    assert t["steps"] == math.ceil(1e11 / (64 * 4096))
    assert t["wall_clock_seconds"]["value"] == pytest.approx(t["steps"] * doc["predicted"]["step_time_seconds"])
    # independent: tokens / tokens per second, within one step
    assert t["wall_clock_seconds"]["value"] == pytest.approx(1e11 / doc["predicted"]["tokens_per_second"], rel=1e-4)
    assert t["cost"]["value"] == pytest.approx(t["gpu_hours"]["value"] * 2.5)
    assert t["gpu_energy_kwh"]["value"] == pytest.approx(16 * 400 * t["wall_clock_seconds"]["value"] / 3.6e6)
    assert t["gpu_board_power_source"].startswith("NVIDIA A100 datasheet")
    assert "cooling and power delivery (PUE)" in t["energy_left_out"]
    text = run(*args).stdout
    assert "wall clock" in text and "GPU-hours" in text and "an upper bound" in text and "left out" in text
    assert max(len(line) for line in text.splitlines()) <= 80


@pytest.mark.parametrize("bad", [["--tokens", "0"], ["--tokens", "nan"], ["--gpu-hour-price", "-1", "--tokens", "1e9"],
                                 ["--pue", "0.5", "--tokens", "1e9"], ["--gpu-hour-price", "2"]])
def test_bad_run_options_are_one_line_input_errors(bad):
    proc = run("plan", "-c", "dgx-a100-80gb", "-n", "1", "-m", "gpt3-1.3b", "-b", "8", "-s", "1024", *bad)
    assert proc.returncode == errors.EXIT_INPUT, proc.stderr
    assert proc.stderr.startswith("error: --") and "Traceback" not in proc.stderr
