"""The held-out MoE validation set (planner/data/moe_runs.json): every row sourced and self-consistent, evaluated
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
    shared = ROOT.parent / "shared" / "validation" / "published_runs.json"
    rows = json.loads(shared.read_text())
    ids = {r.get("id") for r in rows}
    assert not ids & {r["id"] for r in RUNS["rows"]}
    from planner.validation import build_case

    assert all(isinstance(build_case(r), str) for r in rows if r.get("moe") or (r.get("ep") or 1) > 1)


def test_every_row_is_evaluated_and_reported():
    results = moe_results()
    assert len(results) == len(RUNS["rows"]) >= 12
    assert all(r.error is not None and r.fits for r in results)  # each row ran, so none may be judged OOM
    lines = moe_section(results)
    summary = next(line for line in lines if line.startswith("- MoE (held out)"))
    assert f"{len(results)} rows" in summary and "false OOM 0" in summary
    # the node-limited DeepSeek-V3 layout (EP 64 over 8 nodes) is within 15% of the report's arithmetic
    ds = next(r for r in results if r.case.row_id == "deepseek-v3-report-h800-2048gpu")
    assert abs(ds.error) < 0.15


def test_the_document_is_current():
    """docs/validation-modern.md's held-out MoE section is what the code produces now."""
    doc = (ROOT / "docs" / "validation-modern.md").read_text()
    for line in moe_section(moe_results()):
        assert line in doc
