"""FP8 training: which GEMMs run in FP8, their speed by size, quantization cost, memory, FP8 communication
(stdlib only).

Sources: ../shared/reference/modern-training.md §1 (TransformerEngine@d0067d0d docs, torchao@36027d82
float8 config and training docs, torchtitan@b5bcd76c float8.md, DeepSeek-V3 §3.3) and the GEMM timings
measured on the project's H200 (§1.5.2 [X]). FP8 applies to the transformer Linear layers only: QKV (or
MLA's projections), attention output, FC1, FC2 and the experts; embedding, output head, router, norms and
the attention core stay in BF16 (§1.2). MFU stays quoted against the BF16 peak (§1.4).
"""

from __future__ import annotations

from dataclasses import dataclass

# Recipes (framework names in modern-training.md §1.1)
FP8_RECIPES = ("delayed", "tensorwise", "rowwise", "blockwise", "mxfp8")


@dataclass(frozen=True, slots=True)
class Fp8Recipe:
    name: str
    kernel_factor: float  # FP8 kernel rate relative to the tensorwise fit below
    quant_bytes_per_element: float  # HBM bytes per element to quantize one fresh BF16 operand
    extra_weight_bytes_per_param: float  # persistent FP8 weight copies on top of the BF16 weight
    # with FP8 primary weights asked for (Training.fp8_param_gather), the parameter all-gather runs in FP8: Megatron
    # --fp8-param-gather "50% parameter all-gather (except MXFP8)", torchao tensorwise's enable_fsdp_float8_all_gather;
    # rowwise (and MXFP8) in torchtitan: "all distributed communication is done in high precision" (§1.6)
    fp8_param_all_gather: bool


# kernel_factor: the FP8 GEMM kernel relative to the per-tensor-scaled one the fit below measures. Delayed and current
# (tensorwise) scaling run the same per-tensor cuBLAS FP8 GEMM and differ only in how the scale is found (from the
# amax history, or by an extra amax pass over the tensor: fp8_current_scaling.rst L16-34), so their kernel factor
# is 1 and the difference lives in quant_bytes_per_element. TE's H200 12-GEMM autocast speedups (gemm_profiling.rst
# L236-262: delayed 1.69, current 1.58, pre-quantized kernel only 1.92) include quantization: taking 1.69/1.58 as a
# kernel factor on top of the kernel fit would count the quantization difference twice (it would put the delayed
# kernel at ~1.97x, above TE's 1.92x kernel-only figure). Block-scaled recipes use other kernels: blockwise
# 1.40 against current 1.58 on H200, MXFP8 1.42 against delayed 1.64 on B300 (L57-100) (these ratios still include
# their own quantization, kept as the best-sourced estimate); torchao rowwise from the [X] fit below.
# quant bytes: HBM bytes per element at the GPU's peak bandwidth for casting one fresh operand, calibrated so that the
# model (its kernel fits below and quantization_seconds) reproduces TE's published H200 autocast speedups of the
# 12-GEMM layer (gemm_profiling.rst L236-262: delayed 1.69x, current 1.58x, 5B-style config h 4096, FFN 16384,
# 15,872 tokens; tests/test_modern_costs.py): current (tensorwise) 9.8, delayed 4.7. By bytes alone the current cast
# reads the tensor twice (amax, then cast) and writes FP8 and its FP8 transpose (6 B), delayed once (4 B): TE's
# figures put the casts at ~60-85% of peak bandwidth. torchao's compiled casts measured on the project's H200 [X]
# (§1.5.2, 16384 x 8192-28672): rowwise 8.9 B/element, tensorwise 15-18 (the TE value is kept for tensorwise, which
# Megatron, NeMo and the generic planner run through TE). Blockwise and MXFP8 keep the cast of the recipe their
# kernel factor is quoted against (current and delayed), so their autocast ratios stay TE's.
# weights: TE caches an FP8 copy and an FP8 transposed copy next to the BF16 weight (+2 B, Hopper); MXFP8 keeps
# rowwise and columnwise copies with 1/32 E8M0 scales (+2.06 B); torchao casts weights on the fly (transient only).
RECIPES = {
    "delayed": Fp8Recipe("delayed", 1.0, 4.7, 2.0, True),
    "tensorwise": Fp8Recipe("tensorwise", 1.0, 9.8, 2.0, True),
    "rowwise": Fp8Recipe("rowwise", 1.0, 8.9, 0.0, False),  # its own kernel fit (ROWWISE_FIT)
    "blockwise": Fp8Recipe("blockwise", 1.40 / 1.58, 9.8, 2.0, True),
    "mxfp8": Fp8Recipe("mxfp8", 1.42 / 1.64, 4.7, 2 * (1 + 1 / 32), False),
}

