"""`bench --top K`: which layouts are measured, which one to launch, and the calibration written back (pure)."""

import pytest

from planner.bench.shortlist import DEFAULT_BAND, calibration_document, decide, plan_band, shortlist


def _plan(pick_t, alts, band=None):
    """A plan document; `band` (low, high) relative errors becomes its predicted.step_time_seconds_range, the band
    every plan writes (planner/contract.py Predicted)."""
    lay = {"dp": 8, "tp": 1, "pp": 1}
    doc = {"layout": lay, "predicted": {"step_time_seconds": pick_t},
           "alternatives": [{"layout": {"dp": 8 // t, "tp": t, "pp": 1}, "predicted": {"step_time_seconds": s}}
                            for t, s in alts]}
    if band is not None:
        doc["predicted"]["step_time_seconds_range"] = [pick_t * (1 + band[0]), pick_t * (1 + band[1])]
    return doc


def test_runners_up_are_those_within_the_band_fastest_first():
    doc = _plan(1.0, [(2, 1.12), (4, 1.05), (8, 1.5)])
    entries, rule = shortlist(doc, 5)
    # default band 10%: 1.05 is in, 1.12 and 1.5 are out
    assert [e["predicted_step_seconds"] for e in entries] == [1.0, 1.05]
    assert [e["role"] for e in entries] == ["pick", "runner-up"]
    assert "10%" in rule and "default" in rule
    assert DEFAULT_BAND == 0.10


def test_the_plans_own_band_wins_and_k_caps_the_list():
    doc = _plan(1.0, [(2, 1.12), (4, 1.05), (8, 1.5)], band=[-0.15, 0.2])
    assert plan_band(doc) == (pytest.approx(0.2), "the plan's error band (predicted.step_time_seconds_range)")
    entries, _ = shortlist(doc, 5)
    assert [e["predicted_step_seconds"] for e in entries] == [1.0, 1.05, 1.12]
    entries, _ = shortlist(doc, 2)
    assert [e["predicted_step_seconds"] for e in entries] == [1.0, 1.05]


def test_an_error_band_of_measured_over_predicted_factors():
    doc = _plan(1.0, [(2, 1.12), (4, 1.05)])
    doc["error_band"] = {"lower_factor": 0.85, "upper_factor": 1.3, "source": "LOSO"}
    width, source = plan_band(doc)
    assert width == pytest.approx(0.3) and "LOSO" in source
    assert [e["predicted_step_seconds"] for e in shortlist(doc, 3)[0]] == [1.0, 1.05, 1.12]


def test_launch_the_fastest_measured():
    res = [{"layout_short": "a", "predicted": 1.0, "measured": 1.3}, {"layout_short": "b", "predicted": 1.05, "measured": 1.1}]
    d = decide(res)
    assert d["launch"] == "b" and "18% faster" in d["reason"]  # 1.3 / 1.1 - 1 = 0.18
    assert decide(res[:1])["launch"] == "a"


def test_launch_decision_compares_time_per_sequence():
    """Scaled down to the ranks at hand the short list's layouts ran 4, 4 and 2 sequences a step (dp = nproc /
    (tp pp)); the one that ran half the work was 'fastest' by its raw step (audit of 2026-12-08)."""
    res = [{"layout_short": "a", "predicted": 1.0, "measured": 1.0, "sequences_per_step": 4},
           {"layout_short": "b", "predicted": 1.0, "measured": 0.6, "sequences_per_step": 2}]
    d = decide(res)
    assert d["launch"] == "a" and "per sequence" in d["reason"]


def test_calibration_scales_end_to_end_efficiency_by_the_median_ratio():
    res = [{"layout_short": "a", "predicted": 1.0, "measured": 2.0}, {"layout_short": "b", "predicted": 1.0, "measured": 1.0},
           {"layout_short": "c", "predicted": 3.0, "measured": 4.0}]
    cal = calibration_document({"name": "x", "gpu": "H100", "measured": None}, {"end_to_end_efficiency": 0.8}, res,
                               source="test")
    # ratios 0.5, 1.0, 0.75 -> median 0.75
    assert cal["measured"]["knobs"]["end_to_end_efficiency"] == pytest.approx(0.6)
    assert any("a: predicted 1 s, measured 2 s" in n for n in cal["measured"]["notes"])


def test_each_layout_takes_dp_from_nproc_and_a_runner_up_that_cannot_run_is_skipped():
    pytest.importorskip("torch")
    from planner.bench.session import BenchOptions, fit_shortlist

    base = {"zero_stage": 1, "micro_batch_size": 1, "num_micro_batches": 2}
    entries = [{"layout": dict(base, dp=128, tp=1, pp=1), "role": "pick"},
               {"layout": dict(base, dp=64, tp=2, pp=1), "role": "runner-up"},
               {"layout": dict(base, dp=16, tp=8, pp=1), "role": "runner-up"}]
    kept, layouts, skipped = fit_shortlist(entries, BenchOptions(nproc=4))
    assert [(lay.dp, lay.tp) for lay in layouts] == [(4, 1), (2, 2)]
    assert len(kept) == 2 and len(skipped) == 1 and "--nproc" in skipped[0]
    with pytest.raises(Exception, match="--nproc"):  # the pick itself must run
        fit_shortlist(entries[2:] and [dict(entries[2], role="pick")], BenchOptions(nproc=4))


def test_a_hybrid_sharded_layout_scaled_to_the_machine_shards_over_gcd_of_its_group_and_dp():
    pytest.importorskip("torch")
    from cluster_specs import SpecError
    from planner.bench.session import BenchOptions, fit_layout, fit_shortlist
    from planner.inputs.specs import LayoutSpec

    base = {"zero_stage": 3, "micro_batch_size": 1, "num_micro_batches": 2, "tp": 1, "pp": 1}
    entries = [{"layout": dict(base, dp=1024, dp_shard=2), "role": "pick"},
               {"layout": dict(base, dp=1024, dp_shard=8), "role": "runner-up"}]
    kept, layouts, skipped = fit_shortlist(entries, BenchOptions(nproc=4))
    # 2 replicas x 2 shards on 4 ranks; a group of 8 covers all 4: ZeRO over every rank
    assert [(lay.dp, lay.dp_shard) for lay in layouts] == [(4, 2), (4, None)] and not skipped
    assert fit_layout(LayoutSpec(**dict(base, dp=48, dp_shard=16)), BenchOptions(dp=12)).dp_shard == 4
    with pytest.raises(SpecError, match="hybrid sharding over 8 ranks needs a dp it divides"):
        fit_layout(LayoutSpec.model_construct(**dict(base, dp=12, dp_shard=8)), BenchOptions())


def test_the_plans_tie_tolerance_wins_over_its_error_band():
    # `plan --sensitivity` named a short list with the ranking band (planner/decisions/ranking.py): bench must
    # measure the same layouts, not those within the single-prediction band
    doc = _plan(1.0, [(2, 1.12), (4, 1.05), (8, 1.5)], band=[-0.5, 0.5])
    doc["sensitivity"] = {"tie_tolerance": 0.1}
    assert plan_band(doc)[0] == 0.1
    assert [e["predicted_step_seconds"] for e in shortlist(doc, 5)[0]] == [1.0, 1.05]


def test_a_real_plans_band_sets_the_short_list_not_the_default(tmp_path):
    """The band a plan writes (predicted.step_time_seconds_range) is the one bench reads: it once looked only for
    fields no plan writes and said 'the plan states no error band' with the default 10%."""
    import json

    from planner.cli import main

    out = tmp_path / "plan.json"
    with pytest.raises(SystemExit) as done:
        main(["plan", "-c", "dgx-a100-80gb", "-n", "2", "-m", "gpt3-1.3b", "-b", "64", "-s", "2048", "--json",
              "-o", str(out), "--no-schedule", "--no-solver"])
    assert done.value.code == 0
    doc = json.loads(out.read_text())
    low, high = doc["predicted"]["step_time_seconds_range"]
    t = doc["predicted"]["step_time_seconds"]
    width, source = plan_band(doc)
    assert width == pytest.approx(max(1 - low / t, high / t - 1)) and width != DEFAULT_BAND
    assert "step_time_seconds_range" in source


@pytest.mark.parametrize("rng", [None, [1.2, 0.9], [0.9, float("nan")], ["0.9", 1.1], [0.9], [True, 1.1]])
def test_a_band_that_is_no_interval_around_the_step_falls_back_to_the_default(rng):
    doc = _plan(1.0, [(2, 1.05)])
    doc["predicted"]["step_time_seconds_range"] = rng
    assert plan_band(doc)[0] == DEFAULT_BAND


@pytest.mark.parametrize("planned, scaled_split", [
    # a runner-up of `plan` (Megatron-Core's account-for split of 40 layers over 2 stages x 7 chunks) benched with
    # --layers-per-stage 1: 14 layers, 7 a stage; it was refused ('layers_per_stage: [20, 20] -> ... summing to 14')
    ({"tp": 2, "pp": 2, "dp": 32, "schedule": "interleaved_1f1b", "virtual_stages": 7,
      "layers_per_stage": [20, 20]}, [7, 7]),
    ({"tp": 1, "pp": 4, "dp": 2, "layers_per_stage": [9, 11, 11, 9]}, [1, 1, 1, 1]),
])
def test_a_plans_own_stage_split_follows_the_model_the_benchmark_scales(planned, scaled_split):
    pytest.importorskip("torch")
    from planner.bench.session import bench_layout, scale_model
    from planner.inputs.models import load_model
    from planner.inputs.specs import LayoutSpec, TrainingSpec
    from planner.rules import validate_layout

    model = load_model("llama2-13b")  # 40 layers
    layout = LayoutSpec(**planned, zero_stage=1, micro_batch_size=1, num_micro_batches=8)
    scaled = scale_model(model, layout, layers_per_stage=1, hidden_size=None, vocab_size=None)
    bench = bench_layout(layout, scaled, planned_layers=model.num_layers)
    assert bench.layers_per_stage == scaled_split and sum(bench.layers_per_stage) == scaled.num_layers
    training = TrainingSpec(global_batch_size=8 * layout.dp, seq_length=128)
    validate_layout(bench, scaled, training)  # the split, degrees and chunks add up (no cluster: scaled to any)
    assert bench_layout(layout, model, planned_layers=model.num_layers).layers_per_stage == planned["layers_per_stage"]


def test_a_plans_recomputed_layer_counts_keep_their_share_of_the_scaled_stage():
    pytest.importorskip("torch")
    from planner.bench.session import bench_layout, scale_model
    from planner.inputs.models import load_model
    from planner.inputs.specs import LayoutSpec

    model = load_model("llama2-13b")
    layout = LayoutSpec(tp=1, pp=2, dp=4, zero_stage=1, micro_batch_size=1, num_micro_batches=4,
                        layers_per_stage=[20, 20], recompute_layers_per_stage=[10, 0])
    scaled = scale_model(model, layout, layers_per_stage=4, hidden_size=None, vocab_size=None)
    bench = bench_layout(layout, scaled, planned_layers=model.num_layers)
    assert bench.layers_per_stage == [4, 4] and bench.recompute_layers_per_stage == [2, 0]


def _readme_command(start: str) -> list[str]:
    """The README command that starts with `start` (continuation lines joined), as argv after `planner`."""
    import shlex
    from pathlib import Path

    lines = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(start))
    text = lines[i]
    while text.endswith("\\"):
        i += 1
        text = text[:-1] + lines[i]
    return shlex.split(text.split("#")[0])[1:]


def test_the_readme_bench_examples_prepare_every_layout_they_would_run(tmp_path, monkeypatch):
    """README's local bench examples run as written on the plan the README makes just before them: the single
    layout fits --nproc with its --dp, and every layout of the --top short list is prepared (scaled model, stage
    split, degrees) before any rank would start. Both once failed: '--dp 4' after the plan's pick moved to tp 2, and
    a runner-up's [20, 20] split under --layers-per-stage 1."""
    pytest.importorskip("torch")
    from planner.bench.session import (
        BenchOptions,
        bench_config,
        bench_target,
        fit_layout,
        fit_shortlist,
        prepared_shortlist,
    )
    from planner.calibration import calibrated
    from planner.cli import main

    monkeypatch.chdir(tmp_path)
    argv = _readme_command(".venv/bin/planner plan -c dgx-a100-80gb -n 16 -m llama2-13b -b 512 -s 4096 --json")
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0 and (tmp_path / "plan.json").exists()

    def options(argv: list[str]) -> BenchOptions:
        value = {k: argv[argv.index(k) + 1] for k in argv if k.startswith("--") and argv.index(k) + 1 < len(argv)}
        num = {k: int(value[k]) for k in ("--nproc", "--dp", "--micro-batches", "--layers-per-stage",
                                           "--hidden-size", "--vocab-size") if k in value}
        return BenchOptions(nproc=num.get("--nproc"), dp=num.get("--dp"), micro_batches=num.get("--micro-batches"),
                            layers_per_stage=num.get("--layers-per-stage"), hidden_size=num.get("--hidden-size"),
                            vocab_size=num.get("--vocab-size"))

    single = _readme_command(".venv/bin/planner bench plan.json --nproc")
    top = _readme_command(".venv/bin/planner bench plan.json --top")
    for argv in (single, top):
        opts = options(argv)
        seq = int(argv[argv.index("--seq-len") + 1])
        doc, md, cl, lay, _ = bench_target(plan_file=tmp_path / "plan.json", cluster=None, model=None, layout=None,
                                           nodes=None, seq_len=seq, dp=opts.dp, micro_batches=opts.micro_batches)
        cl, knobs_kw = calibrated(cl, None)
        if argv is single:
            bench_config(md, fit_layout(lay, opts), seq, cl, knobs_kw, opts)
            continue
        entries, _ = shortlist(doc, int(argv[argv.index("--top") + 1]))
        kept, layouts, skipped = fit_shortlist(entries, opts)
        kept, prepared, more = prepared_shortlist(kept, layouts, md, seq, cl, knobs_kw, opts)
        assert len(prepared) == len(entries) and not skipped and not more, skipped + more
