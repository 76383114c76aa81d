"""Parameter counts, FLOPs, MFU/HFU (standard library only).

Attention convention: the FULL s^2 score matrix is counted (no causal halving), as Narayanan et al. 2021
Eq. 3, Korthikanti et al. 2022 Eq. 7, PaLM Appendix B and torchtitan do, and as every published MFU in
../shared/validation was computed (Megatron halved it only in 2025-03; cost-models.md §3.4, §10.4).
Every FLOP count here counts a multiply-add as 2 FLOPs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cost_models.attention import (
    attention_extra_count,
    attention_weight_count,
    core_attention_forward_flops,
    up_projection_forward_flops,
)
from cost_models.inputs import Transformer
from cost_models.memo import per_model
from cost_models.moe import mlp_forward_flops_per_token, mlp_parameter_counts


@dataclass(frozen=True, slots=True)
class ParameterCounts:
    embedding: int  # word embeddings (unpadded vocabulary)
    position_embedding: int
    per_layer: int  # one layer (an MoE layer with all its experts when the model has MoE layers)
    per_layer_norms: int  # part of per_layer that TP replicates (norm weights)
    layers: int  # sum over all layers (dense and MoE)
    final_norm: int
    output_layer: int  # 0 when tied to the embedding
    total: int
    active: int = 0  # parameters one token uses (MoE: k of E routed experts); equals total for dense models
    per_dense_layer: int = 0  # a dense layer of an MoE model (DeepSeek's first layers); = per_layer when dense
    per_layer_routed_experts: int = 0  # routed-expert part of per_layer (sharded by EP, not by TP)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _norm_count(model: Transformer) -> int:
    return 0 if not model.norm_has_params else (model.hidden_size if model.rms_norm else 2 * model.hidden_size)


def layer_parameter_count(model: Transformer) -> tuple[int, int]:
    """(parameters of one transformer layer, of which norm weights). Biases as GPT-2/3 when model.bias.

    For an MoE model this is an MoE layer with all its experts; parameter_counts() adds the dense layers."""
    mlp = mlp_parameter_counts(model)
    norms = model.norms_per_layer * _norm_count(model)
    attention = attention_weight_count(model) + attention_extra_count(model)
    return attention + (mlp.moe_layer_total if model.moe else mlp.dense_layer) + norms, norms


@per_model
def parameter_counts(model: Transformer) -> ParameterCounts:
    """Exact parameter count of the model as built (GPT-3 175B: 174,615,846,912 incl. the final LayerNorm;
    Mixtral-8x7B 46,702,792,704; DeepSeek-V3 671,026,419,200: tests/test_model_families.py)."""
    h = model.hidden_size
    per_layer, norms = layer_parameter_count(model)
    mlp = mlp_parameter_counts(model)
    per_dense = per_layer - (mlp.moe_layer_total - mlp.dense_layer if model.moe else 0)
    n_moe = model.num_moe_layers
    layers = per_layer * n_moe + per_dense * (model.num_layers - n_moe)
    embedding = model.vocab_size * h
    position = model.max_position_embeddings * h if model.learned_position_embeddings else 0
    final_norm = _norm_count(model)
    output = 0 if model.tied_embeddings else model.vocab_size * h
    total = embedding + position + layers + final_norm + output
    inactive = (mlp.moe_layer_total - mlp.moe_layer_active) * n_moe
    return ParameterCounts(
        embedding=embedding,
        position_embedding=position,
        per_layer=per_layer,
        per_layer_norms=norms,
        layers=layers,
        final_norm=final_norm,
        output_layer=output,
        total=total,
        active=total - inactive,
        per_dense_layer=per_dense,
        per_layer_routed_experts=mlp.moe_layer_routed,
    )


def layer_forward_flops(model: Transformer, *, tokens: int, seq_length: int) -> tuple[float, float]:
    """Forward FLOPs of one layer for `tokens` tokens in sequences of `seq_length`: (GEMM part, attention core),
    averaged over the layers when they differ (MoE and dense layers, windowed and global attention).

    GEMMs: 2 T x the projection weights (QKV 2T h (q + 2kv), output 2T q h; MLA's latent projections) plus the MLP
    2T h f x (2 GeLU | 3 SwiGLU), for MoE the k routed experts, shared experts and router (cost_models/moe.py).
    Attention core: Q K^T and P V, 2 x 2 T s q (Narayanan et al. 2021 Appendix: 4 B s^2 h for MHA), scaled by the
    window for sliding-window layers (cost_models/attention.py).
    """
    gemm = 2.0 * tokens * _attention_weights(model) + tokens * _mlp_flops_per_token(model)
    core = core_attention_forward_flops(model, tokens=tokens, seq_length=seq_length)
    return float(gemm), float(core)


_attention_weights = per_model(attention_weight_count)
_mlp_flops_per_token = per_model(mlp_forward_flops_per_token)


def fc1_gemm_flops(model: Transformer, *, tokens: float, tp: int) -> float:
    """The dense FC1 GEMM of `tokens` tokens on one of `tp` ranks, 2 T h f / tp: the GEMM whose size sets a layer's
    GEMM rate (stage.matmul_efficiency; extensions' grouped-GEMM slowdown compares the experts' slices with it)."""
    return 2 * tokens * model.hidden_size * model.ffn_hidden_size / tp


def logits_forward_flops(*, tokens: int, hidden_size: int, vocab_size: int) -> float:
    return 2.0 * tokens * hidden_size * vocab_size


def recompute_extra_forward_flops(model: Transformer, *, tokens: int, seq_length: int, recompute: str) -> float:
    """Hardware FLOPs added per layer by recomputation (and by flash attention's backward).

    full: one more forward of the layer (Narayanan Eq. 3, the 96 vs 72 coefficient).
    selective: one more forward of the attention core, 4 T s q. Korthikanti et al. 2022 Eq. 8 writes
      1 + s/(3h), i.e. three times that (the core's forward and backward again); we keep Eq. 3's own
      accounting (recompute = one extra forward) and record the difference (tests/test_cost_vectors.py).
      MLA: its up-projections instead (attention.up_projection_forward_flops; the core stays fused).
    Flash attention's backward recomputes Q K^T once more, 2 T s q (FlashAttention §3.1; torchtitan's
    comment: "flash attention does 1 more matmul recomputation in the backward").
    """
    gemm, core = layer_forward_flops(model, tokens=tokens, seq_length=seq_length)
    return recompute_extra_of(gemm, core, flash_attention=model.flash_attention, recompute=recompute,
                              selective=up_projection_forward_flops(model, tokens=tokens))


def recompute_extra_of(gemm: float, core: float, *, flash_attention: bool, recompute: str,
                       selective: float | None = None) -> float:
    """recompute_extra_forward_flops from a layer's forward (GEMM, attention core) FLOPs. `selective`: what
    selective recompute runs again where it is not the attention core (MLA's up-projections,
    attention.up_projection_forward_flops); None: the core."""
    flash_extra = core / 2 if flash_attention else 0.0
    if recompute == "full":
        return gemm + core + flash_extra
    if recompute == "selective":
        return (core if selective is None else selective) + flash_extra
    return flash_extra


def model_flops_per_step(model: Transformer, *, global_batch_size: int, seq_length: int, vocab_size: int | None = None) -> float:
    """Model FLOPs of one training step (forward + backward = 3 x forward, no recompute).

    For GPT (MHA, f = 4h) this equals Korthikanti et al. 2022 Eq. 7: 72 B s L h^2 (1 + s/(6h) + V/(12 h L)).
    """
    return step_flops(model, global_batch_size=global_batch_size, seq_length=seq_length, vocab_size=vocab_size)[0]


def hardware_flops_per_step(
    model: Transformer, *, global_batch_size: int, seq_length: int, recompute: str, vocab_size: int | None = None
) -> float:
    """Model FLOPs plus recomputation (full recompute of a GPT equals Narayanan Eq. 3, the 96 coefficient)."""
    return step_flops(model, global_batch_size=global_batch_size, seq_length=seq_length, vocab_size=vocab_size,
                      recompute=recompute)[1]


def step_flops(model: Transformer, *, global_batch_size: int, seq_length: int, vocab_size: int | None = None,
               recompute: str = "none") -> tuple[float, float, float]:
    """(model FLOPs, hardware FLOPs, one layer's recompute extra) of one step, from one layer_forward_flops:
    model FLOPs = 3 x (L x layer forward + logits), hardware FLOPs = model FLOPs + L x the extra forward FLOPs
    recomputation adds per layer (recompute_extra_forward_flops)."""
    tokens = global_batch_size * seq_length
    gemm, core = layer_forward_flops(model, tokens=tokens, seq_length=seq_length)
    v = vocab_size or model.vocab_size
    model_flops = 3 * (model.num_layers * (gemm + core)
                       + logits_forward_flops(tokens=tokens, hidden_size=model.hidden_size, vocab_size=v))
    extra = recompute_extra_of(gemm, core, flash_attention=model.flash_attention, recompute=recompute,
                               selective=up_projection_forward_flops(model, tokens=tokens))
    return model_flops, model_flops + model.num_layers * extra, extra


def flops_narayanan_eq3(*, global_batch_size: int, seq_length: int, num_layers: int, hidden_size: int, vocab_size: int) -> float:
    """Narayanan et al. 2021 Eq. 3 (GEMMs, one recompute forward): 96 B s l h^2 (1 + s/(6h) + V/(16 l h))."""
    B, s, l, h, V = global_batch_size, seq_length, num_layers, hidden_size, vocab_size
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def flops_korthikanti_eq7(*, global_batch_size: int, seq_length: int, num_layers: int, hidden_size: int, vocab_size: int) -> float:
    """Korthikanti et al. 2022 Eq. 7 (model FLOPs): 72 B s L h^2 (1 + s/(6h) + V/(12 h L))."""
    B, s, l, h, V = global_batch_size, seq_length, num_layers, hidden_size, vocab_size
    return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * h * l))


