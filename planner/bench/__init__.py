"""The torch.distributed benchmark (torch imported lazily, only here)."""

# what recompute 'selective' runs as (planner/bench/recompute.py): Megatron's attention-core recompute, or
# torchtitan's per-op selective activation checkpointing; named here, where the report and the CLI read them
# without importing torch
CORE_ATTENTION = "core_attention"
PER_OP = "per_op"
SELECTIVE_KINDS = (CORE_ATTENTION, PER_OP)


def need_torch() -> None:
    """A MissingDependencyError (exit 6) saying how to install torch, when it is not there."""
    try:
        import torch  # noqa: F401
    except ImportError:
        from planner.errors import MissingDependencyError

        raise MissingDependencyError(
            "torch is not installed: `pip install 'planner[bench]'` (torch==2.13.0) for bench and calibrate") from None
