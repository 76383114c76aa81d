"""Exports, config checks, the schema contract, and the schedule pictures."""

import json
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from planner import errors
from planner.integrations.check import megatron_parser

ROOT = Path(__file__).resolve().parents[1]
# pp, tp and recompute pinned: a DeepSpeed JSON carries no PP, no sequence parallelism and no recompute (it is
# model-defined), so its check
# must see the same layout as the plan
PLAN_ARGS = ["-c", "dgx-a100-80gb", "-n", "16", "-m", "llama2-13b", "-b", "512", "-s", "4096", "--fix", "pp=1,tp=1,recompute=none"]


def run(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    proc = run("plan", *PLAN_ARGS, "--json", "-o", str(path))
    assert proc.returncode == 0, proc.stderr
    return path


@pytest.fixture(scope="module")
def interleaved_plan(tmp_path_factory):
    """A hand-written plan with pp, interleaving, recompute, ZeRO-1 and uneven stages, to exercise every flag."""
    path = tmp_path_factory.mktemp("plan2") / "plan.json"
    proc = run("estimate", "-c", "dgx-a100-80gb", "-n", "16", "-m", "llama2-13b", "-b", "512", "-s", "4096",
               "--layout", "tp=2,pp=4,dp=16,zero=1,mbs=2,recompute=selective,schedule=interleaved_1f1b,vpp=2", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    doc["kind"] = "plan"
    path.write_text(json.dumps(doc))
    return path, doc


def test_megatron_export_parses_with_documented_names(interleaved_plan):
    path, doc = interleaved_plan
    proc = run("export", str(path), "--to", "megatron")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith("#")]
    args, unknown = megatron_parser().parse_known_args(shlex.split(" ".join(lines)))
    assert unknown == []
    lay = doc["layout"]
    assert args.tensor_model_parallel_size == lay["tp"] == 2
    assert args.pipeline_model_parallel_size == lay["pp"] == 4
    assert args.micro_batch_size == 2 and args.global_batch_size == 512 and args.seq_length == 4096
    assert args.sequence_parallel and args.use_distributed_optimizer and args.bf16
    assert args.recompute_granularity == "selective"
    # not --num-layers-per-virtual-pipeline-stage: it cannot be combined with the uneven-split flags (§2.3)
    assert args.num_virtual_stages_per_pipeline_rank == 2 and args.num_layers_per_virtual_pipeline_stage is None
    assert args.swiglu and args.normalization == "RMSNorm" and args.untie_embeddings_and_output_weights


def test_megatron_export_uneven_stages_and_partial_recompute(tmp_path):
    doc = json.loads((ROOT / "tests" / "data" / "plan_uneven.json").read_text())
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    proc = run("export", str(path), "--to", "megatron")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith("#")]
    args, _ = megatron_parser().parse_known_args(shlex.split(" ".join(lines)))
    assert args.decoder_first_pipeline_num_layers == 9 and args.decoder_last_pipeline_num_layers == 9
    assert args.recompute_granularity == "full" and args.recompute_method == "block" and args.recompute_num_layers == 3


def test_deepspeed_export(plan_file):
    doc = json.loads(plan_file.read_text())
    proc = run("export", str(plan_file), "--to", "deepspeed")
    cfg = json.loads(proc.stdout)
    lay = doc["layout"]
    assert cfg["train_batch_size"] == 512
    assert cfg["train_micro_batch_size_per_gpu"] == lay["micro_batch_size"]
    assert cfg["gradient_accumulation_steps"] == lay["num_micro_batches"]
    assert cfg["train_batch_size"] == lay["micro_batch_size"] * lay["num_micro_batches"] * lay["dp"]
    assert cfg["zero_optimization"]["stage"] == lay["zero_stage"]
    assert cfg["bf16"]["enabled"] is True


