"""DeepSpeed's ZeRO-3 under full recompute gathers a module a third time when its backward lies further than
stage3_max_reuse_distance elements from its recompute (cost_models/data_parallel.py zero3_regathered_modules):
held to a replay of DeepSpeed's step trace and release rule, to hand figures for GPT-3 175B and a 7B layer, and in
the step's data-parallel traffic and memory (torch FSDP, a block a unit, never re-gathers)."""

from dataclasses import replace

import pytest

from cost_models.communication import all_gather_seconds, group_link
from cost_models.data_parallel import zero3_regathered_modules, zero_comm_seconds
from cost_models.inputs import ZERO3_MAX_REUSE_DISTANCE_ELEMENTS, Knobs, Layout, Training, Zero3Gather
from cost_models.stage import fsdp_head_unit_params, layer_module_elements, stage_model
from cost_models.step import dp_comm_seconds, zero3_recompute_regathers, zero3_units_per_layer
from tests.conftest import gpt_shape

BF16 = Training(global_batch_size=512, seq_length=2048, activation_bytes=2, param_bytes=2, grad_bytes=4,
                optimizer_bytes=12, grad_reduce_bytes=4)
GPT3_175B = gpt_shape(num_layers=96, hidden_size=12288, num_attention_heads=96, num_kv_heads=96,
                      ffn_hidden_size=49152, vocab_size=51200)
LLAMA_7B = gpt_shape(num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=32, ffn_hidden_size=11008,
                     vocab_size=32000, bias=False, rms_norm=True, swiglu=True)


def _hw():
    from cluster_specs import load_cluster

    return load_cluster("dgx-a100-80gb", nodes=16).to_cost_model("bf16")


