"""Reference formulas from papers and frameworks, kept as oracles: the production path (stage.py, step.py,
pipeline.py) is tested against them (tests/test_cost_vectors.py, tests/test_stage_model.py), and no production
code calls them. Each states its source; cost-models.md §9 gives the published test vectors.
"""

from __future__ import annotations

# ---------------------------------------------------------------------------------------------------
# Parameters, FLOPs, utilisation, training time
# ---------------------------------------------------------------------------------------------------

def params_narayanan_eq2(*, num_layers: int, hidden_size: int, vocab_size: int, seq_length: int) -> float:
    """Narayanan et al. 2021 Eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)) (no final LayerNorm)."""
    l, h = num_layers, hidden_size
    return 12 * l * h * h * (1 + 13 / (12 * h) + (vocab_size + seq_length) / (12 * l * h))


def mfu(*, model_flops: float, step_seconds: float, num_gpus: int, peak_flops_per_second: float) -> float:
    """Model FLOPs utilization (Korthikanti et al. 2022 Appendix A)."""
    return model_flops / (step_seconds * num_gpus * peak_flops_per_second)


def mfu_palm(*, tokens_per_second: float, num_params: float, num_gpus: int, peak_flops_per_second: float) -> float:
    """PaLM Appendix B without the attention term: tokens/s x 6N / aggregate peak."""
    return tokens_per_second * 6 * num_params / (num_gpus * peak_flops_per_second)


def train_days_eq4(*, tokens: float, num_params: float, num_gpus: int, flops_per_second_per_gpu: float) -> float:
    """Narayanan et al. 2021 Eq. 4: T_train = 8 T P / (n X), in days."""
    return 8 * tokens * num_params / (num_gpus * flops_per_second_per_gpu) / 86400



# ---------------------------------------------------------------------------------------------------
# Memory: model states and activations
# ---------------------------------------------------------------------------------------------------

def zero_model_state_bytes(
    *, num_params: float, dp: int, zero_stage: int, param_bytes: float = 2, grad_bytes: float = 2,
    optimizer_bytes: float = 12,
) -> float:
    """Model-state bytes per device (ZeRO paper §5, Table 1): stage 1 shards the optimizer state, stage 2
    the gradients too, stage 3 the parameters too, each over the data-parallel degree `dp`.

    Defaults are the paper's mixed-precision Adam convention (2 + 2 + K=12 = 16 bytes per parameter);
    Megatron's bf16 with fp32 main grads is grad_bytes=4 (18 bytes per parameter).
    """
    params = param_bytes * num_params / (dp if zero_stage >= 3 else 1)
    grads = grad_bytes * num_params / (dp if zero_stage >= 2 else 1)
    optim = optimizer_bytes * num_params / (dp if zero_stage >= 1 else 1)
    return params + grads + optim


def megatron_bytes_per_param(*, param_dtype: str, grad_dtype: str, distributed_optimizer: bool, dp: int) -> float:
    """Megatron-LM dist_optimizer.md table: bytes per parameter (cost-models.md §1.2)."""
    table = {("fp16", "fp16"): (20, 4, 16), ("bf16", "fp32"): (18, 6, 12), ("fp32", "fp32"): (16, 8, 8)}
    plain, kept, sharded = table[(param_dtype, grad_dtype)]
    return kept + sharded / dp if distributed_optimizer else plain


def deepspeed_zero2_estimate_bytes(*, total_params: float, num_gpus: int, gpus_per_node: int, cpu_offload: bool,
                                   buffer_factor: float = 1.5) -> tuple[float, float]:
    """DeepSpeed estimate_zero2_model_states_mem_needs (after PR #5099): (GPU bytes, CPU bytes)."""
    if cpu_offload:
        return 2 * total_params, total_params * max(4 * num_gpus, 16) * buffer_factor
    return 2 * total_params + int(18 * total_params / num_gpus), 4 * total_params * gpus_per_node * buffer_factor


