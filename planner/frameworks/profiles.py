"""How each framework runs a layout: execution profiles as data, each value with its source.

A profile says where the bytes of a parameter live (memory recipe), what 'selective' checkpointing keeps,
how much of each kind of traffic the framework hides by default (and the flag that changes it), the caching
allocator's reserve and the fixed per-process memory. The cost models never branch on a framework: a profile
becomes `Knobs` (`profile_knobs`) and the same profile serves `estimate`, `plan`, `check` and `validate`.

Overlap values are *shares of that traffic hidden* behind compute (the rest is on the critical path; the hidden
part is further capped by the compute window it can hide behind, see cost_models/step.py). Sources are the
project's reference notes (`../shared/reference/frameworks.md`, section numbers §) read at the commits listed
there, and the papers named. [U] marks a value no source states exactly (an engineering estimate).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from cost_models.inputs import (
    REDUCE_BUCKET_ELEMENTS,
    ZERO3_MAX_REUSE_DISTANCE_ELEMENTS,
    Knobs,
    Zero0Optimizer,
    Zero3Gather,
)
from cost_models.memory import (
    TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT,
    TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT,
)
from cost_models.nccl import COMMUNICATOR_BYTES, DEFAULT_GROUPS, PAIR_COMMUNICATOR_BYTES, Group
from planner.frameworks import Framework

GIB = 2**30
MIB = 2**20


@dataclass(frozen=True, slots=True)
class Sourced:
    """One profile value and where it comes from."""

    value: float
    source: str


@dataclass(frozen=True, slots=True)
class MemoryRecipe:
    """Bytes per parameter by where they live (bf16 training with Adam), before sharding.

    persistent_*: resident for the whole step; `sharded_from_zero` says from which ZeRO stage each is divided by
    the DP degree. gathered_param_bytes: the unsharded working copy of one gathered unit (ZeRO-3 / FSDP).
    """

    name: str
    param_bytes: float
    grad_bytes: float
    optimizer_bytes: float  # fp32 master copy (when kept apart from the params) + Adam moments
    gathered_param_bytes: float
    zero3_gather: str  # "layer": a whole block (+1 prefetched); "module": one Linear at a time
    source: str
    bucket_bytes: float = 0.0  # communication buckets allocated on top (DeepSpeed ZeRO-1/2 IPG and all-gather)
    keeps_stage_output: bool = False  # the pipeline engine keeps each in-flight micro-batch's stage output
    # the optimizer run at ZeRO-0 where it is another one (Knobs.zero0_optimizer); None: the plain one
    zero0: Zero0Optimizer | None = None
    dynamic_grads: bool = False  # gradients are per-parameter tensors allocated every step (not one persistent buffer)
    # ZeRO-1/2 buffers sized by the reduce bucket: (elements, buffers) (Knobs.reduce_bucket_elements/_buffers; None:
    # bucket_bytes)
    reduce_buffers: tuple[float, int] | None = None
    # the optimizer run at ZeRO-0 when the model is a pipeline (DeepSpeed's BF16_Optimizer for a bf16 PipelineModule;
    # Knobs.zero0_pipeline_optimizer); None: as without one
    zero0_pipeline: Zero0Optimizer | None = None

    @property
    def bytes_per_param(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    def applied_to(self, knobs: Knobs) -> Knobs:
        """`knobs` with the cost-model knobs this recipe sets (the one place they are written)."""
        return replace(knobs, zero3_gather=Zero3Gather(self.zero3_gather), bucket_bytes=self.bucket_bytes,
                       keeps_stage_output=self.keeps_stage_output, zero0_optimizer=self.zero0,
                       dynamic_grads=self.dynamic_grads,
                       reduce_bucket_elements=self.reduce_buffers[0] if self.reduce_buffers else None,
                       reduce_bucket_buffers=self.reduce_buffers[1] if self.reduce_buffers else 2,
                       zero0_pipeline_optimizer=self.zero0_pipeline,
                       state_bytes_per_param=(self.param_bytes, self.grad_bytes, self.optimizer_bytes))


@dataclass(frozen=True, slots=True)
class Overlap:
    """Share of each kind of traffic hidden behind compute by default, and the flag that controls it."""

    dp: Sourced  # DDP all-reduce / ZeRO-1,2 reduce-scatter + all-gather
    zero3: Sourced  # ZeRO-3 / FSDP per-layer gathers and reduce-scatters
    tp: Sourced
    pp: Sourced
    ddp: Sourced | None = None  # ZeRO-0 (DDP) all-reduce where it differs from `dp` (None: as dp)
    pp_needs_virtual: Sourced | None = None  # set: the pp share holds only with virtual stages, else none hidden


@dataclass(frozen=True, slots=True)
class Allocator:
    """The caching allocator's reserve above the live (allocated) peak, and memory outside the allocator.

    reserve_fraction applies to the dynamic part (activations, gathered units, buckets): model states are
    allocated once, in large persistent buffers, and do not fragment.
    """

    reserve_fraction: Sourced
    fixed_bytes: Sourced  # CUDA context + cuBLAS workspaces (outside torch's reserved pool)
    fixed_bytes_by_generation: dict[str, Sourced] = field(default_factory=dict)  # where measured per GPU generation
    nccl: NcclGroups | None = None  # the groups whose NCCL communicators the step builds (cost_models/nccl.py)

    def fixed_bytes_on(self, gpu_generation: str | None) -> float:
        """The memory outside the allocator on this GPU generation: its own measurement where there is one."""
        return self.fixed_bytes_by_generation.get(gpu_generation or "", self.fixed_bytes).value


@dataclass(frozen=True, slots=True)
class NcclGroups:
    """The process groups a framework's training step runs collectives on (cost_models.nccl.Group names): each
    builds an NCCL communicator whose buffers sit outside the caching allocator (cost_models/nccl.py)."""

    groups: tuple[str, ...]
    source: str


@dataclass(frozen=True, slots=True)
class Profile:
    framework: Framework
    title: str
    memory: MemoryRecipe
    selective_checkpointing: str  # what 'selective' recomputes in this framework
    overlap: Overlap
    allocator: Allocator
    memory_reported_as: str  # what the framework's own log prints (for comparing with its published runs)
    kernel_efficiency: dict[str, Sourced] = field(default_factory=dict)  # GPU generation -> factor on e2e efficiency
    memory_fp16: MemoryRecipe | None = None  # the recipe under fp16, where the framework runs another optimizer
    # where sequence parallelism keeps the QKV/FC1 inputs all-gathered for backward (torch DTensor SP); None:
    # sharded and re-gathered in backward, as Megatron does
    sp_gathered_inputs: str | None = None
    expert_kernel_gflop: Sourced | None = None  # per-expert kernels' fixed cost (cost_models/moe.py); None: 0
    # where SwiGLU runs as one fused kernel that saves only its input (Knobs.fused_swiglu); None: autograd's SiLU and
    # product keep their own operands (8 s b f bytes, not 6)
    fused_swiglu: str | None = None
    # GPU generation -> fraction of peak the framework's fused causal attention kernel reaches over forward and
    # backward, on the causal FLOPs it runs (Knobs.attention_kernel_efficiency); a generation not listed keeps the
    # core at its full-s^2 FLOPs and the GEMM rate
    attention_kernel: dict[str, Sourced] = field(default_factory=dict)
    # where 'selective' is torchtitan's per-op SAC (cost_models/op_sac.py), not Megatron's core-attention recompute
    selective_op_sac: str | None = None
    loss_bytes_per_logit: Sourced | None = None  # the loss's peak bytes per logit (Knobs); None: Megatron's 4
    # the same where TP shards the vocabulary and the loss runs on the shards (Knobs.loss_parallel_bytes_per_logit);
    # None: loss_bytes_per_logit at every TP degree
    loss_parallel_bytes_per_logit: Sourced | None = None
    # where the pipeline keeps a receive buffer per micro-batch for the whole step (Knobs.pp_receive_buffers)
    pp_receive_buffers: str | None = None
    # where FP8 Linears are torchao's Float8Linear (Knobs.fp8_torchao_linear): the high-precision input is saved and
    # the weights cast on the fly; None: Transformer Engine's (FP8-saved inputs, cached FP8 weight copies)
    fp8_torchao_linear: str | None = None
    # what an fp32 master copy of a bf16 parameter costs once the optimizer's states are set below fp32
    # (Knobs.precision_aware_master_bytes); None: 4
    master_remainders: Sourced | None = None
    # where the framework runs eager by default with torch.compile a flag away: the elementwise traffic is the eager
    # fit's, and `check` reads the flag (Knobs.compiled_elementwise_share, COMPILED_ELEMENTWISE_SHARE)
    eager_elementwise: str | None = None
    # where hybrid sharding all-reduces the gradient shards across replicas once a step (Knobs.hsdp_replica_reduce_once,
    # DeepSpeed's MiCS); None: after every micro-batch under ZeRO-2/3, as torch FSDP2's HSDP does
    hsdp_replica_reduce_once: str | None = None
    # where bf16 training's gradients are reduced in 16 bits, not as the fp32 main gradients of Megatron and torch
    # FSDP2's default MixedPrecisionPolicy(reduce_dtype=fp32) (Knobs.grad_reduce_16bit)
    grad_reduce_16bit: str | None = None
    # where ZeRO-3 reduces gradients in buckets of this many elements, one coalesced reduce-scatter each
    # (Knobs.zero3_reduce_bucket_elements); None: one reduce-scatter per gathered unit
    zero3_reduce_bucket: Sourced | None = None
    # (ZeRO stages, source) where the gradients are all-reduced whole and each rank keeps its partition, not
    # reduce-scattered (Knobs.grad_all_reduce_zero_stages)
    grad_all_reduce: tuple[tuple[int, ...], str] | None = None
    # (ZeRO stages, source) where each rank's slice of the gradients is reduced to it by a dist.reduce of its own, one
    # after another (Knobs.grad_slice_reduce_zero_stages)
    grad_slice_reduce: tuple[tuple[int, ...], str] | None = None

    def attention_kernel_efficiency(self, gpu_generation: str | None) -> float:
        """The fused attention kernel's stated efficiency on this GPU generation, 0 where none is stated."""
        stated = self.attention_kernel.get(gpu_generation or "")
        return stated.value if stated is not None else 0.0

    def recipe(self, precision: str = "bf16") -> MemoryRecipe:
        return self.memory_fp16 if precision == "fp16" and self.memory_fp16 is not None else self.memory

    def knobs(self, base: Knobs | None = None, *, gpu_generation: str | None = None, precision: str = "bf16") -> Knobs:
        """The cost-model knobs of this profile; fitted knobs (efficiencies) are kept from `base`, scaled by the
        profile's kernel efficiency on that GPU generation where evidence shows it differs."""
        base = base or Knobs()
        o, a = self.overlap, self.allocator
        factor = self.kernel_efficiency[gpu_generation].value if gpu_generation in self.kernel_efficiency else 1.0
        recipe = self.recipe(precision)
        return recipe.applied_to(replace(
            base,
            end_to_end_efficiency=base.end_to_end_efficiency * factor,
            dp_overlap_fraction=o.dp.value,
            zero3_overlap_fraction=o.zero3.value,
            tp_overlap_fraction=o.tp.value,
            pp_overlap_fraction=o.pp.value,
            ddp_overlap_fraction=o.ddp.value if o.ddp is not None else None,
            pp_overlap_needs_virtual=o.pp_needs_virtual is not None,
            per_process_overhead_bytes=a.fixed_bytes_on(gpu_generation),
            nccl_groups=a.nccl.groups if a.nccl is not None else base.nccl_groups,
            allocator_reserve_fraction=a.reserve_fraction.value,
            profile=self.framework.value,
            sp_saves_gathered_inputs=self.sp_gathered_inputs is not None,
            moe_expert_kernel_gflop=self.expert_kernel_gflop.value if self.expert_kernel_gflop else 0.0,
            fused_swiglu=self.fused_swiglu is not None,
            attention_kernel_efficiency=self.attention_kernel_efficiency(gpu_generation),
            selective_op_sac=self.selective_op_sac is not None,
            loss_bytes_per_logit=self.loss_bytes_per_logit.value if self.loss_bytes_per_logit else base.loss_bytes_per_logit,
            loss_parallel_bytes_per_logit=(self.loss_parallel_bytes_per_logit.value
                                           if self.loss_parallel_bytes_per_logit else base.loss_parallel_bytes_per_logit),
            pp_receive_buffers=self.pp_receive_buffers is not None,
            fp8_torchao_linear=self.fp8_torchao_linear is not None,
            precision_aware_master_bytes=self.master_remainders.value if self.master_remainders else 4.0,
            hsdp_replica_reduce_once=self.hsdp_replica_reduce_once is not None,
            grad_reduce_16bit=self.grad_reduce_16bit is not None,
            zero3_reduce_bucket_elements=self.zero3_reduce_bucket.value if self.zero3_reduce_bucket else None,
            grad_all_reduce_zero_stages=self.grad_all_reduce[0] if self.grad_all_reduce else (),
            grad_slice_reduce_zero_stages=self.grad_slice_reduce[0] if self.grad_slice_reduce else (),
        ))

    def assumptions(self) -> list[tuple[str, str, str]]:
        """(knob, statement, source) for every profile value that moves a prediction."""
        o, a, m = self.overlap, self.allocator, self.memory
        return [
            ("dp_overlap_fraction", f"DP gradient reduce / ZeRO-1,2 traffic {o.dp.value:.0%} hidden", o.dp.source),
            ("zero3_overlap_fraction", f"ZeRO-3/FSDP gathers and reduce-scatters {o.zero3.value:.0%} hidden",
             o.zero3.source),
            ("tp_overlap_fraction", f"TP all-reduces {o.tp.value:.0%} hidden", o.tp.source),
            ("pp_overlap_fraction", f"steady-state pipeline send/recv {o.pp.value:.0%} hidden"
             + (" (with virtual stages; none without)" if o.pp_needs_virtual else ""), o.pp.source),
            ("allocator_reserve_fraction", f"caching allocator reserves {a.reserve_fraction.value:.0%} above the "
             "live activations and buffers", a.reserve_fraction.source),
            ("per_process_overhead_bytes", f"{a.fixed_bytes.value / GIB:.2f} GiB per GPU outside the allocator "
             "(CUDA context, workspaces; NCCL apart)", a.fixed_bytes.source),
        ] + [
            (f"per_process_overhead_bytes[{gen}]", f"{v.value / GIB:.2f} GiB per GPU outside the allocator on {gen}",
             v.source) for gen, v in a.fixed_bytes_by_generation.items()] + ([
            ("nccl_groups", f"an NCCL communicator per group the step uses ({', '.join(a.nccl.groups)}, where more "
             f"than one rank): {COMMUNICATOR_BYTES / MIB:.0f} MiB each, {PAIR_COMMUNICATOR_BYTES / MIB:.0f} MiB a "
             "2-rank one, outside the allocator", f"{a.nccl.source}; bytes: {NCCL_BYTES_SOURCE}")]
            if a.nccl is not None else []) + [
            ("memory_recipe", f"{m.name}: {m.bytes_per_param:g} B/param", m.source),
        ] + ([("zero3_max_reuse_distance", "ZeRO-3 keeps a recomputed module gathered until its backward when "
               f"that is under {ZERO3_MAX_REUSE_DISTANCE_ELEMENTS / 1e9:g} billion parameter elements away, and "
               "gathers it again otherwise", _REUSE_DISTANCE)] if m.zero3_gather != "layer" else []) + ([
            ("zero3_reduce_bucket_elements", "ZeRO-3 reduces gradients in buckets of "
             f"{self.zero3_reduce_bucket.value / 1e6:g} million elements, one reduce-scatter each (not one per "
             "gradient)", self.zero3_reduce_bucket.source)] if self.zero3_reduce_bucket else []) + ([
            ("grad_all_reduce_zero_stages", "ZeRO-" + "/".join(map(str, self.grad_all_reduce[0])) + " all-reduce each "
             "gradient bucket whole, every rank keeping its partition (not a reduce-scatter)", self.grad_all_reduce[1])]
            if self.grad_all_reduce else []) + ([
            ("grad_slice_reduce_zero_stages", "ZeRO-" + "/".join(map(str, self.grad_slice_reduce[0])) + " reduce each "
             "rank's gradient slice to it with a dist.reduce of its own, one after another (dp times a "
             "reduce-scatter's latency)", self.grad_slice_reduce[1])] if self.grad_slice_reduce else []) + ([("sp_saves_gathered_inputs", "sequence parallelism saves the QKV and FC1 inputs all-gathered "
               "(2 s b h (1 - 1/tp) more per layer than Megatron)", self.sp_gathered_inputs)]
             if self.sp_gathered_inputs else []) + ([
            ("fused_swiglu", "SwiGLU fused: saves FC1's output and FC2's input only (6 s b f bytes per layer, not "
             "autograd's 8)", self.fused_swiglu)] if self.fused_swiglu else []) + ([
            ("selective_op_sac", "recompute selective = per-op SAC: a dense block keeps its input, every 2nd matmul's "
             "output and the attention output; it recomputes the other matmuls and every elementwise op",
             self.selective_op_sac)] if self.selective_op_sac else []) + ([
            ("pp_receive_buffers", "pipeline stages keep one activation receive buffer per micro-batch (every stage "
             "but the first) and one gradient receive buffer per micro-batch (every stage but the last) all step",
             self.pp_receive_buffers)] if self.pp_receive_buffers else []) + ([
            ("fp8_torchao_linear", "FP8 Linears (torchao Float8Linear) save their BF16 inputs and cast the weights on the "
             "fly: FP8 saves no activation memory and keeps no FP8 weight copies", self.fp8_torchao_linear)]
             if self.fp8_torchao_linear else []) + ([
            ("compiled_elementwise_share", "the model runs eager: norms, activations and residual adds as separate "
             f"kernels (compiled, they move {COMPILED_ELEMENTWISE_SHARE.value:.0%} of those bytes)",
             self.eager_elementwise)] if self.eager_elementwise else []) + [
            ("attention_kernel_efficiency", f"fused causal attention on {gen}: {v.value:.0%} of peak over forward and "
             "backward, on the causal half of the scores", v.source) for gen, v in self.attention_kernel.items()] + [
            (f"kernel_efficiency[{gen}]", f"{self.title} on {gen}: {v.value:.1%} of the end-to-end efficiency the "
             "other frameworks reach", v.source) for gen, v in self.kernel_efficiency.items()]


