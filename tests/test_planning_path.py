"""Named guards of the planning path: each test kills a one-line bug that once survived the whole suite
(issue 9's list). The expected numbers come from independent derivations (the alpha-beta collectives, the
stage model's terms) or from the decision table's stated threshold."""

import pytest

from cost_models.communication import (
    Link,
    all_gather_seconds,
    group_link,
    pp_neighbour_link,
    reduce_scatter_seconds,
)
from cost_models.inputs import Knobs, Layout, Training
from cost_models.stage import stage_model
from cost_models.step import estimate_step
from planner.explain.decision import HIGH_BANDWIDTH_BYTES_PER_SECOND_PER_GPU, classify
from tests.conftest import gpt_shape

BF16 = Training(global_batch_size=256, seq_length=2048, activation_bytes=2, param_bytes=2, grad_bytes=4,
                optimizer_bytes=12, grad_reduce_bytes=4)
MODEL = gpt_shape(num_layers=24, hidden_size=2048, num_attention_heads=16, num_kv_heads=16, ffn_hidden_size=8192)


def _hw(nodes=4):
    from cluster_specs import load_cluster

    return load_cluster("dgx-a100-80gb", nodes=nodes).to_cost_model("bf16")


def test_offload_time_is_the_pcie_copy_of_gradients_and_parameters():
    # bug: offload time set to 0. ZeRO-Offload copies the gradients down and the parameters up over PCIe
    hw = _hw()
    layout = Layout(dp=32, tp=1, pp=1, zero_stage=1, offload="optimizer", num_micro_batches=8)
    est = estimate_step(MODEL, BF16, hw, layout)
    local = est.stages[0].params / 32
    want = local * (BF16.grad_bytes + BF16.param_bytes) / hw.host_to_device.bandwidth_bytes_per_second
    assert est.time.offload_seconds == pytest.approx(want, rel=1e-12) and want > 0


def test_zero2_reduce_scatters_after_every_micro_batch():
    # bug: ZeRO-2 reduce-scattering once instead of per micro-batch (sharded gradients cannot accumulate locally)
    hw, m, d = _hw(), 8, 32
    layout = Layout(dp=d, tp=1, pp=1, zero_stage=2, num_micro_batches=m)
    est = estimate_step(MODEL, BF16, hw, layout)
    params = est.stages[0].params
    link = group_link(hw, group_size=d, stride=1).link
    want = (m * reduce_scatter_seconds(message_bytes=params * BF16.grad_reduce_bytes, group_size=d, link=link)
            + all_gather_seconds(message_bytes=params * BF16.param_bytes, group_size=d, link=link))
    assert est.time.dp_comm_total_seconds == pytest.approx(want, rel=1e-12)


def test_recomputed_stage_holds_one_whole_layer_transiently():
    # bug: the recompute transient dropped. Backward rebuilds one layer's full activations at a time
    layout = Layout(dp=32, tp=1, pp=1, zero_stage=1, num_micro_batches=8, recompute="full")
    sm = stage_model(MODEL, BF16, _hw(), layout, Knobs())
    est = estimate_step(MODEL, BF16, _hw(), layout)
    assert est.stages[0].transient_bytes == pytest.approx(sm.lc.act_none_bytes, rel=1e-12)
    plain = estimate_step(MODEL, BF16, _hw(), Layout(dp=32, tp=1, pp=1, zero_stage=1, num_micro_batches=8))
    assert plain.stages[0].transient_bytes == 0.0


def test_pipeline_neighbour_a_whole_node_away_is_across_the_network():
    # bug: `<` turned `<=` in communication.py. With tp x dp = 8 = GPUs per node, the next stage is the next node
    hw = _hw()
    link, crosses = pp_neighbour_link(hw, tp=4, dp=2)
    assert crosses and link.bandwidth_bytes_per_second == pytest.approx(
        hw.nics_per_node * hw.nic.bandwidth_bytes_per_second / hw.gpus_per_node)
    inside, crosses_inside = pp_neighbour_link(hw, tp=4, dp=1)
    assert not crosses_inside and inside == hw.intra_node
    assert isinstance(link, Link)


def test_decision_threshold_is_40_gbit_per_gpu():
    # bug: the high-bandwidth threshold off by 10x. 5 GB/s = 40 Gb/s per GPU separates rows 5 and 6
    assert HIGH_BANDWIDTH_BYTES_PER_SECOND_PER_GPU == 5e9
    kw = dict(num_gpus=64, num_nodes=8, fits_one_card=False)
    assert classify(network_per_gpu=5e9, **kw) == 5
    assert classify(network_per_gpu=4.9e9, **kw) == 6
    assert classify(network_per_gpu=0.6e9, **kw) == 6  # 10x below (a 1 GbE-class share) is low bandwidth
    assert classify(network_per_gpu=25e9, **kw) == 5  # 200 Gb/s InfiniBand per GPU is high bandwidth
