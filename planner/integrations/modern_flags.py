"""What each framework's launch settings say for context parallelism, expert parallelism, MoE/MLA shapes and FP8,
or why it cannot say it (refusals raise SpecError, exit 3).

Option names: ../shared/reference/frameworks.md §1.9 (torchtitan), §2.8 (Megatron-LM), §3.8 (DeepSpeed), §6.1
(the degree table). Megatron's recipe names are its own (`--fp8-recipe {tensorwise,delayed,mxfp8,blockwise}`),
torchtitan's come from torchao (`recipe_name` in {tensorwise, rowwise, rowwise_with_gw_hp}).
"""

from __future__ import annotations

from cluster_specs import SpecError
from planner.frameworks import Framework
from planner.frameworks.capabilities import capabilities, fp8_gathers_params
from planner.inputs.specs import LayoutSpec, ModelSpec, TrainingSpec

MEGATRON_CP_COMM = {"p2p": "p2p", "all_gather": "allgather", "a2a": "a2a"}
MEGATRON_FP8_RECIPES = capabilities(Framework.MEGATRON).fp8_recipes
TORCHTITAN_FP8_RECIPES = capabilities(Framework.TORCHTITAN).fp8_recipes
# Megatron-Bridge `mixed_precision=` recipe names per FP8 recipe (frameworks.md §4.6, training/mixed_precision.py)
NEMO_FP8_MIXED_PRECISION = {"delayed": "bf16_with_fp8_delayed_scaling_mixed",
                            "tensorwise": "bf16_with_fp8_current_scaling_mixed",
                            "blockwise": "bf16_with_fp8_subchannel_scaling_mixed", "mxfp8": "bf16_with_mxfp8_mixed"}

# The feature table (README "Modern training in the exports"): what each export can express
FEATURE_TABLE = [
    ("context parallel, ring (p2p)", "--context-parallel-size, --cp-comm-type p2p", "context_parallel_degree",
     "refused (DeepSpeed has Ulysses only)"),
    ("context parallel, all-gather", "--cp-comm-type allgather", "refused (ring only)", "refused"),
    ("context parallel, Ulysses (a2a)", "--cp-comm-type a2a", "refused (ring only)",
     "sequence_parallel_size (+ Megatron-DeepSpeed --ds-sequence-parallel-size)"),
    ("expert parallel", "--expert-model-parallel-size, --expert-tensor-parallel-size, --num-experts, "
     "--moe-router-topk, --moe-ffn-hidden-size, --moe-layer-freq, --moe-router-num-groups, "
     "--moe-router-group-topk (node-limited routing)", "expert_parallel_degree (+ etp 1)",
     "refused (ep_size is an argument of deepspeed.moe.layer.MoE in model code)"),
    ("MLA", "--multi-latent-attention, --q-lora-rank, --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim, "
     "--v-head-dim", "model code (DeepSeek-V3 model args)", "model code"),
    ("FP8", "--fp8-format hybrid, --fp8-recipe tensorwise|delayed|blockwise|mxfp8, --fp8-param-gather",
     "float8 converter, recipe_name tensorwise|rowwise, enable_fsdp_float8_all_gather (tensorwise)",
     "refused (no FP8 switch in DeepSpeed's config; FP8 comes from Transformer Engine in model code)"),
    ("optimizer states below fp32", "--grad-reduce-in-bf16, --use-precision-aware-optimizer, --main-grads-dtype, "
     "--main-params-dtype, --exp-avg-dtype, --exp-avg-sq-dtype", "refused (fp32 states only)",
     "refused (fp32 states only)"),
]


def _megatron_cp_args(layout: LayoutSpec, *, deepspeed: bool) -> list[tuple[str, object]]:
    if layout.cp == 1:
        return []
    if not deepspeed:
        return [("--context-parallel-size", layout.cp), ("--cp-comm-type", MEGATRON_CP_COMM[layout.cp_comm])]
    caps = capabilities(Framework.MEGATRON_DEEPSPEED)
    why = caps.refusal({"cp": layout.cp, "cp_comm": layout.cp_comm, "sequence_parallel": layout.sequence_parallel})
    if why:
        raise SpecError(f"cp: {why}; plan with --framework megatron-deepspeed or export with --to megatron")
    return [("--ds-sequence-parallel-size", layout.cp)]


