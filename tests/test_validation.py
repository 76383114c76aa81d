"""The cost models against published runs (../shared/validation/published_runs.json; never edited), held out by
source, and against vTrain's measured runs (planner/data/vtrain_ground_truth_multi.csv), never fitted on.

The tests search a coarse grid (a subset of FITTED_GRID) to stay fast; `make validate` searches the full one and
writes docs/validation.md with the figures quoted in the assertions' comments."""

import json
import math
import statistics
from dataclasses import replace

import pytest

from planner.bands import BAND_COVERAGE, BAND_LEVELS
from planner.validation import (
    GIB,
    band_coverage,
    band_hits,
    build_case,
    build_cases,
    case_knobs,
    evaluate,
    load_rows,
    memory_rows,
    nested_band_coverage,
    run_loso,
    run_validation,
    source_balanced_objective,
    summary,
)
from tests.conftest import VALIDATION, require_shared


@pytest.fixture(autouse=True, scope="module")
def _shared_data():
    """No silent skip: without ../shared every test here fails, saying where the data should be."""
    require_shared(VALIDATION)


GRID = {"end_to_end_efficiency": (0.85, 0.875, 0.90), "elementwise_traffic_factor": (8.0, 10.0, 12.0),
        "gemm_half_efficiency_dim": (128.0, 192.0, 256.0)}
FACTORS = {("megatron-deepspeed", "ampere"): (0.8, 0.9, 1.0)}


@pytest.fixture(scope="module")
def report():
    return run_validation(load_rows(VALIDATION), grid=GRID, factor_grid=FACTORS)


def test_loso_targets_of_issue_10(report):
    s = summary(report)
    assert s["rows_evaluated"] >= 250
    # issue #10: LOSO median <= 10% and 90th percentile <= 25%, both met since the 2020-21 Megatron-LM README rows
    # run with the recompute their printed TFLOP/s count (full, Narayanan Eq. 3) and 2020's whole batch per replica,
    # and DeepSpeed's ZeRO-3 of 2021 hides no gather (validation.py ASSUMPTIONS): make validate's full grid 6.1% /
    # 17.4% (docs/validation.md), this grid 5.9% / 17.4% (7.2% / 18.6% and 6.8% / 18.6% before torchtitan's FP8 rows
    # gathered their parameters in FP8 as a torchtitan plan does, which moved the fit and the llm-foundry fold's
    # FSDP/Hopper factor; 7.2% / 20.5% and 6.5% / 20.6% before the GEMM shape term,
    # stage.py gemm_shape_factor, whose grid this one now holds; 7.8% / 19.3% and 7.3% / 19.5% before torchtitan's
    # 'selective (op)' rows ran its per-op SAC, cost_models/op_sac.py, which moved the fit; 8.3% / 21.1% and 7.4% /
    # 21.1% before Megatron-DeepSpeed on A100 got its own kernel factor, KERNEL_FACTOR_GRID; 8.2% / 21.0% on both
    # before Megatron-Core and NeMo ran
    # TE's cuDNN attention on Hopper, profiles.py TE_FUSED_ATTENTION_HOPPER; 8.0% / 21.5% before those profiles
    # kept fused SwiGLU's 6 s b f bytes); 9.4% / 26.0% before the README rows' rules. The bounds are those figures
    # plus about half a point, to catch a regression.
    assert s["loso_median_abs_error"] <= 0.065
    assert s["loso_p90_abs_error"] <= 0.180
    assert s["false_out_of_memory"] == 0  # every published run fit in memory
    # held-out figures cannot beat the in-sample ones by construction of the folds
    assert s["loso_median_abs_error"] >= s["fitted_on_all_median_abs_error"] - 1e-9


def test_a_fold_never_sees_its_source():
    # doubling every measured time of one source must not move the knobs chosen when that source is held out
    cases, _ = build_cases(load_rows(VALIDATION))
    grid = {"end_to_end_efficiency": (0.80, 0.85), "elementwise_traffic_factor": (8.0, 12.0)}
    held = "pytorch/torchtitan docs/performance.md (commit 3faaa1a0, 202"
    assert any(c.source == held for c in cases)
    loso, _ = run_loso(cases, grid, {})
    skewed = [replace(c, measured_step_seconds=2 * c.measured_step_seconds) if c.source == held else c for c in cases]
    loso2, _ = run_loso(skewed, grid, {})
    assert loso.points[loso.fold_choice[held]] == loso2.points[loso2.fold_choice[held]]


def test_source_balanced_objective():
    # two sources: one with 3 rows at 10%, one with 1 row at 30% -> mean of medians 20%, not the row median 10%
    assert source_balanced_objective([0.1, -0.1, 0.1, 0.3], ["a", "a", "a", "b"]) == pytest.approx(0.2)
    assert source_balanced_objective([0.1, -0.1, 0.1, 0.3], ["a", "a", "a", "b"], exclude="b") == pytest.approx(0.1)


