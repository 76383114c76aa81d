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


@pytest.mark.parametrize(("precision", "dtype"), [("fp8", "torch.bfloat16"), ("bf16", "torch.bfloat16"),
                                                  ("fp16", "torch.float16")])
def test_nemo_export_names_the_pipeline_dtype_of_every_precision(precision, dtype):
    """Megatron-Core raises a ValueError for pp > 1 without pipeline_dtype (model_parallel_config.py L527-531,
    frameworks.md §4.4); the export wrote null for every precision but bf16, FP8 included (its activations between
    stages are BF16)."""
    layout = LayoutSpec(dp=2, tp=8, pp=4, sequence_parallel=True, zero_stage=1, num_micro_batches=8)
    training = TrainingSpec(global_batch_size=16, seq_length=8192, precision=precision)
    text = export(_plan("llama3-70b", layout, training), "nemo").text
    assert f"model.pipeline_dtype={dtype}" in text.splitlines()


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
    layout = LayoutSpec(dp=2, cp=4, cp_comm="a2a", zero_stage=3, recompute="full")  # fits DeepSpeed at 64K
    training = TrainingSpec(global_batch_size=2, seq_length=65536)
    assert '"sequence_parallel_size": 4' in export(_plan("llama3-8b", layout, training), "deepspeed").text
    for lay, train, why in ((LayoutSpec(dp=2, cp=4), training, "Ulysses"),
                            (LayoutSpec(dp=8, ep=8), TrainingSpec(global_batch_size=8, seq_length=4096), "model code"),
                            (LayoutSpec(dp=8), TrainingSpec(global_batch_size=8, seq_length=4096, precision="fp8"),
                             "FP8")):
        with pytest.raises(SpecError, match=why):
            deepspeed_settings(lay, load_model("mixtral-8x7b"), train)


def _hf_plan(tmp_path, cfg: dict, layout: LayoutSpec, training: TrainingSpec) -> dict:
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return _plan(str(path), layout, training)


QWEN3_32B = dict(model_type="qwen3", hidden_size=5120, intermediate_size=25600, num_attention_heads=64,
                 num_key_value_heads=8, head_dim=128, num_hidden_layers=64, vocab_size=151936,
                 tie_word_embeddings=False)  # Qwen/Qwen3-32B config.json
QWEN25_7B = dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                 num_key_value_heads=4, num_hidden_layers=28, vocab_size=152064, tie_word_embeddings=False)
GEMMA2_9B = dict(model_type="gemma2", hidden_size=3584, intermediate_size=14336, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=256, num_hidden_layers=42, vocab_size=256000, sliding_window=4096)


def _flags(text: str) -> dict:
    import shlex

    words = shlex.split(" ".join(line for line in text.splitlines() if not line.startswith("#")))
    out: dict = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            out[w] = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
    return out


def test_megatron_export_builds_the_planned_shape(tmp_path):
    """Qwen3's head_dim (128, not 5120/64 = 80: Megatron's kv_channels default) and qk-norm, Qwen2's QKV bias
    without other biases, and no dropout for models without it (Megatron defaults both to 0.1): flags the export
    once left out, so Megatron built a smaller model (Qwen3-32B -6.9% parameters) or saved dropout masks the plan
    did not count. Flag names: Megatron-LM arguments.py / TransformerConfig (kv_channels, qk_layernorm,
    add_qkv_bias, hidden_dropout, attention_dropout)."""
    training = TrainingSpec(global_batch_size=8, seq_length=4096)
    qwen3 = _flags(export(_hf_plan(tmp_path, QWEN3_32B, LayoutSpec(dp=8, tp=8), training), "megatron").text)
    assert qwen3["--kv-channels"] == "128" and "--qk-layernorm" in qwen3 and "--add-qkv-bias" not in qwen3
    assert qwen3["--attention-dropout"] == "0.0" and qwen3["--hidden-dropout"] == "0.0"
    qwen2 = _flags(export(_hf_plan(tmp_path, QWEN25_7B, LayoutSpec(dp=8, tp=4), training), "megatron").text)
    assert "--disable-bias-linear" in qwen2 and "--add-qkv-bias" in qwen2 and "--kv-channels" not in qwen2
    gpt2 = dict(model_type="gpt2", n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024,
                resid_pdrop=0.1)  # openai-community/gpt2: trained with dropout 0.1, Megatron's default
    gpt = _flags(export(_hf_plan(tmp_path, gpt2, LayoutSpec(dp=8), TrainingSpec(global_batch_size=8, seq_length=1024)),
                        "megatron").text)
    assert "--attention-dropout" not in gpt and "--hidden-dropout" not in gpt


def test_megatron_refuses_a_shape_its_flags_cannot_build(tmp_path):
    """Gemma 2: GeGLU and four norms a layer; Megatron-LM's flags build neither (--swiglu, two norms)."""
    plan = _hf_plan(tmp_path, GEMMA2_9B, LayoutSpec(dp=8, tp=4), TrainingSpec(global_batch_size=8, seq_length=4096))
    for target in ("megatron", "megatron-deepspeed"):
        with pytest.raises(SpecError, match="mlp: geglu"):
            export(plan, target)


