"""Tests written against the survivors of `mutmut run` over cost_models/{step,pipeline,attention,compute,
context_parallel,moe,extensions}.py (docs/mutation.md): each checks a value that a one-token change in those cost
functions would move, against a source formula (../shared/reference/cost-models.md, modern-training.md) or an
independent derivation written out here by hand. Every test is in-process and well under a second (it is in
mutmut's fast subset, pyproject.toml [tool.mutmut])."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from cost_models.attention import (
    attention_extra_count,
    attention_saved_elements_per_token,
    attention_weight_count,
    core_attention_forward_flops,
    mla_latent_elements_per_token,
    window_context,
    window_fraction,
)
from cost_models.communication import group_link
from cost_models.compute import (
    hardware_flops_per_step,
    layer_forward_flops,
    layer_parameter_count,
    model_flops_per_step,
    parameter_counts,
    recompute_extra_forward_flops,
    step_flops,
)
from cost_models.context_parallel import (
    CpTraffic,
    cp_buffer_bytes,
    cp_problems,
    cp_traffic,
    cp_transfer_seconds,
    exposed_cp_seconds,
    kv_elements_per_token,
    qkvo_elements_per_token,
    ring_overlap_min_tokens,
)
from cost_models.data_parallel import embedding_sync_seconds, zero_comm_seconds
from cost_models.extensions import (
    LayerExtras,
    Recomputed,
    _cp_terms,
    _ep_seconds,
    _ep_terms,
    _expert_kernel_terms,
    _fp8_terms,
    _grouped_gemm_slowdown,
    _layer_params,
    expert_data_parallel,
    layer_extras,
)
from cost_models.fp8 import fp8_gemm_speedup, fp8_weight_extra_bytes, quantization_seconds
from cost_models.inputs import MLA, Hardware, Knobs, Layout, Link, MoE, Training
from cost_models.memo import per_model
from cost_models.memory import (
    activation_bytes_per_layer,
    attention_score_traffic_bytes,
    embedding_activation_bytes,
    in_flight_per_stage,
    output_activation_bytes,
    sp_gathered_input_bytes,
    vocab_padded,
)
from cost_models.moe import (
    EpTraffic,
    all_to_all_bytes_per_layer,
    dispatch_buffer_bytes,
    ep_all_to_all_seconds,
    ep_traffic,
    expert_kernel_seconds,
    expert_kernels,
    mlp_forward_flops_per_token,
    mlp_parameter_counts,
    moe_layer_other_count,
    node_limited,
    nodes_per_token,
    routed_activation_bytes,
    routed_tokens_per_rank,
    router_activation_bytes,
)
from cost_models.pipeline import Makespan, Op, _timeline, pipeline_makespan, simulate
from cost_models.stage import (
    FORWARD_PASSES_PER_TRAINING_PASS,
    StageTime,
    elementwise_forward_seconds,
    layer_costs,
    stage_model,
    tp_all_reduce_seconds,
    tp_backward_hidden_seconds,
)
from cost_models.step import (
    CPU_ADAM_PARAMS_PER_SECOND_PER_NODE,
    HOST_GRAD_BYTES,
    OPTIMIZER_STEP_BYTES_PER_PARAM,
    _stage_dp_traffic,
    dp_comm_seconds,
    estimate_step,
    host_memory_bytes,
    optimizer_offload_seconds,
    pp_p2p_seconds,
    step_flops_of,
    time_breakdown,
)
from tests.conftest import gpt_shape

# a made-up cluster with round numbers, so that each expected value below is a short hand derivation
HW = Hardware(gpu_name="test", gpu_memory_bytes=80e9, peak_flops_per_second=1e15, matmul_efficiency=0.8,
              hbm_bytes_per_second=2e12, num_nodes=4, gpus_per_node=8, intra_node=Link(200e9, 1e-5),
              intra_node_kind="nvlink", nic=Link(25e9, 5e-6), nics_per_node=8, host_to_device=Link(20e9, 1e-5),
              host_memory_bytes_per_node=1e12)
BF16 = Training(global_batch_size=64, seq_length=1024, activation_bytes=2, param_bytes=2, grad_bytes=4,
                optimizer_bytes=12, grad_reduce_bytes=4)
SMALL = gpt_shape(num_layers=8, hidden_size=512, num_attention_heads=8, num_kv_heads=8, ffn_hidden_size=2048,
                  vocab_size=1000)


def _times(*fb):
    """StageTimes with the given (forward, backward) seconds and nothing else."""
    return [StageTime(f, b, 0.0, 0.0, 0.0) for f, b in fb]


# ---- step.py: optimizer step, offload, host memory ----------------------------------------------------------


@pytest.mark.parametrize("zero,dp,cp,shard", [(0, 4, 2, 1), (1, 4, 2, 8), (2, 3, 1, 3)])
def test_gpu_adam_reads_and_writes_32_bytes_per_local_parameter(zero, dp, cp, shard):
    """GPU Adam is HBM-bound: 32 B per parameter (read fp32 param, grad, m, v; write param, m, v, bf16 copy;
    step.py OPTIMIZER_STEP_BYTES_PER_PARAM) over the parameters this rank updates: all of them at ZeRO-0, 1/(dp x cp)
    from ZeRO-1 on (ZeRO paper, cost-models.md §1.1). No offload, no PCIe traffic."""
    lay = Layout(dp=dp, tp=1, pp=1, cp=cp, zero_stage=zero)
    opt, off = optimizer_offload_seconds(HW, BF16, lay, Knobs(), 8e9, _times((1.0, 2.0)))
    assert OPTIMIZER_STEP_BYTES_PER_PARAM == 32
    assert opt == pytest.approx(8e9 / shard * 32 / 2e12, rel=1e-12)
    assert off == 0.0


def test_cpu_adam_and_the_pcie_copies_of_zero_offload():
    """ZeRO-Offload (cost-models.md §1.4): CPU Adam over every GPU's shard of the node at 2e9 params/s per node
    (step.py CPU_ADAM_PARAMS_PER_SECOND_PER_NODE), gradients down and parameters up over PCIe: local x (4 + 2) B."""
    lay = Layout(dp=4, tp=1, pp=1, cp=2, zero_stage=2, offload="optimizer", num_micro_batches=4)
    opt, off = optimizer_offload_seconds(HW, BF16, lay, Knobs(), 8e9, _times((1.0, 2.0)))
    local = 8e9 / 8
    assert CPU_ADAM_PARAMS_PER_SECOND_PER_NODE == 2e9
    assert opt == pytest.approx(local * 8 / 2e9, rel=1e-12)  # 4.0 s
    assert off == pytest.approx(local * (4 + 2) / 20e9, rel=1e-12)  # 0.3 s


@pytest.mark.parametrize("fb,hidden_by", [((0.01, 0.02), "window"), ((1.0, 2.0), "share")])
def test_streamed_parameters_hide_behind_compute_up_to_the_window(fb, hidden_by):
    """optimizer+params (ZeRO-Infinity) streams every parameter up twice per micro-batch (forward and backward
    gathers): m x 2 x local x 2 B over PCIe; the hidden part is the zero3 overlap share of it, capped by m x the
    slowest stage's forward + backward (the compute it can hide behind)."""
    m, local = 4, 8e9 / 8
    lay = Layout(dp=4, tp=1, pp=2, cp=2, zero_stage=3, offload="optimizer+params", num_micro_batches=m)
    knobs = Knobs(zero3_overlap_fraction=0.25)
    times = _times(fb, (fb[0] / 2, fb[1] / 4))  # the max of each column is the first stage's
    _, off = optimizer_offload_seconds(HW, BF16, lay, knobs, 8e9, times)
    stream = m * 2 * local * 2 / 20e9  # 0.8 s
    window = m * (fb[0] + fb[1])
    hidden = window if hidden_by == "window" else 0.25 * stream
    assert hidden == min(0.25 * stream, window)
    assert off == pytest.approx(local * 6 / 20e9 + stream - hidden, rel=1e-12)


@pytest.mark.parametrize("offload,zero,per_param", [("none", 1, 0), ("optimizer", 0, 12 + 4),
                                                    ("optimizer", 1, 12 + 4), ("optimizer+params", 3, 12 + 4 + 2)])
def test_host_memory_holds_every_local_gpus_offloaded_state(offload, zero, per_param):
    """Host bytes per node: the optimizer state (12 B) and fp32 gradients (4 B, HOST_GRAD_BYTES: CPU Adam updates
    fp32 masters from fp32 grads) of each of the node's 8 GPUs' shards, plus their 2 B parameters under
    optimizer+params; shards are 1/(dp x cp) from ZeRO-1 on. cost-models.md §1.3 (DeepSpeed's estimator: 16 B/param
    on the host with optimizer offload, 18 with parameters too)."""
    lay = Layout(dp=4, tp=1, pp=1, cp=2, zero_stage=zero, offload=offload)
    local = 8e9 / (8 if zero >= 1 else 1)
    assert HOST_GRAD_BYTES == 4
    assert host_memory_bytes(HW, BF16, lay, 8e9) == pytest.approx(local * per_param * 8, rel=1e-12)


# ---- step.py: FLOPs with per-stage recompute -----------------------------------------------------------------


@pytest.mark.parametrize("policy", ["none", "selective", "full"])
def test_per_stage_recompute_pays_one_forward_for_each_fully_recomputed_layer(policy):
    """Hardware FLOPs = model FLOPs + the layers' recompute extra (Narayanan Eq. 3: one more forward of a fully
    recomputed layer). With the ILP's per-stage choice (3 + 1 of 8 layers fully recomputed, the rest under the base
    policy), the extra is 4 whole forwards (GEMMs + core) and 4 layers of the policy's extra (selective: the core
    again; "full" with a per-stage count means: those layers full, the others none, as the stage model runs them);
    model FLOPs are 3 x (L x layer forward + logits) over the TP-padded vocabulary."""
    lay = Layout(dp=1, tp=2, pp=2, recompute=policy, recompute_layers_per_stage=(3, 1))
    sm = stage_model(SMALL, BF16, HW, lay, Knobs())
    B, s, h = BF16.global_batch_size, BF16.seq_length, SMALL.hidden_size
    V = vocab_padded(SMALL.vocab_size, tp=2)
    assert V != SMALL.vocab_size
    gemm, core = layer_forward_flops(SMALL, tokens=B * s, seq_length=s)
    model_flops = 3 * (8 * (gemm + core) + 2 * B * s * h * V)
    policy_extra = core if policy == "selective" else 0.0
    mflops, hflops = step_flops_of(SMALL, BF16, lay, sm)
    assert mflops == pytest.approx(model_flops, rel=1e-12)
    assert hflops == pytest.approx(model_flops + 4 * (gemm + core) + 4 * policy_extra, rel=1e-12)


@pytest.mark.parametrize("policy", ["none", "selective", "full"])
def test_whole_model_recompute_flops(policy):
    """Without a per-stage choice every layer pays the layout's policy: full adds L forwards, selective L cores."""
    lay = Layout(dp=1, tp=1, pp=2, recompute=policy)
    sm = stage_model(SMALL, BF16, HW, lay, Knobs())
    B, s = BF16.global_batch_size, BF16.seq_length
    gemm, core = layer_forward_flops(SMALL, tokens=B * s, seq_length=s)
    mflops, hflops = step_flops_of(SMALL, BF16, lay, sm)
    extra = {"none": 0.0, "selective": core, "full": gemm + core}[policy]
    assert hflops - mflops == pytest.approx(8 * extra, rel=1e-9, abs=1e-3)


# ---- step.py: the breakdown of the bottleneck stage ------------------------------------------------------------


def test_time_breakdown_moves_cp_and_ep_out_of_compute_and_recompute():
    """The bottleneck stage's forward + backward hold its exposed CP and EP traffic, its recompute holds the part
    recomputed forwards repeat: the breakdown shows each apart, so every term is m x the stage's value, compute and
    recompute less the traffic, and the TP total is m x (4 per layer + 2 per fully recomputed layer) all-reduces
    (Megatron: 2 forward + 2 backward per layer, cost-models.md §4.3)."""
    m = 3
    t1 = StageTime(forward_seconds=11.0, backward_seconds=23.0, recompute_seconds=7.0, tp_comm_seconds=0.5,
                   weight_grad_seconds=0.0, cp_comm_seconds=1.5, ep_comm_seconds=2.5, cp_comm_total_seconds=4.0,
                   ep_comm_total_seconds=6.0, cp_recompute_seconds=0.25, ep_recompute_seconds=0.75)
    sm = SimpleNamespace(layout=SimpleNamespace(num_micro_batches=m), lc=SimpleNamespace(t_tp_all_reduce=0.125),
                         split=(2, 5), full_layers=(0, 3))
    span = Makespan(seconds=200.0, busy_seconds=150.0, bottleneck_stage=1)
    tb = time_breakdown(sm, [_times((1.0, 2.0))[0], t1], span, 0.3, (9.0, 4.0), 0.7, 0.9)
    assert tb.compute_seconds == pytest.approx(3 * 34.0 - 3 * 1.5 - 3 * 2.5)
    assert tb.cp_comm_seconds == pytest.approx(3 * 1.5 + 3 * 0.25)
    assert tb.ep_comm_seconds == pytest.approx(3 * 2.5 + 3 * 0.75)
    assert tb.cp_comm_total_seconds == pytest.approx(12.0) and tb.ep_comm_total_seconds == pytest.approx(18.0)
    assert tb.recompute_seconds == pytest.approx(3 * 7.0 - 3 * 0.25 - 3 * 0.75)
    assert tb.tp_comm_seconds == pytest.approx(1.5)
    assert tb.tp_comm_total_seconds == pytest.approx(3 * (5 * 4 + 3 * 2) * 0.125)
    assert tb.pipeline_bubble_seconds == pytest.approx(50.0)
    assert (tb.pp_p2p_seconds, tb.dp_comm_seconds, tb.dp_comm_total_seconds) == (0.3, 4.0, 9.0)
    assert (tb.optimizer_seconds, tb.offload_seconds) == (0.7, 0.9)
    # the breakdown adds up to the bottleneck's m x (forward + backward + recompute + TP) plus the rest
    assert tb.total_seconds == pytest.approx(3 * (34.0 + 7.0 + 0.5) + 50.0 + 0.3 + 4.0 + 0.7 + 0.9)


# ---- step.py: pipeline send/receive -------------------------------------------------------------------------


