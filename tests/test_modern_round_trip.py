"""Context parallelism, expert parallelism and FP8 through the whole path: a plan -> `export` for each framework ->
`check` reads the file back -> the same layout and the same prediction. Before, every reader dropped cp and ep (a
Megatron or NeMo file with --context-parallel-size 2 failed `check` with 'dp*tp*pp must equal the GPUs', an EP file
was checked as ep 1 with another prediction) and read an FP8 file as BF16 (--fp8-format, Megatron-Bridge's FP8
mixed_precision recipes, torchtitan's float8 converter), and `plan --framework deepspeed` could pick a ring CP that
its own export refuses. Option names: ../shared/reference/frameworks.md §1.9 (torchtitan), §2.8 (Megatron), §3.1/§3.8
(DeepSpeed, Megatron-DeepSpeed), §4.6 (Megatron-Bridge)."""

import json

import pytest

from cluster_specs import SpecError
from planner.contract import Predicted
from planner.estimate import build_problem
from planner.frameworks.capabilities import capabilities
from planner.frameworks.restriction import build_restriction
from planner.inputs.specs import LayoutSpec
from planner.integrations.check import check
from planner.integrations.exports import export
from planner.integrations.readers import read_config

NODES = 8  # 64 H100s
LLAMA = ("llama3-70b", 128, 8192)
MIXTRAL = ("mixtral-8x7b", 128, 4096)
QWEN3_MOE = ("qwen3-30b-a3b", 128, 4096)  # a MoE torchtitan 0.3 ships (qwen3 30B-A3B); it builds no Mixtral
SUFFIX = {"megatron": ".sh", "nemo": ".txt", "megatron-deepspeed": ".sh", "deepspeed": ".json", "torchtitan": ".py",
          "torchtitan-toml": ".toml"}

CASES = {  # name: (target, (model, batch, seq), layout fields)
    "megatron-cp-ring": ("megatron", LLAMA, dict(tp=4, pp=4, dp=2, cp=2, zero_stage=1, num_micro_batches=64,
                                                 sequence_parallel=True, schedule="interleaved_1f1b",
                                                 virtual_stages=5)),
    "megatron-cp-allgather": ("megatron", LLAMA, dict(tp=8, pp=2, dp=2, cp=2, cp_comm="all_gather", zero_stage=1,
                                                      num_micro_batches=64, sequence_parallel=True)),
    "megatron-cp-ulysses": ("megatron", LLAMA, dict(tp=4, pp=4, dp=2, cp=2, cp_comm="a2a", zero_stage=1,
                                                    num_micro_batches=64, sequence_parallel=True)),
    "nemo-cp-ring": ("nemo", LLAMA, dict(tp=4, pp=4, dp=2, cp=2, zero_stage=1, num_micro_batches=64,
                                         sequence_parallel=True, schedule="interleaved_1f1b", virtual_stages=5)),
    "torchtitan-cp": ("torchtitan", LLAMA, dict(tp=2, dp=16, cp=2, zero_stage=3, num_micro_batches=8,
                                                sequence_parallel=True, recompute="selective")),
    "torchtitan-toml-cp": ("torchtitan-toml", LLAMA, dict(tp=2, dp=16, cp=2, zero_stage=3, num_micro_batches=8,
                                                          sequence_parallel=True, recompute="selective")),
    "deepspeed-ulysses": ("deepspeed", LLAMA, dict(dp=32, cp=2, cp_comm="a2a", zero_stage=3, micro_batch_size=4,
                                                   recompute="full")),
    "megatron-deepspeed-ulysses": ("megatron-deepspeed", LLAMA, dict(tp=2, pp=4, dp=4, cp=2, cp_comm="a2a",
                                                                     zero_stage=1, num_micro_batches=32,
                                                                     recompute="full")),
    "megatron-ep": ("megatron", MIXTRAL, dict(dp=64, ep=4, zero_stage=3, num_micro_batches=2)),
    "megatron-ep-etp": ("megatron", MIXTRAL, dict(tp=2, dp=32, ep=4, etp=2, zero_stage=1, num_micro_batches=4,
                                                  sequence_parallel=True)),
    "nemo-ep": ("nemo", MIXTRAL, dict(dp=64, ep=4, zero_stage=3, num_micro_batches=2)),
    "torchtitan-ep": ("torchtitan", QWEN3_MOE, dict(dp=64, ep=4, zero_stage=3, num_micro_batches=2)),
}
DENSE = dict(dp=64, zero_stage=3, num_micro_batches=2, recompute="full")
FP8_CASES = {  # name: (target, recipe, the FP8 parameter all-gather the plan asks for)
    "megatron-delayed-param-gather": ("megatron", "delayed", True),
    "megatron-tensorwise": ("megatron", "tensorwise", False),
    "nemo-tensorwise": ("nemo", "tensorwise", True),  # Bridge's current-scaling recipe sets fp8_param_gather
    "nemo-blockwise": ("nemo", "blockwise", False),
    "torchtitan-toml-tensorwise": ("torchtitan-toml", "tensorwise", True),  # its export turns the float8 gather on
    "torchtitan-toml-rowwise": ("torchtitan-toml", "rowwise", False),
}