_REUSE_DISTANCE = ("DeepSpeed's stage3_max_reuse_distance default (runtime/zero/config.py); `check` reads a config's "
                   "(data_parallel.zero3_regathered_modules)")

# Megatron-Core's precision-aware optimizer (TE FusedAdam) keeps an fp32 master copy of a bf16 parameter as the 16 low
# bits the parameter lacks: OptimizerConfig.store_param_remainders defaults to True (Megatron-LM@d98e8a64
# megatron/core/optimizer/optimizer_config.py L192, passed to FusedAdam from TE 2.1, optimizer/__init__.py L587-588;
# distrib_optimizer.py L1008: with bf16 only). Without the precision-aware optimizer the master is a full fp32 copy.
_MASTER_REMAINDERS = Sourced(2.0, "--use-precision-aware-optimizer keeps the fp32 master of a bf16 parameter as its "
                             "16 low bits (store_param_remainders, default True; optimizer_config.py L192, TE >= 2.1)")

# Megatron-Core's GroupedMLP on TE GroupedLinear launches each local expert's GEMMs (and FP8 casts) as their own kernels
# ("--moe-grouped-gemm: launch multiple local GEMM kernels in multiple streams", Megatron MoE README). Their fixed cost
# per kernel, in GFLOP at the GPU's saturated GEMM rate (cost_models/extensions.py _expert_kernel_terms), fitted on the MoE set (planner/data/moe_runs.json) over all
# its rows; docs/validation-modern.md reports the rows leave-one-model-out (each model's rows with the value fitted on
# the other models' rows). torchtitan runs all local experts in one torch._grouped_mm and keeps 0.
MEGATRON_EXPERT_KERNEL_GFLOP = 48.0
_GROUPED_LINEAR = Sourced(MEGATRON_EXPERT_KERNEL_GFLOP, "per-expert GEMM/cast kernels of TE GroupedLinear (Megatron "
                          "MoE README, --moe-grouped-gemm) [fit: the MoE set, docs/validation-modern.md]")