@pytest.mark.parametrize("schedule,v,needs_virtual,hops", [
    ("1f1b", 1, False, 6 + 0.5 * 16),  # the profile's share (0.5) of the steady state hidden
    ("1f1b", 1, True, 6 + 16),  # Megatron: no p2p overlap without virtual stages
    ("interleaved_1f1b", 2, True, 6 + 0.5 * 32),  # with virtual stages it overlaps: v x the steady-state sends
    ("zero_bubble", 1, True, 6 + 0.5 * 16),  # not upstream Megatron's schedule: keeps the profile's share
])
def test_pp_p2p_fill_drain_and_the_steady_state_not_hidden(schedule, v, needs_virtual, hops):
    """Exposed pipeline send/receive: 2(p-1) fill and drain hops in full plus the steady state's 2 m v hops
    less the hidden share (Narayanan §4.1: b s h / t activations per hop, cost-models.md §4.4). tp x dp = 4 ranks
    apart: NVLink (200 GB/s, 10 us)."""
    lay = Layout(dp=2, tp=2, pp=4, micro_batch_size=2, num_micro_batches=8, virtual_stages=v, schedule=schedule)
    knobs = Knobs(pp_overlap_fraction=0.5, pp_overlap_needs_virtual=needs_virtual)
    msg = 2 * 1024 * 512 * 2 / 2  # b s h bytes / t
    one = 1e-5 + msg / 200e9
    assert pp_p2p_seconds(HW, BF16, lay, SMALL, knobs, schedule, v) == pytest.approx(hops * one, rel=1e-12)


def test_pp_p2p_naive_sends_the_whole_batch_once_and_no_pipeline_sends_nothing():
    """naive: one message of all m micro-batches per hop, fill and drain only; pp = 1: no sends."""
    lay = Layout(dp=2, tp=2, pp=4, micro_batch_size=2, num_micro_batches=8, schedule="naive")
    one = 1e-5 + 8 * (2 * 1024 * 512 * 2 / 2) / 200e9
    assert pp_p2p_seconds(HW, BF16, lay, SMALL, Knobs(), "naive", 1) == pytest.approx(6 * one, rel=1e-12)
    flat = Layout(dp=2, tp=2, pp=1, num_micro_batches=8)
    assert pp_p2p_seconds(HW, BF16, flat, SMALL, Knobs(), "1f1b", 1) == 0.0


# ---- step.py: data-parallel traffic per stage ---------------------------------------------------------------


def _zero_traffic(zero, params, layers, bwd, fwd=0.0, d=4, m=2, share=0.5, modules=1, gathers=None):
    """(comm, exposed) by hand: the ZeRO volumes of data_parallel.zero_comm_seconds on the DP group's link, hidden up
    to the share and the window (the last backward at ZeRO 0/1, every backward at ZeRO-2, everything at ZeRO-3)."""
    link = group_link(HW, group_size=d, stride=1).link
    comm = zero_comm_seconds(zero_stage=zero, params=params, dp=d, layers=layers, grad_reduce_bytes=4, param_bytes=2,
                             num_micro_batches=m, link=link, modules_per_layer=modules, gathers_per_layer=gathers)
    window = {0: bwd, 1: bwd, 2: m * bwd, 3: m * (fwd + bwd)}[zero]
    return comm, comm - min(share * comm, window)


def _dp_stages(layout, split, vocab=1024):
    return SimpleNamespace(layout=layout, split=split, full_layers=(0,) * len(split),
                           lc=SimpleNamespace(padded_vocab=vocab, module_params=(), extras=SimpleNamespace(expert_params=0.0)))


def test_dp_traffic_of_alike_stages_is_computed_per_stage_not_per_shared_object():
    """dp_comm_seconds reuses one stage's traffic only for the next stage with the same StageTime object, parameters
    and layers: a different StageTime (same parameters and layers), the same StageTime with other parameters, or
    with other layers (ZeRO-3 pays latency per layer) each get their own (max over the stages)."""
    untied = gpt_shape(num_layers=8, hidden_size=512, num_attention_heads=8, num_kv_heads=8, ffn_hidden_size=2048,
                       vocab_size=1000, tied_embeddings=False)
    one = Layout(dp=4, tp=1, pp=2, zero_stage=1, num_micro_batches=2)
    slow, fast = StageTime(1.0, 50.0, 0.0, 0.0, 0.0), StageTime(1.0, 1e-4, 0.0, 0.0, 0.0)
    # another StageTime object, alike otherwise: the second stage hides less
    total, exposed = dp_comm_seconds(HW, BF16, untied, Knobs(), _dp_stages(one, (2, 2)), [slow, fast], [1e9, 1e9])
    comm, hidden = _zero_traffic(1, 1e9, 2, 1e-4)
    assert (total, exposed) == (pytest.approx(comm, rel=1e-12), pytest.approx(hidden, rel=1e-12))
    assert hidden > _zero_traffic(1, 1e9, 2, 50.0)[1]
    # the same StageTime object, other parameters
    total, exposed = dp_comm_seconds(HW, BF16, untied, Knobs(), _dp_stages(one, (2, 2)), [slow, slow], [1e9, 3e9])
    assert total == pytest.approx(_zero_traffic(1, 3e9, 2, 50.0)[0], rel=1e-12)
    # the same StageTime object and parameters, other layers (ZeRO-3: per-layer gathers)
    three = Layout(dp=4, tp=1, pp=2, zero_stage=3, num_micro_batches=2)
    total, exposed = dp_comm_seconds(HW, BF16, untied, Knobs(), _dp_stages(three, (2, 6)), [slow, slow], [1e9, 1e9])
    assert total == pytest.approx(_zero_traffic(3, 1e9, 6, 50.0, fwd=1.0)[0], rel=1e-12)
    assert total > _zero_traffic(3, 1e9, 2, 50.0, fwd=1.0)[0]


def test_tied_embedding_sync_is_paid_by_the_first_and_last_stage_only():
    """Tied embeddings over a pipeline: the first and last stage all-reduce the embedding gradient (V h / t x 4 B,
    Megatron) after the last backward; a middle stage does not. Here the middle stage has the most traffic."""
    lay = Layout(dp=4, tp=1, pp=3, zero_stage=1, num_micro_batches=2)
    times = [StageTime(1.0, 50.0, 0.0, 0.0, 0.0) for _ in range(3)]
    total, exposed = dp_comm_seconds(HW, BF16, SMALL, Knobs(), _dp_stages(lay, (2, 3, 3)), times, [1e9, 3e9, 1e9])
    sync = embedding_sync_seconds(HW, tp=1, dp=4, embedding_grad_bytes=1024 * 512 * 4)
    (c1, e1), (c3, e3) = _zero_traffic(1, 1e9, 2, 50.0), _zero_traffic(1, 3e9, 3, 50.0)
    assert sync > 0 and c3 > c1 + sync
    assert total == pytest.approx(max(c1 + sync, c3), rel=1e-12)
    assert exposed == pytest.approx(max(e1 + sync, e3), rel=1e-12)


@pytest.mark.parametrize("zero,d,gather,knobs,share", [
    (1, 2, "layer", Knobs(dp_overlap_fraction=0.3, zero3_overlap_fraction=0.9), 0.3),
    (0, 4, "layer", Knobs(dp_overlap_fraction=0.3, ddp_overlap_fraction=0.9), 0.9),  # DDP's own share at ZeRO-0
    (1, 4, "layer", Knobs(dp_overlap_fraction=0.3, ddp_overlap_fraction=0.9), 0.3),  # ... and only there
    (3, 4, "layer", Knobs(dp_overlap_fraction=0.3, zero3_overlap_fraction=0.6), 0.6),
    (3, 4, "module", Knobs(dp_overlap_fraction=0.3, zero3_overlap_fraction=0.6, zero3_gather="module"), 0.6),
    (3, 4, "parameter", Knobs(dp_overlap_fraction=0.3, zero3_overlap_fraction=0.6, zero3_gather="parameter"), 0.6),
])
def test_stage_dp_traffic_share_window_and_zero3_units(zero, d, gather, knobs, share):
    """One stage's (traffic, exposed): ZeRO-3 gathers layer by layer (FSDP), Linear by Linear (DeepSpeed: 4 modules
    a layer, step.py ZERO3_MODULES_PER_LAYER) or parameter tensor by tensor (DeepSpeed of 2021: the 4 weights, its
    biases and LayerNorms under stage3_param_persistence_threshold staying resident, and a reduce-scatter for each of
    the 12 tensors of a GPT layer with biases and LayerNorms); the overlap share is the ZeRO-3 knob at ZeRO-3, DDP's
    own at ZeRO-0 when set, the DP knob otherwise, capped by the window."""
    from cost_models.step import (
        gathered_tensors_per_module,
        parameter_tensors_per_layer,
        zero3_units_per_layer,
    )

    lay = Layout(dp=d, tp=1, pp=1, zero_stage=zero, num_micro_batches=2)
    link = group_link(HW, group_size=d, stride=1).link
    units = zero3_units_per_layer(SMALL, knobs)
    assert units == {"layer": (1, 1), "module": (4, 4), "parameter": (4, 12)}[gather]
    assert parameter_tensors_per_layer(gpt_shape(bias=False, rms_norm=True)) == 6  # Llama: 4 weights, 2 RMSNorms
    # at 1e5 elements a tensor is gathered: h = 131072 gathers both LayerNorms' two tensors and every bias; TP 2
    # halves the column-parallel biases (QKV's 3h, FC1's 4h) and not the row-parallel ones (h)
    wide = gpt_shape(hidden_size=131072, num_attention_heads=128, num_kv_heads=128, ffn_hidden_size=4 * 131072)
    assert gathered_tensors_per_module(wide) == (2, 2, 2, 2, 2, 2)
    assert gathered_tensors_per_module(gpt_shape(hidden_size=20000, num_attention_heads=100, num_kv_heads=100,
                                                 ffn_hidden_size=80000), tp=2) == (0, 1, 1, 0, 1, 1)
    assert gathered_tensors_per_module(gpt_shape(hidden_size=30000, num_attention_heads=100, num_kv_heads=100,
                                                 ffn_hidden_size=120000), tp=1) == (0, 1, 1, 0, 2, 1)
    got = _stage_dp_traffic(BF16, knobs, lay, (link, link), (1e9, 3, 1.0, 50.0, 0), units)
    modules = {"layer": 1, "module": 4, "parameter": 12}[gather]
    want = _zero_traffic(zero, 1e9, 3, 50.0, fwd=1.0, d=d, share=share, modules=modules,
                         gathers=4 if gather == "parameter" else None)
    assert got == (pytest.approx(want[0], rel=1e-12), pytest.approx(want[1], rel=1e-12))
    if gather == "module":
        assert want[0] > _zero_traffic(3, 1e9, 3, 50.0, fwd=1.0, modules=1)[0]
    if gather == "parameter":  # the same bytes in more reduce-scatters: more latency
        assert want[0] > _zero_traffic(3, 1e9, 3, 50.0, fwd=1.0, modules=4)[0]


def test_stage_dp_traffic_without_data_parallelism_is_zero():
    lay = Layout(dp=1, tp=1, pp=1, zero_stage=1, num_micro_batches=2)
    assert _stage_dp_traffic(BF16, Knobs(), lay, (HW.intra_node, HW.intra_node), (1e9, 3, 1.0, 50.0, 0),
                             (1, 1)) == (0.0, 0.0)


# ---- step.py: the estimate is the composition of its parts ----------------------------------------------------


SWIGLU = gpt_shape(num_layers=8, hidden_size=512, num_attention_heads=8, num_kv_heads=4, ffn_hidden_size=1536,
                   vocab_size=1000, swiglu=True, rms_norm=True, bias=False, learned_position_embeddings=False)


def test_estimate_step_is_the_sum_of_its_parts():
    """step = pipeline makespan (zero-bubble: the bottleneck's weight-gradient time fills the bubble) + exposed PP
    send/receive + exposed DP traffic + optimizer + exposed offload (step.py's docstring, cost-models.md §5); the
    throughput, MFU and HFU follow their definitions (PaLM Appendix B, cost-models.md §3.3) over tp x pp x dp x cp =
    16 GPUs; every term here is non-zero, so a dropped or negated term moves the step."""
    lay = Layout(dp=2, tp=2, pp=2, cp=2, zero_stage=3, offload="optimizer+params", num_micro_batches=4,
                 schedule="zero_bubble")
    knobs = Knobs(pp_overlap_needs_virtual=True, zero3_overlap_fraction=0.3)
    est = estimate_step(SWIGLU, BF16, HW, lay, knobs)
    sm = stage_model(SWIGLU, BF16, HW, lay, knobs)
    times, params = sm.times(), sm.params_per_stage()
    span = pipeline_makespan(schedule="zero_bubble", stage_seconds=[t.total_seconds for t in times],
                             num_micro_batches=4, weight_grad_seconds=[t.weight_grad_seconds for t in times])
    assert span.seconds < pipeline_makespan(schedule="zero_bubble", stage_seconds=[t.total_seconds for t in times],
                                            num_micro_batches=4).seconds
    p2p = pp_p2p_seconds(HW, BF16, lay, SWIGLU, knobs, "zero_bubble", 1)
    assert p2p != pp_p2p_seconds(HW, BF16, lay, SWIGLU, knobs, "1f1b", 1)
    _, dp = dp_comm_seconds(HW, BF16, SWIGLU, knobs, sm, times, params)
    opt, off = optimizer_offload_seconds(HW, BF16, lay, knobs, max(params), times)
    parts = (span.seconds, p2p, dp, opt, off)
    assert all(x > 0 for x in parts) and len(set(parts)) == 5
    step = sum(parts)
    assert est.step_seconds == pytest.approx(step, rel=1e-12)
    tokens = 64 * 1024
    assert est.tokens_per_second == pytest.approx(tokens / step, rel=1e-12)
    assert est.tokens_per_second_per_gpu == pytest.approx(tokens / step / 16, rel=1e-12)
    mflops, hflops = step_flops_of(SWIGLU, BF16, lay, sm)
    assert (est.model_flops_per_step, est.hardware_flops_per_step) == (pytest.approx(mflops), pytest.approx(hflops))
    assert est.mfu == pytest.approx(mflops / (step * 16 * 1e15), rel=1e-12)
    assert est.hfu == pytest.approx(hflops / (step * 16 * 1e15), rel=1e-12)
    stages, i = sm.memories_and_peak(params)
    assert est.peak_stage == stages[i].stage and est.peak_memory_bytes == pytest.approx(stages[i].total_bytes)
    assert est.host_memory_bytes_per_node == pytest.approx(host_memory_bytes(HW, BF16, lay, max(params)))
    assert est.host_memory_bytes_per_node > 0 and est.host_memory_capacity_bytes == 1e12
    assert est.gpu_memory_bytes == 80e9 and est.padded_vocab_size == vocab_padded(1000, tp=2) == 1024
    assert est.stage_seconds == tuple(t.total_seconds for t in times)


def test_fits_needs_peak_plus_headroom_within_the_gpu_and_host_bytes_within_the_node():
    """fits: peak + headroom <= GPU memory and host bytes <= the node's host memory, both at equality."""
    lay = Layout(dp=8, tp=1, pp=1, zero_stage=2, offload="optimizer", num_micro_batches=2)
    base = estimate_step(SWIGLU, BF16, HW, lay)
    peak, host = base.peak_memory_bytes, base.host_memory_bytes_per_node
    assert host > 0
    knobs = Knobs(memory_headroom_bytes=1e9)
    exact = replace(HW, gpu_memory_bytes=peak + 1e9, host_memory_bytes_per_node=host)
    est = estimate_step(SWIGLU, BF16, exact, lay, knobs)
    assert est.peak_memory_bytes == peak and est.fits
    assert not estimate_step(SWIGLU, BF16, replace(exact, gpu_memory_bytes=peak + 0.5e9), lay, knobs).fits
    assert not estimate_step(SWIGLU, BF16, replace(exact, host_memory_bytes_per_node=host * 0.99), lay, knobs).fits
    assert not estimate_step(SWIGLU, BF16, replace(exact, gpu_memory_bytes=peak / 2), lay, knobs).fits


