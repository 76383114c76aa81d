"""How DeepSpeed's optimizers move gradients and parameters over DP, as its code does and the memory recipes in
planner/frameworks/profiles.py already say: ZeRO-1/2 all-reduce each gradient bucket whole and every rank keeps its
partition (today: average_tensor -> allreduce_and_scatter with use_multi_rank_bucket_allreduce on; Megatron-DeepSpeed's
ZeRO-1 of 2022: buffered_reduce_fallback -> allreduce_bucket), not a reduce-scatter; BF16_Optimizer, which shards its
fp32 states at ZeRO-0, all-gathers the updated bf16 parameters after its step (update_lp_params ->
all_gather_dp_groups). Held to the ring identities (an all-reduce is a reduce-scatter plus an all-gather of the same
bytes) and, in a step, to the difference those collectives make."""

from dataclasses import replace

import pytest

from cost_models.communication import (
    all_gather_seconds,
    all_reduce_seconds,
    group_link,
    reduce_scatter_seconds,
    reduce_seconds,
    slice_reduces_seconds,
)
from cost_models.data_parallel import zero_comm_seconds
from cost_models.inputs import GradReduce


def _link(nodes=8, ranks=64, stride=1):
    from cluster_specs import load_cluster

    hw = load_cluster("dgx-a100-80gb", nodes=nodes).to_cost_model("bf16")
    return group_link(hw, group_size=ranks, stride=stride).link


@pytest.mark.parametrize("stage, m", [(1, 4), (2, 4)])
def test_an_all_reduced_gradient_costs_one_all_gather_more_per_reduce(stage, m):
    """Ring all-reduce = reduce-scatter + all-gather of the same bytes (communication.py): all-reducing the gradients
    at ZeRO-1 (once a step) or ZeRO-2 (every micro-batch) costs that many all-gathers of the gradient bytes more; the
    parameter all-gather after the step is the same."""
    link = _link()
    args = dict(zero_stage=stage, params=1e9, grad_reduce_bytes=2, param_bytes=2, dp=64, layers=32,
                num_micro_batches=m, link=link)
    grads = 1e9 * 2
    one = all_reduce_seconds(message_bytes=grads, group_size=64, link=link)
    assert one == pytest.approx(reduce_scatter_seconds(message_bytes=grads, group_size=64, link=link)
                                + all_gather_seconds(message_bytes=grads, group_size=64, link=link), rel=1e-12)
    reduces = m if stage == 2 else 1
    extra = zero_comm_seconds(**args, grad_reduce=GradReduce.ALL_REDUCE) - zero_comm_seconds(**args)
    assert extra == pytest.approx(reduces * all_gather_seconds(message_bytes=grads, group_size=64, link=link),
                                  rel=1e-9)


def test_a_sharded_zero0_optimizer_gathers_the_parameters_after_its_step():
    """ZeRO-0: one all-reduce of the gradients; an optimizer that shards its states there (BF16_Optimizer) adds one
    all-gather of the 16-bit parameters; ZeRO-1 and up ignore the flag."""
    link = _link()
    args = dict(params=1e9, grad_reduce_bytes=2, param_bytes=2, dp=64, layers=32, num_micro_batches=4, link=link)
    plain = zero_comm_seconds(zero_stage=0, **args)
    assert plain == pytest.approx(all_reduce_seconds(message_bytes=2e9, group_size=64, link=link), rel=1e-12)
    gathered = zero_comm_seconds(zero_stage=0, zero0_gather=True, **args)
    assert gathered - plain == pytest.approx(all_gather_seconds(message_bytes=2e9, group_size=64, link=link),
                                             rel=1e-9)
    assert zero_comm_seconds(zero_stage=1, zero0_gather=True, **args) == zero_comm_seconds(zero_stage=1, **args)


def test_which_profiles_all_reduce_at_which_stages():
    """DeepSpeed today all-reduces at ZeRO-1 and 2; Megatron-DeepSpeed (2021-2022) at ZeRO-1 only (its ZeRO-2 reduced
    each rank's slice with dist.reduce: a reduce-scatter's bytes); Megatron and torch FSDP reduce-scatter."""
    from planner.frameworks.profiles import profile_knobs

    want = {"deepspeed": (1, 2), "megatron-deepspeed": (1,), "megatron": (), "nemo": (), "torchtitan": (),
            "generic": ()}
    for framework, stages in want.items():
        assert profile_knobs(framework).grad_all_reduce_zero_stages == stages, framework


