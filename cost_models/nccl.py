"""NCCL communicators' device memory (standard library only).

torch gives every process group a rank runs a collective on its own NCCL communicator, built at the group's first
collective, and point-to-point send/recv on a group builds one more per pair of ranks (ProcessGroupNCCL's
send/recv key). Each communicator allocates its channels' buffers with cudaMalloc, outside torch's caching
allocator: torch.cuda.max_memory_reserved does not see them, nvidia-smi and an out-of-memory error do.

NCCL's maintainers: "More communicators = more memory used"; ring/tree buffers grow with the channel count, not
with the number of ranks beyond two nodes (NVIDIA/nccl #864, sjeaugey, quoted in #986). The bytes per
communicator are the one measurement of them per group that a public source prints: NVIDIA/nccl #964 (4 x A100
with NVLink, PyTorch, a 4 MB all-reduce on every group): 544 MB for a 2-rank group, 688 MB for a larger one, read
as MiB (nvidia-smi's unit) [U: one NCCL version on one node; a communicator across nodes holds network buffers of
the same per-channel sizes (NCCL_BUFFSIZE per protocol), and a Hopper node runs more channels than an A100 one,
so more bytes (#986)]. Which groups a framework's training step touches is its profile's
(planner/frameworks/profiles.py); this module only counts them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from enum import StrEnum

MIB = 2**20
COMMUNICATOR_BYTES = 688 * MIB
"""One NCCL communicator of more than two ranks on a GPU (NVIDIA/nccl #964: 688 MB per group of 3-4 A100s)."""
PAIR_COMMUNICATOR_BYTES = 544 * MIB
"""One 2-rank NCCL communicator (a send/recv pair, or a 2-rank group) on a GPU (NVIDIA/nccl #964: 544 MB)."""


class Group(StrEnum):
    """Process groups a training step runs collectives on. Sizes: communicator_group_sizes."""

    WORLD = "world"  # the default group: torch.distributed.barrier() at start-up, all GPUs
    TP = "tp"  # tensor-parallel all-reduces / gathers
    DP = "dp"  # gradient reduce (and ZeRO gathers) over DP x CP
    CP = "cp"  # context-parallel KV exchange
    EP = "ep"  # expert-parallel all-to-all
    MODEL = "model"  # TP x PP (grad-norm / overflow all-reduce over the model-parallel group)
    PIPE = "pipe"  # a collective over the PP group (DeepSpeed's pipe engine broadcasts the loss on it)
    P2P = "p2p"  # send/recv to each neighbouring stage: a 2-rank communicator per neighbour
    TIED = "tied"  # first and last stage all-reduce a tied embedding's gradient: a 2-rank group


DEFAULT_GROUPS: tuple[str, ...] = (Group.WORLD, Group.TP, Group.DP, Group.CP, Group.EP, Group.MODEL, Group.P2P,
                                   Group.TIED)
"""Megatron's: the default group, TP, DP x CP, CP, EP, the model-parallel group (grad norm), a send/recv pair per
neighbouring stage and the embedding group (the Megatron-LM/Core profiles and the generic one, Knobs' default)."""


@functools.lru_cache(maxsize=4096)  # pure, and called per stage of every candidate the search estimates
def communicator_group_sizes(groups: Sequence[str], *, tp: int, dp: int, pp: int, stage: int, cp: int = 1,
                             ep: int = 1, tied_embeddings: bool = False, dp_replicas: int = 1) -> tuple[int, ...]:
    """The size of each communicator a GPU of pipeline stage `stage` holds, for the groups a framework's step uses.
    A group of one rank needs no communicator. Under hybrid sharding (`dp_replicas` > 1) the DP group is the
    sharding group and the replicas reduce on a group of their own."""
    size = {Group.WORLD: tp * dp * cp * pp, Group.TP: tp, Group.DP: dp * cp // dp_replicas, Group.CP: cp, Group.EP: ep,
            Group.MODEL: tp * pp, Group.PIPE: pp,
            Group.P2P: 2, Group.TIED: 2}  # a send/recv pair; the first and last stage's tied pair
    count = {Group.P2P: (stage > 0) + (stage < pp - 1),
             Group.TIED: int(tied_embeddings and pp > 1 and stage in (0, pp - 1))}
    sizes: list[int] = []
    for name in groups:
        g = Group(name)
        sizes += [size[g]] * count.get(g, 1)
        if g is Group.DP:
            sizes.append(dp_replicas)
    return tuple(s for s in sizes if s > 1)


def communicator_bytes(group_sizes: Sequence[int], scale: float = 1.0) -> float:
    """Device memory of the communicators of these sizes on one GPU; `scale` multiplies the measured bytes (0: no
    NCCL, as on CPU ranks, which talk over gloo)."""
    return scale * float(sum(PAIR_COMMUNICATOR_BYTES if n == 2 else COMMUNICATOR_BYTES for n in group_sizes if n > 1))
