"""Cluster and GPU specs (pydantic v2, frozen, unknown fields rejected).

Files use human units (GiB, GB/s, Gb/s, microseconds); the `*_bytes`, `*_per_second` and `*_seconds`
properties give SI values, and `ClusterSpec.to_cost_model()` converts everything once.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from cluster_specs import limits as lim
from cluster_specs.base import FrozenSpec
from cost_models.inputs import Hardware, Link

GIB = 2**30
DTYPES = ("bf16", "fp16", "fp32", "fp8")


class GPUSpec(FrozenSpec):
    name: str = ""
    memory_gib: float = Field(gt=0, le=lim.MAX_GPU_MEMORY_GIB)
    tflops: dict[Literal["bf16", "fp16", "fp32", "fp8"], float] = Field(min_length=1)
    hbm_gb_per_s: float = Field(gt=0, le=lim.MAX_BANDWIDTH_GB_S)
    nvlink_gb_per_s: float | None = Field(default=None, gt=0)
    matmul_efficiency: float = Field(default=0.8, gt=0, le=1)
    board_power_watts: float | None = Field(default=None, gt=0, description="board power limit (max TDP/TGP)")
    board_power_source: str = ""
    source: str = ""

    @model_validator(mode="after")
    def _positive_peaks(self):
        bad = [f"tflops.{k}: {v} -> must be > 0 and <= {lim.MAX_TFLOPS:g} ({lim.REASONS['tflops']})"
               for k, v in self.tflops.items() if not 0 < v <= lim.MAX_TFLOPS]
        if bad:
            raise ValueError("; ".join(bad))
        return self

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    def default_precision(self) -> str:
        """bf16 where the GPU has a bf16 tensor peak; else fp16 (V100, T4), else fp32."""
        return next((d for d in ("bf16", "fp16", "fp32") if d in self.tflops), "fp32")

    def peak_flops_per_second(self, dtype: str) -> float:
        if dtype not in self.tflops:
            known = ", ".join(sorted(self.tflops))
            from cluster_specs.errors import SpecError

            raise SpecError(f"precision: {dtype} -> {self.name or 'this GPU'} has no {dtype} tensor peak "
                            f"(it has: {known}); use --precision {sorted(self.tflops)[0]}")
        return self.tflops[dtype] * 1e12


class IntraNodeLink(FrozenSpec):
    kind: Literal["nvlink", "pcie", "none"]
    gb_per_s: float = Field(ge=0, le=lim.MAX_BANDWIDTH_GB_S, description="per GPU, one direction, line rate")
    efficiency: float = Field(default=0.8, gt=0, le=1)
    latency_us: float = Field(default=5.0, ge=0)

    @model_validator(mode="after")
    def _a_link_moves_data(self):
        if self.kind != "none" and self.gb_per_s == 0:  # a 0 GB/s link would make every collective on it free
            raise ValueError(f"gb_per_s: 0 -> must be > 0 for a {self.kind} link (kind none: GPUs without one)")
        return self

    def link(self) -> Link | None:
        if self.kind == "none" or self.gb_per_s == 0:
            return None
        return Link(self.gb_per_s * 1e9 * self.efficiency, self.latency_us * 1e-6)


class InterNodeNetwork(FrozenSpec):
    kind: Literal["infiniband", "ethernet", "roce", "none"]
    nics_per_node: int = Field(ge=0)
    nic_gbit_per_s: float = Field(ge=0, description="per NIC, one direction, line rate, Gb/s")
    efficiency: float = Field(default=0.9, gt=0, le=1)
    latency_us: float = Field(default=10.0, ge=0)

    def nic_link(self) -> Link | None:
        if self.kind == "none" or self.nics_per_node == 0 or self.nic_gbit_per_s == 0:
            return None
        return Link(self.nic_gbit_per_s / 8 * 1e9 * self.efficiency, self.latency_us * 1e-6)


class HostLink(FrozenSpec):
    gb_per_s: float = Field(gt=0)
    efficiency: float = Field(default=0.8, gt=0, le=1)
    latency_us: float = Field(default=10.0, ge=0)


# The cost-model knobs a calibration file may set (planner/calibration.py applies these and no others), each with the
# range its meaning allows (cost_models/inputs.py Knobs): (low, whether low itself is allowed, high, the words). A
# share of a rate or of traffic hidden is at most 1 and an efficiency above 0; sizes, byte counts, seconds and
# traffic factors are never negative.
CALIBRATION_KNOB_RANGES: dict[str, tuple[float, bool, float, str]] = {
    "end_to_end_efficiency": (0.0, False, 1.0, "a number > 0 and <= 1"),
    # upper bounds far above any meaning (a GEMM of 1e6 GFLOP, a dimension of 1e6, 1,000 passes over a tensor, a
    # PiB outside the allocator, 1,000x NCCL's buffers), where the cost models would overflow to inf or nan
    "matmul_half_efficiency_gflop": (0.0, True, 1e6, "a number from 0 to 1e6"),
    "gemm_half_efficiency_dim": (0.0, True, 1e6, "a number from 0 to 1e6"),
    "elementwise_traffic_factor": (0.0, True, 1e3, "a number from 0 to 1000"),
    "per_process_overhead_bytes": (0.0, True, 2.0**50, "a number of bytes from 0 to 2**50"),
    "nccl_bytes_scale": (0.0, True, 1e3, "a number from 0 to 1000"),
    "dp_overlap_fraction": (0.0, True, 1.0, "a number from 0 to 1"),
    "pp_overlap_fraction": (0.0, True, 1.0, "a number from 0 to 1"),
    "tp_overlap_fraction": (0.0, True, 1.0, "a number from 0 to 1"),
    "tp_layer_overhead_seconds": (0.0, True, 1e3, "a number of seconds from 0 to 1000"),
}


def calibration_knob_problem(name: str, value: float) -> str | None:
    """What is wrong with one calibration knob's value (None: nothing, or a knob this table does not hold, which
    planner/calibration.py ignores)."""
    if name not in CALIBRATION_KNOB_RANGES:
        return None
    low, low_allowed, high, allowed = CALIBRATION_KNOB_RANGES[name]
    above_low = value >= low if low_allowed else value > low
    return None if above_low and value <= high else f"knobs.{name}: {value} -> {allowed}"


class Measured(FrozenSpec):
    """What `planner calibrate` measured on a machine: the knobs it fitted and the raw figures, for the record."""

    measured_at: str = ""
    knobs: dict[str, float] = Field(default_factory=dict)
    gemm: list[dict] = Field(default_factory=list)
    collectives: list[dict] = Field(default_factory=list)
    summary: dict = Field(default_factory=dict, description="the measured headline figures: fitted and best GEMM "
                          "rate, smallest-shape rate, fit errors, memory copy and host-to-device bandwidth")
    noise: dict = Field(default_factory=dict, description="spread of the repeats (max/min - 1) and the machine's "
                        "load average while measuring")
    notes: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _knobs_in_range(self):
        bad = [p for k, v in self.knobs.items() if (p := calibration_knob_problem(k, v))]
        if bad:
            raise ValueError("; ".join(bad))
        return self


class ClusterSpec(FrozenSpec):
    name: str = "custom"
    description: str = ""
    gpu: str | GPUSpec
    num_nodes: int = Field(ge=1, le=lim.MAX_GPUS)
    gpus_per_node: int = Field(ge=1, le=lim.MAX_GPUS_PER_NODE)
    intra_node: IntraNodeLink
    inter_node: InterNodeNetwork
    host_to_device: HostLink
    host_memory_gib: float = Field(default=512, gt=0)
    measured: Measured | None = None  # present in files written by `planner calibrate`

    @model_validator(mode="after")
    def _consistent(self):
        problems = []
        if self.num_nodes * self.gpus_per_node > lim.MAX_GPUS:
            problems.append(f"num_nodes x gpus_per_node: {self.num_nodes} x {self.gpus_per_node} -> "
                            f"{lim.reason_for('num_gpus')}")
        if self.gpus_per_node > 1 and self.intra_node.kind == "none":
            problems.append(f"intra_node.kind: 'none' -> a node of {self.gpus_per_node} GPUs needs nvlink or pcie")
        if self.num_nodes > 1 and self.inter_node.nic_link() is None:
            problems.append(f"inter_node: {self.num_nodes} nodes need a network (nics_per_node >= 1, nic_gbit_per_s > 0)")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def gpu_spec(self) -> GPUSpec:
        if isinstance(self.gpu, GPUSpec):
            return self.gpu
        from cluster_specs import load_gpu

        return load_gpu(self.gpu)

    def with_nodes(self, num_nodes: int) -> ClusterSpec:
        """The same cluster scaled to `num_nodes` nodes (validated again: one node needs no network)."""
        data = self.model_dump()
        data["gpu"] = self.gpu if isinstance(self.gpu, str) else self.gpu.model_dump()
        data["num_nodes"] = num_nodes
        return ClusterSpec.model_validate(data)

    def to_cost_model(self, dtype: str = "bf16") -> Hardware:
        gpu = self.gpu_spec()
        return Hardware(
            gpu_name=gpu.name or str(self.gpu),
            gpu_memory_bytes=gpu.memory_bytes,
            peak_flops_per_second=gpu.peak_flops_per_second(dtype),
            matmul_efficiency=gpu.matmul_efficiency,
            hbm_bytes_per_second=gpu.hbm_gb_per_s * 1e9,
            num_nodes=self.num_nodes,
            gpus_per_node=self.gpus_per_node,
            intra_node=self.intra_node.link() if self.gpus_per_node > 1 else None,
            intra_node_kind=self.intra_node.kind if self.gpus_per_node > 1 else "none",
            nic=self.inter_node.nic_link(),
            nics_per_node=self.inter_node.nics_per_node,
            host_to_device=Link(
                self.host_to_device.gb_per_s * 1e9 * self.host_to_device.efficiency,
                self.host_to_device.latency_us * 1e-6,
            ),
            host_memory_bytes_per_node=self.host_memory_gib * GIB,
        )
