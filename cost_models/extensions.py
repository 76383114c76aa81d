"""What context parallelism, expert parallelism and FP8 change in one layer on one GPU (stdlib only).

The stage model (cost_models/step.py) asks `layer_extras` once per estimate and folds the result into its
per-layer time, memory and parameter counts. Each term comes from the pure modules context_parallel.py,
moe.py and fp8.py (sources there, and ../shared/reference/modern-training.md). Rank order is Megatron's
tp-cp-ep-dp-pp: TP innermost, then CP; the expert grid is etp-ep-edp-pp (parallel folding, §3.5).
"""

from __future__ import annotations

from typing import NamedTuple

from cost_models import op_sac
from cost_models.attention import selective_recomputes_up_projections
from cost_models.communication import group_link
from cost_models.compute import fc1_gemm_flops, parameter_counts
from cost_models.context_parallel import cp_buffer_bytes, cp_traffic, cp_transfer_seconds, exposed_cp_seconds
from cost_models.fp8 import (
    fp8_gemm_speedup,
    fp8_weight_extra_bytes,
    quantization_seconds,
    saved_activation_saving_bytes,
)
from cost_models.inputs import Hardware, Knobs, Layout, Link, MoE, Training, Transformer
from cost_models.memory import mlp_intermediate_coefficient
from cost_models.moe import (
    dispatch_buffer_bytes,
    ep_all_to_all_seconds,
    ep_traffic,
    expert_kernel_seconds,
    expert_weight_count,
    routed_activation_bytes,
    routed_tokens_per_rank,
    router_activation_bytes,
)


class LayerExtras(NamedTuple):
    """Per layer, per micro-batch, per GPU, averaged over the layers (MoE and dense layers differ)."""

    tokens_per_rank: float  # b·s/cp: what every non-attention kernel processes
    gemm_time_factor: float  # time of the layer's GEMMs relative to bf16 (1/FP8 speedup, x imbalance on experts)
    cp_seconds: float  # exposed CP traffic, forward + backward
    ep_seconds: float  # exposed EP all-to-all, forward + backward
    fp8_quant_seconds: float  # casting fresh operands to FP8, forward + backward
    activation_delta_bytes: float  # MoE routed-token activations instead of a dense MLP's, minus FP8-saved inputs
    transient_bytes: float  # CP receive buffers and EP dispatch buffers live while one layer runs
    layer_params: float  # one layer's parameters on this GPU: dense part / tp, routed experts / (ep·etp), norms
    expert_params: float  # the routed-expert part of layer_params (its states shard over edp)
    fp8_weight_bytes: float  # FP8 weight copies of one layer on this GPU
    cp_total_seconds: float = 0.0  # CP traffic before overlap (for explanations), forward + backward
    ep_total_seconds: float = 0.0  # EP all-to-all before overlap, forward + backward
    # the forward's share of the above: what a recomputed forward runs again (`recomputed`)
    cp_forward_seconds: float = 0.0  # exposed
    ep_forward_seconds: float = 0.0  # exposed
    fp8_quant_forward_seconds: float = 0.0
    cp_forward_total_seconds: float = 0.0  # before overlap
    ep_forward_total_seconds: float = 0.0
    expert_kernel_seconds: float = 0.0  # per-expert kernels' fixed cost (moe.py expert_kernel_seconds), f+b
    expert_kernel_forward_seconds: float = 0.0
    # selective recompute runs the attention core again (Megatron's core_attn, with its CP exchange); False for MLA,
    # where it runs the up-projections (attention.up_projection_forward_flops) and no CP traffic
    selective_in_core_attention: bool = True

    @property
    def extra_seconds(self) -> float:
        return self.cp_seconds + self.ep_seconds + self.fp8_quant_seconds + self.expert_kernel_seconds

    def recomputed(self, recompute: str) -> Recomputed:
        """What recomputing one layer's forward in the backward repeats besides its FLOPs.

        full: the whole forward runs again (Megatron transformer_block.py `_checkpointed_forward`, te_checkpoint
        under FP8; torch.utils.checkpoint in torchtitan's full AC), so its CP exchange (TE's ring / all-gather /
        Ulysses all-to-all sit inside the core attention: megatron-core 0.16.1 extensions/transformer_engine.py
        L1228-1242 hands TEDotProductAttention the cp_group and cp_comm_type), its EP dispatch and combine
        all-to-alls (the MoE layer is inside the checkpoint) and its FP8 casts of fresh operands run again.
        selective: Megatron's default recompute_modules ["core_attn"] checkpoints `self.core_attention`
        (attention.py L328-331, L381-415, L1134), i.e. TEDotProductAttention with its CP exchange: the forward CP
        traffic repeats, EP (outside the attention) and the Linear layers' FP8 casts do not. MLA's selective
        recomputes the up-projections only (--recompute-modules mla_up_proj): no traffic repeats."""
        if recompute == "full":
            return Recomputed(self.cp_forward_seconds, self.ep_forward_seconds,
                              self.fp8_quant_forward_seconds + self.expert_kernel_forward_seconds,
                              self.cp_forward_total_seconds, self.ep_forward_total_seconds)
        if recompute == "selective" and self.selective_in_core_attention:
            return Recomputed(self.cp_forward_seconds, 0.0, 0.0, self.cp_forward_total_seconds, 0.0)
        return Recomputed(0.0, 0.0, 0.0, 0.0, 0.0)


