"""DeepSpeed's ZeRO-3 reduces gradients in buckets of reduce_bucket_size elements (default 5e8), one coalesced
reduce-scatter per bucket (stage3.py __reduce_and_partition_ipg_grads -> reduce_scatter_coalesced; cost_models/
data_parallel.py zero3_reduce_buckets): held to a replay of its bucket rule on a Llama 2 7B stage, to the alpha-beta
model's bytes (the bucket moves the latency, never the bandwidth term), to the profiles that state it, and to
`check`, which reads a config's reduce_bucket_size (the Hugging Face Trainer's "auto" is hidden_size^2)."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from cost_models.communication import group_link, reduce_scatter_seconds
from cost_models.data_parallel import zero3_reduce_buckets, zero_comm_seconds
from cost_models.inputs import REDUCE_BUCKET_ELEMENTS, Knobs, Zero3Gather
from cost_models.stage import layer_module_elements
from tests.conftest import gpt_shape

LLAMA_7B = gpt_shape(num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=32, ffn_hidden_size=11008,
                     vocab_size=32000, bias=False, rms_norm=True, swiglu=True)


def _replay(gradients, bucket):
    """DeepSpeed's reduce_independent_p_g_buckets_and_remove_grads, one gradient at a time in the order backward
    produces them: reduce the bucket first if it holds anything and this gradient would overflow it; then add it;
    the epilogue reduces what is left. Returns the bucket sizes reduced."""
    reduced, filled = [], 0
    for n in gradients:
        if filled > 0 and filled + n > bucket:
            reduced.append(filled)
            filled = 0
        filled += n
    return reduced + ([filled] if filled else [])


def test_bucket_rule_by_hand():
    """Modules of 1, 3 and 2 elements, two layers, a bucket of 4: backward produces 2, 3, 1, 2, 3, 1, reduced as
    [2], [3, 1], [2], [3, 1]: 4 reduce-scatters; a bucket of 0 reduces each gradient alone (6); one of 12 all at
    once; a head of 5, larger than the bucket, goes alone first."""
    assert zero3_reduce_buckets((1, 3, 2), layers=2, other_elements=0, bucket_elements=4) == 4
    assert zero3_reduce_buckets((1, 3, 2), layers=2, other_elements=0, bucket_elements=0) == 6
    assert zero3_reduce_buckets((1, 3, 2), layers=2, other_elements=0, bucket_elements=12) == 1
    assert zero3_reduce_buckets((1, 3, 2), layers=2, other_elements=5, bucket_elements=4) == 5
    assert zero3_reduce_buckets((1, 0, 2), layers=1, other_elements=0, bucket_elements=0) == 2  # no empty modules


def test_a_llama_7b_stage_reduces_in_14_to_17_buckets_at_the_default():
    """Llama 2 7B on one stage (TP 1): 32 layers of 202.4M elements (norm 4096, QKV 50.3M, projection 16.8M, norm,
    FC1 90.2M, FC2 45.1M) and 262.1M of embeddings, head and final norm: 6738M elements. A 5e8 bucket flushes with
    at least 5e8 - 90.2M in it (the largest gradient did not fit), so 6738/500 = 13.5 -> 14 to 6738/409.8 -> 17
    reduce-scatters; the replay of DeepSpeed's rule over the same gradients says which; per module (128) before."""
    modules = layer_module_elements(LLAMA_7B, layer_params=202_383_360, tp=1)
    assert modules == pytest.approx((4096, 3 * 4096**2, 4096**2, 4096, 2 * 4096 * 11008, 4096 * 11008))
    other = 2 * 32000 * 4096 + 4096
    count = zero3_reduce_buckets(modules, layers=32, other_elements=other, bucket_elements=REDUCE_BUCKET_ELEMENTS)
    replay = _replay([other] + list(reversed(modules)) * 32, REDUCE_BUCKET_ELEMENTS)
    assert count == len(replay)
    assert 14 <= count <= 17
    assert sum(replay) == other + 32 * sum(modules)
    assert max(replay) <= REDUCE_BUCKET_ELEMENTS


def _latency(link, ranks=512):
    """A ring reduce-scatter's fixed cost on `ranks`: RS(b) = latency + c b, so 2 RS(b) - RS(2b)."""
    one = reduce_scatter_seconds(message_bytes=1e6, group_size=ranks, link=link)
    return 2 * one - reduce_scatter_seconds(message_bytes=2e6, group_size=ranks, link=link)


