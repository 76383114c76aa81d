"""Tests written against the survivors of `make mutate` (docs/mutation.md): each checks a value that a one-token
change in the cost models or the planning code would move, against a source or an independent derivation."""

import itertools
import random

import pytest

from planner.explain.decision import (
    HIGH_BANDWIDTH_BYTES_PER_SECOND_PER_GPU,
    LONG_CONTEXT_TOKENS,
    ROWS,
    classify,
    matches_row,
    network_bytes_per_second_per_gpu,
)
from planner.refine.split import best_split_dp, best_split_uniform

# ---- exact splits against brute force ---------------------------------------------------------------------


def _brute_split(layer_seconds, extras, caps=None):
    """Every contiguous split (each stage >= 1 layer, within its cap): (min makespan, the set of optimal splits)."""
    L, p = len(layer_seconds), len(extras)
    caps = caps or [L] * p
    best, arg = None, set()
    for cuts in itertools.combinations(range(1, L), p - 1):
        bounds = (0, *cuts, L)
        counts = tuple(bounds[k + 1] - bounds[k] for k in range(p))
        if any(n > cap for n, cap in zip(counts, caps, strict=True)):
            continue
        t = max(sum(layer_seconds[bounds[k]:bounds[k + 1]]) + extras[k] for k in range(p))
        if best is None or t < best - 1e-12:
            best, arg = t, {counts}
        elif abs(t - best) <= 1e-12:
            arg.add(counts)
    return best, arg


def _instances(n=40, uniform=False):
    rng = random.Random(7)
    for _ in range(n):
        p = rng.randint(1, 5)
        L = rng.randint(p, 11)
        c = rng.choice([0.5, 1.0, 1.5, 2.0])
        layers = [c] * L if uniform else [rng.choice([0.5, 1.0, 2.0, 3.0]) for _ in range(L)]
        extras = [rng.choice([0.0, 0.0, 0.75, 2.5, 4.0]) for _ in range(p)]
        caps = [rng.randint(1, L) for _ in range(p)] if rng.random() < 0.5 else None
        yield layers, extras, caps


SPLITTERS = [
    ("dp", False, best_split_dp),
    ("uniform", True, lambda layers, extras, caps: best_split_uniform(len(layers), layers[0], extras, caps)),
]


@pytest.mark.parametrize("name,uniform,split", SPLITTERS, ids=[n for n, _, _ in SPLITTERS])
def test_split_counts_realise_the_brute_force_optimum(name, uniform, split):
    """The splitter's layer counts, not only its makespan: they are one of the optimal contiguous splits found by
    enumerating every split (40 seeded instances of up to 11 layers on up to 5 stages, uneven layers unless
    uniform, caps)."""
    seen = 0
    for layers, extras, caps in _instances(uniform=uniform):
        want, optimal = _brute_split(layers, extras, caps)
        got = split(layers, extras, caps)
        if want is None:
            assert got is None
            continue
        seen += 1
        assert got is not None and got[0] == pytest.approx(want, abs=1e-12)
        assert tuple(got[1]) in optimal, (layers, extras, caps, got)
    assert seen >= 25


def test_split_edge_cases():
    # fewer layers than stages, a cap below one layer, caps that cannot hold the model: no split
    assert best_split_uniform(3, 1.0, [0.0] * 4) is None and best_split_dp([1.0] * 3, [0.0] * 4) is None
    assert best_split_uniform(8, 1.0, [0.0, 0.0], [0, 8]) is None
    assert best_split_uniform(8, 1.0, [0.0, 0.0], [3, 4]) is None and best_split_dp([1.0] * 8, [0.0] * 2, [3, 4]) is None
    # exactly enough room: 3 + 5 = 8
    assert best_split_uniform(8, 1.0, [0.0, 0.0], [3, 5]) == (5.0, [3, 5])
    assert best_split_dp([1.0] * 8, [0.0, 0.0], [3, 5]) == (5.0, [3, 5])
    # free layers (c = 0): any split meeting the caps, the makespan is the largest extra
    t, counts = best_split_uniform(6, 0.0, [1.0, 2.0, 0.5], [2, 2, 2])
    assert t == 2.0 and counts == [2, 2, 2]
    # stages faster than one second (the DP starts from an empty prefix costing 0 s, not 1 s)
    assert best_split_dp([0.25, 0.25], [0.0, 0.0]) == (0.25, [1, 1])
    assert best_split_uniform(2, 0.25, [0.0, 0.0]) == (0.25, [1, 1])
    # one stage holds everything
    assert best_split_uniform(5, 2.0, [1.0]) == (11.0, [5]) and best_split_dp([2.0] * 5, [1.0]) == (11.0, [5])
    # an expensive first stage gets the fewest layers: 10 layers, extra 3 on stage 0. T = 4 holds 1 + 4 + 4 = 9
    # < 10 layers; T = 5 holds 2 + 5 + 5 = 12, and the surplus of 2 leaves the most loaded stages first: (2, 4, 4)
    assert best_split_uniform(10, 1.0, [3.0, 0.0, 0.0]) == (5.0, [2, 4, 4])
    assert best_split_dp([1.0] * 10, [3.0, 0.0, 0.0])[0] == 5.0


# ---- the decision table ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, row", [
    (dict(num_gpus=1, num_nodes=1, fits_one_card=True, network_per_gpu=0.0), 1),
    (dict(num_gpus=1, num_nodes=1, fits_one_card=False, network_per_gpu=0.0), 2),
    # one GPU wins over long context and MoE: nothing to parallelise
    (dict(num_gpus=1, num_nodes=1, fits_one_card=True, network_per_gpu=0.0, seq_length=131072, moe=True), 1),
    (dict(num_gpus=8, num_nodes=1, fits_one_card=True, network_per_gpu=0.0), 3),
    (dict(num_gpus=8, num_nodes=1, fits_one_card=False, network_per_gpu=0.0), 4),
    (dict(num_gpus=2, num_nodes=1, fits_one_card=False, network_per_gpu=0.0), 4),
    (dict(num_gpus=16, num_nodes=2, fits_one_card=True, network_per_gpu=45e9), 5),
    (dict(num_gpus=16, num_nodes=2, fits_one_card=True, network_per_gpu=0.125e9), 6),
    # 32k tokens is long context (the issue's "32k-1M"); one token less is not
    (dict(num_gpus=8, num_nodes=1, fits_one_card=True, network_per_gpu=0.0, seq_length=32768), 7),
    (dict(num_gpus=8, num_nodes=1, fits_one_card=True, network_per_gpu=0.0, seq_length=32767), 3),
    # long context is asked before MoE; MoE before the node count
    (dict(num_gpus=16, num_nodes=2, fits_one_card=False, network_per_gpu=45e9, seq_length=65536, moe=True), 7),
    (dict(num_gpus=16, num_nodes=2, fits_one_card=False, network_per_gpu=45e9, moe=True), 8),
    (dict(num_gpus=8, num_nodes=1, fits_one_card=True, network_per_gpu=0.0, moe=True), 8),
])
def test_classify_rows(kw, row):
    """seed-notes #11's table, in the order the module documents (one GPU, long context, MoE, nodes, network)."""
    assert classify(**kw) == row
    assert LONG_CONTEXT_TOKENS == 32768 and HIGH_BANDWIDTH_BYTES_PER_SECOND_PER_GPU == 5e9
    assert set(ROWS) == set(range(1, 9))


def test_network_per_gpu_of_the_presets():
    """NICs x line rate x efficiency / GPUs per node, from the preset files: DGX H100 8 x 400 Gb/s x 0.9 / 8 =
    45 GB/s; DGX A100 8 x 200 Gb/s x 0.9 / 8 = 22.5 GB/s; one 10 GbE NIC x 0.8 / 8 L40S = 0.125 GB/s; no NIC: 0."""
    from cluster_specs import load_cluster

    def per_gpu(name, nodes):
        return network_bytes_per_second_per_gpu(load_cluster(name, nodes=nodes).to_cost_model("bf16"))

    assert per_gpu("dgx-h100", 2) == pytest.approx(45e9, rel=1e-12)
    assert per_gpu("dgx-a100-80gb", 2) == pytest.approx(22.5e9, rel=1e-12)
    assert per_gpu("pcie-l40s-10gbe", 2) == pytest.approx(0.125e9, rel=1e-12)
    assert per_gpu("single-rtx4090", None) == 0.0


class _L:
    def __init__(self, tp=1, pp=1, dp=1, zero_stage=0, offload="none", **kw):
        self.tp, self.pp, self.dp, self.zero_stage, self.offload = tp, pp, dp, zero_stage, offload
        self.__dict__.update(kw)


@pytest.mark.parametrize("row, layout, agrees", [
    (1, _L(), True), (1, _L(dp=2), False), (1, _L(tp=2), False), (1, _L(pp=2), False),
    (1, _L(offload="optimizer"), False),
    (2, _L(offload="optimizer"), True), (2, _L(), False),
    (3, _L(dp=8, zero_stage=2), True), (3, _L(dp=8, zero_stage=3), False), (3, _L(tp=2, dp=4), False),
    (3, _L(pp=2, dp=4), False), (3, _L(dp=8, offload="optimizer"), False),
    (4, _L(tp=2, dp=4), True), (4, _L(dp=8, zero_stage=3), True), (4, _L(dp=8, zero_stage=2), False),
    (5, _L(dp=16, zero_stage=1), True), (5, _L(tp=2, dp=8), True), (5, _L(pp=2, dp=8), True), (5, _L(dp=16), False),
    (6, _L(tp=8, pp=2, dp=1), True), (6, _L(tp=8, dp=2, zero_stage=1), True), (6, _L(tp=16, pp=2, zero_stage=1), False),
    (6, _L(tp=2, dp=8), False),
    (7, _L(cp=2, dp=4), True), (7, _L(dp=8), False),
    (8, _L(ep=8, dp=8), True), (8, _L(ep=2, dp=8), True), (8, _L(ep=4, etp=2, dp=8), True), (8, _L(ep=8, etp=2, dp=8), False),
    (8, _L(dp=8), False),
])
def test_matches_row(row, layout, agrees):
    """Each row's recommendation as a layout test, on both sides of every condition (8 GPUs per node)."""
    assert matches_row(row, layout, 8) is agrees


# ---- FP8 (cost_models/fp8.py; modern-training.md §1) -------------------------------------------------------