def _framework(target: str) -> str:
    return "torchtitan" if target == "torchtitan-toml" else target


def _plan(target: str, shape: tuple, fields: dict, fp8: tuple[str, bool] | None = None) -> dict:
    """A plan document as `plan --framework F -o` writes it: the layout and its prediction under F's profile."""
    model, batch, seq = shape
    problem = build_problem("dgx-h100", NODES, model, batch, seq, "fp8" if fp8 else None,
                            framework=_framework(target), fp8_recipe=fp8[0] if fp8 else None,
                            fp8_param_gather=fp8[1] if fp8 else None)
    lay = LayoutSpec.model_validate(fields)
    from planner.inputs.models import load_model

    return {"layout": lay.model_dump(mode="json"), "framework": _framework(target),
            "predicted": Predicted.from_estimate(problem.estimate(lay), problem.knobs.memory_headroom_bytes).model_dump(),
            "inputs": {"model": load_model(model).model_dump(mode="json"),
                       "training": problem.training.model_dump(mode="json"),
                       "cluster": problem.cluster.model_dump(mode="json")}}


def _round_trip(target: str, shape: tuple, fields: dict, tmp_path, fp8=None):
    fw = _framework(target)
    doc = _plan(target, shape, fields, fp8)
    exp = export(doc, fw, torchtitan_format="toml" if target == "torchtitan-toml" else "python")
    path = tmp_path / f"cfg{SUFFIX[target]}"
    path.write_text(exp.text)
    if target == "megatron-deepspeed":  # its ZeRO settings live in the ds_config beside the arguments
        (tmp_path / "ds_config.json").write_text(export(doc, "deepspeed", framework="megatron-deepspeed").text)
    lay = exp.layout
    overrides = {"tp": lay.tp, "pp": lay.pp, "recompute": lay.recompute} if target == "deepspeed" else {}
    view = read_config(path, gpus=NODES * 8, overrides=dict(overrides), global_batch_size=shape[1])
    model, batch, seq = shape
    problem = build_problem("dgx-h100", NODES, model, view.global_batch_size or batch, view.seq_length or seq,
                            view.precision or "bf16", framework=fw)
    return doc, exp, view, check(view, problem, overrides=overrides), problem


@pytest.mark.parametrize("name", list(CASES))
def test_a_cp_or_ep_plan_comes_back_from_its_export_with_the_same_prediction(name, tmp_path):
    target, shape, fields = CASES[name]
    doc, exp, view, out, problem = _round_trip(target, shape, fields, tmp_path)
    assert exp.changes == [], exp.changes  # each framework runs these layouts as planned
    lay = exp.layout
    for key in ("cp", "cp_comm", "ep", "etp"):  # what the file says, read back
        assert view.fields.get(key, LayoutSpec.model_fields[key].default) == getattr(lay, key), (key, view.fields)
    assert out.violations == [], out.violations
    assert out.layout is not None and (out.layout.cp, out.layout.cp_comm, out.layout.ep, out.layout.etp, out.layout.dp) \
        == (lay.cp, lay.cp_comm, lay.ep, lay.etp, lay.dp)
    got = Predicted.from_estimate(out.estimate, problem.knobs.memory_headroom_bytes).model_dump()
    assert got["step_time_seconds"] == pytest.approx(doc["predicted"]["step_time_seconds"], rel=1e-9)
    assert got["peak_memory_bytes_per_gpu"] == pytest.approx(doc["predicted"]["peak_memory_bytes_per_gpu"], rel=1e-9)


