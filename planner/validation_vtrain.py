"""A second, fully held-out validation set: vTrain's 109 measured multi-node Megatron-DeepSpeed runs on A100.

planner/data/vtrain_ground_truth_multi.csv (source and setup: planner/data/VTRAIN_SOURCE.md). No knob is fitted
on these rows: they are predicted with the knobs fitted on ../shared/validation (all sources), so every figure
here is out of sample. Reported: mean |error|, bias (mean signed error), and per model the regret of the
planner's pick among the measured layouts (measured time of the layout the model ranks fastest over the best
measured time), and the share of each model's layout pairs the predictions order as measured.
"""

from __future__ import annotations

import csv
import itertools
import math
import statistics
from dataclasses import dataclass, replace
from importlib import resources

from cluster_specs import ClusterSpec
from cost_models.inputs import Knobs
from planner.bands import DOES_NOT_FIT, fit_verdict_of_result
from planner.inputs.specs import ModelSpec, TrainingSpec
from planner.validation import Case, CaseResult, _cluster_json, band_hit, case_knobs, evaluate, family_knobs

VTRAIN_SOURCE = "vTrain (Bang et al., MICRO 2024) data/ground_truth_multi.csv"
VTRAIN_ASSUMPTIONS = [
    "GPT-3 architecture as vTrain's ShardedGptModel: GeLU MLP (4h), LayerNorm, learned positions, tied "
    "embeddings, biases, dropout, vocabulary 50257 (src/config.py), unfused attention (Megatron-LM, no flash).",
    "Activation checkpointing: full, every layer (use_checkpoint: true in every config/validation/multi file).",
    "No DP overlap: use_gradient_bucket false (the gradient all-reduce runs after backward): the megatron "
    "profile without its overlap flags.",
    "Megatron-LM's defaults of 2022-23 (no sequence parallelism): the backward input-gradient all-reduces of the "
    "column-parallel linears overlap their weight-gradient GEMMs (async tensor-parallel all-reduce, default since "
    "commit 3f65246911, 2021-09); pipeline sends scatter/gather b s h / t per rank (default until commit 3c92fa93b5, "
    "2023-03) [U: the runs were 'collected using Megatron-DeepSpeed codebase' (vTrain data/README.md), whose commit "
    "and launch flags are not printed; under DeepSpeed's engine (--deepspeed) Megatron-DeepSpeed turns the async "
    "all-reduce off (megatron/arguments.py, microsoft/Megatron-DeepSpeed 4822c87e, 2023-09), which predicts these "
    "runs at mean |error| 9.3%, bias -1.2% and the same picks. docker/Dockerfile (PyTorch 2.0.1) builds vTrain's "
    "profiler, not these runs].",
    "A100 SXM4 80 GB [U: the memory size is not printed], 8 per node, NVLink inside a node, 4 x 200 Gb/s "
    "(inter_node_bandwidth 800 Gb/s per node) between nodes; fp16 mixed precision [U: same tensor-core peak "
    "as bf16 on A100].",
]


