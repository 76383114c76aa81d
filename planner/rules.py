"""Layout rules: every constraint a layout must satisfy against a model, a batch and a cluster, as typed violations.

`layout_violations` is the one place these rules live; the search, `check`, validation and `estimate` all call
it. A `Violation` names the rule, the field, the value, what is allowed and a fix; `str(v)` is the one-line
message `field: value -> allowed` that the CLI prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cost_models.inputs import Offload, Schedule
from cost_models.stage import stage_split

if TYPE_CHECKING:
    from cluster_specs import ClusterSpec
    from planner.inputs.specs import LayoutSpec, ModelSpec, TrainingSpec


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str  # stable identifier of the rule, e.g. "tp_divides_heads"
    field: str  # the layout field (or product of fields) at fault
    value: str  # the value as given, with the numbers that make it wrong
    allowed: str  # what is allowed
    fix: str  # what to change

    def __str__(self) -> str:
        return f"{self.field}: {self.value} -> {self.allowed}"


def _degree_rules(layout: LayoutSpec, model: ModelSpec, cluster: ClusterSpec | None) -> list[Violation]:
    out: list[Violation] = []
    t = layout.tp
    if cluster is not None and layout.num_gpus != cluster.num_gpus:
        degrees, values = ("dp*tp*pp*cp", f"{layout.dp}*{t}*{layout.pp}*{layout.cp}") if layout.cp > 1 else \
            ("dp*tp*pp", f"{layout.dp}*{t}*{layout.pp}")
        out.append(Violation("gpus_match_cluster", degrees, f"{values} = {layout.num_gpus}",
                             f"must equal the cluster's {cluster.num_gpus} GPUs ({cluster.num_nodes} nodes x "
                             f"{cluster.gpus_per_node})", "choose degrees whose product is the number of GPUs"))
    heads, kv = model.num_attention_heads, model.kv_heads
    if heads % t:
        out.append(Violation("tp_divides_heads", "tp", str(t), f"must divide num_attention_heads ({heads})",
                             "use a tp that divides the heads"))
    if kv % t and t % kv:
        out.append(Violation("tp_fits_kv_heads", "tp", str(t), f"num_kv_heads ({kv}) must be divisible by tp, or tp "
                             "by num_kv_heads (GQA replication)", "use a tp that divides the KV heads, or a multiple "
                             "of them"))
    if model.ffn % t:
        out.append(Violation("tp_divides_ffn", "tp", str(t), f"must divide ffn_hidden_size ({model.ffn})",
                             "use a tp that divides the FFN size"))
    if model.hidden_size % t:
        out.append(Violation("tp_divides_hidden", "tp", str(t), f"must divide hidden_size ({model.hidden_size})",
                             "use a tp that divides the hidden size"))
    return out


def _placement_rules(layout: LayoutSpec, model: ModelSpec, cluster: ClusterSpec | None,
                     allow_tp_across_nodes: bool) -> list[Violation]:
    out: list[Violation] = []
    t = layout.tp
    if cluster is not None and not allow_tp_across_nodes and t > cluster.gpus_per_node:
        out.append(Violation("tp_within_node", "tp", str(t), f"exceeds the {cluster.gpus_per_node} GPUs of a node: "
                             "TP all-reduces would cross the network (allow with --allow-tp-across-nodes)",
                             "keep tp <= GPUs per node; add pp or dp instead"))
    if cluster is not None and t <= cluster.gpus_per_node and cluster.gpus_per_node % t:
        out.append(Violation("tp_divides_node", "tp", str(t), f"must divide gpus_per_node ({cluster.gpus_per_node}) "
                             "so TP groups stay in one node", "use a tp that divides the GPUs of a node"))
    chunks = layout.pp * layout.virtual_stages
    if model.num_layers < chunks:
        out.append(Violation("chunks_within_layers", "pp*virtual_stages", f"{layout.pp}*{layout.virtual_stages}",
                             f"must not exceed num_layers ({model.num_layers})",
                             "use fewer pipeline stages (or virtual stages), or a layer count they divide"))
    return out


def _sequence_parallel_rules(layout: LayoutSpec, training: TrainingSpec) -> list[Violation]:
    fix = "turn sequence parallelism off or use a tp that divides the sequence"
    out: list[Violation] = []
    if layout.sequence_parallel and layout.tp == 1:
        out.append(Violation("sp_needs_tp", "sequence_parallel", "true", "needs tp > 1", fix))
    if layout.sequence_parallel and training.seq_length % layout.tp:
        out.append(Violation("sp_divides_sequence", "sequence_parallel", f"seq_length {training.seq_length}",
                             f"must be divisible by tp ({layout.tp})", fix))
    return out


def _batch_rules(layout: LayoutSpec, training: TrainingSpec) -> list[Violation]:
    want = layout.micro_batch_size * layout.num_micro_batches * layout.dp
    if want == training.global_batch_size:
        return []
    return [Violation("batch_product", "global_batch_size", str(training.global_batch_size),
                      f"must equal micro_batch_size x num_micro_batches x dp = {layout.micro_batch_size} x "
                      f"{layout.num_micro_batches} x {layout.dp} = {want}",
                      "set global batch = micro-batch x micro-batches (gradient accumulation) x dp")]


def _schedule_rules(layout: LayoutSpec, model: ModelSpec) -> list[Violation]:
    out: list[Violation] = []
    vfix = "use interleaved_1f1b with >= 2 virtual stages, or drop them"
    if layout.pp == 1 and layout.schedule not in (Schedule.ONE_F_ONE_B, Schedule.GPIPE, Schedule.NAIVE):
        out.append(Violation("schedule_needs_pp", "schedule", str(layout.schedule), "needs pp > 1 (use 1f1b with pp=1)",
                             "use 1f1b without pipelining"))
    if layout.virtual_stages > 1 and layout.schedule != Schedule.INTERLEAVED_1F1B:
        out.append(Violation("virtual_stages_need_interleaving", "virtual_stages", str(layout.virtual_stages),
                             "only interleaved_1f1b uses virtual stages", vfix))
    if layout.schedule != Schedule.INTERLEAVED_1F1B:
        return out
    if layout.virtual_stages < 2:
        out.append(Violation("interleaving_needs_virtual_stages", "virtual_stages", "1",
                             "interleaved_1f1b needs >= 2", vfix))
    if layout.num_micro_batches % layout.pp:
        out.append(Violation("interleaving_micro_batches", "num_micro_batches", str(layout.num_micro_batches),
                             f"interleaved_1f1b needs a multiple of pp ({layout.pp}) (Narayanan et al. 2021 §2.2.2)",
                             "use a multiple of pp micro-batches"))
    chunks = layout.pp * layout.virtual_stages
    if layout.layers_per_stage is None and model.num_layers % chunks:
        split = _uneven_interleaving_split(model.num_layers, layout.pp, layout.virtual_stages)
        given = f", or an uneven split: layers_per_stage={split} (Megatron's account-for-embedding/loss)" if split else ""
        out.append(Violation("interleaving_layers", "num_layers", str(model.num_layers),
                             f"interleaved_1f1b needs a multiple of pp*virtual_stages ({chunks}){given}",
                             (f"give layers_per_stage={split}, or " if split else "")
                             + "use fewer pipeline stages (or virtual stages), or a layer count they divide"))
    return out


def _uneven_interleaving_split(num_layers: int, pp: int, vp: int) -> str | None:
    """The uneven split Megatron's account-for-embedding/loss flags build for layers that pp x vp chunks do not
    divide (what `plan` picks and `export` launches), in --layout syntax; None where none does."""
    from planner.frameworks.megatron_split import account_for_splits

    splits = account_for_splits(num_layers, pp, vp)
    return "/".join(map(str, splits[0])) if splits else None


def _state_rules(layout: LayoutSpec) -> list[Violation]:
    out: list[Violation] = []
    ofix = "offload needs a ZeRO stage that shards what is offloaded"
    if layout.zero_stage >= 2 and layout.pp > 1:
        out.append(Violation("zero_with_pipelining", "zero_stage", str(layout.zero_stage),
                             "with pp > 1 only ZeRO-0/1 are supported (gradients and parameters are needed across "
                             "micro-batches; DeepSpeed and Megatron both refuse ZeRO-2/3 with pipelining)",
                             "use ZeRO-1 (distributed optimizer) with pipelining"))
    if layout.offload != Offload.NONE and layout.zero_stage == 0:
        out.append(Violation("offload_needs_zero", "offload", str(layout.offload),
                             "needs zero_stage >= 1 (ZeRO-Offload shards the optimizer)", ofix))
    if layout.offload == Offload.OPTIMIZER_PARAMS and layout.zero_stage != 3:
        out.append(Violation("param_offload_needs_zero3", "offload", "optimizer+params",
                             "needs zero_stage 3 (ZeRO-Infinity offloads partitioned parameters)", ofix))
    return out + _hybrid_shard_rules(layout)


def hybrid_shard_problem(*, dp: int, shard: int | None, zero_stage: int, offload: str,
                         ep: int) -> Violation | None:
    """Hybrid sharding (dp_shard): a divisor of dp, over a ZeRO stage that shards, without offload or expert
    parallelism (neither is modelled with it). The one test of a shard degree: the layout rules, the search's
    candidates and the benchmark's scaled layout all ask it."""
    if shard is None:
        return None
    fix = "drop shard (ZeRO over all dp ranks), or give a divisor of dp"
    if dp % shard:
        return Violation("dp_shard_divides_dp", "dp_shard", f"{shard} (dp {dp})", "a divisor of dp", fix)
    if shard >= dp:
        return None  # over every dp rank: plain ZeRO
    needs = [(zero_stage == 0, "zero_stage >= 1 (hybrid sharding shards the states)"),
             (offload != Offload.NONE, "offload none (offload with hybrid sharding is not modelled)"),
             (ep > 1, "ep 1 (hybrid sharding with expert parallelism is not modelled)")]
    return next((Violation("hybrid_shard", "dp_shard", f"{shard} of dp {dp}", f"needs {why}", fix)
                 for broken, why in needs if broken), None)


