"""Memory per GPU: activations per layer, micro-batches in flight, the padded vocabulary (stdlib only).
Model states per parameter under ZeRO and offload are cost_models/stage.py's `state_bytes_per_param`.

Activation bytes follow Korthikanti et al. 2022 §4 (2-byte activations, 1-byte dropout masks), extended
to GQA, SwiGLU and no-dropout layers by the component list of cost-models.md §2.6 [D], and checked in
tests against the bytes torch saves for backward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cost_models import op_sac
from cost_models.attention import (
    attention_saved_elements_per_token,
    mla_latent_elements_per_token,
    selective_recomputes_up_projections,
    selective_saved_elements_per_token,
)
from cost_models.inputs import Transformer

# ---------------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------------


def activation_bytes_per_layer(
    model: Transformer, *, seq_length: int, micro_batch_size: int, tp: int = 1, sequence_parallel: bool = False,
    recompute: str = "none", activation_bytes: int = 2, fused_swiglu: bool = False, per_op_sac: bool = False,
) -> float:
    """Bytes one layer keeps for backward, per micro-batch, per GPU.

    Korthikanti et al. 2022 Table 2 for a GPT layer (dropout on, standard attention):
      none: s b h (34 + 5 a s / h); TP: s b h (10 + 24/t + 5 a s/(h t)); TP+SP: s b h/t (34 + 5 a s/h);
      selective drops the a s^2 terms; full keeps the layer input, 2 s b h (/t with SP).
    MLA (modern-training.md §4.3): the latents c_Q, norm(c_Q), the kv_a output and norm(c_KV) (replicated) and
    Q, K (a·d_qk), V, O (a·d_v) instead of the GQA terms; selective recomputes its up-projections and drops Q, K, V.
    Component list generalised to GQA (K, V are 2 s b h g/a each), SwiGLU (gate, up, SiLU output and product,
    8 s b f; 6 s b f fused), no dropout (no masks, no dropout outputs), flash attention (no a s^2 terms; 4 a s b
    bytes of fp32 log-sum-exp) [D, cost-models.md §2.6]. Masks take 1 byte; other tensors `activation_bytes`.
    per_op_sac: 'selective' is torchtitan's per-op SAC on a dense block (cost_models/op_sac.py save set).
    """
    s, b, h, a = seq_length, micro_batch_size, model.hidden_size, model.num_attention_heads
    t = tp
    sbh = s * b * h
    scale = activation_bytes / 2  # the coefficients below are for 2-byte activations
    rep = t if sequence_parallel else 1  # the replicated (non-TP) region is sharded by SP
    if recompute == "full":
        return 2 * sbh * scale / rep
    if recompute == "selective" and op_sac.in_effect(model, per_op_sac):
        return op_sac.saved_bytes_per_layer(model, seq_length=s, micro_batch_size=b, tp=t,
                                            sequence_parallel=sequence_parallel, activation_bytes=activation_bytes)
    mask = 1 if model.dropout else 0
    # K and V are g/a of Q's width; without flash attention they are expanded to all heads before Q K^T
    # (Megatron's unfused path and the torch reference repeat_interleave them), so the saved copies are full width.
    g_over_a = model.num_kv_heads / a if model.flash_attention else 1.0
    f_over_h = model.ffn_hidden_size / h
    # replicated across TP (sharded by SP): two norm inputs, QKV and FC1 inputs, two dropout masks
    replicated = (4 + 2 + 2) * scale + 2 * mask
    # sharded by TP: Q, K, V, output-projection input, MLP intermediates
    attn = (2 + 4 * g_over_a + 2) * scale
    if model.mla is not None:  # MLA: its latents (replicated) and Q, K, V, O at their own widths (attention.py)
        replicated += 2 * mla_latent_elements_per_token(model) / h * scale
        kept = (selective_saved_elements_per_token if recompute == "selective"
                else attention_saved_elements_per_token)(model)
        attn = 2 * kept / h * scale
    mlp = mlp_intermediate_coefficient(model, fused_swiglu=fused_swiglu) * f_over_h * scale
    per_layer = sbh * (replicated / rep + (attn + mlp) / t)
    if recompute == "selective" and not selective_recomputes_up_projections(model):
        return per_layer  # the a s^2 terms are recomputed (Korthikanti §5)
    if model.flash_attention:
        return per_layer + 4 * a * s * b / t  # fp32 softmax statistics
    return per_layer + attention_score_bytes(model, seq_length=s, micro_batch_size=b, tp=t,
                                             activation_bytes=activation_bytes)


def mlp_intermediate_coefficient(model: Transformer, *, fused_swiglu: bool) -> int:
    """Bytes the MLP's intermediates keep per token and FFN unit, for 2-byte activations (x s b f per layer).

    GeLU: FC1 output and GeLU output, 4. SwiGLU under autograd (torchtitan's FeedForward, HF's LlamaMLP): the gate
    and up outputs, the SiLU output and the product (FC2's input), 8. Fused SwiGLU (Megatron-Core's bias_swiglu_impl,
    fusions/fused_bias_swiglu.py: `ctx.save_for_backward(input)`): FC1's output (gate and up, 2 f) and FC2's input
    (f), 6 [cost-models.md §2.6]."""
    if not model.swiglu:
        return 4
    return 6 if fused_swiglu else 8


NORM_FP32_UPCAST_BYTES_PER_ELEMENT = 4
"""What an RMSNorm written as `_norm(x.float()).type_as(x) * weight` saves beyond the input a fused norm saves: the
fp32 upcast of its input (4 B per element), which x.pow(2) and the multiply by rsqrt save; the normalised output
the weight's multiply saves takes the place of the input the component list counts. torchtitan's RMSNorm of its
published Llama runs (torchtitan/models/norms.py, 2024), measured with that class in
tests/test_backward_memory_torch.py; torch's nn.RMSNorm saves fp32 copies too on CPU (torch 2.13), where on CUDA it
dispatches to the fused _fused_rms_norm (aten layer_norm.cpp rms_norm_symint)."""


def eager_saved_extra_bytes(model: Transformer, *, seq_length: int, micro_batch_size: int, tp: int = 1,
                            sequence_parallel: bool = False, norm_upcast: bool = False, kv_repeated: bool = False,
                            activation_bytes: int = 2) -> float:
    """Bytes a layer's model code saves for backward beyond the component list (activation_bytes_per_layer), per
    micro-batch on one GPU: what it keeps without recompute, and what a recomputed layer materialises again.

    norm_upcast: each of the layer's two RMSNorms keeps the fp32 upcast of its input
    (NORM_FP32_UPCAST_BYTES_PER_ELEMENT), sharded by SP (a LayerNorm model runs torch's fused layer_norm, which saves
    its input). kv_repeated: K and V are copied to every query head before SDPA (torchtitan's repeat_kv, an expand
    and a reshape, which copies), and SDPA saves the copies: each at the query width where the list counts the KV
    width (flash attention; unfused attention is counted at the query width already). Memory only: the elementwise
    traffic is fitted on the component list (stage.elementwise_forward_seconds)."""
    tokens = seq_length * micro_batch_size
    norms = 2 * NORM_FP32_UPCAST_BYTES_PER_ELEMENT * model.hidden_size / (tp if sequence_parallel else 1)
    kv = 0.0
    if kv_repeated and model.flash_attention and model.mla is None:
        q, kv_width = model.num_attention_heads * model.head_dim, model.num_kv_heads * model.head_dim
        kv = 2 * (q - kv_width) / tp * activation_bytes
    return tokens * ((norms if norm_upcast and model.rms_norm else 0.0) + kv)


def mlp_backward_gradient_bytes(model: Transformer, *, seq_length: int, micro_batch_size: int, tp: int = 1,
                                activation_bytes: int = 2) -> float:
    """Gradient bytes a layer's backward holds together at its MLP, per micro-batch on one GPU, on top of what the
    layer saved: the gradient of FC2's input and what the activation's backward writes from it while it is alive,
    the gate's and the up projection's gradients with SwiGLU (3 tensors of the FFN width), the FC1 output's with
    GeLU (2); TP-sharded. An MoE layer's are its routed intermediates (top_k x f_e per token) and its shared
    experts'. Measured with torch's MemTracker on CPU, Llama and GPT blocks, none, full and per-op SAC
    (tests/test_backward_memory_torch.py): this plus the recomputed set is within 4% of the measured peak."""
    moe = model.moe
    width = (moe.top_k * moe.expert_ffn_hidden_size + moe.shared_expert_ffn_hidden_size if moe is not None
             else model.ffn_hidden_size)
    tensors = 3 if model.swiglu else 2
    return tensors * width / tp * seq_length * micro_batch_size * activation_bytes


def sp_gathered_input_bytes(*, seq_length: int, micro_batch_size: int, hidden_size: int, tp: int,
                            sequence_parallel: bool, activation_bytes: int = 2) -> float:
    """Bytes per layer and micro-batch that torch-native sequence parallelism saves beyond Megatron's.

    Megatron's column-parallel linear under SP saves its input sharded (s b h / t) and all-gathers it again in
    backward (Korthikanti et al. 2022 §4.2.2). torch's DTensor recipe (PrepareModuleInput Shard(1) -> Replicate,
    then ColwiseParallel; torchtitan's TP plan) all-gathers in forward and autograd keeps that gathered input
    for the weight gradient: the QKV and FC1 inputs are saved at s b h, i.e. 2 s b h (1 - 1/t) more. Measured
    on the CPU benchmark (tests/test_bench.py): the saved (128, 256) fp32 inputs of wq/wk/wv and w1/w3.
    Memory only: the gathered tensor is the all-gather's output, written anyway, so the stage model charges it no
    elementwise traffic."""
    if not sequence_parallel or tp <= 1:
        return 0.0
    return 2 * seq_length * micro_batch_size * hidden_size * activation_bytes * (1 - 1 / tp)


def attention_score_bytes(model: Transformer, *, seq_length: int, micro_batch_size: int, tp: int = 1,
                          activation_bytes: int = 2) -> float:
    """The a s^2 terms unfused attention keeps per layer and micro-batch on one GPU (0 with flash attention):
    softmax output 2 a s^2 b; with dropout also its mask (1) and output (2): 5 a s^2 b (Korthikanti §4.1)."""
    if model.flash_attention:
        return 0.0
    per_element = activation_bytes + (1 + activation_bytes if model.dropout else 0)
    return per_element * model.num_attention_heads * seq_length * seq_length * micro_batch_size / tp


def attention_score_traffic_bytes(model: Transformer, *, seq_length: int, micro_batch_size: int, tp: int = 1,
                                  activation_bytes: int = 2) -> float:
    """HBM bytes the memory-bound kernels on the a s^2 score matrix move in forward + backward (0 with flash).

    Counted per score element from the kernels' operands (each read or written once): Megatron's fused
    scale-mask-softmax reads the scores and writes the probabilities (2 x activation bytes), its backward reads
    the incoming gradient and the probabilities and writes the input gradient (3 x); dropout reads and writes
    the probabilities and writes its 1-byte mask (2 x + 1), its backward reads the gradient and the mask and
    writes (2 x + 1). With dropout: 9 x + 2 = 20 B per element for 2-byte activations, i.e. 4 B per byte kept
    (5 a s^2 b kept), where the linear-size activations move several times more per byte kept (norms, GeLU,
    bias-dropout-add each read and write sbh tensors; elementwise_traffic_factor)."""
    if model.flash_attention:
        return 0.0
    softmax = 5 * activation_bytes
    dropout = 4 * activation_bytes + 2 if model.dropout else 0
    return (softmax + dropout) * model.num_attention_heads * seq_length * seq_length * micro_batch_size / tp


def embedding_activation_bytes(*, seq_length: int, micro_batch_size: int, hidden_size: int, tp: int,
                               sequence_parallel: bool, dropout: bool) -> float:
    """First stage, per micro-batch: int64 token ids 8 s b (Megatron's estimator) and, with dropout, the
    embedding-dropout mask s b h (Korthikanti §4.3), sharded by SP."""
    s, b = seq_length, micro_batch_size
    mask = s * b * hidden_size / (tp if sequence_parallel else 1) if dropout else 0
    return 8 * s * b + mask


FP32_LOGITS_BYTES_PER_LOGIT = 4.0
"""What Megatron's vocab-parallel cross-entropy keeps per logit: the fp32 logits (Korthikanti et al. 2022 §4.3, 4 s b V
/ t); the Knobs default of loss_bytes_per_logit."""


def loss_saved_bytes_per_logit(loss_bytes_per_logit: float) -> float:
    """Of the loss's peak bytes per logit, those kept from its forward to its backward: 4, Megatron's fp32 logits
    and torch's fp32 log-softmax output alike (at most the peak); the rest lives only during the loss's own
    backward (torch's fp32 incoming and input gradients, 8), once per stage, not per micro-batch in flight."""
    return min(loss_bytes_per_logit, FP32_LOGITS_BYTES_PER_LOGIT)


def output_activation_bytes(*, seq_length: int, micro_batch_size: int, hidden_size: int, vocab_size: int, tp: int,
                            sequence_parallel: bool, activation_bytes: int = 2,
                            loss_bytes_per_logit: float = FP32_LOGITS_BYTES_PER_LOGIT) -> float:
    """Last stage, per micro-batch: final-norm input and output-projection input (2 s b h each, the first
    sharded by SP) and what the loss keeps per logit until its backward (loss_saved_bytes_per_logit) s b V / t:
    4, the fp32 logits Megatron's cross-entropy keeps (Korthikanti §4.3), or torch's fp32 log-softmax output."""
    s, b, h = seq_length, micro_batch_size, hidden_size
    norm_in = activation_bytes * s * b * h / (tp if sequence_parallel else 1)
    kept = loss_saved_bytes_per_logit(loss_bytes_per_logit)
    return norm_in + activation_bytes * s * b * h + kept * s * b * vocab_size / tp


def loss_backward_transient_bytes(*, seq_length: int, micro_batch_size: int, vocab_size: int, tp: int,
                                  loss_bytes_per_logit: float = FP32_LOGITS_BYTES_PER_LOGIT) -> float:
    """Last stage: what the loss holds beyond its saved bytes while its backward runs, one micro-batch's
    (loss_bytes_per_logit - loss_saved_bytes_per_logit) s b V / t: 0 for Megatron's, 8 B per logit for torch's
    cross-entropy on fp32-cast logits (TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT)."""
    extra = loss_bytes_per_logit - loss_saved_bytes_per_logit(loss_bytes_per_logit)
    return extra * seq_length * micro_batch_size * vocab_size / tp


FUSED_CROSS_ENTROPY_BYTES_PER_LOGIT = 4.0
"""flash-attn's fused cross-entropy (flash_attn.losses.cross_entropy, llm-foundry's default loss_fn
'fused_crossentropy'): it keeps the 16-bit logits (2 B per logit) and writes their 16-bit gradient (2 B), no fp32
softmax; the same 4 B as Megatron's fp32 logits (FP32_LOGITS_BYTES_PER_LOGIT)."""

TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT = 12.0
"""torch's F.cross_entropy on fp32-cast logits (torchtitan's loss: cross_entropy(pred.flatten(0, 1).float(), ...)):
log_softmax saves its fp32 output (4 B per logit); at its backward the fp32 gradient from nll_loss (4) and the
fp32 input gradient it writes (4) are alive with it, 12 B per logit, before the gradient is cast back to 16 bits
[D: the kernels' operands; torch's log_softmax_backward_data]."""

TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT = 16.0
"""The same loss on vocabulary-sharded logits under torch's loss_parallel (torchtitan with TP: its output projection
keeps the logits Shard(-1) and the loss runs inside loss_parallel(), frameworks.md §1.2), per local logit:
torch/distributed/tensor/parallel/loss.py computes the log-softmax as x - max and exp(x - max) for the sharded sum
(14 B at the forward's peak with the fp32 input and the 16-bit logits) and, in backward, (grad_input +
exp(x)) * grad_output in one function: the saved fp32 output, the zeroed fp32 grad_input, exp of the output and
their sum are alive together, 16 B, 4 more than the unsharded loss's 12. It keeps the same 4 B from forward to
backward [D: that file; measured on CPU at torch 2.13, tests/test_head_memory_torch.py]."""


def loss_peak_bytes_per_logit(*, tp: int, loss_bytes_per_logit: float,
                              loss_parallel_bytes_per_logit: float | None) -> float:
    """The loss's peak bytes per (local) logit on a layout: under TP the vocabulary-sharded loss's where the
    framework runs one (torch's loss_parallel: Knobs.loss_parallel_bytes_per_logit), else its own loss's."""
    if tp > 1 and loss_parallel_bytes_per_logit is not None:
        return loss_parallel_bytes_per_logit
    return loss_bytes_per_logit


def in_flight_micro_batches(*, schedule: str, stage: int, pp: int, num_micro_batches: int, virtual_stages: int = 1) -> float:
    """How many micro-batches of a stage's activations are alive at its peak, in units of the whole stage.

    naive: the whole local batch at once (no micro-batching), m; GPipe: all m (Narayanan §2.2.1);
    1F1B, ZB-H1, PipeDream: min(m, p - stage) (ZB-H1 keeps 1F1B's memory, Qi et al. Table 2);
    interleaved: Megatron's warm-up count ((p - stage - 1) * 2 + (v - 1) * p + 1) chunk passes, each 1/v
    of the stage; on stage 0 that is p (1 + (p-1)/(p v)) (Korthikanti §4.2.3), capped at m.
    """
    return in_flight_per_stage(schedule=schedule, pp=pp, num_micro_batches=num_micro_batches,
                               virtual_stages=virtual_stages, stages=(stage,))[0]


def in_flight_per_stage(*, schedule: str, pp: int, num_micro_batches: int, virtual_stages: int = 1,
                        stages: Sequence[int] | None = None) -> list[float]:
    """in_flight_micro_batches of the given stages (all p by default), in one call."""
    m, p, v = num_micro_batches, pp, virtual_stages
    stages = range(p) if stages is None else stages
    if schedule in ("naive", "gpipe"):
        return [float(m)] * len(stages)
    if schedule == "interleaved_1f1b" and v > 1:
        warmup = (v - 1) * p + 1
        return [min((p - i - 1) * 2 + warmup, m * v) / v for i in stages]
    return [float(min(m, p - i)) for i in stages]


def vocab_padded(vocab_size: int, *, tp: int, divisible_by: int = 128) -> int:
    """Megatron's vocab_size_with_padding: round up to a multiple of divisible_by x tp (cost-models.md §7.1)."""
    multiple = divisible_by * tp
    return int(math.ceil(vocab_size / multiple) * multiple)