def test_band_coverage_near_80_percent(report):
    # the nominal band (central 80% of the other sources' LOSO errors) covers fewer held-out rows than it claims
    # (60.3% on this grid); the calibrated one, its level chosen on the other sources only, about 80% (84.6% on
    # this grid, folds at the 92% and 94% levels, 84.3% on make validate's full grid, docs/validation.md, level 92%;
    # 78.2% / 79.7% before torchtitan's FP8 rows gathered in FP8 as a torchtitan plan does and the fit moved;
    # 80.3% / 81.5% before the GEMM shape term; 79.4% on both before torchtitan's per-op SAC, 78.2% / 81.2% before
    # Megatron-DeepSpeed's kernel factor; with levels capped at 90% it was 76.9% there once the Hopper attention
    # kernel tightened the mcore residuals, so the levels now reach 94%). Since each source weighs the same in a
    # band's quantiles (bands.source_weighted_quantile) a regime's band spans its sources' spread, not that of its
    # largest source, and the rows land a little above 80%: 86.2% on make validate's grid, level 90%; 88.3% since a
    # regime needs three sources for a band of its own (bands.MIN_SOURCES), when a held-out source's rows, each source
    # weighing the same, went from 71.0% to 77.5% inside: the pooled rows overshoot where the per-source mean is near
    # the aim
    inside, total = band_coverage(report)
    assert total >= 250
    assert inside / total < 0.8
    hits, levels = nested_band_coverage(report)
    assert len(hits) == total
    assert 0.78 <= sum(h.inside for h in hits) / total <= 0.9
    per_source: dict[str, list[bool]] = {}
    for h in hits:
        per_source.setdefault(h.result.case.source, []).append(h.inside)
    assert 0.7 <= sum(sum(v) / len(v) for v in per_source.values()) / len(per_source) <= 0.85
    assert set(levels.values()) <= set(BAND_LEVELS)
    # the band is not right because it is wide: the calibrated median width (high - low over the prediction) stays
    # under 70% (63.1% on this grid and on the full grid at the 92% level; 64.0% / 64.3% before the FP8-gather fit
    # moved; 58.5% / 63.6% before the GEMM shape
    # term, 60.8% / 63.9% before torchtitan's per-op SAC, 67.5% / 70.5% before Megatron-DeepSpeed's kernel factor).
    # It is 2.7x the nominal width (23.4%): with the Megatron-LM README rows' residuals tight, the central 80% of
    # most regimes narrowed, and coverage comes from the tails (ZeRO-3 baselines, llm-foundry on H100)
    nominal = statistics.median(h.width for h in band_hits(report, BAND_COVERAGE))
    calibrated = statistics.median(h.width for h in hits)
    assert nominal < calibrated <= 0.70


def test_measured_memory_rows(report):
    # BLOOM-176B layout search (bigscience chronicles): nvidia-smi snapshots (device memory), a printed 'GB' read as
    # GiB (validation.PRINTED_MEMORY_UNIT_BYTES: the source calls the 81920 MiB card '80GB'). Megatron-DeepSpeed
    # ZeRO-1 as DeepSpeedZeroOptimizer at the optimizer step (profiles.py), the A100 CUDA context BigScience measured
    # (1573 MiB) and the NCCL communicators of the groups DeepSpeed's pipe engine and Megatron's layers use (default,
    # TP, DP, TP x PP, PP, a send/recv pair per neighbour, the tied-embedding pair; 688 / 544 MiB each, NVIDIA/nccl
    # #964): every row -7.2%..+2.3%, median |error| 2.0% (before the communicators: -14.7%..-3.4%, all under). The one
    # row under by more than 5% is h13824 with 96 heads (-7.2%): its 128-head twin of the same layout printed 54.
    # The ZeRO-0 row ran on a pre-release DeepSpeed branch ('currently can't test ZeRO_STAGE=0 on master ... need to
    # retest', the source) on 2022-02-21, the day of that branch's 'Got bf16 working' (6eb4f1fa9), before it sharded
    # anything: 72 'GB' measured; its unsharded optimizer (4 + 6 + 12 B/param, a 3 GB fp32 + bf16 bucket,
    # profiles.DEEPSPEED_BF16_BRANCH_RECIPE) predicts 68.9 GiB (-4.4%), where the released BF16_Optimizer's
    # 2 + 4 + 12/d predicted about half the measurement
    s = summary(report)
    assert s["memory_rows"] >= 15
    assert s["memory_median_abs_error"] <= 0.03
    errors = {r.case.row_id: e for r, e in memory_rows(report)}
    assert all(-0.10 <= e <= 0.10 for e in errors.values()), errors
    assert [row for row, e in errors.items() if e < -0.05] == ["bs-prequel-nheads-h13824-heads96"], errors
    # the ZeRO-0 row and its ZeRO-1 twin of the same day and layout (37 'GB'): what differs between them, the
    # optimizer's states, is predicted at 31.0 GiB where 35 were measured (the same communicators and context in both)
    gib = {r.case.row_id: r.predicted_memory_gib for r, _ in memory_rows(report)}
    zero0, zero1 = "bs-prequel-0221-zero0-h14336-pp12-mbs2", "bs-prequel-0221-zero1-h14336-pp12-mbs2"
    assert gib[zero0] - gib[zero1] == pytest.approx(35, rel=0.15)
    # the other reading of the printed unit moves every row by the same factor (1 GiB / 10^9 B)
    as_1e9 = {r.case.row_id: e for r, e in memory_rows(report, 1e9)}
    for row, e in errors.items():
        assert as_1e9[row] + 1 == pytest.approx((e + 1) * GIB / 1e9)


