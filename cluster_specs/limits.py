"""Upper bounds on input numbers, each with the reason it is safe. The schemas use them (so every entry point,
file or flag, gets the same check) and the error message quotes the reason.

Each bound leaves ample room above the largest published value; beyond it the search would spend minutes or
gigabytes enumerating divisors, or a cost model would overflow, for a request no machine can run.
"""

from __future__ import annotations

import math
from typing import TypeGuard

from cluster_specs.errors import SpecError

MAX_GPUS = 2**20
MAX_GPUS_PER_NODE = 1024
MAX_GLOBAL_BATCH = 2**20
MAX_SEQ_LENGTH = 2**27
MAX_LAYERS = 10_000
MAX_HIDDEN = 2**20
MAX_HEADS = 2**16
MAX_VOCAB = 2**24
MAX_GPU_MEMORY_GIB = 2**20
MAX_TFLOPS = 1e6
MAX_BANDWIDTH_GB_S = 1e6
MAX_EXPERTS = 2**16

REASONS = {
    "num_nodes": f"at most {MAX_GPUS:,} GPUs: 5x the largest cluster announced (~200,000 GPUs)",
    "num_gpus": f"at most {MAX_GPUS:,} GPUs: 5x the largest cluster announced (~200,000 GPUs)",
    "gpus_per_node": "the largest NVLink domain announced is 576 GPUs (NVL576)",
    "global_batch_size": f"{MAX_GLOBAL_BATCH:,} sequences: published batches are <= ~16,000 sequences",
    "seq_length": f"{MAX_SEQ_LENGTH:,} tokens: 10x the longest published context (10M tokens)",
    "max_position_embeddings": f"{MAX_SEQ_LENGTH:,} tokens: 10x the longest published context (10M tokens)",
    "num_layers": f"{MAX_LAYERS:,} layers: published models have <= ~200",
    "hidden_size": f"{MAX_HIDDEN:,}: published models use <= ~30,000",
    "ffn_hidden_size": f"{4 * MAX_HIDDEN:,}: 4 x the largest hidden size accepted",
    "num_attention_heads": f"{MAX_HEADS:,} heads: published models use <= 128",
    "num_kv_heads": f"{MAX_HEADS:,} heads: published models use <= 128",
    "vocab_size": f"{MAX_VOCAB:,} tokens: published vocabularies are <= ~260,000",
    "memory_gib": f"{MAX_GPU_MEMORY_GIB:,} GiB: 1,000x the largest GPU memory today",
    "tflops": f"{MAX_TFLOPS:,.0f} TFLOP/s: 100x the fastest GPU's dense peak today (B300 FP4, ~15,000)",
    "hbm_gb_per_s": f"{MAX_BANDWIDTH_GB_S:,.0f} GB/s: 100x the fastest GPU memory today (~8,000 GB/s)",
    "gb_per_s": f"{MAX_BANDWIDTH_GB_S:,.0f} GB/s: 100x the fastest GPU link today",
    "num_experts": f"{MAX_EXPERTS:,} experts: 100x the most routed experts published (384)",
    "expert_groups": f"{MAX_EXPERTS:,} experts: 100x the most routed experts published (384)",
    "tp": f"at most {MAX_GPUS:,} GPUs in all",
    "pp": f"at most {MAX_GPUS:,} GPUs in all",
    "dp": f"at most {MAX_GPUS:,} GPUs in all",
    "micro_batch_size": f"at most the largest global batch ({MAX_GLOBAL_BATCH:,})",
    "num_micro_batches": f"at most the largest global batch ({MAX_GLOBAL_BATCH:,})",
    "virtual_stages": f"at most the largest layer count ({MAX_LAYERS:,})",
}


def reason_for(field: str) -> str | None:
    return REASONS.get(field)


def is_finite_number(x: object) -> TypeGuard[float]:
    """A JSON number that is a real value: an int or float, not a bool, not nan or infinite."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def is_int_at_least(x: object, least: int) -> TypeGuard[int]:
    """A whole number of a config (an int, not a bool) that is at least `least`: the check every reader of degrees,
    sizes and counts makes before it divides by one."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= least


def finite_option(name: str, value: float, *, low: float = 0.0, low_inclusive: bool = True,
                  high: float | None = None) -> float:
    """A command-line number that must be finite and within [low, high] (or (low, high]); else a SpecError."""
    ok = math.isfinite(value) and (value >= low if low_inclusive else value > low) and (high is None or value <= high)
    if not ok:
        rel = ">=" if low_inclusive else ">"
        upper = f" and <= {high:g}" if high is not None else ""
        raise SpecError(f"{name}: {value} -> must be a finite number {rel} {low:g}{upper}")
    return value