# Transformer Engine's DotProductAttention picks cuDNN's fused attention (FusedAttention, F16_arbitrary_seqlen) over
# flash-attn on Hopper and newer ("Disabling FlashAttention to give FusedAttention preference on Hopper+ for
# performance reasons", NVIDIA/TransformerEngine@a0b36d0c transformer_engine/pytorch/attention/dot_product_attention/
# utils.py get_attention_backend); Megatron-Core's TE spec and NeMo run it. cuDNN on H100 SXM5 at head dim 128
# (Shah et al. 2024, FlashAttention-3, arXiv:2407.08608, Figs. 5-6): causal forward 484 / 518 / 529 TFLOPs/s and
# backward 465 / 499 / 518 at s = 2k / 4k / 8k; with the backward's 2.5x FLOPs that is 470 / 504 / 521 TFLOPs/s
# over forward + backward, 0.48-0.53 of the 989 peak. FlashAttention-2 on the same figures: 0.30-0.33 (the
# full-s^2-at-GEMM-rate convention of a profile that states no kernel comes to ~0.35-0.40). Blackwell: no
# published figure, none stated.
TE_FUSED_ATTENTION_HOPPER = 0.50
_CUDNN_HOPPER_FIGURE = "cuDNN fwd+bwd at head dim 128, s 2k-8k: 0.48-0.53 of peak (FlashAttention-3 paper, Figs. 5-6)"
_TE_FUSED_ATTENTION = {"hopper": Sourced(TE_FUSED_ATTENTION_HOPPER, "Transformer Engine prefers cuDNN fused attention "
                                         f"on Hopper (get_attention_backend, TE@a0b36d0c); {_CUDNN_HOPPER_FIGURE}")}

# torchtitan asks for cuDNN's fused attention first: its ScaledDotProductAttention runs F.scaled_dot_product_attention
# under sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, ...], set_priority=True) on every GPU since pytorch/torchtitan
# #1776 (6a3a9da9, 2025-10-09; torchtitan/models/common/attention.py at b5bcd76c): the same cuDNN kernel, at the same
# published 0.48-0.53 of H100 peak, as Transformer Engine's. Before, torchtitan took FLASH_ATTENTION first on
# Hopper (#1196, 3b85aa31, 2025-05-14) or torch's own order, which put FlashAttention-2 before cuDNN on sm90 from
# 2024-11 ("Since we deprioritized cuDNN SDPA", pytorch/pytorch#141274; default SDPA 329 TFLOPs/s where cuDNN
# reaches 631 on H100, pytorch#142132) and in torch 2.4 and earlier. FlashAttention-2, causal, head dim 128, on
# H100 SXM5: 0.30-0.33 of peak over forward and backward (FlashAttention-3 paper, Figs. 5-6; "FlashAttention-2
# achieving only 35% utilization on the H100", its abstract): what validation states for torchtitan's runs of
# 2025 (validation.py fsdp_attention_kernel).
FLASH_ATTENTION_2_HOPPER = 0.315
# FlashAttention-2 on A100: "50-73% of the theoretical maximum FLOPs/s on A100" (Dao 2023, arXiv:2307.08691,
# abstract; 73% is its forward at best, "up to 230 TFLOPs/s", §4.1): the midpoint [U: the range spans forward,
# backward and head dims; the Hopper figure above is causal, head dim 128, forward and backward].
FLASH_ATTENTION_2_AMPERE = 0.615
# The GPU the A100 side of that ratio was measured on, whose MAMF fraction the convention's GEMMs reach there.
AMPERE_REFERENCE_GPU = "A100-SXM4-80GB"


def ampere_kernel_convention_rate(*, gpu_matmul_efficiency: float, ampere_matmul_efficiency: float) -> float:
    """The rate, as a fraction of the GEMM-rate convention (Knobs.attention_convention_rate), of a flash attention
    kernel built on Ampere's tensor-core instructions (mma.sync; no Hopper wgmma or TMA) that runs at the convention on
    A100, when it runs on a Hopper GPU whose GEMMs (cuBLAS, built for Hopper) reach `gpu_matmul_efficiency` of peak.

    FlashAttention-2 is such a kernel: it reaches FLASH_ATTENTION_2_AMPERE of A100's peak and
    FLASH_ATTENTION_2_HOPPER of H100's ("only 35% utilization on the H100", FlashAttention-3 abstract: Hopper's
    peak needs wgmma). An Ampere kernel keeps that ratio of fraction of peak, where the convention keeps the GEMMs'
    (MAMF) fraction, which moves from A100's to this GPU's: (FA-2 on Hopper / on Ampere) x (MAMF A100 / MAMF here).
    """
    return (FLASH_ATTENTION_2_HOPPER / FLASH_ATTENTION_2_AMPERE) * (ampere_matmul_efficiency / gpu_matmul_efficiency)


