"""A plan as launch settings: Megatron-LM arguments, a DeepSpeed config, a torchtitan TOML, a torchrun line.

Option names are the frameworks' own (Megatron-LM megatron/training/arguments.py; DeepSpeed's config keys and
its `pipeline` section from deepspeed/runtime/config.py; torchtitan's ParallelismConfig / TrainingConfig /
ActivationCheckpoint fields). Where a framework cannot express a plan's choice, the export says so in a
comment (Megatron, torchtitan, torchrun) or refuses with the reason (SpecError, exit 3).
"""

from __future__ import annotations

import json
import shlex

from cluster_specs import SpecError
from planner.inputs.specs import LayoutSpec, ModelSpec, TrainingSpec

TORCHTITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B",
                        "zero_bubble": "ZBVZeroBubble"}


def _plan_parts(plan: dict) -> tuple[LayoutSpec, ModelSpec, TrainingSpec, dict]:
    from pydantic import ValidationError

    from cluster_specs.errors import from_pydantic

    try:
        layout = LayoutSpec.model_validate(plan["layout"])
        model = ModelSpec.model_validate(plan["inputs"]["model"])
        training = TrainingSpec.model_validate(plan["inputs"]["training"])
    except KeyError as exc:
        raise SpecError(f"plan JSON: missing {exc.args[0]!r} (expected the output of `planner plan --json`)") from None
    except ValidationError as exc:
        raise from_pydantic(exc, source="plan JSON") from None
    return layout, model, training, plan["inputs"].get("cluster", {})


