"""Framework execution profiles (planner/frameworks/profiles.py) and the DP-overlap semantics they feed."""

from dataclasses import replace

import pytest

from cost_models.inputs import Hardware, Knobs, Layout, Link, Training
from cost_models.step import estimate_step
from planner.frameworks import Framework
from planner.frameworks.profiles import PROFILES, profile_for, profile_knobs
from tests.conftest import gpt_shape


def test_every_framework_has_a_sourced_profile():
    assert set(PROFILES) == set(Framework)
    for p in PROFILES.values():
        for _, statement, source in p.assumptions():
            assert statement and len(source) > 20, (p.framework, statement)


def test_memory_recipes_bytes_per_param():
    # frameworks.md §2.5: Megatron bf16 + fp32 main grads + optimizer = 18 B; §1.6: FSDP2 MixedPrecisionPolicy(bf16,
    # fp32) 16 B (no master copy apart from the sharded fp32 params); §3.5: DeepSpeed ZeRO estimator 2 + 18 = 20 B
    assert profile_for("megatron").memory.bytes_per_param == 18
    assert profile_for("torchtitan").memory.bytes_per_param == 16
    assert profile_for("deepspeed").memory.bytes_per_param == 20
    # Megatron-DeepSpeed ZeRO-1 runs DeepSpeedZeroOptimizer (stage_1_and_2.py @8eef742) with contiguous_gradients
    # off (engine.py ignores it at stage 1, 2021-07 to 2024-01): 16-bit params 2 + grads 2 unsharded, and at the step
    # fp32 master 4 + Adam 8 + the flattened 16-bit partition 2 + its fp32 copy 4 = 18 / d (no grads_in_partition)
    mds = profile_for("megatron-deepspeed")
    assert (mds.memory.param_bytes, mds.memory.grad_bytes, mds.memory.optimizer_bytes) == (2, 2, 18)
    # the reduce flattens a 5e8-element bucket of 16-bit grads and, in bf16, casts it to fp16 (allreduce_bucket's
    # default communication_data_type at that commit): 2 GB in bf16, 1 GB in fp16
    assert (mds.memory.bucket_bytes, mds.recipe("fp16").bucket_bytes) == (5e8 * 4, 5e8 * 2)
    # the same optimizer runs fp16 and bf16 at ZeRO-1; at ZeRO-0 bf16 runs BF16_Optimizer, its own ZeRO-1:
    # 2 + 4 (fp32 grad buffer) + 2 (the all-reduce's bf16 cast of that whole buffer) + 12 / d (bf16_optimizer.py
    # L141-210; engine.py allreduce_bucket, v0.6.4-v0.9.0), no bucket besides; fp16 runs FP16_Optimizer, nothing
    # sharded: 2 + 2 + 4 (per-parameter fp32 grads) + 4 (their flat copy) + 12 (fused_optimizer.py step), and the
    # engine's 1 GB fp16 all-reduce bucket
    assert mds.recipe("fp16").bytes_per_param == 22
    from cost_models.inputs import Zero0Optimizer

    assert mds.memory.zero0 == Zero0Optimizer((2, 6, 12), sharded=True, bucket_bytes=0.0)
    assert mds.recipe("fp16").zero0 == Zero0Optimizer((2, 10, 12), sharded=False, bucket_bytes=None)


def test_generic_profile_is_the_knobs_default():
    # estimate/plan without --framework and Knobs() must be the same numbers
    k, d = profile_knobs(None, Knobs()), Knobs()
    for name in ("dp_overlap_fraction", "pp_overlap_fraction", "tp_overlap_fraction", "zero3_overlap_fraction",
                 "per_process_overhead_bytes", "allocator_reserve_fraction", "nccl_groups", "nccl_bytes_scale"):
        assert getattr(k, name) == getattr(d, name), name


def test_profiles_differ_where_the_frameworks_do():
    # DeepSpeed: ZeRO-1/2 with the overlap_comm the export writes (0.9 of the bucket all-reduce, 2/3 of the ZeRO-1
    # traffic), ZeRO-0 (engine all-reduce after backward) none
    assert profile_knobs("deepspeed").dp_overlap_fraction == pytest.approx(0.6)
    assert profile_knobs("deepspeed").ddp_overlap_fraction == 0.0
    assert profile_knobs("megatron-deepspeed").dp_overlap_fraction == 0.0  # pipeline engine: after the flush
    assert profile_knobs("megatron").ddp_overlap_fraction is None  # --overlap-grad-reduce serves DDP too
    assert profile_knobs("megatron").dp_overlap_fraction == 0.9  # --overlap-grad-reduce
    assert profile_knobs("deepspeed").zero3_gather == "module"
    assert profile_knobs("torchtitan").allocator_reserve_fraction < profile_knobs("megatron").allocator_reserve_fraction
    # kernel efficiency by generation applies only where the profile names it
    base = Knobs()
    mds = "megatron-deepspeed"
    assert profile_knobs(mds, base, gpu_generation="ampere").end_to_end_efficiency < base.end_to_end_efficiency
    assert profile_knobs(mds, base, gpu_generation="hopper").end_to_end_efficiency == base.end_to_end_efficiency


