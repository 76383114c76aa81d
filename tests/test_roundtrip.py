"""Round trip: plan -> export for each framework -> check reads it back -> the same layout and prediction (or the
documented nearest layout with its own prediction, which the export names)."""

import json
from pathlib import Path

import pytest

from cost_models.step import stage_split
from planner.contract import Predicted
from planner.integrations.check import check
from planner.integrations.exports import export
from planner.integrations.readers import read_config

ROOT = Path(__file__).resolve().parents[1]
UNEVEN = json.loads((ROOT / "tests" / "data" / "plan_uneven.json").read_text())  # llama2-13b, 64 A100s, B 256

PLANS = {
    # uneven split + per-stage recompute (the ILP's output)
    "uneven+per-stage-recompute": {},
    "interleaved-zero1": dict(tp=8, pp=4, dp=2, zero_stage=1, micro_batch_size=1, num_micro_batches=128,
                              recompute="selective", schedule="interleaved_1f1b", virtual_stages=2,
                              layers_per_stage=None, recompute_layers_per_stage=None),
    # interleaving whose chunks do not divide the 40 layers: (40 + embedding + loss) / (2 x 3) = 7 per chunk, the
    # end chunks one fewer (Megatron: --account-for-embedding/loss-in-pipeline-split; planner/frameworks/megatron_split.py)
    "interleaved-account-for": dict(tp=8, pp=2, dp=4, zero_stage=1, micro_batch_size=1, num_micro_batches=64,
                                    recompute="selective", schedule="interleaved_1f1b", virtual_stages=3,
                                    layers_per_stage=[20, 20], recompute_layers_per_stage=None),
    # ZeRO-0 over a pipeline: Megatron-DeepSpeed's bf16 runs BF16_Optimizer (2 + 6 + 12/d B/param), which check read
    # as ZeRO-1's DeepSpeedZeroOptimizer (then 4 + 20/d) until this plan: a different peak from the one planned
    "zero0-pipeline": dict(tp=8, pp=4, dp=2, zero_stage=0, micro_batch_size=1, num_micro_batches=128,
                           recompute="full", schedule="1f1b", layers_per_stage=None, recompute_layers_per_stage=None),
    "zero2": dict(tp=1, pp=1, dp=64, zero_stage=2, micro_batch_size=1, num_micro_batches=4, recompute="full",
                  sequence_parallel=False, layers_per_stage=None, recompute_layers_per_stage=None),
    "zero3-fsdp": dict(tp=2, pp=1, dp=32, zero_stage=3, micro_batch_size=2, num_micro_batches=4, recompute="full",
                       layers_per_stage=None, recompute_layers_per_stage=None),
    "zero3-offload": dict(tp=1, pp=1, dp=64, zero_stage=3, offload="optimizer+params", micro_batch_size=1,
                          num_micro_batches=4, recompute="full", sequence_parallel=False, layers_per_stage=None,
                          recompute_layers_per_stage=None),
    # hybrid sharding: FSDP over 8 ranks, 8 replicas (torchtitan's replicate x shard degrees; the others shard over
    # every dp rank, a documented nearest layout)
    "hsdp-zero3": dict(tp=1, pp=1, dp=64, zero_stage=3, dp_shard=8, micro_batch_size=1, num_micro_batches=4,
                       recompute="full", sequence_parallel=False, layers_per_stage=None,
                       recompute_layers_per_stage=None),
    # Megatron-Core's partial distributed optimizer: ZeRO-1 over 16 ranks, 2 instances (torchtitan runs it as FSDP
    # under PP only: the nearest layout, ZeRO-2)
    "hsdp-zero1": dict(tp=2, pp=1, dp=32, zero_stage=1, dp_shard=16, micro_batch_size=1, num_micro_batches=8,
                       recompute="full", sequence_parallel=True, layers_per_stage=None,
                       recompute_layers_per_stage=None),
    "zero1-offload-optimizer": dict(tp=8, pp=1, dp=8, zero_stage=1, offload="optimizer", micro_batch_size=1,
                                    num_micro_batches=32, recompute="full", layers_per_stage=None,
                                    recompute_layers_per_stage=None),
    # context parallelism with no data-parallel degree: torchtitan still runs FSDP, over dp_shard x cp
    # (ParallelDims.fsdp_enabled), which check once read as ZeRO-0 (a 64 GiB plan checked at 156 GiB, FAIL)
    "cp-only-zero2": dict(tp=8, pp=1, dp=1, cp=8, zero_stage=2, micro_batch_size=1, num_micro_batches=256,
                          recompute="full", sequence_parallel=True, layers_per_stage=None,
                          recompute_layers_per_stage=None),
    "cp-pipeline-zero1": dict(tp=4, pp=4, dp=1, cp=4, zero_stage=1, micro_batch_size=1, num_micro_batches=256,
                              recompute="full", sequence_parallel=True, layers_per_stage=None,
                              recompute_layers_per_stage=None),
}
TARGETS = ["megatron", "nemo", "megatron-deepspeed", "deepspeed", "torchtitan", "torchtitan-toml"]
SUFFIX = {"megatron": ".sh", "nemo": ".txt", "megatron-deepspeed": ".sh", "deepspeed": ".json", "torchtitan": ".py",
          "torchtitan-toml": ".toml"}