def test_memory_is_compared_with_what_each_row_printed():
    """Issue 10 point 4 ('say allocated or reserved, per source'): a row's memory_definition says what its peak
    measures, and it is compared with the prediction of that quantity. nvidia-smi (BigScience: every published row
    today) is device memory; torch's max_memory_reserved (torchtitan's Memory(GiB)) leaves out the CUDA context and
    the NCCL communicators; max_memory_allocated is the live tensors."""
    from planner.validation import Report, memory_basis_of

    rows = [r for r in load_rows(VALIDATION) if r.get("peak_memory_gb_per_gpu")]
    assert rows and {memory_basis_of(r) for r in rows} == {"device"}
    assert memory_basis_of({"memory_definition": "torchtitan Memory(GiB): torch.cuda.max_memory_reserved"}) == "reserved"
    assert memory_basis_of({"memory_definition": "torch.cuda.max_memory_allocated() after 10 steps"}) == "allocated"
    assert memory_basis_of({"memory_definition": "nvidia-smi: memory reserved by the process"}) == "device"
    assert memory_basis_of({}) == "device"
    row = next(r for r in rows if r["id"] == "bs-prequel-0217-fp16-20B-8gpu")
    for definition, basis in (("nvidia-smi", "device"), ("max_memory_reserved", "reserved"),
                              ("max_memory_allocated", "allocated")):
        case = build_case(dict(row, memory_definition=definition))
        assert case.memory_basis == basis
        res = evaluate(case, case_knobs(case, {}))
        predicted = {"device": res.predicted_memory_gib, "allocated": res.predicted_allocated_gib,
                     "reserved": res.predicted_memory_gib - res.predicted_overhead_gib}[basis]
        assert res.predicted_memory_on(basis) == pytest.approx(predicted, rel=1e-12)
        (got, err), = memory_rows(Report([res], [], {}))
        assert err == pytest.approx(predicted / 67 - 1, rel=1e-9)  # 67 'GB' printed, read as GiB
    # the reserved pool sits between the live tensors and the device figure by the context and communicators
    assert res.predicted_allocated_gib < res.predicted_memory_on("reserved") < res.predicted_memory_gib


def test_korthikanti_table5_rows(report):
    # Korthikanti et al. 2022 Table 5, measured iteration times, held out by source
    rows = [r for r in report.results if r.case.row_id.startswith("korthikanti22")]
    assert len(rows) >= 6
    # within 20% held out (the full-recompute rows are predicted 10-17% slow: the recomputed forward pays the
    # memory-bound kernels at the fitted elementwise factor; docs/validation.md lists them)
    assert all(abs(r.loso_error) < 0.20 for r in rows), [(r.case.row_id, r.loso_error) for r in rows]
    assert sum(abs(r.loso_error) < 0.06 for r in rows) >= 3  # the selective-recompute rows sit within 6%


def test_skips_have_reasons():
    """Every published throughput row the validation leaves out says why, and the reason is true of the row: the
    fields it calls missing are empty and the evaluated rows have them all; "no measured throughput" rows carry
    none of the four measures. (It once asserted all(x for x in skipped), which no reason could fail.)"""
    needed = ["num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length", "global_batch_size"]
    measures = ["iteration_time_s", "tokens_per_sec_total", "tokens_per_sec_per_gpu", "tflops_per_gpu"]
    rows = [r for r in load_rows(VALIDATION) if r["record_type"] == "throughput_run"]
    built = [(r, build_case(r)) for r in rows]
    skipped = [(r, x) for r, x in built if isinstance(x, str)]
    cases = [x for _, x in built if not isinstance(x, str)]
    kinds = {}
    for row, why in skipped:
        if why.startswith("missing "):
            names = why.removeprefix("missing ").split(", ")
            assert set(names) <= set(needed) and all(not row.get(n) for n in names), (row["id"], why)
            assert all(row.get(n) for n in needed if n not in names), (row["id"], why)  # it names every one
            kinds["missing"] = kinds.get("missing", 0) + 1
        elif why == "no measured throughput":
            assert all(row.get(k) is None for k in measures), (row["id"], why)
            kinds[why] = kinds.get(why, 0) + 1
        else:
            pytest.fail(f"{row['id']}: a skip reason this test does not know how to check: {why!r}")
    # published_runs.json today: 19 rows without the model's shape or batch (the BigScience prequel's topology
    # sweeps give no layer/head counts, ZeRO and Turing-NLG no shapes at all), 4 with no throughput at all
    assert kinds == {"missing": 19, "no measured throughput": 4}, kinds
    assert all(all(row.get(n) for n in needed) for row, x in built if not isinstance(x, str))
    assert len(cases) == len(rows) - 23
    # FP8 and CP rows are evaluated since issue 14 (docs/validation-modern.md), no longer skipped
    assert any(str(c.training.precision) == "fp8" for c in cases)
    assert any(c.layout_fields.get("cp", 1) > 1 for c in cases)


