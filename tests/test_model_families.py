"""Hugging Face import of modern families and exact parameter counts, each against its published or derived number.

Configs are the fields of the released config.json files that affect the count (values as in
../shared/reference/modern-training.md §3.1 and §6.2, which cite the HF configuration_*.py defaults at 008e5743,
DeepSeek-V3@9b4e9788 inference/configs/config_671B.json, NeMo@8cfedd72 model configs).
"""

import json
import subprocess
import sys

import pytest

from cluster_specs import SpecError
from cost_models.attention import attention_weight_count, core_attention_forward_flops, window_fraction
from cost_models.compute import layer_forward_flops
from planner.inputs.models import hf_config_to_spec, load_model
from planner.inputs.specs import ModelSpec

C = {
 "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_hidden_layers=24, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, use_sliding_window=False, sliding_window=32768, max_window_layers=21),
 "nemo": dict(model_type="mistral", hidden_size=5120, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=128, num_hidden_layers=40, vocab_size=131072, tie_word_embeddings=False, sliding_window=None),
 "mixtral": dict(model_type="mixtral", hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=32, vocab_size=32000, num_local_experts=8, num_experts_per_tok=2),
 "mixtral22": dict(model_type="mixtral", hidden_size=6144, intermediate_size=16384, num_attention_heads=48, num_key_value_heads=8, num_hidden_layers=56, vocab_size=32768, num_local_experts=8, num_experts_per_tok=2),
 "qwen3-8b": dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8, head_dim=128, num_hidden_layers=36, vocab_size=151936, tie_word_embeddings=False),
 "gemma2-2b": dict(model_type="gemma2", hidden_size=2304, intermediate_size=9216, num_attention_heads=8, num_key_value_heads=4, head_dim=256, num_hidden_layers=26, vocab_size=256000, sliding_window=4096),
 "gemma2-9b": dict(model_type="gemma2", hidden_size=3584, intermediate_size=14336, num_attention_heads=16, num_key_value_heads=8, head_dim=256, num_hidden_layers=42, vocab_size=256000, sliding_window=4096),
 "gemma2-27b": dict(model_type="gemma2", hidden_size=4608, intermediate_size=36864, num_attention_heads=32, num_key_value_heads=16, head_dim=128, num_hidden_layers=46, vocab_size=256000, sliding_window=4096),
 "phi3": dict(model_type="phi3", hidden_size=3072, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=32, num_hidden_layers=32, vocab_size=32064, tie_word_embeddings=False, sliding_window=2047),
 "falcon7b": dict(model_type="falcon", hidden_size=4544, n_head=71, n_layer=32, vocab_size=65024, multi_query=True, parallel_attn=True, bias=False, new_decoder_architecture=False, alibi=False),
 "olmo7b": dict(model_type="olmo", hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32, num_hidden_layers=32, vocab_size=50304, tie_word_embeddings=False, clip_qkv=None),
 "qwen1.5moe": dict(model_type="qwen2_moe", hidden_size=2048, intermediate_size=5632, num_attention_heads=16, num_key_value_heads=16, num_hidden_layers=24, vocab_size=151936, num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408, shared_expert_intermediate_size=5632, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False),
 "qwen2-57b": dict(model_type="qwen2_moe", hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4, num_hidden_layers=28, vocab_size=151936, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=2560, shared_expert_intermediate_size=20480, tie_word_embeddings=False),
 "qwen3-30b": dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_hidden_layers=48, vocab_size=151936, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, tie_word_embeddings=False),
 "qwen3-235b": dict(model_type="qwen3_moe", hidden_size=4096, intermediate_size=12288, num_attention_heads=64, num_key_value_heads=4, head_dim=128, num_hidden_layers=94, vocab_size=151936, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536, tie_word_embeddings=False),
 "dsv3": dict(model_type="deepseek_v3", hidden_size=7168, intermediate_size=18432, num_attention_heads=128, num_key_value_heads=128, num_hidden_layers=61, vocab_size=129280, moe_intermediate_size=2048, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, first_k_dense_replace=3, moe_layer_freq=1, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, topk_method="noaux_tc", n_group=8, topk_group=4, tie_word_embeddings=False),
 "dsv2": dict(model_type="deepseek_v2", hidden_size=5120, intermediate_size=12288, num_attention_heads=128, num_hidden_layers=60, vocab_size=102400, moe_intermediate_size=1536, n_routed_experts=160, n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1, moe_layer_freq=1, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, topk_method="group_limited_greedy", n_group=8, topk_group=3),
 "dsv2lite": dict(model_type="deepseek_v2", hidden_size=2048, intermediate_size=10944, num_attention_heads=16, num_hidden_layers=27, vocab_size=102400, moe_intermediate_size=1408, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1, moe_layer_freq=1, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, topk_method="greedy", n_group=1, topk_group=1),
}