_TORCHTITAN_CUDNN_ATTENTION = {"hopper": Sourced(TE_FUSED_ATTENTION_HOPPER, "torchtitan runs SDPA with cuDNN first "
                                                 "(sdpa_kernel set_priority, torchtitan#1776, 2025-10); "
                                                 f"{_CUDNN_HOPPER_FIGURE}")}

_MEGATRON_RECIPE = MemoryRecipe(
    "Megatron bf16 + fp32 main grads + distributed optimizer", 2, 4, 12, 2, "layer",
    "bf16 params 2 + fp32 main grads 4 + fp32 master and Adam 12 = 18 B/param; the distributed optimizer shards "
    "the 12 (frameworks.md §2.5; arguments.py L1209-1217)")
_MEGATRON_FP16_RECIPE = MemoryRecipe(
    "Megatron fp16: fp16 params and grads + fp32 master and Adam", 2, 2, 12, 2, "layer",
    "fp16 params 2 + fp16 grads 2 + fp32 master and Adam 12 = 16 B/param: fp32 gradient accumulation is turned on "
    "automatically only for bf16 (arguments.py L1209-1217, frameworks.md §2.5); ZeRO paper's 16 B (K = 12)")
_FSDP2_RECIPE = MemoryRecipe(
    "FSDP2 MixedPrecisionPolicy(bf16, fp32)", 2, 4, 10, 2, "layer",
    "sharded fp32 params 4 + fp32 grads 4 + Adam 8 = 16 B/param, no separate master copy and no sharded bf16 copy; "
    "bf16 unsharded params only per FSDP unit being computed (+1 prefetched) (frameworks.md §1.6; torch "
    "_fsdp_api.py docstring). Placed as param 2 (the gathered bf16 unit) + grad 4 + optimizer 10 (fp32 param 4 "
    "+ Adam 8 - 2)")
DEEPSPEED_BF16_OPTIMIZER_BUCKET_ELEMENTS = 5e8  # engine.py MEMORY_OPT_ALLREDUCE_SIZE


def deepspeed_bf16_optimizer_states(accumulate_bytes: int, *, immediate_grad_update: bool = False
                                    ) -> tuple[float, float, float]:
    """(param, grad, optimizer) bytes per parameter, the optimizer's sharded over DP, of DeepSpeed's BF16_Optimizer
    (bf16_optimizer.py, DeepSpeed 0.19.8), which its engine runs instead of the ZeRO optimizer for a bf16 model at
    ZeRO-1 that accumulates gradients in fp32, and for a bf16 pipeline (PipelineModule) without ZeRO
    (engine.py _do_optimizer_sanity_check; `check` reads both: readers.ds_grad_accum_dtype): bf16 params 2 + the bf16
    param.grad 2 (kept across steps, zeroed and not freed; with bf16.immediate_grad_update, off by default, each is
    added to the accumulation buffer by its hook and freed: accumulate_hp_grads_and_remove_lp) + a full gradient
    buffer in the accumulation dtype (`accumulate_bytes`: grad_acc_dtype, the model's unless data_types says) +
    fp32 master 4/d + Adam 8/d. The engine all-reduces that buffer's gradients after backward and update_lp_params
    all-gathers the updated bf16 partitions after the step: the ZeRO-0 path of a framework whose ZeRO-0 optimizer
    shards its states."""
    return 2.0, (0.0 if immediate_grad_update else 2.0) + accumulate_bytes, 12.0


def deepspeed_bf16_optimizer_bucket_bytes(accumulate_bytes: int) -> float:
    """BF16_Optimizer's reduce bucket: buffered_allreduce_fallback -> allreduce_bucket flattens up to 5e8 gradients
    in the accumulation dtype and, where that is not bf16, casts them to the bf16 communication dtype (engine.py,
    0.19.8): 3 GB accumulating in fp32, 1 GB in bf16."""
    cast = 2 if accumulate_bytes != 2 else 0
    return DEEPSPEED_BF16_OPTIMIZER_BUCKET_ELEMENTS * (accumulate_bytes + cast)


def deepspeed_bf16_optimizer(accumulate_bytes: int, *, immediate_grad_update: bool = False) -> Zero0Optimizer:
    """DeepSpeed's BF16_Optimizer as the ZeRO-0 optimizer it is read as: its states (deepspeed_bf16_optimizer_states,
    the optimizer's sharded over DP) and its reduce bucket (deepspeed_bf16_optimizer_bucket_bytes)."""
    return Zero0Optimizer(deepspeed_bf16_optimizer_states(accumulate_bytes, immediate_grad_update=immediate_grad_update),
                          sharded=True, bucket_bytes=deepspeed_bf16_optimizer_bucket_bytes(accumulate_bytes))


_DEEPSPEED_RECIPE = MemoryRecipe(
    "DeepSpeed ZeRO bf16/fp16", 2, 2, 16, 2, "module",
    "16-bit params 2 + 16-bit grads 2 + fp32 grads 4 + fp32 master 4 + Adam 8 = 20 B/param; the 16 fp32 bytes are "
    "partitioned from ZeRO-1 (ZeRO-2 estimator 2P + 18P/N, stage_1_and_2.py L3093-3095, frameworks.md §3.5); "
    "ZeRO-3 gathers one module at a time (stage3_prefetch_bucket_size); at ZeRO-1/2 two IPG gradient buffers of "
    "reduce_bucket_size (default 5e8, runtime/zero/config.py) 16-bit elements, overlap_comm and contiguous_gradients "
    "on as the DeepSpeed export writes them, 2e9 B (stage_1_and_2.py backward; stage.reduce_buffer_bytes: the "
    "all-gather after the step writes in place, no allgather_bucket_size buffer); at ZeRO-3 one flat bucket of "
    "reduce_bucket_size 16-bit gradients, 1e9 B (stage3.py __ipg_bucket_flat_buffer; stage.bucket_bytes); at ZeRO-0 "
    "2e9 B of reduce buffers [U: the engine's ZeRO-0 path is not followed], the unsharded 20 B of its DDP_BFLOAT16 "
    "(FP16_Optimizer) path, except under a pipeline: a bf16 PipelineModule without ZeRO runs BF16_Optimizer "
    "accumulating in bf16, 2 + 4 + 12/d and a 1 GB bucket (engine.py _do_optimizer_sanity_check, DeepSpeed 0.19.8; "
    "deepspeed_bf16_optimizer_states)", 2e9,
    reduce_buffers=(REDUCE_BUCKET_ELEMENTS, 2),
    zero0_pipeline=deepspeed_bf16_optimizer(2))
_DEEPSPEED_FP16_RECIPE = replace(
    _DEEPSPEED_RECIPE, zero0_pipeline=None,
    source=_DEEPSPEED_RECIPE.source + ". In fp16 a pipeline without ZeRO runs FP16_Optimizer, unsharded, as without one "
    "(engine.py _do_optimizer_sanity_check: BF16_Optimizer only for bf16)")