def _plan(name: str, framework: str | None = None) -> dict:
    """The plan `name`, predicted as `plan --framework FRAMEWORK` predicts it (its execution profile: the overlap its
    export turns on, its memory recipe); None: the generic profile."""
    doc = json.loads(json.dumps(UNEVEN))
    doc["layout"].update(PLANS[name])
    from planner.estimate import build_problem
    from planner.inputs.specs import LayoutSpec

    problem = build_problem("dgx-a100-80gb", 8, "llama2-13b", 256, 4096, framework=framework)
    if framework is not None:
        doc["framework"] = framework
    lay = LayoutSpec.model_validate(doc["layout"])
    doc["predicted"] = Predicted.from_estimate(problem.estimate(lay), problem.knobs.memory_headroom_bytes).model_dump()
    return doc


def _normal(lay: dict, num_layers: int) -> dict:
    lay = dict(lay)
    if lay["layers_per_stage"] is None:
        lay["layers_per_stage"] = list(stage_split(num_layers, lay["pp"]))
    if lay["recompute_layers_per_stage"] is not None and lay["pp"] == 1:
        lay["recompute_layers_per_stage"] = list(lay["recompute_layers_per_stage"])
    return lay


def round_trip(target: str, plan_name: str, tmp_path: Path) -> dict:
    """Plan (with the target framework's profile) -> export -> check: what came back. {"refused": reason} when the
    framework cannot express the plan; else the export, the check's outcome and the plan's prediction."""
    from cluster_specs import SpecError
    from planner.estimate import build_problem

    to, fmt = ("torchtitan", "toml") if target == "torchtitan-toml" else (target, "python")
    doc = _plan(plan_name, to)  # planned with the framework's profile, as `plan --framework` does
    try:
        exp = export(doc, to, torchtitan_format=fmt)
    except SpecError as exc:  # a refusal names its reason
        return {"refused": str(exc)}
    path = tmp_path / f"cfg{SUFFIX[target]}"
    path.write_text(exp.text)
    if target == "megatron-deepspeed":  # its ZeRO and offload settings live in the ds_config beside the arguments
        (tmp_path / "ds_config.json").write_text(export(doc, "deepspeed", framework="megatron-deepspeed").text)
    lay = exp.layout
    overrides = {}
    if target == "deepspeed":  # what the JSON cannot say, passed as the README documents (--pp, --fix recompute)
        overrides = {"pp": lay.pp, "tp": lay.tp, "dp": lay.dp}
        if lay.pp == 1:
            overrides["recompute"] = lay.recompute
    view = read_config(path, gpus=64, overrides=dict(overrides), global_batch_size=256)
    problem = build_problem("dgx-a100-80gb", 8, "llama2-13b", view.global_batch_size or 256,
                            view.seq_length or 4096, view.precision or "bf16", framework=to)
    out = check(view, problem, overrides=overrides)
    got = Predicted.from_estimate(out.estimate, problem.knobs.memory_headroom_bytes).model_dump() \
        if out.estimate else None
    return {"refused": None, "export": exp, "doc": doc, "outcome": out, "got": got,
            "want": exp.predicted or doc["predicted"],
            "same_layout": out.layout is not None and _normal(out.layout.model_dump(), 40) == _normal(
                lay.model_dump(), 40)}


