"""`planner bench`: build the benchmark from a plan (or cluster/model/layout), run it, predict the same model on
the same cluster, and put predicted and measured side by side."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cost_models.communication import all_reduce_seconds, group_link, p2p_seconds, pp_neighbour_link
from planner.bench import CORE_ATTENTION, PER_OP
from planner.bench.runner import BenchConfig, launch_local, worker
from planner.contract import BenchReport
from planner.estimate import Problem
from planner.inputs.specs import LayoutSpec, ModelSpec, TrainingSpec

if TYPE_CHECKING:
    from cluster_specs import ClusterSpec

GIB = 2**30


def scale_model(model: ModelSpec, layout: LayoutSpec, *, layers_per_stage: int | None, hidden_size: int | None,
                vocab_size: int | None) -> ModelSpec:
    """The model the benchmark trains: the plan's, optionally scaled down (layers, width, vocabulary)."""
    upd: dict = {}
    chunks = layout.pp * (layout.virtual_stages if layout.schedule == "interleaved_1f1b" else 1)
    if layers_per_stage:
        upd.update(scaled_layer_counts(model, layers_per_stage * chunks))
    if hidden_size:
        upd.update(scaled_width(model, hidden_size, layout.tp))
    if vocab_size:
        upd["vocab_size"] = vocab_size
    if upd:
        upd["name"] = f"{model.name} (scaled for the benchmark)"
    return model.model_copy(update=upd) if upd else model