class Recomputed(NamedTuple):
    """Per layer per micro-batch: the forward traffic and casts a recompute repeats (LayerExtras.recomputed)."""

    cp_seconds: float  # exposed
    ep_seconds: float  # exposed
    fp8_quant_seconds: float  # and the per-expert kernels' fixed cost
    cp_total_seconds: float  # before overlap
    ep_total_seconds: float

    @property
    def seconds(self) -> float:
        """Added to the layer's recompute time."""
        return self.cp_seconds + self.ep_seconds + self.fp8_quant_seconds


def expert_data_parallel(layout: Layout) -> int:
    """EDP = dp·cp·tp / (ep·etp): expert gradients reduce and expert optimizer states shard over it (§3.5)."""
    return max(1, layout.dp * layout.cp * layout.tp // (layout.ep * layout.etp))


def _moe_fraction(model: Transformer) -> float:
    return model.num_moe_layers / model.num_layers


def _layer_params(model: Transformer, layout: Layout) -> tuple[float, float]:
    pc = parameter_counts(model)
    frac = _moe_fraction(model)
    routed = pc.per_layer_routed_experts * frac
    mean = pc.layers / model.num_layers
    dense_part = mean - routed - pc.per_layer_norms
    experts = routed / (layout.ep * layout.etp)
    return dense_part / layout.tp + experts + pc.per_layer_norms, experts


def _moe_tokens(layout: Layout, tokens: float) -> float:
    """Tokens entering an MoE layer on one rank: sequence-parallel TP shards them by tp."""
    return tokens / layout.tp if layout.sequence_parallel else tokens


def _fp8_terms(model: Transformer, training: Training, hw: Hardware, layout: Layout, tokens: float
               ) -> tuple[float, float, float]:
    """(GEMM time factor, quantization seconds f+b, of which forward) for one layer's Linear GEMMs in FP8."""
    recipe = training.fp8_recipe
    if recipe is None:
        return 1.0, 0.0, 0.0
    t = layout.tp
    q, kv, h = model.num_attention_heads * model.head_dim, model.num_kv_heads * model.head_dim, model.hidden_size
    f = model.moe.expert_ffn_hidden_size if model.moe else model.ffn_hidden_size
    gated = 2 if model.swiglu else 1
    rows = tokens if not model.moe else max(1.0, tokens * model.moe.top_k * layout.ep / model.moe.num_experts)
    shapes = [(h, (q + 2 * kv) // t), (q // t, h), (h, gated * f // t), (f // t, h)]
    flops = [2 * tokens * k * n for k, n in shapes[:2]] + [2 * rows * k * n for k, n in shapes[2:]]
    time_fp8 = sum(fl / fp8_gemm_speedup(gemm_flops=fl, recipe=recipe) for fl in flops)
    factor = time_fp8 / sum(flops)
    fwd, bwd = quantization_seconds(tokens=int(tokens), shapes=shapes, recipe=recipe,
                                    hbm_bytes_per_second=hw.hbm_bytes_per_second)
    return factor, fwd + bwd, fwd


class _CpTerms(NamedTuple):
    exposed_seconds: float = 0.0  # forward + backward
    buffer_bytes: float = 0.0
    total_seconds: float = 0.0  # before overlap, forward + backward
    exposed_forward_seconds: float = 0.0
    total_forward_seconds: float = 0.0


def _cp_terms(model: Transformer, training: Training, hw: Hardware, layout: Layout, core_seconds: float
              ) -> _CpTerms:
    """CP of one layer: exposed seconds, transient bytes, seconds before overlap (and their forward parts)."""
    if layout.cp <= 1:
        return _CpTerms()
    kw = dict(micro_batch_size=layout.micro_batch_size, seq_length=training.seq_length, tp=layout.tp, cp=layout.cp,
              activation_bytes=training.activation_bytes)
    traffic = cp_traffic(model, variant=layout.cp_comm, **kw)
    link = group_link(hw, group_size=layout.cp, stride=layout.tp).link
    fwd, bwd = exposed_cp_seconds(traffic, variant=layout.cp_comm, cp=layout.cp, link=link,
                                  attention_forward_seconds=core_seconds, attention_backward_seconds=2 * core_seconds)
    total = cp_transfer_seconds(traffic, variant=layout.cp_comm, cp=layout.cp, link=link)
    fwd_total, _ = exposed_cp_seconds(traffic, variant=layout.cp_comm, cp=layout.cp, link=link,
                                      attention_forward_seconds=0.0, attention_backward_seconds=0.0)
    return _CpTerms(fwd + bwd, cp_buffer_bytes(model, variant=layout.cp_comm, **kw), total, fwd, fwd_total)


def _ep_seconds(moe: MoE, training: Training, hw: Hardware, layout: Layout, *, tokens: float, hidden_size: int,
                passes: int = 2) -> float:
    """Forward + backward (passes=2; forward only: 1) all-to-all seconds of one MoE layer: dispatch and combine of
    T·k token copies each way, split into NVLink and network bytes by the EP group's placement and the model's
    node-limited routing (moe.py ep_traffic). FP8 dispatch (1 B + 1x128 FP32 scales) with the DeepSeek-style
    blockwise recipe."""
    if layout.ep <= 1:
        return 0.0
    act_b = training.activation_bytes
    dispatch = 1 + 4 / 128 if training.fp8_recipe == "blockwise" else act_b
    copies = passes * tokens * moe.top_k * hidden_size * (dispatch + act_b)  # every copy, local ones included
    g, etp = hw.gpus_per_node, layout.etp
    per_node = max(1, min(layout.ep, g // etp)) if etp < g else 1  # EP ranks sit etp apart (etp-ep-edp-pp)
    traffic = ep_traffic(moe, copies_bytes=copies, ep=layout.ep, ranks_per_node=per_node)
    intra = hw.intra_node or Link(float("inf"), 0.0)
    net = None
    if hw.nic is not None:
        net = Link(hw.nics_per_node * hw.nic.bandwidth_bytes_per_second / g, hw.nic.latency_seconds)
    return ep_all_to_all_seconds(traffic, ep=layout.ep, intra=intra, network_per_gpu=net)


class _EpTerms(NamedTuple):
    exposed_seconds: float = 0.0  # forward + backward
    activation_delta_bytes: float = 0.0
    buffer_bytes: float = 0.0
    total_seconds: float = 0.0  # before overlap, forward + backward
    exposed_forward_seconds: float = 0.0
    total_forward_seconds: float = 0.0


def _ep_terms(model: Transformer, training: Training, hw: Hardware, layout: Layout, knobs: Knobs, tokens: float
              ) -> _EpTerms:
    """EP all-to-all seconds (exposed, before overlap, and their forward parts), activation delta bytes and dispatch
    buffer bytes of an MoE layer, averaged over the layers."""
    moe = model.moe
    if moe is None:
        return _EpTerms()
    frac, h, act_b = _moe_fraction(model), model.hidden_size, training.activation_bytes
    t_moe = _moe_tokens(layout, tokens)
    routed = routed_tokens_per_rank(moe, tokens=int(t_moe), imbalance=knobs.moe_imbalance)
    seconds = _ep_seconds(moe, training, hw, layout, tokens=t_moe * knobs.moe_imbalance, hidden_size=h)
    forward = _ep_seconds(moe, training, hw, layout, tokens=t_moe * knobs.moe_imbalance, hidden_size=h, passes=1)
    # replace the dense-MLP activations memory.py counted (mlp_intermediate_coefficient x f bytes per token / tp)
    # by the routed ones
    mlp = mlp_intermediate_coefficient(model, fused_swiglu=knobs.fused_swiglu)
    dense_mlp = tokens * mlp * model.ffn_hidden_size * act_b / 2 / layout.tp
    moe_mlp = (routed_activation_bytes(model, routed_tokens=routed, fused_swiglu=knobs.fused_swiglu,
                                       activation_bytes=act_b, etp=layout.etp)
               + tokens * mlp * moe.shared_expert_ffn_hidden_size * act_b / 2 / layout.tp
               + router_activation_bytes(tokens=int(t_moe), num_experts=moe.num_experts))
    buffer = dispatch_buffer_bytes(routed_tokens=routed, hidden_size=h, activation_bytes=act_b) if layout.ep > 1 else 0
    expose = (1 - knobs.ep_overlap_fraction) * frac
    return _EpTerms(seconds * expose, (moe_mlp - dense_mlp) * frac, buffer, seconds * frac, forward * expose,
                    forward * frac)


def _routed_fc1_rows_beyond_tokens(model: Transformer, layout: Layout, knobs: Knobs, tokens: float) -> float:
    """FC1 input rows of an MoE layer beyond one per token, averaged over the layers: TE's GroupedLinear keeps
    each expert's FP8 copy of its permuted input (Megatron "stores linear layer inputs in FP8", modern-training.md
    §1.3), i.e. T·k·γ rows (routed_activation_bytes' h per routed copy), where fp8.saved_activation_saving_bytes
    counts the dense layer's T."""
    assert model.moe is not None
    t_moe = _moe_tokens(layout, tokens)
    rows = routed_tokens_per_rank(model.moe, tokens=int(t_moe), imbalance=knobs.moe_imbalance)
    return (rows - t_moe) * _moe_fraction(model)


def _grouped_gemm_slowdown(model: Transformer, layout: Layout, knobs: Knobs, tokens: float) -> float:
    """How much slower the expert GEMMs run than the layer's GEMM efficiency assumes: the stage model rates every
    GEMM of a layer at the size of the dense FC1 (b·s·h·f), but each local expert's grouped-GEMM slice has only
    T·k·ep/E rows and width f_e (modern-training.md §3.6: DeepSeek-V3 at T = 4096, 8192 x 7168 x 2048). The same
    size-saturation curve x / (x + x_half) (cost_models/stage.py matmul_efficiency) at the two sizes gives the
    ratio; grouped GEMM itself runs at ~cuBLAS speed for a slice of that size (MegaBlocks §6.3: 98.6%)."""
    moe = model.moe
    assert moe is not None
    half = knobs.matmul_half_efficiency_gflop * 1e9
    rows = _moe_tokens(layout, tokens) * moe.top_k * layout.ep / moe.num_experts
    gated = 2 if model.swiglu else 1
    expert_gemm = 2 * rows * model.hidden_size * gated * moe.expert_ffn_hidden_size / layout.etp
    dense_gemm = fc1_gemm_flops(model, tokens=tokens, tp=layout.tp)
    return (dense_gemm / (dense_gemm + half)) / (expert_gemm / (expert_gemm + half))


def _expert_kernel_terms(model: Transformer, training: Training, hw: Hardware, layout: Layout, knobs: Knobs,
                         rate: float | None) -> tuple[float, float]:
    """(forward + backward, forward) seconds of an MoE layer's per-expert kernels' fixed cost, averaged over the
    layers; zero without MoE, without the knob, or without the layer's GEMM rate. The fixed cost is charged at the
    GPU's saturated GEMM rate (peak x MAMF fraction x end-to-end factor), not at the layer's achieved rate: that
    rate rises with the tokens, and a launch cost charged at it would fall as the work grows (four times the tokens
    of Qwen3-30B-A3B per micro-batch ran 35% faster)."""
    if model.moe is None or not knobs.moe_expert_kernel_gflop or not rate:
        return 0.0, 0.0
    saturated = hw.peak_flops_per_second * hw.matmul_efficiency * knobs.end_to_end_efficiency
    fwd, bwd = expert_kernel_seconds(local_experts=model.moe.num_experts // layout.ep,
                                     fp8=training.fp8_recipe is not None, kernel_gflop=knobs.moe_expert_kernel_gflop,
                                     rate_flops_per_second=saturated)
    frac = _moe_fraction(model)
    return (fwd + bwd) * frac, fwd * frac


def layer_extras(model: Transformer, training: Training, hw: Hardware, layout: Layout, knobs: Knobs, *,
                 gemm_flops_per_gpu: float, core_seconds: float, rate_flops_per_second: float | None = None
                 ) -> LayerExtras:
    """CP, EP and FP8 terms of one layer. `gemm_flops_per_gpu` and `core_seconds` are the layer's forward GEMM
    FLOPs and attention-core time per GPU for b·s/cp tokens, `rate_flops_per_second` its GEMM rate (the stage
    model computes all three)."""
    tokens = layout.micro_batch_size * training.seq_length / layout.cp
    factor, quant, quant_fwd = _fp8_terms(model, training, hw, layout, tokens)
    if model.moe is not None:
        expert = 2 * tokens * model.moe.top_k * expert_weight_count(model) / layout.tp * _moe_fraction(model)
        share = min(1.0, expert / max(gemm_flops_per_gpu, 1.0))
        factor *= 1 + (knobs.moe_imbalance * _grouped_gemm_slowdown(model, layout, knobs, tokens) - 1) * share
    cp = _cp_terms(model, training, hw, layout, core_seconds)
    ep = _ep_terms(model, training, hw, layout, knobs, tokens)
    kernels, kernels_fwd = _expert_kernel_terms(model, training, hw, layout, knobs, rate_flops_per_second)
    params, experts = _layer_params(model, layout)
    fp8_weights = saving = 0.0
    if training.fp8_recipe is not None and not knobs.fp8_torchao_linear:  # torchao: neither term
        norms = parameter_counts(model).per_layer_norms
        fp8_weights = fp8_weight_extra_bytes(fp8_params=params - norms, recipe=training.fp8_recipe,
                                             fp8_param_gather=training.fp8_param_gather)
        ffn = model.moe.expert_ffn_hidden_size * model.moe.top_k if model.moe else model.ffn_hidden_size
        rep = layout.tp if layout.sequence_parallel else 1
        saving = saved_activation_saving_bytes(tokens=int(tokens), hidden_size=model.hidden_size // rep,
                                               q_width=model.num_attention_heads * model.head_dim // layout.tp,
                                               ffn=ffn // layout.tp)
        if model.moe is not None:  # the experts' FC1 input is every routed copy (T·k·γ rows), kept in FP8 as well
            saving += _routed_fc1_rows_beyond_tokens(model, layout, knobs, tokens) * model.hidden_size
    return LayerExtras(
        tokens_per_rank=tokens, gemm_time_factor=factor, cp_seconds=cp.exposed_seconds, ep_seconds=ep.exposed_seconds,
        fp8_quant_seconds=quant, activation_delta_bytes=ep.activation_delta_bytes - saving,
        transient_bytes=cp.buffer_bytes + ep.buffer_bytes, layer_params=params, expert_params=experts,
        fp8_weight_bytes=fp8_weights, cp_total_seconds=cp.total_seconds, ep_total_seconds=ep.total_seconds,
        cp_forward_seconds=cp.exposed_forward_seconds, ep_forward_seconds=ep.exposed_forward_seconds,
        fp8_quant_forward_seconds=quant_fwd, cp_forward_total_seconds=cp.total_forward_seconds,
        ep_forward_total_seconds=ep.total_forward_seconds, expert_kernel_seconds=kernels,
        expert_kernel_forward_seconds=kernels_fwd, selective_in_core_attention=not selective_recomputes_up_projections(model)
        and not op_sac.in_effect(model, knobs.selective_op_sac),
    )