@pytest.mark.parametrize("field, value, reason", [
    ("tp", "8", "tp: '8' -> a whole number >= 1 (0 or null: not given)"),
    ("tp", -2, "tp: -2 -> a whole number >= 1 (0 or null: not given)"),
    ("pp", 1.5, "pp: 1.5 -> a whole number >= 1 (0 or null: not given)"),
    ("ep", True, "ep: True -> a whole number >= 1 (0 or null: not given)"),
    ("seq_length", float("nan"), "seq_length: nan -> a whole number >= 1 (0 or null: not given)"),
    ("tflops_per_gpu", -3, "tflops_per_gpu: -3 -> a number > 0 (0 or null: not given)"),
    ("zero_stage", 4, "zero_stage: 4 -> 0, 1, 2 or 3, or null"), ("gpu_type", 100, "gpu_type: 100 -> text, or null"),
    ("sequence_parallel", "yes", "sequence_parallel: 'yes' -> true, false or null"),
])
def test_a_malformed_row_is_skipped_with_its_field(field, value, reason):
    """A runs file from elsewhere (the team's held-out set) goes through the same harness: a row whose value is of the
    wrong kind is skipped, naming the field, the value and what is allowed, and the other rows are still evaluated.
    (Before, `planner validate --runs` stopped with an internal error on the first such row: "'>' not supported
    between instances of 'str' and 'int'" for an 'ep' given as text.)"""
    good = next(r for r in load_rows(VALIDATION) if not isinstance(build_case(r), str))
    bad = dict(good, id="bad", **{field: value})
    cases, skipped = build_cases([good, bad, "not a row"])
    assert [c.row_id for c in cases] == [good["id"]]
    assert skipped == [("bad", reason), ("?", "row: 'not a row' -> a JSON object")]
    # a 0 for a parallelism not used reads as not given, as before the check (`row.get("vpp") or 1`)
    zeros = dict(good, id="zeros", vpp=0, cp=0, ep=0)
    assert [c.row_id for c in build_cases([zeros])[0]] == ["zeros"]