# (config, total, active, source of the expected total)
COUNTS = [
    ("qwen2.5-0.5b", 494_032_768, None, "issue 13 brief (Qwen2.5-0.5B with QKV bias, tied); modern-training.md §6.2"),
    ("nemo", 12_247_782_400, None, "issue 13 brief (Mistral-NeMo-12B, head_dim 128 != 5120/32); §6.2"),
    ("mixtral", 46_702_792_704, 12_879_925_248, "§3.1: Mixtral-8x7B 46,702,792,704 (brief), 12.9B active"),
    ("mixtral22", 140_630_071_296, 39_161_468_928, "§3.1: Mixtral-8x22B, published 141B / 39B"),
    ("qwen3-8b", 8_190_735_360, None, "§6.2 derived (qk-norm, untied); published 8.2B"),
    ("gemma2-2b", 2_614_341_888, None, "§6.2 derived (4 norms per layer, tied); published 2.6B"),
    ("gemma2-9b", 9_241_705_984, None, "§6.2 derived; published 9B"),
    ("gemma2-27b", 27_227_128_320, None, "§6.2 derived; published 27B"),
    ("phi3", 3_821_079_552, None, "§6.2 derived (fused qkv/gate_up); published 3.8B"),
    ("falcon7b", 6_921_720_704, None, "§6.2 derived (MQA, one LayerNorm per layer, tied); published 7B"),
    ("olmo7b", 6_888_095_744, None, "§6.2 derived (non-parametric LayerNorm); published 7B"),
    ("qwen1.5moe", 14_315_784_192, 2_689_173_504, "§3.1: Qwen1.5-MoE-A2.7B, published 14.3B / 2.7B"),
    ("qwen2-57b", 57_408_658_944, 14_249_270_784, "§3.1: Qwen2-57B-A14B, published 57B / 14B"),
    ("qwen3-30b", 30_532_122_624, 3_353_032_704, "§3.1: Qwen3-30B-A3B, published 30.5B / 3.3B"),
    ("qwen3-235b", 235_093_634_560, 22_190_763_520, "§3.1: Qwen3-235B-A22B, published 235B / 22B"),
    ("dsv3", 671_026_419_200, 37_552_297_472, "§3.1: DeepSeek-V3 main model, published 671B / 37B (V3 §4.2)"),
    # §3.1 lists 235,741,444,320: that is this count plus 59 x 160 router-bias values, which V2's
    # group_limited_greedy gate does not have (only noaux_tc, V3, keeps e_score_correction_bias)
    ("dsv2", 235_741_434_880, 21_375_800_320, "§3.1 structure; published 236B / 21B (V2 §3.1.2)"),
    ("dsv2lite", 15_706_484_224, 2_661_150_208, "§3.1: DeepSeek-V2-Lite, published 15.7B / 2.4B (V2 App. B.1)"),
]


def _spec(key):
    return ModelSpec.model_validate({"name": key, **hf_config_to_spec(C[key])})


@pytest.mark.parametrize("key,total,active,source", COUNTS, ids=[c[0] for c in COUNTS])
def test_hf_parameter_counts_match_published(key, total, active, source):
    counts = _spec(key).parameter_counts()
    assert counts["total"] == total, source
    assert counts["active"] == (active if active is not None else total), source


def test_published_rounded_counts_agree():
    """The rounded published totals (model cards, papers) agree with the exact counts to their precision."""
    published = {"mixtral": 46.7e9, "qwen3-30b": 30.5e9, "dsv3": 671e9, "dsv2": 236e9, "dsv2lite": 15.7e9,
                 "qwen3-235b": 235e9, "mixtral22": 141e9, "qwen1.5moe": 14.3e9}
    for key, value in published.items():
        assert _spec(key).parameter_counts()["total"] == pytest.approx(value, rel=0.004), key
    # DeepSeek's "activated" figures are about one embedding matrix below the plain count (§3.1 notes)
    assert _spec("dsv3").parameter_counts()["active"] - 129280 * 7168 == pytest.approx(36.7e9, rel=0.003)


