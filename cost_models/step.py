"""One training step: iteration time with its breakdown, throughput, MFU/HFU and peak memory per GPU.

Pure function of (model, training, hardware, layout, knobs). Every modelling assumption is a `Knobs`
field with a documented default. Time model (per stage, per micro-batch):

  forward  = layers x (GEMM + attention-core FLOPs / (peak x efficiency) + exposed TP comm) (+ logits, last stage)
  backward = 2 x forward compute + recompute + TP comm
and the pipeline makespan by schedule (cost-models.md §5, with uneven stages by the bottleneck form):
  naive  m x sum(t_i);  GPipe/1F1B  sum(t_i) + (m-1) max(t_i);  interleaved  m max + (sum - max)/v;
  ZB-H1  m max + (p-1)(t_f + t_B - t_W);  PipeDream async  m max (no flush).
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.communication import (
    all_gather_seconds,
    all_reduce_seconds,
    group_link,
    p2p_seconds,
    pp_neighbour_link,
    reduce_scatter_seconds,
    tp_bytes_per_layer_per_micro_batch,
)
from cost_models.compute import (
    hardware_flops_per_step,
    layer_forward_flops,
    model_flops_per_step,
    parameter_counts,
    recompute_extra_forward_flops,
)
from cost_models.inputs import Hardware, Knobs, Layout, Training, Transformer
from cost_models.memory import (
    activation_bytes_per_layer,
    embedding_activation_bytes,
    in_flight_micro_batches,
    output_activation_bytes,
    vocab_padded,
)
from cost_models.stage import stage_split

OPTIMIZER_STEP_BYTES_PER_PARAM = 32  # Adam: read fp32 param, grad, m, v; write param, m, v, bf16 copy [D]
CPU_ADAM_PARAMS_PER_SECOND_PER_NODE = 2e9  # DeepSpeedCPUAdam order of magnitude [U]
# A layer's forward + backward is 3 forward passes' worth of work: backward = 2 x forward (Narayanan et al. 2021
# Eq. 3, 72 = 3 x 24). The elementwise-traffic knob covers forward + backward, so the forward pays a third of it.
FORWARD_PASSES_PER_TRAINING_PASS = 3
# Offloaded gradients are fp32 on the host: DeepSpeed's CPU Adam updates fp32 master weights from fp32 gradients
# (ZeRO-Offload, Ren et al. 2021 §4.1; DeepSpeed stage_1_and_2.py keeps single_partition_of_fp32_groups).
HOST_GRAD_BYTES = 4
# DeepSpeed's default reduce_bucket_size (5e8 elements): one bucket of gradients is staged on the GPU before it is
# copied to the host under optimizer offload (deepspeed/runtime/zero/config.py).
OFFLOAD_REDUCE_BUCKET_ELEMENTS = 5e8


@dataclass(frozen=True, slots=True)
class StageMemory:
    stage: int
    layers: int
    params: float  # parameters held by one GPU of this stage before ZeRO sharding
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    transient_bytes: float
    overhead_bytes: float
    in_flight_micro_batches: float

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.transient_bytes + self.overhead_bytes)


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

    @property
    def total_seconds(self) -> float:
        return (self.compute_seconds + self.recompute_seconds + self.tp_comm_seconds + self.pipeline_bubble_seconds
                + self.pp_p2p_seconds + self.dp_comm_seconds + self.optimizer_seconds + self.offload_seconds)


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


def matmul_efficiency(hw: Hardware, knobs: Knobs, *, gemm_flops: float) -> float:
    """Achieved fraction of peak: MAMF fraction x size saturation x end-to-end factor.

    Size saturation x / (x + x_half), x the per-GPU GEMM size in GFLOP (small GEMMs run far from peak;
    Calculon uses steps 0.95 / 0.9 / 0.6 at 128 / 16 / 1 GFLOP, cost-models.md §6.3).
    """
    x = gemm_flops / 1e9
    return hw.matmul_efficiency * x / (x + knobs.matmul_half_efficiency_gflop) * knobs.end_to_end_efficiency


@dataclass(frozen=True, slots=True)
class LayerCosts:
    """Per-layer, per-micro-batch, per-GPU quantities of a layout: the linear coefficients from which every
    stage's time and memory are assembled (estimate_step, and the planner's split DP and ILP)."""

    t_layer_forward: float  # seconds, GEMMs + memory-bound kernels
    t_recompute_policy: float  # extra seconds per layer under the layout's recompute policy
    t_recompute_full: float  # extra seconds per layer under full recompute
    t_tp_all_reduce: float  # one TP all-reduce of b s h
    tp_expose: float
    t_logits_forward: float
    gemm_flops_per_gpu: float  # forward GEMM FLOPs of one layer on one GPU (weight-gradient work, ZB's W)
    rate_flops_per_second: float
    act_policy_bytes: float
    act_full_bytes: float
    act_none_bytes: float
    embedding_act_bytes: float
    output_act_bytes: float
    layer_params: float  # parameters of one layer on one GPU (TP-sharded; norms replicated)
    embedding_params: float
    output_params: float
    final_norm_params: float
    largest_module_params: float
    matmul_efficiency: float
    padded_vocab: int
    policy: str


def layer_costs(model: Transformer, training: Training, hw: Hardware, layout: Layout, knobs: Knobs,
                *, fused_swiglu: bool = False) -> LayerCosts:
    h, t = model.hidden_size, layout.tp
    b, s = layout.micro_batch_size, training.seq_length
    act_b = training.activation_bytes
    V = vocab_padded(model.vocab_size, tp=t)
    policy = "none" if layout.recompute == "full" else layout.recompute
    tokens = b * s
    peak = hw.peak_flops_per_second
    gemm, core = layer_forward_flops(model, tokens=tokens, seq_length=s)
    eff = matmul_efficiency(hw, knobs, gemm_flops=2 * tokens * h * model.ffn_hidden_size / t)
    rate = peak * eff
    sp = layout.sequence_parallel

    def act(rec):
        return activation_bytes_per_layer(model, seq_length=s, micro_batch_size=b, tp=t, sequence_parallel=sp,
                                          recompute=rec, activation_bytes=act_b, fused_swiglu=fused_swiglu)

    act_none = act("none")
    # memory-bound kernels (norms, softmax, activation functions, dropout, residual adds): their HBM traffic scales
    # with the layer's activations (s b h), not with h^2, so they weigh most on small models [fit: validation]
    t_layer_mem = knobs.elementwise_traffic_factor * act_none / hw.hbm_bytes_per_second / FORWARD_PASSES_PER_TRAINING_PASS
    tp_msg, _ = tp_bytes_per_layer_per_micro_batch(micro_batch_size=b, seq_length=s, hidden_size=h, tp=t,
                                                   activation_bytes=act_b)
    t_ar = 0.0
    if t > 1:
        t_ar = all_reduce_seconds(message_bytes=tp_msg, group_size=t, link=group_link(hw, group_size=t, stride=1).link)
    logits_gemm = 2 * tokens * h * V / t
    pc = parameter_counts(model)
    t_tp_dispatch = knobs.tp_layer_overhead_seconds / 3 if t > 1 else 0.0  # forward's share (backward = 2 forwards)
    return LayerCosts(
        t_layer_forward=(gemm + core) / t / rate + t_layer_mem + t_tp_dispatch,
        t_recompute_policy=recompute_extra_forward_flops(model, tokens=tokens, seq_length=s, recompute=policy) / t / rate,
        t_recompute_full=recompute_extra_forward_flops(model, tokens=tokens, seq_length=s, recompute="full") / t / rate
        + t_layer_mem,
        t_tp_all_reduce=t_ar,
        tp_expose=1 - knobs.tp_overlap_fraction,
        t_logits_forward=logits_gemm / (peak * matmul_efficiency(hw, knobs, gemm_flops=logits_gemm)),
        gemm_flops_per_gpu=gemm / t,
        rate_flops_per_second=rate,
        act_policy_bytes=act(policy),
        act_full_bytes=act("full"),
        act_none_bytes=act_none,
        embedding_act_bytes=embedding_activation_bytes(seq_length=s, micro_batch_size=b, hidden_size=h, tp=t,
                                                       sequence_parallel=sp, dropout=model.dropout),
        output_act_bytes=output_activation_bytes(seq_length=s, micro_batch_size=b, hidden_size=h, vocab_size=V, tp=t,
                                                 sequence_parallel=sp, activation_bytes=act_b),
        layer_params=(pc.per_layer - pc.per_layer_norms) / t + pc.per_layer_norms,
        embedding_params=V * h / t + pc.position_embedding,
        output_params=V * h / t if (not model.tied_embeddings or layout.pp > 1) else 0.0,
        final_norm_params=pc.final_norm,
        largest_module_params=max(h * model.ffn_hidden_size,
                                  h * (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim) / t,
        matmul_efficiency=eff,
        padded_vocab=V,
        policy=policy,
    )


def estimate_step(model: Transformer, training: Training, hw: Hardware, layout: Layout, knobs: Knobs | None = None,
                  *, fused_swiglu: bool = False) -> StepEstimate:
    knobs = knobs or Knobs()
    L, h = model.num_layers, model.hidden_size
    t, p, d = layout.tp, layout.pp, layout.dp
    b, m, s = layout.micro_batch_size, layout.num_micro_batches, training.seq_length
    v = layout.virtual_stages if layout.schedule == "interleaved_1f1b" else 1
    act_b = training.activation_bytes
    split = layout.layers_per_stage or stage_split(L, p)
    full_layers = layout.recompute_layers_per_stage or (
        split if layout.recompute == "full" else (0,) * p)
    lc = layer_costs(model, training, hw, layout, knobs, fused_swiglu=fused_swiglu)
    policy = lc.policy
    V = lc.padded_vocab
    peak = hw.peak_flops_per_second
    eff, rate = lc.matmul_efficiency, lc.rate_flops_per_second
    t_layer_f, t_rec_policy, t_rec_full = lc.t_layer_forward, lc.t_recompute_policy, lc.t_recompute_full
    t_ar, tp_expose, t_logits_f = lc.t_tp_all_reduce, lc.tp_expose, lc.t_logits_forward
    gemm_per_gpu = lc.gemm_flops_per_gpu

    # ---- per stage time per micro-batch --------------------------------------------------------------
    stage_f, stage_b, stage_rec, stage_tp, stage_w = [], [], [], [], []
    for i, n in enumerate(split):
        r = full_layers[i]
        last = i == p - 1
        f = n * t_layer_f + (t_logits_f if last else 0.0)
        rec = (n - r) * t_rec_policy + r * t_rec_full
        tp_comm = (n * 4 + r * 2) * t_ar * tp_expose
        stage_f.append(f)
        stage_b.append(2 * f)
        stage_rec.append(rec)
        stage_tp.append(tp_comm)
        stage_w.append(n * gemm_per_gpu / rate + (t_logits_f if last else 0.0))  # weight-gradient GEMMs (ZB's W)
    stage_t = [stage_f[i] + stage_b[i] + stage_rec[i] + stage_tp[i] for i in range(p)]
    bottleneck = max(range(p), key=lambda i: stage_t[i])
    t_max = stage_t[bottleneck]

    sched = layout.schedule if p > 1 else "1f1b"
    if sched == "naive":
        pipe = m * sum(stage_t)
    elif sched in ("gpipe", "1f1b"):
        pipe = sum(stage_t) + (m - 1) * t_max
    elif sched == "interleaved_1f1b":
        pipe = m * t_max + (sum(stage_t) - t_max) / v
    elif sched == "zero_bubble":
        tw = stage_w[bottleneck]
        pipe = m * t_max + (p - 1) * max(0.0, t_max - 2 * tw)
    else:  # pipedream_async: no flush, the bubble is amortised away
        pipe = m * t_max
    busy = m * t_max
    bubble = pipe - busy

    # ---- pipeline point-to-point ---------------------------------------------------------------------
    p2p = 0.0
    if p > 1:
        pp_link, _ = pp_neighbour_link(hw, tp=t, dp=d)
        msg = b * s * h * act_b / t  # Megatron scatter/gather (or SP-sharded) activations, Narayanan §4.1
        one = p2p_seconds(message_bytes=msg * (m if sched == "naive" else 1), link=pp_link)
        steady = 0.0 if sched == "naive" else (1 - knobs.pp_overlap_fraction) * 2 * m * v * one
        p2p = 2 * (p - 1) * one + steady

    # ---- parameters per stage, data-parallel traffic ---------------------------------------------------
    layer_sharded, emb_local, out_local = lc.layer_params, lc.embedding_params, lc.output_params
    stage_params = []
    for i, n in enumerate(split):
        params = n * layer_sharded
        if i == 0:
            params += emb_local
        if i == p - 1:
            params += out_local + lc.final_norm_params
        stage_params.append(params)

    z = layout.zero_stage
    dp_place = group_link(hw, group_size=d, stride=t)
    dp_total = dp_exposed = 0.0
    for i in range(p):
        P = stage_params[i]
        grad_msg = P * training.grad_reduce_bytes
        param_msg = P * training.param_bytes
        if d > 1:
            link, n_dp = dp_place.link, d
            if z == 0:
                comm, window = all_reduce_seconds(message_bytes=grad_msg, group_size=n_dp, link=link), stage_b[i]
            elif z == 1:
                comm = (reduce_scatter_seconds(message_bytes=grad_msg, group_size=n_dp, link=link)
                        + all_gather_seconds(message_bytes=param_msg, group_size=n_dp, link=link))
                window = stage_b[i]
            elif z == 2:
                comm = (m * reduce_scatter_seconds(message_bytes=grad_msg, group_size=n_dp, link=link)
                        + all_gather_seconds(message_bytes=param_msg, group_size=n_dp, link=link))
                window = m * stage_b[i]
            else:  # ZeRO-3 / FSDP: per layer, an all-gather forward, one backward, a reduce-scatter (ZeRO §7: 1.5x DP),
                # so the ring latency is paid once per layer per collective
                units = max(1, split[i])
                comm = m * units * (
                    2 * all_gather_seconds(message_bytes=param_msg / units, group_size=n_dp, link=link)
                    + reduce_scatter_seconds(message_bytes=grad_msg / units, group_size=n_dp, link=link))
                window = m * (stage_f[i] + stage_b[i])
        else:
            comm = window = 0.0
        exposed = max(0.0, comm - knobs.dp_overlap_fraction * window)
        if p > 1 and model.tied_embeddings and i in (0, p - 1):  # embedding-gradient sync, first <-> last stage
            pp_link, _ = pp_neighbour_link(hw, tp=t, dp=d)
            exposed += all_reduce_seconds(message_bytes=V * h / t * training.grad_reduce_bytes, group_size=2, link=pp_link)
        dp_total = max(dp_total, comm)
        dp_exposed = max(dp_exposed, exposed)

    # ---- optimizer step and offload ------------------------------------------------------------------
    P_max = max(stage_params)
    shard = d if z >= 1 else 1
    optimizer = offload = 0.0
    if layout.offload == "none":
        optimizer = P_max / shard * OPTIMIZER_STEP_BYTES_PER_PARAM / hw.hbm_bytes_per_second
    else:
        h2d = hw.host_to_device.bandwidth_bytes_per_second
        optimizer = P_max / shard * hw.gpus_per_node / CPU_ADAM_PARAMS_PER_SECOND_PER_NODE
        offload = P_max / shard * (training.grad_bytes + training.param_bytes) / h2d
        if layout.offload == "optimizer+params":
            stream = m * 2 * P_max / shard * training.param_bytes / h2d
            offload += max(0.0, stream - knobs.dp_overlap_fraction * m * (max(stage_f) + max(stage_b)))

    # ---- memory per stage ----------------------------------------------------------------------------
    act_policy, act_full, act_none = lc.act_policy_bytes, lc.act_full_bytes, lc.act_none_bytes
    emb_act, out_act = lc.embedding_act_bytes, lc.output_act_bytes
    largest_layer, largest_module = lc.layer_params, lc.largest_module_params
    stages = []
    for i, n in enumerate(split):
        P = stage_params[i]
        r = full_layers[i]
        offload_opt = layout.offload != "none"
        weights = P * training.param_bytes / (d if z >= 3 else 1)
        if layout.offload == "optimizer+params":
            weights = 0.0
        grads = 0.0 if offload_opt else P * training.grad_bytes / (d if z >= 2 else 1)
        optim = 0.0 if offload_opt else P * training.optimizer_bytes / shard
        flight = in_flight_micro_batches(schedule=sched if p > 1 else "1f1b", stage=i, pp=p,
                                         num_micro_batches=m, virtual_stages=v)
        if sched == "naive":
            flight = float(m)
        per_mb = (n - r) * act_policy + r * act_full
        if i == 0:
            per_mb += emb_act
        if i == p - 1:
            per_mb += out_act
        acts = per_mb * flight
        transient = knobs.bucket_bytes
        if r > 0:
            transient += act_none  # the layer being recomputed is materialised whole during backward
        if z >= 3 or layout.offload == "optimizer+params":
            # the gathered unit (and the prefetched next one) plus its unsharded gradient before reduce-scatter
            unit = largest_layer if knobs.zero3_gather == "layer" else largest_module
            transient += unit * (2 * training.param_bytes + training.grad_bytes)
        if offload_opt:
            transient += min(P / shard, OFFLOAD_REDUCE_BUCKET_ELEMENTS) * training.grad_bytes  # one reduce bucket
        if sched == "pipedream_async":
            weights += max(0.0, flight - 1) * P * training.param_bytes  # stashed weight versions
        stages.append(StageMemory(i, n, P, weights, grads, optim, acts, transient,
                                  knobs.per_process_overhead_bytes, flight))
    peak_stage = max(stages, key=lambda st: st.total_bytes)
    host = 0.0
    if layout.offload != "none":
        host = P_max / shard * (training.optimizer_bytes + HOST_GRAD_BYTES) * hw.gpus_per_node  # states + grads
        if layout.offload == "optimizer+params":
            host += P_max / shard * training.param_bytes * hw.gpus_per_node
    fits = (peak_stage.total_bytes + knobs.memory_headroom_bytes <= hw.gpu_memory_bytes
            and host <= hw.host_memory_bytes_per_node)

    # ---- totals --------------------------------------------------------------------------------------
    B = training.global_batch_size
    step = pipe + p2p + dp_exposed + optimizer + offload
    mflops = model_flops_per_step(model, global_batch_size=B, seq_length=s, vocab_size=V)
    hflops = hardware_flops_per_step(model, global_batch_size=B, seq_length=s, recompute=layout.recompute,
                                     vocab_size=V)
    if layout.recompute_layers_per_stage is not None:  # per-stage recompute (the ILP's choice)
        hflops = hardware_flops_per_step(model, global_batch_size=B, seq_length=s, recompute=policy, vocab_size=V)
        extra = (recompute_extra_forward_flops(model, tokens=B * s, seq_length=s, recompute="full")
                 - recompute_extra_forward_flops(model, tokens=B * s, seq_length=s, recompute=policy))
        hflops += sum(full_layers) * extra
    n_gpus = t * p * d
    i = bottleneck
    compute = m * (stage_f[i] + stage_b[i])
    time = TimeBreakdown(
        compute_seconds=compute,
        recompute_seconds=m * stage_rec[i],
        tp_comm_seconds=m * stage_tp[i],
        pipeline_bubble_seconds=bubble,
        pp_p2p_seconds=p2p,
        dp_comm_seconds=dp_exposed,
        optimizer_seconds=optimizer,
        offload_seconds=offload,
        dp_comm_total_seconds=dp_total,
        tp_comm_total_seconds=m * (split[i] * 4 + full_layers[i] * 2) * t_ar,
    )
    tokens_step = B * s
    return StepEstimate(
        step_seconds=step,
        tokens_per_second=tokens_step / step,
        tokens_per_second_per_gpu=tokens_step / step / n_gpus,
        model_flops_per_step=mflops,
        hardware_flops_per_step=hflops,
        mfu=mflops / (step * n_gpus * peak),
        hfu=hflops / (step * n_gpus * peak),
        peak_memory_bytes=peak_stage.total_bytes,
        peak_stage=peak_stage.stage,
        gpu_memory_bytes=hw.gpu_memory_bytes,
        host_memory_bytes_per_node=host,
        host_memory_capacity_bytes=hw.host_memory_bytes_per_node,
        fits=fits,
        stages=tuple(stages),
        time=time,
        stage_seconds=tuple(stage_t),
        matmul_efficiency=eff,
        padded_vocab_size=V,
    )