_DEEPSPEED_ZERO1_PIPE_RECIPE = MemoryRecipe(
    "DeepSpeed ZeRO-1 optimizer under the pipeline engine (Megatron-DeepSpeed, bf16/fp16)", 2, 2, 18, 2, "module",
    "DeepSpeedZeroOptimizer (stage_1_and_2.py @8eef742, 2022-02-16: 'bf16 is supported w. zero 1'; BF16_Optimizer "
    "only from PR #1801, 2022-04-19, and only for ZeRO-0). At ZeRO-1 the engine turns contiguous_gradients and "
    "overlap_comm off ('meaningless in stage 1 and are ignored', engine.py _configure_zero_optimizer, from 6ae756c03, "
    "2021-07-26, until af033831f, 2024-01-06), so there is no grads_in_partition buffer and no IPG buffer. Peak at "
    "the optimizer step, as the caching allocator holds it: 16-bit params 2 (one flat buffer) + 16-bit grads 2 "
    "(param.grad, accumulated over the micro-batches, unpartitioned under ZeRO-1), which stay reserved at the step: "
    "zero_grad() frees those per-parameter blocks at the end of the reduce epilogue, and the step's multi-GB "
    "contiguous tensors cannot reuse them (the allocator splits a cached block only for requests smaller than it); "
    "sharded from ZeRO-1: fp32 master 4 + Adam 8 + at step() the flattened 16-bit gradient partition 2 and its fp32 "
    "copy 4 (flatten(averaged_gradients).to(fp32); averaged_gradients are views of param.grad) = 4 + 18/d. The "
    "reduce flattens each bucket of up to reduce_bucket_size (5e8) 16-bit gradients (buffered_reduce_fallback -> "
    "allreduce_bucket) and, in bf16, casts it to fp16 for the all-reduce (allreduce_bucket's communication_data_type "
    "defaults to torch.float16 at that commit): 2 GB in bf16, 1 GB in fp16; the all-gather after the step writes in "
    "place into the flat buffer. The pipe engine keeps each in-flight micro-batch's stage output until its backward "
    "(pipe/engine.py _exec_backward_pass: 'Free up the memory from the output of forward()'). The 16-bit grads are "
    "autograd's per-parameter tensors, allocated every step and freed by zero_grad(): the allocator's reserve applies "
    "to them as to activations. At ZeRO-0 bf16 runs DeepSpeed's BF16_Optimizer (engine.py, DeepSpeed >= 0.6.4; "
    "BigScience tr11: 'bf16 must use z0! it implements its own zero stage 1 equivalent'): bf16 params 2 + a "
    "full-size fp32 gradient buffer 4 + fp32 master 4/d + Adam 8/d (bf16_optimizer.py L141-210, frameworks.md §3.5), "
    "and the all-reduce's bf16 copy of that buffer 2: the pipe engine's _bf16_reduce_grads hands the optimizer's one "
    "flat fp32 gradient per group to buffered_allreduce_fallback, whose flatten of a single tensor is a view and "
    "whose allreduce_bucket casts it whole to the bf16 communication dtype (engine.py, v0.6.4 to v0.9.0); no "
    "bucket besides", 2e9, keeps_stage_output=True, dynamic_grads=True, zero0=Zero0Optimizer((2, 6, 12), bucket_bytes=0.0))

_DEEPSPEED_ZERO1_PIPE_FP16_RECIPE = replace(
    _DEEPSPEED_ZERO1_PIPE_RECIPE, bucket_bytes=1e9, zero0=Zero0Optimizer((2, 10, 12), sharded=False),
    source="In fp16 the ZeRO-1 optimizer as in bf16 (" + _DEEPSPEED_ZERO1_PIPE_RECIPE.name + "), with a 1 GB reduce "
    "bucket (no cast). At ZeRO-0 fp16 runs DeepSpeed's FP16_Optimizer (runtime/fp16/fused_optimizer.py @8eef742), "
    "nothing sharded: fp16 params 2 + fp16 grads 2 + at step() each grad's fp32 copy 4 (p.grad.to(fp32), freed "
    "after the flatten, blocks kept reserved) + their flattened fp32 gradient 4 + fp32 master 4 + Adam 8 = 24")

DEEPSPEED_BF16_BRANCH_RECIPE = MemoryRecipe(
    "DeepSpeed bf16 branch before its ZeRO-1 sharding (olruwase/bf16-updates, 2022-02-18 to 02-23)", 4, 6, 12, 2,
    "module",
    "bf16 at ZeRO-0 under the pipeline engine on the branch that became PR #1801, at 6eb4f1fa9 'Got bf16 working' "
    "(2022-02-21); its sharding came in 6f5ebc37a / 819abe2a7 ('bf16+zero_stage_1 first cut', 'finish zero_stage 1 "
    "sharding', 2022-02-24). Nothing sharded: bf16 params 2 + the optimizer's flat bf16 copy 2 (bf16_groups_flat, "
    "flattened and not re-pointed at that commit) + bf16 grads 2 (kept by update_hp_grads(clear_lp_grads=False) "
    "until the next backward) + per-parameter fp32 grads 4 (hp.grad, made every step, freed by clear_hp_grads) + "
    "per-parameter fp32 master 4 + Adam 8 (bf16_optimizer.py at 6eb4f1fa9). The pipe engine's _bf16_reduce_grads "
    "all-reduces the fp32 grads through buffered_allreduce_fallback: one 5e8-element bucket flattened in fp32 and "
    "cast to the bf16 communication dtype (engine.py allreduce_bucket, communication_data_type), 6 B x 5e8",
    3e9, keeps_stage_output=True, dynamic_grads=True)
"""Not a framework's recipe today: a published run of that branch (BigScience's ZeRO_STAGE=0 row of 2022-02-21,
'currently can't test ZeRO_STAGE=0 on master') is predicted with it (planner/validation.py
DEEPSPEED_BF16_SHARDED_FROM)."""

MEGATRON_DEEPSPEED_AMPERE_KERNEL_EFFICIENCY = 0.8
_MEGATRON_DEEPSPEED_AMPERE = (
    "fitted: MT-NLG 126 vs Megatron-LM 159 TFLOP/s per GPU at one layout on the same A100s (Megatron-DeepSpeed "
    "of 2021-22: MT-NLG 530B at tp 8 x pp 35 x dp 8 on Selene, Smith et al. 2022 Table 2; Megatron-LM's PTD-P, "
    "Narayanan et al. 2021 Table 2; the longer pipeline at 1,920 vs 2,240 sequences explains ~2% of it); BigScience's "
    "Jean Zay runs show the same gap. Fitted leave-one-source-out with the global efficiency (docs/validation.md) "
    "[U: the mechanism (pipe engine, optimizer, kernels) is not isolated; no Megatron-DeepSpeed run on another GPU "
    "generation is in the data, so none is stated there]")

COMPILED_ELEMENTWISE_SHARE = Sourced(5 / 12, (
    "a compiled step (XLA under JAX trainers; torch.compile/inductor) fuses each chain of elementwise ops (norms, "
    "activation functions, RoPE, residual adds) into fewer kernels that read their inputs and write their outputs "
    "once, where eager PyTorch runs each op as its own kernel: it moves 5/12 of the eager elementwise bytes (Knobs."
    "compiled_elementwise_share: 5 B per byte kept where the eager fit moves 12). Sized on torchtitan's published "
    "eager/compiled pairs (docs/performance.md at eaea6f6a, Llama 3.1 8B on Grand Teton's H100, 2.4 TB/s HBM2e, "
    "Tables 1 and 3: FSDP 5762 -> 6667 and 5605 -> 6514 tokens/s per GPU with torch.compile, step ratios 0.864 and "
    "0.860; the model gives 0.861 and 0.862 at 5/12; 1/4 while that part was given the SXM H100's 3.35 TB/s; "
    "tests/outside_torchtitan_probe.py), rows outside ../shared/validation; checked on MaxText's (tests/"
    "outside_recipes_probe.py) [U: the whole compile speed-up is put on elementwise traffic; launch gaps and the "
    "fused loss are in it too]"))
"""The elementwise traffic a compiled step keeps of the eager one (cost_models/stage.py elementwise_forward_seconds).
No published row in ../shared/validation states a compiled step, so the fit of elementwise_traffic_factor there is
the eager one, and this share is sized outside it."""

_EAGER = ("compile off, torchtitan's default (compile.enable = false; the export writes none), so the model's "
          "elementwise ops run eager; `check` of a config with compile.enable predicts it compiled "
          "(integrations/readers.py _torchtitan_compile; COMPILED_ELEMENTWISE_SHARE)")
_OP_SAC = ("torchtitan's SelectiveAC (per-op, the Trainer's default; activation_checkpoint.py _get_custom_policy): "
           "must-save the outputs of mm / SDPA / reduce_scatter, recompute every 2nd mm of each block and everything "
           "else, SP all-gathers included (frameworks.md §1.5); MoE and MLA blocks keep the core-attention policy [U]")
_TORCHAO_FP8 = ("torchao's Float8Linear: matmul_with_hp_or_float8_args.forward saves (input_hp, weight_hp_t) and "
                "casts both again in backward (pytorch/ao torchao/float8/float8_linear.py; its late-2024 tensorwise "
                "path saved the FP8 input); under per-op SAC the saved tensors are the _scaled_mm outputs, in BF16. "
                "torchtitan's published Llama 3.1 8B runs print the same memory with and without Float8 (docs/"
                "performance.md Tables 1 and 3, torch.compile without / with Float8: 77.0 / 76.8 GiB, 62.0 / 61.8 GiB)")
_TORCH_LOSS = ("torchtitan's loss is torch's cross_entropy on the fp32-cast logits (components/loss.py "
               "cross_entropy_loss: pred.flatten(0, 1).float()): 12 B per logit at its backward "
               "(cost_models/memory.py TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT) where Megatron keeps 4")
