"""The training frameworks a plan can be run with.

One package holds every per-framework fact, as data with sources: `capabilities` (what a framework can run:
schedules, ZeRO/FSDP modes, sequence parallelism, uneven splits, recompute granularities) and `profiles` (how it
runs: memory recipe, checkpointing semantics, overlap of each kind of traffic, kernel efficiency, allocator reserve).
"""

from enum import StrEnum


class Framework(StrEnum):
    MEGATRON = "megatron"  # Megatron-LM / Megatron-Core
    NEMO = "nemo"  # NeMo 2 / Megatron-Bridge (Megatron-Core underneath)
    TORCHTITAN = "torchtitan"  # torchtitan (FSDP2, torch.distributed.pipelining)
    DEEPSPEED = "deepspeed"  # DeepSpeed (also under the Hugging Face Trainer)
    MEGATRON_DEEPSPEED = "megatron-deepspeed"  # Megatron-DeepSpeed (BLOOM-era)
    GENERIC = "generic"  # no framework named: the planner's stated default behaviour
