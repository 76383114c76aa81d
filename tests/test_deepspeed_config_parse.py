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
    elif not starts and (not isinstance(value, int | float) or math.isfinite(value) and value > 0):
        with pytest.raises(ValueError):  # refused as an integer (0 and below DeepSpeed refuses by its gt=0)
            ds_config_int(value)
    elif starts:
        assert ds_config_int(value) == parsed


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
