"""The output contract, defined once: the plan, estimate, check and bench documents as typed pydantic models.

Every output reads these models: the JSON documents (`model_dump`), the published JSON Schema (generated from
them: `planner schema NAME`, `make schema` writes docs/schema/*.schema.json, and tests/test_contract.py holds the
checked-in copies to the code) and the terminal rendering (planner/explain/report.py takes these models).
The models are built from the cost model's estimate (`Predicted.from_estimate`, `CandidateReport.from_estimate`,
`PlanDocument.from_result`), never from hand-written dicts.

Adding an output field: add it here, with a description, fill it in the `from_*` builder, run `make schema`.
A change that breaks consumers (a field removed, renamed or retyped) bumps planner.SCHEMA_VERSION's major
number; an added field bumps the minor number.

Names: the cost model's own dataclasses (cost_models.step.StageMemory, TimeBreakdown, StepEstimate) are inputs
to this module; the models here are named for what they are in a document (`...Report`, `...Document`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from cluster_specs.schema import ClusterSpec, GPUSpec
from planner.bench import CORE_ATTENTION
from planner.frameworks import Framework
from planner.inputs.specs import LayoutSpec, ModelSpec, TrainingSpec

if TYPE_CHECKING:  # the builders take these; importing them here would pull the cost models into `schema`
    from cost_models.step import StageMemory, StepEstimate


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


def _versions() -> dict[str, str]:
    from planner import SCHEMA_VERSION, __version__

    return {"schema_version": SCHEMA_VERSION, "tool_version": __version__}


# ---- one estimate ----------------------------------------------------------------------------------------


class Assumption(_Strict):
    """One framework-profile assumption behind a prediction."""

    statement: str = Field(description="what the profile assumes, e.g. 'DP gradient reduce ... 90% hidden'")
    source: str = Field(description="where the value comes from (framework code, docs, papers)")
    step_time_seconds_if_not: float = Field(description="the step time if the assumption does not hold")


class Predicted(_Strict):
    """The headline numbers of one layout."""

    step_time_seconds: float = Field(description="Seconds per optimizer step.")
    tokens_per_second: float = Field(description="global_batch_size x seq_length / step_time_seconds.")
    tokens_per_second_per_gpu: float = Field(description="tokens_per_second / GPUs.")
    mfu: float = Field(description="Model FLOPs utilisation: model FLOPs per step / (step time x GPUs x peak).")
    hfu: float = Field(description="Hardware FLOPs utilisation: as mfu, counting recomputation.")
    model_flops_per_step: float = Field(description="Model FLOPs of one step, all GPUs (6N-style, full attention).")
    hardware_flops_per_step: float = Field(description="FLOPs executed per step, recomputation included.")
    peak_memory_bytes_per_gpu: float = Field(description="Modelled peak on the fullest stage "
                                                         "(= memory_breakdown.total_bytes).")
    peak_memory_stage: int = Field(description="Pipeline stage holding the peak (0-based).")
    gpu_memory_bytes: float = Field(description="Memory of one GPU.")
    memory_headroom_bytes: float = Field(description="Kept free on top of the peak (--headroom-gib).")
    host_memory_bytes_per_node: float = Field(description="Host memory per node the layout uses (offload).")
    fits: bool = Field(description="peak + headroom <= GPU memory, and host memory within the node's.")
    # error band, memory split and assumptions (planner/bands.py, planner/frameworks/profiles.py); optional so that
    # plans written before them still load
    step_time_seconds_range: list[float] | None = Field(
        None, description="[low, high]: where the measured step time is expected (a central quantile of the leave-one-"
                          "source-out errors of this regime: framework family, GPU generation, scale; its level is "
                          "calibrated so that about 80% of a held-out source's runs fall inside)")
    peak_memory_bytes_per_gpu_high: float | None = Field(
        None, description="device memory at the band's high end (measured peaks above the prediction, 90th pct)")
    peak_allocated_bytes_per_gpu: float | None = Field(
        None, description="live tensors at the peak (torch.cuda.max_memory_allocated)")
    peak_reserved_bytes_per_gpu: float | None = Field(
        None, description="the caching allocator's pool at the peak (max_memory_reserved); peak_memory_bytes_per_gpu "
                          "adds the CUDA context and NCCL (outside the allocator)")
    fit: Literal["fits", "tight", "does not fit"] | None = Field(
        None, description="fits: the band's high end plus the headroom fits the GPU; does not fit: even the allocated "
                          "peak + context + NCCL exceeds the GPU (check fails it); tight: in between")
    error_band_regime: str | None = Field(None, description="the regime whose residuals made the band")
    error_band_rows: int | None = Field(None, description="published runs in that regime")
    assumptions: list[Assumption] | None = Field(
        None, description="the framework profile's assumptions that move this step time most (estimate, check, the "
                          "plan's pick), largest first")

    @classmethod
    def from_estimate(cls, est: StepEstimate, headroom_bytes: float, problem: Any = None,
                      layout: LayoutSpec | None = None) -> Predicted:
        """With the problem: also the error band and the three-way fit; with the layout too, the assumptions."""
        from planner.estimate import assumptions_json, fits_in_memory

        trust: dict[str, Any] = {}
        if problem is not None:
            from planner.bands import trust_json

            trust = trust_json(problem, est)
            if layout is not None:
                trust["assumptions"] = assumptions_json(problem, layout, est)
        return cls(step_time_seconds=est.step_seconds, tokens_per_second=est.tokens_per_second,
                   tokens_per_second_per_gpu=est.tokens_per_second_per_gpu, mfu=est.mfu, hfu=est.hfu,
                   model_flops_per_step=est.model_flops_per_step, hardware_flops_per_step=est.hardware_flops_per_step,
                   peak_memory_bytes_per_gpu=est.peak_memory_bytes, peak_memory_stage=est.peak_stage,
                   gpu_memory_bytes=est.gpu_memory_bytes, memory_headroom_bytes=headroom_bytes,
                   host_memory_bytes_per_node=est.host_memory_bytes_per_node,
                   fits=fits_in_memory(est, headroom_bytes), **trust)


class _MemoryParts(_Strict):
    # field -> label for the terminal; the parts sum to total_bytes
    PARTS: ClassVar[dict[str, str]] = {"weights_bytes": "weights", "gradients_bytes": "gradients",
                                       "optimizer_bytes": "optimizer", "activations_bytes": "activations",
                                       "transient_bytes": "transient", "reserve_bytes": "allocator reserve",
                                       "overhead_bytes": "context + NCCL (outside the allocator)"}

    weights_bytes: float = Field(description="Parameters held by one GPU (after ZeRO-3 sharding).")
    gradients_bytes: float = Field(description="Gradients held by one GPU (after ZeRO-2/3 sharding).")
    optimizer_bytes: float = Field(description="Optimizer state (fp32 master copy and moments) after ZeRO sharding.")
    activations_bytes: float = Field(description="Saved activations of every in-flight micro-batch.")
    transient_bytes: float = Field(description="Short-lived buffers at the peak: one layer's backward (what its "
                                                "recompute materialises again and its MLP's gradients), ZeRO-3 "
                                                "gathers, communication buckets, the loss's backward.")
    reserve_bytes: float = Field(0.0, description="The caching allocator's reserve above the live bytes (framework "
                                                  "profile); weights to transient + this = reserved.")
    overhead_bytes: float = Field(description="CUDA context, NCCL and workspaces, outside the caching allocator.")
    total_bytes: float = Field(description="Sum of the parts above.")

    @staticmethod
    def _parts(st: StageMemory) -> dict[str, float]:
        return {"weights_bytes": st.weights_bytes, "gradients_bytes": st.gradients_bytes,
                "optimizer_bytes": st.optimizer_bytes, "activations_bytes": st.activations_bytes,
                "transient_bytes": st.transient_bytes, "reserve_bytes": st.reserve_bytes,
                "overhead_bytes": st.overhead_bytes,
                "total_bytes": st.total_bytes}


class StageMemoryReport(_MemoryParts):
    """One pipeline stage's memory per GPU."""

    stage: int = Field(description="Pipeline stage (0-based).")
    layers: int = Field(description="Transformer layers on this stage.")
    parameters: float = Field(description="Parameters held by one GPU of this stage before ZeRO sharding.")
    in_flight_micro_batches: float = Field(description="Micro-batches whose activations the stage holds at its peak.")

    @classmethod
    def from_stage(cls, st: StageMemory) -> StageMemoryReport:
        return cls(stage=st.stage, layers=st.layers, parameters=st.params,
                   in_flight_micro_batches=st.in_flight_micro_batches, **cls._parts(st))