def test_torchtitan_export(interleaved_plan, tmp_path):
    path, doc = interleaved_plan
    out = tmp_path / "job.toml"
    proc = run("export", str(path), "--to", "torchtitan", "--torchtitan-format", "toml", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    cfg = tomllib.loads(out.read_text())
    par, train = cfg["parallelism"], cfg["training"]
    assert par["tensor_parallel_degree"] == 2 and par["pipeline_parallel_degree"] == 4
    assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] == 16
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    # 40 layers over 4 x 2 stages of 5: the plan's split, so no embedding/output allowance (torchtitan's default 1)
    assert par["pipeline_parallel_microbatch_size"] == 2 and par["pipeline_parallel_layers_per_stage"] == 5
    assert par["pipeline_parallel_first_stage_less_layers"] == par["pipeline_parallel_last_stage_less_layers"] == 0
    assert train["local_batch_size"] * 16 == train["global_batch_size"] == 512 and train["seq_len"] == 4096
    assert cfg["activation_checkpoint"]["mode"] == "selective" and cfg["model"]["name"] == "llama3"


def test_torchrun_export(plan_file):
    proc = run("export", str(plan_file), "--to", "torchrun")
    tokens = shlex.split(proc.stdout.replace("\\\n", " ").split("\n", 1)[1])
    assert tokens[0] == "torchrun" and "--nnodes=16" in tokens and "--nproc-per-node=8" in tokens
    assert any(t.startswith("--rdzv-endpoint=") for t in tokens)


def test_export_refuses_what_a_framework_cannot_do(tmp_path):
    doc = json.loads((ROOT / "tests" / "data" / "plan_uneven.json").read_text())
    doc["layout"].update(pp=1, zero_stage=3, offload="optimizer+params", layers_per_stage=None,
                         recompute_layers_per_stage=None, schedule="1f1b", dp=8, num_micro_batches=32,
                         micro_batch_size=1)  # a valid layout (64 GPUs, batch 256)
    path = tmp_path / "z3.json"
    path.write_text(json.dumps(doc))
    proc = run("export", str(path), "--to", "megatron")  # Megatron offloads only the optimizer
    assert proc.returncode == errors.EXIT_INPUT and "offload" in proc.stderr and "Traceback" not in proc.stderr
    proc = run("export", str(path), "--to", "fairseq")
    assert proc.returncode == errors.EXIT_INPUT and "allowed" in proc.stderr


def test_export_refuses_a_hand_edited_plan_that_breaks_a_layout_rule(tmp_path):
    doc = json.loads((ROOT / "tests" / "data" / "plan_uneven.json").read_text())
    doc["layout"]["tp"] = 3  # llama2-13b has 40 heads; 3 x pp x dp is not the cluster's GPU count either
    path = tmp_path / "tp3.json"
    path.write_text(json.dumps(doc))
    proc = run("export", str(path), "--to", "megatron")
    assert proc.returncode == errors.EXIT_INPUT and "tp: 3 -> must divide num_attention_heads (40)" in proc.stderr
    assert proc.stdout == ""


# ---- check ------------------------------------------------------------------------------------------------

CHECK = ["--cluster", "dgx-a100-80gb", "--nodes", "16", "--model", "llama2-13b"]


def test_check_passes_each_format(plan_file, tmp_path):
    # the plan itself
    proc = run("check", str(plan_file), *CHECK)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    planned = json.loads(plan_file.read_text())["predicted"]
    same = json.loads(run("check", str(plan_file), *CHECK, "--json").stdout)["predicted"]
    # the same layout on the same inputs: check predicts exactly what plan did
    assert same["step_time_seconds"] == pytest.approx(planned["step_time_seconds"], rel=1e-9)
    assert same["peak_memory_bytes_per_gpu"] == pytest.approx(planned["peak_memory_bytes_per_gpu"], rel=1e-9)
    # and each export of it
    for to, name in (("megatron", "args.txt"), ("deepspeed", "ds.json"), ("torchtitan", "job.py")):
        out = tmp_path / name
        assert run("export", str(plan_file), "--to", to, "-o", str(out)).returncode == 0
        layout = json.loads(plan_file.read_text())["layout"]
        extra = ["--tp", str(layout["tp"])] if to == "deepspeed" else []
        extra += ["--seq-len", "4096"] if to == "deepspeed" else []
        proc = run("check", str(out), *CHECK, *extra, "--json")
        report = json.loads(proc.stdout)
        assert proc.returncode == 0 and report["passed"], (to, report["violations"])
        got = report["predicted"]
        # fits: the peak plus the default 2 GiB headroom is within the 80 GB of an A100-80GB
        assert got["fits"] is True and got["gpu_memory_bytes"] == 80 * 2**30
        assert got["peak_memory_bytes_per_gpu"] + 2 * 2**30 <= got["gpu_memory_bytes"]