def _hybrid_shard_rules(layout: LayoutSpec) -> list[Violation]:
    v = hybrid_shard_problem(dp=layout.dp, shard=layout.dp_shard, zero_stage=layout.zero_stage,
                             offload=layout.offload, ep=layout.ep)
    return [v] if v else []


def _split_rules(layout: LayoutSpec, model: ModelSpec) -> list[Violation]:
    out: list[Violation] = []
    fix = "list one layer count per stage, summing to the layers"
    lps = layout.layers_per_stage
    if lps is not None and (len(lps) != layout.pp or any(n < 1 for n in lps) or sum(lps) != model.num_layers):
        out.append(Violation("layers_per_stage", "layers_per_stage", str(lps),
                             f"needs pp ({layout.pp}) entries, each >= 1, summing to num_layers ({model.num_layers})",
                             fix))
    rps = layout.recompute_layers_per_stage
    if rps is not None:
        split = lps or list(stage_split(model.num_layers, layout.pp))
        if len(rps) != layout.pp or any(r < 0 or r > n for r, n in zip(rps, split, strict=False)):
            out.append(Violation("recompute_layers_per_stage", "recompute_layers_per_stage", str(rps),
                                 f"needs pp entries, each between 0 and that stage's layers {split}",
                                 "list one recomputed-layer count per stage, at most that stage's layers"))
    return out