def megatron_args(layout: LayoutSpec, model: ModelSpec, training: TrainingSpec, *,
                  deepspeed: bool = False) -> list[tuple[str, object]]:
    """Megatron-LM's flags for CP, EP, MoE/MLA shapes and FP8; with `deepspeed` (Megatron-DeepSpeed) CP is its
    Ulysses --ds-sequence-parallel-size (frameworks.md §3.1), and a ring or all-gather CP is refused."""
    args = _megatron_cp_args(layout, deepspeed=deepspeed)
    moe = model.moe
    if moe is not None:
        args += [("--num-experts", moe.num_experts), ("--moe-router-topk", moe.top_k),
                 ("--moe-ffn-hidden-size", moe.expert_ffn_hidden_size), ("--moe-grouped-gemm", None),
                 ("--moe-token-dispatcher-type", "alltoall"),
                 ("--expert-model-parallel-size", layout.ep), ("--expert-tensor-parallel-size", layout.etp)]
        if moe.shared_expert_ffn_hidden_size:
            args.append(("--moe-shared-expert-intermediate-size", moe.shared_expert_ffn_hidden_size))
        if moe.num_dense_layers:
            dense, sparse = moe.num_dense_layers, model.num_layers - moe.num_dense_layers
            args.append(("--moe-layer-freq", f"([0]*{dense}+[1]*{sparse})"))
        if moe.capacity_factor is not None:
            args.append(("--moe-expert-capacity-factor", moe.capacity_factor))
        if moe.expert_groups is not None:  # Megatron-LM transformer_config.py moe_router_num_groups/group_topk
            args += [("--moe-router-num-groups", moe.expert_groups), ("--moe-router-group-topk", moe.groups_per_token)]
    if model.mla is not None:
        mla = model.mla
        args += [("--multi-latent-attention", None), ("--kv-lora-rank", mla.kv_lora_rank),
                 ("--qk-head-dim", mla.qk_nope_head_dim), ("--qk-pos-emb-head-dim", mla.qk_rope_head_dim),
                 ("--v-head-dim", mla.v_head_dim)]
        if mla.q_lora_rank is not None:
            args.append(("--q-lora-rank", mla.q_lora_rank))
    if training.precision == "fp8":
        if training.fp8_recipe not in MEGATRON_FP8_RECIPES:
            raise SpecError(f"fp8_recipe: {training.fp8_recipe} -> Megatron-LM's --fp8-recipe takes "
                            f"{', '.join(MEGATRON_FP8_RECIPES)} (rowwise is torchao's); plan with tensorwise")
        args += [("--bf16", None), ("--fp8-format", "hybrid"), ("--fp8-recipe", training.fp8_recipe)]
        if training.fp8_param_gather:
            args.append(("--fp8-param-gather", None))
    return args


def torchtitan_settings(layout: LayoutSpec, model: ModelSpec, training: TrainingSpec) -> tuple[dict, dict]:
    """(parallelism keys, the float8 section or {}) for torchtitan's TOML."""
    caps = capabilities(Framework.TORCHTITAN)
    if layout.cp > 1 and layout.cp_comm not in caps.cp_comms:
        raise SpecError(f"cp_comm: {layout.cp_comm} -> torchtitan's context parallelism is torch's ring "
                        "(context_parallel); plan with cp_comm p2p or export with --to megatron")
    if layout.etp > 1 and not caps.expert_tensor_parallel:
        raise SpecError(f"etp: {layout.etp} -> torchtitan has no expert-tensor parallelism in its config (experts "
                        "borrow ranks from FSDP and TP); plan with etp 1 or export with --to megatron")
    par = {"context_parallel_degree": layout.cp}
    if model.moe is not None:
        par["expert_parallel_degree"] = layout.ep
    float8: dict = {}
    if training.precision == "fp8":
        if training.fp8_recipe not in TORCHTITAN_FP8_RECIPES:
            raise SpecError(f"fp8_recipe: {training.fp8_recipe} -> torchtitan's float8 (torchao) takes "
                            f"{', '.join(TORCHTITAN_FP8_RECIPES)}; plan with one of them or export with --to megatron")
        float8 = {"recipe_name": training.fp8_recipe, "filter_fqns": ["output", "router.gate"]}
        if fp8_gathers_params(Framework.TORCHTITAN, training.fp8_recipe) and layout.zero_stage >= 1:
            float8 |= {"enable_fsdp_float8_all_gather": True, "precompute_float8_dynamic_scale_for_fsdp": True}
    return par, float8


