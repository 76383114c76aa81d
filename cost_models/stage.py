"""The stage model: the one place that says what a pipeline stage holds and costs.

Per layer (`LayerCosts`): seconds of forward, recompute and tensor-parallel traffic, bytes of parameters and of
activations per in-flight micro-batch. Per stage (`StageModel`): those times the stage's layer count, plus the
fixed terms of the first stage (embedding) and the last (output layer, final norm), the model states under ZeRO
and offload, the micro-batches in flight under the schedule, and the transients. Everything that needs a stage's
numbers asks this module: the step estimate, the planner's split refinement and ILP (`StageModel.linear`), the
search's memory lower bound (`state_bytes_per_param`), `check`, and the benchmark (`stage_split`).

A stage is linear in its layer count n and its fully recomputed layers r:
    seconds per micro-batch  = n * layer_seconds + r * recompute_seconds + extra_seconds
    bytes                    = n * layer_state_bytes + (n - r) * act_policy * f + r * act_full * f + fixed_bytes
with f the micro-batches in flight (fixed by the schedule); `StageModel.time/memory` evaluate exactly these
terms (plus the transients that are not linear: the layer being recomputed, ZeRO-3's gathered unit).

Extension point for new per-layer traffic (context- or expert-parallel all-to-all, ...): add its seconds per layer
to `LayerCosts` and to `LayerCosts.comm_seconds`; every consumer above picks it up.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from cost_models import op_sac
from cost_models.attention import attention_weight_count, up_projection_forward_flops, window_context
from cost_models.communication import all_reduce_seconds, group_link, tp_bytes_per_layer_per_micro_batch
from cost_models.compute import fc1_gemm_flops, layer_forward_flops, parameter_counts, recompute_extra_of
from cost_models.data_parallel import zero3_regathered_modules
from cost_models.extensions import LayerExtras, expert_data_parallel, layer_extras
from cost_models.inputs import (
    Hardware,
    Knobs,
    Layout,
    Offload,
    Recompute,
    Schedule,
    Training,
    Transformer,
    Zero0Optimizer,
    Zero3Gather,
)
from cost_models.memory import (
    activation_bytes_per_layer,
    attention_score_bytes,
    attention_score_traffic_bytes,
    eager_saved_extra_bytes,
    embedding_activation_bytes,
    in_flight_per_stage,
    loss_backward_transient_bytes,
    loss_peak_bytes_per_logit,
    mlp_backward_gradient_bytes,
    output_activation_bytes,
    sp_gathered_input_bytes,
    vocab_padded,
)
from cost_models.nccl import communicator_bytes, communicator_group_sizes

# A layer's forward + backward is 3 forward passes' worth of work: backward = 2 x forward (Narayanan et al. 2021
# Eq. 3, 72 = 3 x 24). The elementwise-traffic knob covers forward + backward, so the forward pays a third of it.
FORWARD_PASSES_PER_TRAINING_PASS = 3
BACKWARD_OVER_FORWARD = 2  # backward FLOPs = 2 x forward FLOPs (input and weight gradients; same source)
# Megatron TP all-reduces per layer per micro-batch: 2 forward + 2 backward; full recompute repeats the 2 forward
# ones (Narayanan et al. 2021 §3.2; ZeRO paper §8).
TP_ALL_REDUCES_PER_LAYER = 4
TP_ALL_REDUCES_PER_RECOMPUTED_LAYER = 2
# torchtitan's per-op SAC re-issues a layer's two SP all-gathers (attention and MLP inputs) in backward: an
# all-gather moves half an all-reduce's bytes, so the two cost one all-reduce (frameworks.md §1.5)
OP_SAC_ALL_REDUCES_REPEATED = 1
# DeepSpeed's default reduce_bucket_size (5e8 elements): one bucket of gradients is staged on the GPU before it is
# copied to the host under optimizer offload (deepspeed/runtime/zero/config.py).
OFFLOAD_REDUCE_BUCKET_ELEMENTS = 5e8
ZERO3_MAX_LIVE_PARAMETERS = 1e9  # DeepSpeed stage3_max_live_parameters default (frameworks.md §3.5)

# Enum members as module constants: on Python 3.11 reading `Schedule.NAIVE` off the class costs several hundred ns
# (EnumType's attribute lookup), paid per stage on the hot path; a module global costs tens.
_NAIVE, _PIPEDREAM_ASYNC, _INTERLEAVED, _ONE_F_ONE_B = (Schedule.NAIVE, Schedule.PIPEDREAM_ASYNC,
                                                        Schedule.INTERLEAVED_1F1B, Schedule.ONE_F_ONE_B)
_REC_NONE, _REC_FULL, _REC_SELECTIVE = Recompute.NONE, Recompute.FULL, Recompute.SELECTIVE
_OFFLOAD_NONE, _OFFLOAD_PARAMS = Offload.NONE, Offload.OPTIMIZER_PARAMS
_GATHER_LAYER, _GATHER_MODULE = Zero3Gather.LAYER, Zero3Gather.MODULE
# StageMemory(...) of the fields in order, without the named tuple's Python-level __new__ (16 stages per estimate)
_new_tuple = tuple.__new__
_RECOMPUTES = {r.value: r for r in Recompute}  # value -> member: a dict lookup instead of EnumType.__call__
_SCHEDULES = {sc.value: sc for sc in Schedule}


def stage_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """THE split: as even as possible, the remainder to the inner stages first (the outer ones carry the embedding
    and the output layer), e.g. 10 layers over 4 stages -> (2, 3, 3, 2)."""
    base, extra = divmod(num_layers, pp)
    counts = [base] * pp
    order = list(range(1, pp - 1)) + [0, pp - 1] if pp > 2 else list(range(pp))
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


_stage_split = functools.cache(stage_split)  # pure in two ints; a search asks for the same few (layers, pp) pairs


def matmul_efficiency(hw: Hardware, knobs: Knobs, *, gemm_flops: float, shape: float = 1.0) -> float:
    """Achieved fraction of peak: MAMF fraction x size saturation x shape factor x end-to-end factor.

    Size saturation x / (x + x_half), x the per-GPU GEMM size in GFLOP (small GEMMs run far from peak;
    Calculon uses steps 0.95 / 0.9 / 0.6 at 128 / 16 / 1 GFLOP, cost-models.md §6.3); `shape` the GEMMs' smallest
    dimensions (gemm_side_factor for one GEMM, gemm_shape_factor for a layer's).
    """
    return gemm_share_of_peak(hw, knobs, gemm_flops=gemm_flops) * shape * knobs.end_to_end_efficiency


def gemm_share_of_peak(hw: Hardware, knobs: Knobs, *, gemm_flops: float) -> float:
    """MAMF fraction x size saturation x / (x + x_half), x the GEMM in GFLOP: matmul_efficiency before the
    end-to-end factor."""
    x = gemm_flops / 1e9
    return hw.matmul_efficiency * x / (x + knobs.matmul_half_efficiency_gflop)


def gemm_side_factor(dim: float, half_dim: float) -> float:
    """d / (d + half_dim): the share of the size-saturated GEMM rate a GEMM whose smallest dimension is `dim`
    reaches (1 with half_dim 0). Tensor-core GEMMs run in output tiles of up to 256 x 128 over a k loop: a small
    dimension leaves tiles part-empty, few tiles per SM wave and a short k loop whose prologue and epilogue are not
    amortised (NVIDIA, 'Matrix Multiplication Background User's Guide', 2023, §2.3 tile sizes, §3 tile and wave
    quantization; Anthony et al. 2024, 'The Case for Co-Designing Model Architectures with Hardware',
    arXiv:2401.14489: GEMM throughput keeps rising with the hidden size long after the FLOP count is large). The
    form and its half_dim are a fit (planner/validation.py FITTED_GRID), not a measured cuBLAS curve."""
    return dim / (dim + half_dim) if half_dim > 0 else 1.0


def gemm_shape_factor(model: Transformer, *, tokens: float, tp: int, half_dim: float) -> float:
    """gemm_side_factor over a layer's dense GEMMs, FLOP-weighted harmonically (so it scales their summed time):
    QKV h x (q + 2 kv)/t, output projection q/t x h, FC1 h x f/t (2 f with SwiGLU), FC2 f/t x h, each at its
    smallest dimension of tokens and its two weight sides on one of `tp` ranks (the backward's data- and
    weight-gradient GEMMs have the same two weight sides and the tokens as their third). A MoE layer is scored on
    its dense FFN width (the experts' grouped GEMMs carry their own slowdown, extensions.py)."""
    if half_dim <= 0:
        return 1.0
    h, hd = model.hidden_size, model.head_dim
    q, kv = model.num_attention_heads * hd, model.num_kv_heads * hd
    f = model.ffn_hidden_size
    sides = ((h, (q + 2 * kv) / tp), (q / tp, h), (h, f * (2 if model.swiglu else 1) / tp), (f / tp, h))
    weights = [k * n for k, n in sides]
    factors = [gemm_side_factor(min(tokens, k, n), half_dim) for k, n in sides]
    return sum(weights) / sum(w / g for w, g in zip(weights, factors, strict=True))


def attention_core_gemm_equivalent_flops(model: Transformer, knobs: Knobs, *, core_flops: float, seq_length: int,
                                         gemm_efficiency: float) -> float:
    """The attention core's forward FLOPs restated as the FLOPs the layer's GEMMs would run in the same time, so
    `core / rate` is the core's time at the GEMM rate of a layer whose GEMMs reach `gemm_efficiency` of peak
    (matmul_efficiency).

    The core is counted at the full s^2 score matrix (attention.core_attention_forward_flops). A fused causal kernel
    (flash attention) skips the masked blocks: it runs the causal share (s+1)/(2s) of those FLOPs
    (attention.window_context), at its own fraction of peak, `attention_kernel_efficiency`, where a framework
    profile states it for the GPU (planner/frameworks/profiles.py), times the same end-to-end factor as the GEMMs
    (and not the GEMMs' size or shape terms). Without a stated kernel (0), or with unfused attention (which computes
    the whole masked matrix), the core is its full FLOPs at the GEMM rate: the convention of the fitted knobs,
    ~0.35-0.40 of H100 peak on the causal FLOPs, between FlashAttention-2 (0.30-0.33) and cuDNN (0.48-0.53). A
    flash kernel under the convention runs at `attention_convention_rate` of it: 1, or less for a kernel written for
    an older GPU's tensor-core instructions, which the GEMMs (cuBLAS) do not share (an Ampere kernel on Hopper).
    """
    kernel = knobs.attention_kernel_efficiency
    if not model.flash_attention:
        return core_flops
    if kernel <= 0:
        return core_flops / knobs.attention_convention_rate
    causal_share = window_context(seq_length, seq_length) / seq_length
    return core_flops * causal_share * gemm_efficiency / (kernel * knobs.end_to_end_efficiency)


def _layer_time_flops(model: Transformer, hw: Hardware, knobs: Knobs, *, tokens: int, seq_length: int,
                      tp: int) -> tuple[float, float, float]:
    """(GEMM FLOPs, the attention core as GEMM-rate FLOPs, the GEMMs' achieved fraction of peak) of one layer's
    forward on `tokens` tokens: what the layer's time is computed from (its FLOP counts stay
    compute.layer_forward_flops). The rate saturates on the FC1 GEMM per GPU and scales with all its GEMMs' shapes."""
    gemm, core = layer_forward_flops(model, tokens=tokens, seq_length=seq_length)
    eff = matmul_efficiency(hw, knobs, gemm_flops=fc1_gemm_flops(model, tokens=tokens, tp=tp),
                            shape=gemm_shape_factor(model, tokens=tokens, tp=tp, half_dim=knobs.gemm_half_efficiency_dim))
    core = attention_core_gemm_equivalent_flops(model, knobs, core_flops=core, seq_length=seq_length,
                                                gemm_efficiency=eff)
    return gemm, core, eff


def elementwise_forward_seconds(model: Transformer, hw: Hardware, knobs: Knobs, *, act_none_bytes: float,
                                seq_length: int, micro_batch_size: int, tp: int, activation_bytes: int) -> float:
    """Forward share of a layer's memory-bound kernels (norms, softmax, activation functions, dropout, residual
    adds). The s b h-sized activations move `elementwise_traffic_factor` bytes per byte kept (their HBM traffic
    scales with s b h, not h^2, so it weighs most on small models) [fit: validation], times
    `compiled_elementwise_share` where a compiler fuses the chains (1 eager); unfused attention's a s^2
    score tensors are charged their fused softmax and dropout kernels' own traffic, a fixed few passes per element
    (cost_models/memory.py `attention_score_traffic_bytes`), far fewer bytes per byte kept."""
    kw = dict(seq_length=seq_length, micro_batch_size=micro_batch_size, tp=tp, activation_bytes=activation_bytes)
    kept = attention_score_bytes(model, **kw)
    moved = attention_score_traffic_bytes(model, **kw)
    traffic = knobs.elementwise_traffic_factor * knobs.compiled_elementwise_share * (act_none_bytes - kept) + moved
    return traffic / hw.hbm_bytes_per_second / FORWARD_PASSES_PER_TRAINING_PASS


def tp_all_reduce_seconds(hw: Hardware, *, micro_batch_size: int, seq_length: int, hidden_size: int, tp: int,
                          activation_bytes: int) -> float:
    """One Megatron TP all-reduce of b s h activations over the tp ranks of a node (0 without TP)."""
    if tp <= 1:
        return 0.0
    msg, _ = tp_bytes_per_layer_per_micro_batch(micro_batch_size=micro_batch_size, seq_length=seq_length,
                                                hidden_size=hidden_size, tp=tp, activation_bytes=activation_bytes)
    return all_reduce_seconds(message_bytes=msg, group_size=tp, link=group_link(hw, group_size=tp, stride=1).link)


def tp_backward_hidden_seconds(model: Transformer, knobs: Knobs, *, tokens: int, tp: int,
                               all_reduce_seconds: float, rate_flops_per_second: float) -> float:
    """Seconds per layer and micro-batch of the backward TP all-reduces hidden by Megatron's async all-reduce.

    Two of a layer's four all-reduces are the input gradients of its column-parallel linears (QKV and FC1);
    Megatron-LM launches each asynchronously and computes that linear's weight gradient meanwhile
    (megatron/mpu/layers.py ColumnParallelLinearWithAsyncAllreduce, commit 3f65246911, 2021-09). Each hides
    behind its own weight-gradient GEMM (QKV: 2 T h (a + 2 kv) d; FC1: 2 T h f, x2 with SwiGLU's gate), at most
    the all-reduce's exposed part (after `tp_overlap_fraction`). The forward and recompute all-reduces stay
    exposed. 0 without the knob."""
    exposed_all_reduce_seconds = all_reduce_seconds * (1 - knobs.tp_overlap_fraction)
    if not knobs.tp_async_grad_allreduce or tp <= 1 or exposed_all_reduce_seconds <= 0:
        return 0.0
    h, d = model.hidden_size, model.head_dim
    qkv = 2.0 * tokens * h * (model.num_attention_heads + 2 * model.num_kv_heads) * d / tp
    fc1 = 2.0 * tokens * h * model.ffn_hidden_size * (2 if model.swiglu else 1) / tp
    return sum(min(exposed_all_reduce_seconds, flops / rate_flops_per_second) for flops in (qkv, fc1))


class LayerCosts(NamedTuple):
    """Per-layer, per-micro-batch, per-GPU quantities of a layout."""

    t_layer_forward: float  # seconds, GEMMs + memory-bound kernels
    t_recompute_policy: float  # extra seconds per layer under the layout's recompute policy
    t_recompute_full: float  # extra seconds per layer under full recompute
    t_tp_all_reduce: float  # one TP all-reduce of b s h
    tp_expose: float  # share of TP traffic on the critical path
    t_tp_backward_hidden: float  # per layer: exposed backward all-reduce time hidden under weight-gradient GEMMs
    t_logits_forward: float
    gemm_flops_per_gpu: float  # forward GEMM FLOPs of one layer on one GPU (weight-gradient work, ZB's W)
    rate_flops_per_second: float
    act_policy_bytes: float  # saved for backward, one micro-batch, the layout's policy
    act_full_bytes: float  # the same under full recompute
    act_none_bytes: float  # the same without recompute (a recomputed layer, materialised in backward)
    mlp_grad_bytes: float  # gradients a layer's backward holds together at its MLP (memory.mlp_backward_gradient_bytes)
    embedding_act_bytes: float
    output_act_bytes: float
    loss_transient_bytes: float  # the loss's backward beyond its saved bytes, once (memory.loss_backward_transient_bytes)
    layer_params: float  # parameters of one layer on one GPU (TP-sharded; norms replicated)
    embedding_params: float
    output_params: float
    final_norm_params: float
    largest_module_params: float
    # the layer's parameter-holding modules in forward order, elements on one GPU (layer_module_elements)
    module_params: tuple[float, ...]
    matmul_efficiency: float
    padded_vocab: int
    policy: Recompute  # the per-layer policy of layers that are not fully recomputed
    extras: LayerExtras  # CP/EP/FP8 terms (cost_models/extensions.py)

    def backward_working_bytes(self, *, full: bool) -> float:
        """What one layer's backward holds beyond the saved bytes of the layers in flight: what its recompute
        materialises again (everything a layer without recompute saves, less what its policy kept: its input under
        full recompute, the save set under per-op SAC, nothing without recompute) and the gradients alive together
        at its MLP. Measured against torch's MemTracker: tests/test_backward_memory_torch.py."""
        kept = self.act_full_bytes if full else self.act_policy_bytes
        return self.act_none_bytes - kept + self.mlp_grad_bytes

    def comm_seconds(self, layers: int, recomputed: int) -> float:
        """Exposed per-layer model-parallel traffic of `layers` layers, `recomputed` of them fully recomputed."""
        count = layers * TP_ALL_REDUCES_PER_LAYER + recomputed * TP_ALL_REDUCES_PER_RECOMPUTED_LAYER
        return count * self.t_tp_all_reduce * self.tp_expose - layers * self.t_tp_backward_hidden


def _policy(recompute: str) -> Recompute:
    """The per-layer policy of the layers that are not fully recomputed."""
    return _REC_NONE if recompute == _REC_FULL else _RECOMPUTES.get(recompute) or Recompute(recompute)


def _recompute_seconds(gemm: float, core: float, ext: LayerExtras, *, flash: bool, recompute: str, tp: int,
                       rate: float, up_projections: float | None = None) -> float:
    """Extra seconds of a layer's recompute under `recompute`: its FLOPs, the GEMMs at the forward's rate (FP8,
    expert GEMMs), plus the CP/EP traffic and FP8 casts the recomputed forward repeats (LayerExtras.recomputed).
    `up_projections`: MLA's up-projection FLOPs, what its selective recompute runs (GEMMs, at the forward's rate)."""
    selective = None if up_projections is None else up_projections * ext.gemm_time_factor
    flops = recompute_extra_of(gemm * ext.gemm_time_factor, core, flash_attention=flash, recompute=recompute,
                               selective=selective)
    return flops / tp / rate + ext.recomputed(recompute).seconds


class _ActivationBytes(NamedTuple):
    none: float  # a layer's saved bytes per micro-batch without recompute (what a recomputed layer materialises)
    policy: float  # the same under the layout's per-layer policy
    full: float  # the same under full recompute: its input
    gathered: float  # of `none`, the SP inputs kept all-gathered (memory only)
    eager: float  # of `none`, what the model code saves beyond the component list (memory only)
    mlp_grad: float  # gradients a layer's backward holds together at its MLP


def _activation_bytes(model: Transformer, training: Training, layout: Layout, knobs: Knobs, ext: LayerExtras,
                      policy: Recompute) -> _ActivationBytes:
    """What a layer keeps per micro-batch without recompute, under its policy and under full recompute. Per-op SAC
    keeps no gathered input (it re-issues the all-gathers) and none of the model code's eager extras (the norms and
    the K/V copies are recomputed); every other policy keeps both where the layer keeps those tensors."""
    t, b, s_l, sp = layout.tp, layout.micro_batch_size, training.seq_length // layout.cp, layout.sequence_parallel
    act_b, per_op_sac = training.activation_bytes, op_sac.in_effect(model, knobs.selective_op_sac)
    gathered = sp_gathered_input_bytes(seq_length=s_l, micro_batch_size=b, hidden_size=model.hidden_size, tp=t,
                                       activation_bytes=act_b, sequence_parallel=sp and knobs.sp_saves_gathered_inputs)
    eager = eager_saved_extra_bytes(model, seq_length=s_l, micro_batch_size=b, tp=t, sequence_parallel=sp,
                                    norm_upcast=knobs.norm_fp32_upcast and not knobs.compiled,
                                    kv_repeated=knobs.kv_heads_repeated, activation_bytes=act_b)

    def act(rec: Recompute) -> float:
        base = activation_bytes_per_layer(model, seq_length=s_l, micro_batch_size=b, tp=t, sequence_parallel=sp,
                                          recompute=rec, activation_bytes=act_b, fused_swiglu=knobs.fused_swiglu,
                                          per_op_sac=per_op_sac)
        if rec == _REC_FULL:
            return base
        return base + ext.activation_delta_bytes + (0.0 if per_op_sac and rec == _REC_SELECTIVE else gathered + eager)
    act_none = act(_REC_NONE)
    grads = mlp_backward_gradient_bytes(model, seq_length=s_l, micro_batch_size=b, tp=t, activation_bytes=act_b)
    return _ActivationBytes(act_none, act_none if policy == _REC_NONE else act(policy), act(_REC_FULL), gathered, eager,
                            grads)


def _selective_reruns(model: Transformer, knobs: Knobs, *, tokens: int, elementwise_seconds: float,
                      all_reduce_seconds: float) -> tuple[float | None, float]:
    """(the forward FLOPs selective recompute runs again where it is not the attention core, the seconds of other
    forward work it repeats). Per-op SAC: the matmuls it does not save, every elementwise op and the SP all-gathers;
    MLA: its up-projections; otherwise (None, 0): the core (compute.recompute_extra_of)."""
    if op_sac.in_effect(model, knobs.selective_op_sac):
        repeated = elementwise_seconds + OP_SAC_ALL_REDUCES_REPEATED * all_reduce_seconds * (1 - knobs.tp_overlap_fraction)
        return op_sac.recomputed_gemm_flops(model, tokens=tokens), repeated
    return up_projection_forward_flops(model, tokens=tokens), 0.0


def fsdp_head_unit_params(lc: LayerCosts) -> float:
    """Parameters of the FSDP unit that holds the output projection (the final norm and the output layer, or the
    tied embedding), per GPU: FSDP keeps it gathered from its forward to its backward, across the loss. torch FSDP
    does not reshard the root unit after forward ('the root FSDP state has its value specially set to False',
    fully_shard's docstring; FSDP1's _post_forward_reshard alike), which holds them in llm-foundry's FSDP and in
    torchtitan before 2025 (fully_shard(model) over tok_embeddings, norm and output); torchtitan now wraps
    [norm, output] as its own unit with reshard_after_forward off by default ('FSDP would prefetch them
    immediately', torchtitan/distributed/fsdp.py; frameworks.md §1.6). The older root's embedding is not counted:
    the unit torchtitan gathers now."""
    head = lc.output_params if lc.output_params > 0 else lc.embedding_params  # tied: the embedding is the head
    return head + lc.final_norm_params


def largest_module_elements(model: Transformer, *, tp: int) -> float:
    """The largest Linear weight of a layer on one GPU, FC1 (h f, its gate and up counted apart) or QKV."""
    h, qkv_out = model.hidden_size, (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim
    return max(h * model.ffn_hidden_size, h * qkv_out) / tp


def layer_module_elements(model: Transformer, *, layer_params: float, tp: int) -> tuple[float, ...]:
    """One layer's parameter-holding modules in forward order, their elements on one GPU (`layer_params`: the
    layer's, TP-sharded): the attention's norm, QKV, the output projection, the MLP's norm, FC1 (gate and up as one),
    FC2, with their biases. The MLP holds what the layer has beyond the attention and the norms (the routed experts
    on this rank included), split as its weights are: 2:1 gated, 1:1 GeLU. What DeepSpeed's ZeRO-3 fetches one
    module at a time (data_parallel.zero3_regathered_modules)."""
    h, a = model.hidden_size, model.num_attention_heads
    norm = parameter_counts(model).per_layer_norms / 2
    o = a * (model.mla.v_head_dim if model.mla is not None else model.head_dim) * h
    qkv_out = (attention_weight_count(model) - o) / h  # QKV's output width (MLA: its projections' elements / h)
    qkv = (h * qkv_out + (qkv_out if model.bias or model.qkv_bias else 0.0)) / tp
    proj = o / tp + (h if model.bias or model.o_bias else 0.0)
    mlp = max(0.0, layer_params - 2 * norm - qkv - proj)
    fc1 = mlp * (2 / 3 if model.swiglu else 1 / 2)
    return norm, qkv, proj, norm, fc1, mlp - fc1


def layer_costs(model: Transformer, training: Training, hw: Hardware, layout: Layout, knobs: Knobs) -> LayerCosts:
    h, t, b, s = model.hidden_size, layout.tp, layout.micro_batch_size, training.seq_length
    act_b, V = training.activation_bytes, vocab_padded(model.vocab_size, tp=layout.tp)
    policy = _policy(layout.recompute)
    s_l = s // layout.cp  # tokens of each sequence on this rank (context parallelism)
    tokens, sp = b * s_l, layout.sequence_parallel
    gemm, core, eff = _layer_time_flops(model, hw, knobs, tokens=tokens, seq_length=s, tp=t)
    peak, rate = hw.peak_flops_per_second, hw.peak_flops_per_second * eff
    # CP, EP and FP8 terms (extensions.py), forward + backward: zero / 1.0 for a dense bf16 layout without CP or EP
    ext = layer_extras(model, training, hw, layout, knobs, gemm_flops_per_gpu=gemm / t, core_seconds=core / t / rate,
                       rate_flops_per_second=rate)
    acts = _activation_bytes(model, training, layout, knobs, ext, policy)
    t_layer_mem = elementwise_forward_seconds(model, hw, knobs, act_none_bytes=acts.none - acts.gathered - acts.eager,
                                              seq_length=s_l, micro_batch_size=b, tp=t, activation_bytes=act_b)
    t_ar = tp_all_reduce_seconds(hw, micro_batch_size=b, seq_length=s_l, hidden_size=h, tp=t, activation_bytes=act_b)
    reruns, repeats = _selective_reruns(model, knobs, tokens=tokens, elementwise_seconds=t_layer_mem,
                                        all_reduce_seconds=t_ar)
    # per-layer dispatch cost of tensor parallelism (calibrated; 0 on GPUs), the forward's share of fwd + bwd
    t_tp_dispatch = knobs.tp_layer_overhead_seconds / FORWARD_PASSES_PER_TRAINING_PASS if t > 1 else 0.0
    logits_gemm = 2 * tokens * h * V / t
    pc, flash = parameter_counts(model), model.flash_attention
    loss_b = loss_peak_bytes_per_logit(tp=t, loss_bytes_per_logit=knobs.loss_bytes_per_logit,
                                       loss_parallel_bytes_per_logit=knobs.loss_parallel_bytes_per_logit)
    return LayerCosts(
        t_layer_forward=(gemm * ext.gemm_time_factor + core) / t / rate + t_layer_mem + t_tp_dispatch
        + ext.extra_seconds / FORWARD_PASSES_PER_TRAINING_PASS,
        t_recompute_policy=_recompute_seconds(gemm, core, ext, flash=flash, recompute=policy, tp=t, rate=rate,
                                              up_projections=reruns) + (repeats if policy == _REC_SELECTIVE else 0.0),
        t_recompute_full=_recompute_seconds(gemm, core, ext, flash=flash, recompute="full", tp=t, rate=rate) + t_layer_mem,
        t_tp_all_reduce=t_ar,
        tp_expose=1 - knobs.tp_overlap_fraction,
        t_tp_backward_hidden=tp_backward_hidden_seconds(model, knobs, tokens=tokens, tp=t, all_reduce_seconds=t_ar,
                                                        rate_flops_per_second=rate),
        t_logits_forward=logits_gemm / (peak * matmul_efficiency(
            hw, knobs, gemm_flops=logits_gemm,
            shape=gemm_side_factor(min(tokens, h, V / t), knobs.gemm_half_efficiency_dim))),
        gemm_flops_per_gpu=gemm / t,
        rate_flops_per_second=rate,
        act_policy_bytes=acts.policy,
        act_full_bytes=acts.full,
        act_none_bytes=acts.none,
        mlp_grad_bytes=acts.mlp_grad,
        embedding_act_bytes=embedding_activation_bytes(seq_length=s_l, micro_batch_size=b, hidden_size=h, tp=t,
                                                       sequence_parallel=sp, dropout=model.dropout),
        output_act_bytes=output_activation_bytes(seq_length=s_l, micro_batch_size=b, hidden_size=h, vocab_size=V, tp=t,
                                                 sequence_parallel=sp, activation_bytes=act_b,
                                                 loss_bytes_per_logit=loss_b),
        loss_transient_bytes=loss_backward_transient_bytes(seq_length=s_l, micro_batch_size=b, vocab_size=V, tp=t,
                                                           loss_bytes_per_logit=loss_b),
        layer_params=ext.layer_params,
        module_params=layer_module_elements(model, layer_params=ext.layer_params, tp=t),
        embedding_params=V * h / t + pc.position_embedding,
        output_params=V * h / t if (not model.tied_embeddings or layout.pp > 1) else 0.0,
        final_norm_params=pc.final_norm,
        largest_module_params=largest_module_elements(model, tp=t),
        matmul_efficiency=eff,
        padded_vocab=V,
        policy=policy,
        extras=ext,
    )


REDUCE_BUCKET_BYTES_PER_ELEMENT = 2  # DeepSpeed's IPG buckets hold 16-bit gradients (self.dtype), every stage


def zero3_reduce_bucket_elements(knobs: Knobs, *, zero_stage: int) -> float | None:
    """The elements each ZeRO-3 gradient bucket holds where gradients are reduced in buckets (DeepSpeed's ZeRO-3 of
    today, gathering by module: Knobs.zero3_reduce_bucket_elements), else None: FSDP reduces per block, DeepSpeed's
    ZeRO-3 of 2021 per tensor. The one rule the DP traffic (step.dp_comm_seconds) and the memory (bucket_bytes) ask."""
    if zero_stage >= 3 and knobs.zero3_gather == _GATHER_MODULE:
        return knobs.zero3_reduce_bucket_elements
    return None


def zero0_optimizer(holder: Training | Knobs, *, pipeline: bool = False) -> Zero0Optimizer | None:
    """The optimizer the framework runs at ZeRO-0: the pipeline's where the model is one (pp > 1) and the framework
    states one (zero0_pipeline_optimizer), else its ZeRO-0 one; None: the plain one, over the training's own bytes.
    Read from the Training (states net of what lower-precision optimizer states save) or from the Knobs (the
    reduce buffers: bucket_bytes), which hold the same records."""
    if pipeline and holder.zero0_pipeline_optimizer is not None:
        return holder.zero0_pipeline_optimizer
    return holder.zero0_optimizer


def zero0_states_sharded(training: Training, *, offload: str = Offload.NONE, pipeline: bool = False) -> bool:
    """Whether the optimizer the framework runs at ZeRO-0 shards its states over DP (DeepSpeed's BF16_Optimizer), so
    it all-gathers the updated parameters after its step; not under offload, which runs ZeRO-Offload's path."""
    optimizer = zero0_optimizer(training, pipeline=pipeline)
    return offload == _OFFLOAD_NONE and optimizer is not None and optimizer.sharded


def reduce_buffer_bytes(bucket_elements: float, *, buffers: int) -> float:
    """DeepSpeed's gradient buffers: `buffers` of `bucket_elements` 16-bit elements. At ZeRO-1/2 each backward
    allocates one (the IPG buffer) of reduce_bucket_size elements in the model's 16-bit dtype when
    contiguous_gradients is on, and a second with overlap_comm ('Use double buffers to avoid data access conflict when
    overlap_comm is enabled', stage_1_and_2.py backward, DeepSpeed 0.19.8). Without contiguous_gradients there is
    none, but each bucket is flattened when it is reduced (allreduce_bucket): one bucket either way. The all-gather
    after the step writes in place into the flat parameter buffer (runtime/utils.py all_gather_into_tensor_dp_groups):
    no bucket of its own. ZeRO-3 keeps one (stage3.py __ipg_bucket_flat_buffer)."""
    return bucket_elements * REDUCE_BUCKET_BYTES_PER_ELEMENT * buffers


def bucket_bytes(knobs: Knobs, *, zero_stage: int, pipeline: bool = False) -> float:
    """The gradient-reduce buffers allocated on top of the model states: the ZeRO-0 figure where the framework states
    one (its ZeRO-0 optimizer reduces another way); at ZeRO-1/2 where the framework sizes them by its reduce bucket
    (Knobs.reduce_bucket_elements: DeepSpeed's IPG buffers, reduce_buffer_bytes); at ZeRO-3 where gradients
    are reduced in buckets (zero3_reduce_bucket_elements), the one flat 16-bit buffer of that many elements
    DeepSpeed's ZeRO-3 keeps for them (stage3.py __ipg_bucket_flat_buffer, contiguous_gradients on); else the
    bucket."""
    optimizer = zero0_optimizer(knobs, pipeline=pipeline)
    if zero_stage == 0 and optimizer is not None and optimizer.bucket_bytes is not None:
        return optimizer.bucket_bytes  # the framework's ZeRO-0 optimizer (zero0_optimizer)
    if zero_stage in (1, 2) and knobs.reduce_bucket_elements is not None:
        return reduce_buffer_bytes(knobs.reduce_bucket_elements, buffers=knobs.reduce_bucket_buffers)
    bucketed = zero3_reduce_bucket_elements(knobs, zero_stage=zero_stage)
    if bucketed is not None:
        return reduce_buffer_bytes(bucketed, buffers=1)
    return knobs.bucket_bytes


def state_bytes_per_param(training: Training, *, zero_stage: int, dp: int, offload: str = Offload.NONE,
                          pipeline: bool = False) -> tuple[float, float, float]:
    """(weight, gradient, optimizer-state) bytes one GPU holds per parameter of its stage.

    ZeRO paper §5, Table 1: stage 1 shards the optimizer state over dp, stage 2 the gradients too, stage 3 the
    parameters too. Offload keeps gradients and optimizer state on the host (ZeRO-Offload) and, with
    optimizer+params, the parameters too (ZeRO-Infinity). At ZeRO-0 the optimizer the framework runs there
    (zero0_optimizer; `pipeline`: the model is one, pp > 1).
    """
    offloaded = offload != _OFFLOAD_NONE
    zero0 = zero0_optimizer(training, pipeline=pipeline) if zero_stage == 0 and not offloaded else None
    if zero0 is not None:
        param, grad, optimizer = zero0.state_bytes
        return param, grad, optimizer / dp if zero0.sharded else optimizer
    weights = 0.0 if offload == _OFFLOAD_PARAMS else training.param_bytes / (dp if zero_stage >= 3 else 1)
    grads = 0.0 if offloaded else training.grad_bytes / (dp if zero_stage >= 2 else 1)
    optim = 0.0 if offloaded else training.optimizer_bytes / (dp if zero_stage >= 1 else 1)
    return weights, grads, optim


class StageTime(NamedTuple):
    """One stage, one micro-batch. (StageTime and StageMemory are built 2 x pp times per estimate: immutable
    named tuples, which build several times faster than frozen dataclasses.)"""

    forward_seconds: float
    backward_seconds: float
    recompute_seconds: float
    tp_comm_seconds: float  # exposed
    weight_grad_seconds: float  # the weight-gradient GEMMs inside the backward (zero-bubble's W)
    # exposed CP KV exchange and EP all-to-all of the stage's layers, forward + backward: already inside
    # forward_seconds + backward_seconds (they sit on each micro-batch's critical path); the breakdown shows them apart
    cp_comm_seconds: float = 0.0
    ep_comm_seconds: float = 0.0
    cp_comm_total_seconds: float = 0.0  # before overlap, recomputed forwards included
    ep_comm_total_seconds: float = 0.0
    # exposed CP / EP traffic that recomputed forwards repeat: already inside recompute_seconds, shown apart
    cp_recompute_seconds: float = 0.0
    ep_recompute_seconds: float = 0.0

    @property
    def total_seconds(self) -> float:
        return self.forward_seconds + self.backward_seconds + self.recompute_seconds + self.tp_comm_seconds


class StageMemory(NamedTuple):
    stage: int
    layers: int
    params: float  # parameters held by one GPU of this stage before ZeRO sharding
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    transient_bytes: float
    overhead_bytes: float  # outside the caching allocator: CUDA context, NCCL, workspaces
    in_flight_micro_batches: float
    reserve_bytes: float = 0.0  # the caching allocator's reserve above the live dynamic bytes (fragmentation)

    @property
    def allocated_bytes(self) -> float:
        """Live tensors at the peak (what torch.cuda.max_memory_allocated reports)."""
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.transient_bytes)

    @property
    def reserved_bytes(self) -> float:
        """The caching allocator's pool at the peak (torch.cuda.max_memory_reserved)."""
        return self.allocated_bytes + self.reserve_bytes

    @property
    def total_bytes(self) -> float:
        """Device memory in use at the peak (reserved + memory outside the allocator): what decides an OOM."""
        return self.reserved_bytes + self.overhead_bytes


@dataclass(frozen=True, slots=True)
class StageLinear:
    """A stage as linear functions of its layer count n and fully recomputed layers r (see the module docstring).
    The split refinement and the ILP optimise over these; `StageModel.time/memory` evaluate the same terms."""

    layer_seconds: float
    recompute_seconds: float
    extra_seconds: float
    layer_state_bytes: float  # weights + gradients + optimizer state per layer
    layer_act_policy_bytes: float  # activations per layer, all micro-batches in flight, the layout's policy
    layer_act_full_bytes: float  # the same under full recompute
    fixed_bytes: float  # embedding/output states and activations, buckets, overhead, one recomputed layer


_StateBytes = tuple[float, float, float, int, tuple[float, float, float] | None]


class StageModel(NamedTuple):
    """Every stage of one layout: `time(i)`, `memory(i)` at the layout's split, `linear(i)` for any split."""

    layout: Layout
    training: Training
    knobs: Knobs
    lc: LayerCosts
    split: tuple[int, ...]
    full_layers: tuple[int, ...]  # fully recomputed layers per stage
    schedule: Schedule  # as run: 1f1b when there is no pipeline
    virtual_stages: int
    overheads: tuple[float, ...]  # per stage, bytes outside the caching allocator (overhead_bytes_per_stage)

    @property
    def pp(self) -> int:
        return self.layout.pp

    def extra_forward_seconds(self, i: int) -> float:
        return self.lc.t_logits_forward if i == self.layout.pp - 1 else 0.0

    def params(self, i: int) -> float:
        """Parameters one GPU of stage i holds (before ZeRO sharding)."""
        return self.params_per_stage()[i]

    def params_per_stage(self) -> list[float]:
        """params(i) of every stage: its layers', the embedding's on the first stage, the output layer's and the
        final norm's on the last."""
        lc = self.lc
        lp = lc.layer_params
        params = [n * lp for n in self.split]
        params[0] += lc.embedding_params
        params[-1] += lc.output_params + lc.final_norm_params
        return params

    def time(self, i: int) -> StageTime:
        lc, n, r = self.lc, self.split[i], self.full_layers[i]
        ext, extra = lc.extras, self.extra_forward_seconds(i)
        pol, full = ext.recomputed(lc.policy), ext.recomputed("full")
        f = n * lc.t_layer_forward + extra
        return StageTime(
            forward_seconds=f,
            backward_seconds=BACKWARD_OVER_FORWARD * f,
            recompute_seconds=(n - r) * lc.t_recompute_policy + r * lc.t_recompute_full,
            tp_comm_seconds=lc.comm_seconds(n, r),
            weight_grad_seconds=n * lc.gemm_flops_per_gpu / lc.rate_flops_per_second + extra,
            cp_comm_seconds=n * ext.cp_seconds,
            ep_comm_seconds=n * ext.ep_seconds,
            cp_comm_total_seconds=n * ext.cp_total_seconds + (n - r) * pol.cp_total_seconds + r * full.cp_total_seconds,
            ep_comm_total_seconds=n * ext.ep_total_seconds + (n - r) * pol.ep_total_seconds + r * full.ep_total_seconds,
            cp_recompute_seconds=(n - r) * pol.cp_seconds + r * full.cp_seconds,
            ep_recompute_seconds=(n - r) * pol.ep_seconds + r * full.ep_seconds,
        )

    def times(self) -> tuple[StageTime, ...]:
        """time(i) of every stage; stages alike in layers, recomputed layers and role share one result."""
        last = self.pp - 1
        known: dict[tuple[int, int, bool], StageTime] = {}
        out: list[StageTime] = []
        run = (-1, -1)  # (layers, recomputed layers) of the run of alike stages `t` belongs to
        for i, (n, r) in enumerate(zip(self.split, self.full_layers, strict=True)):
            if (n, r) != run or i == last:
                run, key = (n, r), (n, r, i == last)
                t = known.get(key) or known.setdefault(key, self.time(i))
            out.append(t)
        return tuple(out)

    def in_flight(self, i: int) -> float:
        """Micro-batches whose activations stage i holds at its peak (the whole local batch without micro-batching)."""
        return self.in_flights(stages=(i,))[0]

    def in_flights(self, stages: Sequence[int] | None = None) -> list[float]:
        """in_flight(i) of the given stages (all by default)."""
        lay = self.layout
        stages = range(lay.pp) if stages is None else stages
        if self.schedule == _NAIVE:
            return [float(lay.num_micro_batches)] * len(stages)
        return in_flight_per_stage(schedule=self.schedule, pp=lay.pp, num_micro_batches=lay.num_micro_batches,
                                   virtual_stages=self.virtual_stages, stages=stages)

    def activations_per_micro_batch(self) -> list[float]:
        """Activation bytes of one micro-batch, per stage, that its in-flight count multiplies: its layers under their
        policy, the embedding's on the first stage; where the pipeline engine keeps it (knobs.keeps_stage_output:
        DeepSpeed's pipe engine), every other stage's output, a layer input's shape, until its backward. The output
        layer's are apart (output_activation_bytes): they live in the global last stage only."""
        lc, last = self.lc, self.layout.pp - 1
        ap, af = lc.act_policy_bytes, lc.act_full_bytes
        out = [(n - r) * ap + r * af for n, r in zip(self.split, self.full_layers, strict=True)]
        out[0] += lc.embedding_act_bytes
        if self.knobs.keeps_stage_output:
            out[:last] = [x + af for x in out[:last]]
        return out

    def output_in_flight(self) -> float:
        """Micro-batches whose output-layer activations (final norm, logits, loss) the last stage holds at its peak:
        those of the global last stage, which runs each micro-batch's backward right after its forward under
        1F1B, interleaved 1F1B and the zero-bubble schedules (one), and holds all m under GPipe and without
        micro-batching. Not the whole last stage's count, which under interleaving averages over its v chunks
        (((v - 1) p + 1) / v on the last rank), of which only the last holds the output layer."""
        lay = self.layout
        return in_flight_per_stage(schedule=self.schedule, pp=lay.pp, num_micro_batches=lay.num_micro_batches,
                                   stages=(lay.pp - 1,))[0]

    def receive_buffer_bytes(self, stages: Sequence[int] | None = None) -> tuple[list[float], list[float]]:
        """torch.distributed.pipelining's persistent receive buffers per stage (knobs.pp_receive_buffers), a layer
        input's shape each: (activation buffers beyond the in-flight micro-batches' own, which their first layer
        already keeps; gradient buffers). Every virtual stage but the global first holds m activation buffers, every
        one but the global last m gradient buffers. `stages`: those stages only (all by default)."""
        lay = self.layout
        p, v, m = lay.pp, self.virtual_stages, lay.num_micro_batches
        stages = range(p) if stages is None else stages
        if not self.knobs.pp_receive_buffers or p <= 1:
            return [0.0] * len(stages), [0.0] * len(stages)
        one, last = self.lc.act_full_bytes, p * v - 1
        acts, grads = [], []
        for i, flight in zip(stages, self.in_flights(stages), strict=True):
            chunks = [i + k * p for k in range(v)]
            acts.append(one * sum(g > 0 for g in chunks) * max(0.0, m - flight))
            grads.append(one * sum(g < last for g in chunks) * m)
        return acts, grads

    def transient_bytes(self, params: Sequence[float]) -> list[float]:
        """Buffers alive only for part of the step, per stage (`params`: params(i) of every stage): gradient
        buckets, the layer being recomputed, ZeRO-3's gathered unit, the offload bucket, the loss's backward."""
        lay, tr, lc = self.layout, self.training, self.lc
        base = bucket_bytes(self.knobs, zero_stage=lay.zero_stage, pipeline=lay.pp > 1) + lc.extras.transient_bytes
        # the layer in backward: its recompute materialised again and its MLP's gradients (the largest over the
        # stage's fully recomputed layers and its others)
        full, policy = lc.backward_working_bytes(full=True), lc.backward_working_bytes(full=False)
        out = [base + max(full if r > 0 else 0.0, policy if n > r else 0.0)
               for n, r in zip(self.split, self.full_layers, strict=True)]
        out[-1] += lc.loss_transient_bytes  # the loss's backward, on the last stage
        if lay.zero_stage >= 3 or lay.offload == _OFFLOAD_PARAMS:
            # the gathered unit (and the prefetched next one) plus its unsharded gradient before reduce-scatter
            module = self.knobs.zero3_gather != _GATHER_LAYER  # a Linear (or a parameter) at a time
            unit = lc.largest_module_params if module else lc.layer_params
            # the next unit is prefetched unless two would exceed DeepSpeed's stage3_max_live_parameters
            live = 1 if module and 2 * unit * lay.tp > ZERO3_MAX_LIVE_PARAMETERS else 2
            gathered = unit * (live * tr.param_bytes + tr.grad_bytes)
            # DeepSpeed keeps a recomputed module gathered until its backward when that is near enough
            # (zero3_regathered_modules): a fully recomputed layer enters its backward with all of those gathered
            kept = 0.0
            if module and lay.zero_stage >= 3 and any(self.full_layers):
                again = zero3_regathered_modules(lc.module_params,
                                                 max_reuse_distance=self.knobs.zero3_max_reuse_distance)
                kept = sum(n for n, a in zip(lc.module_params, again, strict=True) if not a)
            held = max(live * unit, kept) * tr.param_bytes + unit * tr.grad_bytes
            out = [x + (held if r > 0 else gathered) for x, r in zip(out, self.full_layers, strict=True)]
            if not module:
                out[-1] += fsdp_head_unit_params(lc) * tr.param_bytes
        if lay.offload != _OFFLOAD_NONE:
            shard, grad = lay.optimizer_shard_ranks, tr.grad_bytes  # one reduce bucket
            out = [x + min(P / shard, OFFLOAD_REDUCE_BUCKET_ELEMENTS) * grad for x, P in zip(out, params, strict=True)]
        return out

    def memory(self, i: int) -> StageMemory:
        return self.memories()[i]

    def memories(self, params: Sequence[float] | None = None) -> tuple[StageMemory, ...]:
        """memory(i) of every stage (`params`: params(i) of every stage, when the caller has them already)."""
        return self.memories_and_peak(params)[0]

    def memories_and_peak(self, params: Sequence[float] | None = None) -> tuple[tuple[StageMemory, ...], int]:
        """memories() and the index of the first stage with the most device memory (`StageMemory.total_bytes`)."""
        params = params or self.params_per_stage()
        w, g, o, fp8_shards, expert_states = self._states()
        ext, knobs, param_bytes = self.lc.extras, self.knobs, self.training.param_bytes
        fp8_w, expert_p = ext.fp8_weight_bytes, ext.expert_params
        reserve = knobs.allocator_reserve_fraction
        stash = self.schedule == _PIPEDREAM_ASYNC
        dynamic_grads = knobs.dynamic_grads  # per-parameter grads allocated every step carry the reserve too
        stages, best, peak = [], 0.0, 0
        recv_acts, recv_grads = self.receive_buffer_bytes()
        last, output_acts = self.layout.pp - 1, self.lc.output_act_bytes * self.output_in_flight()
        rows = zip(self.split, params, self.in_flights(), self.activations_per_micro_batch(),
                   self.transient_bytes(params), recv_acts, recv_grads, self.overheads, strict=True)
        for i, (n, P, flight, per_mb, transient, recv_act, recv_grad, overhead) in enumerate(rows):
            weights, grads, opt = P * w + n * fp8_w / fp8_shards, P * g, P * o
            if expert_states is not None:  # routed experts' states shard over EDP instead of DP x CP
                experts = n * expert_p
                weights += experts * (expert_states[0] - w)
                grads += experts * (expert_states[1] - g)
                opt += experts * (expert_states[2] - o)
            if stash:
                weights += max(0.0, flight - 1) * P * param_bytes  # stashed weight versions
            acts = per_mb * flight + recv_act + (output_acts if i == last else 0.0)
            transient += recv_grad
            spare = reserve * (acts + transient + (grads if dynamic_grads else 0.0))
            stages.append(_new_tuple(StageMemory, (i, n, P, weights, grads, opt, acts, transient, overhead, flight,
                                                   spare)))
            total = weights + grads + opt + acts + transient + spare + overhead  # = StageMemory.total_bytes
            if i == 0 or total > best:  # the first of the largest, as max() picks
                best, peak = total, i
        return tuple(stages), peak

    def _states(self) -> _StateBytes:
        """What every stage's model states share: bytes per parameter (weight, gradient, optimizer state) over
        DP x CP, the divisor of the FP8 weight copies, and the same three per routed-expert parameter, sharded over
        EDP instead (None without routed experts). An expert's weights live on the ep·etp ranks of its expert
        grid only, so ZeRO shards them over the ranks that hold the same expert: Megatron's distributed optimizer
        and its expert gradient buffers use the expert-data-parallel group (parallel_state
        get_expert_data_parallel_group), torchtitan's FSDP shards experts over dp_shard_mod_ep, DeepSpeed-MoE over
        its expert data-parallel groups (modern-training.md §3.5)."""
        lay = self.layout
        dc = lay.zero_shard_ranks  # states shard over DP x CP (Megatron: CP piggybacks on the DP group), or HSDP's group
        def states(dp: int) -> tuple[float, float, float]:
            return state_bytes_per_param(self.training, dp=dp, zero_stage=lay.zero_stage, offload=lay.offload,
                                         pipeline=lay.pp > 1)

        w, g, o = states(dc)
        experts = states(expert_data_parallel(lay)) if self.lc.extras.expert_params > 0 else None
        return w, g, o, dc if lay.zero_stage >= 3 else 1, experts

    def linear(self, i: int) -> StageLinear:
        """Stage i's coefficients for any (n, r). The fixed bytes include one recomputed layer's activations, so the
        memory row is a safe bound whether or not the stage recomputes (the estimate re-checks the result)."""
        lc, lay = self.lc, self.layout
        w, g, o = state_bytes_per_param(self.training, zero_stage=lay.zero_stage, dp=lay.zero_shard_ranks,
                                        pipeline=lay.pp > 1)
        flight = self.in_flight(i)
        exposed_ar = lc.t_tp_all_reduce * lc.tp_expose
        grow = 1 + self.knobs.allocator_reserve_fraction  # dynamic bytes carry the allocator's reserve (memory())
        per_state = w + o + g * (grow if self.knobs.dynamic_grads else 1.0)
        # transients as memory() counts them: buckets, CP/EP buffers, one layer's backward under either policy (a
        # safe bound)
        working = max(lc.backward_working_bytes(full=True), lc.backward_working_bytes(full=False))
        fixed = self.overheads[i] + (bucket_bytes(self.knobs, zero_stage=lay.zero_stage, pipeline=lay.pp > 1)
                                     + lc.extras.transient_bytes + working) * grow
        (recv_act,), (recv_grad,) = self.receive_buffer_bytes(stages=(i,))
        fixed += (recv_act + recv_grad) * grow
        if i == 0:
            fixed += lc.embedding_params * per_state + lc.embedding_act_bytes * flight * grow
        if i == self.pp - 1:
            fixed += ((lc.output_params + lc.final_norm_params) * per_state
                      + (lc.output_act_bytes * self.output_in_flight() + lc.loss_transient_bytes) * grow)
        elif self.knobs.keeps_stage_output:
            fixed += lc.act_full_bytes * flight * grow
        return StageLinear(
            layer_seconds=(1 + BACKWARD_OVER_FORWARD) * lc.t_layer_forward + lc.t_recompute_policy
            + TP_ALL_REDUCES_PER_LAYER * exposed_ar - lc.t_tp_backward_hidden,
            recompute_seconds=lc.t_recompute_full - lc.t_recompute_policy
            + TP_ALL_REDUCES_PER_RECOMPUTED_LAYER * exposed_ar,
            extra_seconds=(1 + BACKWARD_OVER_FORWARD) * self.extra_forward_seconds(i),
            layer_state_bytes=lc.layer_params * per_state,
            layer_act_policy_bytes=lc.act_policy_bytes * flight * grow,
            layer_act_full_bytes=lc.act_full_bytes * flight * grow,
            fixed_bytes=fixed,
        )


def stage_model(model: Transformer, training: Training, hw: Hardware, layout: Layout, knobs: Knobs) -> StageModel:
    """The stages of `layout`: its split (or THE split), its full-recompute counts, its schedule as run."""
    p = layout.pp
    split = layout.layers_per_stage or _stage_split(model.num_layers, p)
    full = layout.recompute_layers_per_stage or (split if layout.recompute == _REC_FULL else (0,) * p)
    schedule = (_SCHEDULES.get(layout.schedule) or Schedule(layout.schedule)) if p > 1 else _ONE_F_ONE_B
    v = layout.virtual_stages if schedule == _INTERLEAVED else 1
    lc = layer_costs(model, training, hw, layout, knobs)
    return StageModel(layout, training, knobs, lc, tuple(split), tuple(full), schedule, v,
                      overhead_bytes_per_stage(model, layout, knobs))


def overhead_bytes_per_stage(model: Transformer, layout: Layout, knobs: Knobs) -> tuple[float, ...]:
    """Memory outside the caching allocator on a GPU of each stage: the CUDA context and workspaces
    (knobs.per_process_overhead_bytes) and the NCCL communicators of the groups the framework's step uses
    (knobs.nccl_groups, cost_models/nccl.py): a stage with two pipeline neighbours holds one more send/recv pair."""
    p = layout.pp

    def at(stage: int) -> float:
        return knobs.per_process_overhead_bytes + communicator_bytes(communicator_group_sizes(
            knobs.nccl_groups, tp=layout.tp, dp=layout.dp, pp=p, stage=stage, cp=layout.cp, ep=layout.ep,
            tied_embeddings=model.tied_embeddings, dp_replicas=layout.zero_replicas), knobs.nccl_bytes_scale)
    if p == 1:
        return (at(0),)
    middle = (at(1),) * (p - 2) if p > 2 else ()  # every inner stage holds the same groups
    return (at(0), *middle, at(p - 1))
