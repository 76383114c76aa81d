"""A plan as launch settings the framework accepts: Megatron-LM arguments, Megatron-DeepSpeed arguments, a
DeepSpeed config, a torchtitan 0.3 Python recipe (or the <= 0.2 TOML), a torchrun line.

Each export follows the framework's startup validation rules (../shared/reference/frameworks.md §1.8, §2.7, §3.7).
A plan the framework cannot express exactly is moved to the nearest layout it can run (each change named, with
that layout's own prediction) or refused with the reason (SpecError, exit 3); nothing is dropped silently.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from cluster_specs import ClusterSpec, SpecError
from cluster_specs.limits import is_finite_number
from cost_models.step import stage_split
from planner.frameworks import Framework
from planner.frameworks.capabilities import TORCHTITAN_COMPILE_SECTION, capabilities
from planner.frameworks.megatron_split import MegatronSplitError, SplitFlags, nearest_split, split_setting
from planner.inputs.specs import LayoutSpec, ModelSpec, TrainingSpec
from planner.integrations.modern_flags import (
    deepspeed_settings,
    deepspeed_state_settings,
    megatron_args,
    megatron_state_args,
    nemo_settings,
    nemo_state_settings,
    refuse_states,
    torchtitan_settings,
)

GIB = 2**30
TORCHTITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B",
                        "zero_bubble": "ZBVZeroBubble"}
# torchtitan's shipped Llama-3 flavors (torchtitan/models/llama3/__init__.py, model_registry("8B") etc.)
# presets -> the flavors torchtitan 0.3 ships for them (model_registry(flavor) of torchtitan/models/<family>)
TORCHTITAN_FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"), "llama3-405b": ("llama3", "405B"),
                      "deepseek-v3": ("deepseek_v3", "671B"), "qwen3-30b-a3b": ("qwen3", "30B-A3B"),
                      "qwen3-235b-a22b": ("qwen3", "235B-A22B")}
TARGETS = ("megatron", "nemo", "megatron-deepspeed", "deepspeed", "torchtitan", "torchrun")


@dataclass
class PlanParts:
    layout: LayoutSpec
    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec | None
    headroom_bytes: float
    framework: str
    predicted: dict

    def problem(self, framework: str | None = None):
        """The plan's problem again, under `framework`'s execution profile (default: the plan's, as `plan
        --framework` used it), then what the cluster's calibration measured."""
        from planner.calibration import calibration_knobs
        from planner.estimate import Problem, problem_knobs

        if self.cluster is None:
            raise SpecError("plan JSON: inputs.cluster missing -> needed to predict the nearest expressible layout")
        knobs = problem_knobs(self.cluster, self.training, framework or self.framework, self.headroom_bytes,
                              calibration_knobs(self.cluster))
        return Problem(self.model, self.training, self.cluster, knobs)


@dataclass
class Export:
    text: str
    layout: LayoutSpec  # what the exported settings run (the plan's, or the nearest expressible one)
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the user must do outside the file
    predicted: dict | None = None


def with_fields(lay: LayoutSpec, fields: dict) -> LayoutSpec:
    """A copy with some fields changed, validated (enum fields stay enums)."""
    return LayoutSpec.model_validate({**lay.model_dump(), **fields})


PREDICTED_NUMBERS = ("memory_headroom_bytes", "step_time_seconds", "peak_memory_bytes_per_gpu")
"""The plan's predicted figures an export reads back (the headroom it re-plans with, the figures its header
compares with the nearest layout's)."""


def _finite_non_negative(x: object) -> bool:
    return is_finite_number(x) and x >= 0


def plan_parts(plan: dict, source: str = "plan JSON") -> PlanParts:
    from planner.inputs import plan_file

    parts = plan_file.plan_parts(plan, source)  # schemas and the layout rules: a hand-edited, invalid plan is refused
    predicted = plan.get("predicted") or {}
    if not isinstance(predicted, dict):
        raise SpecError(f"predicted: expected an object, got {type(predicted).__name__} (the output of `planner plan "
                        "--json`)", source=source)
    problems = [f"predicted.{key}: {predicted[key]!r} -> allowed: a finite number >= 0 (the output of `planner plan "
                "--json`)" for key in PREDICTED_NUMBERS if key in predicted and not _finite_non_negative(predicted[key])]
    if problems:
        raise SpecError(problems, source=source)
    from planner.estimate import DEFAULT_HEADROOM_GIB

    headroom = predicted.get("memory_headroom_bytes", DEFAULT_HEADROOM_GIB * GIB)
    return PlanParts(parts.layout, parts.model, parts.training, parts.cluster, headroom, plan.get("framework", "generic"),
                     predicted)


# ---- the nearest expressible layout ---------------------------------------------------------------------------


def _effective_split(lay: LayoutSpec, num_layers: int) -> list[int]:
    return list(lay.layers_per_stage) if lay.layers_per_stage else list(stage_split(num_layers, lay.pp))


def _fix_schedule(fw: Framework, lay: LayoutSpec, changes: list[str]) -> LayoutSpec:
    caps = capabilities(fw)
    if lay.pp == 1 or lay.schedule in caps.schedules:
        return lay
    to = "gpipe" if lay.schedule == "naive" and "gpipe" in caps.schedules else "1f1b"
    changes.append(f"schedule {lay.schedule} -> {to} ({caps.sources['schedules']})")
    return with_fields(lay, {"schedule": to, "virtual_stages": 1})


def _fix_split(fw: Framework, lay: LayoutSpec, model: ModelSpec, changes: list[str]) -> LayoutSpec:
    caps = capabilities(fw)
    if lay.pp == 1 or caps.uneven_split == "any":
        return lay
    want = _effective_split(lay, model.num_layers)
    if caps.uneven_split == "megatron":
        try:
            split_setting(model.num_layers, lay.pp, _virtual(lay), want)
            return lay  # the flags or a pipeline layout string build it
        except MegatronSplitError:
            pass
        try:
            got = nearest_split(model.num_layers, lay.pp, _virtual(lay), want)
        except MegatronSplitError as exc:
            raise SpecError(f"layers_per_stage: {exc}") from None
    elif lay.layers_per_stage is None:
        return lay
    else:
        got = list(stage_split(model.num_layers, lay.pp))
    if got == want:
        return lay
    changes.append(f"layers_per_stage {'/'.join(map(str, want))} -> {'/'.join(map(str, got))} "
                   f"({caps.sources['split']})")
    rps = lay.recompute_layers_per_stage
    if rps:
        rps = [min(r, n) for r, n in zip(rps, got, strict=True)]
    return with_fields(lay, {"layers_per_stage": got, "recompute_layers_per_stage": rps})


