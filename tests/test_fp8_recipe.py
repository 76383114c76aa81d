"""`--fp8-recipe` on plan/estimate: the recipe each framework runs (frameworks.md §1.9, §2.8, §3.8, §4.6), its
default, the refusals, and the recipe carried into the plan JSON and the exports."""

import json
import subprocess
import sys

import pytest

from cluster_specs import SpecError
from planner.estimate import build_problem
from planner.frameworks.capabilities import capabilities, fp8_recipe_for
from planner.integrations.exports import export


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, timeout=120)


ARGS = ("-c", "dgx-h100", "-n", "1", "-m", "llama3-8b", "-b", "16", "-s", "8192")


@pytest.mark.parametrize(("framework", "default"), [
    ("megatron", "delayed"),  # frameworks.md §2.8: --fp8-recipe default delayed
    ("nemo", "tensorwise"),  # §4.6: MixedPrecisionConfig.fp8_recipe defaults to tensorwise
    ("torchtitan", "rowwise"),  # §1.9: Float8LinearConverter recipe_name default rowwise
    (None, "tensorwise"),  # generic: TE current scaling
])
def test_framework_default_recipe(framework, default):
    assert fp8_recipe_for(framework, "fp8", None) == default
    assert build_problem("dgx-h100", 1, "llama3-8b", 16, 8192, "fp8", framework=framework).training.fp8_recipe == default


@pytest.mark.parametrize(("framework", "recipe", "why"), [
    ("torchtitan", "delayed", "torchtitan runs rowwise, tensorwise"),
    ("megatron", "rowwise", "megatron runs delayed, tensorwise, blockwise, mxfp8"),
    ("nemo", "rowwise", "nemo runs"),
    ("deepspeed", None, "deepspeed trains in bf16, fp16, fp32"),
    ("megatron-deepspeed", "delayed", "megatron-deepspeed trains in bf16, fp16, fp32"),
    (None, "fp4", "generic runs delayed, tensorwise, rowwise, blockwise, mxfp8"),
])
def test_recipes_a_framework_cannot_run_are_refused(framework, recipe, why):
    with pytest.raises(SpecError, match=why):
        fp8_recipe_for(framework, "fp8", recipe)


def test_a_16_bit_precision_the_framework_cannot_train_in_is_refused():
    """torchtitan has no fp16 (mixed_precision_param: bfloat16 or float32, frameworks.md §1.6): before, only FP8 was
    checked, so `plan --framework torchtitan` on a V100 (fp16 by default) planned what its export then refused."""
    with pytest.raises(SpecError, match="torchtitan trains in bf16, fp32, fp8"):
        fp8_recipe_for("torchtitan", "fp16", None)
    with pytest.raises(SpecError, match="V100-SXM2-32GB's default fp16 .* pass --precision fp32"):
        build_problem("v100-10gbe", 1, "gpt3-1.3b", 64, 2048, framework="torchtitan")
    assert build_problem("v100-10gbe", 1, "gpt3-1.3b", 64, 2048, "fp32", framework="torchtitan").training.precision \
        == "fp32"
    assert fp8_recipe_for("deepspeed", "fp16", None) is None


def test_a_recipe_without_fp8_is_refused_and_bf16_has_none():
    with pytest.raises(SpecError, match="needs --precision fp8"):
        fp8_recipe_for("megatron", "bf16", "delayed")
    assert fp8_recipe_for("megatron", "bf16", None) is None
    # each framework's recipes are a subset of what the cost model knows
    from cost_models.fp8 import FP8_RECIPES

    for fw in ("megatron", "nemo", "torchtitan", "deepspeed", "megatron-deepspeed", "generic"):
        assert set(capabilities(fw).fp8_recipes) <= set(FP8_RECIPES)