@pytest.mark.parametrize("plan_name", list(PLANS))
@pytest.mark.parametrize("target", TARGETS)
def test_export_then_check_gives_the_same_layout_and_prediction(target, plan_name, tmp_path):
    r = round_trip(target, plan_name, tmp_path)
    if r["refused"]:
        assert "->" in r["refused"] or "cannot" in r["refused"]
        pytest.skip(f"{target} refuses {plan_name}: {r['refused']}")
    exp, out, got, want = r["export"], r["outcome"], r["got"], r["want"]
    assert out.violations == [], out.violations
    assert r["same_layout"], (out.layout, exp.layout)
    assert got["step_time_seconds"] == pytest.approx(want["step_time_seconds"], rel=1e-9)
    assert got["peak_memory_bytes_per_gpu"] == pytest.approx(want["peak_memory_bytes_per_gpu"], rel=1e-9)
    if exp.changes:  # the nearest layout is documented in the file (or, for JSON, in the notes)
        assert exp.predicted is not None
        assert all(c.split(" ")[0] in (exp.text + " ".join(exp.notes)) for c in exp.changes)


@pytest.mark.parametrize("fmt", ["python", "toml"])
def test_a_compiled_plan_exports_compile_and_check_predicts_it_back(fmt, tmp_path):
    """plan --framework torchtitan --compile: the export writes torchtitan's compile setting (the model's blocks; the
    loss eager, as predicted) and check, reading it, predicts the plan's step time; a target without a compile
    setting refuses the plan, naming what to do."""
    from cluster_specs import SpecError
    from planner.estimate import build_problem
    from planner.inputs.specs import LayoutSpec

    problem = build_problem("dgx-a100-80gb", 8, "llama2-13b", 256, 4096, framework="torchtitan", compile_model=True)
    doc = json.loads(json.dumps(UNEVEN))
    doc["layout"].update(PLANS["zero3-fsdp"])
    doc["framework"], doc["inputs"]["training"] = "torchtitan", problem.training.model_dump(mode="json")
    lay = LayoutSpec.model_validate(doc["layout"])
    doc["predicted"] = Predicted.from_estimate(problem.estimate(lay), problem.knobs.memory_headroom_bytes).model_dump()
    exp = export(doc, "torchtitan", torchtitan_format=fmt)
    assert ("[compile]\nenable = true\ncomponents = [\"model\"]" if fmt == "toml"
            else "compile=CompileConfig(\n            enable=True,\n            components=['model'],") in exp.text
    path = tmp_path / ("cfg.toml" if fmt == "toml" else "cfg.py")
    path.write_text(exp.text)
    view = read_config(path, gpus=64, global_batch_size=256)
    eager = build_problem("dgx-a100-80gb", 8, "llama2-13b", 256, 4096, framework="torchtitan")
    out = check(view, eager)
    assert out.violations == [] and any("compile.enable" in n for n in out.notes)
    assert out.estimate.step_seconds == pytest.approx(doc["predicted"]["step_time_seconds"], rel=1e-9)
    assert out.estimate.step_seconds < eager.estimate(lay).step_seconds
    with pytest.raises(SpecError, match="plan without --compile, or export --to torchtitan"):
        export(doc, "megatron")
    # the plan JSON itself, checked: compiled as planned; hand-edited to a stack without compile: a violation
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(doc))
    out = check(read_config(plan_path, gpus=64), eager)
    assert out.estimate.step_seconds == pytest.approx(doc["predicted"]["step_time_seconds"], rel=1e-9)
    plan_path.write_text(json.dumps(dict(doc, framework="megatron")))
    out = check(read_config(plan_path, gpus=64), eager)
    assert [v["rule"] for v in out.violations] == ["compile"]