def _dp_total(problem, layout_text, **knobs):
    from planner.estimate import layout_from_arg
    from planner.problem import Problem

    p = Problem(problem.model, problem.training, problem.cluster, replace(problem.knobs, **knobs))
    return p.estimate(layout_from_arg(layout_text, p)).time.dp_comm_total_seconds


def test_a_deepspeed_zero2_step_all_reduces_every_micro_batch():
    """Llama 2 7B on 8 A100 nodes under DeepSpeed ZeRO-2, four micro-batches: the step's DP traffic is four
    all-gathers of the stage's bf16 gradients (16-bit reduce: DeepSpeed's communication_data_type) more than with
    reduce-scatters, over the DP group's link."""
    from planner.estimate import build_problem, layout_from_arg

    problem = build_problem("dgx-a100-80gb", 8, "llama2-7b", 256, 4096, "bf16", framework="deepspeed")
    text = "tp=1,pp=1,dp=64,zero=2,mbs=1,recompute=full"
    assert problem.cm_training.grad_reduce_bytes == 2
    extra = _dp_total(problem, text) - _dp_total(problem, text, grad_all_reduce_zero_stages=())
    stage_params = problem.estimate(layout_from_arg(text, problem)).stages[0].params
    link = group_link(problem.cluster.to_cost_model("bf16"), group_size=64, stride=1).link
    assert extra == pytest.approx(4 * all_gather_seconds(message_bytes=stage_params * 2, group_size=64, link=link),
                                  rel=1e-6)


def test_bf16_optimizer_at_zero0_gathers_its_parameters_and_fp16_optimizer_does_not():
    """Megatron-DeepSpeed at ZeRO-0: in bf16 its BF16_Optimizer shards the fp32 states and all-gathers the bf16
    parameters after the step; in fp16 FP16_Optimizer keeps everything and gathers nothing."""
    from planner.estimate import build_problem

    text = "tp=8,pp=4,dp=8,zero=0,mbs=1,recompute=full"
    bf16 = build_problem("dgx-a100-80gb", 32, "llama2-70b", 256, 4096, "bf16", framework="megatron-deepspeed")
    fp16 = build_problem("dgx-a100-80gb", 32, "llama2-70b", 256, 4096, "fp16", framework="megatron-deepspeed")
    assert bf16.cm_training.zero0_optimizer.sharded and not fp16.cm_training.zero0_optimizer.sharded
    sharded = _dp_total(bf16, text)
    unsharded = _dp_total(bf16, text, zero0_optimizer=replace(bf16.knobs.zero0_optimizer, sharded=False))
    assert sharded > unsharded
    # fp16: no gather; and the bf16 and fp16 gradient all-reduces move the same 2 B per gradient
    assert _dp_total(fp16, text) == pytest.approx(unsharded, rel=1e-9)


@pytest.mark.parametrize("zero, knob, rules", [
    ({"stage": 2, "use_multi_rank_bucket_allreduce": False}, (), []),
    ({"stage": 1, "use_multi_rank_bucket_allreduce": False, "reduce_scatter": True}, (), []),
    ({"stage": 2, "use_multi_rank_bucket_allreduce": True}, None, []),  # DeepSpeed's default: nothing moves
    ({"stage": 2, "use_multi_rank_bucket_allreduce": False, "reduce_scatter": False}, None, []),  # all-reduce anyway
    ({"stage": 3, "use_multi_rank_bucket_allreduce": False}, None, []),  # ZeRO-3 reduce-scatters regardless
    # read as DeepSpeed's config reads them (lax booleans, tests/test_deepspeed_config_parse.py): 'no' and 0 are false
    ({"stage": 2, "use_multi_rank_bucket_allreduce": "no"}, (), []),
    ({"stage": 1, "reduce_scatter": 0, "use_multi_rank_bucket_allreduce": False}, None, []),
    ({"stage": 2, "use_multi_rank_bucket_allreduce": "maybe"}, None, ["use_multi_rank_bucket_allreduce"]),
    ({"stage": 1, "reduce_scatter": 2}, None, ["reduce_scatter"]),
])
def test_check_reads_how_a_deepspeed_config_reduces(tmp_path, zero, knob, rules):
    from tests.conftest import read_deepspeed_zero

    view = read_deepspeed_zero(tmp_path, zero)
    assert view.knobs.get("grad_all_reduce_zero_stages", (None,))[0] == knob
    assert [r for r, _, _ in view.errors] == rules