FAILING_MEGATRON = {
    "dp*tp*pp": "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --data-parallel-size 2 --micro-batch-size 1 --global-batch-size 512 --seq-length 4096",
    "tp": "--tensor-model-parallel-size 16 --pipeline-model-parallel-size 1 --micro-batch-size 1 --global-batch-size 512 --seq-length 4096",
    "global_batch_size": "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 2 --micro-batch-size 3 --global-batch-size 512 --seq-length 4096",
    "pp*virtual_stages": "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 64 --data-parallel-size 2 --micro-batch-size 1 --global-batch-size 512 --seq-length 4096",
    "num_micro_batches": "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --micro-batch-size 1 --global-batch-size 12 --seq-length 4096 --num-layers-per-virtual-pipeline-stage 5 --num-layers 40",
    "memory": "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --micro-batch-size 16 --global-batch-size 2048 --seq-length 4096",
}


@pytest.mark.parametrize("rule", list(FAILING_MEGATRON))
def test_check_fails_megatron(rule, tmp_path):
    path = tmp_path / "args.txt"
    path.write_text(FAILING_MEGATRON[rule] + "\n")
    proc = run("check", str(path), *CHECK, "--json")
    assert proc.returncode == errors.EXIT_CHECK_FAILED, proc.stderr
    report = json.loads(proc.stdout)
    assert any(v["rule"] == rule for v in report["violations"]), report["violations"]
    assert report["passed"] is False
    # every violation says what to change, in words that name the rule's field (not just a non-empty string)
    assert all(len(v["hint"].split()) >= 3 for v in report["violations"]), report["violations"]


def test_check_fails_deepspeed_and_torchtitan(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 500, "train_micro_batch_size_per_gpu": 2,
                              "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 3},
                              "pipeline": {"stages": 2}}))
    report = json.loads(run("check", str(ds), *CHECK, "--seq-len", "4096", "--json").stdout)
    rules = {v["rule"] for v in report["violations"]}
    assert {"global_batch_size", "zero_stage"} <= rules
    tt = tmp_path / "job.toml"
    tt.write_text("[parallelism]\ntensor_parallel_degree = 3\ndata_parallel_shard_degree = -1\n"
                  "[training]\nlocal_batch_size = 4\nseq_len = 4096\n")
    proc = run("check", str(tt), *CHECK, "--json")
    assert proc.returncode == errors.EXIT_CHECK_FAILED
    rules = {v["rule"] for v in json.loads(proc.stdout)["violations"]}
    assert "tp" in rules  # 40 heads and 8-GPU nodes are not divisible by 3
    messages = {v["message"] for v in json.loads(proc.stdout)["violations"]}
    # llama2-13b: 40 heads, hidden 5120; shard -1 = 128 GPUs // 3 = 42 (torchtitan's rule), 42 x 3 = 126
    assert {"tp: 3 -> must divide num_attention_heads (40)", "tp: 3 -> must divide hidden_size (5120)",
            "dp*tp*pp: 42*3*1 = 126 -> must equal the cluster's 128 GPUs (16 nodes x 8)"} <= messages