@pytest.mark.parametrize("name", list(FP8_CASES))
def test_an_fp8_plan_is_checked_as_fp8_with_its_recipe(name, tmp_path):
    import argparse

    from planner.integrations.check import check_file

    target, recipe, gather = FP8_CASES[name]
    doc = _plan(target, LLAMA, DENSE, (recipe, gather))
    assert (doc["inputs"]["training"]["fp8_recipe"], doc["inputs"]["training"]["fp8_param_gather"]) == (recipe, gather)
    exp = export(doc, _framework(target), torchtitan_format="toml" if target == "torchtitan-toml" else "python")
    path = tmp_path / f"cfg{SUFFIX[target]}"
    path.write_text(exp.text)
    view = read_config(path, gpus=NODES * 8, global_batch_size=LLAMA[1])
    assert (view.precision, view.fp8_recipe) == ("fp8", recipe)
    args = argparse.Namespace(cluster="dgx-h100", nodes=NODES, model=LLAMA[0], global_batch_size=None, seq_len=None,
                              tp=None, pp=None, fix=None, framework=None, precision=None, headroom_gib=2.0,
                              allow_tp_across_nodes=False, calibration=None)
    report = check_file(path, args)
    assert report["passed"], report["violations"]
    for key in ("step_time_seconds", "peak_memory_bytes_per_gpu"):
        assert report["predicted"][key] == pytest.approx(doc["predicted"][key], rel=1e-9), key
    bf16 = _plan(target, LLAMA, DENSE)["predicted"]["step_time_seconds"]
    assert report["predicted"]["step_time_seconds"] < bf16  # read as BF16 before: the BF16 step came back


def test_a_python_recipe_is_checked_as_fp8_when_asked(tmp_path):
    """torchtitan 0.3's float8 converter is model code the reader cannot see: --precision fp8 upgrades its bf16."""
    import argparse

    from planner.integrations.check import check_file

    doc = _plan("torchtitan", LLAMA, DENSE, ("rowwise", False))
    path = tmp_path / "planner_job.py"
    path.write_text(export(doc, "torchtitan").text)
    args = argparse.Namespace(cluster="dgx-h100", nodes=NODES, model=LLAMA[0], global_batch_size=None, seq_len=None,
                              tp=None, pp=None, fix=None, framework=None, precision="fp8", headroom_gib=2.0,
                              allow_tp_across_nodes=False, calibration=None)
    report = check_file(path, args)
    assert report["predicted"]["step_time_seconds"] == pytest.approx(doc["predicted"]["step_time_seconds"], rel=1e-9)
    assert not any("from the config" in n for n in report["notes"])
    args.precision = "fp32"  # any other disagreement: the config's own precision wins, and a note says so
    report = check_file(path, args)
    assert any("precision bf16 from the config (not --precision fp32)" in n for n in report["notes"])