def test_check_predicts_a_configs_slice_reduces(tmp_path):
    """Llama 2 7B on 8 A100 nodes, DeepSpeed ZeRO-2: with use_multi_rank_bucket_allreduce off each micro-batch's
    gradients go in 64 slice reduces (one per rank, a dist.reduce each) where DeepSpeed's default all-reduces them;
    the step's DP traffic differs by 4 x (all-reduce - slice reduces) of the gradient bytes; a note names the
    setting."""
    import json
    from pathlib import Path

    from planner.estimate import build_problem
    from planner.integrations.check import check
    from planner.integrations.readers import read_config

    problem = build_problem("dgx-a100-80gb", 8, "llama2-7b", 256, 4096, "bf16", framework="deepspeed")
    out = {}
    for multi in (True, False):
        path = Path(tmp_path) / f"ds{multi}.json"
        path.write_text(json.dumps({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 1,
                                    "gradient_accumulation_steps": 4, "bf16": {"enabled": True},
                                    "zero_optimization": {"stage": 2, "use_multi_rank_bucket_allreduce": multi}}))
        out[multi] = check(read_config(path, gpus=64), problem, overrides={"recompute": "full"})
    assert any("use_multi_rank_bucket_allreduce false" in n for n in out[False].notes)
    assert not any("use_multi_rank_bucket_allreduce" in n for n in out[True].notes)
    link = group_link(problem.cluster.to_cost_model("bf16"), group_size=64, stride=1).link
    grads = out[True].estimate.stages[0].params * 2
    less = out[True].estimate.time.dp_comm_total_seconds - out[False].estimate.time.dp_comm_total_seconds
    assert less == pytest.approx(4 * (all_reduce_seconds(message_bytes=grads, group_size=64, link=link)
                                      - slice_reduces_seconds(message_bytes=grads, group_size=64, link=link)), rel=1e-6)


def test_a_deepspeed_zero2_plan_names_its_all_reduce_among_its_assumptions():
    """The all-reduce is one of the DeepSpeed profile's named assumptions: a Llama 2 7B ZeRO-2 step on 64 A100s names
    it with the faster step of reduce-scatters (an older DeepSpeed, or use_multi_rank_bucket_allreduce off);
    at ZeRO-3, which reduce-scatters anyway, and under Megatron it is not named."""
    from tests.test_profiles import _named_assumptions

    args = ("dgx-a100-80gb", 8, "llama2-7b", 256, 4096)
    zero2 = "tp=1,pp=1,dp=64,zero=2,mbs=1,recompute=full"
    est, found = _named_assumptions(*args, "deepspeed", zero2, "all-reduce each gradient bucket")
    assert len(found) == 1 and "use_multi_rank_bucket_allreduce" in found[0]["source"]
    assert found[0]["statement"].startswith("ZeRO-1/2 all-reduce")
    assert found[0]["step_time_seconds_if_not"] < est.step_seconds
    assert _named_assumptions(*args, "deepspeed", zero2.replace("zero=2", "zero=3"),
                              "all-reduce each gradient bucket")[1] == []
    assert _named_assumptions(*args, "megatron", zero2.replace("zero=2", "zero=1"),
                              "all-reduce each gradient bucket")[1] == []