_TORCH_LOSS_PARALLEL = ("with TP torchtitan runs that loss on the vocabulary-sharded logits inside torch's "
                        "loss_parallel() (its default: parallelism.disable_loss_parallel = false), whose backward holds "
                        "16 B per local logit (cost_models/memory.py TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT)")
_CONTEXT = ("memory outside torch's pool, taken as the CUDA context measured on V100: ~1.3 GB (BigScience tr8-104B: "
            "'nvidia-smi ... incl. ~1.27 GB CUDA kernels', published_runs.json); NCCL's communicators, built at each "
            "group's first collective, are not in that measurement and are counted apart (nccl_groups) [U: the "
            "context's size under CUDA's lazy module loading]")
_CONTEXT_V100_2022 = Sourced(1271 * MIB, "BigScience, tr8-104B on V100: 'also need to take into account the cuda "
                             "kernels (1271MiB)' in nvidia-smi (tr11-176B-ml/chronicles-prequel.md); NCCL's "
                             "communicators are not in it and are counted apart (nccl_groups)")
_CONTEXT_A100_2022 = Sourced(1573 * MIB, "BigScience on Jean Zay's A100s: '40GB A100 takes 1573MiB for cuda kernels "
                             "(probably about the same for 80GB? may be a bit larger)', nvidia-smi after "
                             "torch.ones(1).cuda() (tr11-176B-ml/chronicles-prequel.md, 2022: the software of its "
                             "runs) [U: measured on the 40 GB card]; NCCL's communicators are not in it and "
                             "are counted apart (nccl_groups)")
NCCL_BYTES_SOURCE = ("NVIDIA/nccl #964: 544 MB per 2-rank group, 688 MB per larger group, 4 x A100 NVLink, measured "
                     "(cost_models/nccl.py) [U: one NCCL version on one node; more channels on Hopper, more bytes]")
_NCCL_TORCH_DEFAULT = ("the default group: torch.distributed.barrier() at start-up builds its communicator; "
                       "torch's send/recv builds one 2-rank communicator per pair of ranks (ProcessGroupNCCL)")
_NCCL_MEGATRON_DEEPSPEED = NcclGroups(
    (Group.WORLD, Group.TP, Group.DP, Group.MODEL, Group.PIPE, Group.P2P, Group.TIED),
    "DeepSpeed's pipe engine of 2021-22 with Megatron's TP layers: activations and gradients go to the neighbouring "
    "stages by dist.send/recv (pipe/p2p.py, torch >= 1.8); the last stage broadcasts the loss over the PP group "
    "(engine.py _aggregate_total_loss); the first and last stage all-reduce the tied embedding's gradient "
    "(PipelineModule.allreduce_tied_weight_gradients); the ZeRO optimizer reduces over DP and all-reduces its "
    "overflow flag and gradient norm over the model-parallel (TP x PP) group (stage_1_and_2.py "
    "_model_parallel_all_reduce); " + _NCCL_TORCH_DEFAULT)
_NCCL_MEGATRON = NcclGroups(
    DEFAULT_GROUPS,
    "Megatron-LM / Megatron-Core: TP, DP x CP (gradient reduce, distributed-optimizer gathers), CP and EP groups; "
    "send/recv to the neighbouring stages (p2p_communication.py); the embedding group (first and last stage, tied "
    "embeddings); the gradient-norm all-reduce over the model-parallel group (get_grad_norm_fp32); "
    + _NCCL_TORCH_DEFAULT + " [U: batched send/recv may share one communicator]")
_NCCL_TORCHTITAN = NcclGroups(
    (Group.WORLD, Group.TP, Group.DP, Group.CP, Group.EP, Group.P2P),
    "torchtitan: the device mesh's TP, FSDP (DP x CP), CP and EP groups; torch.distributed.pipelining's send/recv "
    "to the neighbouring stages; " + _NCCL_TORCH_DEFAULT + " [U: which default-group collectives run]")
_NCCL_DEEPSPEED = NcclGroups(
    (Group.WORLD, Group.TP, Group.DP),
    "DeepSpeed's engine: gradient reduce and ZeRO gathers over its DP group, the model's TP group where it brings "
    "one (mpu); " + _NCCL_TORCH_DEFAULT + " [U: without an mpu the DP group may be the default group's]")
_DTENSOR_SP = ("torchtitan's TP plan (parallelize_llama: SequenceParallel norms, PrepareModuleInput Shard(1) -> "
               "Replicate, ColwiseParallel wq/wk/wv and w1/w3) all-gathers in forward, and autograd saves the "
               "gathered input for the weight gradient; counted on the CPU benchmark, which runs the same DTensor "
               "plan (tests/test_bench.py)")
PIPELINING_RECEIVE_BUFFERS = (
    "torch.distributed.pipelining's PipelineStage allocates a receive buffer per micro-batch at the first step and "
    "keeps it (stage.py _setup_forward_recv_info, _setup_backward_recv_info, torch 2.13; torchtitan builds its "
    "stages as PipelineStage); counted on the CPU benchmark, which runs the same stages (tests/test_bench.py)")
DEEPSPEED_MICS = ("DeepSpeed's hybrid sharding is MiCS (zero_optimization.mics_shard_size, ZeRO-3): the parameters "
                  "and states shard over groups of mics_shard_size ranks, and the replicas all-reduce the gradient "
                  "shards once a step, at the accumulation boundary (runtime/zero/mics.py allreduce_mics_shard_grads; "
                  "no CPU offload with it). DeepSpeed 0.19.8 removed MiCS: its config parser refuses the key "
                  "(runtime/config.py _REMOVED_ZERO_CONFIG_KEYS), so only `check` of an older config meets it")
_NO_EXPANDABLE = ("reserved/allocated without expandable segments: single-GPU H200 runs of real recipes (issue 10: "
                  "reserved 3-12% above the planner's peak, allocated 15-20% below) and torchtune #1185 (reserved "
                  "16.39 GiB vs 10.83 GiB with expandable segments) [U: no Megatron measurement]")
_EXPANDABLE = ("torchtitan's run_train.sh sets PYTORCH_ALLOC_CONF=expandable_segments:True (frameworks.md §1.6); "
               "PyTorch PR #113481: expandable segments remove most fragmentation [U: no torchtitan ratio published]")

_FUSED_SWIGLU = ("Megatron-Core's bias_swiglu_impl (fusions/fused_bias_swiglu.py: save_for_backward(input), FC1's "
                 "output) when bias_activation_fusion is set: Megatron-LM sets it from --bias-swiglu-fusion, on unless "
                 "--no-bias-swiglu-fusion (arguments.py, core_transformer_config_from_args)")
_FUSED_SWIGLU_NEMO = ("NeMo 2's LlamaConfig 'Fusions': bias_activation_fusion=True (nemo/collections/llm/gpt/model/"
                      "llama.py), as NeMo 1's llama3_1_8b.yaml (activation fast-swiglu, bias_activation_fusion: true) "
                      "and Megatron-Bridge's Llama providers; Megatron-Core's bias_swiglu_impl saves FC1's output only")

_P2P_NEEDS_VPP = Sourced(0.0, "without virtual stages Megatron forces overlap_p2p_comm off: 'Overlap P2P communication is "
                               "disabled if not using the interleaved schedule' (megatron/training/arguments.py "
                               "validate_args; frameworks.md §2.3)")
# 0.9 of the gradient reduce hidden; the reduce is a bucket all-reduce (_DEEPSPEED_GRAD_ALL_REDUCE), twice the bytes
# of the exposed all-gather after the step, so two thirds of the ZeRO-1 traffic
DEEPSPEED_OVERLAP_COMM_SHARE = 0.9 * 2 / 3
_DEEPSPEED_COMM_DTYPE = ("DeepSpeed reduces gradients in the engine's communication_data_type: the config's, else "
                         "fp16 or bf16 as the model trains (runtime/engine.py communication_data_type; ZeRO-3's "
                         "get_param_comm_dtype)")
# Megatron-DeepSpeed's profile states no ZeRO-3 bucket, so it reduces per module [U]: its ZeRO-3 is the DeepSpeed of
# 2021-2022, whose bucketing this model does not follow release by release
_DEEPSPEED_ZERO3_REDUCE_BUCKET = Sourced(
    REDUCE_BUCKET_ELEMENTS, "ZeRO-3 reduces gradients in buckets of reduce_bucket_size elements (default 5e8, "
    "runtime/zero/config.py), one coalesced reduce-scatter per bucket (stage3.py __reduce_and_partition_ipg_grads -> "
    "reduce_scatter_coalesced, DeepSpeed 0.19.8; data_parallel.zero3_reduce_buckets)")