def test_a_python_recipe_with_the_float8_converter_is_checked_as_fp8(tmp_path):
    """The export's note says where torchtitan 0.3's converter goes; once it is there, check reads FP8 from the file
    (Float8LinearConverter.Config, recipe_name rowwise by default, frameworks.md §1.9) and gives the plan's
    prediction without --precision; without it, a note says the file was checked as BF16."""
    import argparse

    from planner.integrations.check import check_file

    doc = _plan("torchtitan", LLAMA, DENSE, ("rowwise", False))
    text = export(doc, "torchtitan").text
    args = argparse.Namespace(cluster="dgx-h100", nodes=NODES, model=LLAMA[0], global_batch_size=None, seq_len=None,
                              tp=None, pp=None, fix=None, framework=None, precision=None, headroom_gib=2.0,
                              allow_tp_across_nodes=False, calibration=None)
    bare = tmp_path / "bare.py"
    bare.write_text(text)
    report = check_file(bare, args)
    assert any("no Float8LinearConverter.Config" in n for n in report["notes"])
    assert report["predicted"]["step_time_seconds"] > doc["predicted"]["step_time_seconds"]  # BF16 is slower
    converted = tmp_path / "converted.py"
    converted.write_text(text.replace("model_spec=model_registry(", "model_converters=ModelConvertersContainer.Config("
                                      "converters=[Float8LinearConverter.Config(filter_fqns=['output'])]),\n"
                                      "        model_spec=model_registry(", 1))
    report = check_file(converted, args)
    assert report["predicted"]["step_time_seconds"] == pytest.approx(doc["predicted"]["step_time_seconds"], rel=1e-9)
    assert not any("Float8LinearConverter" in n for n in report["notes"])
    converted.write_text(converted.read_text().replace("Config(filter_fqns", "Config(recipe_name='tensorwise', "
                                                                            "filter_fqns"))
    assert check_file(converted, args)["predicted"]["step_time_seconds"] != pytest.approx(
        doc["predicted"]["step_time_seconds"], rel=1e-9)  # the recipe it names is the one costed


def test_megatron_deepspeed_writes_ulysses_as_its_own_flag(tmp_path):
    _, exp, _, _, _ = _round_trip(*CASES["megatron-deepspeed-ulysses"], tmp_path)
    lines = exp.text.splitlines()
    assert "--ds-sequence-parallel-size 2" in lines
    assert not any(line.startswith(("--context-parallel-size", "--cp-comm-type", "--sequence-parallel"))
                   for line in lines)  # Megatron-DeepSpeed has no CP flag; Ulysses excludes SP (§3.1)
    doc = _plan("megatron-deepspeed", LLAMA, dict(tp=2, pp=4, dp=4, cp=2, zero_stage=1, num_micro_batches=32))
    with pytest.raises(SpecError, match="a2a"):  # a ring CP cannot be written for it
        export(doc, "megatron-deepspeed")