def _cluster(num_gpus: int) -> ClusterSpec:
    spec = _cluster_json("dgx-a100-80gb")
    spec["inter_node"] = {"kind": "infiniband", "nics_per_node": 4, "nic_gbit_per_s": 200.0, "efficiency": 0.9,
                          "latency_us": 10.0}
    spec["num_nodes"] = max(1, num_gpus // spec["gpus_per_node"])
    return ClusterSpec.model_validate(spec)


def _knobs() -> Knobs:
    """The megatron-classic family's knobs (no DP/TP/PP overlap flags) with the async TP all-reduce of the
    Megatron-LM these runs used (VTRAIN_ASSUMPTIONS)."""
    return replace(family_knobs("megatron-classic", "fp16"), tp_async_grad_allreduce=True)


def _case(i: int, row: dict[str, str]) -> Case:
    h, a, L = int(row["hidden size"]), int(row["attention heads"]), int(row["# layers"])
    s, gbs, mbs = int(row["sequence length"]), int(row["global batch"]), int(row["micro batch"])
    tp, dp, pp = int(row["tensor parallelism"]), int(row["data parallelism"]), int(row["pipeline parallelism"])
    name = f"GPT {row['Parameters (billion)']}B"
    model = ModelSpec.model_validate({
        "name": name, "num_layers": L, "hidden_size": h, "num_attention_heads": a, "num_kv_heads": a,
        "vocab_size": 50257, "ffn_hidden_size": 4 * h, "attention": "standard", "max_position_embeddings": s,
        "mlp": "gelu", "norm": "layernorm", "tied_embeddings": True, "bias": True, "position_embedding": "learned",
        "dropout": True})
    training = TrainingSpec(global_batch_size=gbs, seq_length=s, precision="fp16")
    fields = {"tp": tp, "pp": pp, "dp": dp, "zero_stage": 0, "micro_batch_size": mbs,
              "num_micro_batches": gbs // (mbs * dp), "recompute": "full", "sequence_parallel": False}
    return Case(f"vtrain-{i:03d}-{name.split()[1]}-t{tp}d{dp}p{pp}-mbs{mbs}", VTRAIN_SOURCE, model, training,
                _cluster(int(row["# GPUs"])), fields, _knobs(),
                float(row["iteration time (ms)"]) / 1e3, "iteration time", None, family="megatron-classic")


def vtrain_cases() -> list[Case]:
    text = resources.files("planner.data").joinpath("vtrain_ground_truth_multi.csv").read_text(encoding="utf-8")
    return [_case(i, row) for i, row in enumerate(csv.DictReader(text.splitlines()))]


@dataclass
class VTrainReport:
    results: list[CaseResult]
    mean_abs_error: float
    bias: float  # mean signed error; negative: predicted too fast
    regret: dict[str, float]  # model -> measured(pick) / best measured - 1
    false_oom: int
    pairs_ordered: tuple[int, int] = (0, 0)  # (layout pairs of one model ordered as measured, pairs compared)

    @property
    def pair_accuracy(self) -> float:
        return self.pairs_ordered[0] / self.pairs_ordered[1] if self.pairs_ordered[1] else math.nan


def ordered_pairs(rows: list[CaseResult]) -> tuple[int, int]:
    """(pairs the predictions order as the measurements do, pairs compared) over every two layouts of one model
    with different measured times: the whole ranking, where the regret looks at the pick only."""
    good = total = 0
    for a, b in itertools.combinations(rows, 2):
        pa, pb = a.predicted_step_seconds, b.predicted_step_seconds
        ma, mb = a.case.measured_step_seconds, b.case.measured_step_seconds
        if pa is None or pb is None or ma == mb:
            continue
        total += 1
        good += (pa < pb) == (ma < mb)
    return good, total


def pick_and_best(rows: list[CaseResult]) -> tuple[CaseResult, CaseResult]:
    """(the planner's pick: the layout predicted fastest, the layout measured fastest) among one model's rows."""
    ok = [r for r in rows if r.predicted_step_seconds is not None]
    pick = min(ok, key=lambda r: r.predicted_step_seconds if r.predicted_step_seconds is not None else math.inf)
    return pick, min(ok, key=lambda r: r.case.measured_step_seconds)


@dataclass(frozen=True)
class ErrorGroup:
    key: object  # what key(result) returned
    rows: int
    bias: float  # mean signed error
    mean_abs_error: float


def error_groups(results: list[CaseResult], key, *, order=None) -> list[ErrorGroup]:
    """Mean signed and mean |error| of the predicted rows grouped by key(result), in the keys' sorted order (of
    order(key) where given): where in the layout space the model is off, not only by how much."""
    groups: dict = {}
    for r in results:
        if r.error is not None:
            groups.setdefault(key(r), []).append(r.error)
    ranked = sorted(groups, key=order) if order else sorted(groups)
    return [ErrorGroup(k, len(groups[k]), statistics.fmean(groups[k]), statistics.fmean(abs(x) for x in groups[k]))
            for k in ranked]


@dataclass(frozen=True)
class BandCoverage:
    inside: int  # rows whose measured step lies inside the band of their regime
    rows: int
    median_width: float  # (high - low) / predicted step time


def shipped_band_coverage(results: list[CaseResult], table: dict) -> BandCoverage:
    """The step-time band `table` gives each predicted row's regime (framework family, GPU generation, scale), as
    `estimate` shows it, against its measured step: the band checked on runs none of its residuals came from."""
    hits = [band_hit(table, r, r.predicted_step_seconds) for r in results if r.predicted_step_seconds is not None]
    return BandCoverage(sum(h.inside for h in hits), len(hits),
                        statistics.median(h.width for h in hits) if hits else math.nan)


def model_billions(name: str) -> float:
    """The parameter count in a model name _case built ('GPT 18.4B' -> 18.4), to order models by size."""
    return float(name.split()[-1].rstrip("B"))


def by_model(results: list[CaseResult]) -> dict[str, list[CaseResult]]:
    out: dict[str, list[CaseResult]] = {}
    for r in results:
        out.setdefault(r.case.model.name, []).append(r)
    return out


def run_vtrain(fitted: dict[str, float]) -> VTrainReport:
    results = [evaluate(c, case_knobs(c, fitted)) for c in vtrain_cases()]
    errs = [r.error for r in results if r.error is not None]
    models = by_model(results)
    regret = {}
    for name, rows in models.items():
        pick, best = pick_and_best(rows)
        regret[name] = pick.case.measured_step_seconds / best.case.measured_step_seconds - 1
    pairs = [ordered_pairs(rows) for rows in models.values()]
    oom = sum(1 for r in results if fit_verdict_of_result(r) == DOES_NOT_FIT)
    return VTrainReport(results, statistics.fmean(abs(e) for e in errs), statistics.fmean(errs), regret, oom,
                        (sum(p[0] for p in pairs), sum(p[1] for p in pairs)))
