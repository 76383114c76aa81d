"""The MoE validation set (planner/data/moe_runs.json): every row sourced and self-consistent, evaluated
through planner/validation_modern.py, and never part of the fit."""

import json
from pathlib import Path

import pytest

from planner.validation_modern import load_moe_runs, moe_case, moe_results, moe_section

RUNS = load_moe_runs()
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("row", RUNS["rows"], ids=lambda r: r["id"])
def test_rows_are_sourced_and_multiply_out(row):
    source = RUNS["sources"][row["source"]]
    assert source["url"].startswith("https://") and row["locator"]
    lay = row["layout"]
    degrees = lay.get("tp", 1) * lay.get("pp", 1) * lay.get("cp", 1)
    assert row["gpus"] % degrees == 0  # dp = GPUs / (tp pp cp) is whole (modern-training.md §8.10: flag, never fit)
    dp = row["gpus"] // degrees
    assert (dp * lay.get("cp", 1) * lay.get("tp", 1)) % (lay["ep"] * lay.get("etp", 1)) == 0  # EP folds into DP·CP·TP
    case = moe_case(row, RUNS)
    assert case.model.moe is not None
    assert case.measured_step_seconds * row["tokens_per_sec_per_gpu"] * row["gpus"] == pytest.approx(
        row["global_batch_size"] * row["seq_length"])


def test_deepseek_v3_report_row_is_table_1_arithmetic():
    """DeepSeek-V3 Table 1: 180K H800 GPU-hours per trillion tokens -> 1e12 / (180e3 x 3600) = 1543 tokens/s/GPU;
    at batch 15360 x 4096 on 2048 GPUs that is a 19.9 s step (modern-training.md §3.8)."""
    row = next(r for r in RUNS["rows"] if r["source"] == "deepseek-v3-report")
    assert row["tokens_per_sec_per_gpu"] == round(1e12 / (180e3 * 3600))
    assert moe_case(row, RUNS).measured_step_seconds == pytest.approx(19.9, abs=0.05)


def test_no_moe_row_is_in_the_fitted_set():
    """Held out: none of these ids (or their model/GPU/layout) appears among the shared published runs the knobs are
    fitted on, where MoE rows are skipped."""
    from tests.conftest import VALIDATION, require_shared

    rows = json.loads(require_shared(VALIDATION).read_text())
    ids = {r.get("id") for r in rows}
    assert not ids & {r["id"] for r in RUNS["rows"]}
    from planner.validation import build_case

    assert all(isinstance(build_case(r), str) for r in rows if r.get("moe") or (r.get("ep") or 1) > 1)


def test_every_row_is_evaluated_and_reported():
    results = moe_results()
    assert len(results) == len(RUNS["rows"]) >= 12
    assert all(r.error is not None and r.fits for r in results)  # each row ran, so none may be judged OOM
    lines = moe_section(results)
    summary = next(line for line in lines if line.startswith("- MoE (leave-one-model-out)"))
    assert f"{len(results)} rows" in summary and "false OOM 0" in summary
    # the node-limited DeepSeek-V3 layout (EP 64 over 8 nodes) is within 15% of the report's arithmetic
    ds = next(r for r in results if r.case.row_id == "deepseek-v3-report-h800-2048gpu")
    assert abs(ds.error) < 0.15


def test_the_document_is_current():
    """docs/validation-modern.md's MoE section is what the code produces now."""
    doc = (ROOT / "docs" / "validation-modern.md").read_text()
    for line in moe_section(moe_results()):
        assert line in doc


def test_per_expert_kernel_seconds_by_hand():
    """Qwen3-30B-A3B at EP 8 in FP8: 128/8 = 16 local experts, each 4 kernels forward (fc1 and fc2 GEMMs, each
    with its input cast) and 6 backward (dgrad and wgrad of both, two output-gradient casts): at 44 GFLOP per kernel
    and a 1 PFLOP/s GEMM rate, 16 x 4 x 44 us forward and 16 x 6 x 44 us backward."""
    from cost_models.moe import expert_kernel_seconds

    fwd, bwd = expert_kernel_seconds(local_experts=16, fp8=True, kernel_gflop=44.0, rate_flops_per_second=1e15)
    assert (fwd, bwd) == pytest.approx((16 * 4 * 44e-6, 16 * 6 * 44e-6), rel=1e-12)
    # BF16: the GEMMs only (2 forward, 4 backward)
    assert expert_kernel_seconds(local_experts=2, fp8=False, kernel_gflop=1.0, rate_flops_per_second=1e9) == (4.0, 8.0)


def test_the_kernel_cost_is_fitted_without_the_rows_it_judges():
    """Leave-one-model-out: a model's rows are judged with the value fitted on the other models' rows, so changing
    what that model's rows measured cannot move it; the profiles ship the all-rows fit."""
    import copy

    from planner.frameworks.profiles import MEGATRON_EXPERT_KERNEL_GFLOP, profile_knobs
    from planner.validation_modern import moe_kernel_fit

    _, fold = moe_kernel_fit(RUNS)
    assert fold[None] == MEGATRON_EXPERT_KERNEL_GFLOP
    for fw in ("megatron", "nemo"):
        assert profile_knobs(fw).moe_expert_kernel_gflop == MEGATRON_EXPERT_KERNEL_GFLOP
    for fw in ("torchtitan", "generic", "deepspeed"):  # one torch._grouped_mm / no GroupedLinear: no per-expert term
        assert profile_knobs(fw).moe_expert_kernel_gflop == 0.0
    changed = copy.deepcopy(RUNS)
    for row in changed["rows"]:
        if row["model"] == "qwen3-30b-a3b":
            row["tokens_per_sec_per_gpu"] *= 3  # as if these runs had been 3x faster
    _, fold2 = moe_kernel_fit(changed)
    assert fold2["qwen3-30b-a3b"] == fold["qwen3-30b-a3b"]
    assert fold2["qwen3-235b-a22b"] != fold["qwen3-235b-a22b"] or fold2[None] != fold[None]
    notes = {r.case.row_id: r.note for r in moe_results()}
    for row in RUNS["rows"]:
        assert notes[row["id"]] == f"kernel {fold[row['model']]:g} GFLOP"


def test_dense_layers_have_no_per_expert_term():
    """The term only exists where a layer has experts: a dense model under the Megatron profile estimates the same
    with and without it."""
    from dataclasses import replace

    from planner.estimate import build_problem, layout_from_arg

    problem = build_problem("dgx-h100", 1, "llama3-8b", 16, 8192, "bf16", framework="megatron")
    lay = layout_from_arg("dp=8,zero=1,mbs=2,recompute=full", problem)
    off = replace(problem, knobs=replace(problem.knobs, moe_expert_kernel_gflop=0.0))
    assert problem.knobs.moe_expert_kernel_gflop > 0
    assert problem.estimate(lay).step_seconds == off.estimate(lay).step_seconds