class MemoryBreakdown(_MemoryParts):
    """The peak stage's parts, and every stage."""

    peak_stage: int = Field(description="The stage whose parts are given at the top level.")
    stages: list[StageMemoryReport]

    @classmethod
    def from_estimate(cls, est: StepEstimate) -> MemoryBreakdown:
        return cls(peak_stage=est.peak_stage, stages=[StageMemoryReport.from_stage(s) for s in est.stages],
                   **cls._parts(est.stages[est.peak_stage]))


class TimeReport(_Strict):
    """Where one step's time goes, on the bottleneck stage. The exposed parts (PARTS) sum to total_seconds."""

    # field -> label: the terminal's time table and the decision's "mostly X" both read this one map
    PARTS: ClassVar[dict[str, str]] = {
        "compute_seconds": "compute", "recompute_seconds": "recomputation",
        "tp_comm_exposed_seconds": "exposed TP all-reduces", "cp_comm_exposed_seconds": "exposed CP KV exchange",
        "ep_comm_exposed_seconds": "exposed EP all-to-all", "pipeline_bubble_seconds": "pipeline bubble",
        "pp_p2p_exposed_seconds": "pipeline send/recv", "dp_comm_exposed_seconds": "exposed gradient/parameter traffic",
        "optimizer_seconds": "optimizer step", "offload_seconds": "offload"}

    compute_seconds: float = Field(description="Model FLOPs of the bottleneck stage, all micro-batches.")
    recompute_seconds: float = Field(description="Recomputing activations in the backward pass (its GEMMs at the "
                                                 "forward's rate and FP8 casts; the CP/EP traffic it repeats is "
                                                 "in the CP/EP rows).")
    tp_comm_exposed_seconds: float = Field(description="TP/SP collectives not hidden behind compute.")
    cp_comm_exposed_seconds: float = Field(0.0, description="Context-parallel K/V exchange not hidden behind attention "
                                                           "(ring steps longer than their attention block, "
                                                           "all-gather and Ulysses all-to-all in full), including "
                                                           "the forward exchange a recompute repeats (full and "
                                                           "selective: the CP exchange is inside core attention).")
    ep_comm_exposed_seconds: float = Field(0.0, description="Expert-parallel dispatch and combine all-to-all not "
                                                           "hidden (forward and backward, and the forward's again "
                                                           "under full recompute).")
    pipeline_bubble_seconds: float = Field(description="Pipeline fill and drain (idle time of the bottleneck stage).")
    pp_p2p_exposed_seconds: float = Field(description="Pipeline sends and receives not hidden.")
    dp_comm_exposed_seconds: float = Field(description="Gradient reduction / ZeRO gathers not hidden.")
    optimizer_seconds: float = Field(description="The optimizer step.")
    offload_seconds: float = Field(description="Host transfers and CPU optimizer not hidden (offload).")
    dp_comm_total_seconds: float = Field(description="All data-parallel traffic before overlap (for explanations).")
    tp_comm_total_seconds: float = Field(description="All TP traffic before overlap (for explanations).")
    cp_comm_total_seconds: float = Field(0.0, description="All CP K/V traffic before overlap (for explanations).")
    ep_comm_total_seconds: float = Field(0.0, description="All EP all-to-all traffic before overlap (for "
                                                         "explanations).")
    total_seconds: float = Field(description="Sum of the exposed parts = step_time_seconds.")
    matmul_efficiency: float = Field(description="Achieved fraction of peak on the layout's GEMMs.")
    stage_seconds: list[float] = Field(description="Forward + backward seconds of one micro-batch on each stage.")

    @classmethod
    def from_estimate(cls, est: StepEstimate) -> TimeReport:
        t = est.time
        return cls(compute_seconds=t.compute_seconds, recompute_seconds=t.recompute_seconds,
                   tp_comm_exposed_seconds=t.tp_comm_seconds, cp_comm_exposed_seconds=t.cp_comm_seconds,
                   ep_comm_exposed_seconds=t.ep_comm_seconds, pipeline_bubble_seconds=t.pipeline_bubble_seconds,
                   pp_p2p_exposed_seconds=t.pp_p2p_seconds, dp_comm_exposed_seconds=t.dp_comm_seconds,
                   optimizer_seconds=t.optimizer_seconds, offload_seconds=t.offload_seconds,
                   dp_comm_total_seconds=t.dp_comm_total_seconds, tp_comm_total_seconds=t.tp_comm_total_seconds,
                   cp_comm_total_seconds=t.cp_comm_total_seconds, ep_comm_total_seconds=t.ep_comm_total_seconds,
                   total_seconds=t.total_seconds, matmul_efficiency=est.matmul_efficiency,
                   stage_seconds=list(est.stage_seconds))

    def exposed(self) -> dict[str, float]:
        """label -> seconds of each exposed part."""
        return {label: getattr(self, name) for name, label in self.PARTS.items()}