def test_fp8_linear_shapes_of_llama3_8b():
    """(K, N) of QKV, attention output, FC1, FC2 for Llama 3 8B (h 4096, 32 heads x 128, 8 KV heads x 128, SwiGLU
    FFN 14336): QKV 4096 x (4096 + 2 x 1024); FC1 is gated, so it holds two FFN-wide matrices."""
    from cost_models.fp8 import linear_shapes

    assert linear_shapes(hidden_size=4096, q_width=4096, kv_width=1024, ffn=14336, gated=True) == [
        (4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]
    assert linear_shapes(hidden_size=12288, q_width=12288, kv_width=12288, ffn=49152, gated=False)[2] == (12288, 49152)


def test_fp8_quantization_bytes_by_hand():
    """Forward casts each Linear input (T x K) at the recipe's bytes per element; backward casts grad_out (T x N)
    and writes a 1-byte transposed input (T x K). Tensorwise 9.8 B, delayed 4.7 B (calibrated on TE's H200 autocast
    speedups, fp8.py)."""
    from cost_models.fp8 import quantization_seconds

    shapes = [(4, 6), (2, 3)]
    fwd, bwd = quantization_seconds(tokens=10, shapes=shapes, recipe="tensorwise", hbm_bytes_per_second=100.0)
    assert fwd == pytest.approx(10 * (4 + 2) * 9.8 / 100.0, rel=1e-12)  # 5.88 s
    assert bwd == pytest.approx(10 * ((6 * 9.8 + 4) + (3 * 9.8 + 2)) / 100.0, rel=1e-12)  # 9.42 s
    fwd, bwd = quantization_seconds(tokens=10, shapes=shapes, recipe="delayed", hbm_bytes_per_second=100.0)
    assert (fwd, bwd) == (pytest.approx(2.82, rel=1e-12), pytest.approx(10 * ((6 * 4.7 + 4) + (3 * 4.7 + 2)) / 100.0))


def test_fp8_weight_copies_and_scaling_state():
    """TE: +2 B/param (FP8 + transposed FP8); with --fp8-param-gather the BF16 copy goes: 0; MXFP8 keeps
    2 x (1 + 1/32) B whatever the gather; delayed scaling keeps 20 B x history per GEMM, other recipes none."""
    from cost_models.fp8 import fp8_weight_extra_bytes, scaling_state_bytes

    assert fp8_weight_extra_bytes(fp8_params=1e9, recipe="tensorwise") == 2e9
    assert fp8_weight_extra_bytes(fp8_params=1e9, recipe="tensorwise", fp8_param_gather=True) == 0.0
    assert fp8_weight_extra_bytes(fp8_params=1e9, recipe="rowwise") == 0.0  # torchao casts on the fly
    assert fp8_weight_extra_bytes(fp8_params=32e6, recipe="mxfp8", fp8_param_gather=True) == pytest.approx(66e6)
    assert fp8_weight_extra_bytes(fp8_params=32e6, recipe="mxfp8") == pytest.approx(66e6)
    assert scaling_state_bytes(num_gemms=12, recipe="delayed", amax_history=1024) == 20 * 1024 * 12
    assert scaling_state_bytes(num_gemms=12, recipe="delayed") == 240.0
    assert scaling_state_bytes(num_gemms=12, recipe="tensorwise", amax_history=1024) == 0.0


def test_fp8_speedup_uses_each_recipes_fit():
    """speedup = 2 x e_fp8(x) x kernel_factor / e_bf16(x), x in GFLOP, with e(x) = e_max x / (x + x_half):
    rowwise its own fit (0.637, 13.0), tensorwise (0.666, 15.3), BF16 (0.728, 4.67); at 2 x 8192³ FLOP
    (cost_models/fp8.py's fits to modern-training.md §1.5.2, TE gemm_profiling.rst for the kernel factors)."""
    from cost_models.fp8 import fp8_gemm_speedup

    x = 2 * 8192**3 / 1e9

    def e(fit):
        return fit[0] * x / (x + fit[1])

    assert fp8_gemm_speedup(gemm_flops=x * 1e9, recipe="tensorwise") == pytest.approx(
        2 * e((0.666, 15.3)) / e((0.728, 4.67)), rel=1e-12)
    assert fp8_gemm_speedup(gemm_flops=x * 1e9, recipe="rowwise") == pytest.approx(
        2 * e((0.637, 13.0)) / e((0.728, 4.67)), rel=1e-12)
    # delayed runs tensorwise's per-tensor kernel (kernel factor 1); blockwise TE's 1.40 against current's 1.58
    assert fp8_gemm_speedup(gemm_flops=x * 1e9, recipe="delayed") == pytest.approx(
        2 * e((0.666, 15.3)) / e((0.728, 4.67)), rel=1e-12)
    assert fp8_gemm_speedup(gemm_flops=x * 1e9, recipe="blockwise") == pytest.approx(
        2 * e((0.666, 15.3)) * 1.40 / 1.58 / e((0.728, 4.67)), rel=1e-12)
    # a tiny GEMM gains nothing (never below 1x)
    assert fp8_gemm_speedup(gemm_flops=2 * 64**3, recipe="tensorwise") == 1.0


# ---- collectives, placement and data-parallel traffic (alpha-beta by hand) --------------------------------

from cost_models import communication as comm  # noqa: E402
from cost_models import data_parallel as dpm  # noqa: E402
from cost_models.inputs import Hardware, Link  # noqa: E402

LINK = Link(100.0, 1.0)  # 100 B/s and 1 s per step: every term of a formula shows in the result


def _hw(*, gpus_per_node=8, nics=4, intra=Link(400.0, 0.5), nic=Link(50.0, 2.0), nodes=4):
    return Hardware("test", 80.0, 1e15, 0.8, 2e12, nodes, gpus_per_node, intra, "nvlink", nic, nics,
                    Link(25.0, 0.1), 1e12)


def test_collectives_by_hand():
    """nccl-tests ring model: all-reduce 2(n-1) steps and 2(n-1)/n of S; all-gather/reduce-scatter/all-to-all
    (n-1) steps and (n-1)/n of S; one rank or no bytes cost nothing; p2p is one latency plus S / bandwidth."""
    assert comm.all_reduce_seconds(message_bytes=400.0, group_size=4, link=LINK) == 6 * 1.0 + 6 / 4 * 400 / 100
    assert comm.all_gather_seconds(message_bytes=400.0, group_size=4, link=LINK) == 3 * 1.0 + 3 / 4 * 400 / 100
    assert comm.reduce_scatter_seconds(message_bytes=400.0, group_size=4, link=LINK) == 6.0
    assert comm.all_to_all_seconds(message_bytes=400.0, group_size=4, link=LINK) == 6.0
    for f in (comm.all_reduce_seconds, comm.all_gather_seconds):
        assert f(message_bytes=400.0, group_size=1, link=LINK) == 0.0
        assert f(message_bytes=0.0, group_size=4, link=LINK) == 0.0
        assert f(message_bytes=1.0, group_size=2, link=LINK) > 0.0
    assert comm.p2p_seconds(message_bytes=300.0, link=LINK) == 4.0
    assert comm.p2p_seconds(message_bytes=0.0, link=LINK) == 0.0
    assert comm.p2p_seconds(message_bytes=1e-9, link=LINK) > 1.0


def test_group_link_inside_and_across_nodes():
    """cost-models.md §4.6: inside a node the intra link; across nodes q ranks per node share the node's NICs
    with the g/q other groups: min(intra, nics x nic_bw x q / g), latency the larger of the two."""
    hw = _hw()
    one = comm.group_link(hw, group_size=1, stride=1)
    assert (one.group_size, one.ranks_per_node, one.nodes_spanned, one.link) == (1, 1, 1, hw.intra_node)
    inside = comm.group_link(hw, group_size=8, stride=1)
    assert (inside.ranks_per_node, inside.nodes_spanned, inside.crosses_nodes, inside.link) == (8, 1, False, hw.intra_node)
    # 16 ranks, stride 1: 8 per node on 2 nodes; 4 NICs x 50 x 8 / 8 = 200 < 400
    wide = comm.group_link(hw, group_size=16, stride=1)
    assert (wide.ranks_per_node, wide.nodes_spanned, wide.crosses_nodes) == (8, 2, True)
    assert wide.link == Link(200.0, 2.0)
    # stride 2 (TP 2 inside): 4 ranks per node; 4 x 50 x 4 / 8 = 100
    strided = comm.group_link(hw, group_size=8, stride=2)
    assert (strided.ranks_per_node, strided.nodes_spanned, strided.link) == (4, 2, Link(100.0, 2.0))
    # stride 8 (a whole node of TP): one rank per node, no intra hop: 4 x 50 / 8 = 25
    sparse = comm.group_link(hw, group_size=4, stride=8)
    assert (sparse.ranks_per_node, sparse.nodes_spanned, sparse.link) == (1, 4, Link(25.0, 2.0))
    # 3 ranks of stride 3 on 8-GPU nodes: 9 > 8 spans nodes, 2 per node -> ceil(3/2) = 2 nodes; 4 x 50 x 2 / 8 = 50
    odd = comm.group_link(hw, group_size=3, stride=3)
    assert (odd.ranks_per_node, odd.nodes_spanned, odd.link) == (2, 2, Link(50.0, 2.0))
    # a fast network bounded by the intra link: 4 NICs x 2000 x 8 / 8 = 8000 -> 400
    fast = comm.group_link(_hw(nic=Link(2000.0, 0.1)), group_size=16, stride=1)
    assert fast.link == Link(400.0, 0.5)
    with pytest.raises(ValueError, match="no inter-node network"):
        comm.group_link(_hw(nic=None), group_size=16, stride=1)


def test_pp_neighbour_without_network_or_intra_link():
    assert comm.pp_neighbour_link(_hw(), tp=2, dp=2) == (Link(400.0, 0.5), False)
    assert comm.pp_neighbour_link(_hw(), tp=8, dp=1) == (Link(4 * 50.0 / 8, 2.0), True)
    assert comm.pp_neighbour_link(_hw(nic=None), tp=8, dp=1) == (Link(400.0, 0.5), False)
    assert comm.pp_neighbour_link(_hw(nic=None, intra=None, gpus_per_node=1), tp=1, dp=1) == (
        Link(float("inf"), 0.0), False)


def test_tp_bytes_per_layer():
    """Narayanan §3.2: 4 all-reduces of b s h elements per layer and micro-batch (2 forward, 2 backward), 6 with
    full recompute (the forward runs twice); none at tp = 1."""
    assert comm.tp_bytes_per_layer_per_micro_batch(micro_batch_size=2, seq_length=8, hidden_size=16, tp=2) == (512.0, 4)
    assert comm.tp_bytes_per_layer_per_micro_batch(micro_batch_size=2, seq_length=8, hidden_size=16, tp=2,
                                                   activation_bytes=4, recompute="full") == (1024.0, 6)
    assert comm.tp_bytes_per_layer_per_micro_batch(micro_batch_size=2, seq_length=8, hidden_size=16, tp=1) == (0.0, 0)


@pytest.mark.parametrize("zero, want", [
    # P = 100 params, 2 B grads and params, dp 4, 3 micro-batches, 5 layers x 2 modules, LINK (100 B/s, 1 s/step)
    (0, 6 + 1.5 * 200 / 100),  # one all-reduce of 200 B
    (1, (3 + 0.75 * 2) + (3 + 0.75 * 2)),  # reduce-scatter + all-gather of 200 B
    (2, 3 * (3 + 0.75 * 2) + (3 + 0.75 * 2)),  # the reduce-scatter after each of the 3 micro-batches
    # 3 micro-batches x 10 units x (2 all-gathers + 1 reduce-scatter of 20 B)
    (3, 3 * 10 * 3 * (3 + 0.75 * 20 / 100)),
])
def test_zero_comm_by_stage(zero, want):
    got = dpm.zero_comm_seconds(zero_stage=zero, params=100.0, grad_reduce_bytes=2.0, param_bytes=2.0, dp=4, layers=5,
                                num_micro_batches=3, link=LINK, modules_per_layer=2)
    assert got == pytest.approx(want, rel=1e-12)


def test_zero_comm_distinguishes_gradient_and_parameter_bytes():
    # fp32 gradient reduction (4 B) against bf16 parameters (2 B): ZeRO-1 = RS(400 B) + AG(200 B)
    got = dpm.zero_comm_seconds(zero_stage=1, params=100.0, grad_reduce_bytes=4.0, param_bytes=2.0, dp=4, layers=5,
                                num_micro_batches=3, link=LINK)
    assert got == pytest.approx((3 + 0.75 * 4) + (3 + 0.75 * 2), rel=1e-12)
    # ZeRO-3 with no layers on the stage still gathers one unit
    got = dpm.zero_comm_seconds(zero_stage=3, params=100.0, grad_reduce_bytes=4.0, param_bytes=2.0, dp=4, layers=0,
                                num_micro_batches=1, link=LINK)
    assert got == pytest.approx(2 * (3 + 0.75 * 2) + (3 + 0.75 * 4), rel=1e-12)


def test_overlap_window_by_stage():
    kw = dict(forward_seconds=2.0, backward_seconds=3.0, num_micro_batches=4)
    assert [dpm.overlap_window_seconds(zero_stage=z, **kw) for z in (0, 1, 2, 3)] == [3.0, 3.0, 12.0, 20.0]


def test_embedding_sync_is_a_two_rank_all_reduce_over_the_pipeline_link():
    hw = _hw()
    # tp x dp = 8: the last stage is a node away: link 4 x 50 / 8 = 25 B/s, 2 s latency; 2 ranks: 2 steps, 1 x S
    assert dpm.embedding_sync_seconds(hw, tp=4, dp=2, embedding_grad_bytes=50.0) == pytest.approx(2 * 2.0 + 50 / 25)
    assert dpm.embedding_sync_seconds(hw, tp=2, dp=2, embedding_grad_bytes=400.0) == pytest.approx(2 * 0.5 + 1.0)


# ---- activation memory beyond Korthikanti's GPT table (cost_models/memory.py) ------------------------------

from cost_models import memory  # noqa: E402
from tests.conftest import gpt_shape  # noqa: E402

S, B, H, A = 2048, 2, 1024, 16  # a small GPT layer: sbh = 4,194,304; a s^2 b = 134,217,728


def _act(model, **kw):
    return memory.activation_bytes_per_layer(model, seq_length=S, micro_batch_size=B, **kw)


def test_gpt_layer_in_fp32_doubles_tensors_but_not_masks():
    """Korthikanti's 34 s b h + 5 a s^2 b counts 2-byte tensors and 1-byte masks. In fp32 (4-byte) the tensors
    double and the two masks stay: 34 -> 2 x 32 + 2 = 66; 5 -> 2 x 4 + 1 = 9 (softmax out, dropout out, mask)."""
    gpt = gpt_shape(num_layers=2, hidden_size=H, num_attention_heads=A, num_kv_heads=A, ffn_hidden_size=4 * H)
    sbh, as2b = S * B * H, A * S * S * B
    assert _act(gpt) == 34 * sbh + 5 * as2b
    assert _act(gpt, activation_bytes=4) == 66 * sbh + 9 * as2b
    assert _act(gpt, recompute="full", activation_bytes=4) == 4 * sbh
    assert _act(gpt, recompute="full", tp=4, sequence_parallel=True) == 2 * sbh / 4
    assert _act(gpt, recompute="full", tp=4) == 2 * sbh  # the layer input is replicated without SP
    assert _act(gpt, tp=4, recompute="selective") == sbh * (10 + 24 / 4)


def test_llama_layer_gqa_swiglu_flash_no_dropout():
    """cost-models.md §2.6 components for a Llama layer (no dropout, flash attention, SwiGLU, GQA g/a = 1/4):
    replicated 8 (two norm inputs, QKV and FC1 inputs), attention 2 + 4 g/a + 2 = 5, SwiGLU 8 f/h (6 fused), and
    fp32 log-sum-exp 4 a s b; selective drops the last; full keeps the 2-byte input."""
    f = 2816
    llama = gpt_shape(num_layers=2, hidden_size=H, num_attention_heads=A, num_kv_heads=4, ffn_hidden_size=f,
                      swiglu=True, dropout=False, flash_attention=True, rms_norm=True, bias=False)
    sbh = S * B * H
    per_layer = sbh * (8 + 5) + S * B * 8 * f
    assert _act(llama) == pytest.approx(per_layer + 4 * A * S * B, rel=1e-12)
    assert _act(llama, recompute="selective") == pytest.approx(per_layer, rel=1e-12)
    assert _act(llama, recompute="selective", fused_swiglu=True) == pytest.approx(sbh * 13 + S * B * 6 * f, rel=1e-12)
    # TP 2 with SP: everything sharded by 2, the statistics too
    assert _act(llama, tp=2, sequence_parallel=True) == pytest.approx((per_layer + 4 * A * S * B) / 2, rel=1e-12)
    # TP 2 without SP: the replicated 8 s b h stays whole
    assert _act(llama, tp=2, recompute="selective") == pytest.approx(
        sbh * 8 + (sbh * 5 + S * B * 8 * f) / 2, rel=1e-12)
    # without flash attention, K and V are expanded to all heads before Q K^T: 2 + 4 + 2 = 8, and softmax 2 a s^2 b
    eager = gpt_shape(num_layers=2, hidden_size=H, num_attention_heads=A, num_kv_heads=4, ffn_hidden_size=f,
                      swiglu=True, dropout=False, flash_attention=False, rms_norm=True, bias=False)
    assert _act(eager) == pytest.approx(sbh * (8 + 8) + S * B * 8 * f + 2 * A * S * S * B, rel=1e-12)


def test_embedding_and_output_activations():
    """First stage: int64 token ids 8 s b plus, with dropout, the s b h mask (/t under SP). Last stage: the final
    norm input (2 s b h, /t under SP), the output projection's input (2 s b h) and fp32 logits 4 s b V / t."""
    kw = dict(seq_length=S, micro_batch_size=B, hidden_size=H)
    assert memory.embedding_activation_bytes(tp=4, sequence_parallel=False, dropout=True, **kw) == 8 * S * B + S * B * H
    assert memory.embedding_activation_bytes(tp=4, sequence_parallel=True, dropout=True, **kw) == 8 * S * B + S * B * H / 4
    assert memory.embedding_activation_bytes(tp=4, sequence_parallel=True, dropout=False, **kw) == 8 * S * B
    out = memory.output_activation_bytes(vocab_size=32000, tp=4, sequence_parallel=True, **kw)
    assert out == 2 * S * B * H / 4 + 2 * S * B * H + 4 * S * B * 32000 / 4
    out = memory.output_activation_bytes(vocab_size=32000, tp=4, sequence_parallel=False, activation_bytes=4, **kw)
    assert out == 4 * S * B * H * 2 + 4 * S * B * 32000 / 4


@pytest.mark.parametrize("schedule, stage, v, m, want", [
    ("gpipe", 0, 1, 16, 16.0), ("naive", 3, 1, 16, 16.0),
    ("1f1b", 0, 1, 16, 4.0), ("1f1b", 3, 1, 16, 1.0), ("1f1b", 0, 1, 2, 2.0), ("zero_bubble", 1, 1, 16, 3.0),
    # Megatron's warm-up: (p - stage - 1) x 2 + (v - 1) x p + 1 chunk passes of 1/v stage each (p = 4)
    ("interleaved_1f1b", 0, 2, 16, (3 * 2 + 4 + 1) / 2), ("interleaved_1f1b", 3, 2, 16, (0 + 4 + 1) / 2),
    ("interleaved_1f1b", 0, 3, 16, (6 + 8 + 1) / 3),
    ("interleaved_1f1b", 0, 2, 2, 2.0),  # capped at all m x v chunks
    ("interleaved_1f1b", 1, 1, 16, 3.0),  # v = 1 is plain 1F1B
])
def test_in_flight_micro_batches(schedule, stage, v, m, want):
    assert memory.in_flight_micro_batches(schedule=schedule, stage=stage, pp=4, num_micro_batches=m,
                                          virtual_stages=v) == want


def test_vocab_padding_other_multiples():
    assert memory.vocab_padded(32000, tp=1) == 32000 and memory.vocab_padded(32001, tp=1) == 32128
    assert memory.vocab_padded(50257, tp=2, divisible_by=64) == 50304  # GPT-2's padded 50,304 (nanoGPT)


# ---- the ILP against enumeration (planner/refine/ilp.py) ----------------------------------------------------

from planner.refine.ilp import StageCoefficients, solve_stage_recompute  # noqa: E402


def _brute_ilp(stages, L):
    """Every (n_i, r_i) with sum n = L, n_i >= 1, 0 <= r_i <= n_i that fits memory: the least makespan, and among
    those the least total recomputation (the ILP's 1e-6-per-layer tie-break)."""
    p, best = len(stages), None

    def rec(i, left, ns, rs):
        nonlocal best
        if i == p:
            if left:
                return
            t = max(n * st.layer_seconds + r * st.recompute_seconds + st.extra_seconds
                    for n, r, st in zip(ns, rs, stages, strict=True))
            key = (round(t, 9), sum(rs))
            if best is None or key < best[0]:
                best = (key, list(ns), list(rs))
            return
        st = stages[i]
        for n in range(1, left - (p - i - 1) + 1):
            for r in range(n + 1):
                mem = n * (st.layer_state_bytes + st.layer_act_policy_bytes) + r * (
                    st.layer_act_full_bytes - st.layer_act_policy_bytes) + st.fixed_bytes
                if mem <= st.capacity_bytes + 1e-9:
                    rec(i + 1, left - n, [*ns, n], [*rs, r])

    rec(0, L, [], [])
    return best


@pytest.mark.parametrize("seed", range(8))
def test_ilp_matches_enumeration(seed):
    """Small random instances (2-3 stages, 5-7 layers): the ILP's makespan and total recomputation equal the
    enumeration's, its counts fit every stage's memory, and its reported makespan is its counts' makespan."""
    rng = random.Random(100 + seed)
    p, L = rng.randint(2, 3), rng.randint(5, 7)
    stages = [StageCoefficients(1.0, rng.choice([0.3, 0.5]), rng.choice([0.0, 0.0, 1.5]), 1.0,
                                rng.choice([2.0, 3.0, 4.0]) * (p - i) / p, 0.5, rng.choice([0.0, 2.0]),
                                rng.choice([6.0, 8.0, 10.0, 14.0])) for i in range(p)]
    want = _brute_ilp(stages, L)
    res = solve_stage_recompute(stages, L)
    if want is None:
        assert res.status == "infeasible" and res.layers_per_stage is None and res.makespan_seconds is None
        return
    assert res.status == "optimal" and res.optimal and res.solver in ("HiGHS", "CBC") and res.seconds >= 0
    n, r = res.layers_per_stage, res.recompute_layers_per_stage
    assert sum(n) == L and all(0 <= ri <= ni for ni, ri in zip(n, r, strict=True))
    for ni, ri, st in zip(n, r, stages, strict=True):
        assert ni * (st.layer_state_bytes + st.layer_act_policy_bytes) + ri * (
            st.layer_act_full_bytes - st.layer_act_policy_bytes) + st.fixed_bytes <= st.capacity_bytes + 1e-6
    makespan = max(ni * st.layer_seconds + ri * st.recompute_seconds + st.extra_seconds
                   for ni, ri, st in zip(n, r, stages, strict=True))
    assert res.makespan_seconds == pytest.approx(makespan, rel=1e-9)
    assert res.makespan_seconds == pytest.approx(want[0][0], abs=1e-6)
    assert sum(r) == want[0][1]


def test_stage_coefficients_of_a_stage_linear_keep_every_term_in_place():
    from cost_models.stage import StageLinear

    st = StageLinear(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0)
    assert StageCoefficients.of(st, 8.0) == StageCoefficients(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)


def test_group_link_small_groups_fast_networks_and_no_intra_link():
    """The corners of cost-models.md §4.6's placement: a 2-rank group inside a node holds both ranks on it; one rank
    per node (stride 5 on 8-GPU nodes) gets the node's NICs shared by all 8 GPUs (4 x 50 / 8 = 25), not 2 ranks'
    worth; a network faster than NVLink is capped by the intra link only when a node holds 2 or more of the group's
    ranks (4 x 2000 x 2 / 8 = 2000 -> 400), while one rank per node uses the network alone (4 x 2000 / 8 = 1000);
    nodes of one GPU (no intra link) have an infinitely fast, zero-latency local "link"."""
    hw = _hw()
    pair = comm.group_link(hw, group_size=2, stride=1)
    assert (pair.group_size, pair.ranks_per_node, pair.nodes_spanned, pair.link) == (2, 2, 1, hw.intra_node)
    one_per_node = comm.group_link(hw, group_size=2, stride=5)
    assert (one_per_node.group_size, one_per_node.ranks_per_node, one_per_node.nodes_spanned) == (2, 1, 2)
    assert one_per_node.link == Link(25.0, 2.0)
    fast = _hw(nic=Link(2000.0, 0.1))
    assert comm.group_link(fast, group_size=3, stride=3).link == Link(400.0, 0.5)
    assert comm.group_link(fast, group_size=4, stride=8).link == Link(1000.0, 0.5)
    single = _hw(gpus_per_node=1, intra=None, nic=Link(50.0, 0.25))
    alone = comm.group_link(single, group_size=1, stride=1)
    assert (alone.group_size, alone.link) == (1, Link(float("inf"), 0.0))
    spread = comm.group_link(single, group_size=4, stride=1)
    assert (spread.group_size, spread.ranks_per_node, spread.nodes_spanned) == (4, 1, 4)
    assert spread.link == Link(4 * 50.0, 0.25)  # the intra "link" adds no latency


def test_swiglu_activations_in_fp32():
    """SwiGLU's 8 s b f (2-byte) doubles with 4-byte activations, like every other tensor."""
    f = 2816
    llama = gpt_shape(num_layers=2, hidden_size=H, num_attention_heads=A, num_kv_heads=4, ffn_hidden_size=f,
                      swiglu=True, dropout=False, flash_attention=True, rms_norm=True, bias=False)
    assert _act(llama, recompute="selective", activation_bytes=4) == pytest.approx(2 * (S * B * H * 13 + S * B * 8 * f),
                                                                                  rel=1e-12)


# ---- the search's enumeration rules (planner/search.py), each value by hand from the rule in its docstring ----------


def _search_problem(model="llama3-8b", nodes=1, batch=64, seq=4096, cluster="dgx-h100"):
    from cluster_specs import load_cluster
    from planner.inputs.models import load_model
    from planner.inputs.specs import TrainingSpec
    from planner.problem import Problem, default_knobs

    return Problem(load_model(model), TrainingSpec(global_batch_size=batch, seq_length=seq),
                   load_cluster(cluster, nodes=nodes), default_knobs())


@pytest.mark.parametrize("pp, dp, offload, want", [
    (1, 8, False, [(0, "none"), (1, "none"), (2, "none"), (3, "none")]),  # ZeRO 0-3 without pipelining
    (2, 8, False, [(0, "none"), (1, "none")]),  # ZeRO-2/3 never with pp > 1
    (1, 2, False, [(0, "none"), (1, "none"), (2, "none"), (3, "none")]),
    (1, 1, False, [(0, "none")]),  # nothing to shard at dp 1
    (1, 1, True, [(1, "optimizer"), (3, "optimizer"), (3, "optimizer+params")]),
    (2, 1, True, [(1, "optimizer")]),
    (1, 8, True, [(1, "optimizer"), (2, "optimizer"), (3, "optimizer"), (3, "optimizer+params")]),
    (2, 8, True, [(1, "optimizer")]),  # offload needs ZeRO >= 1; parameters offload only with ZeRO-3
])
def test_state_options(pp, dp, offload, want):
    from planner.search import _state_options

    assert [(z, str(off)) for z, off in _state_options(pp, dp, offload)] == want


def test_schedule_options():
    """1F1B always; ZB-H1 (and async when allowed) with pipelining; interleaving v = 2..max where m % pp == 0 and
    the layers divide pp x v, or do with the embedding and/or loss counted as a layer (an uneven split)."""
    from planner.search import PlanOptions, _schedule_options

    def names(*args, **kw):
        return [(str(s), v) for s, v, split in _schedule_options(*args, PlanOptions(**kw)) if split is None]

    def uneven(*args, **kw):
        return [(v, split) for s, v, split in _schedule_options(*args, PlanOptions(**kw)) if split is not None]

    assert names(1, 8, 32) == [("1f1b", 1)]
    assert names(2, 4, 16) == [("1f1b", 1), ("zero_bubble", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4),
                               ("interleaved_1f1b", 8)]  # 16 % (2 v): v = 2, 4, 8
    # v = 3: (16 + embedding + loss) / 2 = 9 per rank, 3 per chunk; rank 0's first chunk and rank 1's last build 2
    assert uneven(2, 4, 16) == [(3, [8, 8])]
    # Llama 3.1 405B: 126 layers over pp 8 interleave only as 128 with both counted (Megatron-Bridge's recipe)
    assert uneven(8, 8, 126, max_virtual_stages=8) == [(v, [15, *[16] * 6, 15]) for v in (2, 4, 8)]
    assert uneven(8, 4, 126) == []  # m = 4 is not a multiple of pp = 8
    assert names(2, 3, 16) == [("1f1b", 1), ("zero_bubble", 1)]  # m = 3 is not a multiple of pp = 2
    assert names(2, 2, 8, allow_async=True, max_virtual_stages=3) == [
        ("1f1b", 1), ("zero_bubble", 1), ("pipedream_async", 1), ("interleaved_1f1b", 2)]  # v = 4 is above the cap
    assert names(2, 2, 8, max_virtual_stages=4) == [("1f1b", 1), ("zero_bubble", 1), ("interleaved_1f1b", 2),
                                                    ("interleaved_1f1b", 4)]
    # 6 layers on pp 4: 6 % (4 x 2) != 0, so no interleaving (6 % (4 / 2) would be 0); counted as 8 the end ranks
    # would hold one layer for two chunks
    assert names(4, 8, 6) == [("1f1b", 1), ("zero_bubble", 1)] and uneven(4, 8, 6) == []


def test_tp_degrees():
    """TP divides the node (8 GPUs), or is whole nodes when allowed, and divides heads, KV heads (or is a multiple of
    them), FFN and width. GPT-3 175B: 96 heads, 12288 wide; Llama 3 70B: 64 heads, 8 KV heads."""
    from planner.search import PlanOptions, _tp_degrees

    gpt3 = _search_problem("gpt3-175b", nodes=3, batch=96, seq=2048)
    assert _tp_degrees(gpt3, PlanOptions()) == [1, 2, 4, 8]  # 3 and 6 fit in the node but do not divide it
    assert _tp_degrees(gpt3, PlanOptions(allow_tp_across_nodes=True)) == [1, 2, 4, 8, 24]
    wide = _search_problem("gpt3-175b", nodes=8, batch=96, seq=2048)
    assert _tp_degrees(wide, PlanOptions(allow_tp_across_nodes=True)) == [1, 2, 4, 8, 16, 32]  # 96 % 64 != 0
    llama = _search_problem("llama3-70b", nodes=2)
    assert _tp_degrees(llama, PlanOptions(allow_tp_across_nodes=True)) == [1, 2, 4, 8, 16]  # 16: a multiple of 8 KV


def test_ep_degrees():
    """Divisors of the experts that divide dp·cp·tp, up to 64 (DeepSeek-V3's EP 64)."""
    from planner.inputs.models import load_model
    from planner.search import _ep_degrees, divisors

    assert _ep_degrees(load_model("llama3-8b"), 8) == [1]
    assert _ep_degrees(load_model("mixtral-8x7b"), 4) == [1, 2, 4]
    assert _ep_degrees(load_model("deepseek-v3"), 128) == [1, 2, 4, 8, 16, 32, 64]  # 256 experts, 128 not allowed
    assert divisors(12) == [1, 2, 3, 4, 6, 12]


def test_degrees_cp_only_for_long_sequences():
    """(tp, pp, dp, cp): pp <= layers, dp divides the batch; cp > 1 needs s divisible by 2 cp tp and s/cp >= 4096."""
    from planner.search import PlanOptions, _degrees

    short = list(_degrees(_search_problem(batch=8, seq=4096), PlanOptions()))
    assert {cp for *_, cp in short} == {1}
    assert (1, 1, 8, 1) in short and (8, 1, 1, 1) in short and (2, 2, 2, 1) in short
    long_ = list(_degrees(_search_problem(batch=8, seq=16384), PlanOptions()))
    assert {(tp, pp, dp, cp) for tp, pp, dp, cp in long_ if cp > 1} == {
        (1, 1, 4, 2), (1, 2, 2, 2), (1, 4, 1, 2), (1, 1, 2, 4), (1, 2, 1, 4), (2, 1, 2, 2), (2, 2, 1, 2),
        (2, 1, 1, 4), (4, 1, 1, 2)}  # s / cp >= 4096 and s % (2 cp tp) == 0
    # s = 8200: 2 cp tp = 16 does not divide it at tp 4 (8200 % 16 = 8), 8 does at tp 2; s / 2 = 4100 >= 4096
    odd_seq = {(tp, cp) for tp, _, _, cp in _degrees(_search_problem(batch=8, seq=8200), PlanOptions()) if cp > 1}
    assert odd_seq == {(1, 2), (2, 2)}
    odd_batch = list(_degrees(_search_problem(batch=6, seq=4096), PlanOptions()))
    assert sorted({dp for _, _, dp, _ in odd_batch}) == [1, 2]  # dp must divide 6
    tiny = list(_degrees(_search_problem("llama3-8b", batch=8, seq=4096, cluster="dgx-h100", nodes=8), PlanOptions()))
    assert max(pp for _, pp, _, _ in tiny) == 32  # pp <= 32 layers (64 divides 64 GPUs but not the layers)


def test_states_lower_bound_bytes_by_hand():
    """Llama 3 8B (8,030,261,248 parameters), bf16 with fp32 gradients and Adam: 2 + 4 + 12 B per parameter sharded by
    ZeRO over dp·cp (over dp·cp·tp when that is more: the bound must stay below every stage), plus 1.3 GB overhead."""
    from planner.search import _states_lower_bound_bytes as lb

    p = _search_problem()
    total = 8_030_261_248
    assert p.total_params == total
    assert lb(p, 2, 2, 2, 0, "none") == total / 4 * 18 + 1.3e9
    assert lb(p, 1, 1, 8, 3, "none") == total * (2 / 8 + 4 / 8 + 12 / 8) + 1.3e9
    assert lb(p, 1, 1, 4, 1, "none", cp=2) == total * (2 + 4 + 12 / 8) + 1.3e9
    assert lb(p, 2, 1, 4, 3, "none") == total / 2 * (18 / 8) + 1.3e9  # dp·cp·tp = 8 shards
    assert lb(p, 1, 1, 8, 2, "optimizer") == total * 2 + 1.3e9  # gradients and optimizer state on the host
    assert lb(p, 1, 1, 8, 3, "optimizer+params") == 0.0
    moe = _search_problem("mixtral-8x7b")
    experts = 1_409_286_144 * 32  # routed experts per layer x MoE layers
    assert moe.total_params == 46_702_792_704
    assert lb(moe, 2, 1, 4, 1, "none", ep=4) == ((46_702_792_704 - experts) / 2 + experts / 4) * (2 + 4 + 12 / 4) + 1.3e9
    # cp 2 and pp 2 with experts: states shard over max(dp·cp, dp·cp·tp/ep) = max(8, 4) = 8 ranks; experts split
    # over ep x pp = 8 GPUs, the rest over tp x pp = 4
    assert lb(moe, 2, 2, 4, 1, "none", cp=2, ep=4) == pytest.approx(
        ((46_702_792_704 - experts) / 4 + experts / 8) * (2 + 4 + 12 / 8) + 1.3e9, rel=1e-15)
    # ep 1: each TP rank keeps whole experts (etp 1) and dp·cp·tp = 16 shards exceed dp·cp = 8
    assert lb(moe, 2, 1, 4, 1, "none", cp=2, ep=1) == pytest.approx(
        ((46_702_792_704 - experts) / 2 + experts) * (2 + 4 + 12 / 16) + 1.3e9, rel=1e-15)


def test_capacity_and_fits_read_the_headroom_and_the_margin():
    """A peak p fits when p x (1 + margin) + headroom <= GPU (planner/estimate.py fits_in_memory); the capacity a
    layout's peak may reach is (GPU - headroom) / (1 + margin) (search.py _capacity_bytes): 2 GB headroom and a 25%
    margin on an 80 GB GPU."""
    from dataclasses import replace as dc_replace
    from types import SimpleNamespace

    from planner.search import _capacity_bytes, _fits

    p = _search_problem()
    p = type(p)(p.model, p.training, p.cluster, dc_replace(p.knobs, memory_headroom_bytes=2e9,
                                                          memory_high_fraction=0.25))
    gpu = p.hardware.gpu_memory_bytes
    assert _capacity_bytes(p) == pytest.approx((gpu - 2e9) / 1.25, rel=1e-15)
    at = (gpu - 2e9) / 1.25
    assert _fits(p, SimpleNamespace(fits=True, peak_memory_bytes=at * (1 - 1e-9), gpu_memory_bytes=gpu))
    assert not _fits(p, SimpleNamespace(fits=True, peak_memory_bytes=at * (1 + 1e-9), gpu_memory_bytes=gpu))
    # the headroom alone (no margin) and the margin alone each refuse a peak that fits without them
    assert not _fits(p, SimpleNamespace(fits=True, peak_memory_bytes=(gpu - 1e9) / 1.25, gpu_memory_bytes=gpu))
    assert not _fits(p, SimpleNamespace(fits=True, peak_memory_bytes=gpu - 1e9, gpu_memory_bytes=gpu))


def test_simplicity_and_objective_key():
    """Ties: no offload, lower ZeRO, no hybrid sharding, fewer model-parallel GPUs, plain 1F1B, no recompute; step
    times bucketed by 0.1% (log base 1.001: 2 s -> bucket 693), a hybrid-sharded layout's raised by
    HYBRID_SHARD_MARGIN first (2 s x 1.005 -> 698); memory objective bucketing the peak instead."""
    from types import SimpleNamespace

    from planner.inputs.specs import LayoutSpec
    from planner.search import PlanOptions, _objective_key, _simplicity

    a = LayoutSpec(tp=2, pp=4, dp=1, zero_stage=1, offload="optimizer", schedule="zero_bubble", recompute="full")
    b = LayoutSpec(tp=1, pp=1, dp=8)
    assert _simplicity(a) == (True, 1, False, 8, True, True)
    assert _simplicity(b) == (False, 0, False, 1, False, False)
    c = SimpleNamespace(layout=b, step_seconds=2.0, estimate=SimpleNamespace(peak_memory_bytes=1.0))
    assert _objective_key(PlanOptions())(c) == (693, (False, 0, False, 1, False, False), 1.0)
    assert _objective_key(PlanOptions(objective="memory"))(c) == (0, 2.0, (False, 0, False, 1, False, False))
    h = LayoutSpec(tp=1, pp=1, dp=8, zero_stage=3, dp_shard=4)
    assert _simplicity(h) == (False, 3, True, 1, False, False)
    hc = SimpleNamespace(layout=h, step_seconds=2.0, estimate=SimpleNamespace(peak_memory_bytes=1.0))
    assert _objective_key(PlanOptions())(hc)[0] == 698
    assert _objective_key(PlanOptions(objective="memory"))(hc)[:2] == (0, 2.0)  # memory ranks by the peak alone
    zero = SimpleNamespace(layout=b, step_seconds=0.0, estimate=SimpleNamespace(peak_memory_bytes=2.0))
    assert _objective_key(PlanOptions())(zero)[0] == 0
    assert _objective_key(PlanOptions(objective="memory"))(zero)[0] == 693


def test_plan_options_allows_asks_the_restriction():
    from planner.search import PlanOptions

    class Only1:
        def adjust(self, f):
            return None if f["tp"] > 1 else {**f, "sequence_parallel": False}

    fields = {"tp": 1, "sequence_parallel": True}
    assert PlanOptions().allows(fields) is fields
    assert PlanOptions(restriction=Only1()).allows(fields) == {"tp": 1, "sequence_parallel": False}
    assert PlanOptions(restriction=Only1()).allows({"tp": 2}) is None



def _fake_candidate(layout=None, times=None, *, origin="search", step=1.0, peak_gib=40.0, stage=2):
    """A candidate whose estimate is round numbers, so reason()'s text can be written by hand."""
    from types import SimpleNamespace

    from planner.inputs.specs import LayoutSpec
    from planner.search import Candidate

    t = {k: 0.0 for k in ("pipeline_bubble", "tp_comm", "dp_comm", "dp_comm_total", "recompute", "offload", "optimizer")}
    t.update(times or {})
    est = SimpleNamespace(step_seconds=step, time=SimpleNamespace(**{k + "_seconds": v for k, v in t.items()}),
                          peak_memory_bytes=peak_gib * 2**30, gpu_memory_bytes=80 * 2**30, peak_stage=stage)
    return Candidate(LayoutSpec(**{"tp": 1, "pp": 1, "dp": 1, **(layout or {})}), est, origin)  # type: ignore[arg-type]


@pytest.mark.parametrize("layout, times, want", [
    ({"pp": 4, "num_micro_batches": 8}, {"pipeline_bubble": 0.3, "tp_comm": 0.2, "dp_comm": 0.1},
     "pp=4: bubble 30.0% with 8 micro-batches; m < 4p (8 < 16) leaves a large bubble"),
    ({"pp": 4, "num_micro_batches": 16}, {"pipeline_bubble": 0.3}, "pp=4: bubble 30.0% with 16 micro-batches"),
    ({"pp": 4, "num_micro_batches": 15}, {"pipeline_bubble": 0.3},
     "pp=4: bubble 30.0% with 15 micro-batches; m < 4p (15 < 16) leaves a large bubble"),
    ({"pp": 4, "num_micro_batches": 8, "schedule": "gpipe"}, {"pipeline_bubble": 0.3},
     "pp=4: bubble 30.0% with 8 micro-batches (gpipe); m < 4p (8 < 16) leaves a large bubble"),
    ({"pp": 4, "num_micro_batches": 8, "schedule": "interleaved_1f1b", "virtual_stages": 2}, {"pipeline_bubble": 0.3},
     "pp=4: bubble 30.0% with 8 micro-batches (interleaved_1f1b, v=2)"),
    ({"pp": 4, "num_micro_batches": 8, "schedule": "zero_bubble"}, {"pipeline_bubble": 0.3},
     "pp=4: bubble 30.0% with 8 micro-batches (zero_bubble)"),
    ({"tp": 8, "pp": 2}, {"pipeline_bubble": 0.1, "tp_comm": 0.25},
     "tp=8 (inside the node): TP all-reduces 25.0% of the step"),
    ({"tp": 16}, {"tp_comm": 0.25}, "tp=16 (crosses nodes): TP all-reduces 25.0% of the step"),
    ({"dp": 4, "zero_stage": 1, "tp": 2}, {"dp_comm": 0.25, "dp_comm_total": 0.5, "tp_comm": 0.1},
     "dp=4, zero=1: 0.5 s of gradient/parameter traffic, 0.25 s exposed"),
    ({"recompute": "selective", "dp": 2}, {"recompute": 0.125, "dp_comm": 0.1},
     "recompute=selective: +12.5% of the step recomputing activations"),
    ({"dp": 2, "zero_stage": 1, "offload": "optimizer"}, {"offload": 0.25, "optimizer": 0.125, "dp_comm": 0.3},
     "offload=optimizer: CPU optimizer and PCIe traffic 0.375 s"),
    ({"dp": 2, "zero_stage": 1, "offload": "optimizer"}, {"optimizer": 0.125, "dp_comm": 0.1},
     "offload=optimizer: CPU optimizer and PCIe traffic 0.125 s"),
])
def test_reason_names_the_largest_cost_beyond_compute(layout, times, want):
    """reason(): the largest of bubble, TP, DP, recompute and offload time, in words and numbers, then the peak."""
    from planner.search import reason

    problem = _search_problem()  # 8 GPUs per node
    assert reason(problem, _fake_candidate(layout, times)) == f"{want}; 40.0/80.0 GiB on stage 2"


def test_reason_without_facts_with_the_pick_and_the_refined_split():
    from planner.search import reason

    problem = _search_problem()
    alone = _fake_candidate({}, {"tp_comm": 0.5, "pipeline_bubble": 0.5, "dp_comm": 0.5, "optimizer": 0.5})
    assert reason(problem, alone) == "40.0/80.0 GiB on stage 2"  # tp = pp = dp = 1, no recompute, GPU optimizer
    pick = _fake_candidate({}, step=0.8)
    split = _fake_candidate({"pp": 4, "layers_per_stage": (7, 9, 9, 7)}, {"pipeline_bubble": 0.1}, origin="split",
                            peak_gib=12.25, stage=0)
    assert reason(problem, split, pick) == ("+25.0% step time vs the pick; pp=4: bubble 10.0% with 1 micro-batches; "
                                            "m < 4p (1 < 16) leaves a large bubble; 12.2/80.0 GiB on stage 0; "
                                            "layers per stage [7, 9, 9, 7] from the split")
    assert reason(problem, pick, pick) == "40.0/80.0 GiB on stage 2"  # the pick is not compared with itself
    compared = _fake_candidate({"pp": 4, "layers_per_stage": (7, 9, 9, 7)}, origin="compared")
    assert reason(problem, compared).endswith("GiB on stage 2")


# ---- layout rules (planner/rules.py): every rule's full violation, the numbers from each case's own degrees ---------

# (model, training, cluster, nodes, layout fields, [(rule, field, value, allowed, fix), ...]); the texts are the
# rules' own words (the CLI prints field: value -> allowed), the numbers follow from the case
RULE_CASES = [('llama3-8b',
  {'global_batch_size': 64, 'seq_length': 4096},
  'dgx-h100',
  2,
  {'dp': 4, 'micro_batch_size': 1, 'num_micro_batches': 16, 'pp': 1, 'sequence_parallel': True, 'tp': 3},
  [('gpus_match_cluster',
    'dp*tp*pp',
    '4*3*1 = 12',
    "must equal the cluster's 16 GPUs (2 nodes x 8)",
    'choose degrees whose product is the number of GPUs'),
   ('tp_divides_heads', 'tp', '3', 'must divide num_attention_heads (32)', 'use a tp that divides the heads'),
   ('tp_fits_kv_heads',
    'tp',
    '3',
    'num_kv_heads (8) must be divisible by tp, or tp by num_kv_heads (GQA replication)',
    'use a tp that divides the KV heads, or a multiple of them'),
   ('tp_divides_ffn', 'tp', '3', 'must divide ffn_hidden_size (14336)', 'use a tp that divides the FFN size'),
   ('tp_divides_hidden', 'tp', '3', 'must divide hidden_size (4096)', 'use a tp that divides the hidden size'),
   ('sp_divides_sequence',
    'sequence_parallel',
    'seq_length 4096',
    'must be divisible by tp (3)',
    'turn sequence parallelism off or use a tp that divides the sequence'),
   ('tp_divides_node',
    'tp',
    '3',
    'must divide gpus_per_node (8) so TP groups stay in one node',
    'use a tp that divides the GPUs of a node')]),
 ('llama3-70b',
  {'global_batch_size': 64, 'seq_length': 4100},
  'dgx-h100',
  4,
  {'dp': 1,
   'micro_batch_size': 2,
   'num_micro_batches': 3,
   'offload': 'optimizer+params',
   'pp': 2,
   'sequence_parallel': True,
   'tp': 16,
   'zero_stage': 2},
  [('sp_divides_sequence',
    'sequence_parallel',
    'seq_length 4100',
    'must be divisible by tp (16)',
    'turn sequence parallelism off or use a tp that divides the sequence'),
   ('tp_within_node',
    'tp',
    '16',
    'exceeds the 8 GPUs of a node: TP all-reduces would cross the network (allow with --allow-tp-across-nodes)',
    'keep tp <= GPUs per node; add pp or dp instead'),
   ('batch_product',
    'global_batch_size',
    '64',
    'must equal micro_batch_size x num_micro_batches x dp = 2 x 3 x 1 = 6',
    'set global batch = micro-batch x micro-batches (gradient accumulation) x dp'),
   ('zero_with_pipelining',
    'zero_stage',
    '2',
    'with pp > 1 only ZeRO-0/1 are supported (gradients and parameters are needed across micro-batches; DeepSpeed '
    'and Megatron both refuse ZeRO-2/3 with pipelining)',
    'use ZeRO-1 (distributed optimizer) with pipelining'),
   ('param_offload_needs_zero3',
    'offload',
    'optimizer+params',
    'needs zero_stage 3 (ZeRO-Infinity offloads partitioned parameters)',
    'offload needs a ZeRO stage that shards what is offloaded')]),
 ('llama3-8b',
  {'global_batch_size': 64, 'seq_length': 4096},
  'single-rtx4090',
  1,
  {'dp': 1,
   'micro_batch_size': 1,
   'num_micro_batches': 64,
   'offload': 'optimizer',
   'pp': 1,
   'schedule': 'zero_bubble',
   'sequence_parallel': True,
   'tp': 1,
   'virtual_stages': 2},
  [('sp_needs_tp',
    'sequence_parallel',
    'true',
    'needs tp > 1',
    'turn sequence parallelism off or use a tp that divides the sequence'),
   ('schedule_needs_pp',
    'schedule',
    'zero_bubble',
    'needs pp > 1 (use 1f1b with pp=1)',
    'use 1f1b without pipelining'),
   ('virtual_stages_need_interleaving',
    'virtual_stages',
    '2',
    'only interleaved_1f1b uses virtual stages',
    'use interleaved_1f1b with >= 2 virtual stages, or drop them'),
   ('offload_needs_zero',
    'offload',
    'optimizer',
    'needs zero_stage >= 1 (ZeRO-Offload shards the optimizer)',
    'offload needs a ZeRO stage that shards what is offloaded')]),
 ('llama3-8b',
  {'global_batch_size': 64, 'seq_length': 4096},
  'dgx-h100',
  1,
  {'dp': 2,
   'micro_batch_size': 1,
   'num_micro_batches': 30,
   'pp': 4,
   'schedule': 'interleaved_1f1b',
   'tp': 1,
   'virtual_stages': 1},
  [('batch_product',
    'global_batch_size',
    '64',
    'must equal micro_batch_size x num_micro_batches x dp = 1 x 30 x 2 = 60',
    'set global batch = micro-batch x micro-batches (gradient accumulation) x dp'),
   ('interleaving_needs_virtual_stages',
    'virtual_stages',
    '1',
    'interleaved_1f1b needs >= 2',
    'use interleaved_1f1b with >= 2 virtual stages, or drop them'),
   ('interleaving_micro_batches',
    'num_micro_batches',
    '30',
    'interleaved_1f1b needs a multiple of pp (4) (Narayanan et al. 2021 §2.2.2)',
    'use a multiple of pp micro-batches')]),
 ('llama3-8b',
  {'global_batch_size': 64, 'seq_length': 4096},
  'dgx-h100',
  1,
  {'dp': 2,
   'micro_batch_size': 1,
   'num_micro_batches': 32,
   'pp': 3,
   'schedule': 'interleaved_1f1b',
   'tp': 1,
   'virtual_stages': 3},
  [('gpus_match_cluster',
    'dp*tp*pp',
    '2*1*3 = 6',
    "must equal the cluster's 8 GPUs (1 nodes x 8)",
    'choose degrees whose product is the number of GPUs'),
   ('interleaving_micro_batches',
    'num_micro_batches',
    '32',
    'interleaved_1f1b needs a multiple of pp (3) (Narayanan et al. 2021 §2.2.2)',
    'use a multiple of pp micro-batches'),
   ('interleaving_layers',
    'num_layers',
    '32',
    'interleaved_1f1b needs a multiple of pp*virtual_stages (9)',
    'use fewer pipeline stages (or virtual stages), or a layer count they divide')]),
 ('llama3-8b',
  {'global_batch_size': 64, 'seq_length': 4096},
  'dgx-h100',
  1,
  {'dp': 2,
   'layers_per_stage': [8, 8, 8, 9],
   'micro_batch_size': 1,
   'num_micro_batches': 32,
   'pp': 4,
   'recompute_layers_per_stage': [0, 9, 0, 0],
   'tp': 1},
  [('layers_per_stage',
    'layers_per_stage',
    '[8, 8, 8, 9]',
    'needs pp (4) entries, each >= 1, summing to num_layers (32)',
    'list one layer count per stage, summing to the layers'),
   ('recompute_layers_per_stage',
    'recompute_layers_per_stage',
    '[0, 9, 0, 0]',
    "needs pp entries, each between 0 and that stage's layers [8, 8, 8, 9]",
    "list one recomputed-layer count per stage, at most that stage's layers")]),
 ('llama3-8b',
  {'global_batch_size': 64, 'seq_length': 4096},
  'dgx-h100',
  1,
  {'dp': 4, 'micro_batch_size': 1, 'num_micro_batches': 16, 'pp': 2, 'recompute_layers_per_stage': [0, 17], 'tp': 1},
  [('recompute_layers_per_stage',
    'recompute_layers_per_stage',
    '[0, 17]',
    "needs pp entries, each between 0 and that stage's layers [16, 16]",
    "list one recomputed-layer count per stage, at most that stage's layers")]),
 ('llama3-8b',
  {'global_batch_size': 64, 'seq_length': 4096},
  'dgx-h100',
  1,
  {'dp': 4, 'ep': 2, 'micro_batch_size': 1, 'num_micro_batches': 16, 'pp': 1, 'tp': 2},
  [('ep_needs_moe',
    'ep',
    '2',
    'expert parallelism needs a mixture-of-experts model (llama3-8b is dense)',
    'use ep=1')]),
 ('mixtral-8x7b',
  {'global_batch_size': 64, 'seq_length': 4096},
  'dgx-h100',
  1,
  {'dp': 8, 'ep': 3, 'etp': 5, 'micro_batch_size': 1, 'num_micro_batches': 8, 'pp': 1, 'tp': 1},
  [('ep_divides_experts',
    'ep',
    '3',
    'must divide num_experts (8) (Megatron arguments.py L1657)',
    'use an ep that divides the experts'),
   ('etp_divides_expert_ffn',
    'etp',
    '5',
    'must divide expert_ffn_hidden_size (14336)',
    'use etp=1 (fine-grained experts) or a divisor'),
   ('ep_folds_into_dp',
    'ep*etp',
    '3*5',
    'must divide dp*cp*tp = 8 (the expert grid etp x ep x edp x pp covers the same GPUs: Megatron parallel folding, '
    'torchtitan parallel_dims)',
    'use an ep that divides dp*cp*tp')]),
 ('llama3-8b',
  {'global_batch_size': 64, 'precision': 'fp8', 'seq_length': 4096},
  'dgx-a100-80gb',
  1,
  {'dp': 8, 'micro_batch_size': 1, 'num_micro_batches': 8, 'pp': 1, 'tp': 1},
  [('fp8_needs_tensor_cores',
    'precision',
    'fp8',
    'the A100-SXM4-80GB has no FP8 tensor cores (needs Ada, Hopper or Blackwell)',
    'use --precision bf16')]),
 ('llama3-8b',
  {'fp8_recipe': 'mxfp8', 'global_batch_size': 64, 'precision': 'fp8', 'seq_length': 4096},
  'dgx-h100',
  1,
  {'dp': 8, 'micro_batch_size': 1, 'num_micro_batches': 8, 'pp': 1, 'tp': 1},
  [('mxfp8_needs_blackwell',
    'fp8_recipe',
    'mxfp8',
    'needs Blackwell (SM100) GPUs, not H100-SXM',
    'use the tensorwise recipe')]),
 ('llama3-8b',
  {'global_batch_size': 64, 'seq_length': 4096},
  'dgx-h100',
  1,
  {'cp': 3, 'dp': 2, 'micro_batch_size': 1, 'num_micro_batches': 32, 'pp': 1, 'tp': 1},
  [('gpus_match_cluster',
    'dp*tp*pp*cp',
    '2*1*1*3 = 6',
    "must equal the cluster's 8 GPUs (1 nodes x 8)",
    'choose degrees whose product is the number of GPUs'),
   ('cp_split',
    'cp',
    '3',
    'seq_length (4096) must be divisible by 2 x cp x tp = 6 (load-balanced causal split of 2·cp chunks; Megatron '
    'arguments.py L1336, torchtitan parallel_dims.py L664-671)',
    'use a cp that splits the sequence into 2·cp equal chunks (and cp_comm p2p when heads do not divide)')]),
 ('llama3-8b',
  {'global_batch_size': 64, 'seq_length': 4096},
  'dgx-h100',
  1,
  {'cp': 2, 'dp': 4, 'micro_batch_size': 1, 'num_micro_batches': 16, 'pp': 1, 'tp': 1},
  []),
 ('llama3-8b',
  {'global_batch_size': 64, 'seq_length': 4096},
  'dgx-h100',
  8,
  {'dp': 8,
   'micro_batch_size': 1,
   'num_micro_batches': 8,
   'pp': 8,
   'schedule': 'interleaved_1f1b',
   'tp': 1,
   'virtual_stages': 8},
  [('chunks_within_layers',
    'pp*virtual_stages',
    '8*8',
    'must not exceed num_layers (32)',
    'use fewer pipeline stages (or virtual stages), or a layer count they divide'),
   ('interleaving_layers',
    'num_layers',
    '32',
    'interleaved_1f1b needs a multiple of pp*virtual_stages (64)',
    'use fewer pipeline stages (or virtual stages), or a layer count they divide')]),
 ('llama3-8b',
  {'global_batch_size': 64, 'seq_length': 4096},
  'dgx-h100',
  2,
  {'dp': 4,
   'layers_per_stage': [0, 32],
   'micro_batch_size': 1,
   'num_micro_batches': 16,
   'pp': 2,
   'recompute_layers_per_stage': [-1, 0],
   'tp': 2},
  [('layers_per_stage',
    'layers_per_stage',
    '[0, 32]',
    'needs pp (2) entries, each >= 1, summing to num_layers (32)',
    'list one layer count per stage, summing to the layers'),
   ('recompute_layers_per_stage',
    'recompute_layers_per_stage',
    '[-1, 0]',
    "needs pp entries, each between 0 and that stage's layers [0, 32]",
    "list one recomputed-layer count per stage, at most that stage's layers")]),
 ('llama3-8b',
  {'global_batch_size': 64, 'seq_length': 4096},
  'dgx-h100',
  1,
  {'dp': 4, 'layers_per_stage': [16, 16, 0], 'micro_batch_size': 1, 'num_micro_batches': 16, 'pp': 2, 'tp': 1},
  [('layers_per_stage',
    'layers_per_stage',
    '[16, 16, 0]',
    'needs pp (2) entries, each >= 1, summing to num_layers (32)',
    'list one layer count per stage, summing to the layers')])]


@pytest.mark.parametrize("model, training, cluster, nodes, layout, want", RULE_CASES)
def test_layout_rules_name_rule_field_value_allowed_and_fix(model, training, cluster, nodes, layout, want):
    from cluster_specs import load_cluster
    from planner.inputs.models import load_model
    from planner.inputs.specs import LayoutSpec, TrainingSpec
    from planner.rules import layout_violations

    got = layout_violations(LayoutSpec.trusted(**layout), load_model(model), TrainingSpec(**training),
                            load_cluster(cluster, nodes=nodes))
    assert [(v.rule, v.field, v.value, v.allowed, v.fix) for v in got] == want
    assert [str(v) for v in got] == [f"{f}: {v} -> {a}" for _, f, v, a, _ in want]


def test_tp_across_nodes_when_allowed_and_validate_layout_raises_one_line_each():
    from cluster_specs import load_cluster
    from planner.errors import InputError
    from planner.inputs.models import load_model
    from planner.inputs.specs import LayoutSpec, TrainingSpec
    from planner.rules import layout_violations, validate_layout

    model, training, cluster = load_model("llama3-70b"), TrainingSpec(seq_length=4096, global_batch_size=64), \
        load_cluster("dgx-h100", nodes=4)
    wide = LayoutSpec.trusted(tp=16, pp=1, dp=2, micro_batch_size=1, num_micro_batches=32)
    assert layout_violations(wide, model, training, cluster, allow_tp_across_nodes=True) == []
    validate_layout(wide, model, training, cluster, allow_tp_across_nodes=True)  # no error
    assert [v.rule for v in layout_violations(wide, model, training, cluster)] == ["tp_within_node"]
    with pytest.raises(InputError) as err:
        validate_layout(LayoutSpec.trusted(tp=16, pp=1, dp=1, micro_batch_size=1, num_micro_batches=32), model,
                        training, cluster)
    assert str(err.value).splitlines() == [  # one line per violation, each named by its source
        "layout: dp*tp*pp: 1*16*1 = 16 -> must equal the cluster's 32 GPUs (4 nodes x 8)",
        "layout: tp: 16 -> exceeds the 8 GPUs of a node: TP all-reduces would cross the network (allow with "
        "--allow-tp-across-nodes)",
        "layout: global_batch_size: 64 -> must equal micro_batch_size x num_micro_batches x dp = 1 x 32 x 1 = 32"]


# ---- the plan's wrappers (planner/search.py), with plan() replaced by a stand-in whose answer is known -------------


class _FakePlan:
    """plan(problem, opts) standing in for the search: tokens/s = 1,000 per node; records the options it saw."""

    def __init__(self, fail_above_fraction=None):
        self.seen = []
        self.fail_above_fraction = fail_above_fraction

    def __call__(self, problem, opts=None):
        from types import SimpleNamespace

        from planner.errors import InfeasibleError

        self.seen.append((problem, opts))
        if self.fail_above_fraction is not None and problem.knobs.memory_high_fraction > self.fail_above_fraction:
            raise InfeasibleError("nothing fits")
        rate = 1000.0 * problem.cluster.num_nodes
        return SimpleNamespace(pick=SimpleNamespace(estimate=SimpleNamespace(tokens_per_second=rate)),
                               memory_margin_relaxed=False)


def test_with_memory_margin_sets_the_band_fraction_or_zero():
    from cluster_specs import SpecError
    from planner.bands import memory_high_fraction
    from planner.search import MEMORY_MARGINS, with_memory_margin

    p = _search_problem()
    assert MEMORY_MARGINS == ("band-high", "estimate")
    assert with_memory_margin(p, "band-high").knobs.memory_high_fraction == memory_high_fraction() > 0
    assert with_memory_margin(p, "estimate").knobs.memory_high_fraction == 0.0
    assert with_memory_margin(p, "estimate").knobs.memory_headroom_bytes == p.knobs.memory_headroom_bytes
    with pytest.raises(SpecError, match=r"^--memory-margin: 'loose' -> allowed: band-high, estimate$"):
        with_memory_margin(p, "loose")


def test_plan_within_memory_margin_relaxes_only_when_nothing_fits(monkeypatch):
    import planner.search as search
    from planner.errors import InfeasibleError

    p = search.with_memory_margin(_search_problem(), "band-high")
    monkeypatch.setattr(search, "plan", _FakePlan())
    used, result = search.plan_within_memory_margin(p, search.PlanOptions())
    relaxed = result.memory_margin_relaxed
    assert used is p and relaxed is False
    monkeypatch.setattr(search, "plan", _FakePlan(fail_above_fraction=0.0))
    used, result = search.plan_within_memory_margin(p, search.PlanOptions())
    relaxed = result.memory_margin_relaxed
    assert relaxed is True and used.knobs.memory_high_fraction == 0.0 and used.model is p.model
    assert result.memory_margin_relaxed is True  # what compare and scaling read
    monkeypatch.setattr(search, "plan", _FakePlan(fail_above_fraction=-1.0))
    with pytest.raises(InfeasibleError):  # already at the estimate: nothing to relax
        search.plan_within_memory_margin(search.with_memory_margin(p, "estimate"), search.PlanOptions())


def test_plan_min_gpus_binary_search(monkeypatch):
    """With 1,000 tokens/s per node, the fewest of 8 nodes reaching 5,500 tokens/s is 6; the search plans without the
    solver or a progress bar, and refuses a target the whole cluster misses."""
    import planner.search as search
    from planner.errors import InfeasibleError

    fake = _FakePlan()
    monkeypatch.setattr(search, "plan", fake)
    p = _search_problem(nodes=8)
    smaller, note = search.plan_min_gpus(p, search.PlanOptions(progress=True), 5500.0)
    assert smaller.cluster.num_nodes == 6 and smaller.model is p.model and smaller.knobs is p.knobs
    assert note == ("min-gpus: 6 nodes (48 GPUs) are the fewest that reach 5,500 tokens/s (binary search over 1..8 "
                    "nodes, assuming the best throughput does not fall as nodes are added)")
    assert all(opts.use_solver is False and opts.progress is False for _, opts in fake.seen)
    assert [q.cluster.num_nodes for q, _ in fake.seen] == [8, 4, 6, 5]  # hi first, then the bisection
    assert search.plan_min_gpus(p, search.PlanOptions(), 8000.0)[0].cluster.num_nodes == 8
    assert search.plan_min_gpus(p, search.PlanOptions(), 1000.0)[0].cluster.num_nodes == 1
    with pytest.raises(InfeasibleError, match=r"^even 8 nodes \(64 GPUs\) do not reach 8,001 tokens/s; raise --nodes$"):
        search.plan_min_gpus(p, search.PlanOptions(), 8001.0)
    monkeypatch.setattr(search, "plan", _FakePlan(fail_above_fraction=-1.0))  # every count infeasible: rate 0
    with pytest.raises(InfeasibleError, match="even 8 nodes"):
        search.plan_min_gpus(p, search.PlanOptions(), 1.0)


def test_any_fits_tries_without_then_with_offload(monkeypatch):
    import planner.search as search

    calls = []

    def fake_search(problem, opts, stats, *, offload):
        calls.append((offload, opts.progress))
        return (["fits"] if offload else []), 0.0

    monkeypatch.setattr(search, "search", fake_search)
    assert search._any_fits(_search_problem(), search.PlanOptions(progress=True)) is True
    assert calls == [(False, False), (True, False)]
    monkeypatch.setattr(search, "search", lambda *a, **k: ([], 0.0))
    assert search._any_fits(_search_problem(), search.PlanOptions()) is False


def test_median_and_infeasible(monkeypatch):
    import math

    import planner.explain.infeasible as infeasible
    import planner.search as search

    assert search._median([3.0, 1.0, 2.0]) == 2.0 and search._median([1.0, 2.0]) == 1.5
    assert math.isnan(search._median([]))
    seen = []
    monkeypatch.setattr(infeasible, "explain_infeasible", lambda problem, opts: seen.append((problem, opts)) or "why")
    p, opts = _search_problem(), search.PlanOptions()
    assert search.infeasible(p, 1.0, opts) == "why" and seen == [(p, opts)]


def test_published_layout_ranks_table(monkeypatch):
    """Rank = 1 + the planner's candidates faster than the published layout beyond the 0.1% tie (a hybrid-sharded one
    by more than HYBRID_SHARD_MARGIN too, as the pick is chosen); one plan per distinct case; rows without a layout or a prediction are left out; a planner failure is a row, not an error."""
    from types import SimpleNamespace

    import planner.search as search

    class Spec:
        def __init__(self, name):
            self.name = name

        def model_dump_json(self):
            return self.name

    class FakeProblem:
        def __init__(self, model, training, cluster, knobs):
            self.model = model

        def estimate(self, layout):
            return SimpleNamespace(step_seconds=layout.step)

    plans = []

    def fake_plan(problem, opts):
        plans.append((problem.model.name, opts.use_solver, opts.top_k))
        if problem.model.name == "broken":
            raise ValueError("infeasible: no layout\nsecond line")
        flat, hybrid = SimpleNamespace(hybrid_sharded=False), SimpleNamespace(hybrid_sharded=True)
        ranked = [SimpleNamespace(step_seconds=s, layout=flat) for s in (0.9, 0.95, 0.9995, 1.0, 1.2)]
        # 0.4% faster than 1.0 but hybrid-sharded: inside HYBRID_SHARD_MARGIN (0.5%), as the pick is chosen
        ranked.append(SimpleNamespace(step_seconds=0.996, layout=hybrid))
        return SimpleNamespace(ranked=ranked, pick=SimpleNamespace(step_seconds=0.9, layout=_short("tp8 pp4")))

    def _short(text, step=1.0):
        return SimpleNamespace(short=lambda: text, step=step)

    def row(row_id, model, layout, predicted=1.0):
        case = SimpleNamespace(row_id=row_id, model=Spec(model), cluster=Spec("c"), training=Spec("t"), knobs="k")
        return SimpleNamespace(case=case, layout=layout, predicted_step_seconds=predicted)

    monkeypatch.setattr(search, "Problem", FakeProblem)
    monkeypatch.setattr(search, "plan", fake_plan)
    report = SimpleNamespace(results=[row("a", "m", _short("tp2 pp8", 1.0)), row("b", "m", _short("tp4 pp4", 0.8)),
                                      row("c", "m", None), row("d", "m", _short("tp1", 1.0), None),
                                      row("e", "broken", _short("tp8", 1.0))])
    text = search.published_layout_ranks(report)
    assert plans == [("m", False, 3), ("broken", False, 3)]  # one plan per distinct case, without the solver
    lines = text.splitlines()
    assert lines[0] == "## The planner against published layouts" and lines[1] == "" and lines[3] == ""
    assert lines[2].startswith("For every evaluated row the planner plans the same model, batch and cluster")
    assert lines[4] == ("- rows: 3; published layout is the pick or ties it: 1; in the top 10: 2; median predicted "
                        "gain of the pick +1.2%; rows where the pick is predicted slower than the published layout by "
                        "more than the 0.1% tie tolerance: 1.")
    assert lines[5:] == ["", "| row | published layout | rank | pick vs published | planner's pick |",
                         "|---|---|---|---|---|",
                         "| a | tp2 pp8 | 3 of 6 | -10.0% | tp8 pp4 |",  # 0.9 and 0.95 beat 1.0 by more than 0.1%
                         "| b | tp4 pp4 | 1 of 6 | +12.5% | tp8 pp4 |",  # nothing beats 0.8
                         "| e | tp8 | - | - | planner: infeasible: no layout |"]


def test_add_compared_estimates_beside_the_pick(monkeypatch):
    from types import SimpleNamespace

    import planner.estimate as estimate
    import planner.search as search

    calls = []

    def fake_estimate_layout(problem, lay, *, allow_tp_across_nodes=False):
        calls.append((lay, allow_tp_across_nodes))
        return _fake_candidate({"pp": 2}, {"pipeline_bubble": 0.5}).estimate

    monkeypatch.setattr(estimate, "estimate_layout", fake_estimate_layout)
    pick = _fake_candidate({}, step=0.5)
    result = SimpleNamespace(pick=pick, compared=[], reasons={})
    lay = _fake_candidate({"pp": 2}).layout
    assert search.add_compared(_search_problem(), result, [lay]) is result
    (cand,) = result.compared
    assert calls == [(lay, True)] and cand.layout is lay and cand.origin == "compared"
    assert result.reasons == {id(cand): "+100.0% step time vs the pick; pp=2: bubble 50.0% with 1 micro-batches; "
                                        "m < 4p (1 < 8) leaves a large bubble; 40.0/80.0 GiB on stage 2"}


def test_search_counts_and_keeps_what_a_brute_force_ladder_keeps():
    """search(): every base is considered with the whole recompute ladder (3 rungs); a base whose states lower bound
    exceeds the capacity is not evaluated; otherwise rungs are evaluated until one fits. Checked against a plain
    loop over the same bases, with non-default knobs (the search must estimate with the problem's knobs)."""
    from dataclasses import replace

    from cost_models.inputs import Recompute
    from cost_models.step import estimate_step
    from planner.contract import SearchStats
    from planner.inputs.specs import LayoutSpec
    from planner.search import (
        PlanOptions,
        _capacity_bytes,
        _fits,
        _states_lower_bound_bytes,
        enumerate_bases,
        search,
    )

    p = _search_problem("llama3-8b", batch=16, seq=8192)
    p = replace(p, knobs=replace(p.knobs, dp_overlap_fraction=0.0, end_to_end_efficiency=0.5))
    opts = PlanOptions()
    bases = list(enumerate_bases(p, opts, offload=False))
    evaluated, kept, least = 0, [], float("inf")
    for base in bases:
        lb = _states_lower_bound_bytes(p, base["tp"], base["pp"], base["dp"], base["zero_stage"], base["offload"],
                                       base["cp"], base["ep"])
        if lb > _capacity_bytes(p):
            least = min(least, lb)
            continue
        for rec in Recompute:
            lay = LayoutSpec.trusted(**base, recompute=rec)
            est = estimate_step(p.cm_model, p.cm_training, p.hardware, lay.to_cost_model(), p.knobs)
            evaluated += 1
            least = min(least, est.peak_memory_bytes)
            if _fits(p, est):
                kept.append((lay, est))
                break
    stats = SearchStats()
    fitting, got_least = search(p, opts, stats, offload=False)
    assert stats.candidates_considered == 3 * len(bases) and stats.candidates_evaluated == evaluated
    assert [(c.layout, c.estimate) for c in fitting] == kept and got_least == least
    assert 0 < len(kept) < evaluated < 3 * len(bases)  # the case exercises pruning, the ladder and misses
    assert any(lay.cp > 1 for lay, _ in kept)  # 8192 tokens: CP 2 is searched


def test_refine_ilp_asks_the_solver_at_the_base_policy_and_keeps_a_faster_fitting_answer(monkeypatch):
    """refine_ilp: only pipelined, non-interleaved layouts that recompute; full recompute refines from selective,
    selective from none; the solver's time, runs and status are counted; its split comes back as the layout's
    (origin "ilp", or flagged when the time limit stopped it); a split that breaks a layout rule, or is not faster,
    is dropped. The solver is replaced by a stand-in whose answer is given."""
    from types import SimpleNamespace

    import planner.refine.ilp as ilp
    from planner.contract import SearchStats
    from planner.search import PlanOptions, refine_ilp

    seen = []
    answer = {"layers_per_stage": [16, 16], "recompute_layers_per_stage": [16, 8], "optimal": True}

    def fake_solve(coeffs, num_layers, *, time_limit_seconds):
        seen.append((len(coeffs), num_layers, time_limit_seconds, coeffs[0].recompute_seconds > 0))
        return SimpleNamespace(seconds=0.25, solver="highs", status="optimal", **answer)

    monkeypatch.setattr(ilp, "solve_stage_recompute", fake_solve)
    p = _search_problem()  # Llama 3 8B, 32 layers, 64 x 4096 tokens on one 8-GPU H100 node
    slow = {"step": 1e9}

    def cand(**kw):
        c = _fake_candidate({"pp": 2, "dp": 4, "zero_stage": 1, "num_micro_batches": 16, **kw}, step=slow["step"])
        return c

    stats, opts = SearchStats(), PlanOptions(solver_time_limit_seconds=7.0)
    got = refine_ilp(p, cand(recompute="full"), opts, stats)
    assert got is not None and got.origin == "ilp"
    assert (got.layout.recompute, got.layout.layers_per_stage, got.layout.recompute_layers_per_stage) == (
        "selective", [16, 16], [16, 8])
    assert got.estimate.step_seconds == p.estimate(got.layout).step_seconds
    assert seen == [(2, 32, 7.0, True)]
    assert (stats.solver_runs, stats.solver_seconds, stats.solver_statuses) == (1, 0.25, ["highs: optimal"])
    refine_ilp(p, cand(recompute="selective"), opts, stats)
    assert (stats.solver_runs, stats.solver_seconds, stats.solver_statuses[-1]) == (2, 0.5, "highs: optimal")
    answer["optimal"] = False
    assert refine_ilp(p, cand(recompute="selective"), opts, stats).origin == (
        "ilp (time limit: feasible, not proven optimal)")
    assert refine_ilp(p, cand(recompute="selective"), opts, stats).layout.recompute == "none"
    for skipped in (cand(recompute="none"), cand(recompute="full", pp=1, dp=8),
                    cand(recompute="full", schedule="interleaved_1f1b", virtual_stages=2)):
        runs = stats.solver_runs
        assert refine_ilp(p, skipped, opts, stats) is None and stats.solver_runs == runs
    answer["layers_per_stage"] = [16, 17]  # 33 layers: breaks the split rule
    assert refine_ilp(p, cand(recompute="full"), opts, stats) is None
    answer["layers_per_stage"] = None  # infeasible
    assert refine_ilp(p, cand(recompute="full"), opts, stats) is None
    answer["layers_per_stage"], slow["step"] = [16, 16], 1e-9  # fits, but not faster
    assert refine_ilp(p, cand(recompute="full"), opts, stats) is None


# ---- pipeline send/receive and DP traffic of the step (cost_models/step.py), by hand on the _hw() links ------------


def _tiny(hidden=4, tied=False):
    from cost_models.inputs import Training, Transformer

    model = Transformer(num_layers=4, hidden_size=hidden, num_attention_heads=2, num_kv_heads=2, ffn_hidden_size=16,
                        vocab_size=64, swiglu=False, tied_embeddings=tied, rms_norm=False, flash_attention=True,
                        learned_position_embeddings=False, max_position_embeddings=64, bias=False, dropout=False)
    training = Training(global_batch_size=8, seq_length=8, activation_bytes=2, param_bytes=2, grad_bytes=4,
                        optimizer_bytes=12, grad_reduce_bytes=4)
    return model, training


def test_pp_p2p_seconds_by_hand():
    """Megatron sends b·s/cp·h·bytes/tp per hop: b 2, s 8, cp 2, h 4, 2 bytes, tp 2 -> 32 B. Neighbours 4 ranks apart sit
    in the node (400 B/s, 0.5 s): one hop 0.5 + 32/400 = 0.58 s; fill and drain 2 (p-1) hops, and the steady state's
    unhidden share (1 - 0.5) x 2 m v hops (m 3, v 2); naive sends the whole batch (m x 32 B) with no steady state;
    16 ranks apart the NIC share 4 x 50 / 8 = 25 B/s, 2 s."""
    from cost_models.inputs import Knobs, Layout, Schedule
    from cost_models.step import pp_p2p_seconds

    model, training = _tiny()
    hw, knobs = _hw(), Knobs(pp_overlap_fraction=0.5)
    lay = Layout(dp=1, tp=2, pp=4, cp=2, micro_batch_size=2, num_micro_batches=3)
    one = 0.5 + 32 / 400
    assert pp_p2p_seconds(hw, training, lay, model, knobs, Schedule.INTERLEAVED_1F1B, 2) == pytest.approx(
        2 * 3 * one + 0.5 * 2 * 3 * 2 * one, rel=1e-12)
    assert pp_p2p_seconds(hw, training, lay, model, knobs, Schedule.NAIVE, 1) == pytest.approx(
        2 * 3 * (0.5 + 3 * 32 / 400), rel=1e-12)
    far = Layout(dp=4, tp=2, pp=4, cp=2, micro_batch_size=2, num_micro_batches=3)
    assert pp_p2p_seconds(hw, training, far, model, knobs, Schedule.ONE_F_ONE_B, 1) == pytest.approx(
        2 * 3 * (2 + 32 / 25) + 0.5 * 2 * 3 * (2 + 32 / 25), rel=1e-12)
    assert pp_p2p_seconds(hw, training, Layout(dp=8, tp=2, pp=1), model, knobs, Schedule.ONE_F_ONE_B, 1) == 0.0


def test_dp_comm_reduces_over_dp_times_cp_and_ties_the_embeddings(monkeypatch):
    """Gradients reduce over dp·cp (dp 2 x cp 2 moves what dp 4 does); with tied embeddings and pp > 1 the first and
    last stages add the embedding-gradient all-reduce of V_padded·h/tp x 4 B (V 64 pads to 256 at tp 2) over dp·cp."""
    from cost_models import step
    from cost_models.inputs import Knobs, Layout
    from cost_models.stage import stage_model

    hw, knobs = _hw(), Knobs()

    def total(model, training, lay):
        sm = stage_model(model, training, hw, lay, knobs)
        return step.dp_comm_seconds(hw, training, model, knobs, sm, sm.times(), sm.params_per_stage())

    model, training = _tiny(tied=True)
    a = total(model, training, Layout(dp=2, cp=2, tp=2, pp=2, zero_stage=1))
    b = total(model, training, Layout(dp=4, tp=2, pp=2, zero_stage=1))
    assert a[0] == b[0] > 0  # the traffic before overlap: the same group of 4
    calls = []
    real = step.embedding_sync_seconds

    def spy(hw_, *, tp, dp, embedding_grad_bytes):
        calls.append((tp, dp, embedding_grad_bytes))
        return real(hw_, tp=tp, dp=dp, embedding_grad_bytes=embedding_grad_bytes)

    monkeypatch.setattr(step, "embedding_sync_seconds", spy)
    tied = total(model, training, Layout(dp=2, cp=2, tp=2, pp=2, zero_stage=1))
    assert calls == [(2, 4, 256 * 4 / 2 * 4)]
    monkeypatch.setattr(step, "embedding_sync_seconds", lambda *a, **k: 0.0)
    bare = total(model, training, Layout(dp=2, cp=2, tp=2, pp=2, zero_stage=1))
    sync = real(hw, tp=2, dp=4, embedding_grad_bytes=2048.0)
    assert sync > 0 and tied[0] == pytest.approx(bare[0] + sync, rel=1e-12)
    assert tied[1] == pytest.approx(bare[1] + sync, rel=1e-12)
    calls.clear()
    monkeypatch.setattr(step, "embedding_sync_seconds", spy)
    total(model, training, Layout(dp=8, tp=2, pp=1, zero_stage=1))  # no pipeline: nothing to sync
    assert calls == []


def test_decide_follows_ties_explains_or_says_nothing_of_the_kind_fits():
    """decide() on one 8-GPU H100 node for Llama 3 8B (row 4: the model does not fit one card; the table recommends
    TP or ZeRO-3): a pick of that kind follows it; otherwise the best layout of the kind is named as a tie (within
    0.5%, or faster), or with the exposed time that differs most; or none of the kind fits. The texts are built here
    from the estimates, so the test holds whatever the time model's numbers become."""
    from planner.contract import TimeReport
    from planner.inputs.specs import LayoutSpec
    from planner.search import Candidate, decide

    p = _search_problem()

    def cand(**f):
        lay = LayoutSpec(**f)
        return Candidate(lay, p.estimate(lay))

    tp2 = cand(tp=2, pp=1, dp=4, zero_stage=1, num_micro_batches=16, sequence_parallel=True)
    zero3 = cand(tp=1, pp=1, dp=8, zero_stage=3, num_micro_batches=8)
    tp8 = cand(tp=8, pp=1, dp=1, num_micro_batches=64)
    full = cand(tp=1, pp=1, dp=8, zero_stage=1, num_micro_batches=8, recompute="full")  # not of the kind
    head = ("One node, several GPUs, model does not fit on one card: the table recommends Tensor parallelism, or "
            "ZeRO stage 3.")
    d = decide(p, [tp2, full], tp2)
    assert (d.row, d.agrees, d.scenario, d.recommendation) == (
        4, True, "One node, several GPUs, model does not fit on one card", "Tensor parallelism, or ZeRO stage 3")
    assert d.reasons == [head, f"The pick ({tp2.layout.short()}) follows it."]
    assert zero3.step_seconds <= full.step_seconds * 1.005 < tp8.step_seconds
    d = decide(p, [full, zero3, tp8], full)
    assert (d.row, d.agrees) == (4, False) and d.reasons == [head, (
        f"The best layout of the recommended kind, {zero3.layout.short()}, ties with the pick "
        f"({zero3.step_seconds:.3g} s against {full.step_seconds:.3g} s per step, within 0.5%); "
        "either is a sound choice.")]
    ta, tp_ = TimeReport.from_estimate(tp8.estimate).exposed(), TimeReport.from_estimate(full.estimate).exposed()
    what = sorted(ta, key=lambda k: ta[k] - tp_[k])[-1]
    d = decide(p, [full, tp8], full)
    assert d.reasons == [head, (
        f"The best layout of the recommended kind, {tp8.layout.short()}, takes {tp8.step_seconds:.3g} s per step "
        f"against the pick's {full.step_seconds:.3g} s ({tp8.step_seconds / full.step_seconds - 1:+.1%}): mostly "
        f"{what}, {ta[what] - tp_[what]:.3g} s more per step ({ta[what]:.3g} s against {tp_[what]:.3g} s, with "
        f"{tp8.estimate.time.compute_seconds:.3g} s of compute).")]
    assert decide(p, [full], full).reasons == [head, (
        f"No layout of the recommended kind fits in 80 GiB per GPU; the pick ({full.layout.short()}) is the fastest "
        "that does.")]


# ---- the stage model's split and linear form (cost_models/stage.py) --------------------------------------------------


def test_stage_split_gives_the_remainder_to_inner_stages_then_the_first():
    """THE split: as even as possible, the remainder to the inner stages first, then the first stage (the last
    carries the output layer): 11 over 4 -> 2 each + 3 extra to stages 1, 2, then 0."""
    from cost_models.stage import stage_split

    assert stage_split(11, 4) == (3, 3, 3, 2)
    assert stage_split(10, 3) == (3, 4, 3)
    assert stage_split(10, 4) == (2, 3, 3, 2)
    assert stage_split(9, 2) == (5, 4)
    assert stage_split(7, 1) == (7,)
    assert stage_split(17, 6) == (3, 3, 3, 3, 3, 2)


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("interleaved_1f1b", 2)])
def test_linear_form_with_cp_tp_overlap_and_every_micro_batch_in_flight(schedule, v):
    """The ILP's linear rows equal the evaluated stages also when states shard over dp·cp, TP traffic is partly
    hidden (tp_overlap_fraction 0.3) and the last stage holds more than one micro-batch (GPipe: all m)."""
    from dataclasses import replace

    from cost_models.inputs import Knobs, Layout
    from cost_models.stage import stage_model
    from tests.test_stage_model import BF16, gpt_shape
    from tests.test_stage_model import _hw as stage_hw

    model = gpt_shape(num_layers=48, hidden_size=4096, num_attention_heads=32, num_kv_heads=32, ffn_hidden_size=16384)
    knobs = Knobs(tp_overlap_fraction=0.3)
    layout = Layout(dp=2, cp=2, tp=4, pp=4, zero_stage=1, micro_batch_size=1, num_micro_batches=8,
                    recompute="selective", sequence_parallel=True, schedule=schedule, virtual_stages=v,
                    layers_per_stage=(11, 13, 13, 11), recompute_layers_per_stage=(0, 3, 12, 1))
    sm = stage_model(model, BF16, stage_hw(), layout, knobs)
    base = stage_model(model, BF16, stage_hw(), replace(layout, recompute_layers_per_stage=None), knobs)
    assert sm.in_flight(3) > 1
    for i in range(4):
        n, r = sm.split[i], sm.full_layers[i]
        lin = base.linear(i)
        assert sm.time(i).total_seconds == pytest.approx(n * lin.layer_seconds + r * lin.recompute_seconds
                                                         + lin.extra_seconds, rel=1e-12)
        linear_bytes = (n * lin.layer_state_bytes + (n - r) * lin.layer_act_policy_bytes
                        + r * lin.layer_act_full_bytes + lin.fixed_bytes)
        # the linear row reserves the larger of a fully recomputed layer's backward and a policy layer's; the stage
        # pays those of the layers it has (with the allocator's reserve on it)
        full, policy = (base.lc.backward_working_bytes(full=f) for f in (True, False))
        paid = max(full if r > 0 else 0.0, policy if n > r else 0.0)
        reserved = (max(full, policy) - paid) * (1 + knobs.allocator_reserve_fraction)
        assert sm.memory(i).total_bytes == pytest.approx(linear_bytes - reserved, rel=1e-12)


