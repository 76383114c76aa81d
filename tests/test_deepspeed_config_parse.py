"""`check` reads a DeepSpeed config's `zero_optimization` keys as DeepSpeed 0.19.8 parses them, and calls a value a
violation exactly where DeepSpeed refuses to start: its config models (runtime/config_utils.py DeepSpeedConfigModel)
drop a key set to "auto", so the default applies, and parse the rest with pydantic v2 in lax mode (a bool takes
true/false, 0 or 1 and 'yes'/'off'/... in any case; an int an integral number, a bool or a string of digits; null only
where the field is Optional, overlap_comm). Checked against DeepSpeedZeroConfig itself where DeepSpeed is installed
(`make test` installs it), and against what that parse implies without it."""

from __future__ import annotations

import math

import pytest

from planner.integrations.readers import ds_config_bool, ds_config_int
from tests.conftest import read_deepspeed_zero

BOOL_VALUES = [True, False, 0, 1, 1.0, 0.0, "true", "FALSE", "yes", "off", "T", "n", "auto",
               2, 0.5, " true", "AUTO", "maybe", None, [], {}]
INT_VALUES = [0, 1, 200_000_000, 2e8, "300000000", " +5 ", True, "auto", -1, 2.5, "5e8", math.inf, math.nan, 1e30, None]
BOOL_KEYS = [(2, "contiguous_gradients"), (2, "overlap_comm"), (3, "overlap_comm"), (1, "reduce_scatter"),
             (2, "use_multi_rank_bucket_allreduce")]
INT_KEYS = [(2, "reduce_bucket_size"), (3, "reduce_bucket_size"), (3, "stage3_max_reuse_distance")]


def _deepspeed_reads(stage: int, key: str, value):
    """(starts, the field's value) as DeepSpeed 0.19.8's DeepSpeedZeroConfig parses {stage, key: value}."""
    config = pytest.importorskip("deepspeed.runtime.zero.config", reason="DeepSpeed not installed: `make test` "
                                                                        "installs it")
    try:
        parsed = config.DeepSpeedZeroConfig(**{"stage": stage, key: value})
    except Exception:  # pydantic's ValidationError: DeepSpeed stops at start-up
        return False, None
    field = {"stage3_max_reuse_distance": "max_reuse_distance"}.get(key, key)
    return True, getattr(parsed, field)


@pytest.mark.parametrize(("stage", "key"), BOOL_KEYS + INT_KEYS)
def test_check_refuses_exactly_what_deepspeed_refuses(tmp_path, stage, key):
    values = BOOL_VALUES if (stage, key) in BOOL_KEYS else INT_VALUES
    for value in values:
        starts, _ = _deepspeed_reads(stage, key, value)
        view = read_deepspeed_zero(tmp_path, {"stage": stage, key: value})
        named = [e[0] for e in view.errors if e[0] == key]
        assert (not named) == starts, (key, value, view.errors)


@pytest.mark.parametrize("value", [v for v in BOOL_VALUES if v is not None])
def test_the_boolean_read_is_deepspeeds(value):
    starts, parsed = _deepspeed_reads(2, "contiguous_gradients", value)
    if not starts:
        with pytest.raises(ValueError):
            ds_config_bool(value)
    elif value == "auto":  # dropped: DeepSpeed's default (true)
        assert ds_config_bool(value) is None and parsed is True
    else:
        assert ds_config_bool(value) is parsed


@pytest.mark.parametrize("value", [v for v in INT_VALUES if v is not None])
def test_the_integer_read_is_deepspeeds(value):
    starts, parsed = _deepspeed_reads(2, "reduce_bucket_size", value)
    if value == "auto":  # dropped: DeepSpeed's default, 5e8
        assert ds_config_int(value) is None and parsed == 500_000_000
    elif starts:
        assert ds_config_int(value) == parsed
    else:  # refused: not an integer DeepSpeed reads, or one below reduce_bucket_size's bound (gt=0)
        try:
            read = ds_config_int(value)
        except ValueError:
            return
        assert read is not None and read < 1, value


@pytest.mark.parametrize(("zero", "knob", "want"), [
    ({"stage": 2, "overlap_comm": "yes"}, "dp_overlap_fraction", None),  # on, as DeepSpeed reads 'yes'
    ({"stage": 2, "overlap_comm": 0}, "dp_overlap_fraction", 0.0),  # off
    ({"stage": 2, "overlap_comm": "auto"}, "dp_overlap_fraction", 0.0),  # dropped: off at ZeRO-2
    ({"stage": 2, "overlap_comm": None}, "dp_overlap_fraction", 0.0),  # Optional: DeepSpeed's default
    ({"stage": 2, "overlap_comm": True, "contiguous_gradients": "false"}, "reduce_bucket_buffers", 1),
    ({"stage": 2, "overlap_comm": True, "contiguous_gradients": "auto"}, "reduce_bucket_buffers", None),
    ({"stage": 2, "overlap_comm": True, "reduce_bucket_size": "200000000"}, "reduce_bucket_elements", 2e8),
    # a config holding "auto" is read as the Hugging Face Trainer's, which fills this one with hidden_size^2
    ({"stage": 2, "overlap_comm": True, "reduce_bucket_size": "auto"}, "reduce_bucket_elements", "hidden_size^2"),
])
def test_what_deepspeed_accepts_moves_the_prediction_as_it_reads_it(tmp_path, zero, knob, want):
    """A value DeepSpeed takes is read as DeepSpeed reads it ("auto": its default), with no violation."""
    view = read_deepspeed_zero(tmp_path, zero)
    assert view.errors == []
    assert view.knobs.get(knob, (None,))[0] == want