def test_estimate_step_plans_unfused_swiglu_unless_told():
    """Knobs.fused_swiglu defaults to False (the stage model's unfused SwiGLU keeps both FC1 halves, the SiLU output
    and the product); set, each layer keeps 2 s b f bytes fewer (memory.mlp_intermediate_coefficient: 8 -> 6)."""
    lay = Layout(dp=8, tp=1, pp=1, zero_stage=1, num_micro_batches=2)
    peaks, acts = {}, {}
    for fused in (False, True):
        sm = stage_model(SWIGLU, BF16, HW, lay, Knobs(fused_swiglu=fused))
        stages, i = sm.memories_and_peak(sm.params_per_stage())
        peaks[fused], acts[fused] = stages[i].total_bytes, sm.lc.act_none_bytes
    s, f = BF16.seq_length, SWIGLU.ffn_hidden_size
    assert acts[False] - acts[True] == pytest.approx(2 * s * f * 2 / 2, rel=1e-12)  # 2 s b f bytes, b = 1
    assert estimate_step(SWIGLU, BF16, HW, lay).peak_memory_bytes == pytest.approx(peaks[False], rel=1e-12)
    assert estimate_step(SWIGLU, BF16, HW, lay, Knobs(fused_swiglu=True)).peak_memory_bytes == pytest.approx(peaks[True])


# ---- attention.py: windows, MLA, saved elements ----------------------------------------------------------------

V3 = gpt_shape(num_layers=61, hidden_size=7168, num_attention_heads=128, num_kv_heads=128, ffn_hidden_size=18432,
               vocab_size=129280, swiglu=True, tied_embeddings=False, rms_norm=True, flash_attention=True,
               learned_position_embeddings=False, bias=False, dropout=False,
               mla=MLA(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128))
LLAMA3_70B = gpt_shape(num_layers=80, hidden_size=8192, num_attention_heads=64, num_kv_heads=8, ffn_hidden_size=28672,
                       vocab_size=128256, swiglu=True, tied_embeddings=False, rms_norm=True, bias=False)


@pytest.mark.parametrize("window,s,ctx,fraction", [
    (4096, 16384, 3584.125, 0.437),  # Mistral-7B (modern-training.md §5: ctx 3584, 0.437 of full causal)
    (4096, 32768, 3840.0625, 0.234),  # Mistral-7B at 32k: 0.234
    (4096, 8192, 3072.25, 0.750),  # Gemma-2's SWA layers at 8k: 0.750
    (8192, 8192, 4096.5, 1.0),  # a window as long as the sequence is plain causal: (s + 1) / 2
    (9000, 8192, 4096.5, 1.0),
])
def test_window_context_and_fraction_against_the_published_ratios(window, s, ctx, fraction):
    """ctx(W, s) = W - W(W-1)/(2s) for W < s, else (s+1)/2 (Megatron-Bridge flop_utils L752-764, modern-training.md
    §5), and the fraction of a full causal layer's core-attention FLOPs, ctx / ((s+1)/2), to the table's 3 digits."""
    assert window_context(window, s) == pytest.approx(ctx, rel=1e-12)
    assert window_fraction(window, s) == pytest.approx(ctx / ((s + 1) / 2), rel=1e-12)
    assert window_fraction(window, s) == pytest.approx(fraction, abs=5e-4)


def test_no_window_is_full_attention():
    assert window_fraction(None, 4096) == 1.0 and window_fraction(0, 4096) == 1.0


def test_gemma2_alternating_windows_average_to_0875():
    """Gemma-2 at s = 8192, W = 4096 on every other layer: the core attention averages (1 + 0.75) / 2 = 0.875 of a
    full causal model's (modern-training.md §5)."""
    kw = dict(num_layers=4, hidden_size=2304, num_attention_heads=8, num_kv_heads=4, ffn_hidden_size=9216,
              vocab_size=256000, head_dim_size=256)
    full = gpt_shape(**kw)
    gemma = gpt_shape(**kw, sliding_window=4096, sliding_window_layers=2)
    ratio = (core_attention_forward_flops(gemma, tokens=8192, seq_length=8192)
             / core_attention_forward_flops(full, tokens=8192, seq_length=8192))
    assert ratio == pytest.approx((1 + window_fraction(4096, 8192)) / 2, rel=1e-12)
    assert ratio == pytest.approx(0.875, abs=5e-4)


def test_saved_attention_elements_of_mla_and_gqa_per_token():
    """Per token and layer (modern-training.md §4.3): DeepSeek-V3 saves Q and K at n_h d_qk = 24,576 each, V and O at
    n_h d_v = 16,384 each (81,920), and the latents c_Q + norm(c_Q) 2 x 1536, the kv_a output 576, norm(c_KV) 512
    (4,160): with the norm output h = 7168, 93,248 elements. Llama-3-70B (GQA 64/8 heads of 128) stores 26,624 with
    the norm output, i.e. 2 a d + 2 g d = 18,432 in the attention block; no latents without MLA."""
    assert attention_saved_elements_per_token(V3) == 81_920
    assert mla_latent_elements_per_token(V3) == 4_160
    assert V3.hidden_size + 81_920 + 4_160 == 93_248
    assert attention_saved_elements_per_token(LLAMA3_70B) == 26_624 - 8192 == 18_432
    assert mla_latent_elements_per_token(LLAMA3_70B) == 0
    v2_lite = replace(V3, mla=replace(V3.mla, q_lora_rank=None))
    assert mla_latent_elements_per_token(v2_lite) == 512 + 64 + 512  # no c_Q without q_lora_rank


def test_mla_layer_keeps_its_own_attention_tensors_and_selective_drops_q_k_v():
    """The production activation count (memory.activation_bytes_per_layer) holds MLA's tensors, not GQA's:
    modern-training.md §4.3's 93,248 elements per token (norm output 7,168 + latents 4,160 + Q, K, V, O 81,920), plus
    the layer's other kept tensors (norm inputs 2 h, FC1 input h, the MLP's 6 f fused), 2 bytes each, plus flash
    attention's fp32 log-sum-exp 4 a per token. Selective recompute on MLA recomputes the up-projections
    (DeepSeek-V3 §3.2.3; Megatron --recompute-modules mla_up_proj): Q, K and V (24,576 + 24,576 + 16,384 = 65,536,
    '≈ 65.5K of the 93K', §4.3) are dropped and the log-sum-exp stays (the core is not recomputed)."""
    from cost_models.memory import activation_bytes_per_layer

    s, h, f, a = 4096, 7168, 18432, 128
    others = 2 * h + h + 3 * f  # two norm inputs, the FC1 input, fused SwiGLU's FC1 output (2 f) and FC2 input (f)
    none = activation_bytes_per_layer(V3, seq_length=s, micro_batch_size=1, fused_swiglu=True)
    assert none == pytest.approx(s * 2 * (93_248 + others) + 4 * a * s, rel=1e-12)
    sel = activation_bytes_per_layer(V3, seq_length=s, micro_batch_size=1, fused_swiglu=True, recompute="selective")
    assert none - sel == pytest.approx(s * 2 * 65_536, rel=1e-12)
    # GQA is unchanged by selective under flash attention but for the log-sum-exp (the core is recomputed)
    llama = replace(LLAMA3_70B, flash_attention=True, dropout=False)
    g_none = activation_bytes_per_layer(llama, seq_length=s, micro_batch_size=1)
    g_sel = activation_bytes_per_layer(llama, seq_length=s, micro_batch_size=1, recompute="selective")
    assert g_none - g_sel == pytest.approx(4 * 64 * s, rel=1e-12)


def test_mla_selective_recomputes_the_up_projections_only():
    """V3's up-projections per token: q_b 1536 x 128 x 192 + kv_b 512 x 128 x (128 + 128) = 37,748,736 + 16,777,216
    = 54,525,952 weights (modern-training.md §4.1), 2 FLOPs each: selective adds that forward (and flash attention's
    own QK^T recompute, half the core), not the attention core; full adds the whole layer; without MLA selective
    adds the core."""
    from cost_models.attention import up_projection_forward_flops
    from cost_models.compute import layer_forward_flops, recompute_extra_forward_flops

    T, s = 4096, 4096
    assert up_projection_forward_flops(V3, tokens=T) == 2 * T * 54_525_952
    assert up_projection_forward_flops(LLAMA3_70B, tokens=T) is None
    gemm, core = layer_forward_flops(V3, tokens=T, seq_length=s)
    extra = recompute_extra_forward_flops(V3, tokens=T, seq_length=s, recompute="selective")
    assert extra == pytest.approx(2 * T * 54_525_952 + core / 2, rel=1e-12)
    assert recompute_extra_forward_flops(V3, tokens=T, seq_length=s, recompute="full") == pytest.approx(
        gemm + core + core / 2, rel=1e-12)
    llama = replace(LLAMA3_70B, flash_attention=True)
    _, g_core = layer_forward_flops(llama, tokens=T, seq_length=s)
    assert recompute_extra_forward_flops(llama, tokens=T, seq_length=s, recompute="selective") == pytest.approx(
        g_core + g_core / 2, rel=1e-12)
    # V2-Lite has no q_lora_rank: its Q comes from q_proj on the hidden state (h x a d_qk)
    v2_lite = replace(V3, mla=replace(V3.mla, q_lora_rank=None))
    assert up_projection_forward_flops(v2_lite, tokens=1) == 2 * (7168 * 128 * 192 + 512 * 128 * 256)


def test_mla_selective_repeats_no_cp_exchange():
    """Megatron's core_attn checkpoint holds the CP exchange, so a GQA layer's selective recompute repeats its
    forward CP traffic; MLA's selective recomputes the up-projections only, outside the attention core: nothing
    repeats (LayerExtras.recomputed)."""
    from cost_models.extensions import layer_extras

    hw = HW
    lay = Layout(dp=1, tp=1, pp=1, cp=2, num_micro_batches=1)
    training = replace(BF16, seq_length=8192)
    for model, repeats in ((LLAMA3_70B, True), (V3, False)):
        ext = layer_extras(model, training, hw, lay, Knobs(), gemm_flops_per_gpu=1e12, core_seconds=1e-3,
                           rate_flops_per_second=1e15)
        sel = ext.recomputed("selective")
        assert ext.cp_forward_total_seconds > 0
        assert (sel.cp_total_seconds == ext.cp_forward_total_seconds) is repeats
        assert (sel.cp_total_seconds == 0.0) is not repeats


# ---- compute.py: norms, flash attention, the vocabulary argument ------------------------------------------------


@pytest.mark.parametrize("kw,norm", [({"rms_norm": True}, 1), ({"rms_norm": False}, 2),
                                     ({"rms_norm": False, "norm_has_params": False}, 0)])
def test_norm_weights_rmsnorm_layernorm_and_non_parametric(kw, norm):
    """RMSNorm has a weight of h, LayerNorm a weight and a bias (2h), OLMo's non-parametric LayerNorm none."""
    model = replace(SMALL, **kw)
    pc = parameter_counts(model)
    assert pc.final_norm == norm * 512
    assert pc.per_layer_norms == 2 * norm * 512


def _gpt_flops(B, s, L, h, V):
    """Korthikanti et al. 2022 Eq. 7 (cost-models.md §3.2): model FLOPs 72 B s L h^2 (1 + s/(6h) + V/(12 h L))."""
    return 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))


def test_flash_attention_backward_recomputes_qk_once_more():
    """Flash attention's backward recomputes Q K^T once more: 2 T s h per layer, i.e. half the core's 4 T s h
    (FlashAttention §3.1, compute.py). Model FLOPs keep Eq. 7; hardware FLOPs add L x 2 B s^2 h without recompute,
    L x (4 + 2) B s^2 h with selective recompute, and Narayanan Eq. 3's 96 B s L h^2 (1 + s/(6h) + V/(16 h L)) plus the
    flash term with full recompute. The vocabulary argument overrides the model's (the TP-padded one)."""
    B, s, L, h, V = 8, 2048, 4, 1024, 51200
    gpt = gpt_shape(num_layers=L, hidden_size=h, num_attention_heads=16, num_kv_heads=16, ffn_hidden_size=4 * h,
                    vocab_size=50000, flash_attention=True)
    flash = L * 2 * B * s * s * h
    assert model_flops_per_step(gpt, global_batch_size=B, seq_length=s, vocab_size=V) == pytest.approx(
        _gpt_flops(B, s, L, h, V), rel=1e-12)
    assert model_flops_per_step(gpt, global_batch_size=B, seq_length=s) == pytest.approx(
        _gpt_flops(B, s, L, h, 50000), rel=1e-12)
    hw_flops = {r: hardware_flops_per_step(gpt, global_batch_size=B, seq_length=s, recompute=r, vocab_size=V)
                for r in ("none", "selective", "full")}
    assert hw_flops["none"] == pytest.approx(_gpt_flops(B, s, L, h, V) + flash, rel=1e-12)
    assert hw_flops["selective"] == pytest.approx(_gpt_flops(B, s, L, h, V) + L * 4 * B * s * s * h + flash, rel=1e-12)
    eq3 = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * h * L))
    assert hw_flops["full"] == pytest.approx(eq3 + flash, rel=1e-12)
    assert recompute_extra_forward_flops(gpt, tokens=B * s, seq_length=s, recompute="selective") == pytest.approx(
        (4 + 2) * B * s * s * h, rel=1e-12)
    assert step_flops(gpt, global_batch_size=B, seq_length=s, vocab_size=V)[2] == pytest.approx(flash / L, rel=1e-12)


def test_mla_attention_parameters_of_deepseek_v3_by_weight():
    """DeepSeek-V3's attention per layer (modern-training.md §4.1 table): q_a 11,010,048 + q_a_layernorm 1,536 +
    q_b 37,748,736 + kv_a 4,128,768 + kv_a_layernorm 512 + kv_b 16,777,216 + o 117,440,512 = 187,107,328. With
    DeepSeek's `attention_bias`, q_a (1536), kv_a (512 + 64) and o (7168) carry biases, q_b and kv_b none. Without
    q_lora_rank (V2-Lite's plain q_proj, h x n_h d_qk) there is no q_a norm and q_proj has no bias (HF
    transformers@000c33fd modular_deepseek_v3.py: `q_proj = nn.Linear(..., bias=False)`)."""
    assert attention_weight_count(V3) == 11_010_048 + 37_748_736 + 4_128_768 + 16_777_216 + 117_440_512
    assert attention_extra_count(V3) == 1_536 + 512
    assert attention_weight_count(V3) + attention_extra_count(V3) == 187_107_328
    assert attention_extra_count(replace(V3, o_bias=True)) == 1_536 + 512 + 1_536 + 576 + 7_168
    assert attention_extra_count(replace(V3, bias=True)) == attention_extra_count(replace(V3, o_bias=True))
    lite = replace(V3, mla=replace(V3.mla, q_lora_rank=None))
    assert attention_weight_count(lite) == 7168 * 128 * 192 + 4_128_768 + 16_777_216 + 117_440_512
    assert attention_extra_count(lite) == 512
    assert attention_extra_count(replace(lite, o_bias=True)) == 512 + 576 + 7_168


