"""Config readers for `planner check`: each reads a framework's config with that framework's defaults and semantics
(../shared/reference/frameworks.md; the section is cited at each default) into a `ConfigView`.

Formats: plan JSON; DeepSpeed JSON (also with Hugging Face Trainer "auto" values); torchtitan TOML (<= 0.2) and
Python recipe modules (0.3, read with `ast`, never executed); Megatron-LM / Megatron-DeepSpeed argument files and
launch scripts (shell variables expanded); Megatron-Bridge (NeMo) key=value overrides and override YAML, and
NeMo-Framework-Launcher (NeMo 1.x) training YAML (planner/integrations/nemo_yaml.py).
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from cluster_specs import SpecError
from cluster_specs.limits import is_int_at_least
from cost_models.inputs import REDUCE_BUCKET_ELEMENTS, ZERO3_MAX_REUSE_DISTANCE_ELEMENTS, Zero0Optimizer
from cost_models.memory import NORM_FP32_UPCAST_BYTES_PER_ELEMENT
from cost_models.step import stage_split
from planner.frameworks import Framework
from planner.frameworks.capabilities import TORCHTITAN, capabilities
from planner.frameworks.megatron_split import (
    MegatronSplitError,
    SplitFlags,
    layout_stage_layers,
    parse_layout,
    shorten,
    stage_layers,
)
from planner.frameworks.profiles import (
    COMPILED_ELEMENTWISE_SHARE,
    deepspeed_bf16_optimizer,
)
from planner.integrations.modern_flags import NEMO_FP8_MIXED_PRECISION
from planner.integrations.shell import ShellError, ShellRead, read_script, refusals, statements, unexpanded


@dataclass
class ConfigView:
    """What a config says, read with its framework's defaults (None where neither the config nor a default says)."""

    format: str
    framework: Framework
    fields: dict
    global_batch_size: int | None = None
    seq_length: int | None = None
    precision: str | None = None
    # where `precision` is not written in the config but its framework's default (DeepSpeed without an enabled bf16 or
    # fp16 section: fp32): which default, said in a note; --precision overrides such a precision (check._precision)
    precision_default: str = ""
    model: dict = field(default_factory=dict)  # num_layers, hidden_size, num_attention_heads, ... as the config says
    notes: list[str] = field(default_factory=list)
    errors: list[tuple[str, str, str]] = field(default_factory=list)  # (rule, message, hint): the framework refuses
    stage_layers: list[int] | None = None  # torchtitan: layers per pipeline stage, in stage order, when known
    layers_per_chunk: int | None = None
    recompute_every: int | None = None  # torchtitan v0.2.2 layer SAC: every N-th block is recomputed
    triad: dict = field(default_factory=dict)  # DeepSpeed: the batch keys as written (None = missing, "auto")
    fp8_recipe: str | None = None  # with precision fp8: the scaling recipe the config names (cost_models/fp8.py)
    fp8_param_gather: bool | None = None  # FP8 parameter all-gather as the config sets it (None: the default)
    # the gradient buffer's and optimizer states' dtypes where the config sets them (TrainingSpec fields grad_dtype,
    # master_dtype, exp_avg_dtype, exp_avg_sq_dtype; planner/integrations/modern_flags.py writes them), and the
    # gradient reduce's (grad_reduce_dtype: DeepSpeed's communication_data_type)
    optimizer_states: dict[str, str] = field(default_factory=dict)
    # knobs the config sets below its framework's profile: communication it leaves exposed that the profile assumes
    # hidden, a compiled model's elementwise traffic: knob -> (value, why); HIDDEN_SQUARED where the value is the
    # model's hidden size squared (the Hugging Face Trainer's "auto" bucket), which check resolves with the model
    knobs: dict[str, tuple[float | str | tuple[float, ...] | Zero0Optimizer, str]] = field(default_factory=dict)
    # a memory remedy as the config would say it, where the layout change check tries reads otherwise in it:
    # "zero_stage=1" -> "drop data_types.grad_accum_dtype ..." for a config read as DeepSpeed's BF16_Optimizer (only
    # an engine reading sets them, so check drops them with engine_knobs)
    remedy_names: dict[str, str] = field(default_factory=dict)
    # what the reader read as its framework's engine of today decides it (DeepSpeed 0.19.8 picking BF16_Optimizer):
    # the knobs so set, and the layout fields as the config wrote them; checked under another framework's profile
    # (--framework megatron-deepspeed: DeepSpeed of 2022) those knobs are dropped and the fields restored
    engine_knobs: set[str] = field(default_factory=set)
    engine_fields: dict = field(default_factory=dict)


