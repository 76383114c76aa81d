"""NeMo's YAML configs for `planner check`, as the Megatron-Bridge overrides readers.nemo_view reads.

Two stacks write them:
- a Megatron-Bridge override file (examples/.../conf/*_override_example.yaml, a script's --config-file): OmegaConf
  YAML merged onto the recipe's ConfigContainer, the same dotted keys as run_recipe.py's KEY=VALUE overrides,
  nested (frameworks.md §4.1-4.2); read as those overrides;
- a NeMo-Framework-Launcher training config (conf/training/*/*.yaml: NeMo 1.x, Hydra, `trainer` and `model`
  sections; its absent keys take NeMo's examples/nlp/language_modeling/conf/megatron_gpt_config.yaml): both stacks
  build Megatron-Core's TransformerConfig and DDP, so its names are mapped to Bridge's (LAUNCHER_NAMES) and what only
  it says (trainer precision, optim.name, the overlap switches, the model's shape) is read here. Sources:
  NVIDIA/NeMo@8cfedd72 nemo/collections/nlp/models/language_modeling/megatron_base_model.py (MBM) and
  megatron_gpt_model.py (MGM).
Any other YAML is refused, naming the formats check reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster_specs import SpecError
from planner.integrations.modern_flags import NEMO_FP8_MIXED_PRECISION

if TYPE_CHECKING:
    from planner.integrations.readers import ConfigView

# Megatron-Bridge's ConfigContainer fields (training/config.py@067f987d L965-1010): an override file's top level
BRIDGE_SECTIONS = frozenset({
    "env_vars", "rng", "rerun_state_machine", "train", "model", "optimizer", "optimizer_config_override_provider",
    "ddp", "validation", "scheduler", "dataset", "logger", "tokenizer", "checkpoint", "dist", "ft", "straggler",
    "nvrx_straggler", "profiling", "peft", "comm_overlap", "mixed_precision", "tensor_inspect", "inprocess_restart"})

FORMATS = ("plan JSON, DeepSpeed JSON, torchtitan TOML or Python recipe, Megatron-LM / Megatron-DeepSpeed arguments "
           "or launch scripts, Megatron-Bridge overrides (KEY=VALUE lines, or an override YAML of its ConfigContainer "
           "sections) and NeMo-Framework-Launcher training YAML (trainer and model sections)")

_SAME = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
         "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel",
         "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
# NeMo 1.x names -> Megatron-Bridge's (MBM L557-587 passes activations_checkpoint_* as TransformerConfig's recompute_*;
# the batch sizes are the microbatch calculator's, the sequence length the model's)
LAUNCHER_NAMES = {
    "model.micro_batch_size": "train.micro_batch_size", "model.global_batch_size": "train.global_batch_size",
    "model.encoder_seq_length": "dataset.seq_length",
    "model.activations_checkpoint_granularity": "model.recompute_granularity",
    "model.activations_checkpoint_method": "model.recompute_method",
    "model.activations_checkpoint_num_layers": "model.recompute_num_layers",
    **{f"model.{k}": f"model.{k}" for k in _SAME},
}
# NeMo 1.x trainer.precision (utils_funcs.py torch_dtype_from_precision L43-56) -> Bridge's mixed_precision recipe
LAUNCHER_PRECISION = {"bf16": "bf16_mixed", "bf16-mixed": "bf16_mixed", "16": "fp16_mixed", "16-mixed": "fp16_mixed",
                      "32": "null", "32-true": "null"}
# the optimizers that shard their states over data parallel (MBM L151-152: apex's and Megatron-Core's distributed)
DISTRIBUTED_OPTIMIZERS = ("distributed_fused_adam", "mcore_distributed_optim")
LAUNCHER_DEFAULT_DROPOUT = 0.1  # megatron_gpt_config.yaml hidden_dropout / attention_dropout


def yaml_overrides(doc: object, source: str) -> tuple[dict[str, str], str]:
    """(the overrides in Megatron-Bridge's names, the format) of a NeMo YAML config; any other YAML is an error."""
    if isinstance(doc, dict) and isinstance(doc.get("trainer"), dict) and isinstance(doc.get("model"), dict):
        _refuse_sections_for_values(doc, LAUNCHER_NAMES, source)
        return launcher_overrides(doc), "nemo-launcher"
    if isinstance(doc, dict) and doc and all(isinstance(k, str) for k in doc) and set(doc) <= BRIDGE_SECTIONS:
        _refuse_sections_for_values(doc, LAUNCHER_NAMES.values(), source)
        return flatten(doc), "nemo"
    keys = ", ".join(sorted(map(str, doc))[:6]) if isinstance(doc, dict) else type(doc).__name__
    raise SpecError(f"YAML ({keys}) is neither a Megatron-Bridge override file nor a NeMo-Framework-Launcher training "
                    f"config -> check reads {FORMATS}", source=source)


def launcher_names(problem: str) -> str:
    """A problem line in Megatron-Bridge's names (train.micro_batch_size: ...) in the launcher file's own
    (model.micro_batch_size: ...), where it names one of LAUNCHER_NAMES."""
    for name, bridge in LAUNCHER_NAMES.items():
        if problem.startswith(f"{bridge}:"):
            return name + problem[len(bridge):]
    return problem


def _refuse_sections_for_values(doc: dict, paths, source: str) -> None:
    """A mapping or a list where the reader takes one value (`tensor_model_parallel_size: {a: 1}` was read as no
    value, and the default tp 1 taken in silence)."""
    bad = []
    for path in paths:
        node: object = doc
        for key in path.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict | list):
            bad.append(f"{path}: {type(node).__name__} -> one value (a number, a string or true/false)")
    if bad:
        raise SpecError(bad, source=source)


