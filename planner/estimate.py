"""Glue between the specs and the cost models: complete a partial layout, estimate it, the fit rule.

The JSON documents are built in planner/contract.py; `Problem` lives in planner/problem.py."""

from __future__ import annotations

from pathlib import Path

from cluster_specs import ClusterSpec, SpecError
from cost_models.inputs import Knobs
from cost_models.step import StepEstimate, estimate_step
from planner.inputs.specs import LayoutSpec, ModelSpec, TrainingSpec
from planner.problem import DEFAULT_HEADROOM_GIB, GIB, Problem
from planner.rules import validate_layout

__all__ = ["DEFAULT_HEADROOM_GIB", "GIB", "Problem", "build_problem", "complete_layout", "estimate_layout", "fits_in_memory",
           "layout_from_arg"]


def _training(model, global_batch_size: int, seq_len: int, precision: str, compile_model: bool,
              optimizer_states: dict[str, str] | None) -> TrainingSpec:
    """The training setup, validated, and one the model can train on (ModelSpec.sequence_problem)."""
    from pydantic import ValidationError

    from cluster_specs.errors import from_pydantic

    try:
        tr = TrainingSpec(global_batch_size=global_batch_size, seq_length=seq_len, precision=precision,
                          compile=compile_model, **(optimizer_states or {}))
    except ValidationError as exc:
        raise from_pydantic(exc, source="training setup") from None
    why = model.sequence_problem(tr.seq_length)
    if why:
        raise SpecError(f"--seq-len: {why}")
    return tr


def build_problem(cluster: str, nodes: int | None, model: str, global_batch_size: int, seq_len: int,
                  precision: str | None = None, headroom_gib: float = DEFAULT_HEADROOM_GIB,
                  calibration: Path | None = None, framework: str | None = None,
                  fp8_recipe: str | None = None, fp8_param_gather: bool | None = None,
                  optimizer_states: dict[str, str] | None = None, compile_model: bool = False) -> Problem:
    """The problem a command describes: cluster (scaled, calibrated), model, training setup, knobs. Without a
    precision, the GPU's default (bf16, or fp16 on a GPU without bf16 such as V100; a note says so). With
    precision fp8 and no recipe, the framework's default recipe (planner/frameworks/capabilities.py), and its
    default FP8 parameter all-gather unless `fp8_param_gather` says (a config read by `check` sets it).
    optimizer_states: TrainingSpec's state dtype fields (grad_dtype, master_dtype, exp_avg_dtype, exp_avg_sq_dtype;
    planner.inputs.layout_string.parse_optimizer_states), refused where the framework cannot keep them.
    compile_model: torch.compile the model (TrainingSpec.compile), refused where the framework has no such setting."""
    import sys

    from cluster_specs import limits as lim
    from cluster_specs import load_cluster
    from cluster_specs.limits import finite_option
    from planner.calibration import calibrated
    from planner.inputs.models import load_model

    headroom = finite_option("--headroom-gib", headroom_gib, high=float(lim.MAX_GPU_MEMORY_GIB))
    cl, knobs_kw = calibrated(load_cluster(cluster, nodes=nodes), calibration)
    md = load_model(model)
    if precision is None:
        gpu = cl.gpu_spec()
        precision = gpu.default_precision()
        from planner.frameworks.capabilities import capabilities

        why = capabilities(framework).precision_problem(precision, None)
        if why:
            raise SpecError(f"--precision: not given, and {gpu.name}'s default {precision} (it has no bf16 tensor "
                            f"peak): {why}; pass --precision fp32")
        if precision != "bf16":
            print(f"note: {gpu.name} has no bf16 tensor peak: using --precision {precision}", file=sys.stderr)
    tr = _training(md, global_batch_size, seq_len, precision, compile_model, optimizer_states)
    if tr.grad_dtype is not None and tr.grad_dtype_off_default is None:
        # a gradient dtype asked for that is the default is no change: the framework profile's recipe stays
        tr = tr.model_copy(update={"grad_dtype": None})
    from planner.frameworks.capabilities import capabilities

    why = capabilities(framework).state_dtype_problem(tr)
    if why:
        raise SpecError(f"--optimizer-states: {why}")
    why = capabilities(framework).compile_problem(tr.compile)
    if why:
        raise SpecError(f"--compile: {why}")
    from planner.frameworks.capabilities import fp8_gathers_params, fp8_recipe_for

    recipe = fp8_recipe_for(framework, tr.precision, fp8_recipe)
    if recipe is not None:
        gather = fp8_gathers_params(framework, recipe) if fp8_param_gather is None else fp8_param_gather
        tr = tr.model_copy(update={"fp8_recipe": recipe, "fp8_param_gather": gather})
    return Problem(md, tr, cl, problem_knobs(cl, tr, framework, headroom * GIB, knobs_kw))