class CandidateReport(_Strict):
    """One layout with its prediction and both breakdowns."""

    layout: LayoutSpec
    predicted: Predicted
    memory_breakdown: MemoryBreakdown
    time_breakdown: TimeReport
    origin: str = Field(description="search | split | ilp | compared: where the layout came from.")
    reason: str | None = Field(description="One line. The pick: what dominates its cost beyond compute, in numbers. "
                                           "Runners-up and compared layouts: what differs from the pick and what "
                                           "it costs.")

    @classmethod
    def from_estimate(cls, layout: LayoutSpec, est: StepEstimate, *, headroom_bytes: float, origin: str,
                      reason: str | None, problem: Any = None, assumptions: bool = False) -> CandidateReport:
        predicted = Predicted.from_estimate(est, headroom_bytes, problem, layout if assumptions else None)
        return cls(layout=layout, predicted=predicted,
                   memory_breakdown=MemoryBreakdown.from_estimate(est), time_breakdown=TimeReport.from_estimate(est),
                   origin=origin, reason=reason)


class Inputs(_Strict):
    cluster: ClusterSpec
    model: ModelSpec
    training: TrainingSpec

    @classmethod
    def from_problem(cls, problem: Any) -> Inputs:
        return cls(cluster=problem.cluster, model=problem.model, training=problem.training)


class EstimateDocument(_Strict):
    """`planner estimate --json`."""

    schema_version: str
    tool_version: str
    kind: Literal["estimate"] = "estimate"
    framework: Framework = Field(Framework.GENERIC, description="The framework the layout was checked against "
                                                                "(--framework, else the framework of a plan file "
                                                                "given as --layout, else generic).")
    inputs: Inputs
    layout: LayoutSpec
    predicted: Predicted
    memory_breakdown: MemoryBreakdown
    time_breakdown: TimeReport

    @classmethod
    def from_estimate(cls, problem: Any, layout: LayoutSpec, est: StepEstimate,
                      framework: Framework = Framework.GENERIC) -> EstimateDocument:
        return cls(**_versions(), framework=framework, inputs=Inputs.from_problem(problem), layout=layout,
                   predicted=Predicted.from_estimate(est, problem.knobs.memory_headroom_bytes, problem, layout),
                   memory_breakdown=MemoryBreakdown.from_estimate(est), time_breakdown=TimeReport.from_estimate(est))


# ---- the plan --------------------------------------------------------------------------------------------


class Decision(_Strict):
    """The seed's decision-table row for the request, and whether the pick follows it."""

    row: int = Field(description="Row of the decision table (1-6 the seed's; 7 long context, 8 mixture of experts).")
    scenario: str
    recommendation: str
    agrees: bool = Field(description="Whether the pick is of the recommended kind.")
    reasons: list[str]


class SearchStats(BaseModel):
    """What the search did (filled in as it runs). The three *_seconds fields are this run's wall clock and differ
    between identical runs; every other field of a plan document is the same for the same inputs."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)

    candidates_considered: int = Field(default=0, description="Layouts enumerated (before pruning).")
    candidates_evaluated: int = Field(default=0, description="Layouts estimated in full.")
    solver_runs: int = Field(default=0, description="ILP solves (0 with --no-solver).")
    solver_seconds: float = Field(default=0.0, description="Wall clock in the solver, this run (varies run to run).")
    solver_statuses: list[str] = Field(default_factory=list, description="Each solve's status, as the solver says it.")
    search_seconds: float = Field(default=0.0, description="Wall clock of the search, this run (varies run to run).")
    total_seconds: float = Field(default=0.0, description="Wall clock of planning, this run (varies run to run).")


class Bounded(_Strict):
    """A quantity and, with an error band, its values at the band's lower and upper step time."""

    value: float | None = Field(description="the point estimate; null when it cannot be computed (no price, no power)")
    low: float | None = Field(description="at the band's lower step time; null without a band")
    high: float | None = Field(description="at the band's upper step time; null without a band")