def flatten(doc: dict, prefix: str = "") -> dict[str, str]:
    """Nested sections as dotted keys with the values written as run_recipe.py's overrides write them."""
    out: dict[str, str] = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = override_text(value)
    return out


def override_text(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(override_text(v) for v in value) + "]"
    return str(value)


def _resolved(flat: dict[str, str], key: str) -> bool:
    """A key whose value is not a Hydra interpolation (`${...}`, resolved by Hydra at launch, not here)."""
    return key in flat and "${" not in flat[key]


def launcher_overrides(doc: dict) -> dict[str, str]:
    """A NeMo-Framework-Launcher config in Bridge's names: the shared model-parallel and batch keys (LAUNCHER_NAMES),
    the distributed optimizer (optim.name), the precision (trainer.precision, model.fp8), the gradient reduce dtype
    of Megatron-Core's optimizer (optim.grad_sync_dtype: MGM L601 grad_reduce_in_fp32); sequence parallelism with tp 1
    is dropped, as NeMo drops it (MBM L1019-1025, launcher_extras notes it)."""
    model = doc["model"]
    flat = flatten({"model": model})
    kv = {bridge: flat[name] for name, bridge in LAUNCHER_NAMES.items() if _resolved(flat, name)}
    data = model.get("data")
    data = data if isinstance(data, dict) else {}
    if "dataset.seq_length" not in kv and isinstance(data.get("seq_length"), int):
        kv["dataset.seq_length"] = str(data["seq_length"])
    optim = model.get("optim")
    optim = optim if isinstance(optim, dict) else {}
    name = optim.get("name", "fused_adam")  # megatron_gpt_config.yaml optim.name
    kv["ddp.use_distributed_optimizer"] = override_text(name in DISTRIBUTED_OPTIMIZERS)
    kv["mixed_precision"] = _launcher_precision(doc["trainer"], model)
    if name == "mcore_distributed_optim":
        kv["mixed_precision.grad_reduce_in_fp32"] = override_text(optim.get("grad_sync_dtype", "fp32") == "fp32")
    if kv.get("model.sequence_parallel") == "true" and kv.get("model.tensor_model_parallel_size", "1") == "1":
        kv["model.sequence_parallel"] = "false"
    return kv


def _launcher_precision(trainer: dict, model: dict) -> str:
    """Bridge's mixed_precision name for trainer.precision (model.precision where the trainer has none) and model.fp8:
    FP8 with a format (MGM L2240-2247: fp8_e4m3 or fp8_hybrid, else ValueError) at model.fp8_recipe, Megatron-Core's
    default delayed scaling where it is not set (frameworks.md §2.8)."""
    given = trainer.get("precision", model.get("precision", "32"))  # Lightning's default: 32
    mixed = LAUNCHER_PRECISION.get(str(given))
    if mixed is None:
        raise SpecError(f"trainer.precision: {given!r} -> one of {', '.join(LAUNCHER_PRECISION)} (NeMo's "
                        "torch_dtype_from_precision)")
    if model.get("fp8") is True and mixed == "bf16_mixed":
        recipe = str(model.get("fp8_recipe", "delayed"))
        if recipe not in NEMO_FP8_MIXED_PRECISION:
            raise SpecError(f"model.fp8_recipe: {recipe!r} -> one of {', '.join(NEMO_FP8_MIXED_PRECISION)}")
        return NEMO_FP8_MIXED_PRECISION[recipe]
    return mixed


def launcher_extras(doc: dict, view: ConfigView, gpus: int) -> None:
    """What only a NeMo-Framework-Launcher config says, on the view read from its overrides: the model's shape and
    dropout (check compares them with --model), NeMo's start-up refusal of FP8 without a format, the overlap its
    optimizer and TE switches leave exposed (NeMo 1.x defaults them off), the world it was written for, and the
    sequence parallelism NeMo drops at tp 1."""
    model, trainer = doc["model"], doc["trainer"]
    _launcher_model(model, view)
    if model.get("fp8") is True and not (model.get("fp8_e4m3") or model.get("fp8_hybrid")):
        view.errors.append(("precision", "model.fp8 true without model.fp8_e4m3 or model.fp8_hybrid -> NeMo raises "
                            "ValueError ('fp8 enabled but fp8_format (fp8_e4m3 | fp8_hybrid) is not set')",
                            "set model.fp8_hybrid: true"))
    if model.get("megatron_amp_O2", False) is not True and view.precision in ("bf16", "fp16", "fp8"):
        view.notes.append("model.megatron_amp_O2 false: NeMo keeps fp32 parameters under autocast (megatron_base_model.py L1209-1245); "
                          f"checked as {view.precision} parameters, so the weights and gradients are under-stated")
    if model.get("sequence_parallel") is True and view.fields["tp"] == 1:
        view.notes.append("model.sequence_parallel true with tp 1: NeMo turns it off ('Sequence parallel should only "
                          "be used with tensor parallel size > 1', megatron_base_model.py L1019-1025); checked without it")
    _launcher_overlap(model, view)
    nodes, devices = trainer.get("num_nodes"), trainer.get("devices")
    if isinstance(nodes, int) and isinstance(devices, int) and nodes * devices != gpus:
        view.notes.append(f"trainer.num_nodes x devices = {nodes * devices} GPUs; checked on the cluster's {gpus}")
    unresolved = sorted(k for k in ("model.ffn_hidden_size", "model.num_layers", "model.hidden_size",
                                    *LAUNCHER_NAMES) if "${" in flatten({"model": model}).get(k, ""))
    if unresolved:
        view.notes.append(f"Hydra interpolations not resolved (not read): {', '.join(unresolved)}")
    rename = {b: n for n, b in LAUNCHER_NAMES.items() if b != n}
    view.errors[:] = [(r, _renamed(m, rename), _renamed(h, rename)) for r, m, h in view.errors]
    view.notes[:] = [_renamed(n, rename) for n in view.notes]


def _renamed(text: str, rename: dict[str, str]) -> str:
    """A message of the override reader in the launcher's names."""
    for bridge, name in rename.items():
        text = text.replace(bridge, name)
    return text.replace("Megatron-Bridge", "NeMo")


def _launcher_model(model: dict, view: ConfigView) -> None:
    """num_layers, hidden_size, num_attention_heads, num_query_groups (null: one per head), ffn_hidden_size, and
    dropout (hidden_dropout, attention_dropout; megatron_gpt_config.yaml's 0.1 where absent)."""
    shape = {"num_layers": model.get("num_layers"), "hidden_size": model.get("hidden_size"),
             "num_attention_heads": model.get("num_attention_heads"),
             "num_kv_heads": model.get("num_query_groups") or model.get("num_attention_heads"),
             "ffn_hidden_size": model.get("ffn_hidden_size")}
    view.model.update({k: v for k, v in shape.items() if isinstance(v, int) and not isinstance(v, bool)})
    drops = [model.get(k, LAUNCHER_DEFAULT_DROPOUT) for k in ("hidden_dropout", "attention_dropout")]
    view.model["dropout"] = any(isinstance(p, int | float) and p > 0 for p in drops)


def _launcher_overlap(model: dict, view: ConfigView) -> None:
    """NeMo 1.x overlaps the gradient reduce only with optim.overlap_grad_sync (default false, MGM L602) and the TP
    collectives only with model.ub_tp_comm_overlap (default false, MGM L2238); the NeMo profile assumes Bridge's
    overlap, so each switch left off is predicted exposed."""
    optim = model.get("optim")
    optim = optim if isinstance(optim, dict) else {}
    f = view.fields
    if f["dp"] > 1 and optim.get("overlap_grad_sync") is not True:
        view.knobs["dp_overlap_fraction"] = (0.0, "no model.optim.overlap_grad_sync: the gradient reduce runs after "
                                                  "backward")
        view.knobs["zero3_overlap_fraction"] = view.knobs["dp_overlap_fraction"]
    if f["tp"] > 1 and model.get("ub_tp_comm_overlap") is not True:
        view.knobs["tp_overlap_fraction"] = (0.0, "no model.ub_tp_comm_overlap: the TP collectives are not hidden")