def test_validating_ones_own_runs_leaves_the_shipped_bands_alone(tmp_path):
    """`planner validate --runs THEIRS -o report.md` writes the report only: the error bands and the ranking band
    every later estimate reads are rewritten only with --write-tables (make validate, on the published set). Before,
    -o alone rewrote them, so validating a file of one's own (a held-out set, 300 mutated rows) silently replaced
    the shipped bands with that file's."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    rows = [r for r in load_rows(VALIDATION) if not isinstance(build_case(r), str)][:3]
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps(rows + [dict(rows[0], id="bad", tp="8")]))
    tables = [ROOT / "planner" / "data" / name for name in ("error_bands.json", "ranking_band.json")]
    before = [t.read_bytes() for t in tables]
    out = tmp_path / "report.md"
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "validate", "--runs", str(runs), "-o", str(out),
                           "--no-with-planner"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert [t.read_bytes() for t in tables] == before
    text = out.read_text()
    assert "| bad | tp: '8' -> a whole number >= 1" in text  # the malformed row listed among the skips


def test_vtrain_second_set(report):
    from planner.validation_vtrain import run_vtrain, vtrain_cases

    cases = vtrain_cases()
    assert len(cases) == 109  # data/ground_truth_multi.csv of VIA-Research/vTrain at f8dda847
    first = cases[0]  # "3.6,64,512,8,3072,32,30,2048,1,64,1,3566.5"
    assert (first.model.hidden_size, first.layout_fields["dp"], first.measured_step_seconds) == (3072, 64, 3.5665)
    vt = run_vtrain(report.knobs)
    assert len(vt.regret) == 4
    assert vt.false_oom == 0
    # regret of the pick: the layout ranked fastest is within 5% of the best measured one for every model
    assert max(vt.regret.values()) <= 0.05
    # issue #10 targets on these never-fitted rows: mean |error| <= 12%, |bias| <= 5% (docs/validation.md, full
    # grid: 8.4% and -3.6%; 9.1% and -5.6% before the GEMM shape term, stage.py gemm_shape_factor; 8.8% and -3.5%
    # before torchtitan's per-op SAC moved the fit of the published runs to elementwise_traffic_factor 8, from 10;
    # 9.4% and -0.4% before Megatron's async TP all-reduce was modelled; 12.2% and +7.4% before unfused attention's
    # score tensors were charged their own kernel traffic). The bias moves with the fit, which sits on a flat ridge:
    # the five best grid points on the published runs, within 0.05 points of its objective, give -3.6% to -4.5%
    # here (-3.4% to -5.6% before the shape term, when the target was not met at the shipped fit).
    assert vt.mean_abs_error <= 0.10
    assert abs(vt.bias) <= 0.05
    # the whole ranking: 1,400 of 1,721 layout pairs ordered as measured (81.3%; 80.8%-81.7% at the five best grid
    # points; 83.1% before the GEMM shape term, which predicts GPT 39.1B's tp 8 layouts slower against its tp 2 ones,
    # measured 18-36% slower than predicted already: the bound was 82% and is lowered to 80%, said here; 82.8% at
    # the fit before per-op SAC, 81.6% without the async all-reduce)
    assert vt.pairs_ordered[1] == 1721 and vt.pair_accuracy >= 0.80
    assert statistics.fmean(abs(r.error) for r in vt.results if r.error is not None) == pytest.approx(
        vt.mean_abs_error)


def test_vtrain_band_coverage_counts_rows_inside_their_regimes_band(report):
    # docs/validation.md: the shipped band checked on vTrain's never-fitted rows. A wider band (a higher level of the
    # same residuals) holds at least the rows a narrower one does; every predicted row is counted once; a row counts
    # as inside exactly when band_text (the outside probes' column) says 'in'
    from planner.validation import band_table, band_text, shipped_band_level
    from planner.validation_vtrain import run_vtrain, shipped_band_coverage

    vt = run_vtrain(report.knobs)
    shipped = band_table(report, level=shipped_band_level(report))
    cov = shipped_band_coverage(vt.results, shipped)
    assert cov.rows == 109 and 0 < cov.inside <= cov.rows and cov.median_width > 0
    assert cov.inside == sum(band_text(shipped, r).endswith(" in") for r in vt.results)
    narrow, wide = (shipped_band_coverage(vt.results, band_table(report, level=q)) for q in (0.5, 0.98))
    assert narrow.inside <= cov.inside <= wide.inside and narrow.median_width < wide.median_width


def test_vtrain_error_groups_and_picks_partition_the_rows(report):
    # docs/validation.md's 'where the error sits' and picks tables: every group partition covers all 109 rows once,
    # and its row-weighted biases give back the overall bias; the best layout is the one measured fastest, and the
    # regret is the pick's measured time over it
    from planner.validation_vtrain import by_model, error_groups, model_billions, pick_and_best, run_vtrain

    vt = run_vtrain(report.knobs)
    for key in (lambda r: r.case.layout_fields["tp"], lambda r: r.case.layout_fields["pp"],
                lambda r: r.case.model.name):
        groups = error_groups(vt.results, key)
        assert sum(g.rows for g in groups) == 109
        assert sum(g.rows * g.bias for g in groups) / 109 == pytest.approx(vt.bias)
        assert all(g.mean_abs_error >= abs(g.bias) for g in groups)
    tp = {g.key: g.rows for g in error_groups(vt.results, lambda r: r.case.layout_fields["tp"])}
    assert tp == {1: 8, 2: 14, 4: 30, 8: 51, 16: 6}  # counted in data/ground_truth_multi.csv's tp column
    assert [model_billions(m) for m in by_model(vt.results)] == [3.6, 18.4, 39.1, 175.0]
    for name, rows in by_model(vt.results).items():
        pick, best = pick_and_best(rows)
        assert best.case.measured_step_seconds == min(r.case.measured_step_seconds for r in rows)
        assert pick.predicted_step_seconds == min(r.predicted_step_seconds for r in rows)
        assert vt.regret[name] == pytest.approx(pick.case.measured_step_seconds / best.case.measured_step_seconds - 1)


def test_llm_foundry_errors_do_not_run_with_the_model_width(report):
    # The mechanism behind the GEMM shape term (cost_models/stage.py gemm_shape_factor): with the GEMM rate set by
    # the FC1 GEMM's FLOPs alone, llm-foundry's FSDP rows (one source, one framework, widths 768-8192), held out,
    # ran with the model's width. Measured per GPU generation, as the least-squares slope of the held-out error
    # against log2(h) (this grid): with the term -1.3% per doubling on A100 (139 rows) and +3.6% on H100 (77 rows);
    # without it (gemm_half_efficiency_dim 0 in the same grid) +4.6% and +9.0%. Per generation, since the two
    # carry different offsets (the H100 rows ran at a fitted FSDP/Hopper factor until 2026-12-06) and A100 alone has the narrow
    # models: pooled, a change of that factor reads as a width trend. Not a blind test of the term: its form was
    # chosen after seeing this trend (and vTrain's per-model bias); these rows are held out only from its fitted
    # value (the llm-foundry fold chose it on the other sources).
    rows = [r for r in report.results if r.case.source.startswith("mosaicml/llm-foundry") and r.loso_error is not None]
    assert len({r.case.model.hidden_size for r in rows}) >= 8 and len(rows) >= 200
    for gen in ("ampere", "hopper"):
        mine = [r for r in rows if r.case.gpu_generation == gen]
        assert len(mine) >= 70, gen
        slope = statistics.linear_regression([math.log2(r.case.model.hidden_size) for r in mine],
                                             [r.loso_error for r in mine]).slope
        assert abs(slope) <= 0.042, (gen, slope)


def test_shipped_defaults_are_the_all_source_fit():
    # the knobs every command uses are the ones `make validate` fitted on every source (planner/data/error_bands.json)
    from importlib import resources

    from cost_models.inputs import Knobs
    from planner.frameworks.profiles import MEGATRON_DEEPSPEED_AMPERE_KERNEL_EFFICIENCY

    table = json.loads(resources.files("planner.data").joinpath("error_bands.json").read_text())
    fitted = table["fitted_knobs"]
    assert Knobs().end_to_end_efficiency == fitted["end_to_end_efficiency"]
    assert Knobs().elementwise_traffic_factor == fitted["elementwise_traffic_factor"]
    assert Knobs().gemm_half_efficiency_dim == fitted["gemm_half_efficiency_dim"]
    assert "kernel_efficiency[fsdp/hopper]" not in fitted  # explained by two mechanisms, removed (KERNEL_FACTOR_GRID)
    assert MEGATRON_DEEPSPEED_AMPERE_KERNEL_EFFICIENCY == fitted["kernel_efficiency[megatron-deepspeed/ampere]"]


def test_megatron_deepspeed_runs_below_megatron_lm_on_a100(report):
    # MT-NLG 530B (Smith et al. 2022, Table 2: 126 TFLOP/s per GPU at tp 8 x pp 35 x dp 8 on Selene) against
    # Megatron-LM's PTD-P at the same layout on the same cluster (Narayanan et al. 2021, Table 2: 159): per
    # sequence 60.1 s / 1,920 = 31.3 ms vs 55.45 s / 2,240 = 24.8 ms, 1.26x. Both Megatron-DeepSpeed sources show
    # the gap on their own: each one's fold, fitted on the other source alone, chooses a factor below 1 (0.8 on this
    # grid, both), and the family's held-out median falls from 20.2% (make validate before the factor) to 6.1% here
    # (9.1% on the full grid)
    by_source = {r.case.source: r for r in report.results if r.case.family == "megatron-deepspeed"}
    assert len(by_source) == 2
    name = "kernel_efficiency[megatron-deepspeed/ampere]"
    for src in by_source:
        assert report.loso.points[report.loso.fold_choice[src]][name] < 1.0, src
    rows = [r for r in report.results if r.case.family == "megatron-deepspeed"]
    assert statistics.median(abs(r.loso_error) for r in rows) <= 0.10
    mtnlg = next(r for r in rows if r.case.row_id == "mtnlg-530B-2240gpu")
    ptdp = next(r for r in report.results if r.case.row_id == "narayanan21-t2-ptdp-529.6B-2240gpu")
    measured = (mtnlg.case.measured_step_seconds / 1920) / (ptdp.case.measured_step_seconds / 2240)
    assert measured == pytest.approx(1.264, abs=0.005)
    # the model without the factor runs the two at almost the same time per sequence (MT-NLG's shorter pipeline
    # fill, 240 micro-batches vs 280: more bubble); the factor is what carries the gap
    predicted = (mtnlg.predicted_step_seconds / 1920) / (ptdp.predicted_step_seconds / 2240)
    assert 1.15 <= predicted <= 1.35
    without = {k: v for k, v in report.knobs.items() if k != name}
    bare = evaluate(mtnlg.case, case_knobs(mtnlg.case, without)).predicted_step_seconds
    assert 1.0 <= (bare / 1920) / (ptdp.predicted_step_seconds / 2240) <= 1.03


def test_published_pairs_rank_like_vtrains(report):
    # The tie tolerance comes from vTrain's layout sweeps (planner/decisions/ranking.py: 80% of 1,721 ratio errors
    # within 23.8%, 20% within 2.2%). A second, independent estimate: pairs of published runs of one model on one
    # cluster (one GPU type and count) from one source, predicted leave-one-source-out (29 groups, 53 pairs today):
    # 80% within 13.7% and 20% within 1.7% on this coarse grid (2.0% at the fit before Grand Teton's H100 had its 2.4 TB/s). The grouping left out the GPU type until
    # torchtitan's FP8 rows gathered in FP8 and moved the fit: 40 of its 69 groups were an A100 run and an H100 run
    # of one llm-foundry shape, whose ratio error is the A100/H100 offset, not a ranking error (25.8% at the 80%
    # point with them; 14.5% / 1.7% before, when the llm-foundry fold's FSDP/Hopper factor happened to cancel that
    # offset). The 20% point of 53 pairs is the 11th smallest ratio error: it moves by tenths of a point when one
    # source's rows move, so the two estimates are held to agree within 1.0 point (vTrain's is shipped, the wider of
    # the two, so the recommendation errs towards the simpler layout).
    from planner.decisions.ranking import band_figures, error_groups, ranking_band

    groups = error_groups(report.results, loso=True)
    f = band_figures(groups)
    assert len(groups) >= 25 and f["pairs"] >= 50
    shipped = ranking_band()
    assert 0.10 <= f["tie_tolerance"] <= shipped.tie_tolerance
    assert f["recommend_within"] == pytest.approx(shipped.recommend_within, abs=0.010)


def test_ordered_pairs_counts_the_whole_ranking():
    # three layouts measured 1, 2, 3 s; predicted 1.1, 3.2, 2.9: pairs (1,2) and (1,3) in order, (2,3) swapped;
    # a repeated measurement (equal times) is no pair, a layout without a prediction is left out
    from types import SimpleNamespace

    from planner.validation_vtrain import ordered_pairs

    def row(measured, predicted):
        return SimpleNamespace(case=SimpleNamespace(measured_step_seconds=measured), predicted_step_seconds=predicted)

    rows = [row(1.0, 1.1), row(2.0, 3.2), row(3.0, 2.9), row(3.0, 5.0), row(4.0, None)]
    # pairs with the fourth: (1,4) and (2,4) in order, (3,4) tied measured (skipped)
    assert ordered_pairs(rows) == (4, 5)


def _row(row_id):
    return next(r for r in load_rows(VALIDATION) if r["id"] == row_id)


def test_unprinted_recompute_follows_the_flop_convention_and_the_software_era():
    from planner.validation import _row_year

    # Megatron-LM README of 2020-09-11 (tables.tex, 8B on 8 A100): 109.3 TFLOP/s x 8 GPUs x 1.343 s = 1.174e18,
    # Narayanan Eq. 3 (96 B s l h^2 (1 + s/6h + V/16lh), 4 passes) of B 16, s 1024, l 42, h 4096 = 1.175e18
    case = build_case(_row("mlm2020-mp-dgxa100-8B"))
    assert case.layout_fields["recompute"] == "full" and case.recompute_choices == ("full",)
    # that Megatron-LM had no micro-batches (--batch-size per model instance until 2020-12-06): mbs = 16 / dp 1
    assert case.layout_fields["micro_batch_size"] == 16 and "micro_batch_size" not in case.searched
    # a 3-pass count (72 instead of 96: 25% fewer FLOPs) is not Eq. 3: recompute is searched, without selective,
    # which Megatron-LM gained in 2022 (commit cfd2e21607)
    three_pass = dict(_row("mlm2020-mp-dgxa100-8B"), tflops_per_gpu=109.3 * 0.75)
    case = build_case(three_pass)
    assert "recompute" not in case.layout_fields and case.recompute_choices == ("none", "full")
    # the Jan-2021 README rows state the Narayanan Table 1 convention: full, micro-batch searched (2021 code)
    case = build_case(_row("mlm-readme-jan2021-145B"))
    assert case.layout_fields["recompute"] == "full" and "micro_batch_size" in case.searched
    # a Megatron-Core row that printed no recompute keeps every policy
    case = build_case(_row("mlm-h100-weak-7.1B"))
    assert "recompute" in case.searched and case.recompute_choices == ("none", "selective", "full")
    # a printed policy wins over any rule
    assert build_case(_row("korthikanti22-22B-sp-selective")).layout_fields["recompute"] == "selective"
    # years: the framework field first, then the source; an arXiv id is no year
    assert _row_year({"framework": "Megatron-LM (Jan 2021)", "source": "x 2024"}) == 2021
    assert _row_year({"framework": "Megatron-LM", "source": "Narayanan et al. 2021 (arXiv:2104.04473)"}) == 2021
    assert _row_year({"framework": "X", "source": "Brown et al. (arXiv:2005.14165)"}) is None


def test_deepspeed_zero3_of_2021_hides_no_gather():
    # DeepSpeed v0.3.13-v0.5.4 (2021) synchronised the device before every per-parameter ZeRO-3 gather
    # (partition_parameters.py _allgather_param; DeepSpeed PR #1188: 'the async version is not async at all')
    from planner.frameworks import Framework
    from planner.frameworks.profiles import profile_knobs

    row = _row("narayanan21-t2-zero3-174.6B-768gpu")  # Narayanan et al. 2021 Table 2, ZeRO-3 baseline
    assert build_case(row).knobs.zero3_overlap_fraction == 0.0
    later = dict(row, framework="DeepSpeed ZeRO-3", source="a DeepSpeed benchmark of 2023")
    assert build_case(later).knobs.zero3_overlap_fraction == profile_knobs(Framework.DEEPSPEED).zero3_overlap_fraction > 0


def test_deepspeed_bf16_zero0_before_its_sharding_keeps_every_state_whole():
    # DeepSpeed's olruwase/bf16-updates branch (PR #1801): 'Got bf16 working' 6eb4f1fa9 on 2022-02-21, ZeRO-1 sharding
    # from 6f5ebc37a / 819abe2a7 on 2022-02-24. BigScience's ZeRO_STAGE=0 row (2022-02-21) ran it ('the special
    # branch'); its ZeRO-1 twin of the same day and the later ZeRO-0 runs keep the profile's recipes
    from planner.frameworks.profiles import DEEPSPEED_BF16_BRANCH_RECIPE, profile_for

    zero0 = _row("bs-prequel-0221-zero0-h14336-pp12-mbs2")
    knobs = build_case(zero0, memory_only=True).knobs
    assert knobs.state_bytes_per_param == (4, 6, 12) and knobs.zero0_optimizer is None
    assert knobs.bucket_bytes == 5e8 * (4 + 2)  # one 5e8-element bucket flattened in fp32, cast to bf16
    # 22 B/param, none of it over DP: the released BF16_Optimizer holds 8 + 12/d (its fp32 gradient buffer and the
    # all-reduce's bf16 copy of it)
    assert DEEPSPEED_BF16_BRANCH_RECIPE.bytes_per_param == 22
    released = profile_for("megatron-deepspeed").memory
    after = dict(zero0, notes="Measured at iteration 2 (date 2022-02-24).")
    undated = dict(zero0, notes=None)
    zero1 = _row("bs-prequel-0221-zero1-h14336-pp12-mbs2")
    for row in (after, undated, zero1):
        k = build_case(row, memory_only=True).knobs
        assert (k.state_bytes_per_param, k.zero0_optimizer) == (
            (released.param_bytes, released.grad_bytes, released.optimizer_bytes), released.zero0), row["id"]
    # the unsharded states are 13.5 B/param more than ZeRO-1's 4 + 18/4 on the same layout: the two rows of that day
    # measured 72 and 37 GB
    mem = {row["id"]: evaluate(build_case(row, memory_only=True)).predicted_memory_gib for row in (zero0, zero1)}
    assert mem[zero0["id"]] - mem[zero1["id"]] > 25


def test_torchtitan_fp8_rows_gather_their_parameters_as_a_torchtitan_plan_does():
    """An FP8 torchtitan row all-gathers its FSDP parameters in FP8, as `planner estimate --framework torchtitan
    --precision fp8` plans it (capabilities.fp8_gathers_params) and as torchtitan's own 405B run was launched
    (train_configs/llama3_405b.toml at 3faaa1a0: enable_fsdp_float8_all_gather = true; docs/float8.md's launch line
    passes it too). Validation gathered in BF16 before, so the planner's prediction was not the validated one: the
    published Float8 405B row (FSDP 16 x TP 8) was predicted +9.9% slow with all-source knobs, +0.2% once it
    gathered in FP8, +0.3% on the 500 W HBM2e H100 it ran on, +6.9% now that part moves its bytes at the 2.4 TB/s
    torchtitan states for it, not the SXM part's 3.35 (+11.8% if it gathered in BF16; docs/validation.md).
    llm-foundry's FP8 rows run Transformer Engine under FSDP, which gathers in BF16."""
    from planner.bands import load_table
    from planner.frameworks.capabilities import fp8_gathers_params

    rows = {r["id"]: r for r in load_rows(VALIDATION)}
    titan = build_case(rows["torchtitan-h100-405B-fsdp16-tp8-float8"])
    foundry = build_case(rows["llmfoundry-h100_80gb-amp_fp8-mpt3b-s8192-g8-mbs3-gbs144"])
    assert titan.training.fp8_recipe == "tensorwise"
    assert titan.training.fp8_param_gather is fp8_gathers_params("torchtitan", "tensorwise") is True
    assert foundry.training.fp8_param_gather is False
    knobs = case_knobs(titan, load_table()["fitted_knobs"])
    gathered = evaluate(titan, knobs)
    bf16_gather = evaluate(replace(titan, training=titan.training.model_copy(update={"fp8_param_gather": False})),
                           knobs)
    assert gathered.predicted_step_seconds < bf16_gather.predicted_step_seconds
    assert abs(gathered.error) < 0.075 < bf16_gather.error