def test_check_reads_a_deepspeed_configs_communication_data_type(tmp_path):
    """DeepSpeed's top-level communication_data_type sets the dtype gradients are reduced in: fp32 on a bf16 model
    moves twice the bytes of the default (the model's bf16), so `check` predicts a slower step and says why; bf16
    is the default and moves nothing; a value DeepSpeed refuses ('fp8') is a violation that names the key."""
    import json
    from pathlib import Path

    from tests.test_real_configs import run

    steps = {}
    for dtype in (None, "bf16", "fp32", "fp8"):
        doc = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
               "bf16": {"enabled": True}, "zero_optimization": {"stage": 1, "overlap_comm": True}}
        if dtype:
            doc["communication_data_type"] = dtype
        path = Path(tmp_path) / f"ds{dtype}.json"
        path.write_text(json.dumps(doc))
        proc = run("check", str(path), "-c", "dgx-a100-80gb", "-n", "8", "-m", "llama2-7b", "-s", "4096", "--fix",
                   "recompute=full", "--json")
        report = json.loads(proc.stdout)
        if dtype == "fp8":
            assert proc.returncode == 1
            assert [v["rule"] for v in report["violations"]] == ["communication_data_type"]
            continue
        assert proc.returncode == 0, proc.stdout + proc.stderr
        steps[dtype] = report["predicted"]["step_time_seconds"]
        if dtype:
            assert f"communication_data_type {dtype}: gradients reduced in {dtype} (predicted so)" in report["notes"]
    assert steps["bf16"] == pytest.approx(steps[None], rel=1e-12)
    assert steps["fp32"] > steps[None]


def test_slice_reduces_by_hand():
    """n reduces of S/n, each (n-1) latency steps and its bytes at the bus bandwidth (nccl-tests: Reduce's factor is
    1): 4 ranks, 10 us, 100 GB/s, 4 GB -> 4 x (3 x 10 us + 1 GB / 100 GB/s) = 40.12 ms; a reduce-scatter of the same
    4 GB is 3 x 10 us + 3 GB / 100 GB/s = 30.03 ms: the slices move S/n more and pay n times the latency."""
    from cost_models.inputs import Link

    link = Link(bandwidth_bytes_per_second=100e9, latency_seconds=10e-6)
    assert reduce_seconds(message_bytes=1e9, group_size=4, link=link) == pytest.approx(3e-5 + 0.01, rel=1e-12)
    assert slice_reduces_seconds(message_bytes=4e9, group_size=4, link=link) == pytest.approx(0.04012, rel=1e-12)
    assert reduce_scatter_seconds(message_bytes=4e9, group_size=4, link=link) == pytest.approx(0.03003, rel=1e-12)
    assert slice_reduces_seconds(message_bytes=4e9, group_size=1, link=link) == 0.0


def test_slice_reduces_cost_a_reduce_scatter_plus_latency_that_grows_with_dp():
    """Against the ring reduce-scatter of the same gradients at ZeRO-2 (4 micro-batches, 1e9 parameters in 16 bits):
    the slices add per micro-batch S/n of bandwidth and (n-1)^2 latency steps, so the gap grows with the DP degree
    (64 -> 512 ranks on 8 -> 64 nodes) faster than linearly."""
    gaps = []
    for nodes in (8, 64):
        ranks = nodes * 8
        link = _link(nodes=nodes, ranks=ranks)
        args = dict(zero_stage=2, params=1e9, grad_reduce_bytes=2, param_bytes=2, dp=ranks, layers=32,
                    num_micro_batches=4, link=link)
        gap = zero_comm_seconds(**args, grad_reduce=GradReduce.SLICE_REDUCES) - zero_comm_seconds(**args)
        want = 4 * ((ranks - 1) ** 2 * link.latency_seconds + 2e9 / ranks / link.bandwidth_bytes_per_second)
        assert gap == pytest.approx(want, rel=1e-9)
        gaps.append(gap)
    assert gaps[1] > 8 * gaps[0]


def test_megatron_deepspeeds_zero2_reduces_slices_and_its_zero1_all_reduces():
    """Megatron-DeepSpeed's DeepSpeed of 2022: ZeRO-2 reduced each rank's slice with a dist.reduce of its own
    (average_tensor @8eef742), ZeRO-1 all-reduced buckets; the DeepSpeed profile of today all-reduces both by default.
    The profile states each, and the assumption list names the slices."""
    from planner.frameworks.profiles import profile_for

    mds, ds = profile_for("megatron-deepspeed"), profile_for("deepspeed")
    assert (mds.knobs().grad_slice_reduce_zero_stages, mds.knobs().grad_all_reduce_zero_stages) == ((2,), (1,))
    assert (ds.knobs().grad_slice_reduce_zero_stages, ds.knobs().grad_all_reduce_zero_stages) == ((), (1, 2))
    assert any(k == "grad_slice_reduce_zero_stages" and "average_tensor" in src for k, _, src in mds.assumptions())
