"""`bench --top K`: which layouts are measured, which one to launch, and the calibration written back (pure)."""

import pytest

from planner.bench.shortlist import DEFAULT_BAND, calibration_document, decide, plan_band, shortlist


def _plan(pick_t, alts, band=None):
    lay = {"dp": 8, "tp": 1, "pp": 1}
    doc = {"layout": lay, "predicted": {"step_time_seconds": pick_t},
           "alternatives": [{"layout": {"dp": 8 // t, "tp": t, "pp": 1}, "predicted": {"step_time_seconds": s}}
                            for t, s in alts]}
    if band is not None:
        doc["predicted"]["step_time_band"] = band
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
    assert plan_band(doc) == (0.2, "the plan's error band")
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