def test_a_torchtitan_hsdp_config_is_checked_hybrid_sharded(tmp_path):
    """torchtitan's data_parallel_replicate_degree x data_parallel_shard_degree is read as hybrid sharding
    (dp_shard = the shard degree): the states shard over 8 ranks, not all 128, so check predicts what `estimate`
    predicts for `shard=8` (it read all 128 before, optimistic for memory, and passed this config at 63 GiB)."""
    from planner.estimate import build_problem, layout_from_arg

    path = tmp_path / "hsdp.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n\n[training]\nlocal_batch_size = 2\n'
                    'global_batch_size = 256\nseq_len = 8192\n\n[parallelism]\ndata_parallel_replicate_degree = 16\n'
                    'data_parallel_shard_degree = 8\n\n[activation_checkpoint]\nmode = "selective"\n'
                    'selective_ac_option = "op"\n')
    problem = build_problem("dgx-h100", 16, "llama3-8b", 256, 8192, "bf16", framework="torchtitan")
    out = check(read_config(path, gpus=128), problem)
    assert out.layout.dp == 128 and out.layout.dp_shard == 8 and out.layout.hybrid_sharded
    want = problem.estimate(layout_from_arg("tp=1,pp=1,dp=128,zero=3,shard=8,mbs=2,recompute=selective", problem))
    assert out.estimate.step_seconds == pytest.approx(want.step_seconds, rel=1e-12)
    assert out.estimate.peak_memory_bytes == pytest.approx(want.peak_memory_bytes, rel=1e-12)
    every = problem.estimate(layout_from_arg("tp=1,pp=1,dp=128,zero=3,mbs=2,recompute=selective", problem))
    assert out.estimate.peak_memory_bytes > every.peak_memory_bytes + 10 * 2**30  # 16 B/param over 8, not 128
    # 77.9 GiB with the allocator's cache, over the GPU less the 2 GiB headroom, but its live tensors, context and
    # NCCL fit the GPU: 'tight', which check passes with its memory line (planner.bands.fit_verdict)
    from planner.bands import TIGHT, band_for, verdict_for

    assert out.violations == [] and verdict_for(problem, out.estimate, band_for(problem, out.estimate)) == TIGHT


@pytest.mark.parametrize("layout, rule", [
    ("tp=1,pp=1,dp=64,zero=3,shard=6,mbs=1", "dp_shard_divides_dp"),
    ("tp=1,pp=1,dp=64,zero=0,shard=8,mbs=1", "hybrid_shard"),
    ("tp=1,pp=1,dp=64,zero=3,shard=8,mbs=1,offload=optimizer+params", "hybrid_shard"),
])
def test_hybrid_sharding_rules(layout, rule):
    from planner.estimate import build_problem, layout_from_arg
    from planner.rules import layout_violations

    problem = build_problem("dgx-a100-80gb", 8, "llama2-13b", 256, 4096)
    lay = layout_from_arg(layout, problem)
    assert [v.rule for v in layout_violations(lay, problem.model, problem.training, problem.cluster)] == [rule]


def test_hybrid_sharding_is_refused_where_the_framework_has_none():
    from cluster_specs import SpecError
    from planner.requests import ProblemRequest, estimate_document

    req = ProblemRequest("dgx-a100-80gb", "llama2-13b", 256, 4096, nodes=8)
    layout = "tp=1,pp=1,dp=64,zero=1,shard=8,mbs=1,recompute=full"
    with pytest.raises(SpecError, match="dp_shard 8 of dp 64 at zero_stage 1 -> no hybrid sharding"):
        estimate_document(req, layout, framework="deepspeed")
    zero3 = layout.replace("zero=1", "zero=3")  # Megatron: the partial distributed optimizer, ZeRO-1 only
    with pytest.raises(SpecError, match=r"at zero_stage 3 -> hybrid sharding at zero_stage \(1,\)"):
        estimate_document(req, zero3, framework="megatron")
    assert estimate_document(req, layout, framework="megatron").layout.dp_shard == 8
    assert estimate_document(req, zero3).layout.dp_shard == 8  # generic: any stack


def test_export_of_an_unsupported_hybrid_sharding_names_the_reason():
    """Megatron has hybrid sharding at ZeRO-1 only (the partial distributed optimizer): a ZeRO-3 plan sharded over 8
    of 64 dp ranks exports sharded over all of them, and the change says why, as the framework's refusal does."""
    from planner.integrations.exports import export

    exp = export(_plan("hsdp-zero3"), "megatron")
    assert exp.layout.dp_shard is None
    assert [c for c in exp.changes if c.startswith("dp_shard 8 -> every dp rank (megatron: dp_shard 8 at zero_stage 3 "
                                                   "-> hybrid sharding at zero_stage (1,)")]