# GEMM efficiency fits e(x) = e_max · x / (x + x_half), x = GEMM GFLOP, to the 13 shapes of modern-training.md §1.5.2
# [X] (H200, BF16 peak 989, FP8 peak 1979 TFLOP/s): (e_max, x_half GFLOP), median error 3.7 / 6.2 / 3.2%.
BF16_FIT = (0.728, 4.67)
TENSORWISE_FIT = (0.666, 15.3)
ROWWISE_FIT = (0.637, 13.0)


def _eff(fit: tuple[float, float], gflop: float) -> float:
    e_max, half = fit
    return e_max * gflop / (gflop + half)


def fp8_gemm_speedup(*, gemm_flops: float, recipe: str, peak_ratio: float = 2.0) -> float:
    """Kernel speed of an FP8 GEMM over the same BF16 GEMM, by size: 1.23x at 2048³, 1.8x at 16384x4096x4096
    (tensorwise on H200). `peak_ratio` is the GPU's dense FP8/BF16 peak (2 on Hopper and Blackwell, §1.4).
    Never 2x: the best FP8 kernels reach ≈70% of the FP8 peak against ≈78% for BF16 (§1.5.2)."""
    gflop = gemm_flops / 1e9
    fit = ROWWISE_FIT if recipe == "rowwise" else TENSORWISE_FIT
    r = RECIPES[recipe]
    return max(1.0, peak_ratio * _eff(fit, gflop) * r.kernel_factor / _eff(BF16_FIT, gflop))


def linear_shapes(*, hidden_size: int, q_width: int, kv_width: int, ffn: int, gated: bool) -> list[tuple[int, int]]:
    """(K, N) of the four Linear layers of a dense layer: QKV, attention output, FC1, FC2."""
    h = hidden_size
    return [(h, q_width + 2 * kv_width), (q_width, h), (h, (2 if gated else 1) * ffn), (ffn, h)]


def quantization_seconds(*, tokens: int, shapes: list[tuple[int, int]], recipe: str, hbm_bytes_per_second: float
                         ) -> tuple[float, float]:
    """(forward, backward) seconds to quantize the fresh operands of one layer's FP8 GEMMs per micro-batch.

    Forward: each Linear's input (T x K). Backward: grad_out (T x N), cast once in both orientations (dgrad and
    wgrad), plus the transposed input copy; weights are quantized once per step and cached (TE
    is_first_microbatch), so they are left out here (§1.5.2: 5-15% of the BF16 GEMM time is typical)."""
    q = RECIPES[recipe].quant_bytes_per_element
    fwd = sum(tokens * k for k, _ in shapes) * q / hbm_bytes_per_second
    bwd = sum(tokens * (n * q + k * 1.0) for k, n in shapes) / hbm_bytes_per_second  # + 1 B transposed input
    return fwd, bwd


def fp8_weight_extra_bytes(*, fp8_params: float, recipe: str, fp8_param_gather: bool = False) -> float:
    """Persistent extra bytes for FP8 weight copies (§1.3): TE +2 B/param (FP8 + FP8 transpose cached for the step),
    0 with FP8 primary weights (Megatron --fp8-param-gather: the BF16 copy is dropped), MXFP8 +2.06 B."""
    extra = RECIPES[recipe].extra_weight_bytes_per_param
    if fp8_param_gather and recipe != "mxfp8":
        extra -= 2.0  # FP8 weight (1) + transposed (1) replace the BF16 weight (2)
    return max(0.0, extra) * fp8_params


def param_all_gather_bytes(*, param_bytes: float, recipe: str | None, fp8_param_gather: bool) -> float:
    """Bytes per parameter the ZeRO/FSDP parameter all-gather moves: 1 where the run keeps FP8 primary weights and its
    recipe gathers them in FP8 (Fp8Recipe.fp8_param_all_gather), else the working copy's `param_bytes`."""
    if recipe is not None and fp8_param_gather and RECIPES[recipe].fp8_param_all_gather:
        return 1.0
    return param_bytes


def scaling_state_bytes(*, num_gemms: int, recipe: str, amax_history: int = 1) -> float:
    """Delayed scaling's amax history: 20·len bytes per GEMM (5 FP32 tensors: 3 forward, 2 backward), negligible at
    Megatron's len 1, 20 KiB per GEMM at TE's 1024 (§1.3). Other recipes keep a scale per tensor/block (in the
    FP8 copies' 1-3% and counted there)."""
    return 20.0 * amax_history * num_gemms if recipe == "delayed" else 0.0


def saved_activation_saving_bytes(*, tokens: int, hidden_size: int, q_width: int, ffn: int) -> float:
    """Bytes saved per layer per micro-batch by keeping the four Linear inputs in FP8 instead of BF16 (Megatron
    "stores linear layer inputs in FP8"; §1.3: ≈ 7 s b h of Korthikanti's 34 s b h for GPT): 1 B per element of
    the QKV input h, projection input a·d, FC1 input h and FC2 input f."""
    return float(tokens * (2 * hidden_size + q_width + ffn))