def _fix_recompute(fw: Framework, lay: LayoutSpec, changes: list[str]) -> LayoutSpec:
    caps = capabilities(fw)
    rps = lay.recompute_layers_per_stage
    if rps and caps.per_stage_recompute == "same_count" and (len(set(rps)) > 1 or lay.recompute != "none"):
        n = max(rps)
        counts = [min(n, c) for c in (lay.layers_per_stage or [n] * lay.pp)]
        changes.append(f"recompute_layers_per_stage {'/'.join(map(str, rps))} (base {lay.recompute}) -> {n} layers "
                       f"on every stage, base none ({caps.sources['recompute']})")
        lay = with_fields(lay, {"recompute": "none", "recompute_layers_per_stage": counts})
    elif rps and caps.per_stage_recompute == "none":
        changes.append(f"recompute_layers_per_stage {'/'.join(map(str, rps))} -> dropped, base recompute "
                       f"{lay.recompute} ({caps.sources['recompute']})")
        lay = with_fields(lay, {"recompute_layers_per_stage": None})
    if lay.recompute not in caps.recompute:
        changes.append(f"recompute {lay.recompute} -> none ({caps.sources['recompute']})")
        lay = with_fields(lay, {"recompute": "none"})
    return lay


def _fix_sharding(fw: Framework, lay: LayoutSpec, changes: list[str]) -> LayoutSpec:
    caps = capabilities(fw)
    if fw is Framework.TORCHTITAN and lay.pp == 1 and lay.zero_stage == 1:
        changes.append("zero_stage 1 -> 2 (torchtitan has no optimizer-only sharding; FSDP2 without resharding "
                       "after forward)")
        lay = with_fields(lay, {"zero_stage": 2})
    if lay.offload == "optimizer" and "optimizer" not in caps.offload:
        if lay.pp > 1:
            raise SpecError(f"offload: optimizer -> {fw.value} offloads parameters and optimizer together (FSDP2 CPU "
                            "offload), which needs pp = 1; plan with --framework " + fw.value)
        changes.append("offload optimizer -> optimizer+params with zero_stage 3 (FSDP2's CPUOffloadPolicy moves "
                       "parameters, gradients and optimizer state)")
        lay = with_fields(lay, {"offload": "optimizer+params", "zero_stage": 3})
    why = caps.offload_problem(lay.offload, lay.zero_stage)  # the rule `plan --framework` searched under
    if why:
        raise SpecError(f"{fw.value}: {why}; plan with --framework {fw.value}")
    if lay.sequence_parallel and (not caps.sequence_parallel or lay.schedule in caps.no_sp_schedules):
        changes.append(f"sequence_parallel -> off ({caps.sources['sp']})")
        lay = with_fields(lay, {"sequence_parallel": False})
    refusal = caps.hybrid_shard_refusal(lay.dp_shard, lay.zero_stage) if lay.hybrid_sharded and lay.dp_shard else None
    if refusal:
        changes.append(f"dp_shard {lay.dp_shard} -> every dp rank ({fw.value}: {refusal})")
        lay = with_fields(lay, {"dp_shard": None})
    return lay


def _refuse(fw: Framework, lay: LayoutSpec, model: ModelSpec, training: TrainingSpec) -> None:
    caps = capabilities(fw)
    if fw is Framework.DEEPSPEED and lay.tp > 1 and lay.pp > 1:
        raise SpecError(f"tp: {lay.tp} with pp {lay.pp} -> DeepSpeed's JSON has AutoTP but its pipeline engine does "
                        "not combine with it; export with --to megatron-deepspeed (tp and pp on its command line)")
    if fw is Framework.DEEPSPEED and lay.tp > 1 and lay.zero_stage not in caps.tensor_parallel_zero_stages:
        raise SpecError(f"tp: {lay.tp} with zero_stage {lay.zero_stage} -> {caps.sources['tp']}")
    vocab = caps.vocab_problem(model.vocab_size, lay.tp)
    if vocab:
        raise SpecError(f"{vocab}; plan with --framework {fw.value} (it then picks a tp that divides the vocabulary)")
    why = caps.precision_problem(training.precision, training.fp8_recipe)
    if why:
        raise SpecError(f"{why}; plan with --framework {fw.value}")
    why = caps.compile_problem(training.compile)
    if why:
        raise SpecError(f"{why}; plan without --compile, or export --to torchtitan")
    refuse_states(fw, lay, training)
    # the model itself: a launch that builds another model would make every predicted number wrong
    if fw is Framework.TORCHTITAN:
        _torchtitan_family(model)
    elif fw in (Framework.MEGATRON, Framework.MEGATRON_DEEPSPEED):
        why = _megatron_shape_refusal(model, deepspeed=fw is Framework.MEGATRON_DEEPSPEED)
        if why:
            raise SpecError(f"{why}; the exported launch would build another model: export --to nemo "
                            "(Megatron-Bridge's model providers), or describe a model the framework builds")


