"""NCCL communicators' device memory (cost_models/nccl.py): which groups a framework's step builds communicators for
(planner/frameworks/profiles.py nccl_groups), and what they add to a stage's memory outside the allocator."""

from dataclasses import replace

import pytest

from cost_models.inputs import Hardware, Knobs, Layout, Link, Recompute, Training
from cost_models.nccl import (
    COMMUNICATOR_BYTES,
    PAIR_COMMUNICATOR_BYTES,
    communicator_bytes,
    communicator_group_sizes,
)
from cost_models.stage import stage_model
from cost_models.step import estimate_step
from planner.frameworks.profiles import profile_for, profile_knobs
from tests.conftest import gpt_shape

MIB = 2**20
MDS = profile_for("megatron-deepspeed").allocator.nccl.groups


def test_bytes_per_communicator_are_the_a100_measurement():
    # NVIDIA/nccl #964, 4 x A100 with NVLink, a 4 MB all-reduce on every group: 544 MB for a 2-rank group, 688 MB
    # for a larger one (nvidia-smi: MiB)
    assert (PAIR_COMMUNICATOR_BYTES, COMMUNICATOR_BYTES) == (544 * MIB, 688 * MIB)
    assert communicator_bytes((8, 2, 1, 80)) == 2 * 688 * MIB + 544 * MIB  # a 1-rank group has none


def test_megatron_deepspeed_groups_of_bigscience_layouts():
    # DeepSpeed's pipe engine (2022): default group, Megatron's TP, DP, the model-parallel TP x PP group (overflow
    # and grad-norm all-reduce), the PP group (loss broadcast), a send/recv pair per neighbouring stage, the
    # first/last stage's tied-embedding pair
    assert MDS == ("world", "tp", "dp", "model", "pipe", "p2p", "tied")
    # 20B on one node, tp 8: the default group, TP and TP x PP are three communicators of the same 8 ranks
    assert communicator_group_sizes(MDS, tp=8, dp=1, pp=1, stage=0, tied_embeddings=True) == (8, 8, 8)
    # 200B, tp 8 x pp 10 x dp 2 on 160 GPUs
    first = communicator_group_sizes(MDS, tp=8, dp=2, pp=10, stage=0, tied_embeddings=True)
    middle = communicator_group_sizes(MDS, tp=8, dp=2, pp=10, stage=4, tied_embeddings=True)
    last = communicator_group_sizes(MDS, tp=8, dp=2, pp=10, stage=9, tied_embeddings=True)
    assert first == (160, 8, 2, 80, 10, 2, 2) and last == first
    assert middle == (160, 8, 2, 80, 10, 2, 2)  # two neighbours, no tied embedding
    assert communicator_bytes(first) == 4 * 688 * MIB + 3 * 544 * MIB
    # untied embeddings: no tied pair on the first and last stage
    assert communicator_group_sizes(MDS, tp=8, dp=2, pp=10, stage=0, tied_embeddings=False) == (160, 8, 2, 80, 10, 2)


def test_a_single_gpu_has_no_communicator():
    for name in ("megatron", "torchtitan", "deepspeed", "megatron-deepspeed", None):
        groups = profile_knobs(name).nccl_groups
        assert groups, name
        assert communicator_group_sizes(groups, tp=1, dp=1, pp=1, stage=0, tied_embeddings=True) == ()


def _a100(nodes: int = 8):
    nv = Link(230e9, 5e-6)
    return Hardware("A100", 80 * 2**30, 312e12, 0.869, 1.8e12, nodes, 8, nv, "nvlink", Link(22.5e9, 10e-6), 8,
                    Link(25e9, 1e-5), 2e12)


def test_stage_memory_outside_the_allocator_adds_the_communicators():
    # untied embeddings: an end stage holds one send/recv pair, an inner stage two (tied, the ends' embedding pair
    # would even them out)
    model = gpt_shape(num_layers=40, hidden_size=6144, num_attention_heads=48, ffn_hidden_size=4 * 6144,
                      tied_embeddings=False)
    training = Training(global_batch_size=64, seq_length=2048, activation_bytes=2, param_bytes=2, grad_bytes=2,
                        optimizer_bytes=12, grad_reduce_bytes=2)
    layout = Layout(dp=4, tp=8, pp=4, zero_stage=1, micro_batch_size=1, num_micro_batches=32,
                    recompute=Recompute.FULL)
    knobs = profile_knobs("megatron-deepspeed", Knobs(), gpu_generation="ampere")
    none = replace(knobs, nccl_groups=())
    sm, sm0 = stage_model(model, training, _a100(16), layout, knobs), stage_model(model, training, _a100(16), layout, none)
    context = knobs.per_process_overhead_bytes
    assert sm0.overheads == (context,) * 4
    ends, inner = 5 * 688 * MIB + 544 * MIB, 5 * 688 * MIB + 2 * 544 * MIB  # (128, 8, 4, 32, 4) + pairs
    assert sm.overheads == (context + ends, context + inner, context + inner, context + ends)
    for m, m0 in zip(sm.memories(), sm0.memories(), strict=True):
        assert m.overhead_bytes - m0.overhead_bytes == pytest.approx(ends if m.stage in (0, 3) else inner)
        assert m.reserved_bytes == pytest.approx(m0.reserved_bytes)  # the allocator's pool does not see them
    est, est0 = estimate_step(model, training, _a100(16), layout, knobs), estimate_step(model, training, _a100(16), layout, none)
    assert est.peak_memory_bytes - est0.peak_memory_bytes == pytest.approx(ends)
    assert est.step_seconds == est0.step_seconds  # memory only
    # the linear stage rows the ILP and the split refinement use carry the same bytes
    for i in range(4):
        assert sm.linear(i).fixed_bytes - sm0.linear(i).fixed_bytes == pytest.approx(sm.overheads[i] - context)


def test_profiles_state_their_groups():
    for name in ("megatron", "nemo", "torchtitan", "deepspeed", "megatron-deepspeed", "generic"):
        stated = {k: (s, src) for k, s, src in profile_for(name).assumptions()}
        assert "nccl_groups" in stated, name
        statement, source = stated["nccl_groups"]
        assert "688 MiB" in statement and "#964" in source