def test_stage_transients_by_rule():
    """StageModel.transient_bytes, rule by rule: buckets + CP/EP buffers; ZeRO-3 gathers a unit (a layer under FSDP,
    the largest Linear under DeepSpeed) plus the prefetched next one, and holds its unsharded gradient, and FSDP keeps
    the unit holding the output layer gathered on the last stage (stage.fsdp_head_unit_params); DeepSpeed keeps
    one unit live when two would pass stage3_max_live_parameters (1e9); optimizer offload stages one reduce bucket of
    min(params / (dp·cp), 5e8) elements at the gradient's bytes. bf16: 2 B parameters, 4 B gradients."""
    from dataclasses import replace

    from cost_models.inputs import Knobs, Layout
    from cost_models.stage import stage_model

    built: dict[int, str] = {}  # the model each stage model below was built for

    def sm(model, layout, **knobs):
        p = _search_problem(model, nodes=4)
        out = stage_model(p.cm_model, p.cm_training, p.hardware, layout, replace(Knobs(), **knobs))
        built[id(out)] = model
        return out

    zero3 = Layout(dp=4, cp=2, tp=1, pp=1, zero_stage=3, num_micro_batches=8)
    mlps = {"llama3-8b": (3, 14336), "gpt3-175b": (2, 49152)}  # (FFN-wide gradients: SwiGLU 3, GeLU 2; FFN width)

    def grads(s):  # no recompute: a layer's backward holds its MLP's gradients, bf16, TP-sharded
        tensors, ffn = mlps[built[id(s)]]
        assert s.lc.backward_working_bytes(full=False) == s.lc.mlp_grad_bytes == pytest.approx(
            tensors * ffn / s.layout.tp * s.lc.extras.tokens_per_rank * 2, rel=1e-12)
        return s.lc.mlp_grad_bytes

    s = sm("llama3-8b", zero3, bucket_bytes=1e6)
    assert s.lc.extras.transient_bytes > 0  # CP receive buffers
    # FSDP also keeps the unit holding the output layer gathered across the loss: final norm + output, 2 B each
    head = 4096 + 128256 * 4096
    assert s.memory(0).transient_bytes == (1e6 + s.lc.extras.transient_bytes + s.lc.layer_params * (2 * 2 + 4)
                                           + head * 2 + grads(s))
    s = sm("llama3-8b", zero3, zero3_gather="module")  # 4096 x 14336 = 58.7M: two fit under 1e9
    assert s.lc.largest_module_params == 4096 * 14336
    assert s.memory(0).transient_bytes == s.lc.extras.transient_bytes + 4096 * 14336 * (2 * 2 + 4) + grads(s)
    s = sm("gpt3-175b", zero3, zero3_gather="module")  # 12288 x 49152 = 604M: one at a time
    assert s.memory(0).transient_bytes == s.lc.extras.transient_bytes + 12288 * 49152 * (1 * 2 + 4) + grads(s)
    s = sm("gpt3-175b", replace(zero3, tp=2, dp=2), zero3_gather="module")  # 302M per GPU, x tp = 604M each: one
    assert s.memory(0).transient_bytes == s.lc.extras.transient_bytes + 12288 * 49152 / 2 * (1 * 2 + 4) + grads(s)
    offload = Layout(dp=32, tp=1, pp=1, zero_stage=1, offload="optimizer", num_micro_batches=1)
    s = sm("llama3-8b", offload)
    assert s.memory(0).transient_bytes == min(s.params(0) / 32, 5e8) * 4 + grads(s) == s.params(0) / 32 * 4 + grads(s)
    s = sm("llama3-8b", replace(offload, dp=4, pp=8))  # ~1B parameters per stage / dp 4 = ~250M: under the cap
    assert [m.transient_bytes for m in s.memories()] == [P / 4 * 4 + grads(s) for P in s.params_per_stage()]
    s = sm("gpt3-175b", replace(offload, dp=32))  # 175B / 32 = 5.5e9: capped at one 5e8-element bucket
    assert s.memory(0).transient_bytes == 5e8 * 4 + grads(s)
    both = sm("llama3-8b", Layout(dp=32, tp=1, pp=1, zero_stage=3, offload="optimizer+params", num_micro_batches=1))
    assert both.memory(0).transient_bytes == (both.lc.layer_params * (2 * 2 + 4) + head * 2
                                              + both.params(0) / 32 * 4 + grads(both))
    plain = sm("llama3-8b", Layout(dp=32, tp=1, pp=1, zero_stage=2, num_micro_batches=1))
    assert plain.memory(0).transient_bytes == grads(plain)