def nearest(fw: Framework, parts: PlanParts) -> tuple[LayoutSpec, list[str], dict | None]:
    """(layout the framework runs, the changes from the plan, its prediction when it differs from the plan's). A plan
    made for another framework's profile (a generic plan exported to torchtitan) is predicted again under the
    target's, as `check` of the file predicts it, and refused where it then does not fit even with full recompute:
    an export `check` then fails would be a launch that runs out of memory."""
    lay, model = parts.layout, parts.model
    changes: list[str] = []
    lay = _fix_schedule(fw, lay, changes)
    lay = _fix_sharding(fw, lay, changes)
    lay = _fix_split(fw, lay, model, changes)
    lay = _fix_recompute(fw, lay, changes)
    _refuse(fw, lay, model, parts.training)
    if not changes and parts.framework == fw.value:
        return lay, [], None
    from planner.contract import Predicted
    from planner.rules import layout_violations

    problem = parts.problem(fw.value)  # the nearest layout runs in the target framework: predicted as `check` reads it
    problems = layout_violations(lay, model, parts.training, parts.cluster, allow_tp_across_nodes=True)
    if problems:
        raise SpecError(f"{fw.value}: the nearest expressible layout {lay.short()} breaks a rule: {problems[0]}")
    pred = Predicted.from_estimate(problem.estimate(lay), parts.headroom_bytes).model_dump()
    if not pred["fits"] and lay.recompute != "full" and "full" in capabilities(fw).recompute:
        changes.append("recompute -> full (the nearest layout does not fit without it)")
        lay = with_fields(lay, {"recompute": "full", "recompute_layers_per_stage": None})
        pred = Predicted.from_estimate(problem.estimate(lay), parts.headroom_bytes).model_dump()
    if not pred["fits"]:
        what = (f"cannot express {parts.layout.short()} ({'; '.join(changes)}); the nearest layout {lay.short()}"
                if changes or lay != parts.layout else
                f"{lay.short()}, planned with the {parts.framework} profile, under {fw.value}'s")
        raise SpecError(f"{fw.value}: {what} needs {pred['peak_memory_bytes_per_gpu'] / GIB:.1f} GiB per GPU and does "
                        f"not fit: plan with --framework {fw.value}")
    if not changes and lay == parts.layout and _same_prediction(pred, parts.predicted):
        return lay, [], None
    return lay, changes, pred


def _same_prediction(new: dict, old: dict) -> bool:
    """The target's prediction equals the plan's (to 1e-9: the profiles agree on this layout)."""
    keys = ("step_time_seconds", "peak_memory_bytes_per_gpu")
    return all(k in old and abs(new[k] - old[k]) <= 1e-9 * max(1.0, abs(old[k])) for k in keys)


def _header(target: str, parts: PlanParts, exp: Export) -> list[str]:
    lines = [f"planner export for {target}: {exp.layout.short()}"]
    if not exp.changes and exp.predicted and parts.predicted:
        new, old = exp.predicted, parts.predicted
        lines.append(f"planned with the {parts.framework} profile; {target} runs it at {new['step_time_seconds']:.3g} "
                     f"s/step (plan {old['step_time_seconds']:.3g}), peak {new['peak_memory_bytes_per_gpu'] / GIB:.1f} "
                     f"GiB/GPU (plan {old['peak_memory_bytes_per_gpu'] / GIB:.1f}), as check of this file predicts")
    if exp.changes:
        old, new = parts.predicted, exp.predicted or {}
        lines.append(f"the plan ({parts.layout.short()}) cannot be expressed exactly; nearest expressible layout:")
        lines += [f"  - {c}" for c in exp.changes]
        if all(k in new and k in old for k in ("step_time_seconds", "peak_memory_bytes_per_gpu")):
            lines.append(f"  its prediction: {new['step_time_seconds']:.3g} s/step (plan {old['step_time_seconds']:.3g}), "
                         f"peak {new['peak_memory_bytes_per_gpu'] / GIB:.1f} GiB/GPU "
                         f"(plan {old['peak_memory_bytes_per_gpu'] / GIB:.1f})")
    return lines


# ---- Megatron-LM (and NeMo through the same flags) -------------------------------------------------------------


def _megatron_shape_refusal(model: ModelSpec, *, deepspeed: bool) -> str | None:
    """What of the model's shape Megatron-LM's (or, with `deepspeed`, Megatron-DeepSpeed's) arguments cannot build,
    or None. Megatron-LM: megatron/training/arguments.py and TransformerConfig (NVIDIA/Megatron-LM d98e8a64, 2026-08):
    --swiglu and --squared-relu are its gated and squared activations (--quick-geglu is a different GeLU), two norms a
    layer, LayerNorm or RMSNorm, learned/rope positions, --add-qkv-bias the only bias short of --add-bias-linear, and
    --window-size for every layer unless a per-layer pattern says which. Megatron-DeepSpeed (microsoft f4157bea,
    2024-12): no qk-norm, QKV bias or sliding window, and --position-embedding-type is not one of its options."""
    name = "Megatron-DeepSpeed" if deepspeed else "Megatron-LM"
    if model.mlp == "geglu":
        return f"mlp: geglu -> {name}'s flags build SwiGLU (--swiglu), not a gated GeLU"
    if model.norms_per_layer != 2:
        return f"norms_per_layer: {model.norms_per_layer} -> {name} builds two norms a layer"
    if model.norm == "nonparametric":
        return f"norm: nonparametric -> {name} builds LayerNorm or RMSNorm, with weights"
    if model.position_embedding == "alibi":
        return f"position_embedding: alibi -> {name}'s positions are learned or rotary"
    if model.attention_bias and not model.bias:
        return (f"attention_bias: true -> {name} has a bias on every Linear (--add-bias-linear) or "
                + ("none" if deepspeed else "on Q, K and V only (--add-qkv-bias)") + ", not on the attention's alone")
    if deepspeed and (model.qk_norm or (model.qkv_bias and not model.bias)):
        return f"{'qk_norm' if model.qk_norm else 'qkv_bias'}: true -> Megatron-DeepSpeed has no such option"
    window_layers = model.sliding_window_layers if model.sliding_window_layers is not None else model.num_layers
    if model.sliding_window is not None and window_layers:
        if deepspeed:
            return "sliding_window: -> Megatron-DeepSpeed has no sliding-window attention"
        if window_layers != model.num_layers:
            return (f"sliding_window_layers: {window_layers} of {model.num_layers} -> the planner knows how many "
                    "layers slide, not which (Megatron's --window-attn-skip-freq needs the pattern)")
    return None