def test_check_human_output_and_bad_input(tmp_path):
    path = tmp_path / "args.txt"
    # 13B, tp 8, 16 sequences of 4096 per micro-batch: activations overflow 80 GB; full recompute fits
    path.write_text("--tensor-model-parallel-size 8 --micro-batch-size 16 --global-batch-size 2048 --seq-length 4096 --bf16\n")
    proc = run("check", str(path), *CHECK)
    assert proc.returncode == 1 and "FAIL" in proc.stdout and "fix:" in proc.stdout
    assert "recompute" in proc.stdout  # the memory hint names a remedy that fits
    bad = tmp_path / "broken.toml"
    bad.write_text("[parallelism\n")
    proc = run("check", str(bad), *CHECK)
    assert proc.returncode == errors.EXIT_INPUT and "malformed TOML" in proc.stderr and "Traceback" not in proc.stderr


# ---- schema -----------------------------------------------------------------------------------------------

# the checked-in schemas are generated and held current in tests/test_contract.py


def test_outputs_validate_against_the_schema(plan_file, tmp_path):
    from planner.contract import CheckReport, PlanDocument

    PlanDocument.model_validate(json.loads(plan_file.read_text()))
    report = json.loads(run("check", str(plan_file), *CHECK, "--json").stdout)
    CheckReport.model_validate(report)


# ---- pictures ---------------------------------------------------------------------------------------------

def test_schedule_command_and_svg(tmp_path):
    svg = tmp_path / "s.svg"
    proc = run("schedule", "--pp", "4", "-m", "8", "--compare", "naive,gpipe,1f1b,interleaved_1f1b,zero_bubble",
               "--svg", str(svg), "--width", "60")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.replace("\n", " ")  # the console wraps long lines at 80 columns
    for name in ("naive", "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"):
        assert f"{name}: pp=4" in out
    # the seed's argument in numbers: naive idles 75%, GPipe/1F1B 27.3%, interleaving less, ZB-H1 least
    assert "bubble 75.0%" in out and "bubble 27.3%" in out and "bubble 15.8%" in out
    assert "peak in-flight micro-batches per stage: 8, 8, 8, 8" in out  # GPipe keeps every micro-batch
    assert "4, 3, 2, 1" in out  # 1F1B keeps p - stage
    assert svg.read_text().startswith("<svg")


def test_plan_draws_its_schedule():
    # GPT-3 175B on 128 DGX A100 nodes: the pick is pipelined (tests/test_planner.py, row-5 scenario)
    args = ["-c", "dgx-a100-80gb", "-n", "128", "-m", "gpt3-175b", "-b", "1536", "-s", "2048", "--no-solver"]
    assert json.loads(run("plan", *args, "--json").stdout)["layout"]["pp"] > 1
    proc = run("plan", *args)
    assert proc.returncode == 0
    assert "Pipeline schedule" in proc.stdout and "bubble" in proc.stdout
    proc2 = run("plan", *args, "--no-schedule")
    assert proc2.returncode == 0 and "Pipeline schedule" not in proc2.stdout


# ---- one failing config per rule, for each input format -------------------------------------------------------

BASE = dict(dp=16, tp=2, pp=4, zero_stage=1, offload="none", micro_batch_size=1, num_micro_batches=32,
            recompute="selective", sequence_parallel=True, schedule="interleaved_1f1b", virtual_stages=2,
            layers_per_stage=None, recompute_layers_per_stage=None)  # passes on 16 x 8 A100 80GB, llama2-13b, B=512
BREAK = {
    # rule -> how to break it (the layout a team might have written)
    "dp*tp*pp": dict(dp=8, num_micro_batches=64),  # 8 x 2 x 4 = 64 GPUs on a 128-GPU cluster
    "tp": dict(tp=16, dp=2, num_micro_batches=256),  # TP across nodes, and 40 heads do not divide by 16
    "global_batch_size": dict(micro_batch_size=3, num_micro_batches=10),  # 3 x 10 x 16 = 480 != 512
    "num_micro_batches": dict(num_micro_batches=34, micro_batch_size=1, dp=16),  # interleaving needs m % pp == 0
    "memory": dict(recompute="none", sequence_parallel=False, micro_batch_size=8, num_micro_batches=4, tp=2,
                   schedule="gpipe", virtual_stages=1),  # GPipe keeps every micro-batch of 8 x 4096 tokens
}
FORMATS = {"plan": "plan.json", "megatron": "args.txt", "deepspeed": "ds.json", "torchtitan": "job.toml"}
# Megatron-LM and DeepSpeed derive the data-parallel size from the world size, so a wrong product cannot be written
# in them; DeepSpeed's JSON has no virtual stages or schedule to get wrong.
CANNOT_SAY = {("megatron", "dp*tp*pp"), ("deepspeed", "dp*tp*pp"), ("deepspeed", "num_micro_batches")}
# DeepSpeed has no GPipe to choose: its memory failure is 16 sequences of 4096 tokens per micro-batch, no recompute
FORMAT_BREAK = {("deepspeed", "memory"): dict(recompute="none", sequence_parallel=False, micro_batch_size=16,
                                              num_micro_batches=2, schedule="1f1b", virtual_stages=1)}