_DEEPSPEED_GRAD_ALL_REDUCE = ((1, 2), "reduce_scatter and use_multi_rank_bucket_allreduce on, DeepSpeed's defaults; "
                              "average_tensor -> allreduce_and_scatter -> allreduce_and_copy_with_multiple_ranks -> "
                              "allreduce_bucket all-reduces each bucket whole and every rank keeps its partition "
                              "(runtime/zero/stage_1_and_2.py, DeepSpeed 0.19.8)")
_MEGATRON_DEEPSPEED_GRAD_ALL_REDUCE = ((1,), "contiguous_gradients off at ZeRO-1, as the engine sets it; reduce_ipg_grads "
                                       "takes buffered_reduce_fallback -> allreduce_bucket, an all-reduce "
                                       "(engine.py _configure_zero_optimizer, 6ae756c03 to af033831f; stage_1_and_2.py "
                                       "@8eef742)")
_MEGATRON_DEEPSPEED_GRAD_SLICE_REDUCE = ((2,), "its ZeRO-2 reduced each rank's slice of a gradient bucket to it with a "
                                         "dist.reduce of its own, issued in turn on the DP group (average_tensor, "
                                         "stage_1_and_2.py @8eef742; DeepSpeed had no multi-rank bucket all-reduce "
                                         "then)")
_MEGATRON_DEEPSPEED_COMM_DTYPE = (
    "Megatron-DeepSpeed's DeepSpeed reduces bf16 gradients in 16 bits: at ZeRO-1 allreduce_bucket casts each bucket "
    "to its communication_data_type, torch.float16 at BigScience's branch (stage_1_and_2.py @8eef742); at ZeRO-0 the "
    "pipe engine all-reduces BF16_Optimizer's fp32 gradient buffer cast to bf16 (_bf16_reduce_grads -> "
    "allreduce_bucket, v0.6.4 to v0.9.0) [U: MT-NLG's 2021 runs do not print their reduce dtype]")

_OVERLAP_COMM = ("zero_optimization.overlap_comm: true, which the DeepSpeed export writes (DeepSpeed's default is "
                 "true only at ZeRO-3: runtime/zero/config.py overlap_comm_valid, 0.19.8): ZeRO-1/2 reduce gradient "
                 "buckets on a side stream during backward (stage_1_and_2.py create_gradient_handling_hooks; "
                 "reduce_gradients skips its post-backward pass); the all-gather of the updated partitions after the "
                 "step stays exposed: 0.9 of the reduce, a bucket all-reduce of twice the all-gather's bytes, so two "
                 "thirds of the ZeRO-1 traffic, hidden [U: share]. A config without it is checked with none hidden")

PROFILES: dict[Framework, Profile] = {
    Framework.MEGATRON: Profile(
        Framework.MEGATRON, "Megatron-LM / Megatron-Core", _MEGATRON_RECIPE,
        "core attention only (--recompute-granularity selective, --recompute-modules core_attn) (frameworks.md §2.4); "
        "on an MLA model the up-projections (--recompute-modules mla_up_proj, Megatron MoE README)",
        Overlap(
            Sourced(0.9, "--overlap-grad-reduce --overlap-param-gather, bucketed, hidden behind backward except the "
                         "last bucket (frameworks.md §2.6; Megatron-Core performance recipes set both)"),
            Sourced(0.9, "Megatron-FSDP optim_grads_params prefetches like FSDP (frameworks.md §2.5) [U]"),
            Sourced(0.5, "--tp-comm-overlap with --sequence-parallel (TE userbuffers) hides part of the TP traffic "
                         "(frameworks.md §2.6) [U: share]"),
            Sourced(0.9, "--overlap-p2p-communication, on by default with VPP (frameworks.md §2.3)"),
            pp_needs_virtual=_P2P_NEEDS_VPP,
        ),
        Allocator(Sourced(0.12, _NO_EXPANDABLE), Sourced(1.3 * 1e9, _CONTEXT), nccl=_NCCL_MEGATRON),
        "allocated and reserved, MB = 2^20 B (report_memory, frameworks.md §2.5)", memory_fp16=_MEGATRON_FP16_RECIPE,
        expert_kernel_gflop=_GROUPED_LINEAR, fused_swiglu=_FUSED_SWIGLU,
        attention_kernel=_TE_FUSED_ATTENTION, master_remainders=_MASTER_REMAINDERS),
    Framework.NEMO: Profile(
        Framework.NEMO, "NeMo 2 / Megatron-Bridge (Megatron-Core)", _MEGATRON_RECIPE,
        "core attention only (Megatron-Core fields, frameworks.md §4.4); on an MLA model the up-projections "
        "(recompute_modules=['mla_up_proj'], Megatron-Bridge's DeepSeek-V3 recipes)",
        Overlap(
            Sourced(0.9, "Bridge's _pretrain_common: overlap_grad_reduce=True, overlap_param_gather=True, 128 Mi-param "
                         "buckets (frameworks.md §4.4)"),
            Sourced(0.9, "Megatron-FSDP optim_grads_params prefetch [U]"),
            Sourced(0.5, "tp_comm_overlap=True in the performance recipes (MegatronCommOverlapCallback, "
                         "frameworks.md §4.4) [U: share]"),
            Sourced(0.9, "VPP > 1 sets overlap_p2p_comm=True (comm_overlap.py L454-463, frameworks.md §4.4)"),
            pp_needs_virtual=_P2P_NEEDS_VPP,
        ),
        Allocator(Sourced(0.12, _NO_EXPANDABLE), Sourced(1.3 * 1e9, _CONTEXT), nccl=_NCCL_MEGATRON),
        "allocated and reserved, MB (Megatron-Core report_memory)", memory_fp16=_MEGATRON_FP16_RECIPE,
        expert_kernel_gflop=_GROUPED_LINEAR, fused_swiglu=_FUSED_SWIGLU_NEMO,
        attention_kernel=_TE_FUSED_ATTENTION, master_remainders=_MASTER_REMAINDERS),
    Framework.TORCHTITAN: Profile(
        Framework.TORCHTITAN, "torchtitan (FSDP2, torch.distributed.pipelining)", _FSDP2_RECIPE,
        "per-op SAC: saves matmul/attention/reduce-scatter outputs, recomputes every 2nd matmul and all elementwise "
        "ops; NOT Megatron's selective (frameworks.md §1.5)",
        Overlap(
            Sourced(0.8, "DDP (dp_replicate) bucketed all-reduce overlaps backward (bucket_cap_mb=100, "
                         "frameworks.md §1.2) [U: share]"),
            Sourced(0.8, "FSDP2 implicit prefetch: all-gathers and reduce-scatters overlap compute, "
                         "backward_prefetch=BACKWARD_PRE (frameworks.md §1.7) [U: share]"),
            Sourced(0.0, "async TP only with compile.enable_async_tensor_parallel (off by default, frameworks.md §1.7)"),
            Sourced(0.5, "torch.distributed.pipelining sends asynchronously, no explicit overlap flag [U]"),
        ),
        Allocator(Sourced(0.04, _EXPANDABLE), Sourced(1.3 * 1e9, _CONTEXT), nccl=_NCCL_TORCHTITAN),
        "max_reserved GiB (DeviceMemoryMonitor, frameworks.md §1.6)",
        {},
        sp_gathered_inputs=_DTENSOR_SP, selective_op_sac=_OP_SAC, pp_receive_buffers=PIPELINING_RECEIVE_BUFFERS,
        fp8_torchao_linear=_TORCHAO_FP8, loss_bytes_per_logit=Sourced(TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT, _TORCH_LOSS),
        loss_parallel_bytes_per_logit=Sourced(TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT, _TORCH_LOSS_PARALLEL),
        attention_kernel=_TORCHTITAN_CUDNN_ATTENTION, eager_elementwise=_EAGER),
    Framework.DEEPSPEED: Profile(
        Framework.DEEPSPEED, "DeepSpeed", _DEEPSPEED_RECIPE,
        "model-defined: DeepSpeed checkpoints what the model code wraps (frameworks.md §3.4)",
        Overlap(
            Sourced(DEEPSPEED_OVERLAP_COMM_SHARE, _OVERLAP_COMM),
            Sourced(0.8, "ZeRO-3 overlap_comm=True and parameter prefetch (stage3_prefetch_bucket_size, "
                         "frameworks.md §3.6) [U: share]"),
            Sourced(0.0, "no TP overlap (frameworks.md §3.6)"),
            Sourced(0.0, "the pipeline engine schedules its own blocking send/recv (pipe/engine.py, §3.6) [U]"),
            ddp=Sourced(0.0, "ZeRO-0: the engine all-reduces the gradients after backward (engine.py "
                             "allreduce_gradients -> buffered_allreduce_fallback); overlap_comm does not apply"),
        ),
        Allocator(Sourced(0.12, _NO_EXPANDABLE), Sourced(1.3 * 1e9, _CONTEXT), nccl=_NCCL_DEEPSPEED),
        "torch.cuda.max_memory_allocated via see_memory_usage, or nvidia-smi [U]",
        hsdp_replica_reduce_once=DEEPSPEED_MICS, grad_reduce_16bit=_DEEPSPEED_COMM_DTYPE,
        zero3_reduce_bucket=_DEEPSPEED_ZERO3_REDUCE_BUCKET, grad_all_reduce=_DEEPSPEED_GRAD_ALL_REDUCE,
        memory_fp16=_DEEPSPEED_FP16_RECIPE),
    Framework.MEGATRON_DEEPSPEED: Profile(
        Framework.MEGATRON_DEEPSPEED, "Megatron-DeepSpeed (2021-2022)", _DEEPSPEED_ZERO1_PIPE_RECIPE,
        "core attention only (--recompute-granularity selective) or full layers (--checkpoint-activations) "
        "(frameworks.md §3.4)",
        Overlap(
            Sourced(0.0, "the pipeline engine all-reduces gradients after the pipeline flush, not during backward "
                         "(pipe/engine.py L78-79, frameworks.md §3.6); Korthikanti §6.3: no gradient overlap"),
            Sourced(0.8, "ZeRO-3 overlap_comm=True (DeepSpeed default for stage 3) [U: share]"),
            Sourced(0.0, "async TP all-reduce turned off under --deepspeed (megatron/arguments.py L390-400)"),
            Sourced(0.0, "blocking pipeline send/recv (DeepSpeed pipe engine) [U]"),
        ),
        Allocator(Sourced(0.12, _NO_EXPANDABLE), _CONTEXT_V100_2022, {"ampere": _CONTEXT_A100_2022},
                  _NCCL_MEGATRON_DEEPSPEED),
        "max GPU memory in GB as logged (nvidia-smi style: includes the CUDA context)",
        {"ampere": Sourced(MEGATRON_DEEPSPEED_AMPERE_KERNEL_EFFICIENCY, _MEGATRON_DEEPSPEED_AMPERE)},
        memory_fp16=_DEEPSPEED_ZERO1_PIPE_FP16_RECIPE, hsdp_replica_reduce_once=DEEPSPEED_MICS,
        grad_all_reduce=_MEGATRON_DEEPSPEED_GRAD_ALL_REDUCE, grad_slice_reduce=_MEGATRON_DEEPSPEED_GRAD_SLICE_REDUCE,
        grad_reduce_16bit=_MEGATRON_DEEPSPEED_COMM_DTYPE),
    Framework.GENERIC: Profile(
        Framework.GENERIC, "generic (no framework named)", _MEGATRON_RECIPE,
        "core attention only (Megatron's definition, Korthikanti et al. 2022 §5)",
        Overlap(
            Sourced(0.5, "half: the frameworks' defaults range from none (Megatron-LM CLI and DeepSpeed ZeRO-1/2 "
                         "defaults, frameworks.md §2.6, §3.5) to 0.9 (Megatron-Core/NeMo with --overlap-grad-reduce) "
                         "[U: name --framework for its own value]"),
            Sourced(0.5, "half, as the DP traffic above: FSDP / ZeRO-3 prefetch hides most (0.8 in the torchtitan "
                         "and DeepSpeed profiles) but nothing is known of the stack [U]"),
            Sourced(0.0, "TP all-reduces on the critical path (no tp-comm-overlap)"),
            Sourced(0.5, "steady-state send/recv half hidden [U]"),
        ),
        Allocator(Sourced(0.12, _NO_EXPANDABLE), Sourced(1.3 * 1e9, _CONTEXT), nccl=_NCCL_MEGATRON),
        "predicted reserved", memory_fp16=_MEGATRON_FP16_RECIPE),
}


