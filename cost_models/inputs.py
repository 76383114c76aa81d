"""Plain, immutable inputs of the cost models (standard library only, SI units in every name).

The planner's pydantic specs convert themselves into these once (`to_cost_model()`), so the cost
functions stay pure, cheap to call, and importable without pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from cost_models.nccl import DEFAULT_GROUPS


class Schedule(StrEnum):
    """Pipeline schedules (cost-models.md §5)."""

    NAIVE = "naive"  # no micro-batching: the whole local batch at once
    GPIPE = "gpipe"  # all forwards, then all backwards (Huang et al. 2019)
    ONE_F_ONE_B = "1f1b"  # PipeDream-Flush (Narayanan et al. 2021 §2.2.1)
    INTERLEAVED_1F1B = "interleaved_1f1b"  # virtual stages (Narayanan et al. 2021 §2.2.2)
    ZERO_BUBBLE = "zero_bubble"  # ZB-H1 (Qi et al. 2023)
    PIPEDREAM_ASYNC = "pipedream_async"  # asynchronous 1F1B, stale weights (Harlap et al. 2018)


class Recompute(StrEnum):
    """Activation recomputation policies (Korthikanti et al. 2022 §5)."""

    NONE = "none"
    SELECTIVE = "selective"  # the attention core only
    FULL = "full"  # the whole layer; only its input is kept


class Offload(StrEnum):
    """What lives on the host (ZeRO-Offload / ZeRO-Infinity)."""

    NONE = "none"
    OPTIMIZER = "optimizer"  # optimizer state and gradients; CPU Adam
    OPTIMIZER_PARAMS = "optimizer+params"  # and the partitioned parameters (ZeRO-3 only)


class Precision(StrEnum):
    """Training precision of weights and activations."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8 = "fp8"  # FP8 GEMMs in the Linear layers; weights, activations and everything else in bf16 (fp8.py)

    @property
    def bytes(self) -> int:
        return 4 if self is Precision.FP32 else 2


class Zero3Gather(StrEnum):
    """The unit ZeRO-3 gathers at a time."""

    LAYER = "layer"  # FSDP wraps a whole transformer block (+1 prefetched)
    MODULE = "module"  # DeepSpeed fetches one Linear at a time
    # DeepSpeed's ZeRO-3 of 2021 (v0.3.13-v0.5.x): one all-gather per parameter tensor (partition_parameters.py
    # _allgather_param; those under stage3_param_persistence_threshold stay resident) and one reduce-scatter per
    # tensor (_reduce_scatter_gradients), before coalesced gathers (v0.6.0, 2022-03): step.zero3_units_per_layer
    PARAMETER = "parameter"


class GradReduce(StrEnum):
    """How ZeRO-1/2 reduce the gradients (Knobs.grad_reduce, data_parallel.zero_comm_seconds)."""

    REDUCE_SCATTER = "reduce_scatter"  # the ZeRO paper's: each rank receives its partition, reduced
    # an all-reduce of each whole bucket, every rank then keeping its partition (DeepSpeed's DeepSpeedZeroOptimizer):
    # twice the bytes
    ALL_REDUCE = "all_reduce"
    # each rank's slice reduced to it by a dist.reduce of its own, one after another (DeepSpeed with
    # use_multi_rank_bucket_allreduce off; Megatron-DeepSpeed's ZeRO-2): a reduce-scatter's bytes, dp times its latency
    SLICE_REDUCES = "slice_reduces"


ZERO3_MAX_REUSE_DISTANCE_ELEMENTS = 1e9
"""DeepSpeed's stage3_max_reuse_distance default: 'Do not release a parameter if it will be reused within this
threshold of parameters' (DeepSpeed config docs; runtime/zero/config.py; 1e9 in v0.3.13's stage3.py as well)."""


REDUCE_BUCKET_ELEMENTS = 5e8
"""DeepSpeed's reduce_bucket_size default, 'Number of elements reduced/allreduced at a time' (DeepSpeed config docs;
runtime/zero/config.py reduce_bucket_size = 5e8, 0.19.8), at every ZeRO stage; the Hugging Face Trainer's "auto" fills
it with hidden_size^2 at every stage (transformers integrations/deepspeed.py trainer_config_finalize)."""


