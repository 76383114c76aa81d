"""Context parallelism: KV traffic per layer, its overlap with attention, buffers, constraints (stdlib only).

Sources: ../shared/reference/modern-training.md §2 (Megatron-LM@d98e8a64 context_parallel.md, arguments.py;
TransformerEngine@d0067d0d context_parallel.py; Llama 3 §3.3.2; DeepSpeed-Ulysses; Ring Attention §3).
The sequence is cut into 2·cp chunks and rank r keeps chunks r and 2cp-1-r (load-balanced causal split), so
every rank does 1/cp of the causal attention FLOPs and every ring step costs the same (§2.2). Everything
outside the attention core simply runs on s/cp tokens per rank (§2.3). Per layer, per micro-batch, per rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.communication import all_gather_seconds, all_to_all_seconds, p2p_seconds
from cost_models.inputs import Link, Transformer

# Megatron --cp-comm-type names: p2p (ring, Megatron's and torch context_parallel's default), all_gather (Llama 3),
# a2a (DeepSpeed-Ulysses)
CP_VARIANTS = ("p2p", "all_gather", "a2a")


def kv_elements_per_token(model: Transformer, *, tp: int) -> float:
    """K and V elements per token on one TP rank: 2·(g/t)·d. MLA exchanges the expanded K (a·d_qk) and V
    (a·d_v), not the latent (modern-training.md §4.2, [U] whether an implementation ships latents)."""
    if model.mla is not None:
        return model.num_attention_heads * (model.mla.qk_head_dim + model.mla.v_head_dim) / tp
    return 2 * max(model.num_kv_heads / tp, 1) * model.head_dim


def qkvo_elements_per_token(model: Transformer, *, tp: int) -> float:
    """Q, K, V and O elements per token on one TP rank (what Ulysses' all-to-alls move): (2a + 2g)·d/t."""
    if model.mla is not None:
        a, mla = model.num_attention_heads, model.mla
        return a * (2 * mla.qk_head_dim + 2 * mla.v_head_dim) / tp
    return (2 * model.num_attention_heads / tp + 2 * max(model.num_kv_heads / tp, 1)) * model.head_dim


@dataclass(frozen=True, slots=True)
class CpTraffic:
    forward_bytes: float  # sent per rank per layer per micro-batch
    backward_bytes: float
    messages_forward: int  # ring steps / collectives (latency terms)


def cp_traffic(model: Transformer, *, variant: str, micro_batch_size: int, seq_length: int, tp: int, cp: int,
               activation_bytes: float = 2) -> CpTraffic:
    """Bytes per rank per layer (modern-training.md §2.3).

    p2p and all_gather: (cp-1)·s_l·2(g/t)d·β·b forward; backward ≈ 2x (KV again, then dKV).
    a2a: (cp-1)/cp·s_l·(2a+2g)/t·d·β·b each way (QKV in, O out; backward the same).
    Llama-3-8B, s=128k, cp=8, t=1: ring 469.8 MB forward, Ulysses 293.6 MB.
    """
    if cp <= 1:
        return CpTraffic(0.0, 0.0, 0)
    s_l = seq_length / cp
    b, beta = micro_batch_size, activation_bytes
    if variant == "a2a":
        fwd = (cp - 1) / cp * s_l * qkvo_elements_per_token(model, tp=tp) * beta * b
        return CpTraffic(fwd, fwd, 2)
    fwd = (cp - 1) * s_l * kv_elements_per_token(model, tp=tp) * beta * b
    return CpTraffic(fwd, 2 * fwd, cp - 1 if variant == "p2p" else 1)


def ring_overlap_min_tokens(model: Transformer, *, attention_flops_per_second: float, link: Link,
                            activation_bytes: float = 2) -> float:
    """Smallest tokens per rank s_l at which a ring step's KV transfer hides behind its attention block:
    s_l >= (g/a)·β·F_att/B_link (§2.4; Ring Attention §3 for MHA). Llama-3-8B at 500 TFLOP/s over 450 GB/s: 556."""
    a = model.num_attention_heads
    per_head = model.mla.qk_head_dim + model.mla.v_head_dim if model.mla is not None else 2 * model.head_dim
    # a ring step: a·(d_qk + d_v)·s_l² FLOPs (half of an s_l x s_l block, §2.2) against s_l·kv·β bytes
    return (kv_elements_per_token(model, tp=1) * activation_bytes * attention_flops_per_second
            / (a * per_head * link.bandwidth_bytes_per_second))


def cp_transfer_seconds(traffic: CpTraffic, *, variant: str, cp: int, link: Link) -> float:
    """Forward + backward seconds of one layer's CP traffic before any overlap (what the ring hides behind
    attention); all-gather and a2a are never overlapped, so this equals their exposed time."""
    if cp <= 1:
        return 0.0
    if variant == "p2p":
        steps = cp - 1
        return steps * (p2p_seconds(message_bytes=traffic.forward_bytes / steps, link=link)
                        + p2p_seconds(message_bytes=traffic.backward_bytes / steps, link=link))
    return sum(exposed_cp_seconds(traffic, variant=variant, cp=cp, link=link, attention_forward_seconds=0.0,
                                  attention_backward_seconds=0.0))


def exposed_cp_seconds(traffic: CpTraffic, *, variant: str, cp: int, link: Link, attention_forward_seconds: float,
                       attention_backward_seconds: float) -> tuple[float, float]:
    """(forward, backward) CP communication left on the critical path per layer per micro-batch.

    p2p: cp-1 transfers, each hidden behind one of the cp equal attention steps (TE's double-buffered ring), so
    each exposes max(0, t_transfer - t_step). all_gather: not overlapped ("not async, and cannot be overlapped",
    Megatron; Llama 3 charges it as exposed). a2a: two blocking all-to-alls around attention each way.
    """
    if cp <= 1:
        return 0.0, 0.0
    if variant == "p2p":
        steps = cp - 1
        fwd_step = p2p_seconds(message_bytes=traffic.forward_bytes / steps, link=link)
        bwd_step = p2p_seconds(message_bytes=traffic.backward_bytes / steps, link=link)
        return (steps * max(0.0, fwd_step - attention_forward_seconds / cp),
                steps * max(0.0, bwd_step - attention_backward_seconds / cp))
    if variant == "all_gather":
        # the per-rank share of the gathered KV is traffic/(cp-1); all_gather_seconds takes the whole buffer
        whole = traffic.forward_bytes * cp / (cp - 1)
        fwd = all_gather_seconds(message_bytes=whole, group_size=cp, link=link)
        return fwd, 2 * fwd  # re-gather KV + reduce-scatter dKV
    half = traffic.forward_bytes / 2 * cp / (cp - 1)  # per all-to-all, as the per-rank buffer
    t = 2 * all_to_all_seconds(message_bytes=half, group_size=cp, link=link)
    return t, t


def cp_buffer_bytes(model: Transformer, *, variant: str, micro_batch_size: int, seq_length: int, tp: int, cp: int,
                    activation_bytes: float = 2) -> float:
    """Transient bytes while one layer's attention runs (§2.5): p2p two KV receive buffers plus a dKV buffer in
    backward (3 x s_l·kv); all_gather the full gathered KV (s·kv); a2a nothing beyond the resharded Q,K,V,O
    (same size as the local tensors)."""
    if cp <= 1:
        return 0.0
    kv = kv_elements_per_token(model, tp=tp) * activation_bytes * micro_batch_size
    if variant == "p2p":
        return 3 * seq_length / cp * kv
    if variant == "all_gather":
        return seq_length * kv
    return 0.0


def cp_problems(model: Transformer, *, variant: str, cp: int, seq_length: int, tp: int) -> list[tuple[str, str]]:
    """(field, what is allowed) for each constraint a CP degree breaks (modern-training.md §2.6)."""
    out: list[tuple[str, str]] = []
    if cp <= 1:
        return out
    if variant not in CP_VARIANTS:
        out.append(("cp_comm", f"{variant!r} -> one of {', '.join(CP_VARIANTS)}"))
    if seq_length % (2 * cp * tp):
        out.append(("cp", f"{cp} -> seq_length ({seq_length}) must be divisible by 2 x cp x tp = {2 * cp * tp} "
                          "(load-balanced causal split of 2·cp chunks; Megatron arguments.py L1336, torchtitan "
                          "parallel_dims.py L664-671)"))
    if variant == "a2a":
        heads, kv = model.num_attention_heads // tp, max(model.num_kv_heads // tp, 1)
        if heads % cp or (model.mla is None and kv % cp):
            out.append(("cp", f"{cp} -> a2a (Ulysses) needs query heads per TP rank ({heads}) and KV heads per TP "
                              f"rank ({kv}) divisible by cp (TE context_parallel.py L4246-4248); use cp_comm p2p"))
    return out
