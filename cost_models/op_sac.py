"""torchtitan's per-op selective activation checkpointing (SAC) of a dense transformer block (stdlib only).

frameworks.md §1.5 (torchtitan/distributed/activation_checkpoint.py): each block is checkpointed with a policy that
must-saves the outputs of compute-intensive ops (mm, SDPA) and of reduce-scatters, except that every second
matmul of the block's forward is recomputed (a per-block counter: the 1st, 3rd, 5th ... are saved); everything
else (norms, RoPE, activation functions, residual adds, the SP all-gathers) is recomputed in backward. A Llama
block issues its matmuls as wq, wk, wv, wo, w1, w3, w2: it saves wq, wv, w1 and w2 and recomputes wk, wo and w3.
This is not Megatron's 'selective', which recomputes only the attention core and keeps every linear's input.

Modelled for dense blocks with flash/SDPA attention (torchtitan's only kind); MoE and MLA blocks, and unfused
attention, keep the core-attention policy (`applies`): their op order (router, grouped expert GEMMs, latent
projections, batched score matmuls) is not written out here.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.inputs import Transformer


@dataclass(frozen=True, slots=True)
class Matmul:
    name: str
    in_features: int
    out_features: int
    row_parallel: bool  # TP splits its input (wo, w2): its output is a full-width partial sum before the reduce


def block_matmuls(model: Transformer) -> list[Matmul]:
    """The block's matmuls in the order its forward issues them (torchtitan's Llama / GPT block)."""
    h, d = model.hidden_size, model.head_dim
    q, kv, f = model.num_attention_heads * d, model.num_kv_heads * d, model.ffn_hidden_size
    mlp = [Matmul("w1", h, f, False)] + ([Matmul("w3", h, f, False)] if model.swiglu else []) + [
        Matmul("w2", f, h, True)]
    return [Matmul("wq", h, q, False), Matmul("wk", h, kv, False), Matmul("wv", h, kv, False),
            Matmul("wo", q, h, True)] + mlp


def applies(model: Transformer) -> bool:
    """Per-op SAC is modelled for dense, non-MLA blocks with SDPA (flash) attention (module doc): torchtitan's
    policy saves the SDPA output; an unfused attention's matmuls are batched (bmm), which its list does not name."""
    return model.moe is None and model.mla is None and model.flash_attention


def in_effect(model: Transformer, selective_op_sac: bool) -> bool:
    """Whether 'selective' means per-op SAC here: the profile states it (Knobs.selective_op_sac) and the block is
    one this module models. The one rule the memory, recompute-time and CP-repeat terms follow."""
    return selective_op_sac and applies(model)


def saved_matmuls(model: Transformer) -> list[Matmul]:
    """The 1st, 3rd, 5th ... matmul of the block: their outputs are saved."""
    return block_matmuls(model)[0::2]


def recomputed_matmuls(model: Transformer) -> list[Matmul]:
    """The 2nd, 4th ... matmul of the block: run again in backward."""
    return block_matmuls(model)[1::2]


def saved_bytes_per_layer(model: Transformer, *, seq_length: int, micro_batch_size: int, tp: int = 1,
                          sequence_parallel: bool = False, activation_bytes: int = 2) -> float:
    """Bytes one block keeps for backward per micro-batch on one GPU under per-op SAC: its input (sharded by SP),
    the saved matmuls' outputs (a column-parallel output sharded by TP, a row-parallel one the full-width partial
    sum), the two reduce-scatter outputs under TP with SP (h / t each; without SP the row-parallel outputs are
    all-reduced, and an all-reduce is not on the save list), and the attention output with its fp32 log-sum-exp
    (a·d / t and a / t per token)."""
    tokens, h, t = seq_length * micro_batch_size, model.hidden_size, tp
    elements = h / (t if sequence_parallel else 1)
    elements += sum(m.out_features if (m.row_parallel and t > 1) else m.out_features / t for m in saved_matmuls(model))
    elements += (2 * h / t if t > 1 and sequence_parallel else 0.0) + model.num_attention_heads * model.head_dim / t
    lse_bytes = 4 * model.num_attention_heads / t
    return tokens * (elements * activation_bytes + lse_bytes)


def recomputed_gemm_flops(model: Transformer, *, tokens: float) -> float:
    """Forward FLOPs of the matmuls per-op SAC runs again, over all TP ranks: 2 T x in x out each."""
    return sum(2.0 * tokens * m.in_features * m.out_features for m in recomputed_matmuls(model))
