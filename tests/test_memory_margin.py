"""`plan --memory-margin`: by default every candidate must fit with its predicted peak raised to the memory band's
high end (planner/data/error_bands.json, the 90th percentile of how far printed peaks exceeded the predictions);
`estimate` relaxes that to the point estimate, and the plan says when its pick only fits there."""

import json
import subprocess
import sys
from dataclasses import replace
from importlib import resources

import pytest

from cluster_specs import load_cluster
from planner.bands import memory_high_fraction
from planner.contract import PlanDocument
from planner.errors import InfeasibleError
from planner.inputs.models import load_model
from planner.inputs.specs import TrainingSpec
from planner.problem import Problem, default_knobs
from planner.search import PlanOptions, margin_cost, plan, plan_within_memory_margin, with_memory_margin

GIB = 2**30
OPTS = PlanOptions(use_solver=False, top_k=2)


@pytest.fixture(scope="module")
def one_node_near_full():
    # Gemma 2 9B, 64 x 4096 tokens on one DGX A100 80GB: the fastest layout (tp 2, mbs 2) predicts ~74 GiB, inside
    # 78 GiB (80 minus the 2 GiB headroom) but not once raised to the band's high end (+13.6%: the 90th percentile
    # of how far the 15 printed peaks exceeded their predictions, docs/validation.md)
    return Problem(load_model("gemma2-9b"), TrainingSpec(global_batch_size=64, seq_length=4096, precision="bf16"),
                   load_cluster("dgx-a100-80gb", nodes=1), default_knobs())


def test_band_high_fraction_is_the_validated_one():
    table = json.loads(resources.files("planner.data").joinpath("error_bands.json").read_text())
    assert memory_high_fraction() == table["memory"]["high_fraction"] > 0


def test_band_high_keeps_every_candidate_inside_the_margin(one_node_near_full):
    f = memory_high_fraction()
    problem = with_memory_margin(one_node_near_full, "band-high")
    assert problem.knobs.memory_high_fraction == f
    result = plan(problem, OPTS)
    gpu, headroom = problem.hardware.gpu_memory_bytes, problem.knobs.memory_headroom_bytes
    assert all(c.estimate.peak_memory_bytes * (1 + f) + headroom <= gpu for c in result.ranked)
    # the estimate margin admits a faster layout that is only 'tight' (fits at the estimate, not at the band's high
    # end), and band-high gives it up for one that fits at the high end
    loose = plan(with_memory_margin(one_node_near_full, "estimate"), OPTS)
    assert loose.pick.step_seconds <= result.pick.step_seconds
    assert loose.pick.estimate.peak_memory_bytes * (1 + f) + headroom > gpu
    assert loose.pick.estimate.peak_memory_bytes + headroom <= gpu


def test_plan_document_says_when_the_pick_fits_only_at_the_estimate(one_node_near_full):
    estimate = with_memory_margin(one_node_near_full, "estimate")
    doc = PlanDocument.from_result(estimate, plan(estimate, OPTS), objective="throughput")
    assert (doc.memory_margin, doc.memory_margin_fraction, doc.predicted.fit) == ("estimate", 0.0, "tight")
    assert any(r.startswith("memory: the pick fits only at the estimate") for r in doc.decision.reasons)
    band = with_memory_margin(one_node_near_full, "band-high")
    doc = PlanDocument.from_result(band, plan(band, OPTS), objective="throughput")
    assert (doc.memory_margin, doc.predicted.fit) == ("band-high", "fits")
    assert not any(r.startswith("memory:") for r in doc.decision.reasons)


def test_plan_says_what_the_margin_costs(one_node_near_full):
    # band-high gives up the faster layout that fits only at the estimate: the plan names it, its step time and its
    # memory at both ends, so a user can weigh the speed against the risk of running out of memory
    band = with_memory_margin(one_node_near_full, "band-high")
    result = plan(band, OPTS)
    # here the tight layout (mbs 2, ~74 GiB) is only 0.49% faster than the pick (mbs 1, ~57 GiB): below
    # MARGIN_COST_MIN, the same speed, so the plan does not mention it
    assert margin_cost(band, result, OPTS) is None
    tight = margin_cost(band, result, OPTS, min_gain=0.0)
    assert tight is not None
    assert tight.layout == plan(with_memory_margin(one_node_near_full, "estimate"), OPTS).pick.layout
    assert tight.step_seconds < result.pick.step_seconds
    doc = PlanDocument.from_result(band, result, objective="throughput", margin_cost=tight)
    cost = doc.memory_margin_cost
    assert cost is not None and cost.predicted.fit == "tight" and cost.layout == tight.layout
    line = next(r for r in doc.decision.reasons if r.startswith("memory: the margin costs"))
    assert f"{result.pick.step_seconds / tight.step_seconds - 1:.1%}" in line and tight.layout.short() in line
    # nothing to report under the estimate margin, for another objective, or when the margin moves nothing
    estimate = with_memory_margin(one_node_near_full, "estimate")
    assert margin_cost(estimate, plan(estimate, OPTS), OPTS, min_gain=0.0) is None
    assert margin_cost(band, result, replace(OPTS, objective="memory"), min_gain=0.0) is None
    roomy = replace(band, knobs=replace(band.knobs, memory_high_fraction=1e-6))
    assert margin_cost(roomy, plan(roomy, OPTS), OPTS, min_gain=0.0) is None
    plain = PlanDocument.from_result(band, result, objective="throughput")
    assert plain.memory_margin_cost is None and not any("margin costs" in r for r in plain.decision.reasons)


