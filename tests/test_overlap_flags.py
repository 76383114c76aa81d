"""Megatron-LM overlaps nothing by default (frameworks.md §2.6: --overlap-grad-reduce, --overlap-param-gather and
--tp-comm-overlap are off): `check` predicts a config without them with that traffic exposed, and the Megatron export
writes them so that the plan's prediction (the Megatron profile: the performance recipes' flags) is what runs."""

import json
from dataclasses import replace

import pytest

from planner.estimate import Problem, build_problem
from planner.inputs.models import load_model
from planner.integrations.check import check
from planner.integrations.readers import read_config

ARGS = """torchrun --nproc_per_node 8 pretrain_gpt.py \\
  --tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --sequence-parallel \\
  --use-distributed-optimizer --micro-batch-size 1 --global-batch-size 256 --seq-length 4096 \\
  --num-layers 40 --hidden-size 5120 --num-attention-heads 40 --ffn-hidden-size 13824 --swiglu \\
  --normalization RMSNorm --bf16 --recompute-granularity selective {flags}
"""
FLAGS = "--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap"


def _check(tmp_path, flags: str):
    path = tmp_path / f"run{len(flags)}.sh"
    path.write_text(ARGS.format(flags=flags))
    view = read_config(path, gpus=64)
    problem = build_problem("dgx-a100-80gb", 8, "llama2-13b", 256, 4096, "bf16", framework="megatron")
    return check(view, problem), problem


def test_megatron_config_without_overlap_flags_is_predicted_with_the_traffic_exposed(tmp_path):
    with_flags, problem = _check(tmp_path, FLAGS)
    without, _ = _check(tmp_path, "")
    assert with_flags.layout == without.layout and with_flags.violations == without.violations == []
    # with the flags: the Megatron profile as is (0.9 of DP traffic, 0.5 of TP traffic hidden; profiles.py)
    assert with_flags.estimate.step_seconds == pytest.approx(problem.estimate(with_flags.layout).step_seconds, rel=1e-12)
    # without: the same layout predicted with nothing of that traffic hidden (an independent construction)
    exposed = Problem(problem.model, problem.training, problem.cluster,
                      replace(problem.knobs, dp_overlap_fraction=0.0, zero3_overlap_fraction=0.0,
                              tp_overlap_fraction=0.0))
    assert without.estimate.step_seconds == pytest.approx(exposed.estimate(without.layout).step_seconds, rel=1e-12)
    assert without.estimate.step_seconds > with_flags.estimate.step_seconds * 1.01
    assert any("no --overlap-grad-reduce" in n for n in without.notes)
    assert any("no --tp-comm-overlap" in n for n in without.notes)
    assert not any("overlap" in n for n in with_flags.notes)


def test_megatron_export_switches_on_the_overlap_its_profile_assumes():
    from test_roundtrip import _plan

    from planner.integrations.exports import export

    text = export(_plan("interleaved-zero1"), "megatron").text.splitlines()  # tp 8 + SP, dp 2, distributed optimizer
    assert {"--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap"} <= set(text)
    text = export(_plan("zero2"), "megatron").text.splitlines()  # tp 1, dp 64, Megatron-FSDP
    assert {"--overlap-grad-reduce", "--overlap-param-gather"} <= set(text) and "--tp-comm-overlap" not in text


# ---- DeepSpeed overlap_comm: the export turns it on at ZeRO-1/2, `check` reads it (absent: DeepSpeed's default) ----

DS = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}


def _ds_check(tmp_path, zero: dict, framework: str = "deepspeed"):
    path = tmp_path / f"ds{len(json.dumps(zero))}{framework}.json"
    path.write_text(json.dumps({**DS, "zero_optimization": zero}))
    view = read_config(path, gpus=64, global_batch_size=256)
    problem = build_problem("dgx-a100-80gb", 8, "llama2-13b", 256, 4096, "bf16", framework=framework)
    return check(view, problem), problem


def _with(problem: Problem, **knobs) -> Problem:
    return Problem(problem.model, problem.training, problem.cluster, replace(problem.knobs, **knobs))


