"""The three inputs (model, training setup, cluster) and the output (layout), as frozen pydantic models.

`layout_problems` is the one place that checks parallel degrees against a model, a cluster and a batch;
`validate_layout` raises with all the problems at once.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster_specs import ClusterSpec, SpecError
from cost_models import inputs as cm
from cost_models.compute import parameter_counts
from cost_models.step import stage_split

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "pipedream_async")
RECOMPUTE = ("none", "selective", "full")
OFFLOAD = ("none", "optimizer", "optimizer+params")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MoESpec(_Frozen):
    """Mixture-of-experts MLP: routed experts (the model's MLP kind, width expert_ffn_hidden_size), top-k routing,
    optional shared experts and leading dense layers (modern-training.md §3.1)."""

    num_experts: int = Field(ge=2, description="routed experts E")
    top_k: int = Field(ge=1, description="experts per token")
    expert_ffn_hidden_size: int = Field(ge=1)
    shared_expert_ffn_hidden_size: int = Field(default=0, ge=0, description="total width of the shared experts")
    shared_expert_gate: bool = False
    router_bias: bool = Field(default=False, description="an E-sized expert bias per layer (DeepSeek-V3)")
    num_dense_layers: int = Field(default=0, ge=0, description="leading layers with the dense FFN")
    capacity_factor: float | None = Field(default=None, gt=0, description="None: dropless")

    @model_validator(mode="after")
    def _routing(self):
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k: {self.top_k} -> must not exceed num_experts ({self.num_experts})")
        return self

    def to_cost_model(self) -> cm.MoE:
        return cm.MoE(**self.model_dump())


class MLASpec(_Frozen):
    """Multi-head latent attention (DeepSeek-V2/V3), Hugging Face field names (modern-training.md §4.1)."""

    q_lora_rank: int | None = Field(default=None, ge=1, description="None: a plain q_proj")
    kv_lora_rank: int = Field(ge=1)
    qk_nope_head_dim: int = Field(ge=1)
    qk_rope_head_dim: int = Field(ge=0)
    v_head_dim: int = Field(ge=1)

    def to_cost_model(self) -> cm.MLA:
        return cm.MLA(**self.model_dump())


class ModelSpec(_Frozen):
    """A decoder-only transformer. Parameter counts are derived, never typed in."""

    name: str = "custom"
    source: str = ""
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int | None = Field(default=None, ge=1)
    head_dim: int | None = Field(default=None, ge=1, description="when heads x head_dim != hidden_size")
    ffn_hidden_size: int | None = Field(default=None, ge=1)
    mlp: Literal["gelu", "swiglu", "geglu"] = "gelu"
    vocab_size: int = Field(ge=1)
    tied_embeddings: bool = True
    norm: Literal["layernorm", "rmsnorm", "nonparametric"] = "layernorm"
    norms_per_layer: int = Field(default=2, ge=0, le=8)
    attention: Literal["standard", "flash"] = "flash"
    position_embedding: Literal["learned", "rope", "alibi"] = "learned"
    max_position_embeddings: int | None = Field(default=None, ge=1)
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
        if self.mlp != "gelu" and self.ffn_hidden_size is None:
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
            swiglu=self.mlp != "gelu",
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


PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


class TrainingSpec(_Frozen):
    """What one step trains on, in what precision, with which optimizer."""

    global_batch_size: int = Field(ge=1, description="sequences per optimizer step")
    seq_length: int = Field(ge=1)
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    optimizer: Literal["adam", "adamw", "sgd"] = "adamw"
    grad_dtype: Literal["fp32", "bf16", "fp16"] | None = Field(
        default=None,
        description="gradient buffer dtype; default fp32 for bf16 (Megatron, 18 B/param), else the precision "
        "(ZeRO paper, 16 B/param)",
    )
    grad_reduce_dtype: Literal["fp32", "bf16", "fp16"] | None = None

    @property
    def grad_bytes(self) -> int:
        dtype = self.grad_dtype or ("fp32" if self.precision == "bf16" else self.precision)
        return PRECISION_BYTES[dtype]

    @property
    def optimizer_bytes_per_param(self) -> int:
        """fp32 master copy (mixed precision only) + moments: Adam 8, SGD-momentum 4 (ZeRO paper §3.1, K=12)."""
        master = 4 if self.precision != "fp32" else 0
        moments = 8 if self.optimizer in ("adam", "adamw") else 4
        return master + moments

    def to_cost_model(self) -> cm.Training:
        reduce = self.grad_reduce_dtype
        return cm.Training(
            global_batch_size=self.global_batch_size,
            seq_length=self.seq_length,
            activation_bytes=PRECISION_BYTES[self.precision],
            param_bytes=PRECISION_BYTES[self.precision],
            grad_bytes=self.grad_bytes,
            optimizer_bytes=self.optimizer_bytes_per_param,
            grad_reduce_bytes=PRECISION_BYTES[reduce] if reduce else self.grad_bytes,
        )


class LayoutSpec(_Frozen):
    """The planner's output and what `check` validates. Field names follow torchtitan's short degree names."""

    dp: int = Field(ge=1)
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    zero_stage: int = Field(default=0, ge=0, le=3)
    offload: Literal["none", "optimizer", "optimizer+params"] = "none"
    micro_batch_size: int = Field(default=1, ge=1)
    num_micro_batches: int = Field(default=1, ge=1, description="per pipeline per step (gradient accumulation)")
    recompute: Literal["none", "selective", "full"] = "none"
    sequence_parallel: bool = False
    schedule: Literal["naive", "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "pipedream_async"] = "1f1b"
    virtual_stages: int = Field(default=1, ge=1)
    layers_per_stage: list[int] | None = None
    recompute_layers_per_stage: list[int] | None = None

    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp

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
        )

    def short(self) -> str:
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}", f"zero={self.zero_stage}"]
        if self.offload != "none":
            parts.append(f"offload={self.offload}")
        parts += [f"mbs={self.micro_batch_size}", f"recompute={self.recompute}"]
        if self.sequence_parallel:
            parts.append("sp=1")
        if self.pp > 1:
            parts.append(f"schedule={self.schedule}")
            if self.virtual_stages > 1:
                parts.append(f"vpp={self.virtual_stages}")
        return ",".join(parts)


def layout_problems(
    layout: LayoutSpec,
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec | None = None,
    *,
    allow_tp_across_nodes: bool = False,
) -> list[str]:
    """Every rule a layout must satisfy, as one line per violation: field, value, what is allowed."""
    p: list[str] = []
    t = layout.tp
    if cluster is not None and layout.num_gpus != cluster.num_gpus:
        p.append(
            f"dp*tp*pp: {layout.dp}*{t}*{layout.pp} = {layout.num_gpus} -> must equal the cluster's "
            f"{cluster.num_gpus} GPUs ({cluster.num_nodes} nodes x {cluster.gpus_per_node})"
        )
    heads, kv = model.num_attention_heads, model.kv_heads
    if heads % t:
        p.append(f"tp: {t} -> must divide num_attention_heads ({heads})")
    if kv % t and t % kv:
        p.append(f"tp: {t} -> num_kv_heads ({kv}) must be divisible by tp, or tp by num_kv_heads (GQA replication)")
    if model.ffn % t:
        p.append(f"tp: {t} -> must divide ffn_hidden_size ({model.ffn})")
    if model.hidden_size % t:
        p.append(f"tp: {t} -> must divide hidden_size ({model.hidden_size})")
    if layout.sequence_parallel and t == 1:
        p.append("sequence_parallel: true -> needs tp > 1")
    if layout.sequence_parallel and training.seq_length % t:
        p.append(f"sequence_parallel: seq_length {training.seq_length} -> must be divisible by tp ({t})")
    if cluster is not None and not allow_tp_across_nodes and t > cluster.gpus_per_node:
        p.append(
            f"tp: {t} -> exceeds the {cluster.gpus_per_node} GPUs of a node: TP all-reduces would cross the network "
            "(allow with --allow-tp-across-nodes)"
        )
    if cluster is not None and t <= cluster.gpus_per_node and cluster.gpus_per_node % t:
        p.append(f"tp: {t} -> must divide gpus_per_node ({cluster.gpus_per_node}) so TP groups stay in one node")
    chunks = layout.pp * layout.virtual_stages
    if model.num_layers < chunks:
        p.append(f"pp*virtual_stages: {layout.pp}*{layout.virtual_stages} -> must not exceed num_layers ({model.num_layers})")
    want_batch = layout.micro_batch_size * layout.num_micro_batches * layout.dp
    if want_batch != training.global_batch_size:
        p.append(
            f"global_batch_size: {training.global_batch_size} -> must equal micro_batch_size x num_micro_batches x dp "
            f"= {layout.micro_batch_size} x {layout.num_micro_batches} x {layout.dp} = {want_batch}"
        )
    if layout.pp == 1 and layout.schedule not in ("1f1b", "gpipe", "naive"):
        p.append(f"schedule: {layout.schedule} -> needs pp > 1 (use 1f1b with pp=1)")
    if layout.virtual_stages > 1 and layout.schedule != "interleaved_1f1b":
        p.append(f"virtual_stages: {layout.virtual_stages} -> only interleaved_1f1b uses virtual stages")
    if layout.schedule == "interleaved_1f1b":
        if layout.virtual_stages < 2:
            p.append("virtual_stages: 1 -> interleaved_1f1b needs >= 2")
        if layout.num_micro_batches % layout.pp:
            p.append(
                f"num_micro_batches: {layout.num_micro_batches} -> interleaved_1f1b needs a multiple of pp ({layout.pp}) "
                "(Narayanan et al. 2021 §2.2.2)"
            )
        if layout.layers_per_stage is None and model.num_layers % chunks:
            p.append(
                f"num_layers: {model.num_layers} -> interleaved_1f1b needs a multiple of pp*virtual_stages ({chunks})"
            )
    if layout.zero_stage >= 2 and layout.pp > 1:
        p.append(
            f"zero_stage: {layout.zero_stage} -> with pp > 1 only ZeRO-0/1 are supported (gradients and parameters are "
            "needed across micro-batches; DeepSpeed and Megatron both refuse ZeRO-2/3 with pipelining)"
        )
    if layout.offload != "none" and layout.zero_stage == 0:
        p.append(f"offload: {layout.offload} -> needs zero_stage >= 1 (ZeRO-Offload shards the optimizer)")
    if layout.offload == "optimizer+params" and layout.zero_stage != 3:
        p.append("offload: optimizer+params -> needs zero_stage 3 (ZeRO-Infinity offloads partitioned parameters)")
    if layout.layers_per_stage is not None:
        lps = layout.layers_per_stage
        if len(lps) != layout.pp or any(n < 1 for n in lps) or sum(lps) != model.num_layers:
            p.append(
                f"layers_per_stage: {lps} -> needs pp ({layout.pp}) entries, each >= 1, summing to num_layers "
                f"({model.num_layers})"
            )
    if layout.recompute_layers_per_stage is not None:
        rps = layout.recompute_layers_per_stage
        lps = layout.layers_per_stage or list(stage_split(model.num_layers, layout.pp))
        if len(rps) != layout.pp or any(r < 0 or r > n for r, n in zip(rps, lps, strict=False)):
            p.append(f"recompute_layers_per_stage: {rps} -> needs pp entries, each between 0 and that stage's layers {lps}")
    return p


def validate_layout(layout: LayoutSpec, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec | None = None,
                    **kw) -> None:
    problems = layout_problems(layout, model, training, cluster, **kw)
    if problems:
        raise SpecError(problems, source="layout")