@pytest.mark.parametrize("extra, shard, rule, note", [
    ("--use-distributed-optimizer --num-distributed-optimizer-instances 4", 8, None, None),
    ("--use-distributed-optimizer --num-distributed-optimizer-instances 5", None, "dp_shard", None),
    ("--num-distributed-optimizer-instances 4", None, None, "without the distributed optimizer"),
])
def test_megatron_partial_distributed_optimizer_is_read_as_hybrid_sharding(tmp_path, extra, shard, rule, note):
    """--num-distributed-optimizer-instances R: the distributed optimizer over dp / R ranks (dp_shard); R must divide
    dp (a violation naming it, as Megatron asserts); without the distributed optimizer it does nothing (a note)."""
    path = tmp_path / "run.sh"
    path.write_text("torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 "
                    f"--micro-batch-size 1 --global-batch-size 256 --seq-length 4096 --bf16 {extra}\n")
    view = read_config(path, gpus=64)
    assert view.fields.get("dp_shard") == shard
    assert [r for r, _, _ in view.errors] == ([rule] if rule else [])
    assert any(note in n for n in view.notes) if note else True


@pytest.mark.parametrize("zero, shard, rules, note", [
    ({"stage": 3, "mics_shard_size": 8}, 8, ["mics_shard_size"], "read as hybrid sharding over 8 of the 64"),
    ({"stage": 3, "mics_shard_size": -1}, None, [], None),  # DeepSpeed's default: off, and no start-up refusal
    ({"stage": 3, "mics_shard_size": 6}, None, ["mics_shard_size", "dp_shard"], None),
    ({"stage": 3, "mics_shard_size": 64}, None, ["mics_shard_size"], "covers every one of the 64 dp ranks"),
    ({"stage": 3, "mics_shard_size": 8, "offload_optimizer": {"device": "cpu"}}, None,
     ["mics_shard_size", "mics_shard_size"], None),
    ({"stage": 2, "mics_shard_size": 8}, None, ["mics_shard_size"], "MiCS shards ZeRO-3 only"),
    ({"stage": 3, "mics_shard_size": "8"}, None, ["mics_shard_size"], None),
])
def test_a_deepspeed_mics_config_is_read_as_hybrid_sharding(tmp_path, zero, shard, rules, note):
    """zero_optimization.mics_shard_size S: MiCS, ZeRO-3 over groups of S ranks (dp_shard S). It was ignored before,
    so check predicted ZeRO-3 over every dp rank. DeepSpeed 0.19.8 refuses the key at start-up: a violation beside
    the prediction. S must divide dp; MiCS has no CPU offload and shards ZeRO-3 only."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 1,
                                "bf16": {"enabled": True}, "zero_optimization": zero}))
    view = read_config(path, gpus=64)
    assert view.fields.get("dp_shard") == shard
    assert [r for r, _, _ in view.errors] == rules
    assert any(note in n for n in view.notes) if note else True


def test_check_predicts_a_mics_config_as_mics_ran_it(tmp_path):
    """Llama 3 8B on 128 H100 nodes, DeepSpeed ZeRO-3 with mics_shard_size 8: the states over 8 ranks (more than 15
    GiB more per GPU than over all 1024), and the replicas' all-reduce once a step (the DeepSpeed profile), as
    `estimate` predicts shard=8 under that profile."""
    from dataclasses import replace

    from planner.estimate import build_problem, layout_from_arg

    path = tmp_path / "mics.json"
    path.write_text(json.dumps({"train_batch_size": 2048, "train_micro_batch_size_per_gpu": 1,
                                "bf16": {"enabled": True},
                                "zero_optimization": {"stage": 3, "mics_shard_size": 8, "overlap_comm": True}}))
    problem = build_problem("dgx-h100", 128, "llama3-8b", 2048, 8192, "bf16", framework="deepspeed")
    assert problem.knobs.hsdp_replica_reduce_once
    out = check(read_config(path, gpus=1024), problem)
    assert out.layout.dp_shard == 8 and [v["rule"] for v in out.violations] == ["mics_shard_size"]
    want = problem.estimate(layout_from_arg("tp=1,pp=1,dp=1024,zero=3,shard=8,mbs=1,recompute=none", problem))
    assert out.estimate.step_seconds == pytest.approx(want.step_seconds, rel=1e-12)
    assert out.estimate.peak_memory_bytes == pytest.approx(want.peak_memory_bytes, rel=1e-12)
    every = problem.estimate(layout_from_arg("tp=1,pp=1,dp=1024,zero=3,mbs=1,recompute=none", problem))
    # DeepSpeed's ZeRO-3 states, 2 + 2 + 16 B per parameter (profiles.py _DEEPSPEED_RECIPE), of 8.03B parameters
    # over 8 ranks instead of 1024: 20 x 8.03e9 x (1/8 - 1/1024) B = 18.6 GiB more
    assert out.estimate.peak_memory_bytes > every.peak_memory_bytes + 15 * 2**30
    per_micro_batch = replace(problem, knobs=replace(problem.knobs, hsdp_replica_reduce_once=False))
    # 2 micro-batches: FSDP2's HSDP would all-reduce the shards twice a step
    assert per_micro_batch.estimate(out.layout).step_seconds > out.estimate.step_seconds


@pytest.mark.parametrize("line", ["ddp.num_distributed_optimizer_instances=abc", "model.tensor_model_parallel_size=2x"])
def test_a_nemo_override_that_is_not_an_integer_is_named(tmp_path, line):
    """An integer override Megatron-Bridge would refuse is an error naming the key and value (exit 3), not the
    internal error (exit 9) int() raised before."""
    from cluster_specs import SpecError

    path = tmp_path / "overrides.txt"
    path.write_text(f"train.micro_batch_size=1\ntrain.global_batch_size=256\nddp.use_distributed_optimizer=true\n{line}\n")
    key, value = line.split("=")
    with pytest.raises(SpecError, match=f"{key}: '{value}' -> an integer"):
        read_config(path, gpus=64)


def test_a_nearest_layout_is_predicted_as_the_target_framework_runs_it(tmp_path, capsys):
    """A generic plan exported to Megatron becomes its nearest layout; the prediction the export writes is the one
    `check` of that file gives (the target's profile), not the plan's profile's (56.5 s / 36.3 GiB against check's
    53.9 / 35.2 before)."""
    from planner.cli import main

    shape = ["-c", "dgx-a100-40gb", "-n", "8", "-m", "llama2-70b", "-b", "256", "-s", "4096"]
    plan = tmp_path / "plan.json"
    with pytest.raises(SystemExit):
        main(["plan", *shape, "--json", "-o", str(plan)])
    exp = export(json.loads(plan.read_text()), "megatron")
    assert exp.changes and exp.predicted is not None  # the solver's uneven split is not Megatron's
    args = tmp_path / "train.sh"
    args.write_text(exp.text)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["check", str(args), *shape, "--framework", "megatron", "--json"])
    got = json.loads(capsys.readouterr().out)["predicted"]
    assert got["step_time_seconds"] == pytest.approx(exp.predicted["step_time_seconds"], rel=1e-9)
    assert got["peak_memory_bytes_per_gpu"] == pytest.approx(exp.predicted["peak_memory_bytes_per_gpu"], rel=1e-9)


def test_check_refuses_the_torchrun_launch_of_the_benchmark(tmp_path):
    """`export --to torchrun` writes a launch of planner.bench; check once read it as Megatron arguments (batch 16
    instead of the plan's, FAIL at 204.5 GiB). It is refused with what to check instead (exit 3)."""
    from cluster_specs import SpecError

    doc = _plan("zero2")
    path = tmp_path / "launch.sh"
    path.write_text(export(doc, "torchrun").text)
    with pytest.raises(SpecError, match="torchrun launch of `planner.bench`"):
        read_config(path, gpus=64)


def test_a_deepspeed_json_with_tp_says_it_cannot_see_sequence_parallelism(tmp_path):
    """Megatron-DeepSpeed's --sequence-parallel is a launch argument, not a ds_config key: a JSON checked with --tp 2
    is read with it off (+1.7% step, +10.5% memory against a plan with it on), and the check now says so."""
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 1,
                                "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}))
    view = read_config(path, gpus=64, overrides={"tp": 2})
    assert view.fields["sequence_parallel"] is False and any("--fix sp=1" in n for n in view.notes)
    view = read_config(path, gpus=64, overrides={"tp": 2, "sequence_parallel": True})
    assert not any("--fix sp=1" in n for n in view.notes)