def test_the_bucket_moves_latency_not_bytes():
    """One stage's ZeRO-3 traffic on 512 ranks with the gradients reduced in k buckets instead of 128 modules: the
    same bytes, so the difference is (128 - k) reduce-scatters' latency per micro-batch, nothing else."""
    from cluster_specs import load_cluster

    link = group_link(load_cluster("dgx-a100-80gb", nodes=64).to_cost_model("bf16"), group_size=512, stride=1).link
    args = dict(zero_stage=3, params=6.738e9, grad_reduce_bytes=2, param_bytes=2, dp=512, layers=32,
                num_micro_batches=2, link=link, modules_per_layer=4)
    per_module = zero_comm_seconds(**args)
    bucketed = zero_comm_seconds(**args, reduce_scatters=14)
    latency = _latency(link)
    assert latency > 0
    assert per_module - bucketed == pytest.approx(2 * (128 - 14) * latency, rel=1e-9)


def _problem(framework, nodes=64, model="llama2-7b", batch=1024):
    from planner.estimate import build_problem

    return build_problem("dgx-a100-80gb", nodes, model, batch, 4096, "bf16", framework=framework)


def test_deepspeeds_profile_reduces_in_its_default_bucket_and_the_others_do_not():
    """The DeepSpeed profile states the 5e8 bucket; Megatron-DeepSpeed's (DeepSpeed of 2021-2022) and the FSDP
    frameworks state none. Under FSDP (a block a unit) a bucket changes nothing; under DeepSpeed's ZeRO-3 of 2021
    (a reduce-scatter per tensor) neither."""
    from planner.estimate import layout_from_arg
    from planner.problem import Problem

    assert _problem("deepspeed").knobs.zero3_reduce_bucket_elements == REDUCE_BUCKET_ELEMENTS
    for framework in ("megatron-deepspeed", "torchtitan", "megatron", "generic"):
        assert _problem(framework).knobs.zero3_reduce_bucket_elements is None, framework
    text = "tp=1,pp=1,dp=512,zero=3,mbs=1,recompute=full"
    for framework, gather in (("torchtitan", None), ("deepspeed", Zero3Gather.PARAMETER)):
        p = _problem(framework)
        knobs = p.knobs if gather is None else replace(p.knobs, zero3_gather=gather)
        times = [Problem(p.model, p.training, p.cluster, replace(knobs, zero3_reduce_bucket_elements=b))
                 .estimate(layout_from_arg(text, p)).time.dp_comm_total_seconds for b in (None, 5e8)]
        assert times[0] == times[1], framework


def test_a_deepspeed_zero3_step_at_scale_pays_fewer_reduce_scatter_latencies():
    """Llama 2 7B on 512 A100s, DeepSpeed ZeRO-3, two micro-batches: 5e8 buckets reduce in 14-17 collectives a
    micro-batch where a reduce-scatter per Linear paid 128 ring latencies; the step's DP traffic is lower by
    2 x (128 - k) of them, the rest unchanged."""
    from planner.estimate import layout_from_arg
    from planner.problem import Problem

    p = _problem("deepspeed")
    layout = layout_from_arg("tp=1,pp=1,dp=512,zero=3,mbs=1,recompute=full", p)
    per_module, bucketed = (Problem(p.model, p.training, p.cluster, replace(p.knobs, zero3_reduce_bucket_elements=b))
                            .estimate(layout).time.dp_comm_total_seconds for b in (None, 5e8))
    from cost_models.communication import group_link as gl

    hw = p.cluster.to_cost_model(p.training.precision)
    latency = _latency(gl(hw, group_size=512, stride=1).link)
    saved = (per_module - bucketed) / (2 * latency)
    assert 128 - 17 <= round(saved) <= 128 - 14
    assert math.isclose(saved, round(saved), rel_tol=1e-6)


@pytest.mark.parametrize("zero, hf, knob, rules", [
    ({"stage": 3, "reduce_bucket_size": 1e6}, False, 1e6, []),
    ({"stage": 3, "reduce_bucket_size": 5e8}, False, None, []),  # DeepSpeed's default: nothing moves
    ({"stage": 2, "reduce_bucket_size": 1e6}, False, None, []),  # read at ZeRO-3 only
    ({"stage": 3, "reduce_bucket_size": "auto"}, True, "hidden_size^2", []),
    ({"stage": 3, "reduce_bucket_size": "5e8"}, False, None, ["reduce_bucket_size"]),
    ({"stage": 3, "reduce_bucket_size": -1}, False, None, ["reduce_bucket_size"]),
    ({"stage": 3, "reduce_bucket_size": float("inf")}, False, None, ["reduce_bucket_size"]),
    ({"stage": 3, "reduce_bucket_size": 0}, False, None, ["reduce_bucket_size"]),  # DeepSpeed: Field(gt=0)
    # DeepSpeed's config reads what pydantic's lax int does: True is 1, "300000000" a number
    ({"stage": 3, "reduce_bucket_size": True}, False, 1.0, []),
    ({"stage": 3, "reduce_bucket_size": "300000000"}, False, 3e8, []),
])
def test_check_reads_a_deepspeed_configs_reduce_bucket(tmp_path, zero, hf, knob, rules):
    from tests.conftest import read_deepspeed_zero

    view = read_deepspeed_zero(tmp_path, zero, **({"gradient_clipping": "auto"} if hf else {}))
    assert view.knobs.get("zero3_reduce_bucket_elements", (None,))[0] == knob
    assert [r for r, _, _ in view.errors] == rules


