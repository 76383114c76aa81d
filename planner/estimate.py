"""Glue between the specs and the cost models: complete a partial layout, estimate it, the fit rule.

The JSON documents are built in planner/contract.py; `Problem` lives in planner/problem.py."""

from __future__ import annotations

from cluster_specs import ClusterSpec, SpecError
from cost_models.step import StepEstimate
from planner.inputs.specs import LayoutSpec, ModelSpec, TrainingSpec
from planner.problem import DEFAULT_HEADROOM_GIB, GIB, Problem
from planner.rules import validate_layout

__all__ = ["DEFAULT_HEADROOM_GIB", "GIB", "Problem", "complete_layout", "estimate_layout", "fits_in_memory",
           "layout_from_arg"]


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


def layout_from_arg(text: str, problem: Problem, option: str = "--layout") -> LayoutSpec:
    """A --layout or --compare value, completed: a key=value string, or a plan JSON file (its `layout` object;
    a full plan is validated first, so a hand-edited one that breaks a layout rule is refused)."""
    from pathlib import Path

    from planner.inputs.layout_string import parse_layout_string

    p = Path(text)
    if p.suffix.lower() == ".json" or (p.exists() and p.is_file()):
        from cluster_specs import read_structured_file
        from planner.inputs.plan_file import plan_parts

        doc = read_structured_file(p)
        if not isinstance(doc, dict) or not isinstance(doc.get("layout"), dict):
            raise SpecError(f"{option}: expected a plan JSON with a 'layout' object", source=str(p))
        if "inputs" in doc:
            plan_parts(doc, str(p))
        fields = dict(doc["layout"])
    else:
        fields = parse_layout_string(text, source=option)
    return complete_layout(fields, problem.model, problem.training, problem.cluster)


def estimate_layout(problem: Problem, layout: LayoutSpec, *, allow_tp_across_nodes: bool = False) -> StepEstimate:
    validate_layout(layout, problem.model, problem.training, problem.cluster, allow_tp_across_nodes=allow_tp_across_nodes)
    return problem.estimate(layout)


def fits_in_memory(est: StepEstimate, headroom_bytes: float) -> bool:
    """The one fit rule: the modelled peak plus the headroom within the GPU, and host memory within the node's."""
    return est.fits and est.peak_memory_bytes + headroom_bytes <= est.gpu_memory_bytes