def test_naive_schedule_holds_every_micro_batch_on_every_stage():
    from cost_models.inputs import Knobs, Layout
    from cost_models.stage import stage_model

    p = _search_problem(nodes=1)
    s = stage_model(p.cm_model, p.cm_training, p.hardware,
                    Layout(dp=4, tp=1, pp=2, num_micro_batches=4, schedule="naive"), Knobs())
    assert s.in_flights() == [4.0, 4.0] and s.in_flight(1) == 4.0
    # the output layer on the last stage holds every micro-batch too (StageModel.output_in_flight)
    assert s.output_in_flight() == 4.0
    assert [m.activations_bytes for m in s.memories()] == [
        a * 4.0 + (4.0 * s.lc.output_act_bytes if i == 1 else 0.0) for i, a in enumerate(s.activations_per_micro_batch())]
    assert [m.in_flight_micro_batches for m in s.memories()] == [4.0, 4.0]


def test_pipedream_async_stashes_a_weight_version_per_extra_micro_batch_in_flight():
    """PipeDream's asynchronous 1F1B keeps one weight version per micro-batch in flight beyond the first (Harlap et
    al. 2018 §3.3): stage i holds min(m, p - i) - 1 extra copies of its bf16 weights (2 B per parameter)."""
    from dataclasses import replace

    from cost_models.inputs import Knobs, Layout
    from cost_models.stage import stage_model

    p = _search_problem(nodes=1)
    layout = Layout(dp=2, tp=1, pp=4, num_micro_batches=8, schedule="1f1b")
    flush = stage_model(p.cm_model, p.cm_training, p.hardware, layout, Knobs())
    stale = stage_model(p.cm_model, p.cm_training, p.hardware, replace(layout, schedule="pipedream_async"), Knobs())
    for i, (a, b) in enumerate(zip(flush.memories(), stale.memories(), strict=True)):
        assert b.weights_bytes == pytest.approx(a.weights_bytes + (4 - i - 1) * a.params * 2, rel=1e-12)
        assert b.in_flight_micro_batches == a.in_flight_micro_batches == 4 - i


def test_fp8_weight_copies_expert_optimizer_shards_and_offload_over_cp():
    """Model states per stage beyond plain ZeRO: FP8 weight copies (n x the layer's FP8 bytes, sharded over dp·cp
    only under ZeRO-3); routed experts' optimizer state sharded over EDP = dp·cp·tp / (ep·etp) instead of dp·cp
    (Mixtral, ep 4 of dp 8: EDP 2, 12 B / 2 = 6 B instead of 12 B / 8); the offload bucket over dp·cp."""
    from cost_models.inputs import Knobs, Layout
    from cost_models.stage import stage_model
    from planner.inputs.specs import TrainingSpec
    from planner.problem import Problem

    def sm(problem, layout):
        return stage_model(problem.cm_model, problem.cm_training, problem.hardware, layout, Knobs())

    p8 = _search_problem(nodes=4)
    p8 = Problem(p8.model, TrainingSpec(global_batch_size=64, seq_length=4096, precision="fp8",
                                        fp8_recipe="delayed"), p8.cluster, p8.knobs)
    for zero, shards in ((1, 1), (3, 8)):
        s = sm(p8, Layout(dp=4, cp=2, tp=1, pp=2, zero_stage=zero, num_micro_batches=8) if zero == 1 else
               Layout(dp=4, cp=2, tp=1, pp=1, zero_stage=zero, num_micro_batches=8))
        fp8 = s.lc.extras.fp8_weight_bytes
        assert fp8 > 0
        for i, m in enumerate(s.memories()):
            per_param = 2 / (8 if zero == 3 else 1)
            assert m.weights_bytes == pytest.approx(m.params * per_param + s.split[i] * fp8 / shards, rel=1e-12)
    moe = _search_problem("mixtral-8x7b", nodes=1)
    s = sm(moe, Layout(dp=8, tp=1, pp=1, ep=4, zero_stage=1, num_micro_batches=8))
    (m,) = s.memories()
    assert s.lc.extras.expert_params > 0
    assert m.optimizer_bytes == pytest.approx(m.params * 12 / 8 + 32 * s.lc.extras.expert_params * (12 / 2 - 12 / 8),
                                              rel=1e-12)
    off = sm(_search_problem(nodes=4), Layout(dp=8, cp=2, tp=1, pp=2, zero_stage=1, offload="optimizer",
                                              num_micro_batches=8))
    buffers = off.lc.extras.transient_bytes + off.lc.mlp_grad_bytes  # CP receive buffers, the MLP's gradients
    assert [m.transient_bytes for m in off.memories()] == [buffers + min(P / 16, 5e8) * 4
                                                           for P in off.params_per_stage()]


# ---- planner/decisions/train.py: time, cost and energy to train, by hand from the module docstring's formulas ----


def _run(**kw):
    from planner.decisions.train import Power, StepTimeBand, training_run

    args = {"tokens": 1e9, "global_batch_size": 8, "seq_length": 1024, "step_seconds": 2.0, "num_gpus": 64,
            "power": Power(400.0, "A100 datasheet"), "price_per_gpu_hour": 1.5, "pue": 1.2,
            "band": StepTimeBand(0.9, 1.25, "test band")}
    return training_run(**{**args, **kw})


