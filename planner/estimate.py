"""Glue between the specs and the cost models: complete a partial layout, estimate it, shape the JSON."""

from __future__ import annotations

from dataclasses import dataclass, field

from cluster_specs import ClusterSpec, SpecError
from cost_models.inputs import Hardware, Knobs
from cost_models.step import StepEstimate, estimate_step
from planner.inputs.specs import LayoutSpec, ModelSpec, TrainingSpec, validate_layout

GIB = 2**30
DEFAULT_HEADROOM_GIB = 2.0  # kept free on top of the modelled peak (plan and check); --headroom-gib changes it


@dataclass(frozen=True)
class Problem:
    """The three inputs, converted once for the cost models."""

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    knobs: Knobs = field(default_factory=Knobs)

    def __post_init__(self):
        object.__setattr__(self, "hardware", self.cluster.to_cost_model(self.training.precision))
        object.__setattr__(self, "cm_model", self.model.to_cost_model(seq_length=self.training.seq_length))
        object.__setattr__(self, "cm_training", self.training.to_cost_model())

    hardware: Hardware = field(init=False)

    def estimate(self, layout: LayoutSpec) -> StepEstimate:
        return estimate_step(self.cm_model, self.cm_training, self.hardware, layout.to_cost_model(), self.knobs)


def complete_layout(fields: dict, model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec) -> LayoutSpec:
    """Fill the keys a user left out, with these stated defaults:

    tp 1, pp 1; dp = GPUs / (tp x pp); zero 0; offload none; mbs 1; num_micro_batches = batch / (mbs x dp);
    recompute none; sequence_parallel on when tp > 1 (Korthikanti et al. 2022 recommend it with TP);
    schedule 1f1b; virtual stages 2 when the schedule is interleaved_1f1b.
    """
    from pydantic import ValidationError

    from cluster_specs.errors import from_pydantic

    f = dict(fields)
    f.setdefault("tp", 1)
    f.setdefault("pp", 1)
    if "dp" not in f:
        tp_pp = f["tp"] * f["pp"]
        if tp_pp <= 0 or cluster.num_gpus % tp_pp:
            raise SpecError(f"dp: cannot infer: tp*pp = {tp_pp} does not divide the cluster's {cluster.num_gpus} GPUs",
                            source="--layout")
        f["dp"] = cluster.num_gpus // tp_pp
    f.setdefault("micro_batch_size", 1)
    if "num_micro_batches" not in f:
        per = f["micro_batch_size"] * f["dp"]
        if per <= 0 or training.global_batch_size % per:
            raise SpecError(
                f"global_batch_size: {training.global_batch_size} -> not divisible by micro_batch_size x dp = {per}",
                source="--layout")
        f["num_micro_batches"] = training.global_batch_size // per
    f.setdefault("sequence_parallel", f["tp"] > 1)
    if f.get("schedule") == "interleaved_1f1b":
        f.setdefault("virtual_stages", 2)
    try:
        layout = LayoutSpec.model_validate(f)
    except ValidationError as exc:
        raise from_pydantic(exc, source="layout") from None
    return layout


def estimate_layout(problem: Problem, layout: LayoutSpec, *, allow_tp_across_nodes: bool = False) -> StepEstimate:
    validate_layout(layout, problem.model, problem.training, problem.cluster, allow_tp_across_nodes=allow_tp_across_nodes)
    return problem.estimate(layout)


def predicted_json(est: StepEstimate, headroom_bytes: float = 0.0) -> dict:
    return {
        "step_time_seconds": est.step_seconds,
        "tokens_per_second": est.tokens_per_second,
        "tokens_per_second_per_gpu": est.tokens_per_second_per_gpu,
        "mfu": est.mfu,
        "hfu": est.hfu,
        "model_flops_per_step": est.model_flops_per_step,
        "hardware_flops_per_step": est.hardware_flops_per_step,
        "peak_memory_bytes_per_gpu": est.peak_memory_bytes,
        "peak_memory_stage": est.peak_stage,
        "gpu_memory_bytes": est.gpu_memory_bytes,
        "memory_headroom_bytes": headroom_bytes,
        "host_memory_bytes_per_node": est.host_memory_bytes_per_node,
        "fits": est.fits and est.peak_memory_bytes + headroom_bytes <= est.gpu_memory_bytes,
    }


def memory_breakdown_json(est: StepEstimate) -> dict:
    def stage(st):
        return {
            "stage": st.stage, "layers": st.layers, "parameters": st.params,
            "weights_bytes": st.weights_bytes, "gradients_bytes": st.gradients_bytes,
            "optimizer_bytes": st.optimizer_bytes, "activations_bytes": st.activations_bytes,
            "transient_bytes": st.transient_bytes, "overhead_bytes": st.overhead_bytes,
            "total_bytes": st.total_bytes, "in_flight_micro_batches": st.in_flight_micro_batches,
        }

    peak = est.stages[est.peak_stage]
    return {"peak_stage": est.peak_stage, **{k: v for k, v in stage(peak).items() if k.endswith("_bytes")},
            "stages": [stage(s) for s in est.stages]}


def time_breakdown_json(est: StepEstimate) -> dict:
    t = est.time
    return {
        "compute_seconds": t.compute_seconds,
        "recompute_seconds": t.recompute_seconds,
        "tp_comm_exposed_seconds": t.tp_comm_seconds,
        "pipeline_bubble_seconds": t.pipeline_bubble_seconds,
        "pp_p2p_exposed_seconds": t.pp_p2p_seconds,
        "dp_comm_exposed_seconds": t.dp_comm_seconds,
        "optimizer_seconds": t.optimizer_seconds,
        "offload_seconds": t.offload_seconds,
        "dp_comm_total_seconds": t.dp_comm_total_seconds,
        "tp_comm_total_seconds": t.tp_comm_total_seconds,
        "total_seconds": t.total_seconds,
        "matmul_efficiency": est.matmul_efficiency,
    }
