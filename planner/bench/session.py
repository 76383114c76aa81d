"""`planner bench`: build the benchmark from a plan (or cluster/model/layout), run it, predict the same model on
the same cluster, and put predicted and measured side by side."""

from __future__ import annotations

import statistics

from cost_models.communication import all_reduce_seconds, group_link, p2p_seconds, pp_neighbour_link
from planner.bench.runner import BenchConfig, launch_local, worker
from planner.contract import BenchReport
from planner.estimate import Problem
from planner.inputs.specs import LayoutSpec, ModelSpec, TrainingSpec

GIB = 2**30


def scale_model(model: ModelSpec, layout: LayoutSpec, *, layers_per_stage: int | None, hidden_size: int | None,
                vocab_size: int | None) -> ModelSpec:
    """The model the benchmark trains: the plan's, optionally scaled down (layers, width, vocabulary)."""
    upd: dict = {}
    chunks = layout.pp * (layout.virtual_stages if layout.schedule == "interleaved_1f1b" else
                          2 if layout.schedule == "zero_bubble" and layout.pp > 1 else 1)
    if layers_per_stage:
        upd["num_layers"] = layers_per_stage * chunks
    if hidden_size:
        a = model.num_attention_heads
        while hidden_size % a or a % layout.tp:
            a -= 1
        kv = min(model.kv_heads, a)
        while a % kv or (kv % layout.tp and layout.tp % kv):
            kv -= 1
        ffn = int(round(model.ffn * hidden_size / model.hidden_size / (8 * layout.tp))) * 8 * layout.tp or 4 * hidden_size
        upd.update(hidden_size=hidden_size, num_attention_heads=a, num_kv_heads=kv, ffn_hidden_size=ffn)
    if vocab_size:
        upd["vocab_size"] = vocab_size
    if upd:
        upd["name"] = f"{model.name} (scaled for the benchmark)"
    return model.model_copy(update=upd) if upd else model


