"""Attention variants: GQA/MQA with an explicit head_dim, QKV bias, qk-norm, MLA, sliding windows (stdlib only).

Parameter counts follow the Hugging Face modules the configs describe (modern-training.md §4.1, §6.1);
FLOPs follow the project convention of cost_models/compute.py (the FULL s^2 score matrix, 2 FLOPs per
multiply-add), scaled for sliding windows by the average attended context of Megatron-Bridge's
flop_utils (modern-training.md §5).
"""

from __future__ import annotations

from cost_models.inputs import Transformer


def attention_weight_count(model: Transformer) -> int:
    """Weights of the attention projections of one layer (no biases, no norms): what the GEMMs multiply by.

    Standard/GQA: q h·a·d, k and v h·g·d each, o a·d·h. MLA (DeepSeek-V2/V3): q_a h·d'_c and q_b d'_c·a(d_n+d_r)
    (or one q_proj h·a(d_n+d_r) when q_lora_rank is null), kv_a h·(d_c+d_r), kv_b d_c·a(d_n+d_v), o a·d_v·h.
    """
    h, a = model.hidden_size, model.num_attention_heads
    mla = model.mla
    if mla is None:
        d = model.head_dim
        q, kv = a * d, model.num_kv_heads * d
        return h * (q + 2 * kv) + q * h
    q_out = a * mla.qk_head_dim
    q = h * q_out if mla.q_lora_rank is None else mla.q_lora_rank * (h + q_out)
    kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)
    return q + kv + a * mla.v_head_dim * h


def attention_extra_count(model: Transformer) -> int:
    """Attention parameters besides the projection weights: biases, qk-norm, MLA's latent norms.

    GPT-style `bias`: q, k, v and o biases. Qwen2 `qkv_bias`: q, k, v only (Qwen2.5-0.5B: 494,032,768 needs it).
    Llama `attention_bias`: `qkv_bias` and `o_bias`. Qwen3 `qk_norm`: two RMSNorms of size d. MLA: q_a_layernorm
    d'_c and kv_a_layernorm d_c; with `o_bias` (DeepSeek `attention_bias`) q_a (d'_c), kv_a (d_c + d_r) and o (h)
    carry biases; a plain q_proj (no q_lora_rank), q_b and kv_b never do (HF transformers@000c33fd
    modular_deepseek_v3.py DeepseekV3Attention: `q_proj = nn.Linear(..., bias=False)`).
    """
    h, a = model.hidden_size, model.num_attention_heads
    mla = model.mla
    if mla is not None:
        norms = (mla.q_lora_rank or 0) + mla.kv_lora_rank
        biases = 0
        if model.bias or model.o_bias:
            biases = (mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_rope_head_dim + h
        return norms + biases
    d = model.head_dim
    qkv = (a + 2 * model.num_kv_heads) * d
    if model.bias:
        extra = qkv + h
    else:
        extra = (qkv if model.qkv_bias else 0) + (h if model.o_bias else 0)
    return extra + (2 * d if model.qk_norm else 0)


def window_context(window: int, seq_length: int) -> float:
    """Average keys a query attends to under a causal window W over length s (Megatron-Bridge flop_utils
    L752-764): W - W(W-1)/(2s) for W < s, else (s+1)/2 (plain causal)."""
    if window >= seq_length:
        return (seq_length + 1) / 2
    return window - window * (window - 1) / (2 * seq_length)


def window_fraction(window: int | None, seq_length: int) -> float:
    """Core-attention FLOPs of a windowed layer relative to a full causal layer (1.0 without a window).
    Mistral-7B at s=16384, W=4096: 0.437 (modern-training.md §5)."""
    if not window:
        return 1.0
    return window_context(window, seq_length) / ((seq_length + 1) / 2)


def core_attention_forward_flops(model: Transformer, *, tokens: int, seq_length: int) -> float:
    """Forward FLOPs of the attention core (Q K^T and P V) of one layer, averaged over the layers.

    Full s^2 convention: 2·T·s·a·(d_qk + d_v); d_qk = d_v = d for standard attention (4 T s a d), d_n + d_r and
    d_v for MLA (1.25x MHA's core at V3's shapes, modern-training.md §4.2). Windowed layers are scaled by
    window_fraction; `sliding_window_layers` of the `num_layers` layers use the window.
    """
    a = model.num_attention_heads
    if model.mla is not None:
        per_head = model.mla.qk_head_dim + model.mla.v_head_dim
    else:
        per_head = 2 * model.head_dim
    full = 2.0 * tokens * seq_length * a * per_head
    if not model.sliding_window or not model.sliding_window_layers:
        return full
    local = min(model.sliding_window_layers, model.num_layers) / model.num_layers
    return full * (1 - local + local * window_fraction(model.sliding_window, seq_length))


def attention_saved_elements_per_token(model: Transformer) -> int:
    """Elements the attention block saves for backward per token and layer in the TP-sharded region: Q, K, V and
    the output-projection input O. Standard/GQA: a·d + 2·g·d + a·d (cost-models.md §2.6). MLA: Q and K at
    a·d_qk, V and O at a·d_v (V3: 81,920 of the 93,248 elements of modern-training.md §4.3; the rest is the norm
    output and mla_latent_elements_per_token)."""
    a, mla = model.num_attention_heads, model.mla
    if mla is None:
        d = model.head_dim
        return 2 * a * d + 2 * model.num_kv_heads * d
    return 2 * a * mla.qk_head_dim + 2 * a * mla.v_head_dim


def selective_recomputes_up_projections(model: Transformer) -> bool:
    """What `selective` recomputes: on an MLA model its up-projections (DeepSeek-V3 §3.2.3; Megatron
    --recompute-modules mla_up_proj), elsewhere the attention core (Megatron's default core_attn). The one rule the
    memory, FLOP and traffic terms of selective recompute follow."""
    return model.mla is not None


def selective_saved_elements_per_token(model: Transformer) -> int:
    """attention_saved_elements_per_token under selective recompute. MLA: the up-projections are recomputed
    (DeepSeek-V3 §3.2.3 'Recomputation of ... MLA Up-Projection'; Megatron --recompute-modules mla_up_proj), so Q,
    K and V are dropped and O kept: a·d_v (V3: 16,384 of 81,920; modern-training.md §4.3: 'drops Q, K, V').
    Otherwise the attention core is recomputed and its inputs Q, K, V stay saved (Korthikanti §5): as without."""
    mla = model.mla
    if mla is None or not selective_recomputes_up_projections(model):
        return attention_saved_elements_per_token(model)
    return model.num_attention_heads * mla.v_head_dim


def up_projection_forward_flops(model: Transformer, *, tokens: float) -> float | None:
    """The forward FLOPs selective recompute runs again on an MLA layer: its up-projections, 2 T (d'_c·a·d_qk +
    d_c·a(d_n + d_v)) (q_proj's h·a·d_qk without q_lora_rank; V3: 2 T x 54.5M). None without MLA, where selective
    recomputes the attention core instead (compute.recompute_extra_of)."""
    mla = model.mla
    if mla is None:  # selective_recomputes_up_projections: only MLA has up-projections
        return None
    a = model.num_attention_heads
    q_in = mla.q_lora_rank or model.hidden_size
    return 2.0 * tokens * (q_in * a * mla.qk_head_dim + mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim))


def mla_latent_elements_per_token(model: Transformer) -> int:
    """MLA's replicated latent activations per token: c_Q and its norm, the kv_a output, norm(c_KV)."""
    mla = model.mla
    if mla is None:
        return 0
    return 2 * (mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_rope_head_dim + mla.kv_lora_rank