# ---- context_parallel.py / moe.py -----------------------------------------------------------------------------


def test_ulysses_moves_q_k_v_and_o_per_tp_rank_with_replicated_kv_heads():
    """What Ulysses' all-to-alls move per token on one TP rank (modern-training.md §2.3): (2a + 2g)·d/t, the KV heads
    replicated when t exceeds them (max(g/t, 1): Megatron copies a KV head to each TP rank of its query group); MLA
    moves the expanded heads, a·(2 d_qk + 2 d_v)/t. Llama-3-8B (a 32, g 8, d 128), DeepSeek-V3 (128 heads, d_qk 192,
    d_v 128)."""
    llama = gpt_shape(num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
                      vocab_size=128256, swiglu=True, rms_norm=True, bias=False)
    assert qkvo_elements_per_token(llama, tp=1) == (64 + 16) * 128
    assert qkvo_elements_per_token(llama, tp=2) == (32 + 8) * 128
    assert qkvo_elements_per_token(llama, tp=16) == (4 + 2) * 128  # 8 KV heads over 16 ranks: one copy each
    assert qkvo_elements_per_token(V3, tp=2) == 128 * (2 * 192 + 2 * 128) / 2


def test_expert_all_to_all_bytes_from_two_ranks_on():
    """(ep-1)/ep of the T·k·h copies leave the rank, dispatch + combine at 2 B each (modern-training.md §3.4): at ep 2
    half of them; nothing at ep 1."""
    fwd, bwd = all_to_all_bytes_per_layer(tokens=4096, top_k=8, hidden_size=7168, ep=2)
    assert fwd == bwd == 4096 * 8 * 7168 / 2 * (2 + 2)


def test_nodes_per_token_without_a_group_limit_is_k_or_the_nodes():
    """Group-limited routing only with both fields (HF n_group and topk_group) and fewer chosen groups than groups
    (moe.py nodes_per_token): n_group alone does not limit a token's nodes, min(N, k) = min(8, 6)."""
    moe = MoE(num_experts=64, top_k=6, expert_ffn_hidden_size=1408, expert_groups=8, groups_per_token=None)
    assert nodes_per_token(moe, ep_nodes=8) == 6 and not node_limited(moe, ep_nodes=8)
    assert nodes_per_token(replace(moe, groups_per_token=3), ep_nodes=8) == 3


@pytest.mark.parametrize("fp8,kernels", [(False, (2, 4)), (True, (4, 6))])
def test_per_expert_kernels_and_their_fixed_seconds(fp8, kernels):
    """Each local expert launches its own fc1 and fc2 GEMMs forward, dgrad and wgrad of each backward, and in FP8 a
    cast of each fresh operand (moe.py EXPERT_KERNELS: 2 + 4 in BF16, 4 + 6 in FP8; Qwen3-30B-A3B at EP 8: 16 local
    experts, 160 kernels per layer in FP8); each costs kernel_gflop GFLOP at the layer's rate."""
    assert expert_kernels(fp8=fp8) == kernels
    fwd, bwd = expert_kernel_seconds(local_experts=16, fp8=fp8, kernel_gflop=0.5, rate_flops_per_second=4e14)
    per_kernel = 0.5e9 / 4e14
    # abs=0: the seconds are ~1e-5, below pytest.approx's default absolute tolerance of 1e-12 x 1e7
    assert (fwd, bwd) == (pytest.approx(16 * kernels[0] * per_kernel, rel=1e-12, abs=0),
                          pytest.approx(16 * kernels[1] * per_kernel, rel=1e-12, abs=0))
    if fp8:
        assert 16 * sum(kernels) == 160


def test_mla_ring_hides_from_beta_f_over_b_tokens():
    """MLA's ring exchanges the expanded K and V, a·(d_qk + d_v) per token, and a ring step computes a·(d_qk + d_v)·s_l²
    (modern-training.md §2.4, §4.2): the heads and head sizes cancel, s_l >= β·F_att/B = 2 x 500e12 / 450e9 = 2222
    tokens for DeepSeek-V3 over NVLink at 500 TFLOP/s."""
    got = ring_overlap_min_tokens(V3, attention_flops_per_second=500e12, link=Link(450e9, 0.0))
    assert got == pytest.approx(2 * 500e12 / 450e9, rel=1e-12)


def test_one_chosen_group_limits_a_token_to_one_of_two_nodes():
    """Two nodes, 8 expert groups, each token picks 1 group (k = 6): a group sits inside one node, so the token
    reaches 1 node although k and N would allow 2: node-limited (DeepSeek-V3 §3.2.2's dispatch)."""
    moe = MoE(num_experts=64, top_k=6, expert_ffn_hidden_size=1408, expert_groups=8, groups_per_token=1)
    assert nodes_per_token(moe, ep_nodes=2) == 1 and node_limited(moe, ep_nodes=2)


def test_per_model_computes_once_per_model_object_and_again_for_another():
    """memo.py: `per_model(fn)(m)` calls fn once for the last model object it saw (by identity) and again for any
    other object, even an equal one. (`per_model` runs at import time for compute.py's memoised functions, so
    mutmut maps its mutants to the first test that imports compute; this test calls it itself.)"""
    calls = []

    def count(model):
        calls.append(model)
        return len(calls)

    memoised = per_model(count)
    a, b = SimpleNamespace(n=1), SimpleNamespace(n=1)
    assert (memoised(a), memoised(a)) == (1, 1)
    assert memoised(b) == 2
    assert memoised(a) == 3
    assert calls == [a, b, a] and [id(m) for m in calls] == [id(a), id(b), id(a)]
    assert memoised.__name__ == "count"


# ---- context_parallel.py on round numbers (modern-training.md §2.3-§2.6) -----------------------------------------

# a = 8 query heads, g = 2 KV heads, d = 64; a made-up MLA with a = 8, d_qk = 32 + 16, d_v = 32
GQA = gpt_shape(num_layers=2, hidden_size=512, num_attention_heads=8, num_kv_heads=2, ffn_hidden_size=2048,
                vocab_size=1000)
SMALL_MLA = replace(GQA, mla=MLA(q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
                                 v_head_dim=32))
CP_LINK = Link(1e9, 1e-5)  # 1 GB/s, 10 µs: each message's latency shows in the sums below


@pytest.mark.parametrize("model,tp,expected", [(GQA, 1, 2 * 2 * 64), (GQA, 2, 2 * 1 * 64), (GQA, 4, 2 * 1 * 64),
                                               (SMALL_MLA, 2, 8 * (48 + 32) / 2)])
def test_kv_elements_per_token_per_tp_rank(model, tp, expected):
    """2·max(g/t, 1)·d (a KV head is replicated, not split, once t > g); MLA's expanded K and V a·(d_qk + d_v)/t."""
    assert kv_elements_per_token(model, tp=tp) == expected


@pytest.mark.parametrize("variant", ["p2p", "all_gather", "a2a"])
def test_cp_one_sends_nothing(variant):
    kw = dict(micro_batch_size=2, seq_length=4096, tp=1, cp=1)
    assert cp_traffic(GQA, variant=variant, **kw) == CpTraffic(0.0, 0.0, 0)
    assert cp_transfer_seconds(CpTraffic(1e6, 2e6, 1), variant=variant, cp=1, link=CP_LINK) == 0.0
    assert exposed_cp_seconds(CpTraffic(1e6, 2e6, 1), variant=variant, cp=1, link=CP_LINK,
                              attention_forward_seconds=0.0, attention_backward_seconds=0.0) == (0.0, 0.0)
    assert cp_buffer_bytes(GQA, variant=variant, **kw) == 0.0


@pytest.mark.parametrize("variant,cp,expected", [
    # (cp-1)·s_l·kv·β·b with s = 4096, kv = 256, β = 2, b = 2; backward 2x; cp-1 ring steps, one all-gather
    ("p2p", 2, CpTraffic(1 * 2048 * 256 * 2 * 2, 2 * 1 * 2048 * 256 * 2 * 2, 1)),
    ("p2p", 4, CpTraffic(3 * 1024 * 256 * 2 * 2, 2 * 3 * 1024 * 256 * 2 * 2, 3)),
    ("all_gather", 4, CpTraffic(3 * 1024 * 256 * 2 * 2, 2 * 3 * 1024 * 256 * 2 * 2, 1)),
    # Ulysses: (cp-1)/cp·s_l·(2a + 2g)·d·β·b = 3/4 x 1024 x 1280 x 2 x 2 each way, two all-to-alls
    ("a2a", 4, CpTraffic(3 / 4 * 1024 * 1280 * 2 * 2, 3 / 4 * 1024 * 1280 * 2 * 2, 2)),
])
def test_cp_traffic_by_variant(variant, cp, expected):
    """cp_traffic's docstring formulas (modern-training.md §2.3) on s = 4096, b = 2, t = 1."""
    got = cp_traffic(GQA, variant=variant, micro_batch_size=2, seq_length=4096, tp=1, cp=cp)
    assert got.forward_bytes == pytest.approx(expected.forward_bytes, rel=1e-12)
    assert got.backward_bytes == pytest.approx(expected.backward_bytes, rel=1e-12)
    assert got.messages_forward == expected.messages_forward


def _cp4(variant):
    return cp_traffic(GQA, variant=variant, micro_batch_size=2, seq_length=4096, tp=1, cp=4)


def test_cp_transfer_and_exposed_seconds_by_hand():
    """cp = 4 over 1 GB/s with 10 µs per message (alpha-beta, cost-models.md §3). Ring: 3 steps of 1/3 of the bytes
    each way, each hidden behind one of the cp equal attention steps. All-gather: the whole KV buffer
    (traffic x cp/(cp-1)) gathered, 2x in backward. Ulysses: two all-to-alls of half the per-rank buffer each way."""
    ring = _cp4("p2p")  # 3,145,728 B forward, 6,291,456 B backward
    fwd_step, bwd_step = 1e-5 + 1_048_576 / 1e9, 1e-5 + 2_097_152 / 1e9
    assert cp_transfer_seconds(ring, variant="p2p", cp=4, link=CP_LINK) == pytest.approx(3 * (fwd_step + bwd_step))
    fwd, bwd = exposed_cp_seconds(ring, variant="p2p", cp=4, link=CP_LINK, attention_forward_seconds=2e-3,
                                  attention_backward_seconds=4e-3)
    assert (fwd, bwd) == (pytest.approx(3 * (fwd_step - 2e-3 / 4)), pytest.approx(3 * (bwd_step - 4e-3 / 4)))
    gather = _cp4("all_gather")
    one = 3 * 1e-5 + 3 / 4 * (3_145_728 * 4 / 3) / 1e9  # ring all-gather of 4,194,304 B over 4 ranks
    assert exposed_cp_seconds(gather, variant="all_gather", cp=4, link=CP_LINK, attention_forward_seconds=1.0,
                              attention_backward_seconds=1.0) == (pytest.approx(one), pytest.approx(2 * one))
    assert cp_transfer_seconds(gather, variant="all_gather", cp=4, link=CP_LINK) == pytest.approx(3 * one)
    ulysses = _cp4("a2a")  # 3,932,160 B each way
    t = 2 * (3 * 1e-5 + 3 / 4 * (3_932_160 / 2 * 4 / 3) / 1e9)
    assert exposed_cp_seconds(ulysses, variant="a2a", cp=4, link=CP_LINK, attention_forward_seconds=1.0,
                              attention_backward_seconds=1.0) == (pytest.approx(t), pytest.approx(t))
    assert cp_transfer_seconds(ulysses, variant="a2a", cp=4, link=CP_LINK) == pytest.approx(2 * t)
    # cp = 2: one ring step each way, nothing to hide behind
    two = cp_traffic(GQA, variant="p2p", micro_batch_size=2, seq_length=4096, tp=1, cp=2)
    assert cp_transfer_seconds(two, variant="p2p", cp=2, link=CP_LINK) == pytest.approx(
        2e-5 + (2_097_152 + 4_194_304) / 1e9)
    assert exposed_cp_seconds(two, variant="p2p", cp=2, link=CP_LINK, attention_forward_seconds=0.0,
                              attention_backward_seconds=0.0) == (pytest.approx(1e-5 + 2_097_152 / 1e9),
                                                                 pytest.approx(1e-5 + 4_194_304 / 1e9))


@pytest.mark.parametrize("variant,expected", [("p2p", 3 * 1024 * 1024), ("all_gather", 4096 * 1024), ("a2a", 0.0)])
def test_cp_buffer_bytes_by_variant(variant, expected):
    """§2.5: kv·β·b = 256 x 2 x 2 = 1024 B per token; the ring holds 3 x s_l of it, all-gather the whole s, Ulysses
    nothing beyond its resharded tensors (s = 4096, cp = 4)."""
    assert cp_buffer_bytes(GQA, variant=variant, micro_batch_size=2, seq_length=4096, tp=1, cp=4) == expected


def test_cp_problems_name_the_field_and_the_numbers():
    """§2.6: the variant, seq_length divisible by 2 x cp x tp, and Ulysses' heads per TP rank divisible by cp."""
    assert cp_problems(GQA, variant="ring", cp=1, seq_length=4096, tp=1) == []
    assert cp_problems(GQA, variant="ring", cp=2, seq_length=4096, tp=1) == [
        ("cp_comm", "'ring' -> one of p2p, all_gather, a2a")]
    (field, msg), = cp_problems(GQA, variant="p2p", cp=4, seq_length=4100, tp=2)  # 4100 % 16 = 4 (% 4 = 0)
    assert field == "cp" and msg.startswith("4 -> seq_length (4100) must be divisible by 2 x cp x tp = 16 ")
    # tp 2: 4 query heads and 1 KV head per rank; 1 is not divisible by cp = 2
    (field, msg), = cp_problems(GQA, variant="a2a", cp=2, seq_length=4096, tp=2)
    assert field == "cp" and msg.startswith("2 -> a2a (Ulysses) needs query heads per TP rank (4) and KV heads per "
                                            "TP rank (1) divisible by cp ")
    assert cp_problems(GQA, variant="a2a", cp=2, seq_length=4096, tp=1) == []  # 8 and 2 heads


# ---- moe.py on round numbers (modern-training.md §3; Megatron theoretical_memory_usage.py) --------------------