def test_training_run_quantities_by_hand():
    """1e9 tokens at 8 x 1,024 tokens per step: ceil(122,070.3) = 122,071 steps; 2 s each = 244,142 s = 2.8257 days;
    64 GPUs: 4,340.30 GPU-hours, 6,510.45 at 1.5 per GPU-hour; 64 x 400 W x 244,142 s / 3.6e6 = 1,736.12 kWh, x PUE
    1.2 = 2,083.35 kWh (hand arithmetic)."""
    from planner.decisions.train import LEFT_OUT, NO_BAND, Power

    r = _run()
    assert (r.tokens_per_step, r.steps, r.step_seconds, r.num_gpus) == (8192, 122_071, 2.0, 64)
    want = {"wall_clock_seconds": 244_142.0, "wall_clock_days": 244_142.0 / 86_400, "gpu_hours": 64 * 244_142 / 3600,
            "cost": 64 * 244_142 / 3600 * 1.5, "gpu_energy_kwh": 64 * 400 * 244_142 / 3.6e6,
            "facility_energy_kwh": 64 * 400 * 244_142 / 3.6e6 * 1.2}
    assert r.quantities() == pytest.approx(want, rel=1e-12)
    assert r.bounds() == {k: (pytest.approx(v * 0.9, rel=1e-12), pytest.approx(v * 1.25, rel=1e-12))
                          for k, v in want.items()}
    assert r.band.half_width == pytest.approx(0.175, rel=1e-12)  # (1.25 - 0.9) / 2
    doc = r.as_json()
    assert doc["wall_clock_seconds"] == {"value": 244_142.0, "low": pytest.approx(244_142 * 0.9),
                                         "high": pytest.approx(244_142 * 1.25)}
    assert {k: doc[k] for k in ("tokens", "tokens_per_step", "steps", "step_time_seconds", "num_gpus",
                                "price_per_gpu_hour", "gpu_board_power_watts", "gpu_board_power_source", "pue",
                                "energy_left_out", "error_band", "error_band_note")} == {
        "tokens": 1e9, "tokens_per_step": 8192, "steps": 122_071, "step_time_seconds": 2.0, "num_gpus": 64,
        "price_per_gpu_hour": 1.5, "gpu_board_power_watts": 400.0, "gpu_board_power_source": "A100 datasheet",
        "pue": 1.2, "energy_left_out": ["CPUs and host memory", "NICs, switches and storage"],
        "error_band": {"lower_factor": 0.9, "upper_factor": 1.25, "source": "test band"}, "error_band_note": "test band"}
    assert len(doc) == 18  # 5 counts, 6 quantities, 7 inputs and notes
    bare = _run(power=Power(None, "no power"), price_per_gpu_hour=None, pue=None, band=None)
    assert (bare.cost, bare.gpu_energy_kwh, bare.facility_energy_kwh) == (None, None, None)
    assert bare.bounds() == dict.fromkeys(want)
    assert bare.as_json()["energy_left_out"] == list(LEFT_OUT) and bare.as_json()["error_band"] is None
    assert bare.as_json()["cost"] == {"value": None, "low": None, "high": None}
    assert bare.band_note == NO_BAND == ("no error band available for this prediction: the figures are point "
                                         "estimates")
    assert _run(pue=None).facility_energy_kwh is None and _run(pue=None).gpu_energy_kwh == pytest.approx(
        want["gpu_energy_kwh"])
    assert _run(band_note="given").band_note == "given"
    assert _run(tokens=8192.0).steps == 1 and _run(tokens=8193.0).steps == 2  # ceil, not floor or round


def test_step_time_band_bounds():
    from planner.decisions.train import StepTimeBand

    assert StepTimeBand(1.0, 1.0, "point").half_width == 0.0  # lower == upper is allowed
    assert StepTimeBand(1e-9, 1e9, "wide").upper_factor == 1e9
    for lo, hi in ((0.0, 1.0), (-1.0, 1.0), (1.2, 1.1), (0.5, float("inf"))):
        with pytest.raises(ValueError, match=rf"^band: lower {lo}, upper {hi} -> need 0 < lower <= upper < inf$"):
            StepTimeBand(lo, hi, "bad")


def test_gpu_power_and_for_problem():
    """The catalog's board power (NVIDIA H100 datasheet: 700 W); a GPU without one says so by name or file."""
    from types import SimpleNamespace

    from planner.decisions.train import Power, for_problem, gpu_power

    p = _search_problem(nodes=2)
    assert gpu_power(p.cluster) == Power(700.0, 'NVIDIA H100 datasheet, SXM "max TDP up to 700 W (configurable)" [S]')

    def cluster(name, watts=None, source=""):
        gpu = SimpleNamespace(name=name, board_power_watts=watts, board_power_source=source)
        return SimpleNamespace(gpu="gpu.yaml", gpu_spec=lambda: gpu, num_gpus=16)

    assert gpu_power(cluster("X1")) == Power(None, "no board power for X1 in the catalog: energy not estimated")
    assert gpu_power(cluster("")).source == "no board power for gpu.yaml in the catalog: energy not estimated"
    assert gpu_power(cluster("X1", 300.0)) == Power(300.0, "cluster file")
    fake = SimpleNamespace(training=SimpleNamespace(global_batch_size=4, seq_length=100),
                           cluster=cluster("X1", 300.0, "sheet"))
    r = for_problem(fake, 3.0, tokens=1000.0, price_per_gpu_hour=2.0, pue=1.5)
    assert (r.tokens, r.tokens_per_step, r.steps, r.step_seconds, r.num_gpus) == (1000.0, 400, 3, 3.0, 16)
    assert (r.price_per_gpu_hour, r.pue, r.power, r.band) == (2.0, 1.5, Power(300.0, "sheet"), None)
    from planner.decisions.train import StepTimeBand

    band = StepTimeBand(0.9, 1.1, "b")
    assert for_problem(fake, 3.0, tokens=1000.0, band=band).band is band


@pytest.mark.parametrize("tokens, price, pue, problems", [
    (1.0, 0.0, 1.0, []), (1e17, 1e4, 5.0, []), (None, None, None, []),
    (0.5, None, None, ["--tokens: 0.5 -> must be a number of tokens between 1 and 1e17"]),
    (1.1e17, None, None, ["--tokens: 1.1e+17 -> must be a number of tokens between 1 and 1e17"]),
    (float("nan"), None, None, ["--tokens: nan -> must be a number of tokens between 1 and 1e17"]),
    (1e9, -0.01, None, ["--gpu-hour-price: -0.01 -> must be between 0 and 10000 per GPU-hour"]),
    (1e9, 10000.5, None, ["--gpu-hour-price: 10000.5 -> must be between 0 and 10000 per GPU-hour"]),
    (1e9, float("inf"), None, ["--gpu-hour-price: inf -> must be between 0 and 10000 per GPU-hour"]),
    (1e9, None, 0.99, ["--pue: 0.99 -> must be between 1.0 and 5.0 (facility energy / IT energy)"]),
    (1e9, None, 5.01, ["--pue: 5.01 -> must be between 1.0 and 5.0 (facility energy / IT energy)"]),
    (1e9, None, float("nan"), ["--pue: nan -> must be between 1.0 and 5.0 (facility energy / IT energy)"]),
    (None, 2.0, None, ["--gpu-hour-price/--pue: need --tokens (the token budget to train)"]),
    (None, None, 1.1, ["--gpu-hour-price/--pue: need --tokens (the token budget to train)"]),
    (0.0, -1.0, 9.0, ["--tokens: 0.0 -> must be a number of tokens between 1 and 1e17",
                      "--gpu-hour-price: -1.0 -> must be between 0 and 10000 per GPU-hour",
                      "--pue: 9.0 -> must be between 1.0 and 5.0 (facility energy / IT energy)"]),
])
def test_check_run_options_lists_every_bad_option(tokens, price, pue, problems):
    from cluster_specs import SpecError
    from planner.decisions.train import check_run_options

    if not problems:
        assert check_run_options(tokens, price, pue) is None
        return
    with pytest.raises(SpecError) as exc:
        check_run_options(tokens, price, pue)
    assert exc.value.problems == problems


def test_energy_days_and_wrap_formats():
    from planner.decisions.train import _days, _energy, wrap

    assert [_energy(x) for x in (999.0, 1000.0, 12_345.0, 1e6, 2.5e6, 3.0e9)] == [
        "999 kWh", "1 MWh", "12.3 MWh", "1 GWh", "2.5 GWh", "3e+03 GWh"]
    assert [_days(x) for x in (1.0, 0.5, 1234.56)] == ["1.0 days", "12.0 hours", "1,234.6 days"]
    assert wrap("note", "") == ["  note"]
    assert wrap("label", "a " * 40) == ["  label       " + "a " * 32 + "a", "              " + "a " * 6 + "a"]
    assert wrap("x", "one-two three", width=21) == ["  x           one-two", "              three"]
    assert wrap("x", "aaaa-bbbb cc", width=22) == ["  x           aaaa-bbb", "              b cc"]  # no break at "-"


def test_training_run_lines():
    """Every line of the terminal block, from the numbers of test_training_run_quantities_by_hand: 2.83 days (band
    x0.9 = 2.54, x1.25 = 3.53), 4,340 GPU-hours (3,906 - 5,425), cost 6,510 (5,859 - 8,138), 1.74 MWh (1.56 - 2.17),
    facility 2.08 MWh."""
    from planner.decisions.train import Power, render_lines

    assert render_lines(_run()) == [
        "Training 1.00B tokens: 122,071 steps of 8,192 tokens, 64 GPUs",
        "  wall clock  2.8 days (band 2.5 days - 3.5 days)",
        "  GPU-hours   4,340 (band 3,906 - 5,425)",
        "  cost        6,510 at 1.5 per GPU-hour (band 5,859 - 8,138)",
        "  GPU energy  1.74 MWh (band 1.56 MWh - 2.17 MWh), an upper bound: 400 W per GPU",
        "              (A100 datasheet)",
        "  facility    2.08 MWh with PUE 1.2 (the GPUs' share)",
        "  left out    CPUs and host memory; NICs, switches and storage",
        "  band        step time x0.90 to x1.25 (test band)"]
    assert render_lines(_run(power=Power(None, "no board power for X1"), price_per_gpu_hour=None, pue=None,
                             band=None)) == [
        "Training 1.00B tokens: 122,071 steps of 8,192 tokens, 64 GPUs",
        "  wall clock  2.8 days",
        "  GPU-hours   4,340",
        "  energy      no board power for X1",
        "  note        no error band available for this prediction: the figures are point",
        "              estimates"]
    assert render_lines(_run(pue=None, band=None))[4:] == [
        "  GPU energy  1.74 MWh, an upper bound: 400 W per GPU (A100 datasheet)",
        "  left out    CPUs and host memory; NICs, switches and storage; cooling and",
        "              power delivery (PUE)",
        "  note        no error band available for this prediction: the figures are point",
        "              estimates"]


# ---- planner/decisions/waste.py: the wasted share and what would help, with the planner's plan() faked ----------


def _est(step=2.0, bubble=0.0, tp=0.0, dp=0.0, p2p=0.0, rate=1000.0, mfu=0.4):
    from types import SimpleNamespace

    t = SimpleNamespace(pipeline_bubble_seconds=bubble, tp_comm_seconds=tp, dp_comm_seconds=dp, pp_p2p_seconds=p2p,
                        cp_comm_seconds=0.0, ep_comm_seconds=0.0)
    return SimpleNamespace(step_seconds=step, time=t, tokens_per_second=rate, mfu=mfu)


def _pick(est, text="tp1 pp1 dp8"):
    from types import SimpleNamespace

    return SimpleNamespace(estimate=est, layout=SimpleNamespace(short=lambda: text), step_seconds=est.step_seconds)


class _PlanByShape:
    """plan() faked: the pick for a problem by (nodes, global batch); a missing key is infeasible."""

    def __init__(self, picks):
        self.picks, self.seen, self.problems = picks, [], []

    def __call__(self, problem, opts):
        from types import SimpleNamespace

        from planner.errors import InfeasibleError

        key = (problem.cluster.num_nodes, problem.training.global_batch_size)
        self.seen.append((key, opts.use_solver, opts.progress))
        self.problems.append(problem)
        if key not in self.picks:
            raise InfeasibleError(f"nothing fits {key}")
        return SimpleNamespace(pick=self.picks[key])


def test_waste_utilisation_of_a_wasteful_pick(monkeypatch):
    """A pick whose 2 s step holds 0.5 s bubble, 0.2 s TP, 0.1 s DP and 0.06 s p2p exposed: 43% wasted (>= 30%). Half
    the nodes reach 90% of its 1,000 tokens/s on 50% of the GPUs (GPU-hours x0.5/0.9 = -44%), a quarter 30% on 25%
    (x0.25/0.3 = -17%); batch x2 reaches 1,500 tokens/s, batch x4 does not fit (hand arithmetic)."""
    from types import SimpleNamespace

    import planner.search as search
    from planner.decisions import waste
    from planner.search import PlanOptions

    p = _search_problem(nodes=8)
    fake = _PlanByShape({(4, 64): _pick(_est(rate=900.0, mfu=0.36), "tp2 dp16"),
                         (2, 64): _pick(_est(rate=300.0, mfu=0.12), "tp4 dp4"),
                         (8, 128): _pick(_est(bubble=0.1, tp=0.1, rate=1500.0, mfu=0.6), "tp1 dp64")})
    monkeypatch.setattr(search, "plan", fake)
    result = SimpleNamespace(pick=_pick(_est(bubble=0.5, tp=0.2, dp=0.1, p2p=0.06)))
    doc = waste.utilisation(p, result, PlanOptions(use_solver=True, progress=True))
    assert doc["parts"] == pytest.approx({"pipeline_bubble": 0.25, "tp_comm_exposed": 0.1, "dp_comm_exposed": 0.05,
                                          "pp_p2p_exposed": 0.03, "cp_comm_exposed": 0.0, "ep_comm_exposed": 0.0},
                                         rel=1e-12)
    assert doc["wasted_share"] == pytest.approx(0.43) and doc["wasteful"] is True and doc["threshold"] == 0.30
    assert doc["fewer_gpus"] == [
        {"nodes": 4, "num_gpus": 32, "tokens_per_second": 900.0, "mfu": 0.36, "relative_throughput": 0.9,
         "gpu_hours_change": pytest.approx(0.5 / 0.9 - 1), "layout_text": "tp2 dp16"},
        {"nodes": 2, "num_gpus": 16, "tokens_per_second": 300.0, "mfu": 0.12, "relative_throughput": 0.3,
         "gpu_hours_change": pytest.approx(0.25 / 0.3 - 1), "layout_text": "tp4 dp4"}]
    assert doc["larger_batches"] == [
        {"global_batch_size": 128, "tokens_per_second": 1500.0, "mfu": 0.6, "wasted_share": pytest.approx(0.1),
         "layout_text": "tp1 dp64", "relative_throughput": 1.5}]
    assert doc["min_gpus_command"] == ("planner plan -c dgx-h100 -n 8 -m llama3-8b -b 64 -s 4096 --objective min-gpus "
                                       "--target-tokens-per-second 900")
    assert doc["scaling_command"] == ("planner scaling -c dgx-h100 -n 8 -m llama3-8b -b 64 -s 4096 "
                                      "--batch-sizes 64,128,256")
    # the smaller and larger plans run without the solver or a progress bar; batch x4 (256) does not fit: skipped
    assert fake.seen == [((4, 64), False, False), ((2, 64), False, False), ((8, 128), False, False),
                         ((8, 256), False, False)]
    assert all(q.model is p.model and q.knobs is p.knobs for q in fake.problems)
    assert all(q.training is p.training for q in fake.problems[:2]) and fake.problems[2].cluster == p.cluster
    assert waste.render_lines(doc, p) == [
        "",
        "The pick wastes the cluster: 43% of each step is pipeline bubble (25%) or",
        "exposed communication (18%), at least 30%. What would help:",
        "  4 nodes     90% of the tokens/s on 50% of the GPUs (MFU 36.0%; GPU-hours to",
        "              train -44%)",
        "  2 nodes     30% of the tokens/s on 25% of the GPUs (MFU 12.0%; GPU-hours to",
        "              train -17%)",
        "  min-gpus    the fewest nodes for 90% of the tokens/s:",
        "    planner plan -c dgx-h100 -n 8 -m llama3-8b -b 64 -s 4096 \\",
        "        --objective min-gpus --target-tokens-per-second 900",
        "  batch x2    128 sequences: 1.50K tokens/s (+50%), MFU 60.0%, 10% wasted",
        "              a larger batch changes the optimisation (fewer updates per token):",
        "              check it with your training recipe",
        "  curve       tokens/s, MFU and days over node counts and batch sizes:",
        "    planner scaling -c dgx-h100 -n 8 -m llama3-8b -b 64 -s 4096 \\",
        "        --batch-sizes 64,128,256"]


def test_waste_stops_at_the_first_infeasible_smaller_cluster_and_skips_infeasible_batches(monkeypatch):
    from types import SimpleNamespace

    import planner.search as search
    from planner.decisions import waste
    from planner.search import PlanOptions

    pick = SimpleNamespace(pick=_pick(_est(bubble=0.6)))  # exactly 30% wasted: wasteful (>=)
    fake = _PlanByShape({(2, 64): _pick(_est()), (8, 256): _pick(_est(rate=2000.0))})  # 4 nodes and batch x2 fail
    monkeypatch.setattr(search, "plan", fake)
    p = _search_problem(nodes=8)
    assert waste.fewer_gpus(p, pick, PlanOptions()) == []  # 4 nodes infeasible: 2 nodes not tried
    assert [b["global_batch_size"] for b in waste.larger_batches(p, pick, PlanOptions())] == [256]
    assert [k for k, *_ in fake.seen] == [(4, 64), (8, 128), (8, 256)]
    three = _search_problem(nodes=3)
    fake.picks[(1, 64)] = _pick(_est())
    assert [f["nodes"] for f in waste.fewer_gpus(three, pick, PlanOptions())] == [1]  # 3 // 4 = 0 nodes: stop
    assert waste.fewer_gpus(_search_problem(nodes=1), pick, PlanOptions()) == []
    doc = waste.utilisation(p, pick, PlanOptions())
    assert doc["wasteful"] is True and doc["wasted_share"] == pytest.approx(0.3)
    assert doc["larger_batches"][0]["relative_throughput"] == 2.0
    lines = waste.render_lines({**doc, "larger_batches": []}, p)
    assert not any("a larger batch" in line for line in lines) and lines[-3].startswith("  curve")
    calm = SimpleNamespace(pick=_pick(_est(bubble=0.5, tp=0.09)))  # 29.5%: not wasteful, nothing planned
    fake.seen.clear()
    assert waste.utilisation(p, calm, PlanOptions()) == {
        "wasted_share": pytest.approx(0.295), "parts": pytest.approx({"pipeline_bubble": 0.25, "tp_comm_exposed": 0.045,
                                                                      "dp_comm_exposed": 0.0, "pp_p2p_exposed": 0.0,
                                                                      "cp_comm_exposed": 0.0, "ep_comm_exposed": 0.0}),
        "threshold": 0.3, "wasteful": False, "fewer_gpus": [], "min_gpus_command": None, "larger_batches": [],
        "scaling_command": None}
    assert fake.seen == [] and waste.render_lines(waste.utilisation(p, calm, PlanOptions()), p) == []


# ---- planner/refine/ilp.py: the solver choice, its silence, and every status it reports ----------------------


def test_ilp_solver_is_highs_when_available_else_cbc_silent_with_the_time_limit(monkeypatch, recwarn):
    """HiGHS (highspy is a dependency) unless pulp lists no available HiGHS; CBC otherwise, its pulp 3.3
    DeprecationWarning silenced; both without messages and with the caller's time limit."""
    import warnings

    import pulp

    from planner.refine import ilp

    backend, name = ilp._solver(7.0)
    assert name == "HiGHS" and isinstance(backend, pulp.HiGHS) and backend.msg is False and backend.timeLimit == 7.0
    listed = {True: ["PULP_CBC_CMD"], False: ["PULP_CBC_CMD", "HiGHS"]}  # HiGHS known to pulp but not installed
    monkeypatch.setattr(pulp, "listSolvers", lambda onlyAvailable=False: listed[bool(onlyAvailable)])
    warnings.simplefilter("always")
    backend, name = ilp._solver(3.0)
    assert name == "CBC" and isinstance(backend, pulp.PULP_CBC_CMD) and backend.msg is False and backend.timeLimit == 3.0
    assert not [w for w in recwarn if w.category is DeprecationWarning]


def _ilp_stages():
    # two stages: 4 layers of 1 s each, the first with 1.5 s extra; memory is no constraint
    return [StageCoefficients(1.0, 0.5, 1.5, 1.0, 1.0, 0.5, 0.0, 100.0),
            StageCoefficients(1.0, 0.5, 0.0, 1.0, 1.0, 0.5, 0.0, 100.0)]


def test_ilp_cbc_by_name_and_the_time_limit_reach_the_backend(monkeypatch, recwarn):
    import warnings

    import pulp

    from planner.refine import ilp

    warnings.simplefilter("always")
    res = ilp.solve_stage_recompute(_ilp_stages(), 4, solver="CBC", time_limit_seconds=5.0)
    assert (res.solver, res.status, res.optimal) == ("CBC", "optimal", True)
    assert res.layers_per_stage == [1, 3] and res.recompute_layers_per_stage == [0, 0] and res.makespan_seconds == 3.0
    assert not [w for w in recwarn if w.category is DeprecationWarning]
    seen = []
    real = ilp._solver

    def spy(limit):
        seen.append(limit)
        return real(limit)

    monkeypatch.setattr(ilp, "_solver", spy)
    res = ilp.solve_stage_recompute(_ilp_stages(), 4, time_limit_seconds=5.0)
    assert seen == [5.0] and res.solver == "HiGHS" and res.layers_per_stage == [1, 3]
    ilp.solve_stage_recompute(_ilp_stages(), 4)
    assert seen == [5.0, 10.0]  # the default limit: 10 s
    assert isinstance(pulp.HiGHS, type)


class _FakeBackend:
    """A pulp solver stand-in: sets the solution status (and the variables' values) as a real one would."""

    def __init__(self, sol_status, status=1, values=None, error=None):
        self.sol_status, self.status, self.values, self.error = sol_status, status, values or {}, error

    def actualSolve(self, prob, **kw):
        if self.error:
            raise self.error
        for v in prob.variables():
            v.varValue = self.values.get(v.name, 0.0)
        prob.sol_status = self.sol_status
        prob.status = self.status
        return self.status


@pytest.mark.parametrize("backend, want", [
    (_FakeBackend(0, 0), ("no solution (No Solution Found)", False, None, None, None)),
    (_FakeBackend(-1, -1), ("infeasible", False, None, None, None)),
    (_FakeBackend(-2, -2), ("infeasible", False, None, None, None)),  # unbounded cannot happen: reported as infeasible
    (_FakeBackend(0, -1), ("infeasible", False, None, None, None)),  # the problem status says infeasible
    (_FakeBackend(2, 1, {"n_0": 1.2, "n_1": 2.8, "r_0": 0.0, "r_1": 1.0}), ("feasible", False, [1, 3], [0, 1], 3.5)),
    (_FakeBackend(1, 1, {"n_0": 2.0, "n_1": 2.0, "r_0": 0.0, "r_1": 0.0}), ("optimal", True, [2, 2], [0, 0], 3.5)),
    (_FakeBackend(1, 1, error=RuntimeError("solver crashed")), ("error: solver crashed", False, None, None, None)),
])
def test_ilp_reports_each_solution_status(monkeypatch, backend, want):
    """Optimality is read from the solution status (a time-limited incumbent is "feasible", not optimal); counts are
    the rounded variables; the makespan is recomputed from them: max(2 x 1 + 1.5, 2 x 1) = 3.5,
    max(1 + 1.5, 3 + 0.5) = 3.5 (hand arithmetic); a crash is reported, not raised."""
    from planner.refine import ilp

    monkeypatch.setattr(ilp, "_solver", lambda limit: (backend, "Fake"))
    res = ilp.solve_stage_recompute(_ilp_stages(), 4)
    assert (res.status, res.optimal, res.layers_per_stage, res.recompute_layers_per_stage,
            res.makespan_seconds) == want
    assert res.solver == "Fake" and 0 <= res.seconds < 60


def test_ilp_quiet_stdout_hides_fd_1_and_restores_it(capfd):
    import os

    from planner.refine.ilp import _quiet_stdout

    print("before", flush=True)
    with _quiet_stdout():
        os.write(1, b"fd-level")  # where HiGHS writes its banner
    os.write(1, b" after")
    print(" end", flush=True)
    assert capfd.readouterr().out == "before\n after end\n"


# ---- planner/decisions/sensitivity.py: perturbations, verdicts, ties and the report ------------------------------


def test_sensitivity_perturbations_change_exactly_their_input():
    """DGX H100 (8 x 400 Gbit/s NICs, NVLink 450 GB/s, matmul efficiency 0.803, end-to-end 0.8 by default)."""
    from planner.decisions import sensitivity as s
    from planner.decisions.train import StepTimeBand

    p = _search_problem(nodes=2)
    net = s._net(p, 0.5)
    assert net.cluster.inter_node.nic_gbit_per_s == 200.0 and net.cluster.intra_node == p.cluster.intra_node
    assert (net.model, net.training, net.knobs) == (p.model, p.training, p.knobs)
    assert s._net(p, 2.0).cluster.inter_node.nic_gbit_per_s == 800.0
    assert s._net(_search_problem(nodes=1), 0.5) is None  # one node: no network
    no_nic = p.cluster.model_copy(update={"inter_node": p.cluster.inter_node.model_copy(update={"nics_per_node": 0})})
    assert s._net(s._with(p, cluster=no_nic), 0.5) is None
    intra = s._intra(p, 0.5)
    assert intra.cluster.intra_node.gb_per_s == 225.0 and intra.cluster.inter_node == p.cluster.inter_node
    assert s._intra(s._with(p, cluster=p.cluster.model_copy(update={"gpus_per_node": 1})), 0.5) is None
    assert s._intra(s._with(p, cluster=p.cluster.model_copy(update={"gpus_per_node": 2})), 0.5) is not None
    assert s._matmul(p, 0.9).cluster.gpu_spec().matmul_efficiency == pytest.approx(0.803 * 0.9, rel=1e-12)
    assert s._matmul(p, 1.1).cluster.gpu_spec().matmul_efficiency == pytest.approx(0.803 * 1.1, rel=1e-12)
    assert s._matmul(p, 2.0).cluster.gpu_spec().matmul_efficiency == 1.0  # capped at 1
    e2e = p.knobs.end_to_end_efficiency
    assert s._compute(p, 1.25).knobs.end_to_end_efficiency == pytest.approx(e2e / 1.25, rel=1e-12)
    assert e2e / 0.5 > 1 and s._compute(p, 0.5).knobs.end_to_end_efficiency == 1.0  # capped at 1
    assert s._compute(p, 1.25).cluster is p.cluster
    assert s._one_node_fewer(p).cluster.num_nodes == 1 and s._one_node_fewer(_search_problem(nodes=1)) is None
    assert s._with(p).cluster is p.cluster and s._with(p).knobs is p.knobs
    names = ["inter-node bandwidth x0.5", "inter-node bandwidth x2", "intra-node bandwidth x0.5",
             "matmul efficiency +10%", "matmul efficiency -10%", "one node fewer"]
    assert [sc.name for sc in s.scenarios(None)] == names
    banded = s.scenarios(StepTimeBand(0.8, 1.3, "b"))
    assert [sc.name for sc in banded] == [*names[:5], "error band top (compute x1.30 slower)",
                                          "error band bottom (compute x0.80)", names[5]]
    made = [sc.make(p) for sc in banded]
    assert [m.cluster.inter_node.nic_gbit_per_s for m in made[:2]] == [200.0, 800.0]
    assert made[2].cluster.intra_node.gb_per_s == 225.0
    assert [m.cluster.gpu_spec().matmul_efficiency for m in made[3:5]] == pytest.approx([0.803 * 1.1, 0.803 * 0.9])
    assert [m.knobs.end_to_end_efficiency for m in made[5:7]] == pytest.approx([e2e / 1.3, 1.0])
    assert made[7].cluster.num_nodes == 1


