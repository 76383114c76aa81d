"""Parse `--layout "tp=8,pp=8,dp=16,zero=1,mbs=1,recompute=selective,schedule=1f1b"` into layout fields."""

from __future__ import annotations

from cluster_specs import SpecError

ALIASES = {
    "tp": "tp", "tensor_parallel": "tp", "pp": "pp", "pipeline_parallel": "pp", "dp": "dp", "data_parallel": "dp",
    "zero": "zero_stage", "zero_stage": "zero_stage", "offload": "offload", "mbs": "micro_batch_size",
    "micro_batch_size": "micro_batch_size", "m": "num_micro_batches", "num_micro_batches": "num_micro_batches",
    "recompute": "recompute", "sp": "sequence_parallel", "sequence_parallel": "sequence_parallel",
    "schedule": "schedule", "vpp": "virtual_stages", "virtual_stages": "virtual_stages",
    "layers_per_stage": "layers_per_stage", "recompute_layers_per_stage": "recompute_layers_per_stage",
    "cp": "cp", "context_parallel": "cp", "cp_comm": "cp_comm", "ep": "ep", "expert_parallel": "ep",
    "etp": "etp", "expert_tensor_parallel": "etp", "shard": "dp_shard", "dp_shard": "dp_shard",
}
INT_FIELDS = {"tp", "pp", "dp", "zero_stage", "micro_batch_size", "num_micro_batches", "virtual_stages", "cp", "ep",
              "etp", "dp_shard"}
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off"}


def parse_layout_string(text: str, source: str = "--layout") -> dict:
    """Return the given layout fields; missing keys are left for the caller's defaults."""
    fields: dict = {}
    given: dict[str, str] = {}  # field -> the part that set it, to refuse `tp=8,tp=4`
    problems = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            problems.append(f"layout: {part!r} -> expected key=value")
            continue
        key, value = (x.strip() for x in part.split("=", 1))
        name = ALIASES.get(key.lower())
        if name is None:
            problems.append(f"layout key {key!r} -> allowed: {', '.join(sorted(k for k in ALIASES if len(k) <= 8))}")
            continue
        if name in given:
            problems.append(f"layout key {key!r}: given twice ({given[name]}, then {part}) -> give each key once")
            continue
        given[name] = part
        if name in INT_FIELDS:
            try:
                fields[name] = int(value)
            except ValueError:
                problems.append(f"layout {key}: {value!r} -> must be an integer")
        elif name == "sequence_parallel":
            if value.lower() not in TRUE | FALSE:
                problems.append(f"layout {key}: {value!r} -> must be true/false (or 1/0)")
            else:
                fields[name] = value.lower() in TRUE
        elif name in ("layers_per_stage", "recompute_layers_per_stage"):
            try:
                fields[name] = [int(x) for x in value.split("/")]
            except ValueError:
                problems.append(f"layout {key}: {value!r} -> integers separated by '/', e.g. 11/12/12/11")
        else:
            fields[name] = value
    if problems:
        raise SpecError(problems, source=source)
    return fields


# `--optimizer-states` keys -> TrainingSpec fields; `moments` sets both Adam moments
STATE_KEYS = {"grad": ("grad_dtype",), "master": ("master_dtype",), "exp_avg": ("exp_avg_dtype",),
              "exp_avg_sq": ("exp_avg_sq_dtype",), "moments": ("exp_avg_dtype", "exp_avg_sq_dtype")}


def parse_optimizer_states(text: str | None, source: str = "--optimizer-states") -> dict[str, str]:
    """`--optimizer-states "grad=bf16,master=fp32,moments=bf16"` -> TrainingSpec dtype fields (the values are checked
    by TrainingSpec, which names the field and the allowed dtypes)."""
    fields: dict[str, str] = {}
    problems = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, _, value = (x.strip() for x in part.partition("="))
        names = STATE_KEYS.get(key.lower())
        if not value or names is None:
            problems.append(f"{part!r} -> expected key=dtype with key one of {', '.join(STATE_KEYS)}")
            continue
        for name in names:
            if name in fields:
                problems.append(f"{key}: {name} given twice -> give each state once")
            fields[name] = value.lower()
    if problems:
        raise SpecError(problems, source=source)
    return fields