class ErrorBand(_Strict):
    lower_factor: float = Field(description="measured / predicted step time, low end")
    upper_factor: float = Field(description="measured / predicted step time, high end")
    source: str


class TrainingRun(_Strict):
    """`plan --tokens`: time, cost and energy to train the token budget with the pick (planner/decisions/train.py)."""

    tokens: float
    tokens_per_step: int
    steps: int = Field(description="ceil(tokens / tokens_per_step)")
    step_time_seconds: float
    num_gpus: int
    wall_clock_seconds: Bounded
    wall_clock_days: Bounded
    gpu_hours: Bounded
    cost: Bounded = Field(description="gpu_hours x price_per_gpu_hour, in the price's currency")
    gpu_energy_kwh: Bounded = Field(description="GPUs x board power limit x wall clock: an upper bound for the GPUs")
    facility_energy_kwh: Bounded = Field(description="gpu_energy_kwh x pue (only with a PUE)")
    price_per_gpu_hour: float | None
    gpu_board_power_watts: float | None
    gpu_board_power_source: str
    pue: float | None
    energy_left_out: list[str] = Field(description="what the energy figure does not include")
    error_band: ErrorBand | None
    error_band_note: str


class FewerGpus(_Strict):
    nodes: int
    num_gpus: int
    tokens_per_second: float
    mfu: float
    relative_throughput: float = Field(description="this plan's tokens/s / the pick's")
    gpu_hours_change: float = Field(description="relative change of GPU-hours to train the same tokens")
    layout_text: str


class LargerBatch(_Strict):
    global_batch_size: int
    tokens_per_second: float
    mfu: float
    wasted_share: float
    layout_text: str
    relative_throughput: float


class Utilisation(_Strict):
    """Whether the pick wastes the cluster and what would help (planner/decisions/waste.py)."""

    wasted_share: float = Field(description="(bubble + exposed TP/DP/PP/CP/EP communication) / step time")
    parts: dict[str, float]
    threshold: float = Field(description="wasteful at or above this share")
    wasteful: bool
    fewer_gpus: list[FewerGpus] = Field(description="the best plan on 1/2 and 1/4 of the nodes (when wasteful)")
    min_gpus_command: str | None = Field(description="the min-gpus search for 90% of the pick's tokens/s")
    larger_batches: list[LargerBatch] = Field(description="the best plan at 2x and 4x the global batch (when wasteful)")
    scaling_command: str | None


class ScenarioOutcome(_Strict):
    perturbation: str
    verdict: Literal["kept", "tie", "changes", "not applicable", "infeasible"]
    new_pick: LayoutSpec | None
    new_pick_text: str | None
    new_step_time_seconds: float | None
    original_step_time_seconds: float | None = Field(description="the original pick under the perturbation; null "
                                                                  "when it cannot run there (see note)")
    step_time_change: float | None = Field(description="new best's step time / the pick's unperturbed - 1")
    regret: float | None = Field(description="original pick's step time / new best's - 1, under the perturbation")
    note: str


class TiedLayout(_Strict):
    layout_text: str
    step_time_seconds: float
    step_time_vs_pick: float


class SensitivityReport(_Strict):
    """`plan --sensitivity` (planner/decisions/sensitivity.py)."""

    tie_tolerance: float = Field(description="relative step-time difference below which two layouts tie: the "
                                             "ranking error band (80% of the ratio errors of pairs of layouts of "
                                             "one model on one cluster, planner/decisions/ranking.py)")
    tie_source: str
    recommend_within: float = Field(description="a simpler layout is recommended only within this relative "
                                                "step time of the pick (a layout that much slower was "
                                                "in fact faster in 40% of vTrain's pairs)")
    scenarios: list[ScenarioOutcome]
    tied: list[TiedLayout] = Field(description="the pick and the distinct layouts within the tie tolerance, in "
                                               "the plan's ranking order")
    recommended: str = Field(description="the simplest layout of the short list within recommend_within of the "
                                         "pick (the pick itself when none is simpler)")
    recommended_step_time_vs_pick: float = Field(description="the recommended layout's predicted step time "
                                                             "against the pick's, minus 1")
    short_list: list[str] = Field(description="the first (at most 5) tied layouts: what `planner bench plan.json "
                                              "--top K` measures")
    short_list_size: int = Field(description="K for `planner bench plan.json --top K`")


