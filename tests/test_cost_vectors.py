"""The test vectors of ../shared/reference/cost-models.md §9, each with its source."""

import math

import pytest

from cost_models import communication as comm
from cost_models import compute, memory, oracles
from cost_models.inputs import Link
from tests.conftest import gpt_shape

GIB = 2**30


# ZeRO paper (Rajbhandari et al. 2020) Table 1, GB = 1e9 B, K = 12, 16 B/param.
@pytest.mark.parametrize(
    "psi,nd,stage,expected",
    [
        (7.5e9, 64, 1, 31.40625e9),  # §9 #1
        (7.5e9, 64, 2, 16.640625e9),  # §9 #2
        (7.5e9, 64, 3, 1.875e9),  # §9 #3
        (1e12, 1024, 3, 15.625e9),  # §9 #4
        (7.5e9, 4, 1, 52.5e9),
        (7.5e9, 4, 2, 41.25e9),
        (7.5e9, 4, 3, 30e9),
        (7.5e9, 1, 0, 120e9),
        (128e9, 64, 1, 536e9),
        (128e9, 64, 2, 284e9),
        (128e9, 64, 3, 32e9),
        (1e12, 1024, 0, 16000e9),
    ],
)
def test_zero_table1(psi, nd, stage, expected):
    got = oracles.zero_model_state_bytes(num_params=psi, dp=nd, zero_stage=stage)
    assert got == pytest.approx(expected, rel=1e-12)


def test_megatron_bytes_per_param():
    # Megatron-LM docs dist_optimizer.md table (§9 #5, #6)
    assert oracles.megatron_bytes_per_param(param_dtype="bf16", grad_dtype="fp32", distributed_optimizer=True, dp=8) == 7.5
    assert oracles.megatron_bytes_per_param(param_dtype="fp16", grad_dtype="fp16", distributed_optimizer=True, dp=8) == 6.0
    assert oracles.megatron_bytes_per_param(param_dtype="bf16", grad_dtype="fp32", distributed_optimizer=False, dp=8) == 18
    # the same numbers from the general ZeRO function with Megatron's convention (2 + 4 + 12)
    assert oracles.zero_model_state_bytes(num_params=1, dp=8, zero_stage=1, grad_bytes=4) == 7.5


def test_deepspeed_estimators():
    # DeepSpeed stage_1_and_2 / stage3 estimators (cost-models.md §1.3, §9 #7, #8)
    gpu, _ = oracles.deepspeed_zero2_estimate_bytes(total_params=2851e6, num_gpus=8, gpus_per_node=8, cpu_offload=False)
    assert gpu == pytest.approx(12_116_750_000, abs=1)
    gpu, cpu = oracles.deepspeed_zero2_estimate_bytes(total_params=2851e6, num_gpus=8, gpus_per_node=8, cpu_offload=True)
    assert gpu / GIB == pytest.approx(5.3104, abs=1e-4) and cpu / GIB == pytest.approx(127.4496, abs=1e-4)
    gpu, cpu = oracles.deepspeed_zero3_estimate_bytes(total_params=2851e6, largest_layer_params=32e6, num_gpus=8,
                                                     gpus_per_node=8)
    assert gpu / GIB == pytest.approx(6.0934, abs=1e-4) and cpu / GIB == pytest.approx(1.4305, abs=1e-4)
    gpu, cpu = oracles.deepspeed_zero3_estimate_bytes(total_params=2851e6, largest_layer_params=32e6, num_gpus=8,
                                                     gpus_per_node=8, offload_params=True, offload_optimizer=True)
    assert gpu / GIB == pytest.approx(0.1192, abs=1e-4) and cpu / GIB == pytest.approx(71.6904, abs=1e-4)
    gpu, cpu = oracles.deepspeed_zero3_estimate_bytes(total_params=2851e6, largest_layer_params=32e6, num_gpus=8,
                                                     gpus_per_node=8, offload_optimizer=True)
    assert gpu / GIB == pytest.approx(0.7830, abs=1e-4) and cpu / GIB == pytest.approx(63.7248, abs=1e-4)