@pytest.mark.parametrize("name,key", [("mixtral-8x7b", "mixtral"), ("mixtral-8x22b", "mixtral22"),
                                      ("deepseek-v3", "dsv3"), ("deepseek-v2", "dsv2"), ("qwen3-30b-a3b", "qwen3-30b"),
                                      ("qwen3-235b-a22b", "qwen3-235b"), ("mistral-nemo-12b", "nemo"),
                                      ("gemma2-9b", "gemma2-9b"), ("gemma2-27b", "gemma2-27b")])
def test_presets_equal_their_hf_config(name, key):
    assert load_model(name).parameter_counts() == _spec(key).parameter_counts()
    assert load_model(name).to_cost_model() == _spec(key).to_cost_model()


def test_llama31_405b_preset_has_128k_context():
    spec = load_model("llama3.1-405b")
    assert spec.max_position_embeddings == 131072
    assert spec.parameter_counts()["total"] == load_model("llama3-405b").parameter_counts()["total"]
    assert spec.parameter_counts()["total"] == pytest.approx(405e9, rel=0.003)  # "405B" (Llama 3 paper Table 3)


def test_mla_layer_parameters_and_core_flops():
    """DeepSeek-V3 MLA: 187,107,328 weights+norms per layer (modern-training.md §4.1; Megatron
    theoretical_memory_usage.py L62-80); the core costs 1.25x MHA's at equal heads (§4.2)."""
    m = _spec("dsv3").to_cost_model()
    assert attention_weight_count(m) + 1536 + 512 == 187_107_328
    mha_core = 4 * 4096 * 4096 * 128 * 128  # 4 T s a d with d = 128
    assert core_attention_forward_flops(m, tokens=4096, seq_length=4096) / mha_core == pytest.approx(1.25)


def test_sliding_window_flops():
    """Mistral-7B at s=16384, W=4096 attends 0.437 of full causal; Gemma-2 at 8192 averages 0.875 (§5)."""
    assert window_fraction(4096, 16384) == pytest.approx(0.437, abs=5e-4)
    assert window_fraction(4096, 32768) == pytest.approx(0.234, abs=5e-4)
    assert window_fraction(4096, 4096) == 1.0
    g = _spec("gemma2-9b").to_cost_model()
    assert g.sliding_window_layers == 21
    full = core_attention_forward_flops(
        _spec("gemma2-9b").model_copy(update={"sliding_window": None}).to_cost_model(), tokens=8192, seq_length=8192)
    assert core_attention_forward_flops(g, tokens=8192, seq_length=8192) / full == pytest.approx(0.875, abs=1e-3)


def test_moe_flops_use_active_experts():
    """Forward GEMM FLOPs of an MoE model are 2 x (active parameters outside the embedding) per token, plus nothing
    for inactive experts; Mixtral: 2 x (12,879,925,248 - 2 x 131,072,000 - norms)."""
    spec = _spec("mixtral")
    m, counts = spec.to_cost_model(), spec.parameter_counts()
    gemm, _ = layer_forward_flops(m, tokens=1, seq_length=4096)
    norms = counts["per_layer_norms"]
    per_layer_active = (counts["active"] - counts["embedding"] - counts["output_layer"] - counts["final_norm"]) / 32
    assert gemm == pytest.approx(2 * (per_layer_active - norms))


def test_dense_first_layers_are_counted_once():
    """DeepSeek-V3: 3 dense layers with ffn 18432 and 58 MoE layers."""
    counts = _spec("dsv3").parameter_counts()
    assert counts["layers"] == 3 * counts["per_dense_layer"] + 58 * counts["per_layer"]
    assert counts["per_layer"] - counts["per_dense_layer"] == (256 * 3 + 3) * 7168 * 2048 + 256 * 7168 + 256 \
        - 3 * 7168 * 18432


@pytest.mark.parametrize("model_type,needle", [("t5", "encoder-decoder"), ("mamba", "state-space"),
                                               ("jamba", "hybrid"), ("bert", "encoder-only"), ("olmo2", "q/k norms"),
                                               ("some_new_arch", "not a supported family")])
def test_unsupported_families_say_what_is_missing(model_type, needle):
    with pytest.raises(SpecError) as err:
        hf_config_to_spec({"model_type": model_type, "hidden_size": 8})
    assert needle in str(err.value) and "model YAML" in str(err.value)


def test_multimodal_wrapper_is_refused_with_the_way_out():
    with pytest.raises(SpecError, match="text_config"):
        hf_config_to_spec({"model_type": "llava", "text_config": {"model_type": "llama"}})