def _megatron_shape_flags(model: ModelSpec, *, deepspeed: bool) -> list[tuple[str, object]]:
    """The flags for what differs from Megatron's default layer (kv_channels = hidden / heads, MHA, GeLU, LayerNorm,
    learned positions, full attention, tied embeddings, biases, dropout 0.1)."""
    kv = model.kv_heads != model.num_attention_heads
    flags: list[tuple[bool, list[tuple[str, object]]]] = [
        (model.head_dim is not None and model.mla is None
         and model.head_dim * model.num_attention_heads != model.hidden_size, [("--kv-channels", model.head_dim)]),
        (kv and deepspeed, [("--num-key-value-heads", model.kv_heads)]),
        (kv and not deepspeed, [("--group-query-attention", None), ("--num-query-groups", model.kv_heads)]),
        (model.mlp == "swiglu", [("--swiglu", None)]),
        (model.mlp == "relu2", [("--squared-relu", None)]),
        (model.norm == "rmsnorm", [("--normalization", "rmsnorm" if deepspeed else "RMSNorm")]),
        (model.qk_norm, [("--qk-layernorm", None)]),
        (model.position_embedding == "rope", [("--use-rotary-position-embeddings", None)] if deepspeed
         else [("--position-embedding-type", "rope")]),
        # (left, right) tokens, as Transformer Engine takes it
        (model.sliding_window is not None and model.sliding_window_layers != 0,
         [("--window-size", f"({model.sliding_window},0)")]),
        (not model.tied_embeddings, [("--untie-embeddings-and-output-weights", None)]),
        (not model.bias, [("--disable-bias-linear", None)]),
        (not model.bias and model.qkv_bias, [("--add-qkv-bias", None)]),
        (not model.dropout, [("--attention-dropout", 0.0), ("--hidden-dropout", 0.0)]),
    ]
    return [flag for applies, fs in flags if applies for flag in fs]


def _megatron_model_args(model: ModelSpec, training: TrainingSpec, *,
                         deepspeed: bool = False) -> list[tuple[str, object]]:
    """The model's shape as Megatron-LM's flags (Megatron-DeepSpeed's spellings with `deepspeed`: --num-key-value-heads,
    --normalization rmsnorm, --use-rotary-position-embeddings; its arguments.py at microsoft f4157bea). Dropout is set
    to the model's: both default to 0.1 (TransformerConfig hidden_dropout/attention_dropout), which a model without
    dropout does not run (the masks would cost memory the plan does not count). A shape the flags cannot build was
    refused before (_refuse, with _megatron_shape_refusal)."""
    args: list[tuple[str, object]] = [
        ("--num-layers", model.num_layers), ("--hidden-size", model.hidden_size),
        ("--ffn-hidden-size", model.ffn), ("--num-attention-heads", model.num_attention_heads),
        ("--seq-length", training.seq_length),
        # Megatron asserts max_position_embeddings >= seq_length for every position type (arguments.py validate_args);
        # past a rotary model's own it only sizes the RoPE table, and learned positions never get here
        # (ModelSpec.sequence_problem)
        ("--max-position-embeddings", max(model.max_position_embeddings or 0, training.seq_length)),
    ]
    args += _megatron_shape_flags(model, deepspeed=deepspeed)
    if training.precision in ("bf16", "fp16"):
        args.append((f"--{training.precision}", None))  # fp32 is Megatron's default: no flag
    return args


def _megatron_recompute(lay: LayoutSpec, *, deepspeed: bool, mla: bool = False) -> list[tuple[str, object]]:
    if lay.recompute_layers_per_stage:  # one count for every stage (same_count, ensured by nearest())
        return [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                ("--recompute-num-layers", max(lay.recompute_layers_per_stage))]
    if lay.recompute == "full":
        if deepspeed:  # Megatron-DeepSpeed: the pipe model reads --checkpoint-activations (frameworks.md §3.4)
            return [("--checkpoint-activations", None), ("--checkpoint-num-layers", 1)]
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    if lay.recompute == "selective":
        # on an MLA model the cost model's selective recomputes the up-projections (Megatron's mla_up_proj module,
        # what Megatron-Bridge's DeepSeek-V3 recipes run); elsewhere the default module, core_attn
        args: list[tuple[str, object]] = [("--recompute-granularity", "selective")]
        return args + ([("--recompute-modules", "mla_up_proj")] if mla else [])
    return []


def _megatron_sharding(lay: LayoutSpec) -> list[tuple[str, object]]:
    if lay.zero_stage == 1:
        args: list[tuple[str, object]] = [("--use-distributed-optimizer", None)]
        if lay.hybrid_sharded:  # the partial distributed optimizer: R instances over dp / R ranks each
            args.append(("--num-distributed-optimizer-instances", lay.dp_replicas))
    elif lay.zero_stage in (2, 3):  # Megatron-FSDP (frameworks.md §2.5, §2.7 rules 7-9)
        strategy = "optim_grads" if lay.zero_stage == 2 else "optim_grads_params"
        args = [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", strategy),
                ("--ckpt-format", "fsdp_dtensor"), ("--no-gradient-accumulation-fusion", None)]
    else:
        args = []
    if lay.offload == "optimizer":
        args += [("--optimizer-cpu-offload", None), ("--use-precision-aware-optimizer", None),
                 ("--optimizer-offload-fraction", 1.0)]
    return args


def _megatron_overlap(lay: LayoutSpec) -> list[tuple[str, object]]:
    """The overlap the Megatron profile predicts with, which Megatron-LM leaves off by default (frameworks.md §2.6):
    the gradient reduce behind backward, the distributed optimizer's / Megatron-FSDP's parameter gather behind
    forward (needs --overlap-grad-reduce), the TP collectives with TE userbuffers (needs --sequence-parallel).
    The pipeline's send/receive overlap is on by default with virtual stages (and forced off without them)."""
    args: list[tuple[str, object]] = []
    if lay.dp * lay.cp > 1:
        args.append(("--overlap-grad-reduce", None))
        if lay.zero_stage >= 1:
            args.append(("--overlap-param-gather", None))
    if lay.tp > 1 and lay.sequence_parallel:
        args.append(("--tp-comm-overlap", None))
    return args


def _virtual(lay: LayoutSpec) -> int:
    return lay.virtual_stages if lay.schedule == "interleaved_1f1b" else 1


def megatron_split_of(lay: LayoutSpec, model: ModelSpec) -> SplitFlags | str:
    """The Megatron flags, or else the pipeline layout string, that build the layout's stage split
    (planner/frameworks/megatron_split.py)."""
    try:
        return split_setting(model.num_layers, lay.pp, _virtual(lay), _effective_split(lay, model.num_layers))
    except MegatronSplitError as exc:
        raise SpecError(f"layers_per_stage: {exc}") from None