def _cp_rules(layout: LayoutSpec, model: ModelSpec, training: TrainingSpec) -> list[Violation]:
    from cost_models.context_parallel import cp_problems

    fix = "use a cp that splits the sequence into 2·cp equal chunks (and cp_comm p2p when heads do not divide)"
    found = cp_problems(model.to_cost_model(), variant=layout.cp_comm, cp=layout.cp, seq_length=training.seq_length,
                        tp=layout.tp if layout.sequence_parallel else 1)
    return [Violation("cp_" + ("comm" if field == "cp_comm" else "split"), field, str(getattr(layout, field)),
                      why.split(" -> ", 1)[-1], fix) for field, why in found]


def _ep_rules(layout: LayoutSpec, model: ModelSpec) -> list[Violation]:
    out: list[Violation] = []
    moe, ep, etp = model.moe, layout.ep, layout.etp
    if (ep > 1 or etp > 1) and moe is None:
        out.append(Violation("ep_needs_moe", "ep", str(ep), f"expert parallelism needs a mixture-of-experts model "
                             f"({model.name} is dense)", "use ep=1"))
    if moe is not None and moe.num_experts % ep:
        out.append(Violation("ep_divides_experts", "ep", str(ep), f"must divide num_experts ({moe.num_experts}) "
                             "(Megatron arguments.py L1657)", "use an ep that divides the experts"))
    if moe is not None and moe.expert_ffn_hidden_size % etp:
        out.append(Violation("etp_divides_expert_ffn", "etp", str(etp), "must divide expert_ffn_hidden_size "
                             f"({moe.expert_ffn_hidden_size})", "use etp=1 (fine-grained experts) or a divisor"))
    folded = layout.dp * layout.cp * layout.tp
    if folded % (ep * etp):
        out.append(Violation("ep_folds_into_dp", "ep*etp", f"{ep}*{etp}", f"must divide dp*cp*tp = {folded} (the "
                             "expert grid etp x ep x edp x pp covers the same GPUs: Megatron parallel folding, "
                             "torchtitan parallel_dims)", "use an ep that divides dp*cp*tp"))
    return out