def test_a_null_where_deepspeed_types_a_plain_bool_is_a_violation_naming_the_key(tmp_path):
    view = read_deepspeed_zero(tmp_path, {"stage": 2, "contiguous_gradients": None})
    assert [e[0] for e in view.errors] == ["contiguous_gradients"]
    assert "true or false" in view.errors[0][1]


STAGE_VALUES = [0, 1, 2, 3, "2", 2.0, True, "auto", 4, -1, 2.5, "two", None]


@pytest.mark.parametrize("value", STAGE_VALUES)
def test_the_zero_stage_is_deepspeeds(tmp_path, value):
    """zero_optimization.stage as DeepSpeed reads it ("2" is ZeRO-2, not ZeRO-0; "auto" is its default 0), and a
    violation exactly where DeepSpeed refuses to start."""
    config = pytest.importorskip("deepspeed.runtime.zero.config", reason="DeepSpeed not installed: `make test` "
                                                                        "installs it")
    try:
        want = int(config.DeepSpeedZeroConfig(stage=value).stage)
    except Exception:  # pydantic's ValidationError: DeepSpeed stops at start-up
        want = None
    view = read_deepspeed_zero(tmp_path, {"stage": value})
    named = [e for e in view.errors if e[0] == "zero_stage"]
    if want is None:
        assert named and view.fields["zero_stage"] == 0
    else:
        assert not named and view.fields["zero_stage"] == want


def test_a_string_stage_is_checked_at_that_stage_through_the_cli(tmp_path):
    """Bug: `"stage": "2"` (which DeepSpeed runs as ZeRO-2) was checked as ZeRO-0 and failed on memory."""
    import json
    import subprocess
    import sys

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
                                "bf16": {"enabled": "true"}, "zero_optimization": {"stage": "2"}}))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "check", str(path), "-c", "dgx-a100-80gb", "-m",
                          "llama2-7b", "-n", "1", "-s", "2048", "--json"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["layout"]["zero_stage"] == 2 and doc["passed"], doc["violations"]


PRECISION_DOCS = [
    {"bf16": {"enabled": True}}, {"bf16": {"enabled": "true"}}, {"bfloat16": {"enabled": 1}},
    {"fp16": {"enabled": "yes"}}, {"fp16": {"enabled": False}}, {"bf16": {}}, {"fp16": {"loss_scale": 0}},
    {"bf16": {"enabled": "maybe"}}, {"bf16": {"enabled": None}}, {"bf16": {"enabled": True}, "fp16": {"enabled": 1}},
]


@pytest.mark.parametrize("doc", PRECISION_DOCS)
def test_the_precision_is_deepspeeds(tmp_path, doc):
    """bf16 (or the older bfloat16) and fp16 `enabled` as DeepSpeed's precision configs read them; a violation exactly
    where DeepSpeed refuses to start, both enabled included."""
    precision = pytest.importorskip("deepspeed.runtime.precision_config", reason="DeepSpeed not installed: `make "
                                                                                "test` installs it")
    try:
        bf16 = precision.get_bfloat16_config(doc).enabled
        fp16 = precision.get_float16_config(doc).enabled
        starts = not (bf16 and fp16)
    except Exception:  # pydantic's ValidationError: DeepSpeed stops at start-up
        starts = False
    view = read_deepspeed_zero(tmp_path, {"stage": 1}, **{k: v for k, v in doc.items()}, **(
        {} if "bf16" in doc else {"bf16": None}))
    named = [e for e in view.errors if e[0] == "precision"]
    assert (not named) == starts, (doc, view.errors)
    if starts:
        assert view.precision == ("bf16" if bf16 else "fp16" if fp16 else "fp32")


@pytest.mark.parametrize("key", ["offload_optimizer", "offload_param"])
@pytest.mark.parametrize("device", ["cpu", "nvme", "none", "auto", "CPU", "gpu", None])
def test_the_offload_device_is_deepspeeds(tmp_path, key, device):
    """An offload section's `device` as DeepSpeed's OffloadDeviceEnum reads it ("auto": its default, none; 'CPU'
    refused), and a violation exactly where DeepSpeed refuses to start."""
    config = pytest.importorskip("deepspeed.runtime.zero.config", reason="DeepSpeed not installed: `make test` "
                                                                        "installs it")
    try:
        section = getattr(config.DeepSpeedZeroConfig(stage=3, **{key: {"device": device}}), key)
        want = section.device.value if hasattr(section.device, "value") else section.device
    except Exception:  # pydantic's ValidationError: DeepSpeed stops at start-up
        want = None
    view = read_deepspeed_zero(tmp_path, {"stage": 3, key: {"device": device}})
    named = [e for e in view.errors if e[0] == "offload"]
    assert (not named) == (want is not None), (device, view.errors)
    if want is not None:
        expected = "none" if want == "none" else "optimizer+params" if key == "offload_param" else "optimizer"
        assert view.fields["offload"] == expected