BATCH_OF_RULE = {"num_micro_batches": 544}  # 1 x 34 x 16: a consistent batch whose 34 micro-batches pp=4 cannot interleave


def _write_config(fmt: str, layout: dict, tmp_path, batch: int = 512) -> Path:
    doc = json.loads((ROOT / "tests" / "data" / "plan_uneven.json").read_text())
    doc["inputs"]["training"]["global_batch_size"] = batch
    doc["layout"] = layout
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    if fmt == "plan":
        return plan
    out = tmp_path / FORMATS[fmt]
    from planner.integrations.exports import export

    try:
        result = export(doc, fmt, torchtitan_format="toml")
    except Exception as exc:  # the exporter itself refuses some layouts
        pytest.skip(f"{fmt} cannot express this layout: {exc}")
    if result.changes:
        pytest.skip(f"{fmt} expresses the nearest layout instead: {result.changes}")
    out.write_text(result.text)
    return out


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("rule", ["pass", *BREAK])
def test_check_matrix(fmt, rule, tmp_path):
    if (fmt, rule) in CANNOT_SAY:
        pytest.skip(f"a {fmt} config cannot express the {rule} rule")
    layout = dict(BASE, **FORMAT_BREAK.get((fmt, rule), BREAK.get(rule, {})))
    path = _write_config(fmt, layout, tmp_path, BATCH_OF_RULE.get(rule, 512))
    extra = ["--tp", str(layout["tp"]), "--seq-len", "4096"] if fmt == "deepspeed" else []
    proc = run("check", str(path), *CHECK, *extra, "--json")
    report = json.loads(proc.stdout)
    if rule == "pass":
        assert proc.returncode == 0 and report["passed"], report["violations"]
    else:
        assert proc.returncode == errors.EXIT_CHECK_FAILED
        assert rule in {v["rule"] for v in report["violations"]}, report["violations"]


def test_the_torchtitan_format_follows_the_output_name(tmp_path, capsys):
    """`export --to torchtitan -o job.toml` once wrote a Python recipe into job.toml, which torchtitan and `check`
    then read as TOML (a parse error). The format now follows the name, and a contradiction is refused (exit 3)."""
    import json as _json

    from planner.cli import main

    plan = tmp_path / "plan.json"
    with pytest.raises(SystemExit):
        main(["plan", "-c", "dgx-h100", "-n", "1", "-m", "llama3-8b", "-b", "16", "-s", "4096", "--framework",
              "torchtitan", "--no-solver", "--json", "-o", str(plan)])
    assert _json.loads(plan.read_text())["layout"]
    for name, head in (("job.toml", "[model]"), ("job.py", "from ")):
        with pytest.raises(SystemExit) as done:
            main(["export", str(plan), "--to", "torchtitan", "-o", str(tmp_path / name)])
        assert done.value.code == 0
        assert any(line.startswith(head) for line in (tmp_path / name).read_text().splitlines()), name
    with pytest.raises(SystemExit) as done:
        main(["export", str(plan), "--to", "torchtitan", "--torchtitan-format", "python", "-o",
              str(tmp_path / "other.toml")])
    assert done.value.code == 3 and not (tmp_path / "other.toml").exists()