def test_megatron_deepspeed_context_is_the_one_bigscience_measured_on_each_gpu():
    # BigScience (tr11-176B-ml/chronicles-prequel.md): 'cuda kernels (1271MiB)' on V100 (tr8-104B) and '40GB A100
    # takes 1573MiB for cuda kernels'; the other profiles keep their single 1.3 GB, and validation applies the same
    # per-generation value (family_knobs)
    from planner.validation import family_knobs

    mib = 2**20
    assert profile_knobs("megatron-deepspeed", gpu_generation="ampere").per_process_overhead_bytes == 1573 * mib
    assert profile_knobs("megatron-deepspeed", gpu_generation="volta").per_process_overhead_bytes == 1271 * mib
    assert profile_knobs("megatron-deepspeed").per_process_overhead_bytes == 1271 * mib
    assert profile_knobs("megatron", gpu_generation="ampere").per_process_overhead_bytes == 1.3e9
    assert family_knobs("megatron-deepspeed", generation="ampere").per_process_overhead_bytes == 1573 * mib
    stated = {k for k, _, _ in profile_for("megatron-deepspeed").assumptions()}
    assert "per_process_overhead_bytes[ampere]" in stated


def test_unknown_framework_is_a_clear_error():
    with pytest.raises(ValueError, match="framework: 'jax' -> must be one of"):
        profile_for("jax")


def _a100_64():
    nv = Link(230e9, 5e-6)
    return Hardware("A100", 80e9, 312e12, 0.869, 1.8e12, 8, 8, nv, "nvlink", Link(22.5e9, 10e-6), 8, Link(25e9, 1e-5),
                    2e12)


def test_dp_overlap_is_a_share_of_the_traffic():
    # issue 10: 22B on 64 A100 with ZeRO-3 had 4.2 s of gathers hidden entirely (the knob capped traffic at a share
    # of the compute window). Now the exposed part is at least (1 - share) of the traffic.
    model = gpt_shape(num_layers=48, hidden_size=6144, num_attention_heads=48, ffn_hidden_size=4 * 6144)
    training = Training(global_batch_size=512, seq_length=2048, activation_bytes=2, param_bytes=2, grad_bytes=4,
                        optimizer_bytes=12, grad_reduce_bytes=4)
    layout = Layout(dp=64, tp=1, pp=1, zero_stage=3, micro_batch_size=1, num_micro_batches=8, recompute="full")
    for share in (0.0, 0.5, 0.8, 1.0):
        est = estimate_step(model, training, _a100_64(), layout, replace(Knobs(), zero3_overlap_fraction=share))
        total, exposed = est.time.dp_comm_total_seconds, est.time.dp_comm_seconds
        assert total > 1.0
        assert exposed == pytest.approx(total * (1 - share), rel=1e-9, abs=1e-12)  # compute window is larger here
    # the hidden part never exceeds the compute it hides behind
    tiny = Layout(dp=64, tp=1, pp=1, zero_stage=3, micro_batch_size=1, num_micro_batches=1, recompute="none")
    t2 = replace(training, global_batch_size=64, seq_length=128)
    est = estimate_step(model, t2, _a100_64(), tiny, replace(Knobs(), zero3_overlap_fraction=1.0))
    assert est.time.dp_comm_seconds >= est.time.dp_comm_total_seconds - est.time.compute_seconds - 1e-12
    assert est.time.dp_comm_seconds > 0


