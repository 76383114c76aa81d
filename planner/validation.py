"""`planner validate`: hold the cost models (and the planner) against published training runs.

Each throughput row of ../shared/validation/published_runs.json becomes a case (model, training, cluster,
layout as published) or a stated skip. Measured step time comes from the row's iteration time, or from its
tokens/s (B s / rate), or from its TFLOP/s converted back with the FLOP formula the source used (Narayanan
Eq. 3 with recompute, or the model-FLOP formula of Megatron-Core and Korthikanti Eq. 7). Fields a source did
not print are filled as stated in `ASSUMPTIONS`; unknown micro-batch sizes and recompute policies take the
fastest choice the model finds that fits (what the team would have tuned to) among those the row's software had
and its FLOP convention allows (`recompute_choices`), and the report says so.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from cluster_specs import ClusterSpec, SpecError, load_cluster, load_gpu
from cost_models import compute
from cost_models.inputs import Knobs, Zero3Gather
from cost_models.memory import FUSED_CROSS_ENTROPY_BYTES_PER_LOGIT
from cost_models.stage import stage_split
from planner.bands import (
    BAND_COVERAGE,
    BAND_LEVELS,
    BANDS_FILE,
    DOES_NOT_FIT,
    MIN_SOURCES,
    band_from_table,
    build_table,
    cluster_generation,
    estimate_verdict,
    fit_verdict_of_result,
    regime_keys,
    scale_bucket,
)
from planner.frameworks import Framework
from planner.frameworks.capabilities import capabilities, fp8_gathers_params
from planner.frameworks.megatron_split import account_for_splits
from planner.frameworks.profiles import (
    AMPERE_REFERENCE_GPU,
    COMPILED_ELEMENTWISE_SHARE,
    DEEPSPEED_BF16_BRANCH_RECIPE,
    FLASH_ATTENTION_2_HOPPER,
    MemoryRecipe,
    ampere_kernel_convention_rate,
    profile_for,
)
from planner.inputs.specs import GATED_MLPS, LayoutSpec, ModelSpec, TrainingSpec
from planner.problem import Problem
from planner.rules import layout_violations

GIB = 2**30

ASSUMPTIONS = [
    "GPU memory: 'A100' without '40GB' is the 80 GB part (Selene and Jean Zay nodes are A100 80GB); "
    "a row that states its GPU memory (gpu_memory_gb, or a size in its GPU text: 'H100 SXM 95GB') more than "
    "10% away from its preset's runs on the stated size, read as 10^9 bytes. An 'H100 ... HBM2e' row (torchtitan's "
    "Grand Teton, 'lower TDP', 500 W) runs on that part, whose peak torchtitan puts 'between SXM and NVL' "
    "(cluster_specs/gpus.yaml H100-SXM-HBM2e-500W: the midpoint, 912 TFLOP/s BF16 [U]).",
    "Network when not printed: DGX A100 8 x HDR 200 Gb/s, DGX H100 8 x NDR 400 Gb/s, DGX-2 8 x EDR 100 Gb/s, "
    "Jean Zay 4 x Omni-Path 100 Gb/s [U].",
    "Model family: Llama rows (KV heads or 'Llama' in the name) are SwiGLU/RMSNorm/untied/no-bias; Nemotron-4 and "
    "Minitron rows (by name, not Llama-Nemotron) squared-ReLU (2 matrices)/LayerNorm/untied/no-bias; MPT rows "
    "GeLU/LayerNorm/tied/no-bias with ALiBi; others GPT (GeLU, LayerNorm, tied, biases, learned positions). Where "
    "this rule's parameter count misses the printed params_b by more than 20% and the other MLP gating's is within "
    "5%, the row ran the other gating (Nemotron-4: GQA with a non-gated squared-ReLU MLP; "
    "mlp_gating_by_printed_size).",
    "Attention: flash for torchtitan, llm-foundry, Megatron-Core and NeMo rows; standard (unfused softmax) for "
    "Megatron 2020-2022, Megatron-DeepSpeed and DeepSpeed rows. Dropout on for Megatron-era GPT rows. On Hopper "
    "Megatron-Core and NeMo rows run cuDNN's fused attention through Transformer Engine (profiles.py "
    "TE_FUSED_ATTENTION_HOPPER); torchtitan's of 2025 FlashAttention-2 (torch SDPA's order, then torchtitan's, put "
    "it first on sm90; profiles.py FLASH_ATTENTION_2_HOPPER), of 2024 the GEMM-rate convention (torch 2.4 took "
    "FlashAttention-2, 2.5.0 cuDNN; the rows print no torch), later ones cuDNN as torchtitan now asks "
    "(validation.py TORCHTITAN_FLASH_ATTENTION_2_YEAR). llm-foundry's rows ran its own Triton flash attention: "
    "attn_impl 'triton', the default of scripts/train/benchmarking/submit_benchmarks.py when its H100 tables were "
    "added (b2a43a14, 2023-10-19), whose sweep.sh passes no --attn_impl; pre-MLIR Triton (setup.py: "
    "triton-pre-mlir, branch triton_pre_mlir_sm90). On A100 they keep the full-s^2 GEMM-rate convention. On H100 "
    "that Triton is an Ampere kernel: its code generator, frozen when Triton moved to MLIR, emits Ampere's mma.sync "
    "(Hopper's wgmma and TMA came only to the MLIR backend), and the sm90 branch only let it run there "
    "('enables it to run on SM90 GPUs', llm-foundry#251, 2023-05). It runs at the share of the convention "
    "FlashAttention-2, an Ampere kernel too, keeps from A100 to H100: (0.315 / 0.615) x (A100 MAMF / H100 MAMF) = "
    "0.55 (profiles.py ampere_kernel_convention_rate; FlashAttention-2 and -3 papers) [U: the 2024-01 large-scale "
    "H100 sweep, s = 2048, passes 'flash' for some models, flash-attn 2, itself an Ampere kernel].",
    "ZeRO: the printed stage; FSDP FULL_SHARD = 3, SHARD_GRAD_OP = 2; unprinted = 0 (plain DP), except "
    "NeMo/Megatron-Core rows (distributed optimizer = 1).",
    "Framework profile (planner/frameworks/profiles.py, the same one `estimate --framework` uses): Megatron-Core "
    "and NeMo rows -> megatron/nemo; torchtitan and llm-foundry (FSDP) -> torchtitan; DeepSpeed -> deepspeed; "
    "Megatron-DeepSpeed -> megatron-deepspeed; llm-foundry rows keep their fused cross-entropy's 4 B per logit "
    "(loss_fn 'fused_crossentropy', flash_attn.losses.cross_entropy, its default), not torchtitan's torch loss "
    "(12), and their amp_fp8 runs Transformer Engine's FP8 Linears (FP8-saved inputs, cached FP8 weights), not "
    "torchao's. FP8 rows all-gather their parameters in FP8 where the stack does: torchtitan's (torchao tensorwise, "
    "enable_fsdp_float8_all_gather, as a torchtitan FP8 plan is exported and as its llama3_405b.toml sets it at the "
    "rows' commit 3faaa1a0) and NeMo/Megatron-Core's (fp8_param_gather, frameworks.md §4.6); llm-foundry's TE Linears "
    "under FSDP gather in BF16. torchtitan's rows of 2025 and before copy K and V to every query head before SDPA "
    "(its repeat_kv, until #2259 of 2026-01; TORCHTITAN_REPEAT_KV_LAST_YEAR); llm-foundry's and the JAX trainers' "
    "rows run their own attention code. torchtitan's "
    "2024-04 A100 rows ran norm_type 'fused_rmsnorm' (its Triton RMSNorm, which saves its input; train_configs at "
    "1ea476e9) and its 2024-08 405B rows 'rmsnorm' with compile = true (llama3_405b.toml at 9515a140), which fuses "
    "it: none carries the eager RMSNorm's fp32 upcast (Knobs.norm_fp32_upcast). torchtitan 'selective (op)' rows "
    "run the torchtitan profile's selective, per-op SAC (cost_models/op_sac.py); "
    "'selective (layer)' rows its layer SAC of the time (selective_ac_option '2', the default: every 2nd block fully "
    "recomputed). A row whose framework names a JAX trainer (MaxText, Pax, Levanter) or torch.compile ran a "
    f"compiled step: its elementwise kernels move {COMPILED_ELEMENTWISE_SHARE.value:.0%} of the eager bytes "
    "(profiles.py COMPILED_ELEMENTWISE_SHARE, "
    "sized on torchtitan's published eager/compiled pairs; validation.COMPILED_STEP_NAMES); other rows run eager, "
    "torch's default. Megatron-LM rows of 2020-2022 use the megatron profile without the "
    "overlap flags, which did not exist yet (gradient all-reduce after backward, Korthikanti et al. 2022 §6.3). "
    "DeepSpeed ZeRO-3 rows dated 2021 or earlier hide none of their ZeRO-3 traffic: DeepSpeed's ZeRO-3 of "
    "2021 (v0.3.13-v0.5.4) synchronised the device before every per-parameter gather (DeepSpeed PR #1188: 'the "
    "async version is not async at all'), and gathered each parameter tensor on its own (partition_parameters.py "
    "_allgather_param), those of under 1e5 elements excepted (stage3_param_persistence_threshold: gathered once, "
    "kept; a GPT layer's biases and LayerNorms at these widths), so 4 weights a layer; it reduce-scattered every "
    "tensor on its own (_reduce_scatter_gradients: 12 a GPT layer), each paying the ring's latency "
    "(Zero3Gather.PARAMETER, step.zero3_units_per_layer). Under full "
    "recompute DeepSpeed (then and now) gathers a module again for its backward when that lies a reuse distance "
    "(stage3_max_reuse_distance, 1e9 elements) or more past its recompute (data_parallel.zero3_regathered_modules): "
    "at 175B and 530B with TP 1, QKV, the projection, FC1 and the norms. "
    "Megatron-DeepSpeed bf16 rows at ZeRO-0 measured before 2022-02-24 (the "
    "date in their notes) ran DeepSpeed's bf16 branch before it sharded anything (DEEPSPEED_BF16_SHARDED_FROM).",
    "Unknown micro-batch size: the fastest fitting choice among mbs 1/2/4/8, except Megatron-LM rows dated 2020, "
    "which ran the whole per-replica batch at once (global batch / DP): their Megatron-LM had no micro-batches "
    "(--batch-size, 'batch size per model instance', became --micro-batch-size in commit 9019bbf400, 2020-12-06).",
    "Unknown recompute: a row whose printed TFLOP/s count the recomputed forward pass ran with full recompute "
    "(Narayanan et al. 2021 Eq. 3, 96 B s l h^2 (1 + s/6h + V/16lh), counts 4 passes: its definition says so, or "
    "its TFLOP/s x GPUs x step time equal Eq. 3 within 2%, where the 3-pass count is 25% lower); otherwise the "
    "fastest fitting of none/selective/full, but none/full for Megatron-LM rows dated before 2022: selective "
    "recompute arrived with Korthikanti et al. 2022 (Megatron-LM commit cfd2e21607, 2022-04-28, "
    "--checkpoint-granularity selective); until then Megatron-LM had only --checkpoint-activations, i.e. full.",
    "Sequence parallelism unprinted: on with TP for Megatron-Core/NeMo and torchtitan (its enable_sequence_parallel "
    "defaults to True, frameworks.md §1.2), off otherwise.",
]


RECOMPUTE_POLICIES = ("none", "selective", "full")
LAYER_SAC = "layer"  # _printed_recompute: torchtitan's layer SAC (v0.2.2 and before)
LAYER_SAC_EVERY = 2  # its default selective_ac_option '2' (job_config.py@v0.2.2 L651-659, frameworks.md §1.5)
SELECTIVE_RECOMPUTE_YEAR = 2022
MICRO_BATCHES_YEAR = 2021
"""Megatron-LM split a replica's batch into micro-batches from commit 9019bbf400 (2020-12-06, --micro-batch-size);
rows dated before 2021 ran the whole per-replica batch (--batch-size) in one forward and backward."""
"""Megatron-LM gained selective recompute with Korthikanti et al. 2022 (commit cfd2e21607, 2022-04-28, the
--checkpoint-granularity flag); before it, --checkpoint-activations recomputed whole layers (full)."""


@dataclass
class Case:
    row_id: str
    source: str
    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    layout_fields: dict
    knobs: Knobs
    measured_step_seconds: float
    measured_basis: str
    measured_memory_gib: float | None
    searched: list[str] = field(default_factory=list)
    family: str = "megatron-classic"
    recompute_choices: tuple[str, ...] = RECOMPUTE_POLICIES  # searched when the row printed none
    inferred: list[str] = field(default_factory=list)  # fields set by a stated rule, not printed by the source
    memory_basis: str = "device"  # what the printed memory measures (memory_basis_of): device, reserved, allocated

    @property
    def gpu_generation(self) -> str:
        return cluster_generation(self.cluster)

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_gpus


@dataclass
class CaseResult:
    case: Case
    layout: LayoutSpec | None
    predicted_step_seconds: float | None
    predicted_memory_gib: float | None
    fits: bool
    error: float | None  # (predicted - measured) / measured, knobs fitted on every source
    note: str = ""
    predicted_allocated_gib: float | None = None
    host_fits: bool = True
    loso_error: float | None = None  # the same, knobs fitted without this row's source
    predicted_overhead_gib: float | None = None  # outside the allocator on the peak stage: context + NCCL

    def predicted_memory_on(self, basis: str) -> float | None:
        """The predicted peak (GiB) of the quantity a source printed: device (reserved + context + NCCL), reserved
        (torch's pool: device less what sits outside the allocator) or allocated (live tensors)."""
        if basis == "allocated":
            return self.predicted_allocated_gib
        if basis == "reserved" and self.predicted_memory_gib is not None and self.predicted_overhead_gib is not None:
            return self.predicted_memory_gib - self.predicted_overhead_gib
        return self.predicted_memory_gib


def _num(x):
    return x if isinstance(x, int | float) and not isinstance(x, bool) else None


PCIE_SERVERS = {
    "H100-PCIe": {"kind": "pcie", "gb_per_s": 50.0, "efficiency": 0.8, "latency_us": 10.0},  # Gen5 x16 ~63/dir [S]
    "A100-PCIe-80GB": {"kind": "pcie", "gb_per_s": 25.0, "efficiency": 0.8, "latency_us": 10.0},  # Gen4 x16 [S]
}
"""A PCIe card's server: the GPUs talk over PCIe through the host (NVLink bridges join pairs only), the efficiency
as the L40S preset's [U]; the network between nodes stays the DGX preset's unless the row names another."""


_GRACE = "GPU {gpu!r}: a Grace superchip (NVLink-C2C host link, NVL domains beyond a node) is not in the catalog"
GPU_TEXT_RULES: tuple[tuple[tuple[str, ...], tuple[str, dict] | str], ...] = (
    (("tpu",), "TPU run, not GPU data"),
    # Grace superchips before h200 / b200, which their names contain
    (("gh200",), _GRACE),
    (("gb200",), _GRACE),
    (("h200", "nvl"), "GPU {gpu!r}: H200 NVL (a PCIe card on NVLink bridges) is not in the catalog"),
    (("h200",), ("dgx-h200", {})),
    (("b200",), ("dgx-b200", {})),
    (("h800",), ("hgx-h800", {})),  # the export part: H100 silicon, NVLink cut to 400 GB/s
    (("a800",), ("dgx-a100-80gb", {"gpu": "A800-SXM4-80GB", "intra_node": {"gb_per_s": 200.0}})),  # NVLink cut
    (("h100", "nvl"), "GPU {gpu!r}: H100 NVL (a PCIe pair on NVLink bridges) is not in the catalog"),
    (("h100", "pcie"), ("dgx-h100", {"gpu": "H100-PCIe", "intra_node": PCIE_SERVERS["H100-PCIe"]})),
    # torchtitan's H100 runs: Grand Teton's HBM2e SXM part at 500 W ("lower TDP"), peak between SXM and NVL
    (("h100", "hbm2e"), ("dgx-h100", {"gpu": "H100-SXM-HBM2e-500W"})),
    (("h100",), ("dgx-h100", {})),
    (("a100", "pcie", "40gb"), "GPU {gpu!r}: the 40 GB A100 PCIe card is not in the catalog"),
    (("a100", "pcie"), ("dgx-a100-80gb", {"gpu": "A100-PCIe-80GB", "intra_node": PCIE_SERVERS["A100-PCIe-80GB"]})),
    (("a100", "40gb"), ("dgx-a100-40gb", {})),
    (("a100",), ("dgx-a100-80gb", {})),
    (("v100",), ("dgx2", {})),
)
"""A row's GPU text (lower-cased) -> (the cluster preset, the spec fields it overrides: `gpu`, a catalog name;
`intra_node`, fields merged into the preset's link), or why it cannot run. A stated memory size is not a rule: it
applies to any GPU (MEMORY_MISMATCH_FRACTION).
The first rule whose words all occur wins."""


def _catalog_base(gpu: str) -> tuple[str, dict] | str:
    """The cluster preset a row's GPU text runs on and the spec fields it overrides, or why it cannot run
    (GPU_TEXT_RULES)."""
    low = gpu.lower()
    for words, result in GPU_TEXT_RULES:
        if all(w in low for w in words):
            return result.format(gpu=gpu) if isinstance(result, str) else result
    return f"GPU {gpu!r} not in the catalog"


MEMORY_MISMATCH_FRACTION = 0.1
"""A row whose stated GPU memory is this far from its preset's (a 96 GB H100, a 40 GB A100 named without its
size) runs on the stated size, read as 10^9 bytes (the lower reading of a vendor's "GB"); within it, the preset's
measured capacity stands (80 GB parts hold 79.6-80 GiB)."""


def _stated_memory_gb(row) -> float | None:
    """The GPU memory a row states: its gpu_memory_gb, else a size in its GPU text ("H100 96GB"), else None."""
    stated = _num(row.get("gpu_memory_gb"))
    if stated is not None and stated > 0:
        return float(stated)
    m = re.search(r"(\d+(?:\.\d+)?)\s*gb\b", (row.get("gpu_type") or "").lower())
    return float(m.group(1)) if m else None


def _gpu_and_cluster(row) -> tuple[str, dict] | str:
    gpu = (row.get("gpu_type") or "")
    inter = (row.get("interconnect") or "").lower()
    gpn = row.get("gpus_per_node") or 8
    n = row.get("total_gpus")
    if not n:
        return "no total_gpus"
    base_over = _catalog_base(gpu)
    if isinstance(base_over, str):
        return base_over
    base, over = base_over
    spec: dict[str, Any]
    if base == "dgx2":
        spec = {
            "name": "dgx-2", "gpu": "V100-SXM2-32GB", "num_nodes": 1, "gpus_per_node": 16,
            "intra_node": {"kind": "nvlink", "gb_per_s": 150.0, "efficiency": 0.8, "latency_us": 5.0},
            "inter_node": {"kind": "infiniband", "nics_per_node": 8, "nic_gbit_per_s": 100.0, "efficiency": 0.9,
                           "latency_us": 10.0},
            "host_to_device": {"gb_per_s": 12.0}, "host_memory_gib": 1536,
        }
    else:
        spec = _cluster_json(base)
        if "omni-path" in inter:
            spec["inter_node"] = {"kind": "infiniband", "nics_per_node": 4, "nic_gbit_per_s": 100.0, "efficiency": 0.9,
                                  "latency_us": 10.0}
        elif "1600 gbps" in inter:
            spec["inter_node"] = {"kind": "roce", "nics_per_node": 8, "nic_gbit_per_s": 200.0, "efficiency": 0.9,
                                  "latency_us": 10.0}
    if "gpu" in over:
        spec["gpu"] = over["gpu"]
    stated = _stated_memory_gb(row)
    gpu_fields = load_gpu(spec["gpu"]).model_dump(mode="json")
    # nominal sizes compared: a vendor's "80GB" part holds 79.6-80 GiB
    if stated is not None and abs(gpu_fields["memory_gib"] - stated) > MEMORY_MISMATCH_FRACTION * stated:
        spec["gpu"] = {**gpu_fields, "memory_gib": stated * 1e9 / GIB}
    if "intra_node" in over:
        spec["intra_node"] = {**spec["intra_node"], **over["intra_node"]}
    spec["gpus_per_node"] = min(gpn, n) if n < gpn else gpn
    spec["num_nodes"] = max(1, n // spec["gpus_per_node"])
    if spec["num_nodes"] * spec["gpus_per_node"] != n:
        return f"{n} GPUs do not fill whole nodes of {gpn}"
    if spec["num_nodes"] == 1 and n == 1:
        spec["intra_node"] = {"kind": "none", "gb_per_s": 0.0}
    return base, spec


@cache
def _cluster_json_cached(base: str) -> str:
    return json.dumps(load_cluster(base).model_dump(mode="json"))


def _cluster_json(base: str) -> dict:
    return json.loads(_cluster_json_cached(base))


JAX_TRAINER_NAMES = ("maxtext", "jax", "paxml", "levanter")
"""How a row's `framework` text names a JAX trainer: the fsdp family (FAMILY_NAMES), a compiled step
(COMPILED_STEP_NAMES)."""

FAMILY_NAMES = (
    ("mcore", ("megatron-core", "megatron core", "mcore", "nemo", "megatron-bridge", "megatron bridge")),
    ("fsdp", ("torchtitan", "llm-foundry", "composer", "fsdp", *JAX_TRAINER_NAMES)),
    ("megatron-deepspeed", ("megatron-deepspeed", "megatron deepspeed", "gpt-neox")),
    ("deepspeed", ("deepspeed",)),
)
"""How a row's `framework` text names its family, first match wins (case-insensitive); none: megatron-classic.
The spellings besides the ones ../shared/validation uses are stated choices for rows from other sources: Megatron
Core and Megatron-Bridge run Megatron-Core; GPT-NeoX is Megatron-LM on DeepSpeed; JAX trainers (MaxText, Pax,
Levanter) shard FSDP-style with XLA overlapping the gathers, nearer torchtitan's FSDP2 than Megatron-LM of 2021
[U: no JAX row is in the published set]."""


def _framework_family(row) -> str:
    fw = (row.get("framework") or "").lower()
    for family, names in FAMILY_NAMES:
        if any(name in fw for name in names):
            return family
    return "megatron-classic"


FAMILY_FRAMEWORK = {"mcore": Framework.MEGATRON, "fsdp": Framework.TORCHTITAN, "deepspeed": Framework.DEEPSPEED,
                    "megatron-deepspeed": Framework.MEGATRON_DEEPSPEED, "megatron-classic": Framework.MEGATRON}
"""The profile each family of published rows runs with (report groups keep the family apart)."""


def family_knobs(family: str, precision: str = "bf16", year: int | None = None,
                 generation: str | None = None) -> Knobs:
    """The framework profile's knobs, with what a row's software era fixes: Megatron-LM before 2023 had no
    --overlap-grad-reduce / --overlap-param-gather / --tp-comm-overlap (Korthikanti et al. 2022 §6.3) and no
    Transformer Engine attention; DeepSpeed's ZeRO-3 before 2022 did not overlap its parameter gathers with compute
    (ZERO3_SYNC_GATHERS_UNTIL). The profile's stated facts of the GPU generation (its fused attention kernel, the
    memory outside the allocator) apply; its kernel-efficiency factor does not: validation fits that per fold
    (KERNEL_FACTOR_GRID)."""
    profile = profile_for(FAMILY_FRAMEWORK[family])
    knobs = replace(profile.knobs(precision=precision),
                    attention_kernel_efficiency=profile.attention_kernel_efficiency(generation),
                    per_process_overhead_bytes=profile.allocator.fixed_bytes_on(generation))
    if family == "megatron-classic":
        knobs = replace(knobs, dp_overlap_fraction=0.0, pp_overlap_fraction=0.0, tp_overlap_fraction=0.0,
                        attention_kernel_efficiency=0.0)
    if family == "deepspeed" and year is not None and year <= ZERO3_SYNC_GATHERS_UNTIL:
        knobs = replace(knobs, zero3_overlap_fraction=0.0, zero3_gather=Zero3Gather.PARAMETER)
    return knobs


ZERO3_SYNC_GATHERS_UNTIL = 2021
"""DeepSpeed's ZeRO-3 of 2021 (v0.3.13, 2021-03-16, through v0.5.4, 2021-10-06) gathered each parameter on its own
(partition_parameters.py _allgather_param) after a torch.cuda.synchronize(), so a prefetched gather waited for
the compute queued before it and fetch_sub_module waited for the gather (comm_stream.synchronize()): compute and
gathers took turns. DeepSpeed PR #1188 (v0.5.5, 2021-11): "the async version is not async at all, because each
all_gather calls torch.cuda.synchronize()"; coalesced gathers from v0.6.0 (2022-03). Rows dated 2021 or earlier
run with none of the ZeRO-3 traffic hidden [U: the gradient reduce-scatter ran on a side stream and may have
overlapped; the profile has one share for both]."""


DEEPSPEED_BF16_SHARDED_FROM = "2022-02-24"
"""The day DeepSpeed's bf16 optimizer first sharded its fp32 state over DP: commits 6f5ebc37a 'bf16+zero_stage_1
first cut' and 819abe2a7 'finish zero_stage 1 sharding' on the olruwase/bf16-updates branch (squashed into PR #1801,
released 2022-04-19 as BF16_Optimizer). Before it, bf16 at ZeRO-0 under the pipeline engine ran that branch's
unsharded optimizer (profiles.DEEPSPEED_BF16_BRANCH_RECIPE). DeepSpeed's master then handed bf16 at ZeRO-0 the bare
optimizer over the bf16 parameters, with no fp32 master (engine.py _configure_optimizer @8eef742), and BigScience
measured its ZeRO_STAGE=0 row of 2022-02-21 on 'the special branch' ('currently can't test ZeRO_STAGE=0 on master',
chronicles-prequel.md), the day of the branch's 'Got bf16 working' (6eb4f1fa9)."""


def _row_date(row: dict) -> str | None:
    """The day a row was measured, where its notes print it ('(date 2022-02-21)'), as ISO text; None elsewhere."""
    notes = row.get("notes")
    m = re.search(r"\bdate (\d{4}-\d\d-\d\d)\b", notes) if isinstance(notes, str) else None
    return m.group(1) if m else None


def era_memory_recipe(row: dict, family: str, precision: str) -> MemoryRecipe | None:
    """The memory recipe a row's software of its day ran where it differs from its profile's (None: the profile's):
    Megatron-DeepSpeed bf16 at ZeRO-0 measured before DEEPSPEED_BF16_SHARDED_FROM ran the unsharded bf16 branch."""
    date = _row_date(row)
    if (family == "megatron-deepspeed" and precision == "bf16" and row.get("zero_stage") == 0
            and date is not None and date < DEEPSPEED_BF16_SHARDED_FROM):
        return DEEPSPEED_BF16_BRANCH_RECIPE
    return None


def _unrepresentable(row: dict) -> str | None:
    """Why a row cannot become a case before its cluster is looked at (None: it can)."""
    if row.get("record_type") != "throughput_run":
        return f"record_type {row.get('record_type')}"
    if row.get("moe") or (row.get("ep") or 1) > 1:
        return "MoE model: the row carries no expert shapes (num_experts, top_k, expert FFN width) to rebuild it"
    needed = ["num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length", "global_batch_size"]
    missing = [k for k in needed if not row.get(k)]
    if missing:
        return f"missing {', '.join(missing)}"
    return None


def _model_fields(row: dict, family: str) -> dict:
    """The ModelSpec fields a row implies (architecture family from the model name and head counts)."""
    name = (row.get("model_name") or "") + " " + (row.get("model_family") or "")
    heads = row["num_attention_heads"]
    kv = row.get("num_kv_heads") or heads
    # Nemotron-4 and its Minitron prunes are GQA with a non-gated squared-ReLU MLP (arXiv:2402.16819 §2), not
    # Llama's SwiGLU; Llama-3.1-Nemotron models are Llamas (mlp_gating_by_printed_size also catches unnamed ones)
    nemotron4 = any(k in name.lower() for k in ("nemotron-4", "nemotron4", "minitron")) and "llama" not in name.lower()
    llama = ("llama" in name.lower() or kv != heads) and not nemotron4
    mpt = "mpt" in name.lower()
    flash = family in ("fsdp", "mcore")
    model = {
        "name": row.get("model_name") or row["id"], "num_layers": row["num_layers"], "hidden_size": row["hidden_size"],
        "num_attention_heads": heads, "num_kv_heads": kv, "vocab_size": row["vocab_size"],
        "ffn_hidden_size": row.get("ffn_hidden_size") or 4 * row["hidden_size"],
        "attention": "flash" if flash else "standard", "max_position_embeddings": row["seq_length"],
    }
    if llama:
        model.update(mlp="swiglu", norm="rmsnorm", tied_embeddings=False, bias=False, position_embedding="rope")
    elif nemotron4:  # specs.py relu2: 2 matrices, costed as GeLU
        model.update(mlp="relu2", norm="layernorm", tied_embeddings=False, bias=False, position_embedding="rope")
    elif mpt:
        model.update(mlp="gelu", norm="layernorm", tied_embeddings=True, bias=False, position_embedding="alibi")
    else:
        model.update(mlp="gelu", norm="layernorm", tied_embeddings=True, bias=True, position_embedding="learned",
                     dropout=family in ("megatron-classic", "deepspeed"))
    if "bloom" in name.lower() or "bs-" in row["id"]:
        model["position_embedding"] = "alibi"
    return model


GATING_RULE_MISS = 0.20  # the name/head-count rule's parameter count this far from the printed size ...
GATING_OTHER_MATCH = 0.05  # ... and the other MLP gating's this close: the other gating is what the row trained


def mlp_gating_by_printed_size(row: dict, model: dict) -> tuple[dict, str | None]:
    """(model fields, the rule's note or None): the MLP gating the row's printed parameter count (params_b) says,
    where the name/head-count rule of _model_fields contradicts it. GQA does not imply SwiGLU: Nemotron-4 15B and
    340B are GQA (8 KV heads) with a non-gated squared-ReLU MLP of 4h (arXiv:2402.16819 §2, 2406.11704 §2.1), which
    the rule takes for Llama's SwiGLU: +31% and +38% parameters, so false out-of-memory verdicts and recompute that
    never ran. The thresholds leave alone rows whose printed size differs for other reasons (llm-foundry's short
    MPT rows count learned positions of long sequences: -16% and -29% under the rule, and SwiGLU is no closer)."""
    printed = _num(row.get("params_b"))
    if not printed:
        return model, None

    def miss(mlp: str) -> float:
        try:
            total = ModelSpec.model_validate(dict(model, mlp=mlp)).parameter_counts()["total"]
        except ValueError:
            return math.inf
        return abs(total / (printed * 1e9) - 1)

    other = "gelu" if model["mlp"] in GATED_MLPS else "swiglu"
    rule_miss = miss(model["mlp"])
    if rule_miss <= GATING_RULE_MISS or miss(other) > GATING_OTHER_MATCH:
        return model, None
    kind = "non-gated (2 matrices of h x ffn)" if other == "gelu" else "gated (SwiGLU, 3 matrices)"
    return dict(model, mlp=other), (f"mlp={other}: a {kind} MLP matches the printed {printed:g}B parameters; the "
                                    f"name/head-count rule's {model['mlp']} misses them by {rule_miss:.0%}")


def _fp8_param_gather(family: str, fp8_recipe: str) -> bool:
    """Whether an FP8 row all-gathers its parameters in FP8, as a plan for its framework does
    (capabilities.fp8_gathers_params): NVIDIA's Megatron-Core rows ran NeMo / Megatron-Bridge recipes, whose
    mixed-precision configs set it for their delayed, current-scaling and MXFP8 recipes (frameworks.md §4.6);
    torchtitan's tensorwise rows gather in FP8, as torchtitan's float8 guide launches it and its llama3_405b.toml
    sets it (enable_fsdp_float8_all_gather = true at commits 3faaa1a0 and eaea6f6a); llm-foundry's TE rows do not."""
    return fp8_gathers_params(Framework.NEMO if family == "mcore" else FAMILY_FRAMEWORK[family], fp8_recipe)


def _precision(row: dict, family: str) -> tuple[str, str]:
    """(precision, fp8 recipe) of a row."""
    precision_text = (row.get("precision") or "").lower()
    precision = "fp16" if ("fp16" in precision_text and "bf16" not in precision_text) or "v100" in (row.get("gpu_type") or "").lower() else "bf16"
    # FP8 rows (modern-training.md §1.1): torchtitan's float8 of 2024-12 is torchao tensorwise; TE-based stacks
    # (NeMo/Megatron-Core recipes of 2024, llm-foundry's TE AMP) use TE's default, delayed scaling
    fp8_recipe = "tensorwise" if family == "fsdp" and _is_torchtitan(row) else "delayed"
    if "fp8" in precision_text:
        precision = "fp8"
    return precision, fp8_recipe


def _unprinted_sequence_parallel(family: str, tp: int) -> bool:
    """Sequence parallelism for a row that does not print it (ASSUMPTIONS): on with TP where Megatron-Core/NeMo's
    recipes set it, else its family's framework default (Capabilities.sequence_parallel_default: torchtitan's
    enable_sequence_parallel, which the FSDP family's rows run with, like the rest of its profile)."""
    return tp > 1 and (family == "mcore" or capabilities(FAMILY_FRAMEWORK[family]).sequence_parallel_default)


def _layout_fields(row: dict, family: str, n: int) -> dict | str:
    """The layout the row reports (degrees, schedule, ZeRO stage, sequence parallelism), or why it does not add up."""
    tp, pp, cp = row.get("tp") or 1, row.get("pp") or 1, row.get("cp") or 1
    dp = row.get("dp") or n // (tp * pp * cp)
    if tp * pp * dp * cp != n:
        return f"tp*pp*dp*cp = {tp * pp * dp * cp} != {n} GPUs"
    fields: dict = {"tp": tp, "pp": pp, "dp": dp, "cp": cp}
    if row.get("vpp") and row["vpp"] > 1:
        fields.update(schedule="interleaved_1f1b", virtual_stages=row["vpp"])
        layers = row.get("num_layers") or 0
        splits = account_for_splits(layers, pp, row["vpp"]) if family == "mcore" and layers % (pp * row["vpp"]) else []
        if splits:  # Megatron-Core builds these chunks only with the account-for flags (Megatron-Bridge's recipes)
            fields["layers_per_stage"] = splits[0]
    zero = row.get("zero_stage")
    if zero is None:
        zero = 1 if family == "mcore" else 0
    fields["zero_stage"] = zero
    sp = row.get("sequence_parallel")
    fields["sequence_parallel"] = bool(sp) if sp is not None else _unprinted_sequence_parallel(family, tp)
    return fields


def _is_llm_foundry(row: dict) -> bool:
    return "llm-foundry" in str(row.get("framework") or "")


def _is_torchtitan(row: dict) -> bool:
    return "torchtitan" in str(row.get("framework") or "").lower()


COMPILED_STEP_NAMES = (*JAX_TRAINER_NAMES, "torch.compile")
"""A row whose framework text names one of these ran a compiled step: JAX trainers always (XLA compiles the whole
step), PyTorch ones when the text says torch.compile (eager is torch's and torchtitan's default). Such a row moves
profiles.COMPILED_ELEMENTWISE_SHARE of the eager elementwise traffic. No row of ../shared/validation names one."""


def compiled_step(row: dict) -> bool:
    fw = str(row.get("framework") or "").lower()
    return any(name in fw for name in COMPILED_STEP_NAMES)


TORCHTITAN_REPEAT_KV_LAST_YEAR = 2025
"""The last year whose torchtitan runs copied K and V to every query head before SDPA (repeat_kv: unsqueeze, expand,
reshape, a copy that SDPA saves; Knobs.kv_heads_repeated): torchtitan passes enable_gqa to SDPA instead from
'GQA without kv repeats' (#2259, commit ff0829c1, 2026-01-27), as the torchtitan profile assumes."""

TORCHTITAN_FLASH_ATTENTION_2_YEAR = 2025
"""The year whose torchtitan runs took FlashAttention-2 on Hopper; later runs take cuDNN's attention, as the
torchtitan profile does (torchtitan puts CUDNN_ATTENTION first from 2025-10-09, #1776; profiles.py). Its runs of
2025 took FlashAttention-2 (FLASH_ATTENTION first on Hopper from #1196, 2025-05; before, torch's own order,
FlashAttention-2 first on sm90 since pytorch#141274, 2024-11) [U: a run of 2025-10..12]. Its runs of 2024 are
not known: torch 2.4 and earlier took FlashAttention-2, torch 2.5.0 and the nightlies before it (from the second
landing of pytorch#125343, after 2024-06-27) cuDNN, and torchtitan's 2024-08 rows do not print their torch; they
keep the GEMM-rate convention, which lies between the two (~0.35-0.40 of H100 peak on the causal FLOPs)."""


def fsdp_attention_kernel(row: dict, profile_value: float) -> float:
    """The fused attention kernel's efficiency a PyTorch FSDP row ran at (Knobs.attention_kernel_efficiency; 0: the
    GEMM-rate convention), given its profile's value for its GPU (0 off Hopper). llm-foundry's rows ran its own
    Triton flash attention (ASSUMPTIONS): the convention. torchtitan's by their year
    (TORCHTITAN_FLASH_ATTENTION_2_YEAR); a row without a year takes the profile's, the kernel torchtitan runs now."""
    if profile_value <= 0 or _is_llm_foundry(row):
        return 0.0
    year = _row_year(row)
    if not _is_torchtitan(row) or year is None or year > TORCHTITAN_FLASH_ATTENTION_2_YEAR:
        return profile_value
    return FLASH_ATTENTION_2_HOPPER if year == TORCHTITAN_FLASH_ATTENTION_2_YEAR else 0.0


def fsdp_attention_convention_rate(row: dict, cluster: ClusterSpec) -> float:
    """Knobs.attention_convention_rate of a PyTorch FSDP row: llm-foundry's rows on Hopper ran pre-MLIR Triton's
    flash attention, an Ampere kernel there (ASSUMPTIONS), at profiles.ampere_kernel_convention_rate; every other
    row at the convention itself (1)."""
    if not _is_llm_foundry(row) or cluster_generation(cluster) != "hopper":
        return 1.0
    return ampere_kernel_convention_rate(gpu_matmul_efficiency=cluster.gpu_spec().matmul_efficiency,
                                         ampere_matmul_efficiency=load_gpu(AMPERE_REFERENCE_GPU).matmul_efficiency)


def _row_year(row: dict) -> int | None:
    """The year a row's software or source is dated (the framework field first, then the source); arXiv ids such
    as 2005.14165 are not years."""
    for text in (row.get("framework"), row.get("source")):
        m = re.search(r"(?<![\w.:])(?:19|20)\d\d(?![\w.])", text or "")
        if m:
            return int(m.group(0))
    return None


def _flops_count_recompute(row: dict, model: ModelSpec, training: TrainingSpec, n: int,
                           step_seconds: float | None) -> bool:
    """Whether the row's printed TFLOP/s count a recomputed forward pass (Narayanan et al. 2021 Eq. 3, 4 passes):
    its definition says so, or it printed a step time too and TFLOP/s x GPUs x step equals Eq. 3 within 2% (the
    3-pass count of the same shape is 25% lower)."""
    if _counts_recompute_definition(row):
        return True
    x = _num(row.get("tflops_per_gpu"))
    if not x or not step_seconds or step_seconds != step_seconds or not _gpt_like(model):
        return False
    eq3 = compute.flops_narayanan_eq3(**_flop_shape(model, training))
    return abs(x * 1e12 * n * step_seconds / eq3 - 1) <= 0.02


def recompute_choices(row: dict, family: str, flops_count_recompute: bool) -> tuple[tuple[str, ...], str | None]:
    """The recompute policies a row that printed none may have run with, and the rule that narrowed them (None:
    every policy). The one place for this rule (ASSUMPTIONS states it)."""
    if flops_count_recompute:
        return ("full",), "recompute=full: its TFLOP/s count the recomputed forward, Narayanan Eq. 3"
    year = _row_year(row)
    if family == "megatron-classic" and year is not None and year < SELECTIVE_RECOMPUTE_YEAR:
        return ("none", "full"), None
    return RECOMPUTE_POLICIES, None


def _printed_recompute(row: dict) -> str | None:
    """The recompute policy the row prints (LAYER_SAC for torchtitan's layer SAC; None: not printed)."""
    rec = (row.get("activation_recomputation") or "").lower()
    if "(op)" in rec:
        return "selective"  # torchtitan's per-op SAC: the torchtitan profile's selective (cost_models/op_sac.py)
    if "(layer)" in rec:
        return LAYER_SAC  # torchtitan's layer SAC: every 2nd block fully recomputed (_searched_fields)
    if rec.startswith("full"):
        return "full"
    if "selective" in rec:
        return "selective"
    if rec.startswith("none") or rec.startswith("baseline no"):
        return "none"
    return None


def _searched_fields(row: dict, fields: dict, choices: tuple[tuple[str, ...], str | None]
                     ) -> tuple[list[str], list[str], tuple[str, ...]]:
    """Fill the recompute policy and micro-batch the row reports (or a stated rule fixes) into `fields`; return the
    fields left to search, the fields a rule set, and the recompute policies to search."""
    searched: list[str] = []
    inferred: list[str] = []
    rec = _printed_recompute(row)
    options, why = choices
    if rec == LAYER_SAC:
        fields.update(recompute="none", recompute_layers_per_stage=[
            n // LAYER_SAC_EVERY for n in stage_split(row["num_layers"], fields["pp"])])
        options = ("none",)
        inferred.append(f"recompute_layers_per_stage={fields['recompute_layers_per_stage']}: torchtitan's layer SAC "
                        f"(selective_ac_option '{LAYER_SAC_EVERY}', its default) fully recomputes every "
                        f"{LAYER_SAC_EVERY}-th block and saves everything of the others (frameworks.md §1.5)")
    elif rec:
        fields["recompute"] = rec
        options = (rec,)
    elif len(options) == 1:
        fields["recompute"] = options[0]
        inferred.append(why or f"recompute={options[0]}")
    else:
        searched.append("recompute" if options == RECOMPUTE_POLICIES else f"recompute ({'/'.join(options)})")
    if row.get("micro_batch_size"):
        fields["micro_batch_size"] = row["micro_batch_size"]
    elif (whole := _whole_batch_per_replica(row, fields)) is not None:
        fields["micro_batch_size"] = whole
        inferred.append(f"micro_batch_size={whole}: Megatron-LM of 2020 ran one batch per replica per iteration")
    else:
        searched.append("micro_batch_size")
    return searched, inferred, options


def _whole_batch_per_replica(row: dict, fields: dict) -> int | None:
    """Megatron-LM before micro-batches (commit 9019bbf400, 2020-12-06, renamed --batch-size, 'batch size per model
    instance', to --micro-batch-size): a 2020 row ran its whole per-replica batch at once (None: not such a row)."""
    year = _row_year(row)
    if _framework_family(row) != "megatron-classic" or year is None or year >= MICRO_BATCHES_YEAR:
        return None
    per_dp, rest = divmod(row["global_batch_size"], fields["dp"])
    return per_dp if per_dp and not rest else None


ROW_COUNTS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
              "seq_length", "global_batch_size", "total_gpus", "gpus_per_node", "tp", "pp", "dp", "vpp", "cp", "ep",
              "micro_batch_size")
ROW_MEASURES = ("tokens_per_sec_per_gpu", "tokens_per_sec_total", "tflops_per_gpu", "iteration_time_s",
                "peak_memory_gb_per_gpu")
ROW_TEXTS = ("id", "source", "record_type", "gpu_type", "interconnect", "framework", "precision", "model_name",
             "model_family", "activation_recomputation", "tflops_definition")
"""The fields of a published row the harness reads, by kind: whole counts, finite measurements, text; each may be
null. A 0 reads as absent, as it always has (`row.get("vpp") or 1`; tables write 0 for a parallelism not used)."""


def malformed_field(row: object) -> str | None:
    """The first field of a row whose value is of the wrong kind, as 'field: value -> allowed' (None: well formed).
    A runs file from elsewhere skips such a row with that reason instead of stopping the harness."""
    if not isinstance(row, dict):
        return f"row: {str(row)[:40]!r} -> a JSON object"
    for keys, whole, allowed in ((ROW_COUNTS, True, "a whole number >= 1"), (ROW_MEASURES, False, "a number > 0")):
        for key in keys:
            v = row.get(key)
            x = _num(v)
            if v is not None and (x is None or not math.isfinite(x) or x < 0 or (whole and x != int(x))):
                return f"{key}: {v!r} -> {allowed} (0 or null: not given)"
    z = row.get("zero_stage")
    if z is not None and (isinstance(z, bool) or z not in (0, 1, 2, 3)):
        return f"zero_stage: {z!r} -> 0, 1, 2 or 3, or null"
    for key in ROW_TEXTS:
        v = row.get(key)
        if v is not None and not isinstance(v, str):
            return f"{key}: {v!r} -> text, or null"
    sp = row.get("sequence_parallel")
    if sp is not None and not isinstance(sp, bool):
        return f"sequence_parallel: {sp!r} -> true, false or null"
    return None


def build_case(row: dict, *, memory_only: bool = False) -> Case | str:
    """A case, or the reason the row cannot be represented. memory_only: a row that printed its memory but no
    throughput becomes a case for the memory table (its step time is NaN and it joins no time statistic)."""
    reason = malformed_field(row) or _unrepresentable(row)
    if reason is not None:
        return reason
    cl = _gpu_and_cluster(row)
    if isinstance(cl, str):
        return cl
    base, cluster_data = cl
    family = _framework_family(row)
    model, gating_note = mlp_gating_by_printed_size(row, _model_fields(row, family))
    precision, fp8_recipe = _precision(row, family)
    try:
        model_spec = ModelSpec.model_validate(model)
        training = TrainingSpec(global_batch_size=row["global_batch_size"], seq_length=row["seq_length"], precision=precision,
                                fp8_recipe=fp8_recipe, fp8_param_gather=_fp8_param_gather(family, fp8_recipe))
        cluster = ClusterSpec.model_validate(cluster_data)
    except Exception as exc:  # a row whose shape the specs reject
        return f"not representable: {str(exc).splitlines()[0][:120]}"
    n = row["total_gpus"]
    fields = _layout_fields(row, family, n)
    if isinstance(fields, str):
        return fields
    knobs = _row_knobs(row, family, precision, cluster)
    measured, basis = _measured_step(row, model_spec, training, n)
    mem = _num(row.get("peak_memory_gb_per_gpu"))
    if measured is None and memory_only and mem:
        measured, basis = float("nan"), "memory only"
    if measured is None:
        return basis
    if not (math.isnan(measured) or 0 < measured < math.inf):  # NaN: a memory-only row
        return f"measured step time {measured!r} s -> must be a positive finite number ({basis})"
    choices = recompute_choices(row, family, _flops_count_recompute(row, model_spec, training, n, measured))
    searched, inferred, options = _searched_fields(row, fields, choices)
    if gating_note:
        inferred.append(gating_note)
    return Case(row["id"], row.get("source", "")[:60], model_spec, training, cluster, fields, knobs, measured, basis,
                mem, searched, family=family, recompute_choices=options, inferred=inferred,
                memory_basis=memory_basis_of(row))


def _row_knobs(row: dict, family: str, precision: str, cluster: ClusterSpec) -> Knobs:
    """The family's profile knobs with what the row's own stack and era fix (ASSUMPTIONS)."""
    year = _row_year(row)
    knobs = family_knobs(family, precision, year, cluster_generation(cluster))
    era_recipe = era_memory_recipe(row, family, precision)
    if era_recipe is not None:
        knobs = era_recipe.applied_to(knobs)
    if _is_llm_foundry(row):  # its fused cross-entropy, not torchtitan's torch loss; TE's FP8 Linear
        knobs = replace(knobs, loss_bytes_per_logit=FUSED_CROSS_ENTROPY_BYTES_PER_LOGIT,
                        loss_parallel_bytes_per_logit=None, fp8_torchao_linear=False)
    if _is_torchtitan(row) and year is not None and year <= TORCHTITAN_REPEAT_KV_LAST_YEAR:
        knobs = replace(knobs, kv_heads_repeated=True)
    if compiled_step(row):
        knobs = replace(knobs, compiled_elementwise_share=COMPILED_ELEMENTWISE_SHARE.value)
    if family == "fsdp":
        kernel = fsdp_attention_kernel(row, knobs.attention_kernel_efficiency)
        knobs = replace(knobs, attention_kernel_efficiency=kernel,
                        attention_convention_rate=fsdp_attention_convention_rate(row, cluster))
    return knobs


def memory_basis_of(row: dict) -> str:
    """What a row's printed peak memory measures, from its memory_definition: 'reserved' (torch's
    max_memory_reserved, e.g. torchtitan's Memory(GiB) or Megatron's 'max reserved'), 'allocated'
    (max_memory_allocated), else 'device' (nvidia-smi, or a definition that names neither: what decides an OOM).
    Compared with the prediction of the same quantity (CaseResult.predicted_memory_on)."""
    text = str(row.get("memory_definition") or "").lower()
    if "nvidia-smi" in text:
        return "device"
    if "reserved" in text:
        return "reserved"
    if "allocated" in text:
        return "allocated"
    return "device"


def _measured_step(row, model: ModelSpec, training: TrainingSpec, n: int) -> tuple[float | None, str]:
    tokens = training.global_batch_size * training.seq_length
    if _num(row.get("iteration_time_s")):
        return row["iteration_time_s"], "iteration time"
    if _num(row.get("tokens_per_sec_total")):
        return tokens / row["tokens_per_sec_total"], "tokens/s"
    if _num(row.get("tokens_per_sec_per_gpu")):
        return tokens / (row["tokens_per_sec_per_gpu"] * n), "tokens/s per GPU"
    x = _num(row.get("tflops_per_gpu"))
    definition = (row.get("tflops_definition") or "").lower()
    if x:
        kw = _flop_shape(model, training)
        if not _gpt_like(model):
            return None, "TFLOP/s for a non-GPT shape: the source's FLOP formula is not known exactly"
        if _counts_recompute_definition(row):
            return compute.flops_narayanan_eq3(**kw) / (x * 1e12 * n), "TFLOP/s via Narayanan Eq. 3"
        if "model flops" in definition and "megatron formula" in definition:
            return compute.flops_korthikanti_eq7(**kw) / (x * 1e12 * n), "TFLOP/s via model FLOPs (Eq. 7)"
        return None, f"TFLOP/s with an unusable definition ({definition or 'none given'})"
    return None, "no measured throughput"


def _flop_shape(model: ModelSpec, training: TrainingSpec) -> dict[str, int]:
    return dict(global_batch_size=training.global_batch_size, seq_length=training.seq_length,
                num_layers=model.num_layers, hidden_size=model.hidden_size, vocab_size=model.vocab_size)


def _gpt_like(model: ModelSpec) -> bool:
    """The shape the papers' FLOP formulas are written for (4h MLP, one KV head per head)."""
    return model.ffn == 4 * model.hidden_size and model.kv_heads == model.num_attention_heads


def _counts_recompute_definition(row: dict) -> bool:
    """The row's TFLOP/s definition names Narayanan Eq. 3 (one recomputed forward counted)."""
    definition = (row.get("tflops_definition") or "").lower()
    return any(k in definition for k in ("eq.3", "eq. 3", "narayanan table 1", "incl. recompute"))


def _candidates(case: Case) -> list[dict]:
    mbs_opts = [case.layout_fields["micro_batch_size"]] if "micro_batch_size" in case.layout_fields else [1, 2, 4, 8]
    rec_opts = [case.layout_fields["recompute"]] if "recompute" in case.layout_fields else list(case.recompute_choices)
    out = []
    per_dp = case.training.global_batch_size / case.layout_fields["dp"]
    for mbs in mbs_opts:
        if per_dp % mbs and len(mbs_opts) > 1:
            continue
        for rec in rec_opts:
            f = dict(case.layout_fields, micro_batch_size=mbs, recompute=rec)
            f["num_micro_batches"] = max(1, round(per_dp / mbs))
            out.append(f)
    return out


# Published runs are estimated as published: the planner's own ZeRO rules (no ZeRO-2/3 with pipelining, offload
# only with a ZeRO stage that shards it) are not held against them.
ZERO_RULES_NOT_CHECKED = frozenset({"zero_with_pipelining", "offload_needs_zero", "param_offload_needs_zero3"})


def _may_run(est) -> bool:
    """Whether a candidate is not judged 'does not fit' (planner.bands.estimate_verdict on the run's own GPU, at the
    point estimate). A published run ran, so among the candidates for its unprinted fields the harness takes the
    fastest that may run, 'tight' ones included: the caching allocator's reserve is what it frees and retries before
    an out-of-memory error."""
    return estimate_verdict(est, capacity_bytes=est.gpu_memory_bytes,
                            peak_memory_bytes_high=est.peak_memory_bytes) != DOES_NOT_FIT


def evaluate(case: Case, knobs: Knobs | None = None) -> CaseResult:
    knobs = knobs or case.knobs
    best = None
    for f in _candidates(case):
        try:
            layout = LayoutSpec.model_validate(f)
        except Exception:
            continue
        # batch arithmetic is relaxed: some sources use micro-batches that do not divide (composer, ramp-up), so
        # each candidate is estimated at its own batch and its step time scaled to the published one
        training = replace_batch(case.training, layout.micro_batch_size * layout.num_micro_batches * layout.dp)
        problem = Problem(case.model, training, case.cluster, knobs)
        # the published runs ran as printed (vTrain has TP 16 across nodes)
        problems = [str(v) for v in layout_violations(layout, case.model, training, case.cluster,
                                                       allow_tp_across_nodes=True)
                    if v.rule not in ZERO_RULES_NOT_CHECKED]
        if problems:
            return CaseResult(case, layout, None, None, False, None, "; ".join(problems))
        est = problem.estimate(layout)
        step = est.step_seconds * case.training.global_batch_size / training.global_batch_size
        key = (not _may_run(est), step)
        if best is None or key < best[0]:
            best = (key, layout, est, step)
    if best is None:
        return CaseResult(case, None, None, None, False, None, "no layout could be built")
    _, layout, est, step = best
    err = (step - case.measured_step_seconds) / case.measured_step_seconds
    return CaseResult(case, layout, step, est.peak_memory_bytes / GIB, est.fits, err,
                      predicted_allocated_gib=est.peak_allocated_bytes / GIB,
                      predicted_overhead_gib=est.stages[est.peak_stage].overhead_bytes / GIB,
                      host_fits=est.host_memory_bytes_per_node <= est.host_memory_capacity_bytes)


def replace_batch(training: TrainingSpec, batch: int) -> TrainingSpec:
    return training.model_copy(update={"global_batch_size": batch})


FITTED_GRID: dict[str, tuple[float, ...]] = {
    "end_to_end_efficiency": (0.75, 0.775, 0.80, 0.825, 0.85, 0.875, 0.90, 0.925, 0.95, 0.975, 1.0),
    "elementwise_traffic_factor": (4.0, 6.0, 8.0, 10.0, 12.0),
    "gemm_half_efficiency_dim": (0.0, 64.0, 128.0, 192.0, 256.0),
}
"""The knobs fitted on published runs, and the grid searched; everything else comes from a source (framework
profiles, GPU catalog). A fold's choice minimises the mean over its training sources of each source's median
|error|, so no one source (llm-foundry has 2/3 of the rows) decides for the others.
gemm_half_efficiency_dim (cost_models/stage.py gemm_side_factor) came in when, with the GEMM rate set by the FC1
GEMM's FLOPs alone, the errors ran with the model's width inside one source (llm-foundry FSDP rows, mean signed
error -11.5% at h <= 1024, +10.4% at h ~ 8192) and across vTrain's never-fitted models (-14.0% GPT 3.6B, +5.9%
GPT 175B); 0 keeps the old model in the search. Its grid stops at 256, the largest cuBLAS tile side: a dimension
that fills one tile is no longer small. Tried first (2026-12-02) and not kept: the same grid with 320, whose
llm-foundry fold chose 320 with the FSDP/Hopper factor 0.7 (LOSO 7.6% / 21.6%); the e2e grid reaches 1.0
because the shape term takes its share of the old factor. The all-source fit sits on the elementwise grid's edge
(12): end_to_end_efficiency and elementwise_traffic_factor trade off along a ridge of near-equal objective, and
with 14 and 16 added (tried 2026-12-02, not kept) the fit moved along it to 0.9 / 14 (objective 5.12% vs 5.17%)
while the held-out figures worsened to 8.3% / 24.2% (7.2% / 18.6% on this grid). Tried 2026-12-07 and not kept:
the half dimension as a share of each GPU's ridge point (dense peak FLOP/s over HBM bytes/s; a GEMM whose smallest
dimension is d does ~d FLOPs per byte it moves, so its traffic weighs ridge / d of its math: the roofline), which
puts A100's at about half of H100's. The all-source fit chose share 1.0 (H100 295, A100 153): LOSO 4.7% / 11.7%
(4.8% / 13.1% on this grid), but vTrain's bias went to -6.1% (target |bias| <= 5%) and the megatron-deepspeed
family's LOSO median to 6.5% (2.1%): the A100 Megatron rows want the shape term this grid gives them. With the exact
intensity 1 / (1/M + 1/N + 1/K) for the smallest dimension: 4.9% / 12.2%, bias -6.8%."""

KERNEL_FACTOR_GRID: dict[tuple[str, str], tuple[float, ...]] = {
    ("megatron-deepspeed", "ampere"): (0.70, 0.75, 0.80, 0.85, 0.90, 0.95, 1.0),
}
"""Kernel efficiency of a framework family on a GPU generation relative to the global end-to-end factor, where
evidence shows it differs: Megatron-DeepSpeed ran MT-NLG 530B at 126 TFLOP/s per GPU where Megatron-LM ran the
same layout on the same A100 cluster at 159 (Smith et al. 2022; Narayanan et al. 2021). Fitted per fold like the
knobs above, so a held-out source never sets its own factor; rows of other regimes ignore it.
PyTorch FSDP on Hopper had a factor too (0.70-1.0; 0.925 fitted), for the lower MFU llm-foundry's and torchtitan's
H100 runs printed. Two sourced mechanisms explain that MFU (llm-foundry's Ampere attention kernel on Hopper,
fsdp_attention_convention_rate; torchtitan's 500 W HBM2e H100, gpus.yaml H100-SXM-HBM2e-500W), after which every
fold chose 1.0 and the llm-foundry fold's choice rested on torchtitan's 3 H100 rows alone: 0.85 with that part at
the NVL end of torchtitan's range (LOSO 7.0% / 16.6%), 0.925 at the SXM end (5.6% / 13.2%), 1.0 at the midpoint
(4.8% / 13.1%). A knob three rows of one source decide is not kept (removed 2026-12-06).
The Megatron-DeepSpeed factor searches steps of 0.05: on the FSDP factor's five values the all-source fit of the
global knobs tipped from 0.8 / 10 to 0.825 / 12 on a flat objective: LOSO 7.6% / 19.2% (7.8% / 19.3% here), but
every shipped prediction moved ~3%, the MoE rows' leave-one-model-out median went 9.1% -> 11.5% and the nested band
coverage 79.4% -> 76.6% (tried first, 2026-12-02; this grid was chosen second, knowing those figures)."""


def grid_points(grid: dict[str, tuple[float, ...]] | None = None) -> list[dict[str, float]]:
    grid = grid or FITTED_GRID
    points: list[dict[str, float]] = [{}]
    for name in grid:
        points = [dict(pt, **{name: v}) for pt in points for v in grid[name]]
    return points


def factor_name(family: str, generation: str) -> str:
    return f"kernel_efficiency[{family}/{generation}]"


def case_knobs(case: Case, fitted: dict[str, float]) -> Knobs:
    """The case's profile knobs with the fitted values (a kernel factor scales the end-to-end efficiency)."""
    own: dict[str, Any] = {k: v for k, v in fitted.items() if not k.startswith("kernel_efficiency[")}
    knobs = replace(case.knobs, **own)
    factor = fitted.get(factor_name(case.family, case.gpu_generation), 1.0)
    return replace(knobs, end_to_end_efficiency=knobs.end_to_end_efficiency * factor)


def source_balanced_objective(errors: list[float | None], sources: list[str], exclude: str | None = None) -> float:
    by: dict[str, list[float]] = {}
    for e, src in zip(errors, sources, strict=True):
        if e is not None and src != exclude:
            by.setdefault(src, []).append(abs(e))
    return statistics.fmean(statistics.median(v) for v in by.values()) if by else float("inf")


@dataclass
class Loso:
    """Leave-one-source-out: every row predicted with the fitted knobs chosen without its source."""

    points: list[dict[str, float]]
    fold_choice: dict[str, int]  # source -> grid index chosen without it
    all_choice: int  # grid index chosen on every source (the shipped defaults)


@dataclass
class Report:
    results: list[CaseResult]
    skipped: list[tuple[str, str]]
    knobs: dict[str, float]  # fitted on every source
    loso: Loso | None = None
    memory_only: list[CaseResult] = field(default_factory=list)  # rows that printed memory but no throughput
    band_level: float | None = None  # the error band's calibrated quantile level (shipped_band_level)

    def errors(self, subset=None, *, loso: bool = True) -> list[float]:
        rows = self.results if subset is None else subset
        vals = [r.loso_error if loso else r.error for r in rows]
        return [abs(e) for e in vals if e is not None]

    @property
    def false_oom(self) -> list[CaseResult]:
        """Runs that ran, judged 'does not fit' (even their live tensors exceed the GPU)."""
        return [r for r in self.results if r.predicted_step_seconds is not None
                and fit_verdict_of_result(r) == DOES_NOT_FIT]


def load_rows(path: str | Path) -> list[dict]:
    from cluster_specs.reading import parse_json, read_text

    p = Path(path)
    rows = parse_json(read_text(p), str(p))
    if not isinstance(rows, list):
        raise SpecError("expected a JSON list of runs", source=str(p))
    return rows


def build_cases(rows: list[dict]) -> tuple[list[Case], list[tuple[str, str]]]:
    cases, skipped = [], []
    for row in rows:
        case = build_case(row)
        if isinstance(case, str):
            if not isinstance(row, dict) or row.get("record_type") == "throughput_run":
                skipped.append((str(row.get("id", "?")) if isinstance(row, dict) else "?", case))
            continue
        cases.append(case)
    return cases, skipped


def evaluate_all(cases: list[Case], fitted: dict[str, float]) -> list[CaseResult]:
    return [evaluate(c, case_knobs(c, fitted)) for c in cases]


def _grid_results(cases: list[Case], grid, factor_grid) -> tuple[list[dict[str, float]], list[list[CaseResult]]]:
    """Every (knobs x kernel factors) point; a factor's rows are re-evaluated, the others shared (it cannot move
    them), which keeps the search to one pass over the rows per knob point plus one per factor value."""
    base_points = grid_points(grid)
    per_base = [evaluate_all(cases, pt) for pt in base_points]
    points, results = [dict(pt) for pt in base_points], [list(r) for r in per_base]
    for (fam, gen), values in (factor_grid or {}).items():
        name = factor_name(fam, gen)
        idx = [i for i, c in enumerate(cases) if c.family == fam and c.gpu_generation == gen]
        new_points, new_results = [], []
        for pt, res in zip(points, results, strict=True):
            for v in values:
                fitted = dict(pt, **{name: v})
                row = list(res)
                for i in idx:
                    row[i] = evaluate(cases[i], case_knobs(cases[i], fitted))
                new_points.append(fitted)
                new_results.append(row)
        points, results = new_points, new_results
    return points, results


def run_loso(cases: list[Case], grid: dict[str, tuple[float, ...]] | None = None,
             factor_grid: dict[tuple[str, str], tuple[float, ...]] | None = None
             ) -> tuple[Loso, list[list[CaseResult]]]:
    """Evaluate every grid point once; each fold then picks its point from the other sources' errors."""
    points, per_point = _grid_results(cases, grid, KERNEL_FACTOR_GRID if factor_grid is None else factor_grid)
    sources = [c.source for c in cases]
    errs = [[r.error for r in res] for res in per_point]

    def best(exclude):
        return min(range(len(points)), key=lambda i: source_balanced_objective(errs[i], sources, exclude))

    fold = {src: best(src) for src in dict.fromkeys(sources)}
    return Loso(points, fold, best(None)), per_point


def run_validation(rows: list[dict], *, grid: dict[str, tuple[float, ...]] | None = None,
                   factor_grid: dict[tuple[str, str], tuple[float, ...]] | None = None) -> Report:
    cases, skipped = build_cases(rows)
    if not cases:
        from cluster_specs import SpecError

        why = "; ".join(f"{row}: {reason}" for row, reason in skipped[:3]) or "the file holds no rows"
        raise SpecError(f"--runs: no row can be predicted ({len(skipped)} skipped: {why}) -> give published runs "
                        "with a layout and a measured step time or throughput")
    loso, per_point = run_loso(cases, grid, factor_grid)
    results = per_point[loso.all_choice]
    for i, r in enumerate(results):
        r.loso_error = per_point[loso.fold_choice[r.case.source]][i].error
    memory_cases = [c for c in (build_case(r, memory_only=True) for r in rows if r.get("peak_memory_gb_per_gpu"))
                    if not isinstance(c, str) and c.measured_basis == "memory only"]
    fitted = loso.points[loso.all_choice]
    return Report(results, skipped, fitted, loso, evaluate_all(memory_cases, fitted))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _stats(errs: list[float]) -> dict:
    return {"rows": len(errs), "median_abs_error": statistics.median(errs) if errs else None,
            "p90_abs_error": percentile(errs, 0.9) if errs else None}


def _grouped(report: Report, key) -> dict[str, dict]:
    groups: dict[str, list[CaseResult]] = {}
    for r in report.results:
        groups.setdefault(key(r), []).append(r)
    return {k: _stats(report.errors(v)) for k, v in sorted(groups.items())}


PRINTED_MEMORY_UNIT_BYTES = GIB
"""What one printed 'GB' of measured memory is. BigScience, the one source that prints peaks, read them off
nvidia-smi, which shows MiB, and wrote them in the units in which it calls an 81920 MiB card '80GB': 'max is 77GB'
of that card (chronicles-prequel.md, the tables' footnote), a budget of '80/10 = 8 stages per gpu = 44GB ... the
remaining 28GB for activations (2GB is cuda kernels)' (same file), and a Jean Zay check that allocates '77Gb (e.g.
to test 80GB A100s)' as torch.ones(77 * 2**28) fp32 elements, 77 GiB (jz/slurm/README.md). So a printed GB is read
as GiB (MiB / 1024). [U: the tables do not say; read as 10^9 bytes every row's error is 7.4% higher, and
docs/validation.md prints both.] The reading that takes the measured peaks as the larger is also the one that keeps
the memory band on the safe side of an out-of-memory verdict."""


def memory_rows(report: Report, unit_bytes: float = PRINTED_MEMORY_UNIT_BYTES) -> list[tuple[CaseResult, float]]:
    """(result, signed error of the predicted peak vs the printed one, read in `unit_bytes` per printed GB) for rows
    that printed memory; each row against the prediction of what it printed (Case.memory_basis: device memory for
    nvidia-smi, reserved for torch's max_memory_reserved, allocated for max_memory_allocated)."""
    out = []
    for r in report.results + report.memory_only:
        predicted = r.predicted_memory_on(r.case.memory_basis)
        if r.case.measured_memory_gib and predicted:
            measured_gib = r.case.measured_memory_gib * unit_bytes / GIB
            out.append((r, (predicted - measured_gib) / measured_gib))
    return out


def summary(report: Report) -> dict:
    loso = report.errors()
    full = report.errors(loso=False)
    mem = memory_rows(report)
    return {
        "rows_evaluated": len(loso),
        "rows_skipped": len(report.skipped),
        "loso_median_abs_error": statistics.median(loso) if loso else None,
        "loso_p90_abs_error": percentile(loso, 0.9),
        "fitted_on_all_median_abs_error": statistics.median(full) if full else None,
        "fitted_on_all_p90_abs_error": percentile(full, 0.9),
        "false_out_of_memory": len(report.false_oom),
        "fitted_knobs": report.knobs,
        "by_family": _grouped(report, lambda r: r.case.family),
        "by_gpu_generation": _grouped(report, lambda r: r.case.gpu_generation),
        "by_source": _grouped(report, lambda r: r.case.source),
        "memory_rows": len(mem),
        "memory_median_abs_error": statistics.median(abs(e) for _, e in mem) if mem else None,
        "memory_worst_under_prediction": min((e for _, e in mem), default=None),
        "memory_median_abs_error_if_printed_gb_is_1e9_bytes":
            statistics.median(abs(e) for _, e in memory_rows(report, 1e9)) if mem else None,
    }


def band_table(report: Report, exclude_source: str | None = None, *, level: float | None = None,
               exclude: frozenset[str] = frozenset()) -> dict:
    """The error-band table (planner/bands.py) from this report's LOSO residuals, without `exclude_source` and the
    sources in `exclude`, at the central quantile `level` (default: the band's nominal coverage)."""

    out = exclude | {exclude_source} if exclude_source else exclude
    res = [(r.case.source, r.case.family, r.case.gpu_generation, r.case.num_gpus, r.loso_error) for r in report.results
           if r.loso_error is not None and r.case.source not in out]
    mem = [e for r, e in memory_rows(report) if r.case.source not in out]
    return build_table(res, mem, BAND_COVERAGE if level is None else level)


@dataclass(frozen=True)
class BandHit:
    """One row against the band built without its source: inside it or not, and the band's relative width."""

    result: CaseResult
    inside: bool
    width: float  # (high - low) / predicted step time


def case_band(table: dict, case: Case, predicted_step_seconds: float):
    """The step-time band (planner.bands.Band) `table` gives a case's regime (family, GPU generation, scale)
    around a prediction; the shipped table (planner.bands.load_table) gives what `estimate` would show."""
    return band_from_table(table, regime_keys(case.family, case.gpu_generation, case.num_gpus),
                           predicted_step_seconds, 0.0)


def band_hit(table: dict, result: CaseResult, predicted_step_seconds: float) -> BandHit:
    """A row against the band `table` gives its regime around `predicted_step_seconds`."""
    band = case_band(table, result.case, predicted_step_seconds)
    return BandHit(result, band.holds_step(result.case.measured_step_seconds),
                   (band.step_seconds_high - band.step_seconds_low) / predicted_step_seconds)


def band_text(table: dict, result: CaseResult) -> str:
    """'low-high in' (or 'out'): the step-time band `table` gives a predicted row, and whether its measured step
    lies inside it (the outside probes' column); '-' for a row not predicted."""
    if result.predicted_step_seconds is None:
        return "-"
    band = case_band(table, result.case, result.predicted_step_seconds)
    inside = band.holds_step(result.case.measured_step_seconds)
    return f"{band.step_seconds_low:.2f}-{band.step_seconds_high:.2f} {'in' if inside else 'out'}"


def band_hits(report: Report, level: float | None = None, *, exclude: frozenset[str] = frozenset(),
              levels: dict[str, float] | None = None) -> list[BandHit]:
    """Every row of every source not in `exclude`, against the band built without its source (and without
    `exclude`), at `level` or at the source's own level in `levels`."""
    hits = []
    for src in dict.fromkeys(r.case.source for r in report.results):
        if src in exclude:
            continue
        table = band_table(report, src, level=levels[src] if levels else level, exclude=exclude)
        for r in report.results:
            if r.case.source != src or r.loso_error is None:
                continue
            hits.append(band_hit(table, r, r.case.measured_step_seconds * (1 + r.loso_error)))
    return hits


def band_coverage(report: Report, level: float | None = None) -> tuple[int, int]:
    """(rows inside their band, rows): each source's rows against a band built without that source."""
    hits = band_hits(report, level)
    return sum(h.inside for h in hits), len(hits)


def choose_band_level(report: Report, exclude: frozenset[str] = frozenset()) -> float:
    """The smallest quantile level (planner.bands.BAND_LEVELS) at which the sources not in `exclude`, each held
    out in turn, land inside their band at least BAND_COVERAGE of the time (the largest level if none does)."""

    for level in BAND_LEVELS:
        hits = band_hits(report, level, exclude=exclude)
        if hits and sum(h.inside for h in hits) >= BAND_COVERAGE * len(hits):
            return level
    return BAND_LEVELS[-1]


def shipped_band_table(report: Report) -> dict:
    """The band table `make validate` ships (planner/data/error_bands.json, less its knobs): every source's LOSO
    residuals at the shipped level."""
    return band_table(report, level=shipped_band_level(report))


def shipped_band_level(report: Report) -> float:
    """The quantile level the shipped band table uses: choose_band_level on every source (computed once)."""
    if report.band_level is None:
        report.band_level = choose_band_level(report)
    return report.band_level


def nested_band_coverage(report: Report) -> tuple[list[BandHit], dict[str, float]]:
    """The calibrated band held out twice: each source's rows against a band built without that source, at a
    quantile level chosen (choose_band_level) on the other sources only. Returns the hits and each source's level."""
    sources = list(dict.fromkeys(r.case.source for r in report.results))
    levels = {src: choose_band_level(report, frozenset({src})) for src in sources}
    return band_hits(report, levels=levels), levels


def _pct(x) -> str:
    return "n/a" if x is None or x != x else f"{x * 100:.1f}%"


def _group_table(title: str, groups: dict[str, dict]) -> list[str]:
    out = [f"| {title} | rows | LOSO median abs error | LOSO 90th percentile |", "|---|---|---|---|"]
    out += [f"| {k} | {v['rows']} | {_pct(v['median_abs_error'])} | {_pct(v['p90_abs_error'])} |"
            for k, v in groups.items()]
    return out


MEMORY_NOT_PREDICTED = (
    "Rows that printed memory but are not in the table: the 2022-02-20 BLOOM layout-search rows (bs-prequel-0220-*) "
    "print neither the layer count nor the heads (their model size varies per row), and the 104B V100 "
    "measurement (bigscience-104B-v100-memory) prints neither the DP degree nor the micro-batch size.")


def _memory_section(report: Report) -> list[str]:
    mem = memory_rows(report)
    as_1e9 = dict((r.case.row_id, e) for r, e in memory_rows(report, 1e9))
    out = ["## Memory against measured peaks", "",
           "Predicted device memory = reserved (live tensors + the caching allocator's reserve) + memory outside the "
           "allocator (the CUDA context BigScience measured, and NCCL's communicators), the quantity nvidia-smi "
           "shows; allocated = live tensors only. "
           "BigScience's tables print the memory in 'GB' as nvidia-smi showed it ('was quickly getting the memory "
           "snapshot with: pdsh ... nvidia-smi', chronicles-prequel.md); it is compared with device memory. "
           "nvidia-smi shows MiB, and the source writes GB in the units in which it calls the 81920 MiB card '80GB' "
           "('max is 77GB', its footnote): a printed GB is read as GiB (validation.PRINTED_MEMORY_UNIT_BYTES). The "
           "tables do not say so; the last column reads it as 10^9 bytes instead. "
           "NCCL's communicators: torch builds one per process group at its first collective (and one per pair of "
           "ranks for send/recv), with buffers outside torch's pool. The groups are those DeepSpeed's pipe engine and "
           "Megatron's layers run collectives on in a step (default, TP, DP, TP x PP, PP, one send/recv pair per "
           "neighbouring stage, the tied-embedding pair; profiles.py nccl_groups), at 688 MiB per communicator and "
           "544 MiB per 2-rank one, as NVIDIA/nccl #964 measured them on A100s (cost_models/nccl.py): 2.0 GiB on the "
           "single-node 20B row, 4.4 GiB on a first stage with DP > 1. The column 'NCCL GiB' gives each row's. "
           "Each row is compared with the prediction of what its memory_definition says it printed "
           "(validation.memory_basis_of; column 'compared with'): nvidia-smi, or a definition naming neither of the "
           "others, with device memory; torch's max_memory_reserved (torchtitan's Memory(GiB), Megatron's 'max "
           "reserved') with reserved, which leaves out the context and NCCL; max_memory_allocated with allocated. "
           "The Megatron-DeepSpeed recipe is DeepSpeed's ZeRO-1 optimizer at its step (planner/frameworks/"
           "profiles.py), so 'allocated' here is the step's reserved model states plus the live activations, an "
           "upper bound of max_memory_allocated. Rows marked * printed memory but no throughput. The ZeRO-0 row ran "
           "on a pre-release DeepSpeed branch (the source: 'currently can't test ZeRO_STAGE=0 on master ... need to "
           "retest'), measured on 2022-02-21, the day of that branch's 'Got bf16 working' (6eb4f1fa9) and three days "
           "before it first sharded the fp32 state over DP: it is predicted with that commit's unsharded bf16 "
           "optimizer (4 + 6 + 12 B/param and a 3 GB all-reduce bucket, profiles.DEEPSPEED_BF16_BRANCH_RECIPE), not "
           "the released BF16_Optimizer (2 + 4 + 12/d).", "",
           "| row | layout | printed 'GB' | compared with | predicted allocated GiB | NCCL GiB | predicted device GiB "
           "| error | error if a printed GB were 10^9 B |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r, e in mem:
        mark = " *" if r.case.measured_basis == "memory only" else ""
        out.append(f"| {r.case.row_id}{mark} | {r.layout.short() if r.layout else '-'} | {r.case.measured_memory_gib} "
                   f"| {r.case.memory_basis} "
                   f"| {_gib(r.predicted_allocated_gib)} | {_gib(_nccl_gib(r))} | {_gib(r.predicted_memory_gib)} "
                   f"| {e * 100:+.1f}% "
                   f"| {as_1e9[r.case.row_id] * 100:+.1f}% |")
    return out + ["", MEMORY_NOT_PREDICTED]


def _nccl_gib(r: CaseResult) -> float | None:
    """The NCCL communicators' share of a row's memory outside the allocator (the rest is the CUDA context)."""
    if r.predicted_overhead_gib is None:
        return None
    return r.predicted_overhead_gib - r.case.knobs.per_process_overhead_bytes / GIB


def _coverage_cells(hits: list[BandHit]) -> str:
    """'inside (share) | median width' of a group of rows."""
    inside = sum(h.inside for h in hits)
    return f"{inside} ({_pct(inside / len(hits))}) | {_pct(statistics.median(h.width for h in hits))}"


def _band_section(report: Report, hits: list[BandHit], levels: dict[str, float]) -> list[str]:
    """Coverage of the error band held out by source: the calibrated level (each source's level chosen without it)
    against the nominal one (the central 80% of the other sources' errors), overall and per regime, with widths."""

    nominal = band_hits(report, BAND_COVERAGE)
    out = ["## Error band coverage", "",
           f"Each source's rows against the band built from the other sources' LOSO residuals. Nominal: the central "
           f"{BAND_COVERAGE:.0%} of those residuals per regime, each source weighing the same "
           "(planner/bands.py source_weighted_quantile). Calibrated: the central quantile level at which the "
           f"bands cover >= {BAND_COVERAGE:.0%} of held-out rows, chosen for each source on the other sources only "
           f"(nested leave-one-source-out), so the coverage below is out of sample; the shipped table uses the level "
           f"chosen on every source, {shipped_band_level(report):.0%}. Width: (high - low) / predicted step time.", "",
           "| regime | rows | inside, nominal | median width, nominal | inside, calibrated | median width, calibrated |",
           "|---|---|---|---|---|---|"]
    keys = [("", lambda h: "all rows"), ("family", lambda h: h.result.case.family),
            ("GPU", lambda h: h.result.case.gpu_generation), ("scale", lambda h: scale_bucket(h.result.case.num_gpus))]
    for title, key in keys:
        for g in sorted({key(h) for h in hits}):
            nom, cal = [h for h in nominal if key(h) == g], [h for h in hits if key(h) == g]
            label = f"{title}: {g}" if title else g
            out.append(f"| {label} | {len(cal)} | {_coverage_cells(nom)} | {_coverage_cells(cal)} |")
    chosen = ", ".join(f"{v:.0%}" for v in sorted(set(levels.values())))
    per_source: dict[str, list[bool]] = {}
    for h in hits:
        per_source.setdefault(h.result.case.source, []).append(h.inside)
    weighted = statistics.fmean(sum(v) / len(v) for v in per_source.values())
    return out + ["", f"- Levels chosen with one source held out: {chosen}.",
                  f"- Each source weighing the same (a new setup is a new source), the calibrated bands hold "
                  f"{_pct(weighted)} of a held-out source's rows (mean over {len(per_source)} sources); the rows "
                  f"pooled, {_pct(sum(h.inside for h in hits) / len(hits))}, where the largest source's "
                  f"{len(max(per_source.values(), key=len)) / len(hits):.0%} of the rows weigh most.",
                  f"- A regime has a band of its own only with rows from {MIN_SOURCES} sources (planner/bands.py "
                  "MIN_SOURCES, 2 before 2026-12-07): that choice was made looking at these two coverages (86.2% "
                  "and 71.0% with two) and at the outside probes', so they are not blind to it; no knob or level "
                  "was set on them."]


def _gib(gib: float | None) -> str:
    """GiB with one decimal ("-" when not predicted)."""
    return "-" if gib is None else f"{gib:.1f}"


def _vtrain_section(vt, table: dict) -> list[str]:
    """vTrain's figures, and how many rows lie inside their band in `table` (the band table this run ships)."""
    from planner.validation_vtrain import VTRAIN_ASSUMPTIONS, shipped_band_coverage

    cov = shipped_band_coverage(vt.results, table)
    out = ["## Second validation set: vTrain's measured multi-node runs (fully held out)", "",
           f"{len(vt.results)} measured Megatron-DeepSpeed runs on 64-512 A100 GPUs (planner/data/VTRAIN_SOURCE.md), "
           "predicted with the knobs fitted on the published runs above; no knob's value was chosen on these rows. Not "
           "every model form was chosen blind to them: the GEMM shape term (cost_models/stage.py "
           "gemm_shape_factor) came in after their per-model bias (-14.0% GPT 3.6B to +5.9% GPT 175B) and "
           "llm-foundry's width trend were seen. Targets: mean |error| <= 12%, |bias| <= 5%, regret <= 1% mean "
           "and <= 3% worst.", "",
           f"- mean |error| **{_pct(vt.mean_abs_error)}**, bias (mean signed error) **{vt.bias * 100:+.1f}%**, "
           f"false out-of-memory verdicts {vt.false_oom}.",
           f"- regret of the pick (the layout the model ranks fastest among each model's measured layouts; its "
           f"measured time over the best measured time): mean **{_pct(statistics.fmean(vt.regret.values()))}**, "
           f"worst **{_pct(max(vt.regret.values()))}**; "
           + ", ".join(f"{k} {_pct(v)}" for k, v in vt.regret.items()) + ".",
           f"- pairs of layouts (one model, different measured times) the predictions order as measured: "
           f"{vt.pairs_ordered[0]} of {vt.pairs_ordered[1]} ({_pct(vt.pair_accuracy)}); the regret judges the pick "
           "alone, and a pick among layouts measured within a few percent of each other is close to a coin flip.",
           f"- the shipped step-time band of each row's regime (as `estimate` shows it) holds the measured step "
           f"of {cov.inside} of {cov.rows} rows ({_pct(cov.inside / cov.rows)}; median width "
           f"{_pct(cov.median_width)}): the band's coverage on runs none of its residuals came from, against "
           f"{_pct(BAND_COVERAGE)} aimed at.", ""]
    out += _vtrain_picks(vt) + [""] + _vtrain_error_groups(vt) + [""]
    out += [f"- {a}" for a in VTRAIN_ASSUMPTIONS]
    return out


def _vtrain_layout(result) -> str:
    f = result.case.layout_fields
    return f"tp={f['tp']},dp={f['dp']},pp={f['pp']},mbs={f['micro_batch_size']}"


def _vtrain_picks(vt) -> list[str]:
    from planner.validation_vtrain import by_model, pick_and_best

    out = ["| model | pick (predicted fastest) | its predicted s | its measured s | best measured layout | "
           "its predicted s | its measured s | regret |", "|---|---|---|---|---|---|---|---|"]
    for name, rows in by_model(vt.results).items():
        pick, best = pick_and_best(rows)
        out.append(f"| {name} | {_vtrain_layout(pick)} | {pick.predicted_step_seconds:.2f} | "
                   f"{pick.case.measured_step_seconds:.2f} | {_vtrain_layout(best)} | {best.predicted_step_seconds:.2f}"
                   f" | {best.case.measured_step_seconds:.2f} | {_pct(vt.regret[name])} |")
    return out


def _vtrain_error_groups(vt) -> list[str]:
    """Where the error sits, by layout degree: a user whose layout is in a group with a large bias knows which way
    to read the number (these rows are held out: nothing is corrected with them)."""
    from planner.validation_vtrain import error_groups, model_billions

    out = ["Where the error sits (mean signed error: negative, predicted too fast). Tensor parallelism 16 spans two "
           "nodes.", "", "| grouped by | value | rows | bias | mean abs error |", "|---|---|---|---|---|"]
    groupings = (("model", lambda r: r.case.model.name, model_billions),
                 ("tensor parallel", lambda r: r.case.layout_fields["tp"], None),
                 ("pipeline parallel", lambda r: r.case.layout_fields["pp"], None))
    for title, key, order in groupings:
        out += [f"| {title} | {g.key} | {g.rows} | {g.bias * 100:+.1f}% | {_pct(g.mean_abs_error)} |"
                for g in error_groups(vt.results, key, order=order)]
    return out


def _summary_bullets(report: Report, s: dict, hits: list[BandHit]) -> list[str]:
    inside, total = sum(h.inside for h in hits), len(hits)
    knobs = ", ".join(f"{k} = {v:g}" for k, v in report.knobs.items())
    return [
        f"- False out-of-memory verdicts (a run that ran, judged 'does not fit'): **{s['false_out_of_memory']}**.",
        f"- Error band coverage (held out twice, below): {inside} of {total} rows ({_pct(inside / total)}) lie "
        f"inside their band; the shipped band takes the central {shipped_band_level(report):.0%} of each regime's "
        "LOSO errors, each source weighing the same (planner/bands.py).",
        f"- Memory: {s['memory_rows']} rows with a measured peak, median |error| {_pct(s['memory_median_abs_error'])},"
        f" worst under-prediction {_pct(s['memory_worst_under_prediction'])} (table below; median |error| "
        f"{_pct(s['memory_median_abs_error_if_printed_gb_is_1e9_bytes'])} if the printed GB were 10^9 bytes).",
        f"- Rows skipped: {s['rows_skipped']} (reasons below).",
        f"- Knobs fitted on every source (shipped defaults): {knobs}. Each fold's choice is listed below.",
    ]


def render_markdown(report: Report, *, runs_path: str, planner_section: str = "", vtrain=None) -> str:
    s = summary(report)
    hits, levels = nested_band_coverage(report)
    out = [
        "# Validation against published training runs",
        "",
        f"Generated by `make validate` (`planner validate --runs {runs_path}`). Do not edit by hand.",
        "",
        "Each throughput row is predicted with the layout it was published with and the framework profile of the",
        "software that ran it; the error is (predicted - measured) / measured step time (tokens/s and TFLOP/s rows",
        "converted to step time with the source's own formula). **Leave-one-source-out (LOSO):** every fitted knob",
        "is chosen by a grid search on the other sources only, and each source's rows are predicted with the knobs",
        "chosen without it. The LOSO figures are the ones to trust. Targets (issue #10): LOSO median <= 10%,",
        "90th percentile <= 25%, zero false out-of-memory verdicts.",
        "",
        "## Summary",
        "",
        "| | rows | median abs error | 90th percentile |",
        "|---|---|---|---|",
        f"| **LOSO (held out by source)** | {s['rows_evaluated']} | **{_pct(s['loso_median_abs_error'])}** | "
        f"**{_pct(s['loso_p90_abs_error'])}** |",
        f"| knobs fitted on every source (in-sample) | {s['rows_evaluated']} | "
        f"{_pct(s['fitted_on_all_median_abs_error'])} | {_pct(s['fitted_on_all_p90_abs_error'])} |",
        "",
        *_summary_bullets(report, s, hits),
        "",
    ]
    out += _group_table("framework family", s["by_family"]) + [""]
    out += _group_table("GPU generation", s["by_gpu_generation"]) + [""]
    out += _group_table("source", s["by_source"]) + [""]
    out += ["## Knobs chosen in each fold", "", "| held-out source | knobs chosen without it |", "|---|---|"]
    loso = report.loso
    if loso is not None:
        out += [f"| {src} | {', '.join(f'{k} = {v:g}' for k, v in loso.points[i].items())} |"
                for src, i in loso.fold_choice.items()]
    out += [""]
    if vtrain is not None:
        out += _vtrain_section(vtrain, shipped_band_table(report)) + [""]
    out += _memory_section(report)
    out += ["", *_band_section(report, hits, levels)]
    out += ["", "## Assumptions for fields a source did not print", ""]
    out += [f"- {a}" for a in ASSUMPTIONS]
    bad = sorted(((r.loso_error, r.case.row_id) for r in report.results
                  if r.loso_error is not None and abs(r.loso_error) > 0.25), key=lambda pair: pair[0])
    out += ["", "## Rows off by more than 25% (LOSO)", ""]
    out += [f"- `{row_id}`: {e * 100:+.1f}%" for e, row_id in bad] or ["- none"]
    if planner_section:
        out += ["", planner_section]
    from planner.validation_modern import modern_section

    out += ["", *modern_section(report)]
    out += _rows_section(report)
    return "\n".join(out) + "\n"


def _rows_section(report: Report) -> list[str]:
    out = ["", "## Every evaluated row", "",
           "| row | measured from | layout used | measured s | predicted s | error | LOSO error | device mem GiB "
           "| measured mem GB | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report.results:
        c = r.case
        lay = r.layout.short() if r.layout else "-"
        if c.searched:
            lay += f" (searched: {', '.join(c.searched)})"
        if c.inferred:
            lay += f" ({'; '.join(c.inferred)})"
        out.append(
            f"| {c.row_id} | {c.measured_basis} | {lay} | {c.measured_step_seconds:.3g} | "
            f"{'-' if r.predicted_step_seconds is None else f'{r.predicted_step_seconds:.3g}'} | "
            f"{'-' if r.error is None else f'{r.error * 100:+.1f}%'} | "
            f"{'-' if r.loso_error is None else f'{r.loso_error * 100:+.1f}%'} | "
            f"{'-' if r.predicted_memory_gib is None else f'{r.predicted_memory_gib:.1f}'} | "
            f"{c.measured_memory_gib or '-'} | {fit_verdict_of_result(r)} |")
    out += ["", "## Skipped rows", "", "| row | reason |", "|---|---|"]
    out += [f"| {rid} | {why} |" for rid, why in report.skipped]
    return out


def write_band_table(report: Report) -> Path:
    """planner/data/error_bands.json: the band table `planner.bands.prediction_band` reads, with the knobs fitted
    on every source (the profiles' and Knobs' shipped values must equal them: tests/test_validation.py)."""

    table = shipped_band_table(report)
    table["fitted_knobs"] = report.knobs
    table["generated_by"] = "make validate (planner validate): LOSO residuals of ../shared/validation"
    path = Path(__file__).parent / "data" / BANDS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
