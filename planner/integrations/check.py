"""`planner check`: validate an existing config (plan JSON, DeepSpeed JSON, torchtitan TOML, Megatron-LM
arguments) against a model and a cluster, for CI. One line per violation with the numbers and a fix hint."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from cluster_specs import SpecError
from cost_models.inputs import Recompute
from planner.inputs.specs import LayoutSpec
from planner.rules import layout_violations

GIB = 2**30


@dataclass
class ConfigView:
    """What a config says about the layout and the batch (None where it says nothing)."""

    format: str
    fields: dict
    global_batch_size: int | None = None
    seq_length: int | None = None
    vocab_padded_by_framework: bool = False
    notes: list[str] = field(default_factory=list)
    layers_per_chunk: int | None = None  # torchtitan: virtual stages follow from the model's layer count


def megatron_parser() -> argparse.ArgumentParser:
    """The Megatron-LM options the planner reads or writes, as megatron/training/arguments.py names them."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ints = ["--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size",
            "--global-batch-size", "--seq-length", "--num-layers", "--hidden-size", "--ffn-hidden-size",
            "--num-attention-heads", "--max-position-embeddings", "--num-query-groups", "--recompute-num-layers",
            "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
            "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--context-parallel-size",
            "--data-parallel-size"]
    for name in ints:
        p.add_argument(name, type=int)
    for name in ["--sequence-parallel", "--use-distributed-optimizer", "--use-torch-fsdp2", "--bf16", "--fp16",
                 "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--group-query-attention",
                 "--optimizer-cpu-offload", "--use-precision-aware-optimizer", "--recompute-activations"]:
        p.add_argument(name, action="store_true")
    p.add_argument("--recompute-granularity", choices=["full", "selective"])
    p.add_argument("--recompute-method", choices=["uniform", "block"])
    p.add_argument("--normalization")
    p.add_argument("--position-embedding-type")
    p.add_argument("--optimizer-offload-fraction", type=float)
    return p


def read_config(path: Path, *, gpus: int) -> ConfigView:
    from cluster_specs.reading import parse_json, parse_toml, read_text

    text = read_text(path)
    suffix = path.suffix.lower()
    if suffix == ".toml":
        doc = parse_toml(text, str(path))
        return _torchtitan(doc, gpus)
    if suffix == ".json":
        doc = parse_json(text, str(path))
        if not isinstance(doc, dict):
            raise SpecError("expected a JSON object", source=str(path))
        if "layout" in doc:
            return _plan(doc)
        if "zero_optimization" in doc or "train_micro_batch_size_per_gpu" in doc or "train_batch_size" in doc:
            return _deepspeed(doc, gpus)
        raise SpecError("JSON is neither a plan (no 'layout') nor a DeepSpeed config (no 'zero_optimization' or "
                        "'train_micro_batch_size_per_gpu')", source=str(path))
    return _megatron(text, gpus, str(path))


def _plan(doc: dict) -> ConfigView:
    lay = dict(doc["layout"])
    training = doc.get("inputs", {}).get("training", {})
    return ConfigView("plan", lay, training.get("global_batch_size"), training.get("seq_length"), True)


def _degrees(gpus: int, tp: int, pp: int, dp: int | None) -> int:
    if dp is not None:
        return dp
    return gpus // (tp * pp) if tp * pp and gpus % (tp * pp) == 0 else max(1, gpus // max(1, tp * pp))


def _deepspeed(doc: dict, gpus: int) -> ConfigView:
    zero = doc.get("zero_optimization", {}) or {}
    pipe = doc.get("pipeline", {}) or {}
    pp = pipe.get("stages", 1)
    pp = pp if isinstance(pp, int) else 1
    tp = 1
    dp = _degrees(gpus, tp, pp, None)
    off = "none"
    if zero.get("offload_param", {}).get("device", "none") not in ("none", None):
        off = "optimizer+params"
    elif zero.get("offload_optimizer", {}).get("device", "none") not in ("none", None):
        off = "optimizer"
    rec = "full" if (doc.get("activation_checkpointing") or pipe.get("activation_checkpoint_interval", 0)) else "none"
    mbs = doc.get("train_micro_batch_size_per_gpu", 1)
    gas = doc.get("gradient_accumulation_steps", 1)
    fields = {"tp": tp, "pp": pp, "dp": dp, "zero_stage": zero.get("stage", 0), "offload": off,
              "micro_batch_size": mbs, "num_micro_batches": gas, "recompute": rec}
    notes = ["DeepSpeed's JSON has no tensor-parallel degree: tp taken from --tp (default 1)"]
    return ConfigView("deepspeed", fields, doc.get("train_batch_size"), None, False, notes)


