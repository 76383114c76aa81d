"""The decisions package: time, cost and energy to train; compare; scaling; sensitivity."""

import json
import math
import subprocess
import sys

import pytest

from planner import errors
from planner.decisions.ranking import RankingBand
from planner.decisions.train import Power, StepTimeBand, training_run


def run(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, timeout=300)


# ---- time, cost and energy to train ----------------------------------------------------------------------

def test_training_run_matches_deepseek_v3_reported_arithmetic():
    # DeepSeek-V3 tech report, Table 1 and §1 (shared/reference/modern-training.md, "Cost" row): 180K H800
    # GPU-hours per trillion tokens = 3.7 days on 2,048 GPUs; 2,788K GPU-hours cost $5.576M at $2 per GPU-hour.
    # A step time chosen so that 1e12 tokens take 180K GPU-hours on 2,048 GPUs must give those figures.
    tokens, per_step, gpus = 1e12, 15_360 * 4096, 2048
    steps = math.ceil(tokens / per_step)
    step = 180e3 * 3600 / gpus / steps
    r = training_run(tokens=tokens, global_batch_size=15_360, seq_length=4096, step_seconds=step, num_gpus=gpus,
                     power=Power(700.0, "test"), price_per_gpu_hour=2.0)
    assert r.steps == steps
    assert r.gpu_hours == pytest.approx(180e3)
    assert r.wall_days == pytest.approx(3.66, abs=0.01)  # "3.7 days"
    assert r.cost == pytest.approx(360e3)
    total = training_run(tokens=1, global_batch_size=1, seq_length=1, step_seconds=2_788e3 * 3600 / gpus,
                         num_gpus=gpus, power=Power(None, "none"), price_per_gpu_hour=2.0)
    assert total.cost == pytest.approx(5.576e6)
    assert total.gpu_energy_kwh is None


def test_energy_is_gpus_times_board_power_times_wall_clock_and_pue_scales_it():
    # 16,384 GPUs x 700 W for 10 days = 16,384 x 0.7 kW x 240 h = 2,752,512 kWh (hand arithmetic)
    r = training_run(tokens=1e6, global_batch_size=1, seq_length=1e6 // 100, step_seconds=864_000 / 100,
                     num_gpus=16_384, power=Power(700.0, "H100 datasheet"), pue=1.2)
    assert r.wall_days == pytest.approx(10.0)
    assert r.gpu_energy_kwh == pytest.approx(2_752_512)
    assert r.facility_energy_kwh == pytest.approx(2_752_512 * 1.2)


def test_the_error_band_carries_through_every_quantity():
    band = StepTimeBand(0.9, 1.25, "test band")
    r = training_run(tokens=1e9, global_batch_size=8, seq_length=1024, step_seconds=2.0, num_gpus=64,
                     power=Power(400.0, "A100"), price_per_gpu_hour=1.5, band=band)
    for key, b in r.bounds().items():
        v = r.quantities()[key]
        if v is None:  # facility energy without a PUE
            assert b is None
            continue
        assert b == (pytest.approx(0.9 * v), pytest.approx(1.25 * v))
    doc = r.as_json()
    assert doc["gpu_hours"]["high"] == pytest.approx(1.25 * r.gpu_hours)
    assert doc["error_band"]["source"] == "test band"
    with pytest.raises(ValueError):
        StepTimeBand(1.2, 1.1, "lower above upper")


def test_catalog_power_has_a_source_for_every_gpu():
    import yaml

    from cluster_specs import load_gpu
    from tests.conftest import ROOT

    names = yaml.safe_load((ROOT / "cluster_specs" / "gpus.yaml").read_text())
    for name in names:
        gpu = load_gpu(name)
        assert gpu.board_power_watts and 100 <= gpu.board_power_watts <= 1200, name
        assert gpu.board_power_source.startswith(("NVIDIA", "HGX")), name  # a named document
    assert load_gpu("H100-SXM").board_power_watts == 700  # NVIDIA H100 SXM datasheet "up to 700 W"
    assert load_gpu("A100-SXM4-80GB").board_power_watts == 400  # NVIDIA A100 SXM datasheet "400 W"


