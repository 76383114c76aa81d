"""What each training framework can run, as data with sources.

`plan --framework X` searches only layouts X can run; `export` refuses (or moves to the nearest expressible
layout) what X cannot express; `check` reads a config with X's defaults. Every fact cites
`../shared/reference/frameworks.md` (which cites the framework's code at a commit) or the framework's docs.

Layout vocabulary (the planner's): schedules `1f1b gpipe interleaved_1f1b zero_bubble naive pipedream_async`;
ZeRO stage 0-3; offload `none optimizer optimizer+params`; recompute `none selective full` (selective = Megatron's
core-attention recomputation); per-stage layer counts (`layers_per_stage`) and per-stage full-recompute counts
(`recompute_layers_per_stage`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from planner.frameworks import Framework
from planner.frameworks.megatron_split import MegatronSplitError, split_setting

if TYPE_CHECKING:
    from planner.inputs.specs import TrainingSpec

ALL_SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "pipedream_async")


@dataclass(frozen=True)
class Capabilities:
    framework: Framework
    schedules: tuple[str, ...]  # with pp > 1 (pp = 1 always runs as plain data parallelism)
    zero_stages: tuple[int, ...]  # without pipelining
    zero_stages_with_pp: tuple[int, ...]
    offload: tuple[str, ...]
    recompute: tuple[str, ...]
    optimizer_offload_zero_stages: tuple[int, ...] = (0, 1, 2, 3)  # ZeRO stages its optimizer-only offload runs at
    tensor_parallel_zero_stages: tuple[int, ...] = (0, 1, 2, 3)  # ZeRO stages that combine with tp > 1
    tensor_parallel_with_pp: bool = True
    sequence_parallel: bool = True  # Megatron-style SP on the TP group
    sequence_parallel_default: bool = False  # SP with tp > 1 where its config does not say
    no_sp_schedules: tuple[str, ...] = ()  # schedules that run without sequence parallelism
    sp_needs_tp: str = "warn"  # what SP with tp = 1 does: "warn" (disabled with a warning) or "error"
    uneven_split: str = "none"  # "any" | "megatron" (planner/frameworks/megatron_split.py) | "none"
    per_stage_recompute: str = "none"  # "any" | "same_count" (one count for every stage) | "none"
    max_virtual_stages: int = 1
    pads_vocab: bool = False  # pads the vocabulary to a multiple of tp itself (no divisibility rule)
    vocab_rule: str = ""
    precisions: tuple[str, ...] = ("bf16", "fp16", "fp32", "fp8")  # fp8: TE (Megatron/NeMo), torchao (torchtitan)
    # FP8 scaling recipes it runs (cost_models/fp8.py names) and the one it uses when none is asked for
    fp8_recipes: tuple[str, ...] = ("delayed", "tensorwise", "rowwise", "blockwise", "mxfp8")
    default_fp8_recipe: str = "tensorwise"
    # schedules it runs that the cost model predicts as another one (why): `plan` does not search them unless asked
    # (--schedules / --fix schedule=), and estimate, check and a plan's pick state the difference as an assumption
    unpredicted_schedules: dict[str, str] = field(default_factory=dict)
    cp_comms: tuple[str, ...] = ("p2p", "all_gather", "a2a")  # the context-parallel exchanges it runs (cp > 1)
    ulysses_excludes_sp: bool = False  # Ulysses (a2a) context parallelism cannot run with sequence parallelism
    expert_parallel: bool = True  # an expert-parallel degree its launch settings can set
    expert_tensor_parallel: bool = True  # an expert-tensor-parallel degree its launch settings can set
    # the optimizer-state dtypes it runs below fp32 (TrainingSpec field -> dtypes; a field not listed: fp32 only, and
    # grad_dtype only its precision's default) and the ZeRO stages that run them
    state_dtypes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    state_dtype_zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    # the sets of state fields its settings lower together (one switch sets several); empty: any combination
    state_dtype_sets: tuple[tuple[str, ...], ...] = ()
    # how its launch settings torch.compile the model (TrainingSpec.compile); empty: it has no such setting
    compile_setting: str = ""
    # ZeRO stages it shards over part of the DP ranks at (hybrid sharding, LayoutSpec.dp_shard); empty: none
    hybrid_shard_zero_stages: tuple[int, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)

    def compile_problem(self, compile_model: bool) -> str | None:
        """Why this framework cannot run the model compiled (TrainingSpec.compile), or None."""
        if compile_model and not self.compile_setting:
            return (f"compile: true -> {self.framework.value} has no setting that torch.compiles the model (its fused "
                    f"kernels are its own); torchtitan ({TORCHTITAN_COMPILE}) or generic run it")
        return None

    def state_zero_problem(self, training: TrainingSpec, zero_stage: int) -> str | None:
        """Why this framework cannot keep `training`'s lower-precision master copy and moments at this ZeRO stage."""
        if training.low_precision_states and zero_stage not in self.state_dtype_zero_stages:
            return (f"zero_stage {zero_stage} with {', '.join(training.low_precision_states)} below fp32 -> "
                    f"{self.framework.value} runs them at ZeRO {self.state_dtype_zero_stages} only "
                    f"({self.sources.get('states', '')})")
        return None

    def state_dtype_problem(self, training: TrainingSpec) -> str | None:
        """Why this framework cannot keep the optimizer states (master copy, moments, gradient buffer) in the dtypes
        `training` sets, or None."""
        given = dict(training.low_precision_states)
        if training.grad_dtype_off_default:
            given["grad_dtype"] = training.grad_dtype_off_default
        for key, dtype in given.items():
            allowed = self.state_dtypes.get(key, ())
            if dtype not in allowed:
                runs = f"{', '.join(allowed)} or the default" if allowed else "only the default"
                return (f"{key} {dtype} -> {self.framework.value} keeps {runs} "
                        f"({self.sources.get('states', 'fp32 master weights and moments')})")
        if given and self.state_dtype_sets and tuple(sorted(given)) not in self.state_dtype_sets:
            sets = " or ".join("+".join(s) for s in self.state_dtype_sets)
            return (f"{', '.join(sorted(given))} below fp32 -> {self.framework.value} lowers {sets} together "
                    f"({self.sources.get('states', '')})")
        return None

    def refusal(self, f: dict) -> str | None:
        """Why this framework cannot run the layout fields `f` (a LayoutSpec dump or a search base), or None."""
        for rule in (self._schedule_refusal, self._sharding_refusal, self._tp_refusal, self._split_refusal,
                     self._cp_ep_refusal):
            why = rule(f)
            if why:
                return f"{self.framework.value}: {why}"
        return None

    def _schedule_refusal(self, f: dict) -> str | None:
        pp, sched, v = f.get("pp", 1), f.get("schedule", "1f1b"), f.get("virtual_stages", 1)
        if pp > 1 and sched not in self.schedules:
            return (f"schedule {sched} -> not available; it runs {', '.join(self.schedules)} "
                    f"({self.sources.get('schedules', '')})")
        if v > self.max_virtual_stages:
            return f"virtual_stages {v} -> at most {self.max_virtual_stages} ({self.sources.get('schedules', '')})"
        return None

    def _sharding_refusal(self, f: dict) -> str | None:
        zero, pp = f.get("zero_stage", 0), f.get("pp", 1)
        allowed = self.zero_stages_with_pp if pp > 1 else self.zero_stages
        if zero not in allowed:
            with_pp = " with pipelining" if pp > 1 else ""
            return f"zero_stage {zero}{with_pp} -> allowed: {allowed} ({self.sources.get('zero', '')})"
        shard, dp = f.get("dp_shard"), f.get("dp", 1)
        if shard is not None and shard < dp:
            why = self.hybrid_shard_refusal(shard, zero, f" of dp {dp}")
            if why:
                return why
        why = self.offload_problem(f.get("offload", "none"), zero)
        if why:
            return why
        rec = f.get("recompute")
        if rec is not None and rec not in self.recompute:
            return f"recompute {rec} -> allowed: {', '.join(self.recompute)} ({self.sources.get('recompute', '')})"
        return None

    def offload_problem(self, off: str, zero: int) -> str | None:
        """Why this framework cannot offload `off` at ZeRO stage `zero`, or None."""
        if off not in self.offload:
            return f"offload {off} -> allowed: {', '.join(self.offload)} ({self.sources.get('offload', '')})"
        if off == "optimizer" and zero not in self.optimizer_offload_zero_stages:
            return (f"offload optimizer with zero_stage {zero} -> at ZeRO {self.optimizer_offload_zero_stages} only "
                    f"({self.sources.get('offload', '')})")
        return None

    def hybrid_shard_refusal(self, shard: int, zero: int | None, of_dp: str = "") -> str | None:
        """Why this framework cannot shard over `shard` of the dp ranks at ZeRO stage `zero` (None: at none of its
        stages), or None; `of_dp` names the dp degree where one is known."""
        stages = self.hybrid_shard_zero_stages
        if stages and (zero is None or zero in stages):
            return None
        at = f" at zero_stage {zero}" if zero is not None else ""
        allowed = f"hybrid sharding at zero_stage {stages}" if stages else "no hybrid sharding the planner writes"
        return (f"dp_shard {shard}{of_dp}{at} -> {allowed} "
                f"({self.sources.get('hsdp', 'shard over every dp rank: drop shard')})")

    def _tp_refusal(self, f: dict) -> str | None:
        tp, pp = f.get("tp", 1), f.get("pp", 1)
        if tp > 1 and f.get("zero_stage", 0) not in self.tensor_parallel_zero_stages:
            return (f"tp {tp} with zero_stage {f.get('zero_stage')} -> its tensor parallelism combines with ZeRO "
                    f"{self.tensor_parallel_zero_stages} only ({self.sources.get('tp', '')})")
        if tp > 1 and pp > 1 and not self.tensor_parallel_with_pp:
            return f"tp {tp} with pp {pp} -> its tensor parallelism does not combine with pipelining " \
                   f"({self.sources.get('tp', '')})"
        if f.get("sequence_parallel") and not self.sequence_parallel:
            return f"sequence_parallel -> not available ({self.sources.get('sp', '')})"
        if f.get("sequence_parallel") and pp > 1 and f.get("schedule") in self.no_sp_schedules:
            return f"sequence_parallel with {f.get('schedule')} -> not allowed ({self.sources.get('sp', '')})"
        return None

    def _split_refusal(self, f: dict) -> str | None:
        lps, rps = f.get("layers_per_stage"), f.get("recompute_layers_per_stage")
        if lps and len(set(lps)) > 1 and self.uneven_split == "none":
            return f"layers_per_stage {lps} -> no per-stage layer counts ({self.sources.get('split', '')})"
        if lps and self.uneven_split == "megatron":
            v = f.get("virtual_stages", 1) if f.get("schedule") == "interleaved_1f1b" else 1
            try:
                split_setting(sum(lps), len(lps), v, list(lps))
            except MegatronSplitError as exc:
                return f"layers_per_stage {exc} ({self.sources.get('split', '')})"
        if rps and len(set(rps)) > 1 and self.per_stage_recompute != "any":
            return (f"recompute_layers_per_stage {rps} -> "
                    + ("one recompute count for every stage" if self.per_stage_recompute == "same_count"
                       else "no per-stage recompute counts") + f" ({self.sources.get('recompute', '')})")
        if rps and self.per_stage_recompute == "none":
            return f"recompute_layers_per_stage {rps} -> no per-stage recompute counts " \
                   f"({self.sources.get('recompute', '')})"
        return None

    @property
    def planned_cp_comm(self) -> str | None:
        """The context-parallel exchange `plan` searches: the ring (p2p) where the framework runs it, else the one it
        runs (DeepSpeed's Ulysses all-to-all); None where it runs no context parallelism."""
        return "p2p" if "p2p" in self.cp_comms else (self.cp_comms[0] if self.cp_comms else None)

    def _cp_ep_refusal(self, f: dict) -> str | None:
        cp, comm = f.get("cp", 1), f.get("cp_comm", "p2p")
        if cp > 1 and comm not in self.cp_comms:
            runs = f"it runs cp_comm {', '.join(self.cp_comms)}" if self.cp_comms else "no context parallelism"
            return f"cp {cp} with cp_comm {comm} -> {runs} ({self.sources.get('cp', '')})"
        if cp > 1 and comm == "a2a" and f.get("sequence_parallel") and self.ulysses_excludes_sp:
            return f"cp {cp} (Ulysses) with sequence_parallel -> not allowed ({self.sources.get('cp', '')})"
        if f.get("ep", 1) > 1 and not self.expert_parallel:
            return f"ep {f['ep']} -> not in its launch settings ({self.sources.get('ep', '')})"
        if f.get("etp", 1) > 1 and not self.expert_tensor_parallel:
            return f"etp {f['etp']} -> no expert-tensor parallelism ({self.sources.get('ep', '')})"
        return None

    def vocab_problem(self, vocab_size: int, tp: int) -> str | None:
        """The vocabulary rule under tensor parallelism: None when the framework runs this vocabulary at this tp."""
        if tp == 1 or self.pads_vocab or vocab_size % tp == 0:
            return None
        return f"vocab_size: {vocab_size} -> not divisible by tp ({tp}); {self.vocab_rule}"

    def precision_problem(self, precision: str, fp8_recipe: str | None) -> str | None:
        """Why this framework cannot train in `precision` (with FP8: with `fp8_recipe`), or None."""
        if precision not in self.precisions:
            return (f"precision {precision} -> {self.framework.value} trains in {', '.join(self.precisions)} "
                    f"({self.sources.get('precision', '')})")
        if precision == "fp8" and fp8_recipe is not None and fp8_recipe not in self.fp8_recipes:
            return (f"fp8_recipe {fp8_recipe} -> {self.framework.value} runs {', '.join(self.fp8_recipes)} "
                    f"({self.sources.get('fp8', '')})")
        return None

    def padded_vocab(self, vocab_size: int, tp: int) -> int:
        """The vocabulary the framework builds (Megatron pads to a multiple of 128 x tp)."""
        if not self.pads_vocab:
            return vocab_size
        unit = 128 * tp
        return -(-vocab_size // unit) * unit


_MEGATRON_SOURCES = {
    "hsdp": "Megatron-Core's partial distributed optimizer: --num-distributed-optimizer-instances R (Bridge: "
            "ddp.num_distributed_optimizer_instances), the distributed optimizer over dp / R ranks and R instances "
            "all-reducing the gradient shards ('the factor by which the DP domain is sharded', megatron-core 0.16.1 "
            "DistributedDataParallelConfig); ZeRO-1 only",
    "schedules": "frameworks.md §2.3: upstream Megatron-LM has 1F1B and interleaved 1F1B, no zero-bubble",
    "zero": "frameworks.md §2.5/§2.7: distributed optimizer = ZeRO-1; Megatron-FSDP optim_grads = ZeRO-2, "
            "optim_grads_params = ZeRO-3; FSDP needs pp = 1",
    "offload": "--optimizer-cpu-offload moves only the optimizer, and runs with the distributed optimizer (ZeRO-1) "
               "(frameworks.md §2.4, §2.5)",
    "recompute": "frameworks.md §2.4: --recompute-method block --recompute-num-layers N is one count per model chunk",
    "split": "frameworks.md §2.3: --decoder-first/last-pipeline-num-layers with an even middle, "
             "--account-for-embedding/loss-in-pipeline-split, or a --pipeline-model-parallel-layout string (a layer "
             "in every virtual stage)",
    "sp": "--sequence-parallel (frameworks.md §2.6)",
    "vocab": "frameworks.md §2.5: padded to a multiple of --make-vocab-size-divisible-by (128) x tp",
    "fp8": "frameworks.md §2.8: --fp8-recipe {tensorwise,delayed,mxfp8,blockwise}, default delayed "
           "(transformer_config.py L587-600); rowwise is torchao's",
    "cp": "frameworks.md §2.8: --context-parallel-size with --cp-comm-type p2p (default), allgather, a2a, a2a+p2p",
    "ep": "frameworks.md §2.8: --expert-model-parallel-size, --expert-tensor-parallel-size",
    "states": "Megatron-LM arguments.py L3666-3684 (d98e8a64): --use-precision-aware-optimizer with "
              "--main-params-dtype {fp32,fp16}, --exp-avg-dtype / --exp-avg-sq-dtype {fp32,fp16,bf16,fp8}, only "
              "with the distributed optimizer (optimizer_config.py __post_init__); --grad-reduce-in-bf16 keeps the "
              "gradient buffer in bf16 (arguments.py L1204-1216)",
}
# Megatron-Core's precision-aware optimizer (TE FusedAdam): the dtypes it keeps the states in (arguments.py choices)
MEGATRON_STATE_DTYPES = {"master_dtype": ("fp16",), "exp_avg_dtype": ("fp16", "bf16", "fp8"),
                         "exp_avg_sq_dtype": ("fp16", "bf16", "fp8"), "grad_dtype": ("bf16", "fp32")}

MEGATRON = Capabilities(
    Framework.MEGATRON, schedules=("1f1b", "interleaved_1f1b"), zero_stages=(0, 1, 2, 3), zero_stages_with_pp=(0, 1),
    offload=("none", "optimizer"), recompute=("none", "selective", "full"), optimizer_offload_zero_stages=(1,),
    sp_needs_tp="warn",
    uneven_split="megatron", per_stage_recompute="same_count", max_virtual_stages=64, pads_vocab=True,
    vocab_rule="Megatron pads the vocabulary to a multiple of 128 x tp",
    fp8_recipes=("delayed", "tensorwise", "blockwise", "mxfp8"), default_fp8_recipe="delayed",
    state_dtypes=MEGATRON_STATE_DTYPES, state_dtype_zero_stages=(1,), hybrid_shard_zero_stages=(1,),
    sources=_MEGATRON_SOURCES)

NEMO = Capabilities(
    Framework.NEMO, schedules=("1f1b", "interleaved_1f1b"), zero_stages=(0, 1, 2, 3), zero_stages_with_pp=(0, 1),
    offload=("none", "optimizer"), recompute=("none", "selective", "full"), optimizer_offload_zero_stages=(1,),
    sp_needs_tp="error",
    uneven_split="megatron", per_stage_recompute="same_count", max_virtual_stages=64, pads_vocab=True,
    vocab_rule="Megatron-Core pads the vocabulary to a multiple of 128 x tp",
    fp8_recipes=("delayed", "tensorwise", "blockwise", "mxfp8"), default_fp8_recipe="tensorwise",
    state_dtypes=MEGATRON_STATE_DTYPES, state_dtype_zero_stages=(1,), hybrid_shard_zero_stages=(1,),
    sources={**_MEGATRON_SOURCES,
             "sp": "frameworks.md §4.5: Megatron-Bridge builds the mcore config directly: SP with tp = 1 is a "
                   "ValueError",
             "fp8": "frameworks.md §4.6: Bridge mixed_precision recipes fp8 delayed / current (tensorwise) / "
                    "subchannel (blockwise) / mxfp8; MixedPrecisionConfig.fp8_recipe defaults to tensorwise"})

TORCHTITAN_ZERO_BUBBLE = (
    "zero_bubble is predicted as ZB-H1 (one stage per rank, 1F1B's memory); torchtitan has no ZB-H1: its zero-bubble "
    "schedules hold two or more stages per rank (ZBVZeroBubble, InterleavedZeroBubble; frameworks.md §1.4), and "
    "torch 2.13's schedules keep every micro-batch's loss until the step ends, which with the backward split into "
    "input and weight passes keeps the last stage's graph alive (the CPU bench: the last stage holds about two "
    "thirds of each micro-batch's activations after its weight pass), so its memory per rank is above the "
    "prediction")
"""Why `plan --framework torchtitan` does not search zero_bubble unless asked (Capabilities.unpredicted_schedules)."""

TORCHTITAN_COMPILE_SECTION = {"enable": True, "components": ["model"]}
"""torchtitan's setting that torch.compiles each transformer block (CompileConfig; the export writes it): the loss
left eager, as the torchtitan profile counts its bytes (torchtitan's own default compiles the loss too)."""
TORCHTITAN_COMPILE = f"compile.enable = true, compile.components = {TORCHTITAN_COMPILE_SECTION['components']}"

TORCHTITAN = Capabilities(
    Framework.TORCHTITAN, schedules=("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"), zero_stages=(0, 2, 3),
    zero_stages_with_pp=(0, 1), offload=("none", "optimizer+params"), recompute=("none", "selective", "full"),
    sp_needs_tp="warn", sequence_parallel_default=True, uneven_split="any", per_stage_recompute="none",
    max_virtual_stages=64,
    vocab_rule="torchtitan does not pad the vocabulary; the planner requires tp to divide it for the sharded "
               "embedding and output",
    precisions=("bf16", "fp32", "fp8"), fp8_recipes=("rowwise", "tensorwise"), default_fp8_recipe="rowwise",
    unpredicted_schedules={"zero_bubble": TORCHTITAN_ZERO_BUBBLE}, cp_comms=("p2p",), expert_tensor_parallel=False,
    compile_setting=TORCHTITAN_COMPILE, hybrid_shard_zero_stages=(1, 2, 3),
    sources={
        "cp": "frameworks.md §1.9: context_parallel_degree (torch's context_parallel), planned and exported as its "
              "ring (p2p); the planner has no key for v0.2.2's context_parallel_rotate_method",
        "ep": "frameworks.md §1.9: expert_parallel_degree; experts borrow their ranks from FSDP and TP, with no "
              "expert-tensor-parallel key in its config",
        "schedules": "frameworks.md §1.4: GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, "
                     "ZBVZeroBubble (zero_bubble exports as ZBVZeroBubble: two stages per rank in a V)",
        "zero": "frameworks.md §1.6: FSDP2: reshard_after_forward default = ZeRO-3, never = ZeRO-2 (parameters "
                "gathered from forward to backward); under PP FSDP keeps parameters unsharded (read as ZeRO-1); "
                "no optimizer-only sharding",
        "hsdp": "frameworks.md §1.2: data_parallel_replicate_degree x data_parallel_shard_degree (HSDP: FSDP over "
                "the shard group, gradients all-reduced across the replicas)",
        "offload": "frameworks.md §1.6: enable_cpu_offload = CPUOffloadPolicy (parameters, gradients, optimizer)",
        "recompute": "frameworks.md §1.5: none, full, selective (per-op SAC); no per-stage counts in 0.3",
        "split": "frameworks.md §1.4: module_fqns_per_model_part gives any split",
        "sp": "enable_sequence_parallel, default True (frameworks.md §1.2)",
        "precision": "mixed_precision_param: bfloat16 or float32 (frameworks.md §1.6)",
        "states": "FSDP2 MixedPrecisionPolicy(bf16, fp32): the sharded fp32 parameters are the master copy and their "
                  "fp32 gradients feed torch.optim's AdamW, whose moments take the parameters' dtype "
                  "(frameworks.md §1.6); its config has no optimizer-state dtype",
        "fp8": "frameworks.md §1.9: torchao float8 recipe_name rowwise (main's default) or tensorwise (v0.2.2 "
               "TOML, with the FSDP float8 all-gather); MXFP8 is a separate converter the export does not write",
    })

_DEEPSPEED_STATES = ("ZeRO keeps an fp32 partition of the parameters and its optimizer's fp32 moments "
                     "(single_partition_of_fp32_groups, stage_1_and_2.py; frameworks.md §3.5); its JSON has no "
                     "optimizer-state dtype")

_DEEPSPEED_BF16_STATES = (
    "ZeRO keeps an fp32 partition of the parameters and fp32 moments (stage_1_and_2.py; frameworks.md §3.5) unless "
    "bf16.bf16_master_weights_and_grads (bf16 master weights) and bf16.bf16_optimizer_states (bf16 moments too; "
    "without it the fp32 moments need the optimizer offloaded to DeepSpeedCPUAdam) say otherwise, at ZeRO 1-3 "
    "(DeepSpeed >= 0.18.3: runtime/config.py, base_optimizer.py _configure_master_weights; frameworks.md §3.7 rule 6)")

_DEEPSPEED_HSDP = ("DeepSpeed's hybrid sharding, MiCS (zero_optimization.mics_shard_size), was removed in 0.19.8, "
                   "whose config parser refuses the key; `check` reads an older MiCS config as shard=S; shard over "
                   "every dp rank: drop shard")

DEEPSPEED = Capabilities(
    Framework.DEEPSPEED, schedules=("1f1b",), zero_stages=(0, 1, 2, 3), zero_stages_with_pp=(0, 1),
    offload=("none", "optimizer", "optimizer+params"), recompute=("none", "full"),
    tensor_parallel_zero_stages=(0, 1, 2), tensor_parallel_with_pp=False, sequence_parallel=False,
    uneven_split="none", per_stage_recompute="none", max_virtual_stages=1,
    vocab_rule="DeepSpeed does not pad the vocabulary; the planner requires tp to divide it",
    precisions=("bf16", "fp16", "fp32"), fp8_recipes=(), cp_comms=("a2a",), expert_parallel=False,
    sources={
        "cp": "frameworks.md §3.8: Ulysses sequence_parallel_size (all-to-all) is DeepSpeed's only context "
              "parallelism",
        "ep": "frameworks.md §3.8: ep_size is an argument of deepspeed.moe.layer.MoE in model code, not a config key",
        "schedules": "frameworks.md §3.3: TrainSchedule is synchronous 1F1B; no interleaving, no zero-bubble",
        "zero": "frameworks.md §3.3: ZeRO-2/3 are incompatible with pipeline parallelism",
        "offload": "frameworks.md §3.5: offload_optimizer (ZeRO >= 1), offload_param (ZeRO-3 only)",
        "recompute": "frameworks.md §3.4: the JSON does not choose layers; model code checkpoints whole layers "
                     "(PipelineModule activation_checkpoint_interval, HF gradient_checkpointing)",
        "split": "frameworks.md §3.3: PipelineModule partition_method parameters/uniform/type:regex, no explicit "
                 "counts",
        "tp": "AutoTP training (tensor_parallel.autotp_size): ZeRO 0, 1 or 2, no pipeline "
              "(deepspeed.ai/tutorials/autotp-training)",
        "sp": "AutoTP has no Megatron-style sequence parallelism (Ulysses is context parallelism)",
        "precision": "frameworks.md §3.8: no FP8 training switch in DeepSpeed's config (FP8 comes from Transformer "
                     "Engine in model code)",
        "states": _DEEPSPEED_BF16_STATES,
        "hsdp": _DEEPSPEED_HSDP,
    },
    state_dtypes={"master_dtype": ("bf16",), "exp_avg_dtype": ("bf16",), "exp_avg_sq_dtype": ("bf16",)},
    state_dtype_zero_stages=(1, 2, 3),
    state_dtype_sets=(("master_dtype",), ("exp_avg_dtype", "exp_avg_sq_dtype", "master_dtype")))

MEGATRON_DEEPSPEED = Capabilities(
    Framework.MEGATRON_DEEPSPEED, schedules=("1f1b", "zero_bubble"), zero_stages=(0, 1, 2, 3),
    zero_stages_with_pp=(0, 1), offload=("none", "optimizer", "optimizer+params"),
    recompute=("none", "selective", "full"), no_sp_schedules=("zero_bubble",), uneven_split="none",
    per_stage_recompute="none", max_virtual_stages=1, pads_vocab=True,
    vocab_rule="Megatron-DeepSpeed pads the vocabulary to a multiple of 128 x tp",
    precisions=("bf16", "fp16", "fp32"), fp8_recipes=(), cp_comms=("a2a",), ulysses_excludes_sp=True,
    sources={
        "cp": "frameworks.md §3.1: --ds-sequence-parallel-size sets Ulysses (all-to-all) sequence parallelism; it "
              "'cannot be combined with --sequence-parallel'",
        "schedules": "frameworks.md §3.3: DeepSpeed's pipeline engine runs 1F1B; --enable-zbh1-pipeline runs ZB-H1 "
                     "(no SP)",
        "zero": "frameworks.md §3.1/§3.3: --zero-stage with the DeepSpeed engine; ZeRO-2/3 only with "
                "--no-pipeline-parallel",
        "offload": "frameworks.md §3.5 (ds_config offload_optimizer / offload_param)",
        "recompute": "frameworks.md §3.4: --checkpoint-activations / --recompute-granularity; block is not "
                     "supported by the DeepSpeed pipeline",
        "split": "frameworks.md §3.3: partition_method type:transformer balances the layer count",
        "sp": "--sequence-parallel (not with --enable-zbh1-pipeline)",
        "vocab": "Megatron's padding to 128 x tp",
        "precision": "frameworks.md §3: no FP8 recipe option is sourced for Megatron-DeepSpeed (its DeepSpeed JSON "
                     "has no FP8 switch, §3.8); plan FP8 with --framework megatron",
        "states": _DEEPSPEED_STATES,
        "hsdp": _DEEPSPEED_HSDP,
    })

GENERIC = Capabilities(
    Framework.GENERIC, schedules=ALL_SCHEDULES, zero_stages=(0, 1, 2, 3), zero_stages_with_pp=(0, 1),
    offload=("none", "optimizer", "optimizer+params"), recompute=("none", "selective", "full"),
    uneven_split="any", per_stage_recompute="any", max_virtual_stages=64, pads_vocab=True,
    vocab_rule="", state_dtypes={"master_dtype": ("bf16", "fp16"), "exp_avg_dtype": ("bf16", "fp16", "fp8"),
                                 "exp_avg_sq_dtype": ("bf16", "fp16", "fp8"), "grad_dtype": ("fp32", "bf16", "fp16")},
    compile_setting="torch.compile of the model (no framework named)", hybrid_shard_zero_stages=(1, 2, 3),
    sources={"schedules": "every schedule the cost models know (no framework named)",
                            "fp8": "every FP8 recipe the cost model knows (cost_models/fp8.py, modern-training.md "
                                   "§1.1)"})

CAPABILITIES: dict[Framework, Capabilities] = {
    c.framework: c for c in (MEGATRON, NEMO, TORCHTITAN, DEEPSPEED, MEGATRON_DEEPSPEED, GENERIC)}

DEFAULT_FRAMEWORK = Framework.GENERIC  # plan/estimate without --framework: every schedule the cost models know


def capabilities(name: str | Framework | None) -> Capabilities:
    return CAPABILITIES[parse_framework(name)]


def parse_framework(name: str | Framework | None) -> Framework:
    from cluster_specs import SpecError

    if name is None:
        return DEFAULT_FRAMEWORK
    try:
        return Framework(str(name).lower())
    except ValueError:
        allowed = ", ".join(f.value for f in Framework)
        raise SpecError(f"--framework: {name!r} -> allowed: {allowed}") from None


def refuse_unrunnable(framework: str | None, layout, model, training: TrainingSpec | None = None) -> str:
    """`estimate --framework X`: a one-line error when X cannot run the layout (with `training`: its optimizer states
    at this ZeRO stage too); the framework's name otherwise."""
    from cluster_specs import SpecError

    caps = capabilities(framework)
    why = (caps.refusal(layout.model_dump()) or caps.vocab_problem(model.vocab_size, layout.tp)
           or (caps.state_zero_problem(training, layout.zero_stage) if training is not None else None))
    if why:
        raise SpecError(f"--layout: {why}")
    return caps.framework.value


def fp8_recipe_for(framework: str | Framework | None, precision: str, fp8_recipe: str | None) -> str | None:
    """The FP8 recipe a run uses: the one asked for, else the framework's default (Megatron-LM delayed, NeMo and the
    generic planner tensorwise, torchtitan rowwise); None unless the precision is fp8. A one-line error when the
    framework cannot train in this precision or recipe, or a recipe is asked for without --precision fp8."""
    from cluster_specs import SpecError

    caps = capabilities(framework)
    if precision != "fp8":
        if fp8_recipe is not None:
            raise SpecError(f"--fp8-recipe: {fp8_recipe} -> needs --precision fp8 (the precision is {precision})")
        why = caps.precision_problem(precision, None)  # e.g. torchtitan has no fp16 (a V100's default precision)
        if why:
            raise SpecError(f"--precision: {caps.framework.value}: {why}")
        return None
    recipe = fp8_recipe or caps.default_fp8_recipe
    why = caps.precision_problem(precision, recipe)
    if why:
        raise SpecError(f"--precision/--fp8-recipe: {caps.framework.value}: {why}")
    return recipe


NEMO_FP8_PARAM_GATHER_RECIPES = ("delayed", "tensorwise", "mxfp8")
"""The FP8 recipes whose Megatron-Bridge mixed-precision recipe sets fp8_param_gather=True: bf16_with_fp8_delayed_
scaling_mixed, bf16_with_fp8_current_scaling_mixed and bf16_with_mxfp8_mixed; bf16_with_fp8_subchannel_scaling_mixed
(blockwise) sets it False (Megatron-Bridge src/megatron/bridge/training/mixed_precision.py @0509780)."""


def fp8_gathers_params(framework: str | Framework | None, fp8_recipe: str | None) -> bool:
    """Whether a plan for this framework all-gathers its parameters in FP8 (FP8 primary weights) by default:
    torchtitan with torchao tensorwise, whose export turns on enable_fsdp_float8_all_gather and
    precompute_float8_dynamic_scale_for_fsdp (modern-training.md §1.6: 'all-gather bytes halved vs BF16'); NeMo /
    Megatron-Bridge with a recipe whose mixed-precision config sets it (NEMO_FP8_PARAM_GATHER_RECIPES, the recipe
    the export names); elsewhere not unless a plan file asks (fp8_param_gather: Megatron-LM's --fp8-param-gather is
    off by default)."""
    fw = capabilities(framework).framework
    return ((fw == Framework.TORCHTITAN and fp8_recipe == "tensorwise")
            or (fw == Framework.NEMO and fp8_recipe in NEMO_FP8_PARAM_GATHER_RECIPES))


def sp_problem(caps: Capabilities, f: dict) -> tuple[str, str] | None:
    """SP with tp = 1: ('warning', text) where the framework disables it, ('error', text) where it refuses."""
    if not f.get("sequence_parallel") or f.get("tp", 1) > 1:
        return None
    if caps.sp_needs_tp == "error":
        return "error", f"sequence_parallel with tp=1 -> {caps.sources.get('sp', '')}"
    return "warning", ("sequence parallelism with tp=1: the framework disables it with a warning "
                       "(\"Disabling sequence parallelism because tensor model parallelism is disabled\"); checked "
                       "without it")
