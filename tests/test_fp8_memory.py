"""FP8 memory by the library that runs the FP8 Linears (cost_models/inputs.py Knobs.fp8_torchao_linear).

Transformer Engine (Megatron-Core, NeMo, llm-foundry's amp_fp8) keeps each FP8 Linear's input quantized for backward
(Megatron: "stores linear layer inputs in FP8", modern-training.md §1.3) and caches FP8 weight copies for the step;
torchao's Float8Linear (torchtitan) saves the high-precision input (pytorch/ao torchao/float8/float8_linear.py,
matmul_with_hp_or_float8_args.forward: save_for_backward(input_hp, weight_hp_t)) and casts weights on the fly.
Measured: torchtitan's Llama 3.1 8B runs print the same memory with and without Float8 (docs/performance.md at
eaea6f6a, Tables 1 and 3, torch.compile: 77.0 / 76.8 GiB on 8 H100, 62.0 / 61.8 GiB on 128); before this the model
put torchtitan's FP8 run 11.8 GiB under its BF16 run.
"""

import pytest

from cost_models.fp8 import saved_activation_saving_bytes
from planner.estimate import build_problem
from planner.inputs.layout_string import parse_layout_string
from planner.inputs.specs import LayoutSpec
from planner.validation import _gpu_and_cluster

LLAMA3_8B = dict(tokens=2 * 8192, hidden_size=4096, q_width=4096, ffn=14336)  # HF config: h 4096, 32 heads, ffn 14336


def _stage(framework, precision, layout):
    est = build_problem("dgx-h100", 1, "llama3-8b", 16, 8192, precision, framework=framework).estimate(layout)
    return est.stages[est.peak_stage]


def _layout(text):
    return LayoutSpec.model_validate(parse_layout_string(text))


@pytest.mark.parametrize("recompute", ["selective", "none"])
def test_torchtitan_fp8_keeps_the_bf16_activations_and_no_weight_copies(recompute):
    layout = _layout(f"dp=8,zero=3,mbs=2,recompute={recompute}")
    bf16, fp8 = (_stage("torchtitan", p, layout) for p in ("bf16", "fp8"))
    assert fp8.activations_bytes == pytest.approx(bf16.activations_bytes, rel=1e-12)
    assert fp8.weights_bytes == pytest.approx(bf16.weights_bytes, rel=1e-12)


def test_megatron_fp8_saves_the_quantized_linear_inputs():
    layout = _layout("dp=8,zero=1,mbs=2,recompute=none")
    bf16, fp8 = (_stage("megatron", p, layout) for p in ("bf16", "fp8"))
    per_layer = saved_activation_saving_bytes(**LLAMA3_8B)  # 1 B per element of the four Linear inputs
    assert bf16.activations_bytes - fp8.activations_bytes == pytest.approx(32 * per_layer, rel=1e-9)
    assert fp8.weights_bytes > bf16.weights_bytes  # TE's cached FP8 weight copies


def test_a_rows_stated_gpu_memory_reaches_its_cluster():
    """torchtitan's Grand Teton H100s ('96GB HBM2e', docs/performance.md at eaea6f6a) print up to 84.9 GiB reserved:
    on the 80 GB preset (79.6 GiB) every such row was a false out-of-memory verdict. They run on their own catalog
    part, the 95 GB HBM2e H100 at 500 W (the published set's rows state 95 GB; the probe's 96 GB is within
    MEMORY_MISMATCH_FRACTION of it). A row naming an A100 without its size but stating 40 GB runs on 40 GB, not the
    80 GB preset."""
    from cluster_specs import load_gpu

    for text, stated in (("H100 SXM 96GB HBM2e (500 W)", None), ("H100 SXM 95GB HBM2e (lower TDP)", 95)):
        _, spec = _gpu_and_cluster({"gpu_type": text, "gpu_memory_gb": stated, "total_gpus": 8, "gpus_per_node": 8})
        assert spec["gpu"] == "H100-SXM-HBM2e-500W"
        assert load_gpu(spec["gpu"]).memory_gib * 2**30 == pytest.approx(95e9)
    _, spec = _gpu_and_cluster({"gpu_type": "A100 SXM", "gpu_memory_gb": 40, "total_gpus": 8, "gpus_per_node": 8})
    assert spec["gpu"]["memory_gib"] * 2**30 == pytest.approx(40e9)
    _, spec = _gpu_and_cluster({"gpu_type": "A100 80GB", "gpu_memory_gb": 80, "total_gpus": 8, "gpus_per_node": 8})
    assert spec["gpu"] == "A100-SXM4-80GB"  # within 10% of the preset: its measured capacity stands
