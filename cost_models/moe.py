"""Mixture of experts and expert parallelism: parameters, FLOPs, all-to-all bytes, memory (stdlib only).

Formulas and sources: ../shared/reference/modern-training.md §3 (Megatron-LM@d98e8a64
theoretical_memory_usage.py and training.py; DeepSeek-V2/V3 reports; DeepEP). Units are in the names;
T is the number of tokens entering one MoE layer on one rank per micro-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cost_models.inputs import Link, MoE, Transformer
from cost_models.memory import mlp_intermediate_coefficient

# Default load imbalance γ = max rank load / mean load. The NVIDIA benchmark rows force-balance routing (γ = 1,
# Megatron-Bridge performance-summary footnote); trained routers with an auxiliary loss or DeepSeek's bias
# balancing stay close to balanced after the first few hundred steps (Megatron MoE README, older L474-478).
# 1.1 charges 10% on expert GEMMs, received-token memory and all-to-all for the residual imbalance [D, stated].
DEFAULT_IMBALANCE = 1.1


# Kernels each local expert launches per MoE layer, (forward, backward), in Megatron's GroupedMLP on TransformerEngine's
# GroupedLinear: "--moe-grouped-gemm: launch multiple local GEMM kernels in multiple streams" (Megatron MoE README,
# MoE arguments table), so every local expert runs its own fc1 and fc2 GEMMs (forward), dgrad and wgrad for each
# (backward), and in FP8 its own cast of each fresh operand (the rows of that expert: the fc1 and fc2 inputs forward,
# their output gradients backward). The activation, permutation and router run once over all experts' rows.
EXPERT_KERNELS = {"bf16": (2, 4), "fp8": (4, 6)}


def expert_kernels(*, fp8: bool) -> tuple[int, int]:
    """(forward, backward) kernels per local expert per MoE layer (EXPERT_KERNELS)."""
    return EXPERT_KERNELS["fp8" if fp8 else "bf16"]


def expert_kernel_seconds(*, local_experts: int, fp8: bool, kernel_gflop: float, rate_flops_per_second: float
                          ) -> tuple[float, float]:
    """(forward, backward) seconds one MoE layer's per-expert kernels cost beyond their FLOPs: each kernel a fixed
    `kernel_gflop` GFLOP-equivalent at the GPU's saturated GEMM rate (launch latency, wave ramp-up and tail of a small
    kernel: a cost that scales with the GPU's speed, as the size-saturation curve's x_half does for one GEMM,
    cost_models/stage.py matmul_efficiency). Fine-grained MoE multiplies it: Qwen3-30B-A3B at EP 8 runs 16 local
    experts, 160 such kernels per layer in FP8, where a dense layer runs about a dozen GEMMs."""
    fwd, bwd = expert_kernels(fp8=fp8)
    per_kernel = kernel_gflop * 1e9 / rate_flops_per_second
    return local_experts * fwd * per_kernel, local_experts * bwd * per_kernel


def mlp_matrices(model: Transformer) -> int:
    """Weight matrices per MLP: 3 gated (SwiGLU/GeGLU), 2 plain."""
    return 3 if model.swiglu else 2


def dense_mlp_weight_count(model: Transformer) -> int:
    return mlp_matrices(model) * model.hidden_size * model.ffn_hidden_size


def expert_weight_count(model: Transformer) -> int:
    """Weights of one routed expert: 3·h·f_e (gated) or 2·h·f_e."""
    assert model.moe is not None
    return mlp_matrices(model) * model.hidden_size * model.moe.expert_ffn_hidden_size


def moe_layer_other_count(moe: MoE, *, hidden_size: int, mlp_matrix_count: int) -> int:
    """Always-active MoE parameters besides the routed experts: router h·E (+E bias), shared experts, shared gate h
    (Megatron theoretical_memory_usage.py L104-152: router_params = h·E (+E if bias), shared_expert_gate = h)."""
    h, E = hidden_size, moe.num_experts
    router = h * E + (E if moe.router_bias else 0)
    shared = mlp_matrix_count * h * moe.shared_expert_ffn_hidden_size
    return router + shared + (h if moe.shared_expert_gate else 0)


@dataclass(frozen=True, slots=True)
class MlpParameterCounts:
    dense_layer: int  # MLP parameters of a dense layer
    moe_layer_total: int  # of an MoE layer, all experts
    moe_layer_active: int  # of an MoE layer, the k routed experts a token uses + router + shared
    moe_layer_routed: int  # the routed experts' part of moe_layer_total (sharded by EP)


def mlp_parameter_counts(model: Transformer) -> MlpParameterCounts:
    """MLP parameters per layer kind; biases as GPT when model.bias (dense MLP only: MoE families have none)."""
    dense = dense_mlp_weight_count(model)
    if model.bias:
        dense += (2 * model.ffn_hidden_size if model.swiglu else model.ffn_hidden_size) + model.hidden_size
    moe = model.moe
    if moe is None:
        return MlpParameterCounts(dense, 0, 0, 0)
    other = moe_layer_other_count(moe, hidden_size=model.hidden_size, mlp_matrix_count=mlp_matrices(model))
    routed = moe.num_experts * expert_weight_count(model)
    active = moe.top_k * expert_weight_count(model)
    return MlpParameterCounts(dense, routed + other, active + other, routed)


def mlp_forward_flops_per_token(model: Transformer) -> float:
    """Forward MLP FLOPs per token averaged over the layers: dense layers 2·(3 h f); MoE layers the k routed experts,
    the shared experts and the router GEMM 2·h·E. Megatron's formula (training.py L1009-1311) leaves the router out
    (0.5% of DeepSeek-V3's MoE layer); it is a real GEMM, so it is counted here."""
    dense = 2.0 * dense_mlp_weight_count(model)
    if model.moe is None:
        return dense
    moe = model.moe
    routed = 2.0 * moe.top_k * expert_weight_count(model)
    shared = 2.0 * mlp_matrices(model) * model.hidden_size * moe.shared_expert_ffn_hidden_size
    router = 2.0 * model.hidden_size * moe.num_experts
    n_moe = model.num_moe_layers
    return (dense * (model.num_layers - n_moe) + (routed + shared + router) * n_moe) / model.num_layers


def capacity_tokens(*, tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Megatron's per-expert capacity C = ceil(T·k/E · CF) (moe_utils.py L248-266)."""
    return math.ceil(tokens * top_k / num_experts * capacity_factor)


def routed_tokens_per_rank(moe: MoE, *, tokens: int, imbalance: float = DEFAULT_IMBALANCE) -> float:
    """Token copies one EP rank's experts process per layer: T·k (the average over ranks, as every rank also sends
    T·k), times γ for the most loaded rank. With a capacity factor the load is capped at CF (tokens above capacity
    are dropped), and padded to capacity with `--moe-pad-expert-input-to-capacity` semantics not assumed."""
    load = tokens * moe.top_k * imbalance
    if moe.capacity_factor is not None:
        load = min(load, tokens * moe.top_k * moe.capacity_factor)
    return load


def all_to_all_bytes_per_layer(*, tokens: float, top_k: int, hidden_size: int, ep: int, dispatch_bytes: float = 2,
                               combine_bytes: float = 2) -> tuple[float, float]:
    """(forward, backward) bytes one rank sends per MoE layer per micro-batch (modern-training.md §3.4).

    Dispatch and combine each move T·k·h elements, of which (ep-1)/ep leave the rank; backward repeats both (the
    gradient of a dispatch is a combine, DeepEP README). FP8 dispatch (DeepSeek-V3, Megatron with DeepEP) sends
    1 byte plus 1x128 FP32 scales: dispatch_bytes = 1 + 4/128.
    """
    if ep <= 1:
        return 0.0, 0.0
    copies = tokens * top_k * hidden_size * (ep - 1) / ep
    forward = copies * (dispatch_bytes + combine_bytes)
    return forward, forward


def nodes_per_token(moe: MoE, *, ep_nodes: int) -> int:
    """Most nodes one token's k expert copies can reach when the EP group spans `ep_nodes` nodes.

    Group-limited routing (HF `n_group`/`topk_group`, Megatron `moe_router_num_groups`/`moe_router_group_topk`):
    experts are cut into G equal groups, each token picks M groups first and its k experts inside them
    (Megatron-LM transformer_config.py moe_router_num_groups docstring; DeepSeek-V3 §2.1.2: G = 8, M = 4, "each
    token will be sent to at most 4 nodes"). Experts sit on EP ranks in order, so a group spans max(1, N/G) nodes
    and a token reaches at most min(N, k, M·max(1, N/G)) nodes; without groups min(N, k)."""
    limit = ep_nodes
    groups, chosen = moe.expert_groups, moe.groups_per_token
    if groups is not None and chosen is not None and chosen < groups:
        limit = min(ep_nodes, math.ceil(chosen * max(1.0, ep_nodes / groups)))
    return max(1, min(limit, moe.top_k))


def node_limited(moe: MoE, *, ep_nodes: int) -> bool:
    """True when group-limited routing caps a token below the nodes it could otherwise reach (then the dispatch
    sends each token once per target node and forwards it over NVLink: DeepSeek-V3 §3.2.2, DeepEP)."""
    return ep_nodes > 1 and nodes_per_token(moe, ep_nodes=ep_nodes) < min(ep_nodes, moe.top_k)


@dataclass(frozen=True, slots=True)
class EpTraffic:
    """Bytes one EP rank moves per MoE layer per micro-batch, forward + backward, by the link they use."""

    intra_node_bytes: float  # to / from EP peers in the node (NVLink), forwarding included
    network_bytes: float  # across nodes (the NICs)


def ep_traffic(moe: MoE, *, copies_bytes: float, ep: int, ranks_per_node: int) -> EpTraffic:
    """Split `copies_bytes` (T·k·h·β summed over dispatch and combine, forward and backward: every copy, local ones
    included) by the link each copy crosses, uniform routing over an EP group laid out node by node, q ranks a node.

    Plain all-to-all (Megatron's alltoall dispatcher): (q-1)/ep of the copies stay on NVLink, (ep-q)/ep cross the
    network. Node-limited routing with intra-node forwarding (DeepSeek-V3 §3.2.2, DeepEP): a token crosses the
    network once per remote target node, M·(N-1)/N times on average for M = nodes_per_token of N nodes, whatever
    k is ("scale up the number of selected experts ... to 13 ... without additional communication overhead");
    then NVLink carries the (q-1)/q of the copies that land on another GPU of the target node.

    A group that does not fill its last node (ep 10 on 8-GPU nodes) still spans ceil(ep/q) nodes; under the plain
    all-to-all its slowest rank is one of the r ranks of that last node, (ep-r)/ep of whose copies cross the
    network."""
    q = max(1, min(ranks_per_node, ep))
    nodes = -(-ep // q)
    if nodes == 1:
        return EpTraffic(copies_bytes * (q - 1) / ep, 0.0)
    if node_limited(moe, ep_nodes=nodes):
        m = nodes_per_token(moe, ep_nodes=nodes)
        return EpTraffic(copies_bytes * (q - 1) / q, copies_bytes / moe.top_k * m * (nodes - 1) / nodes)
    last = ep - (nodes - 1) * q  # ranks on the last node (q when the nodes are full)
    return EpTraffic(copies_bytes * (q - 1) / ep, copies_bytes * (ep - last) / ep)


def ep_all_to_all_seconds(traffic: EpTraffic, *, ep: int, intra: Link, network_per_gpu: Link | None) -> float:
    """Seconds of one layer's EP traffic: NVLink and the NICs work at once, so the slower of the two, plus one
    latency per peer. `network_per_gpu` is a GPU's share of its node's NICs (nics x NIC bandwidth / GPUs per node:
    every GPU of the node dispatches at once; DeepEP measures 43-58 GB/s per H800 on 50 GB/s NICs, §3.4)."""
    if ep <= 1:
        return 0.0
    t_intra = traffic.intra_node_bytes / intra.bandwidth_bytes_per_second if traffic.intra_node_bytes else 0.0
    t_net = 0.0
    latency = intra.latency_seconds
    if traffic.network_bytes:
        if network_per_gpu is None:
            raise ValueError("EP traffic crosses nodes but the cluster has no inter-node network")
        t_net = traffic.network_bytes / network_per_gpu.bandwidth_bytes_per_second
        latency = max(latency, network_per_gpu.latency_seconds)
    return (ep - 1) * latency + max(t_intra, t_net)


def routed_activation_bytes(model: Transformer, *, routed_tokens: float, fused_swiglu: bool,
                            activation_bytes: float = 2, etp: int = 1) -> float:
    """Bytes an MoE layer saves for backward for its routed tokens (no recompute, gated MLP; modern-training.md §3.7):
    permuted fc1 input h, fc1 output 2 f_e, SwiGLU output f_e, fc2 output h: T·k·γ·(2h + 3 f_e) elements with
    Megatron's fused SwiGLU (plain MLP: 2h + 2 f_e; SwiGLU under autograd, torchtitan's GroupedExperts: 2h + 4 f_e,
    memory.mlp_intermediate_coefficient); the f_e parts are split by expert-TP."""
    assert model.moe is not None
    h, fe = model.hidden_size, model.moe.expert_ffn_hidden_size
    ffn_elems = mlp_intermediate_coefficient(model, fused_swiglu=fused_swiglu) / 2 * fe / etp
    return routed_tokens * (2 * h + ffn_elems) * activation_bytes


def router_activation_bytes(*, tokens: int, num_experts: int) -> float:
    """Router logits and probabilities in FP32: T·E·4·2 bytes (modern-training.md §3.7)."""
    return tokens * num_experts * 4 * 2


def dispatch_buffer_bytes(*, routed_tokens: float, hidden_size: int, activation_bytes: float = 2) -> float:
    """All-to-all receive buffer, sized by the tokens actually received (Megatron's all-to-all dispatcher)."""
    return routed_tokens * hidden_size * activation_bytes


def expert_tokens_per_gemm(moe: MoE, *, tokens: int, ep: int) -> float:
    """Rows of one local expert's grouped-GEMM slice: T·k·ep/E (DeepSeek-V3 at T=4096, ep=64: 8192)."""
    return tokens * moe.top_k * ep / moe.num_experts
