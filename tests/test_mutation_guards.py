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


def test_dp_split_counts_realise_the_brute_force_optimum():
    """The DP's layer counts, not only its makespan: they are one of the optimal contiguous splits found by
    enumerating every split (40 seeded instances of up to 11 layers on up to 5 stages, uneven layers, caps)."""
    seen = 0
    for layers, extras, caps in _instances():
        want, optimal = _brute_split(layers, extras, caps)
        got = best_split_dp(layers, extras, caps)
        if want is None:
            assert got is None
            continue
        seen += 1
        assert got is not None and got[0] == pytest.approx(want, abs=1e-12)
        assert tuple(got[1]) in optimal, (layers, extras, caps, got)
    assert seen >= 25


def test_uniform_split_counts_realise_the_brute_force_optimum():
    seen = 0
    for layers, extras, caps in _instances(uniform=True):
        want, optimal = _brute_split(layers, extras, caps)
        got = best_split_uniform(len(layers), layers[0], extras, caps)
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
    # 32k tokens is long context (the "32k-1M"); one token less is not
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
    (8, _L(ep=8, dp=8), True), (8, _L(ep=4, etp=2, dp=8), True), (8, _L(ep=8, etp=2, dp=8), False),
    (8, _L(dp=8), False),
])
def test_matches_row(row, layout, agrees):
    """Each row's recommendation as a layout test, on both sides of every condition (8 GPUs per node)."""
    assert matches_row(row, layout, 8) is agrees