def deepspeed_zero3_estimate_bytes(*, total_params: float, largest_layer_params: float, num_gpus: int,
                                   gpus_per_node: int, num_nodes: int = 1, offload_params: bool = False,
                                   offload_optimizer: bool = False, zero_init: bool = True,
                                   buffer_factor: float = 1.5) -> tuple[float, float]:
    """DeepSpeed estimate_zero3_model_states_mem_needs: (GPU bytes, CPU bytes) (cost-models.md §1.3)."""
    largest = 4 * largest_layer_params
    node_factor = 1 / num_nodes
    if offload_params and offload_optimizer:
        gpu = largest
        cpu = total_params * 18 * node_factor * buffer_factor if zero_init else total_params * max(4 * gpus_per_node, 18 * node_factor) * buffer_factor
    elif offload_optimizer:
        gpu = largest + 2 * total_params / num_gpus
        cpu = total_params * 16 * node_factor * buffer_factor if zero_init else total_params * max(4 * gpus_per_node, 16 * node_factor) * buffer_factor
    else:
        gpu = largest + 18 * total_params / num_gpus
        cpu = (largest_layer_params if zero_init else total_params) * 4 * gpus_per_node * buffer_factor
    return gpu, cpu


def interleave_memory_factor(*, pp: int, virtual_stages: int) -> float:
    """Korthikanti §4.2.3: stage-0 activation memory of interleaving relative to 1F1B, 1 + (p-1)/(p v)."""
    return 1 + (pp - 1) / (pp * virtual_stages)


def korthikanti_first_stage_activation_bytes(
    *, seq_length: int, micro_batch_size: int, hidden_size: int, num_heads: int, num_layers: int, tp: int, pp: int,
    virtual_stages: int = 1, sequence_parallel: bool, selective: bool,
) -> float:
    """Korthikanti Eq. 5/6 with the interleave factor: total first-stage activations (layers only)."""
    s, b, h, a, L, t = seq_length, micro_batch_size, hidden_size, num_heads, num_layers, tp
    sbh = s * b * h
    if sequence_parallel:
        per = 34 / t + (0 if selective else 5 * a * s / (h * t))
    else:
        per = 10 + 24 / t + (0 if selective else 5 * a * s / (h * t))
    factor = interleave_memory_factor(pp=pp, virtual_stages=virtual_stages) if virtual_stages > 1 else 1.0
    return sbh * L * per * factor



# ---------------------------------------------------------------------------------------------------
# Tensor-parallel traffic
# ---------------------------------------------------------------------------------------------------

def tp_elements_per_layer_narayanan(*, micro_batch_size: int, seq_length: int, hidden_size: int, tp: int) -> float:
    """Narayanan §3.2: 8 b s h (t-1)/t elements per layer per device per micro-batch."""
    return 8 * micro_batch_size * seq_length * hidden_size * (tp - 1) / tp



# ---------------------------------------------------------------------------------------------------
# Pipeline bubbles
# ---------------------------------------------------------------------------------------------------

def bubble_gpipe_of_total(*, pp: int, num_micro_batches: int) -> float:
    """GPipe / 1F1B idle share of the total time: (p-1)/(m+p-1) (GPipe §2.3)."""
    return (pp - 1) / (num_micro_batches + pp - 1)


def bubble_1f1b_of_ideal(*, pp: int, num_micro_batches: int) -> float:
    """Bubble time over ideal compute time: (p-1)/m (Narayanan §2.2.1)."""
    return (pp - 1) / num_micro_batches


def bubble_interleaved_of_ideal(*, pp: int, num_micro_batches: int, virtual_stages: int) -> float:
    """(1/v)(p-1)/m (Narayanan §2.2.2)."""
    return (pp - 1) / (virtual_stages * num_micro_batches)


def zero_bubble_bubbles(*, pp: int, t_f: float, t_b: float, t_w: float) -> dict[str, float]:
    """Bubble time of 1F1B, ZB-H1 and ZB-H2 with B = input gradient and W = weight gradient (Qi et al. Table 2)."""
    return {
        "1f1b": (pp - 1) * (t_f + t_b + t_w),
        "zb_h1": (pp - 1) * (t_f + t_b - t_w),
        "zb_h2": max(0.0, (pp - 1) * (t_f + t_b - 2 * t_w)),
    }