def profile_for(framework: Framework | str | None) -> Profile:
    """The profile of a framework name (None: generic). Raises ValueError on an unknown name."""
    if framework is None:
        return PROFILES[Framework.GENERIC]
    try:
        return PROFILES[Framework(framework)]
    except ValueError:
        from cluster_specs import SpecError

        allowed = ", ".join(f.value for f in Framework)
        raise SpecError(f"framework: {framework!r} -> must be one of {allowed}") from None


def profile_knobs(framework: Framework | str | None, base: Knobs | None = None, *,
                  gpu_generation: str | None = None, precision: str = "bf16") -> Knobs:
    return profile_for(framework).knobs(base, gpu_generation=gpu_generation, precision=precision)


@dataclass(frozen=True, slots=True)
class Assumption:
    """A profile value, what it claims, its source, and how much the prediction moves without it."""

    knob: str
    statement: str
    source: str
    step_seconds_if_wrong: float  # the step time if this assumption does not hold (its opposite value)
    effect: float  # |step_seconds_if_wrong / step_seconds - 1|


# what each knob is set to when the assumption does not hold: overlap -> none hidden; a ZeRO-3 reduce bucket -> none
# (a reduce-scatter per module, as the Hugging Face Trainer's "auto" h^2 bucket gives); ZeRO-1/2 all-reduces or slice
# reduces -> reduce-scatters; the fused attention kernel ->
# not stated (the core at its full-s^2 FLOPs and the GEMM rate, ~0.35-0.40 of peak on the causal FLOPs on H100)
_OPPOSITE = {"dp_overlap_fraction": 0.0, "zero3_overlap_fraction": 0.0, "tp_overlap_fraction": 0.0,
             "pp_overlap_fraction": 0.0, "attention_kernel_efficiency": 0.0, "zero3_max_reuse_distance": 0.0,
             "zero3_reduce_bucket_elements": 0.0, "grad_all_reduce_zero_stages": (), "grad_slice_reduce_zero_stages": (),
             "compiled_elementwise_share": COMPILED_ELEMENTWISE_SHARE.value}


def ranked_assumptions(estimate_with, knobs: Knobs, framework: Framework | str | None, step_seconds: float,
                       limit: int = 3, gpu_generation: str | None = None) -> list[Assumption]:
    """The profile's time assumptions that move this prediction most, largest first (those that move it < 0.5%
    are left out). `estimate_with(knobs)` re-estimates the same layout with other knobs and returns step seconds.
    An overlap assumption is tested by hiding nothing of that traffic; the framework's kernel factor on this GPU
    generation by dropping it (the end-to-end efficiency of every other framework)."""
    profile = profile_for(framework)
    out = []
    for knob, statement, source in profile.assumptions():
        changed: dict[str, Any]
        if knob == f"kernel_efficiency[{gpu_generation}]":
            changed = {"end_to_end_efficiency": knobs.end_to_end_efficiency
                       / profile.kernel_efficiency[gpu_generation or ""].value}
        elif knob in _OPPOSITE and getattr(knobs, knob) != _OPPOSITE[knob]:
            changed = {knob: _OPPOSITE[knob]}
        else:
            continue
        other = estimate_with(replace(knobs, **changed))
        effect = abs(other / step_seconds - 1)
        if effect >= 0.005:
            out.append(Assumption(knob, f"{statement} ({_flag_of(source)})", source, other, effect))
    return sorted(out, key=lambda a: -a.effect)[:limit]


FLAG_CHARS = 90
"""The longest short reason `_flag_of` gives (an assumption line must fit a terminal line or two)."""


def _flag_of(source: str) -> str:
    """The short reason of a source: the text before its first parenthesis or semicolon, cut at a word boundary to
    at most FLAG_CHARS characters, an ellipsis marking the cut (never a word cut in two)."""
    cut = min((i for i in (source.find(" ("), source.find(";")) if i > 0), default=len(source))
    text = source[:cut]
    if len(text) <= FLAG_CHARS:
        return text
    head = text[:FLAG_CHARS]
    space = head.rfind(" ")
    return (head[:space] if space > 0 else head[:FLAG_CHARS - 1]).rstrip(" ,;:-") + "…"