@pytest.mark.parametrize("field,value", [("num_key_value_heads", 0), ("head_dim", "128"), ("num_hidden_layers", -1),
                                         ("tie_word_embeddings", "yes")])
def test_bad_hf_values_name_the_hf_key(field, value):
    cfg = {**C["qwen3-8b"], field: value}
    with pytest.raises(SpecError, match=field):
        hf_config_to_spec(cfg)


def test_missing_hf_key_is_named():
    cfg = {k: v for k, v in C["mixtral"].items() if k != "num_local_experts"}
    with pytest.raises(SpecError, match="num_local_experts: missing"):
        hf_config_to_spec(cfg)


def test_models_show_reads_a_snapshot_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(C["mixtral"]))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "models", "show", str(tmp_path), "--json"],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["parameters"]["total"] == 46_702_792_704


def test_readme_model_yaml_example_loads(tmp_path):
    from conftest import ROOT

    text = (ROOT / "README.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "my-moe.yaml"
    path.write_text(block)
    spec = load_model(str(path))
    assert spec.moe is not None and spec.parameter_counts()["total"] == 46_702_792_704  # Mixtral's shape


def test_multimodal_wrapper_of_an_unsupported_decoder_says_so():
    """Llama 4's wrapper holds a llama4_text decoder the planner does not read: saving its text_config would only
    lead to a second refusal, so the first one says it."""
    with pytest.raises(SpecError, match="text decoder \\(model_type 'llama4_text'\\) is not a supported family"):
        hf_config_to_spec({"model_type": "llama4", "text_config": {"model_type": "llama4_text"}})


def test_gemma3_text_config_as_released_takes_transformers_defaults():
    """Google's Gemma 3 27B text_config leaves out vocab_size and its 4B's num_attention_heads; transformers fills
    Gemma3TextConfig's defaults (262,208 tokens; 8 heads, 4 KV heads, head_dim 256). 27B text decoder: 62 layers,
    h 5376, 32 heads (16 KV), head_dim 128, ffn 21504. By hand: per layer q 5376x4096 + k, v 2x5376x2048 + o 4096x5376
    = 66,060,288, GeGLU 3x5376x21504 = 346,816,512, 4 norms 4x5376 + q/k norms 2x128 = 21,760, so 412,898,560;
    x 62 = 25,599,710,720, + the tied embedding 262,208 x 5376 = 1,409,630,208 + the final norm 5,376 =
    27,009,346,304 (Gemma 3's published 27B)."""
    cfg = dict(model_type="gemma3_text", hidden_size=5376, intermediate_size=21504, num_attention_heads=32,
               num_key_value_heads=16, head_dim=128, num_hidden_layers=62, sliding_window=1024)
    spec = ModelSpec.model_validate(hf_config_to_spec(cfg))
    assert spec.vocab_size == 262208
    from cost_models.compute import parameter_counts

    assert parameter_counts(spec.to_cost_model()).total == 27_009_346_304


@pytest.mark.parametrize("update,key", [({"decoder_sparse_step": 2}, "decoder_sparse_step"),
                                        ({"mlp_only_layers": [5]}, "mlp_only_layers")])
def test_moe_with_dense_layers_between_moe_layers_is_refused(update, key):
    """HF Qwen MoE: layer i is MoE when (i+1) % decoder_sparse_step == 0 and i is not in mlp_only_layers. Dense layers
    between MoE ones were counted as leading dense layers (and exported as Megatron's [0]*k+[1]*n pattern)."""
    with pytest.raises(SpecError, match=f"{key}: .* between MoE layers"):
        hf_config_to_spec({**C["qwen3-30b"], **update})
    assert hf_config_to_spec({**C["qwen3-30b"], "mlp_only_layers": [0, 1]})["moe"]["num_dense_layers"] == 2


@pytest.mark.parametrize("layer_types", [["sliding_attention"] * 6, "sliding_attention",
                                         ["sliding_attention", "global"] * 21])
def test_layer_types_must_list_every_layer(layer_types):
    with pytest.raises(SpecError, match="layer_types: .* -> a list of 42 entries"):
        hf_config_to_spec({**C["gemma2-9b"], "layer_types": layer_types})


def test_a_check_across_fields_names_the_config_json_key(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**C["qwen3-8b"], "num_key_value_heads": 64}))
    with pytest.raises(SpecError) as err:
        load_model(str(path))
    assert err.value.problems == ["num_kv_heads (config.json num_key_value_heads): 64 -> must divide "
                                  "num_attention_heads (32)"]
