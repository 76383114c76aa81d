"""The JSON contract with launch scripts: the plan document and the check report, as pydantic models.

`planner schema` prints their JSON Schema; tests/test_schema.py holds it against docs/schema/*.json (so any
change is deliberate; a change that breaks consumers bumps planner.SCHEMA_VERSION) and validates real outputs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cluster_specs.schema import ClusterSpec
from planner.inputs.specs import LayoutSpec, ModelSpec, TrainingSpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Predicted(_Strict):
    step_time_seconds: float
    tokens_per_second: float
    tokens_per_second_per_gpu: float
    mfu: float
    hfu: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    peak_memory_bytes_per_gpu: float
    peak_memory_stage: int
    gpu_memory_bytes: float
    memory_headroom_bytes: float
    host_memory_bytes_per_node: float
    fits: bool


class _MemoryParts(_Strict):
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    transient_bytes: float
    overhead_bytes: float
    total_bytes: float


class StageMemory(_MemoryParts):
    stage: int
    layers: int
    parameters: float
    in_flight_micro_batches: float


class MemoryBreakdown(_MemoryParts):
    """The peak stage's parts, and every stage."""

    peak_stage: int
    stages: list[StageMemory]


class TimeBreakdown(_Strict):
    compute_seconds: float
    recompute_seconds: float
    tp_comm_exposed_seconds: float
    pipeline_bubble_seconds: float
    pp_p2p_exposed_seconds: float
    dp_comm_exposed_seconds: float
    optimizer_seconds: float
    offload_seconds: float
    dp_comm_total_seconds: float
    tp_comm_total_seconds: float
    total_seconds: float
    matmul_efficiency: float


class Candidate(_Strict):
    layout: LayoutSpec
    predicted: Predicted
    memory_breakdown: MemoryBreakdown
    time_breakdown: TimeBreakdown
    origin: str
    reason: str | None


class Decision(_Strict):
    row: int
    scenario: str
    recommendation: str
    agrees: bool
    reasons: list[str]


class Search(_Strict):
    candidates_considered: int
    candidates_evaluated: int
    solver_runs: int
    solver_seconds: float
    solver_statuses: list[str]
    search_seconds: float
    total_seconds: float


class Inputs(_Strict):
    cluster: ClusterSpec
    model: ModelSpec
    training: TrainingSpec


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


FRAMEWORKS = Literal["megatron", "nemo", "torchtitan", "deepspeed", "megatron-deepspeed", "generic"]


class PlanDocument(Candidate):
    schema_version: str
    tool_version: str
    kind: Literal["plan"]
    framework: FRAMEWORKS = Field("generic", description="the framework the search was restricted to (--framework); "
                                                         "`export` defaults to it")
    objective: str
    inputs: Inputs
    alternatives: list[Candidate]
    decision: Decision
    search: Search
    compared: list[Candidate]
    training_run: TrainingRun | None = None


class Violation(_Strict):
    rule: str
    message: str
    hint: str


class CheckReport(_Strict):
    schema_version: str
    tool_version: str
    kind: Literal["check"]
    config: str
    format: Literal["plan", "deepspeed", "torchtitan", "megatron"]
    layout: LayoutSpec | None
    passed: bool
    violations: list[Violation]
    predicted: Predicted | None
    notes: list[str]


SCHEMAS = {"plan": PlanDocument, "check": CheckReport}


def json_schema(which: str) -> dict:
    return SCHEMAS[which].model_json_schema()