# h = 512, SwiGLU, 4 layers of which the first is dense (f = 2048); 8 routed experts of f_e = 256, k = 2, shared
# experts of total width 384 with a gate, a router bias
SMALL_MOE = gpt_shape(num_layers=4, hidden_size=512, num_attention_heads=8, num_kv_heads=8, ffn_hidden_size=2048,
                      vocab_size=1000, swiglu=True, bias=False,
                      moe=MoE(num_experts=8, top_k=2, expert_ffn_hidden_size=256, shared_expert_ffn_hidden_size=384,
                              shared_expert_gate=True, router_bias=True, num_dense_layers=1))


@pytest.mark.parametrize("swiglu,expected", [(False, 2 * 512 * 2048 + 2048 + 512),
                                             (True, 3 * 512 * 2048 + 2 * 2048 + 512)])
def test_dense_mlp_parameters_with_gpt_biases(swiglu, expected):
    """GPT-style biases: fc1's f (two of them gated: 2f) and fc2's h, on top of 2 (or 3) h x f weights."""
    model = gpt_shape(hidden_size=512, ffn_hidden_size=2048, bias=True, swiglu=swiglu)
    got = mlp_parameter_counts(model)
    assert (got.dense_layer, got.moe_layer_total, got.moe_layer_active, got.moe_layer_routed) == (expected, 0, 0, 0)


def test_moe_layer_parameters_by_part():
    """Router h·E + E (bias), shared experts 3·h·384, shared gate h (Megatron theoretical_memory_usage.py
    L104-152); routed 8 x 3·h·f_e of which k = 2 are active."""
    expert = 3 * 512 * 256
    other = 512 * 8 + 8 + 3 * 512 * 384 + 512
    moe = SMALL_MOE.moe
    assert moe_layer_other_count(moe, hidden_size=512, mlp_matrix_count=3) == other
    plain = replace(moe, router_bias=False, shared_expert_gate=False)
    assert moe_layer_other_count(plain, hidden_size=512, mlp_matrix_count=3) == 512 * 8 + 3 * 512 * 384
    counts = mlp_parameter_counts(SMALL_MOE)
    assert (counts.dense_layer, counts.moe_layer_total, counts.moe_layer_active, counts.moe_layer_routed) == (
        3 * 512 * 2048, 8 * expert + other, 2 * expert + other, 8 * expert)


def test_mlp_forward_flops_per_token_average_dense_and_moe_layers():
    """2 FLOPs per weight: one dense layer 2·3·h·f, three MoE layers of 2 routed experts, the shared experts and the
    router GEMM 2·h·E, averaged over the 4 layers (moe.py mlp_forward_flops_per_token)."""
    dense = 2 * 3 * 512 * 2048
    routed, shared, router = 2 * 2 * 3 * 512 * 256, 2 * 3 * 512 * 384, 2 * 512 * 8
    assert mlp_forward_flops_per_token(SMALL_MOE) == (dense * 1 + (routed + shared + router) * 3) / 4


@pytest.mark.parametrize("imbalance,capacity,expected", [(1.5, None, 3000), (1.5, 1.25, 2500), (1.1, 2.0, 2200)])
def test_routed_tokens_per_rank_with_imbalance_and_capacity(imbalance, capacity, expected):
    """T·k·γ, capped at T·k·CF with a capacity factor: T = 1000, k = 2."""
    moe = replace(SMALL_MOE.moe, capacity_factor=capacity)
    assert routed_tokens_per_rank(moe, tokens=1000, imbalance=imbalance) == pytest.approx(expected, rel=1e-12)


GROUPED = MoE(num_experts=64, top_k=6, expert_ffn_hidden_size=1408, expert_groups=8, groups_per_token=2)


@pytest.mark.parametrize("moe,ep,per_node,intra,network", [
    (SMALL_MOE.moe, 8, 8, 6e6 * 7 / 8, 0.0),  # one node: the 7 other GPUs of the 8 over NVLink
    (SMALL_MOE.moe, 16, 8, 6e6 * 7 / 16, 6e6 * 8 / 16),  # two nodes, plain all-to-all
    (SMALL_MOE.moe, 4, 1, 0.0, 6e6 * 3 / 4),  # one rank a node: every remote copy crosses the network
    # node-limited (DeepSeek-V3 §3.2.2): 4 nodes, M = 2 chosen of 8 groups -> 2 nodes a token, once each over the
    # network for 3 of 4 nodes remote, c/k x 2 x 3/4; then 7/8 of the copies forwarded over NVLink
    (GROUPED, 32, 8, 6e6 * 7 / 8, 6e6 / 6 * 2 * 3 / 4),
])
def test_ep_traffic_by_placement(moe, ep, per_node, intra, network):
    got = ep_traffic(moe, copies_bytes=6e6, ep=ep, ranks_per_node=per_node)
    assert (got.intra_node_bytes, got.network_bytes) == (pytest.approx(intra, rel=1e-12),
                                                         pytest.approx(network, rel=1e-12))


def test_ep_all_to_all_seconds_slower_link_plus_a_latency_per_peer():
    """NVLink and the NICs at once: max(intra/B_intra, network/B_net) + (ep-1) x the larger latency."""
    intra, net = Link(100e9, 1e-5), Link(10e9, 2e-5)
    assert ep_all_to_all_seconds(EpTraffic(1e8, 1e8), ep=1, intra=intra, network_per_gpu=net) == 0.0
    assert ep_all_to_all_seconds(EpTraffic(1e8, 1e8), ep=2, intra=intra, network_per_gpu=net) == pytest.approx(
        2e-5 + 1e8 / 10e9)
    assert ep_all_to_all_seconds(EpTraffic(7e8, 0.0), ep=8, intra=intra, network_per_gpu=None) == pytest.approx(
        7 * 1e-5 + 7e8 / 100e9)
    assert ep_all_to_all_seconds(EpTraffic(0.0, 3e8), ep=4, intra=intra, network_per_gpu=net) == pytest.approx(
        3 * 2e-5 + 3e8 / 10e9)
    with pytest.raises(ValueError, match="^EP traffic crosses nodes but the cluster has no inter-node network$"):
        ep_all_to_all_seconds(EpTraffic(0.0, 3e8), ep=4, intra=intra, network_per_gpu=None)


def test_routed_router_and_dispatch_bytes():
    """§3.7: T·k·γ·(2h + 3 f_e/etp)·β saved for the routed tokens with Megatron's fused SwiGLU (4 f_e under
    autograd, which keeps the SiLU output too; 2 f_e without a gate); router logits and probabilities T·E·4·2; the
    dispatch receive buffer T·k·γ·h·β (h = 512, f_e = 256, 100 routed tokens)."""
    assert routed_activation_bytes(SMALL_MOE, routed_tokens=100, fused_swiglu=True, etp=2) == (
        100 * (2 * 512 + 3 * 256 / 2) * 2)
    assert routed_activation_bytes(SMALL_MOE, routed_tokens=100, fused_swiglu=False, etp=2) == (
        100 * (2 * 512 + 4 * 256 / 2) * 2)
    plain = replace(SMALL_MOE, swiglu=False)
    for fused in (True, False):
        assert routed_activation_bytes(plain, routed_tokens=100, fused_swiglu=fused) == 100 * (2 * 512 + 2 * 256) * 2
    assert router_activation_bytes(tokens=100, num_experts=8) == 100 * 8 * 4 * 2
    assert dispatch_buffer_bytes(routed_tokens=100, hidden_size=512) == 100 * 512 * 2
    assert dispatch_buffer_bytes(routed_tokens=100, hidden_size=512, activation_bytes=1) == 100 * 512


# ---- attention.py's biases and qk-norm (HF modules, modern-training.md §4.1, §6.1) ---------------------------


@pytest.mark.parametrize("kw,expected", [
    (dict(bias=True), (8 + 2 * 2) * 64 + 512),  # GPT: q, k, v (a + 2g)·d and o h
    (dict(bias=False), 0),
    (dict(bias=False, qkv_bias=True), (8 + 2 * 2) * 64),  # Qwen2
    (dict(bias=False, o_bias=True), 512),
    (dict(bias=False, qkv_bias=True, o_bias=True), (8 + 2 * 2) * 64 + 512),  # Llama attention_bias
    (dict(bias=False, qk_norm=True), 2 * 64),  # Qwen3: two RMSNorms of size d
    (dict(bias=True, qk_norm=True), (8 + 2 * 2) * 64 + 512 + 2 * 64),
])
def test_attention_biases_and_qk_norm_of_gqa(kw, expected):
    """a = 8, g = 2, d = 64, h = 512 (attention.py attention_extra_count's docstring)."""
    assert attention_extra_count(replace(GQA, **kw)) == expected


def test_layer_parameters_add_attention_mlp_and_norms():
    """One GPT-style GQA layer with biases: attention weights h(a·d + 2g·d) + a·d·h = 655,360, their biases
    1,280, the MLP 2·h·f + f + h = 2,099,712, two LayerNorms of 2h = 2,048 (compute.py layer_parameter_count)."""
    weights = 512 * (512 + 2 * 128) + 512 * 512
    assert layer_parameter_count(GQA) == (weights + 1280 + 2 * 512 * 2048 + 2048 + 512 + 2 * 2 * 512, 2 * 2 * 512)


# ---- pipeline.py's simulator: timelines worked out by hand (cost-models.md §5) ----------------------------------


def _ops(tl):
    return [(o.stage, o.kind, o.micro_batch, o.chunk, o.start, o.end) for o in tl.ops]


def test_gpipe_timeline_pays_the_p2p_delay_once_per_hop():
    """p = 2, m = 2, F = 1, B = 2, send/receive 0.5 s between stages: stage 1's forwards wait 0.5 s for stage 0's,
    stage 0's backwards 0.5 s for stage 1's; a stage's own F before its B costs nothing. 9 s without the delay
    (sum + (m-1) max, Narayanan §2.2.1) + 2 hops x 0.5 s."""
    tl = simulate(schedule="gpipe", pp=2, num_micro_batches=2, t_forward=1.0, t_backward=2.0, t_p2p=0.5)
    assert _ops(tl) == [(0, "F", 0, 0, 0.0, 1.0), (0, "F", 1, 0, 1.0, 2.0), (0, "B", 0, 0, 6.0, 8.0),
                        (0, "B", 1, 0, 8.0, 10.0), (1, "F", 0, 0, 1.5, 2.5), (1, "F", 1, 0, 2.5, 3.5),
                        (1, "B", 0, 0, 3.5, 5.5), (1, "B", 1, 0, 5.5, 7.5)]
    assert (tl.schedule, tl.pp, tl.num_micro_batches, tl.virtual_stages) == ("gpipe", 2, 2, 1)
    assert (tl.makespan, tl.busy_per_stage, tl.peak_in_flight_per_stage) == (10.0, (6.0, 6.0), (2.0, 2.0))


def test_interleaved_timeline_by_hand():
    """p = 2, v = 2, m = 2, F = 1 and B = 2 per stage (0.5 and 1 per chunk), 0.25 s per hop. Stage 0 runs all four
    forwards first (warm-up (p-r-1)·2 + (v-1)·p = 4), stage 1 two; chunk 1 of stage 0 waits for chunk 0 of the last
    stage, the last stage's chunk-0 backward for stage 0's chunk-1 backward (Narayanan §2.2.2's chunk order)."""
    tl = simulate(schedule="interleaved_1f1b", pp=2, num_micro_batches=2, virtual_stages=2, t_forward=1.0,
                  t_backward=2.0, t_p2p=0.25)
    assert _ops(tl) == [
        (0, "F", 0, 0, 0.0, 0.5), (0, "F", 1, 0, 0.5, 1.0), (0, "F", 0, 1, 1.5, 2.0), (0, "F", 1, 1, 2.0, 2.5),
        (0, "B", 0, 1, 4.0, 5.0), (0, "B", 1, 1, 5.5, 6.5), (0, "B", 0, 0, 6.5, 7.5), (0, "B", 1, 0, 8.0, 9.0),
        (1, "F", 0, 0, 0.75, 1.25), (1, "F", 1, 0, 1.25, 1.75), (1, "F", 0, 1, 2.25, 2.75), (1, "B", 0, 1, 2.75, 3.75),
        (1, "F", 1, 1, 3.75, 4.25), (1, "B", 1, 1, 4.25, 5.25), (1, "B", 0, 0, 5.25, 6.25), (1, "B", 1, 0, 6.75, 7.75)]
    assert (tl.makespan, tl.busy_per_stage, tl.peak_in_flight_per_stage) == (9.0, (6.0, 6.0), (4 / 2, 3 / 2))
    assert (tl.schedule, tl.virtual_stages) == ("interleaved_1f1b", 2)


def test_interleaved_more_micro_batches_than_stages_matches_the_closed_form():
    """m = 4 > p = 2: the second group of micro-batches (2 and 3) follows the first; equal stages of 3 s:
    m·t + (p·t - t)/v = 12 + 3/2 (Narayanan §2.2.2), every (micro-batch, chunk) once per stage and kind."""
    tl = simulate(schedule="interleaved_1f1b", pp=2, num_micro_batches=4, virtual_stages=2)
    assert tl.makespan == 13.5
    for r in range(2):
        for kind in "FB":
            assert sorted((o.micro_batch, o.chunk) for o in tl.ops if o.stage == r and o.kind == kind) == [
                (mb, c) for mb in range(4) for c in range(2)]


@pytest.mark.parametrize("t_weight,t_p2p,expected", [
    # default W = B/2 = 1 (the input-gradient part 1): m·3 + (p-1)·max(0, 3 - 2·1) = 7 (Qi et al. Table 2)
    (None, 0.0, [(0, "F", 0, 0.0, 1.0), (0, "F", 1, 1.0, 2.0), (0, "B", 0, 3.0, 4.0), (0, "W", 0, 4.0, 5.0),
                 (0, "B", 1, 5.0, 6.0), (0, "W", 1, 6.0, 7.0), (1, "F", 0, 1.0, 2.0), (1, "B", 0, 2.0, 3.0),
                 (1, "F", 1, 3.0, 4.0), (1, "B", 1, 4.0, 5.0), (1, "W", 0, 5.0, 6.0), (1, "W", 1, 6.0, 7.0)]),
    # W = 0.5, B = 1.5: stage 0 fills 5.0-5.5 with W0 while B1 waits for stage 1 (ready at 6.0)
    (0.5, 0.0, [(0, "F", 0, 0.0, 1.0), (0, "F", 1, 1.0, 2.0), (0, "B", 0, 3.5, 5.0), (0, "W", 0, 5.0, 5.5),
                (0, "B", 1, 6.0, 7.5), (0, "W", 1, 7.5, 8.0), (1, "F", 0, 1.0, 2.0), (1, "B", 0, 2.0, 3.5),
                (1, "F", 1, 3.5, 4.5), (1, "B", 1, 4.5, 6.0), (1, "W", 0, 6.0, 6.5), (1, "W", 1, 6.5, 7.0)]),
    # 0.25 s per hop: stage 1's forwards and stage 0's backwards wait for it; the last stage's B and stage 0's F not
    (None, 0.25, [(0, "F", 0, 0.0, 1.0), (0, "F", 1, 1.0, 2.0), (0, "B", 0, 3.5, 4.5), (0, "W", 0, 4.5, 5.5),
                  (0, "B", 1, 5.5, 6.5), (0, "W", 1, 6.5, 7.5), (1, "F", 0, 1.25, 2.25), (1, "B", 0, 2.25, 3.25),
                  (1, "F", 1, 3.25, 4.25), (1, "B", 1, 4.25, 5.25), (1, "W", 0, 5.25, 6.25), (1, "W", 1, 6.25, 7.25)]),
])
def test_zero_bubble_timeline_by_hand(t_weight, t_p2p, expected):
    """ZB-H1 list scheduling (pipeline.py _simulate_zero_bubble; Qi et al. 2023 §3), p = 2, m = 2, F = 1, B + W = 2:
    B first when it can start first, then F (at most p - stage micro-batches in flight), W only in idle time."""
    tl = simulate(schedule="zero_bubble", pp=2, num_micro_batches=2, t_forward=1.0, t_backward=2.0,
                  t_weight=t_weight, t_p2p=t_p2p)
    assert [(o.stage, o.kind, o.micro_batch, o.start, o.end) for o in tl.ops] == expected
    assert all(o.chunk == 0 for o in tl.ops)
    assert (tl.schedule, tl.num_micro_batches, tl.virtual_stages) == ("zero_bubble", 2, 1)
    assert tl.makespan == max(op[-1] for op in expected) and tl.peak_in_flight_per_stage == (2.0, 1.0)