def scaled_layer_counts(model: ModelSpec, num_layers: int) -> dict:
    """`num_layers` layers, and the counts of layers of a kind in the same share (rounded half up): the layers with
    the sliding window (Gemma-2: every other one) and MoE's leading dense layers (fewer than num_layers)."""
    def share(count: int) -> int:
        return min(num_layers, (count * num_layers + model.num_layers // 2) // model.num_layers)

    upd: dict = {"num_layers": num_layers}
    if model.sliding_window_layers is not None:
        upd["sliding_window_layers"] = share(model.sliding_window_layers)
    if model.moe is not None and model.moe.num_dense_layers:
        dense = min(num_layers - 1, share(model.moe.num_dense_layers))
        upd["moe"] = model.moe.model_copy(update={"num_dense_layers": dense})
    return upd


def scaled_width(model: ModelSpec, hidden_size: int, tp: int) -> dict:
    """The fields of `hidden_size` wide layers: the most heads (at most the model's) that divide the width and
    that tp divides, K/V heads that divide them, the FFN in the model's ratio (a multiple of 8·tp). Refused
    (SpecError) when no head count both divides the width and splits over tp."""
    from cluster_specs import SpecError

    a = next((n for n in range(min(model.num_attention_heads, hidden_size), 0, -1)
              if hidden_size % n == 0 and n % tp == 0), None)
    if a is None:
        raise SpecError(f"--hidden-size: {hidden_size} -> with tp {tp} the width needs a head count that divides it "
                        f"and that tp divides: a multiple of {tp}")
    kv = next(k for k in range(min(model.kv_heads, a), 0, -1) if a % k == 0 and (k % tp == 0 or tp % k == 0))
    ffn = int(round(model.ffn * hidden_size / model.hidden_size / (8 * tp))) * 8 * tp or 4 * hidden_size
    return {"hidden_size": hidden_size, "num_attention_heads": a, "num_kv_heads": kv, "ffn_hidden_size": ffn}


def bench_layout(layout: LayoutSpec, model: ModelSpec, *, planned_layers: int | None = None) -> LayoutSpec:
    """The layout with its stage split written out: the split the estimate uses (cost_models.stage.stage_split), so
    the benchmark builds the very stages whose memory it compares. Where scale_model changed the layer count (from
    `planned_layers`), the plan's own split no longer adds up: the scaled model's layers go evenly to the stages
    (scale_model gave every stage, and every virtual chunk, the same count), and a per-stage count of fully
    recomputed layers keeps its share of its stage."""
    if planned_layers is not None and planned_layers != model.num_layers and layout.layers_per_stage is not None:
        per_stage = model.num_layers // layout.pp
        update: dict = {"layers_per_stage": [per_stage] * layout.pp}
        if layout.recompute_layers_per_stage is not None:
            update["recompute_layers_per_stage"] = [
                min(per_stage, round(r * per_stage / n)) if n else 0
                for r, n in zip(layout.recompute_layers_per_stage, layout.layers_per_stage, strict=True)]
        return layout.model_copy(update=update)
    if layout.pp > 1 and layout.layers_per_stage is None and layout.schedule != "interleaved_1f1b":
        from cost_models.stage import stage_split

        return layout.model_copy(update={"layers_per_stage": list(stage_split(model.num_layers, layout.pp))})
    return layout


def bench_training(layout: LayoutSpec, seq_length: int, dtype: str, optimizer: str,
                   moments: dict[str, str] | None = None) -> TrainingSpec:
    """What the benchmark trains: compute in `dtype`; AdamW with fp32 master weights and moments (12 B/param,
    sharded by ZeRO-1 and FSDP2), or moments in `moments`' dtypes (exp_avg_dtype, exp_avg_sq_dtype: bf16, fp16;
    bench_moments); gradients in the compute dtype under ZeRO-0/1 (the parameters' .grad) and in fp32 under FSDP2
    (MixedPrecisionPolicy reduce_dtype, sharded). SGD (tests) keeps one momentum buffer."""
    precision = {"float32": "fp32", "bfloat16": "bf16"}[dtype]
    grad = precision if layout.zero_stage <= 1 else "fp32"
    return TrainingSpec(global_batch_size=layout.micro_batch_size * layout.num_micro_batches * layout.dp,
                        seq_length=seq_length, precision=precision, optimizer=optimizer, grad_dtype=grad,
                        **(moments or {}))


def bench_moments(text: str | None, optimizer: str) -> dict[str, str]:
    """`bench --optimizer-states`: the AdamW moments the benchmark keeps below fp32 (TrainingSpec fields). The
    benchmark's master copy stays fp32 and its gradients follow its layout, and fp8 moments need a scale it does not
    implement: those are refused."""
    from cluster_specs import SpecError
    from planner.bench.optim import MOMENT_DTYPES
    from planner.inputs.layout_string import parse_optimizer_states

    fields = parse_optimizer_states(text)
    for key, dtype in fields.items():
        if key not in ("exp_avg_dtype", "exp_avg_sq_dtype"):
            raise SpecError(f"--optimizer-states: {key} {dtype} -> the benchmark sets only the moments (exp_avg, "
                            "exp_avg_sq, moments): its master copy is fp32 and its gradients follow the layout")
        if dtype not in MOMENT_DTYPES:
            raise SpecError(f"--optimizer-states: {key} {dtype} -> the benchmark keeps moments in "
                            f"{', '.join(MOMENT_DTYPES)}")
    if fields and optimizer != "adamw":
        raise SpecError(f"--optimizer-states: with --optimizer {optimizer} -> moments below fp32 need adamw")
    return {k: v for k, v in fields.items() if v != "fp32"}


def bench_problem(model: ModelSpec, layout: LayoutSpec, seq_length: int, cluster, dtype: str, knobs,
                  optimizer: str = "adamw", moments: dict[str, str] | None = None) -> Problem:
    """Prediction inputs matching what the benchmark runs (bench_training), on a cluster with exactly dp*tp*pp
    GPUs (one node of that many when it fits in a node)."""
    training = bench_training(layout, seq_length, dtype, optimizer, moments)
    return Problem(model, training, bench_cluster(cluster, layout.num_gpus), knobs)


def bench_cluster(cluster: ClusterSpec, world: int) -> ClusterSpec:
    """The cluster with exactly `world` GPUs: one node of that many when it fits in a node, else whole nodes.
    Refused (SpecError) when it takes more than one node and the cluster has no network between nodes: a
    calibration file (`planner calibrate --nproc N`) describes one node of the N ranks it measured."""
    from cluster_specs import ClusterSpec, SpecError

    if world <= cluster.gpus_per_node:
        data = cluster.model_dump(mode="json")
        data.update(num_nodes=1, gpus_per_node=world)
        if world == 1:
            data["intra_node"] = {"kind": "none", "gb_per_s": 0.0}
        return ClusterSpec.model_validate(data)
    if cluster.inter_node.nic_link() is None:
        raise SpecError(f"ranks: {world} (dp*tp*pp*cp) -> the cluster {cluster.name!r} has {cluster.gpus_per_node} "
                        f"GPUs on one node and no network (a calibration of {cluster.gpus_per_node} ranks): run at "
                        f"most {cluster.gpus_per_node} ranks, or calibrate with `planner calibrate --nproc {world}`")
    return cluster.with_nodes(-(-world // cluster.gpus_per_node))


def make_config(model: ModelSpec, layout: LayoutSpec, seq_length: int, *, steps: int, warmup: int, dtype: str,
                timeout_seconds: float, collect_params: bool = False, fail_rank: int | None = None,
                optimizer: str = "adamw", selective: str = CORE_ATTENTION,
                moments: dict[str, str] | None = None) -> BenchConfig:
    from dataclasses import asdict

    from planner.bench.optim import MOMENT_DTYPES

    shape = asdict(model.to_cost_model(seq_length=seq_length))
    moments = moments or {}
    return BenchConfig(shape=shape, seq_length=seq_length, layout=layout.model_dump(mode="json"), steps=steps,
                       warmup=warmup, dtype=dtype, timeout_seconds=timeout_seconds, collect_params=collect_params,
                       fail_rank=fail_rank, optimizer=optimizer, selective=selective,
                       exp_avg_dtype=MOMENT_DTYPES[moments.get("exp_avg_dtype", "fp32")],
                       exp_avg_sq_dtype=MOMENT_DTYPES[moments.get("exp_avg_sq_dtype", "fp32")])


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
    gathered: list[Any] = [None] * world  # every rank's report once gathered
    dist.all_gather_object(gathered, report)
    dist.destroy_process_group()
    return gathered


def _err(pred: float, meas: float) -> float | None:
    return (pred - meas) / meas if meas else None


def _row(quantity: str, pred: float, meas: float, unit: float) -> dict:
    return {"quantity": quantity, "predicted": pred / unit, "measured": meas / unit, "error": _err(pred, meas)}


def memory_rows(est, reports: list[dict]) -> list[dict]:
    """Per pipeline stage (its first rank; all TP/DP ranks of a stage hold the same): on CUDA the allocator's peak
    allocated against the predicted live bytes, and its peak reserved against those plus the profile's allocator
    reserve (the estimate less the process overhead outside the allocator: context, NCCL); everywhere, the state
    tensors counted one by one."""
    rows = []
    for r in sorted(reports, key=lambda r: r["rank"]):
        if r["dp_rank"] or r["tp_rank"]:
            continue
        stage = est.stages[min(r["pp_rank"], len(est.stages) - 1)]
        tag = f"stage {r['pp_rank']}"
        allocated = stage.allocated_bytes  # live tensors (no allocator reserve, no context)
        parts = (("parameters", stage.weights_bytes, r["parameter_bytes"]),
                 ("gradients", stage.gradients_bytes, r["gradient_bytes"]),
                 ("optimizer state", stage.optimizer_bytes, r["optimizer_state_bytes"]),
                 ("saved activations (peak)", stage.activations_bytes, r["saved_activation_peak_bytes"]))
        if r.get("cuda_max_allocated_bytes") is not None:
            conf = r.get("allocator_config") or "default"
            rows.append(_row(f"{tag}: peak allocated (GiB, CUDA)", allocated, r["cuda_max_allocated_bytes"], GIB))
            rows.append(_row(f"{tag}: peak reserved (GiB, CUDA, PYTORCH_CUDA_ALLOC_CONF={conf})",
                             stage.reserved_bytes, r["cuda_max_reserved_bytes"], GIB))
        else:
            rows.append(_row(f"{tag}: state + saved activations (MiB, tensor accounting)",
                             sum(p for _, p, _ in parts), sum(m for _, _, m in parts), 2**20))
        rows.extend(_row(f"{tag}: {name} (MiB)", pred, meas, 2**20) for name, pred, meas in parts)
    return rows


def run_notes(problem: Problem, layout: LayoutSpec, device: str, world: int | None = None) -> list[str]:
    """Where the run and its prediction differ by design, said beside the rows it moves."""
    notes = []
    cl = problem.cluster
    if device == "cpu" and cl.measured is not None and world is not None and cl.gpus_per_node != world:
        notes.append(f"the calibration measured {cl.gpus_per_node} ranks at once and this run has {world}: on CPU the "
                     "ranks share the cores, so its rates hold at its own rank count only (calibrate with "
                     f"`planner calibrate --nproc {world}`)")
    if layout.sequence_parallel and layout.tp > 1:
        notes.append("saved activations: predicted as torch's DTensor sequence parallelism runs (bench_knobs: the "
                     "gathered QKV and FC1 inputs kept for backward); Megatron keeps them sharded and saves less")
    if layout.schedule == "pipedream_async":
        notes.append("pipedream_async: torch.distributed.pipelining has no asynchronous PipeDream schedule; the "
                     "benchmark runs synchronous 1F1B (a flush every step, no stashed weight versions), so the "
                     "parameters the estimate books for PipeDream's stash read high")
    if layout.schedule == "zero_bubble" and layout.pp > 1:
        notes.append("zero_bubble runs as ZB-H1, the schedule predicted: torch's InterleavedZeroBubble (ZB1P) with "
                     "one stage per rank; torch keeps every micro-batch's loss until the step ends, which with the "
                     "backward split into input and weight passes keeps the last stage's graph alive, so the last "
                     "stage measures more than ZB-H1's memory (Megatron-DeepSpeed's ZB-H1 frees it)")
    if device == "cpu":
        notes.append("on CPU, step times include Python, DTensor and gloo overheads that a GPU run hides: predict on a "
                     "calibration of the same ranks (`planner calibrate --nproc N`), whose layer probes carry them")
    if layout.zero_stage >= 2:
        tr = problem.cm_training
        zero2 = (" ZeRO-2 runs as FSDP2 too, which shards the parameters as ZeRO-3 does, where the estimate keeps "
                 "them whole: its parameters row reads high." if layout.zero_stage == 2 else "")
        booked = ("as the estimate books them" if (tr.param_bytes, tr.optimizer_bytes) == (4, 8) else
                  f"where the estimate books {tr.param_bytes:g} B of weights + {tr.optimizer_bytes:g} B of optimizer "
                  "state")
        notes.append(f"FSDP2: the fp32 shards are both the parameters and AdamW's masters, so the run counts 4 B of "
                     f"parameters + 8 B of moments per parameter, {booked}; the run's gathered copies are transient "
                     f"(in the CUDA peak, not in these rows).{zero2}")
    return notes


def compare(problem: Problem, layout: LayoutSpec, reports: list[dict]) -> dict:
    est = problem.estimate(layout)
    measured_step = max(r["median_step_seconds"] for r in reports)
    rows = [{"quantity": "step time (s)", "predicted": est.step_seconds, "measured": measured_step,
             "error": _err(est.step_seconds, measured_step)}]
    rows += memory_rows(est, reports)
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
    notes = run_notes(problem, layout, reports[0]["device"], len(reports))
    return {"rows": rows, "notes": notes, "median_abs_error": statistics.median(errors) if errors else None,
            "predicted_step_seconds": est.step_seconds, "measured_step_seconds": measured_step}


def report_document(problem: Problem, layout: LayoutSpec, cfg: BenchConfig, reports: list[dict], *,
                    framework: str = "generic") -> BenchReport:
    per_rank = [{k: v for k, v in r.items() if k != "params"} for r in reports]
    comparison = compare(problem, layout, reports)
    if layout.recompute == "selective":
        why = (f"{framework}'s per-op SAC is modelled for dense blocks with SDPA attention only"
               if problem.knobs.selective_op_sac else f"what {framework} means by it")
        comparison["notes"].append(_SELECTIVE_NOTES[cfg.selective].format(framework=framework, why=why))
    return BenchReport.from_run(problem=problem, layout=layout, cfg=cfg, comparison=comparison, ranks=per_rank,
                                framework=framework)


_SELECTIVE_NOTES = {
    CORE_ATTENTION: "recompute 'selective' ran as Megatron's selective recompute: the attention core recomputed "
                      "(Q K^T, softmax, dropout, P V or the fused kernel), every linear's input kept ({why})",
    PER_OP: "recompute 'selective' ran as {framework} means it: per-op selective activation checkpointing (torch's "
              "create_selective_checkpoint_contexts), each block keeping its input, every 2nd matmul's output and "
              "the attention output, and recomputing the rest",
}


@dataclass(frozen=True)
class BenchOptions:
    """How to run a layout (the CLI's options): overrides to fit the machine, scaling, steps, recipe."""

    nproc: int | None = None
    dp: int | None = None
    micro_batches: int | None = None
    layers_per_stage: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    steps: int = 3
    warmup: int = 1
    dtype: str = "float32"
    optimizer: str = "adamw"
    optimizer_states: str | None = None  # moments below fp32 (bench_moments)
    timeout_seconds: float = 120.0
    framework: str | None = None  # whose 'selective' recompute to run; None: the plan's framework, else generic


def check_bench_supports(layout: LayoutSpec, model: ModelSpec | None = None) -> None:
    """Refuse (SpecError, before any rank starts) what the benchmark does not build, naming every such field:
    it trains dense blocks with standard attention (runner.StageModule), over a (pp, dp, tp) mesh, recomputing
    every layer of a stage or none, with all state on the device. Context and expert parallelism are measured on
    their own by `python -m planner.bench.cp_ep` (their exchanges, not a training step)."""
    from cluster_specs import SpecError

    found = []
    if layout.cp > 1:
        found.append(f"cp: {layout.cp} -> the benchmark runs cp=1 (ring attention is measured on its own: "
                     "python -m planner.bench.cp_ep)")
    if layout.ep > 1 or layout.etp > 1:
        found.append(f"ep: {layout.ep}, etp: {layout.etp} -> the benchmark runs ep=1, etp=1 (the all-to-all is "
                     "measured on its own: python -m planner.bench.cp_ep)")
    if layout.offload != "none":
        found.append(f"offload: {layout.offload} -> the benchmark runs offload=none")
    if layout.recompute_layers_per_stage is not None:
        found.append(f"recompute_layers_per_stage: {layout.recompute_layers_per_stage} -> the benchmark recomputes "
                     "every layer of a stage or none (recompute=none, selective or full, without per-stage counts)")
    if model is not None and model.moe is not None:
        found.append(f"moe: {model.moe.num_experts} experts ({model.name}) -> the benchmark builds dense models only")
    if model is not None and model.mla is not None:
        found.append(f"mla: kv_lora_rank {model.mla.kv_lora_rank} ({model.name}) -> the benchmark builds standard "
                     "multi-head (GQA) attention only")
    if found:
        raise SpecError("; ".join(found))


def check_bench_shapes(model: ModelSpec, layout: LayoutSpec) -> None:
    """Refuse (SpecError) a valid layout that the benchmark's ranks cannot run on the model it trains (the scaled
    one), before any rank starts: K/V heads TP cannot split (runner.apply_tp shards them by heads; Megatron would
    replicate them, which the benchmark does not), and fewer micro-batches than torch's pipeline schedule takes
    (Schedule1F1B: at least one per stage; the interleaved and zero-bubble runtimes: a whole number of rounds of
    pp, or fewer than pp)."""
    from cluster_specs import SpecError

    found = []
    if layout.tp > 1 and model.kv_heads % layout.tp:
        found.append(f"num_kv_heads: {model.kv_heads} ({model.name}) -> the benchmark shards K/V heads over tp: "
                     f"a multiple of tp ({layout.tp}); use a tp that divides {model.kv_heads}")
    m, pp = layout.num_micro_batches, layout.pp
    if pp > 1 and layout.schedule in ("1f1b", "pipedream_async") and m < pp:
        found.append(f"num_micro_batches (--micro-batches): {m} -> {layout.schedule} over {pp} pipeline stages "
                     f"needs at least {pp} (torch's Schedule1F1B)")
    elif pp > 1 and layout.schedule in ("interleaved_1f1b", "zero_bubble") and m % max(1, m // pp):
        found.append(f"num_micro_batches (--micro-batches): {m} -> {layout.schedule} over {pp} pipeline ranks runs "
                     f"whole rounds: a multiple of {max(1, m // pp)}, or fewer than {pp}")
    if found:
        raise SpecError("; ".join(found))


def bench_vocabulary(model: ModelSpec, layout: LayoutSpec) -> ModelSpec:
    """The model with its vocabulary padded as the prediction pads it (cost_models.memory.vocab_padded: a multiple
    of 128·tp, Megatron's make-vocab-size-divisible-by), so the vocabulary-parallel embedding and output layer split
    evenly over TP and the run holds the parameters predicted."""
    from cost_models.memory import vocab_padded

    padded = vocab_padded(model.vocab_size, tp=layout.tp)
    return model if padded == model.vocab_size else model.model_copy(update={"vocab_size": padded})


def fit_layout(layout: LayoutSpec, opts: BenchOptions) -> LayoutSpec:
    """The layout with the machine-fitting overrides applied, refused when the benchmark cannot run it."""
    from cluster_specs import SpecError
    from planner.rules import hybrid_shard_problem

    upd = {k: v for k, v in (("dp", opts.dp), ("num_micro_batches", opts.micro_batches)) if v}
    lay = layout.model_copy(update=upd) if upd else layout
    if lay.dp_shard is not None and "dp" in upd:
        # scaled to the machine: the hybrid sharding group shrinks to gcd(S, dp), sharded over every rank where that
        # is all of them (a 32-rank group of a 1,024-rank plan on 4 ranks: ZeRO over the 4)
        s = math.gcd(lay.dp_shard, lay.dp)
        lay = lay.model_copy(update={"dp_shard": s if 1 < s < lay.dp else None})
    check_bench_supports(lay)
    if lay.zero_stage >= 2 and lay.pp > 1:
        raise SpecError("zero_stage: >= 2 with pp > 1 is not supported (see `planner check`)")
    bad = hybrid_shard_problem(dp=lay.dp, shard=lay.dp_shard, zero_stage=lay.zero_stage, offload=lay.offload,
                               ep=lay.ep)
    if bad is not None and bad.rule == "dp_shard_divides_dp":
        raise SpecError(f"dp: {lay.dp} -> hybrid sharding over {lay.dp_shard} ranks needs a dp it divides (--dp a "
                        f"multiple of {lay.dp_shard})")
    if bad is not None:
        raise SpecError(str(bad))
    if opts.nproc is not None:
        check_world_size(lay, opts.nproc)
    return lay


def check_world_size(layout: LayoutSpec, nproc: int | None) -> None:
    """Refuse (SpecError, before any rank starts) a layout whose dp*tp*pp*cp ranks are not the ranks that would
    run it: --nproc's local ranks, else torchrun's WORLD_SIZE (RANK set), else the one rank `bench` starts itself
    (runner.run: the same choice). The message names the option that sets the ranks."""
    import os

    from cluster_specs import SpecError

    needs = f"the layout needs dp*tp*pp*cp = {layout.num_gpus} ranks"
    if nproc is not None:
        if nproc != layout.num_gpus:
            raise SpecError(f"--nproc: {nproc} -> {needs} (give --nproc {layout.num_gpus}, or --dp to shrink it)")
        return
    if "RANK" in os.environ:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world != layout.num_gpus:
            raise SpecError(f"WORLD_SIZE: {world} (torchrun's ranks) -> {needs}: launch that many (torchrun "
                            "--nnodes x --nproc-per-node), or fit the layout to the ranks with --dp")
    elif layout.num_gpus != 1:
        raise SpecError(f"--nproc: not given (one local rank, not under torchrun) -> {needs}: give --nproc "
                        f"{layout.num_gpus} (or --dp to shrink it)")


def _runnable(entries: list[dict], items: list, attempt: Callable[[Any], Any]) -> tuple[list[dict], list, list[str]]:
    """(the entries kept, attempt(item) of each, why a runner-up was skipped) over the short list's entries and their
    items (a layout each): a runner-up whose attempt is refused (SpecError) is skipped with the reason; the pick's
    refusal stands."""
    from cluster_specs import SpecError

    kept: list[dict] = []
    done: list = []
    skipped: list[str] = []
    for e, item in zip(entries, items, strict=True):
        try:
            done.append(attempt(item))
        except SpecError as exc:
            if e["role"] == "pick":
                raise
            skipped.append(f"{item.short()}: {exc}")
            continue
        kept.append(e)
    return kept, done, skipped


def fit_shortlist(entries: list[dict], opts: BenchOptions) -> tuple[list[dict], list[LayoutSpec], list[str]]:
    """The short list's layouts fitted to the machine: each keeps its TP x PP and, without --dp, takes
    dp = nproc / (tp pp). A runner-up that cannot run here is skipped, with why; the pick must run."""
    from dataclasses import replace

    def fit(lay: LayoutSpec) -> LayoutSpec:
        if opts.nproc and not opts.dp and opts.nproc % (lay.tp * lay.pp) == 0:
            return fit_layout(lay, replace(opts, dp=opts.nproc // (lay.tp * lay.pp)))
        return fit_layout(lay, opts)

    return _runnable(entries, [LayoutSpec.model_validate(e["layout"]) for e in entries], fit)


def prepared_shortlist(entries: list[dict], layouts: list[LayoutSpec], model: ModelSpec, seq_length: int, cluster,
                       knobs_kw: dict, opts: BenchOptions
                       ) -> tuple[list[dict], list[tuple[Problem, LayoutSpec, BenchConfig]], list[str]]:
    """bench_config of every fitted layout of the short list, before any runs: (the entries kept, their prepared
    (problem, layout, config), why a runner-up was skipped). A runner-up the scaled model cannot take is skipped
    with the reason; the pick must be prepared."""
    return _runnable(entries, layouts, lambda lay: bench_config(model, lay, seq_length, cluster, knobs_kw, opts))


def bench_knobs(knobs_kw: dict, framework: str | None = None):
    """The knobs the benchmark is predicted with: a calibration's (`knobs_kw`) and what the benchmark runs. It runs
    torch's DTensor sequence parallelism, which saves the gathered QKV/FC1 inputs; torch.distributed.pipelining,
    which keeps a receive buffer per micro-batch; torch's cross-entropy on fp32-cast logits (runner.worker's
    loss_fn), 12 B per logit at its backward, 16 B per local logit under TP, where it runs in loss_parallel; and
    'selective' as `framework` means it (Megatron's attention core, or torchtitan's per-op SAC)."""
    from cost_models.inputs import Knobs
    from cost_models.memory import (
        TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT,
        TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT,
    )
    from planner.frameworks.profiles import profile_for

    return Knobs(**{**knobs_kw, "sp_saves_gathered_inputs": True, "pp_receive_buffers": True,
                    "loss_bytes_per_logit": TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT,
                    "loss_parallel_bytes_per_logit": TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT,
                    "selective_op_sac": profile_for(framework).selective_op_sac is not None})


def bench_config(model: ModelSpec, layout: LayoutSpec, seq_length: int, cluster, knobs_kw: dict,
                 opts: BenchOptions) -> tuple[Problem, LayoutSpec, BenchConfig]:
    """What one layout's benchmark runs and is predicted as, checked, before any rank starts: (the problem it is
    predicted with, the layout with its stage split, the ranks' configuration). The model is scaled as asked and
    the layout's own stage split follows it (bench_layout); a layout the scaled model cannot take is refused here
    (exit 3, the field and the value)."""
    from cost_models import op_sac
    from planner.bench.recompute import selective_kind
    from planner.rules import validate_layout

    md = scale_model(model, layout, layers_per_stage=opts.layers_per_stage, hidden_size=opts.hidden_size,
                     vocab_size=opts.vocab_size)
    md = bench_vocabulary(md, layout)
    lay = bench_layout(layout, md, planned_layers=model.num_layers)
    check_bench_supports(lay, md)
    check_bench_shapes(md, lay)
    check_world_size(lay, opts.nproc)
    knobs = bench_knobs(knobs_kw, opts.framework)
    moments = bench_moments(opts.optimizer_states, opts.optimizer)
    problem = bench_problem(md, lay, seq_length, cluster, opts.dtype, knobs, opts.optimizer, moments)
    validate_layout(lay, problem.model, problem.training, problem.cluster, allow_tp_across_nodes=True)
    cfg = make_config(md, lay, seq_length, steps=opts.steps, warmup=opts.warmup, dtype=opts.dtype,
                      timeout_seconds=opts.timeout_seconds, optimizer=opts.optimizer,
                      selective=selective_kind(op_sac.in_effect(problem.cm_model, knobs.selective_op_sac)),
                      moments=moments)
    return problem, lay, cfg


def bench_one(model: ModelSpec, layout: LayoutSpec, seq_length: int, cluster, knobs_kw: dict,
              opts: BenchOptions) -> dict | None:
    """Scale, predict, run and compare one layout; the report document (None on ranks other than 0 of torchrun)."""
    return bench_run(*bench_config(model, layout, seq_length, cluster, knobs_kw, opts), opts)


def bench_run(problem: Problem, lay: LayoutSpec, cfg: BenchConfig, opts: BenchOptions) -> dict | None:
    """Run what bench_config prepared and compare with its prediction (None on ranks other than 0 of torchrun)."""
    import os

    reports = run(cfg, nproc=opts.nproc)
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    return report_document(problem, lay, cfg, reports, framework=opts.framework or "generic").model_dump(mode="json")


def bench_target(*, plan_file: Path | None, cluster: str | None, model: str | None, layout: str | None,
                 nodes: int | None, seq_len: int | None, dp: int | None,
                 micro_batches: int | None) -> tuple[dict | None, ModelSpec, ClusterSpec, LayoutSpec, int]:
    """What to benchmark: the plan's model, cluster and layout, or --cluster/--model/--layout.
    Returns (plan document or None, model, cluster, layout, sequence length)."""
    from cluster_specs import SpecError, load_cluster
    from planner.estimate import complete_layout
    from planner.inputs.layout_string import parse_layout_string
    from planner.inputs.models import load_model

    if plan_file is not None:
        from planner.inputs.plan_file import load_plan

        parts = load_plan(plan_file)
        if parts.cluster is None:
            raise SpecError("inputs.cluster: missing (expected the output of `planner plan --json`)",
                            source=str(plan_file))
        return parts.doc, parts.model, parts.cluster, parts.layout, seq_len or parts.training.seq_length
    if not (cluster and model and layout):
        raise SpecError("give a plan JSON, or --cluster, --model and --layout")
    cl = load_cluster(cluster, nodes=nodes)
    md = load_model(model)
    seq = seq_len or 2048
    fields = parse_layout_string(layout)
    fields.setdefault("dp", dp or max(1, cl.num_gpus // (fields.get("tp", 1) * fields.get("pp", 1))))
    fields.setdefault("num_micro_batches", micro_batches or max(1, fields.get("pp", 1)))
    tr = TrainingSpec(global_batch_size=fields.get("micro_batch_size", 1) * fields["num_micro_batches"] * fields["dp"],
                      seq_length=seq)
    return None, md, cl, complete_layout(fields, md, tr, cl), seq


DTYPES = ("float32", "bfloat16")
OPTIMIZERS = ("adamw", "sgd")


def check_bench_counts(opts: BenchOptions) -> None:
    """The rank and batch counts the options set, when given: whole numbers >= 1 (0 was silently ignored, a
    negative one blamed on another option or an internal error)."""
    from cluster_specs import SpecError

    for name, value in (("--nproc", opts.nproc), ("--dp", opts.dp), ("--micro-batches", opts.micro_batches),
                        ("--layers-per-stage", opts.layers_per_stage), ("--hidden-size", opts.hidden_size),
                        ("--vocab-size", opts.vocab_size)):
        if value is not None and value < 1:
            raise SpecError(f"{name}: {value} -> must be a whole number >= 1")


def check_bench_options(opts: BenchOptions, top: int, plan_file: Path | None, *, given: tuple[str, ...] = (),
                        save_calibration: Path | None = None) -> None:
    """The bench options, before any rank starts; `given`: which of --cluster/--model/--layout were given, which a
    plan file says itself (they would be ignored beside one)."""
    from cluster_specs import SpecError
    from cluster_specs.limits import finite_option

    check_bench_counts(opts)
    if opts.dtype not in DTYPES:
        raise SpecError(f"--dtype: {opts.dtype!r} -> allowed: {', '.join(DTYPES)}")
    if opts.optimizer not in OPTIMIZERS:
        raise SpecError(f"--optimizer: {opts.optimizer!r} -> allowed: {', '.join(OPTIMIZERS)}")
    bench_moments(opts.optimizer_states, opts.optimizer)  # refused before any rank starts
    if top < 1 or (top > 1 and plan_file is None):
        raise SpecError(f"--top: {top} -> needs a plan JSON and a value >= 1")
    if plan_file is not None and given:
        raise SpecError(f"{', '.join(given)}: given with a plan file -> the plan says them; give the plan, or "
                        "--cluster/--model/--layout without one")
    if save_calibration is not None and top < 2:
        raise SpecError(f"--save-calibration: needs --top 2 or more (given --top {top}) -> it folds the measured "
                        "layouts' step times into the calibration")
    finite_option("--timeout", opts.timeout_seconds, low=0.0, low_inclusive=False, high=86400.0)


def check_calibration_device(cluster) -> None:
    """--save-calibration folds the measured/predicted ratio into the cluster's end-to-end factor: only where the
    runs measured what was predicted. Runs on this machine's CPU against predictions for a GPU cluster would write a
    CPU-versus-GPU ratio into the GPU's file (0.07 for A100s: the next plan predicted 95 s where it said 7.7 s). A
    cluster measured by `planner calibrate` (its `measured` section, e.g. --calibration local.yaml) is this machine;
    on CUDA the runs are the GPUs'."""
    import torch

    if torch.cuda.is_available() or cluster.measured is not None:
        return
    from cluster_specs import SpecError

    raise SpecError(f"--save-calibration: the runs are on this machine's CPU, the predictions for {cluster.gpu} "
                    f"({cluster.name}) -> run on that cluster's GPUs, or predict on this machine's calibration "
                    "(--calibration local.yaml, from `planner calibrate`)")


def bench_document(opts: BenchOptions, *, plan_file: Path | None, cluster: str | None, model: str | None,
                   layout: str | None, nodes: int | None, seq_len: int | None, top: int = 1,
                   save_calibration: Path | None = None, calibration: Path | None = None) -> dict | None:
    """`planner bench`: check the options, then run the layout (or the plan's short list with top > 1) and compare
    with the prediction. None on ranks other than 0 of a torchrun job."""
    from dataclasses import replace

    from planner.bench import need_torch
    from planner.calibration import calibrated
    from planner.frameworks.profiles import profile_for

    given = tuple(name for name, v in (("--cluster", cluster), ("--model", model), ("--layout", layout))
                  if v is not None)
    check_bench_options(opts, top, plan_file, given=given, save_calibration=save_calibration)
    need_torch()
    plan_doc, md, cl, lay, seq = bench_target(plan_file=plan_file, cluster=cluster, model=model, layout=layout,
                                              nodes=nodes, seq_len=seq_len, dp=opts.dp,
                                              micro_batches=opts.micro_batches)
    check_bench_supports(lay, md)  # every unsupported field of the model and the layout, before any fitting
    framework = opts.framework or (plan_doc or {}).get("framework") or "generic"
    profile_for(framework)  # refuses a name that is no framework, given or in the plan (field, value, allowed)
    opts = replace(opts, framework=framework)
    cl, knobs_kw = calibrated(cl, calibration)
    if top > 1 and plan_doc is not None:
        from planner.bench.shortlist import run_shortlist

        if save_calibration is not None:
            check_calibration_device(cl)

        return run_shortlist(plan_doc, top, md, seq, cl, knobs_kw, opts, save_calibration)
    return bench_one(md, fit_layout(lay, opts), seq, cl, knobs_kw, opts)
