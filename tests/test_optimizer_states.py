"""Optimizer states below fp32 as an input (`--optimizer-states`): the bytes they cost, the frameworks that run them,
the launch settings that say them and `check` reading those back.

Sources of the expected numbers:
- mixed-precision Adam, 2 + 2 + 12 B/param (ZeRO paper §3.1, K = 12); Megatron's default 2 + 4 + 12 = 18 (fp32 main
  gradients, frameworks.md §2.5);
- Megatron-Core's precision-aware optimizer: --main-params-dtype {fp32,fp16}, --exp-avg-dtype / --exp-avg-sq-dtype
  {fp32,fp16,bf16,fp8}, only with the distributed optimizer (Megatron-LM arguments.py L3666-3684 and validate_args'
  dtype map, fp8 -> torch.uint8), and with it an fp32 master of a bf16 parameter kept as its 16 low bits
  (OptimizerConfig.store_param_remainders, default True, optimizer_config.py L192): 2 B instead of 4;
- --grad-reduce-in-bf16: bf16 main gradients under --bf16 (arguments.py validate_args);
- NeMo 1.x apex DistributedFusedAdam with dtype bf16 and grad_sync_dtype bf16 (NVIDIA dgxc-benchmarking Nemotron-4
  340B recipe): bf16 master and moments, bf16 gradients = 2 + 2 + 6 B/param.
"""

import pytest

from cluster_specs import SpecError
from planner.estimate import build_problem
from planner.frameworks.capabilities import capabilities, refuse_unrunnable
from planner.frameworks.restriction import build_restriction
from planner.inputs.layout_string import parse_optimizer_states
from planner.inputs.specs import TrainingSpec