# Korthikanti et al. 2022 Table 2 / cost-models.md §2.7 (GPT-3 175B, s=2048, b=1), §9 #9-#12
@pytest.mark.parametrize(
    "tp,sp,recompute,expected",
    [
        (1, False, "none", 2_868_903_936),
        (8, False, "none", 578_813_952),
        (8, True, "none", 358_612_992),
        (8, False, "selective", 327_155_712),
        (8, True, "selective", 106_954_752),
        (8, False, "full", 50_331_648),
    ],
)
def test_activation_per_layer_korthikanti(tp, sp, recompute, expected):
    got = memory.activation_bytes_per_layer(gpt_shape(), seq_length=2048, micro_batch_size=1, tp=tp,
                                            sequence_parallel=sp, recompute=recompute)
    assert got == expected


def test_attention_score_bytes_and_their_kernel_traffic():
    # Korthikanti et al. 2022 Table 2: the a s^2 terms of a GPT-3 175B layer are 5 a s^2 b / t bytes (softmax output
    # 2, dropout mask 1, dropout output 2); independently, they are what selective recompute drops (rows above:
    # 578,813,952 - 327,155,712 at tp 8).
    m = gpt_shape()
    kept = memory.attention_score_bytes(m, seq_length=2048, micro_batch_size=1, tp=8)
    assert kept == 5 * 96 * 2048**2 / 8 == 578_813_952 - 327_155_712
    # traffic forward + backward per score element: softmax 2 + 3 tensor passes, dropout 2 + 2 passes and the
    # 1-byte mask twice: 9 x 2 + 2 = 20 B, i.e. 4 B moved per byte kept
    moved = memory.attention_score_traffic_bytes(m, seq_length=2048, micro_batch_size=1, tp=8)
    assert moved == 20 * 96 * 2048**2 / 8 == 4 * kept
    # without dropout only the softmax output is kept (2 B) and its kernels move 10 B per element
    nodrop = gpt_shape(dropout=False)
    assert memory.attention_score_bytes(nodrop, seq_length=2048, micro_batch_size=1) == 2 * 96 * 2048**2
    assert memory.attention_score_traffic_bytes(nodrop, seq_length=2048, micro_batch_size=1) == 10 * 96 * 2048**2
    # flash attention keeps no score matrix
    flash = gpt_shape(flash_attention=True)
    assert memory.attention_score_bytes(flash, seq_length=2048, micro_batch_size=1) == 0.0
    assert memory.attention_score_traffic_bytes(flash, seq_length=2048, micro_batch_size=1) == 0.0


def test_llama70b_layer_coefficient():
    # cost-models.md §2.6 [D]: Llama-3-70B, TP+SP, flash, fused SwiGLU: 33.5 s b h / t = 281,018,368 B at s=8192, t=8
    shape = gpt_shape(hidden_size=8192, num_attention_heads=64, num_kv_heads=8, ffn_hidden_size=28672, swiglu=True,
                      rms_norm=True, flash_attention=True, dropout=False, bias=False)
    got = memory.activation_bytes_per_layer(shape, seq_length=8192, micro_batch_size=1, tp=8, sequence_parallel=True,
                                            recompute="selective", fused_swiglu=True)
    assert got == 281_018_368
    # unfused SwiGLU: 40.5 (same section)
    got = memory.activation_bytes_per_layer(shape, seq_length=8192, micro_batch_size=1, tp=8, sequence_parallel=True,
                                            recompute="selective")
    assert got == pytest.approx(40.5 * 8192 * 8192 / 8)


