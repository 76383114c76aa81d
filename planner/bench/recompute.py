"""Recomputation as the benchmark runs it: full, and 'selective' as the plan's framework means it (torch only).

- full: every layer checkpointed (torch.utils.checkpoint), keeping its input only.
- selective, Megatron's meaning (megatron, nemo, deepspeed, megatron-deepspeed, generic): the attention core
  (Q K^T, softmax, dropout, P V, or the fused SDPA kernel) is recomputed; every linear keeps its input
  (Korthikanti et al. 2022 §4; cost_models/memory.py).
- selective, torchtitan's meaning (where cost_models.op_sac.in_effect: its profile states `selective_op_sac` and
  the block is a dense one with SDPA attention, the blocks op_sac models): per-op selective activation
  checkpointing (frameworks.md §1.5), through torch's own create_selective_checkpoint_contexts. Each block is one
  region; the policy must-saves the outputs of SDPA and of reduce-scatters, and of every other matmul of the
  block's forward (the 1st, 3rd, 5th ...; a per-region counter), and recomputes the rest: the save set
  cost_models/op_sac.py predicts. torchtitan's list names aten.mm; the benchmark's GPT blocks carry biases, so
  their linears run as aten.addmm, which counts as a matmul here.

What SAC keeps lives in its own cache, not in autograd's saved tensors, so the benchmark's saved-activation meter
(runner.SavedActivationMeter) is told about each region's cache (`metering`), held weakly.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from planner.bench import CORE_ATTENTION, PER_OP, SELECTIVE_KINDS

_aten = torch.ops.aten
MATMUL_OPS = frozenset({_aten.mm.default, _aten.addmm.default})
SDPA_OPS = frozenset(getattr(_aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu") if hasattr(_aten, name))
REDUCE_SCATTER_OPS = frozenset({torch.ops._c10d_functional.reduce_scatter_tensor.default})

_meter: Any = None  # the SavedActivationMeter of the step being measured (metering)


def selective_kind(per_op_sac: bool) -> str:
    """What 'selective' runs as: per-op SAC where it is in effect (`op_sac.in_effect`), else Megatron's core."""
    return PER_OP if per_op_sac else CORE_ATTENTION


@contextlib.contextmanager
def metering(meter) -> Iterator[None]:
    """While measuring a step: per-op SAC regions report their caches to `meter`."""
    global _meter
    previous, _meter = _meter, meter
    try:
        yield
    finally:
        _meter = previous
        if meter is not None:
            meter.caches.clear()


def op_sac_policy():
    """A fresh per-region policy: SDPA and reduce-scatter outputs saved, every other matmul saved (1st, 3rd ...),
    all else recomputed. Forward and recompute count their matmuls apart, as torchtitan's policy does."""
    counts: dict[bool, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        if func in MATMUL_OPS:
            counts[ctx.is_recompute] += 1
            return CheckpointPolicy.MUST_SAVE if counts[ctx.is_recompute] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        if func in SDPA_OPS or func in REDUCE_SCATTER_OPS:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def op_sac_contexts():
    """create_selective_checkpoint_contexts with a fresh op_sac_policy; the region's cache goes to the meter."""
    contexts = create_selective_checkpoint_contexts(op_sac_policy())
    if _meter is not None:
        _meter.track_cache(contexts[1])  # the mode backward replays from: alive while the region's graph is
    return contexts


def cached_tensors(mode) -> list[torch.Tensor]:
    """The tensors a SAC region's cache holds now (backward replaces each entry it uses by a marker; entries after
    the last one backward needs stay until the region's graph is freed, and the mode with them)."""
    leaves = pytree.tree_leaves(list(mode.storage.values()))
    return [x for x in (getattr(leaf, "val", leaf) for leaf in leaves) if isinstance(x, torch.Tensor)]


class Checkpointed(nn.Module):
    """A module run under torch.utils.checkpoint (non-reentrant), whole (full) or per-op (context_fn)."""

    def __init__(self, inner: nn.Module, *, per_op: bool = False):
        super().__init__()
        self.inner = inner
        self.per_op = per_op

    def forward(self, *args):
        if self.per_op:
            out = checkpoint(self.inner, *args, use_reentrant=False, context_fn=op_sac_contexts)
            if _meter is not None:
                _meter.observe()
            return out
        return checkpoint(self.inner, *args, use_reentrant=False)


def apply_recompute(module: nn.Module, policy: str, selective: str = CORE_ATTENTION) -> None:
    """full: checkpoint every layer; selective: the attention core (Megatron) or per-op SAC of each block
    (torchtitan), as `selective` says. `module.layers` is a ModuleDict of bench Blocks."""
    if selective not in SELECTIVE_KINDS:
        raise ValueError(f"selective: {selective!r} -> allowed: {', '.join(SELECTIVE_KINDS)}")
    layers = cast(nn.ModuleDict, module.layers)
    for key in list(layers.keys()):
        block = layers[key]
        if policy == "full":
            layers[key] = Checkpointed(block)
        elif policy == "selective" and selective == PER_OP:
            layers[key] = Checkpointed(block, per_op=True)
        elif policy == "selective":
            cast(Any, block).attn.recompute_core = True
