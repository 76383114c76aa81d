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
    model_flops_per_step,
    parameter_counts,
    recompute_extra_forward_flops,
    step_flops,
)
from cost_models.context_parallel import qkvo_elements_per_token, ring_overlap_min_tokens
from cost_models.data_parallel import embedding_sync_seconds, zero_comm_seconds
from cost_models.inputs import MLA, Hardware, Knobs, Layout, Link, MoE, Training
from cost_models.memory import vocab_padded
from cost_models.moe import (
    all_to_all_bytes_per_layer,
    expert_kernel_seconds,
    expert_kernels,
    node_limited,
    nodes_per_token,
)
from cost_models.pipeline import Makespan, pipeline_makespan
from cost_models.stage import StageTime, stage_model
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


def _zero_traffic(zero, params, layers, bwd, fwd=0.0, d=4, m=2, share=0.5, modules=1):
    """(comm, exposed) by hand: the ZeRO volumes of data_parallel.zero_comm_seconds on the DP group's link, hidden up
    to the share and the window (the last backward at ZeRO 0/1, every backward at ZeRO-2, everything at ZeRO-3)."""
    link = group_link(HW, group_size=d, stride=1).link
    comm = zero_comm_seconds(zero_stage=zero, params=params, dp=d, layers=layers, grad_reduce_bytes=4, param_bytes=2,
                             num_micro_batches=m, link=link, modules_per_layer=modules)
    window = {0: bwd, 1: bwd, 2: m * bwd, 3: m * (fwd + bwd)}[zero]
    return comm, comm - min(share * comm, window)


def _dp_stages(layout, split, vocab=1024):
    return SimpleNamespace(layout=layout, split=split, lc=SimpleNamespace(padded_vocab=vocab))


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
])
def test_stage_dp_traffic_share_window_and_zero3_units(zero, d, gather, knobs, share):
    """One stage's (traffic, exposed): ZeRO-3 gathers layer by layer (FSDP) or Linear by Linear (DeepSpeed: 4 modules
    a layer, step.py ZERO3_MODULES_PER_LAYER), the overlap share is the ZeRO-3 knob at ZeRO-3, DDP's own at ZeRO-0
    when set, the DP knob otherwise, capped by the window."""
    lay = Layout(dp=d, tp=1, pp=1, zero_stage=zero, num_micro_batches=2)
    link = group_link(HW, group_size=d, stride=1).link
    got = _stage_dp_traffic(BF16, knobs, lay, link, (1e9, 3, 1.0, 50.0))
    want = _zero_traffic(zero, 1e9, 3, 50.0, fwd=1.0, d=d, share=share, modules=4 if gather == "module" else 1)
    assert got == (pytest.approx(want[0], rel=1e-12), pytest.approx(want[1], rel=1e-12))
    if gather == "module":
        assert want[0] > _zero_traffic(3, 1e9, 3, 50.0, fwd=1.0, modules=1)[0]


def test_stage_dp_traffic_without_data_parallelism_is_zero():
    lay = Layout(dp=1, tp=1, pp=1, zero_stage=1, num_micro_batches=2)
    assert _stage_dp_traffic(BF16, Knobs(), lay, HW.intra_node, (1e9, 3, 1.0, 50.0)) == (0.0, 0.0)


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
    assert (fwd, bwd) == (pytest.approx(16 * kernels[0] * per_kernel, rel=1e-12),
                          pytest.approx(16 * kernels[1] * per_kernel, rel=1e-12))
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
