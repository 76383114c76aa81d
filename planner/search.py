"""`planner plan`: search DP x TP x PP x ZeRO x offload x micro-batch x recompute x schedule, refine the best
with the exact split and the ILP, classify into the decision table, and explain.

Search order and pruning (each rule is a dominance argument in the cost model, or a layout rule):
- degrees: tp divides the node (unless TP across nodes is allowed) and the heads/KV heads/FFN; pp <= layers;
  dp = GPUs / (tp pp) divides the global batch; micro-batch sizes are the divisors of B/dp up to
  `PlanOptions.max_micro_batch_size`;
- ZeRO 2/3 only without pipelining (layout rule); ZeRO stages are skipped when dp = 1 (nothing to shard);
- sequence parallelism whenever tp > 1: same traffic as TP, less memory (Korthikanti §4.2.2), never slower here;
- recompute ladder none -> selective -> full: once one fits, the next is only slower, so it is not evaluated;
- schedules: 1F1B, interleaved 1F1B (v = 2..`max_virtual_stages` where the micro-batches divide and the layers do, with
  the embedding and/or loss counted as a layer where they do not), ZB-H1. GPipe has
  1F1B's time and more memory and naive is slower still, so both are dominated; PipeDream's asynchronous 1F1B
  changes the optimisation (stale weights) and is searched only with --allow-async;
- offload is a fallback: searched only when nothing fits on the GPUs;
- hybrid sharding (HSDP) with ZeRO-2/3 where the framework runs it: groups of one node's dp ranks x 1, 2, 4, ...
  below dp (`_shard_options`; at ZeRO-1 only when pinned);
- a candidate whose model states alone cannot fit is counted but not evaluated.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from cluster_specs import SpecError
from cost_models.context_parallel import cp_problems
from cost_models.inputs import Offload, Recompute, Schedule
from cost_models.stage import stage_model, stage_split, state_bytes_per_param
from cost_models.step import StepEstimate, estimate_step
from planner.contract import Decision, SearchStats, TimeReport
from planner.errors import InfeasibleError
from planner.estimate import fits_in_memory
from planner.explain.decision import ROWS, classify, matches_row, network_bytes_per_second_per_gpu
from planner.frameworks.megatron_split import account_for_splits
from planner.frameworks.restriction import Restriction
from planner.inputs.specs import LayoutSpec
from planner.problem import GIB, Problem
from planner.refine.ilp import StageCoefficients
from planner.rules import hybrid_shard_problem, layout_violations, refuse_unrunnable_setup

# Search-space bounds. 128: the largest micro-batch of any published run in ../shared/validation/published_runs.json
# (llm-foundry MPT-125m/350m at 512 tokens); larger ones only add candidates whose GEMMs are already saturated.
MAX_MICRO_BATCH_SIZE = 128
# 8: the published interleaved runs in the same file use 3 and 6 virtual stages; 8 leaves room above them while the
# bubble gain (1/v) flattens and the p2p traffic keeps growing with v (Narayanan et al. 2021 §2.2.2).
MAX_VIRTUAL_STAGES = 8
# Step times within 0.1% tie (the cost model's own resolution is coarser: its median error is ~10%), and among ties
# the simpler layout is picked; the explanation calls a recommended-kind layout within 0.5% "a tie" for the reader.
TIE_RELATIVE = 1e-3
DECISION_TIE_RELATIVE = 5e-3
# A hybrid-sharded layout (HSDP) ranks above the same kind sharded over every dp rank only when it is faster by more
# than this: it holds more memory (the states over fewer ranks), one more NCCL communicator and a second degree every
# config must carry, for a gain that below it is inside what the relative predictions resolve.
HYBRID_SHARD_MARGIN = DECISION_TIE_RELATIVE


@dataclass
class PlanOptions:
    top_k: int = 5
    objective: str = "throughput"  # throughput | memory | min-gpus
    target_tokens_per_second: float | None = None
    allow_tp_across_nodes: bool = False
    allow_async: bool = False
    use_solver: bool = True
    solver_time_limit_seconds: float = 10.0
    solver_candidates: int = 3
    progress: bool = False
    max_micro_batch_size: int = MAX_MICRO_BATCH_SIZE
    max_virtual_stages: int = MAX_VIRTUAL_STAGES
    restriction: Restriction | None = None  # --framework / --fix / --schedules (planner/frameworks/restriction.py)

    def allows(self, fields: dict) -> dict | None:
        """The candidate as the chosen framework runs it, or None when it is outside the requested space."""
        return fields if self.restriction is None else self.restriction.adjust(fields)


@dataclass
class Candidate:
    layout: LayoutSpec
    estimate: StepEstimate
    origin: str = "search"  # search | split | ilp

    @property
    def step_seconds(self) -> float:
        return self.estimate.step_seconds


@dataclass
class PlanResult:
    pick: Candidate
    alternatives: list[Candidate]
    ranked: list[Candidate]  # every fitting candidate, best first
    decision: Decision
    reasons: dict[int, str]  # id(candidate) -> one-line reason
    stats: SearchStats
    compared: list[Candidate] = field(default_factory=list)  # layouts the user asked to see beside the pick
    # planned at the point estimate because nothing fitted at the memory band's high end (plan_within_memory_margin)
    memory_margin_relaxed: bool = False


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _fits(problem: Problem, est: StepEstimate) -> bool:
    return fits_in_memory(est, problem.knobs.memory_headroom_bytes, problem.knobs.memory_high_fraction)


def _capacity_bytes(problem: Problem) -> float:
    """What a layout's predicted peak may reach: the GPU minus the headroom, shrunk by the memory margin (a peak
    p fits when p (1 + f) + headroom <= GPU)."""
    k = problem.knobs
    return (problem.hardware.gpu_memory_bytes - k.memory_headroom_bytes) / (1 + k.memory_high_fraction)


def _states_lower_bound_bytes(problem: Problem, tp: int, pp: int, dp: int, zero: int, offload: str, cp: int = 1,
                              ep: int = 1) -> float:
    """Model states of an average stage (the stage model's bytes per parameter): no stage holds less, so above
    capacity the layout cannot fit. Routed experts divide by ep instead of tp; states shard over dp·cp (experts
    over EDP, never counted as less sharded than that here); under hybrid sharding `dp` is the sharding group."""
    per_param = sum(state_bytes_per_param(problem.cm_training, zero_stage=zero, dp=max(dp * cp, dp * cp * tp // ep),
                                          offload=offload, pipeline=pp > 1))
    if per_param == 0:
        return 0.0
    counts = problem.parameter_counts
    experts = counts["per_layer_routed_experts"] * problem.cm_model.num_moe_layers
    per_gpu = (problem.total_params - experts) / (tp * pp) + experts / (ep * pp)
    return per_gpu * per_param + problem.knobs.per_process_overhead_bytes


def _tp_degrees(problem: Problem, opts: PlanOptions) -> list[int]:
    """TP degrees that divide the node (or are whole nodes, if allowed) and the heads, KV heads, FFN and width."""
    model, n, g = problem.model, problem.cluster.num_gpus, problem.cluster.gpus_per_node
    tps = [t for t in divisors(n) if (t <= g and g % t == 0) or (opts.allow_tp_across_nodes and t % g == 0)]
    return [t for t in tps if model.num_attention_heads % t == 0
            and (model.kv_heads % t == 0 or t % model.kv_heads == 0)
            and model.ffn % t == 0 and model.hidden_size % t == 0]


# CP is searched when each rank keeps at least this many tokens of a sequence: below it the per-layer work is too
# small to hide a ring step off the node (modern-training.md §2.4: 2,500-5,000 tokens over a 50 GB/s NIC)
MIN_CP_TOKENS = 4096
MAX_EP = 64  # DeepSeek-V3's EP 64 is the largest published (modern-training.md §3.5)


def search_cp_comm(opts: PlanOptions) -> str | None:
    """The context-parallel exchange the search plans (Capabilities.planned_cp_comm; the ring without a framework)."""
    return opts.restriction.caps.planned_cp_comm if opts.restriction is not None else "p2p"


def _degrees(problem: Problem, opts: PlanOptions) -> Iterator[tuple[int, int, int, int]]:
    """(tp, pp, dp, cp) with pp <= layers and dp dividing the global batch; cp > 1 only for long sequences, unless
    pinned (`--fix cp=2`: then whenever the sequence splits into 2 cp tp chunks)."""
    n, L, B = problem.cluster.num_gpus, problem.model.num_layers, problem.training.global_batch_size
    s = problem.training.seq_length
    pinned = opts.restriction.fixed.get("cp") if opts.restriction is not None else None
    comm = search_cp_comm(opts)
    for tp in _tp_degrees(problem, opts):
        for cp in (c for c in divisors(n // tp) if c == 1 or (
                comm is not None and (s // c >= MIN_CP_TOKENS or c == pinned)
                and not cp_problems(problem.cm_model, variant=comm, cp=c, seq_length=s, tp=tp))):
            for pp in divisors(n // (tp * cp)):
                dp = n // (tp * pp * cp)
                if pp <= L and B % dp == 0:
                    yield tp, pp, dp, cp


def _ep_degrees(model, folded: int) -> list[int]:
    """EP degrees for an MoE model: divisors of the experts that divide dp·cp·tp (parallel folding)."""
    if model.moe is None:
        return [1]
    return [e for e in divisors(model.moe.num_experts) if folded % e == 0 and e <= MAX_EP]


def _state_options(pp: int, dp: int, offload: bool) -> list[tuple[int, Offload]]:
    """(ZeRO stage, offload) pairs: ZeRO-2/3 only without pipelining, nothing to shard at dp 1, offload only as the
    fallback search and only with the ZeRO stage that shards what it offloads."""
    zeros = [0, 1] if pp > 1 else [0, 1, 2, 3]
    if dp == 1:
        zeros = ([1, 3] if pp == 1 else [1]) if offload else [0]  # ZeRO-3 never with pp > 1
    if not offload:
        return [(z, Offload.NONE) for z in zeros]
    return [(z, off) for z in zeros for off in (Offload.OPTIMIZER, Offload.OPTIMIZER_PARAMS)
            if not (off == Offload.OPTIMIZER and z == 0) and not (off == Offload.OPTIMIZER_PARAMS and z != 3)]


def _shard_options(dp: int, cp: int, tp: int, gpus_per_node: int, zero: int, offload: Offload,
                   ep: int, pinned: int | None = None) -> list[int | None]:
    """Hybrid sharding degrees (LayoutSpec.dp_shard) for a ZeRO stage that shards: None (every dp rank), and the dp
    ranks of one node (gpus_per_node / (tp cp)) times 1, 2, 4, ... below dp, where the states would otherwise shard
    across nodes. A group of whole nodes, doubling: HSDP groups are a node (torchtitan's and MaxText's recipes shard
    inside the node or a few, and replicate across the rest), and the step time is smooth in the group size between
    them (a ring's latency grows with its ranks, the replicas' all-reduce with their count). Searched under ZeRO-2/3,
    whose gathers and reduce-scatters run every micro-batch; under ZeRO-1 (Megatron's partial distributed optimizer) the sharded traffic runs once a step
    and mostly hides, so it is only pinned (`--fix shard=S`: then the pinned degree is the only one, where it divides
    dp), which keeps the search over pipelined layouts, all ZeRO <= 1, as it was. Each degree passes the layout
    rules' test (rules.hybrid_shard_problem: a divisor of dp, no offload or expert parallelism with it)."""
    if pinned is not None:
        sizes: list[int] = [pinned] if pinned < dp else []
    else:
        per_node = gpus_per_node // (tp * cp) if gpus_per_node % (tp * cp) == 0 else 0
        sizes = [per_node << k for k in range(dp.bit_length()) if 2 <= per_node << k < dp] if zero >= 2 else []
    ok: list[int | None] = [s for s in sizes
                            if hybrid_shard_problem(dp=dp, shard=s, zero_stage=zero, offload=offload, ep=ep) is None]
    return ok if pinned is not None else [None, *ok]


def _interleaved_splits(pp: int, v: int, num_layers: int) -> list[list[int] | None]:
    """Stage splits for interleaving over pp x v chunks: even (None) where the layers divide, else the ones that
    count the embedding and/or the loss as a layer (Megatron's account-for flags: ranks 0 and pp-1 build one layer
    fewer), which balance a layer count such as Llama 3.1 405B's 126 over pp 8 x v 8 (Megatron-Bridge's recipe)."""
    if num_layers % (pp * v) == 0:
        return [None]
    return list(account_for_splits(num_layers, pp, v))


def _schedule_options(pp: int, m: int, num_layers: int,
                      opts: PlanOptions) -> list[tuple[Schedule, int, list[int] | None]]:
    """(schedule, virtual stages, layers per stage or None for the even split): 1F1B; with pipelining also ZB-H1
    (and async if allowed) and interleaving where the micro-batches are a multiple of pp and the layers (with the
    embedding and loss counted, `_interleaved_splits`) of pp x v."""
    out: list[tuple[Schedule, int, list[int] | None]] = [(Schedule.ONE_F_ONE_B, 1, None)]
    if pp == 1:
        return out
    out.append((Schedule.ZERO_BUBBLE, 1, None))
    if opts.allow_async:
        out.append((Schedule.PIPEDREAM_ASYNC, 1, None))
    if m % pp == 0:
        out += [(Schedule.INTERLEAVED_1F1B, v, split) for v in range(2, opts.max_virtual_stages + 1)
                for split in _interleaved_splits(pp, v, num_layers)]
    return out


def enumerate_bases(problem: Problem, opts: PlanOptions, *, offload: bool) -> Iterator[dict[str, Any]]:
    """Yield layout field dicts without recompute (the ladder is applied by the caller), in a fixed order
    (tp, pp, micro-batch size, ZeRO/offload, schedule) that breaks exact ties."""
    B, L, g = problem.training.global_batch_size, problem.model.num_layers, problem.cluster.gpus_per_node
    comm = search_cp_comm(opts)
    pinned = opts.restriction.fixed.get("dp_shard") if opts.restriction is not None else None
    for tp, pp, dp, cp in _degrees(problem, opts):
        per_dp = B // dp
        exchange = {"cp_comm": comm} if cp > 1 else {}
        states = _state_options(pp, dp * cp, offload)
        for mbs, ep in itertools.product((d for d in divisors(per_dp) if d <= opts.max_micro_batch_size),
                                         _ep_degrees(problem.model, dp * cp * tp)):
            m = per_dp // mbs
            for (zero, off), (schedule, v, split) in itertools.product(states, _schedule_options(pp, m, L, opts)):
                uneven = {"layers_per_stage": split} if split else {}
                for shard in _shard_options(dp, cp, tp, g, zero, off, ep, pinned):
                    base = opts.allows({"tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": ep, "zero_stage": zero,
                                        "offload": off, "micro_batch_size": mbs, "num_micro_batches": m,
                                        "sequence_parallel": tp > 1, "schedule": schedule, "virtual_stages": v,
                                        "dp_shard": shard, **exchange, **uneven})
                    if base is not None:
                        yield base


def search(problem: Problem, opts: PlanOptions, stats: SearchStats, *, offload: bool) -> tuple[list[Candidate], float]:
    """All fitting candidates, and the least peak memory seen (for the infeasibility message)."""
    fitting: list[Candidate] = []
    least_peak = math.inf
    cap = _capacity_bytes(problem)
    cm_model, cm_training, hw, knobs = problem.cm_model, problem.cm_training, problem.hardware, problem.knobs
    bases = list(enumerate_bases(problem, opts, offload=offload))
    progress = None
    if opts.progress and len(bases) > 500:
        from rich.progress import Progress

        progress = Progress(transient=True, console=_stderr_console())
        task = progress.add_task("searching layouts", total=len(bases))
        progress.start()
    try:
        for base in bases:
            if progress is not None:
                progress.advance(task)
            ladder = [r for r in Recompute if opts.allows({**base, "recompute": r})]
            stats.candidates_considered += len(ladder)
            lb = _states_lower_bound_bytes(problem, base["tp"], base["pp"], base.get("dp_shard") or base["dp"],
                                           base["zero_stage"], base["offload"], base.get("cp", 1), base.get("ep", 1))
            if lb > cap:
                least_peak = min(least_peak, lb)
                continue
            for rec in ladder:
                layout = LayoutSpec.trusted(**base, recompute=rec)
                est = estimate_step(cm_model, cm_training, hw, layout.to_cost_model(), knobs)
                stats.candidates_evaluated += 1
                least_peak = min(least_peak, est.peak_memory_bytes)
                if _fits(problem, est):
                    fitting.append(Candidate(layout, est))
                    if opts.objective != "memory":
                        break  # the rest of the ladder is slower (under the memory objective it holds less)
    finally:
        if progress is not None:
            progress.stop()
    return fitting, least_peak


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def _simplicity(lay: LayoutSpec) -> tuple:
    """Among ties, prefer what is simpler to run: no offload, lower ZeRO stage, sharded over every dp rank (no
    hybrid sharding), fewer model-parallel GPUs, the plain 1F1B schedule, no recomputation."""
    return (lay.offload != "none", lay.zero_stage, lay.hybrid_sharded, lay.tp * lay.pp, lay.schedule != "1f1b",
            lay.recompute != "none")


def _objective_key(opts: PlanOptions):
    def bucket(x: float) -> int:
        return int(math.log(x) / math.log1p(TIE_RELATIVE)) if x > 0 else 0

    if opts.objective == "memory":
        return lambda c: (bucket(c.estimate.peak_memory_bytes), c.step_seconds, _simplicity(c.layout))
    return lambda c: (bucket(ranking_seconds(c)), _simplicity(c.layout), c.estimate.peak_memory_bytes)


def ranking_seconds(c) -> float:
    """The step time a candidate ranks by under the throughput objective: its own, a hybrid-sharded layout's raised
    by HYBRID_SHARD_MARGIN."""
    return c.step_seconds * (1 + HYBRID_SHARD_MARGIN * c.layout.hybrid_sharded)


# ---- refinement: exact uneven split, then the ILP ------------------------------------------------------


def _stage_coefficients(problem: Problem, layout: LayoutSpec, base_policy: Recompute) -> list[StageCoefficients]:
    """Per-stage linear coefficients for the split and the ILP: the stage model's `linear` terms at the base policy,
    with the memory each stage may use."""
    cm_layout = replace(layout.to_cost_model(), recompute=base_policy, layers_per_stage=None,
                        recompute_layers_per_stage=None)
    sm = stage_model(problem.cm_model, problem.cm_training, problem.hardware, cm_layout, problem.knobs)
    cap = _capacity_bytes(problem)
    return [StageCoefficients.of(sm.linear(i), cap) for i in range(layout.pp)]


def refine_split(problem: Problem, cand: Candidate) -> Candidate | None:
    """Move layers off the first and last stages when their embedding/output layer makes them slowest."""
    from planner.refine.split import best_split_uniform

    layout = cand.layout
    if layout.pp < 3 or layout.schedule == "interleaved_1f1b" or layout.recompute == "full":
        return None
    coeffs = _stage_coefficients(problem, layout, layout.recompute)
    c = coeffs[0].layer_seconds
    caps = [max(0, int((st.capacity_bytes - st.fixed_bytes) // (st.layer_state_bytes + st.layer_act_policy_bytes)))
            for st in coeffs]
    best = best_split_uniform(problem.model.num_layers, c, [st.extra_seconds for st in coeffs], caps)
    if best is None:
        return None
    _, counts = best
    if tuple(counts) == stage_split(problem.model.num_layers, layout.pp):
        return None
    new = layout.model_copy(update={"layers_per_stage": counts})
    est = problem.estimate(new)
    if _fits(problem, est) and est.step_seconds < cand.step_seconds:
        return Candidate(new, est, "split")
    return None


def ilp_refinable(layout: LayoutSpec) -> bool:
    """Whether the ILP can refine a layout: a pipeline whose stages it can split and recompute per stage (not
    interleaved: a virtual stage's layers are not the ILP's variables), with recomputation to trade."""
    return layout.pp >= 2 and layout.schedule != "interleaved_1f1b" and layout.recompute != "none"


def refine_ilp(problem: Problem, cand: Candidate, opts: PlanOptions, stats: SearchStats) -> Candidate | None:
    """Joint per-stage layer counts and full-recompute counts (see planner/refine/ilp.py)."""
    from planner.refine.ilp import solve_stage_recompute

    layout = cand.layout
    if not ilp_refinable(layout):
        return None
    base_policy = Recompute.SELECTIVE if layout.recompute == Recompute.FULL else Recompute.NONE
    coeffs = _stage_coefficients(problem, layout, base_policy)
    res = solve_stage_recompute(coeffs, problem.model.num_layers, time_limit_seconds=opts.solver_time_limit_seconds)
    stats.solver_runs += 1
    stats.solver_seconds += res.seconds
    stats.solver_statuses.append(f"{res.solver}: {res.status}")
    if res.layers_per_stage is None:
        return None
    new = layout.model_copy(update={"recompute": base_policy, "layers_per_stage": res.layers_per_stage,
                                    "recompute_layers_per_stage": res.recompute_layers_per_stage})
    if layout_violations(new, problem.model, problem.training, problem.cluster,
                         allow_tp_across_nodes=opts.allow_tp_across_nodes):
        return None
    est = problem.estimate(new)
    if _fits(problem, est) and est.step_seconds < cand.step_seconds:
        return Candidate(new, est, "ilp" + ("" if res.optimal else " (time limit: feasible, not proven optimal)"))
    return None


# ---- explanations ----------------------------------------------------------------------------------------


def reason(problem: Problem, c: Candidate, pick: Candidate | None = None) -> str:
    """One line: what dominates this layout's cost beyond compute, in numbers."""
    lay, est, t = c.layout, c.estimate, c.estimate.time
    step = est.step_seconds
    g = problem.cluster.gpus_per_node
    parts = []
    if pick is not None and c is not pick:
        parts.append(f"{(step / pick.step_seconds - 1) * 100:+.1f}% step time vs the pick")
    facts = []
    if lay.pp > 1:
        share = t.pipeline_bubble_seconds / step
        txt = f"pp={lay.pp}: bubble {share:.1%} with {lay.num_micro_batches} micro-batches"
        if lay.schedule != "1f1b":
            txt += f" ({lay.schedule}{f', v={lay.virtual_stages}' if lay.virtual_stages > 1 else ''})"
        if lay.num_micro_batches < 4 * lay.pp and lay.schedule in ("1f1b", "gpipe"):
            txt += f"; m < 4p ({lay.num_micro_batches} < {4 * lay.pp}) leaves a large bubble"
        facts.append((t.pipeline_bubble_seconds, txt))
    if lay.tp > 1:
        where = "crosses nodes" if lay.tp > g else "inside the node"
        facts.append((t.tp_comm_seconds, f"tp={lay.tp} ({where}): TP all-reduces {t.tp_comm_seconds / step:.1%} of the step"))
    if lay.dp > 1:
        hybrid = f" sharded over {lay.dp_shard} x {lay.dp_replicas} replicas" if lay.hybrid_sharded else ""
        facts.append((t.dp_comm_seconds, f"dp={lay.dp}, zero={lay.zero_stage}{hybrid}: {t.dp_comm_total_seconds:.3g} s "
                                         f"of gradient/parameter traffic, {t.dp_comm_seconds:.3g} s exposed"))
    if t.recompute_seconds > 0:
        facts.append((t.recompute_seconds, f"recompute={lay.recompute}: +{t.recompute_seconds / step:.1%} of the step "
                                           "recomputing activations"))
    if t.offload_seconds + (t.optimizer_seconds if lay.offload != "none" else 0) > 0:
        facts.append((t.offload_seconds + t.optimizer_seconds, f"offload={lay.offload}: CPU optimizer and PCIe "
                                                               f"traffic {(t.offload_seconds + t.optimizer_seconds):.3g} s"))
    facts.sort(key=lambda f: -f[0])
    if facts:
        parts.append(facts[0][1])
    mem = est.peak_memory_bytes / GIB
    parts.append(f"{mem:.1f}/{est.gpu_memory_bytes / GIB:.1f} GiB on stage {est.peak_stage}")
    if c.origin not in ("search", "compared") and lay.layers_per_stage:
        parts.append(f"layers per stage {lay.layers_per_stage} from the {c.origin}")
    return "; ".join(parts)


def _fits_one_card(problem: Problem) -> bool:
    one = LayoutSpec.trusted(tp=1, pp=1, dp=1, zero_stage=0, offload=Offload.NONE, micro_batch_size=1,
                             num_micro_batches=1, recompute=Recompute.FULL, sequence_parallel=False,
                             schedule=Schedule.ONE_F_ONE_B, virtual_stages=1)
    est = problem.estimate(one)
    return _fits(problem, est)


def decide(problem: Problem, ranked: list[Candidate], pick: Candidate) -> Decision:
    hw = problem.hardware
    row = classify(num_gpus=hw.num_gpus, num_nodes=hw.num_nodes, fits_one_card=_fits_one_card(problem),
                   network_per_gpu=network_bytes_per_second_per_gpu(hw), seq_length=problem.training.seq_length,
                   moe=problem.model.moe is not None)
    scenario, rec = ROWS[row]
    g = hw.gpus_per_node
    agrees = matches_row(row, pick.layout, g)
    reasons = [f"{scenario}: the table recommends {rec}."]
    if agrees:
        reasons.append(f"The pick ({pick.layout.short()}) follows it.")
    else:
        alt = next((c for c in ranked if matches_row(row, c.layout, g)), None)
        if alt is None:
            reasons.append(f"No layout of the recommended kind fits in {hw.gpu_memory_bytes / GIB:.0f} GiB per GPU; "
                           f"the pick ({pick.layout.short()}) is the fastest that does.")
        else:
            ta, tp_ = TimeReport.from_estimate(alt.estimate).exposed(), TimeReport.from_estimate(pick.estimate).exposed()
            what, delta = max(((k, ta[k] - tp_[k]) for k in ta), key=lambda kv: kv[1])
            if alt.step_seconds <= pick.step_seconds * (1 + DECISION_TIE_RELATIVE):
                reasons.append(f"The best layout of the recommended kind, {alt.layout.short()}, ties with the pick "
                               f"({alt.step_seconds:.3g} s against {pick.step_seconds:.3g} s per step, within "
                               f"{DECISION_TIE_RELATIVE:.1%}); "
                               "either is a sound choice.")
                return Decision(row=row, scenario=scenario, recommendation=rec, agrees=agrees, reasons=reasons)
            reasons.append(
                f"The best layout of the recommended kind, {alt.layout.short()}, takes {alt.step_seconds:.3g} s per "
                f"step against the pick's {pick.step_seconds:.3g} s ({alt.step_seconds / pick.step_seconds - 1:+.1%}): "
                f"mostly {what}, {delta:.3g} s more per step "
                f"({ta[what]:.3g} s against {tp_[what]:.3g} s, with "
                f"{alt.estimate.time.compute_seconds:.3g} s of compute).")
    return Decision(row=row, scenario=scenario, recommendation=rec, agrees=agrees, reasons=reasons)


# ---- the whole plan ---------------------------------------------------------------------------------------


def plan(problem: Problem, opts: PlanOptions | None = None) -> PlanResult:
    opts = opts or PlanOptions()
    # no layout can run it: the enumerated layouts are trusted, so it is refused here, as estimate refuses it
    refuse_unrunnable_setup(problem.training, problem.cluster)
    stats = SearchStats()
    start = time.perf_counter()
    fitting, least = search(problem, opts, stats, offload=False)
    if not fitting:
        more, least_off = search(problem, opts, stats, offload=True)
        fitting, least = more, min(least, least_off)
    stats.search_seconds = time.perf_counter() - start
    if not fitting:
        raise infeasible(problem, least, opts)
    key = _objective_key(opts)
    fitting.sort(key=key)
    # refine the best few distinct layouts: exact split, then the ILP (recompute per stage)
    extra = []
    for cand in fitting[: max(opts.solver_candidates, 1)]:
        better = refine_split(problem, cand)
        if better is not None and opts.allows(better.layout.model_dump()):
            extra.append(better)
    if opts.use_solver:
        seen = set()
        for cand in fitting:
            k = (cand.layout.tp, cand.layout.pp, cand.layout.dp, cand.layout.zero_stage, cand.layout.micro_batch_size)
            if not ilp_refinable(cand.layout) or k in seen:  # a layout it cannot refine takes no ILP slot
                continue
            seen.add(k)
            better = refine_ilp(problem, cand, opts, stats)
            if better is not None and opts.allows(better.layout.model_dump()):
                extra.append(better)
            if len(seen) >= opts.solver_candidates:
                break
    ranked = sorted(fitting + extra, key=key)
    pick = ranked[0]
    alternatives = _distinct(ranked[1:], pick, opts.top_k)
    reasons = {id(c): reason(problem, c, pick) for c in [pick, *alternatives]}
    decision = decide(problem, ranked, pick)
    stats.total_seconds = time.perf_counter() - start
    return PlanResult(pick, alternatives, ranked, decision, reasons, stats)


MEMORY_MARGINS = ("band-high", "estimate")
"""--memory-margin: band-high (default) requires a layout's predicted peak raised to the memory band's high end to
fit the GPU minus the headroom; estimate requires only the point estimate to (the error band's 'tight' verdict)."""


def with_memory_margin(problem: Problem, margin: str) -> Problem:
    """The problem whose fit rule keeps `margin` (MEMORY_MARGINS): the knob memory_high_fraction is set to the
    memory band's high end (planner/data/error_bands.json) or to 0."""
    from planner.bands import memory_high_fraction

    if margin not in MEMORY_MARGINS:
        raise SpecError(f"--memory-margin: {margin!r} -> allowed: {', '.join(MEMORY_MARGINS)}")
    fraction = memory_high_fraction() if margin == "band-high" else 0.0
    return replace(problem, knobs=replace(problem.knobs, memory_high_fraction=fraction))


def plan_within_memory_margin(problem: Problem, opts: PlanOptions) -> tuple[Problem, PlanResult]:
    """`plan` under the problem's memory margin; when nothing fits at the band's high end but something fits at
    the point estimate, that plan (the pick may run out of memory: the plan output says so). Returns (the problem
    the plan was made under, the plan); the plan's memory_margin_relaxed says whether the margin was relaxed."""
    try:
        return problem, plan(problem, opts)
    except InfeasibleError:
        if problem.knobs.memory_high_fraction <= 0:
            raise
        relaxed = replace(problem, knobs=replace(problem.knobs, memory_high_fraction=0.0))
        result = plan(relaxed, opts)
        result.memory_margin_relaxed = True  # a fresh result: plan, compare and scaling read the flag from it
        return relaxed, result


MARGIN_COST_MIN = 0.005
"""The smallest step-time gain a layout that fits only at the estimate must have over the pick to be reported as
what the memory margin costs (below it the two are the same speed)."""


def margin_cost(problem: Problem, result: PlanResult, opts: PlanOptions,
                min_gain: float = MARGIN_COST_MIN) -> Candidate | None:
    """What the memory margin costs: the pick of the same search with the fit judged at the point estimate, where it
    is more than `min_gain` faster than `result`'s pick; None under the estimate margin, for objectives other than
    throughput, or when the margin moves nothing."""
    if problem.knobs.memory_high_fraction <= 0 or opts.objective != "throughput":
        return None
    at_estimate = replace(problem, knobs=replace(problem.knobs, memory_high_fraction=0.0))
    try:
        other = plan(at_estimate, replace(opts, top_k=0, progress=False)).pick
    except InfeasibleError:
        return None
    return other if other.step_seconds < result.pick.step_seconds * (1 - min_gain) else None


def _distinct(cands: list[Candidate], pick: Candidate, k: int) -> list[Candidate]:
    """Runners-up that differ from the pick and from each other in more than the micro-batch size (at most k; none
    for k = 0)."""
    if k <= 0:
        return []
    out, seen = [], {_shape(pick.layout)}
    for c in cands:
        s = _shape(c.layout)
        if s in seen:
            continue
        seen.add(s)
        out.append(c)
        if len(out) >= k:
            break
    return out


def _shape(lay: LayoutSpec):
    return (lay.tp, lay.pp, lay.dp, lay.zero_stage, lay.dp_shard, lay.offload, lay.recompute, lay.schedule,
            lay.virtual_stages)


def infeasible(problem: Problem, least_peak_bytes: float, opts: PlanOptions) -> InfeasibleError:
    """Nothing fits: the binding constraint (divisibility, host memory, GPU memory) with the number that would
    make it feasible (planner/explain/infeasible.py; the search's least peak mixes states-only lower bounds)."""
    from planner.explain.infeasible import explain_infeasible

    return explain_infeasible(problem, opts)


def plan_min_gpus(problem: Problem, opts: PlanOptions, target_tokens_per_second: float) -> tuple[Problem, str]:
    """Fewest nodes (up to the cluster's) whose best plan meets the target throughput.

    Sound under one assumption, stated in the output: the best throughput does not fall as nodes are added
    (more GPUs only add layouts' data-parallel replicas). Binary search over node counts, then the smallest
    passing count is verified by a full plan.
    """
    cl = problem.cluster

    def best_rate(nodes: int) -> float:
        p = Problem(problem.model, problem.training, cl.with_nodes(nodes), problem.knobs)
        try:
            return plan(p, replace(opts, use_solver=False, progress=False)).pick.estimate.tokens_per_second
        except InfeasibleError:
            return 0.0

    hi = cl.num_nodes
    if best_rate(hi) < target_tokens_per_second:
        raise InfeasibleError(f"even {hi} nodes ({cl.num_gpus} GPUs) do not reach {target_tokens_per_second:,.0f} "
                              "tokens/s; raise --nodes")
    lo = 1
    while lo < hi:
        mid = (lo + hi) // 2
        if best_rate(mid) >= target_tokens_per_second:
            hi = mid
        else:
            lo = mid + 1
    smaller = Problem(problem.model, problem.training, cl.with_nodes(lo), problem.knobs)
    note = (f"min-gpus: {lo} nodes ({smaller.cluster.num_gpus} GPUs) are the fewest that reach "
            f"{target_tokens_per_second:,.0f} tokens/s (binary search over 1..{cl.num_nodes} nodes, assuming the best "
            "throughput does not fall as nodes are added)")
    return smaller, note


def _any_fits(problem: Problem, opts: PlanOptions) -> bool:
    stats = SearchStats()
    for off in (False, True):
        fitting, _ = search(problem, replace(opts, progress=False), stats, offload=off)
        if fitting:
            return True
    return False


# ---- compared layouts and the published-practice comparison --------------------------------------------------------


def add_compared(problem: Problem, result: PlanResult, layouts: list[LayoutSpec]) -> PlanResult:
    """Estimate layouts given with --compare beside the pick (validated as `check` would, TP across nodes allowed)."""
    from planner.estimate import estimate_layout

    for lay in layouts:
        cand = Candidate(lay, estimate_layout(problem, lay, allow_tp_across_nodes=True), "compared")
        result.compared.append(cand)
        result.reasons[id(cand)] = reason(problem, cand, result.pick)
    return result


def published_layout_ranks(report) -> str:
    """Markdown: where each published layout ranks among the planner's candidates, and the gap to the pick."""
    rows = []
    done: dict[tuple[str, ...], PlanResult | Exception] = {}
    for r in report.results:
        if r.layout is None or r.predicted_step_seconds is None:
            continue
        c = r.case
        key = (c.model.model_dump_json(), c.cluster.model_dump_json(), c.training.model_dump_json(), str(c.knobs))
        problem = Problem(c.model, c.training, c.cluster, c.knobs)
        if key not in done:
            res: PlanResult | Exception
            try:
                res = plan(problem, PlanOptions(use_solver=False, top_k=3))
            except Exception as exc:  # an infeasible or unusual row is reported, not fatal
                res = exc
            done[key] = res
        res = done[key]
        if isinstance(res, Exception):
            rows.append((c.row_id, r.layout.short(), "-", "-", f"planner: {str(res).splitlines()[0][:80]}"))
            continue
        published = problem.estimate(r.layout)
        rank = 1 + sum(1 for x in res.ranked if ranking_seconds(x) < published.step_seconds * (1 - TIE_RELATIVE))
        gap = res.pick.step_seconds / published.step_seconds - 1
        rows.append((c.row_id, r.layout.short(), f"{rank} of {len(res.ranked)}", f"{gap:+.1%}", res.pick.layout.short()))
    ranks = [int(x[2].split()[0]) for x in rows if x[2] != "-"]
    faster = [float(x[3].rstrip("%")) for x in rows if x[3] != "-"]
    out = ["## The planner against published layouts", "",
           "For every evaluated row the planner plans the same model, batch and cluster (with the row's overlap "
           "knobs), the published layout is estimated in the same model, and its rank among the planner's fitting "
           "candidates is given (1 = the planner's pick; step times within 0.1% tie, and among ties the simpler layout "
           "is picked; a hybrid-sharded candidate counts as faster only by more than search.HYBRID_SHARD_MARGIN, as the "
           "pick is chosen). 'pick vs published' is the pick's predicted step time "
           "relative to the published layout's (negative: the pick is predicted faster).", "",
           f"- rows: {len(rows)}; published layout is the pick or ties it: {sum(1 for x in ranks if x == 1)}; "
           f"in the top 10: {sum(1 for x in ranks if x <= 10)}; median predicted gain of the pick "
           f"{_median(faster):+.1f}%; rows where the pick is predicted slower than the published layout by more than "
           f"the {TIE_RELATIVE:.1%} tie tolerance: {sum(1 for f in faster if f > TIE_RELATIVE * 100)}.",
           "", "| row | published layout | rank | pick vs published | planner's pick |", "|---|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
    return "\n".join(out)


def _median(xs):
    import statistics

    return statistics.median(xs) if xs else float("nan")