def test_deepspeed_zero2_without_overlap_comm_is_predicted_with_the_reduce_after_backward(tmp_path):
    from planner.frameworks.profiles import DEEPSPEED_OVERLAP_COMM_SHARE

    on, problem = _ds_check(tmp_path, {"stage": 2, "overlap_comm": True})
    absent, _ = _ds_check(tmp_path, {"stage": 2})
    off, _ = _ds_check(tmp_path, {"stage": 2, "overlap_comm": False})
    assert on.layout == absent.layout == off.layout and on.layout.zero_stage == 2 and on.violations == []
    # overlap_comm on: the DeepSpeed profile as is (the share the export's overlap_comm hides)
    assert problem.knobs.dp_overlap_fraction == DEEPSPEED_OVERLAP_COMM_SHARE > 0
    assert on.estimate.step_seconds == pytest.approx(problem.estimate(on.layout).step_seconds, rel=1e-12)
    exposed = _with(problem, dp_overlap_fraction=0.0).estimate(on.layout).step_seconds
    assert absent.estimate.step_seconds == off.estimate.step_seconds == pytest.approx(exposed, rel=1e-12)
    assert exposed > on.estimate.step_seconds * 1.005
    assert any("overlap_comm not set: DeepSpeed's default at ZeRO-2 (off) assumed" in n for n in absent.notes)
    assert any("overlap_comm off at ZeRO-2" in n and "predicted so" in n for n in absent.notes + off.notes)
    assert not any("overlap_comm" in n for n in on.notes)


def test_deepspeed_zero3_overlap_comm_defaults_on_and_off_exposes_the_reduce_scatters(tmp_path):
    absent, problem = _ds_check(tmp_path, {"stage": 3})
    off, _ = _ds_check(tmp_path, {"stage": 3, "overlap_comm": False})
    assert absent.estimate.step_seconds == pytest.approx(problem.estimate(absent.layout).step_seconds, rel=1e-12)
    assert any("DeepSpeed's default at ZeRO-3 (on) assumed" in n for n in absent.notes)
    # off: the reduce-scatter (1 of the 3 collectives of a layer) no longer hidden, the gathers still prefetched
    share = problem.knobs.zero3_overlap_fraction * 2 / 3
    want = _with(problem, zero3_overlap_fraction=share).estimate(off.layout).step_seconds
    assert off.estimate.step_seconds == pytest.approx(want, rel=1e-12)
    assert off.estimate.step_seconds > absent.estimate.step_seconds * 1.005
    assert any("overlap_comm off at ZeRO-3" in n for n in off.notes)


def test_deepspeed_zero0_hides_no_gradient_traffic_whatever_overlap_comm_says(tmp_path):
    """ZeRO-0: the engine all-reduces after backward (engine.py allreduce_gradients); the profile says so."""
    on, problem = _ds_check(tmp_path, {"stage": 0, "overlap_comm": True})
    assert problem.knobs.ddp_overlap_fraction == 0.0
    want = _with(problem, dp_overlap_fraction=0.0, ddp_overlap_fraction=None).estimate(on.layout).step_seconds
    assert on.estimate.step_seconds == pytest.approx(want, rel=1e-12)
    assert not any("overlap_comm" in n for n in on.notes)


def test_deepspeed_export_turns_on_overlap_comm_where_its_profile_predicts_with_it():
    from test_roundtrip import _plan

    from planner.integrations.exports import export

    for name, stage in (("zero2", 2), ("zero3-offload", 3)):
        zero = json.loads(export(_plan(name, "deepspeed"), "deepspeed").text)["zero_optimization"]
        assert zero["stage"] == stage and zero["overlap_comm"] is True
    # Megatron-DeepSpeed's profile hides no ZeRO-1/2 traffic (pipeline engine): its ds_config keeps the default
    zero = json.loads(export(_plan("zero2", "megatron-deepspeed"), "deepspeed",
                             framework="megatron-deepspeed").text)["zero_optimization"]
    assert "overlap_comm" not in zero


# ---- pipeline send/recv overlap: Megatron forces overlap_p2p_comm off without virtual stages ----------------------

PP_ARGS = """torchrun pretrain_gpt.py --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 \\
  --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --sequence-parallel --tp-comm-overlap \\
  --micro-batch-size 1 --global-batch-size 256 --seq-length 4096 --num-layers 40 --hidden-size 5120 \\
  --num-attention-heads 40 --ffn-hidden-size 13824 --swiglu --normalization RMSNorm --bf16 {flags}
"""


def _pp_check(tmp_path, flags: str, framework: str = "megatron"):
    path = tmp_path / f"pp{len(flags)}.sh"
    path.write_text(PP_ARGS.format(flags=flags))
    view = read_config(path, gpus=64)
    problem = build_problem("dgx-a100-80gb", 8, "llama2-13b", 256, 4096, "bf16", framework=framework)
    return check(view, problem), problem


