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


@pytest.mark.parametrize(("recompute", "forwards"), [("none", 1), ("selective", 1), ("full", 2)])
def test_ep_row_is_the_all_to_all_of_modern_training_3_4(recompute, forwards):
    """Mixtral-8x7B, EP 8 inside one DGX H100 node: per MoE layer per micro-batch each rank sends
    T·k·h·(2 + 2)·(ep-1)/ep bytes forward (BF16 dispatch + combine) and as much backward (§3.4; DeepEP README: the
    backward of a dispatch is a combine), T = b·s tokens scaled by the stated imbalance γ = 1.1. Full recompute
    runs the forward, its dispatch and combine included, again in the backward (Megatron's checkpoint wraps the
    whole layer); selective recompute (Megatron's core_attn) does not touch the MoE layer."""
    problem, lay, est = _est("mixtral-8x7b", 1, 64, 4096, f"tp=1,pp=1,dp=8,ep=8,zero=1,mbs=1,recompute={recompute}")
    T, k, h, ep, gamma = 4096 * 1.1, 2, 4096, 8, 1.1
    forward_sent = T * k * h * 4 * (ep - 1) / ep
    hw = problem.hardware
    link = group_link(hw, group_size=8, stride=1).link
    assert link.bandwidth_bytes_per_second >= 100e9  # NVLink, not the NIC
    one = all_to_all_seconds(message_bytes=2 * forward_sent * ep / (ep - 1), group_size=ep, link=link)
    again = all_to_all_seconds(message_bytes=forward_sent * ep / (ep - 1), group_size=ep, link=link)
    m, layers = lay.num_micro_batches, 32
    assert m == 8 and gamma == problem.knobs.moe_imbalance
    assert est.time.ep_comm_seconds == pytest.approx(m * layers * (one + (forwards - 1) * again), rel=1e-6)
    assert est.time.ep_comm_total_seconds == pytest.approx(est.time.ep_comm_seconds)  # nothing hides it by default
    assert est.time.cp_comm_seconds == 0.0
    assert _exposed_sum(est.time) == pytest.approx(est.step_seconds, rel=1e-9)


@pytest.mark.parametrize(("recompute", "forwards"), [("none", 1), ("selective", 2), ("full", 2)])
def test_cp_all_gather_row_counts_the_gathers_a_recompute_repeats(recompute, forwards):
    """Llama-3-8B at 256k tokens, all-gather CP 8 in one DGX H100 node (§2.3): each layer's forward all-gathers the
    whole K and V, s·2·g·d·β = 262,144 x 2 x 8 x 128 x 2 B = 1 GiB, over NVLink (the cluster's 369.9 GB/s
    achievable of NVLink4's 450, 5 µs a step, 7 steps of (cp-1)/cp);
    the backward re-gathers KV and reduce-scatters dKV (2 x forward). A recompute runs the forward's gather again:
    full recompute reruns the layer; selective reruns Megatron's core attention, and the CP exchange is inside it
    (megatron-core 0.16.1 attention.py L328-331/L381-415 checkpoints self.core_attention, which
    extensions/transformer_engine.py L1228-1242 gives the cp_group)."""
    problem, lay, est = _est("llama3-8b", 1, 1, 262144, f"dp=1,cp=8,cp_comm=all_gather,zero=3,recompute={recompute}")
    link = group_link(problem.hardware, group_size=8, stride=1).link
    assert (link.bandwidth_bytes_per_second, link.latency_seconds) == pytest.approx((369.9e9, 5e-6))
    gather = 7 * 5e-6 + 7 / 8 * 2**30 / 369.9e9
    m, layers = lay.num_micro_batches, 32
    assert m == 1
    assert est.time.cp_comm_seconds == pytest.approx(m * layers * (3 + forwards - 1) * gather, rel=1e-9)
    assert est.time.cp_comm_total_seconds == pytest.approx(est.time.cp_comm_seconds, rel=1e-12)
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


def test_full_recompute_repeats_the_fp8_casts_and_runs_its_gemms_in_fp8():
    """Llama-3-8B, FP8 tensorwise, b·s = 2 x 8192 tokens on one H100 (3,350 GB/s HBM, gpus.yaml): the forward casts
    each Linear's input, K = h, q, h, f = 4096 + 4096 + 4096 + 14336 = 26,624 elements per token, at 9.8 B per
    element (current scaling, calibrated on TE's H200 autocast speedups, fp8.py). A full recompute runs these casts again (TE's checkpoint re-quantizes);
    selective recompute (core attention only) casts nothing. The recomputed GEMMs run at the forward's FP8 rate."""
    from cost_models.stage import stage_model

    problem = build_problem("dgx-h100", 1, "llama3-8b", 16, 8192, "fp8", fp8_recipe="tensorwise")
    lay = layout_from_arg("dp=8,zero=1,mbs=2,recompute=full", problem)
    sm = stage_model(problem.cm_model, problem.cm_training, problem.hardware, lay.to_cost_model(), problem.knobs)
    ext = sm.lc.extras
    quant_fwd = 2 * 8192 * 26624 * 9.8 / 3.35e12
    assert ext.recomputed("full").fp8_quant_seconds == pytest.approx(quant_fwd, rel=1e-9)
    assert ext.recomputed("full").seconds == pytest.approx(quant_fwd, rel=1e-9)  # no CP, no EP
    assert ext.recomputed("selective").seconds == 0.0 and ext.recomputed("none").seconds == 0.0
    bf16 = build_problem("dgx-h100", 1, "llama3-8b", 16, 8192, "bf16")
    sm16 = stage_model(bf16.cm_model, bf16.cm_training, bf16.hardware, lay.to_cost_model(), bf16.knobs)
    gemm_gain = sm16.lc.t_recompute_full - (sm.lc.t_recompute_full - quant_fwd)  # bf16 GEMM time - FP8 GEMM time
    forward_gain = sm16.lc.t_layer_forward - (sm.lc.t_layer_forward - ext.fp8_quant_seconds / 3)
    assert gemm_gain > 0
    # the same GEMMs in the same kernels: the recompute saves what the forward saves (up to the memory-bound
    # elementwise time, which FP8's smaller saved inputs change alike in both)
    assert gemm_gain == pytest.approx(forward_gain, rel=0.02)