def _replay_gathers(module_elements, layers, max_reuse):
    """All-gathers per module of a middle layer in one step, replaying DeepSpeed's parameter coordinator: the trace of
    a step (every layer's forward; then per layer, last first, its recompute's forward and its backward in reverse),
    a gather at every use of a module not gathered, and after each use the release rule of __params_to_release:
    walk the trace onward, adding each use's elements; keep the module if it recurs before max_reuse is reached."""
    n = len(module_elements)
    trace = [(li, j) for li in range(layers) for j in range(n)]
    for li in reversed(range(layers)):
        trace += [(li, j) for j in range(n)] + [(li, j) for j in reversed(range(n))]
    gathered, counts = set(), {}
    for i, use in enumerate(trace):
        if use not in gathered:
            counts[use] = counts.get(use, 0) + 1
            gathered.add(use)
        traversed, keep = 0.0, False
        for later in trace[i + 1:]:
            if traversed >= max_reuse:
                break
            if later == use:
                keep = True
                break
            traversed += module_elements[later[1]]
        if not keep:
            gathered.discard(use)
    return [counts[(layers // 2, j)] for j in range(n)]


@pytest.mark.parametrize("model", [GPT3_175B, LLAMA_7B], ids=["gpt3-175b", "llama-7b"])
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_the_rule_is_what_a_replay_of_deepspeeds_trace_gathers(model, tp):
    mods = layer_module_elements(model, layer_params=_layer_params(model, tp), tp=tp)
    again = zero3_regathered_modules(mods)
    # a layer in the middle of 64: far enough from the last that its forward's gathers are released (DeepSpeed keeps
    # the last few layers' from their forward to their recompute, which the model does not count)
    assert _replay_gathers(mods, 64, ZERO3_MAX_REUSE_DISTANCE_ELEMENTS) == [3 if a else 2 for a in again]


def _layer_params(model, tp):
    sm = stage_model(model, BF16, _hw(), Layout(dp=1, tp=tp, pp=1, num_micro_batches=1), Knobs())
    return sm.lc.layer_params


def test_hand_figures_gpt3_175b_and_a_7b_layer():
    """GPT-3 175B, TP 1 (h = 12288): FC2's backward follows its recompute at once (kept); FC1 is 2 x 4h^2 = 1.21e9
    elements from its own, past 1e9, and so is everything before it: 8h^2 of the 12h^2 Linear elements (and both
    LayerNorms) gathered again. At TP 8 the distances are an eighth: nothing. A 7B Llama layer (2.0e8 elements):
    nothing. The limit is reached at equality (DeepSpeed breaks its walk at traversed >= max)."""
    h = 12288
    mods = layer_module_elements(GPT3_175B, layer_params=_layer_params(GPT3_175B, 1), tp=1)
    assert mods[1] == pytest.approx(3 * h * h + 3 * h, rel=1e-12) and mods[4] == pytest.approx(4 * h * h, rel=1e-4)
    assert zero3_regathered_modules(mods) == (True, True, True, True, True, False)
    assert not any(zero3_regathered_modules(layer_module_elements(
        GPT3_175B, layer_params=_layer_params(GPT3_175B, 8), tp=8)))
    assert not any(zero3_regathered_modules(layer_module_elements(
        LLAMA_7B, layer_params=_layer_params(LLAMA_7B, 1), tp=1)))
    assert zero3_regathered_modules((1.0, 3.0, 1.0, 4.0), max_reuse_distance=10) == (True, True, False, False)
    assert zero3_regathered_modules((1.0, 3.0, 1.0, 4.5), max_reuse_distance=10) == (True, True, False, False)
    assert zero3_regathered_modules((1.0, 3.0, 0.5, 4.0), max_reuse_distance=10) == (True, False, False, False)


@pytest.mark.parametrize("gather", [Zero3Gather.MODULE, Zero3Gather.PARAMETER])
def test_deepspeed_full_recompute_pays_the_third_gather_and_fsdp_does_not(gather):
    """One stage of GPT-3 175B at ZeRO-3, TP 1: under full recompute DeepSpeed's traffic is zero_comm_seconds plus,
    per micro-batch, the re-gathered modules' elements in their own all-gathers (a Linear each; under
    Zero3Gather.PARAMETER each tensor gathered, here the weights alone); under selective recompute, none.
    FSDP's traffic is the same under both."""
    hw, model = _hw(), replace(GPT3_175B, num_layers=8)
    knobs = Knobs(zero3_gather=gather, zero3_overlap_fraction=0.0)
    lay = Layout(dp=64, tp=1, pp=1, zero_stage=3, micro_batch_size=1, num_micro_batches=2, recompute="full")
    full = stage_model(model, BF16, hw, lay, knobs)
    sel = stage_model(model, BF16, hw, replace(lay, recompute="selective"), knobs)
    P = full.params(0)
    link = group_link(hw, group_size=64, stride=1).link
    gathers, units = zero3_units_per_layer(model, knobs)
    base = zero_comm_seconds(zero_stage=3, params=P, grad_reduce_bytes=4, param_bytes=2, dp=64, layers=8,
                             num_micro_batches=2, link=link, modules_per_layer=units, gathers_per_layer=gathers)
    elements, count = zero3_recompute_regathers(model, knobs, full.lc)
    mods = full.lc.module_params
    assert elements == pytest.approx(sum(mods[:5]), rel=1e-12)
    # QKV, proj, FC1: their biases (3h, h, 4h) and the LayerNorms stay resident under 1e5 elements
    assert count == 3
    third = 8 * count * all_gather_seconds(message_bytes=2 * 8 * elements / (8 * count), group_size=64, link=link)
    total, _ = dp_comm_seconds(hw, BF16, model, knobs, full, full.times(), full.params_per_stage())
    assert total == pytest.approx(base + 2 * third, rel=1e-9)
    total_sel, _ = dp_comm_seconds(hw, BF16, model, knobs, sel, sel.times(), sel.params_per_stage())
    assert total_sel == pytest.approx(base, rel=1e-9)
    fsdp = replace(knobs, zero3_gather=Zero3Gather.LAYER)
    f_full, f_sel = (stage_model(model, BF16, hw, m.layout, fsdp) for m in (full, sel))
    assert (dp_comm_seconds(hw, BF16, model, fsdp, f_full, f_full.times(), f_full.params_per_stage())[0]
            == pytest.approx(dp_comm_seconds(hw, BF16, model, fsdp, f_sel, f_sel.times(),
                                             f_sel.params_per_stage())[0], rel=1e-12))


def test_deepspeed_holds_the_kept_modules_of_a_recomputed_layer():
    """A 7B Llama layer under full recompute: DeepSpeed keeps every module gathered from its recompute to its
    backward (all within the reuse distance), the whole layer at once, more than two of its largest modules; under
    selective recompute it holds the largest module and the prefetched next. The difference is the memory's."""
    hw = _hw()
    knobs = Knobs(zero3_gather=Zero3Gather.MODULE)
    lay = Layout(dp=64, tp=1, pp=1, zero_stage=3, micro_batch_size=1, num_micro_batches=1, recompute="full")
    full = stage_model(LLAMA_7B, BF16, hw, lay, knobs)
    lc = full.lc
    assert sum(lc.module_params) > 2 * lc.largest_module_params
    unit, layer = lc.largest_module_params, sum(lc.module_params)
    fsdp_like = stage_model(LLAMA_7B, BF16, hw, lay, replace(knobs, zero3_gather=Zero3Gather.LAYER))
    # FSDP holds 2 layers (+ the head unit); DeepSpeed one layer: the differences of the gathered terms
    want = (2 * lc.layer_params * 2 + lc.layer_params * 4 + fsdp_head_unit_params(lc) * 2) - (layer * 2 + unit * 4)
    assert fsdp_like.memory(0).transient_bytes - full.memory(0).transient_bytes == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("zero, knob, rules", [
    ({"stage": 3, "stage3_max_reuse_distance": 0}, 0.0, []),
    ({"stage": 3, "stage3_max_reuse_distance": 5e9}, 5e9, []),
    ({"stage": 3, "stage3_max_reuse_distance": 1e9}, None, []),  # DeepSpeed's default: nothing moves
    ({"stage": 2, "stage3_max_reuse_distance": 0}, None, []),  # read at ZeRO-3 only
    ({"stage": 3, "stage3_max_reuse_distance": "1e9"}, None, ["stage3_max_reuse_distance"]),
    ({"stage": 3, "stage3_max_reuse_distance": -1}, None, ["stage3_max_reuse_distance"]),
    ({"stage": 3, "stage3_max_reuse_distance": float("nan")}, None, ["stage3_max_reuse_distance"]),
    ({"stage": 3, "stage3_max_reuse_distance": float("inf")}, None, ["stage3_max_reuse_distance"]),
])
def test_check_reads_a_deepspeed_configs_reuse_distance(tmp_path, zero, knob, rules):
    from tests.conftest import read_deepspeed_zero

    view = read_deepspeed_zero(tmp_path, zero)
    assert view.knobs.get("zero3_max_reuse_distance", (None,))[0] == knob
    assert [r for r, _, _ in view.errors] == rules


def test_check_predicts_the_configs_reuse_distance(tmp_path):
    """Llama 2 70B (h = 8192) on 8 A100 nodes, DeepSpeed ZeRO-3 with full recompute: at the default reuse distance
    QKV and the projection are gathered again (twice their later modules' elements, FC1's 0.47e9 and FC2's 0.23e9,
    is past 1e9), FC1 and FC2 are kept; at 0 every module is gathered again (DeepSpeed releases after every use);
    at 5e9 none is. `check` predicts the data-parallel traffic in that order."""
    import json
    from pathlib import Path

    from planner.estimate import build_problem
    from planner.integrations.check import check
    from planner.integrations.readers import read_config

    problem = build_problem("dgx-a100-80gb", 8, "llama2-70b", 64, 4096, "bf16", framework="deepspeed")
    steps = {}
    for reuse in (0, None, 5e9):
        zero = {"stage": 3, "overlap_comm": True} | ({} if reuse is None else {"stage3_max_reuse_distance": reuse})
        path = Path(tmp_path) / f"ds{reuse}.json"
        path.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
                                    "bf16": {"enabled": True}, "zero_optimization": zero}))
        out = check(read_config(path, gpus=64), problem, overrides={"recompute": "full"})
        assert out.layout.recompute == "full"
        steps[reuse] = out.estimate.time.dp_comm_total_seconds
        if reuse == 0:
            assert any("stage3_max_reuse_distance 0" in n for n in out.notes)
    assert steps[0] > steps[None] > steps[5e9]