def nemo_settings(layout: LayoutSpec, model: ModelSpec, training: TrainingSpec) -> list[tuple[str, object]]:
    """Megatron-Bridge overrides for CP, EP and the mixed-precision recipe (the mcore ModelParallelConfig field
    names, as Megatron-LM's flags without the dashes: context_parallel_size, expert_model_parallel_size, ...)."""
    kv: list[tuple[str, object]] = []
    if layout.cp > 1:
        kv += [("model.context_parallel_size", layout.cp), ("model.cp_comm_type", MEGATRON_CP_COMM[layout.cp_comm])]
    if model.moe is not None:
        kv += [("model.expert_model_parallel_size", layout.ep), ("model.expert_tensor_parallel_size", layout.etp)]
    precision = {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp32": None}.get(training.precision)
    if training.precision == "fp8":
        if training.fp8_recipe not in NEMO_FP8_MIXED_PRECISION:
            raise SpecError(f"fp8_recipe: {training.fp8_recipe} -> Megatron-Bridge's FP8 recipes are "
                            f"{', '.join(NEMO_FP8_MIXED_PRECISION)}; plan with --framework nemo")
        precision = NEMO_FP8_MIXED_PRECISION[training.fp8_recipe]
    return [("mixed_precision", precision), *kv]


def deepspeed_settings(layout: LayoutSpec, model: ModelSpec, training: TrainingSpec) -> dict:
    """Keys to add to the DeepSpeed JSON; refusals for what its config cannot carry."""
    if training.precision == "fp8":
        raise SpecError("precision: fp8 -> DeepSpeed's config has no FP8 training switch (FP8 comes from Transformer "
                        "Engine in model code); export with --to megatron or --to torchtitan")
    caps = capabilities(Framework.DEEPSPEED)
    if layout.ep > 1 and not caps.expert_parallel:
        raise SpecError(f"ep: {layout.ep} -> DeepSpeed sets expert parallelism in model code "
                        "(deepspeed.moe.layer.MoE(ep_size=...)), not in its config; export with --to megatron")
    if layout.cp > 1 and layout.cp_comm not in caps.cp_comms:
        raise SpecError(f"cp: {layout.cp} with cp_comm {layout.cp_comm} -> DeepSpeed has Ulysses (a2a) sequence "
                        "parallelism only; plan with cp_comm a2a or export with --to megatron")
    return {"sequence_parallel_size": layout.cp} if layout.cp > 1 else {}


def deepspeed_state_settings(layout: LayoutSpec, training: TrainingSpec) -> dict:
    """The `bf16` section's keys for bf16 optimizer states (DeepSpeed >= 0.18.3; Capabilities.state_dtype_sets keeps
    to the sets they lower): bf16_master_weights_and_grads for the master weights, with bf16_optimizer_states for
    the moments too; master weights alone need the optimizer offloaded to DeepSpeedCPUAdam (stage_1_and_2.py
    _enforce_cpu_offload)."""
    states = training.low_precision_states
    if not states:
        return {}
    if training.precision != "bf16":
        raise SpecError(f"optimizer states: {', '.join(states)} bf16 with precision {training.precision} -> DeepSpeed's "
                        "bf16.bf16_master_weights_and_grads is for a bf16 model; plan with --precision bf16")
    if len(states) == 1 and layout.offload == "none":
        raise SpecError("optimizer states: master_dtype bf16 alone -> DeepSpeed's bf16_master_weights_and_grads "
                        "without bf16_optimizer_states needs the optimizer offloaded (DeepSpeedCPUAdam keeps the fp32 "
                        "moments); plan with --optimizer-states master=bf16,moments=bf16 or with offload=optimizer")
    return {"bf16_master_weights_and_grads": True} | ({"bf16_optimizer_states": True} if len(states) > 1 else {})


# Megatron-LM's state dtype names (arguments.py: --main-grads-dtype {fp32,bf16}, --main-params-dtype {fp32,fp16},
# --exp-avg-dtype / --exp-avg-sq-dtype {fp32,fp16,bf16,fp8}) and the torch dtypes its validate_args maps them to,
# which are the OptimizerConfig values Megatron-Bridge overrides take (fp8 moments are torch.uint8)
TORCH_STATE_DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16", "fp8": "torch.uint8"}
# Megatron-Bridge's OptimizerConfig fields -> TrainingSpec's (the export writes them, the reader reads them back)
BRIDGE_STATE_FIELDS = {"optimizer.main_params_dtype": "master_dtype", "optimizer.exp_avg_dtype": "exp_avg_dtype",
                       "optimizer.exp_avg_sq_dtype": "exp_avg_sq_dtype"}
_STATE_FLAGS = (("master_dtype", "main-params-dtype"), ("exp_avg_dtype", "exp-avg-dtype"),
                ("exp_avg_sq_dtype", "exp-avg-sq-dtype"))


def refuse_states(framework: Framework, layout: LayoutSpec, training: TrainingSpec) -> None:
    """A one-line error when the framework's launch settings cannot keep the training's gradient buffer and optimizer
    states in their dtypes at this ZeRO stage (torchtitan, DeepSpeed and Megatron-DeepSpeed keep only the defaults;
    Megatron needs the distributed optimizer); every export calls it (exports._refuse)."""
    caps = capabilities(framework)
    why = caps.state_dtype_problem(training) or caps.state_zero_problem(training, layout.zero_stage)
    if why:
        fix = (f"plan with --framework {framework.value}" if caps.state_dtypes else
               "plan without --optimizer-states, or export with --to megatron or --to nemo")
        raise SpecError(f"optimizer states: {why}; {fix}")


def megatron_state_args(layout: LayoutSpec, training: TrainingSpec) -> list[tuple[str, object]]:
    """Megatron-LM's flags for a gradient buffer and optimizer states off their defaults: --grad-reduce-in-bf16
    (bf16 main grads, arguments.py L1204-1216), --accumulate-allreduce-grads-in-fp32 (fp32 main grads under fp16), and
    the precision-aware optimizer's dtypes, which need the distributed optimizer (arguments.py L3666-3684)."""
    grad = training.grad_dtype_off_default
    args: list[tuple[str, object]] = []
    if grad == "bf16":
        args.append(("--grad-reduce-in-bf16", None))
    elif grad == "fp32":
        args.append(("--accumulate-allreduce-grads-in-fp32", None))
    states = training.low_precision_states
    if states:
        if layout.offload != "optimizer":  # the offload flags already carry it
            args.append(("--use-precision-aware-optimizer", None))
        if grad == "bf16":
            args.append(("--main-grads-dtype", "bf16"))
        args += [(f"--{flag}", states[key]) for key, flag in _STATE_FLAGS if key in states]
    return args


def nemo_state_settings(layout: LayoutSpec, training: TrainingSpec) -> tuple[list[tuple[str, object]], list[str]]:
    """(Megatron-Bridge overrides, notes) for the same states: OptimizerConfig's use_precision_aware_optimizer and
    main_*/exp_avg* torch dtypes, MixedPrecisionConfig.grad_reduce_in_fp32 for the gradient buffer."""
    grad = training.grad_dtype_off_default
    kv: list[tuple[str, object]] = []
    notes: list[str] = []
    if grad is not None:
        # Bridge copies MixedPrecisionConfig.grad_reduce_in_fp32 over ddp.grad_reduce_in_fp32 at setup
        # (training/mixed_precision.py update_config_with_precision_overrides), so the mixed-precision field is the one
        kv.append(("mixed_precision.grad_reduce_in_fp32", grad == "fp32"))
        notes.append(f"gradients in {grad}: mixed_precision.grad_reduce_in_fp32 applies where the recipe's "
                     "mixed_precision is a MixedPrecisionConfig (as in Megatron-Bridge's perf recipes, "
                     "perf_recipes/_common.py); where it is a recipe name, set cfg.mixed_precision.grad_reduce_in_fp32 "
                     f"= {grad == 'fp32'} in the recipe function")
    states = training.low_precision_states
    if states:
        kv.append(("optimizer.use_precision_aware_optimizer", True))
        if grad == "bf16":
            kv.append(("optimizer.main_grads_dtype", TORCH_STATE_DTYPES["bf16"]))
        kv += [(key, TORCH_STATE_DTYPES[states[name]]) for key, name in BRIDGE_STATE_FIELDS.items() if name in states]
    return kv, notes