@dataclass(frozen=True, slots=True)
class Link:
    """A point-to-point path: achievable bandwidth per direction and per-message latency."""

    bandwidth_bytes_per_second: float
    latency_seconds: float


@dataclass(frozen=True, slots=True)
class Hardware:
    """One GPU type and the topology around it (the cost-model view of a cluster spec)."""

    gpu_name: str
    gpu_memory_bytes: float
    peak_flops_per_second: float  # dense, for the training precision
    matmul_efficiency: float  # achievable fraction of peak for large GEMMs (MAMF / peak)
    hbm_bytes_per_second: float
    num_nodes: int
    gpus_per_node: int
    intra_node: Link | None  # achievable per-GPU bandwidth inside a node; None for 1 GPU per node
    intra_node_kind: str  # "nvlink" | "pcie" | "none"
    nic: Link | None  # one NIC, achievable; None for a single node
    nics_per_node: int
    host_to_device: Link
    host_memory_bytes_per_node: float

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class MoE:
    """Mixture-of-experts MLP (modern-training.md §3.1-3.2). Routed experts have the model's MLP kind."""

    num_experts: int  # routed experts E
    top_k: int  # experts per token k
    expert_ffn_hidden_size: int  # f_e
    shared_expert_ffn_hidden_size: int = 0  # total width of the always-active shared expert(s), n_s x f_e
    shared_expert_gate: bool = False  # Qwen2-MoE: an h x 1 gate on the shared expert
    router_bias: bool = False  # DeepSeek-V3: an E-sized e_score_correction_bias per MoE layer
    num_dense_layers: int = 0  # leading layers that keep the dense FFN (DeepSeek first_k_dense_replace)
    capacity_factor: float | None = None  # None: dropless (Megatron's default, DeepSeek-V3, MegaBlocks)
    expert_groups: int | None = None  # group-limited routing: experts in G groups (HF n_group; DeepSeek-V3 8)
    groups_per_token: int | None = None  # groups a token may use (HF topk_group; DeepSeek-V3 4 = "at most 4 nodes")


@dataclass(frozen=True, slots=True)
class MLA:
    """Multi-head latent attention, DeepSeek-V2/V3 (modern-training.md §4.1; HF field names)."""

    q_lora_rank: int | None  # None: a plain q_proj (V2-Lite)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True)