def _fp8_rules(training: TrainingSpec, cluster: ClusterSpec | None) -> list[Violation]:
    if cluster is None or training.precision != "fp8":
        return []
    gpu = cluster.gpu_spec()
    name = gpu.name or str(cluster.gpu)
    if "fp8" not in gpu.tflops:
        return [Violation("fp8_needs_tensor_cores", "precision", "fp8", f"the {name} has no FP8 tensor cores (needs "
                          "Ada, Hopper or Blackwell)", "use --precision bf16")]
    if training.fp8_recipe == "mxfp8" and not name.upper().startswith(("B", "GB")):
        return [Violation("mxfp8_needs_blackwell", "fp8_recipe", "mxfp8", f"needs Blackwell (SM100) GPUs, not {name}",
                          "use the tensorwise recipe")]
    return []


def setup_violations(training: TrainingSpec, cluster: ClusterSpec | None) -> list[Violation]:
    """The rules the training setup breaks on this cluster whatever the layout (FP8 on the GPU): the search checks
    them once, before it enumerates layouts it then trusts; layout_violations includes them."""
    return _fp8_rules(training, cluster)


def refuse_unrunnable_setup(training: TrainingSpec, cluster: ClusterSpec | None) -> None:
    """Raise `SetupError` (exit 3) when no layout can run the setup on this cluster (setup_violations)."""
    from planner.errors import SetupError

    bad = setup_violations(training, cluster)
    if bad:
        raise SetupError("; ".join(f"{v} ({v.fix})" for v in bad))


def layout_violations(layout: LayoutSpec, model: ModelSpec, training: TrainingSpec,
                      cluster: ClusterSpec | None = None, *, allow_tp_across_nodes: bool = False) -> list[Violation]:
    """Every rule a layout breaks, in a fixed order (degrees, sequence parallelism, placement, batch, schedule,
    model states, split)."""
    return [*_degree_rules(layout, model, cluster),
            *_sequence_parallel_rules(layout, training),
            *_placement_rules(layout, model, cluster, allow_tp_across_nodes),
            *_batch_rules(layout, training),
            *_schedule_rules(layout, model),
            *_state_rules(layout),
            *_split_rules(layout, model),
            *_cp_rules(layout, model, training),
            *_ep_rules(layout, model),
            *setup_violations(training, cluster)]


def validate_layout(layout: LayoutSpec, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec | None = None,
                    *, allow_tp_across_nodes: bool = False) -> None:
    """Raise `InputError` (exit 3) with one line per violation."""
    from planner.errors import InputError

    found = layout_violations(layout, model, training, cluster, allow_tp_across_nodes=allow_tp_across_nodes)
    if found:
        raise InputError([str(v) for v in found], source="layout")