# Korthikanti Fig. 1 as transcribed in calculon validation.py (cost-models.md §2.7), §9 #13-#15
@pytest.mark.parametrize(
    "b,h,a,L,t,p,v,sp_sel,expected_gib,tol",
    [
        (4, 6144, 64, 48, 8, 1, 1, True, 9.5625, 0),
        (4, 6144, 64, 48, 8, 1, 1, False, 59.25, 0),
        (1, 12288, 96, 96, 8, 8, 3, False, 66.84375, 1e-4),
        (1, 12288, 96, 96, 8, 8, 3, True, 12.3516, 1e-4),
        (1, 20480, 128, 105, 8, 35, 3, True, 23.0762, 1e-4),
        (1, 25600, 160, 128, 8, 64, 1, False, 131.25, 1e-4),
        (1, 25600, 160, 128, 8, 64, 1, True, 26.5625, 1e-4),
    ],
)
def test_first_stage_activations_fig1(b, h, a, L, t, p, v, sp_sel, expected_gib, tol):
    got = oracles.korthikanti_first_stage_activation_bytes(
        seq_length=2048, micro_batch_size=b, hidden_size=h, num_heads=a, num_layers=L, tp=t, pp=p, virtual_stages=v,
        sequence_parallel=sp_sel, selective=sp_sel)
    assert got / GIB == pytest.approx(expected_gib, abs=tol, rel=1e-12)
    # second derivation: per-layer bytes x layers per stage x micro-batches in flight on stage 0
    shape = gpt_shape(hidden_size=h, num_attention_heads=a, ffn_hidden_size=4 * h, num_layers=L)
    per_layer = memory.activation_bytes_per_layer(shape, seq_length=2048, micro_batch_size=b, tp=t,
                                                  sequence_parallel=sp_sel, recompute="selective" if sp_sel else "none")
    flight = memory.in_flight_micro_batches(schedule="interleaved_1f1b" if v > 1 else "1f1b", stage=0, pp=p,
                                            num_micro_batches=10_000, virtual_stages=v)
    assert per_layer * (L / p) * flight / GIB == pytest.approx(expected_gib, abs=tol, rel=1e-12)


def test_params_and_flops_narayanan():
    # §9 #16: Narayanan Eq. 2
    assert oracles.params_narayanan_eq2(num_layers=96, hidden_size=12288, vocab_size=51200, seq_length=2048) == pytest.approx(174.6158e9, rel=1e-4)
    # §9 #17, #18: Eq. 3 (96) and Eq. 7 (72)
    kw = dict(global_batch_size=1536, seq_length=2048, num_layers=96, hidden_size=12288, vocab_size=51200)
    assert compute.flops_narayanan_eq3(**kw) == pytest.approx(4.5110e18, rel=1e-4)
    assert compute.flops_korthikanti_eq7(**kw) == pytest.approx(3.3862e18, rel=1e-4)
    # second derivation: the per-GEMM count for a GPT shape (no biases counted in FLOPs) equals both closed forms
    shape = gpt_shape()
    assert compute.model_flops_per_step(shape, global_batch_size=1536, seq_length=2048) == pytest.approx(compute.flops_korthikanti_eq7(**kw), rel=1e-12)
    assert compute.hardware_flops_per_step(shape, global_batch_size=1536, seq_length=2048, recompute="full") == pytest.approx(compute.flops_narayanan_eq3(**kw), rel=1e-12)
    # Selective recompute: one more forward of the attention core, 4 B s^2 h per layer (Narayanan Appendix:
    # QK^T 2Bs^2h + PV 2Bs^2h). Korthikanti Eq. 8 (1 + s/(3h)) counts three times this extra; known difference.
    model = compute.model_flops_per_step(shape, global_batch_size=1536, seq_length=2048)
    sel = compute.hardware_flops_per_step(shape, global_batch_size=1536, seq_length=2048, recompute="selective")
    assert sel - model == pytest.approx(96 * 4 * 1536 * 2048**2 * 12288, rel=1e-12)
    eq8 = 72 * 1536 * 96 * 2048 * 12288**2 * (1 + 2048 / (3 * 12288) + 51200 / (12 * 12288 * 96))
    assert eq8 - model == pytest.approx(3 * (sel - model), rel=1e-12)