class Transformer:
    """A decoder-only transformer, GPT- or Llama-style, optionally with MoE, MLA or sliding-window layers."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    swiglu: bool
    tied_embeddings: bool
    rms_norm: bool
    flash_attention: bool
    learned_position_embeddings: bool
    max_position_embeddings: int
    bias: bool
    dropout: bool
    head_dim_size: int | None = None  # HF `head_dim` when a x d != h (Mistral-NeMo, Gemma-2, Qwen3)
    qkv_bias: bool = False  # bias on q, k, v only (Qwen2); `bias` means GPT-style biases everywhere
    o_bias: bool = False  # bias on the output projection (with qkv_bias: Llama's attention_bias)
    qk_norm: bool = False  # Qwen3: RMSNorm of size d on q and k in every layer
    norms_per_layer: int = 2  # Gemma-2: 4 (pre/post attention and FFN); Falcon-7B: 1 (parallel attention)
    norm_has_params: bool = True  # False for OLMo's non-parametric LayerNorm
    sliding_window: int | None = None  # tokens each query sees in a local-attention layer
    sliding_window_layers: int = 0  # how many layers use the window (Gemma-2: every other one)
    moe: MoE | None = None
    mla: MLA | None = None
    # Nemotron-4's relu(x)^2 in a non-gated MLP: the same GEMMs as GeLU's and, like it, two f-wide tensors kept per
    # token (relu's output, which pow saves too, and FC2's input: memory.mlp_intermediate_coefficient's 4); the cost
    # model costs it as GeLU, the benchmark's model runs it
    squared_relu: bool = False

    @property
    def head_dim(self) -> int:
        return self.head_dim_size or self.hidden_size // self.num_attention_heads

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.moe.num_dense_layers if self.moe else 0


@dataclass(frozen=True, slots=True)
class Zero0Optimizer:
    """An optimizer a framework runs at ZeRO-0 in place of the plain one (DeepSpeed's BF16_Optimizer, FP16_Optimizer):
    its (param, grad, optimizer) bytes per parameter; whether it shards the optimizer bytes over DP, and so all-gathers
    the updated parameters after its step (BF16_Optimizer), or keeps every byte unsharded (FP16_Optimizer); and its
    gradient-reduce buffers in bytes (None: Knobs.bucket_bytes)."""

    state_bytes: tuple[float, float, float]
    sharded: bool = True
    bucket_bytes: float | None = None

    def less_optimizer_bytes(self, saved: float) -> Zero0Optimizer:
        """The same optimizer with `saved` bytes per parameter off its optimizer bytes (lower-precision states)."""
        param, grad, optimizer = self.state_bytes
        return replace(self, state_bytes=(param, grad, optimizer - saved))


@dataclass(frozen=True, slots=True)
class Training:
    """What one optimizer step processes, and the bytes of each kind of state."""

    global_batch_size: int  # sequences
    seq_length: int
    activation_bytes: int  # 2 for bf16/fp16, 4 for fp32
    param_bytes: float  # working (compute) copy of a parameter
    grad_bytes: float  # gradient buffer element (4 with fp32 main grads, Megatron's default for bf16)
    optimizer_bytes: float  # per parameter: fp32 master copy (if any) + optimizer moments
    grad_reduce_bytes: int  # element size of the DP gradient reduction
    # bytes per parameter that lower-precision master weights and moments save against fp32 ones (already taken off
    # optimizer_bytes); the optimizer step reads and writes each state once, so it moves twice this much less
    optimizer_state_saved_bytes: float = 0.0
    fp8_recipe: str | None = None  # FP8 GEMMs (cost_models/fp8.py FP8_RECIPES); None: all GEMMs in bf16/fp16
    fp8_param_gather: bool = False  # FP8 primary weights / FP8 parameter all-gather (Megatron --fp8-param-gather)
    # the optimizer the framework runs at ZeRO-0 where it is another one (its optimizer bytes net of
    # optimizer_state_saved_bytes); None: ZeRO-0 keeps the bytes above, unsharded
    zero0_optimizer: Zero0Optimizer | None = None
    # the one it runs at ZeRO-0 when the model is a pipeline (pp > 1), where that is yet another (DeepSpeed's
    # BF16_Optimizer for a bf16 PipelineModule, engine.py _do_optimizer_sanity_check); None: zero0_optimizer
    zero0_pipeline_optimizer: Zero0Optimizer | None = None


@dataclass(frozen=True, slots=True)
class Layout:
    """How the training runs: the parallel degrees and the per-step choices."""

    dp: int
    tp: int
    pp: int
    zero_stage: int = 0
    offload: Offload = Offload.NONE
    micro_batch_size: int = 1
    num_micro_batches: int = 1
    recompute: Recompute = Recompute.NONE
    sequence_parallel: bool = False
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    layers_per_stage: tuple[int, ...] | None = None  # None: as even as possible
    recompute_layers_per_stage: tuple[int, ...] | None = None  # full-recompute layers per stage (ILP)
    cp: int = 1  # context parallel: each rank holds seq/cp tokens of every sequence (GPUs = dp·tp·pp·cp)
    cp_comm: str = "p2p"  # p2p (ring) | all_gather | a2a (Ulysses); Megatron --cp-comm-type
    ep: int = 1  # expert parallel: routed experts split over ep ranks, carved from dp·cp·tp (parallel folding)
    etp: int = 1  # expert tensor parallel (Megatron --expert-tensor-parallel-size); 1 for fine-grained MoE
    # hybrid sharding (HSDP): ZeRO shards the states over dp_shard of the dp ranks and the dp / dp_shard replicas
    # all-reduce the sharded gradients (torchtitan data_parallel_shard_degree x data_parallel_replicate_degree);
    # 0: over all dp ranks
    dp_shard: int = 0

    @property
    def zero_shard_ranks(self) -> int:
        """The ranks ZeRO shards the states over: the sharding group x CP (Megatron and torchtitan fold CP into it)."""
        return (self.dp_shard or self.dp) * self.cp

    @property
    def optimizer_shard_ranks(self) -> int:
        """The ranks the optimizer state (and what offload moves) is split over: ZeRO's group from stage 1, else 1."""
        return self.zero_shard_ranks if self.zero_stage >= 1 else 1

    @property
    def zero_replicas(self) -> int:
        """How many copies of the sharded states hybrid sharding keeps (1 without it)."""
        return self.dp // (self.dp_shard or self.dp)


@dataclass(frozen=True, slots=True)
class Knobs:
    """Modelling assumptions a user may override; every default is documented in docs/cost-model.md."""

    # Overlap knobs are the share of that traffic hidden behind compute; the hidden part is also capped by the
    # compute it can hide behind. Defaults are the generic profile (planner/frameworks/profiles.py).
    dp_overlap_fraction: float = 0.5  # DDP all-reduce / ZeRO-1,2 traffic hidden behind backward
    pp_overlap_fraction: float = 0.5  # share of steady-state PP send/recv hidden behind compute
    tp_overlap_fraction: float = 0.0  # TP all-reduces sit on the critical path (no tp-comm-overlap)
    zero3_overlap_fraction: float = 0.5  # ZeRO-3/FSDP per-layer gathers and reduce-scatters hidden (prefetch)
    ddp_overlap_fraction: float | None = None  # ZeRO-0 (DDP) all-reduce hidden; None: dp_overlap_fraction
    pp_overlap_needs_virtual: bool = False  # steady-state p2p overlap only with virtual stages (Megatron)
    per_process_overhead_bytes: float = 1.3e9  # CUDA context + workspaces, outside the caching allocator
    # process groups the framework's step runs collectives on (cost_models/nccl.py Group): each one's NCCL
    # communicator is device memory outside the allocator (the generic profile's groups; a profile states its own)
    nccl_groups: tuple[str, ...] = DEFAULT_GROUPS
    nccl_bytes_scale: float = 1.0  # x the measured bytes per communicator (0: no NCCL, CPU ranks on gloo)
    allocator_reserve_fraction: float = 0.12  # caching allocator: reserved above the live dynamic bytes
    # the framework's memory recipe for 16-bit training: (param, grad, optimizer) bytes per parameter as step.py
    # places them (param unsharded below ZeRO-3, grad below ZeRO-2, optimizer below ZeRO-1); None: the precision's
    state_bytes_per_param: tuple[float, float, float] | None = None
    # the framework's ZeRO-0 optimizers, without and with a pipeline (Training.zero0_optimizer, zero0_pipeline_optimizer,
    # which take their optimizer bytes less what lower-precision states save); None: the plain one
    zero0_optimizer: Zero0Optimizer | None = None
    zero0_pipeline_optimizer: Zero0Optimizer | None = None
    # what an fp32 master copy of a bf16 parameter costs once the optimizer's states are set below fp32: 4, or 2 where
    # the framework's precision-aware optimizer keeps only the 16 bits the bf16 parameter lacks (Profile.master_remainders)
    precision_aware_master_bytes: float = 4.0
    profile: str = "generic"  # the framework profile these knobs come from (planner/frameworks/profiles.py)
    memory_high_fraction: float = 0.0  # plan: a layout must fit with its peak raised by this (the error band's high end)
    matmul_half_efficiency_gflop: float = 2.0  # per-GEMM size at which efficiency is half its maximum
    # a GEMM's smallest dimension at which it reaches half its size-saturated rate (stage.gemm_side_factor) [fit:
    # docs/validation.md]; 0 turns the shape term off (CPU ranks: `planner calibrate` fits its own size curve)
    gemm_half_efficiency_dim: float = 192.0
    end_to_end_efficiency: float = 0.875  # launch gaps, data loading, imperfect kernels (fit: docs/validation.md)
    elementwise_traffic_factor: float = 12.0  # HBM bytes moved by non-GEMM kernels per saved activation byte [fit]
    # share of that (eager) traffic a compiled step still moves: XLA (JAX trainers) and torch.compile fuse the
    # elementwise chains (norms, activations, residual adds, RoPE) into few kernels that read and write each tensor
    # once (planner/frameworks/profiles.py COMPILED_ELEMENTWISE_SHARE); 1: eager PyTorch, each op its own kernel
    compiled_elementwise_share: float = 1.0
    zero3_gather: Zero3Gather = Zero3Gather.LAYER  # layer: FSDP, a whole block (+1 prefetched); module: DeepSpeed
    # DeepSpeed's stage3_max_reuse_distance (elements): a module recomputed further than this from its backward is
    # gathered again for it (data_parallel.zero3_regathered_modules); `check` reads it from a DeepSpeed config
    zero3_max_reuse_distance: float = ZERO3_MAX_REUSE_DISTANCE_ELEMENTS
    # DeepSpeed's reduce_bucket_size (elements) where its ZeRO-3 reduces gradients in buckets, one coalesced
    # reduce-scatter each (data_parallel.zero3_reduce_buckets; `check` reads it from a DeepSpeed config); None: one
    # reduce-scatter per gathered unit (FSDP's block, DeepSpeed 2021's tensors: step.zero3_units_per_layer)
    zero3_reduce_bucket_elements: float | None = None
    memory_headroom_bytes: float = 0.0  # memory kept free on top of the model (plan adds its own default)
    bucket_bytes: float = 0.0  # extra gradient-bucket bytes (DeepSpeed reduce_bucket_size x bytes)
    # DeepSpeed's ZeRO-1/2 gradient buffers (stage.reduce_buffer_bytes): reduce_bucket_size 16-bit elements
    # each, two with overlap_comm and contiguous_gradients on, else one; `check` reads all three from a DeepSpeed
    # config. None: bucket_bytes stands at ZeRO-1/2 as the framework's recipe states it
    reduce_bucket_elements: float | None = None
    reduce_bucket_buffers: int = 2
    # the pipeline engine keeps each in-flight micro-batch's stage output until its backward (DeepSpeed's pipe engine;
    # Megatron frees it after the send, deallocate_output_tensor): one more layer input per micro-batch in flight
    keeps_stage_output: bool = False
    # torch.distributed.pipelining (PipelineStage) allocates, at the first step, one activation receive buffer per
    # micro-batch on every stage but the first and one gradient receive buffer per micro-batch on every stage but the
    # last, and keeps them (stage.py _setup_forward_recv_info / _setup_backward_recv_info, torch 2.13); Megatron and
    # DeepSpeed allocate a receive tensor per transfer and free it with the micro-batch
    pp_receive_buffers: bool = False
    # gradients are per-parameter tensors autograd allocates every step and the optimizer frees (DeepSpeed ZeRO-1/2),
    # not one persistent buffer (Megatron's grad buffer, FSDP's sharded grads): the allocator's reserve applies to them
    dynamic_grads: bool = False
    # bf16 training's gradients are reduced in 16 bits (DeepSpeed's communication_data_type), not in the fp32 of
    # the gradient buffer, unless the training sets its reduce dtype (planner/problem.py Problem.cm_training)
    grad_reduce_16bit: bool = False
    # hybrid sharding: the replicas all-reduce the gradient shards once a step, at the accumulation boundary
    # (DeepSpeed's MiCS), not after every micro-batch under ZeRO-2/3 (torch FSDP2's HSDP)
    hsdp_replica_reduce_once: bool = False
    # ZeRO stages whose gradient reduce is GradReduce.ALL_REDUCE (DeepSpeed's DeepSpeedZeroOptimizer:
    # planner/frameworks/profiles.py), and those whose is GradReduce.SLICE_REDUCES; the rest reduce-scatter (grad_reduce)
    grad_all_reduce_zero_stages: tuple[int, ...] = ()
    grad_slice_reduce_zero_stages: tuple[int, ...] = ()
    tp_layer_overhead_seconds: float = 0.0  # per layer and micro-batch (fwd+bwd) under TP: framework dispatch
    # Megatron-LM's async tensor-parallel all-reduce (on by default since 2021-09, commit 3f65246911; off with
    # --no-async-tensor-model-parallel-allreduce and under Megatron-DeepSpeed's --deepspeed): in backward, each
    # column-parallel linear's input-gradient all-reduce runs while its weight-gradient GEMM computes
    tp_async_grad_allreduce: bool = False
    # of sharded operators (DTensor); 0 on GPUs, where launches overlap; `planner calibrate` measures it on CPU ranks
    moe_imbalance: float = 1.1  # max/mean tokens per EP rank (cost_models/moe.py DEFAULT_IMBALANCE, stated)
    ep_overlap_fraction: float = 0.0  # share of the EP all-to-all hidden (Megatron without a2a overlap: none)
    # sequence parallelism keeps the QKV and FC1 inputs all-gathered for the weight gradients (torch DTensor
    # SequenceParallel + PrepareModuleInput, torchtitan), not sharded and re-gathered in backward (Megatron)
    sp_saves_gathered_inputs: bool = False
    # GFLOP-equivalent fixed cost of each per-expert kernel (cost_models/moe.py expert_kernel_seconds) [fit: held-out
    # MoE set, leave-one-model-out; docs/validation-modern.md]
    moe_expert_kernel_gflop: float = 0.0
    # SwiGLU runs as one fused kernel that saves only its input (Megatron-Core's bias_swiglu_impl), not autograd's
    # gate, up, SiLU output and product: 6 s b f bytes kept per layer instead of 8 (memory.mlp_intermediate_coefficient)
    fused_swiglu: bool = False
    # the model code's RMSNorm upcasts in eager (`_norm(x.float()).type_as(x) * weight`: torchtitan's norm_type
    # 'rmsnorm' of 2024, read from a config by `check`) and saves the fp32 upcast of its input; a fused norm (Triton,
    # Apex, TE, torch's _fused_rms_norm) or a compiled step saves its input (memory.eager_saved_extra_bytes)
    norm_fp32_upcast: bool = False
    # K and V copied to every query head before SDPA (torchtitan's repeat_kv until 2026-01), which saves the copies
    kv_heads_repeated: bool = False
    # fraction of peak a fused causal attention kernel reaches over its forward and backward, counted on the FLOPs
    # it runs (the causal half of the score matrix); 0: not stated, the core is costed as its full-s^2 FLOPs at the
    # layer's GEMM rate (stage.attention_core_gemm_equivalent_flops)
    attention_kernel_efficiency: float = 0.0
    # with no kernel stated (0 above), the flash kernel's rate relative to that GEMM-rate convention: 1, or below 1
    # for a kernel built on an older GPU's tensor-core instructions (an Ampere kernel on Hopper:
    # planner/frameworks/profiles.py ampere_kernel_convention_rate)
    attention_convention_rate: float = 1.0
    # 'selective' is torchtitan's per-op SAC (cost_models/op_sac.py: every 2nd matmul and all elementwise ops
    # recomputed, the attention output kept), not Megatron's core-attention recompute
    selective_op_sac: bool = False
    # peak bytes per logit element of the loss on the last stage (memory.output_activation_bytes): 4, the fp32 logits
    # Megatron's vocab-parallel cross-entropy keeps (memory.FP32_LOGITS_BYTES_PER_LOGIT, Korthikanti §4.3; inputs.py
    # cannot import memory.py, which imports it); torch's F.cross_entropy on fp32-cast logits
    # (torchtitan) holds more at its backward
    loss_bytes_per_logit: float = 4.0
    # the same under TP where the loss runs on vocabulary-sharded logits (torch's loss_parallel, torchtitan's default
    # with TP: memory.TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT); None: loss_bytes_per_logit at every TP degree
    loss_parallel_bytes_per_logit: float | None = None
    # the FP8 Linear is torchao's Float8Linear (torchtitan): it saves the high-precision input
    # (matmul_with_hp_or_float8_args: save_for_backward(input_hp, weight_hp_t)) and casts the weights on the fly, so
    # FP8 saves no activation bytes and keeps no persistent weight copies. False: Transformer Engine's, which keeps its
    # input quantized for backward (Megatron "stores linear layer inputs in FP8") and caches FP8 weight copies for the
    # step (fp8.RECIPES extra_weight_bytes_per_param)
    fp8_torchao_linear: bool = False

    @property
    def compiled(self) -> bool:
        """A compiled step (torch.compile, XLA): its elementwise chains fused (compiled_elementwise_share below 1)."""
        return self.compiled_elementwise_share < 1.0

    def grad_reduce(self, zero_stage: int) -> GradReduce:
        """How ZeRO-`zero_stage` reduces the gradients: an all-reduce where grad_all_reduce_zero_stages names the stage,
        else slice reduces where grad_slice_reduce_zero_stages does, else a reduce-scatter."""
        if zero_stage in self.grad_all_reduce_zero_stages:
            return GradReduce.ALL_REDUCE
        if zero_stage in self.grad_slice_reduce_zero_stages:
            return GradReduce.SLICE_REDUCES
        return GradReduce.REDUCE_SCATTER