def test_check_predicts_the_configs_reduce_bucket(tmp_path):
    """Llama 2 7B on 64 A100 nodes under DeepSpeed ZeRO-3: a 1e6-element bucket reduces every gradient alone, and so
    does the Trainer's "auto" (4096^2 = 16.8M: the projection's gradient is exactly that, so the norm before it goes
    alone too), 6 a layer: slower than the default 5e8; a note names the setting."""
    from planner.integrations.check import check
    from planner.integrations.readers import read_config

    problem = _problem("deepspeed")
    steps = {}
    for size in (1e6, None, "auto"):
        zero = {"stage": 3, "overlap_comm": True} | ({} if size is None else {"reduce_bucket_size": size})
        doc = {"train_batch_size": 1024, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
               "zero_optimization": zero} | ({"gradient_clipping": "auto"} if size == "auto" else {})
        path = Path(tmp_path) / f"ds{size}.json"
        path.write_text(json.dumps(doc))
        out = check(read_config(path, gpus=512), problem, overrides={"recompute": "full"})
        steps[size] = out.estimate.time.dp_comm_total_seconds
        if size is not None:
            assert any("reduce_bucket_size" in n and "(predicted so)" in n for n in out.notes), out.notes
    assert steps[1e6] == steps["auto"] > steps[None]
    assert Knobs().zero3_reduce_bucket_elements is None


def test_a_deepspeed_zero3_plan_names_its_reduce_bucket_among_its_assumptions():
    """The bucket is one of the DeepSpeed profile's named assumptions: on 512 A100s it is among the three that move
    a Llama 2 7B ZeRO-3 step most, with the step at a reduce-scatter per gradient (bucket 0) slower; a torchtitan
    (FSDP) plan never names it."""
    from tests.test_profiles import _named_assumptions

    args = ("dgx-a100-80gb", 64, "llama2-7b", 1024, 4096)
    layout = "tp=1,pp=1,dp=512,zero=3,mbs=1,recompute=full"
    est, found = _named_assumptions(*args, "deepspeed", layout, "reduces gradients in buckets")
    assert len(found) == 1 and "reduce_bucket_size" in found[0]["source"]
    assert found[0]["step_time_seconds_if_not"] > est.step_seconds
    assert _named_assumptions(*args, "torchtitan", layout, "reduces gradients in buckets")[1] == []


def test_deepspeed_zero3_holds_one_16_bit_bucket_of_gradients():
    """DeepSpeed's ZeRO-3 keeps one flat buffer of reduce_bucket_size 16-bit gradients (stage3.py
    __ipg_bucket_flat_buffer): 1e9 bytes at the default 5e8 elements, where ZeRO-1/2 keep the recipe's two (2e9, the
    double buffer overlap_comm swaps); a bucket of h^2 (the Trainer's "auto") holds 2 h^2 bytes. FSDP and the 2021
    mode keep the recipe's figure."""
    from cost_models.stage import bucket_bytes

    knobs = _problem("deepspeed").knobs
    assert bucket_bytes(knobs, zero_stage=3) == 1e9
    assert bucket_bytes(knobs, zero_stage=2) == bucket_bytes(knobs, zero_stage=1) == 2e9
    assert bucket_bytes(replace(knobs, zero3_reduce_bucket_elements=4096.0**2), zero_stage=3) == 2 * 4096**2
    assert bucket_bytes(replace(knobs, zero3_gather=Zero3Gather.PARAMETER), zero_stage=3) == 2e9
    fsdp = _problem("torchtitan").knobs
    assert bucket_bytes(fsdp, zero_stage=3) == fsdp.bucket_bytes


def test_check_predicts_the_memory_of_a_configs_reduce_bucket(tmp_path):
    """The bucket `check` reads moves the memory too: a 1e6-element bucket holds 2 MB where the default holds 1 GB,
    and the predicted peak is lower by the difference."""
    from planner.integrations.check import check
    from planner.integrations.readers import read_config

    problem = _problem("deepspeed")
    peaks = {}
    for size in (None, 1e6):
        zero = {"stage": 3, "overlap_comm": True} | ({} if size is None else {"reduce_bucket_size": size})
        path = Path(tmp_path) / f"ds{size}.json"
        path.write_text(json.dumps({"train_batch_size": 1024, "train_micro_batch_size_per_gpu": 1,
                                    "bf16": {"enabled": True}, "zero_optimization": zero}))
        est = check(read_config(path, gpus=512), problem, overrides={"recompute": "full"}).estimate
        peaks[size] = est.stages[est.peak_stage].transient_bytes
    assert peaks[None] - peaks[1e6] == pytest.approx(1e9 - 2e6, rel=1e-9)
