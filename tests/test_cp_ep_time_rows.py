"""CP and EP communication as their own rows of the time breakdown (estimate and plan, terminal and JSON), not
folded into compute: the rows, their before-overlap totals, and the identity that the parts still sum to the step."""

import json
import subprocess
import sys

import pytest

from cost_models.communication import all_to_all_seconds, group_link
from planner.estimate import build_problem, estimate_layout, layout_from_arg


def _est(model, nodes, batch, seq, layout, precision=None):
    problem = build_problem("dgx-h100", nodes, model, batch, seq, precision)
    lay = layout_from_arg(layout, problem)
    return problem, lay, estimate_layout(problem, lay)


def _exposed_sum(t):
    return (t.compute_seconds + t.recompute_seconds + t.tp_comm_seconds + t.cp_comm_seconds + t.ep_comm_seconds
            + t.pipeline_bubble_seconds + t.pp_p2p_seconds + t.dp_comm_seconds + t.optimizer_seconds
            + t.offload_seconds)


def test_ep_row_is_the_all_to_all_of_modern_training_3_4():
    """Mixtral-8x7B, EP 8 inside one DGX H100 node: per MoE layer per micro-batch each rank sends
    T·k·h·(2 + 2)·(ep-1)/ep bytes forward (BF16 dispatch + combine) and as much backward (§3.4; DeepEP README: the
    backward of a dispatch is a combine), T = b·s tokens scaled by the stated imbalance γ = 1.1."""
    problem, lay, est = _est("mixtral-8x7b", 1, 64, 4096, "tp=1,pp=1,dp=8,ep=8,zero=1,mbs=1,recompute=full")
    T, k, h, ep, gamma = 4096 * 1.1, 2, 4096, 8, 1.1
    per_layer_sent = 2 * T * k * h * 4 * (ep - 1) / ep  # forward + backward
    hw = problem.hardware
    link = group_link(hw, group_size=8, stride=1).link
    assert link.bandwidth_bytes_per_second >= 100e9  # NVLink, not the NIC
    one = all_to_all_seconds(message_bytes=per_layer_sent * ep / (ep - 1), group_size=ep, link=link)
    m, layers = lay.num_micro_batches, 32
    assert gamma == problem.knobs.moe_imbalance
    assert est.time.ep_comm_seconds == pytest.approx(m * layers * one, rel=1e-6)
    assert est.time.ep_comm_total_seconds == pytest.approx(est.time.ep_comm_seconds)  # nothing hides it by default
    assert est.time.cp_comm_seconds == 0.0
    assert _exposed_sum(est.time) == pytest.approx(est.step_seconds, rel=1e-9)


def test_cp_rows_ring_hides_all_gather_does_not():
    """Llama-3-8B at 256k tokens, CP 8 in one node: the ring's KV transfer hides behind attention (§2.4: s_l = 32k
    is far above the 556-token threshold), Llama 3's all-gather is exposed in full (§2.1, §8.7)."""
    _, lay, ring = _est("llama3-8b", 1, 1, 262144, "dp=1,cp=8,zero=3,recompute=full")
    _, _, ag = _est("llama3-8b", 1, 1, 262144, "dp=1,cp=8,cp_comm=all_gather,zero=3,recompute=full")
    assert ring.time.cp_comm_total_seconds > 0 and ring.time.cp_comm_seconds == 0.0
    assert ag.time.cp_comm_seconds > 0
    assert ag.time.cp_comm_seconds == pytest.approx(ag.time.cp_comm_total_seconds)
    # the same bytes move either way (§2.3: all-gather receives (cp-1)/cp·s·kv = the ring's (cp-1)·s_l·kv)
    assert ag.step_seconds > ring.step_seconds
    for est in (ring, ag):
        assert _exposed_sum(est.time) == pytest.approx(est.step_seconds, rel=1e-9)
        # pp = 1: the stage's micro-batch time is compute + recompute + TP + CP + EP
        t = est.time
        assert (t.compute_seconds + t.recompute_seconds + t.tp_comm_seconds + t.cp_comm_seconds
                + t.ep_comm_seconds) == pytest.approx(lay.num_micro_batches * est.stage_seconds[0], rel=1e-9)


def test_dense_layout_has_empty_cp_and_ep_rows():
    _, _, est = _est("llama3-8b", 1, 16, 8192, "dp=8,zero=1,mbs=2,recompute=full")
    assert (est.time.cp_comm_seconds, est.time.ep_comm_seconds, est.time.cp_comm_total_seconds,
            est.time.ep_comm_total_seconds) == (0.0, 0.0, 0.0, 0.0)


def test_terminal_and_json_show_the_rows():
    args = ["-c", "dgx-h100", "-n", "1", "-m", "mixtral-8x7b", "-b", "64", "-s", "4096",
            "--layout", "tp=1,pp=1,dp=8,ep=8,zero=1,mbs=1,recompute=full"]
    run = [sys.executable, "-m", "planner.cli", "estimate", *args]
    text = subprocess.run(run, capture_output=True, text=True, timeout=120, env={"NO_COLOR": "1", "COLUMNS": "100",
                                                                                 "PATH": "/usr/bin:/bin"})
    assert text.returncode == 0, text.stderr
    assert "exposed EP all-to-all" in text.stdout and "exposed CP KV exchange" in text.stdout
    doc = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=120).stdout)
    tb = doc["time_breakdown"]
    assert tb["ep_comm_exposed_seconds"] > 0 and tb["cp_comm_exposed_seconds"] == 0
    parts = ("compute_seconds", "recompute_seconds", "tp_comm_exposed_seconds", "cp_comm_exposed_seconds",
             "ep_comm_exposed_seconds", "pipeline_bubble_seconds", "pp_p2p_exposed_seconds",
             "dp_comm_exposed_seconds", "optimizer_seconds", "offload_seconds")
    assert sum(tb[p] for p in parts) == pytest.approx(tb["total_seconds"], rel=1e-9)


def test_node_limited_routing_halves_deepseek_v3_ep_row():
    """DeepSeek-V3 on 128 DGX H100 nodes, EP 64 over 8 nodes: the network share dominates the all-to-all, and
    node-limited routing (M = 4 of 8 nodes, V3 §3.2.2) halves the network bytes (test_modern_costs), so the EP row
    roughly halves against the same model routed without groups."""
    from dataclasses import replace

    problem, lay, est = _est("deepseek-v3", 128, 1024, 4096, "tp=1,pp=16,dp=64,ep=64,zero=1,mbs=1,recompute=full")
    moe = problem.model.moe.model_copy(update={"expert_groups": None, "groups_per_token": None})
    plain = replace(problem, model=problem.model.model_copy(update={"moe": moe}))
    est_plain = estimate_layout(plain, lay)
    assert est.time.ep_comm_seconds / est_plain.time.ep_comm_seconds == pytest.approx(0.5, abs=0.03)
    assert est.step_seconds < est_plain.step_seconds