def _torchtitan(doc: dict, gpus: int) -> ConfigView:
    par, train, ac = doc.get("parallelism", {}), doc.get("training", {}), doc.get("activation_checkpoint", {})
    tp, pp = par.get("tensor_parallel_degree", 1), par.get("pipeline_parallel_degree", 1)
    rep, shard = par.get("data_parallel_replicate_degree", 1), par.get("data_parallel_shard_degree", -1)
    if shard == -1:
        shard = max(1, gpus // (tp * pp * rep))
    dp = rep * shard
    reshard = par.get("fsdp_reshard_after_forward", "default")
    zero = 0 if shard == 1 else (2 if reshard == "never" else 3)
    sched = {v: k for k, v in {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B",
                               "zero_bubble": "ZBVZeroBubble"}.items()}
    schedule = sched.get(par.get("pipeline_parallel_schedule", "1F1B"), "1f1b")
    local = train.get("local_batch_size", train.get("batch_size", 1))
    mbs = par.get("pipeline_parallel_microbatch_size", local) if pp > 1 else local
    fields = {"tp": tp, "pp": pp, "dp": dp, "zero_stage": zero if pp == 1 else min(zero, 1),
              "offload": "optimizer+params" if train.get("enable_cpu_offload") else "none",
              "micro_batch_size": mbs, "num_micro_batches": max(1, local // mbs) if mbs else 1,
              "recompute": ac.get("mode", "none"), "sequence_parallel": tp > 1, "schedule": schedule}
    gbs = train.get("global_batch_size")
    if gbs in (None, -1):
        gbs = local * dp
    view = ConfigView("torchtitan", fields, gbs, train.get("seq_len"), False,
                      layers_per_chunk=par.get("pipeline_parallel_layers_per_stage"))
    if gbs != local * dp and gbs % (local * dp) == 0:  # gradient accumulation on top of the local batch
        fields["num_micro_batches"] *= gbs // (local * dp)
    return view


def _megatron(text: str, gpus: int, source: str) -> ConfigView:
    lines = [ln.split("#", 1)[0] for ln in text.splitlines()]
    try:
        tokens = shlex.split(" ".join(ln.replace("\\", " ") for ln in lines))
    except ValueError as exc:
        raise SpecError(f"cannot split Megatron arguments: {exc}", source=source) from None
    args, unknown = megatron_parser().parse_known_args(tokens)
    tp = args.tensor_model_parallel_size or 1
    pp = args.pipeline_model_parallel_size or 1
    dp = args.data_parallel_size or _degrees(gpus, tp, pp, None)
    mbs = args.micro_batch_size or 1
    gbs = args.global_batch_size
    m = gbs // (mbs * dp) if gbs and mbs * dp else 1
    rec = args.recompute_granularity or ("selective" if args.recompute_activations else "none")
    fields = {"tp": tp, "pp": pp, "dp": dp, "zero_stage": 3 if args.use_torch_fsdp2 else 1 if args.use_distributed_optimizer else 0,
              "offload": "optimizer" if args.optimizer_cpu_offload else "none", "micro_batch_size": mbs,
              "num_micro_batches": max(1, m), "recompute": rec, "sequence_parallel": bool(args.sequence_parallel)}
    if args.num_layers_per_virtual_pipeline_stage and args.num_layers:
        fields.update(schedule="interleaved_1f1b",
                      virtual_stages=args.num_layers // (pp * args.num_layers_per_virtual_pipeline_stage))
    elif args.num_virtual_stages_per_pipeline_rank:
        fields.update(schedule="interleaved_1f1b", virtual_stages=args.num_virtual_stages_per_pipeline_rank)
    view = ConfigView("megatron", fields, gbs, args.seq_length, True)
    if unknown:
        view.notes.append(f"ignored {len([u for u in unknown if u.startswith('--')])} options the planner does not model")
    return view


HINTS = [
    ("dp*tp*pp", "choose degrees whose product is the number of GPUs"),
    ("num_attention_heads", "use a tp that divides the heads"),
    ("num_kv_heads", "use a tp that divides the KV heads, or a multiple of them"),
    ("ffn_hidden_size", "use a tp that divides the FFN size"),
    ("hidden_size", "use a tp that divides the hidden size"),
    ("exceeds the", "keep tp <= GPUs per node; add pp or dp instead"),
    ("gpus_per_node", "use a tp that divides the GPUs of a node"),
    ("num_layers", "use fewer pipeline stages (or virtual stages), or a layer count they divide"),
    ("global_batch_size", "set global batch = micro-batch x micro-batches (gradient accumulation) x dp"),
    ("sequence_parallel", "turn sequence parallelism off or use a tp that divides the sequence"),
    ("virtual_stages", "use interleaved_1f1b with >= 2 virtual stages, or drop them"),
    ("num_micro_batches", "use a multiple of pp micro-batches"),
    ("zero_stage", "use ZeRO-1 (distributed optimizer) with pipelining"),
    ("offload", "offload needs a ZeRO stage that shards what is offloaded"),
    ("layers_per_stage", "list one layer count per stage, summing to the layers"),
    ("vocab", "pad the vocabulary to a multiple of tp (Megatron pads to 128 x tp itself)"),
]


def hint_for(problem: str) -> str:
    for key, hint in HINTS:
        if problem.startswith(key) or key in problem.split("->")[0]:
            return hint
    return "see the message"


def check(view: ConfigView, problem, *, allow_tp_across_nodes: bool = False) -> tuple[LayoutSpec | None, list[dict], object]:
    """(layout, violations, estimate or None)."""
    from pydantic import ValidationError

    violations: list[dict] = []
    fields = dict(view.fields)
    if fields.get("schedule") == "interleaved_1f1b" and view.layers_per_chunk:
        fields["virtual_stages"] = max(1, problem.model.num_layers // (fields["pp"] * view.layers_per_chunk))
    try:
        layout = LayoutSpec.model_validate(fields)
    except ValidationError as exc:
        from cluster_specs.errors import from_pydantic

        for line in from_pydantic(exc).problems:
            violations.append({"rule": "field", "message": line, "hint": "use an allowed value"})
        return None, violations, None
    for v in layout_violations(layout, problem.model, problem.training, problem.cluster,
                               allow_tp_across_nodes=allow_tp_across_nodes):
        violations.append({"rule": v.field, "message": str(v), "hint": v.fix})
    if not view.vocab_padded_by_framework and layout.tp > 1 and problem.model.vocab_size % layout.tp:
        msg = f"vocab_size: {problem.model.vocab_size} -> not divisible by tp ({layout.tp}); the embedding cannot be sharded"
        violations.append({"rule": "vocab_size", "message": msg, "hint": hint_for("vocab")})
    est = None
    if not any(v["rule"] in ("dp*tp*pp", "tp", "pp*virtual_stages", "field") for v in violations):
        est = problem.estimate(layout)
        headroom = problem.knobs.memory_headroom_bytes
        if est.peak_memory_bytes + headroom > est.gpu_memory_bytes or not est.fits:
            violations.append({
                "rule": "memory",
                "message": f"memory: {est.peak_memory_bytes / GIB:.1f} GiB peak on stage {est.peak_stage} + "
                           f"{headroom / GIB:.1f} GiB headroom -> exceeds the GPU's {est.gpu_memory_bytes / GIB:.1f} GiB",
                "hint": _memory_hint(problem, layout),
            })
    return layout, violations, est


def _memory_hint(problem, layout: LayoutSpec) -> str:
    """Try the usual remedies and name the first ones that fit, with their predicted memory."""
    tries = []
    if layout.recompute != "full":
        tries.append(layout.model_copy(update={"recompute": Recompute.SELECTIVE if layout.recompute == "none"
                                               else Recompute.FULL}))
        tries.append(layout.model_copy(update={"recompute": Recompute.FULL}))
    if layout.zero_stage < (1 if layout.pp > 1 else 3) and layout.dp > 1:
        tries.append(layout.model_copy(update={"zero_stage": layout.zero_stage + 1}))
    if layout.micro_batch_size > 1:
        f = layout.micro_batch_size // 2 if layout.micro_batch_size % 2 == 0 else 1
        tries.append(layout.model_copy(update={"micro_batch_size": f,
                                               "num_micro_batches": layout.num_micro_batches * layout.micro_batch_size // f}))
    found = []
    for t in tries:
        if layout_violations(t, problem.model, problem.training, problem.cluster):
            continue
        est = problem.estimate(t)
        if est.fits and est.peak_memory_bytes + problem.knobs.memory_headroom_bytes <= est.gpu_memory_bytes:
            found.append(f"{_diff(layout, t)} fits at {est.peak_memory_bytes / GIB:.1f} GiB, {est.step_seconds:.3g} s/step")
    return "; ".join(found[:2]) if found else "add pipeline stages, ZeRO, offload or GPUs (`planner plan` searches them)"


def _diff(a: LayoutSpec, b: LayoutSpec) -> str:
    da, db = a.model_dump(), b.model_dump()
    return ", ".join(f"{k}={db[k]}" for k in db if db[k] != da[k] and k != "num_micro_batches") or "as is"