def test_simulate_defaults_naive_and_virtual_stages_only_for_interleaving():
    """v is 1 unless told and only interleaving reads it; naive is one micro-batch of m x the work, and holds
    all m micro-batches' activations on every stage (peak m)."""
    assert simulate(schedule="interleaved_1f1b", pp=2, num_micro_batches=2).virtual_stages == 1
    assert simulate(schedule="1f1b", pp=2, num_micro_batches=4, virtual_stages=2) == simulate(
        schedule="1f1b", pp=2, num_micro_batches=4)
    naive = simulate(schedule="naive", pp=2, num_micro_batches=4)
    assert naive.makespan == 4 * (1 + 2) * 2 and naive.peak_in_flight_per_stage == (4.0, 4.0)
    assert (naive.schedule, naive.num_micro_batches) == ("naive", 4)
    with pytest.raises(ValueError, match="^no static order for schedule 'bogus'$"):
        simulate(schedule="bogus", pp=2, num_micro_batches=2)


def test_peak_in_flight_counts_forwards_started_less_backwards_done():
    """One stage running F0, B0, F1, F2: in flight 1, 0, 1, 2, so the peak is 2 (pipeline.py _timeline)."""
    ops = [Op(0, "F", 0, 0, 0.0, 1.0), Op(0, "B", 0, 0, 1.0, 2.0), Op(0, "F", 1, 0, 2.0, 3.0),
           Op(0, "F", 2, 0, 3.0, 4.0)]
    assert _timeline("1f1b", 1, 3, 1, ops).peak_in_flight_per_stage == (2.0,)


def test_pipeline_makespan_defaults_and_unknown_schedule():
    """Interleaving with v = 1 unless told: m·max + (sum - max)/1 = 4 x 2 + 1."""
    assert pipeline_makespan(schedule="interleaved_1f1b", stage_seconds=[1.0, 2.0], num_micro_batches=4) == (
        9.0, 8.0, 1)
    with pytest.raises(ValueError, match="^unknown schedule 'bogus'$"):
        pipeline_makespan(schedule="bogus", stage_seconds=[1.0], num_micro_batches=1)


# ---- extensions.py: what CP, EP and FP8 add to one layer (modern-training.md §2-§3, §1) ----------------------

FP32_LONG = replace(BF16, seq_length=4096, activation_bytes=4)


@pytest.mark.parametrize("variant", ["p2p", "all_gather", "a2a"])
def test_cp_terms_attention_backward_is_twice_the_forward(variant):
    """_cp_terms: the exchange of b = 2 sequences of s = 4096 fp32 tokens over cp = 4 ranks, tp = 2 (the CP group
    of 4 ranks 2 apart fills one 8-GPU node: NVLink, 200 GB/s, 10 µs); exposed against the attention core
    forward (1e-5 s per ring step: core/cp) and backward at 2x the forward (Korthikanti's 2:1); totals before any
    overlap; the forward parts; the receive buffers. Without CP, nothing."""
    lay = Layout(dp=1, tp=2, pp=1, cp=4, cp_comm=variant, micro_batch_size=2)
    core = 4e-5
    kw = dict(micro_batch_size=2, seq_length=4096, tp=2, cp=4, activation_bytes=4)
    traffic = cp_traffic(GQA, variant=variant, **kw)
    link = Link(200e9, 1e-5)
    fwd, bwd = exposed_cp_seconds(traffic, variant=variant, cp=4, link=link, attention_forward_seconds=core,
                                  attention_backward_seconds=2 * core)
    fwd_total, _ = exposed_cp_seconds(traffic, variant=variant, cp=4, link=link, attention_forward_seconds=0.0,
                                      attention_backward_seconds=0.0)
    got = _cp_terms(GQA, FP32_LONG, HW, lay, core)
    assert got == (fwd + bwd, cp_buffer_bytes(GQA, variant=variant, **kw),
                   cp_transfer_seconds(traffic, variant=variant, cp=4, link=link), fwd, fwd_total)
    if variant == "p2p":  # 3 steps of 1,048,576 B (fp32 K and V of 1024 tokens x 128 elements x 2 sequences)
        step = 1e-5 + 1_048_576 / 200e9
        assert fwd == pytest.approx(3 * (step - core / 4)) and fwd_total == pytest.approx(3 * step)
        assert bwd == pytest.approx(3 * (1e-5 + 2 * 1_048_576 / 200e9 - 2 * core / 4))
    assert _cp_terms(GQA, FP32_LONG, HW, replace(lay, cp=1), core) == (0.0, 0.0, 0.0, 0.0, 0.0)


# SMALL_MOE: 3 of 4 layers MoE (frac 0.75), 8 experts, k = 2, h = 512, f_e = 256, shared 384, SwiGLU
MOE_KNOBS = Knobs(moe_imbalance=1.25, ep_overlap_fraction=0.2)


