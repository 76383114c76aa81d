"""CP, EP, MoE/MLA and FP8 in the launch exports: the frameworks' own option names (frameworks.md §1.9, §2.8,
§3.8) or a refusal that says why."""

import pytest

from cluster_specs import SpecError, load_cluster
from planner.inputs.models import load_model
from planner.inputs.specs import LayoutSpec, TrainingSpec
from planner.integrations.exports import export
from planner.integrations.modern_flags import deepspeed_settings, megatron_args, torchtitan_settings


def _plan(model: str, layout: LayoutSpec, training: TrainingSpec) -> dict:
    cluster = load_cluster("dgx-h100", nodes=max(1, layout.num_gpus // 8))
    return {"layout": layout.model_dump(mode="json"),
            "inputs": {"model": load_model(model).model_dump(mode="json"), "training": training.model_dump(mode="json"),
                       "cluster": cluster.model_dump(mode="json")}}


def test_megatron_long_context_fp8():
    layout = LayoutSpec(dp=8, tp=8, pp=16, cp=16, sequence_parallel=True, zero_stage=1, num_micro_batches=2)
    training = TrainingSpec(global_batch_size=16, seq_length=131072, precision="fp8", fp8_recipe="delayed")
    text = export(_plan("llama3.1-405b", layout, training), "megatron").text
    for line in ("--context-parallel-size 16", "--cp-comm-type p2p", "--fp8-format hybrid", "--fp8-recipe delayed",
                 "--bf16"):
        assert line in text.splitlines()


def test_megatron_deepseek_v3_moe_and_mla():
    args = dict(megatron_args(LayoutSpec(dp=64, pp=16, ep=64), load_model("deepseek-v3"), TrainingSpec(
        global_batch_size=64, seq_length=4096)))
    assert args["--num-experts"] == 256 and args["--moe-router-topk"] == 8 and args["--moe-ffn-hidden-size"] == 2048
    assert args["--expert-model-parallel-size"] == 64 and args["--expert-tensor-parallel-size"] == 1
    assert args["--moe-shared-expert-intermediate-size"] == 2048
    assert args["--moe-layer-freq"] == "([0]*3+[1]*58)"  # DeepSeek-V3's first 3 dense layers (§3.5)
    assert args["--q-lora-rank"] == 1536 and args["--kv-lora-rank"] == 512 and args["--qk-pos-emb-head-dim"] == 64
    assert "--multi-latent-attention" in args


def test_megatron_refuses_a_torchao_recipe():
    with pytest.raises(SpecError, match="rowwise"):
        megatron_args(LayoutSpec(dp=8), load_model("llama3-8b"),
                      TrainingSpec(global_batch_size=8, seq_length=8192, precision="fp8", fp8_recipe="rowwise"))


def test_torchtitan_cp_ep_float8():
    layout = LayoutSpec(dp=8, cp=8, zero_stage=3)
    training = TrainingSpec(global_batch_size=8, seq_length=262144, precision="fp8")
    text = export(_plan("llama3-8b", layout, training), "torchtitan", torchtitan_format="toml").text
    assert "context_parallel_degree = 8" in text and 'converters = ["float8"]' in text
    assert 'recipe_name = "tensorwise"' in text and "enable_fsdp_float8_all_gather = true" in text
    par, _ = torchtitan_settings(LayoutSpec(dp=8, ep=8), load_model("mixtral-8x7b"),
                                 TrainingSpec(global_batch_size=8, seq_length=4096))
    assert par["expert_parallel_degree"] == 8
    with pytest.raises(SpecError, match="ring"):
        torchtitan_settings(LayoutSpec(dp=1, cp=8, cp_comm="a2a"), load_model("llama3-8b"),
                            TrainingSpec(global_batch_size=1, seq_length=65536))
    with pytest.raises(SpecError, match="torchao"):
        torchtitan_settings(LayoutSpec(dp=8), load_model("llama3-8b"),
                            TrainingSpec(global_batch_size=8, seq_length=8192, precision="fp8", fp8_recipe="delayed"))


def test_deepspeed_ulysses_and_refusals():
    layout = LayoutSpec(dp=2, cp=4, cp_comm="a2a")
    training = TrainingSpec(global_batch_size=2, seq_length=65536)
    assert '"sequence_parallel_size": 4' in export(_plan("llama3-8b", layout, training), "deepspeed").text
    for lay, train, why in ((LayoutSpec(dp=2, cp=4), training, "Ulysses"),
                            (LayoutSpec(dp=8, ep=8), TrainingSpec(global_batch_size=8, seq_length=4096), "model code"),
                            (LayoutSpec(dp=8), TrainingSpec(global_batch_size=8, seq_length=4096, precision="fp8"),
                             "FP8")):
        with pytest.raises(SpecError, match=why):
            deepspeed_settings(lay, load_model("mixtral-8x7b"), train)
