"""Context-parallel ring attention and expert-parallel dispatch/combine on real gloo process groups (CPU), against
one process, and their communication against the cost model on this machine's calibration (planner/bench/cp_ep.py).

Numerics: fp64 everywhere, so the ring's online softmax and the all-to-all round trip must reproduce the single
process to rounding (observed 1e-15). Bytes: what the ranks actually sent equals the cost model's volumes
(cost_models/context_parallel.py cp_traffic for the ring; cost_models/moe.py ep_traffic for the all-to-all, up to the
routing's deviation from uniform). Time: two ranks (one per core of this 2-core machine), the link fitted on the same
ranks in the same rounds; the machine is shared, so the band is wide (observed ratios 1.1-5x quiet, above 10x under the full
suite's load; see docs/benchmark.md).
"""

import os

import pytest

torch = pytest.importorskip("torch")

from planner.bench.cp_ep import CpEpConfig, run  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.torch]
os.environ.setdefault("OMP_NUM_THREADS", "1")


def test_ring_attention_and_ep_dispatch_equal_one_process_on_four_ranks():
    cfg = CpEpConfig(seq_length=256, head_dim=16, tokens=128, hidden=32, repeats=1)
    r = run(cfg, 4)
    assert r["attention_max_abs_error"] < 1e-12  # causal GQA attention over 256 tokens, load-balanced split over 4
    assert r["moe_max_abs_error"] < 1e-12  # top-2 of 8 experts, 2 experts per rank
    # the ring: cp-1 = 3 steps of s/cp tokens x 2 kv_heads x d, in fp64 (modern-training.md §2.3)
    assert r["ring_bytes_sent"] == r["predicted"]["cp_bytes_model"] == 3 * 64 * 2 * 2 * 16 * 8
    # the all-to-all: copies leaving the rank, against the uniform-routing (ep-1)/ep share of T·k·h (§3.4)
    assert r["predicted"]["ep_bytes_sent"] == pytest.approx(r["predicted"]["ep_bytes_model"], rel=0.15)


def test_measured_exchanges_against_the_cost_model_on_two_ranks():
    r = run(CpEpConfig(seq_length=512, tokens=256, repeats=3), 2)
    assert r["attention_max_abs_error"] < 1e-12 and r["moe_max_abs_error"] < 1e-12
    link = r["link"]
    assert link["bandwidth_bytes_per_second"] > 0 and link["latency_seconds"] >= 0
    for key in ("cp_ring_seconds", "ep_all_to_all_seconds"):
        ratio = r["measured"][key] / r["predicted"][key]
        # an accounting error (bytes x (ep-1), latency per copy, fp64 counted as fp32 ...) moves this by more than
        # 30x at these sizes; the shared machine's load alone moved it 1.1-5x in quiet runs and past 10x while the
        # whole suite and four other sessions ran, so the band only catches the former
        assert 1 / 30 < ratio < 30, (key, ratio)