class PlanDocument(CandidateReport):
    """`planner plan --json`: the pick at the top level, then runners-up, the decision and the search."""

    schema_version: str
    tool_version: str
    kind: Literal["plan"] = "plan"
    framework: Framework = Field(Framework.GENERIC, description="The framework the search was restricted to "
                                                                "(--framework); `export` defaults to it.")
    objective: str = Field(description="throughput | memory | min-gpus")
    inputs: Inputs
    alternatives: list[CandidateReport]
    decision: Decision
    search: SearchStats
    compared: list[CandidateReport] = Field(description="Layouts given with --compare, estimated beside the pick.")
    training_run: TrainingRun | None = Field(default=None, description="With --tokens: time, cost and energy to "
                                                                       "train the budget with the pick.")
    utilisation: Utilisation | None = Field(default=None, description="Whether the pick wastes the cluster "
                                                                      "(objective throughput).")
    sensitivity: SensitivityReport | None = Field(default=None, description="With --sensitivity.")
    figures: list[str] | None = Field(default=None, description="Files written by --figures.")
    memory_margin: Literal["band-high", "estimate"] = Field(
        "band-high", description="The memory margin every candidate was held to: band-high (its predicted peak "
                                 "raised to the memory band's high end, plus the headroom, within the GPU) or "
                                 "estimate (the point estimate only: --memory-margin estimate, or nothing fit at "
                                 "the band's high end; then the pick may run out of memory).")
    memory_margin_fraction: float = Field(
        0.0, description="The fraction each candidate's predicted peak was raised by when judging fit (the memory "
                         "band's high end, planner/data/error_bands.json); 0 under the estimate margin.")
    memory_margin_relaxed: bool = Field(
        False, description="True when band-high was asked for (the default) but no layout fits at the band's high "
                           "end, so the plan was made at the estimate.")
    memory_margin_cost: CandidateReport | None = Field(
        None, description="What the band-high margin costs: the fastest layout that fits only at the point estimate "
                          "('tight'), where it is more than 0.5% faster than the pick (objective throughput; "
                          "--memory-margin estimate would pick it, and it may run out of memory); null otherwise.")

    @classmethod
    def from_result(cls, problem: Any, result: Any, *, objective: str, framework: Framework = Framework.GENERIC,
                    notes: list[str] | None = None, memory_margin_relaxed: bool = False,
                    margin_cost: Any = None) -> PlanDocument:
        """From a planner.search.PlanResult: its pick, alternatives, compared layouts, reasons and decision."""
        headroom = problem.knobs.memory_headroom_bytes
        fraction = float(problem.knobs.memory_high_fraction)

        def report(c: Any) -> CandidateReport:
            return CandidateReport.from_estimate(c.layout, c.estimate, headroom_bytes=headroom, origin=c.origin,
                                                 reason=result.reasons.get(id(c)), problem=problem,
                                                 assumptions=c is result.pick)

        def against_pick(c: Any) -> CandidateReport:
            from planner.explain.versus import versus

            r = report(c)
            return r.model_copy(update={"reason": versus(pick, r)})

        pick = report(result.pick)
        cost = None
        if margin_cost is not None:
            cost = CandidateReport.from_estimate(margin_cost.layout, margin_cost.estimate, headroom_bytes=headroom,
                                                 origin=margin_cost.origin, reason=None, problem=problem)
            cost = cost.model_copy(update={"reason": _margin_cost_note(pick, cost)})
        notes = [*_memory_margin_notes(pick, headroom, memory_margin_relaxed),
                 *([cost.reason] if cost is not None and cost.reason else []), *(notes or [])]
        decision = result.decision.model_copy(update={"reasons": [*result.decision.reasons, *notes]})
        return cls(**_versions(), objective=objective, framework=framework, inputs=Inputs.from_problem(problem),
                   **dict(pick), alternatives=[against_pick(c) for c in result.alternatives],
                   decision=decision, search=result.stats.model_copy(),
                   compared=[against_pick(c) for c in getattr(result, "compared", [])],
                   memory_margin="band-high" if fraction > 0 else "estimate", memory_margin_fraction=fraction,
                   memory_margin_relaxed=memory_margin_relaxed, memory_margin_cost=cost)


def _margin_cost_note(pick: CandidateReport, tight: CandidateReport) -> str:
    """The decision line that says what the memory margin costs (planner.search.margin_cost)."""
    gib, p, t = 2**30, pick.predicted, tight.predicted
    high = t.peak_memory_bytes_per_gpu_high
    return (f"memory: the margin costs {p.step_time_seconds / t.step_time_seconds - 1:.1%} of step time: "
            f"{tight.layout.short()} runs in {t.step_time_seconds:.3f} s at {t.peak_memory_bytes_per_gpu / gib:.1f} GiB "
            "predicted" + (f", {high / gib:.1f} GiB at the band's high end" if high is not None else "")
            + "; --memory-margin estimate picks it, and it may run out of memory.")


def _memory_margin_notes(pick: CandidateReport, headroom_bytes: float, relaxed: bool) -> list[str]:
    """A line when the pick fits only at the point estimate (its verdict is 'tight')."""
    p = pick.predicted
    if p.fit != "tight" or p.peak_memory_bytes_per_gpu_high is None:
        return []
    gib = 2**30
    why = ("no layout fits at the memory band's high end, so the plan was made at the estimate"
           if relaxed else "planned with --memory-margin estimate")
    remedy = "add GPUs" if relaxed else "add GPUs or keep the default --memory-margin band-high"
    return [f"memory: the pick fits only at the estimate: {p.peak_memory_bytes_per_gpu / gib:.1f} GiB predicted, "
            f"{p.peak_memory_bytes_per_gpu_high / gib:.1f} GiB at the band's high end, against "
            f"{(p.gpu_memory_bytes - headroom_bytes) / gib:.1f} GiB (GPU minus headroom); {why}. It may run out of "
            f"memory: {remedy}."]


# ---- check -----------------------------------------------------------------------------------------------


class Violation(_Strict):
    rule: str = Field(description="The rule broken (a layout field, 'memory', 'dp*tp*pp', ...).")
    message: str = Field(description="One line with the numbers: field: value -> what is allowed.")
    hint: str = Field(description="How to fix it (for memory: the remedies that fit, with their predicted memory).")