@pytest.mark.parametrize("framework", ["megatron", "nemo"])
def test_pipeline_p2p_overlap_applies_only_with_virtual_stages(tmp_path, framework):
    flat, problem = _pp_check(tmp_path, "", framework)
    interleaved, _ = _pp_check(tmp_path, "--num-virtual-stages-per-pipeline-rank 2", framework)
    assert (flat.layout.pp, flat.layout.virtual_stages) == (4, 1) and interleaved.layout.virtual_stages == 2
    assert problem.knobs.pp_overlap_fraction == 0.9 and problem.knobs.pp_overlap_needs_virtual
    # plan and check agree: the check's prediction is the profile's estimate of the same layout
    for out in (flat, interleaved):
        assert out.estimate.step_seconds == pytest.approx(problem.estimate(out.layout).step_seconds, rel=1e-12)
    # independent construction: without virtual stages, as if no p2p overlap at all; with them, the 0.9 share
    none = _with(problem, pp_overlap_fraction=0.0, pp_overlap_needs_virtual=False)
    assert flat.estimate.step_seconds == pytest.approx(none.estimate(flat.layout).step_seconds, rel=1e-12)
    hidden = _with(problem, pp_overlap_needs_virtual=False)
    assert interleaved.estimate.step_seconds == pytest.approx(hidden.estimate(interleaved.layout).step_seconds,
                                                              rel=1e-12)
    assert none.estimate(interleaved.layout).step_seconds > interleaved.estimate.step_seconds


def test_no_overlap_p2p_communication_with_virtual_stages_is_predicted_exposed(tmp_path):
    off, problem = _pp_check(tmp_path, "--num-virtual-stages-per-pipeline-rank 2 --no-overlap-p2p-communication")
    want = _with(problem, pp_overlap_fraction=0.0).estimate(off.layout).step_seconds
    assert off.estimate.step_seconds == pytest.approx(want, rel=1e-12)
    assert any("--no-overlap-p2p-communication" in n for n in off.notes)


def test_torchtitan_pipeline_overlap_does_not_depend_on_virtual_stages():
    problem = build_problem("dgx-a100-80gb", 8, "llama2-13b", 256, 4096, "bf16", framework="torchtitan")
    assert not problem.knobs.pp_overlap_needs_virtual and problem.knobs.pp_overlap_fraction == 0.5


# ---- torchtitan compile: `check` predicts a compiled model with the compiled elementwise share ----

TT = """[model]
name = "llama3"
flavor = "8B"

[training]
local_batch_size = 1
seq_len = 8192
global_batch_size = 8
{training}
[parallelism]
data_parallel_shard_degree = 8

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
{compile}"""


def _tt_check(tmp_path, *, compile_section: str = "", training: str = "", suffix: str = ".toml", text: str = ""):
    path = tmp_path / f"tt{abs(hash((compile_section, training, text)))}{suffix}"
    path.write_text(text or TT.format(compile=compile_section, training=training))
    view = read_config(path, gpus=8)
    problem = build_problem("dgx-h100", 1, "llama3-8b", 8, 8192, "bf16", framework="torchtitan")
    return check(view, problem), problem


@pytest.mark.parametrize("compile_section, training, compiled", [
    ("", "", False),
    ("[compile]\nenable = false\n", "", False),
    ("[compile]\nenable = true\n", "", True),
    ("[compile]\nenable = true\ncomponents = [\"model\"]\n", "", True),
    ("[compile]\nenable = true\ncomponents = [\"loss\"]\n", "", False),  # the model itself runs eager
    ("", "compile = true\n", True),  # torchtitan's older [training] compile
])
def test_torchtitan_compile_is_predicted_with_the_compiled_elementwise_share(tmp_path, compile_section, training,
                                                                             compiled):
    from planner.frameworks.profiles import COMPILED_ELEMENTWISE_SHARE

    out, problem = _tt_check(tmp_path, compile_section=compile_section, training=training)
    assert out.violations == []
    share = COMPILED_ELEMENTWISE_SHARE.value if compiled else 1.0
    expected = _with(problem, compiled_elementwise_share=share).estimate(out.layout).step_seconds
    assert out.estimate.step_seconds == pytest.approx(expected, rel=1e-12)
    assert any("torch.compile fuses" in n for n in out.notes) is compiled
    assert any("predicted eager" in n for n in out.notes) is (not compiled and bool(compile_section))
    if compiled:  # the same layout eager is slower: the elementwise kernels are a tenth or more of this step
        assert out.estimate.step_seconds < problem.estimate(out.layout).step_seconds * 0.9


def test_torchtitan_python_recipe_compile_config_is_read(tmp_path):
    recipe = """from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.models.llama3 import model_registry
from torchtitan.trainer import Trainer


def job() -> Trainer.Config:
    return Trainer.Config(
        model_spec=model_registry("8B"),
        training=TrainingConfig(local_batch_size=1, global_batch_size=8, seq_len=8192),
        parallelism=ParallelismConfig(data_parallel_shard_degree=8),
        compile=CompileConfig(enable=True, components=["model", "loss"]),
    )
"""
    out, problem = _tt_check(tmp_path, suffix=".py", text=recipe)
    assert any("compile.enable" in n for n in out.notes)
    assert out.estimate.step_seconds < problem.estimate(out.layout).step_seconds * 0.9