def read_config(path: Path, *, gpus: int, overrides: dict | None = None, global_batch_size: int | None = None,
                config_function: str | None = None) -> ConfigView:
    """The config at `path`, by its suffix and content; `config_function` names the function to read of a torchtitan
    Python module that holds several (check --config-function)."""
    from cluster_specs.reading import parse_json, parse_toml, parse_yaml, read_text

    text = read_text(path)
    suffix = path.suffix.lower()
    over = dict(overrides or {})
    if config_function is not None and suffix != ".py":
        raise SpecError(f"--config-function: {config_function!r} -> names a function of a torchtitan Python recipe "
                        "module (.py); this config is not one", source=str(path))
    if suffix == ".toml":  # the guarded parsers: depth limit, one-line errors
        return _torchtitan(parse_toml(text, str(path)), gpus, over, legacy=True)
    if suffix == ".py":
        doc, note = _python_recipe(text, str(path), config_function)
        view = _torchtitan(doc, gpus, over, legacy=False)
        view.notes[1:1] = [note] if note else []
        return view
    if suffix == ".json":
        doc = parse_json(text, str(path))
        if not isinstance(doc, dict):
            raise SpecError("expected a JSON object", source=str(path))
        if "layout" in doc:
            return _plan(doc)
        if {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size"} & set(doc):
            return _deepspeed(doc, gpus, over, global_batch_size)
        raise SpecError("JSON is neither a plan (no 'layout') nor a DeepSpeed config (no 'zero_optimization', "
                        "'train_batch_size' or 'train_micro_batch_size_per_gpu')", source=str(path))
    if suffix in (".yaml", ".yml"):  # NeMo's: a Megatron-Bridge override file or a NeMo-Framework-Launcher config
        return _nemo_yaml(parse_yaml(text, str(path)), gpus, str(path))
    if _looks_like_overrides(text):
        return _nemo(text, gpus)
    if re.search(r"(?m)^[^#\n]*-m\s+planner\.bench\b", text):  # `export --to torchrun`: a launch of the benchmark
        raise SpecError("a torchrun launch of `planner.bench` (export --to torchrun), not a framework's config: check "
                        "the plan JSON it runs, or the config exported for the framework", source=str(path))
    return _megatron(text, gpus, str(path))


def _plan(doc: dict) -> ConfigView:
    from planner.inputs.plan_file import schema_problem

    schema_problem(doc, "plan JSON")
    inputs = doc.get("inputs") or {}
    training = inputs.get("training") or {} if isinstance(inputs, dict) else None
    for name, part in (("layout", doc["layout"]), ("inputs", inputs), ("inputs.training", training)):
        if not isinstance(part, dict):
            raise SpecError(f"{name}: {part!r} -> must be a JSON object (a plan written by `planner plan --json`)")
    assert isinstance(training, dict)
    lay = dict(doc["layout"])
    for key in PLAN_DEGREES:  # the framework's split rules divide by them before the layout is validated
        v = lay.get(key)
        if key in lay and not is_int_at_least(v, 1):
            raise SpecError(f"layout.{key}: {v!r} -> must be an integer >= 1 (a plan written by `planner plan --json`)")
    name = doc.get("framework", "generic")
    if not isinstance(name, str) or name not in {f.value for f in Framework}:
        raise SpecError(f"framework: {name!r} -> one of {', '.join(f.value for f in Framework)} (a plan written by "
                        "`planner plan --json`)")
    fw = Framework(name)
    view = ConfigView("plan", fw, lay, training.get("global_batch_size"), training.get("seq_length"),
                      training.get("precision"))
    view.optimizer_states = {k: training[k] for k in STATE_FIELDS if isinstance(training.get(k), str)}
    _plan_model(inputs.get("model"), view)
    if view.precision == "fp8":  # the recipe and FP8 gather the plan was predicted with (None: the framework's)
        recipe, gather = training.get("fp8_recipe"), training.get("fp8_param_gather")
        view.fp8_recipe = recipe if isinstance(recipe, str) else None
        view.fp8_param_gather = gather if isinstance(gather, bool) else None
    if training.get("compile") is True:
        compiled_model(view, "inputs.training.compile (planned with --compile)")
    return view


def _plan_model(model: object, view: ConfigView) -> None:
    """The shape the plan was made for (inputs.model), which check compares with --model as it does a framework
    config's flags: a plan checked against another model is a different model, not a pass."""
    if not isinstance(model, dict):
        return
    shape = {k: model.get(k) for k in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size")}
    heads, hidden = shape["num_attention_heads"], shape["hidden_size"]
    shape["num_kv_heads"] = model.get("num_kv_heads") or heads
    shape["ffn_hidden_size"] = model.get("ffn_hidden_size") or (4 * hidden if isinstance(hidden, int) else None)
    view.model.update({k: v for k, v in shape.items() if isinstance(v, int) and not isinstance(v, bool)})


PLAN_DEGREES = ("tp", "pp", "dp", "cp", "ep", "etp", "micro_batch_size", "num_micro_batches", "virtual_stages")
STATE_FIELDS = ("grad_dtype", "master_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")  # TrainingSpec's state dtypes


def _dp(gpus: int, *degrees: int) -> int:
    prod = 1
    for d in degrees:
        prod *= max(1, d)
    return max(1, gpus // prod)


# Megatron-LM's --cp-comm-type names (and Megatron-Bridge's model.cp_comm_type) -> the planner's cp_comm
CP_COMM_OF = {"p2p": "p2p", "allgather": "all_gather", "a2a": "a2a", "a2a+p2p": "p2p"}


def _cp_ep(view: ConfigView, *, cp: int, cp_comm: str = "p2p", ep: int = 1, etp: int = 1) -> None:
    """Context- and expert-parallel degrees as the config says them (planner/integrations/modern_flags.py writes
    them); the layout fields carry them only where they are not the default, so a dense config reads as before."""
    if cp > 1:
        view.fields.update(cp=cp, cp_comm=cp_comm)
    if ep > 1 or etp > 1:
        view.fields.update(ep=ep, etp=etp)


# ---- DeepSpeed (and the Hugging Face Trainer's "auto") ------------------------------------------------------


DS_SECTIONS = ("zero_optimization", "pipeline", "tensor_parallel", "bf16", "fp16")  # objects in DeepSpeed's schema


def _deepspeed(doc: dict, gpus: int, over: dict, global_batch_size: int | None) -> ConfigView:
    for key in DS_SECTIONS:
        if doc.get(key) is not None and not isinstance(doc[key], dict):
            raise SpecError(f"{key}: {doc[key]!r} -> must be a JSON object (DeepSpeed's config schema)")
    zero = doc.get("zero_optimization") or {}
    pipe = doc.get("pipeline") or {}
    for name, value, least in (("tensor_parallel.autotp_size", (doc.get("tensor_parallel") or {}).get("autotp_size"), 0),
                               ("pipeline.stages", pipe.get("stages"), 1),
                               ("sequence_parallel_size", doc.get("sequence_parallel_size"), 1)):
        if value is not None and not is_int_at_least(value, least):
            raise SpecError(f"{name}: {value!r} -> an integer >= {least} (DeepSpeed's config schema)")
    tp_cfg = (doc.get("tensor_parallel") or {}).get("autotp_size", 0)
    tp = over.pop("tp", None) or (tp_cfg if isinstance(tp_cfg, int) and tp_cfg > 1 else 1)
    stages = pipe.get("stages")
    pp = over.pop("pp", None) or (stages if isinstance(stages, int) else 1)
    ulysses = doc.get("sequence_parallel_size", 1)  # DeepSpeed-Ulysses (the DeepSpeed export writes it for cp a2a)
    sp_degree = ulysses if isinstance(ulysses, int) and not isinstance(ulysses, bool) and ulysses > 1 else 1
    dp = _dp(gpus, tp, pp, sp_degree)
    hf = _has_auto(doc)
    view = ConfigView("hf-deepspeed" if hf else "deepspeed", Framework.DEEPSPEED, {})
    if hf:
        _hf_model_code(view)
    if isinstance(stages, int) and "pp" not in over:
        view.notes.append(f"pipeline.stages {stages}: DeepSpeed's engine does not read it (the model's PipelineModule "
                          "decides); taken as pp — pass --pp to be explicit")
    mbs, gas, gbs = _ds_triad(doc, dp, hf, global_batch_size, view)
    stage = ds_zero_stage(zero, view)
    off = ds_offload(zero, stage, view)
    interval = pipe.get("activation_checkpoint_interval", 0)
    rec = "full" if isinstance(interval, int) and interval > 0 and pp > 1 else "none"
    if "recompute" not in over and rec == "none":
        view.notes.append("activation checkpointing: the DeepSpeed JSON does not say which layers model code "
                          "checkpoints (frameworks.md §3.4); checked with recompute=none — pass --fix recompute=full "
                          "if the model checkpoints its layers")
    view.fields = {"tp": tp, "pp": pp, "dp": dp, "zero_stage": stage,
                   "offload": off, "micro_batch_size": mbs, "num_micro_batches": gas, "recompute": rec,
                   "sequence_parallel": False}
    if tp > 1 and "sequence_parallel" not in over:  # Megatron's --sequence-parallel lives on the command line
        view.notes.append("sequence parallelism: the DeepSpeed JSON does not say (Megatron-DeepSpeed's "
                          "--sequence-parallel is a launch argument); checked off — pass --fix sp=1 if the launch "
                          "sets it")
    _cp_ep(view, cp=sp_degree, cp_comm="a2a")
    view.global_batch_size = gbs
    view.precision = _ds_precision(doc, view)
    if view.precision is None and not hf:  # frameworks.md §3.5: fp32, no wrapper
        view.precision = "fp32"
        view.precision_default = ("DeepSpeed's default: no bf16 or fp16 section, both enabled=false "
                                  "(runtime/precision_config.py), so the engine trains the model in fp32")
    ds_comm_dtype(doc, view)
    ds_grad_accum_dtype(doc, view)
    ds_bf16_states(doc, view)
    ds_overlap(zero, view.fields["zero_stage"], view)
    ds_mics(zero, view)
    ds_reuse_distance(zero, view)
    ds_reduce_bucket(zero, view, hf)
    ds_contiguous_gradients(zero, view)
    ds_grad_reduce(zero, view)
    return view


def ds_grad_reduce(zero: dict, view: ConfigView) -> None:
    """`zero_optimization.reduce_scatter` and `use_multi_rank_bucket_allreduce` at ZeRO-1/2 (both true by default):
    DeepSpeed all-reduces each gradient bucket whole unless reduce_scatter is on and use_multi_rank_bucket_allreduce
    off, where it reduces each rank's slice to that rank with a dist.reduce of its own, a reduce-scatter's bytes and
    dp times its latency (stage_1_and_2.py average_tensor; Knobs.grad_all_reduce_zero_stages and
    grad_slice_reduce_zero_stages)."""
    if view.fields["zero_stage"] not in (1, 2):
        return
    before = len(view.errors)
    scatter = _ds_bool(zero, "reduce_scatter", view)
    if len(view.errors) > before:  # the first key DeepSpeed would refuse is the one named
        return
    multi = _ds_bool(zero, "use_multi_rank_bucket_allreduce", view)
    if scatter is not False and multi is False:
        why = ("use_multi_rank_bucket_allreduce false: ZeRO-1/2 reduce each rank's slice of a gradient bucket to it "
               "with a dist.reduce of its own, one after another: a reduce-scatter's bytes and dp times its latency, "
               "not the all-reduce of the whole bucket DeepSpeed's default runs")
        view.knobs["grad_all_reduce_zero_stages"] = ((), why)
        view.knobs["grad_slice_reduce_zero_stages"] = ((1, 2), why)


DS_COMM_DTYPES = ("fp16", "bf16", "fp32")  # runtime/config.py get_communication_data_type


def ds_comm_dtype(doc: dict, view: ConfigView) -> None:
    """DeepSpeed's top-level `communication_data_type`: the dtype gradients are reduced in (the engine's, else the
    model's 16-bit dtype), read as the training's grad_reduce_dtype; DeepSpeed refuses other values at start-up."""
    given = doc.get("communication_data_type")
    if given is None:
        return
    if not isinstance(given, str) or given.lower() not in DS_COMM_DTYPES:
        view.errors.append(("communication_data_type", f"communication_data_type: {given!r} -> one of "
                            f"{', '.join(DS_COMM_DTYPES)} (DeepSpeed's engine refuses others at start-up)",
                            "give fp16, bf16 or fp32, or drop the key (the model's 16-bit dtype)"))
        return
    view.optimizer_states["grad_reduce_dtype"] = given.lower()
    view.notes.append(f"communication_data_type {given.lower()}: gradients reduced in {given.lower()} (predicted so)")


# DeepSpeed's DtypeEnum names (runtime/config.py): the canonical name of each accepted spelling
DS_DTYPE_NAMES = {name: canon for canon, names in (
    ("fp16", ("torch.float16", "fp16", "float16", "half")), ("fp32", ("torch.float32", "fp32", "float32", "float")),
    ("bf16", ("torch.bfloat16", "bf16", "bfloat16")), ("int8", ("torch.int8", "int8"))) for name in names}


def ds_grad_accum_dtype(doc: dict, view: ConfigView) -> None:
    """`data_types.grad_accum_dtype` (default: the model's dtype), as DeepSpeed's engine picks its optimizer from it
    (engine.py _do_optimizer_sanity_check, 0.19.8). It runs BF16_Optimizer, not the ZeRO optimizer or none, for a
    bf16 model at ZeRO-1 accumulating in fp32 without CPU offload, and for a bf16 pipeline (pp > 1: a PipelineModule)
    without ZeRO accumulating in bf16: read as ZeRO-0 with BF16_Optimizer's sharded states
    (profiles.deepspeed_bf16_optimizer), whose memory and traffic that path predicts. Without ZeRO a dtype
    other than the model's is refused at start-up ("unsupported mix"); elsewhere another dtype is not followed (a
    note says so)."""
    section = doc.get("data_types")
    given = section.get("grad_accum_dtype") if isinstance(section, dict) else None
    canon = DS_DTYPE_NAMES.get(given) if isinstance(given, str) else None
    if given is not None and canon is None:
        view.errors.append(("grad_accum_dtype", f"data_types.grad_accum_dtype: {given!r} -> one of "
                            f"{', '.join(sorted(DS_DTYPE_NAMES))} (DeepSpeed's DtypeEnum)",
                            "give fp32, bf16 or fp16, or drop the key (the model's dtype)"))
        return
    if view.precision is None:
        if canon is not None:
            view.notes.append(f"data_types.grad_accum_dtype {canon}: the config does not state its precision, so "
                              "which optimizer DeepSpeed runs is not read (predicted with the profile's)")
        return
    model, stage, f = view.precision, view.fields["zero_stage"], view.fields
    accumulate = canon or model
    if stage == 0 and accumulate != model:
        view.errors.append(("grad_accum_dtype", f"data_types.grad_accum_dtype {accumulate} with a {model} model and "
                            "no ZeRO -> DeepSpeed refuses it at start-up ('unsupported mix of model_dtype and "
                            "grad_accum_dtype', engine.py)", "drop the key, or use ZeRO stage 1 or higher"))
        return
    if model == "bf16" and ((stage == 1 and accumulate == "fp32" and f["offload"] == "none")
                            or (stage == 0 and f["pp"] > 1)):
        _ds_bf16_optimizer(doc, view, accumulate)
    elif accumulate != model:
        view.notes.append(f"data_types.grad_accum_dtype {accumulate} at ZeRO-{stage}: the {accumulate} gradient "
                          f"accumulation is not followed (predicted with the {model} gradients of the profile)")


def _ds_bf16_optimizer(doc: dict, view: ConfigView, accumulate: str) -> None:
    """The config read as DeepSpeed's BF16_Optimizer (ds_grad_accum_dtype): ZeRO-0 with its states and bucket, with or
    without a pipeline (the DeepSpeed profile states the bf16 pipeline's own, which these equal unless the config
    sets bf16.immediate_grad_update)."""
    stage = view.fields["zero_stage"]
    view.engine_fields["zero_stage"] = stage
    view.fields["zero_stage"] = 0
    immediate = (doc.get("bf16") or {}).get("immediate_grad_update") is True
    size = 4 if accumulate == "fp32" else 2
    optimizer = deepspeed_bf16_optimizer(size, immediate_grad_update=immediate)
    states, bucket = optimizer.state_bytes, optimizer.bucket_bytes or 0.0
    said = ("zero_optimization.stage 1, bf16, data_types.grad_accum_dtype fp32" if stage == 1 else
            f"a bf16 pipeline (pp {view.fields['pp']}) without ZeRO")
    why = (f"{said}: DeepSpeed runs BF16_Optimizer, read as ZeRO-0 with its states: {states[0]:g} + {states[1]:g} + "
           f"{states[2]:g}/dp B/param{' (bf16.immediate_grad_update)' if immediate else ''} and a {bucket / 1e9:g} GB "
           "reduce bucket (engine.py _do_optimizer_sanity_check)")
    names: tuple[str, ...] = ("zero0_pipeline_optimizer",)
    if stage == 1:
        names += ("zero0_optimizer",)
        view.remedy_names["zero_stage=1"] = "drop data_types.grad_accum_dtype (DeepSpeed's ZeRO-1 optimizer)"
    for name in names:
        view.knobs[name] = (optimizer, why)
    view.engine_knobs.update(names)


DS_BF16_STATE_KEYS = ("bf16_master_weights_and_grads", "bf16_optimizer_states")  # runtime/precision_config.py


def ds_bf16_states(doc: dict, view: ConfigView) -> None:
    """`bf16.bf16_master_weights_and_grads` and `bf16.bf16_optimizer_states` (DeepSpeed >= 0.18.3, PR #7700): the ZeRO
    optimizer keeps its master weights (and gradient partition) in bf16, and with the second its Adam moments too
    (base_optimizer.py _configure_master_weights, 0.19.8), read as TrainingSpec's master_dtype and, with the second,
    exp_avg_dtype and exp_avg_sq_dtype. DeepSpeed refuses at start-up (_ds_bf16_states_refusal), and keeps them only
    in its ZeRO optimizers (not the BF16_Optimizer a ZeRO-1 fp32 accumulation runs)."""
    section = doc["bf16"] if doc.get("bf16") is not None else doc.get("bfloat16")
    if not isinstance(section, dict):
        return
    given = []
    for key in DS_BF16_STATE_KEYS:
        try:
            given.append(bool(ds_config_bool(section.get(key, False))))
        except ValueError:
            view.errors.append(("optimizer_states", f"bf16.{key}: {section[key]!r} -> true or false (DeepSpeed refuses "
                                "any other value at start-up)", "give a boolean"))
            return
    master, moments = given
    if not (master or moments) or _ds_bf16_states_refusal(master, moments, view):
        return
    said = " and ".join(f"bf16.{k}" for k, on in zip(DS_BF16_STATE_KEYS, given, strict=True) if on)
    if view.precision != "bf16" or "zero_stage" in view.engine_fields:
        why = ("the engine runs BF16_Optimizer here, not its ZeRO optimizer" if view.precision == "bf16"
               else "the model is not read as bf16")
        view.notes.append(f"{said}: ignored ({why}); checked with fp32 master weights and moments")
        return
    states = {"master_dtype": "bf16"} | ({"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"} if moments else {})
    view.optimizer_states.update(states)
    view.notes.append(f"{said}: the ZeRO optimizer's master weights{' and Adam moments' if moments else ''} in bf16 "
                      f"({', '.join(states)} bf16: {2 + 4 * moments} B/param fewer, sharded as ZeRO shards them; "
                      "stage_1_and_2.py / stage3.py master_weights_and_grads_dtype); its bf16 master-gradient "
                      "partition (2 B/param fewer again, DeepSpeedExamples bf16_master_weight README) is not "
                      "modelled, so the sharded states are over-stated by up to that")


def _ds_bf16_states_refusal(master: bool, moments: bool, view: ConfigView) -> bool:
    """Whether DeepSpeed 0.19.8 refuses the bf16 state settings (a violation says why): either below ZeRO-1, and
    bf16_optimizer_states without bf16_master_weights_and_grads (runtime/config.py L706-714; frameworks.md §3.7 rule
    6); bf16 master weights with fp32 moments need the optimizer offloaded to DeepSpeedCPUAdam (stage_1_and_2.py
    _enforce_cpu_offload, stage3.py _enforce_optimizer_offload, via base_optimizer.py _configure_master_weights)."""
    stage = view.engine_fields.get("zero_stage", view.fields["zero_stage"])
    if stage == 0:
        why, fix = "at ZeRO-0 -> DeepSpeed asserts ZeRO stage 1, 2 or 3 (runtime/config.py; frameworks.md §3.7 " \
                   "rule 6)", "use zero_optimization.stage 1 or higher, or drop them"
    elif moments and not master:
        why, fix = "without bf16.bf16_master_weights_and_grads -> DeepSpeed asserts bf16_optimizer_states requires " \
                   "bf16_master_weights_and_grads (runtime/config.py)", "add bf16.bf16_master_weights_and_grads: true"
    elif master and not moments and view.fields["offload"] == "none":
        why, fix = "without bf16.bf16_optimizer_states or optimizer offload -> DeepSpeed's ZeRO optimizer asserts " \
                   "bf16 master weights with fp32 moments run on ZeRO-Offload with DeepSpeedCPUAdam " \
                   "(stage_1_and_2.py _enforce_cpu_offload)", "add bf16.bf16_optimizer_states: true, or " \
                   "zero_optimization.offload_optimizer to cpu"
    else:
        return False
    said = " and ".join(f"bf16.{k}" for k, on in zip(DS_BF16_STATE_KEYS, (master, moments), strict=True) if on)
    view.errors.append(("optimizer_states", f"{said} {why}", fix))
    return True


HIDDEN_SQUARED = "hidden_size^2"


def ds_reduce_bucket(zero: dict, view: ConfigView, hf: bool) -> None:
    """`zero_optimization.reduce_bucket_size`: at ZeRO-3 how many gradient elements each coalesced reduce-scatter
    carries (Knobs.zero3_reduce_bucket_elements, data_parallel.zero3_reduce_buckets), at ZeRO-1/2 the size of the
    gradient buffers (Knobs.reduce_bucket_elements, stage.reduce_buffer_bytes); DeepSpeed's default is 5e8,
    and "auto" under the Hugging Face Trainer is the model's hidden_size^2 at every stage (transformers
    integrations/deepspeed.py trainer_config_finalize)."""
    stage = view.fields["zero_stage"]
    if stage not in (1, 2, 3):
        return
    knob = "zero3_reduce_bucket_elements" if stage == 3 else "reduce_bucket_elements"
    what = ("ZeRO-3 reduce-scatters its gradients in buckets of that many elements" if stage == 3 else
            f"ZeRO-{stage}'s gradient buffers hold that many 16-bit elements each")
    if zero.get("reduce_bucket_size") == "auto" and hf:
        view.knobs[knob] = (HIDDEN_SQUARED, f"reduce_bucket_size auto: the Trainer fills hidden_size^2; {what} "
                                            "(DeepSpeed's default is 5e8)")
        return
    given = _ds_elements(zero, view, "reduce_bucket_size", "gradient", REDUCE_BUCKET_ELEMENTS, stages=(1, 2, 3),
                         least=1)  # reduce_bucket_size: Field(gt=0), runtime/zero/config.py
    if given is not None:
        view.knobs[knob] = (given, f"reduce_bucket_size {given:g}: {what} (DeepSpeed's default 5e8)")


def ds_contiguous_gradients(zero: dict, view: ConfigView) -> None:
    """`zero_optimization.contiguous_gradients` at ZeRO-1/2 (DeepSpeed's default true): off, no gradient buffer is
    kept across the backward; each bucket is flattened when it is reduced, one bucket's worth (Knobs.
    reduce_bucket_buffers, stage.reduce_buffer_bytes). ZeRO-3 flattens a bucket either way."""
    if view.fields["zero_stage"] not in (1, 2, 3):
        return
    if _ds_bool(zero, "contiguous_gradients", view) is False and view.fields["zero_stage"] < 3:
        view.knobs["reduce_bucket_buffers"] = (1, "contiguous_gradients off: no gradient buffer across the backward, "
                                                  "each bucket flattened as it is reduced (one bucket's bytes)")


# DeepSpeed's config models (runtime/config_utils.py DeepSpeedConfigModel, 0.19.8) drop a key whose value is "auto",
# so its default applies, and parse the rest with pydantic v2 in lax mode: a bool field takes true/false, 0 or 1 and
# the strings below in any case; an int field an integral number, a bool or a string of digits. Nothing else starts.
_LAX_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_LAX_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_INT64 = 2**63


def ds_config_bool(value: object) -> bool | None:
    """The boolean DeepSpeed's config reads from `value`; None for "auto" (dropped: the default applies). Raises
    ValueError where DeepSpeed refuses to start (DeepSpeedConfigModel's lax bool)."""
    if value == "auto":
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _LAX_TRUE | _LAX_FALSE:
        return value.lower() in _LAX_TRUE
    raise ValueError(f"{value!r} is not a boolean DeepSpeed reads")


def ds_config_int(value: object) -> int | None:
    """The integer DeepSpeed's config reads from `value`; None for "auto" (dropped: the default applies). Raises
    ValueError where DeepSpeed refuses to start (DeepSpeedConfigModel's lax int, 64-bit)."""
    if value == "auto":
        return None
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and -_INT64 <= value < _INT64:
        return int(value)
    raise ValueError(f"{value!r} is not an integer DeepSpeed reads")


def _ds_bool(zero: dict, key: str, view: ConfigView, *, nullable: bool = False) -> bool | None:
    """`zero_optimization.<key>` as DeepSpeed reads it (ds_config_bool); None where it is absent, "auto" (DeepSpeed's
    default), null on a key DeepSpeed types Optional (`nullable`: overlap_comm; null elsewhere stops DeepSpeed), or
    a value DeepSpeed refuses at start-up (a violation that names the key)."""
    if key not in zero or (nullable and zero[key] is None):
        return None
    given = zero[key]
    try:
        return ds_config_bool(given)
    except ValueError:
        view.errors.append((key, f"zero_optimization.{key}: {given!r} -> true or false (DeepSpeed refuses any other "
                                 "value at start-up)", "give a boolean, or drop the key for DeepSpeed's default"))
        return None


def _ds_elements(zero: dict, view: ConfigView, key: str, what: str, default: float, *,
                 stages: tuple[int, ...] = (3,), least: int = 0) -> float | None:
    """An element count `zero_optimization.<key>` sets other than DeepSpeed's `default`, as DeepSpeed reads it
    (ds_config_int); None where the key is absent, "auto" (the default), at its default or read at a stage outside
    `stages`, or a value DeepSpeed refuses at start-up: not an integer >= `least`, the field's bound in DeepSpeed's
    config model (a violation that names the key)."""
    if key not in zero or view.fields["zero_stage"] not in stages:
        return None
    given = zero[key]
    try:
        count = ds_config_int(given)
        refused = count is not None and count < least
    except ValueError:
        count, refused = None, True
    if refused:
        view.errors.append((key, f"zero_optimization.{key}: {given!r} -> a whole number of {what} elements >= "
                                 f"{least} (DeepSpeed refuses any other value at start-up)",
                            f"give a number (DeepSpeed's default is {default:g}), or drop the key"))
        return None
    return None if count is None or count == default else float(count)


def ds_reuse_distance(zero: dict, view: ConfigView) -> None:
    """`zero_optimization.stage3_max_reuse_distance` at ZeRO-3: how near its next use a released module's parameters
    must be to stay gathered (DeepSpeed's default 1e9 elements); a recomputed module further from its backward is
    gathered again for it (Knobs.zero3_max_reuse_distance, data_parallel.zero3_regathered_modules)."""
    given = _ds_elements(zero, view, "stage3_max_reuse_distance", "parameter", ZERO3_MAX_REUSE_DISTANCE_ELEMENTS)
    if given is not None:
        view.knobs["zero3_max_reuse_distance"] = (
            given, f"stage3_max_reuse_distance {given:g}: a recomputed module further than that from its backward "
                   "is gathered again for it (DeepSpeed's default 1e9)")


def ds_mics(zero: dict, view: ConfigView) -> None:
    """DeepSpeed's MiCS (`zero_optimization.mics_shard_size` S, -1 off): ZeRO-3 sharded over groups of S ranks and
    replicated across them, read as hybrid sharding (LayoutSpec.dp_shard; profiles.DEEPSPEED_MICS), so the memory and
    traffic are predicted as it ran on the DeepSpeed it was written for. DeepSpeed 0.19.8 refuses the key at start-up
    (MiCS removed), which is a violation."""
    size = zero.get("mics_shard_size")
    if size is None or size == -1:
        return
    if not is_int_at_least(size, 1):
        view.errors.append(("mics_shard_size", f"zero_optimization.mics_shard_size: {size!r} -> a positive integer, "
                                               "or -1 (off)", "give the MiCS group size, or drop the key"))
        return
    view.errors.append(("mics_shard_size", f"zero_optimization.mics_shard_size: {size} -> DeepSpeed 0.19.8 refuses "
                                           "it at start-up ('MiCS ZeRO-3 sharding has been removed', runtime/config.py)",
                        "drop mics_shard_size (ZeRO-3 over every dp rank), or run an older DeepSpeed that has MiCS"))
    dp, stage = view.fields["dp"], view.fields["zero_stage"]
    if stage != 3:
        view.notes.append(f"mics_shard_size {size} at ZeRO-{stage}: MiCS shards ZeRO-3 only (ignored)")
    elif view.fields["offload"] != "none":
        view.errors.append(("mics_shard_size", f"mics_shard_size {size} with offload {view.fields['offload']} -> "
                                               "MiCS has no CPU offload ('Local sharding has no support for CPU "
                                               "offloading', runtime/zero/mics.py)", "drop the offload or MiCS"))
    elif size >= dp:
        view.notes.append(f"mics_shard_size {size} covers every one of the {dp} dp ranks: ZeRO-3 over them")
    elif dp % size:
        view.errors.append(("dp_shard", f"mics_shard_size: {size} -> must divide the data-parallel size {dp}",
                            "give a divisor of the data-parallel size"))
    else:
        view.fields["dp_shard"] = size
        view.notes.append(f"mics_shard_size {size}: MiCS, read as hybrid sharding over {size} of the {dp} dp ranks "
                          f"(shard={size}); its {dp // size} replicas all-reduce the gradient shards once a step")


def ds_overlap(zero: dict, stage: int, view: ConfigView) -> None:
    """DeepSpeed's `overlap_comm` as the config sets it, else DeepSpeed's default for the stage: on only at ZeRO-3
    (runtime/zero/config.py overlap_comm_valid, 0.19.8). Off at ZeRO-1/2 the gradient reduce runs after backward;
    off at ZeRO-3 the reduce-scatters (1 of the 3 collectives per layer) run on the compute stream while the
    prefetched gathers stay hidden. ZeRO-0 does not read it (the engine all-reduces after backward)."""
    from planner.frameworks.profiles import profile_for

    if stage not in (1, 2, 3):
        return
    before = len(view.errors)
    given = _ds_bool(zero, "overlap_comm", view, nullable=True)
    on = stage == 3 if given is None else given
    if given is None and len(view.errors) == before:
        view.notes.append(f"overlap_comm not set: DeepSpeed's default at ZeRO-{stage} ({'on' if on else 'off'}) "
                          "assumed")
    if on:
        return
    if stage < 3:
        view.knobs["dp_overlap_fraction"] = (0.0, f"overlap_comm off at ZeRO-{stage}: the gradient reduce runs "
                                                  "after backward")
        view.knobs["reduce_bucket_buffers"] = (1, f"overlap_comm off at ZeRO-{stage}: one reduce_bucket_size gradient "
                                                  "buffer (DeepSpeed doubles it only with overlap_comm)")
    else:
        share = profile_for(Framework.DEEPSPEED).overlap.zero3.value * 2 / 3
        view.knobs["zero3_overlap_fraction"] = (share, "overlap_comm off at ZeRO-3: the reduce-scatters are not "
                                                       "hidden (the prefetched gathers are)")


DS_OFFLOAD_DEVICES = ("none", "cpu", "nvme")  # runtime/zero/offload_config.py OffloadDeviceEnum


def ds_offload(zero: dict, stage: int, view: ConfigView) -> str:
    """The offload `zero_optimization.offload_param` / `offload_optimizer` ask for at ZeRO-`stage`, as DeepSpeed
    0.19.8 reads their `device` (OffloadDeviceEnum: none, cpu or nvme, lower case; absent or "auto": none, as is a
    section set to "auto" or null): "optimizer+params", "optimizer" or "none". A device DeepSpeed refuses at start-up
    is a violation that names the key (read as none meanwhile). DeepSpeed's engine hands offload_param to the ZeRO-3
    optimizer only and offload_optimizer to a ZeRO optimizer only (engine.py _configure_zero_optimizer: ZeRO-1/2 take
    offload_optimizer_config alone, ZeRO-0 builds none): below those stages the section is ignored, with a note."""
    devices = {}
    for key in ("offload_param", "offload_optimizer"):
        section = zero.get(key)
        if section not in (None, "auto") and not isinstance(section, dict):
            raise SpecError(f"zero_optimization.{key}: {section!r} -> an object such as {{\"device\": \"cpu\"}} "
                            "(DeepSpeed's config schema)")
        if not isinstance(section, dict):
            continue
        device = section.get("device", "none")
        if device == "auto":
            device = "none"
        if device not in DS_OFFLOAD_DEVICES:
            view.errors.append(("offload", f"zero_optimization.{key}.device: {device!r} -> one of "
                                           f"{', '.join(DS_OFFLOAD_DEVICES)} (DeepSpeed refuses any other value at "
                                           "start-up)", "give none, cpu or nvme"))
            device = "none"
        devices[key] = device
    for key, least in (("offload_param", 3), ("offload_optimizer", 1)):
        if stage < least and devices.get(key, "none") != "none":
            view.notes.append(f"zero_optimization.{key} at ZeRO-{stage}: DeepSpeed's engine reads it only from "
                              f"ZeRO-{least} on, so nothing is offloaded by it; checked without it")
            devices[key] = "none"
    if devices.get("offload_param", "none") != "none":
        return "optimizer+params"
    return "optimizer" if devices.get("offload_optimizer", "none") != "none" else "none"


def _hf_model_code(view: ConfigView) -> None:
    """A Hugging Face Trainer config ("auto" values) trains a transformers model, whose RMSNorm modules (LlamaRMSNorm
    and its copies: `hidden_states.to(torch.float32)` ... `self.weight * hidden_states.to(input_dtype)`,
    transformers modeling_llama.py) run eager and save the fp32 upcast of their input (Knobs.norm_fp32_upcast; a
    LayerNorm model, GPT-2's, runs torch's fused layer_norm and is not moved)."""
    view.knobs["norm_fp32_upcast"] = (
        True, "Hugging Face Trainer config: transformers' RMSNorm (LlamaRMSNorm and its copies) upcasts to fp32 and "
              f"saves the copy ({NORM_FP32_UPCAST_BYTES_PER_ELEMENT} B per element, two norms a layer; a LayerNorm "
              "model is not moved)")


def _has_auto(doc) -> bool:
    if isinstance(doc, dict):
        return any(_has_auto(v) for v in doc.values())
    return doc == "auto"


def _ds_precision(doc: dict, view: ConfigView) -> str | None:
    """The precision a DeepSpeed config trains in, as DeepSpeed 0.19.8 reads `bf16` (or the older `bfloat16`) and
    `fp16` (runtime/precision_config.py: `enabled` a lax boolean, default false; "auto" dropped there and filled by
    the Hugging Face Trainer from --bf16/--fp16, so None: --precision decides); fp32 where a section is there and none
    is enabled; None where neither section is. A value DeepSpeed refuses, or both enabled ('bfloat16 and fp16 modes
    cannot be simultaneously enabled', runtime/config.py), is a violation. Without a section, the caller's: fp32 for
    plain DeepSpeed, --precision for the Hugging Face Trainer (Accelerate adds the section from its mixed_precision)."""
    sections = {"bf16": doc["bf16"] if doc.get("bf16") is not None else doc.get("bfloat16"), "fp16": doc.get("fp16")}
    enabled: dict[str, bool | None] = {}
    for name, section in sections.items():
        if section is None and not (name == "fp16" and "fp16" in doc):
            continue
        if not isinstance(section, dict):
            view.errors.append(("precision", f"{name}: {section!r} -> a section such as {{\"enabled\": true}} "
                                             "(DeepSpeed refuses any other value at start-up)",
                                f"write {name} as a section, or drop it"))
            continue
        if "enabled" not in section:
            enabled[name] = False
            continue
        try:
            enabled[name] = ds_config_bool(section["enabled"])
        except ValueError:
            view.errors.append(("precision", f"{name}.enabled: {section['enabled']!r} -> true or false (DeepSpeed "
                                             "refuses any other value at start-up)", "give a boolean"))
    on = [name for name, value in enabled.items() if value]
    if len(on) == 2:
        view.errors.append(("precision", "bf16.enabled and fp16.enabled both true -> DeepSpeed refuses it ('bfloat16 "
                                         "and fp16 modes cannot be simultaneously enabled', runtime/config.py)",
                            "enable one of them"))
    if on:
        return on[0]
    if None in enabled.values():  # "auto": the Trainer fills it from --bf16/--fp16
        return None
    return "fp32" if enabled or any(name in doc for name in ("bf16", "bfloat16", "fp16")) else None


def ds_zero_stage(zero: dict, view: ConfigView) -> int:
    """`zero_optimization.stage` as DeepSpeed 0.19.8 reads it (ds_config_int into ZeroStageEnum, 0 to 3; absent or
    "auto": 0); any other value stops DeepSpeed at start-up, a violation (read as 0 meanwhile)."""
    if "stage" not in zero:
        return 0
    given = zero["stage"]
    try:
        stage = ds_config_int(given)
    except ValueError:
        stage = -1
    if stage is None:
        return 0
    if stage not in (0, 1, 2, 3):
        view.errors.append(("zero_stage", f"zero_optimization.stage: {given!r} -> 0, 1, 2 or 3 (DeepSpeed refuses any "
                                          "other value at start-up)", "give a ZeRO stage from 0 to 3"))
        return 0
    return stage


def _ds_fill_auto(triad: tuple, dp: int, global_batch_size: int | None, view: ConfigView) -> tuple:
    """(train, micro, GA) after the HF Trainer fills "auto" (§5.2: train = world x micro x GA)."""
    train, micro, ga = triad
    if ga == "auto":
        ga = None
    if micro == "auto":
        micro = None
    if train == "auto":
        train = global_batch_size
    filled = [k for k, v in view.triad.items() if v == "auto"]
    if filled:
        view.notes.append(f"\"auto\" ({', '.join(filled)}): filled as the Hugging Face Trainer does, from -b "
                          f"({global_batch_size}) and the cluster (data-parallel size {dp}); GA 1 when both GA and "
                          "micro-batch are auto (TrainingArguments' default)")
        if micro is None and ga is None and train:
            ga = 1
    return train, micro, ga


def _ds_derive(train: int | None, micro: int | None, ga: int | None, dp: int) -> tuple:
    """The missing members of the triad by floor division over the data-parallel size (runtime/config.py
    _set_batch_related_parameters, §3.2)."""
    if train is not None and micro is not None and ga is None:
        ga = train // micro // dp
    elif train is not None and ga is not None and micro is None:
        micro = train // dp // ga
    elif micro is not None and ga is not None and train is None:
        train = micro * ga * dp
    elif train is not None and micro is None:
        ga, micro = 1, train // dp
    elif micro is not None and train is None:
        ga, train = 1, micro * dp
    return train, micro, ga


def _ds_triad(doc: dict, dp: int, hf: bool, global_batch_size: int | None, view: ConfigView) -> tuple[int, int, int]:
    """The batch triad derived as DeepSpeed derives it (runtime/config.py _set_batch_related_parameters, §3.2),
    after the HF Trainer fills "auto" (§5.2: train = world x micro x GA)."""
    train, micro, ga = (doc.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                              "gradient_accumulation_steps"))
    view.triad = {"train_batch_size": train, "train_micro_batch_size_per_gpu": micro,
                  "gradient_accumulation_steps": ga}
    if hf:
        train, micro, ga = _ds_fill_auto((train, micro, ga), dp, global_batch_size, view)
    for name, v in (("train_batch_size", train), ("train_micro_batch_size_per_gpu", micro),
                    ("gradient_accumulation_steps", ga)):
        if v is not None and (not isinstance(v, int) or v <= 0):
            raise SpecError(f"{name}: {v!r} -> must be a positive integer (DeepSpeed asserts all three > 0)")
    if train is None and micro is None:
        if global_batch_size:
            train = global_batch_size
        else:
            raise SpecError("train_batch_size / train_micro_batch_size_per_gpu: both missing -> DeepSpeed asserts "
                            "one of them is given (or pass -b)")
    train, micro, ga = _ds_derive(train, micro, ga, dp)
    if not micro or not ga or train != micro * ga * dp:
        view.errors.append(("global_batch_size",
                            f"global_batch_size: train_batch_size {train} != micro {micro} x GA {ga} x data-parallel "
                            f"size {dp} -> DeepSpeed's batch assertion fails at start-up (it derives missing members "
                            "by floor division over the data-parallel size, frameworks.md §3.2)",
                            "set train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
                            "data-parallel size (or leave one of them out)"))
    return max(1, micro or 1), max(1, ga or 1), train


# ---- torchtitan -------------------------------------------------------------------------------------------


def _python_recipe(text: str, source: str, function: str | None = None) -> tuple[dict, str | None]:
    """A torchtitan 0.3 recipe module as the TOML-shaped dict the reader takes: the keyword arguments of
    TrainingConfig / ParallelismConfig calls, the AC policy (FullAC/SelectiveAC/MemoryBudgetAC .Config(), or None;
    an `ActivationCheckpointConfig(mode=...)` call of the pre-release main is read too),
    and model_registry("FLAVOR"). Literals only; the module is never executed. A module of several config functions
    (a config_registry.py) is read for the one `function` names (_recipe_scopes); with it, a note naming it."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise SpecError(f"cannot parse the Python recipe: {exc.msg} (line {exc.lineno})", source=source) from None
    doc: dict = {}
    scopes = _recipe_scopes(tree, function, source)
    for scope in scopes:  # a derived function's base first, its own changes on top
        for node in ast.walk(scope):
            if isinstance(node, ast.Call):
                _recipe_call(node, doc)
        for kw in (k for n in ast.walk(scope) if isinstance(n, ast.Call) for k in n.keywords):
            if kw.arg == "activation_checkpoint" and isinstance(kw.value, ast.Constant) and kw.value.value is None:
                doc.setdefault("activation_checkpoint", {})["mode"] = "none"
        _recipe_assignments(scope, doc)
    names = [s.name for s in scopes if isinstance(s, ast.FunctionDef)]
    note = None if function is None else (f"read config function {names[-1]}()" + (
        f", built on {', '.join(n + '()' for n in names[:-1])} (their settings, then its own)" if len(names) > 1
        else ""))
    return doc, note


_RECIPE_SECTIONS = {"TrainingConfig": "training", "ParallelismConfig": "parallelism",
                    "ActivationCheckpointConfig": "activation_checkpoint", "CompileConfig": "compile"}


def _recipe_call(node: ast.Call, doc: dict) -> None:
    """One call of a recipe, read into its section (_python_recipe)."""
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    owner = node.func.value.id if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
        else None
    if name in _RECIPE_SECTIONS:
        doc.setdefault(_RECIPE_SECTIONS[name], {}).update(_literal_kwargs(node))
    elif name == "Config" and owner in ("FullAC", "SelectiveAC", "MemoryBudgetAC"):
        doc.setdefault("activation_checkpoint", {})["mode"] = {"FullAC": "full", "SelectiveAC": "selective",
                                                               "MemoryBudgetAC": "memory_budget"}[owner]
    elif name == "model_registry" and node.args and isinstance(node.args[0], ast.Constant):
        doc.setdefault("model", {})["flavor"] = node.args[0].value
    elif name == "Config" and owner == "Float8LinearConverter":
        # 0.3's float8 is a model converter (frameworks.md §1.9), wherever the recipe passes it (model_registry's
        # converters, or model_converters); read as the TOML's sections, recipe_name defaulting to torchtitan's
        doc.setdefault("model", {})["converters"] = ["float8"]
        doc.setdefault("quantize", {}).setdefault("linear", {})["float8"] = {
            "recipe_name": TORCHTITAN.default_fp8_recipe, **_literal_kwargs(node)}


def _recipe_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """The module's config functions: its top-level functions annotated to return a config (torchtitan 0.3's
    config_registry.py: `def llama3_70b() -> Trainer.Config`, one per run; torchtitan runs the one --config names)."""
    return {n.name: n for n in tree.body
            if isinstance(n, ast.FunctionDef) and n.returns is not None and "Config" in ast.unparse(n.returns)}


def _recipe_scopes(tree: ast.Module, function: str | None, source: str) -> list[ast.AST]:
    """What to read of a recipe module: the whole module where it holds at most one config function and none is
    named; else the named function, after the config functions it is built on (`config = llama3_8b()`, then its
    changes). Several functions and none named is an error naming them: read together they would mix runs."""
    funcs = _recipe_functions(tree)
    if function is None:
        if len(funcs) <= 1:
            return [tree]
        raise SpecError(f"{len(funcs)} config functions ({', '.join(funcs)}) -> name the one to check with "
                        "--config-function NAME (torchtitan runs the one its --config names)", source=source)
    if function not in funcs:
        raise SpecError(f"--config-function: {function!r} -> one of {', '.join(funcs) or '(none: no function here '}"
                        f"{'' if funcs else 'returns a Trainer.Config)'}", source=source)
    chain: list[str] = []
    name: str | None = function
    while name is not None and name not in chain:
        chain.insert(0, name)
        name = next((n.func.id for n in ast.walk(funcs[name]) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Name) and n.func.id in funcs and n.func.id != name), None)
    return [funcs[n] for n in chain]


def _recipe_assignments(scope: ast.AST, doc: dict) -> None:
    """A derived config function's literal changes: `config.training.seq_len = 4096` into its section,
    `config.activation_checkpoint = None` as no AC (config objects assigned whole are read as calls)."""
    for node in ast.walk(scope):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            path: list[str] = []
            while isinstance(target, ast.Attribute):
                path.insert(0, target.attr)
                target = target.value
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, TypeError):
                continue
            if len(path) == 2 and path[0] in _RECIPE_SECTIONS.values():
                doc.setdefault(path[0], {})[path[1]] = value
            elif path == ["activation_checkpoint"] and value is None:
                doc.setdefault("activation_checkpoint", {})["mode"] = "none"


def _literal_kwargs(node: ast.Call) -> dict:
    out = {}
    for kw in node.keywords:
        if kw.arg is None:
            continue
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            continue
    return out


def torchtitan_default_split(num_layers: int, num_stages: int, first_less: int = 1, last_less: int = 1) -> list[int]:
    """torchtitan's split (pipeline_parallel.py _get_pipeline_metadata, frameworks.md §1.4): E = L + first + last
    effective layers, base = E // S, the first E mod S stages one more; the first/last stages give back their
    allowance for the embedding and the output."""
    eff = num_layers + first_less + last_less
    base, extra = divmod(eff, num_stages)
    shares = [base + (1 if i < extra else 0) for i in range(num_stages)]
    shares[0] -= first_less
    shares[-1] -= last_less
    return shares


TT_SCHEDULES = {"gpipe": ("gpipe", 1), "1f1b": ("1f1b", 1), "interleaved1f1b": ("interleaved_1f1b", 2),
                "loopedbfs": ("interleaved_1f1b", 2), "interleavedzerobubble": ("zero_bubble", 2),
                "zbvzerobubble": ("zero_bubble", 2), "dualpipev": ("zero_bubble", 2)}


# torchtitan's integer fields: a present value of another type is a config torchtitan itself would reject
TT_INT_FIELDS = {"parallelism": ("tensor_parallel_degree", "pipeline_parallel_degree", "data_parallel_replicate_degree",
                                 "data_parallel_shard_degree", "context_parallel_degree",
                                 "pipeline_parallel_microbatch_size", "expert_parallel_degree",
                                 "expert_tensor_parallel_degree", "pipeline_parallel_layers_per_stage",
                                 "pipeline_parallel_first_stage_less_layers",
                                 "pipeline_parallel_last_stage_less_layers"),
                 "training": ("local_batch_size", "batch_size", "global_batch_size", "seq_len")}


TT_MINUS_ONE = ("data_parallel_shard_degree", "global_batch_size")  # -1: derived by torchtitan (frameworks.md §1.2-1.3)
TT_ZERO_OK = ("pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers")
# torchtitan's boolean fields the reader acts on: a string ("no") is not False
TT_BOOL_FIELDS = {"parallelism": ("enable_sequence_parallel", "enable_async_tensor_parallel"),
                  "training": ("enable_cpu_offload",)}


def _require_types(doc: dict) -> None:
    """torchtitan's integer and boolean fields and its FQN lists, as torchtitan's config dataclasses type them."""
    for section, names in TT_INT_FIELDS.items():
        part = doc.get(section, {})
        if not isinstance(part, dict):
            raise SpecError(f"[{section}]: {type(part).__name__} -> must be a table of settings")
        for name in names:
            v = part.get(name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise SpecError(f"{section}.{name}: {v!r} -> must be an integer")
            least = 0 if name in TT_ZERO_OK else 1
            if v is not None and v < least and not (v == -1 and name in TT_MINUS_ONE):
                allowed = "-1 (derived) or >= 1" if name in TT_MINUS_ONE else f">= {least}"
                raise SpecError(f"{section}.{name}: {v!r} -> must be {allowed}")
    for section, names in TT_BOOL_FIELDS.items():
        for name in names:
            v = doc.get(section, {}).get(name)
            if v is not None and not isinstance(v, bool):
                raise SpecError(f"{section}.{name}: {v!r} -> must be true or false")
    fqns = doc.get("parallelism", {}).get("module_fqns_per_model_part")
    if fqns is not None and not (isinstance(fqns, list) and all(
            isinstance(part, list) and all(isinstance(n, str) for n in part) for part in fqns)):
        raise SpecError(f"parallelism.module_fqns_per_model_part: {fqns!r} -> must be a list of lists of module names")


def _torchtitan_degrees(par: dict, gpus: int) -> tuple[int, int, int, int, int | None]:
    """(tp, pp, dp, ZeRO stage, the HSDP shard group or None) of a torchtitan parallelism section."""
    tp, pp = par.get("tensor_parallel_degree", 1), par.get("pipeline_parallel_degree", 1)
    rep, shard, cp = par.get("data_parallel_replicate_degree", 1), par.get("data_parallel_shard_degree", -1), \
        par.get("context_parallel_degree", 1)
    if shard == -1:  # world / (replicate x cp x tp x pp) (frameworks.md §1.2)
        shard = _dp(gpus, tp, pp, rep, cp)
    dp = rep * shard
    hsdp = shard if rep > 1 and shard > 1 else None  # FSDP over the shard group, the replicas all-reduce its shards
    reshard = par.get("fsdp_reshard_after_forward", "default")
    # torchtitan applies FSDP over dp_shard x cp (ParallelDims.fsdp_enabled: dp_shard > 1 or cp > 1; the mesh
    # 'dp_shard_cp', torchtitan/distributed/parallel_dims.py), so CP alone shards the states too
    if shard * cp == 1:
        zero = 0
    elif pp > 1:
        zero = 1  # FSDP keeps parameters unsharded under PP (§1.6): optimizer and gradients sharded
    else:
        zero = 2 if reshard == "never" else 3  # never = gathered from forward to backward: not ZeRO-3 (§1.6)
    return tp, pp, dp, zero, hsdp


def _torchtitan_schedule(par: dict, pp: int, view: ConfigView) -> tuple[str, int]:
    """(planner schedule, stages per rank) of torchtitan's pipeline_parallel_schedule. With pp 1 it is unused:
    torchtitan builds a schedule only when parallel_dims.pp_enabled (train.py@v0.2.2 L218, trainer.py@release/0.3
    L443), so a multi-stage name there (v0.2.2's deepseek_v3_671b.toml: Interleaved1F1B) is noted, not checked."""
    name = str(par.get("pipeline_parallel_schedule", "1F1B"))
    if pp == 1:
        if TT_SCHEDULES.get(name.lower(), ("1f1b", 1))[1] > 1 or name.lower() not in TT_SCHEDULES:
            view.notes.append(f"pipeline_parallel_schedule {name!r} with pp 1: unused (torchtitan builds a pipeline "
                              "schedule only when pipeline parallelism is on); checked without a pipeline")
        return "1f1b", 1
    schedule, stages_per_rank = TT_SCHEDULES.get(name.lower(), ("1f1b", 1))
    if name.lower() not in TT_SCHEDULES:
        view.notes.append(f"pipeline_parallel_schedule {name!r}: not modelled; checked as 1F1B")
    if name.lower() in ("loopedbfs", "dualpipev"):
        view.notes.append(f"{name}: modelled as {schedule} with {stages_per_rank} stages per rank")
    return schedule, stages_per_rank


def _torchtitan_batch(train: dict, par: dict, pp: int, dp: int, view: ConfigView) -> tuple[int, int, int]:
    """(global batch, micro-batch, micro-batches per step) as torchtitan derives them (frameworks.md §1.3: local 8,
    global -1 = local x dp, PP micro-batch 1 sequence)."""
    local = train.get("local_batch_size", train.get("batch_size", 8))
    pp_mbs = par.get("pipeline_parallel_microbatch_size", 1)
    gbs = train.get("global_batch_size", -1)
    gbs = local * dp if gbs in (None, -1) else gbs
    ga = gbs // (local * dp) if gbs % (local * dp) == 0 else 1
    if gbs % (local * dp):
        view.errors.append(("global_batch_size", f"global_batch_size: {gbs} -> must be a multiple of local_batch_size "
                            f"{local} x data-parallel degree {dp} (torchtitan asserts it, frameworks.md §1.3)",
                            "set global_batch_size to a multiple of local_batch_size x dp"))
    if pp == 1:
        return gbs, local, ga
    if local % pp_mbs:
        view.errors.append(("num_micro_batches", f"local_batch_size {local} -> not divisible by "
                            f"pipeline_parallel_microbatch_size {pp_mbs} (ValueError)",
                            "use a local batch that the PP micro-batch divides"))
    m = max(1, local // pp_mbs) * ga
    if ga > 1:
        view.notes.append(f"gradient accumulation {ga} x a pipeline of {local // pp_mbs} micro-batches: modelled "
                          f"as one pipeline of {m} (one bubble instead of {ga})")
    return gbs, pp_mbs, m


def _torchtitan(doc: dict, gpus: int, over: dict, *, legacy: bool) -> ConfigView:
    _require_types(doc)
    par, train = doc.get("parallelism", {}), doc.get("training", {})
    era = "torchtitan <= 0.2 TOML" if legacy else "torchtitan 0.3 Python recipe"
    view = ConfigView("torchtitan" if legacy else "torchtitan-python", Framework.TORCHTITAN, {})
    tp, pp, dp, zero, hsdp = _torchtitan_degrees(par, gpus)
    schedule, stages_per_rank = _torchtitan_schedule(par, pp, view)
    gbs, mbs, m = _torchtitan_batch(train, par, pp, dp, view)
    rec, every = _torchtitan_ac(doc.get("activation_checkpoint"), legacy, view)
    view.recompute_every = every
    view.fields = {"tp": tp, "pp": pp, "dp": dp, "zero_stage": zero,
                   "offload": "optimizer+params" if train.get("enable_cpu_offload") else "none",
                   "micro_batch_size": mbs, "num_micro_batches": m, "recompute": rec,
                   "sequence_parallel": tp > 1 and par.get("enable_sequence_parallel",
                                                            TORCHTITAN.sequence_parallel_default),
                   "schedule": schedule,
                   "virtual_stages": 1} | ({"dp_shard": hsdp} if hsdp else {})
    # torch's context_parallel is a ring (p2p); experts borrow their ranks from FSDP (and TP): no etp key
    _cp_ep(view, cp=par.get("context_parallel_degree", 1), ep=par.get("expert_parallel_degree", 1))
    if legacy and par.get("context_parallel_degree", 1) > 1:  # frameworks.md §1.9: v0.2.2's rotate method
        given = par.get("context_parallel_rotate_method")
        method = f"{given}" if given else "allgather (the default)"
        view.notes.append(f"context_parallel_rotate_method {method}: the planner predicts torch's ring exchange "
                          "whatever the rotation")
    view.global_batch_size, view.seq_length = gbs, train.get("seq_len", 2048)
    mp = train.get("mixed_precision_param", "bfloat16")
    view.precision = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(mp)
    if mp not in ("bfloat16", "float32"):
        view.errors.append(("precision", f"mixed_precision_param: {mp!r} -> allowed: bfloat16, float32", "use bfloat16"))
    view.notes.insert(0, f"read as {era}")
    _torchtitan_stages(par, view, stages_per_rank)
    flavor = (doc.get("model") or {}).get("flavor")
    if flavor:
        view.model["flavor"] = str(flavor)
    _torchtitan_float8(doc, view)
    _torchtitan_compile(doc, view)
    _torchtitan_norm(doc, view)
    return view


def _torchtitan_compile(doc: dict, view: ConfigView) -> None:
    """torch.compile of the model: `[compile] enable = true` with "model" in `components` (its default
    ["model", "loss"]; the 0.3 recipe's CompileConfig(enable=True, ...) is read into the same section), or the
    older `[training] compile = true`. A compiled model moves profiles.COMPILED_ELEMENTWISE_SHARE of the eager
    elementwise traffic the torchtitan profile assumes (eager is torchtitan's default); what else compile changes
    (freed intermediates, async TP) is not credited."""
    section = doc.get("compile") or {}
    if not isinstance(section, dict):
        view.errors.append(("compile", f"compile: {section!r} -> a section (enable, components, ...)",
                            "write a compile section (TOML table) with enable = true"))
        return
    allowed = ("model", "loss")  # torchtitan's CompileConfig.__post_init__ raises ValueError for anything else
    components = section.get("components", list(allowed))  # its default: both
    if not isinstance(components, list) or any(c not in allowed for c in components):
        view.errors.append(("compile", f"compile.components: {components!r} -> allowed: a list of 'model', 'loss'",
                            "list the components to compile: \"model\" and/or \"loss\""))
        return
    if section.get("enable") is True and "model" in components:
        how = "compile.enable with 'model' in compile.components"
    elif isinstance(doc.get("training"), dict) and doc["training"].get("compile") is True:
        how = "training.compile"
    else:
        if section:  # a compile section that does not switch the model's compile on (enable absent or false)
            view.notes.append("compile section without enable = true for the model: predicted eager (torchtitan's "
                              "default)")
        return
    compiled_model(view, how)


def _torchtitan_norm(doc: dict, view: ConfigView) -> None:
    """`[model] norm_type = "rmsnorm"` (torchtitan's train_configs from 2024-05 until the field went, 2025-02) runs
    torchtitan's own RMSNorm class, `_norm(x.float()).type_as(x) * self.weight` (torchtitan/models/norms.py): eager,
    each norm saves the fp32 upcast of its input (Knobs.norm_fp32_upcast). 'fused_rmsnorm' (Triton) and the layer
    norms save their input; a compiled model fuses the norm (the knob then moves nothing)."""
    if (doc.get("model") or {}).get("norm_type") != "rmsnorm" or "compiled_elementwise_share" in view.knobs:
        return
    view.knobs["norm_fp32_upcast"] = (
        True, "model.norm_type = 'rmsnorm': torchtitan's eager RMSNorm saves the fp32 upcast of each norm's input "
              f"({NORM_FP32_UPCAST_BYTES_PER_ELEMENT} B per element, two norms a layer; torchtitan/models/norms.py)")


def compiled_model(view: ConfigView, how: str) -> None:
    """The config runs the model torch.compiled (`how`: the setting that says so): predicted with
    profiles.COMPILED_ELEMENTWISE_SHARE of the eager elementwise traffic, and a note."""
    view.knobs["compiled_elementwise_share"] = (
        COMPILED_ELEMENTWISE_SHARE.value,
        f"{how}: torch.compile fuses the model's elementwise kernels, {COMPILED_ELEMENTWISE_SHARE.value:.0%} of the "
        "eager traffic (profiles.COMPILED_ELEMENTWISE_SHARE)")


def _torchtitan_float8(doc: dict, view: ConfigView) -> None:
    """The TOML's float8 converter (frameworks.md §1.9: `[model] converters = ["float8"]`, `[quantize.linear.float8]`
    recipe_name, None = tensorwise, and enable_fsdp_float8_all_gather), or a Python recipe's
    Float8LinearConverter.Config(recipe_name=..., default rowwise), as _python_recipe writes it into those sections."""
    converters = (doc.get("model") or {}).get("converters") or []
    if "float8" not in converters:
        if view.format == "torchtitan-python":
            view.notes.append("no Float8LinearConverter.Config in this recipe: checked without FP8 unless --precision fp8 "
                              "(torchtitan's FP8 is a model converter: frameworks.md §1.9)")
        return
    section = ((doc.get("quantize") or {}).get("linear") or {}).get("float8") or {}
    recipe = section.get("recipe_name") or "tensorwise"
    allowed = capabilities(Framework.TORCHTITAN).fp8_recipes
    if recipe == "rowwise_with_gw_hp":  # rowwise, the weight gradient's GEMM kept in high precision
        view.notes.append("float8 recipe_name rowwise_with_gw_hp: checked as rowwise (its weight-gradient GEMM in "
                          "bf16 is not modelled)")
        recipe = "rowwise"
    if recipe not in allowed:
        raise SpecError(f"quantize.linear.float8.recipe_name: {recipe!r} -> the planner models {', '.join(allowed)}")
    view.precision, view.fp8_recipe = "fp8", recipe
    view.fp8_param_gather = bool(section.get("enable_fsdp_float8_all_gather", False))


def _torchtitan_ac(ac: dict | None, legacy: bool, view: ConfigView) -> tuple[str, int | None]:
    if ac is None:  # the default is selective (frameworks.md §1.5)
        view.notes.append("no activation_checkpoint section: torchtitan's default is selective "
                          + ("(layer SAC, every 2nd block)" if legacy else "(per-op SAC)"))
        ac = {"mode": "selective"}
    mode = ac.get("mode", "selective")
    if mode in ("none", "full"):
        return mode, None
    if mode == "memory_budget":
        view.notes.append("activation_checkpoint memory_budget: modelled as selective")
        return "selective", None
    option = str(ac.get("selective_ac_option", "2" if legacy else "op"))
    if option.isdigit() and legacy:
        return "none", int(option)  # every N-th block fully recomputed, the others save everything
    if option.isdigit():
        view.notes.append(f"selective_ac_option {option}: layer SAC was removed in 0.3 (per-op SAC runs)")
    view.notes.append("per-op SAC: the torchtitan profile's selective (cost_models/op_sac.py: every 2nd matmul and "
                      "every elementwise op recomputed, not Megatron's core attention)")
    return "selective", None


def _torchtitan_stages(par: dict, view: ConfigView, stages_per_rank: int) -> None:
    pp = view.fields["pp"]
    if pp == 1:
        return
    fqns = par.get("module_fqns_per_model_part")
    if fqns:
        view.stage_layers = [sum(1 for n in part if str(n).startswith("layers.")) for part in fqns]
        return
    view.layers_per_chunk = par.get("pipeline_parallel_layers_per_stage")
    view.model["first_less"] = par.get("pipeline_parallel_first_stage_less_layers", 1)
    view.model["last_less"] = par.get("pipeline_parallel_last_stage_less_layers", 1)
    view.model["stages_per_rank"] = stages_per_rank


def torchtitan_resolve(view: ConfigView, num_layers: int) -> None:
    """Stage split, virtual stages and layer SAC once the model's layer count is known."""
    f = view.fields
    pp = f["pp"]
    stages = view.stage_layers
    if pp > num_layers:  # said before any per-stage list is built (a degree of 2**63 must not build one)
        view.errors.append(("pp*virtual_stages", f"pipeline_parallel_degree: {pp} -> at most the model's "
                            f"{num_layers} layers", "use fewer pipeline stages"))
        return
    if pp > 1 and stages is None:
        first, last = view.model.get("first_less", 1), view.model.get("last_less", 1)
        lps = view.layers_per_chunk
        count = -(-(num_layers + first + last) // lps) if lps else pp * view.model.get("stages_per_rank", 1)
        if count > num_layers + first + last or count < pp:
            view.errors.append(("layers_per_stage", f"torchtitan split: {count} stages for {num_layers} layers -> "
                                "torchtitan refuses more stages than effective layers (ValueError)",
                                "use more layers per stage"))
            return
        if count % pp:
            view.errors.append(("pp*virtual_stages", f"pipeline stages: {count} -> must be a multiple of pp ({pp})",
                                "choose pipeline_parallel_layers_per_stage so the stage count divides by pp"))
            return
        stages = torchtitan_default_split(num_layers, count, first, last)
        if min(stages) < 0 or first > (num_layers + first + last) // count:
            view.errors.append(("layers_per_stage", f"torchtitan split: {stages} -> a stage would hold fewer layers "
                                "than its embedding/output allowance (ValueError)", "use fewer stages"))
            return
    if stages is not None and pp > 1:
        v = len(stages) // pp
        if f["schedule"] == "zero_bubble" and v == 2 and "zbv" in str(view.model.get("schedule_name", "zbv")):
            per_rank = [stages[r] + stages[2 * pp - 1 - r] for r in range(pp)]
        else:
            per_rank = [sum(stages[r::pp]) for r in range(pp)]
        if f["schedule"] == "interleaved_1f1b":
            f["virtual_stages"] = max(2, v)
        uneven_chunks = f["schedule"] == "interleaved_1f1b" and len(set(stages)) > 1  # not the even chunks None means
        if len(set(per_rank)) > 1 or sum(per_rank) != num_layers or per_rank != list(stage_split(num_layers, pp)) \
                or uneven_chunks:
            f["layers_per_stage"] = per_rank
    if view.recompute_every:
        per_stage = f.get("layers_per_stage") or list(stage_split(num_layers, pp))
        f["recompute_layers_per_stage"] = [n // view.recompute_every for n in per_stage]


# ---- Megatron-LM / Megatron-DeepSpeed ------------------------------------------------------------------------


MEGATRON_DEFAULT_DROPOUT = 0.1


@functools.cache
def megatron_parser() -> argparse.ArgumentParser:
    """The Megatron-LM (and Megatron-DeepSpeed) options the planner reads or writes, as their arguments.py names them.
    Built once per process (parsing does not change it)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    ints = ["--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size",
            "--global-batch-size", "--seq-length", "--num-layers", "--hidden-size", "--ffn-hidden-size",
            "--num-attention-heads", "--max-position-embeddings", "--num-query-groups", "--recompute-num-layers",
            "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
            "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--context-parallel-size",
            "--data-parallel-size", "--zero-stage", "--checkpoint-num-layers", "--padded-vocab-size",
            "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--ds-sequence-parallel-size",
            "--vocab-size", "--num-experts", "--mtp-num-layers", "--num-distributed-optimizer-instances",
            "--kv-channels", "--num-key-value-heads"]
    for name in ints:
        p.add_argument(name, type=int)
    for name in ["--sequence-parallel", "--use-distributed-optimizer", "--use-torch-fsdp2", "--use-megatron-fsdp",
                 "--bf16", "--fp16", "--swiglu", "--squared-relu", "--untie-embeddings-and-output-weights",
                 "--disable-bias-linear",
                 "--group-query-attention", "--optimizer-cpu-offload", "--use-precision-aware-optimizer",
                 "--recompute-activations", "--checkpoint-activations", "--deepspeed", "--no-pipeline-parallel",
                 "--enable-zbh1-pipeline", "--cpu-optimizer", "--no-gradient-accumulation-fusion",
                 "--deepspeed-activation-checkpointing", "--partition-activations", "--overlap-grad-reduce",
                 "--overlap-param-gather", "--tp-comm-overlap", "--no-overlap-p2p-communication",
                 "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                 "--qk-layernorm", "--add-qkv-bias", "--use-rotary-position-embeddings"]:
        p.add_argument(name, action="store_true")
    p.add_argument("--recompute-granularity", choices=["full", "selective"])
    p.add_argument("--recompute-modules", nargs="*")
    p.add_argument("--recompute-method", choices=["uniform", "block"])
    p.add_argument("--cp-comm-type", nargs="+", choices=list(CP_COMM_OF))  # one type, or one per layer
    p.add_argument("--fp8-format", choices=["e4m3", "hybrid"])
    p.add_argument("--fp8-recipe", choices=["tensorwise", "delayed", "mxfp8", "blockwise", "custom"])
    p.add_argument("--fp8-param-gather", action="store_true")
    p.add_argument("--data-parallel-sharding-strategy",
                   choices=["no_shard", "optim", "optim_grads", "optim_grads_params"])
    for name in ["--normalization", "--position-embedding-type", "--deepspeed_config", "--deepspeed-config",
                 "--pp-partition-method",
                 "--ckpt-format", "--tokenizer-type", "--make-vocab-size-divisible-by",
                 "--pipeline-model-parallel-layout", "--window-size", "--step-batch-size-schedule"]:
        p.add_argument(name)
    p.add_argument("--optimizer-offload-fraction", type=float)
    for name in ["--attention-dropout", "--hidden-dropout"]:
        p.add_argument(name, type=float)
    # the gradient buffer and the precision-aware optimizer's states (Megatron-LM arguments.py choices)
    for name in ["--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"]:
        p.add_argument(name, action="store_true")
    p.add_argument("--main-grads-dtype", choices=["fp32", "bf16"])
    p.add_argument("--main-params-dtype", choices=["fp32", "fp16"])
    for name in ["--exp-avg-dtype", "--exp-avg-sq-dtype"]:
        p.add_argument(name, choices=["fp32", "fp16", "bf16", "fp8"])
    return p


# options that do not change memory or time (naming them as ignored would be noise)
_HARMLESS = re.compile(r"^--(lr|min-lr|lr-\S+|weight-decay|adam-\S+|clip-grad|init-method-std|seed|data-\S+|split|"
                       r"vocab-file|merge-file|tokenizer-\S+|save\S*|load\S*|log\S*|tensorboard\S*|wandb\S*|"
                       r"eval-\S+|train-iters|train-samples|train-tokens|exit-\S+|distributed-backend|"
                       r"hysteresis|loss-scale\S*|initial-loss-scale|min-loss-scale|"
                       r"no-masked-softmax-fusion|no-bias-gelu-fusion|no-bias-dropout-fusion|micro-batch-times\S*|"
                       r"timing-log\S*|profile\S*|use-checkpoint-\S+|finetune|no-load-\S+|kill-switch\S*|"
                       r"rampup-\S+|num-workers|nproc_per_node|nnodes|node_rank|master_addr|master_port|rdzv\S*|reset-\S+|eod-mask-loss|use-flash-attn\S*|lr-decay-\S+|"
                       r"lr-warmup-\S+|override-opt_param-scheduler|dataloader-type|mock-data|bias-gelu-fusion|"
                       r"masked-softmax-fusion|no-async-tensor-model-parallel-allreduce|pipeline-model-parallel-"
                       r"split-rank|use-mcore-models|transformer-impl|attention-softmax-in-fp32|seq-length)$")
def megatron_tokens(text: str, source: str) -> tuple[list[str], dict[str, str], ShellRead]:
    """(Megatron's arguments, the variables the script sets, the whole read) of an argument file or launch script
    (planner/integrations/shell.py reads it as bash would). The arguments are those of the launch that passes the
    most options the planner reads; a file that launches nothing is an argument file (its commands' words), or an
    argument snippet held only in variables (GPT_ARGS="...")."""
    try:
        read = read_script(text)
    except ShellError as exc:
        raise SpecError(str(exc), source=source) from None
    except RecursionError:
        raise SpecError("the script nests expansions too deeply to read -> pass the expanded arguments (e.g. run "
                        "the script with `set -x`)", source=source) from None
    known = _megatron_options()
    launch = max(read.launches, key=lambda la: sum(w.partition("=")[0] in known for w in la.argv), default=None)
    if launch is not None:
        if len(read.launches) > 1:
            read.notes.append(f"{len(read.launches)} launches (lines {', '.join(str(la.line) for la in read.launches)}"
                              f"): read the one at line {launch.line}, which passes the most options the planner "
                              "reads")
        return launch.argv, read.env, read
    if read.hidden or read.stopped:
        what = (f"{read.hidden[0]}: the only launch, under a branch that cannot be decided" if read.hidden else
                f"{read.stopped}: the script exits there, before any launch, on the path read")
        raise SpecError(f"{what} -> state the values the conditions test in the file, or pass the expanded arguments "
                        "(e.g. run the script with `set -x`)", source=source)
    tokens = [t for t in read.commands if not t.endswith(".py") and t not in ("torchrun", "python", "deepspeed")]
    if not any(t.startswith("--") for t in tokens):
        tokens = [t for v in read.env.values() if v.lstrip().startswith("--") for t in v.split()]
    if not any(t.startswith("--") for t in tokens):  # checked as Megatron's defaults before (tp 1, fp32)
        raise SpecError("no launch (a command running a *.py file) and no Megatron options on the path bash takes "
                        "-> give the script that launches training, or its arguments", source=source)
    return tokens, read.env, read


def _megatron_options() -> set[str]:
    return {o for a in megatron_parser()._actions for o in a.option_strings}


def _parse_megatron(tokens: list[str], read: ShellRead, source: str) -> tuple[argparse.Namespace, list[str]]:
    parser = megatron_parser()
    unknown = refusals(tokens, read.unknown, _megatron_options())
    if unknown:
        raise SpecError(unknown, source=source)
    try:
        args, unknown = parser.parse_known_args(tokens)
    except (argparse.ArgumentError, ValueError) as exc:
        raise SpecError(f"Megatron arguments: {exc}", source=source) from None
    bad = [f"{a.option_strings[0]}: {getattr(args, a.dest)} -> must be >= {_MEGATRON_LEAST.get(a.dest, 1)}"
           for a in parser._actions if a.type is int and getattr(args, a.dest) is not None
           and getattr(args, a.dest) < _MEGATRON_LEAST.get(a.dest, 1)]
    if args.bf16 and args.fp16:
        bad.append("--bf16 and --fp16: both given -> at most one (Megatron's validate_args asserts it)")
    if bad:
        raise SpecError(bad, source=source)
    return args, unknown


# Megatron integer options that may be 0 (the rest are sizes, counts and degrees: >= 1)
_MEGATRON_LEAST = {"zero_stage": 0, "decoder_first_pipeline_num_layers": 0, "decoder_last_pipeline_num_layers": 0,
                   "mtp_num_layers": 0}


def _megatron(text: str, gpus: int, source: str) -> ConfigView:
    tokens, env, read = megatron_tokens(text, source)
    args, unknown = _parse_megatron(tokens, read, source)
    ds = args.deepspeed
    view = ConfigView("megatron-deepspeed" if ds else "megatron",
                      Framework.MEGATRON_DEEPSPEED if ds else Framework.MEGATRON, {})
    tp = args.tensor_model_parallel_size or 1
    pp = 1 if args.no_pipeline_parallel else (args.pipeline_model_parallel_size or 1)
    dp = args.data_parallel_size or _dp(gpus, tp, pp, args.context_parallel_size or 1, args.ds_sequence_parallel_size or 1)
    if not args.micro_batch_size:
        view.errors.append(("micro_batch_size", "micro_batch_size: missing -> Megatron requires --micro-batch-size",
                            "add --micro-batch-size"))
    mbs = args.micro_batch_size or 1
    gbs = args.global_batch_size or mbs * dp  # Megatron's default: mbs x dp (frameworks.md §2.2)
    m = gbs // (mbs * dp) if gbs % (mbs * dp) == 0 else max(1, gbs // (mbs * dp))
    view.fields = {"tp": tp, "pp": pp, "dp": dp, "zero_stage": _megatron_zero(args, view),
                   "offload": "optimizer" if (args.optimizer_cpu_offload or args.cpu_optimizer) else "none",
                   "micro_batch_size": mbs, "num_micro_batches": max(1, m),
                   "recompute": "none", "sequence_parallel": bool(args.sequence_parallel)}
    _megatron_recompute(args, view, ds)
    _megatron_pipeline(args, view, ds)
    _megatron_cp_ep(args, view, ds)
    if not ds:
        partial_distributed_optimizer(view, args.num_distributed_optimizer_instances,
                                      "--num-distributed-optimizer-instances")
    view.global_batch_size, view.seq_length = gbs, args.seq_length
    _megatron_batch_schedule(args, view, unknown, ds)
    view.precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    if args.fp8_format:  # FP8 GEMMs over the 16-bit run (frameworks.md §2.8: --fp8-recipe defaults to delayed)
        view.precision, view.fp8_recipe = "fp8", args.fp8_recipe or "delayed"
        view.fp8_param_gather = args.fp8_param_gather
    elif args.fp8_param_gather:
        view.notes.append("--fp8-param-gather without --fp8-format: no FP8 training, so no FP8 gather; ignored")
    if view.fp8_recipe == "custom":
        view.notes.append("--fp8-recipe custom: a recipe from code the planner cannot see; checked as delayed")
        view.fp8_recipe = "delayed"
    _megatron_states(args, view)
    _megatron_model(args, view)
    if ds:
        view.model["partition_method"] = args.pp_partition_method or "type:transformer"
        _megatron_ds_config(args, view, source)
        if view.precision == "bf16" and view.fields["zero_stage"] == 0:  # the profile's zero0 recipe costs it
            from planner.frameworks.profiles import profile_for

            param, grad, optimizer = getattr(profile_for(Framework.MEGATRON_DEEPSPEED).memory.zero0, "state_bytes", (0,) * 3)
            view.notes.append("bf16 at ZeRO-0 under DeepSpeed's pipeline engine runs BF16_Optimizer: fp32 master "
                              f"weights and Adam state sharded over data parallel, {param:g} + {grad:g} + "
                              f"{optimizer:g}/d bytes per parameter (the gradients: its fp32 buffer and the "
                              "all-reduce's bf16 copy of it; frameworks.md §3.5), as plan and estimate cost zero=0 "
                              "for megatron-deepspeed")
    else:
        _megatron_overlap(args, view)
    _megatron_env(env, view)
    _ignored(unknown, view)
    view.notes += read.notes
    unresolved = unexpanded(tokens, read.unknown)
    if unresolved:
        view.notes.append(f"unexpanded shell variables (not in options the planner reads): {', '.join(unresolved)}")
    return view


def _megatron_batch_schedule(args: argparse.Namespace, view: ConfigView, unknown: list[str], ds: bool) -> None:
    """--step-batch-size-schedule (Megatron-LM; Megatron-DeepSpeed has no such option: listed as ignored there):
    with --global-batch-size given too, validate_args raises ValueError("Cannot specify both
    --step-batch-size-schedule and --global-batch-size", megatron/training/arguments.py@d98e8a64 L698-700); alone,
    the batch changes during the run, and the check holds the one Megatron sets first (micro x dp, L702-703)."""
    if args.step_batch_size_schedule is None:
        return
    if ds:
        unknown.append("--step-batch-size-schedule")
    elif args.global_batch_size is not None:
        view.errors.append(("global_batch_size", f"--step-batch-size-schedule {args.step_batch_size_schedule!r} with "
                            f"--global-batch-size {args.global_batch_size} -> Megatron-LM raises ValueError at "
                            "start-up (\"Cannot specify both --step-batch-size-schedule and --global-batch-size\", "
                            "arguments.py validate_args)", "drop --global-batch-size (the schedule sets the batch) or "
                            "the schedule"))
    else:
        view.notes.append(f"--step-batch-size-schedule {args.step_batch_size_schedule!r}: the batch changes during "
                          f"the run; checked at the global batch Megatron starts from, micro x dp = "
                          f"{view.global_batch_size}")


def _megatron_model(args: argparse.Namespace, view: ConfigView) -> None:
    """The model's shape as the flags give it (check compares it with --model), and its dropout as the run applies
    it: both probabilities default to 0.1 (TransformerConfig hidden_dropout and attention_dropout; Megatron-DeepSpeed's
    arguments.py the same)."""
    view.model.update({k: v for k, v in (("num_layers", args.num_layers), ("hidden_size", args.hidden_size),
                                         ("num_attention_heads", args.num_attention_heads),
                                         ("num_kv_heads", args.num_query_groups if args.group_query_attention
                                          else args.num_key_value_heads),
                                         ("ffn_hidden_size", args.ffn_hidden_size)) if v})
    view.model["dropout"] = any((p if p is not None else MEGATRON_DEFAULT_DROPOUT) > 0
                                for p in (args.attention_dropout, args.hidden_dropout))


def _megatron_states(args: argparse.Namespace, view: ConfigView) -> None:
    """The gradient buffer and optimizer-state dtypes: --grad-reduce-in-bf16 or --main-grads-dtype bf16 keep bf16 main
    gradients under --bf16, --accumulate-allreduce-grads-in-fp32 fp32 ones under --fp16 (arguments.py validate_args);
    --main-params-dtype / --exp-avg-dtype / --exp-avg-sq-dtype below fp32 need --use-precision-aware-optimizer
    (Megatron-Core's OptimizerConfig asserts fp32 states without it), which needs the distributed optimizer (check)."""
    states: dict[str, str] = {}
    if args.grad_reduce_in_bf16 or args.main_grads_dtype == "bf16":
        if args.bf16:
            states["grad_dtype"] = "bf16"
        else:
            view.notes.append("--grad-reduce-in-bf16 / --main-grads-dtype bf16 without --bf16: Megatron reads them "
                              "only for bf16 runs; ignored")
    elif args.accumulate_allreduce_grads_in_fp32 and args.fp16:
        states["grad_dtype"] = "fp32"
    given = (("master_dtype", "--main-params-dtype", args.main_params_dtype),
             ("exp_avg_dtype", "--exp-avg-dtype", args.exp_avg_dtype),
             ("exp_avg_sq_dtype", "--exp-avg-sq-dtype", args.exp_avg_sq_dtype))
    low = [(flag, value) for _, flag, value in given if value not in (None, "fp32")]
    if args.main_grads_dtype == "bf16":
        low.insert(0, ("--main-grads-dtype", "bf16"))
    if low and not args.use_precision_aware_optimizer:
        flags = ", ".join(f"{f} {v}" for f, v in low)
        view.errors.append(("optimizer_states", f"{flags} without --use-precision-aware-optimizer -> Megatron-Core "
                            "keeps fp32 states without it (OptimizerConfig asserts them)",
                            "add --use-precision-aware-optimizer (with --use-distributed-optimizer)"))
    states.update({key: value for key, _, value in given if value not in (None, "fp32")})
    view.optimizer_states = states


def _megatron_cp_ep(args: argparse.Namespace, view: ConfigView, ds: bool) -> None:
    """--context-parallel-size with --cp-comm-type (Megatron-LM), --ds-sequence-parallel-size (Megatron-DeepSpeed's
    Ulysses: all-to-all), --expert-model-parallel-size and --expert-tensor-parallel-size."""
    cp, types = args.context_parallel_size or 1, sorted(set(args.cp_comm_type or ["p2p"]))
    if ds and (args.ds_sequence_parallel_size or 1) > 1:
        cp, types = args.ds_sequence_parallel_size, ["a2a"]
    if cp > 1 and len(types) > 1:
        view.notes.append(f"--cp-comm-type per layer ({', '.join(types)}): checked as {types[0]} in every layer")
    if cp > 1 and types[0] == "a2a+p2p":
        view.notes.append("--cp-comm-type a2a+p2p (hierarchical): checked as the p2p ring")
    etp = args.expert_tensor_parallel_size
    if etp is None and args.num_experts and not ds:  # Megatron-LM: None -> tp (frameworks.md §2.1, L587-588)
        etp = view.fields["tp"]
        if etp > 1:
            view.notes.append(f"--expert-tensor-parallel-size not given: Megatron-LM's default is tp ({etp})")
    _cp_ep(view, cp=cp, cp_comm=CP_COMM_OF[types[0]], ep=args.expert_model_parallel_size or 1, etp=etp or 1)


def _megatron_overlap(args: argparse.Namespace, view: ConfigView) -> None:
    """Megatron-LM overlaps nothing by default (frameworks.md §2.6): without --overlap-grad-reduce the gradient
    reduce (and the distributed optimizer's parameter gather) runs after backward, without --tp-comm-overlap the TP
    collectives sit on the critical path. The Megatron profile assumes the performance recipes' flags."""
    f = view.fields
    if f["dp"] > 1 and not args.overlap_grad_reduce:
        view.knobs["dp_overlap_fraction"] = (0.0, "no --overlap-grad-reduce: the gradient reduce runs after backward")
        view.knobs["zero3_overlap_fraction"] = view.knobs["dp_overlap_fraction"]
    if f["tp"] > 1 and not args.tp_comm_overlap:
        view.knobs["tp_overlap_fraction"] = (0.0, "no --tp-comm-overlap: the TP collectives are not hidden")
    if f.get("virtual_stages", 1) > 1 and args.no_overlap_p2p_communication:
        view.knobs["pp_overlap_fraction"] = (0.0, "--no-overlap-p2p-communication: the interleaved schedule's "
                                                  "send/recv are not hidden")


def _megatron_ds_config(args: argparse.Namespace, view: ConfigView, source: str) -> None:
    """Megatron-DeepSpeed: ZeRO offload lives in the --deepspeed_config JSON; read it when it sits beside the file."""
    name = args.deepspeed_config or getattr(args, "deepspeed-config", None)
    path = Path(source).parent / name if name and "$" not in name else None
    if path is None or not path.is_file():
        view.notes.append(f"--deepspeed_config {name or '(none)'}: not found beside the file; ZeRO offload and the "
                          "batch triad in it are not checked (check the JSON too, with --tp/--pp)")
        return
    from cluster_specs.reading import parse_json, read_text

    doc = parse_json(read_text(path), str(path))
    zero = (doc.get("zero_optimization") or {}) if isinstance(doc, dict) else {}
    if args.zero_stage is None and "stage" in zero:
        view.fields["zero_stage"] = ds_zero_stage(zero, view)
    off = ds_offload(zero, view.fields["zero_stage"], view)
    if off != "none":
        view.fields["offload"] = off
    ds_overlap(zero, view.fields["zero_stage"], view)
    ds_mics(zero, view)
    view.notes.append(f"read ZeRO settings from {name}")


def partial_distributed_optimizer(view: ConfigView, instances: int | None, name: str) -> None:
    """Megatron-Core's partial distributed optimizer (`name` = R instances): hybrid sharding, the distributed
    optimizer over dp / R ranks (LayoutSpec.dp_shard), with ZeRO-1 only; R must divide dp (Megatron asserts it)."""
    if instances is None or instances <= 1:
        return
    dp = view.fields["dp"]
    if view.fields["zero_stage"] != 1:
        view.notes.append(f"{name} {instances} without the distributed optimizer: it applies to the distributed "
                          "optimizer only (ignored)")
    elif dp % instances:
        view.errors.append(("dp_shard", f"{name}: {instances} -> must divide the data-parallel size {dp}",
                            "give a divisor of the data-parallel size"))
    else:
        view.fields["dp_shard"] = dp // instances


def _megatron_zero(args: argparse.Namespace, view: ConfigView) -> int:
    if args.zero_stage is not None and args.deepspeed:
        return args.zero_stage
    if args.use_megatron_fsdp:
        strategy = args.data_parallel_sharding_strategy or "optim_grads_params"
        return {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}[strategy]
    if args.use_torch_fsdp2:
        if not args.no_gradient_accumulation_fusion:
            view.errors.append(("zero_stage", "--use-torch-fsdp2 without --no-gradient-accumulation-fusion -> "
                                "Megatron refuses FSDP2 with gradient-accumulation fusion (frameworks.md §2.7 rule 8)",
                                "add --no-gradient-accumulation-fusion"))
        return 3
    if args.zero_stage is not None:
        view.notes.append(f"--zero-stage {args.zero_stage}: read only with --deepspeed (Megatron-DeepSpeed)")
    return 1 if args.use_distributed_optimizer else 0


# what the cost model's selective recomputes: the attention core, or on an MLA model its up-projections
_SELECTIVE_MODULES = {"core_attn", "mla_up_proj"}


def _note_recompute_modules(view: ConfigView, modules: list[str] | None) -> None:
    """Megatron's --recompute-modules (default core_attn): modules beyond the attention core (an MLA model's
    mla_up_proj) are predicted as the cost model's selective, and the note says so."""
    other = sorted(set(modules or []) - _SELECTIVE_MODULES)
    if other:
        view.notes.append(f"--recompute-modules {' '.join(modules or [])}: modelled as selective (the attention core; "
                          f"on an MLA model its up-projections); {', '.join(other)} not modelled one by one: their "
                          "activations are counted as kept and their recompute is not timed, so peak memory is "
                          "over-stated (a memory failure may not hold) and the step time under-stated")


def _megatron_recompute(args: argparse.Namespace, view: ConfigView, ds: bool) -> None:
    f = view.fields
    if args.checkpoint_activations:
        if ds:  # Megatron-DeepSpeed: chunks of --checkpoint-num-layers, every layer recomputed (§3.4)
            f["recompute"] = "full"
        else:
            view.errors.append(("recompute", "--checkpoint-activations -> Megatron-LM prints \"no longer valid\" and "
                                "exits (frameworks.md §2.4)", "use --recompute-granularity full --recompute-method "
                                "uniform --recompute-num-layers 1"))
            f["recompute"] = "full"
        return
    gran = args.recompute_granularity or ("selective" if args.recompute_activations else None)
    if gran == "selective":
        f["recompute"] = "selective"
        _note_recompute_modules(view, args.recompute_modules)
    elif gran == "full":
        method, n = args.recompute_method, args.recompute_num_layers
        if method is None or (n is None and not ds):
            view.errors.append(("recompute", "--recompute-granularity full needs --recompute-method and "
                                "--recompute-num-layers (ValueError, frameworks.md §2.4)",
                                "add --recompute-method uniform --recompute-num-layers 1"))
        if method == "block":
            view.model["recompute_block"] = n if n is not None else 1
        else:
            f["recompute"] = "full"


def _megatron_pipeline(args: argparse.Namespace, view: ConfigView, ds: bool) -> None:
    f = view.fields
    pp = f["pp"]
    flags = SplitFlags(args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers,
                       args.account_for_embedding_in_pipeline_split, args.account_for_loss_in_pipeline_split)
    if args.pipeline_model_parallel_layout is not None and ds:
        view.notes.append("--pipeline-model-parallel-layout: a Megatron-Core option, not Megatron-DeepSpeed's (its "
                          "stages follow --pp-partition-method); ignored")
    elif args.pipeline_model_parallel_layout is not None:
        vpp_flags = [name for name, given in (("--num-layers-per-virtual-pipeline-stage",
                                                args.num_layers_per_virtual_pipeline_stage),
                                               ("--num-virtual-stages-per-pipeline-rank",
                                                args.num_virtual_stages_per_pipeline_rank)) if given]
        if vpp_flags:
            view.errors.append(("pp*virtual_stages", f"--pipeline-model-parallel-layout with {', '.join(vpp_flags)} -> "
                                "Megatron takes the virtual stages from one of them only (frameworks.md §2.3)",
                                "drop " + ", ".join(vpp_flags)))
        read_layout(view, args.pipeline_model_parallel_layout, flags, args.mtp_num_layers,
                    "--pipeline-model-parallel-layout")
        _megatron_sp(view)
        return
    if args.num_layers_per_virtual_pipeline_stage:
        # vpp = (L'/pp)/n once the layer count is known (megatron_resolve); L' counts the account-for layers
        f["schedule"] = "interleaved_1f1b"
        view.model["layers_per_virtual_stage"] = args.num_layers_per_virtual_pipeline_stage
    elif args.num_virtual_stages_per_pipeline_rank and args.num_virtual_stages_per_pipeline_rank > 1:
        f.update(schedule="interleaved_1f1b", virtual_stages=args.num_virtual_stages_per_pipeline_rank)
    if ds and args.enable_zbh1_pipeline and pp > 1:
        f["schedule"] = "zero_bubble"
    if args.mtp_num_layers:
        view.notes.append(_mtp_note(args.mtp_num_layers, "--mtp-num-layers"))
    if flags != SplitFlags() and pp > 1:
        view.model["split_flags"] = flags
        if args.num_layers_per_virtual_pipeline_stage and (flags.first is not None or flags.last is not None):
            view.errors.append(("layers_per_stage", "--num-layers-per-virtual-pipeline-stage with --decoder-first/last-"
                                "pipeline-num-layers -> Megatron refuses the pair (frameworks.md §2.3)",
                                "use --num-virtual-stages-per-pipeline-rank"))
    _megatron_sp(view)


def _mtp_note(layers: int, option: str) -> str:
    return (f"{layers} multi-token-prediction layer(s) ({option}): not costed (the planner's models exclude the MTP "
            "module), so the memory and time of the stage that holds them are under-stated")


def read_layout(view: ConfigView, text: str, flags: SplitFlags, mtp_layers: int | None, name: str) -> None:
    """A Megatron-Core pipeline layout string: its virtual stages now, its split once the layer count is known
    (megatron_resolve). `name` is the option as the config spells it (Megatron-LM's flag or Bridge's field)."""
    f = view.fields
    if flags != SplitFlags():
        view.errors.append(("layers_per_stage", f"{name} with {flags.describe()} -> Megatron-Core raises ValueError "
                            "(\"cannot be set with other pipeline layout arguments\", frameworks.md §2.3)",
                            f"keep {name} only"))
    try:
        layout = parse_layout(text, f["pp"])
    except MegatronSplitError as exc:
        view.errors.append(("layers_per_stage", f"{name} {shorten(text)!r}: {exc} -> Megatron-Core refuses it at start-up "
                            "(frameworks.md §2.3)", "write one '|'-separated stage per pipeline rank and virtual stage"))
        return
    view.model["pipeline_layout"] = (layout, mtp_layers)
    if layout.virtual_stages > 1:
        f.update(schedule="interleaved_1f1b", virtual_stages=layout.virtual_stages)
    if layout.count("m"):
        view.notes.append(_mtp_note(layout.count("m"), f"'m' in {name}"))


def _megatron_sp(view: ConfigView) -> None:
    f = view.fields
    if f["sequence_parallel"] and f["tp"] == 1:
        f["sequence_parallel"] = False
        view.notes.append("--sequence-parallel with tp=1: Megatron disables it with a warning (\"Disabling sequence "
                          "parallelism because tensor model parallelism is disabled\"); checked without it")


def _resolve_layout(view: ConfigView, num_layers: int) -> None:
    """A pipeline layout string's per-rank split (read_layout parsed it)."""
    layout, mtp_layers = view.model["pipeline_layout"]
    try:
        split = layout_stage_layers(layout, num_layers, mtp_layers)
    except MegatronSplitError as exc:
        view.errors.append(("layers_per_stage", f"pipeline layout {shorten(layout.text)!r}: {exc} -> Megatron-Core "
                            "refuses it at start-up (frameworks.md §2.3)", "list every decoder layer once, between E and "
                            "L"))
    else:
        empty = [rank for rank, n in enumerate(split) if n == 0]
        if empty:
            view.errors.append(("layers_per_stage", f"pipeline layout {shorten(layout.text)!r}: pipeline rank(s) "
                                f"{', '.join(map(str, empty))} build no decoder layer -> Megatron-Core accepts "
                                "it; the planner costs only stages that hold decoder layers",
                                "give every pipeline rank at least one 't'"))
        elif view.fields["pp"] > 1:
            view.fields["layers_per_stage"] = split


def megatron_resolve(view: ConfigView, num_layers: int) -> None:
    """Uneven split and block recompute once the model's layer count is known (frameworks.md §2.3, §2.4)."""
    f = view.fields
    pp, v = f["pp"], f.get("virtual_stages", 1)
    per_chunk = view.model.get("layers_per_virtual_stage")
    flags = view.model.get("split_flags", SplitFlags())
    if per_chunk:
        per_rank = (num_layers + flags.embedding + flags.loss) // pp
        if per_rank % per_chunk:
            view.errors.append(("pp*virtual_stages", f"--num-layers-per-virtual-pipeline-stage {per_chunk}: {per_rank} "
                                "layers per pipeline rank do not divide into it (Megatron asserts; frameworks.md §2.3)",
                                "choose a layer count per virtual stage that divides the layers per rank"))
        v = max(1, per_rank // per_chunk)
        f["virtual_stages"] = v
        if v == 1:
            f["schedule"] = "1f1b"
    if "pipeline_layout" in view.model:
        _resolve_layout(view, num_layers)
    elif "split_flags" in view.model:
        try:
            f["layers_per_stage"] = stage_layers(num_layers, pp, v, flags)
        except MegatronSplitError as exc:
            view.errors.append(("layers_per_stage", f"{flags.describe()}: {exc} -> Megatron refuses it at start-up "
                                "(frameworks.md §2.3)", "choose a split Megatron builds"))
    elif pp > 1 and view.framework is Framework.MEGATRON_DEEPSPEED:
        # DeepSpeed's PipelineModule partitions any count (no even-split assert); with 'type:transformer|embedding'
        # (BLOOM's --pp-partition-method) the embedding and the output count as a layer each (type:<regex> balances the matching layers, frameworks.md §3 "Layer split")
        if "embedding" in str(view.model.get("partition_method", "")):
            split = torchtitan_default_split(num_layers, pp, 1, 1)
            if min(split) >= 1 and split != list(stage_split(num_layers, pp)):
                f["layers_per_stage"] = split
    elif pp > 1 and num_layers % pp:
        view.errors.append(("num_layers", f"num_layers: {num_layers} -> not divisible by pp ({pp}) and no "
                            "--decoder-first/last-pipeline-num-layers or --account-for-embedding/loss-in-pipeline-"
                            "split (Megatron asserts an even split)",
                            "set --decoder-first/last-pipeline-num-layers, the account-for flags, or a pp that "
                            "divides the layers"))
    if "recompute_block" in view.model:
        n = view.model["recompute_block"]
        lps = f.get("layers_per_stage") or list(stage_split(num_layers, pp))
        f["recompute_layers_per_stage"] = [min(n * v, c) for c in lps]  # the first n of each model chunk


def _megatron_env(env: dict[str, str], view: ConfigView) -> None:
    conns = env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    f = view.fields
    if conns is None:
        return
    if f["zero_stage"] >= 2 and conns == "1" and view.framework is Framework.MEGATRON:
        view.errors.append(("environment", "CUDA_DEVICE_MAX_CONNECTIONS=1 with FSDP -> Megatron asserts it is not 1 "
                            "(frameworks.md §2.7 rule 7)", "export CUDA_DEVICE_MAX_CONNECTIONS=8"))


def _ignored(unknown: list[str], view: ConfigView) -> None:
    opts = sorted({u.split("=", 1)[0] for u in unknown if u.startswith("--")})
    relevant = [o for o in opts if not _HARMLESS.match(o)]
    if relevant:
        view.notes.append(f"ignored options that may change memory or time: {', '.join(relevant)}")


# ---- Megatron-Bridge (NeMo) overrides -------------------------------------------------------------------------

_OVERRIDE = re.compile(r"^[a-z_]+(\.[a-z_0-9]+)*=\S*$")


def _looks_like_overrides(text: str) -> bool:
    lines = [stmt for _, stmt in statements(text)]
    return bool(lines) and all(_OVERRIDE.match(line) for line in lines)


def _nemo_layout(view: ConfigView, layout: str | None, flags: SplitFlags, mtp: int | None, vpp: int) -> None:
    """Bridge's model.pipeline_model_parallel_layout (a string override) and model.mtp_num_layers."""
    if layout in (None, "null", "None"):
        if mtp:
            view.notes.append(_mtp_note(mtp, "model.mtp_num_layers"))
        return
    read_layout(view, str(layout).strip("'\""), flags, mtp, "model.pipeline_model_parallel_layout")
    got = view.fields.get("virtual_stages", 1)
    if vpp > 1 and "pipeline_layout" in view.model and got != vpp:
        view.errors.append(("pp*virtual_stages", f"model.virtual_pipeline_model_parallel_size {vpp} with a layout of "
                            f"{got} virtual stage(s) -> Megatron-Core asserts they agree (frameworks.md §2.3)",
                            "drop model.virtual_pipeline_model_parallel_size"))


def _nemo_int(kv: dict[str, str], key: str, default: int | None) -> int | None:
    """An integer override (null/None: the default); anything else is an error naming the key, not a traceback."""
    v = kv.get(key)
    if v in (None, "null", "None"):
        return default
    try:
        n = int(v)
    except ValueError:
        raise SpecError(f"{key}: {v!r} -> an integer (or null)") from None
    least = 0 if key in _NEMO_ZERO_OK else 1
    if n < least:  # sizes, counts and degrees: Megatron-Core's configs assert them positive
        raise SpecError(f"{key}: {n} -> must be >= {least}")
    return n


_NEMO_ZERO_OK = ("model.num_layers_in_first_pipeline_stage", "model.num_layers_in_last_pipeline_stage",
                 "model.mtp_num_layers")


def _nemo_fp8_recipe(mixed: str) -> str | None:
    """The FP8 recipe a Megatron-Bridge mixed_precision recipe name runs (None: a 16-bit one, or none given); a name
    Bridge does not have is an error."""
    fp8 = {name: recipe for recipe, name in NEMO_FP8_MIXED_PRECISION.items()}.get(mixed)
    if mixed not in ("", "null", "None", "bf16_mixed", "fp16_mixed") and fp8 is None:
        raise SpecError(f"mixed_precision: {mixed!r} -> a Megatron-Bridge recipe name: bf16_mixed, fp16_mixed, "
                        f"{', '.join(NEMO_FP8_MIXED_PRECISION.values())}")
    return fp8


def _nemo(text: str, gpus: int) -> ConfigView:
    return nemo_view(dict(stmt.split("=", 1) for _, stmt in statements(text)), gpus)


def _nemo_yaml(doc: object, gpus: int, source: str) -> ConfigView:
    """A NeMo YAML config (planner/integrations/nemo_yaml.py) read as the overrides it amounts to."""
    from planner.integrations.nemo_yaml import launcher_extras, launcher_names, yaml_overrides

    kv, fmt = yaml_overrides(doc, source)
    try:
        view = nemo_view(kv, gpus, fmt)
    except SpecError as exc:  # a launcher file's problems in its own keys (model.micro_batch_size), not Bridge's
        if fmt != "nemo-launcher":
            raise
        raise SpecError([launcher_names(p) for p in exc.problems], source=exc.source or source) from None
    if fmt == "nemo-launcher":
        assert isinstance(doc, dict)  # yaml_overrides said so
        launcher_extras(doc, view, gpus)
    view.notes.insert(0, "read as a NeMo-Framework-Launcher training config (NeMo 1.x)" if fmt == "nemo-launcher"
                      else "read as Megatron-Bridge overrides (an override YAML)")
    return view


def nemo_view(kv: dict[str, str], gpus: int, fmt: str = "nemo") -> ConfigView:
    """Megatron-Bridge overrides (run_recipe.py's KEY=VALUE, or their YAML: planner/integrations/nemo_yaml.py) over
    the recipe they apply to, or a NeMo-Framework-Launcher config mapped to their names (fmt "nemo-launcher", a
    complete config: no recipe behind it)."""
    def num(key: str, default: int | None) -> int | None:
        return _nemo_int(kv, key, default)

    tp, pp = num("model.tensor_model_parallel_size", 1) or 1, num("model.pipeline_model_parallel_size", 1) or 1
    dp = _dp(gpus, tp, pp, num("model.context_parallel_size", 1) or 1)
    view = ConfigView(fmt, Framework.NEMO, {})
    mbs = num("train.micro_batch_size", None)
    gbs = num("train.global_batch_size", None)
    if mbs is None or gbs is None:  # Bridge has no fallback (frameworks.md §4.3)
        view.errors.append(("global_batch_size", "train.micro_batch_size / train.global_batch_size: Megatron-Bridge "
                            "requires both", "set both"))
    mbs = mbs or 1
    gbs = gbs or mbs * dp
    vpp = num("model.virtual_pipeline_model_parallel_size", 1) or 1
    view.fields = {"tp": tp, "pp": pp, "dp": dp, "zero_stage": _nemo_zero(kv, view), "micro_batch_size": mbs,
                   "num_micro_batches": max(1, gbs // (mbs * dp)), "recompute": "none",
                   "sequence_parallel": kv.get("model.sequence_parallel") == "true",
                   "offload": "optimizer" if kv.get("optimizer.optimizer_cpu_offload") == "true" else "none"}
    if vpp > 1:
        view.fields.update(schedule="interleaved_1f1b", virtual_stages=vpp)
    comm = kv.get("model.cp_comm_type", "p2p")
    if comm not in CP_COMM_OF:
        raise SpecError(f"model.cp_comm_type: {comm!r} -> allowed: {', '.join(CP_COMM_OF)}")
    _cp_ep(view, cp=num("model.context_parallel_size", 1) or 1, cp_comm=CP_COMM_OF[comm],
           ep=num("model.expert_model_parallel_size", 1) or 1, etp=num("model.expert_tensor_parallel_size", 1) or 1)
    gran, method = kv.get("model.recompute_granularity"), kv.get("model.recompute_method")
    if gran == "selective":
        view.fields["recompute"] = "selective"
        modules = kv.get("model.recompute_modules")
        _note_recompute_modules(view, None if modules is None else modules.strip("[]").replace(",", " ").split())
    elif gran == "full" and method == "block":
        view.model["recompute_block"] = num("model.recompute_num_layers", 1)
    elif gran == "full":
        view.fields["recompute"] = "full"
    flags = SplitFlags(num("model.num_layers_in_first_pipeline_stage", None),
                       num("model.num_layers_in_last_pipeline_stage", None),
                       kv.get("model.account_for_embedding_in_pipeline_split") == "true",
                       kv.get("model.account_for_loss_in_pipeline_split") == "true")
    _nemo_layout(view, kv.get("model.pipeline_model_parallel_layout"), flags, num("model.mtp_num_layers", None), vpp)
    if flags != SplitFlags() and pp > 1 and "pipeline_layout" not in view.model:
        view.model["split_flags"] = flags
    if view.fields["sequence_parallel"] and tp == 1:
        view.errors.append(("sequence_parallel", "model.sequence_parallel=true with tp=1 -> Megatron-Core raises "
                            "ValueError under Megatron-Bridge (frameworks.md §4.5)", "set model.sequence_parallel=false"))
        view.fields["sequence_parallel"] = False
    view.global_batch_size, view.seq_length = gbs, num("dataset.seq_length", None)
    _nemo_precision(kv, view)
    _nemo_states(kv, view)
    if fmt == "nemo":
        _nemo_recipe_values(kv, view)
    return view


def _nemo_bool(kv: dict[str, str], key: str) -> bool | None:
    """A boolean override as Hydra's grammar reads it (true/false in any case); None where absent or not one."""
    return {"true": True, "false": False}.get(str(kv.get(key)).lower())


BRIDGE_COMMON = "Megatron-Bridge's _pretrain_common(), which every pretrain recipe builds on (recipes/common.py@067f987d"


def _nemo_zero(kv: dict[str, str], view: ConfigView) -> int:
    """ZeRO stage: the distributed optimizer (ddp.use_distributed_optimizer; absent: True, as _pretrain_common()
    sets it, L87, frameworks.md §4.4, for overrides; NeMo-Launcher configs always say), or Megatron-FSDP
    (ddp.use_megatron_fsdp or dist.use_megatron_fsdp, training/config.py L1484) at its sharding strategy."""
    given = _nemo_bool(kv, "ddp.use_distributed_optimizer")
    if given is None and view.format == "nemo":
        view.notes.append(f"ddp.use_distributed_optimizer not in the file: true, as {BRIDGE_COMMON} L87) sets it; "
                          "checked as ZeRO-1")
    zero = 0 if given is False else 1
    if _nemo_bool(kv, "ddp.use_megatron_fsdp") or _nemo_bool(kv, "dist.use_megatron_fsdp"):
        zero = {"optim_grads": 2, "optim": 1, "no_shard": 0}.get(kv.get("ddp.data_parallel_sharding_strategy", ""), 3)
    return zero


def _nemo_precision(kv: dict[str, str], view: ConfigView) -> None:
    """mixed_precision: a recipe name (frameworks.md §4.6: its FP8 recipes too), null for none (fp32); absent from
    overrides, _pretrain_common()'s bf16_mixed (L130), a default --precision overrides."""
    mixed = kv.get("mixed_precision")
    if mixed is None and view.format == "nemo":
        view.precision = "bf16"
        view.precision_default = f"mixed_precision not in the file: bf16_mixed, as {BRIDGE_COMMON} L130) sets it"
        return
    mixed = mixed or ""
    view.precision = {"bf16_mixed": "bf16", "fp16_mixed": "fp16", "null": "fp32", "None": "fp32"}.get(mixed)
    fp8 = _nemo_fp8_recipe(mixed)
    if fp8 is not None:  # Megatron-Bridge's FP8 mixed-precision recipes (frameworks.md §4.6)
        view.precision, view.fp8_recipe = "fp8", fp8


# the settings a Bridge recipe function sets for its model and GPU count (frameworks.md §4.4: e.g. llama3_70b's TP 4,
# PP 4, VPP 5, CP 2): overrides that leave them out run the recipe's values, which the planner cannot see
BRIDGE_RECIPE_SETS = {"model.tensor_model_parallel_size": "1", "model.pipeline_model_parallel_size": "1",
                      "model.context_parallel_size": "1", "model.recompute_granularity": "none"}


def _nemo_recipe_values(kv: dict[str, str], view: ConfigView) -> None:
    """A note naming the recipe-set values the overrides leave out, checked at Megatron-Core's defaults."""
    missing = [k for k in BRIDGE_RECIPE_SETS if k not in kv]
    if missing:
        view.notes.append(f"not in the file, so the recipe's values run, which the planner cannot see: "
                          f"{', '.join(missing)}; checked at Megatron-Core's defaults "
                          f"({', '.join(BRIDGE_RECIPE_SETS[k] for k in missing)}): pass --tp, --pp or --fix "
                          "cp=/recompute= with the recipe's")


def _nemo_states(kv: dict[str, str], view: ConfigView) -> None:
    """Megatron-Bridge's gradient buffer (MixedPrecisionConfig.grad_reduce_in_fp32, which it copies over
    ddp.grad_reduce_in_fp32 at setup), the precision-aware optimizer's OptimizerConfig dtypes, and the partial
    distributed optimizer's instances (hybrid sharding)."""
    from planner.integrations.modern_flags import BRIDGE_STATE_FIELDS, TORCH_STATE_DTYPES

    key = "ddp.num_distributed_optimizer_instances"
    partial_distributed_optimizer(view, _nemo_int(kv, key, None), key)

    dtype_of = {v: k for k, v in TORCH_STATE_DTYPES.items()}
    states: dict[str, str] = {}
    reduce32 = kv.get("mixed_precision.grad_reduce_in_fp32")
    if kv.get("ddp.grad_reduce_in_fp32") is not None and reduce32 is None:
        view.notes.append(f"ddp.grad_reduce_in_fp32={kv['ddp.grad_reduce_in_fp32']}: Megatron-Bridge copies "
                          "mixed_precision.grad_reduce_in_fp32 over it at setup; checked with the mixed-precision "
                          "recipe's gradients")
    if reduce32 == "false" and view.precision in ("bf16", "fp8"):
        states["grad_dtype"] = "bf16"
    elif reduce32 == "true" and view.precision == "fp16":
        states["grad_dtype"] = "fp32"
    fields = {**BRIDGE_STATE_FIELDS, "optimizer.main_grads_dtype": "grad_dtype"}
    for key, name in fields.items():
        raw = kv.get(key)
        if raw is None:
            continue
        if raw not in dtype_of:
            raise SpecError(f"{key}: {raw!r} -> allowed: {', '.join(TORCH_STATE_DTYPES.values())}")
        if dtype_of[raw] != "fp32":
            states[name] = dtype_of[raw]
    low = [k for k, n in fields.items() if n in states and k in kv]
    if low and kv.get("optimizer.use_precision_aware_optimizer") != "true":
        view.errors.append(("optimizer_states", f"{', '.join(low)} below fp32 without "
                            "optimizer.use_precision_aware_optimizer=true -> Megatron-Core keeps fp32 states without "
                            "it (OptimizerConfig asserts them)", "set optimizer.use_precision_aware_optimizer=true"))
    view.optimizer_states = states