class CheckReport(_Strict):
    """`planner check --json`."""

    schema_version: str
    tool_version: str
    kind: Literal["check"] = "check"
    config: str = Field(description="The config file checked.")
    format: Literal["plan", "deepspeed", "hf-deepspeed", "torchtitan", "torchtitan-python", "megatron",
                    "megatron-deepspeed", "nemo", "nemo-launcher"] | None = Field(
        description="The format read (nemo: Megatron-Bridge overrides, KEY=VALUE lines or YAML; nemo-launcher: a "
                    "NeMo-Framework-Launcher training YAML); null when unreadable.")
    framework: Framework | None = Field(description="Whose defaults and rules were applied (--framework, else the "
                                                     "format's).")
    layout: LayoutSpec | None = Field(description="The layout the config describes (null if it could not be read).")
    passed: bool
    violations: list[Violation]
    predicted: Predicted | None = Field(description="Null when the layout cannot be estimated (e.g. it does not divide).")
    notes: list[str]
    error: str | None = Field(description="why the config could not be checked (exit 3); null otherwise")
    precision: Literal["bf16", "fp16", "fp32", "fp8"] | None = Field(
        None, description="The precision checked (null when the config could not be checked).")
    precision_source: Literal["config", "framework default", "--precision", "GPU default"] | None = Field(
        None, description="Where the precision comes from: the config; its framework's default where the config "
                          "writes none (DeepSpeed without an enabled bf16/fp16 section: fp32; a note names it); "
                          "--precision (where the config does not say, or says only a default); the GPU's default.")
    fp8_recipe: Literal["delayed", "tensorwise", "rowwise", "blockwise", "mxfp8"] | None = Field(
        None, description="With precision fp8: the FP8 scaling recipe checked (the config's, else its framework's "
                          "default); null otherwise.")

    @classmethod
    def from_check(cls, *, config: str, view: Any, layout: LayoutSpec | None, violations: list[dict[str, str]],
                   est: StepEstimate | None, headroom_bytes: float, problem: Any = None) -> CheckReport:
        return cls(**_versions(), config=config, format=view.format, layout=layout, passed=not violations,
                   violations=[Violation.model_validate(v) for v in violations],
                   predicted=Predicted.from_estimate(est, headroom_bytes, problem, layout) if est is not None else None,
                   notes=list(view.notes))


class CheckBatch(_Strict):
    """`check` with several configs: one document; exit_code 8 if the operating system would not read one, else 3 if
    any could not be checked, else 1 if any failed."""

    schema_version: str
    tool_version: str
    kind: Literal["check-batch"] = "check-batch"
    passed: bool
    exit_code: int
    reports: list[CheckReport]


# ---- bench -----------------------------------------------------------------------------------------------


class BenchRow(_Strict):
    quantity: str = Field(description="What was measured, with its unit.")
    predicted: float
    measured: float
    error: float | None = Field(description="predicted / measured - 1 (null when measured is 0).")


class BenchComparison(_Strict):
    rows: list[BenchRow]
    notes: list[str]
    median_abs_error: float | None
    predicted_step_seconds: float
    measured_step_seconds: float


class BenchReport(_Strict):
    """`planner bench --json`: predicted against measured."""

    schema_version: str
    tool_version: str
    kind: Literal["bench"] = "bench"
    layout: LayoutSpec
    model: ModelSpec = Field(description="The model as run (scaled down where asked).")
    cluster: ClusterSpec = Field(description="The cluster the prediction is for.")
    seq_length: int
    steps: int
    warmup: int
    dtype: str = Field(description="Compute dtype of the run (float32 or bfloat16).")
    optimizer: str = Field(description="adamw: fp32 master weights and fp32 moments (the training recipe); "
                                       "sgd: momentum, for numerics checks.")
    exp_avg_dtype: str = Field("float32", description="AdamW's first moment as run (torch dtype name; "
                                                      "--optimizer-states).")
    exp_avg_sq_dtype: str = Field("float32", description="AdamW's second moment as run.")
    world_size: int
    device: str
    device_name: str | None = Field(description="The GPU's name (CUDA), null on CPU.")
    torch_version: str | None
    allocator_config: str | None = Field(description="PYTORCH_CUDA_ALLOC_CONF during the run ('' when unset; "
                                                     "null on CPU).")
    framework: str = Field("generic", description="Whose recompute semantics the run and its prediction follow "
                                                  "(--framework, else the plan's framework, else generic).")
    selective: str = Field(CORE_ATTENTION, description="What recompute 'selective' runs as: core_attention "
                                                         "(Megatron's attention-core recompute) or per_op "
                                                         "(torchtitan's per-op selective activation checkpointing).")
    comparison: BenchComparison
    ranks: list[dict[str, Any]] = Field(description="Each rank's raw measurements.")

    @classmethod
    def from_run(cls, *, problem: Any, layout: LayoutSpec, cfg: Any, comparison: dict[str, Any],
                 ranks: list[dict[str, Any]], framework: str = "generic") -> BenchReport:
        return cls(**_versions(), layout=layout, model=problem.model, cluster=problem.cluster,
                   seq_length=cfg.seq_length, steps=cfg.steps, warmup=cfg.warmup, dtype=cfg.dtype,
                   optimizer=cfg.optimizer, exp_avg_dtype=cfg.exp_avg_dtype, exp_avg_sq_dtype=cfg.exp_avg_sq_dtype,
                   world_size=len(ranks), device=ranks[0]["device"],
                   device_name=ranks[0].get("device_name"), torch_version=ranks[0].get("torch_version"),
                   allocator_config=ranks[0].get("allocator_config"), framework=framework, selective=cfg.selective,
                   comparison=BenchComparison.model_validate(comparison), ranks=ranks)


# ---- decisions: compare and scaling (planner/decisions/) --------------------------------------------------


class ComparedCluster(_Strict):
    cluster: str
    nodes: int
    label: str = Field(description="CLUSTER:NODES as given")
    num_gpus: int
    gpu: str
    price_per_gpu_hour: float | None
    feasible: bool
    infeasible_reason: str | None
    pick: CandidateReport | None
    training_run: TrainingRun | None
    per_million_tokens: dict[str, float | None] = Field(description="gpu_hours, cost and gpu_energy_kwh per 1e6 tokens")
    memory_margin_relaxed: bool = Field(description="nothing fitted under memory_margin, so the pick was chosen at "
                                                    "the point estimate (its fit is 'tight': it may run out of memory)")