def test_mfu_and_days():
    # §9 #19: Narayanan Eq. 4, GPT-3 34 days
    assert oracles.train_days_eq4(tokens=300e9, num_params=175e9, num_gpus=1024, flops_per_second_per_gpu=140e12) == pytest.approx(33.91, abs=0.01)
    # §9 #20: Korthikanti Table 5, 175B at 13.75 s on 64 GPUs -> 51.4% MFU
    flops = compute.flops_korthikanti_eq7(global_batch_size=64, seq_length=2048, num_layers=96, hidden_size=12288, vocab_size=51200)
    assert oracles.mfu(model_flops=flops, step_seconds=13.75, num_gpus=64, peak_flops_per_second=312e12) == pytest.approx(0.514, abs=0.002)
    # §9 #21: PaLM Appendix B
    assert oracles.mfu_palm(tokens_per_second=238.3e3, num_params=540e9, num_gpus=6144, peak_flops_per_second=275e12) == pytest.approx(0.4570, abs=1e-3)


def test_comm_vectors():
    # §9 #22: Narayanan §3.2, 8 b s h (t-1)/t
    assert oracles.tp_elements_per_layer_narayanan(micro_batch_size=1, seq_length=2048, hidden_size=12288, tp=8) == 176_160_768
    # §9 #23: nccl-tests model, 1 GiB on 8 ranks at 230 GB/s busbw
    t = comm.all_reduce_seconds(message_bytes=2**30, group_size=8, link=Link(230e9, 0.0))
    assert t * 1e3 == pytest.approx(8.170, abs=0.01)
    # 8 x H100 ring at 370 GB/s: 5.08 ms (cost-models.md §4.1)
    assert comm.all_reduce_seconds(message_bytes=2**30, group_size=8, link=Link(370e9, 0.0)) * 1e3 == pytest.approx(5.08, abs=0.01)
    # ZeRO §7 example: 7.5e9 fp16 grads over 64 ranks at 180 GB/s -> 0.164 s
    assert comm.all_reduce_seconds(message_bytes=15e9, group_size=64, link=Link(180e9, 0.0)) == pytest.approx(0.164, abs=1e-3)


def test_bubble_vectors():
    assert oracles.bubble_1f1b_of_ideal(pp=8, num_micro_batches=64) == 0.109375  # §9 #24
    assert oracles.bubble_gpipe_of_total(pp=8, num_micro_batches=64) == pytest.approx(0.098592, abs=1e-6)
    assert oracles.bubble_interleaved_of_ideal(pp=8, num_micro_batches=64, virtual_stages=3) == pytest.approx(0.0364583, abs=1e-7)  # §9 #25
    assert oracles.bubble_gpipe_of_total(pp=16, num_micro_batches=128) == pytest.approx(0.104895, abs=1e-6)
    zb = oracles.zero_bubble_bubbles(pp=8, t_f=1, t_b=1, t_w=1)  # §9 #26
    assert (zb["1f1b"], zb["zb_h1"], zb["zb_h2"]) == (21, 7, 0)
    assert oracles.interleave_memory_factor(pp=8, virtual_stages=3) == pytest.approx(1.291667, abs=1e-6)  # §9 #28


def test_vocab_padding():
    # §9 #27 and §7.1: Megatron pads to a multiple of 128 x t
    assert memory.vocab_padded(128256, tp=8) == 129024
    assert memory.vocab_padded(50257, tp=8) == 51200
    assert memory.vocab_padded(51200, tp=8) == 51200


def test_korthikanti_fig1_params_convention():
    # Korthikanti Fig. 1 "parameters and optimizer state" = 18 B x 12 L h^2 / (t p) (calculon validation.py)
    for L, h, t, p, gib in [(48, 6144, 8, 1, 45.5625), (96, 12288, 8, 8, 45.5625), (105, 20480, 8, 35, 31.6406),
                            (128, 25600, 8, 64, 32.9590)]:
        assert oracles.zero_model_state_bytes(num_params=12 * L * h * h / (t * p), dp=1, zero_stage=0,
                                             grad_bytes=4) / GIB == pytest.approx(gib, abs=1e-4)
    assert math.isclose(oracles.zero_model_state_bytes(num_params=1, dp=1, zero_stage=0), 16)