@pytest.mark.parametrize(("stage", "want"), [(3, "optimizer+params"), (2, "optimizer"), (1, "optimizer"), (0, "none")])
def test_an_offload_section_below_the_stage_that_reads_it_is_ignored_with_a_note(tmp_path, stage, want):
    """DeepSpeed's engine hands offload_param to the ZeRO-3 optimizer only and offload_optimizer to a ZeRO optimizer
    only (engine.py _configure_zero_optimizer: ZeRO-1/2 take offload_optimizer_config alone; ZeRO-0 builds none), so a
    config that sets them lower runs without them: no violation (it was 'offload needs zero_stage 3'), a note."""
    both = {"offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}
    view = read_deepspeed_zero(tmp_path, {"stage": stage, **both})
    assert view.errors == [] and view.fields["offload"] == want
    ignored = [n for n in view.notes if "so nothing is offloaded by it" in n]
    assert len(ignored) == (stage < 3) + (stage < 1)


def _check_report(path, *extra):
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "planner.cli", "check", str(path), "-c", "dgx-h100", "-n", "1", "-m",
                          "llama2-7b", "-s", "512", "--json", *extra], capture_output=True, text=True, check=False)
    return json.loads(out.stdout)


def test_bf16_master_weights_and_optimizer_states_shrink_the_sharded_states():
    """DeepSpeedExamples training/bf16_master_weight: bf16_full.json sets bf16.bf16_master_weights_and_grads and
    bf16_optimizer_states over baseline.json (both ZeRO-3). Its README's breakdown: master weights 4 -> 2 B/param,
    Adam moments 8 -> 4 (and the master gradients 4 -> 2, which the planner's memory recipe does not split out);
    DeepSpeed keeps them so (runtime/zero/stage3.py master_weights_and_grads_dtype, PR #7700). Derived: ZeRO-3 over
    dp 8 saves 6 B x 6.74e9 parameters (Llama 2 7B) / 8 per GPU; both were predicted alike before."""
    from pathlib import Path

    data = Path(__file__).parent / "data" / "configs" / "deepspeed"
    full, base = _check_report(data / "bf16_master_z3.json"), _check_report(data / "bf16_baseline_z3.json")
    assert full["error"] is None and base["error"] is None
    saved = base["predicted"]["peak_memory_bytes_per_gpu"] - full["predicted"]["peak_memory_bytes_per_gpu"]
    assert saved == pytest.approx(6 * 6.74e9 / 8, rel=0.02)
    assert any("bf16_master_weights_and_grads" in n and "bf16_optimizer_states" in n for n in full["notes"])
    assert full["predicted"]["step_time_seconds"] < base["predicted"]["step_time_seconds"]  # a smaller Adam step


@pytest.mark.parametrize("zero,bf16,rule_says", [
    ({"stage": 0}, {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}, "ZeRO stage 1, 2 or 3"),
    ({"stage": 3}, {"bf16_optimizer_states": True}, "requires bf16_master_weights_and_grads"),
    ({"stage": 2}, {"bf16_master_weights_and_grads": True}, "optimizer offload"),
    ({"stage": 2}, {"bf16_master_weights_and_grads": "maybe"}, "true or false"),
])
def test_bf16_state_settings_deepspeed_refuses_are_violations(tmp_path, zero, bf16, rule_says):
    """DeepSpeed's start-up refusals: runtime/config.py _do_error_check asserts both settings at ZeRO 1-3 and
    bf16_optimizer_states only with bf16_master_weights_and_grads (frameworks.md §3.7 rule 6); bf16 master weights
    with fp32 moments need ZeRO-Offload with DeepSpeedCPUAdam (stage_1_and_2.py _enforce_cpu_offload); the
    precision config's fields are pydantic bools."""
    view = read_deepspeed_zero(tmp_path, zero, bf16={"enabled": True, **bf16})
    said = [e[1] for e in view.errors if e[0] == "optimizer_states"]
    assert said and rule_says in said[0], view.errors
    assert view.optimizer_states == {}


def test_bf16_master_weights_with_offloaded_fp32_moments_is_read(tmp_path):
    """With offload_optimizer to cpu DeepSpeedCPUAdam keeps fp32 moments (fp32_optimizer_states defaults to True,
    engine.py) and the master weights are bf16: only master_dtype moves."""
    view = read_deepspeed_zero(tmp_path, {"stage": 2, "offload_optimizer": {"device": "cpu"}},
                               bf16={"enabled": True, "bf16_master_weights_and_grads": True})
    assert not view.errors and view.optimizer_states == {"master_dtype": "bf16"}
