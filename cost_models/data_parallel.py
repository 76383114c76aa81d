"""Data-parallel traffic of one step per stage: gradient reduction and parameter gathers under ZeRO 0-3, with the
share hidden behind the backward pass, and the embedding-gradient sync between the first and last stage.
Standard library only; the collectives are communication.py's ring alpha-beta model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cost_models.communication import (
    all_gather_seconds,
    all_reduce_seconds,
    pp_neighbour_link,
    reduce_scatter_seconds,
    slice_reduces_seconds,
)
from cost_models.inputs import ZERO3_MAX_REUSE_DISTANCE_ELEMENTS, GradReduce, Hardware, Link


@dataclass(frozen=True, slots=True)
class DataParallelTraffic:
    total_seconds: float  # the slowest stage's traffic before overlap (for explanations)
    exposed_seconds: float  # the slowest stage's traffic left on the critical path


def zero3_regathered_modules(module_elements: Sequence[float], *,
                             max_reuse_distance: float = ZERO3_MAX_REUSE_DISTANCE_ELEMENTS) -> tuple[bool, ...]:
    """Which modules of a fully recomputed layer (parameter elements of each, in forward order) DeepSpeed's ZeRO-3
    gathers a third time in a step.

    Its hooks gather a module's parameters before each of its forwards, the recompute's inside backward included
    (the recompute runs the modules' forward hooks again: DeepSpeed issue #4784), and release them after that forward
    unless the module is used again within `max_reuse_distance` elements of parameters fetched in between
    (PartitionedParameterCoordinator.__params_to_release today, _keep_for_later in v0.3.13). After a recompute, a
    module's next use is its own backward, once every later module of the layer has run its forward and its backward:
    twice their elements. A module that far from its backward is released and gathered again for it. torch FSDP
    gathers a whole block before its backward, recompute and all, and never re-gathers."""
    out, after = [], 0.0
    for n in reversed(module_elements):
        out.append(2 * after >= max_reuse_distance)
        after += n
    return tuple(reversed(out))


def zero3_reduce_buckets(module_elements: Sequence[float], *, layers: int, other_elements: float,
                         bucket_elements: float) -> int:
    """Reduce-scatters one backward of a stage issues under DeepSpeed's bucketed ZeRO-3 reduce: gradients join the
    bucket as backward produces them (the `layers` layers' modules in reverse, `module_elements` each on one GPU,
    after the head's and embeddings' `other_elements`), a full bucket is reduced before a gradient that would
    overflow it joins (`elements > 0 and elements + next > reduce_bucket_size`), each bucket in one coalesced
    reduce-scatter, and the last at the end of backward (stage3.py reduce_independent_p_g_buckets_and_remove_grads,
    __reduce_and_partition_ipg_grads -> __avg_scatter_grads -> reduce_scatter_coalesced, DeepSpeed 0.19.8). One
    module's weight and bias count as one gradient."""
    count, filled = 0, 0.0
    for n in [other_elements] * (other_elements > 0) + [x for x in reversed(module_elements) if x > 0] * layers:
        if filled > 0 and filled + n > bucket_elements:
            count, filled = count + 1, 0.0
        filled += n
    return count + (filled > 0)


def zero_comm_seconds(*, zero_stage: int, params: float, grad_reduce_bytes: float, param_bytes: float, dp: int,
                      layers: int, num_micro_batches: int, link: Link, modules_per_layer: int = 1,
                      gathers_per_layer: int | None = None, regathered_share: float = 0.0,
                      regathers: int = 0, reduce_scatters: int | None = None,
                      grad_reduce: GradReduce = GradReduce.REDUCE_SCATTER, zero0_gather: bool = False) -> float:
    """One stage's data-parallel traffic per step (ZeRO paper §7 for the volumes):

    ZeRO-0: one all-reduce of the gradients; ZeRO-1: reduce-scatter of the gradients + all-gather of the updated
    parameters; ZeRO-2: the reduce-scatter after every micro-batch (gradients are sharded, so accumulation cannot
    wait) + one all-gather; ZeRO-3 / FSDP: per layer and micro-batch an all-gather in forward, one in backward, and
    a reduce-scatter (1.5x the DP volume), each paying the ring latency per layer. `modules_per_layer` units are
    reduced one at a time, and gathered one at a time unless `gathers_per_layer` says otherwise (None: as many): the
    same bytes in that many all-gathers (DeepSpeed's ZeRO-3 of 2021 gathered each weight on its own and
    reduce-scattered every tensor on its own: step.zero3_units_per_layer), more or less latency, the same bandwidth.
    `regathers` more all-gathers per micro-batch move `regathered_share` of the parameters again (DeepSpeed's ZeRO-3
    under full recompute: zero3_regathered_modules). `reduce_scatters` (None: one per unit) says how many the
    gradients are reduced in instead (DeepSpeed's bucketed reduce today: zero3_reduce_buckets). `grad_reduce`: how
    ZeRO-1/2 reduce the gradients (Knobs.grad_reduce): a reduce-scatter; an all-reduce, each rank keeping its
    partition of the result (DeepSpeed's DeepSpeedZeroOptimizer); or each rank's slice reduced to it with a dist.reduce
    of its own (DeepSpeed with use_multi_rank_bucket_allreduce off, Megatron-DeepSpeed's ZeRO-2), a reduce-scatter's
    bytes and dp times its latency (communication.slice_reduces_seconds). `zero0_gather`: an optimizer that
    shards its states at ZeRO-0 all-gathers the updated 16-bit parameters after its step (DeepSpeed's BF16_Optimizer:
    update_lp_params -> all_gather_dp_groups).
    """
    grad_msg, param_msg, m = params * grad_reduce_bytes, params * param_bytes, num_micro_batches
    if zero_stage == 0:
        return (all_reduce_seconds(message_bytes=grad_msg, group_size=dp, link=link)
                + (all_gather_seconds(message_bytes=param_msg, group_size=dp, link=link) if zero0_gather else 0.0))
    reduce = {GradReduce.ALL_REDUCE: all_reduce_seconds, GradReduce.SLICE_REDUCES: slice_reduces_seconds}.get(
        grad_reduce, reduce_scatter_seconds)
    if zero_stage == 1:
        return (reduce(message_bytes=grad_msg, group_size=dp, link=link)
                + all_gather_seconds(message_bytes=param_msg, group_size=dp, link=link))
    if zero_stage == 2:
        return (m * reduce(message_bytes=grad_msg, group_size=dp, link=link)
                + all_gather_seconds(message_bytes=param_msg, group_size=dp, link=link))
    units = max(1, layers) * modules_per_layer if reduce_scatters is None else max(1, reduce_scatters)
    gathers = max(1, layers) * (modules_per_layer if gathers_per_layer is None else gathers_per_layer)
    again = (regathers * all_gather_seconds(message_bytes=param_msg * regathered_share / regathers, group_size=dp,
                                            link=link) if regathers > 0 else 0.0)
    return m * (2 * gathers * all_gather_seconds(message_bytes=param_msg / gathers, group_size=dp, link=link) + again
                + units * reduce_scatter_seconds(message_bytes=grad_msg / units, group_size=dp, link=link))


def replica_all_reduce_seconds(*, zero_stage: int, params: float, grad_reduce_bytes: float, shard: int,
                               replicas: int, num_micro_batches: int, link: Link, reduce_once: bool = False) -> float:
    """Hybrid sharding (HSDP): after the sharding group's reduce-scatter, the replicas all-reduce each rank's
    gradient shard (params / shard): once a step under ZeRO-1, after every micro-batch under ZeRO-2/3, whose
    gradients are reduced in each backward (torch FSDP2's HSDP; torchtitan never skips that sync without PP,
    frameworks.md §1.6), unless `reduce_once`: DeepSpeed's MiCS all-reduces the accumulated shards once, at the
    accumulation boundary (runtime/zero/mics.py allreduce_mics_shard_grads). 0 without replicas (a group of one
    rank moves nothing)."""
    once = all_reduce_seconds(message_bytes=params * grad_reduce_bytes / shard, group_size=replicas, link=link)
    return once * (num_micro_batches if zero_stage >= 2 and not reduce_once else 1)


def overlap_window_seconds(*, zero_stage: int, forward_seconds: float, backward_seconds: float,
                           num_micro_batches: int) -> float:
    """Compute time the traffic can hide behind: the last backward (ZeRO 0/1 reduce once, at the end), every
    backward (ZeRO-2), every forward and backward (ZeRO-3 gathers ahead of both)."""
    m = num_micro_batches
    if zero_stage <= 1:
        return backward_seconds
    if zero_stage == 2:
        return m * backward_seconds
    return m * (forward_seconds + backward_seconds)


def embedding_sync_seconds(hw: Hardware, *, tp: int, dp: int, embedding_grad_bytes: float) -> float:
    """Tied embeddings over a pipeline: the first and last stage all-reduce the embedding gradient (Megatron)."""
    pp_link, _ = pp_neighbour_link(hw, tp=tp, dp=dp)
    return all_reduce_seconds(message_bytes=embedding_grad_bytes, group_size=2, link=pp_link)
