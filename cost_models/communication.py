"""Alpha-beta model of collectives and point-to-point on a cluster topology (standard library only).

Bus-bandwidth factors are nccl-tests' (doc/PERFORMANCE.md, cost-models.md §4.1): all-reduce 2(n-1)/n,
reduce-scatter / all-gather / all-to-all (n-1)/n, reduce 1, where the message is the per-rank buffer size S.
Rank order is Megatron-LM's and torchtitan's: TP innermost, then DP, then PP (cost-models.md §7.3).
"""

from __future__ import annotations

from typing import NamedTuple

from cost_models.inputs import Hardware, Link


def all_reduce_seconds(*, message_bytes: float, group_size: int, link: Link) -> float:
    """Ring all-reduce: 2(n-1) latency steps, 2(n-1)/n of the bytes over the bus bandwidth."""
    if group_size <= 1 or message_bytes <= 0:
        return 0.0
    steps = 2 * (group_size - 1)
    return steps * link.latency_seconds + steps / group_size * message_bytes / link.bandwidth_bytes_per_second


def all_gather_seconds(*, message_bytes: float, group_size: int, link: Link) -> float:
    """Ring all-gather of a total buffer of message_bytes: (n-1) steps, (n-1)/n of the bytes."""
    if group_size <= 1 or message_bytes <= 0:
        return 0.0
    steps = group_size - 1
    return steps * link.latency_seconds + steps / group_size * message_bytes / link.bandwidth_bytes_per_second


def reduce_scatter_seconds(*, message_bytes: float, group_size: int, link: Link) -> float:
    """Ring reduce-scatter of a total buffer of message_bytes: same cost as all-gather."""
    return all_gather_seconds(message_bytes=message_bytes, group_size=group_size, link=link)


def reduce_seconds(*, message_bytes: float, group_size: int, link: Link) -> float:
    """Ring reduce of message_bytes to one rank (dist.reduce): (n-1) latency steps, and the whole buffer over the bus
    bandwidth (nccl-tests doc/PERFORMANCE.md: Reduce's bus-bandwidth factor is 1)."""
    if group_size <= 1 or message_bytes <= 0:
        return 0.0
    return (group_size - 1) * link.latency_seconds + message_bytes / link.bandwidth_bytes_per_second


def slice_reduces_seconds(*, message_bytes: float, group_size: int, link: Link) -> float:
    """Each rank's 1/n slice of a buffer of message_bytes reduced to that rank by a dist.reduce of its own, issued one
    after another on one communicator (DeepSpeed's ZeRO-1/2 average_tensor with use_multi_rank_bucket_allreduce off):
    n reduces of message/n, so a reduce-scatter's bandwidth term (+1/n) and n times its latency. Every ring step is
    charged the group's bottleneck latency, as for the other collectives here: across nodes an upper bound, since most
    of a ring's hops are NVLink ones [U: no measurement of DeepSpeed's slice reduces at scale]."""
    if group_size <= 1 or message_bytes <= 0:
        return 0.0
    return group_size * reduce_seconds(message_bytes=message_bytes / group_size, group_size=group_size, link=link)


def all_to_all_seconds(*, message_bytes: float, group_size: int, link: Link) -> float:
    """All-to-all of a per-rank buffer of message_bytes: (n-1)/n of it leaves each rank."""
    return all_gather_seconds(message_bytes=message_bytes, group_size=group_size, link=link)


def p2p_seconds(*, message_bytes: float, link: Link) -> float:
    if message_bytes <= 0:
        return 0.0
    return link.latency_seconds + message_bytes / link.bandwidth_bytes_per_second


class GroupPlacement(NamedTuple):
    """Where a communication group's ranks sit, and the bottleneck link it sees."""

    group_size: int
    ranks_per_node: int
    nodes_spanned: int
    link: Link

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes_spanned > 1


def group_link(hw: Hardware, *, group_size: int, stride: int) -> GroupPlacement:
    """The bottleneck bus bandwidth of a group of `group_size` ranks, `stride` apart in rank order.

    Inside a node: the per-GPU intra-node link (NVLink or PCIe). Across nodes (cost-models.md §4.6):
    NCCL's rings stripe over the node's NICs, so a group with q ranks per node, while g/q such groups run
    at once on the node (the other TP ranks' groups), sees min(intra, nics x nic_bw x q / g).
    """
    g = hw.gpus_per_node
    intra = hw.intra_node or Link(float("inf"), 0.0)
    if group_size <= 1:
        return GroupPlacement(group_size, 1, 1, intra)
    span = stride * group_size
    if span <= g:
        return GroupPlacement(group_size, group_size, 1, intra)
    q = max(1, min(group_size, g // stride)) if stride < g else 1
    nodes = -(-group_size // q)
    nic = hw.nic
    if nic is None:  # a multi-node group on a cluster without a network cannot happen in a valid spec
        raise ValueError("group crosses nodes but the cluster has no inter-node network")
    net_bw = hw.nics_per_node * nic.bandwidth_bytes_per_second * q / g
    bw = min(intra.bandwidth_bytes_per_second, net_bw) if q > 1 else net_bw
    return GroupPlacement(group_size, q, nodes, Link(bw, max(intra.latency_seconds, nic.latency_seconds)))


def pp_neighbour_link(hw: Hardware, *, tp: int, dp: int) -> tuple[Link, bool]:
    """(link, crosses_nodes) between a rank and its next pipeline stage, tp*dp ranks further on.

    Across nodes every GPU of the node sends at once, so each gets nics x nic_bw / g.
    """
    distance = tp * dp
    g = hw.gpus_per_node
    if distance < g and hw.intra_node is not None:
        return hw.intra_node, False
    if hw.nic is None:
        return hw.intra_node or Link(float("inf"), 0.0), False
    bw = hw.nics_per_node * hw.nic.bandwidth_bytes_per_second / g
    return Link(bw, hw.nic.latency_seconds), True


def tp_bytes_per_layer_per_micro_batch(*, micro_batch_size: int, seq_length: int, hidden_size: int, tp: int,
                                       activation_bytes: int = 2, recompute: str = "none") -> tuple[float, int]:
    """(bytes per all-reduce, all-reduces per layer per micro-batch) of Megatron TP (Narayanan §3.2):
    2 forward + 2 backward all-reduces of b s h elements; 6 with full recompute (ZeRO paper §8). With
    sequence parallelism the same bytes move as reduce-scatter + all-gather (Korthikanti §4.2.2)."""
    if tp <= 1:
        return 0.0, 0
    count = 6 if recompute == "full" else 4
    return float(micro_batch_size * seq_length * hidden_size * activation_bytes), count


