"""One training step: iteration time with its breakdown, throughput, MFU/HFU and peak memory per GPU.

Pure function of (model, training, hardware, layout, knobs); every modelling assumption is a `Knobs` field with a
documented default. `estimate_step` is a composition: the stage model (cost_models/stage.py: per-stage time and
memory), the pipeline makespan (pipeline.py), pipeline send/receive, data-parallel traffic (data_parallel.py), the
optimizer step and offload, then the totals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cost_models.communication import group_link, p2p_seconds, pp_neighbour_link
from cost_models.compute import recompute_extra_forward_flops, step_flops
from cost_models.data_parallel import (
    embedding_sync_seconds,
    overlap_window_seconds,
    replica_all_reduce_seconds,
    zero3_reduce_buckets,
    zero3_regathered_modules,
    zero_comm_seconds,
)
from cost_models.extensions import expert_data_parallel
from cost_models.fp8 import param_all_gather_bytes
from cost_models.inputs import (
    Hardware,
    Knobs,
    Layout,
    Link,
    Offload,
    Schedule,
    Training,
    Transformer,
    Zero3Gather,
)
from cost_models.pipeline import Makespan, pipeline_makespan
from cost_models.stage import (
    TP_ALL_REDUCES_PER_LAYER,
    TP_ALL_REDUCES_PER_RECOMPUTED_LAYER,
    LayerCosts,
    StageMemory,
    StageModel,
    StageTime,
    layer_costs,
    matmul_efficiency,
    stage_model,
    stage_split,
    zero0_states_sharded,
    zero3_reduce_bucket_elements,
)

__all__ = ["LayerCosts", "StageMemory", "StepEstimate", "TimeBreakdown", "estimate_step", "layer_costs",
           "matmul_efficiency", "stage_split"]

OPTIMIZER_STEP_BYTES_PER_PARAM = 32  # Adam: read fp32 param, grad, m, v; write param, m, v, bf16 copy [D]
CPU_ADAM_PARAMS_PER_SECOND_PER_NODE = 2e9  # DeepSpeedCPUAdam order of magnitude [U]
# Offloaded gradients are fp32 on the host: DeepSpeed's CPU Adam updates fp32 master weights from fp32 gradients
# (ZeRO-Offload, Ren et al. 2021 §4.1; DeepSpeed stage_1_and_2.py keeps single_partition_of_fp32_groups).
HOST_GRAD_BYTES = 4
ZERO3_MODULES_PER_LAYER = 4  # Linear modules DeepSpeed ZeRO-3 fetches one by one: QKV, proj, FC1, FC2 (GPT/Llama)

# enum members as module constants (reading them off the class is slow on Python 3.11; cost_models/stage.py)
_NAIVE, _ZERO_BUBBLE = Schedule.NAIVE, Schedule.ZERO_BUBBLE
_GATHER_LAYER, _GATHER_MODULE, _GATHER_PARAMETER = Zero3Gather.LAYER, Zero3Gather.MODULE, Zero3Gather.PARAMETER
_OFFLOAD_NONE, _OFFLOAD_PARAMS = Offload.NONE, Offload.OPTIMIZER_PARAMS


ZERO3_PARAM_PERSISTENCE_THRESHOLD = 1e5
"""DeepSpeed's stage3_param_persistence_threshold default: a parameter tensor with fewer elements is gathered once
and never released (ds_persist: v0.3.13 stage3.py persistent_parameters and zero/constants.py; runtime/zero/config.py
today), so biases and norm weights below it are not gathered per use."""


def gathered_tensors_per_module(model: Transformer, tp: int = 1) -> tuple[int, ...]:
    """Parameter tensors DeepSpeed's ZeRO-3 gathers per use of each of a layer's modules on one of `tp` ranks, in
    stage.layer_module_elements' order (norm, QKV, projection, norm, FC1, FC2; Megatron's GPT fuses QKV, and gate
    and up): each Linear's weight, and its bias or a norm's weight and bias only where it has
    ZERO3_PARAM_PERSISTENCE_THRESHOLD elements or more (the column-parallel biases are TP-sharded)."""
    h, hd, big = model.hidden_size, model.head_dim, ZERO3_PARAM_PERSISTENCE_THRESHOLD
    qkv_out = (model.num_attention_heads + 2 * model.num_kv_heads) * hd
    fc1_out = model.ffn_hidden_size * (2 if model.swiglu else 1)
    norm = (1 if model.rms_norm else 2) if h >= big else 0

    def linear(bias_elements: float, has_bias: bool) -> int:
        return 1 + (1 if has_bias and bias_elements >= big else 0)

    return (norm, linear(qkv_out / tp, model.bias or model.qkv_bias), linear(h, model.bias or model.o_bias), norm,
            linear(fc1_out / tp, model.bias), linear(h, model.bias))


def parameter_tensors_per_layer(model: Transformer) -> int:
    """Parameter tensors of one layer as Megatron's GPT builds it (fused QKV, fused gate and up under SwiGLU): the
    four Linear weights, their biases where the model has them, and the two norms' weights (and LayerNorm's biases)."""
    return ZERO3_MODULES_PER_LAYER * (2 if model.bias else 1) + 2 * (1 if model.rms_norm else 2)


def zero3_units_per_layer(model: Transformer, knobs: Knobs, tp: int = 1) -> tuple[int, int]:
    """(all-gathers, reduce-scatters) per layer of ZeRO-3 / FSDP: one each for a whole block (FSDP); one each per
    Linear module (DeepSpeed); under Zero3Gather.PARAMETER (DeepSpeed's ZeRO-3 of 2021) one gather per parameter
    tensor not kept resident (gathered_tensors_per_module) and one reduce-scatter per parameter tensor, resident
    ones included (partition_parameters.py _reduce_scatter_gradients loops over the bucket's parameters)."""
    if knobs.zero3_gather == _GATHER_PARAMETER:
        return sum(gathered_tensors_per_module(model, tp)), parameter_tensors_per_layer(model)
    if knobs.zero3_gather == _GATHER_MODULE:
        return ZERO3_MODULES_PER_LAYER, ZERO3_MODULES_PER_LAYER
    return 1, 1


def zero3_recompute_regathers(model: Transformer, knobs: Knobs, lc: LayerCosts, tp: int = 1) -> tuple[float, int]:
    """(elements, all-gathers) per fully recomputed layer that DeepSpeed's ZeRO-3 gathers a third time, for the
    backward of the modules its recompute released (data_parallel.zero3_regathered_modules); (0, 0) under FSDP,
    which gathers a whole block once for its recompute and backward. Gathers count as zero3_units_per_layer does:
    each Linear module, or under Zero3Gather.PARAMETER each tensor gathered_tensors_per_module counts."""
    if knobs.zero3_gather == _GATHER_LAYER:
        return 0.0, 0
    again = zero3_regathered_modules(lc.module_params, max_reuse_distance=knobs.zero3_max_reuse_distance)
    if knobs.zero3_gather == _GATHER_PARAMETER:
        counts = gathered_tensors_per_module(model, tp)
    else:
        counts = (0, 1, 1, 0, 1, 1)  # the four Linear modules of layer_module_elements' order
    elements = sum(n for n, a in zip(lc.module_params, again, strict=True) if a)
    gathers = sum(k for k, a in zip(counts, again, strict=True) if a)
    return elements, max(gathers, 1) if elements > 0 else 0


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    compute_seconds: float  # model FLOPs on the bottleneck stage, all micro-batches
    recompute_seconds: float
    tp_comm_seconds: float  # exposed
    pipeline_bubble_seconds: float
    pp_p2p_seconds: float  # exposed
    dp_comm_seconds: float  # exposed
    optimizer_seconds: float
    offload_seconds: float  # exposed
    dp_comm_total_seconds: float  # before overlap, for explanations
    tp_comm_total_seconds: float
    cp_comm_seconds: float = 0.0  # exposed CP KV exchange (ring steps not hidden, all-gather, Ulysses all-to-all)
    ep_comm_seconds: float = 0.0  # exposed EP dispatch/combine all-to-all
    cp_comm_total_seconds: float = 0.0  # before overlap, for explanations
    ep_comm_total_seconds: float = 0.0

    @property
    def total_seconds(self) -> float:
        return (self.compute_seconds + self.recompute_seconds + self.tp_comm_seconds + self.cp_comm_seconds
                + self.ep_comm_seconds + self.pipeline_bubble_seconds + self.pp_p2p_seconds + self.dp_comm_seconds
                + self.optimizer_seconds + self.offload_seconds)


@dataclass(frozen=True, slots=True)
class StepEstimate:
    step_seconds: float
    tokens_per_second: float
    tokens_per_second_per_gpu: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    mfu: float
    hfu: float
    peak_memory_bytes: float
    peak_stage: int
    gpu_memory_bytes: float
    host_memory_bytes_per_node: float
    host_memory_capacity_bytes: float
    fits: bool
    stages: tuple[StageMemory, ...]
    time: TimeBreakdown
    stage_seconds: tuple[float, ...]  # forward + backward per micro-batch, per stage
    matmul_efficiency: float
    padded_vocab_size: int

    @property
    def peak_allocated_bytes(self) -> float:
        """Live tensors on the peak stage (max_memory_allocated); peak_memory_bytes adds the reserve and context."""
        return self.stages[self.peak_stage].allocated_bytes

    @property
    def peak_reserved_bytes(self) -> float:
        return self.stages[self.peak_stage].reserved_bytes


def pp_p2p_seconds(hw: Hardware, training: Training, layout: Layout, model: Transformer, knobs: Knobs,
                   schedule: Schedule, virtual_stages: int) -> float:
    """Exposed pipeline send/receive: the fill and drain hops in full, the steady state's share not hidden
    (Megatron sends b s h / t activations per hop, scatter/gather or SP-sharded, Narayanan §4.1)."""
    p, m = layout.pp, layout.num_micro_batches
    if p == 1:
        return 0.0
    pp_link, _ = pp_neighbour_link(hw, tp=layout.tp, dp=layout.dp * layout.cp)
    msg = layout.micro_batch_size * training.seq_length // layout.cp * model.hidden_size * training.activation_bytes / layout.tp
    naive = schedule == _NAIVE
    one = p2p_seconds(message_bytes=msg * (m if naive else 1), link=pp_link)
    # Megatron forces overlap_p2p_comm off for its non-interleaved schedules (arguments.py validate_args); a
    # zero-bubble schedule is not upstream Megatron's and keeps the profile's share
    flat = virtual_stages == 1 and schedule != _ZERO_BUBBLE
    share = 0.0 if knobs.pp_overlap_needs_virtual and flat else knobs.pp_overlap_fraction
    steady = 0.0 if naive else (1 - share) * 2 * m * virtual_stages * one
    return 2 * (p - 1) * one + steady


def dp_comm_seconds(hw: Hardware, training: Training, model: Transformer, knobs: Knobs, sm: StageModel,
                    times: Sequence[StageTime], params: Sequence[float]) -> tuple[float, float]:
    """(total, exposed) data-parallel traffic of the slowest stage."""
    lay = sm.layout
    p, d = lay.pp, lay.dp * lay.cp  # gradients reduce over DP x CP
    # the sharding group (all of DP x CP unless hybrid sharding), and the replicas of hybrid sharding, further out
    shard = lay.zero_shard_ranks
    link = group_link(hw, group_size=shard, stride=lay.tp).link
    replica_link = group_link(hw, group_size=lay.zero_replicas, stride=lay.tp * shard).link
    # routed experts' gradients and shards move over EDP, whose ranks sit ep·etp apart (etp-ep-edp-pp): a group
    # with fewer ranks per node than DP x CP's, so a slower share of the node's NICs (StageModel._states)
    edp = expert_data_parallel(lay)
    experts = ((sm.lc.extras.expert_params, edp, group_link(hw, group_size=edp, stride=lay.ep * lay.etp).link)
               if sm.lc.extras.expert_params > 0 else None)
    tied, sync = p > 1 and model.tied_embeddings, 0.0
    if tied:  # embedding-gradient sync, first <-> last stage: not overlapped, it runs after the last backward
        sync = embedding_sync_seconds(hw, tp=lay.tp, dp=d, embedding_grad_bytes=sm.lc.padded_vocab
                                      * model.hidden_size / lay.tp * training.grad_reduce_bytes)
    units = zero3_units_per_layer(model, knobs, lay.tp)
    regather = zero3_recompute_regathers(model, knobs, sm.lc, lay.tp) if lay.zero_stage >= 3 else (0.0, 0)
    bucketed = zero3_reduce_bucket_elements(knobs, zero_stage=lay.zero_stage)
    # stages alike in parameters, layers and compute move the same traffic: computed once per kind of stage
    known: dict[tuple[float, int, float, float, int], tuple[float, float]] = {}
    total = exposed = 0.0
    traffic = (0.0, 0.0)
    seen: tuple[float, int, StageTime | None, int] = (-1.0, -1, None, -1)
    for i, (P, n, t, r) in enumerate(zip(params, sm.split, times, sm.full_layers, strict=True)):
        # a run of alike stages shares one StageTime object
        if t is not seen[2] or P != seen[0] or n != seen[1] or r != seen[3]:
            seen, key = (P, n, t, r), (P, n, t.forward_seconds, t.backward_seconds, r)
            traffic = known.get(key) or known.setdefault(
                key, _stage_dp_traffic(training, knobs, lay, (link, replica_link), key, units, regather,
                                       _bucketed_reduce_scatters(sm.lc, P, n, bucketed), experts))
        comm, hidden = traffic
        if tied and (i == 0 or i == p - 1):
            comm, hidden = comm + sync, hidden + sync
        if comm > total:  # max(total, comm), without the call
            total = comm
        if hidden > exposed:
            exposed = hidden
    return total, exposed


def _bucketed_reduce_scatters(lc: LayerCosts, params: float, layers: int, bucket: float | None) -> int | None:
    """Reduce-scatters per backward of a stage of `params` parameters and `layers` layers where gradients go in
    buckets of `bucket` elements (zero3_reduce_buckets; the head's and embeddings' elements are what the layers
    leave), None where they do not."""
    if bucket is None:
        return None
    return zero3_reduce_buckets(lc.module_params, layers=layers, bucket_elements=bucket,
                                other_elements=max(0.0, params - layers * sum(lc.module_params)))


def _stage_dp_traffic(training: Training, knobs: Knobs, lay: Layout, links: tuple[Link, Link],
                      stage: tuple[float, int, float, float, int], units: tuple[int, int],
                      regather: tuple[float, int] = (0.0, 0),
                      reduce_scatters: int | None = None,
                      experts: tuple[float, int, Link] | None = None) -> tuple[float, float]:
    """(traffic, exposed traffic) of one stage of (parameters, layers, forward and backward seconds per
    micro-batch, fully recomputed layers) under the layout's ZeRO stage; `units`: zero3_units_per_layer; `regather`:
    zero3_recompute_regathers; `reduce_scatters`: per backward where buckets decide (zero3_reduce_buckets); `links`:
    the sharding group's and, under hybrid sharding, the replicas'; `experts`: (routed-expert parameters per layer
    on this GPU, EDP, EDP's link): that part of the stage's parameters moves over EDP, the rest over DP x CP (None:
    no routed experts)."""
    params, layers, forward_seconds, backward_seconds, recomputed = stage
    d, m = lay.zero_shard_ranks, lay.num_micro_batches
    expert_params, edp, edp_link = experts or (0.0, 1, links[0])
    expert_params *= layers
    comm = window = 0.0
    if lay.dp * lay.cp > 1 or edp > 1:
        parts = ((params - expert_params, d, links[0]), (expert_params, edp, edp_link))
        again = (recomputed * regather[0] / params if params > 0 else 0.0, recomputed * regather[1])
        comm = sum(_zero_traffic(training, knobs, lay, part, layers, units, again, reduce_scatters)
                   for part in parts if part[0] > 0)
        comm += replica_all_reduce_seconds(zero_stage=lay.zero_stage, params=params, shard=d,
                                           grad_reduce_bytes=training.grad_reduce_bytes, replicas=lay.zero_replicas,
                                           num_micro_batches=m, link=links[1],
                                           reduce_once=knobs.hsdp_replica_reduce_once)
        window = overlap_window_seconds(zero_stage=lay.zero_stage, forward_seconds=forward_seconds,
                                        backward_seconds=backward_seconds, num_micro_batches=m)
    # the overlap knob is the share of this traffic hidden; it cannot hide behind more compute than there is
    share = knobs.zero3_overlap_fraction if lay.zero_stage >= 3 else knobs.dp_overlap_fraction
    if lay.zero_stage == 0 and knobs.ddp_overlap_fraction is not None:
        share = knobs.ddp_overlap_fraction
    return comm, comm - min(share * comm, window)  # (the exposed part)


def _zero_traffic(training: Training, knobs: Knobs, lay: Layout, part: tuple[float, int, Link], layers: int,
                  units: tuple[int, int], again: tuple[float, int], reduce_scatters: int | None) -> float:
    """zero_comm_seconds of `part` = (parameters, the group they shard and reduce over, its link); `again`: the
    share of the stage's parameters gathered again under recompute, and in how many all-gathers."""
    params, group, link = part
    return zero_comm_seconds(zero_stage=lay.zero_stage, params=params, dp=group, layers=layers,
                             grad_reduce_bytes=training.grad_reduce_bytes,
                             param_bytes=param_all_gather_bytes(param_bytes=training.param_bytes,
                                                                recipe=training.fp8_recipe,
                                                                fp8_param_gather=training.fp8_param_gather),
                             num_micro_batches=lay.num_micro_batches, link=link,
                             modules_per_layer=units[1], gathers_per_layer=units[0],
                             regathered_share=again[0], regathers=again[1], reduce_scatters=reduce_scatters,
                             grad_reduce=knobs.grad_reduce(lay.zero_stage),
                             zero0_gather=zero0_states_sharded(training, offload=lay.offload, pipeline=lay.pp > 1))


def optimizer_offload_seconds(hw: Hardware, training: Training, layout: Layout, knobs: Knobs, max_params: float,
                              times: Sequence[StageTime]) -> tuple[float, float]:
    """(optimizer step, exposed offload traffic) of the largest stage: Adam on the GPU bound by HBM, or CPU Adam
    plus the gradient/parameter copies over PCIe, and with optimizer+params the streamed parameters' share not
    hidden behind compute."""
    local = max_params / layout.optimizer_shard_ranks
    if layout.offload == _OFFLOAD_NONE:
        step_bytes = OPTIMIZER_STEP_BYTES_PER_PARAM - 2 * training.optimizer_state_saved_bytes
        return local * step_bytes / hw.hbm_bytes_per_second, 0.0
    h2d = hw.host_to_device.bandwidth_bytes_per_second
    optimizer = local * hw.gpus_per_node / CPU_ADAM_PARAMS_PER_SECOND_PER_NODE
    offload = local * (training.grad_bytes + training.param_bytes) / h2d
    if layout.offload == _OFFLOAD_PARAMS:
        m = layout.num_micro_batches
        stream = m * 2 * local * training.param_bytes / h2d
        window = m * (max(t.forward_seconds for t in times) + max(t.backward_seconds for t in times))
        offload += stream - min(knobs.zero3_overlap_fraction * stream, window)
    return optimizer, offload


def host_memory_bytes(hw: Hardware, training: Training, layout: Layout, max_params: float) -> float:
    """Host memory per node under offload: optimizer state and fp32 gradients (and parameters) of every GPU."""
    if layout.offload == _OFFLOAD_NONE:
        return 0.0
    local = max_params / layout.optimizer_shard_ranks
    host = local * (training.optimizer_bytes + HOST_GRAD_BYTES) * hw.gpus_per_node
    if layout.offload == _OFFLOAD_PARAMS:
        host += local * training.param_bytes * hw.gpus_per_node
    return host


def step_flops_of(model: Transformer, training: Training, layout: Layout, sm: StageModel) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs): model FLOPs plus recomputation; with per-stage recompute (the ILP's choice)
    the fully recomputed layers pay a whole forward and the others the base policy's extra."""
    B, s, V = training.global_batch_size, training.seq_length, sm.lc.padded_vocab
    per_stage = layout.recompute_layers_per_stage is not None
    mflops, hflops, policy_extra = step_flops(model, global_batch_size=B, seq_length=s, vocab_size=V,
                                              recompute=sm.lc.policy if per_stage else layout.recompute)
    if not per_stage:
        return mflops, hflops
    extra = recompute_extra_forward_flops(model, tokens=B * s, seq_length=s, recompute="full") - policy_extra
    return mflops, hflops + sum(sm.full_layers) * extra


def time_breakdown(sm: StageModel, times: Sequence[StageTime], span: Makespan, p2p: float, dp: tuple[float, float],
                   optimizer: float, offload: float) -> TimeBreakdown:
    i, m, lc = span.bottleneck_stage, sm.layout.num_micro_batches, sm.lc
    t = times[i]
    ar_count = sm.split[i] * TP_ALL_REDUCES_PER_LAYER + sm.full_layers[i] * TP_ALL_REDUCES_PER_RECOMPUTED_LAYER
    cp, ep = m * t.cp_comm_seconds, m * t.ep_comm_seconds  # inside the stage's forward + backward: shown apart
    cp_rec, ep_rec = m * t.cp_recompute_seconds, m * t.ep_recompute_seconds  # inside the recompute: shown apart
    return TimeBreakdown(
        compute_seconds=m * (t.forward_seconds + t.backward_seconds) - cp - ep,
        cp_comm_seconds=cp + cp_rec,
        ep_comm_seconds=ep + ep_rec,
        cp_comm_total_seconds=m * t.cp_comm_total_seconds,
        ep_comm_total_seconds=m * t.ep_comm_total_seconds,
        recompute_seconds=m * t.recompute_seconds - cp_rec - ep_rec,
        tp_comm_seconds=m * t.tp_comm_seconds,
        pipeline_bubble_seconds=span.bubble_seconds,
        pp_p2p_seconds=p2p,
        dp_comm_seconds=dp[1],
        optimizer_seconds=optimizer,
        offload_seconds=offload,
        dp_comm_total_seconds=dp[0],
        tp_comm_total_seconds=m * ar_count * lc.t_tp_all_reduce,
    )


def _stage_seconds(times: Sequence[StageTime]) -> tuple[float, ...]:
    """`total_seconds` of every stage, once per run of stages that share one StageTime (StageModel.times)."""
    out, last, total = [], None, 0.0
    for t in times:
        if t is not last:
            last, total = t, t.total_seconds
        out.append(total)
    return tuple(out)


def estimate_step(model: Transformer, training: Training, hw: Hardware, layout: Layout,
                  knobs: Knobs | None = None) -> StepEstimate:
    knobs = knobs or Knobs()
    sm = stage_model(model, training, hw, layout, knobs)
    times = sm.times()
    params = sm.params_per_stage()
    stage_seconds = _stage_seconds(times)
    span = pipeline_makespan(schedule=sm.schedule, stage_seconds=stage_seconds,
                             num_micro_batches=layout.num_micro_batches, virtual_stages=sm.virtual_stages,
                             weight_grad_seconds=[t.weight_grad_seconds for t in times])
    p2p = pp_p2p_seconds(hw, training, layout, model, knobs, sm.schedule, sm.virtual_stages)
    dp = dp_comm_seconds(hw, training, model, knobs, sm, times, params)
    max_params = max(params)
    optimizer, offload = optimizer_offload_seconds(hw, training, layout, knobs, max_params, times)
    stages, peak_index = sm.memories_and_peak(params)
    peak = stages[peak_index]
    host = host_memory_bytes(hw, training, layout, max_params)
    time = time_breakdown(sm, times, span, p2p, dp, optimizer, offload)
    step = span.seconds + p2p + dp[1] + optimizer + offload
    n_gpus = layout.tp * layout.pp * layout.dp * layout.cp
    tokens = training.global_batch_size * training.seq_length
    mflops, hflops = step_flops_of(model, training, layout, sm)
    return StepEstimate(
        step_seconds=step, tokens_per_second=tokens / step, tokens_per_second_per_gpu=tokens / step / n_gpus,
        model_flops_per_step=mflops, hardware_flops_per_step=hflops,
        mfu=mflops / (step * n_gpus * hw.peak_flops_per_second), hfu=hflops / (step * n_gpus * hw.peak_flops_per_second),
        peak_memory_bytes=peak.total_bytes, peak_stage=peak.stage, gpu_memory_bytes=hw.gpu_memory_bytes,
        host_memory_bytes_per_node=host, host_memory_capacity_bytes=hw.host_memory_bytes_per_node,
        fits=(peak.total_bytes + knobs.memory_headroom_bytes <= hw.gpu_memory_bytes
              and host <= hw.host_memory_bytes_per_node),
        stages=stages, time=time, stage_seconds=stage_seconds,
        matmul_efficiency=sm.lc.matmul_efficiency, padded_vocab_size=sm.lc.padded_vocab,
    )