def test_sensitivity_original_pick_under_a_perturbed_problem():
    from planner.decisions import sensitivity as s
    from planner.inputs.specs import LayoutSpec
    from planner.rules import layout_violations

    p = _search_problem(nodes=1)
    ok = LayoutSpec(tp=1, pp=1, dp=8, zero_stage=1, recompute="full", num_micro_batches=8)
    step, why = s._original_under(p, ok, False)
    assert step == p.estimate(ok).step_seconds and why == ""
    assert s._original_under(p, LayoutSpec(tp=1, pp=1, dp=16), False) == (
        None, "the pick needs 16 GPUs; this cluster has 8")
    big = _search_problem(nodes=2)
    across = LayoutSpec(tp=16, pp=1, dp=1, zero_stage=0, num_micro_batches=64)
    assert s._original_under(big, across, False) == (
        None, str(layout_violations(across, big.model, big.training, big.cluster)[0]))
    assert s._original_under(big, across, True) == (big.estimate(across).step_seconds, "")  # TP across nodes allowed
    assert s._original_under(p, LayoutSpec(tp=1, pp=1, dp=8, zero_stage=0, num_micro_batches=8), False) == (
        None, "the pick no longer fits in memory")  # 8B x 18 B of states on one 80 GB GPU
    from dataclasses import replace

    margin = replace(p, knobs=replace(p.knobs, memory_high_fraction=100.0))  # the perturbed plan's own fit rule
    assert s._original_under(margin, ok, False) == (
        None, "the pick no longer fits in memory at the memory band's high end")


def test_sensitivity_verdicts(monkeypatch):
    """kept: the same layout and micro-batch; tie: another layout whose regret (the pick's step under the
    perturbation / the new best's - 1) is within the tie tolerance; changes otherwise, or when the pick cannot run."""
    from types import SimpleNamespace

    import planner.search as search
    from planner.decisions import sensitivity as s
    from planner.errors import InfeasibleError
    from planner.search import PlanOptions

    pick = _fake_candidate({"dp": 8}, step=1.0)
    other = _fake_candidate({"dp": 4, "tp": 2}, step=1.0)
    seen = []

    def fake_plan(problem, opts):
        seen.append(opts.progress)
        if problem == "none fits":
            raise InfeasibleError("nothing fits\nsecond line")
        return SimpleNamespace(pick=problem)

    monkeypatch.setattr(search, "plan", fake_plan)
    under = []

    def fake_under(problem, layout, allow):
        under.append((problem, layout))
        return (1.05, "") if allow else (None, "why")

    monkeypatch.setattr(s, "_original_under", fake_under)
    opts = PlanOptions(progress=True, allow_tp_across_nodes=True)
    na = s.run_scenario(s.Scenario("x", lambda p: None), "p", pick, opts, 0.02)
    assert (na.name, na.verdict, na.new_pick, na.note) == ("x", "not applicable", None,
                                                           "the cluster has no such link or node to remove")
    inf = s.run_scenario(s.Scenario("y", lambda p: "none fits"), "p", pick, opts, 0.02)
    assert (inf.name, inf.verdict, inf.note, inf.new_pick) == ("y", "infeasible", "nothing fits", None)
    same = _fake_candidate({"dp": 8}, step=1.04)
    kept = s.run_scenario(s.Scenario("k", lambda p: same if p == "p" else None), "p", pick, opts, 0.02)
    assert (kept.name, kept.verdict, kept.new_pick, kept.original_step_seconds, kept.new_step_seconds) == (
        "k", "kept", same, 1.05, 1.04)
    assert under == [(same, pick.layout)]  # the original pick, in the perturbed problem
    tie = s.run_scenario(s.Scenario("t", lambda p: _fake_candidate({"dp": 4, "tp": 2}, step=1.03)), "p", pick, opts,
                         0.02)
    assert tie.verdict == "tie" and tie.regret == pytest.approx(1.05 / 1.03 - 1)  # 1.9% <= 2%
    edge = s.run_scenario(s.Scenario("e", lambda p: _fake_candidate({"dp": 4, "tp": 2}, step=1.05)), "p", pick, opts,
                          0.0)
    assert edge.verdict == "tie" and edge.regret == 0.0  # regret exactly at the tolerance: a tie
    changes = s.run_scenario(s.Scenario("c", lambda p: _fake_candidate({"dp": 4, "tp": 2}, step=1.02)), "p", pick,
                             opts, 0.02)
    assert changes.verdict == "changes" and changes.regret == pytest.approx(1.05 / 1.02 - 1)  # 2.9%
    gone = s.run_scenario(s.Scenario("g", lambda p: other), "p", pick, PlanOptions(), 0.02)
    assert (gone.verdict, gone.note, gone.regret) == ("changes", "why", None)  # the pick cannot run: no regret
    assert set(seen) == {False}  # planned without a progress bar
    assert s.identity(_fake_candidate({"dp": 8, "micro_batch_size": 2}).layout) != s.identity(pick.layout)
    assert s.shape(_fake_candidate({"dp": 8, "micro_batch_size": 2}).layout) == s.shape(pick.layout)
    assert s.Outcome("o", "kept", None, 2.0, 1.6).regret == pytest.approx(0.25)
    assert s.Outcome("o", "kept", None, None, 1.6).regret is None and s.Outcome("o", "kept", None, 2.0).regret is None


def _sensitivity_fixture():
    from types import SimpleNamespace

    from planner.decisions import sensitivity as s
    from planner.decisions.ranking import RankingBand

    pick = _fake_candidate({"dp": 8, "zero_stage": 1}, step=1.0)
    c1 = _fake_candidate({"tp": 2, "dp": 4, "zero_stage": 1}, step=1.01)
    c1b = _fake_candidate({"tp": 2, "dp": 4, "zero_stage": 1, "micro_batch_size": 2}, step=1.015)  # c1's shape
    c2 = _fake_candidate({"dp": 8}, step=1.018)  # ZeRO-0: simpler than the pick
    c3 = _fake_candidate({"pp": 2, "dp": 4}, step=1.05)
    result = SimpleNamespace(pick=pick, ranked=[pick, c1, c1b, c2, c3])
    ranking = RankingBand(0.02, 0.015, 1721, "vTrain")
    outcomes = [s.Outcome("inter-node bandwidth x0.5", "kept", pick, 1.1, 1.1),
                s.Outcome("intra-node bandwidth x0.5", "changes", c3, 1.3, 1.2),
                s.Outcome("one node fewer", "changes", c1, None, 1.25, "the pick needs 16 GPUs; this cluster has 8"),
                s.Outcome("error band top (compute x1.30 slower) and a very long name", "not applicable",
                          note="the cluster has no such link or node to remove"),
                s.Outcome("matmul efficiency -10%", "tie", c2, 0.99, 1.0),
                s.Outcome("inter-node bandwidth x2", "infeasible", note="nothing fits: a very long explanation of why "
                          "nothing fits that goes on past eighty columns of text")]
    return result, ranking, outcomes, (pick, c1, c2, c3)


def test_sensitivity_ties_short_list_and_recommendation(monkeypatch):
    """Tied: the pick and the distinct shapes within 2% (c1 at +1.0%, c2 at +1.8%; c1's micro-batch-2 twin is the same
    shape; c3 at +5%). Recommended: the simplest within 1.5% (the pick: c2 is simpler but +1.8%); within 2%, c2."""
    from planner.decisions import sensitivity as s
    from planner.search import PlanOptions

    result, ranking, outcomes, (pick, c1, c2, c3) = _sensitivity_fixture()
    assert s.tied_layouts(result, 0.02) == [pick, c1, c2]
    assert s.tied_layouts(result, 0.01) == [pick, c1]  # 1.01 <= 1.01: inclusive
    assert s.tied_layouts(result, 0.0) == [pick]
    assert s.recommend([pick, c1, c2], 0.015) is pick and s.recommend([pick, c1, c2], 0.018) is c2
    assert s.recommend([c1, c3], 0.0) is c1 and s.recommend([c1, c3], 0.04) is c3  # c3 (ZeRO-0) is 4.0% slower
    equal = _fake_candidate({"dp": 8}, step=1.001)
    assert s.recommend([pick, c2, equal], 0.02) is equal  # equally simple: the faster
    calls = []

    def fake_run(sc, problem, p, opts, tie):
        calls.append((sc.name, problem, p, tie, opts))
        return outcomes[0]

    monkeypatch.setattr(s, "run_scenario", fake_run)
    many = [_fake_candidate({"tp": 2, "dp": 4, "pp": 1, "zero_stage": 1, "recompute": r}, step=1.0 + i / 1000)
            for i, r in enumerate(("selective", "full"))]
    many += [_fake_candidate({"dp": 8, "zero_stage": z}, step=1.003 + z / 1000) for z in (2, 3)]
    many += [_fake_candidate({"dp": 8, "zero_stage": 1, "offload": "optimizer"}, step=1.0)]
    result.ranked = [pick, *many, c2]
    popts = PlanOptions()
    sens = s.sensitivity("prob", result, popts, None, ranking)
    assert [c[0] for c in calls] == [sc.name for sc in s.scenarios(None)] and {c[3] for c in calls} == {0.02}
    assert all(c[1] == "prob" and c[2] is pick and c[4] is popts for c in calls)
    from planner.decisions.train import StepTimeBand

    calls.clear()
    s.sensitivity("prob", result, popts, StepTimeBand(0.8, 1.3, "b"), ranking)
    assert len(calls) == 8 and calls[5][0] == "error band top (compute x1.30 slower)"
    assert sens.tied == [pick, *many, c2] and sens.short_list == [pick, *many[:4]] and sens.tie_tolerance == 0.02
    assert sens.recommended is pick  # c2 (ZeRO-0) is not on the short list of 5
    assert sens.outcomes == [outcomes[0]] * 6 and sens.ranking is ranking


def test_sensitivity_document_and_lines():
    from planner.decisions import sensitivity as s

    result, ranking, outcomes, (pick, c1, c2, c3) = _sensitivity_fixture()
    sens = s.Sensitivity(ranking, outcomes, [pick, c1, c2], pick)
    doc = s.as_json(sens, pick)
    assert doc["scenarios"][1] == {
        "perturbation": "intra-node bandwidth x0.5", "verdict": "changes", "new_pick": c3.layout.model_dump(mode="json"),
        "new_pick_text": "tp=1,pp=2,dp=4,zero=0,mbs=1,recompute=none,schedule=1f1b", "new_step_time_seconds": 1.2,
        "original_step_time_seconds": 1.3, "step_time_change": pytest.approx(0.2), "regret": pytest.approx(1.3 / 1.2 - 1),
        "note": ""}
    assert doc["scenarios"][3]["new_pick"] is None and doc["scenarios"][3]["step_time_change"] is None
    assert {k: v for k, v in doc.items() if k != "scenarios"} == {
        "tie_tolerance": 0.02, "tie_source": "the ranking error of two layouts' predicted step times: 80% of 1,721 "
        "pairs of layouts within 2.0% (vTrain)", "recommend_within": 0.015,
        "tied": [{"layout_text": "tp=1,pp=1,dp=8,zero=1,mbs=1,recompute=none", "step_time_seconds": 1.0,
                  "step_time_vs_pick": 0.0},
                 {"layout_text": "tp=2,pp=1,dp=4,zero=1,mbs=1,recompute=none", "step_time_seconds": 1.01,
                  "step_time_vs_pick": pytest.approx(0.01)},
                 {"layout_text": "tp=1,pp=1,dp=8,zero=0,mbs=1,recompute=none", "step_time_seconds": 1.018,
                  "step_time_vs_pick": pytest.approx(0.018)}],
        "recommended": "tp=1,pp=1,dp=8,zero=1,mbs=1,recompute=none", "recommended_step_time_vs_pick": 0.0,
        "short_list": ["tp=1,pp=1,dp=8,zero=1,mbs=1,recompute=none", "tp=2,pp=1,dp=4,zero=1,mbs=1,recompute=none",
                       "tp=1,pp=1,dp=8,zero=0,mbs=1,recompute=none"], "short_list_size": 3}
    assert s.render_lines(doc, "planner plan -m x") == [
        "",
        "Sensitivity: the plan made again under each perturbed input",
        "tie tolerance 2.0%: the ranking error of two layouts' predicted step times: 80%",
        "of 1,721 pairs of layouts within 2.0% (vTrain)",
        "  perturbation                             best step  pick        regret",
        "  inter-node bandwidth x0.5                   +10.0%  kept         +0.0%",
        "  intra-node bandwidth x0.5                   +20.0%  changes      +8.3%",
        "    -> tp=1,pp=2,dp=4,zero=0,mbs=1,recompute=none,schedule=1f1b",
        "  one node fewer                              +25.0%  changes          -",
        "    -> tp=2,pp=1,dp=4,zero=1,mbs=1,recompute=none",
        "    the pick needs 16 GPUs; this cluster has 8",
        "  error band top (compute x1.30 slower) a          -  not applicable       -",
        "    the cluster has no such link or node to remove",
        "  matmul efficiency -10%                       +0.0%  tie          +0.0%",
        "    -> tp=1,pp=1,dp=8,zero=0,mbs=1,recompute=none",
        "  inter-node bandwidth x2                          -  infeasible       -",
        "    nothing fits: a very long explanation of why nothing fits that goes on past",
        "    eighty columns of text",
        "best step: the new best's step time against the pick's today; regret: the pick's",
        "step time under the perturbation against the new best's.",
        "",
        "Tie: 3 layouts lie within 2.0% of the pick's step time: the model cannot order",
        "them. The short list (3 fastest):",
        "   +0.0%  tp=1,pp=1,dp=8,zero=1,mbs=1,recompute=none",
        "   +1.0%  tp=2,pp=1,dp=4,zero=1,mbs=1,recompute=none",
        "   +1.8%  tp=1,pp=1,dp=8,zero=0,mbs=1,recompute=none",
        "Recommended: the pick (no simpler layout of the short list is within 1.5% of",
        "it).",
        "Measure the short list (3 layouts) before launching:",
        "  planner plan -m x -o plan.json",
        "  planner bench plan.json --top 3"]
    other = s.as_json(s.Sensitivity(ranking, [], [pick, c1, c2], c2), pick)
    assert s._tie_lines(other, "cmd")[5:8] == [
        "Recommended, the simplest of the short list within 1.5% of the pick (+1.8% step",
        "time):", "  tp=1,pp=1,dp=8,zero=0,mbs=1,recompute=none"]
    alone = s.as_json(s.Sensitivity(ranking, [], [pick], pick), pick)
    assert s._tie_lines(alone, "cmd") == ["No other layout lies within 2.0% of the pick's step time."]
    kept_note = s.as_json(s.Sensitivity(ranking, [s.Outcome("k", "kept", pick, 1.0, 1.0, "a note")], [pick], pick),
                          pick)
    assert s._scenario_lines(kept_note)[1:] == ["  k                                            +0.0%  kept         +0.0%"]


_ILP_CASES = {  # found by a brute-force search for instances where one coefficient's misuse changes the optimum
    "recompute 0.5 s of a 2 s layer": ([(2.0, 0.5, 0.0, 1.0, 3.0, 0.5, 0.0, 14.0), (2.0, 0.5, 8.0, 1.0, 2.0, 0.5, 0.0, 6.0)],
                                       6),
    "a stage that would rather hold no layer": ([(0.5, 0.5, 0.0, 1.0, 3.0, 0.5, 0.0, 10.0),
                                                 (0.5, 1.5, 1.5, 1.0, 2.0, 0.5, 0.0, 10.0),
                                                 (0.5, 0.2, 0.0, 1.0, 2.0, 0.5, 0.0, 6.0)], 4),
    "2 s layers, three stages": ([(2.0, 0.5, 0.0, 1.0, 2.0, 0.5, 0.0, 14.0), (2.0, 0.5, 1.5, 1.0, 3.0, 0.5, 0.0, 8.0),
                                  (2.0, 1.5, 1.5, 1.0, 3.0, 0.5, 0.0, 10.0)], 6),
    "the same in tenths of a second": ([(0.2, 0.05, 0.0, 1.0, 2.0, 0.5, 0.0, 14.0),
                                        (0.2, 0.05, 0.15, 1.0, 3.0, 0.5, 0.0, 8.0),
                                        (0.2, 0.15, 0.15, 1.0, 3.0, 0.5, 0.0, 10.0)], 6),
    # microseconds: the objective's T / (largest layer seconds) keeps the 1e-6-per-layer recompute tie-break far
    # below one layer's time; unscaled, a recomputed layer would weigh as much as a whole layer's seconds
    "the same in microseconds": ([(2e-6, 0.5e-6, 0.0, 1.0, 2.0, 0.5, 0.0, 14.0),
                                  (2e-6, 0.5e-6, 1.5e-6, 1.0, 3.0, 0.5, 0.0, 8.0),
                                  (2e-6, 1.5e-6, 1.5e-6, 1.0, 3.0, 0.5, 0.0, 10.0)], 6),
}


@pytest.mark.parametrize("case", list(_ILP_CASES))
def test_ilp_matches_enumeration_where_coefficients_matter(case):
    """Layer seconds other than 1 (so n x layer_seconds and r x recompute_seconds cannot be swapped for a division),
    a stage whose best count would be 0 (every stage holds >= 1 layer), a makespan below 1 s: the ILP's makespan and
    total recomputation equal the enumeration's (`_brute_ilp`)."""
    rows, L = _ILP_CASES[case]
    stages = [StageCoefficients(*row) for row in rows]
    want = _brute_ilp(stages, L)
    res = solve_stage_recompute(stages, L)
    assert res.status == "optimal" and min(res.layers_per_stage) >= 1
    assert res.makespan_seconds == pytest.approx(want[0][0], rel=1e-9, abs=0)
    assert sum(res.recompute_layers_per_stage) == want[0][1]


def test_ilp_cbc_gets_no_messages_and_the_time_limit(monkeypatch):
    import pulp

    from planner.refine import ilp

    made = []

    class Spy(pulp.PULP_CBC_CMD):
        def __init__(self, **kw):
            made.append(kw)
            super().__init__(**kw)

    monkeypatch.setattr(pulp, "PULP_CBC_CMD", Spy)
    res = ilp.solve_stage_recompute(_ilp_stages(), 4, solver="CBC", time_limit_seconds=4.0)
    assert made == [{"msg": False, "timeLimit": 4.0}] and res.solver == "CBC"


# ---- planner/search.py: plan()'s refinement loop and ranking, with the search and the refinements faked ----------


def _plan_fixture(monkeypatch, found, found_offload=(), least=(5.0, 3.0)):
    """Fake search (returns `found`, then `found_offload` when offload is searched), refinements and explanations:
    the log records every call in order."""
    import planner.search as search

    log = []

    def fake_search(problem, opts, stats, *, offload):
        log.append(("search", offload, stats))
        return (list(found_offload) if offload else list(found)), least[offload]

    def fake_split(problem, cand):
        log.append(("split", cand.step_seconds))
        return splits.get(cand.step_seconds)

    def fake_ilp(problem, cand, opts, stats):
        log.append(("ilp", cand.step_seconds, opts, stats))
        return ilps.get(cand.step_seconds)

    splits, ilps = {}, {}
    monkeypatch.setattr(search, "search", fake_search)
    monkeypatch.setattr(search, "refine_split", fake_split)
    monkeypatch.setattr(search, "refine_ilp", fake_ilp)
    monkeypatch.setattr(search, "reason", lambda problem, c, pick=None: f"{c.step_seconds} vs {pick.step_seconds}")
    monkeypatch.setattr(search, "decide", lambda problem, ranked, pick: ("decision", tuple(ranked), pick))
    return log, splits, ilps


def test_plan_refines_the_best_few_then_ranks_everything(monkeypatch):
    """Sorted by step time: the first max(solver_candidates, 1) go to the exact split; the ILP takes candidates in
    order, skipping no-recompute, unpipelined and already-seen (tp, pp, dp, zero, mbs) ones, until it has seen
    solver_candidates; refinements the options refuse are dropped; the pick is the fastest of all, the runners-up
    distinct from it and each other (top_k), each explained against the pick."""
    import planner.search as search
    from planner.search import PlanOptions

    def cand(step, origin="search", **lay):
        return _fake_candidate({"dp": 8, "num_micro_batches": 8, **lay}, step=step, origin=origin)

    f = {1.0: cand(1.0, pp=2, dp=4, recompute="selective"),
         1.1: cand(1.1, recompute="full"),  # pp 1: no ILP
         1.2: cand(1.2, pp=2, dp=4),  # no recompute: no ILP
         1.25: cand(1.25, pp=2, dp=4, recompute="selective", schedule="zero_bubble"),  # the 1.0 one's key: seen
         1.3: cand(1.3, pp=4, dp=2, recompute="full"),
         1.4: cand(1.4, pp=8, dp=1, recompute="full")}
    log, splits, ilps = _plan_fixture(monkeypatch, [f[k] for k in (1.3, 1.0, 1.4, 1.2, 1.1, 1.25)])
    splits[1.0] = cand(0.95, "split", pp=2, dp=4, recompute="selective", layers_per_stage=(17, 15))
    ilps[1.0] = cand(0.9, "ilp", tp=2, pp=2, dp=2, recompute="selective")  # refused below
    ilps[1.3] = cand(0.97, "ilp", pp=4, dp=2, recompute="selective")

    class NoTp2:
        def adjust(self, fields):
            return None if fields["tp"] == 2 else fields

    opts = PlanOptions(solver_candidates=2, top_k=2, restriction=NoTp2())
    res = search.plan(_search_problem(), opts)
    stats = log[0][2]
    assert [e[:2] for e in log] == [("search", False), ("split", 1.0), ("split", 1.1), ("ilp", 1.0), ("ilp", 1.3)]
    assert all(e[2] is opts and e[3] is stats for e in log[3:]) and res.stats is stats
    assert [c.step_seconds for c in res.ranked] == [0.95, 0.97, 1.0, 1.1, 1.2, 1.25, 1.3, 1.4]
    assert res.pick is splits[1.0] and res.alternatives == [ilps[1.3], f[1.1]]  # f[1.0]: the pick's shape
    assert res.reasons == {id(res.pick): "0.95 vs 0.95", id(ilps[1.3]): "0.97 vs 0.95", id(f[1.1]): "1.1 vs 0.95"}
    assert res.decision == ("decision", tuple(res.ranked), res.pick) and res.compared == []
    assert 0 <= stats.search_seconds <= stats.total_seconds < 60

    log.clear()
    res = search.plan(_search_problem(), PlanOptions(solver_candidates=0, use_solver=True, top_k=1))
    assert [e[:2] for e in log] == [("search", False), ("split", 1.0), ("ilp", 1.0)]  # at least one of each
    assert res.pick is ilps[1.0] and res.alternatives == [splits[1.0]]  # tp 2 allowed now; top_k 1
    log.clear()
    res = search.plan(_search_problem(), PlanOptions(use_solver=False))
    assert [e[:2] for e in log] == [("search", False), ("split", 1.0), ("split", 1.1), ("split", 1.2)]
    assert len(res.alternatives) == 5 and res.pick is splits[1.0]  # default top_k 5 of 6 distinct runners-up
    log.clear()
    assert search.plan(_search_problem()).pick is ilps[1.0]  # default options: the solver runs, 3 candidates
    assert [e[:2] for e in log] == [("search", False), ("split", 1.0), ("split", 1.1), ("split", 1.2), ("ilp", 1.0),
                                    ("ilp", 1.3), ("ilp", 1.4)]


def test_plan_memory_objective_and_offload_fallback(monkeypatch):
    import planner.search as search
    from planner.search import PlanOptions

    small = _fake_candidate({"dp": 8}, step=1.2, peak_gib=20.0)
    fast = _fake_candidate({"dp": 8, "zero_stage": 1}, step=1.0, peak_gib=60.0)
    log, _, _ = _plan_fixture(monkeypatch, [], [fast, small])
    res = search.plan(_search_problem(), PlanOptions(objective="memory", use_solver=False))
    assert [e[:2] for e in log] == [("search", False), ("search", True), ("split", 1.2), ("split", 1.0)]
    assert log[0][2] is log[1][2]  # one SearchStats for both searches
    assert res.pick is small and res.ranked == [small, fast]


def test_plan_infeasible_passes_the_least_peak_of_both_searches(monkeypatch):
    import planner.search as search
    from planner.errors import InfeasibleError
    from planner.search import PlanOptions

    seen = []

    def fake_infeasible(problem, least, opts):
        seen.append((least, opts))
        return InfeasibleError(f"least {least}")

    _plan_fixture(monkeypatch, [], [], least=(5.0, 3.0))
    monkeypatch.setattr(search, "infeasible", fake_infeasible)
    opts = PlanOptions()
    with pytest.raises(InfeasibleError, match=r"^least 3.0$"):
        search.plan(_search_problem(), opts)
    _plan_fixture(monkeypatch, [], [], least=(2.0, 3.0))
    monkeypatch.setattr(search, "infeasible", fake_infeasible)
    with pytest.raises(InfeasibleError, match=r"^least 2.0$"):
        search.plan(_search_problem(), opts)
    assert seen == [(3.0, opts), (2.0, opts)]


def test_fits_one_card_estimates_the_plainest_one_gpu_layout():
    """One GPU, no parallelism, full recompute, micro-batch 1: GPT-3 1.3B fits an 80 GB H100 (1.3B x 18 B of states
    = 24 GB), Llama 3 8B does not (8B x 18 B = 145 GB)."""
    from types import SimpleNamespace

    from planner.inputs.specs import LayoutSpec
    from planner.search import _fits_one_card

    seen = []
    p = _search_problem()
    fake = SimpleNamespace(estimate=lambda lay: seen.append(lay) or p.estimate(lay), knobs=p.knobs)
    assert _fits_one_card(fake) is False
    assert seen == [LayoutSpec(tp=1, pp=1, dp=1, zero_stage=0, offload="none", micro_batch_size=1, num_micro_batches=1,
                               recompute="full", sequence_parallel=False, schedule="1f1b", virtual_stages=1)]
    assert _fits_one_card(_search_problem("gpt3-1.3b", seq=2048)) is True


# ---- planner/decisions/compare.py: entries, rankings, document and lines, with plan_all faked ---------------------