def test_megatron_deepspeed_states_per_zero_stage():
    # the recipe reaches the cost model through the problem: ZeRO-1 -> DeepSpeedZeroOptimizer 2 + 2 + 18/d,
    # ZeRO-0 bf16 -> BF16_Optimizer 2 + 6 + 12/d (it shards its own optimizer state over DP), and each stage's
    # reduce buffers follow the optimizer that runs: 2 GB (bf16 bucket + its fp16 cast) at ZeRO-1, none at ZeRO-0
    # (the cast is the 2 B/param above), fp16's 1 GB at both
    from cluster_specs import load_cluster
    from cost_models.stage import state_bytes_per_param
    from planner.inputs.models import load_model
    from planner.inputs.specs import TrainingSpec
    from planner.problem import Problem

    def states(precision, zero):
        knobs = profile_knobs("megatron-deepspeed", precision=precision)
        problem = Problem(load_model("bloom-176b"), TrainingSpec(global_batch_size=2048, seq_length=2048,
                                                                 precision=precision),
                          load_cluster("dgx-a100-80gb", nodes=48), knobs)
        return state_bytes_per_param(problem.cm_training, zero_stage=zero, dp=8)

    assert states("bf16", 1) == (2, 2, 2.25)
    assert states("bf16", 0) == (2, 6, 1.5)
    assert states("fp16", 1) == (2, 2, 2.25)
    assert states("fp16", 0) == (2, 10, 12)  # fp16 at ZeRO-0: FP16_Optimizer's 24 bytes, unsharded
    from cost_models.stage import bucket_bytes

    buckets = {(p, z): bucket_bytes(profile_knobs("megatron-deepspeed", precision=p), zero_stage=z)
               for p in ("bf16", "fp16") for z in (0, 1)}
    assert buckets == {("bf16", 0): 0.0, ("bf16", 1): 2e9, ("fp16", 0): 1e9, ("fp16", 1): 1e9}


LLAMA3_8B = gpt_shape(num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
                      vocab_size=128256, swiglu=True, tied_embeddings=False, rms_norm=True, flash_attention=True,
                      learned_position_embeddings=False, bias=False, dropout=False)


def test_swiglu_activations_follow_the_frameworks_kernel():
    """Megatron-Core fuses SwiGLU (bias_swiglu_impl saves FC1's output only: Megatron-LM's --bias-swiglu-fusion
    default, NeMo 2's LlamaConfig bias_activation_fusion=True); torchtitan's FeedForward, HF models under DeepSpeed
    and the generic profile run silu(x w1) * (x w3) under autograd, which also keeps the SiLU output and the up
    projection."""
    from cost_models.memory import activation_bytes_per_layer

    fused = {f for f in Framework if profile_knobs(f).fused_swiglu}
    assert fused == {Framework.MEGATRON, Framework.NEMO}
    # Llama 3 8B, 4096 tokens on the rank, tp 1, no recompute. By hand (memory.py's component list, bytes per token
    # and hidden unit): norm inputs 4 + QKV and FC1 inputs 4 + Q 2 + K and V 2 x 2 x 8/32 = 1 + projection input 2
    # = 13, plus the MLP's 6 f/h (fused: FC1's 2 f outputs and FC2's f input) or 8 f/h (autograd), plus flash
    # attention's fp32 log-sum-exp, 4 a s b
    s, h, f, a = 4096, 4096, 14336, 32
    for kernel_fused, mlp in ((True, 6), (False, 8)):
        got = activation_bytes_per_layer(LLAMA3_8B, seq_length=s, micro_batch_size=1, fused_swiglu=kernel_fused)
        assert got == pytest.approx(s * h * 13 + s * mlp * f + 4 * a * s, rel=1e-12)


def test_nemo_llama31_8b_cp2_fits_without_recompute_as_it_ran():
    """NVIDIA's DGX Cloud Llama 3.1 8B recipe ran TP 1, CP 2, DP 4, MBS 1 at 8192 tokens on 8 H100 without
    activation checkpointing (NeMo-Framework-Launcher llama3_1_8b.yaml: activations_checkpoint_granularity null;
    published_runs.json dgxc-llama31-8B-bf16-8gpu, 12.78 s). With NeMo's fused SwiGLU the layout is 'tight' (its
    live tensors, context and NCCL communicators fit: 78.3 of 79.6 GiB; with the allocator's reserve, 80.5 GiB, it
    relies on the allocator giving cached blocks back); with autograd's SwiGLU bytes (8 s b f) its live tensors alone
    would not fit (81.8 GiB)."""
    from planner.bands import band_for, verdict_for
    from planner.estimate import build_problem, estimate_layout, layout_from_arg

    problem = build_problem("dgx-h100", 1, "llama3-8b", 128, 8192, framework="nemo", headroom_gib=0)
    layout = layout_from_arg("tp=1,pp=1,dp=4,cp=2,zero=1,mbs=1,recompute=none", problem)
    est = estimate_layout(problem, layout)
    assert verdict_for(problem, est, band_for(problem, est)) != "does not fit"
    unfused = replace(problem, knobs=replace(problem.knobs, fused_swiglu=False))
    est = estimate_layout(unfused, layout)
    assert verdict_for(unfused, est, band_for(unfused, est)) == "does not fit"