def test_band_quantiles_weigh_each_source_the_same():
    """Source a has one row (0.0), source b three (1, 2, 3): each source weighs 1, so a's row sits at 0.25 of the
    cumulative scale and b's at 0.583, 0.75, 0.917 (the middle of each row's weight over 2). The median is
    0 + (0.5 - 0.25) / (0.583 - 0.25) = 0.75, where pooling the rows gives 1.5 (b outvoting a); the ends clamp.
    Equal-sized sources give the rows' own midpoint quantile. build_table takes its time bands this way."""
    from planner.bands import build_table, source_weighted_quantile

    rows = [("a", 0.0), ("b", 1.0), ("b", 2.0), ("b", 3.0)]
    assert source_weighted_quantile(rows, 0.5) == pytest.approx(0.75)
    assert source_weighted_quantile(rows, 0.1) == 0.0 and source_weighted_quantile(rows, 0.95) == 3.0
    assert source_weighted_quantile([("a", 1.0), ("b", 3.0)], 0.5) == pytest.approx(2.0)
    # a regime needs rows from three sources (bands.MIN_SOURCES): two sources' rows give no band of their own
    two = build_table([(src, "fsdp", "hopper", 8, e) for src, e in rows * 2], [], level=0.5)
    assert "fsdp|hopper" not in two["time"] and "*" not in two["time"]
    three = rows + [("c", 1.5)] * 2
    table = build_table([(src, "fsdp", "hopper", 8, e) for src, e in three * 2], [], level=0.5)
    assert table["time"]["fsdp|hopper"]["error_low"] == pytest.approx(source_weighted_quantile(three * 2, 0.25))
    assert table["time"]["fsdp|hopper"]["error_high"] == pytest.approx(source_weighted_quantile(three * 2, 0.75))


def test_validate_json_is_the_contract_s_validation_summary(report):
    """`validate --json` prints planner.contract.ValidationSummary (`planner schema validation`): the summary and
    vTrain's figures, read back through the model unchanged."""
    from planner.contract import ValidationSummary
    from planner.requests import validation_document
    from planner.validation_vtrain import run_vtrain

    doc = validation_document(report, run_vtrain(report.knobs))
    again = ValidationSummary.model_validate_json(doc.model_dump_json())
    assert again == doc and again.kind == "validation"
    assert again.rows_evaluated == summary(report)["rows_evaluated"] and again.vtrain.rows == 109
    assert set(again.vtrain.regret) == {"GPT 3.6B", "GPT 18.4B", "GPT 39.1B", "GPT 175B"}