def _megatron_pipeline(lay: LayoutSpec, model: ModelSpec) -> list[tuple[str, object]]:
    flags = megatron_split_of(lay, model)
    if isinstance(flags, str):  # it names the virtual stages too: no other split or VPP flag (§2.3)
        return [("--pipeline-model-parallel-layout", flags)]
    args: list[tuple[str, object]] = []
    if _virtual(lay) > 1:
        # not --num-layers-per-virtual-pipeline-stage: it cannot be combined with the first/last flags (§2.3)
        args.append(("--num-virtual-stages-per-pipeline-rank", lay.virtual_stages))
    if flags.first is not None:
        args += [("--decoder-first-pipeline-num-layers", flags.first),
                 ("--decoder-last-pipeline-num-layers", flags.last)]
    args += [("--account-for-embedding-in-pipeline-split", None)] if flags.embedding else []
    args += [("--account-for-loss-in-pipeline-split", None)] if flags.loss else []
    return args


def _env_lines(lay: LayoutSpec, cluster: ClusterSpec | None) -> list[str]:
    gpu = (cluster.gpu if cluster is not None else "") or ""
    blackwell = any(tag in str(gpu).upper() for tag in ("B100", "B200", "GB200", "B300"))
    if lay.zero_stage >= 2:
        return ["export CUDA_DEVICE_MAX_CONNECTIONS=8  # Megatron-FSDP asserts it is not 1 (frameworks.md §2.7 rule 7)"]
    if lay.tp > 1 and not blackwell:
        return ["export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron asserts it with tp > 1 before Blackwell "
                "(frameworks.md §2.7 rule 7)"]
    return []


def to_megatron(parts: PlanParts, lay: LayoutSpec, *, deepspeed: bool = False) -> tuple[str, list[str]]:
    model, training = parts.model, parts.training
    args: list[tuple[str, object]] = [
        ("--tensor-model-parallel-size", lay.tp), ("--pipeline-model-parallel-size", lay.pp),
        ("--micro-batch-size", lay.micro_batch_size), ("--global-batch-size", training.global_batch_size),
    ]
    args += _megatron_model_args(model, training, deepspeed=deepspeed)
    if lay.sequence_parallel:
        args.append(("--sequence-parallel", None))
    if deepspeed:
        args += [("--deepspeed", None), ("--deepspeed_config", "ds_config.json"), ("--zero-stage", lay.zero_stage)]
        if lay.pp == 1:
            args.append(("--no-pipeline-parallel", None))
        if lay.pp > 1 and lay.schedule == "zero_bubble":
            args.append(("--enable-zbh1-pipeline", None))
        if lay.offload != "none":
            args.append(("--cpu-optimizer", None))
    else:
        args += _megatron_sharding(lay) + _megatron_overlap(lay) + _megatron_pipeline(lay, model)
        args += megatron_state_args(lay, training)
    args += _megatron_recompute(lay, deepspeed=deepspeed, mla=model.mla is not None)
    args += [a for a in megatron_args(lay, model, training, deepspeed=deepspeed)
             if a[0] != "--bf16" or ("--bf16", None) not in args]
    env = _env_lines(lay, parts.cluster) if not deepspeed else []
    notes = [f"environment: {e}" for e in env]
    if deepspeed:
        notes.append("ds_config.json: `planner export PLAN --to deepspeed --framework megatron-deepspeed -o "
                     "ds_config.json` (ZeRO, offload and the batch triad live there)")
    body = [f"# {e}" for e in env]
    body += [name if value is None else f"{name} {shlex.quote(str(value))}" for name, value in args]
    return "\n".join(body), notes


def to_nemo(parts: PlanParts, lay: LayoutSpec) -> tuple[str, list[str]]:
    """Megatron-Bridge `run_recipe.py` overrides (the NeMo 2 successor; frameworks.md §4.1-4.2), one per line."""
    training = parts.training
    kv: list[tuple[str, object]] = [
        ("model.tensor_model_parallel_size", lay.tp), ("model.pipeline_model_parallel_size", lay.pp),
        ("model.virtual_pipeline_model_parallel_size", lay.virtual_stages if lay.virtual_stages > 1 else None),
        ("model.sequence_parallel", lay.sequence_parallel), ("train.micro_batch_size", lay.micro_batch_size),
        ("train.global_batch_size", training.global_batch_size), ("dataset.seq_length", training.seq_length),
        *nemo_settings(lay, parts.model, training),  # mixed_precision (FP8 recipe), CP, EP
        ("ddp.use_distributed_optimizer", lay.zero_stage == 1),
    ]
    if lay.zero_stage == 1 and lay.hybrid_sharded:  # the partial distributed optimizer (as _megatron_sharding)
        kv.append(("ddp.num_distributed_optimizer_instances", lay.dp_replicas))
    if lay.pp > 1:
        # mcore raises a ValueError for pp > 1 without it (model_parallel_config.py L527-531, frameworks.md §4.4):
        # the dtype of the activations the stages send, BF16 under an FP8 recipe too
        kv.append(("model.pipeline_dtype", PIPELINE_DTYPE[training.precision]))
    flags = megatron_split_of(lay, parts.model)
    if isinstance(flags, str):  # quoted: the override parser reads '|', '*' and '(' unquoted as its own syntax
        kv.append(("model.pipeline_model_parallel_layout", f'"{flags}"'))
        flags = SplitFlags()
    if flags.first is not None:
        kv += [("model.num_layers_in_first_pipeline_stage", flags.first),
               ("model.num_layers_in_last_pipeline_stage", flags.last)]
    kv += [("model.account_for_embedding_in_pipeline_split", True)] if flags.embedding else []
    kv += [("model.account_for_loss_in_pipeline_split", True)] if flags.loss else []
    if lay.zero_stage >= 2:
        kv += [("ddp.use_megatron_fsdp", True),
               ("ddp.data_parallel_sharding_strategy", "optim_grads" if lay.zero_stage == 2 else "optim_grads_params"),
               ("checkpoint.ckpt_format", "fsdp_dtensor")]
    if lay.offload == "optimizer":
        kv += [("optimizer.optimizer_cpu_offload", True), ("optimizer.optimizer_offload_fraction", 1.0)]
    for flag, value in _megatron_recompute(lay, deepspeed=False, mla=parts.model.mla is not None):
        kv.append((f"model.{flag[2:].replace('-', '_')}", f"[{value}]" if flag == "--recompute-modules" else value))
    states, notes = nemo_state_settings(lay, training)
    kv += states
    lines = [f"{k}={_override(v)}" for k, v in kv]
    run = "run: torchrun ... scripts/training/run_recipe.py --recipe <recipe> $(grep -v '^#' FILE)"
    return "\n".join(lines), notes + [run]