def test_plan_tokens_json_and_text():
    args = ["plan", "-c", "dgx-a100-80gb", "-n", "2", "-m", "llama2-7b", "-b", "64", "-s", "4096", "--no-solver",
            "--tokens", "1e11", "--gpu-hour-price", "2.5"]
    proc = run(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    from planner.contract import PlanDocument

    PlanDocument.model_validate(doc)
    t = doc["training_run"]
    assert t["steps"] == math.ceil(1e11 / (64 * 4096))
    assert t["wall_clock_seconds"]["value"] == pytest.approx(t["steps"] * doc["predicted"]["step_time_seconds"])
    # independent: tokens / tokens per second, within one step
    assert t["wall_clock_seconds"]["value"] == pytest.approx(1e11 / doc["predicted"]["tokens_per_second"], rel=1e-4)
    assert t["cost"]["value"] == pytest.approx(t["gpu_hours"]["value"] * 2.5)
    assert t["gpu_energy_kwh"]["value"] == pytest.approx(16 * 400 * t["wall_clock_seconds"]["value"] / 3.6e6)
    assert t["gpu_board_power_source"].startswith("NVIDIA A100 datasheet")
    assert "cooling and power delivery (PUE)" in t["energy_left_out"]
    text = run(*args).stdout
    assert "wall clock" in text and "GPU-hours" in text and "an upper bound" in text and "left out" in text
    assert max(len(line) for line in text.splitlines()) <= 80


@pytest.mark.parametrize("bad", [["--tokens", "0"], ["--tokens", "nan"], ["--gpu-hour-price", "-1", "--tokens", "1e9"],
                                 ["--pue", "0.5", "--tokens", "1e9"], ["--gpu-hour-price", "2"]])
def test_bad_run_options_are_one_line_input_errors(bad):
    proc = run("plan", "-c", "dgx-a100-80gb", "-n", "1", "-m", "gpt3-1.3b", "-b", "8", "-s", "1024", *bad)
    assert proc.returncode == errors.EXIT_INPUT, proc.stderr
    assert proc.stderr.startswith("error: --") and "Traceback" not in proc.stderr


# ---- which cluster ---------------------------------------------------------------------------------------

def test_parse_clusters():
    from cluster_specs import SpecError
    from planner.decisions.compare import ClusterChoice, parse_clusters

    assert parse_clusters("dgx-a100-80gb:128, dgx-h100:64@2.5", 1.0) == [
        ClusterChoice("dgx-a100-80gb", 128, 1.0), ClusterChoice("dgx-h100", 64, 2.5)]
    with pytest.raises(SpecError) as exc:
        parse_clusters("dgx-h100,dgx-h100:x,dgx-h100:0,dgx-h100:8@-1")
    assert len(exc.value.problems) == 4
    with pytest.raises(SpecError):
        parse_clusters("dgx-h100:8,dgx-h100:8")


@pytest.fixture(scope="module")
def compared():
    proc = run("compare", "--clusters", "dgx-a100-80gb:8@1.2,dgx-h100:4@2.5,dgx-h200:4@3.0", "-m", "llama2-7b",
               "-b", "64", "-s", "4096", "--no-solver", "--tokens", "2e12", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_compare_document_follows_the_contract(compared):
    from planner.contract import CompareDocument
    from tests.conftest import ROOT

    CompareDocument.model_validate(compared)
    assert json.loads(run("schema", "compare").stdout) == json.loads(
        (ROOT / "docs" / "schema" / "compare.schema.json").read_text())


def test_compare_rankings_follow_their_metrics(compared):
    by = {c["label"]: c for c in compared["clusters"]}
    assert all(c["feasible"] for c in by.values())
    tps = {k: c["pick"]["predicted"]["tokens_per_second"] for k, c in by.items()}
    # time to train is tokens / tokens per second: the same order as total throughput
    assert compared["rankings"]["time_to_train"] == sorted(tps, key=lambda k: -tps[k])
    per_gpu = {k: c["pick"]["predicted"]["tokens_per_second_per_gpu"] for k, c in by.items()}
    assert compared["rankings"]["tokens_per_second_per_gpu"] == sorted(per_gpu, key=lambda k: -per_gpu[k])
    for k, c in by.items():
        # GPU-hours per million tokens, derived independently: 1e6 / (tokens/s per GPU) / 3600
        gh = 1e6 / per_gpu[k] / 3600
        assert c["per_million_tokens"]["gpu_hours"] == pytest.approx(gh, rel=1e-3)
        assert c["per_million_tokens"]["cost"] == pytest.approx(gh * c["price_per_gpu_hour"], rel=1e-3)
    cost = {k: c["per_million_tokens"]["cost"] for k, c in by.items()}
    assert compared["priced"] and compared["rankings"]["cost_per_million_tokens"] == sorted(cost, key=cost.get)


def test_compare_pick_is_the_plan_pick(compared):
    proc = run("plan", "-c", "dgx-h100", "-n", "4", "-m", "llama2-7b", "-b", "64", "-s", "4096", "--no-solver", "--json")
    doc = json.loads(proc.stdout)
    entry = next(c for c in compared["clusters"] if c["label"] == "dgx-h100:4")
    assert entry["pick"]["layout"] == doc["layout"]
    assert entry["pick"]["predicted"]["step_time_seconds"] == pytest.approx(doc["predicted"]["step_time_seconds"])


def test_compare_text_fits_80_columns():
    proc = run("compare", "--clusters", "dgx-a100-80gb:2,dgx-h100:1", "-m", "gpt3-1.3b", "-b", "64", "-s", "2048",
               "--no-solver")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("by time to train: 1. ") for line in lines)
    assert "per trillion" in proc.stdout and "GPU-h/Mtok" in proc.stdout  # no budget, no prices: said so
    assert max(len(line) for line in lines if not line.startswith("  tp=")) <= 80


def test_plans_in_worker_processes_are_the_plans_made_one_by_one(monkeypatch):
    from planner.decisions import parallel
    from planner.decisions.parallel import plan_all, workers_for
    from planner.search import PlanOptions, plan

    monkeypatch.setenv("PLANNER_WORKERS", "2")
    # this test process may hold a solver's threads from earlier tests; the workers here run no solver
    monkeypatch.setattr(parallel, "_single_threaded", lambda: True)
    assert workers_for(8) == 2 and workers_for(1) == 1
    problems = [_problem(nodes=1), _problem(nodes=2), _problem(model="mt-nlg-530b", nodes=1, batch=8)]
    opts = PlanOptions(use_solver=False)
    got = plan_all(problems, opts)
    for p, res in zip(problems[:2], got, strict=False):
        ref = plan(p, opts)
        assert res.pick.layout == ref.pick.layout and res.pick.step_seconds == ref.pick.step_seconds
        assert [c.layout for c in res.alternatives] == [c.layout for c in ref.alternatives]
        # reasons survive the process boundary, keyed by the returned candidates
        assert [res.reasons[id(c)] for c in [res.pick, *res.alternatives]] == [
            ref.reasons[id(c)] for c in [ref.pick, *ref.alternatives]]
    assert isinstance(got[2], str) and got[2].startswith("no layout fits")  # 530B on 8 GPUs: why, as text
    monkeypatch.setenv("PLANNER_WORKERS", "1")
    assert workers_for(8) == 1


def test_a_process_with_solver_threads_plans_one_by_one(monkeypatch):
    # a fork copies only the calling thread: after a HiGHS solve (which keeps a thread pool) no worker is forked
    import os

    from planner.decisions.parallel import _single_threaded, workers_for
    from planner.search import PlanOptions, plan

    monkeypatch.setenv("PLANNER_WORKERS", "2")
    result = plan(_problem(model="llama2-13b", nodes=4), PlanOptions())
    assert result.stats.solver_runs >= 1
    assert len(os.listdir("/proc/self/task")) > 1 and not _single_threaded() and workers_for(8) == 1


# ---- how many GPUs ---------------------------------------------------------------------------------------

def test_default_node_counts():
    from planner.decisions.scaling import default_node_counts

    assert default_node_counts(2048) == [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert default_node_counts(2) == [1, 2, 4, 8]


@pytest.fixture(scope="module")
def scaled():
    proc = run("scaling", "-c", "dgx-a100-80gb", "-m", "gpt3-1.3b", "-b", "64", "-s", "2048", "--node-counts",
               "1,2,4,8", "--batch-sizes", "64,256", "--no-solver", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_scaling_document_and_efficiency(scaled):
    from planner.contract import ScalingDocument

    ScalingDocument.model_validate(scaled)
    assert [c["global_batch_size"] for c in scaled["curves"]] == [64, 256]
    for curve in scaled["curves"]:
        pts = curve["points"]
        assert [p["nodes"] for p in pts] == [1, 2, 4, 8] and all(p["feasible"] for p in pts)
        base = pts[0]["tokens_per_second"] / pts[0]["num_gpus"]
        for p in pts:  # efficiency recomputed from tokens/s and GPU counts
            assert p["scaling_efficiency"] == pytest.approx(p["tokens_per_second"] / p["num_gpus"] / base)
            assert p["time_to_train_days"] == pytest.approx(1e12 / p["tokens_per_second"] / 86400)
        below = [p["nodes"] for p in pts if p["scaling_efficiency"] < scaled["stop_efficiency"]]
        assert curve["stops_paying_at_nodes"] == (below[0] if below else None)
    # at batch 64 on 64 GPUs data parallelism runs out (dp <= 64 sequences): the larger batch scales better
    small, large = (c["points"][-1]["scaling_efficiency"] for c in scaled["curves"])
    assert large > small


def test_scaling_point_is_the_plan_pick(scaled):
    doc = json.loads(run("plan", "-c", "dgx-a100-80gb", "-n", "4", "-m", "gpt3-1.3b", "-b", "64", "-s", "2048",
                         "--no-solver", "--json").stdout)
    point = scaled["curves"][0]["points"][2]
    assert point["layout"] == doc["layout"]
    assert point["step_time_seconds"] == pytest.approx(doc["predicted"]["step_time_seconds"])


def test_scaling_and_compare_plan_compiled_with_compile():
    """--compile reaches every point of a sweep as it reaches `plan` (TrainingSpec.compile in the document's
    inputs, the pick faster than eager), and a framework without a compile setting refuses it (exit 3)."""
    args = ["-m", "gpt3-1.3b", "-b", "64", "-s", "2048", "--framework", "torchtitan", "--no-solver", "--json"]
    docs = [json.loads(run("scaling", "-c", "dgx-h100", "--node-counts", "1", *args, *extra).stdout)
            for extra in ([], ["--compile"])]
    assert [d["inputs"]["training"]["compile"] for d in docs] == [False, True]
    eager, compiled = (d["curves"][0]["points"][0]["tokens_per_second"] for d in docs)
    assert compiled > eager
    proc = run("compare", "--clusters", "dgx-h100:1", *args[:-4], "--framework", "megatron", "--compile")
    assert proc.returncode == 3 and "--compile" in proc.stderr


def test_scaling_text_marks_where_it_stops_paying():
    proc = run("scaling", "-c", "dgx-a100-80gb", "-m", "gpt3-1.3b", "-b", "64", "-s", "2048", "--node-counts",
               "1,2,4,8,16", "--no-solver")
    assert proc.returncode == 0, proc.stderr
    assert " <" in proc.stdout and "stops paying" in proc.stdout.replace("\n", " ")
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80


def test_wasteful_pick_says_what_would_help():
    # 1T on 65,536 H100 at batch 3,072 (issue 13): 46% bubble; the pick must say so and offer fewer GPUs / a larger batch
    args = ["plan", "-c", "dgx-h100", "-n", "8192", "-m", "megatron-1t", "-b", "3072", "-s", "2048", "--no-solver"]
    doc = json.loads(run(*args, "--json").stdout)
    u, t = doc["utilisation"], doc["time_breakdown"]
    wasted = (t["pipeline_bubble_seconds"] + t["tp_comm_exposed_seconds"] + t["dp_comm_exposed_seconds"]
              + t["pp_p2p_exposed_seconds"] + t["cp_comm_exposed_seconds"] + t["ep_comm_exposed_seconds"]
              ) / doc["predicted"]["step_time_seconds"]
    assert u["wasted_share"] == pytest.approx(wasted) and u["wasteful"] and wasted >= 0.3
    assert [f["nodes"] for f in u["fewer_gpus"]] == [4096, 2048]
    for f in u["fewer_gpus"]:
        assert 0 < f["relative_throughput"] < 1
        assert f["gpu_hours_change"] == pytest.approx(f["num_gpus"] / 65536 / f["relative_throughput"] - 1)
    assert [b["global_batch_size"] for b in u["larger_batches"]] == [6144, 12288]
    assert all(b["relative_throughput"] > 1 for b in u["larger_batches"])
    target = 0.9 * doc["predicted"]["tokens_per_second"]
    assert u["min_gpus_command"].endswith(f"--objective min-gpus --target-tokens-per-second {target:.0f}")
    text = run(*args, "--no-schedule").stdout
    flat = " ".join(text.replace("\\\n", " ").split())  # the wrapped command read back as one line
    assert "The pick wastes the cluster" in text and u["min_gpus_command"] in flat


def test_a_well_fed_pick_is_not_called_wasteful():
    args = ["plan", "-c", "dgx-a100-80gb", "-n", "1", "-m", "gpt3-1.3b", "-b", "64", "-s", "2048", "--no-solver"]
    doc = json.loads(run(*args, "--json").stdout)
    assert not doc["utilisation"]["wasteful"] and doc["utilisation"]["fewer_gpus"] == []
    assert "wastes" not in run(*args).stdout


# ---- does the pick survive? ------------------------------------------------------------------------------

def _problem(cluster="dgx-a100-80gb", nodes=2, model="gpt3-1.3b", batch=64, seq=2048):
    from cluster_specs import load_cluster
    from planner.inputs.models import load_model
    from planner.inputs.specs import TrainingSpec
    from planner.problem import Problem

    return Problem(load_model(model), TrainingSpec(global_batch_size=batch, seq_length=seq),
                   load_cluster(cluster, nodes=nodes))


def test_perturbations_change_exactly_their_input():
    from planner.decisions import sensitivity as s

    p = _problem()
    assert s._net(p, 0.5).hardware.nic.bandwidth_bytes_per_second == pytest.approx(
        p.hardware.nic.bandwidth_bytes_per_second / 2)
    assert s._net(p, 0.5).hardware.intra_node == p.hardware.intra_node
    assert s._intra(p, 0.5).hardware.intra_node.bandwidth_bytes_per_second == pytest.approx(
        p.hardware.intra_node.bandwidth_bytes_per_second / 2)
    assert s._matmul(p, 1.1).hardware.matmul_efficiency == pytest.approx(p.hardware.matmul_efficiency * 1.1)
    assert s._matmul(_problem("dgx-h100"), 2.0).hardware.matmul_efficiency == 1.0  # capped
    assert s._compute(p, 1.25).knobs.end_to_end_efficiency == pytest.approx(p.knobs.end_to_end_efficiency / 1.25)
    assert s._one_node_fewer(p).cluster.num_nodes == 1
    one = _problem(nodes=1)
    assert s._net(one, 2.0) is None and s._one_node_fewer(one) is None


def test_sensitivity_outcomes_and_regret():
    from planner.decisions import sensitivity as s
    from planner.decisions.train import StepTimeBand
    from planner.search import PlanOptions, _simplicity, plan

    p, opts = _problem(), PlanOptions(use_solver=False)
    result = plan(p, opts)
    band = StepTimeBand(0.9, 1.1, "test band")
    rep = s.sensitivity(p, result, opts, band, RankingBand(0.1, 0.01, 1, "test ranking band"))
    assert rep.tie_tolerance == pytest.approx(0.1)  # the ranking band's, not the step-time band's half width
    assert [o.name for o in rep.outcomes][-1] == "one node fewer" and len(rep.outcomes) == 8
    for sc, o in zip(s.scenarios(band), rep.outcomes, strict=True):
        if o.verdict == "kept":
            assert s.identity(o.new_pick.layout) == s.identity(result.pick.layout)
        if o.original_step_seconds is not None:
            # the original pick re-estimated here, independently, under the same perturbed inputs
            assert o.original_step_seconds == pytest.approx(sc.make(p).estimate(result.pick.layout).step_seconds)
            assert o.regret >= -1e-3  # the new best is the best there (up to the search's 0.1% tie)
    fewer = rep.outcomes[-1]
    assert fewer.original_step_seconds is None and "needs 16 GPUs" in fewer.note
    assert all(c.step_seconds <= result.pick.step_seconds * 1.1 for c in rep.tied)
    near = [c for c in rep.tied[:5] if c.step_seconds <= result.pick.step_seconds * 1.01]
    assert rep.recommended is min(near, key=lambda c: (_simplicity(c.layout), c.step_seconds))
    doc = s.as_json(rep, result.pick)
    from planner.contract import SensitivityReport

    SensitivityReport.model_validate(doc)
    assert doc["short_list_size"] == min(len(rep.tied), 5) == len(doc["short_list"])
    assert doc["short_list"][0] == result.pick.layout.short()
    assert doc["recommended_step_time_vs_pick"] <= 0.01


def test_plan_sensitivity_cli():
    args = ["plan", "-c", "dgx-a100-80gb", "-n", "2", "-m", "gpt3-1.3b", "-b", "64", "-s", "2048", "--no-solver",
            "--sensitivity"]
    doc = json.loads(run(*args, "--json").stdout)
    from planner.contract import PlanDocument

    PlanDocument.model_validate(doc)
    assert [o["perturbation"] for o in doc["sensitivity"]["scenarios"]][:3] == [
        "inter-node bandwidth x0.5", "inter-node bandwidth x2", "intra-node bandwidth x0.5"]
    sens = doc["sensitivity"]
    assert sens["tie_tolerance"] == pytest.approx(0.238, abs=0.001)  # the shipped ranking band (vTrain pairs)
    assert sens["short_list"] == [t["layout_text"] for t in sens["tied"][:5]]
    text = run(*args, "--no-schedule").stdout
    assert "Sensitivity" in text and "regret" in text
    if len(sens["tied"]) > 1:  # the hint writes a plan that carries the short list's tolerance for bench
        flat = " ".join(text.replace("\\\n", " ").split())  # the wrapped command read back as one line
        assert "--sensitivity -o plan.json" in flat and f"--top {sens['short_list_size']}" in flat
    body = text.split("Sensitivity")[1].splitlines()
    assert max(len(line) for line in body if not line.startswith("  ")) <= 80
    start = next((i for i, line in enumerate(body) if line.lstrip().startswith("planner plan")), None)
    if start is not None:  # the command to copy, wrapped with backslashes
        end = next(i for i in range(start, len(body)) if not body[i].endswith("\\"))
        assert max(len(line) for line in body[start:end + 1]) <= 80


def test_ranking_band_of_a_hand_pair():
    from planner.decisions.ranking import band_figures

    # one pair, errors +10% and -10%: the ratio of the predictions is off by 1.1 / 0.9 - 1 = 22.2%
    f = band_figures([[0.1, -0.1], [0.05]])
    assert f["pairs"] == 1 and f["tie_tolerance"] == pytest.approx(1.1 / 0.9 - 1)
    # a bias common to a group cancels: every layout 30% slow predicts every ratio exactly
    assert band_figures([[0.3, 0.3, 0.3]])["tie_tolerance"] == pytest.approx(0.0)


def test_shipped_ranking_band_is_vtrains_and_current():
    # vTrain (Bang et al., MICRO 2024) data/ground_truth_multi.csv: 4 models with 26, 15, 47 and 21 layouts each
    # -> C(26,2) + C(15,2) + C(47,2) + C(21,2) = 325 + 105 + 1081 + 210 = 1,721 pairs; predicted with the shipped
    # knobs (fitted on ../shared/validation, never on vTrain). Recomputed here: the checked-in file is current.
    from planner.decisions.ranking import ranking_band, vtrain_table

    table = vtrain_table()
    assert sorted(table["groups"]) == [15, 21, 26, 47] and table["pairs"] == 1721
    shipped = ranking_band()
    assert shipped.pairs == 1721
    assert shipped.tie_tolerance == pytest.approx(table["tie_tolerance"], rel=1e-9)
    assert shipped.recommend_within == pytest.approx(table["recommend_within"], rel=1e-9)
    # the figures quoted in docs/decisions.md: 80% of pairs within 23.8%, 20% within 2.2% (24.6% / 2.3% while
    # torchtitan's 500 W H100 had the SXM part's 3.35 TB/s, not the 2.4 TB/s HBM2e torchtitan states, which moved the
    # fit back along its ridge, end_to_end_efficiency 0.9 -> 0.875 and gemm_half_efficiency_dim 256 -> 192; 23.8% /
    # 2.2% before torchtitan's FP8 rows gathered their parameters in FP8 as a torchtitan plan does, the move the other
    # way; 19.8% / 2.6%
    # before the GEMM shape term, stage.py gemm_shape_factor, a widening from GPT 39.1B's pairs; 20.3% / 2.6% at the shipped
    # knobs before torchtitan's per-op SAC moved their fit, elementwise_traffic_factor 10 -> 8; 22.3% / 2.2% before
    # Megatron's async TP all-reduce was modelled, 21.9% / 2.1% before unfused attention's score tensors were charged
    # their own kernel traffic)
    assert shipped.tie_tolerance == pytest.approx(0.238, abs=0.001)
    assert shipped.recommend_within == pytest.approx(0.0223, abs=0.001)


def _ties(cluster, nodes, model, batch, seq):
    from planner.decisions import sensitivity as s
    from planner.decisions.ranking import ranking_band
    from planner.search import PlanOptions, plan

    result = plan(_problem(cluster, nodes, model, batch, seq), PlanOptions(use_solver=False))
    band = ranking_band()
    tied = s.tied_layouts(result, band.tie_tolerance)
    return result, tied, s.recommend(tied[:s.SHORT_LIST_MAX], band.recommend_within), band


def test_ampere_above_512_gpus_ties_on_the_ranking_band_not_the_wide_step_band():
    # issue 15 repro: MT-NLG 530B on 280 DGX A100 (2,240 GPUs), batch 1,920 x 2,048. The single-prediction band
    # of regime *|ampere|>512 GPUs (planner/data/error_bands.json) is about -2%/+139%: half its width tied 42
    # layouts and recommended tp4 pp35 dp16 zero0 recompute=full 1f1b, far slower than the pick.
    result, tied, rec, band = _ties("dgx-a100-80gb", 280, "mt-nlg-530b", 1920, 2048)
    pick = result.pick
    assert all(c.step_seconds <= pick.step_seconds * (1 + band.tie_tolerance) for c in tied)
    assert 1 < len(tied) < 42
    assert rec.step_seconds <= pick.step_seconds * (1 + band.recommend_within)  # never much slower
    assert rec.layout.recompute == "none" and rec.layout.schedule == pick.layout.schedule
    assert rec.layout.short() != "tp=4,pp=35,dp=16,zero=0,mbs=1,recompute=full,sp=1,schedule=1f1b"


def test_1t_on_65536_h100_keeps_the_pick_when_simpler_layouts_cost_more_than_a_coin_flip():
    # issue 15: 1T over 65,536 H100 at batch 3,072. The simpler runners-up (ZeRO-0, or pp 128) are predicted
    # 2.9-5.2% slower: beyond the 2.2% within which a slower-predicted layout was still faster in 40% of
    # vTrain's pairs, so the pick stays the recommendation; they are still ties (within 23.8%), on the short list.
    result, tied, rec, band = _ties("dgx-h100", 8192, "megatron-1t", 3072, 2048)
    assert rec is result.pick
    slower = [c.step_seconds / result.pick.step_seconds - 1 for c in tied[1:5]]
    assert all(band.recommend_within < d <= band.tie_tolerance for d in slower), slower


# ---- figures ---------------------------------------------------------------------------------------------

def test_letter_bars_are_exactly_proportional():
    from planner.explain.figures import _bar

    assert _bar([("A", 1.0), ("B", 1.0)], 4.0, 40) == "A" * 10 + "B" * 10
    assert len(_bar([("A", 1 / 3), ("B", 1 / 3), ("C", 1 / 3)], 1.0, 10)) == 10


def test_plan_figures_are_written_and_drawn_in_the_terminal(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "figs"
    proc = run("plan", "-c", "dgx-a100-80gb", "-n", "4", "-m", "llama2-13b", "-b", "64", "-s", "2048", "--no-solver",
               "--figures", str(out), "--no-schedule")
    assert proc.returncode == 0, proc.stderr
    for name in ("memory", "time"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"<svg" in (out / f"{name}.svg").read_bytes()[:400]
    assert "Memory per stage" in proc.stdout and "Time per step" in proc.stdout
    assert "W weights" in proc.stdout  # letters, so the bars read without colour


def test_scaling_and_compare_figures(tmp_path):
    pytest.importorskip("matplotlib")
    png, svg = tmp_path / "s.png", tmp_path / "c.svg"
    assert run("scaling", "-c", "dgx-a100-80gb", "-m", "gpt3-1.3b", "-b", "64", "-s", "2048", "--node-counts", "1,2",
               "--no-solver", "--figure", str(png)).returncode == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert run("compare", "--clusters", "dgx-a100-80gb:1,dgx-h100:1", "-m", "gpt3-1.3b", "-b", "64", "-s", "2048",
               "--no-solver", "--figure", str(svg)).returncode == 0
    assert b"<svg" in svg.read_bytes()[:400]


def test_figures_without_matplotlib_exit_6_and_write_nothing(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from planner import cli\n"
            f"sys.argv = ['planner', 'scaling', '-c', 'dgx-a100-80gb', '-m', 'gpt3-1.3b', '-b', '64', '-s', '2048', "
            f"'--node-counts', '1', '--figure', {str(tmp_path / 'x.png')!r}]\n"
            "cli.main()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == errors.EXIT_MISSING_DEPENDENCY
    assert "pip install 'planner[plots]'" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_figure_suffix_is_checked_first(tmp_path):
    proc = run("compare", "--clusters", "dgx-h100:1", "-m", "gpt3-1.3b", "-b", "8", "-s", "1024",
               "--figure", str(tmp_path / "c.pdf"))
    assert proc.returncode == errors.EXIT_INPUT and ".png or .svg" in proc.stderr


def test_waste_counts_exposed_cp_and_ep_traffic():
    """The wasted share is the bubble plus every exposed communication row the time breakdown has, the CP KV exchange
    and the EP all-to-all included (a DeepSeek-V2 pick on 256 H800s had 20.8% exposed EP and 9.7% else, 30.5% in all,
    and was not called wasteful)."""
    from types import SimpleNamespace

    from planner.decisions.waste import wasted_parts

    t = SimpleNamespace(pipeline_bubble_seconds=0.05, tp_comm_seconds=0.02, dp_comm_seconds=0.02, pp_p2p_seconds=0.01,
                        cp_comm_seconds=0.05, ep_comm_seconds=0.2)
    parts = wasted_parts(SimpleNamespace(step_seconds=1.0, time=t))
    assert sum(parts.values()) == pytest.approx(0.35)
    assert parts["ep_comm_exposed"] == pytest.approx(0.2) and parts["cp_comm_exposed"] == pytest.approx(0.05)


def test_top_zero_lists_no_runners_up():
    doc = json.loads(run("plan", "-c", "dgx-h100", "-n", "1", "-m", "llama3-8b", "-b", "16", "-s", "4096", "--top", "0",
                         "--no-solver", "--json").stdout)
    assert doc["alternatives"] == []