def test_cli_plan_json_carries_the_margin_cost():
    # Megatron-1T on 64 DGX A100 under Megatron-DeepSpeed: tp 8 x pp 64 ZeRO-0 without recompute is predicted at
    # ~76.4 GiB, inside 78 GiB but not at the band's high end; the pick at the margin is ~18% slower
    out = subprocess.run([sys.executable, "-m", "planner.cli", "plan", "-c", "dgx-a100-80gb", "-n", "64", "-m",
                          "megatron-1t", "-b", "2048", "-s", "2048", "--framework", "megatron-deepspeed", "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    cost = doc["memory_margin_cost"]
    assert cost["predicted"]["fit"] == "tight"
    assert cost["predicted"]["step_time_seconds"] < doc["predicted"]["step_time_seconds"] * (1 - 0.005)
    assert any(r.startswith("memory: the margin costs") for r in doc["decision"]["reasons"])


def test_nothing_fits_at_the_high_end_falls_back_to_the_estimate_and_says_so(one_node_near_full):
    # a margin no layout can meet (peaks raised 100x: under 0.8 GiB per GPU): the plan is made at the estimate and flagged as relaxed
    impossible = replace(one_node_near_full, knobs=replace(one_node_near_full.knobs, memory_high_fraction=100.0))
    with pytest.raises(InfeasibleError):
        plan(impossible, OPTS)
    used, result = plan_within_memory_margin(impossible, OPTS)
    relaxed = result.memory_margin_relaxed
    assert relaxed and used.knobs.memory_high_fraction == 0.0
    doc = PlanDocument.from_result(used, result, objective="throughput", memory_margin_relaxed=relaxed)
    assert doc.memory_margin_relaxed and doc.memory_margin == "estimate"


def test_cli_rejects_an_unknown_margin():
    out = subprocess.run([sys.executable, "-m", "planner.cli", "plan", "-c", "dgx-a100-80gb", "-n", "1", "-m",
                          "llama2-7b", "-b", "64", "-s", "4096", "--memory-margin", "p95"],
                         capture_output=True, text=True)
    assert out.returncode == 3
    assert "--memory-margin: 'p95' -> allowed: band-high, estimate" in out.stderr


def _json_of(capsys, *args) -> dict:
    from planner.cli import main

    with pytest.raises(SystemExit) as done:
        main([*args, "--no-solver", "--json"])
    out, err = capsys.readouterr()
    assert done.value.code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("margin", ["band-high", "estimate"])
def test_compare_and_scaling_pick_what_plan_picks_under_the_same_margin(capsys, margin):
    """compare and scaling once planned at the point estimate whatever `plan` did: their row for Llama 3.1 405B on
    2,048 DGX H100 nodes was the layout `plan` turns down for its memory margin (8% faster, 78.6 GiB at the band's
    high end). Here the margin binds too (Gemma 2 9B on one DGX A100: the fastest layout is 'tight')."""
    shape = ["-m", "gemma2-9b", "-b", "64", "-s", "4096", "--memory-margin", margin]
    planned = _json_of(capsys, "plan", "-c", "dgx-a100-80gb", "-n", "1", *shape)
    compared = _json_of(capsys, "compare", "--clusters", "dgx-a100-80gb:1", *shape)
    scaled = _json_of(capsys, "scaling", "-c", "dgx-a100-80gb", "--node-counts", "1", *shape)
    entry, point = compared["clusters"][0], scaled["curves"][0]["points"][0]
    assert entry["pick"]["layout"] == planned["layout"] == point["layout"]
    assert entry["pick"]["predicted"]["fit"] == planned["predicted"]["fit"] == ("fits" if margin == "band-high"
                                                                                else "tight")
    assert compared["memory_margin"] == scaled["memory_margin"] == margin
    assert not entry["memory_margin_relaxed"] and not point["memory_margin_relaxed"]


def test_compare_and_scaling_say_when_nothing_fitted_under_the_margin(one_node_near_full):
    from planner.decisions import compare, scaling
    from planner.decisions.report import MARGIN_RELAXED

    impossible = replace(one_node_near_full, knobs=replace(one_node_near_full.knobs, memory_high_fraction=100.0))
    cmp = compare.compare([compare.ClusterChoice("dgx-a100-80gb", 1, None)], lambda _c, _n: impossible, OPTS)
    assert cmp.entries[0].feasible and compare.as_json(cmp)["clusters"][0]["memory_margin_relaxed"]
    lines = compare.render_lines(cmp, "t")
    assert MARGIN_RELAXED in " ".join(" ".join(lines).split()) and max(map(len, lines)) <= 80
    curves = scaling.scaling_curves(lambda _n, _b: impossible, OPTS, [1], [64])
    assert scaling.point_json(curves[0].points[0], 1e12)["memory_margin_relaxed"]
    lines = scaling.render_lines(curves, 1e12, False, "t")
    assert " !" in "\n".join(lines) and "fits only at the point estimate" in "\n".join(lines)
    assert max(map(len, lines)) <= 80


def test_tight_says_which_tight_and_check_says_it_too(capsys, tmp_path):
    """'tight' covers two cases, and the text says which (it once said 'fits at the estimate' of a layout at 81.96
    of 80 GiB); check printed PASS with no word of the 'tight' its JSON carried."""
    from planner.cli import main
    from planner.explain.report import TIGHT_AT_ESTIMATE, TIGHT_LIVE_ONLY, fit_text

    assert TIGHT_AT_ESTIMATE in fit_text("tight", True) and TIGHT_LIVE_ONLY in fit_text("tight", False)
    shape = ["-c", "dgx-a100-80gb", "-n", "1", "-m", "gemma2-9b", "-b", "64", "-s", "4096"]
    with pytest.raises(SystemExit):
        main(["estimate", *shape, "--layout", "tp=2,pp=1,dp=4,zero=1,mbs=2,recompute=none,sp=0", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["predicted"]["fit"] == "tight" and doc["predicted"]["fits"] is False  # over the GPU at the estimate
    planned = tmp_path / "plan.json"
    with pytest.raises(SystemExit):
        main(["plan", *shape, "--memory-margin", "estimate", "--no-solver", "--json", "-o", str(planned)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["check", str(planned), *shape])
    out = " ".join(capsys.readouterr().out.split())
    assert done.value.code == 0 and "PASS" in out and f"memory: tight ({TIGHT_AT_ESTIMATE})" in out


def test_does_not_fit_is_judged_against_the_gpu_not_the_headroom():
    """'does not fit' claims the run cannot run, the claim validation's false-OOM count tests (against the GPU's
    memory); the headroom is a margin the user keeps, so it moves a layout from 'fits' to 'tight' and no further
    (planner.bands.fit_verdict). NVIDIA's DGX Cloud Llama 3.1 8B on 8 H100 (tp 1, cp 2, dp 4, no recompute; it ran:
    shared/validation) has live tensors + context + NCCL of 78.6 GiB, between the GPU less the default 2 GiB headroom
    (77.6) and the GPU (79.6): 'tight', as estimate shows it and check passes it, never 'does not fit'."""
    from planner.bands import DOES_NOT_FIT, FITS, TIGHT, fit_verdict

    gib = 2**30
    kw = dict(overhead_bytes=3 * gib, capacity_bytes=80 * gib)
    assert fit_verdict(peak_allocated_bytes=76 * gib, peak_memory_bytes_high=79 * gib, headroom_bytes=2 * gib,
                       **kw) == TIGHT
    assert fit_verdict(peak_allocated_bytes=76 * gib, peak_memory_bytes_high=79 * gib, **kw) == FITS
    assert fit_verdict(peak_allocated_bytes=77.5 * gib, peak_memory_bytes_high=79 * gib, **kw) == DOES_NOT_FIT
    common = ["-c", "dgx-h100", "-n", "1", "-m", "llama3-8b", "-b", "128", "-s", "8192", "--framework", "nemo"]
    layout = "tp=1,pp=1,dp=4,cp=2,zero=1,mbs=1,recompute=none"
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "estimate", *common, "-l", layout, "--json"],
                          capture_output=True, text=True, timeout=120)
    predicted = json.loads(proc.stdout)["predicted"]
    # live tensors + what the device holds outside the allocator (context, NCCL: device peak less reserved)
    outside = predicted["peak_memory_bytes_per_gpu"] - predicted["peak_reserved_bytes_per_gpu"]
    live = (predicted["peak_allocated_bytes_per_gpu"] + outside) / gib
    assert 79.6 - 2.0 < live < 79.6 and not predicted["fits"]  # between the GPU less the headroom and the GPU
    assert predicted["fit"] == "tight"
