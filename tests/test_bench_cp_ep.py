"""Context-parallel ring attention and expert-parallel dispatch/combine on real gloo process groups (CPU), forward
and backward, against one process, and their communication against the cost model on this machine's calibration
(planner/bench/cp_ep.py, planner/bench/cp_ep_backward.py).

Numerics: fp64 everywhere, so the ring's online softmax and the all-to-all round trip must reproduce the single
process to rounding (observed 1e-15), and the ring's backward (TE's reverse ring carrying dK/dV) and autograd
through the all-to-alls must reproduce one process's autograd gradients (observed 5e-15 and 2.5e-14). Bytes: what the ranks actually sent equals the cost model's volumes
(cost_models/context_parallel.py cp_traffic for the ring; cost_models/moe.py ep_traffic for the all-to-all, up to the
routing's deviation from uniform). Time: the model's charge on the link fitted on the same ranks in the same rounds is
checked in closed form; measured against predicted is reported by the benchmark, not asserted (the machine is shared:
observed ratios 1.1-5x quiet, above 10x under the full suite's load, 35x once; see docs/benchmark.md).
"""

import math
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
    # backward: dQ, dK, dV of every rank's chunks; dX, the router (summed over ranks: replicated, all-reduced in
    # training) and each rank's local experts' fc1/fc2 gradients
    assert r["attention_backward_max_abs_error"] < 1e-12
    assert r["moe_backward_max_abs_error"] < 1e-12
    # the backward ring: K/V again (3 blocks) and dK/dV (3 blocks), twice the forward (§2.3, cp_traffic backward_bytes)
    assert r["ring_backward_bytes_sent"] == r["predicted"]["cp_backward_bytes_model"] == 2 * 3 * 64 * 2 * 2 * 16 * 8
    # the gradients of dispatch and combine are a combine and a dispatch: the forward's rows, the other way
    assert r["predicted"]["ep_backward_bytes_model"] == r["predicted"]["ep_bytes_model"] == 128 * 2 * 32 * 16 * 3 / 4
    assert r["predicted"]["ep_backward_bytes_sent"] == pytest.approx(r["predicted"]["ep_backward_bytes_model"],
                                                                     rel=0.15)


def test_measured_exchanges_against_the_cost_model_on_two_ranks():
    r = run(CpEpConfig(seq_length=512, tokens=256, repeats=3), 2)
    assert r["attention_max_abs_error"] < 1e-12 and r["moe_max_abs_error"] < 1e-12
    assert r["attention_backward_max_abs_error"] < 1e-12 and r["moe_backward_max_abs_error"] < 1e-12
    # two ranks: the forward ring sends rank 1's K/V once, the backward K/V once and dK/dV once
    assert r["ring_backward_bytes_sent"] == 2 * r["ring_bytes_sent"] == 2 * 256 * 2 * 2 * 32 * 8
    link = r["link"]
    bw, lat = link["bandwidth_bytes_per_second"], link["latency_seconds"]
    assert bw > 0 and lat >= 0
    # the time the model charges on the fitted link, in closed form: two ranks make one exchange per ring direction
    # and one peer for the all-to-all, so each is one latency plus its bytes (asserted exactly above) over the
    # bandwidth; a latency per copy, bytes x (ep - 1) or fp64 counted as fp32 would break these
    p = r["predicted"]
    assert p["cp_ring_seconds"] == pytest.approx(lat + p["cp_bytes_model"] / bw)
    assert p["cp_ring_backward_seconds"] == pytest.approx(lat + p["cp_backward_bytes_model"] / bw)
    assert p["ep_all_to_all_seconds"] == pytest.approx(lat + p["ep_bytes_model"] / bw)
    assert p["ep_all_to_all_backward_seconds"] == pytest.approx(lat + p["ep_backward_bytes_model"] / bw)
    # measured against predicted is the benchmark's report (python -m planner.bench.cp_ep, docs/benchmark.md), not
    # asserted: on this shared machine load alone moved the ratio 1.1-5x quiet, past 10x under the full suite and
    # to 35x once in a clean-clone CI run, with the bytes exact
    for key in p:
        if key.endswith("_seconds"):
            assert math.isfinite(r["measured"][key]) and r["measured"][key] > 0, key