def test_transformer_engine_attention_is_stated_for_hopper_only():
    """Megatron-Core and NeMo run Transformer Engine, which prefers cuDNN's fused attention on Hopper
    (get_attention_backend); its forward+backward efficiency there is a stated fact, 0.50 of peak (FlashAttention-3
    paper, cuDNN at head dim 128: 470-521 TFLOPs/s of 989 over s 2k-8k). Elsewhere nothing is stated (0)."""
    for fw in (Framework.MEGATRON, Framework.NEMO):
        assert profile_knobs(fw, gpu_generation="hopper").attention_kernel_efficiency == 0.50
        assert profile_knobs(fw, gpu_generation="ampere").attention_kernel_efficiency == 0.0
        assert profile_knobs(fw).attention_kernel_efficiency == 0.0
    for fw in (Framework.DEEPSPEED, Framework.MEGATRON_DEEPSPEED, Framework.GENERIC):
        assert profile_knobs(fw, gpu_generation="hopper").attention_kernel_efficiency == 0.0
    assert any(k == "attention_kernel_efficiency" for k, _, _ in profile_for("nemo").assumptions())


def _training(s):
    return Training(global_batch_size=8, seq_length=s, activation_bytes=2, param_bytes=2, grad_bytes=4,
                    optimizer_bytes=12, grad_reduce_bytes=4)


