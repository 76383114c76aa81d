"""The one stage model (cost_models/stage.py) and the one makespan (cost_models/pipeline.py), held to independent
derivations: the timeline simulator, the paper formulas in cost_models/oracles.py, and the stage model's own
linear form (which the split refinement and the ILP optimise)."""

from dataclasses import replace

import pytest

from cost_models import oracles
from cost_models.inputs import Knobs, Layout, Recompute, Training, Zero3Gather
from cost_models.memory import activation_bytes_per_layer
from cost_models.pipeline import pipeline_makespan, simulate
from cost_models.stage import stage_model, stage_split, state_bytes_per_param
from cost_models.step import estimate_step
from tests.conftest import gpt_shape

BF16 = Training(global_batch_size=512, seq_length=2048, activation_bytes=2, param_bytes=2, grad_bytes=4,
                optimizer_bytes=12, grad_reduce_bytes=4)


def _hw():
    from cluster_specs import load_cluster

    return load_cluster("dgx-a100-80gb", nodes=16).to_cost_model("bf16")


# ---- the makespan, against the timeline simulator ---------------------------------------------------------


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("gpipe", 1), ("naive", 1), ("interleaved_1f1b", 2),
                                         ("interleaved_1f1b", 3), ("zero_bubble", 1)])
@pytest.mark.parametrize("p, m", [(2, 4), (3, 6), (4, 8), (8, 16)])
def test_makespan_equals_the_simulated_timeline(schedule, v, p, m):
    # equal stages: forward 1, backward 2 (of which the weight gradient 1, zero-bubble's W)
    tl = simulate(schedule=schedule, pp=p, num_micro_batches=m, virtual_stages=v, t_forward=1.0, t_backward=2.0,
                  t_weight=1.0 if schedule == "zero_bubble" else None)
    span = pipeline_makespan(schedule=schedule, stage_seconds=[3.0] * p, num_micro_batches=m, virtual_stages=v,
                             weight_grad_seconds=[1.0] * p)
    assert span.seconds == pytest.approx(tl.makespan, rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_async_makespan_is_the_simulated_steady_state(p):
    # PipeDream's asynchronous 1F1B never flushes: a step costs the simulator's marginal time of m more micro-batches
    m = 8
    one = simulate(schedule="pipedream_async", pp=p, num_micro_batches=m).makespan
    two = simulate(schedule="pipedream_async", pp=p, num_micro_batches=2 * m).makespan
    span = pipeline_makespan(schedule="pipedream_async", stage_seconds=[3.0] * p, num_micro_batches=m)
    assert span.seconds == pytest.approx(two - one) and span.bubble_seconds == 0


def test_uneven_stages_take_the_bottleneck_form():
    # 1F1B with stage times 1, 3, 2: fill and drain through every stage once, the slowest paces the rest
    span = pipeline_makespan(schedule="1f1b", stage_seconds=[1.0, 3.0, 2.0], num_micro_batches=5)
    assert (span.seconds, span.bottleneck_stage, span.bubble_seconds) == (6.0 + 4 * 3.0, 1, 6.0 + 12.0 - 15.0)


def test_makespan_bubbles_equal_the_paper_closed_forms():
    p, m, v = 8, 64, 3
    t = 3.0
    one = pipeline_makespan(schedule="1f1b", stage_seconds=[t] * p, num_micro_batches=m)
    assert one.bubble_seconds / one.busy_seconds == pytest.approx(oracles.bubble_1f1b_of_ideal(pp=p, num_micro_batches=m))
    assert one.bubble_seconds / one.seconds == pytest.approx(oracles.bubble_gpipe_of_total(pp=p, num_micro_batches=m))
    inter = pipeline_makespan(schedule="interleaved_1f1b", stage_seconds=[t] * p, num_micro_batches=m,
                              virtual_stages=v)
    assert inter.bubble_seconds / inter.busy_seconds == pytest.approx(
        oracles.bubble_interleaved_of_ideal(pp=p, num_micro_batches=m, virtual_stages=v))
    t_f, t_b, t_w = 1.0, 1.2, 0.8  # t_b: input gradient only
    zb = pipeline_makespan(schedule="zero_bubble", stage_seconds=[t_f + t_b + t_w] * p, num_micro_batches=m,
                           weight_grad_seconds=[t_w] * p)
    assert zb.bubble_seconds == pytest.approx(oracles.zero_bubble_bubbles(pp=p, t_f=t_f, t_b=t_b, t_w=t_w)["zb_h1"])


# ---- the stage model: its evaluated stages equal its linear form ------------------------------------------


DEEPSPEED_PIPE = Knobs(keeps_stage_output=True, dynamic_grads=True, bucket_bytes=1e9)
TORCH_PIPELINING = Knobs(pp_receive_buffers=True)


@pytest.mark.parametrize("knobs", [Knobs(), DEEPSPEED_PIPE, TORCH_PIPELINING, Knobs(loss_bytes_per_logit=12.0)])
@pytest.mark.parametrize("zero, recompute, full", [(0, "none", None), (1, "selective", (0, 3, 12, 1)),
                                                   (1, "full", None), (0, "selective", (2, 2, 2, 2))])
def test_evaluated_stages_equal_the_linear_form_the_ilp_uses(zero, recompute, full, knobs):
    model = gpt_shape(num_layers=48, hidden_size=4096, num_attention_heads=32, num_kv_heads=32, ffn_hidden_size=16384)
    split = (11, 13, 13, 11)
    layout = Layout(dp=4, tp=4, pp=4, zero_stage=zero, micro_batch_size=1, num_micro_batches=16, recompute=recompute,
                    sequence_parallel=True, layers_per_stage=split, recompute_layers_per_stage=full)
    sm = stage_model(model, BF16, _hw(), layout, knobs)
    # the ILP's coefficients come from the base policy: none/selective layers, r of them fully recomputed
    base = stage_model(model, BF16, _hw(), replace(layout, recompute="none" if recompute == "full" else recompute,
                                                   recompute_layers_per_stage=None), knobs)
    for i in range(4):
        n, r = sm.split[i], sm.full_layers[i]
        lin = base.linear(i)
        assert sm.time(i).total_seconds == pytest.approx(n * lin.layer_seconds + r * lin.recompute_seconds
                                                         + lin.extra_seconds, rel=1e-12)
        mem = sm.memory(i)
        linear_bytes = (n * lin.layer_state_bytes + (n - r) * lin.layer_act_policy_bytes
                        + r * lin.layer_act_full_bytes + lin.fixed_bytes)
        # the linear row always reserves the larger of one fully recomputed layer's backward and one policy layer's
        # (LayerCosts.backward_working_bytes); the stage pays those of the layers it has (with the caching
        # allocator's reserve on it, as on every dynamic byte)
        full, policy = (base.lc.backward_working_bytes(full=f) for f in (True, False))
        paid = max(full if r > 0 else 0.0, policy if n > r else 0.0)
        reserved = (max(full, policy) - paid) * (1 + knobs.allocator_reserve_fraction)
        assert mem.total_bytes == pytest.approx(linear_bytes - reserved, rel=1e-12)


def test_deepspeed_pipe_engine_memory_terms():
    # DeepSpeed's pipe engine keeps each in-flight micro-batch's stage output until its backward (pipe/engine.py
    # _exec_backward_pass): one layer input (2 s b h / t with SP) per micro-batch in flight, on every stage but the
    # last; its per-parameter 16-bit grads are allocated every step, so the allocator's reserve covers them
    model = gpt_shape(num_layers=48, hidden_size=4096, num_attention_heads=32, num_kv_heads=32, ffn_hidden_size=16384)
    layout = Layout(dp=4, tp=4, pp=4, zero_stage=1, micro_batch_size=2, num_micro_batches=16, recompute="full",
                    sequence_parallel=True)
    plain, ds = (stage_model(model, BF16, _hw(), layout, k) for k in (Knobs(), replace(DEEPSPEED_PIPE, bucket_bytes=0)))
    layer_input = 2 * 2048 * 2 * 4096 / 4  # s b h x 2 bytes, sharded by SP over tp = 4
    r = Knobs().allocator_reserve_fraction
    for i in range(4):
        a, b = plain.memory(i), ds.memory(i)
        kept = 0.0 if i == 3 else layer_input * a.in_flight_micro_batches
        assert b.activations_bytes - a.activations_bytes == pytest.approx(kept, rel=1e-12)
        assert b.reserve_bytes - a.reserve_bytes == pytest.approx(r * (kept + b.gradients_bytes), rel=1e-12)


@pytest.mark.parametrize("schedule, v, p, m, acts, grads", [
    # 1F1B, p 4, m 8: stage i holds min(m, p - i) = 4, 3, 2, 1 micro-batches; stages 1-3 keep 8 activation buffers,
    # 8 - in flight of them beyond the in-flight inputs; stages 0-2 keep 8 gradient buffers
    ("1f1b", 1, 4, 8, [0, 5, 6, 7], [8, 8, 8, 0]),
    # p 2, m 4: stage 1 holds 1 in flight and 3 more buffers; stage 0 holds 4 gradient buffers
    ("1f1b", 1, 2, 4, [0, 3], [4, 0]),
    # p 4, m 2: stages 1 and 2 have every micro-batch in flight (min(2, 3) = min(2, 2) = 2): no buffer beyond them
    ("1f1b", 1, 4, 2, [0, 0, 0, 1], [2, 2, 2, 0]),
    # interleaved, p 4, v 2, m 8: rank i runs global stages i and i + 4; only global stage 0 has no activation
    # buffers and only global stage 7 no gradient buffers. In flight (Megatron's warm-up count / v): rank 0
    # min(3*2 + 5, 16) / 2 = 5.5, rank 1 4.5, rank 2 3.5, rank 3 2.5 -> activation buffers beyond them
    # 1 x (8 - 5.5), 2 x (8 - 4.5), 2 x (8 - 3.5), 2 x (8 - 2.5)
    ("interleaved_1f1b", 2, 4, 8, [2.5, 7, 9, 11], [16, 16, 16, 8]),
])
def test_torch_pipelining_receive_buffers_by_hand(schedule, v, p, m, acts, grads):
    """torch.distributed.pipelining keeps a receive buffer per micro-batch (stage.py _setup_forward_recv_info and
    _setup_backward_recv_info, torch 2.13): counted in layer inputs (2 s b h / t bytes with SP), the activation ones
    in the stage's activations, the gradient ones as buffers; none without the knob."""
    model = gpt_shape(num_layers=48, hidden_size=4096, num_attention_heads=32, num_kv_heads=32, ffn_hidden_size=16384)
    layout = Layout(dp=2, tp=4, pp=p, zero_stage=1, micro_batch_size=2, num_micro_batches=m, recompute="full",
                    sequence_parallel=True, schedule=schedule, virtual_stages=v)
    plain, torch_pp = (stage_model(model, BF16, _hw(), layout, k) for k in (Knobs(), TORCH_PIPELINING))
    layer_input = 2 * 2048 * 2 * 4096 / 4
    assert torch_pp.receive_buffer_bytes() == ([a * layer_input for a in acts], [g * layer_input for g in grads])
    assert plain.receive_buffer_bytes() == ([0.0] * p, [0.0] * p)
    for i in range(p):
        a, b = plain.memory(i), torch_pp.memory(i)
        assert b.activations_bytes - a.activations_bytes == pytest.approx(acts[i] * layer_input, rel=1e-12)
        assert b.transient_bytes - a.transient_bytes == pytest.approx(grads[i] * layer_input, rel=1e-12)


@pytest.mark.parametrize("schedule, v, held", [("1f1b", 1, 1), ("interleaved_1f1b", 2, 1), ("zero_bubble", 1, 1),
                                               ("gpipe", 1, 8)])
def test_the_output_layer_holds_the_global_last_stages_micro_batches(schedule, v, held):
    """The final norm, logits and loss live in the global last stage, which runs each micro-batch's backward right
    after its forward under the 1F1B family (one held) and holds all m under GPipe; under interleaving the last
    rank's whole-stage count ((v - 1) p + 1) / v = 2.5 here, which multiplied them before, is its chunks' average."""
    model = gpt_shape(num_layers=48, hidden_size=4096, num_attention_heads=32, num_kv_heads=32, ffn_hidden_size=16384)
    layout = Layout(dp=2, tp=4, pp=4, zero_stage=1, micro_batch_size=2, num_micro_batches=8, recompute="full",
                    sequence_parallel=True, schedule=schedule, virtual_stages=v)
    sm = stage_model(model, BF16, _hw(), layout, Knobs())
    assert sm.output_in_flight() == held
    last = sm.memory(3)
    layers = sm.activations_per_micro_batch()[3] * last.in_flight_micro_batches
    assert last.activations_bytes == pytest.approx(layers + held * sm.lc.output_act_bytes, rel=1e-12)
    if schedule == "interleaved_1f1b":
        assert last.in_flight_micro_batches == 2.5


@pytest.mark.parametrize("schedule, held", [("1f1b", 1), ("gpipe", 8)])
def test_torch_cross_entropy_keeps_4_bytes_per_logit_and_holds_8_more_at_its_backward(schedule, held):
    """torch's F.cross_entropy on fp32-cast logits (TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT, 12): its fp32
    log-softmax output (4 B per logit) is kept for every micro-batch the output layer holds; the fp32 incoming and
    input gradients (8) live only during one loss backward, a buffer of the last stage. Megatron's 4 are all kept."""
    from cost_models.memory import TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT

    model = gpt_shape(num_layers=8, hidden_size=1024, num_attention_heads=8, num_kv_heads=8, ffn_hidden_size=4096,
                      vocab_size=32000)
    layout = Layout(dp=1, tp=2, pp=2, micro_batch_size=2, num_micro_batches=8, recompute="full",
                    sequence_parallel=True, schedule=schedule)
    megatron, torch_ce = (stage_model(model, BF16, _hw(), layout, Knobs(loss_bytes_per_logit=b))
                          for b in (4.0, TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT))
    logits = 2048 * 2 * 32000 / 2  # s b V / t on one GPU
    a, b = megatron.memory(1), torch_ce.memory(1)
    assert megatron.lc.loss_transient_bytes == 0.0
    assert b.activations_bytes == pytest.approx(a.activations_bytes, rel=1e-12)  # 4 B kept per held micro-batch
    assert b.transient_bytes - a.transient_bytes == pytest.approx(8 * logits, rel=1e-12)  # once, not x held
    assert megatron.output_in_flight() == held
    assert torch_ce.memory(0) == megatron.memory(0)  # the first stage has no loss


def test_loss_parallel_holds_4_more_bytes_per_local_logit_under_tp_only():
    """torch's loss_parallel (TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT, 16; measured in tests/test_head_memory_torch.py)
    applies where TP shards the vocabulary: 4 B per local logit more at the loss's backward than the unsharded loss
    (12), the same 4 B kept; at TP 1 the profile's own loss holds."""
    from cost_models.memory import (
        TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT,
        TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT,
    )

    model = gpt_shape(num_layers=4, hidden_size=1024, num_attention_heads=8, num_kv_heads=8, ffn_hidden_size=4096,
                      vocab_size=32000)
    plain = Knobs(loss_bytes_per_logit=TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT)
    sharded = replace(plain, loss_parallel_bytes_per_logit=TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT)
    for tp, extra in ((2, 4.0), (1, 0.0)):
        layout = Layout(dp=1, tp=tp, pp=1, micro_batch_size=2, num_micro_batches=1, recompute="full",
                        sequence_parallel=tp > 1)
        a, b = (stage_model(model, BF16, _hw(), layout, k) for k in (plain, sharded))
        assert b.lc.output_act_bytes == pytest.approx(a.lc.output_act_bytes, rel=1e-12)
        assert b.lc.loss_transient_bytes - a.lc.loss_transient_bytes == pytest.approx(
            extra * 2048 * 2 * 32000 / tp, rel=1e-12)


@pytest.mark.parametrize("tied", [False, True])
def test_fsdp_keeps_the_output_unit_gathered_on_the_last_stage(tied):
    """FSDP (a layer a unit) keeps the unit holding the output projection (final norm + output layer, or the tied
    embedding) gathered from forward to backward (stage.fsdp_head_unit_params; torch's fully_shard root, checked in
    tests/test_head_memory_torch.py): its parameters in the compute dtype on top of the layer units. DeepSpeed's
    ZeRO-3 (a module at a time) releases them after use; under full recompute it holds this small layer's modules
    from their recompute to their backward (data_parallel.zero3_regathered_modules: all within its reuse distance)."""
    model = gpt_shape(num_layers=4, hidden_size=1024, num_attention_heads=8, num_kv_heads=8, ffn_hidden_size=4096,
                      vocab_size=32000, tied_embeddings=tied)
    layout = Layout(dp=8, tp=1, pp=1, zero_stage=3, micro_batch_size=1, num_micro_batches=1, recompute="full")
    fsdp, module = (stage_model(model, BF16, _hw(), layout, Knobs(zero3_gather=g))
                    for g in (Zero3Gather.LAYER, Zero3Gather.MODULE))
    # V h + the final LayerNorm's weight and bias; tied, the unit is the embedding's, learned positions included
    head = 32000 * 1024 + 2 * 1024 + (2048 * 1024 if tied else 0)
    layer, largest = fsdp.lc.layer_params, fsdp.lc.largest_module_params
    assert sum(module.lc.module_params) == pytest.approx(layer, rel=1e-12)
    assert fsdp.memory(0).transient_bytes - layer * (2 * 2 + 4) == pytest.approx(
        module.memory(0).transient_bytes - (max(2 * largest, layer) * 2 + largest * 4) + head * 2, rel=1e-12)


def test_hybrid_sharding_shards_states_over_its_group_and_all_reduces_across_replicas():
    """HSDP (Layout.dp_shard): the model states divide by the sharding group (x CP), not all DP ranks; the sharding
    group runs ZeRO's collectives and the dp / dp_shard replicas all-reduce each gradient shard, after every
    micro-batch under ZeRO-3 (data_parallel.replica_all_reduce_seconds); one more NCCL communicator (the
    replicas'). dp_shard = dp is plain ZeRO."""
    from cost_models.communication import all_reduce_seconds, group_link
    from cost_models.data_parallel import zero_comm_seconds
    from cost_models.nccl import COMMUNICATOR_BYTES
    from cost_models.step import dp_comm_seconds

    model = gpt_shape(num_layers=8, hidden_size=2048, num_attention_heads=16, num_kv_heads=16, ffn_hidden_size=8192)
    hw = _hw()
    base = Layout(dp=32, tp=2, pp=1, zero_stage=3, micro_batch_size=1, num_micro_batches=4, recompute="full",
                  sequence_parallel=True)
    knobs = Knobs(zero3_overlap_fraction=0.0)
    full, same, hsdp = (stage_model(model, BF16, hw, replace(base, dp_shard=s), knobs) for s in (0, 32, 8))
    assert same.memory(0) == full.memory(0) and hsdp.layout.zero_replicas == 4
    P = full.params(0)
    w, g, o = state_bytes_per_param(BF16, zero_stage=3, dp=8)
    m = hsdp.memory(0)
    assert (m.weights_bytes, m.gradients_bytes, m.optimizer_bytes) == pytest.approx((P * w, P * g, P * o), rel=1e-12)
    assert m.optimizer_bytes == pytest.approx(full.memory(0).optimizer_bytes * 4, rel=1e-12)
    assert m.overhead_bytes == pytest.approx(full.memory(0).overhead_bytes + COMMUNICATOR_BYTES, rel=1e-12)
    times = [hsdp.time(0)]
    total, _ = dp_comm_seconds(hw, BF16, model, knobs, hsdp, times, [P])
    shard_link = group_link(hw, group_size=8, stride=2).link
    replica_link = group_link(hw, group_size=4, stride=16).link
    want = (zero_comm_seconds(zero_stage=3, params=P, grad_reduce_bytes=BF16.grad_reduce_bytes,
                              param_bytes=BF16.param_bytes, dp=8, layers=8, num_micro_batches=4, link=shard_link)
            + 4 * all_reduce_seconds(message_bytes=P * BF16.grad_reduce_bytes / 8, group_size=4, link=replica_link))
    assert total == pytest.approx(want, rel=1e-9)
    # DeepSpeed's MiCS all-reduces the accumulated shards once, at the accumulation boundary: 3 all-reduces fewer
    once = replace(knobs, hsdp_replica_reduce_once=True)
    total_once, _ = dp_comm_seconds(hw, BF16, model, once, stage_model(model, BF16, hw, hsdp.layout, once),
                                    times, [P])
    one = all_reduce_seconds(message_bytes=P * BF16.grad_reduce_bytes / 8, group_size=4, link=replica_link)
    assert total_once == pytest.approx(want - 3 * one, rel=1e-9)


def test_estimate_reports_the_stage_model():
    model = gpt_shape(num_layers=10, hidden_size=2048, num_attention_heads=16, num_kv_heads=16, ffn_hidden_size=8192)
    layout = Layout(dp=32, tp=1, pp=4, zero_stage=1, num_micro_batches=16)
    est = estimate_step(model, BF16, _hw(), layout)
    sm = stage_model(model, BF16, _hw(), layout, Knobs())
    assert [st.layers for st in est.stages] == [2, 3, 3, 2] == list(stage_split(10, 4))
    assert est.stages == tuple(sm.memory(i) for i in range(4))
    assert est.stage_seconds == tuple(sm.time(i).total_seconds for i in range(4))


# ---- production against the paper formulas ---------------------------------------------------------------


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_stage_states_equal_the_zero_paper_table(zero):
    model = gpt_shape(num_layers=24, hidden_size=2048, num_attention_heads=16, num_kv_heads=16, ffn_hidden_size=8192)
    layout = Layout(dp=128, tp=1, pp=1, zero_stage=zero, num_micro_batches=4)
    st = estimate_step(model, BF16, _hw(), layout).stages[0]
    want = oracles.zero_model_state_bytes(num_params=st.params, dp=128, zero_stage=zero, param_bytes=2, grad_bytes=4,
                                          optimizer_bytes=12)
    assert st.weights_bytes + st.gradients_bytes + st.optimizer_bytes == pytest.approx(want, rel=1e-12)
    assert sum(state_bytes_per_param(BF16, zero_stage=zero, dp=128)) * st.params == pytest.approx(want, rel=1e-12)


def test_interleaved_first_stage_activations_equal_korthikanti():
    # Korthikanti et al. 2022 Eq. 5 with the interleave factor 1 + (p-1)/(p v): selective recompute, TP + SP, GPT
    p, v, t = 4, 3, 4
    model = gpt_shape(num_layers=48, hidden_size=4096, num_attention_heads=32, num_kv_heads=32, ffn_hidden_size=16384)
    layout = Layout(dp=8, tp=t, pp=p, zero_stage=1, num_micro_batches=16, recompute="selective",
                    sequence_parallel=True, schedule="interleaved_1f1b", virtual_stages=v)
    sm = stage_model(model, BF16, _hw(), layout, Knobs())
    layers_only = sm.memory(0).activations_bytes - sm.lc.embedding_act_bytes * sm.in_flight(0)
    want = oracles.korthikanti_first_stage_activation_bytes(
        seq_length=2048, micro_batch_size=1, hidden_size=4096, num_heads=32, num_layers=48, tp=t, pp=p,
        virtual_stages=v, sequence_parallel=True, selective=True)
    assert layers_only == pytest.approx(want, rel=1e-12)
    assert sm.lc.act_policy_bytes == activation_bytes_per_layer(model, seq_length=2048, micro_batch_size=1, tp=t,
                                                                sequence_parallel=True, recompute="selective")


# ---- Megatron's async TP all-reduce (the backward input-gradient all-reduces under weight-gradient GEMMs) ------


def test_async_tp_all_reduce_hides_at_most_each_wgrad_gemm():
    from cost_models.stage import tp_backward_hidden_seconds

    # GPT 18.4B shard (h 6144, 48 heads, f 4h) at tp 4, one micro-batch of 2 x 2048 tokens, 100 TFLOP/s: by hand,
    # QKV's weight gradient is 2 * 4096 * 6144 * 18432 / 4 = 231.9 GFLOP = 2.319 ms, FC1's 309.2 GFLOP = 3.092 ms
    model = gpt_shape(num_layers=40, hidden_size=6144, num_attention_heads=48, num_kv_heads=48,
                      ffn_hidden_size=4 * 6144)
    on = Knobs(tp_async_grad_allreduce=True)
    kw = dict(tokens=4096, tp=4, rate_flops_per_second=100e12)
    qkv, fc1 = 2 * 4096 * 6144 * 18432 / 4 / 100e12, 2 * 4096 * 6144 * 24576 / 4 / 100e12
    assert (qkv, fc1) == pytest.approx((2.3193e-3, 3.0924e-3), rel=1e-4)
    # a short all-reduce hides entirely behind each GEMM; a long one only for the GEMM's duration
    assert tp_backward_hidden_seconds(model, on, all_reduce_seconds=1e-3, **kw) == pytest.approx(2e-3)
    assert tp_backward_hidden_seconds(model, on, all_reduce_seconds=2.8e-3, **kw) == pytest.approx(
        qkv + 2.8e-3)
    assert tp_backward_hidden_seconds(model, on, all_reduce_seconds=1.0, **kw) == pytest.approx(qkv + fc1)
    # off by default (the knob), and nothing to hide without TP
    assert tp_backward_hidden_seconds(model, Knobs(), all_reduce_seconds=1e-3, **kw) == 0.0
    assert tp_backward_hidden_seconds(model, on, all_reduce_seconds=1e-3, **{**kw, "tp": 1}) == 0.0


def test_async_tp_all_reduce_shortens_the_step_by_the_hidden_time():
    # pp 1: the step falls by exactly layers x micro-batches x the hidden time, and only the TP term moves; the
    # linear form the ILP optimises carries the same saving
    model = gpt_shape(num_layers=40, hidden_size=6144, num_attention_heads=48, num_kv_heads=48,
                      ffn_hidden_size=4 * 6144)
    lay = Layout(tp=8, pp=1, dp=32, micro_batch_size=8, num_micro_batches=4, recompute=Recompute.FULL)
    training = replace(BF16, global_batch_size=1024)
    hw = _hw()
    off, on = Knobs(tp_overlap_fraction=0.0), Knobs(tp_overlap_fraction=0.0, tp_async_grad_allreduce=True)
    a, b = estimate_step(model, training, hw, lay, off), estimate_step(model, training, hw, lay, on)
    sm = stage_model(model, training, hw, lay, on)
    hidden = sm.lc.t_tp_backward_hidden
    assert 0 < hidden <= 2 * sm.lc.t_tp_all_reduce
    assert a.step_seconds - b.step_seconds == pytest.approx(40 * 4 * hidden, rel=1e-9)
    assert a.time.tp_comm_seconds - b.time.tp_comm_seconds == pytest.approx(40 * 4 * hidden, rel=1e-9)
    assert a.time.compute_seconds == pytest.approx(b.time.compute_seconds, rel=1e-12)
    lin_off, lin_on = stage_model(model, training, hw, lay, off).linear(0), sm.linear(0)
    assert lin_off.layer_seconds - lin_on.layer_seconds == pytest.approx(hidden, rel=1e-9)