MOMENTS_BF16 = {"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}
ALL_BF16 = {"grad_dtype": "bf16", "master_dtype": "bf16", **MOMENTS_BF16}


def _bytes(framework, states):
    t = build_problem("dgx-h100", 2, "llama3-8b", 256, 4096, framework=framework, optimizer_states=states).cm_training
    return t.param_bytes + t.grad_bytes + t.optimizer_bytes


@pytest.mark.parametrize("framework,states,total", [
    (None, {}, 18),  # the generic recipe: bf16 weights, fp32 main gradients, fp32 master + moments
    (None, MOMENTS_BF16, 14),  # 2 + 4 + (4 + 2 + 2)
    (None, ALL_BF16, 10),  # apex DistributedFusedAdam dtype=bf16, grad_sync_dtype=bf16: 2 + 2 + (2 + 2 + 2)
    (None, {"exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "bf16"}, 13),  # 2 + 4 + (4 + 1 + 2)
    ("megatron", {}, 18),  # Megatron's 18 B/param
    ("megatron", MOMENTS_BF16, 12),  # 2 + 4 + (2 remainder bits + 2 + 2)
    ("megatron", {"grad_dtype": "bf16", **MOMENTS_BF16}, 10),  # 2 + 2 + 6
    ("megatron", {"grad_dtype": "bf16"}, 16),  # --grad-reduce-in-bf16 alone: no precision-aware optimizer, fp32 master
    ("megatron", {"master_dtype": "fp16"}, 16),  # an fp16 master is 2 B (no remainders), moments fp32
    ("nemo", MOMENTS_BF16, 12),
])
def test_state_bytes_per_parameter(framework, states, total):
    assert _bytes(framework, states) == total


def test_the_optimizer_step_moves_less_with_smaller_states():
    """The step reads and writes each state once (OPTIMIZER_STEP_BYTES_PER_PARAM = 32 with fp32 states): the saved
    6 B/param of Megatron's bf16 moments with remainders come off twice."""
    from cost_models.step import OPTIMIZER_STEP_BYTES_PER_PARAM
    from planner.estimate import layout_from_arg

    seconds = []
    for states in ({}, MOMENTS_BF16):
        problem = build_problem("dgx-h100", 2, "llama3-8b", 256, 4096, framework="megatron", optimizer_states=states)
        seconds.append(problem.estimate(layout_from_arg("dp=16,zero=1,mbs=1", problem)).time.optimizer_seconds)
    assert seconds[1] / seconds[0] == pytest.approx((OPTIMIZER_STEP_BYTES_PER_PARAM - 12) / OPTIMIZER_STEP_BYTES_PER_PARAM)


def test_lower_states_show_in_the_prediction():
    lay = "dp=16,zero=1,mbs=1"
    est = {}
    for name, states in (("fp32", {}), ("bf16", MOMENTS_BF16)):
        problem = build_problem("dgx-h100", 2, "llama3-8b", 256, 4096, framework="megatron", optimizer_states=states)
        from planner.estimate import layout_from_arg

        est[name] = problem.estimate(layout_from_arg(lay, problem))
    saved = est["fp32"].peak_memory_bytes - est["bf16"].peak_memory_bytes
    params = 8.03e9  # Llama 3 8B, the optimizer states sharded over dp 16: 6 B/param saved
    assert saved == pytest.approx(6 * params / 16, rel=0.02)
    assert est["bf16"].step_seconds < est["fp32"].step_seconds


@pytest.mark.parametrize("text,fields", [
    ("moments=bf16", MOMENTS_BF16),
    ("grad=bf16, master=fp16, exp_avg=fp8, exp_avg_sq=bf16",
     {"grad_dtype": "bf16", "master_dtype": "fp16", "exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "bf16"}),
    ("", {}), (None, {}),
])
def test_parse_optimizer_states(text, fields):
    assert parse_optimizer_states(text) == fields


@pytest.mark.parametrize("text,needle", [
    ("moment=bf16", "expected key=dtype with key one of grad, master, exp_avg, exp_avg_sq, moments"),
    ("grad", "expected key=dtype"),
    ("moments=bf16,exp_avg=fp8", "exp_avg_dtype given twice"),
])
def test_parse_optimizer_states_errors(text, needle):
    with pytest.raises(SpecError) as exc:
        parse_optimizer_states(text)
    assert needle in str(exc.value) and "--optimizer-states" in str(exc.value)


@pytest.mark.parametrize("fields,needle", [
    ({"precision": "fp32", "master_dtype": "bf16"}, "fp32 training keeps no master copy"),
    ({"optimizer": "sgd", "exp_avg_sq_dtype": "bf16"}, "SGD keeps no second moment"),
    ({"precision": "fp16", "grad_dtype": "bf16"}, "fp16 training keeps its gradients in fp16 or fp32"),
    ({"exp_avg_dtype": "int8"}, "exp_avg_dtype"),
])
def test_training_spec_refuses_states_that_mean_nothing(fields, needle):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=needle):
        TrainingSpec(global_batch_size=8, seq_length=1024, **fields)


@pytest.mark.parametrize("framework,states,needle", [
    ("megatron", {"master_dtype": "bf16"}, "master_dtype bf16 -> megatron keeps fp16 or the default"),
    ("nemo", {"master_dtype": "bf16"}, "master_dtype bf16 -> nemo keeps fp16 or the default"),
    ("torchtitan", MOMENTS_BF16, "exp_avg_dtype bf16 -> torchtitan keeps only the default"),
    ("deepspeed", {"grad_dtype": "bf16"}, "grad_dtype bf16 -> deepspeed keeps only the default"),
    ("megatron-deepspeed", MOMENTS_BF16, "megatron-deepspeed keeps only the default"),
])
def test_frameworks_refuse_states_they_cannot_keep(framework, states, needle):
    with pytest.raises(SpecError, match="--optimizer-states") as exc:
        build_problem("dgx-h100", 2, "llama3-8b", 256, 4096, framework=framework, optimizer_states=states)
    assert needle in str(exc.value)


def test_default_grad_dtype_is_not_a_change():
    """fp32 gradients under bf16 are every framework's default: torchtitan takes grad=fp32 without complaint."""
    given = build_problem("dgx-h100", 2, "llama3-8b", 256, 4096, framework="torchtitan",
                          optimizer_states={"grad_dtype": "fp32"}).cm_training
    default = build_problem("dgx-h100", 2, "llama3-8b", 256, 4096, framework="torchtitan").cm_training
    assert given == default  # the FSDP2 recipe (fp32 sharded parameters and gradients) stays
    assert TrainingSpec(global_batch_size=8, seq_length=1024, grad_dtype="fp32").grad_dtype_off_default is None
    assert TrainingSpec(global_batch_size=8, seq_length=1024, precision="fp16",
                        grad_dtype="fp32").grad_dtype_off_default == "fp32"


def test_megatron_runs_lower_states_only_with_the_distributed_optimizer():
    training = TrainingSpec(global_batch_size=256, seq_length=4096, **MOMENTS_BF16)
    caps = capabilities("megatron")
    assert caps.state_zero_problem(training, 1) is None
    for stage in (0, 2, 3):
        assert "runs them at ZeRO (1,) only" in caps.state_zero_problem(training, stage)
    assert capabilities(None).state_zero_problem(training, 3) is None  # the generic planner keeps them anywhere
    restriction = build_restriction("megatron", 128256, training=training)
    assert restriction.adjust({"dp": 16, "zero_stage": 0}) is None
    assert restriction.adjust({"dp": 16, "zero_stage": 1}) is not None
    with pytest.raises(SpecError, match="--fix: zero_stage 0"):
        build_restriction("megatron", 128256, fix=["zero_stage=0"], training=training)
    problem = build_problem("dgx-h100", 2, "llama3-8b", 256, 4096, framework="megatron", optimizer_states=MOMENTS_BF16)
    from planner.estimate import layout_from_arg

    with pytest.raises(SpecError, match="--layout: zero_stage 0"):
        refuse_unrunnable("megatron", layout_from_arg("dp=16,zero=0", problem), problem.model, problem.training)


# ---- plan -> export -> check ---------------------------------------------------------------------------------


def _plan(framework: str, states: dict, layout: str = "dp=16,zero=1,mbs=1") -> dict:
    from planner.contract import Predicted
    from planner.estimate import layout_from_arg

    problem = build_problem("dgx-h100", 2, "llama3-8b", 256, 4096, framework=framework, optimizer_states=states)
    lay = layout_from_arg(layout, problem)
    return {"layout": lay.model_dump(mode="json"), "framework": framework,
            "predicted": Predicted.from_estimate(problem.estimate(lay), problem.knobs.memory_headroom_bytes).model_dump(),
            "inputs": {"model": problem.model.model_dump(mode="json"),
                       "training": problem.training.model_dump(mode="json"),
                       "cluster": problem.cluster.model_dump(mode="json")}}


def _check(path, framework=None, seq_len=None):
    import argparse

    from planner.integrations.check import check_file

    args = argparse.Namespace(cluster="dgx-h100", nodes=2, model="llama3-8b", global_batch_size=None, seq_len=seq_len,
                              tp=None, pp=None, fix=None, framework=framework, precision=None, headroom_gib=2.0,
                              allow_tp_across_nodes=False, calibration=None)
    return check_file(path, args)


@pytest.mark.parametrize("target,states,lines", [
    ("megatron", {"grad_dtype": "bf16", **MOMENTS_BF16},
     ["--grad-reduce-in-bf16", "--use-precision-aware-optimizer", "--main-grads-dtype bf16", "--exp-avg-dtype bf16",
      "--exp-avg-sq-dtype bf16"]),
    ("megatron", {"master_dtype": "fp16", "exp_avg_dtype": "fp8"},
     ["--use-precision-aware-optimizer", "--main-params-dtype fp16", "--exp-avg-dtype fp8"]),
    ("megatron", {"grad_dtype": "bf16"}, ["--grad-reduce-in-bf16"]),
    ("nemo", {"grad_dtype": "bf16", **MOMENTS_BF16},
     ["mixed_precision.grad_reduce_in_fp32=false", "optimizer.use_precision_aware_optimizer=true",
      "optimizer.main_grads_dtype=torch.bfloat16", "optimizer.exp_avg_dtype=torch.bfloat16",
      "optimizer.exp_avg_sq_dtype=torch.bfloat16"]),
    ("nemo", {"exp_avg_dtype": "fp8"}, ["optimizer.exp_avg_dtype=torch.uint8"]),
])
def test_exports_say_the_states_and_check_reads_them_back(tmp_path, target, states, lines):
    from planner.integrations.exports import export

    doc = _plan(target, states)
    exp = export(doc, target)
    text = exp.text.splitlines()
    for line in lines:
        assert line in text, (line, exp.text)
    if "grad_dtype" not in states:
        assert not any("grad_reduce" in t or "main-grads" in t for t in text)
    if states.keys() == {"grad_dtype"}:
        assert "--use-precision-aware-optimizer" not in text  # bf16 gradients alone need no precision-aware optimizer
    path = tmp_path / ("cfg.sh" if target == "megatron" else "cfg.txt")
    path.write_text(exp.text)
    report = _check(path)
    assert report["passed"], report["violations"]
    for key in ("step_time_seconds", "peak_memory_bytes_per_gpu"):
        assert report["predicted"][key] == pytest.approx(doc["predicted"][key], rel=1e-9), key
    default = _plan(target, {})["predicted"]["peak_memory_bytes_per_gpu"]
    assert report["predicted"]["peak_memory_bytes_per_gpu"] < default  # read as fp32 states, it would be the default


def test_a_plan_json_is_checked_with_its_states(tmp_path):
    import json

    doc = _plan("megatron", MOMENTS_BF16)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    report = _check(path)
    assert report["predicted"]["peak_memory_bytes_per_gpu"] == pytest.approx(doc["predicted"]["peak_memory_bytes_per_gpu"])


@pytest.mark.parametrize("target", ["torchtitan", "megatron-deepspeed"])
def test_exports_without_a_state_dtype_refuse(target):
    from planner.integrations.exports import export

    doc = _plan(None, MOMENTS_BF16)
    doc["framework"] = "generic"
    with pytest.raises(SpecError, match="keeps only the default.*plan without --optimizer-states"):
        export(doc, target)


def test_a_generic_plan_at_zero_0_is_not_written_for_megatron():
    from planner.integrations.exports import export

    doc = _plan(None, MOMENTS_BF16, "dp=16,zero=0,mbs=1")
    doc["framework"] = "generic"
    with pytest.raises(SpecError, match="zero_stage 0 .* ZeRO \\(1,\\) only.*plan with --framework megatron"):
        export(doc, "megatron")


@pytest.mark.parametrize("flags,needle", [
    ("--exp-avg-dtype bf16", "--exp-avg-dtype bf16 without --use-precision-aware-optimizer"),
    ("--main-grads-dtype bf16", "--main-grads-dtype bf16 without --use-precision-aware-optimizer"),
])
def test_megatron_state_flags_need_the_precision_aware_optimizer(tmp_path, flags, needle):
    path = tmp_path / "run.sh"
    path.write_text("torchrun pretrain_gpt.py --micro-batch-size 1 --global-batch-size 256 --seq-length 4096 --bf16 "
                    f"--use-distributed-optimizer {flags}\n")
    report = _check(path)
    assert not report["passed"]
    assert any(needle in v["message"] for v in report["violations"]), report["violations"]


def test_megatron_precision_aware_optimizer_needs_the_distributed_optimizer(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text("torchrun pretrain_gpt.py --micro-batch-size 1 --global-batch-size 256 --seq-length 4096 --bf16 "
                    "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16\n")
    report = _check(path)
    states = [v for v in report["violations"] if v["rule"] == "optimizer_states"]
    assert len(states) == 1 and "zero_stage 0" in states[0]["message"], report["violations"]


def test_nemo_reads_ddp_grad_reduce_as_overridden(tmp_path):
    """Bridge copies mixed_precision.grad_reduce_in_fp32 over ddp's at setup: a ddp-only override changes nothing."""
    from planner.integrations.readers import read_config

    path = tmp_path / "o.txt"
    path.write_text("train.micro_batch_size=1\ntrain.global_batch_size=256\nmixed_precision=bf16_mixed\n"
                    "ddp.grad_reduce_in_fp32=false\nddp.use_distributed_optimizer=true\n")
    view = read_config(path, gpus=16)
    assert view.optimizer_states == {}
    assert any("copies mixed_precision.grad_reduce_in_fp32 over it" in n for n in view.notes)
    path.write_text(path.read_text() + "optimizer.exp_avg_dtype=torch.bfloat16\n")
    view = read_config(path, gpus=16)
    assert view.optimizer_states == {"exp_avg_dtype": "bf16"}
    assert view.errors and view.errors[0][0] == "optimizer_states"
    path.write_text(path.read_text() + "optimizer.exp_avg_sq_dtype=bfloat16\n")
    with pytest.raises(SpecError, match="optimizer.exp_avg_sq_dtype: 'bfloat16' -> allowed: torch.float32"):
        read_config(path, gpus=16)


# ---- the command line ----------------------------------------------------------------------------------------


def test_cli_plan_records_the_states_and_estimate_refuses_what_a_framework_cannot_keep(capsys, tmp_path):
    import json

    from planner import errors
    from planner.cli import main

    def cli(*args):
        with pytest.raises(SystemExit) as exit_:
            main(list(args))
        return exit_.value.code, *capsys.readouterr()

    base = ["-c", "dgx-h100", "-n", "2", "-m", "llama3-8b", "-b", "256", "-s", "4096"]
    out = tmp_path / "p.json"
    rc, _, err = cli("plan", *base, "--framework", "megatron", "--optimizer-states", "grad=bf16,moments=bf16",
                     "--no-solver", "--no-schedule", "-o", str(out))
    assert rc == 0, err
    doc = json.loads(out.read_text())
    training = doc["inputs"]["training"]
    assert (training["grad_dtype"], training["exp_avg_dtype"], training["exp_avg_sq_dtype"]) == ("bf16",) * 3
    assert doc["layout"]["zero_stage"] == 1  # Megatron runs them with its distributed optimizer only
    rc, out_text, err = cli("estimate", *base, "--layout", "dp=16,zero=1", "--framework", "torchtitan",
                            "--optimizer-states", "moments=bf16", "--json")
    assert rc == errors.EXIT_INPUT and "torchtitan keeps only the default" in err
    rc, _, err = cli("estimate", *base, "--layout", "dp=16,zero=1", "--optimizer-states", "moments=int4")
    assert rc == errors.EXIT_INPUT and "exp_avg_dtype" in err
    rc, out_text, _ = cli("compare", "--clusters", "dgx-h100:2", "-m", "llama3-8b", "-b", "256", "-s", "4096",
                          "--framework", "megatron", "--optimizer-states", "moments=bf16", "--no-solver", "--json")
    assert rc == 0
    doc = json.loads(out_text)
    assert doc["inputs"]["training"]["exp_avg_dtype"] == "bf16"
    assert doc["clusters"][0]["pick"]["layout"]["zero_stage"] == 1
    rc, _, err = cli("scaling", "-c", "dgx-h100", "-m", "llama3-8b", "-b", "256", "-s", "4096", "--node-counts", "1,2",
                     "--framework", "torchtitan", "--optimizer-states", "moments=bf16", "--no-solver")
    assert rc == errors.EXIT_INPUT and "torchtitan keeps only the default" in err


# ---- the benchmark keeps bf16 moments and counts them ------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.distributed
def test_bench_with_bf16_moments_matches_its_reference_and_its_prediction():
    """AdamW with bf16 moments (updated in fp32 a chunk at a time, stored rounded) on 2 gloo ranks under ZeRO-1
    against the single-process run with the same moments, and the bytes of state torch holds against the fp32-moment
    run's."""
    torch = pytest.importorskip("torch")
    import os

    from planner.bench.runner import BenchConfig, launch_local, reference_params

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    shape = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=64,
                 vocab_size=64, swiglu=True, tied_embeddings=False, rms_norm=True, flash_attention=False,
                 learned_position_embeddings=False, max_position_embeddings=16, bias=False, dropout=False)
    layout = dict(tp=1, pp=1, dp=2, zero_stage=1, micro_batch_size=1, num_micro_batches=2)
    cfg = BenchConfig(shape=shape, seq_length=16, layout=layout, steps=2, warmup=1, collect_params=True,
                      timeout_seconds=60, measure_collectives=False, optimizer="adamw", lr=1e-3, adam_eps=1e-6,
                      exp_avg_dtype="bfloat16", exp_avg_sq_dtype="bfloat16")
    reports = launch_local(cfg, 2)
    params = {}
    for r in reports:
        params.update(r["params"])
    ref = reference_params(cfg)
    worst = max(float((torch.tensor(v) - torch.tensor(ref[k])).abs().max()) for k, v in params.items())
    assert worst < 1e-4  # the same bound as the fp32-moment recipe (tests/test_bench.py)
    fp32 = launch_local(BenchConfig(**{**cfg.__dict__, "exp_avg_dtype": "float32", "exp_avg_sq_dtype": "float32",
                                       "collect_params": False}), 2)
    ratio = sum(r["optimizer_state_bytes"] for r in reports) / sum(r["optimizer_state_bytes"] for r in fp32)
    # fp32 compute: the parameters are their own masters, so the state is the moments alone, 2 + 2 against 4 + 4
    assert ratio == pytest.approx((2 + 2) / (4 + 4))


@pytest.mark.torch
@pytest.mark.distributed
def test_bench_cli_predicts_the_moments_it_keeps():
    import json
    import subprocess
    import sys

    base = [sys.executable, "-m", "planner.cli", "bench", "-c", "dgx-a100-80gb", "-m", "llama2-7b", "--layout",
            "tp=1,pp=1,dp=2,mbs=1,zero=1", "--micro-batches", "2", "--layers-per-stage", "2", "--hidden-size", "128",
            "--vocab-size", "256", "--seq-len", "32", "--nproc", "2", "--steps", "1", "--json"]
    proc = subprocess.run([*base, "--optimizer-states", "moments=bf16"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["exp_avg_dtype"], doc["exp_avg_sq_dtype"]) == ("bfloat16", "bfloat16")
    row = {r["quantity"]: r for r in doc["comparison"]["rows"]}["stage 0: optimizer state (MiB)"]
    assert row["measured"] == pytest.approx(row["predicted"], rel=0.02), row  # ZeRO-1 shards by whole tensors
    for bad, needle in (("master=fp16", "the benchmark sets only the moments"),
                        ("moments=fp8", "the benchmark keeps moments in fp32, bf16, fp16")):
        proc = subprocess.run([*base, "--optimizer-states", bad], capture_output=True, text=True, timeout=240)
        assert proc.returncode == 3 and needle in proc.stderr, proc.stderr


DEEPSPEED_BF16 = {"master_dtype": "bf16", **MOMENTS_BF16}


def test_deepspeed_exports_its_bf16_states_and_check_reads_them_back(tmp_path):
    """DeepSpeed >= 0.18.3 keeps the ZeRO optimizer's master weights and Adam moments in bf16 with
    bf16.bf16_master_weights_and_grads and bf16.bf16_optimizer_states (runtime/precision_config.py; DeepSpeedExamples
    training/bf16_master_weight/configs/bf16_full.json), at ZeRO 1-3 (runtime/config.py, frameworks.md §3.7 rule 6)."""
    import json

    from planner.integrations.exports import export

    doc = _plan("deepspeed", DEEPSPEED_BF16)
    exp = export(doc, "deepspeed")
    assert json.loads(exp.text)["bf16"] == {"enabled": True, "bf16_master_weights_and_grads": True,
                                            "bf16_optimizer_states": True}
    path = tmp_path / "ds.json"
    path.write_text(exp.text)
    report = _check(path, seq_len=4096)  # the JSON has no sequence length
    for key in ("step_time_seconds", "peak_memory_bytes_per_gpu"):
        assert report["predicted"][key] == pytest.approx(doc["predicted"][key], rel=1e-9), key
    assert report["predicted"]["peak_memory_bytes_per_gpu"] < _plan("deepspeed", {})["predicted"][
        "peak_memory_bytes_per_gpu"]


@pytest.mark.parametrize("states,layout,needle", [
    (MOMENTS_BF16, "dp=16,zero=1,mbs=1", r"deepspeed lowers master_dtype or exp_avg_dtype\+exp_avg_sq_dtype\+"
                                         "master_dtype together"),
    ({"master_dtype": "bf16"}, "dp=16,zero=1,mbs=1", "bf16_master_weights_and_grads without "
                                                     "bf16_optimizer_states needs the optimizer offloaded"),
    (DEEPSPEED_BF16, "dp=16,zero=0,mbs=1", r"zero_stage 0 .* ZeRO \(1, 2, 3\) only"),
])
def test_deepspeed_refuses_the_bf16_states_its_switches_cannot_set(states, layout, needle):
    """bf16_optimizer_states lowers both moments and needs bf16 master weights; bf16 master weights with fp32
    moments run only with the optimizer on DeepSpeedCPUAdam (stage_1_and_2.py _enforce_cpu_offload); ZeRO 1-3."""
    from planner.integrations.exports import export

    doc = _plan(None, states, layout)
    doc["framework"] = "generic"
    with pytest.raises(SpecError, match=needle):
        export(doc, "deepspeed")