def _h100_layer(knobs: Knobs, *, flash: bool = True, cp: int = 1):
    from cluster_specs import load_cluster
    from cost_models.stage import layer_costs

    hw = load_cluster("dgx-h100", nodes=1).to_cost_model("bf16")
    model = replace(LLAMA3_8B, flash_attention=flash)
    layout = Layout(dp=8 // cp, tp=1, pp=1, zero_stage=1, micro_batch_size=1, num_micro_batches=1, cp=cp)
    return layer_costs(model, _training(8192), hw, layout, knobs), hw


@pytest.mark.parametrize("cp", [1, 2])
def test_a_stated_attention_kernel_runs_the_causal_half_at_its_own_rate(cp):
    """Llama 3 8B, 8192 tokens, one H100. The core's forward is 4 T s a d = 4 x 8192 x 8192 x 4096 FLOPs at the
    full s^2 convention (per rank: T = 8192 / cp). Without a stated kernel it runs at the layer's GEMM rate; with
    TE's cuDNN kernel (0.50 of peak, times the same end-to-end factor) it runs the causal (s+1)/(2s) of those
    FLOPs. The forward differs by exactly that; unfused attention (the whole masked matrix) is unchanged."""
    base = Knobs(end_to_end_efficiency=0.8)
    stated = replace(base, attention_kernel_efficiency=0.5)
    plain, hw = _h100_layer(base, cp=cp)
    fused, _ = _h100_layer(stated, cp=cp)
    s = 8192
    core = 4.0 * (s // cp) * s * 4096
    at_gemm_rate = core / plain.rate_flops_per_second
    on_kernel = core * (s + 1) / (2 * s) / (hw.peak_flops_per_second * 0.5 * 0.8)
    assert plain.t_layer_forward - fused.t_layer_forward == pytest.approx(at_gemm_rate - on_kernel, rel=1e-9)
    assert on_kernel < at_gemm_rate  # cuDNN on H100 beats the GEMM-rate convention (~0.35-0.40 of peak causal)
    # flash's backward recompute of Q K^T (half a core forward) moves with the kernel too
    assert fused.t_recompute_policy < plain.t_recompute_policy
    unfused_plain, _ = _h100_layer(base, flash=False, cp=cp)
    unfused_stated, _ = _h100_layer(stated, flash=False, cp=cp)
    assert unfused_plain == unfused_stated


def test_an_ampere_kernel_under_the_convention_runs_its_core_at_the_stated_share_of_the_gemm_rate():
    """Llama 3 8B, 8192 tokens, one H100, no kernel stated: the flash core's forward (4 x 8192 x 8192 x 4096 FLOPs)
    runs at the layer's GEMM rate times attention_convention_rate, so at rate 0.5 it takes exactly one more
    core-at-GEMM-rate; a stated kernel and unfused attention ignore the rate."""
    base = Knobs(end_to_end_efficiency=0.8)
    slow = replace(base, attention_convention_rate=0.5)
    plain, _ = _h100_layer(base)
    ampere, _ = _h100_layer(slow)
    core_at_gemm_rate = 4.0 * 8192 * 8192 * 4096 / plain.rate_flops_per_second
    assert ampere.t_layer_forward - plain.t_layer_forward == pytest.approx(core_at_gemm_rate, rel=1e-9)
    stated = replace(base, attention_kernel_efficiency=0.5)
    assert _h100_layer(replace(stated, attention_convention_rate=0.5))[0] == _h100_layer(stated)[0]
    assert _h100_layer(slow, flash=False)[0] == _h100_layer(base, flash=False)[0]


def test_llm_foundry_triton_attention_is_an_ampere_kernel_on_hopper():
    """llm-foundry's rows ran pre-MLIR Triton's flash attention, whose code generator emits Ampere's mma.sync, not
    Hopper's wgmma. On H100 it keeps FlashAttention-2's share of peak from A100 to H100 (0.30-0.33 of H100's,
    FlashAttention-3 Figs. 5-6; 50-73% of A100's, FlashAttention-2's abstract: 0.315 / 0.615), while the GEMMs of
    the convention go from A100's MAMF fraction (0.869) to H100's (794.5 / 989): 0.554 of the convention. On A100,
    and for torchtitan's rows, the convention itself (1)."""
    from cluster_specs import load_cluster, load_gpu
    from planner.validation import fsdp_attention_convention_rate

    expected = (0.315 / 0.615) * (0.869 / (794.5 / 989))
    foundry = {"framework": "llm-foundry/Composer FSDP FULL_SHARD (MP mode DEFAULT), FlashAttention"}
    titan = {"framework": "torchtitan (FSDP2)"}
    h100, a100 = load_cluster("dgx-h100", nodes=1), load_cluster("dgx-a100-80gb", nodes=1)
    assert fsdp_attention_convention_rate(foundry, h100) == pytest.approx(expected, rel=1e-3)
    assert load_gpu("A100-SXM4-80GB").matmul_efficiency == 0.869  # the MAMF fractions the docstring names
    assert load_gpu("H100-SXM").matmul_efficiency == pytest.approx(794.5 / 989, abs=1e-3)
    assert fsdp_attention_convention_rate(foundry, a100) == 1.0
    assert fsdp_attention_convention_rate(titan, h100) == 1.0


@pytest.mark.parametrize("framework, batch, layout_text, source", [
    ("nemo", 128, "tp=1,pp=1,dp=4,cp=2,zero=1,mbs=1,recompute=full", "Transformer Engine"),
    ("torchtitan", 16, "tp=1,pp=1,dp=8,zero=3,mbs=2,recompute=selective", "torchtitan#1776"),
])
def test_the_attention_kernel_is_an_assumption_a_hopper_plan_names(framework, batch, layout_text, source):
    """Llama 3.1 8B at 8192 tokens on DGX H100 under NeMo (TE) or torchtitan (SDPA, cuDNN first): cuDNN's attention
    is a named assumption, with the step time it would take at the GEMM-rate convention (slower); on DGX A100 nothing
    is stated, nothing named."""
    def named(cluster):
        return _named_assumptions(cluster, 1, "llama3-8b", batch, 8192, framework, layout_text,
                                  "fused causal attention")

    est, found = named("dgx-h100")
    assert len(found) == 1 and found[0]["step_time_seconds_if_not"] > est.step_seconds
    assert source in found[0]["source"]
    assert named("dgx-a100-80gb")[1] == []


def test_torchtitan_asks_for_cudnn_attention_and_its_older_runs_for_flash_attention_2():
    """torchtitan runs SDPA under sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, ...], set_priority=True) since
    torchtitan#1776 (2025-10): on Hopper, cuDNN's fused attention, the kernel Transformer Engine runs (0.50 of peak).
    Its runs of 2025 took FlashAttention-2 first (torchtitan#1196; torch's own order from pytorch#141274): 0.315
    (FlashAttention-3 paper, Figs. 5-6: 0.30-0.33); those of 2024 (torch 2.4 FlashAttention-2, 2.5.0 cuDNN, torch not
    printed) keep the GEMM-rate convention, which lies between the two (~0.35-0.40 of peak on the causal FLOPs for
    Llama 3 8B at 8192 tokens); llm-foundry's rows ran its own Triton kernel and keep it too (on Hopper at an Ampere
    kernel's share of it: test_llm_foundry_triton_attention_is_an_ampere_kernel_on_hopper). Ampere: nothing
    stated (a plan names it: test_the_attention_kernel_is_an_assumption_a_hopper_plan_names)."""
    from planner.frameworks.profiles import FLASH_ATTENTION_2_HOPPER, TE_FUSED_ATTENTION_HOPPER
    from planner.validation import fsdp_attention_kernel

    assert 0.30 <= FLASH_ATTENTION_2_HOPPER <= 0.33 < TE_FUSED_ATTENTION_HOPPER
    hopper = profile_knobs("torchtitan", gpu_generation="hopper").attention_kernel_efficiency
    assert hopper == TE_FUSED_ATTENTION_HOPPER
    assert profile_knobs("torchtitan", gpu_generation="ampere").attention_kernel_efficiency == 0.0
    plain, hw = _h100_layer(Knobs(end_to_end_efficiency=0.8))
    causal_share = (8192 + 1) / (2 * 8192)
    convention = causal_share * plain.rate_flops_per_second / (hw.peak_flops_per_second * 0.8)
    assert FLASH_ATTENTION_2_HOPPER < convention < TE_FUSED_ATTENTION_HOPPER
    assert 0.35 <= convention <= 0.40

    def row(framework, source):
        return {"framework": framework, "source": source}

    titan = "torchtitan (FSDP2)"
    assert fsdp_attention_kernel(row(titan, "docs/performance.md (commit eaea6f6a, 2025-02-02)"), hopper) \
        == FLASH_ATTENTION_2_HOPPER
    assert fsdp_attention_kernel(row(titan, "docs/performance.md (commit 3faaa1a0, 2024-08-23)"), hopper) == 0.0
    assert fsdp_attention_kernel(row(titan, "a run of 2026-03"), hopper) == hopper
    assert fsdp_attention_kernel(row(titan, "a run with no date"), hopper) == hopper
    assert fsdp_attention_kernel(row(titan, "a run of 2025-02"), 0.0) == 0.0  # off Hopper
    assert fsdp_attention_kernel(row("llm-foundry/Composer FSDP", "README (2024-04-22)"), hopper) == 0.0


def _named_assumptions(cluster, nodes, model, batch, seq, framework, layout_text, phrase):
    """(the estimate, the plan's ranked assumptions whose statement holds `phrase`) for one layout."""
    from planner.estimate import assumptions_json, build_problem, estimate_layout, layout_from_arg

    problem = build_problem(cluster, nodes, model, batch, seq, framework=framework, headroom_gib=0)
    layout = layout_from_arg(layout_text, problem)
    est = estimate_layout(problem, layout)
    return est, [a for a in assumptions_json(problem, layout, est) if phrase in a["statement"]]


def test_megatron_deepspeed_on_a100_runs_at_its_fitted_factor_and_says_so():
    """The Megatron-DeepSpeed profile scales the end-to-end efficiency on Ampere only (the generation its evidence
    is from: MT-NLG and BigScience on A100), and an A100 plan names that factor with the step time without it:
    faster by 1/0.8 on the compute it scales; on H100 nothing is stated, nothing named."""
    from planner.frameworks.profiles import MEGATRON_DEEPSPEED_AMPERE_KERNEL_EFFICIENCY as factor

    base = Knobs()
    ampere = profile_knobs("megatron-deepspeed", base, gpu_generation="ampere")
    assert ampere.end_to_end_efficiency == pytest.approx(base.end_to_end_efficiency * factor)
    hopper = profile_knobs("megatron-deepspeed", base, gpu_generation="hopper")
    assert hopper.end_to_end_efficiency == base.end_to_end_efficiency

    def named(cluster):
        return _named_assumptions(cluster, 2, "gpt3-1.3b", 64, 2048, "megatron-deepspeed",
                                  "tp=1,pp=1,dp=16,zero=1,mbs=4,recompute=full", "end-to-end efficiency")

    est, found = named("dgx-a100-80gb")
    assert len(found) == 1 and "MT-NLG 126 vs Megatron-LM 159" in found[0]["source"]
    # without the factor the step is faster, by at most 1/0.8 (only the compute is scaled, not the traffic)
    ratio = est.step_seconds / found[0]["step_time_seconds_if_not"]
    assert 1.0 < ratio <= 1 / factor + 1e-9
    assert named("dgx-h100")[1] == []


def test_the_layer_rate_saturates_on_its_fc1_gemm_per_gpu():
    """The layer's GEMM rate is the MAMF fraction x x/(x + 2 GFLOP) x the end-to-end factor, x its FC1 GEMM per
    GPU: 2 T h f / tp. Llama 3 8B, 8192 tokens, tp 2 on H100: x = 2 x 8192 x 4096 x 14336 / 2 / 1e9 = 481 GFLOP;
    at 256 tokens x = 15.0 GFLOP, where the size term matters (0.88). The shape term is off here (half dimension
    0); the next test has it on."""
    from cluster_specs import load_cluster
    from cost_models.stage import layer_costs

    hw = load_cluster("dgx-h100", nodes=1).to_cost_model("bf16")
    for s in (8192, 256):
        lc = layer_costs(LLAMA3_8B, _training(s), hw, _TP2,
                         Knobs(end_to_end_efficiency=0.8, gemm_half_efficiency_dim=0.0))
        x = 2 * s * 4096 * 14336 / 2 / 1e9
        assert lc.matmul_efficiency == pytest.approx(hw.matmul_efficiency * x / (x + 2.0) * 0.8, rel=1e-12)
        assert lc.rate_flops_per_second == pytest.approx(hw.peak_flops_per_second * lc.matmul_efficiency, rel=1e-12)


_TP2 = Layout(dp=4, tp=2, pp=1, zero_stage=1, micro_batch_size=1, num_micro_batches=2, sequence_parallel=True)


def test_the_layer_rate_scales_with_its_gemms_smallest_sides():
    """The shape term (stage.py gemm_shape_factor, half dimension 192) by hand, Llama 3 8B at tp 2: per rank QKV is
    4096 x (4096 + 2 x 1024) / 2 = 4096 x 3072, the projection 2048 x 4096, FC1 4096 x 2 x 14336 / 2 = 4096 x 14336
    (SwiGLU), FC2 7168 x 4096. At 8192 tokens their smallest sides are 3072, 2048, 4096, 4096, each d / (d + 192),
    combined harmonically weighted by k x n (the summed GEMM time); at 256 tokens every GEMM's smallest side is the
    tokens, 256 / 448 = 4/7. The flash kernel's time does not take the shape term (it is not these GEMMs)."""
    from cluster_specs import load_cluster
    from cost_models.stage import gemm_shape_factor, layer_costs

    sides = ((4096, 3072), (2048, 4096), (4096, 14336), (7168, 4096))
    weights = [k * n for k, n in sides]
    by_hand = sum(weights) / sum(w * (m + 192) / m for w, m in zip(weights, (3072, 2048, 4096, 4096), strict=True))
    assert gemm_shape_factor(LLAMA3_8B, tokens=8192, tp=2, half_dim=192.0) == pytest.approx(by_hand, rel=1e-12)
    assert gemm_shape_factor(LLAMA3_8B, tokens=256, tp=2, half_dim=192.0) == pytest.approx(4 / 7, rel=1e-12)
    assert gemm_shape_factor(LLAMA3_8B, tokens=256, tp=2, half_dim=0.0) == 1.0
    hw = load_cluster("dgx-h100", nodes=1).to_cost_model("bf16")
    for s, factor in ((8192, by_hand), (256, 4 / 7)):
        on = layer_costs(LLAMA3_8B, _training(s), hw, _TP2,
                         Knobs(end_to_end_efficiency=0.8, gemm_half_efficiency_dim=192.0))
        off = layer_costs(LLAMA3_8B, _training(s), hw, _TP2,
                          Knobs(end_to_end_efficiency=0.8, gemm_half_efficiency_dim=0.0))
        assert on.matmul_efficiency == pytest.approx(off.matmul_efficiency * factor, rel=1e-12)
    # with a stated flash kernel its time is the same whatever the GEMMs' shapes: only the GEMM part moves
    kernel = Knobs(end_to_end_efficiency=0.8, attention_kernel_efficiency=0.5)
    on = layer_costs(LLAMA3_8B, _training(8192), hw, _TP2, kernel)
    off = layer_costs(LLAMA3_8B, _training(8192), hw, _TP2, replace(kernel, gemm_half_efficiency_dim=0.0))
    assert on.t_recompute_policy == pytest.approx(off.t_recompute_policy, rel=1e-12)
    assert on.t_recompute_policy > 0 and on.t_layer_forward > off.t_layer_forward  # the kernel's QK^T; GEMMs slower


def test_torchtitans_eager_default_is_named_with_the_compiled_step_time():
    """The torchtitan profile predicts eager (compile off, its default) and names it among the assumptions, with
    the step time compiled (Knobs.compiled_elementwise_share at COMPILED_ELEMENTWISE_SHARE) as the alternative;
    Megatron's profile (fused kernels, no compile flag) names nothing of the kind."""
    from dataclasses import replace

    from planner.estimate import build_problem, layout_from_arg
    from planner.frameworks.profiles import COMPILED_ELEMENTWISE_SHARE

    args = ("dgx-h100", 1, "llama3-8b", 16, 8192)
    layout_text = "tp=1,pp=1,dp=8,zero=3,mbs=2,recompute=selective"
    est, found = _named_assumptions(*args, "torchtitan", layout_text, "the model runs eager")
    assert len(found) == 1 and "compile.enable" in found[0]["source"]
    problem = build_problem(*args, framework="torchtitan", headroom_gib=0)
    compiled = replace(problem.knobs, compiled_elementwise_share=COMPILED_ELEMENTWISE_SHARE.value)
    other = type(problem)(problem.model, problem.training, problem.cluster, compiled)
    expected = other.estimate(layout_from_arg(layout_text, problem)).step_seconds
    assert found[0]["step_time_seconds_if_not"] == pytest.approx(expected, rel=1e-9)
    # the elementwise kernels are more than a tenth of this step (a sequence of 8192 on an 8B model: at mbs 2,
    # 1.985 s eager and 1.739 s compiled at the shipped knobs; README shows mbs 1), so the alternative is at least
    # 10% faster
    assert found[0]["step_time_seconds_if_not"] < est.step_seconds * 0.9
    assert _named_assumptions(*args, "megatron", "tp=1,pp=1,dp=8,zero=1,mbs=2,recompute=selective",
                              "the model runs eager")[1] == []


def test_compile_option_predicts_the_compiled_step_the_assumption_names():
    """--compile (TrainingSpec.compile) is the compiled step the eager assumption names as its alternative, and
    then the assumption is gone; a framework without a compile setting refuses it, naming the option."""
    from cluster_specs import SpecError
    from planner.estimate import build_problem, layout_from_arg

    args = ("dgx-h100", 1, "llama3-8b", 16, 8192)
    layout_text = "tp=1,pp=1,dp=8,zero=3,mbs=2,recompute=selective"
    _, found = _named_assumptions(*args, "torchtitan", layout_text, "the model runs eager")
    problem = build_problem(*args, framework="torchtitan", headroom_gib=0, compile_model=True)
    assert problem.training.compile
    step = problem.estimate(layout_from_arg(layout_text, problem)).step_seconds
    assert step == pytest.approx(found[0]["step_time_seconds_if_not"], rel=1e-9)
    for framework in ("megatron", "nemo", "deepspeed", "megatron-deepspeed"):
        with pytest.raises(SpecError, match="--compile: compile: true -> .* has no setting"):
            build_problem(*args, framework=framework, compile_model=True)
    assert build_problem(*args, compile_model=True).training.compile  # generic: any stack may compile


def test_deepspeeds_reuse_distance_is_an_assumption_a_zero3_recompute_plan_names():
    """Llama 2 70B on 8 A100 nodes, ZeRO-3 with full recompute under DeepSpeed: the reuse distance it keeps a
    recomputed module gathered within (stage3_max_reuse_distance, 1e9) is named, with the step time at 0 (every
    module gathered again: slower); with selective recompute nothing is gathered again and it is not named; FSDP
    (torchtitan) never names it."""
    args = ("dgx-a100-80gb", 8, "llama2-70b", 64, 4096)
    full = "tp=1,pp=1,dp=64,zero=3,mbs=1,recompute=full"
    est, found = _named_assumptions(*args, "deepspeed", full, "keeps a recomputed module gathered")
    assert len(found) == 1 and "stage3_max_reuse_distance" in found[0]["source"]
    assert found[0]["step_time_seconds_if_not"] > est.step_seconds
    assert _named_assumptions(*args, "deepspeed", full.replace("full", "selective"),
                              "keeps a recomputed module gathered")[1] == []
    assert _named_assumptions(*args, "torchtitan", full, "keeps a recomputed module gathered")[1] == []


def test_deepspeed_reduces_bf16_gradients_in_16_bits():
    """DeepSpeed reduces gradients in its engine's communication_data_type, bf16 for a bf16 model (runtime/engine.py),
    while its recipe keeps 16-bit gradients: the DP traffic moves 2 B per gradient, and so does Megatron-DeepSpeed's
    (BigScience's branch casts each bucket to fp16 at ZeRO-1, to bf16 at ZeRO-0), where Megatron's fp32 main
    gradients and torch FSDP2's default reduce_dtype move 4; fp16 training reduces in 2 B everywhere; a training
    spec's own grad_reduce_dtype wins."""
    from planner.estimate import build_problem

    args = ("dgx-a100-80gb", 8, "llama2-13b", 256, 4096)
    for framework, bf16_bytes in (("deepspeed", 2), ("megatron-deepspeed", 2), ("megatron", 4), ("torchtitan", 4),
                                  ("generic", 4)):
        assert build_problem(*args, framework=framework).cm_training.grad_reduce_bytes == bf16_bytes, framework
        if framework != "torchtitan":  # which trains in bf16 or fp32 only
            assert build_problem(*args, precision="fp16", framework=framework).cm_training.grad_reduce_bytes == 2
    ds = build_problem(*args, framework="deepspeed")
    fp32 = type(ds)(ds.model, ds.training.model_copy(update={"grad_reduce_dtype": "fp32"}), ds.cluster, ds.knobs)
    assert fp32.cm_training.grad_reduce_bytes == 4


@pytest.mark.parametrize("framework", list(Framework))
def test_an_assumptions_short_reason_never_cuts_a_word(framework):
    """The reason an assumption line quotes from its source is cut at a word boundary, with an ellipsis where text
    was dropped: torchtitan's FSDP overlap once read 'overlap compute, backward_prefetc' (the 90-character cut)."""
    from planner.frameworks.profiles import FLAG_CHARS, _flag_of

    for _knob, _statement, source in profile_for(framework).assumptions():
        short = _flag_of(source)
        assert len(short) <= FLAG_CHARS
        if short.endswith("…"):
            kept = short[:-1]
            assert source.startswith(kept)
            assert source[len(kept)] in " ,;:-"  # the cut falls between words
        else:
            assert source.startswith(short) and (len(short) == len(source) or source[len(short)] in " (;")