class CompareDocument(_Strict):
    """`planner compare --json`: one model and batch planned on several clusters (planner/decisions/compare.py)."""

    schema_version: str
    tool_version: str
    kind: Literal["compare"] = "compare"
    inputs: dict[str, ModelSpec | TrainingSpec]
    framework: str | None = Field(description="--framework: only layouts it runs were planned (null: any)")
    memory_margin: str = Field(description="--memory-margin: the fit rule each cluster was planned under, as in "
                                           "`plan` (band-high or estimate)")
    tokens: float = Field(description="the token budget (1e12 when --tokens is not given)")
    tokens_given: bool
    priced: bool = Field(description="every feasible cluster has a price: cost ranking, else GPU-hours")
    clusters: list[ComparedCluster]
    rankings: dict[str, list[str]] = Field(description="time_to_train, cost_per_million_tokens, "
                                                       "tokens_per_second_per_gpu: labels, best first")


class ScalingPoint(_Strict):
    nodes: int
    num_gpus: int
    global_batch_size: int
    feasible: bool
    infeasible_reason: str | None
    layout: LayoutSpec | None
    step_time_seconds: float | None
    tokens_per_second: float | None
    tokens_per_second_per_gpu: float | None
    mfu: float | None
    pipeline_bubble_share: float | None
    scaling_efficiency: float | None = Field(description="tokens/s per GPU / that of base_nodes")
    time_to_train_days: float | None
    memory_margin_relaxed: bool = Field(description="nothing fitted under memory_margin at this point, so its pick "
                                                    "was chosen at the point estimate (it may run out of memory)")


class ScalingCurve(_Strict):
    global_batch_size: int
    base_nodes: int | None = Field(description="the smallest node count of the sweep that fits")
    stops_paying_at_nodes: int | None = Field(description="the first node count below stop_efficiency")
    points: list[ScalingPoint]


class ScalingDocument(_Strict):
    """`planner scaling --json` (planner/decisions/scaling.py)."""

    schema_version: str
    tool_version: str
    kind: Literal["scaling"] = "scaling"
    inputs: dict[str, ClusterSpec | ModelSpec | TrainingSpec | int] = Field(
        description="cluster, model, seq_length, and training (precision, fp8_recipe; its batch is the first curve's)")
    framework: str | None = Field(description="--framework: only layouts it runs were planned (null: any)")
    memory_margin: str = Field(description="--memory-margin: the fit rule each point was planned under, as in "
                                           "`plan` (band-high or estimate)")
    tokens: float
    tokens_given: bool
    stop_efficiency: float
    efficiency_definition: str
    curves: list[ScalingCurve]


# ---- catalog, version, calibration, validation -------------------------------------------------------------


class ClusterListEntry(_Strict):
    name: str = Field(description="The preset's name, as -c takes it.")
    description: str = Field(description="What the preset is.")
    gpu: str = Field(description="Its GPU, a name `clusters show` resolves in the GPU catalog.")
    gpus_per_node: int = Field(description="GPUs per node.")


class ClusterList(RootModel[list[ClusterListEntry]]):
    """`planner clusters list --json`: the presets, one object each (an array, without versions)."""


class ClusterDerived(_Strict):
    num_gpus: int = Field(description="num_nodes x gpus_per_node.")
    gpu_memory_bytes: float = Field(description="One GPU's memory, bytes.")
    intra_node_bytes_per_second: float | None = Field(
        description="Achieved bandwidth inside a node (gb_per_s x efficiency), bytes/s; null without a link.")
    node_network_bytes_per_second: float | None = Field(
        description="Achieved bandwidth of a node's NICs together, bytes/s; null for one node without a network.")


class ClusterDocument(_Strict):
    """`planner clusters show NAME --json`: the cluster spec as the cost models read it, its GPU, and derived SI
    values."""

    schema_version: str
    tool_version: str
    kind: Literal["cluster"] = "cluster"
    cluster: ClusterSpec = Field(description="The cluster spec (the file format -c takes, human units).")
    gpu: GPUSpec = Field(description="Its GPU from the catalog (cluster_specs/gpus.yaml).")
    derived: ClusterDerived

    @classmethod
    def from_spec(cls, spec: ClusterSpec) -> ClusterDocument:
        gpu, hw = spec.gpu_spec(), spec.to_cost_model()
        derived = ClusterDerived(
            num_gpus=spec.num_gpus, gpu_memory_bytes=gpu.memory_bytes,
            intra_node_bytes_per_second=hw.intra_node.bandwidth_bytes_per_second if hw.intra_node else None,
            node_network_bytes_per_second=hw.nic.bandwidth_bytes_per_second * hw.nics_per_node if hw.nic else None)
        return cls(**_versions(), cluster=spec, gpu=gpu, derived=derived)


class ModelListEntry(_Strict):
    name: str = Field(description="The preset's name, as -m takes it.")
    parameters: int = Field(description="Total parameters (all experts).")
    source: str = Field(description="Where the shape comes from.")


class ModelList(RootModel[list[ModelListEntry]]):
    """`planner models list --json`: the presets, one object each (an array, without versions)."""


class ParameterCountsReport(_Strict):
    embedding: int = Field(description="Word embeddings (unpadded vocabulary).")
    position_embedding: int = Field(description="Learned position embeddings (0 for rotary/ALiBi).")
    per_layer: int = Field(description="One layer (an MoE layer with all its experts).")
    per_layer_norms: int = Field(description="The part of per_layer that TP replicates (norm weights).")
    layers: int = Field(description="All layers together (dense and MoE).")
    final_norm: int = Field(description="The final norm.")
    output_layer: int = Field(description="The output projection (0 when tied to the embedding).")
    total: int = Field(description="Every parameter.")
    active: int = Field(description="Parameters one token uses (MoE: k of E routed experts); total when dense.")
    per_dense_layer: int = Field(description="A dense layer of an MoE model; per_layer when dense.")
    per_layer_routed_experts: int = Field(description="The routed-expert part of per_layer (sharded by EP).")


