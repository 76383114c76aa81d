"""Specs, presets, loaders and the one layout validator."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_specs import SpecError, cluster_names, gpu_names, load_cluster, load_gpu
from planner.inputs.models import hf_config_to_spec, load_model, model_names
from planner.inputs.specs import LayoutSpec, ModelSpec, TrainingSpec
from planner.rules import Violation, layout_violations

GIB = 2**30


def test_catalog_has_required_gpus():
    required = {"V100-SXM2-16GB", "V100-SXM2-32GB", "A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM", "H100-PCIe",
                "H200", "B200", "L40S", "RTX-4090", "A10"}
    assert required <= set(gpu_names())
    # dense peaks, not sparse (cost-models.md §0.4, §6.1)
    assert load_gpu("H100-SXM").tflops["bf16"] == 989.0
    assert load_gpu("A100-SXM4-80GB").tflops["bf16"] == 312.0
    assert load_gpu("B200").tflops["bf16"] == 2250.0
    assert "bf16" not in load_gpu("V100-SXM2-32GB").tflops
    for name in gpu_names():
        assert load_gpu(name).source


def test_cluster_presets():
    required = {"dgx-a100-80gb", "dgx-a100-40gb", "dgx-h100", "dgx-h200", "pcie-l40s-10gbe", "v100-10gbe",
                "single-a100-40gb", "single-rtx4090"}
    assert required <= set(cluster_names())
    c = load_cluster("dgx-a100-80gb", nodes=280)
    assert c.num_gpus == 2240
    hw = c.to_cost_model()
    assert hw.nic.bandwidth_bytes_per_second == pytest.approx(25e9 * 0.9)  # HDR 200 Gb/s = 25 GB/s, x0.9
    assert hw.intra_node.bandwidth_bytes_per_second == pytest.approx(230.1e9, rel=1e-3)  # ~230 GB/s busbw
    assert load_cluster("v100-10gbe", nodes=4).to_cost_model("fp16").nic.bandwidth_bytes_per_second == pytest.approx(1.0e9)


def test_unknown_preset_suggests_names():
    with pytest.raises(SpecError) as err:
        load_cluster("dgx-a100-80")
    assert "dgx-a100-80gb" in str(err.value)
    with pytest.raises(SpecError) as err:
        load_model("llama3-8")
    assert "llama3-8b" in str(err.value)


def test_precision_the_gpu_lacks_is_an_input_error():
    with pytest.raises(SpecError, match="--precision fp16"):
        load_cluster("v100-10gbe").to_cost_model("bf16")


def test_single_gpu_cluster_cannot_scale_without_network():
    with pytest.raises(SpecError) as err:
        load_cluster("single-a100-40gb", nodes=2)
    assert "inter_node" in str(err.value)


def test_all_model_presets_load_with_sources():
    for name in model_names():
        spec = load_model(name)
        assert spec.source and spec.parameter_counts()["total"] > 0


@pytest.mark.parametrize("name,billions", [("llama3-70b", 70.55), ("llama3-405b", 405.85), ("llama2-7b", 6.74),
                                           ("llama2-70b", 68.98), ("gpt-neox-20b", 20.55), ("bloom-176b", 176.25)])
def test_parameter_counts_known_models(name, billions):
    # published parameter counts (model cards and papers; BLOOM 176,247M per its model card)
    assert load_model(name).parameter_counts()["total"] / 1e9 == pytest.approx(billions, abs=0.01)


def test_hf_config(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_model(str(path))
    assert spec.parameter_counts()["total"] == load_model("llama3-8b").parameter_counts()["total"]
    # the name: a snapshot's folder for config.json, the file's stem otherwise, the config's own name first
    assert spec.name == tmp_path.name
    (tmp_path / "llama65b.json").write_text(json.dumps(cfg))
    assert load_model(str(tmp_path / "llama65b.json")).name == "llama65b"
    (tmp_path / "named.json").write_text(json.dumps({**cfg, "_name_or_path": "meta-llama/Meta-Llama-3-8B"}))
    assert load_model(str(tmp_path / "named.json")).name == "meta-llama/Meta-Llama-3-8B"
    gpt2 = hf_config_to_spec({"model_type": "gpt2", "n_embd": 1600, "n_layer": 48, "n_head": 25, "vocab_size": 50257,
                              "n_positions": 1024})
    assert ModelSpec.model_validate(gpt2).parameter_counts()["total"] == 1_557_611_200  # GPT-2 XL, 1.5B
    with pytest.raises(SpecError, match="model_type"):
        hf_config_to_spec({"model_type": "t5"})


def _gpt3():
    return load_model("gpt3-175b")


def test_layout_rules_report_every_problem():
    model = _gpt3()
    training = TrainingSpec(global_batch_size=1536, seq_length=2048)
    cluster = load_cluster("dgx-a100-80gb", nodes=128)
    ok = LayoutSpec(tp=8, pp=8, dp=16, micro_batch_size=1, num_micro_batches=96)
    assert layout_violations(ok, model, training, cluster) == []
    bad = LayoutSpec(tp=7, pp=200, dp=3, micro_batch_size=1, num_micro_batches=5, schedule="interleaved_1f1b",
                     sequence_parallel=True)
    problems = layout_violations(bad, model, training, cluster)
    text = "\n".join(str(p) for p in problems)
    for needle in ["dp*tp*pp", "num_attention_heads", "must divide gpus_per_node", "num_layers (96)", "global_batch_size",
                   "virtual_stages: 1", "multiple of pp", "seq_length"]:
        assert needle in text, needle
    # typed: each violation names its rule and field, the value as given and a fix (no string parsing needed)
    by_rule = {p.rule: p for p in problems}
    assert by_rule["gpus_match_cluster"] == Violation(
        "gpus_match_cluster", "dp*tp*pp", "3*7*200 = 4200", "must equal the cluster's 1024 GPUs (128 nodes x 8)",
        "choose degrees whose product is the number of GPUs")
    assert by_rule["tp_divides_heads"].field == "tp" and by_rule["tp_divides_heads"].value == "7"
    assert str(by_rule["batch_product"]) == ("global_batch_size: 1536 -> must equal micro_batch_size x "
                                             "num_micro_batches x dp = 1 x 5 x 3 = 15")
    assert all(p.fix and p.allowed for p in problems)


def test_gqa_rule():
    model = load_model("llama3-70b")  # 64 heads, 8 KV heads
    training = TrainingSpec(global_batch_size=16, seq_length=8192)
    for tp, ok in [(8, True), (16, True), (4, True), (32, True), (3, False)]:
        problems = layout_violations(LayoutSpec(tp=tp, dp=1, micro_batch_size=1, num_micro_batches=16), model, training)
        assert (not any(p.rule in ("tp_fits_kv_heads", "tp_divides_heads") for p in problems)) == ok, tp


# ---- property-based: loaders return a valid spec or raise SpecError, nothing else -------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)
MODEL_KEYS = ["num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size", "mlp",
              "vocab_size", "tied_embeddings", "norm", "attention", "model_type", "n_embd"]
CLUSTER_KEYS = ["gpu", "num_nodes", "gpus_per_node", "intra_node", "inter_node", "host_to_device", "host_memory_gib"]


def _mapping(keys):
    return st.dictionaries(st.sampled_from(keys + ["bogus"]), json_values | st.integers(1, 4096), max_size=len(keys))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(_mapping(MODEL_KEYS), json_values))
def test_model_loader_never_crashes(tmp_path, data):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(data, allow_nan=True))
    try:
        spec = load_model(str(path))
    except SpecError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
    else:
        assert isinstance(spec, ModelSpec)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(_mapping(CLUSTER_KEYS), json_values), raw=st.binary(max_size=40))
def test_cluster_loader_never_crashes(tmp_path, data, raw):
    path = tmp_path / "cluster.yaml"
    path.write_text(json.dumps(data, allow_nan=True))
    bad = tmp_path / "garbage.yaml"
    bad.write_bytes(raw)
    for p in (path, bad):
        try:
            load_cluster(str(p))
        except SpecError as exc:
            assert exc.problems


@pytest.mark.parametrize("name, value, allowed", [
    ("end_to_end_efficiency", 0.0, "a number > 0 and <= 1"), ("end_to_end_efficiency", 1.5, "a number > 0 and <= 1"),
    ("matmul_half_efficiency_gflop", -2.0, "a number from 0 to 1e6"),
    ("gemm_half_efficiency_dim", -5.0, "a number from 0 to 1e6"),
    ("dp_overlap_fraction", 3.0, "a number from 0 to 1"),
    ("tp_layer_overhead_seconds", -1e-3, "a number of seconds from 0 to 1000"),
    # past any meaning the cost models would overflow (a factor of 1e308 crashed plan --calibration)
    ("elementwise_traffic_factor", 5000.0, "a number from 0 to 1000"),
])
def test_a_calibration_file_knob_outside_its_meaning_is_refused(tmp_path, name, value, allowed):
    """A calibration file's knobs (`measured.knobs`, written by `planner calibrate` or edited by hand) are checked
    on load against the range their meaning allows (cluster_specs/schema.py CALIBRATION_KNOB_RANGES), naming the
    knob, the value and what is allowed. Before, end_to_end_efficiency 0 stopped `estimate` with an internal
    ZeroDivisionError, and a negative GEMM half-size or an overlap share of 3 were applied silently."""
    import subprocess
    import sys

    import yaml

    from planner import errors
    from planner.calibration import KNOB_NAMES
    from tests.conftest import ROOT

    spec = load_cluster("dgx-a100-80gb", nodes=1).model_dump(mode="json")
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump({**spec, "measured": {"knobs": {name: value}}}))
    with pytest.raises(SpecError, match=f"knobs.{name}: {value} -> {allowed}"):
        load_cluster(str(path))
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "estimate", "-c", str(path), "-m", "gpt3-1.3b",
                           "-b", "64", "-s", "2048", "-l", "tp=1,pp=1,dp=8,zero=1,mbs=1"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == errors.EXIT_INPUT and f"knobs.{name}" in proc.stderr and "Traceback" not in proc.stderr
    # the edges their meaning allows load, and so does a knob the table does not hold (ignored, as before)
    low = 1.0 if name == "end_to_end_efficiency" else 0.0
    path.write_text(yaml.safe_dump({**spec, "measured": {"knobs": {name: low, "some_future_knob": -1.0}}}))
    assert load_cluster(str(path)).measured.knobs[name] == low
    assert name in KNOB_NAMES


def test_a_switch_where_a_number_belongs_is_refused_not_coerced(tmp_path):
    """pydantic's lax mode would read `num_nodes: true` as 1 node and `tied_embeddings: 0` as untied
    (cluster_specs/base.py); each input spec refuses a value of the other kind, naming the field."""
    spec = load_cluster("dgx-a100-80gb").model_dump()
    for path, value, expected in (
        (("num_nodes",), True, "num_nodes: true -> must be a number, not true/false"),
        (("intra_node", "gb_per_s"), False, "intra_node.gb_per_s: false -> must be a number"),
    ):
        bad = json.loads(json.dumps(spec))
        target = bad
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        f = tmp_path / "c.json"
        f.write_text(json.dumps(bad))
        with pytest.raises(SpecError, match=expected.replace(".", r"\.")):
            load_cluster(str(f))
    base = load_model("llama3-8b").model_dump(exclude_none=True)
    with pytest.raises(Exception, match="tied_embeddings: 0 -> must be true or false"):
        ModelSpec.model_validate({**base, "tied_embeddings": 0})
    with pytest.raises(Exception, match="num_layers: true -> must be a number"):
        ModelSpec.model_validate({**base, "num_layers": True})
    with pytest.raises(Exception, match=r"tflops\.bf16: true -> must be a number"):
        type(load_gpu("H100-SXM")).model_validate({**load_gpu("H100-SXM").model_dump(), "tflops": {"bf16": True}})
    # numbers spelled as digits or whole floats still mean that number; a layout string is parsed to its types first
    assert ModelSpec.model_validate({**base, "num_layers": "32", "hidden_size": 4096.0}).num_layers == 32
    assert LayoutSpec.model_validate({"tp": 2, "dp": 4, "sequence_parallel": True}).sequence_parallel
