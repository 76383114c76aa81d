"""Numeric ranges on inputs: absurd numbers are refused at once, with the bound and its reason."""

import time

import pytest

from cluster_specs import SpecError, load_cluster
from cluster_specs.limits import MAX_GLOBAL_BATCH, MAX_GPUS, finite_option
from planner.inputs.layout_string import parse_layout_string
from planner.inputs.models import hf_config_to_spec
from planner.inputs.specs import ModelSpec, TrainingSpec


def test_huge_node_count_is_refused_fast_with_its_reason():
    t = time.perf_counter()
    with pytest.raises(SpecError, match="largest cluster announced"):
        load_cluster("dgx-a100-80gb", nodes=1_000_000_000)
    with pytest.raises(SpecError, match="num_nodes x gpus_per_node"):
        load_cluster("dgx-a100-80gb", nodes=MAX_GPUS // 4)  # within the node bound, over the GPU bound
    assert time.perf_counter() - t < 1.0


@pytest.mark.parametrize("field, value", [("global_batch_size", 99999999999999999999),
                                          ("global_batch_size", MAX_GLOBAL_BATCH + 1), ("seq_length", 2**40)])
def test_training_bounds(field, value):
    kw = {"global_batch_size": 8, "seq_length": 2048, field: value}
    with pytest.raises(ValueError, match="less than or equal"):
        TrainingSpec(**kw)


def test_nan_and_inf_are_not_numbers_here():
    for v in (float("nan"), float("inf"), -1.0):
        with pytest.raises(SpecError, match="finite number"):
            finite_option("--headroom-gib", v)
    with pytest.raises(SpecError, match="> 0"):
        finite_option("--solver-time-limit", 0.0, low_inclusive=False)
    assert finite_option("--headroom-gib", 0.0) == 0.0


def test_duplicate_layout_keys_are_refused():
    with pytest.raises(SpecError, match="given twice"):
        parse_layout_string("tp=8,tp=4")
    with pytest.raises(SpecError, match="given twice"):
        parse_layout_string("tp=8,tensor_parallel=8")  # an alias names the same field
    assert parse_layout_string("tp=8,pp=2") == {"tp": 8, "pp": 2}


def test_hf_zero_kv_heads_is_refused_not_read_as_all_heads():
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 100}
    assert ModelSpec.model_validate(hf_config_to_spec(cfg)).kv_heads == 4  # absent: MHA
    with pytest.raises(SpecError, match="num_key_value_heads: 0 -> must be an integer >= 1"):
        hf_config_to_spec({**cfg, "num_key_value_heads": 0})


def test_v100_defaults_to_fp16():
    assert load_cluster("v100-10gbe").gpu_spec().default_precision() == "fp16"
    assert load_cluster("dgx-h100").gpu_spec().default_precision() == "bf16"
