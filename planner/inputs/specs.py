"""The three inputs (model, training setup, cluster) and the output (layout), as frozen pydantic models.

The rules that check a layout against a model, a cluster and a batch live in planner/rules.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from cluster_specs import limits as lim
from cluster_specs.base import FrozenSpec
from cost_models import inputs as cm
from cost_models.compute import parameter_counts
from cost_models.inputs import Offload, Precision, Recompute, Schedule

SCHEDULES = tuple(s.value for s in Schedule)  # the names `--schedules` accepts


class MoESpec(FrozenSpec):
    """Mixture-of-experts MLP: routed experts (the model's MLP kind, width expert_ffn_hidden_size), top-k routing,
    optional shared experts and leading dense layers (modern-training.md §3.1)."""

    num_experts: int = Field(ge=2, le=lim.MAX_EXPERTS, description="routed experts E")
    top_k: int = Field(ge=1, le=lim.MAX_EXPERTS, description="experts per token")
    expert_ffn_hidden_size: int = Field(ge=1, le=4 * lim.MAX_HIDDEN)
    shared_expert_ffn_hidden_size: int = Field(default=0, ge=0, le=64 * lim.MAX_HIDDEN,
                                               description="total width of the shared experts")
    shared_expert_gate: bool = False
    router_bias: bool = Field(default=False, description="an E-sized expert bias per layer (DeepSeek-V3)")
    num_dense_layers: int = Field(default=0, ge=0, le=lim.MAX_LAYERS, description="leading layers with the dense FFN")
    capacity_factor: float | None = Field(default=None, gt=0, description="None: dropless")
    expert_groups: int | None = Field(
        default=None, ge=1, le=lim.MAX_EXPERTS, description="group-limited routing: experts cut into this many equal groups (HF n_group, "
                                        "Megatron --moe-router-num-groups; DeepSeek-V3 8, one per node of EP 64)")
    groups_per_token: int | None = Field(
        default=None, ge=1, le=lim.MAX_EXPERTS, description="groups a token's experts may come from (HF topk_group, Megatron "
                                        "--moe-router-group-topk; DeepSeek-V3 4: each token reaches at most 4 nodes)")

    @model_validator(mode="after")
    def _routing(self):
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k: {self.top_k} -> must not exceed num_experts ({self.num_experts})")
        g, m = self.expert_groups, self.groups_per_token
        if (g is None) != (m is None):
            raise ValueError("expert_groups / groups_per_token: give both (group-limited routing) or neither")
        if g is not None and m is not None:
            if self.num_experts % g:
                raise ValueError(f"expert_groups: {g} -> must divide num_experts ({self.num_experts})")
            if m > g:
                raise ValueError(f"groups_per_token: {m} -> must not exceed expert_groups ({g})")
        return self

    def to_cost_model(self) -> cm.MoE:
        return cm.MoE(**self.model_dump())


class MLASpec(FrozenSpec):
    """Multi-head latent attention (DeepSeek-V2/V3), Hugging Face field names (modern-training.md §4.1)."""

    q_lora_rank: int | None = Field(default=None, ge=1, le=lim.MAX_HIDDEN, description="None: a plain q_proj")
    kv_lora_rank: int = Field(ge=1, le=lim.MAX_HIDDEN)
    qk_nope_head_dim: int = Field(ge=1, le=lim.MAX_HIDDEN)
    qk_rope_head_dim: int = Field(ge=0, le=lim.MAX_HIDDEN)
    v_head_dim: int = Field(ge=1, le=lim.MAX_HIDDEN)

    def to_cost_model(self) -> cm.MLA:
        return cm.MLA(**self.model_dump())


GATED_MLPS = ("swiglu", "geglu")  # a gate and an up projection: 3 matrices, the rest 2


class ModelSpec(FrozenSpec):
    """A decoder-only transformer. Parameter counts are derived, never typed in."""

    name: str = "custom"
    source: str = ""
    num_layers: int = Field(ge=1, le=lim.MAX_LAYERS)
    hidden_size: int = Field(ge=1, le=lim.MAX_HIDDEN)
    num_attention_heads: int = Field(ge=1, le=lim.MAX_HEADS)
    num_kv_heads: int | None = Field(default=None, ge=1, le=lim.MAX_HEADS)
    head_dim: int | None = Field(default=None, ge=1, le=lim.MAX_HIDDEN, description="when heads x head_dim != hidden_size")
    ffn_hidden_size: int | None = Field(default=None, ge=1, le=4 * lim.MAX_HIDDEN)
    mlp: Literal["gelu", "swiglu", "geglu", "relu2"] = Field(
        default="gelu", description="gelu / relu2 (squared ReLU, Nemotron-4): 2 matrices; swiglu / geglu: gated, 3")
    vocab_size: int = Field(ge=1, le=lim.MAX_VOCAB)
    tied_embeddings: bool = True
    norm: Literal["layernorm", "rmsnorm", "nonparametric"] = "layernorm"
    norms_per_layer: int = Field(default=2, ge=0, le=8)
    attention: Literal["standard", "flash"] = "flash"
    position_embedding: Literal["learned", "rope", "alibi"] = "learned"
    max_position_embeddings: int | None = Field(default=None, ge=1, le=lim.MAX_SEQ_LENGTH)
    bias: bool = True
    qkv_bias: bool = Field(default=False, description="bias on q, k, v only (Qwen2)")
    attention_bias: bool = Field(default=False, description="bias on q, k, v and o (Llama/DeepSeek attention_bias)")
    qk_norm: bool = Field(default=False, description="RMSNorm on q and k per head (Qwen3)")
    dropout: bool = False
    sliding_window: int | None = Field(default=None, ge=1, description="local-attention window in tokens")
    sliding_window_layers: int | None = Field(default=None, ge=0, description="layers using it (default: all)")
    moe: MoESpec | None = None
    mla: MLASpec | None = None

    @model_validator(mode="after")
    def _shape(self):
        problems = []
        if self.head_dim is None and self.mla is None and self.hidden_size % self.num_attention_heads:
            problems.append(
                f"hidden_size: {self.hidden_size} -> must be divisible by num_attention_heads ({self.num_attention_heads}),"
                " or give head_dim"
            )
        kv = self.kv_heads
        if kv > self.num_attention_heads or self.num_attention_heads % kv:
            problems.append(
                f"num_kv_heads: {kv} -> must divide num_attention_heads ({self.num_attention_heads})"
            )
        if self.mlp in GATED_MLPS and self.ffn_hidden_size is None:
            problems.append(f"ffn_hidden_size: missing -> required for a {self.mlp} MLP (no 4h default)")
        if self.moe is not None and self.moe.num_dense_layers >= self.num_layers:
            problems.append(f"moe.num_dense_layers: {self.moe.num_dense_layers} -> must be below num_layers "
                            f"({self.num_layers})")
        if self.sliding_window_layers and self.sliding_window_layers > self.num_layers:
            problems.append(f"sliding_window_layers: {self.sliding_window_layers} -> at most num_layers "
                            f"({self.num_layers})")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    def sequence_problem(self, seq_length: int) -> str | None:
        """Why the model cannot train on `seq_length` tokens, or None: learned positions have a row per position, so a
        sequence past max_position_embeddings has none (Hugging Face's GPT-2 wpe, n_positions; Megatron asserts
        max_position_embeddings >= seq_length). Rotary and ALiBi positions have no such table."""
        if self.position_embedding == "learned" and self.max_position_embeddings is not None \
                and seq_length > self.max_position_embeddings:
            return (f"{seq_length} -> {self.name} has learned positions for {self.max_position_embeddings} tokens "
                    f"(max_position_embeddings): train at most that long, or describe the model with "
                    f"max_position_embeddings >= {seq_length}")
        return None

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    def to_cost_model(self, *, seq_length: int | None = None) -> cm.Transformer:
        window_layers = self.sliding_window_layers if self.sliding_window_layers is not None else self.num_layers
        return cm.Transformer(
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            num_kv_heads=self.kv_heads,
            ffn_hidden_size=self.ffn,
            vocab_size=self.vocab_size,
            swiglu=self.mlp in GATED_MLPS,
            squared_relu=self.mlp == "relu2",
            tied_embeddings=self.tied_embeddings,
            rms_norm=self.norm == "rmsnorm",
            flash_attention=self.attention == "flash",
            learned_position_embeddings=self.position_embedding == "learned",
            max_position_embeddings=self.max_position_embeddings or seq_length or 2048,
            bias=self.bias,
            dropout=self.dropout,
            head_dim_size=self.head_dim,
            qkv_bias=self.qkv_bias or self.attention_bias,
            o_bias=self.attention_bias,
            qk_norm=self.qk_norm,
            norms_per_layer=self.norms_per_layer,
            norm_has_params=self.norm != "nonparametric",
            sliding_window=self.sliding_window,
            sliding_window_layers=window_layers if self.sliding_window else 0,
            moe=self.moe.to_cost_model() if self.moe else None,
            mla=self.mla.to_cost_model() if self.mla else None,
        )

    def parameter_counts(self) -> dict[str, int]:
        return parameter_counts(self.to_cost_model()).as_dict()


PRECISION_BYTES = {p.value: p.bytes for p in Precision}
# an optimizer state's element: the precision's, but an fp8 state is one byte (Megatron-LM --exp-avg-dtype fp8; its
# per-tensor fp32 scale is not counted), where fp8 training keeps its parameters in bf16
STATE_BYTES = {**PRECISION_BYTES, "fp8": 1}
FP8_RECIPES = ("delayed", "tensorwise", "rowwise", "blockwise", "mxfp8")  # cost_models/fp8.py


class TrainingSpec(FrozenSpec):
    """What one step trains on, in what precision, with which optimizer."""

    global_batch_size: int = Field(ge=1, le=lim.MAX_GLOBAL_BATCH, description="sequences per optimizer step")
    seq_length: int = Field(ge=1, le=lim.MAX_SEQ_LENGTH)
    precision: Precision = Precision.BF16
    fp8_recipe: Literal["delayed", "tensorwise", "rowwise", "blockwise", "mxfp8"] = Field(
        default="tensorwise",
        description="with precision fp8: TE delayed/current(tensorwise)/blockwise/MXFP8 or torchao tensorwise/rowwise "
        "scaling (modern-training.md §1.1); tensorwise is NeMo's FP8-CS and torchao's fastest",
    )
    fp8_param_gather: bool = Field(default=False, description="FP8 primary weights, FP8 parameter all-gather")
    optimizer: Literal["adam", "adamw", "sgd"] = "adamw"
    grad_dtype: Literal["fp32", "bf16", "fp16"] | None = Field(
        default=None,
        description="gradient buffer dtype; default fp32 for bf16 (Megatron, 18 B/param), else the precision "
        "(ZeRO paper, 16 B/param)",
    )
    grad_reduce_dtype: Literal["fp32", "bf16", "fp16"] | None = None
    # lower-precision optimizer states (Megatron-Core's precision-aware optimizer --main-params-dtype, --exp-avg-dtype,
    # --exp-avg-sq-dtype; apex DistributedFusedAdam dtype; DeepSeek-V3's bf16 moments, modern-training.md §1.3)
    master_dtype: Literal["fp32", "bf16", "fp16"] | None = Field(
        default=None, description="the optimizer's master copy of the weights (mixed precision); default fp32")
    exp_avg_dtype: Literal["fp32", "bf16", "fp16", "fp8"] | None = Field(
        default=None, description="Adam's first moment (SGD's momentum); default fp32; fp8 is 1 byte")
    exp_avg_sq_dtype: Literal["fp32", "bf16", "fp16", "fp8"] | None = Field(
        default=None, description="Adam's second moment; default fp32; fp8 is 1 byte")
    compile: bool = Field(
        default=False, description="torch.compile the model (--compile; torchtitan's [compile] enable with components "
        "['model']): each transformer block's elementwise kernels fused, moving 5/12 of eager's bytes "
        "(planner/frameworks/profiles.py COMPILED_ELEMENTWISE_SHARE); the loss stays eager")

    @model_validator(mode="after")
    def _states(self) -> TrainingSpec:
        if self.master_dtype not in (None, "fp32") and self.precision == "fp32":
            raise ValueError(f"master_dtype: {self.master_dtype} -> fp32 training keeps no master copy; leave it unset")
        if self.grad_dtype == "bf16" and self.precision == "fp16":
            raise ValueError("grad_dtype: bf16 with precision fp16 -> fp16 training keeps its gradients in fp16 or fp32")
        if self.exp_avg_sq_dtype not in (None, "fp32") and self.optimizer == "sgd":
            raise ValueError(f"exp_avg_sq_dtype: {self.exp_avg_sq_dtype} -> SGD keeps no second moment; leave it unset")
        return self

    @property
    def default_grad_dtype(self) -> str:
        """Mixed precision's gradient buffer: fp32 main gradients for bf16 and fp8 (Megatron's, FSDP2's), the
        parameter's dtype for fp16 and fp32 (ZeRO paper)."""
        return "fp32" if self.precision in ("bf16", "fp8") else self.precision

    @property
    def grad_bytes(self) -> int:
        return PRECISION_BYTES[self.grad_dtype or self.default_grad_dtype]

    @property
    def low_precision_states(self) -> dict[str, str]:
        """The optimizer's states (master copy, moments) set below fp32: field -> dtype."""
        given = {"master_dtype": self.master_dtype, "exp_avg_dtype": self.exp_avg_dtype,
                 "exp_avg_sq_dtype": self.exp_avg_sq_dtype}
        return {k: v for k, v in given.items() if v not in (None, "fp32")}

    @property
    def grad_dtype_off_default(self) -> str | None:
        """The gradient buffer's dtype where it is set off the default (default_grad_dtype), else None."""
        return self.grad_dtype if self.grad_dtype not in (None, self.default_grad_dtype) else None

    def optimizer_state_saved_bytes(self, fp32_master_bytes: float = 4) -> float:
        """Bytes per parameter the master copy and moments save against fp32 ones (0 by default). fp32_master_bytes:
        what an fp32 master costs where it is kept (4; 2 where the framework keeps only the 16 bits a bf16
        parameter lacks, Profile.master_remainders)."""
        if self.precision == "fp32":
            master = 0.0
        else:
            master = 4 - (fp32_master_bytes if self.master_dtype in (None, "fp32") else STATE_BYTES[self.master_dtype])
        moments = [self.exp_avg_dtype] + ([self.exp_avg_sq_dtype] if self.optimizer in ("adam", "adamw") else [])
        return master + sum(4 - STATE_BYTES[d or "fp32"] for d in moments)

    @property
    def optimizer_bytes_per_param(self) -> float:
        """Master copy (mixed precision only) + moments: fp32 Adam 4 + 8, SGD-momentum 4 + 4 (ZeRO paper §3.1, K=12),
        less what lower-precision states save."""
        master = 4 if self.precision != "fp32" else 0
        moments = 8 if self.optimizer in ("adam", "adamw") else 4
        return master + moments - self.optimizer_state_saved_bytes()

    @property
    def compute_dtype(self) -> str:
        """The dtype whose peak the cost model divides by: FP8 runs charge the FP8 GEMMs their measured speedup over
        the BF16 peak (cost_models/fp8.py), and MFU stays quoted against BF16 (modern-training.md §1.4)."""
        return "bf16" if self.precision == "fp8" else self.precision

    def to_cost_model(self) -> cm.Training:
        reduce = self.grad_reduce_dtype
        return cm.Training(
            global_batch_size=self.global_batch_size,
            seq_length=self.seq_length,
            activation_bytes=PRECISION_BYTES[self.precision],
            param_bytes=PRECISION_BYTES[self.precision],
            grad_bytes=self.grad_bytes,
            optimizer_bytes=self.optimizer_bytes_per_param,
            optimizer_state_saved_bytes=self.optimizer_state_saved_bytes(),
            grad_reduce_bytes=PRECISION_BYTES[reduce] if reduce else self.grad_bytes,
            fp8_recipe=self.fp8_recipe if self.precision == "fp8" else None,
            fp8_param_gather=self.precision == "fp8" and self.fp8_param_gather,
        )


class LayoutSpec(FrozenSpec):
    """The planner's output and what `check` validates. Field names follow torchtitan's short degree names."""

    dp: int = Field(ge=1, le=lim.MAX_GPUS)
    tp: int = Field(default=1, ge=1, le=lim.MAX_GPUS)
    pp: int = Field(default=1, ge=1, le=lim.MAX_GPUS)
    zero_stage: int = Field(default=0, ge=0, le=3)
    offload: Offload = Offload.NONE
    micro_batch_size: int = Field(default=1, ge=1, le=lim.MAX_GLOBAL_BATCH)
    num_micro_batches: int = Field(default=1, ge=1, le=lim.MAX_GLOBAL_BATCH,
                                   description="per pipeline per step (gradient accumulation)")
    recompute: Recompute = Recompute.NONE
    sequence_parallel: bool = False
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = Field(default=1, ge=1, le=lim.MAX_LAYERS)
    layers_per_stage: list[int] | None = None
    recompute_layers_per_stage: list[int] | None = None
    cp: int = Field(default=1, ge=1, description="context parallel degree (sequence split over cp ranks)")
    cp_comm: Literal["p2p", "all_gather", "a2a"] = Field(
        default="p2p", description="CP exchange: ring (Megatron's default), Llama 3's all-gather, or Ulysses all-to-all")
    ep: int = Field(default=1, ge=1, description="expert parallel degree (routed experts split over ep ranks)")
    etp: int = Field(default=1, ge=1, description="expert tensor parallel degree (Megatron)")
    dp_shard: int | None = Field(
        default=None, ge=1, description="hybrid sharding (HSDP): ZeRO shards the states over dp_shard of the dp ranks, "
        "and the dp / dp_shard replicas all-reduce the sharded gradients (torchtitan's data_parallel_shard_degree with "
        "data_parallel_replicate_degree); None: over all dp ranks")

    @classmethod
    def trusted(cls, **fields: Any) -> LayoutSpec:
        """Build without validation (the search's hot path: its candidates satisfy the field constraints by
        construction); option strings become their enum members, unset fields take their defaults."""
        for key, enum in (("offload", Offload), ("recompute", Recompute), ("schedule", Schedule)):
            if key in fields:
                fields[key] = enum(fields[key])
        fields.setdefault("layers_per_stage", None)
        fields.setdefault("recompute_layers_per_stage", None)
        return cls.model_construct(**fields)

    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def hybrid_sharded(self) -> bool:
        """Whether ZeRO shards over part of the dp ranks only (dp_shard below dp)."""
        return self.dp_shard is not None and self.dp_shard < self.dp

    @property
    def dp_replicas(self) -> int:
        """Copies of the sharded states hybrid sharding keeps, dp / dp_shard (1 without it; the cost model's
        Layout.zero_replicas)."""
        return self.to_cost_model().zero_replicas

    def to_cost_model(self) -> cm.Layout:
        return cm.Layout(
            dp=self.dp,
            tp=self.tp,
            pp=self.pp,
            zero_stage=self.zero_stage,
            offload=self.offload,
            micro_batch_size=self.micro_batch_size,
            num_micro_batches=self.num_micro_batches,
            recompute=self.recompute,
            sequence_parallel=self.sequence_parallel,
            schedule=self.schedule,
            virtual_stages=self.virtual_stages,
            layers_per_stage=tuple(self.layers_per_stage) if self.layers_per_stage else None,
            recompute_layers_per_stage=tuple(self.recompute_layers_per_stage)
            if self.recompute_layers_per_stage
            else None,
            cp=self.cp,
            cp_comm=self.cp_comm,
            ep=self.ep,
            etp=self.etp,
            dp_shard=self.dp_shard or 0,
        )

    def degree_parts(self) -> list[str]:
        """The `--layout` keys every rendering of a layout starts with: degrees, ZeRO and its sharding, offload,
        micro-batch size and recompute (short(); report.layout_arg adds what gives the same layout back)."""
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}", f"zero={self.zero_stage}"]
        if self.hybrid_sharded:
            parts.append(f"shard={self.dp_shard}")
        if self.cp > 1:
            parts += [f"cp={self.cp}"] + ([f"cp_comm={self.cp_comm}"] if self.cp_comm != "p2p" else [])
        if self.ep > 1 or self.etp > 1:
            parts += [f"ep={self.ep}"] + ([f"etp={self.etp}"] if self.etp > 1 else [])
        if self.offload != "none":
            parts.append(f"offload={self.offload}")
        return parts + [f"mbs={self.micro_batch_size}", f"recompute={self.recompute}"]

    def short(self) -> str:
        parts = self.degree_parts()
        if self.sequence_parallel:
            parts.append("sp=1")
        if self.pp > 1:
            parts.append(f"schedule={self.schedule}")
            if self.virtual_stages > 1:
                parts.append(f"vpp={self.virtual_stages}")
        return ",".join(parts)