def test_a_deepspeed_json_with_ulysses_reads_as_cp(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
                                "sequence_parallel_size": 4, "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}))
    view = read_config(path, gpus=128)
    assert (view.fields["dp"], view.fields["cp"], view.fields["cp_comm"]) == (32, 4, "a2a")  # dp = 128 / 4
    assert view.fields["num_micro_batches"] == 1  # the triad over the DP degree: 64 = 2 x 1 x 32


@pytest.mark.parametrize("framework,comm", [("deepspeed", "a2a"), ("megatron-deepspeed", "a2a"), ("torchtitan", "p2p"),
                                            ("megatron", "p2p"), ("nemo", "p2p"), ("generic", "p2p")])
def test_plan_searches_the_context_parallelism_the_framework_runs(framework, comm):
    from planner.search import PlanOptions, enumerate_bases

    problem = build_problem("dgx-h100", NODES, "llama3-70b", 64, 65536, framework=framework)
    opts = PlanOptions(restriction=build_restriction(framework, problem.model.vocab_size))
    bases = [b for b in enumerate_bases(problem, opts, offload=False) if b.get("cp", 1) > 1]
    assert bases and {b["cp_comm"] for b in bases} == {comm}
    caps = capabilities(framework)
    assert all(caps.refusal(b) is None for b in bases)
    heads = problem.model.num_kv_heads  # Ulysses needs the KV heads per TP rank divisible by cp (TE)
    assert comm != "a2a" or all(heads // b["tp"] % b["cp"] == 0 for b in bases)


def test_cp_and_ep_can_be_pinned_and_the_rest_say_why_not():
    from planner.frameworks.restriction import parse_fix

    assert parse_fix(["cp=2,ep=4"]) == {"cp": 2, "ep": 4}
    for key, why in (("cp_comm=a2a", "ring"), ("etp=2", "expert tensor"), ("layers_per_stage=10/10", "per-stage")):
        with pytest.raises(SpecError, match=why):
            parse_fix([key])
    # pinned below the search's own CP threshold (4,096 tokens per rank): still planned, as asked
    problem = build_problem("dgx-h100", NODES, "llama3-70b", 128, 2048, framework="megatron")
    from planner.search import PlanOptions, enumerate_bases

    opts = PlanOptions(restriction=build_restriction("megatron", problem.model.vocab_size, ["cp=2"]))
    assert {b["cp"] for b in enumerate_bases(problem, opts, offload=False)} == {2}


def test_megatron_expert_tensor_parallelism_defaults_to_tp(tmp_path):
    """--expert-tensor-parallel-size None -> tp in Megatron-LM (frameworks.md §2.1, arguments.py L587-588)."""
    base = ("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --micro-batch-size 1 "
            "--global-batch-size 128 --seq-length 4096 --bf16 --expert-model-parallel-size 4 ")
    path = tmp_path / "moe.sh"
    path.write_text(base + "--num-experts 8\n")
    view = read_config(path, gpus=64)
    assert (view.fields["ep"], view.fields["etp"]) == (4, 2)
    assert any("Megatron-LM's default is tp (2)" in n for n in view.notes)
    path.write_text(base + "--num-experts 8 --expert-tensor-parallel-size 1\n")
    assert read_config(path, gpus=64).fields["etp"] == 1


def test_a_plan_json_is_checked_against_its_own_framework(tmp_path):
    """A plan file made before a rule existed (here: a ring CP under DeepSpeed, which runs Ulysses only) or edited by
    hand fails `check` against the framework it names; before, only a config of another framework was held to it."""
    import argparse

    from planner.integrations.check import check_file

    doc = _plan("deepspeed", LLAMA, dict(dp=32, cp=2, zero_stage=3, micro_batch_size=4, recompute="full"))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    args = argparse.Namespace(cluster="dgx-h100", nodes=NODES, model=LLAMA[0], global_batch_size=None, seq_len=None,
                              tp=None, pp=None, fix=None, framework=None, precision=None, headroom_gib=2.0,
                              allow_tp_across_nodes=False, calibration=None)
    report = check_file(path, args)
    assert [v["rule"] for v in report["violations"]] == ["framework"]
    assert "cp_comm a2a" in report["violations"][0]["message"]
    doc["layout"]["cp_comm"] = "a2a"  # the Ulysses twin passes
    path.write_text(json.dumps(doc))
    assert check_file(path, args)["passed"]


@pytest.mark.parametrize("recipe, framework", [("blockwise", "megatron"), ("tensorwise", "torchtitan")])
def test_check_of_an_fp8_plan_file_keeps_its_recipe(tmp_path, recipe, framework):
    """`check plan.json` predicts with the plan's own FP8 recipe and FP8 gather (inputs.training), not the framework's
    default recipe: a blockwise Megatron plan of 5.40 s was checked at 4.89 s (the delayed default)."""
    import json
    import subprocess
    import sys

    def run(*args):
        proc = subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout)

    path = tmp_path / "plan.json"
    run("plan", "-c", "dgx-h100", "-n", "2", "-m", "llama3-8b", "-b", "128", "-s", "8192", "--precision", "fp8",
        "--fp8-recipe", recipe, "--framework", framework, "--no-solver", "--json", "-o", str(path))
    plan = json.loads(path.read_text())
    checked = run("check", str(path), "-c", "dgx-h100", "-n", "2", "-m", "llama3-8b", "--json")
    result = checked["results"][0] if "results" in checked else checked
    assert result["predicted"]["step_time_seconds"] == pytest.approx(plan["predicted"]["step_time_seconds"], rel=1e-9)
    assert result["predicted"]["peak_memory_bytes_per_gpu"] == pytest.approx(
        plan["predicted"]["peak_memory_bytes_per_gpu"], rel=1e-9)