class ModelDocument(_Strict):
    """`planner models show NAME --json`: the model spec (the YAML format -m takes) and its parameter counts."""

    schema_version: str
    tool_version: str
    kind: Literal["model"] = "model"
    model: ModelSpec
    parameters: ParameterCountsReport

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> ModelDocument:
        return cls(**_versions(), model=spec, parameters=ParameterCountsReport(**spec.parameter_counts()))


class VersionDocument(_Strict):
    """`planner --version --json`."""

    tool_version: str
    schema_version: str = Field(description="The version of every JSON document's contract (planner/contract.py).")

    @classmethod
    def current(cls) -> VersionDocument:
        return cls(**_versions())


class ErrorStats(_Strict):
    rows: int = Field(description="Rows in the group.")
    median_abs_error: float | None = Field(description="Median |predicted - measured| / measured (leave one source "
                                                       "out); null for no rows.")
    p90_abs_error: float | None = Field(description="90th percentile of the same; null for no rows.")


class BandInside(_Strict):
    rows: int = Field(description="vTrain rows whose measured step lies inside the shipped step-time band.")
    of: int = Field(description="vTrain rows compared.")
    median_width: float = Field(description="Median width of those bands, as a fraction of the prediction.")


class VTrainSummary(_Strict):
    rows: int = Field(description="vTrain's measured runs predicted (planner/data/vtrain_ground_truth_multi.csv).")
    mean_abs_error: float = Field(description="Mean |predicted - measured| / measured.")
    bias: float = Field(description="Mean signed error; negative: predicted too fast.")
    regret: dict[str, float] = Field(description="Per model: measured time of the layout predicted fastest over the "
                                                 "best measured time, minus 1.")
    false_out_of_memory: int = Field(description="Measured runs predicted not to fit.")
    pairs_ordered_as_measured: float = Field(description="Share of one model's layout pairs the predictions order as "
                                                          "measured.")
    inside_band: BandInside


class ValidationSummary(_Strict):
    """`planner validate --json`: the figures `make validate` reports (docs/validation.md has the tables). Errors
    are fractions (0.05 = 5%)."""

    schema_version: str
    tool_version: str
    kind: Literal["validation"] = "validation"
    rows_evaluated: int = Field(description="Published rows predicted.")
    rows_skipped: int = Field(description="Rows the models cannot represent (docs/validation.md says why).")
    loso_median_abs_error: float | None = Field(description="Median |error|, each source predicted with knobs "
                                                            "fitted without it (leave one source out).")
    loso_p90_abs_error: float | None = Field(description="90th percentile of the same.")
    fitted_on_all_median_abs_error: float | None = Field(description="Median |error| with knobs fitted on all rows "
                                                                     "(in-sample, for comparison).")
    fitted_on_all_p90_abs_error: float | None = Field(description="90th percentile of the same.")
    false_out_of_memory: int = Field(description="Rows that ran but are predicted not to fit.")
    fitted_knobs: dict[str, float] = Field(description="The knob values fitted on all rows (shipped).")
    by_family: dict[str, ErrorStats] = Field(description="Per framework family.")
    by_gpu_generation: dict[str, ErrorStats] = Field(description="Per GPU generation.")
    by_source: dict[str, ErrorStats] = Field(description="Per published source.")
    memory_rows: int = Field(description="Rows with a printed peak memory.")
    memory_median_abs_error: float | None = Field(description="Median |error| of predicted against printed memory.")
    memory_worst_under_prediction: float | None = Field(description="The most negative memory error (under-"
                                                                    "prediction).")
    memory_median_abs_error_if_printed_gb_is_1e9_bytes: float | None = Field(
        description="The memory median if a printed GB were 10^9 bytes rather than GiB.")
    vtrain: VTrainSummary


# ---- errors ----------------------------------------------------------------------------------------------


class ErrorDocument(_Strict):
    """With --json, a command that fails prints this on stdout (and the human lines on stderr)."""

    schema_version: str
    tool_version: str
    kind: Literal["error"] = "error"
    exit_code: int = Field(description="The process exit code (planner.errors.EXIT_CODES).")
    error: str = Field(description="The exit code's name: usage, invalid_input, infeasible, solver_failed, "
                                   "missing_dependency, benchmark_failed, io_error, internal_error.")
    message: str = Field(description="The first problem, one line.")
    problems: list[str] = Field(description="Every problem, one line each (field: value -> what is allowed).")
    source: str | None = Field(description="The file or option the problems are about, when known.")

    @classmethod
    def from_failure(cls, exit_code: int, problems: list[str], source: str | None = None) -> ErrorDocument:
        from planner.errors import EXIT_CODES, ExitCode

        name = EXIT_CODES[ExitCode(exit_code)][0] if exit_code in set(ExitCode) else "error"
        return cls(**_versions(), exit_code=exit_code, error=name, message=problems[0] if problems else name,
                   problems=problems, source=source)


SCHEMAS: dict[str, type[BaseModel]] = {"plan": PlanDocument, "estimate": EstimateDocument, "check": CheckReport,
                                       "bench": BenchReport, "check-batch": CheckBatch, "compare": CompareDocument,
                                       "scaling": ScalingDocument, "error": ErrorDocument, "clusters": ClusterList,
                                       "cluster": ClusterDocument, "calibration": ClusterSpec, "models": ModelList,
                                       "model": ModelDocument, "validation": ValidationSummary,
                                       "version": VersionDocument}


def json_schema(which: str) -> dict[str, Any]:
    """The JSON Schema of a document kind; a SpecError (exit 3) naming the kinds for any other name."""
    if which not in SCHEMAS:
        from cluster_specs import SpecError

        raise SpecError(f"schema: {which!r} -> allowed: {', '.join(SCHEMAS)}")
    return SCHEMAS[which].model_json_schema(mode="serialization")