def bench_problem(model: ModelSpec, layout: LayoutSpec, seq_length: int, cluster, dtype: str, knobs) -> Problem:
    """Prediction inputs matching what the benchmark runs: SGD with momentum, parameters and gradients in `dtype`,
    on a cluster with exactly dp*tp*pp GPUs (one node of that many when it fits in a node)."""
    world = layout.num_gpus
    precision = {"float32": "fp32", "bfloat16": "bf16"}[dtype]
    training = TrainingSpec(global_batch_size=layout.micro_batch_size * layout.num_micro_batches * layout.dp,
                            seq_length=seq_length, precision=precision, optimizer="sgd", grad_dtype=precision)
    if world <= cluster.gpus_per_node:
        data = cluster.model_dump(mode="json")
        data.update(num_nodes=1, gpus_per_node=world)
        if world == 1:
            data["intra_node"] = {"kind": "none", "gb_per_s": 0.0}
        from cluster_specs import ClusterSpec

        cluster = ClusterSpec.model_validate(data)
    else:
        cluster = cluster.with_nodes(-(-world // cluster.gpus_per_node))
    return Problem(model, training, cluster, knobs)


def make_config(model: ModelSpec, layout: LayoutSpec, seq_length: int, *, steps: int, warmup: int, dtype: str,
                timeout_seconds: float, collect_params: bool = False, fail_rank: int | None = None) -> BenchConfig:
    from dataclasses import asdict

    shape = asdict(model.to_cost_model(seq_length=seq_length))
    return BenchConfig(shape=shape, seq_length=seq_length, layout=layout.model_dump(mode="json"), steps=steps,
                       warmup=warmup, dtype=dtype, timeout_seconds=timeout_seconds, collect_params=collect_params,
                       fail_rank=fail_rank)


def run(cfg: BenchConfig, *, nproc: int | None) -> list[dict]:
    """Local ranks (--nproc), or this process as one rank of a torchrun job (RANK/WORLD_SIZE set)."""
    import os

    if nproc:
        return launch_local(cfg, nproc)
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world == 1 and "RANK" not in os.environ:
        return launch_local(cfg, 1)
    report = worker(rank, world, cfg, None)
    gathered = [None] * world
    dist.all_gather_object(gathered, report)
    dist.destroy_process_group()
    return gathered


def _err(pred: float, meas: float) -> float | None:
    return (pred - meas) / meas if meas else None


def compare(problem: Problem, layout: LayoutSpec, reports: list[dict]) -> dict:
    est = problem.estimate(layout)
    measured_step = max(r["median_step_seconds"] for r in reports)
    rows = [{"quantity": "step time (s)", "predicted": est.step_seconds, "measured": measured_step,
             "error": _err(est.step_seconds, measured_step)}]
    on_gpu = reports[0]["device"] == "cuda"
    for r in sorted(reports, key=lambda r: r["rank"]):
        if r["dp_rank"] or r["tp_rank"]:
            continue
        stage = est.stages[r["pp_rank"]] if r["pp_rank"] < len(est.stages) else est.stages[-1]
        tag = f"stage {r['pp_rank']}"
        if on_gpu:
            pred = stage.total_bytes - stage.overhead_bytes
            rows.append({"quantity": f"{tag}: peak memory (GiB, CUDA max allocated)", "predicted": pred / GIB,
                         "measured": r["cuda_max_allocated_bytes"] / GIB, "error": _err(pred, r["cuda_max_allocated_bytes"])})
        for name, pred, meas in (("parameters", stage.weights_bytes, r["parameter_bytes"]),
                                 ("optimizer state", stage.optimizer_bytes, r["optimizer_state_bytes"]),
                                 ("saved activations (peak)", stage.activations_bytes, r["saved_activation_peak_bytes"])):
            rows.append({"quantity": f"{tag}: {name} (MiB)", "predicted": pred / 2**20, "measured": meas / 2**20,
                         "error": _err(pred, meas)})
    hw = problem.hardware
    coll = reports[0].get("collectives", {})
    links = {"tp_all_reduce": group_link(hw, group_size=layout.tp, stride=1).link,
             "dp_all_reduce": group_link(hw, group_size=layout.dp, stride=layout.tp).link}
    for name, c in coll.items():
        if name == "pp_send_recv":
            link, _ = pp_neighbour_link(hw, tp=layout.tp, dp=layout.dp)
            pred = p2p_seconds(message_bytes=c["bytes"], link=link)
        else:
            pred = all_reduce_seconds(message_bytes=c["bytes"], group_size=c["group_size"], link=links[name])
        rows.append({"quantity": f"{name.replace('_', ' ')} of {c['bytes'] / 2**20:.2f} MiB (ms)",
                     "predicted": pred * 1e3, "measured": c["seconds"] * 1e3, "error": _err(pred, c["seconds"])})
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    notes = []
    if layout.sequence_parallel and layout.tp > 1:
        notes.append("saved activations: the model is Megatron's (sequence-parallel inputs kept sharded and "
                     "re-gathered in backward); torch's DTensor sequence parallelism keeps the gathered QKV and FC1 "
                     "inputs, so it measures more")
    if layout.schedule == "pipedream_async":
        notes.append("pipedream_async: torch.distributed.pipelining has no asynchronous PipeDream schedule; the "
                     "benchmark runs synchronous 1F1B (same memory per micro-batch, a flush every step)")
    if layout.schedule == "zero_bubble" and layout.pp > 1:
        notes.append("zero_bubble runs as torch's ZBVZeroBubble (two stages per rank in a V), the predicted time is "
                     "ZB-H1's")
    if reports[0]["device"] == "cpu":
        notes.append("on CPU, step times include Python and gloo overheads that a GPU run hides; calibrate the "
                     "machine (`planner calibrate`) for a like-for-like prediction")
    return {"rows": rows, "notes": notes, "median_abs_error": statistics.median(errors) if errors else None,
            "predicted_step_seconds": est.step_seconds, "measured_step_seconds": measured_step}


def report_document(problem: Problem, layout: LayoutSpec, cfg: BenchConfig, reports: list[dict]) -> BenchReport:
    per_rank = [{k: v for k, v in r.items() if k != "params"} for r in reports]
    return BenchReport.from_run(problem=problem, layout=layout, cfg=cfg, comparison=compare(problem, layout, reports),
                                ranks=per_rank)