@pytest.mark.parametrize("components", ['"model"', '["model", "optimizer"]'])
def test_torchtitan_compile_components_torchtitan_refuses_are_a_violation(tmp_path, components):
    # torchtitan's CompileConfig raises ValueError for entries other than 'model' and 'loss' (torchtitan/config/
    # compile.py __post_init__); check says so with the field and what is allowed, and predicts nothing compiled
    out, problem = _tt_check(tmp_path, compile_section=f"[compile]\nenable = true\ncomponents = {components}\n")
    assert [v["rule"] for v in out.violations] == ["compile"]
    assert "compile.components" in out.violations[0]["message"] and "'model', 'loss'" in out.violations[0]["message"]
    assert not any("torch.compile fuses" in n for n in out.notes)


def test_a_torchtitan_compile_key_that_is_not_a_section_is_a_violation(tmp_path):
    text = "compile = true\n" + TT.format(compile="", training="")
    out, _ = _tt_check(tmp_path, text=text)
    assert [v["rule"] for v in out.violations] == ["compile"]
    assert out.violations[0]["message"].startswith("compile: True -> a section")


@pytest.mark.parametrize("norm_type, compile_section, upcast", [
    ('"rmsnorm"', "", True),  # torchtitan's eager RMSNorm class (train_configs of 2024-05 .. 2025-02)
    ('"fused_rmsnorm"', "", False),  # its Triton kernel saves the input
    ('"rmsnorm"', "[compile]\nenable = true\n", False),  # compiled: the norm is fused
    (None, "", False),  # no norm_type (torchtitan now: nn.RMSNorm, torch's fused kernel)
])
def test_torchtitan_eager_rmsnorm_is_predicted_with_its_fp32_upcast(tmp_path, norm_type, compile_section, upcast):
    """`check` of a config with norm_type 'rmsnorm' predicts the memory of torchtitan's eager RMSNorm: per-op SAC
    recomputes the norms, so the upcast lives in the recomputed layer only: 2 norms x 4 B x 8192 tokens x 4096 =
    0.25 GiB, and the allocator's reserve on it."""
    from cost_models.memory import NORM_FP32_UPCAST_BYTES_PER_ELEMENT
    from planner.frameworks.profiles import COMPILED_ELEMENTWISE_SHARE

    text = TT.format(compile=compile_section, training="")
    if norm_type is not None:
        text = text.replace('flavor = "8B"', f'flavor = "8B"\nnorm_type = {norm_type}')
    out, problem = _tt_check(tmp_path, text=text)
    assert out.violations == []
    share = COMPILED_ELEMENTWISE_SHARE.value if compile_section else problem.knobs.compiled_elementwise_share
    without = _with(problem, compiled_elementwise_share=share).estimate(out.layout).peak_memory_bytes
    upcast_bytes = 2 * NORM_FP32_UPCAST_BYTES_PER_ELEMENT * 8192 * 4096 * (1 + problem.knobs.allocator_reserve_fraction)
    assert out.estimate.peak_memory_bytes - without == pytest.approx(upcast_bytes if upcast else 0.0, rel=1e-9)
    assert any("eager RMSNorm" in n for n in out.notes) is upcast


@pytest.mark.parametrize("model, moved", [("llama2-7b", True), ("gpt2-1.5b", False)])
def test_hugging_face_trainer_config_is_predicted_with_transformers_rmsnorm(tmp_path, model, moved):
    """A DeepSpeed config with the HF Trainer's "auto" values trains a transformers model: its RMSNorm (LlamaRMSNorm)
    saves the fp32 upcast of its input, without recompute 2 x 4 B x tokens x h per layer; a LayerNorm model (GPT-2)
    runs torch's fused layer_norm and is not moved."""
    from cost_models.memory import NORM_FP32_UPCAST_BYTES_PER_ELEMENT

    path = tmp_path / "ds_auto.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                                "train_batch_size": "auto", "bf16": {"enabled": True},
                                "zero_optimization": {"stage": 2, "overlap_comm": True}}))
    view = read_config(path, gpus=8, global_batch_size=8)
    problem = build_problem("dgx-a100-80gb", 1, model, 8, 1024, "bf16", framework="deepspeed")
    out = check(view, problem)
    assert any("transformers' RMSNorm" in n for n in out.notes)
    plain = problem.estimate(out.layout).peak_memory_bytes
    spec = load_model(model)
    per_layer = 2 * NORM_FP32_UPCAST_BYTES_PER_ELEMENT * 1024 * spec.hidden_size  # mbs 1 x 1024 tokens
    grow = 1 + problem.knobs.allocator_reserve_fraction
    extra = spec.num_layers * per_layer * grow if moved else 0.0
    assert out.estimate.peak_memory_bytes - plain == pytest.approx(extra, rel=1e-9, abs=1.0)