def test_ep_terms_within_one_node_by_hand():
    """ep = 8 on one 8-GPU node, b·s = 1024 tokens, γ = 1.25: the all-to-all moves 2 passes x T·γ x k x h x (2 + 2) B
    = 10,485,760 B, 7/8 of it to the node's other GPUs over NVLink (moe.py ep_traffic), plus 7 latencies; exposed
    (1 - 0.2) x 0.75 of it, 0.75 before overlap (frac of MoE layers); the forward pass half the bytes. Memory: the
    routed tokens' activations T·k·γ·(2h + 4 f_e)·2 (SwiGLU under autograd, Knobs' default), the shared expert's
    8·384 B and the router's T·E·8 replace the dense MLP's 8·f B per token (§3.7); the dispatch buffer holds
    T·k·γ·h·2 B."""
    lay = Layout(dp=8, tp=1, pp=1, ep=8)
    got = _ep_terms(SMALL_MOE, BF16, HW, lay, MOE_KNOBS, 1024.0)
    seconds = 7 * 1e-5 + 10_485_760 * 7 / 8 / 200e9
    forward = 7 * 1e-5 + 10_485_760 / 2 * 7 / 8 / 200e9
    routed = 1024 * 2 * 1.25
    moe_mlp = routed * (2 * 512 + 4 * 256) * 2 + 1024 * 8 * 384 * 2 / 2 + 1024 * 8 * 4 * 2
    dense_mlp = 1024 * 8 * 2048 * 2 / 2
    assert got == (pytest.approx(seconds * 0.8 * 0.75), pytest.approx((moe_mlp - dense_mlp) * 0.75),
                   routed * 512 * 2, pytest.approx(seconds * 0.75), pytest.approx(forward * 0.8 * 0.75),
                   pytest.approx(forward * 0.75))
    assert _ep_terms(GQA, BF16, HW, lay, MOE_KNOBS, 1024.0) == (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def test_ep_terms_across_nodes_with_sequence_parallel_etp_and_fp32():
    """ep = 16, etp = 2 on 8-GPU nodes: 4 EP ranks a node (etp apart), 4 nodes; sequence parallelism gives the MoE
    layer T/tp = 512 tokens; fp32: 2 x 640 x 2 x 512 x (4 + 4) = 10,485,760 B, 3/16 on NVLink, 12/16 over the
    node's share of the NICs (8 x 25 GB/s / 8 GPUs = 25 GB/s), 15 latencies of 10 µs. A plain MLP saves 4·f B per
    token (2h + 2 f_e/etp for the routed tokens)."""
    moe = replace(SMALL_MOE, swiglu=False)
    lay = Layout(dp=16, tp=2, pp=1, ep=16, etp=2, sequence_parallel=True)
    got = _ep_terms(moe, FP32_LONG, HW, lay, MOE_KNOBS, 1024.0)
    seconds = 15 * 1e-5 + 10_485_760 * 12 / 16 / 25e9
    forward = 15 * 1e-5 + 10_485_760 / 2 * 12 / 16 / 25e9
    routed = 512 * 2 * 1.25
    moe_mlp = routed * (2 * 512 + 2 * 256 / 2) * 4 + 1024 * 4 * 384 * 4 / 2 / 2 + 512 * 8 * 4 * 2
    dense_mlp = 1024 * 4 * 2048 * 4 / 2 / 2
    assert got == (pytest.approx(seconds * 0.6), pytest.approx((moe_mlp - dense_mlp) * 0.75), routed * 512 * 4,
                   pytest.approx(seconds * 0.75), pytest.approx(forward * 0.6), pytest.approx(forward * 0.75))


@pytest.mark.parametrize("ep,seconds,buffer", [(1, 0.0, 0.0), (2, 1e-5 + 10_485_760 / 2 / 200e9, 2560 * 512 * 2)])
def test_ep_terms_at_ep_one_and_two(ep, seconds, buffer):
    """No all-to-all and no dispatch buffer at ep = 1 (the activation delta stays); at ep = 2 half the copies go to
    the other GPU, one latency."""
    got = _ep_terms(SMALL_MOE, BF16, HW, Layout(dp=2, tp=1, pp=1, ep=ep), MOE_KNOBS, 1024.0)
    assert got.exposed_seconds == pytest.approx(seconds * 0.6, rel=1e-12, abs=0) and got.buffer_bytes == buffer
    assert got.activation_delta_bytes == pytest.approx(
        (2560 * (2 * 512 + 4 * 256) * 2 + 1024 * 8 * 384 + 1024 * 64 - 1024 * 8 * 2048) * 0.75)


def test_ep_seconds_fp8_dispatch_whole_node_experts_and_one_gpu_nodes():
    """FP8 blockwise dispatch sends 1 B + 1x128 FP32 scales per element, the combine stays in BF16 (DeepSeek-V3
    §3.3); expert TP filling a node puts one EP rank per node; one GPU per node: no NVLink, every copy but the
    local one over the network at nics x 25 GB/s."""
    fp8 = replace(BF16, fp8_recipe="blockwise")
    lay = Layout(dp=8, tp=1, pp=1, ep=8)
    c = 2 * 1000 * 2 * 512 * (1 + 4 / 128 + 2)
    assert _ep_seconds(SMALL_MOE.moe, fp8, HW, lay, tokens=1000, hidden_size=512) == pytest.approx(
        7e-5 + c * 7 / 8 / 200e9, rel=1e-12)
    assert _ep_seconds(SMALL_MOE.moe, replace(BF16, fp8_recipe="tensorwise"), HW, lay, tokens=1000,
                       hidden_size=512) == pytest.approx(7e-5 + 2 * 1000 * 2 * 512 * 4 * 7 / 8 / 200e9, rel=1e-12)
    whole = Layout(dp=16, tp=8, pp=1, ep=2, etp=8)  # etp = 8 = GPUs a node: 2 EP ranks, 2 nodes
    c = 2 * 1000 * 2 * 512 * 4
    assert _ep_seconds(SMALL_MOE.moe, BF16, HW, whole, tokens=1000, hidden_size=512) == pytest.approx(
        1e-5 + c / 2 / 25e9, rel=1e-12)
    single = replace(HW, gpus_per_node=1, intra_node=None, intra_node_kind="none", nics_per_node=1)
    assert _ep_seconds(SMALL_MOE.moe, BF16, single, Layout(dp=4, tp=1, pp=1, ep=4), tokens=1000,
                       hidden_size=512) == pytest.approx(3 * 5e-6 + c * 3 / 4 / 25e9, rel=1e-12)
    assert _ep_seconds(SMALL_MOE.moe, BF16, HW, Layout(dp=8, tp=1, pp=1, ep=1), tokens=1000, hidden_size=512) == 0


def test_expert_kernel_terms_need_moe_the_knob_and_a_rate():
    """ep = 2: 4 local experts x (2 + 4) kernels (BF16) or (4 + 6) (FP8) x 0.5 GFLOP at the GPU's saturated GEMM
    rate (peak x MAMF fraction x end-to-end factor, whatever the layer's achieved rate), x 0.75 (frac)."""
    knobs = Knobs(moe_expert_kernel_gflop=0.5)
    lay = Layout(dp=2, tp=1, pp=1, ep=2)
    k = 0.5e9 / (HW.peak_flops_per_second * HW.matmul_efficiency * knobs.end_to_end_efficiency)
    assert _expert_kernel_terms(SMALL_MOE, BF16, HW, lay, knobs, 4e14) == (pytest.approx(4 * 6 * k * 0.75, rel=1e-12, abs=0),
                                                                     pytest.approx(4 * 2 * k * 0.75, rel=1e-12, abs=0))
    fp8 = replace(BF16, fp8_recipe="tensorwise")
    assert _expert_kernel_terms(SMALL_MOE, fp8, HW, lay, knobs, 4e14) == (pytest.approx(4 * 10 * k * 0.75, rel=1e-12, abs=0),
                                                                    pytest.approx(4 * 4 * k * 0.75, rel=1e-12, abs=0))
    assert _expert_kernel_terms(SMALL_MOE, BF16, HW, lay, Knobs(), 4e14) == (0.0, 0.0)
    assert _expert_kernel_terms(SMALL_MOE, BF16, HW, lay, knobs, None) == (0.0, 0.0)
    assert _expert_kernel_terms(GQA, BF16, HW, lay, knobs, 4e14) == (0.0, 0.0)


@pytest.mark.parametrize("swiglu", [True, False])
def test_grouped_gemm_slowdown_by_the_size_curve(swiglu):
    """tp = 2, etp = 2, ep = 4, 1024 tokens: a local expert's slice has T·k·ep/E = 1024 rows, its FC1
    2·1024·512·(2)·256/etp FLOPs against the dense FC1 2·1024·512·2048/tp; the efficiency x/(x + 2 GFLOP) at each."""
    model = replace(SMALL_MOE, swiglu=swiglu)
    lay = Layout(dp=8, tp=2, pp=1, ep=4, etp=2)
    gated = 2 if swiglu else 1
    expert = 2 * 1024 * 512 * gated * 256 / 2
    dense = 2 * 1024 * 512 * 2048 / 2
    expected = (dense / (dense + 2e9)) / (expert / (expert + 2e9))
    assert _grouped_gemm_slowdown(model, lay, Knobs(), 1024.0) == pytest.approx(expected, rel=1e-13)


def test_layer_params_shard_dense_by_tp_and_experts_by_ep_times_etp():
    """SMALL_MOE's mean layer 18,568,728 / 4 = 4,642,182 parameters: routed experts 8 x 3·512·256 x 0.75
    = 2,359,296, norms 2 x 2h = 2,048, the rest dense; tp = 2, ep x etp = 4 x 2."""
    params, experts = _layer_params(SMALL_MOE, Layout(dp=8, tp=2, pp=1, ep=4, etp=2))
    routed = 8 * 3 * 512 * 256 * 0.75
    assert parameter_counts(SMALL_MOE).layers == 18_568_728
    assert experts == routed / 8
    assert params == pytest.approx((4_642_182 - routed - 2048) / 2 + routed / 8 + 2048, rel=1e-15)


@pytest.mark.parametrize("lay,edp", [(Layout(dp=4, tp=2, pp=1, cp=2, ep=4, etp=2), 2),
                                      (Layout(dp=2, tp=2, pp=1, ep=2, etp=2), 1),
                                      (Layout(dp=8, tp=1, pp=1, cp=2, ep=4), 4)])
def test_expert_data_parallel_is_dp_cp_tp_over_ep_etp(lay, edp):
    assert expert_data_parallel(lay) == edp


def test_fp8_terms_by_gemm():
    """The four Linear GEMMs of a layer at their FP8 speed-up by size (fp8.py fp8_gemm_speedup: above ~8 GFLOP, so
    65,536 tokens), QKV and projection on the layer's tokens, FC1/FC2 on a local expert's T·k·ep/E rows (MoE),
    widths split by tp; the casts of fresh operands (fp8.py quantization_seconds). Without a recipe: factor 1."""
    tokens = 65536

    def expected(shapes, token_rows):
        flops = [2 * r * k * n for (k, n), r in zip(shapes, token_rows, strict=True)]
        factor = sum(f / fp8_gemm_speedup(gemm_flops=f, recipe="tensorwise") for f in flops) / sum(flops)
        fwd, bwd = quantization_seconds(tokens=tokens, shapes=shapes, recipe="tensorwise", hbm_bytes_per_second=2e12)
        return (pytest.approx(factor, rel=1e-13), pytest.approx(fwd + bwd, rel=1e-13),
                pytest.approx(fwd, rel=1e-13))
    fp8 = replace(BF16, fp8_recipe="tensorwise")
    lay = Layout(dp=2, tp=2, pp=1, ep=2)
    # GQA (a = 8, g = 2, d = 64, plain MLP f = 2048), tp 2: 25.8, 17.2, 68.7 and 68.7 GFLOP
    dense = [(512, (512 + 2 * 128) // 2), (256, 512), (512, 2048 // 2), (1024, 512)]
    got = _fp8_terms(GQA, fp8, HW, lay, float(tokens))
    assert got == expected(dense, [tokens] * 4) and got[0] < 1 / 1.2
    # SMALL_MOE (a = g = 8, SwiGLU, f_e = 256): 65,536 x 2 x 2 / 8 = 32,768 rows per local expert
    moe = [(512, (512 + 2 * 512) // 2), (256, 512), (512, 2 * 256 // 2), (128, 512)]
    assert _fp8_terms(SMALL_MOE, fp8, HW, lay, float(tokens)) == expected(moe, [tokens, tokens, tokens // 2,
                                                                                tokens // 2])
    assert _fp8_terms(GQA, BF16, HW, lay, float(tokens)) == (1.0, 0.0, 0.0)


def test_fp8_terms_keep_at_least_one_expert_row():
    """h = 4096, 1024 experts, k = 1: 1000 tokens give 1000 / 1024 rows per expert, floored at one row; the QKV
    (2·1000·4096·6144 = 50 GFLOP) and projection GEMMs are large enough to run faster in FP8."""
    model = replace(SMALL_MOE, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
                    moe=replace(SMALL_MOE.moe, num_experts=1024, top_k=1))
    fp8 = replace(BF16, fp8_recipe="tensorwise")
    flops = [2 * 1000 * 4096 * 6144, 2 * 1000 * 4096 * 4096, 2 * 1 * 4096 * 512, 2 * 1 * 256 * 4096]
    factor = sum(f / fp8_gemm_speedup(gemm_flops=f, recipe="tensorwise") for f in flops) / sum(flops)
    assert _fp8_terms(model, fp8, HW, Layout(dp=1, tp=1, pp=1), 1000.0)[0] == pytest.approx(factor, rel=1e-13)


def test_layer_extras_composes_its_terms():
    """Everything at once (SMALL_MOE, FP8 tensorwise with FP8 parameter gathers, cp 2 ring, ep 2, tp 2 with
    sequence parallelism, per-expert kernels): each field is its term function's value. The expert GEMMs' share
    of the layer's FLOPs, 2·T·k·(3·h·f_e)/tp x 0.75, scales their imbalance x grouped-GEMM slowdown into the GEMM
    time factor; FP8 saves 1 B per element of the four Linear inputs (h/tp under SP, a·d/tp, k·f_e/tp), and of the
    experts' FC1 input for every routed copy beyond one per token ((k·γ - 1)·T/tp rows of h under SP, x 0.75), and
    keeps no FP8 weight copies with FP8 parameter gathers (fp8.py)."""
    training = replace(BF16, seq_length=65536, fp8_recipe="tensorwise", fp8_param_gather=True)
    lay = Layout(dp=4, tp=2, pp=1, cp=2, ep=2, micro_batch_size=2, sequence_parallel=True)
    knobs = replace(MOE_KNOBS, moe_expert_kernel_gflop=0.5)
    gemm = 4e12
    got = layer_extras(SMALL_MOE, training, HW, lay, knobs, gemm_flops_per_gpu=gemm, core_seconds=1e-9,
                       rate_flops_per_second=4e14)
    tokens = 2 * 65536 / 2
    factor, quant, quant_fwd = _fp8_terms(SMALL_MOE, training, HW, lay, tokens)
    share = 2 * tokens * 2 * (3 * 512 * 256) / 2 * 0.75 / gemm
    factor *= 1 + (1.25 * _grouped_gemm_slowdown(SMALL_MOE, lay, knobs, tokens) - 1) * share
    cp = _cp_terms(SMALL_MOE, training, HW, lay, 1e-9)
    ep = _ep_terms(SMALL_MOE, training, HW, lay, knobs, tokens)
    kernels, kernels_fwd = _expert_kernel_terms(SMALL_MOE, training, HW, lay, knobs, 4e14)
    params, experts = _layer_params(SMALL_MOE, lay)
    saving = tokens * (2 * 512 / 2 + 512 / 2 + 256 * 2 / 2) + (2 * 1.25 - 1) * tokens / 2 * 512 * 0.75
    assert cp.buffer_bytes > 0 and ep.buffer_bytes > 0 and kernels > 0 and 0 < share < 1
    assert cp.exposed_forward_seconds > 0 and factor != 1.0 and _fp8_terms(SMALL_MOE, training, HW, lay, tokens)[0] < 1
    assert got == LayerExtras(
        tokens, pytest.approx(factor, rel=1e-13), cp.exposed_seconds, ep.exposed_seconds, quant,
        ep.activation_delta_bytes - saving, cp.buffer_bytes + ep.buffer_bytes, params, experts, 0.0,
        cp.total_seconds, ep.total_seconds, cp.exposed_forward_seconds, ep.exposed_forward_seconds, quant_fwd,
        cp.total_forward_seconds, ep.total_forward_seconds, kernels, kernels_fwd)
    # FP8 weight copies without FP8 parameter gathers: +2 B per non-norm parameter; without SP the inputs are whole
    plain = replace(training, fp8_param_gather=False)
    no_sp = replace(lay, sequence_parallel=False)
    got = layer_extras(SMALL_MOE, plain, HW, no_sp, knobs, gemm_flops_per_gpu=gemm, core_seconds=1e-9,
                       rate_flops_per_second=4e14)
    params, _ = _layer_params(SMALL_MOE, no_sp)
    assert got.fp8_weight_bytes == fp8_weight_extra_bytes(fp8_params=params - 2048, recipe="tensorwise")
    assert got.activation_delta_bytes == pytest.approx(
        _ep_terms(SMALL_MOE, plain, HW, no_sp, knobs, tokens).activation_delta_bytes
        - tokens * (2 * 512 + 512 / 2 + 256 * 2 / 2) - (2 * 1.25 - 1) * tokens * 512 * 0.75, rel=1e-13)


def test_layer_extras_expert_share_is_capped_at_the_whole_layer():
    """share = min(1, expert FLOPs / the layer's GEMM FLOPs): with a layer of 1 MFLOP the experts are all of it."""
    lay = Layout(dp=8, tp=1, pp=1, ep=8)
    got = layer_extras(SMALL_MOE, BF16, HW, lay, MOE_KNOBS, gemm_flops_per_gpu=1e6, core_seconds=1e-4)
    assert got.gemm_time_factor == pytest.approx(1.25 * _grouped_gemm_slowdown(SMALL_MOE, lay, MOE_KNOBS, 1024.0),
                                                 rel=1e-13)
    assert got.tokens_per_rank == 1024.0 and got.expert_kernel_seconds == 0.0


def test_recomputed_repeats_what_the_recomputed_forward_runs():
    """full: the forward's CP and EP exchanges, FP8 casts and per-expert kernels run again; selective: only the
    attention core's CP exchange; none: nothing (extensions.py LayerExtras.recomputed)."""
    ex = LayerExtras(1.0, 1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, cp_total_seconds=5.0, ep_total_seconds=6.0,
                     cp_forward_seconds=0.5, ep_forward_seconds=0.25, fp8_quant_forward_seconds=0.125,
                     cp_forward_total_seconds=0.75, ep_forward_total_seconds=0.375, expert_kernel_seconds=7.0,
                     expert_kernel_forward_seconds=0.0625)
    assert ex.recomputed("full") == Recomputed(0.5, 0.25, 0.125 + 0.0625, 0.75, 0.375)
    assert ex.recomputed("selective") == Recomputed(0.5, 0.0, 0.0, 0.75, 0.0)
    assert ex.recomputed("none") == Recomputed(0.0, 0.0, 0.0, 0.0, 0.0)
    assert ex.recomputed("full").seconds == 0.5 + 0.25 + 0.1875 and ex.extra_seconds == 2.0 + 3.0 + 4.0 + 7.0


def test_core_attention_flops_of_mla_use_its_head_sizes():
    """Full s² convention 2·T·s·a·(d_qk + d_v) (attention.py core_attention_forward_flops): a = 8, d_qk = 48,
    d_v = 32; without a window (sliding_window_layers alone) the whole core."""
    assert core_attention_forward_flops(SMALL_MLA, tokens=1024, seq_length=1024) == 2.0 * 1024 * 1024 * 8 * (48 + 32)
    assert core_attention_forward_flops(replace(GQA, sliding_window_layers=2), tokens=1024, seq_length=1024) == (
        2.0 * 1024 * 1024 * 8 * 2 * 64)


def test_ep_traffic_inside_one_node_even_with_node_limited_routing():
    """ep = 8 on one 8-GPU node: 7/8 of the copies over NVLink and none over the network, whatever the routing's
    group limit (one group a token would limit it to one node of two, were there two)."""
    one_group = replace(GROUPED, groups_per_token=1)
    assert ep_traffic(one_group, copies_bytes=6e6, ep=8, ranks_per_node=8) == EpTraffic(6e6 * 7 / 8, 0.0)


# ---- memory.py: torch-native SP's gathered inputs, score-matrix traffic, micro-batches in flight ------------------


@pytest.mark.parametrize("tp,sp,expected", [(4, True, 2 * 1024 * 2 * 512 * 2 * (1 - 1 / 4)),
                                            (2, True, 2 * 1024 * 2 * 512 * 2 * (1 - 1 / 2)),
                                            (1, True, 0.0), (4, False, 0.0)])
def test_sp_gathered_inputs_are_2sbh_times_one_minus_one_over_tp(tp, sp, expected):
    """memory.py sp_gathered_input_bytes: the QKV and FC1 inputs kept all-gathered, 2·s·b·h·β·(1 - 1/t) beyond
    Megatron's sharded ones (s = 1024, b = 2, h = 512, β = 2 by default); nothing without SP or TP."""
    assert sp_gathered_input_bytes(seq_length=1024, micro_batch_size=2, hidden_size=512, tp=tp,
                                   sequence_parallel=sp) == expected


def test_attention_score_traffic_scales_with_the_micro_batch():
    """(5β + 4β + 2) B per score element with dropout (memory.py attention_score_traffic_bytes: 20 B at β = 2),
    a·s²·b/t elements: a = 8, s = 1024, b = 2, t = 2."""
    assert attention_score_traffic_bytes(GQA, seq_length=1024, micro_batch_size=2, tp=2) == 20 * 8 * 1024 ** 2 * 2 / 2


def test_in_flight_per_stage_defaults_to_every_stage_and_one_virtual_stage():
    """1F1B: min(m, p - stage) for stages 0..p-1 (Narayanan §2.2.1); interleaving without virtual stages given
    is 1F1B."""
    assert in_flight_per_stage(schedule="1f1b", pp=4, num_micro_batches=8) == [4.0, 3.0, 2.0, 1.0]
    assert in_flight_per_stage(schedule="interleaved_1f1b", pp=4, num_micro_batches=8) == [4.0, 3.0, 2.0, 1.0]


# ---- stage.py's per-layer costs (cost-models.md §2-§4; Narayanan §3.2; Korthikanti §4) ---------------------------


def test_async_tp_all_reduces_hide_behind_their_weight_gradient_gemms():
    """Megatron's async TP all-reduce (stage.py tp_backward_hidden_seconds): QKV's and FC1's backward all-reduces
    each hide behind their own weight-gradient GEMM, 2·T·h·(a + 2g)·d/t and 2·T·h·f(x2 gated)/t FLOPs, at most the
    exposed all-reduce (1 - 0.25 of 1 ms); nothing without the knob, TP or an exposed part."""
    on = Knobs(tp_async_grad_allreduce=True, tp_overlap_fraction=0.25)
    kw = dict(tokens=1024, tp=2, all_reduce_seconds=1e-3)
    qkv = 2 * 1024 * 512 * (8 + 2 * 4) * 64 / 2
    fc1 = 2 * 1024 * 512 * 1536 * 2 / 2
    assert tp_backward_hidden_seconds(SWIGLU, on, rate_flops_per_second=4e12, **kw) == pytest.approx(
        qkv / 4e12 + fc1 / 4e12, rel=1e-12)
    assert tp_backward_hidden_seconds(SMALL, on, rate_flops_per_second=1e12, **kw) == pytest.approx(2 * 0.75e-3)
    assert tp_backward_hidden_seconds(SMALL, Knobs(tp_overlap_fraction=0.25), rate_flops_per_second=1e12, **kw) == 0
    assert tp_backward_hidden_seconds(SMALL, on, rate_flops_per_second=1e12, tokens=1024, tp=1,
                                      all_reduce_seconds=1e-3) == 0
    assert tp_backward_hidden_seconds(SMALL, replace(on, tp_overlap_fraction=1.0), rate_flops_per_second=1e12,
                                      **kw) == 0


@pytest.mark.parametrize("tp,expected", [(1, 0.0), (2, 2 * 1e-5 + 2 * 1 / 2 * 2_097_152 / 200e9),
                                         (8, 14 * 1e-5 + 14 / 8 * 2_097_152 / 200e9)])
def test_tp_all_reduce_of_bsh_over_the_node(tp, expected):
    """One ring all-reduce of b·s·h·β = 1 x 1024 x 512 x 4 B (fp32) over tp adjacent ranks of a node (NVLink,
    200 GB/s, 10 µs): 2(n-1) steps, 2(n-1)/n of the bytes."""
    got = tp_all_reduce_seconds(HW, micro_batch_size=1, seq_length=1024, hidden_size=512, tp=tp, activation_bytes=4)
    assert got == pytest.approx(expected, rel=1e-12, abs=0)


def test_elementwise_seconds_charge_the_kept_bytes_and_the_score_kernels():
    """stage.py elementwise_forward_seconds: 10 B moved per byte kept of the s·b·h activations (the kept a·s² score
    bytes taken out), plus the score kernels' own traffic, over HBM, the forward's third of fwd + bwd (tp 2, fp32)."""
    kw = dict(seq_length=1024, micro_batch_size=1, tp=2, activation_bytes=4)
    kept = 8 * 1024 ** 2 * 1 * (4 + 1 + 4) / 2  # softmax output + dropout mask and output (fp32)
    moved = (5 * 4 + 4 * 4 + 2) * 8 * 1024 ** 2 / 2
    got = elementwise_forward_seconds(SMALL, HW, Knobs(elementwise_traffic_factor=10.0), act_none_bytes=1e8, **kw)
    assert got == pytest.approx((10 * (1e8 - kept) + moved) / 2e12 / FORWARD_PASSES_PER_TRAINING_PASS, rel=1e-12)
    # a compiled step moves its share of the s·b·h traffic; the score kernels' own traffic stays (they are fused
    # kernels already)
    compiled = elementwise_forward_seconds(SMALL, HW, Knobs(elementwise_traffic_factor=10.0,
                                                            compiled_elementwise_share=0.25), act_none_bytes=1e8, **kw)
    assert compiled == pytest.approx((2.5 * (1e8 - kept) + moved) / 2e12 / FORWARD_PASSES_PER_TRAINING_PASS, rel=1e-12)


def _costs(model=SMALL, training=BF16, knobs=Knobs(), **lay):
    return layer_costs(model, training, HW, Layout(**{"dp": 1, "tp": 2, "pp": 1, **lay}), knobs)


def test_layer_costs_parameters_of_the_embedding_and_output_layers():
    """V padded to 1024 (Megatron: a multiple of 128 x tp), V·h/t = 262,144 per GPU; the learned positions
    2048 x 512 on the embedding stage; a tied output layer only costs its own copy when it sits on another stage."""
    tied = _costs()
    assert tied.padded_vocab == 1024
    assert tied.embedding_params == 1024 * 512 / 2 + 2048 * 512
    assert tied.output_params == 0.0
    assert _costs(pp=2).output_params == 1024 * 512 / 2
    assert _costs(replace(SMALL, tied_embeddings=False)).output_params == 1024 * 512 / 2


def test_layer_costs_times_by_their_formulas():
    """b = 1, s = 1024, tp 2: GEMM FLOPs per GPU = the layer's / t; efficiency from the FC1 GEMM 2·T·h·f/t
    (stage.py gemm_share_of_peak: 0.8 x x/(x + 2), x in GFLOP) x the shape term x the end-to-end 0.8; the shape
    term by hand (gemm_shape_factor, half dimension 192): QKV 512 x 768, projection 256 x 512, FC1 512 x 1024,
    FC2 1024 x 512 per rank, smallest sides 512, 256, 512, 512 against T = 1024, so factors 8/11, 4/7, 8/11, 8/11
    and, weighted harmonically by k·n, 1,572,864 / 2,211,840 = 32/45; logits 2·T·h·V/t at their own size's
    efficiency x 8/11 (smallest of T, h, V/t = 512); the TP dispatch overhead a third (the forward's share) in the
    forward; TP exposed 1 - overlap; flash attention's recompute: full = the layer's forward again + the QK^T once
    more, selective = the core."""
    knobs = Knobs(tp_overlap_fraction=0.25, tp_layer_overhead_seconds=3e-3, end_to_end_efficiency=0.8,
                  gemm_half_efficiency_dim=192.0)
    flash = replace(SMALL, flash_attention=True)
    got = _costs(flash, knobs=knobs)
    gemm, core = layer_forward_flops(flash, tokens=1024, seq_length=1024)
    x = 2 * 1024 * 512 * 2048 / 2 / 1e9
    eff = 0.8 * x / (x + 2.0) * 32 / 45 * 0.8
    rate = 1e15 * eff
    assert got.gemm_flops_per_gpu == gemm / 2 and got.matmul_efficiency == pytest.approx(eff, rel=1e-12)
    assert got.rate_flops_per_second == pytest.approx(rate, rel=1e-12) and got.tp_expose == 0.75
    logits = 2 * 1024 * 512 * 1024 / 2
    assert got.t_logits_forward == pytest.approx(
        logits / (1e15 * 0.8 * (logits / 1e9) / (logits / 1e9 + 2) * 0.8 * 8 / 11), rel=1e-12)
    unshaped = _costs(flash, knobs=replace(knobs, gemm_half_efficiency_dim=0.0))
    assert unshaped.matmul_efficiency == pytest.approx(0.8 * x / (x + 2.0) * 0.8, rel=1e-12)
    no_dispatch = _costs(flash, knobs=replace(knobs, tp_layer_overhead_seconds=0.0))
    assert got.t_layer_forward - no_dispatch.t_layer_forward == pytest.approx(1e-3, rel=1e-9)
    one = layer_costs(flash, BF16, HW, Layout(dp=2, tp=1, pp=1), knobs)
    assert one.t_layer_forward == layer_costs(flash, BF16, HW, Layout(dp=2, tp=1, pp=1),
                                              replace(knobs, tp_layer_overhead_seconds=0.0)).t_layer_forward
    mem = no_dispatch.t_layer_forward - (gemm + core) / 2 / rate  # the memory-bound kernels
    assert no_dispatch.t_recompute_full == pytest.approx((gemm + core + core / 2) / 2 / rate + mem, rel=1e-9)
    selective = _costs(flash, knobs=replace(knobs, tp_layer_overhead_seconds=0.0), recompute="selective")
    assert selective.t_recompute_policy == pytest.approx((core + core / 2) / 2 / rate, rel=1e-12)


def test_layer_costs_activations_with_sp_gathered_inputs_and_fp32():
    """torch-native SP keeps the QKV and FC1 inputs gathered (Knobs.sp_saves_gathered_inputs): 2·s·b·h·β(1 - 1/t)
    more saved bytes, except under full recompute (only the layer input is kept), and no more elementwise time
    (the gathered tensor is the all-gather's output, memory.py sp_gathered_input_bytes); fp32 activations; the
    embedding (token ids, dropout mask) and output (norm and projection inputs, fp32 logits) bytes with SP."""
    fp32 = replace(BF16, activation_bytes=4)
    plain = _costs(training=fp32, sequence_parallel=True)
    kept = _costs(training=fp32, knobs=Knobs(sp_saves_gathered_inputs=True), sequence_parallel=True)
    gathered = 2 * 1024 * 1 * 512 * 4 * (1 - 1 / 2)
    assert kept.act_none_bytes - plain.act_none_bytes == pytest.approx(gathered, rel=1e-12)
    assert kept.act_full_bytes == plain.act_full_bytes
    assert kept.t_layer_forward == pytest.approx(plain.t_layer_forward, rel=1e-12)
    assert plain.act_none_bytes == activation_bytes_per_layer(SMALL, seq_length=1024, micro_batch_size=1, tp=2,
                                                              sequence_parallel=True, activation_bytes=4)
    assert plain.embedding_act_bytes == embedding_activation_bytes(seq_length=1024, micro_batch_size=1,
                                                                   hidden_size=512, tp=2, sequence_parallel=True,
                                                                   dropout=True)
    assert plain.output_act_bytes == output_activation_bytes(seq_length=1024, micro_batch_size=1, hidden_size=512,
                                                             vocab_size=1024, tp=2, sequence_parallel=True,
                                                             activation_bytes=4)
    assert layer_costs(SWIGLU, BF16, HW, Layout(dp=1, tp=2, pp=1), Knobs()) == layer_costs(
        SWIGLU, BF16, HW, Layout(dp=1, tp=2, pp=1), Knobs(fused_swiglu=False))


def test_ep_group_spilling_onto_a_second_node_crosses_the_network():
    """Bug: `ep_traffic` counted ep // ranks_per_node nodes, so an EP group of 10 ranks on 8-GPU nodes (possible for
    DeepSeek-V2's 160 experts) was one node with no network bytes. It spans 2 nodes; the 2 ranks of the second one
    send 8/10 of their copies across the network (the slowest ranks), the 8 of the first 7/10 to NVLink peers."""
    got = ep_traffic(SMALL_MOE.moe, copies_bytes=1e7, ep=10, ranks_per_node=8)
    assert got == EpTraffic(pytest.approx(1e7 * 7 / 10), pytest.approx(1e7 * 8 / 10))
    # full nodes are unchanged: 16 ranks on two nodes, 8/16 across
    assert ep_traffic(SMALL_MOE.moe, copies_bytes=1e7, ep=16, ranks_per_node=8) == EpTraffic(
        pytest.approx(1e7 * 7 / 16), pytest.approx(1e7 * 8 / 16))


# ---- this stop's MLA, fused-SwiGLU and FP8 terms at the stage level (survivors of the merged run) ---------------


def test_recompute_seconds_by_hand_mla_selective_fp8_and_repeated_traffic():
    """stage._recompute_seconds: the recomputed FLOPs, GEMMs at the forward's time factor (FP8, experts; the
    attention core and flash attention's QK^T are not GEMMs of the layer's Linears), per TP rank at the forward's
    rate, plus what the recomputed forward repeats (LayerExtras.recomputed). MLA's selective runs its
    up-projections (at the GEMM factor) and flash's QK^T instead of the core (compute.recompute_extra_of)."""
    from cost_models.stage import _recompute_seconds

    repeated = {"full": 3.0, "selective": 2.0, "none": 1.0}
    ext = SimpleNamespace(gemm_time_factor=0.5, recomputed=lambda r: SimpleNamespace(seconds=repeated[r]))
    kw = dict(flash=True, tp=2, rate=10.0)
    # gemm 1000, core 40, up-projections 100: selective (50 + 20) / 2 / 10 + 2; without MLA (40 + 20) / 20 + 2
    assert _recompute_seconds(1000.0, 40.0, ext, recompute="selective", up_projections=100.0, **kw) == 70 / 20 + 2
    assert _recompute_seconds(1000.0, 40.0, ext, recompute="selective", **kw) == 60 / 20 + 2
    assert _recompute_seconds(1000.0, 40.0, ext, recompute="full", up_projections=100.0, **kw) == 560 / 20 + 3
    assert _recompute_seconds(1000.0, 40.0, ext, recompute="none", up_projections=100.0, **kw) == 20 / 20 + 1


def test_selective_keeps_q_k_v_without_mla():
    """Without MLA, selective recomputes the attention core from its saved inputs: Q, K, V and O stay
    (Llama-3-70B: 18,432 elements per token, modern-training.md §4.3); MLA keeps O only (V3: 16,384)."""
    from cost_models.attention import selective_saved_elements_per_token

    assert selective_saved_elements_per_token(LLAMA3_70B) == 18_432
    assert selective_saved_elements_per_token(V3) == 16_384


def test_step_flops_of_mla_selective_count_the_up_projections():
    """Hardware FLOPs of a step with selective recompute on an MLA model: model FLOPs plus, per layer, the
    up-projections' forward (2 T x 54,525,952 for V3) and flash attention's QK^T (half the core)."""
    from cost_models.compute import layer_forward_flops, step_flops

    B, s = 2, 4096
    T = B * s
    model_flops, hardware, extra = step_flops(V3, global_batch_size=B, seq_length=s, recompute="selective")
    _, core = layer_forward_flops(V3, tokens=T, seq_length=s)
    assert extra == pytest.approx(2 * T * 54_525_952 + core / 2, rel=1e-12)
    assert hardware == pytest.approx(model_flops + V3.num_layers * extra, rel=1e-12)


def test_mla_activations_scale_with_the_activation_bytes():
    """fp32 activations (4 B) double every 2-byte term, MLA's latents and Q/K/V/O included (memory.py's `scale`)."""
    from cost_models.memory import activation_bytes_per_layer

    for rec in ("none", "selective"):
        two = activation_bytes_per_layer(V3, seq_length=1024, micro_batch_size=1, recompute=rec)
        four = activation_bytes_per_layer(V3, seq_length=1024, micro_batch_size=1, recompute=rec, activation_bytes=4)
        lse = 4 * 128 * 1024  # fp32 log-sum-exp, the same at either activation size
        assert four - lse == pytest.approx(2 * (two - lse), rel=1e-12)


def test_ep_terms_follow_the_fused_swiglu_knob():
    """Knobs.fused_swiglu reaches the MoE layer's activation replacement: the dense MLP it removes and the shared
    expert it adds at 6 f (fused) instead of 8 f bytes per token, the routed copies at 3 f_e instead of 4 f_e."""
    lay = Layout(dp=8, tp=1, pp=1, ep=8)
    fused = _ep_terms(SMALL_MOE, BF16, HW, lay, replace(MOE_KNOBS, fused_swiglu=True), 1024.0)
    plain = _ep_terms(SMALL_MOE, BF16, HW, lay, MOE_KNOBS, 1024.0)
    routed = 1024 * 2 * 1.25
    # per MoE layer: routed 2 B x f_e less, shared and dense 2 B x f less each (2-byte activations), x 0.75
    expected = (-routed * 256 * 2 - 1024 * 2 * 384 + 1024 * 2 * 2048) * 0.75
    assert fused.activation_delta_bytes - plain.activation_delta_bytes == pytest.approx(expected, rel=1e-12)