def problem_knobs(cluster: ClusterSpec, training: TrainingSpec, framework: str | None, headroom_bytes: float,
                  calibrated: dict) -> Knobs:
    """The knobs of a problem: the framework's execution profile (the same one `validate` uses) on the cluster's
    GPU generation and the training's precision, a compiled model's elementwise share where it is compiled, then
    what a calibration measured. `build_problem` and a plan file's problem (exports) both use it."""
    from dataclasses import replace

    from planner.bands import cluster_generation
    from planner.frameworks.profiles import COMPILED_ELEMENTWISE_SHARE, profile_knobs

    profiled = profile_knobs(framework, Knobs(memory_headroom_bytes=headroom_bytes),
                             gpu_generation=cluster_generation(cluster), precision=training.precision)
    if training.compile:
        profiled = replace(profiled, compiled_elementwise_share=COMPILED_ELEMENTWISE_SHARE.value)
    return replace(profiled, **calibrated)


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
    if "dp" not in f:  # what the other degrees leave (CP ranks are GPUs of their own; EP folds into DP)
        cp = f.get("cp", 1)
        used, named = f["tp"] * f["pp"] * cp, "tp*pp" + ("*cp" if cp != 1 else "")
        if used <= 0 or cluster.num_gpus % used:
            raise SpecError(f"dp: cannot infer: {named} = {used} does not divide the cluster's {cluster.num_gpus} GPUs",
                            source="--layout")
        f["dp"] = cluster.num_gpus // used
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


def layout_file(text: str) -> Path | None:
    """The file a --layout/--compare value names (a .json name, or an existing file), or None for a key=value
    string, which is never taken for a file name."""
    p = Path(text)
    if p.suffix.lower() == ".json":
        return p
    if "=" in text:
        return None
    try:
        return p if p.is_file() else None
    except OSError:  # a name the OS cannot look up (too long): not a file
        return None


def plan_file_framework(text: str) -> str | None:
    """The framework a plan JSON given as --layout was made for (its top-level `framework`), or None: a key=value
    string, a layout-only file, or a file that cannot be read (layout_from_arg then says why)."""
    p = layout_file(text)
    if p is None:
        return None
    from cluster_specs import read_structured_file

    try:
        doc = read_structured_file(p)
    except SpecError:
        return None
    from planner.frameworks import Framework

    framework = doc.get("framework") if isinstance(doc, dict) else None
    return framework if framework in tuple(Framework) else None


def layout_from_arg(text: str, problem: Problem, option: str = "--layout") -> LayoutSpec:
    """A --layout or --compare value, completed: a key=value string, or a plan JSON file (its `layout` object;
    a full plan is validated first, so a hand-edited one that breaks a layout rule is refused)."""
    from planner.inputs.layout_string import parse_layout_string

    p = layout_file(text)
    if p is not None:
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


def fits_in_memory(est: StepEstimate, headroom_bytes: float, high_fraction: float = 0.0) -> bool:
    """The one fit rule: the modelled peak, raised by `high_fraction` (the memory band's high end when `plan`
    keeps its default --memory-margin band-high), plus the headroom within the GPU, and host memory within the
    node's."""
    return est.fits and est.peak_memory_bytes * (1 + high_fraction) + headroom_bytes <= est.gpu_memory_bytes


def assumptions_json(problem: Problem, layout: LayoutSpec, est: StepEstimate) -> list[dict]:
    """The framework profile's assumptions that move this prediction most, each with the step time without it."""
    from planner.frameworks.profiles import ranked_assumptions

    cm_layout = layout.to_cost_model()

    def step_with(knobs) -> float:
        return estimate_step(problem.cm_model, problem.cm_training, problem.hardware, cm_layout, knobs).step_seconds

    from planner.bands import cluster_generation

    found = ranked_assumptions(step_with, problem.knobs, problem.knobs.profile, est.step_seconds,
                               gpu_generation=cluster_generation(problem.cluster))
    out = [{"statement": a.statement, "source": a.source, "step_time_seconds_if_not": a.step_seconds_if_wrong}
           for a in found]
    return out + _schedule_assumption(problem, layout)


def _schedule_assumption(problem: Problem, layout: LayoutSpec) -> list[dict]:
    """A schedule the framework runs differently from the one predicted (Capabilities.unpredicted_schedules), as an
    assumption whose alternative is the same layout under 1F1B."""
    from planner.frameworks.capabilities import capabilities

    why = capabilities(problem.knobs.profile).unpredicted_schedules.get(layout.schedule) if layout.pp > 1 else None
    if why is None:
        return []
    plain = layout.model_copy(update={"schedule": "1f1b", "virtual_stages": 1})
    return [{"statement": why, "source": "frameworks.md §1.4; docs/benchmark.md (zero bubble)",
             "step_time_seconds_if_not": problem.estimate(plain).step_seconds}]