def _override(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


# ---- DeepSpeed ----------------------------------------------------------------------------------------------


def to_deepspeed(parts: PlanParts, lay: LayoutSpec, *, megatron: bool = False) -> tuple[str, list[str]]:
    """DeepSpeed's JSON with only keys DeepSpeed reads (runtime/config.py); the triad over the DP degree (§3.2)."""
    training = parts.training
    modern = deepspeed_settings(lay, parts.model, training)  # Ulysses degree, or a refusal for EP/FP8/ring CP
    zero: dict = {"stage": lay.zero_stage, "contiguous_gradients": True}
    if lay.zero_stage >= 1 and not megatron:
        # the overlap the DeepSpeed profile predicts ZeRO-1/2 with (DeepSpeed's default turns it on only at ZeRO-3);
        # Megatron-DeepSpeed's profile hides no DP traffic (its pipeline engine reduces after the flush), so its
        # config keeps DeepSpeed's default
        zero["overlap_comm"] = True
    if lay.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if lay.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config: dict = {
        "train_batch_size": training.global_batch_size,
        "train_micro_batch_size_per_gpu": lay.micro_batch_size,
        "gradient_accumulation_steps": lay.num_micro_batches,
        "zero_optimization": zero,
        "gradient_clipping": 1.0,
        **modern,
    }
    config.update(_deepspeed_precision(lay, training))
    notes = []
    if not megatron:
        if lay.tp > 1:
            config["tensor_parallel"] = {"autotp_size": lay.tp}
        if lay.pp > 1:
            notes.append(f"pipeline: build the model as PipelineModule(layers, num_stages={lay.pp}, "
                         "partition_method='uniform'); DeepSpeed's JSON has no pipeline degree (check it with --pp "
                         f"{lay.pp})")
            if lay.recompute == "full":
                config["pipeline"] = {"activation_checkpoint_interval": 1}
        elif lay.recompute == "full":
            notes.append("activation checkpointing: the JSON cannot turn it on; checkpoint every layer in model code "
                         "(HF Trainer: gradient_checkpointing=True); check it with --fix recompute=full")
    return json.dumps(config, indent=2), notes


def _deepspeed_precision(lay: LayoutSpec, training: TrainingSpec) -> dict:
    """The bf16 or fp16 section, with the bf16 master weights and moments a plan keeps (Megatron-DeepSpeed's plans
    keep fp32 ones: refuse_states refused the others before)."""
    states = deepspeed_state_settings(lay, training)  # refuses states below fp32 without a bf16 model
    if training.precision == "fp16":
        return {"fp16": {"enabled": True, "loss_scale": 0}}
    return {"bf16": {"enabled": True, **states}} if training.precision == "bf16" else {}


# ---- torchtitan -----------------------------------------------------------------------------------------------


def _torchtitan_parallelism(lay: LayoutSpec, model: ModelSpec, head: str) -> dict:
    # HSDP: FSDP over the shard group, dp_replicas copies of it; without ZeRO, plain replication (DDP)
    replicate = lay.dp_replicas if lay.zero_stage >= 1 else lay.dp
    shard = lay.dp // replicate
    par: dict = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
                 "tensor_parallel_degree": lay.tp, "pipeline_parallel_degree": lay.pp}
    if lay.tp > 1:
        par["enable_sequence_parallel"] = lay.sequence_parallel
    if lay.zero_stage == 2:
        par["fsdp_reshard_after_forward"] = "never"
    elif lay.zero_stage == 3:
        par["fsdp_reshard_after_forward"] = "default"  # True without PP (frameworks.md §1.6)
    if lay.pp > 1:
        par["pipeline_parallel_schedule"] = TORCHTITAN_SCHEDULES[lay.schedule]
        par["pipeline_parallel_microbatch_size"] = lay.micro_batch_size
        par.update(_torchtitan_split(lay, model, head))
    return par