def test_megatron_deepspeed_export_uses_its_own_flag_names():
    """microsoft/Megatron-DeepSpeed's arguments.py (f4157bea): --normalization takes 'layernorm' or 'rmsnorm',
    rotary positions are --use-rotary-position-embeddings, GQA is --num-key-value-heads; Megatron-LM's
    'RMSNorm', --position-embedding-type and --num-query-groups are not its options (argparse exits)."""
    plan = _plan("llama3-8b", LayoutSpec(dp=8, zero_stage=1), TrainingSpec(global_batch_size=8, seq_length=4096))
    flags = _flags(export(plan, "megatron-deepspeed", framework="megatron-deepspeed").text)
    assert flags["--normalization"] == "rmsnorm" and "--use-rotary-position-embeddings" in flags
    assert flags["--num-key-value-heads"] == "8"
    assert not {"--position-embedding-type", "--num-query-groups", "--group-query-attention"} & set(flags)
    megatron = _flags(export(plan, "megatron").text)
    assert megatron["--normalization"] == "RMSNorm" and megatron["--position-embedding-type"] == "rope"
    assert megatron["--num-query-groups"] == "8" and "--group-query-attention" in megatron


def test_check_says_when_a_megatron_config_runs_dropout_the_model_lacks(tmp_path):
    """Megatron's dropout defaults (0.1) hold where a launch script does not set them; check of such a script for a
    model without dropout says its masks are not counted. The export's own script sets them off: no note."""
    import subprocess
    import sys

    plan = _plan("llama3-8b", LayoutSpec(dp=8, zero_stage=1, recompute="full"),
                 TrainingSpec(global_batch_size=8, seq_length=4096))
    text = export(plan, "megatron").text
    common = ["-c", "dgx-h100", "-n", "1", "-m", "llama3-8b", "-b", "8", "-s", "4096", "--framework", "megatron"]
    notes = []
    for name, body in (("exported.sh", text), ("defaults.sh", "\n".join(
            line for line in text.splitlines() if "dropout" not in line))):
        (tmp_path / name).write_text(body)
        proc = subprocess.run([sys.executable, "-m", "planner.cli", "check", str(tmp_path / name), *common],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        notes.append("the config runs dropout" in proc.stdout + proc.stderr)
    assert notes == [False, True]


def test_torchtitan_export_names_the_family_that_builds_the_model(tmp_path):
    """torchtitan 0.3's families (torchtitan/models: llama3, qwen3, deepseek_v3): a preset it ships is its flavor; a
    qk-norm model registers in qwen3 with its head_dim; a shape none builds is refused. The export once told every
    model to register in llama3, whose builder has no MoE, qk-norm or head_dim."""
    training = TrainingSpec(global_batch_size=8, seq_length=4096)
    dsv3 = export(_plan("deepseek-v3", LayoutSpec(dp=512, ep=64, zero_stage=3, recompute="full"),
                        TrainingSpec(global_batch_size=512, seq_length=4096)), "torchtitan").text
    assert "from torchtitan.models.deepseek_v3 import model_registry" in dsv3 and "model_registry('671B')" in dsv3
    qwen = export(_hf_plan(tmp_path, QWEN3_32B, LayoutSpec(dp=16, zero_stage=3, recompute="full"),
                           TrainingSpec(global_batch_size=16, seq_length=4096)), "torchtitan")
    assert "from torchtitan.models.qwen3 import model_registry" in qwen.text
    note = " ".join(qwen.notes)
    assert "register it in torchtitan/models/qwen3 with dim=5120" in note
    assert "hidden_dim=25600" in note and "head_dim=128" in note and "enable_weight_tying=False" in note
    with pytest.raises(SpecError, match="routed experts without MLA or qk-norm"):
        export(_plan("mixtral-8x7b", LayoutSpec(dp=8, ep=8, zero_stage=3), training), "torchtitan")
    with pytest.raises(SpecError, match="mlp geglu"):
        export(_hf_plan(tmp_path, GEMMA2_9B, LayoutSpec(dp=8, zero_stage=3), training), "torchtitan")


def test_export_of_a_plan_made_for_another_profile_is_predicted_under_the_target(tmp_path):
    """A generic plan (Llama 3 70B on 8 DGX H100, 71.6 GiB) exported to torchtitan was written as planned, and `check`
    of the file failed it at 78.7 GiB + headroom under torchtitan's profile. The export predicts it under the target's
    profile as check does, takes the nearest layout that fits there (full recompute), and check passes it."""
    import json
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True,
                              timeout=300)

    common = ["-c", "dgx-h100", "-n", "8", "-m", "llama3-70b", "-b", "512", "-s", "8192"]
    plan = tmp_path / "plan.json"
    assert run("plan", *common, "--no-solver", "--json", "-o", str(plan)).returncode == 0
    job = tmp_path / "job.py"
    proc = run("export", str(plan), "--to", "torchtitan", "-o", str(job))
    assert proc.returncode == 0, proc.stderr
    checked = run("check", str(job), *common, "--json")
    assert checked.returncode == 0, checked.stdout
    report = json.loads(checked.stdout)
    assert report["passed"] and report["layout"]["recompute"] == "full"
    assert "recompute -> full" in job.read_text()