def to_megatron(plan: dict) -> str:
    layout, model, training, _ = _plan_parts(plan)
    args: list[tuple[str, object]] = [
        ("--tensor-model-parallel-size", layout.tp),
        ("--pipeline-model-parallel-size", layout.pp),
        ("--micro-batch-size", layout.micro_batch_size),
        ("--global-batch-size", training.global_batch_size),
        ("--seq-length", training.seq_length),
        ("--num-layers", model.num_layers),
        ("--hidden-size", model.hidden_size),
        ("--ffn-hidden-size", model.ffn),
        ("--num-attention-heads", model.num_attention_heads),
        ("--max-position-embeddings", model.max_position_embeddings or training.seq_length),
    ]
    comments = [f"planner export for Megatron-LM: {layout.short()}",
                f"data-parallel size {layout.dp} follows from WORLD_SIZE / (tp x pp)"]
    if model.kv_heads != model.num_attention_heads:
        args += [("--group-query-attention", None), ("--num-query-groups", model.kv_heads)]
    if model.mlp == "swiglu":
        args.append(("--swiglu", None))
    if model.norm == "rmsnorm":
        args.append(("--normalization", "RMSNorm"))
    if model.position_embedding == "rope":
        args.append(("--position-embedding-type", "rope"))
    if not model.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    if not model.bias:
        args.append(("--disable-bias-linear", None))
    if training.precision in ("bf16", "fp16"):
        args.append((f"--{training.precision}", None))  # fp32 is Megatron's default: no flag
    if layout.sequence_parallel:
        args.append(("--sequence-parallel", None))
    if layout.zero_stage == 1:
        args.append(("--use-distributed-optimizer", None))
    elif layout.zero_stage == 2:
        raise SpecError("zero_stage: 2 -> Megatron-LM has no ZeRO-2 (its distributed optimizer is ZeRO-1; FSDP is "
                        "ZeRO-3); export with --to deepspeed or --to torchtitan, or plan with zero 1 or 3")
    elif layout.zero_stage == 3:
        args.append(("--use-torch-fsdp2", None))
    if layout.offload != "none":
        if layout.offload == "optimizer+params":
            raise SpecError("offload: optimizer+params -> Megatron-LM offloads only the optimizer; export with --to "
                            "deepspeed")
        args += [("--optimizer-cpu-offload", None), ("--use-precision-aware-optimizer", None),
                 ("--optimizer-offload-fraction", 1.0)]
    if layout.recompute_layers_per_stage:
        # Megatron recomputes the same number of layers on every stage: take the most any stage needs
        args += [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                 ("--recompute-num-layers", max(layout.recompute_layers_per_stage))]
        comments.append(f"the plan recomputes {layout.recompute_layers_per_stage} layers per stage; Megatron takes one "
                        "count for all stages, so every stage recomputes the largest (more memory headroom, a little "
                        "more time than predicted)")
    elif layout.recompute == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    elif layout.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    if layout.schedule == "interleaved_1f1b":
        args.append(("--num-layers-per-virtual-pipeline-stage", model.num_layers // (layout.pp * layout.virtual_stages)))
    elif layout.schedule == "zero_bubble":
        comments.append("zero_bubble: upstream Megatron-LM runs 1F1B; ZB-H1 needs the sail-sg zero-bubble fork "
                        "(predicted time assumes ZB-H1)")
    elif layout.schedule in ("gpipe", "naive", "pipedream_async"):
        comments.append(f"schedule {layout.schedule}: Megatron-LM runs 1F1B instead")
    if layout.layers_per_stage and layout.pp > 1:
        lps = layout.layers_per_stage
        args += [("--decoder-first-pipeline-num-layers", lps[0]), ("--decoder-last-pipeline-num-layers", lps[-1])]
        if len(set(lps[1:-1])) > 1:
            comments.append(f"middle stages {lps[1:-1]} are uneven; Megatron splits the middle evenly")
    lines = [f"# {c}" for c in comments]
    for name, value in args:
        lines.append(name if value is None else f"{name} {shlex.quote(str(value))}")
    return "\n".join(lines) + "\n"


def to_deepspeed(plan: dict) -> str:
    layout, model, training, _ = _plan_parts(plan)
    tp_note = layout.tp > 1  # DeepSpeed's JSON has no TP degree (Megatron-DeepSpeed takes it on its command line)
    zero: dict = {"stage": layout.zero_stage, "overlap_comm": True, "contiguous_gradients": True,
                  "reduce_bucket_size": 5e8}
    if layout.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if layout.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config = {
        "train_batch_size": training.global_batch_size,
        "train_micro_batch_size_per_gpu": layout.micro_batch_size,
        "gradient_accumulation_steps": layout.num_micro_batches,
        "zero_optimization": zero,
        "gradient_clipping": 1.0,
    }
    if training.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif training.precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0}
    if layout.recompute != "none":
        config["activation_checkpointing"] = {"partition_activations": tp_note, "contiguous_memory_optimization": False,
                                              "cpu_checkpointing": False}
    if layout.pp > 1:
        config["pipeline"] = {"stages": layout.pp, "partition": "uniform" if not layout.layers_per_stage else "parameters",
                              "activation_checkpoint_interval": 1 if layout.recompute == "full" else 0}
    return json.dumps(config, indent=2) + "\n"


def to_torchtitan(plan: dict) -> str:
    layout, model, training, _ = _plan_parts(plan)
    if layout.schedule in ("naive", "pipedream_async"):
        raise SpecError(f"schedule: {layout.schedule} -> torchtitan has no such schedule; plan with 1f1b, gpipe, "
                        "interleaved_1f1b or zero_bubble")
    if layout.offload == "optimizer":
        raise SpecError("offload: optimizer -> torchtitan offloads parameters and optimizer together "
                        "(FSDP2 CPU offload); plan with offload=optimizer+params or none")
    shard, replicate = (layout.dp, 1) if layout.zero_stage >= 1 else (1, layout.dp)
    comments = [f"planner export for torchtitan: {layout.short()}"]
    par = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": layout.tp,
        "context_parallel_degree": 1,
        "pipeline_parallel_degree": layout.pp,
    }
    if layout.zero_stage in (1, 2):
        par["fsdp_reshard_after_forward"] = "never"
        comments.append(f"ZeRO-{layout.zero_stage} -> FSDP2 without resharding after forward (ZeRO-2-like; torchtitan "
                        "has no optimizer-only sharding)")
    elif layout.zero_stage == 3:
        par["fsdp_reshard_after_forward"] = "always" if layout.pp == 1 else "default"
    if layout.pp > 1:
        par["pipeline_parallel_schedule"] = TORCHTITAN_SCHEDULES[layout.schedule]
        par["pipeline_parallel_microbatch_size"] = layout.micro_batch_size
        chunks = layout.virtual_stages if layout.schedule == "interleaved_1f1b" else 2 if layout.schedule == "zero_bubble" else 1
        if model.num_layers % (layout.pp * chunks) == 0:
            par["pipeline_parallel_layers_per_stage"] = model.num_layers // (layout.pp * chunks)
        if layout.schedule == "zero_bubble":
            comments.append("zero_bubble -> ZBVZeroBubble (two stages per rank in a V; ZB-H1's memory, ~zero bubble)")
    local = layout.micro_batch_size * (layout.num_micro_batches if layout.pp > 1 else 1)
    train = {
        "local_batch_size": local,
        "global_batch_size": training.global_batch_size,
        "seq_len": training.seq_length,
        "mixed_precision_param": {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[training.precision],
    }
    if layout.offload == "optimizer+params":
        train["enable_cpu_offload"] = True
    ac = {"mode": layout.recompute}
    if layout.recompute == "selective":
        ac["selective_ac_option"] = "op"
    lines = [f"# {c}" for c in comments]
    for section, values in (("parallelism", par), ("training", train), ("activation_checkpoint", ac)):
        lines.append(f"\n[{section}]")
        for k, v in values.items():
            lines.append(f"{k} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return json.dumps(str(v))


def to_torchrun(plan: dict, *, program: str = "-m planner.bench", program_args: str | None = None,
                plan_path: str = "plan.json") -> str:
    layout, _, _, cluster = _plan_parts(plan)
    nodes = cluster.get("num_nodes", 1)
    gpn = cluster.get("gpus_per_node", layout.num_gpus)
    if nodes * gpn != layout.num_gpus:
        raise SpecError(f"plan: {nodes} nodes x {gpn} GPUs != dp*tp*pp = {layout.num_gpus}")
    tail = program_args if program_args is not None else shlex.quote(plan_path)
    return (
        "# planner export for torchrun: run this same line on every node; fill in the rendezvous values\n"
        f"torchrun --nnodes={nodes} --nproc-per-node={gpn} \\\n"
        '  --rdzv-backend=c10d --rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT:-29500}" --rdzv-id="${JOB_ID}" \\\n'
        f"  {program} {tail}\n"
    )


EXPORTERS = {"megatron": to_megatron, "deepspeed": to_deepspeed, "torchtitan": to_torchtitan, "torchrun": to_torchrun}