def torchtitan_stage_layers(lay: LayoutSpec, num_layers: int) -> list[int]:
    """Layers of each torchtitan stage in stage order: per-rank counts split over the rank's local stages."""
    per_rank = _effective_split(lay, num_layers)
    if lay.schedule == "interleaved_1f1b":
        v = lay.virtual_stages
        if lay.layers_per_stage is None:
            return [num_layers // (lay.pp * v)] * (lay.pp * v)
        # loop placement: stage s on rank s mod pp; a rank's layers split as evenly as its chunks allow
        chunks = [list(stage_split(n, v)) for n in per_rank]
        return [chunks[s % lay.pp][s // lay.pp] for s in range(lay.pp * v)]
    if lay.schedule == "zero_bubble":  # ZBV: rank r holds stages r and 2pp-1-r (frameworks.md §1.4)
        stages = [0] * (2 * lay.pp)
        for r, n in enumerate(per_rank):
            stages[r], stages[2 * lay.pp - 1 - r] = n - n // 2, n // 2
        return stages
    return per_rank


def _torchtitan_split(lay: LayoutSpec, model: ModelSpec, head: str) -> dict:
    """Layers per stage as torchtitan takes them; an uneven split as module names per stage (the output projection
    is `lm_head` in 0.3's Decoder, `output` in <= 0.2's Transformer)."""
    stages = torchtitan_stage_layers(lay, model.num_layers)
    if min(stages) < 1:
        raise SpecError(f"layers_per_stage: {stages} -> every torchtitan stage needs >= 1 layer")
    if len(set(stages)) == 1:
        # no embedding/output allowance: the plan's split, not torchtitan's default one-layer discount (§1.4)
        return {"pipeline_parallel_layers_per_stage": stages[0], "pipeline_parallel_first_stage_less_layers": 0,
                "pipeline_parallel_last_stage_less_layers": 0}
    parts, start = [], 0
    for i, n in enumerate(stages):
        names = [f"layers.{j}" for j in range(start, start + n)]
        start += n
        if i == 0:
            names.insert(0, "tok_embeddings")
        if i == len(stages) - 1:
            names += ["norm", head]
        parts.append(names)
    return {"module_fqns_per_model_part": parts}


PIPELINE_DTYPE = {"bf16": "torch.bfloat16", "fp8": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}
"""Megatron-Core's pipeline_dtype (the dtype of the tensors pipeline stages send) per training precision: FP8
recipes keep BF16 activations between the layers (TE casts inside each Linear)."""


def _torchtitan_training(lay: LayoutSpec, training: TrainingSpec) -> dict:
    local = lay.micro_batch_size * lay.num_micro_batches if lay.pp > 1 else lay.micro_batch_size
    train: dict = {"local_batch_size": local, "global_batch_size": training.global_batch_size,
                   "seq_len": training.seq_length,
                   "mixed_precision_param": {"bf16": "bfloat16", "fp32": "float32",
                                             "fp8": "bfloat16"}[training.precision]}
    if lay.offload == "optimizer+params":
        train["enable_cpu_offload"] = True
    return train


def _torchtitan_family(model: ModelSpec) -> str:
    """The torchtitan 0.3 model family (torchtitan/models/<family>) whose builder makes this shape, or a SpecError
    naming what none makes. Every family there is a pre-norm decoder of two RMSNorms a layer, bias-free Linears, a
    SwiGLU MLP and rotary positions, without sliding windows; llama3's builder (_build_llama3_layers) derives head_dim
    = dim / n_heads and has no qk-norm or MoE; qwen3's (_build_qwen3_layers, _build_qwen3_moe_layers) takes head_dim,
    always norms q and k, and routes without shared experts or dense layers; deepseek_v3's builds MLA with MoE."""
    window = model.sliding_window is not None and model.sliding_window_layers != 0
    for bad, what in ((model.mlp != "swiglu", f"mlp {model.mlp}"), (model.norm != "rmsnorm", f"norm {model.norm}"),
                      (model.norms_per_layer != 2, f"{model.norms_per_layer} norms a layer"),
                      (model.position_embedding != "rope", f"{model.position_embedding} positions"),
                      (model.bias or model.qkv_bias or model.attention_bias, "Linear biases"),
                      (window, "sliding-window attention")):
        if bad:
            raise SpecError(f"model: {what} -> torchtitan 0.3's model families (llama3, qwen3, deepseek_v3) build "
                            "SwiGLU, two RMSNorms a layer, rotary positions, no biases and no sliding window; "
                            "export --to megatron or --to nemo")
    if model.mla is not None:
        return "deepseek_v3"
    moe = model.moe
    if model.qk_norm:
        if moe is not None and (moe.shared_expert_ffn_hidden_size or moe.num_dense_layers):
            raise SpecError("moe: shared experts or dense layers with qk-norm -> torchtitan's qwen3 MoE routes every "
                            "layer without shared experts; export --to megatron")
        return "qwen3"
    if moe is not None:
        raise SpecError("moe: routed experts without MLA or qk-norm -> torchtitan 0.3 builds MoE in deepseek_v3 (MLA) "
                        "and qwen3 (qk-norm) only; export --to megatron")
    if model.head_dim is not None and model.head_dim * model.num_attention_heads != model.hidden_size:
        raise SpecError(f"head_dim: {model.head_dim} -> torchtitan's llama3 derives head_dim = dim / n_heads "
                        f"({model.hidden_size // model.num_attention_heads}); export --to megatron")
    return "llama3"


def _torchtitan_flavor(model: ModelSpec) -> tuple[str, str, list[str]]:
    """(family, flavor, notes): a flavor torchtitan ships, or what to register, with every field the family's builder
    needs for the planned shape (its FFN width is the final hidden_dim, as the 0.3 builders take it)."""
    if model.name in TORCHTITAN_FLAVORS:
        name, flavor = TORCHTITAN_FLAVORS[model.name]
        return name, flavor, []
    family = _torchtitan_family(model)
    dims = (f"dim={model.hidden_size}, n_layers={model.num_layers}, n_heads={model.num_attention_heads}, "
            f"n_kv_heads={model.kv_heads}, vocab_size={model.vocab_size}, hidden_dim={model.ffn}, "
            f"enable_weight_tying={model.tied_embeddings}")
    if family == "qwen3":
        dims += f", head_dim={model.head_dim or model.hidden_size // model.num_attention_heads}"
    if model.moe is not None:
        moe = model.moe
        dims += (f", num_experts={moe.num_experts}, top_k={moe.top_k}, moe_hidden_dim={moe.expert_ffn_hidden_size}, "
                 f"shared_experts_hidden_dim={moe.shared_expert_ffn_hidden_size}, n_dense_layers={moe.num_dense_layers}")
    if model.mla is not None:
        mla = model.mla
        dims += (f", q_lora_rank={mla.q_lora_rank or 0}, kv_lora_rank={mla.kv_lora_rank}, "
                 f"qk_nope_head_dim={mla.qk_nope_head_dim}, qk_rope_head_dim={mla.qk_rope_head_dim}, "
                 f"v_head_dim={mla.v_head_dim}")
    return family, model.name, [f"torchtitan ships no flavor {model.name!r}: register it in "
                                f"torchtitan/models/{family} with {dims}"]


def to_torchtitan(parts: PlanParts, lay: LayoutSpec) -> tuple[str, list[str]]:
    """torchtitan 0.3: a Python module with one function returning Trainer.Config (frameworks.md §1.1)."""
    par, train = _torchtitan_parallelism(lay, parts.model, "lm_head"), _torchtitan_training(lay, parts.training)
    modern, float8 = torchtitan_settings(lay, parts.model, parts.training)
    par.update(modern)
    if lay.pp > 1:
        train["disable_cuda_graphs"] = True  # Trainer.Config raises for CUDA graphs with pp > 1 (§1.4)
    name, flavor, notes = _torchtitan_flavor(parts.model)
    if float8:
        notes.append(f"float8: add converters=[Float8LinearConverter.Config(recipe_name={float8['recipe_name']!r}, "
                     "filter_fqns=['lm_head', 'router.gate'])] to the model config (frameworks.md §1.9); check reads it "
                     "from this file once it is there")
    # 0.3's AC is a policy object (frameworks.md §1.5; torchtitan/distributed/activation_checkpoint.py): None turns
    # it off; the Trainer's default is SelectiveAC (per-op)
    policy = {"none": None, "full": "FullAC", "selective": "SelectiveAC"}[lay.recompute]
    if lay.recompute == "selective":
        notes.append("recompute selective -> torchtitan's per-op SAC, which --framework torchtitan predicts "
                     "(cost_models/op_sac.py); a plan made for another framework's selective (Megatron's core "
                     "attention) predicted more memory and less time: re-run estimate --framework torchtitan")

    def kwargs(d: dict, indent: str) -> str:
        return "".join(f"\n{indent}{k}={v!r}," for k, v in d.items())

    compiled = parts.training.compile
    text = (
        f"from torchtitan.config import {'CompileConfig, ' if compiled else ''}ParallelismConfig, TrainingConfig\n"
        + (f"from torchtitan.distributed.activation_checkpoint import {policy}\n" if policy else "")
        + f"from torchtitan.models.{name} import model_registry\n"
        "from torchtitan.trainer import Trainer\n\n\n"
        "def planner_job() -> Trainer.Config:\n"
        "    return Trainer.Config(\n"
        f"        model_spec=model_registry({flavor!r}),\n"
        f"        training=TrainingConfig({kwargs(train, ' ' * 12)}\n        ),\n"
        f"        parallelism=ParallelismConfig({kwargs(par, ' ' * 12)}\n        ),\n"
        f"        activation_checkpoint={f'{policy}.Config()' if policy else None},\n"
        + (f"        compile=CompileConfig({kwargs(TORCHTITAN_COMPILE_SECTION, ' ' * 12)}\n        ),\n"
           if compiled else "")
        + "    )\n"
    )
    notes.append(f"run: NGPU={lay.num_gpus} torchrun ... -m torchtitan.train --module <this module> --config planner_job")
    return text, notes


def to_torchtitan_toml(parts: PlanParts, lay: LayoutSpec) -> tuple[str, list[str]]:
    """torchtitan <= 0.2.2: the TOML job file (frameworks.md §1.1)."""
    par, train = _torchtitan_parallelism(lay, parts.model, "output"), _torchtitan_training(lay, parts.training)
    modern, float8 = torchtitan_settings(lay, parts.model, parts.training)
    par.update(modern)
    name, flavor, notes = _torchtitan_flavor(parts.model)
    ac: dict = {"mode": lay.recompute}
    if lay.recompute == "selective":
        ac["selective_ac_option"] = "op"
    lines = []
    model_section = {"name": name, "flavor": flavor} | ({"converters": ["float8"]} if float8 else {})
    sections = [("model", model_section), ("training", train), ("parallelism", par), ("activation_checkpoint", ac)]
    if parts.training.compile:
        sections.append(("compile", TORCHTITAN_COMPILE_SECTION))
    if float8:
        sections.append(("quantize.linear.float8", float8))
    for section, values in sections:
        lines.append(f"\n[{section}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines).lstrip("\n"), notes


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


# ---- torchrun -------------------------------------------------------------------------------------------------


def to_torchrun(parts: PlanParts, *, program: str | None = None, program_args: str | None = None,
                plan_path: str = "plan.json") -> str:
    lay, cluster = parts.layout, parts.cluster
    nodes = cluster.num_nodes if cluster is not None else 1
    gpn = cluster.gpus_per_node if cluster is not None else lay.num_gpus
    if nodes * gpn != lay.num_gpus:
        raise SpecError(f"plan: {nodes} nodes x {gpn} GPUs != dp*tp*pp = {lay.num_gpus}")
    # the plan path is the benchmark's argument; another program gets only the arguments it is given
    tail = program_args if program_args is not None else (shlex.quote(plan_path) if program is None else "")
    prog = program or "-m planner.bench"
    return (
        "# planner export for torchrun: run this same line on every node; fill in the rendezvous values\n"
        f"torchrun --nnodes={nodes} --nproc-per-node={gpn} \\\n"
        '  --rdzv-backend=c10d --rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT:-29500}" --rdzv-id="${JOB_ID}" \\\n'
        f"  {prog}{' ' + tail if tail else ''}\n"
    )


# ---- entry point ----------------------------------------------------------------------------------------------


FORMATS = {  # --to -> (framework whose capabilities apply, writer)
    "megatron": Framework.MEGATRON, "nemo": Framework.NEMO, "megatron-deepspeed": Framework.MEGATRON_DEEPSPEED,
    "deepspeed": Framework.DEEPSPEED, "torchtitan": Framework.TORCHTITAN,
}


def export(plan: dict, to: str | None = None, *, framework: str | None = None, torchtitan_format: str = "python",
           program: str | None = None, program_args: str | None = None, plan_path: str = "plan.json") -> Export:
    parts = plan_parts(plan)
    target = _target(to, framework, parts.framework)
    if target == "torchrun":
        return Export(to_torchrun(parts, program=program, program_args=program_args, plan_path=plan_path),
                      parts.layout)
    # DeepSpeed JSON for Megatron-DeepSpeed: tp and pp are on Megatron's command line, so its rules apply
    fw = Framework.MEGATRON_DEEPSPEED if (target == "deepspeed" and framework == "megatron-deepspeed") \
        else FORMATS[target]
    lay, changes, pred = nearest(fw, parts)
    exp = Export("", lay, changes, [], pred)
    if target == "megatron":
        body, exp.notes = to_megatron(parts, lay)
    elif target == "nemo":
        body, exp.notes = to_nemo(parts, lay)
    elif target == "megatron-deepspeed":
        body, exp.notes = to_megatron(parts, lay, deepspeed=True)
    elif target == "deepspeed":
        body, exp.notes = to_deepspeed(parts, lay, megatron=fw is Framework.MEGATRON_DEEPSPEED)
        exp.notes = _header(target, parts, exp)[1:] + exp.notes  # JSON has no comments: the caller prints these
        exp.text = body + "\n"
        return exp
    elif torchtitan_format == "toml":
        body, exp.notes = to_torchtitan_toml(parts, lay)
    else:
        body, exp.notes = to_torchtitan(parts, lay)
    header = _header(target, parts, exp) + [f"note: {n}" for n in exp.notes if not n.startswith("environment")]
    exp.text = "\n".join(f"# {h}" for h in header) + "\n" + body + "\n"
    return exp


def _target(to: str | None, framework: str | None, plan_framework: str) -> str:
    if to is None:
        to = framework if framework not in (None, "generic") else plan_framework
        if to in (None, "generic"):
            raise SpecError(f"--to: missing -> the plan names no framework; allowed: {', '.join(TARGETS)}")
    if to not in TARGETS:
        raise SpecError(f"--to: {to!r} -> allowed: {', '.join(TARGETS)}")
    if framework not in (None, "generic", to) and to != "torchrun" \
            and not (to == "deepspeed" and framework == "megatron-deepspeed"):
        raise SpecError(f"--framework {framework} and --to {to} disagree -> give one of them")
    return to