@pytest.mark.parametrize("text, problems", [
    ("x", ["--clusters: 'x' -> expected CLUSTER:NODES[@PRICE], NODES an integer 1..1000000"]),
    (":4", ["--clusters: ':4' -> expected CLUSTER:NODES[@PRICE], NODES an integer 1..1000000"]),
    ("a:0,a:1000001", ["--clusters: 'a:0' -> expected CLUSTER:NODES[@PRICE], NODES an integer 1..1000000",
                       "--clusters: 'a:1000001' -> expected CLUSTER:NODES[@PRICE], NODES an integer 1..1000000"]),
    ("a:x", ["--clusters: 'a:x' -> expected CLUSTER:NODES[@PRICE], NODES an integer 1..1000000"]),
    ("a:1@abc", ["--clusters: 'a:1@abc' -> expected CLUSTER:NODES[@PRICE], NODES an integer 1..1000000"]),
    ("a:1@-1,b:1@10001,c:1@nan", ["--clusters: 'a:1@-1' -> the price must be between 0 and 10000 per GPU-hour",
                                  "--clusters: 'b:1@10001' -> the price must be between 0 and 10000 per GPU-hour",
                                  "--clusters: 'c:1@nan' -> the price must be between 0 and 10000 per GPU-hour"]),
    (" , ", ["--clusters: ' , ' -> give at least one CLUSTER:NODES"]),
    ("a:1,a:1@2", ["--clusters: 'a:1,a:1@2' -> an entry is repeated"]),
    (",".join(f"c{i}:1" for i in range(17)), ["--clusters: 17 entries -> at most 16"]),
])
def test_parse_clusters_names_each_bad_entry(text, problems):
    from cluster_specs import SpecError
    from planner.decisions.compare import parse_clusters

    with pytest.raises(SpecError) as exc:
        parse_clusters(text)
    assert exc.value.problems == problems


def test_parse_clusters_accepts_the_bounds():
    from planner.decisions.compare import ClusterChoice, parse_clusters

    assert parse_clusters("a:1000000@0, ,host:b:1@10000,c:2", 1.5) == [
        ClusterChoice("a", 1_000_000, 0.0), ClusterChoice("host:b", 1, 10000.0), ClusterChoice("c", 2, 1.5)]
    assert len(parse_clusters(",".join(f"c{i}:1" for i in range(16)))) == 16
    assert parse_clusters("c:2")[0].price_per_gpu_hour is None and parse_clusters("c:2")[0].label == "c:2"


def _entries():
    """A feasible DGX H100 entry (8 GPUs at 2 s per 64 x 4,096-token step: 1e12 tokens in ceil(3,814,697.3) =
    3,814,698 steps = 88.3 days, 16,954.2 GPU-hours = 0.016954 per million tokens, 0.033908 at 2.0 per GPU-hour,
    8 x 700 W: 0.011868 kWh per million tokens) and an infeasible DGX A100 one."""
    from types import SimpleNamespace

    from planner.decisions.compare import ClusterChoice, Entry
    from planner.decisions.train import for_problem

    h100 = _search_problem(nodes=1)
    est = SimpleNamespace(tokens_per_second_per_gpu=16384.0, mfu=0.42)
    pick = SimpleNamespace(estimate=est, layout=SimpleNamespace(short=lambda: "tp=1,pp=1,dp=8"))
    ok = Entry(ClusterChoice("dgx-h100", 1, 2.0), h100, SimpleNamespace(pick=pick, memory_margin_relaxed=False),
               for_problem(h100, 2.0, tokens=1e12, price_per_gpu_hour=2.0), None)
    a100 = _search_problem(nodes=1, cluster="dgx-a100-80gb")
    bad = Entry(ClusterChoice("dgx-a100-80gb", 1), a100, None, None, "nothing fits\nsecond line")
    return ok, bad


def test_compare_entries_per_million_tokens_and_lines():
    from planner.decisions.compare import Comparison, render_lines

    ok, bad = _entries()
    assert ok.per_million_tokens() == pytest.approx({"gpu_hours": 0.016954213333, "cost": 0.033908426667,
                                                     "gpu_energy_kwh": 0.011867949333}, rel=1e-9)
    assert bad.per_million_tokens() == {"gpu_hours": None, "cost": None, "gpu_energy_kwh": None}
    assert ok.training is ok.run and ok.label == "dgx-h100:1" and ok.feasible and not bad.feasible
    with pytest.raises(ValueError, match=r"^dgx-a100-80gb:1: no layout fits$"):
        bad.training  # noqa: B018
    with pytest.raises(ValueError, match=r"^dgx-a100-80gb:1: no layout fits$"):
        bad.pick  # noqa: B018
    cmp = Comparison([ok, bad], 1e12, False)
    assert cmp.priced is True
    assert render_lines(cmp, "Title") == [
        "Title", "time to train 1.00T tokens (no --tokens: per trillion)", "",
        "cluster                GPUs tok/s/GPU    MFU     days  cost/Mtok  kWh/Mtok",
        "dgx-h100:1                8    16,384  42.0%     88.3     0.0339    0.0119",
        "  tp=1,pp=1,dp=8",
        "dgx-a100-80gb:1           8  no layout fits",
        "  nothing fits",
        "",
        "by time to train: 1. dgx-h100:1",
        "by cost per million tokens: 1. dgx-h100:1",
        "by tokens/s per GPU: 1. dgx-h100:1",
        "  note        no error band available for this prediction: the figures are point",
        "              estimates"]
    unpriced = Comparison([ok, bad], 2e12, True)
    ok.run = ok.run.__class__(**{**ok.run.__dict__, "price_per_gpu_hour": None})
    lines = render_lines(unpriced, "T")
    assert lines[1] == "time to train 2.00T tokens" and lines[3].endswith("GPU-h/Mtok  kWh/Mtok")
    assert lines[4] == "dgx-h100:1                8    16,384  42.0%     88.3      0.017    0.0119"
    assert lines[10] == "by GPU-hours per million tokens (no prices given): 1. dgx-h100:1"


def test_compare_rankings_follow_their_metrics():
    from types import SimpleNamespace

    from planner.decisions.compare import ClusterChoice, Comparison, Entry
    from planner.decisions.train import Power, training_run

    def entry(name, step, per_gpu, price, gpus=8):
        run = training_run(tokens=1e9, global_batch_size=1, seq_length=1000, step_seconds=step, num_gpus=gpus,
                           power=Power(None, "-"), price_per_gpu_hour=price)
        pick = SimpleNamespace(estimate=SimpleNamespace(tokens_per_second_per_gpu=per_gpu))
        return Entry(ClusterChoice(name, 1, price), None, SimpleNamespace(pick=pick, memory_margin_relaxed=False), run,
                     None)

    # a: fastest wall clock; b: most tokens/s per GPU; c: cheapest per million tokens (cost = GPUs x wall x price)
    a, b, c = entry("a", 1.0, 100.0, 4.0, gpus=16), entry("b", 2.0, 300.0, 2.0), entry("c", 3.0, 200.0, 0.5)
    infeasible = Entry(ClusterChoice("x", 1), None, None, None, "no")
    cmp = Comparison([a, b, c, infeasible], 1e9, True)
    assert [e.label for e in cmp.ranking("time_to_train")] == ["a:1", "b:1", "c:1"]
    assert [e.label for e in cmp.ranking("tokens_per_second_per_gpu")] == ["b:1", "c:1", "a:1"]
    assert [e.label for e in cmp.ranking("cost_per_million_tokens")] == ["c:1", "b:1", "a:1"]  # 0.5x3x8, 2x2x8, 4x1x16
    with pytest.raises(ValueError, match="^days$"):
        cmp.ranking("days")
    free = entry("free", 3.0, 1.0, None, gpus=1)  # no price: GPU-hours per million tokens decide, 1 GPU x 3 s
    cmp = Comparison([a, free], 1e9, True)
    assert cmp.priced is False and [e.label for e in cmp.ranking("cost_per_million_tokens")] == ["free:1", "a:1"]


def test_compare_plans_each_cluster_and_keeps_the_infeasible(monkeypatch):
    from types import SimpleNamespace

    import planner.decisions.parallel as parallel
    from planner.decisions.compare import ClusterChoice, compare
    from planner.decisions.train import StepTimeBand
    from planner.search import PlanOptions

    made, seen = [], []
    pick = SimpleNamespace(step_seconds=2.0)

    def make(cluster, nodes):
        made.append((cluster, nodes))
        return _search_problem(nodes=nodes, cluster=cluster)

    def fake_plan_all(problems, opts):
        seen.append(([p.cluster.num_nodes for p in problems], opts))
        return [SimpleNamespace(pick=pick, memory_margin_relaxed=False), "nothing fits"][:len(problems)]

    monkeypatch.setattr(parallel, "plan_all", fake_plan_all)
    band = StepTimeBand(0.9, 1.1, "b")
    opts = PlanOptions()
    choices = [ClusterChoice("dgx-h100", 2, 3.0), ClusterChoice("dgx-a100-80gb", 1)]
    cmp = compare(choices, make, opts, pue=1.3, band_for=lambda problem, p: band if p is pick else None)
    assert made == [("dgx-h100", 2), ("dgx-a100-80gb", 1)] and seen == [([2, 1], opts)]
    assert (cmp.tokens, cmp.tokens_given) == (1e12, False)
    ok, bad = cmp.entries
    assert (ok.choice, ok.result.pick, ok.error) == (choices[0], pick, None)
    run = ok.run
    assert (run.tokens, run.step_seconds, run.price_per_gpu_hour, run.pue, run.band, run.num_gpus) == (
        1e12, 2.0, 3.0, 1.3, band, 16)
    assert (bad.result, bad.run, bad.error, bad.problem.cluster.num_nodes) == (None, None, "nothing fits", 1)
    cmp = compare(choices[:1], make, opts, tokens=5e9)
    assert (cmp.tokens, cmp.tokens_given, cmp.entries[0].run.tokens, cmp.entries[0].run.band) == (5e9, True, 5e9, None)


def test_compare_document_and_report(monkeypatch):
    from planner import SCHEMA_VERSION, __version__
    from planner.decisions import compare as cmp_mod
    from planner.decisions.compare import CompareRequest, Comparison, as_json, compare_report
    from planner.inputs.specs import LayoutSpec
    from planner.search import Candidate

    ok, bad = _entries()
    lay = LayoutSpec(tp=1, pp=1, dp=8, zero_stage=1, num_micro_batches=8)
    real = Candidate(lay, ok.problem.estimate(lay))
    ok.result.pick, ok.result.reasons = real, {id(real): "why"}
    doc = as_json(Comparison([ok, bad], 1e12, False))
    assert {k: v for k, v in doc.items() if k != "clusters"} == {
        "tokens": 1e12, "tokens_given": False, "priced": True,
        "rankings": {"time_to_train": ["dgx-h100:1"], "cost_per_million_tokens": ["dgx-h100:1"],
                     "tokens_per_second_per_gpu": ["dgx-h100:1"]}}
    first, second = doc["clusters"]
    assert {k: first[k] for k in ("cluster", "nodes", "label", "num_gpus", "gpu", "price_per_gpu_hour", "feasible",
                                  "infeasible_reason")} == {
        "cluster": "dgx-h100", "nodes": 1, "label": "dgx-h100:1", "num_gpus": 8, "gpu": ok.problem.hardware.gpu_name,
        "price_per_gpu_hour": 2.0, "feasible": True, "infeasible_reason": None}
    assert first["pick"]["reason"] == "why" and first["pick"]["origin"] == "search"
    assert first["pick"]["layout"]["dp"] == 8 and first["training_run"] == ok.run.as_json()
    assert first["per_million_tokens"] == ok.per_million_tokens()
    assert second == {"cluster": "dgx-a100-80gb", "nodes": 1, "label": "dgx-a100-80gb:1", "num_gpus": 8,
                      "gpu": bad.problem.hardware.gpu_name, "price_per_gpu_hour": None, "feasible": False,
                      "infeasible_reason": "nothing fits\nsecond line", "pick": None, "training_run": None,
                      "per_million_tokens": {"gpu_hours": None, "cost": None, "gpu_energy_kwh": None},
                      "memory_margin_relaxed": False}
    calls = []

    def fake_compare(choices, make, opts, *, tokens=None, pue=None, band_for=None):
        calls.append((choices, opts, tokens, pue, band_for))
        problems = [make(c.cluster, c.nodes) for c in choices]
        assert [p.cluster.num_nodes for p in problems] == [1]
        ok.problem = problems[0]
        return Comparison([ok, bad], tokens or 1e12, tokens is not None)

    monkeypatch.setattr(cmp_mod, "compare", fake_compare)
    req = CompareRequest(clusters="dgx-h100:1", model="llama3-8b", global_batch_size=64, seq_len=4096, tokens=2e9,
                         gpu_hour_price=2.5, pue=1.1, use_solver=False)
    rep = compare_report(req)
    (choices, opts, tokens, pue, band_for), = calls
    assert [c.price_per_gpu_hour for c in choices] == [2.5] and (tokens, pue) == (2e9, 1.1)
    assert opts.use_solver is False and opts.restriction is None
    from planner.decisions.plan_extras import step_time_band

    assert band_for is step_time_band
    assert rep.document["schema_version"] == SCHEMA_VERSION and rep.document["tool_version"] == __version__
    assert rep.document["kind"] == "compare" and rep.document["framework"] is None
    assert rep.document["inputs"]["model"]["name"] == "llama3-8b"
    assert rep.document["inputs"]["training"]["global_batch_size"] == 64
    assert rep.lines[0] == "llama3-8b, batch 64 x 4,096 tokens, on 2 clusters"
    assert rep.document["rankings"] == doc["rankings"]
    rep = compare_report(CompareRequest(clusters="dgx-h100:1", model="llama3-8b", global_batch_size=64, seq_len=4096,
                                        framework="megatron"))
    assert rep.document["framework"] == "megatron" and calls[-1][1].restriction is not None
    assert calls[-1][1].use_solver is True


# ---- planner/decisions/scaling.py: node counts, efficiency, where it stops paying, document and lines ----------


def test_default_node_counts_double_up_to_four_times_the_nodes():
    from planner.decisions.scaling import DEFAULT_POINTS, default_node_counts

    assert DEFAULT_POINTS == 8
    assert default_node_counts(16) == [1, 2, 4, 8, 16, 32, 64]  # 64 >> 7 = 0 is left out
    assert default_node_counts(128) == [4, 8, 16, 32, 64, 128, 256, 512]  # nodes/32 ... nodes*4
    assert default_node_counts(1) == [1, 2, 4]
    assert default_node_counts(16, points=3) == [16, 32, 64]
    assert default_node_counts(3) == [1, 3, 6, 12]  # 12 >> 2 = 3, 12 >> 3 = 1


def _scaling_points(problem_for=None):
    """Llama 3 8B on DGX H100 at batch 64: 1 node infeasible; per-GPU tokens/s 1,000 (2 nodes, the base), 800
    (4: 80%), 690 (8: 69%, below 70%: stops paying), 700 (16: 70% is not below)."""
    from types import SimpleNamespace

    from planner.decisions.scaling import Point
    from planner.inputs.specs import LayoutSpec

    def res(gpus, per_gpu, mfu, tp, pp, dp, bubble):
        est = SimpleNamespace(tokens_per_second=per_gpu * gpus, tokens_per_second_per_gpu=per_gpu, mfu=mfu,
                              step_seconds=1.0, time=SimpleNamespace(pipeline_bubble_seconds=bubble))
        return SimpleNamespace(pick=SimpleNamespace(estimate=est, layout=LayoutSpec(tp=tp, pp=pp, dp=dp)),
                               memory_margin_relaxed=False)

    problem_for = problem_for or (lambda n: None)
    return [Point(1, 8, 64, problem_for(1), None, "nothing fits"),
            Point(2, 16, 64, problem_for(2), res(16, 1000.0, 0.5, 2, 1, 8, 0.1), None),
            Point(4, 32, 64, problem_for(4), res(32, 800.0, 0.4, 2, 2, 8, 0.1), None),
            Point(8, 64, 64, problem_for(8), res(64, 690.0, 0.345, 8, 1, 8, 0.2), None),
            Point(16, 128, 64, problem_for(16), res(128, 700.0, 0.35, 8, 2, 8, 0.2), None)]


def test_scaling_curve_efficiency_and_where_it_stops_paying():
    from planner.decisions.scaling import STOP_EFFICIENCY, Curve, _curve

    assert STOP_EFFICIENCY == 0.70
    pts = _scaling_points()
    curve = _curve(64, pts)
    assert curve.global_batch_size == 64 and curve.points is pts and curve.base is pts[1]
    assert [p.efficiency for p in pts] == [None, 1.0, 0.8, pytest.approx(0.69), pytest.approx(0.7)]
    assert curve.stops_paying is pts[3]
    assert pts[0].label == "1 nodes" and pts[0].tokens_per_second is None and pts[0].per_gpu is None
    assert pts[1].tokens_per_second == 16000.0 and pts[1].per_gpu == 1000.0
    assert Curve(64, [pts[0]]).base is None and Curve(64, [pts[0]]).stops_paying is None
    assert _curve(64, [pts[0]]).points[0].efficiency is None


def test_scaling_curves_plan_every_count_and_batch(monkeypatch):
    from types import SimpleNamespace

    import planner.decisions.parallel as parallel
    from planner.decisions.scaling import scaling_curve, scaling_curves
    from planner.search import PlanOptions

    made, seen = [], []

    def make(nodes, batch):
        made.append((nodes, batch))
        return _search_problem(nodes=nodes, batch=batch)

    def est(per_gpu):
        return SimpleNamespace(pick=SimpleNamespace(estimate=SimpleNamespace(tokens_per_second_per_gpu=per_gpu)),
                               memory_margin_relaxed=False)

    def fake_plan_all(problems, opts):
        seen.append(opts)
        return ["none fits\nsecond line" if p.cluster.num_nodes == 1 else est(1000.0 / p.cluster.num_nodes)
                for p in problems]

    monkeypatch.setattr(parallel, "plan_all", fake_plan_all)
    opts = PlanOptions()
    curves = scaling_curves(make, opts, [4, 1, 2, 2], [64, 128])
    assert made == [(1, 64), (2, 64), (4, 64), (1, 128), (2, 128), (4, 128)] and seen == [opts]
    assert [c.global_batch_size for c in curves] == [64, 128]
    pts = curves[1].points
    assert [(p.nodes, p.num_gpus, p.global_batch_size, p.error) for p in pts] == [
        (1, 8, 128, "none fits"), (2, 16, 128, None), (4, 32, 128, None)]
    assert pts[0].result is None and pts[1].problem.training.global_batch_size == 128
    assert [p.efficiency for p in pts] == [None, 1.0, 0.5]
    one = scaling_curve(make, opts, [2, 4], 64)
    assert [p.nodes for p in one.points] == [2, 4] and one.global_batch_size == 64


def test_scaling_document_and_lines():
    from planner.decisions.scaling import _curve, as_json, point_json, render_lines

    curve = _curve(64, _scaling_points())
    doc = as_json([curve], 1e12, False)
    assert {k: v for k, v in doc.items() if k != "curves"} == {
        "tokens": 1e12, "tokens_given": False, "stop_efficiency": 0.7,
        "efficiency_definition": "tokens/s per GPU relative to the smallest node count that fits, same batch"}
    (c,) = doc["curves"]
    assert (c["global_batch_size"], c["base_nodes"], c["stops_paying_at_nodes"]) == (64, 2, 8)
    assert c["points"][0] == {"nodes": 1, "num_gpus": 8, "global_batch_size": 64, "feasible": False,
                              "infeasible_reason": "nothing fits", "layout": None, "step_time_seconds": None,
                              "tokens_per_second": None, "tokens_per_second_per_gpu": None, "mfu": None,
                              "pipeline_bubble_share": None, "scaling_efficiency": None, "time_to_train_days": None,
                              "memory_margin_relaxed": False}
    p = curve.points[2]
    assert point_json(p, 2e12) == {
        "nodes": 4, "num_gpus": 32, "global_batch_size": 64, "feasible": True, "infeasible_reason": None,
        "layout": p.pick.layout.model_dump(mode="json"), "step_time_seconds": 1.0, "tokens_per_second": 25600.0,
        "tokens_per_second_per_gpu": 800.0, "mfu": 0.4, "pipeline_bubble_share": 0.1, "scaling_efficiency": 0.8,
        "time_to_train_days": pytest.approx(2e12 / 25600 / 86400), "memory_margin_relaxed": False}
    empty = _curve(128, [curve.points[0]])
    assert as_json([empty], 1e9, True)["curves"][0]["base_nodes"] is None
    title = "Scaling: llama3-8b, 4096-token sequences, on dgx-h100 (8 x H100-SXM per node)"
    assert render_lines([curve], 1e12, False, title) == [
        "Scaling: llama3-8b, 4096-token sequences, on dgx-h100 (8 x H100-SXM per node)",
        "days: to train 1.00T tokens (no --tokens: per trillion); eff.: tokens/s per GPU",
        "against the first row that fits",
        "",
        "global batch 64 sequences",
        " nodes    GPUs   tokens/s   /GPU    MFU  eff.     days  tp x pp x dp  bubble",
        "     1       8  no layout fits",
        "     2      16     16.00K  1,000  50.0%  100%    723.4  2x1x8          10.0%",
        "     4      32     25.60K    800  40.0%   80%    452.1  2x2x8          10.0%",
        "     8      64     44.16K    690  34.5%   69%    262.1  8x1x8          20.0% <",
        "    16     128     89.60K    700  35.0%   70%    129.2  8x2x8          20.0%",
        "  stops       < marks where adding GPUs stops paying: at 8 nodes each GPU",
        "              delivers 69% of its tokens/s on 2 nodes (below 70%)"]
    steady = _curve(64, _scaling_points()[1:3])
    lines = render_lines([steady, empty], 2e12, True, "T")
    assert lines[1:3] == ["days: to train 2.00T tokens; eff.: tokens/s per GPU against the first row that", "fits"]
    assert lines[8:] == [
        "  paying      every count keeps scaling efficiency >= 70% of 2 nodes' tokens/s",
        "              per GPU",
        "",
        "global batch 128 sequences",
        " nodes    GPUs   tokens/s   /GPU    MFU  eff.     days  tp x pp x dp  bubble",
        "     1       8  no layout fits",
        "  note        no node count of the sweep fits this model"]


def test_scaling_report_builds_problems_and_the_document(monkeypatch):
    from planner.decisions import scaling as sc
    from planner.decisions.scaling import ScalingRequest, _curve, scaling_report

    calls = []

    def fake_curves(make, opts, counts, batches):
        calls.append((opts, counts, batches))
        return [_curve(b, _scaling_points(lambda n, b=b: make(n, b))) for b in batches]

    monkeypatch.setattr(sc, "scaling_curves", fake_curves)
    rep = scaling_report(ScalingRequest(cluster="dgx-h100", model="llama3-8b", global_batch_size=64, seq_len=4096,
                                        nodes=2, use_solver=False))
    opts, counts, batches = calls[-1]
    assert counts == [1, 2, 4, 8] and batches == [64] and opts.use_solver is False and opts.restriction is None
    doc = rep.document
    assert (doc["kind"], doc["framework"], doc["tokens"], doc["tokens_given"]) == ("scaling", None, 1e12, False)
    assert doc["inputs"]["seq_length"] == 4096 and doc["inputs"]["model"]["name"] == "llama3-8b"
    assert doc["inputs"]["cluster"]["num_nodes"] == 1 and doc["inputs"]["training"]["global_batch_size"] == 64
    gpu = _search_problem().hardware.gpu_name
    assert rep.lines[0] == f"Scaling: llama3-8b, 4096-token sequences, on dgx-h100 (8 x {gpu} per node)"
    scaling_report(ScalingRequest(cluster="dgx-h100", model="llama3-8b", global_batch_size=64, seq_len=4096,
                                  node_counts="2,4", batch_sizes="64,128", tokens=1e9, framework="megatron"))
    opts, counts, batches = calls[-1]
    assert counts == [2, 4] and batches == [64, 128] and opts.use_solver is True and opts.restriction is not None
    from cluster_specs import load_cluster

    scaling_report(ScalingRequest(cluster="dgx-h100", model="llama3-8b", global_batch_size=64, seq_len=4096))
    assert calls[-1][1] == sc.default_node_counts(load_cluster("dgx-h100").num_nodes)


# ---- planner/decisions/ranking.py: the ranking error band, by hand on three groups of signed errors -------------


def _ranking_results():
    from types import SimpleNamespace

    def r(err, source="s", model="m", gpus=8, batch=64, seq=2048, loso=None, gpu="A100-SXM4-80GB"):
        case = SimpleNamespace(source=source, model=SimpleNamespace(name=model), num_gpus=gpus,
                               training=SimpleNamespace(global_batch_size=batch, seq_length=seq),
                               cluster=SimpleNamespace(gpu=gpu))
        return SimpleNamespace(error=err, loso_error=loso, case=case)

    # the last row is the first group's shape on another GPU: a run of another cluster, not a layout of the same plan
    return [r(0.1, loso=0.2), r(-0.1, loso=0.1), r(0.0), r(0.2, model="n"), r(0.2, model="n", loso=-0.1),
            r(0.5, gpus=16), r(None, model="n"), r(0.3, source="t", loso=0.0), r(0.3, batch=128, loso=0.3),
            r(0.3, seq=4096, loso=0.4), r(0.4, gpu="H100-SXM", loso=0.5)]


def test_ranking_error_groups_skip_a_missing_error_and_read_on():
    """A row without an error (here the first) is skipped; the rows after it still form their group."""
    from types import SimpleNamespace

    from planner.decisions.ranking import error_groups

    case = SimpleNamespace(source="s", model=SimpleNamespace(name="m"), num_gpus=8,
                           training=SimpleNamespace(global_batch_size=64, seq_length=2048),
                           cluster=SimpleNamespace(gpu="A100-SXM4-80GB"))
    rows = [SimpleNamespace(error=e, loso_error=e, case=case) for e in (None, 0.1, -0.2)]
    assert error_groups(rows) == [[0.1, -0.2]] and error_groups(rows, loso=True) == [[0.1, -0.2]]


def test_ranking_band_figures_by_hand():
    """Groups [0.1, -0.1, 0.0], [0.2, 0.2] and [0.5]: |ln(1.1/0.9)| = 0.2006707, |ln 1.1| = 0.0953102,
    |ln 0.9| = 0.1053605 and 0; the 80th percentile (position 2.4 of 4) 0.1434846 -> +15.428%; the 20th (position
    0.6) 0.0571861 -> +5.8853% (hand arithmetic)."""
    import math

    from planner.decisions.ranking import (
        BAND_COVERAGE,
        RECOMMEND_MIN_CHANCE,
        _quantile,
        band_figures,
        log_ratio_errors,
    )

    assert (BAND_COVERAGE, RECOMMEND_MIN_CHANCE) == (0.8, 0.4)
    assert _quantile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.5 and _quantile([3.0, 1.0, 2.0, 4.0], 0.0) == 1.0
    assert _quantile([3.0, 1.0, 2.0, 4.0], 1.0) == 4.0 and _quantile([5.0], 0.7) == 5.0
    assert _quantile([1.0, 2.0, 3.0, 4.0], 0.8) == pytest.approx(3.4)
    groups = [[0.1, -0.1, 0.0], [0.2, 0.2], [0.5]]
    assert log_ratio_errors(groups) == pytest.approx([0.2006707, 0.0953102, 0.1053605, 0.0], abs=1e-7)
    got = band_figures(groups)
    assert got == {"pairs": 4, "groups": [3, 2, 1], "tie_tolerance": pytest.approx(math.expm1(0.1434846), abs=1e-7),
                   "recommend_within": pytest.approx(math.expm1(0.0571861), abs=1e-7)}
    with pytest.raises(ValueError, match="^no pair of layouts to measure a ranking error on$"):
        band_figures([[0.1], []])