def test_cli_carries_the_recipe_into_the_json_and_it_changes_the_estimate():
    layout = ("--layout", "dp=8,zero=3,mbs=2,recompute=full")
    times = {}
    for recipe in ("delayed", "tensorwise", "rowwise"):
        proc = _cli("estimate", *ARGS, *layout, "--precision", "fp8", "--fp8-recipe", recipe, "--json")
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["inputs"]["training"]["fp8_recipe"] == recipe
        times[recipe] = doc["predicted"]["step_time_seconds"]
    # TE's 12-GEMM autocast speedups on H200: delayed 1.69x > current (tensorwise) 1.58x (modern-training.md §1.5.1)
    assert times["delayed"] < times["tensorwise"]
    bad = _cli("estimate", *ARGS, *layout, "--precision", "fp8", "--fp8-recipe", "delayed", "--framework", "torchtitan")
    assert bad.returncode == 3 and "torchtitan runs rowwise, tensorwise" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_plan_json_recipe_reaches_the_exports():
    proc = _cli("plan", *ARGS, "--precision", "fp8", "--fp8-recipe", "blockwise", "--framework", "megatron",
                "--no-solver", "--top", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["inputs"]["training"]["fp8_recipe"] == "blockwise"
    assert "--fp8-recipe blockwise" in export(plan, "megatron").text.splitlines()
    # Megatron-Bridge's recipe name for blockwise (frameworks.md §4.6: subchannel scaling)
    assert "mixed_precision=bf16_with_fp8_subchannel_scaling_mixed" in export(plan, "nemo").text.splitlines()
    with pytest.raises(SpecError, match="torchtitan runs rowwise, tensorwise"):
        export(plan, "torchtitan")
    with pytest.raises(SpecError, match="deepspeed trains in bf16, fp16, fp32"):
        export(plan, "deepspeed")


def _layout_arg(lay: dict) -> str:
    keys = ("tp", "pp", "dp", "cp", "ep", "micro_batch_size", "recompute", "sequence_parallel", "schedule")
    names = {"micro_batch_size": "mbs", "sequence_parallel": "sp"}
    vals = {k: int(v) if isinstance(v, bool) else v for k, v in lay.items()}
    return ",".join(f"{names.get(k, k)}={vals[k]}" for k in keys) + f",zero={lay['zero_stage']}"


def test_compare_and_scaling_carry_the_recipe_and_plan_with_it():
    """compare/scaling build each cluster's problem as `plan` does: the recipe asked for (or the framework's
    default) is in their JSON, and each pick's step time is what `estimate` gives that layout with that recipe."""
    from planner.decisions.compare import CompareRequest, compare_report
    from planner.decisions.scaling import ScalingRequest, scaling_report
    from planner.requests import ProblemRequest, estimate_document

    cmp = compare_report(CompareRequest("dgx-h100:1", "llama3-8b", 16, 8192, "fp8", use_solver=False,
                                        framework="megatron", fp8_recipe="blockwise")).document
    assert cmp["inputs"]["training"]["fp8_recipe"] == "blockwise" and cmp["framework"] == "megatron"
    sc = scaling_report(ScalingRequest("dgx-h100", "llama3-8b", 16, 8192, node_counts="1", precision="fp8",
                                       use_solver=False, framework="torchtitan")).document
    assert sc["inputs"]["training"]["fp8_recipe"] == "rowwise"  # torchtitan's default (frameworks.md §1.9)
    assert sc["inputs"]["training"]["precision"] == "fp8" and sc["framework"] == "torchtitan"
    for doc, layout, recipe, fw in ((cmp, cmp["clusters"][0]["pick"]["layout"], "blockwise", "megatron"),
                                    (sc, sc["curves"][0]["points"][0]["layout"], "rowwise", "torchtitan")):
        step = (cmp["clusters"][0]["pick"]["predicted"]["step_time_seconds"] if doc is cmp
                else sc["curves"][0]["points"][0]["step_time_seconds"])
        req = ProblemRequest("dgx-h100", "llama3-8b", 16, 8192, 1, "fp8", fp8_recipe=recipe)
        est = estimate_document(req, _layout_arg(layout), framework=fw)
        assert est.predicted.step_time_seconds == pytest.approx(step, rel=1e-12)
        # the same framework with another recipe predicts another time (TE/torchao speedups, modern-training.md §1.5)
        other = estimate_document(ProblemRequest("dgx-h100", "llama3-8b", 16, 8192, 1, "fp8", fp8_recipe="tensorwise"),
                                  _layout_arg(layout), framework=fw)
        assert other.predicted.step_time_seconds != pytest.approx(step, rel=1e-6)


@pytest.mark.parametrize("command", [
    ("compare", "--clusters", "dgx-h100:1"),
    ("scaling", "-c", "dgx-h100", "--node-counts", "1"),
])
def test_compare_and_scaling_refuse_a_recipe_the_framework_cannot_run(command):
    base = (*command, "-m", "llama3-8b", "-b", "16", "-s", "8192", "--no-solver")
    bad = _cli(*base, "--precision", "fp8", "--fp8-recipe", "delayed", "--framework", "torchtitan")
    assert bad.returncode == 3 and "torchtitan runs rowwise, tensorwise" in bad.stderr
    no_fp8 = _cli(*base, "--fp8-recipe", "rowwise", "--json")
    assert no_fp8.returncode == 3 and "needs --precision fp8 (the precision is bf16)" in no_fp8.stdout
    assert "Traceback" not in bad.stderr + no_fp8.stderr


def test_plan_refuses_an_fp8_setup_the_gpu_cannot_run_as_estimate_does():
    """The search trusts the layouts it enumerates, so the GPU rules of the setup (planner/rules.py setup_violations:
    no FP8 tensor cores before Ada/Hopper; MXFP8 only on Blackwell) are checked before it: `plan` returned an MXFP8
    layout on H100 that `estimate` of that very layout refused. compare keeps the cluster as a row saying why."""
    mx = _cli("plan", "-c", "dgx-h100", "-m", "llama3-8b", "-b", "16", "-s", "4096", "--precision", "fp8",
              "--fp8-recipe", "mxfp8", "--no-solver", "--no-schedule")
    assert mx.returncode == 3 and "fp8_recipe: mxfp8 -> needs Blackwell (SM100) GPUs, not H100-SXM" in mx.stderr
    a100 = _cli("plan", "-c", "dgx-a100-80gb", "-m", "llama3-8b", "-b", "16", "-s", "4096", "--precision", "fp8",
                "--no-solver", "--no-schedule")
    assert a100.returncode == 3 and "has no FP8 tensor cores" in a100.stderr
    assert "Traceback" not in mx.stderr + a100.stderr
    from planner.decisions.compare import CompareRequest, compare_report

    doc = compare_report(CompareRequest("dgx-h100:1,dgx-b200:1", "llama3-8b", 16, 4096, "fp8", use_solver=False,
                                        fp8_recipe="mxfp8")).document
    rows = {c["label"]: c for c in doc["clusters"]}
    assert rows["dgx-b200:1"]["feasible"] and rows["dgx-b200:1"]["pick"] is not None
    assert not rows["dgx-h100:1"]["feasible"] and "needs Blackwell" in rows["dgx-h100:1"]["infeasible_reason"]
    cmp = _cli("compare", "--clusters", "dgx-h100:1,dgx-b200:1", "-m", "llama3-8b", "-b", "16", "-s", "4096",
               "--precision", "fp8", "--fp8-recipe", "mxfp8", "--no-solver")
    assert cmp.returncode == 0 and "cannot run" in cmp.stdout and "no layout fits" not in cmp.stdout
    # scaling sweeps one GPU type: no node count can run it, so it is refused as plan refuses it
    sc = _cli("scaling", "-c", "dgx-h100", "--node-counts", "1,2", "-m", "llama3-8b", "-b", "16", "-s", "4096",
              "--precision", "fp8", "--fp8-recipe", "mxfp8", "--no-solver")
    assert sc.returncode == 3 and "needs Blackwell" in sc.stderr and "Traceback" not in sc.stderr


def test_nemo_gathers_parameters_in_fp8_as_bridge_s_recipes_set_it():
    """Megatron-Bridge's mixed-precision recipes (src/megatron/bridge/training/mixed_precision.py @0509780) set
    fp8_param_gather=True for delayed, current (tensorwise) scaling and MXFP8, False for subchannel (blockwise); a
    NeMo plan assumes what the recipe its export names sets, as validation assumed for NVIDIA's Megatron-Core rows.
    Megatron-LM's --fp8-param-gather stays off by default."""
    from planner.frameworks.capabilities import fp8_gathers_params

    assert [fp8_gathers_params("nemo", r) for r in ("delayed", "tensorwise", "mxfp8", "blockwise")] == \
        [True, True, True, False]
    assert not any(fp8_gathers_params("megatron", r) for r in ("delayed", "tensorwise", "mxfp8", "blockwise"))