def test_ranking_error_groups_and_tables(monkeypatch, tmp_path):
    import json
    from pathlib import Path

    import planner.bands as bands
    import planner.fileio as fileio
    import planner.validation_vtrain as vt
    from planner.decisions import ranking

    res = _ranking_results()
    # by (source, model, GPU type and count, batch, sequence); a missing error is left out; single rows are dropped
    assert ranking.error_groups(res) == [[0.1, -0.1, 0.0], [0.2, 0.2]]
    assert ranking.error_groups(res, loso=True) == [[0.2, 0.1]]
    table = ranking.table_from_results(res)
    assert table == {**ranking.band_figures([[0.1, -0.1, 0.0], [0.2, 0.2]]), "coverage": 0.8,
                     "source": f"{vt.VTRAIN_SOURCE}, out of sample",
                     "generated_by": "planner validate --write-tables (make validate), or python -m planner.decisions.ranking"}
    seen = []
    monkeypatch.setattr(bands, "load_table", lambda: {"fitted_knobs": "K"})
    monkeypatch.setattr(vt, "run_vtrain", lambda knobs: seen.append(knobs) or type("R", (), {"results": res})())
    assert ranking.vtrain_table() == table and seen == ["K"]
    # every write goes through a recording stand-in: a mutant that ignores the path given must not overwrite the
    # shipped planner/data/ranking_band.json (it did once under mutmut, failing every later run's clean tests)
    written = []
    monkeypatch.setattr(fileio, "write_atomically", lambda p, text: written.append((p, text)))
    path = ranking.write_table({"b": 1, "a": [1, 2]}, tmp_path / "band.json")
    assert path == tmp_path / "band.json"
    assert written == [(tmp_path / "band.json", '{\n "a": [\n  1,\n  2\n ],\n "b": 1\n}\n')]
    assert ranking.write_table({}) == Path(ranking.__file__).parent.parent / "data" / "ranking_band.json" \
        == written[1][0]
    shipped = json.loads((Path(ranking.__file__).parent.parent / "data" / "ranking_band.json").read_text())
    ranking.ranking_band.cache_clear()
    band = ranking.ranking_band()
    assert band == ranking.RankingBand(shipped["tie_tolerance"], shipped["recommend_within"], shipped["pairs"],
                                       shipped["source"])
    assert band.description == (f"the ranking error of two layouts' predicted step times: 80% of {shipped['pairs']:,} "
                                f"pairs of layouts within {shipped['tie_tolerance']:.1%} ({shipped['source']})")
    assert ranking.RankingBand(0.123, 0.01, 1721, "src").description == (
        "the ranking error of two layouts' predicted step times: 80% of 1,721 pairs of layouts within 12.3% (src)")


# ---- planner/decisions/report.py and parallel.py -----------------------------------------------------------------


def test_decision_report_helpers(tmp_path):
    from cluster_specs import SpecError
    from planner import SCHEMA_VERSION, __version__
    from planner.decisions.report import Planned, check_figure, framework_restriction, header, parse_counts
    from planner.frameworks.restriction import build_restriction
    from planner.inputs.models import load_model

    assert check_figure(None) is None and check_figure(tmp_path / "a.svg") is None
    with pytest.raises(SpecError, match="the file name must end in .png or .svg"):
        check_figure(tmp_path / "a.txt")
    assert header("scaling") == {"schema_version": SCHEMA_VERSION, "tool_version": __version__, "kind": "scaling"}
    assert framework_restriction(None, "llama3-8b") is None
    got = framework_restriction("megatron", "llama3-8b")
    assert got == build_restriction("megatron", load_model("llama3-8b").vocab_size)
    assert parse_counts(None, "--x") is None and parse_counts("64, 128,,256", "--x") == [64, 128, 256]
    assert parse_counts("1000000", "--x") == [1_000_000] and parse_counts(",".join(["1"] * 32), "--x") == [1] * 32
    assert parse_counts("100000000", "--b", 10**8) == [10**8]
    for text, msg in (("a,1", "--x: 'a,1' -> comma-separated integers"),
                      ("", "--x: '' -> 1 to 32 integers, each between 1 and 1,000,000"),
                      ("0", "--x: '0' -> 1 to 32 integers, each between 1 and 1,000,000"),
                      ("1000001", "--x: '1000001' -> 1 to 32 integers, each between 1 and 1,000,000"),
                      (",".join(["1"] * 33), f"--x: {','.join(['1'] * 33)!r} -> 1 to 32 integers, each between 1 and "
                                             "1,000,000")):
        with pytest.raises(SpecError) as exc:
            parse_counts(text, "--x")
        assert exc.value.problems == [msg]
    with pytest.raises(SpecError) as exc:
        parse_counts("11", "--y", 10)
    assert exc.value.problems == ["--y: '11' -> 1 to 32 integers, each between 1 and 10"]

    class Named(Planned):
        label = "here"

        def __init__(self, result):
            self.result = result

    from types import SimpleNamespace

    assert Named(SimpleNamespace(pick="p")).feasible is True and Named(SimpleNamespace(pick="p")).pick == "p"
    with pytest.raises(ValueError, match="^here: no layout fits$"):
        Named(None).pick  # noqa: B018
    assert Named(None).feasible is False
    with pytest.raises(NotImplementedError):
        Planned().label  # noqa: B018


def test_parallel_workers_for(monkeypatch):
    import os

    from planner.decisions import parallel

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    monkeypatch.setattr(parallel, "_single_threaded", lambda: True)
    monkeypatch.delenv("PLANNER_WORKERS", raising=False)
    assert [parallel.workers_for(j) for j in (0, 1, 3, 9)] == [1, 1, 3, 5]
    for env, want in (("2", 2), (" 3 ", 3), ("0", 5), ("x", 5), ("-2", 5), ("", 5)):
        monkeypatch.setenv("PLANNER_WORKERS", env)
        assert parallel.workers_for(9) == want, env
    monkeypatch.setattr(parallel, "_single_threaded", lambda: False)
    assert parallel.workers_for(9) == 1
    monkeypatch.undo()
    monkeypatch.setattr(os, "listdir", lambda path: ["1"] if path == "/proc/self/task" else [])
    assert parallel._single_threaded() is True
    monkeypatch.setattr(os, "listdir", lambda path: ["1", "2"] if path == "/proc/self/task" else [])
    assert parallel._single_threaded() is False

    def no_proc(path):
        raise OSError("no /proc")

    monkeypatch.setattr(os, "listdir", no_proc)
    assert parallel._single_threaded() is False


def test_parallel_plan_one_pack_and_plan_all(monkeypatch):
    from dataclasses import replace
    from types import SimpleNamespace

    import planner.search as search
    from planner.decisions import parallel
    from planner.errors import InfeasibleError
    from planner.search import PlanOptions, PlanResult

    a, b, c, d = (_fake_candidate({"dp": 8}, step=s) for s in (1.0, 1.1, 1.2, 1.3))
    full = PlanResult(a, [b], [a, b, c], "decision", {id(a): "ra", id(b): "rb", id(d): "rd"}, SimpleNamespace(),
                      [d])
    seen = []

    def fake_plan(problem, opts):
        seen.append((problem, opts))
        if problem == "bad":
            raise InfeasibleError("nothing fits")
        return replace(full) if problem == "ok" else full

    def fake_within_margin(problem, opts):  # plan_one plans as `plan` does, under the problem's memory margin
        return problem, fake_plan(problem, opts)

    monkeypatch.setattr(search, "plan_within_memory_margin", fake_within_margin)
    opts = PlanOptions(progress=True, top_k=2)
    assert parallel.plan_one("bad", opts) == "nothing fits"
    assert seen[-1][1] == replace(opts, progress=False)
    packed, reasons = parallel._packed("ok", opts)
    assert packed.ranked == [a, b] and packed.reasons == {} and packed.compared == [d] and packed.pick is a
    assert reasons == [(0, "ra"), (1, "rb"), (2, "rd")]
    assert parallel._packed("bad", opts) == ("nothing fits", [])
    back = parallel._unpacked(packed, reasons)
    assert back.reasons == {id(a): "ra", id(b): "rb", id(d): "rd"}
    assert parallel._unpacked("why", []) == "why"
    monkeypatch.setenv("PLANNER_WORKERS", "1")
    seen.clear()
    assert parallel.plan_all(["ok", "bad"], opts)[1] == "nothing fits" and [s[0] for s in seen] == ["ok", "bad"]
    monkeypatch.setenv("PLANNER_WORKERS", "2")
    monkeypatch.setattr(parallel, "_single_threaded", lambda: True)
    got = parallel.plan_all(["ok", "bad"], opts)  # two forked workers, each with the fake plan
    assert got[1] == "nothing fits" and [c.step_seconds for c in got[0].ranked] == [1.0, 1.1]
    assert sorted(got[0].reasons.values()) == ["ra", "rb", "rd"] and got[0].reasons[id(got[0].pick)] == "ra"


# ---- planner/decisions/plan_extras.py: what `plan` adds, each section wired to its source ------------------------


def test_plan_extras_check_and_step_time_band(monkeypatch):
    import sys
    from types import SimpleNamespace

    import planner.bands as bands
    import planner.explain.figures as figures
    from cluster_specs import SpecError
    from planner.decisions.plan_extras import PlanExtras, step_time_band
    from planner.decisions.train import StepTimeBand

    with pytest.raises(SpecError) as exc:
        PlanExtras(price_per_gpu_hour=2.0).check()
    assert exc.value.problems == ["--gpu-hour-price/--pue: need --tokens (the token budget to train)"]
    with pytest.raises(SpecError):
        PlanExtras(tokens=1e9, pue=9.0).check()
    asked = []
    monkeypatch.setattr(figures, "require_matplotlib", lambda: asked.append(1))
    assert PlanExtras(tokens=1e9, pue=1.2).check() is None and asked == []
    PlanExtras(figures="out").check()
    assert asked == [1]
    p = _search_problem(nodes=2)
    pick = SimpleNamespace(estimate=SimpleNamespace(step_seconds=2.0, peak_memory_bytes=5e10))
    calls = []

    def fake_band(**kw):
        calls.append(kw)
        return bands.Band(2.0, 1.6, 2.5, 5e10, 6e10, "hopper", kw.get("rows", 12))

    monkeypatch.setattr(bands, "prediction_band", fake_band)
    monkeypatch.setattr(bands, "band_level", lambda: 0.85)
    got = step_time_band(p, pick, "megatron")
    assert got == StepTimeBand(0.8, 1.25, "central 85% of leave-one-source-out errors (about 80% of held-out runs "
                                          "inside), regime hopper, 12 published runs")
    assert calls == [{"framework": "megatron", "gpu_name": p.hardware.gpu_name, "num_gpus": 16, "step_seconds": 2.0,
                      "peak_memory_bytes": 5e10}]
    monkeypatch.setattr(bands, "prediction_band", lambda **kw: bands.Band(2.0, 1.6, 2.5, 5e10, 6e10, "all", 0))
    assert step_time_band(p, pick) is None  # a regime without rows: no band
    monkeypatch.setitem(sys.modules, "planner.bands", None)
    assert step_time_band(p, pick) is None  # the error-band table is not installed


def test_plan_extras_extend_adds_each_requested_section(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import planner.contract as contract
    import planner.decisions.sensitivity as sens
    import planner.decisions.train as train
    import planner.decisions.waste as waste
    import planner.explain.figures as figures
    from planner.decisions import plan_extras
    from planner.decisions.plan_extras import PlanExtras, extend
    from planner.search import PlanOptions

    log = []

    class Model:
        def __init__(self, name):
            self.name = name

        def model_validate(self, data):
            log.append((self.name, data))
            return SimpleNamespace(model_dump=lambda: {"validated": data})

    for name in ("Utilisation", "TrainingRun", "SensitivityReport"):
        monkeypatch.setattr(contract, name, Model(name))
    calls = []  # what each stand-in was handed: the plan's own problem, result, options, pick and estimate
    monkeypatch.setattr(waste, "utilisation",
                        lambda problem, result, opts: calls.append(("utilisation", problem, result, opts))
                        or {"waste": opts.top_k})
    monkeypatch.setattr(waste, "render_lines", lambda doc, problem: calls.append(("waste lines", problem))
                        or [f"waste {doc}"])
    band = object()
    monkeypatch.setattr(plan_extras, "step_time_band",
                        lambda problem, pick, fw: calls.append(("band", problem, pick)) or log.append(("band", fw))
                        or band)
    run = SimpleNamespace(as_json=lambda: {"run": 1})

    def fake_for_problem(problem, step, **kw):
        calls.append(("run", problem))
        log.append(("run", step, kw))
        return run

    monkeypatch.setattr(train, "for_problem", fake_for_problem)
    monkeypatch.setattr(train, "render_lines", lambda r: calls.append(("run lines", r)) or ["run lines"])
    monkeypatch.setattr(sens, "sensitivity", lambda problem, result, opts, b: calls.append(("sens", problem, result, opts))
                        or log.append(("sens", b)) or "S")
    monkeypatch.setattr(sens, "as_json", lambda s, pick: {"sens": s, "pick": pick})
    monkeypatch.setattr(sens, "render_lines", lambda report, command: calls.append(("sens lines", report))
                        or [f"sens {command}"])
    monkeypatch.setattr(figures, "plan_figures", lambda problem, result, folder: calls.append(("figures", problem, result))
                        or [folder / "m.png", folder / "t.png"])
    monkeypatch.setattr(figures, "memory_lines", lambda est, headroom: calls.append(("mem", est)) or [f"mem {headroom}"])
    monkeypatch.setattr(figures, "time_lines", lambda est: calls.append(("time", est)) or ["time"])
    p = _search_problem()
    pick = SimpleNamespace(step_seconds=3.0, estimate="E")
    result = SimpleNamespace(pick=pick)
    doc = SimpleNamespace(framework=SimpleNamespace(value="torchtitan"))
    extras = PlanExtras(tokens=1e10, price_per_gpu_hour=2.0, pue=1.1, sensitivity=True, command="planner plan -m x",
                        figures=tmp_path)
    opts = PlanOptions(top_k=4)
    extend(doc, p, result, extras, opts)
    assert calls == [("utilisation", p, result, opts), ("waste lines", p), ("band", p, pick), ("run", p),
                     ("run lines", run), ("band", p, pick), ("sens", p, result, opts),
                     ("sens lines", {"sens": "S", "pick": pick}), ("figures", p, result), ("mem", "E"), ("time", "E")]
    assert doc.utilisation.model_dump() == {"validated": {"waste": 4}}
    assert doc.training_run.model_dump() == {"validated": {"run": 1}}
    assert doc.sensitivity.model_dump() == {"validated": {"sens": "S", "pick": pick}}
    assert doc.figures == [str(tmp_path / "m.png"), str(tmp_path / "t.png")]
    assert log == [("Utilisation", {"waste": 4}), ("band", "torchtitan"),
                   ("run", 3.0, {"tokens": 1e10, "price_per_gpu_hour": 2.0, "pue": 1.1, "band": band}),
                   ("TrainingRun", {"run": 1}), ("band", "torchtitan"), ("sens", band),
                   ("SensitivityReport", {"sens": "S", "pick": pick})]
    assert extras.lines == ["waste {'validated': {'waste': 4}}", "", "run lines", "sens planner plan -m x", "",
                            f"mem {p.knobs.memory_headroom_bytes}", "time",
                            f"figures: {tmp_path / 'm.png'}, {tmp_path / 't.png'}"]
    log.clear()
    bare = SimpleNamespace(framework="generic")
    quiet = PlanExtras(objective="memory", sensitivity=True)
    extend(bare, p, result, quiet, PlanOptions())
    assert not hasattr(bare, "utilisation") and not hasattr(bare, "training_run") and not hasattr(bare, "figures")
    assert log[0] == ("band", "generic") and quiet.lines == ["sens planner plan ..."]


def test_sensitivity_lines_wrap_at_80_columns_and_ratios_divide_by_the_pick():
    """Texts built so that a line would be exactly 81 columns: each must wrap at 80. Step-time ratios against a pick of
    2 s: 3 s -> +50%, 2.5 s -> +25% (hand arithmetic)."""
    from planner.decisions import sensitivity as s
    from planner.decisions.ranking import RankingBand

    ranking = RankingBand(1.0, 0.115, 1721, "vTrain")
    pick = _fake_candidate({"dp": 8, "zero_stage": 1}, step=2.0)
    other = _fake_candidate({"dp": 8}, step=2.5)
    note = "word " * 15 + "ab"  # 4 + 77 = 81 columns on one line
    sens = s.Sensitivity(ranking, [s.Outcome("n", "changes", other, 3.0, 3.0, note)], [pick, other], other)
    doc = s.as_json(sens, pick)
    assert doc["scenarios"][0]["step_time_change"] == pytest.approx(0.5)
    assert doc["tied"][1]["step_time_vs_pick"] == pytest.approx(0.25)
    assert doc["recommended_step_time_vs_pick"] == pytest.approx(0.25)
    assert type(doc["scenarios"][0]["new_pick"]["schedule"]) is str  # JSON mode: plain strings, not enums
    lines = s.render_lines(doc, "cmd")
    assert lines[2:4] == ["tie tolerance 100.0%: the ranking error of two layouts' predicted step times:",
                          "80% of 1,721 pairs of layouts within 100.0% (vTrain)"]
    assert lines[7:9] == ["    word word word word word word word word word word word word word word word", "    ab"]
    many = {**doc, "tied": doc["tied"] * 50, "tie_tolerance": 0.12, "short_list_size": 5,
            "recommend_within": 0.115, "recommended_step_time_vs_pick": 0.118}
    tie = s._tie_lines(many, "cmd")
    assert tie[0] == "Tie: 100 layouts lie within 12.0% of the pick's step time: the model cannot"
    assert tie[-6:-4] == ["Recommended, the simplest of the short list within 11.5% of the pick (+11.8%",
                          "step time):"]
    assert max(len(line) for line in lines + tie) <= 80


def test_search_shows_a_transient_progress_bar_on_stderr_above_500_bases(monkeypatch):
    """The bar (rich) appears only with opts.progress and more than 500 bases: transient, on a stderr console,
    advanced once per base, started and stopped once; bases whose states cannot fit are counted, not evaluated."""
    import rich.progress

    import planner.search as search
    from planner.contract import SearchStats
    from planner.search import PlanOptions

    made = []

    class FakeProgress:
        def __init__(self, **kw):
            self.kw, self.tasks, self.advanced, self.events = kw, [], 0, []
            made.append(self)

        def add_task(self, label, total):
            self.tasks.append((label, total))
            return "task-id"

        def advance(self, task):
            assert task == "task-id"
            self.advanced += 1

        def start(self):
            self.events.append("start")

        def stop(self):
            self.events.append("stop")

    monkeypatch.setattr(rich.progress, "Progress", FakeProgress)
    monkeypatch.setattr(search, "_states_lower_bound_bytes", lambda *a, **k: 1e30)  # nothing is evaluated
    base = {"tp": 1, "pp": 1, "dp": 8, "cp": 1, "ep": 1, "zero_stage": 0, "offload": "none"}
    p = _search_problem()
    for n, progress, shown in ((501, True, True), (500, True, False), (501, False, False)):
        monkeypatch.setattr(search, "enumerate_bases", lambda problem, opts, offload, n=n: [base] * n)
        made.clear()
        stats = SearchStats()
        fitting, least = search.search(p, PlanOptions(progress=progress), stats, offload=False)
        assert fitting == [] and least == 1e30 and stats.candidates_considered == 3 * n
        assert stats.candidates_evaluated == 0
        if not shown:
            assert made == []
            continue
        (bar,) = made
        assert bar.kw["transient"] is True and bar.kw["console"].stderr is True
        assert bar.tasks == [("searching layouts", 501)] and bar.advanced == 501 and bar.events == ["start", "stop"]
    assert search._stderr_console().stderr is True


def test_published_layout_ranks_introduction():
    from types import SimpleNamespace

    from planner.search import published_layout_ranks

    text = published_layout_ranks(SimpleNamespace(results=[]))
    assert text.splitlines()[:6] == [
        "## The planner against published layouts", "",
        "For every evaluated row the planner plans the same model, batch and cluster (with the row's overlap knobs), "
        "the published layout is estimated in the same model, and its rank among the planner's fitting candidates is "
        "given (1 = the planner's pick; step times within 0.1% tie, and among ties the simpler layout is picked; a "
        "hybrid-sharded candidate counts as faster only by more than search.HYBRID_SHARD_MARGIN, as the pick is "
        "chosen). 'pick vs published' is the pick's predicted step time relative to the published layout's (negative: the "
        "pick is predicted faster).", "",
        "- rows: 0; published layout is the pick or ties it: 0; in the top 10: 0; median predicted gain of the pick "
        "+nan%; rows where the pick is predicted slower than the published layout by more than the 0.1% tie "
        "tolerance: 0.", ""]


# ---- layout rules at their boundaries (planner/rules.py): the value just allowed gets no violation ------------------


def _rules_inputs():
    from cluster_specs import load_cluster
    from planner.inputs.models import load_model
    from planner.inputs.specs import LayoutSpec, TrainingSpec

    return LayoutSpec.trusted, load_model("llama3-8b"), load_model("mixtral-8x7b"), TrainingSpec, load_cluster


def test_rules_allow_the_boundary_values():
    """Two virtual stages interleave; ZeRO-2 without pipelining; ZeRO-3 with parameter offload; a stage of one layer
    and a stage recomputing none (llama3-8b: 32 layers); pp x virtual_stages equal to the layers; an MoE ep and etp
    that divide the experts and the expert FFN (Mixtral: 8 experts, f_e 14336); FP8 tensorwise on H100 and MXFP8 on
    B200 (rules.py _schedule_rules, _state_rules, _split_rules, _placement_rules, _ep_rules, _fp8_rules)."""
    import planner.rules as rules

    lay, llama, mixtral, training, cluster = _rules_inputs()
    assert rules._schedule_rules(lay(tp=1, pp=2, dp=1, num_micro_batches=4, schedule="interleaved_1f1b",
                                     virtual_stages=2), llama) == []
    assert rules._state_rules(lay(tp=1, pp=1, dp=8, zero_stage=2)) == []
    assert rules._state_rules(lay(tp=1, pp=1, dp=8, zero_stage=3, offload="optimizer+params")) == []
    assert rules._split_rules(lay(tp=1, pp=2, dp=1, layers_per_stage=[1, 31], recompute_layers_per_stage=[0, 31]),
                              llama) == []
    assert rules._placement_rules(lay(tp=1, pp=4, dp=1, schedule="interleaved_1f1b", virtual_stages=8), llama,
                                  None, False) == []
    assert rules._ep_rules(lay(tp=2, pp=1, dp=4, ep=4, etp=2), mixtral) == []
    h100 = cluster("dgx-h100", nodes=1)
    assert rules._fp8_rules(training(global_batch_size=8, seq_length=4096, precision="fp8"), h100) == []
    b200 = h100.model_copy(update={"gpu": "B200"})
    assert rules._fp8_rules(training(global_batch_size=8, seq_length=4096, precision="fp8", fp8_recipe="mxfp8"),
                            b200) == []


def test_rules_refuse_just_past_the_boundaries():
    """etp 2 on a dense model; ep x etp = 4 not dividing dp*cp*tp = 2; a recompute list zipped against a split of the
    wrong length is checked entry by entry (no error); cp = 2 names its degree in the GPU product."""
    import planner.rules as rules

    lay, llama, mixtral, training, cluster = _rules_inputs()
    assert [v.rule for v in rules._ep_rules(lay(tp=1, pp=1, dp=8, etp=2), llama)] == ["ep_needs_moe"]
    assert [(v.rule, v.value) for v in rules._ep_rules(lay(tp=1, pp=1, dp=2, ep=2, etp=2), mixtral)] == [
        ("ep_folds_into_dp", "2*2")]
    got = rules._split_rules(lay(tp=1, pp=2, dp=1, layers_per_stage=[10, 10, 12], recompute_layers_per_stage=[0, 0]),
                             llama)
    assert [v.rule for v in got] == ["layers_per_stage"]
    (v,) = rules._degree_rules(lay(tp=1, pp=1, dp=1, cp=2), llama, cluster("dgx-h100", nodes=1))
    assert (v.rule, v.field, v.value) == ("gpus_match_cluster", "dp*tp*pp*cp", "1*1*1*2 = 2")


@pytest.mark.parametrize("sp,tp,cp_comm,want", [
    (False, 2, "p2p", []),  # without SP the sequence is cut into 2·cp chunks only: 4100 % 4 = 0
    (True, 2, "p2p", [("cp_split", "cp", "2")]),  # with SP into 2·cp·tp: 4100 % 8 = 4
    (True, 2, "ring", [("cp_comm", "cp_comm", "ring"), ("cp_split", "cp", "2")]),
])
def test_cp_rules_split_by_tp_only_under_sequence_parallelism(sp, tp, cp_comm, want):
    import planner.rules as rules

    lay, llama, _, training, _ = _rules_inputs()
    layout = lay(tp=tp, pp=1, dp=1, cp=2, cp_comm=cp_comm, sequence_parallel=sp)
    got = rules._cp_rules(layout, llama, training(global_batch_size=8, seq_length=4100))
    assert [(v.rule, v.field, v.value) for v in got] == want
    if cp_comm == "ring":
        assert got[0].allowed == "one of p2p, all_gather, a2a"


def test_cp_rules_read_the_model_for_ulysses_heads():
    """a2a with tp 8 under SP: llama3-8b's 8 KV heads leave 1 per TP rank, not divisible by cp = 2."""
    import planner.rules as rules

    lay, llama, _, training, _ = _rules_inputs()
    got = rules._cp_rules(lay(tp=8, pp=1, dp=1, cp=2, cp_comm="a2a", sequence_parallel=True), llama,
                          training(global_batch_size=8, seq_length=4096))
    assert [(v.rule, v.field) for v in got] == [("cp_split", "cp")] and "KV heads per TP rank (1)" in got[0].allowed


def test_distinct_runners_up_differ_from_the_pick_and_from_each_other_beyond_the_micro_batch():
    """search._distinct: a runner-up whose shape (tp, pp, dp, ZeRO, offload, recompute, schedule, v) was already
    shown, the pick's included, is skipped; a micro-batch size alone does not make it new; at most k are kept."""
    from types import SimpleNamespace

    from planner.inputs.specs import LayoutSpec
    from planner.search import _distinct

    def cand(**kw):
        return SimpleNamespace(layout=LayoutSpec.trusted(**{"tp": 1, "pp": 1, "dp": 8, **kw}))

    pick = cand(zero_stage=1)
    a, a_mbs, b, c = cand(zero_stage=2), cand(zero_stage=2, micro_batch_size=2), cand(tp=2, dp=4), cand(tp=8, dp=1)
    same_as_pick = cand(zero_stage=1, micro_batch_size=4)
    assert _distinct([same_as_pick, a, a_mbs, b, c], pick, 2) == [a, b]
    assert _distinct([a, a_mbs, b, c], pick, 5) == [a, b, c]
