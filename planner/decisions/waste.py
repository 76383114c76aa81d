"""Does the pick waste the cluster? If so, say what would help (issue 13: "fewer GPUs at nearly the same
step time, or a larger global batch").

Wasted share of a step = (pipeline bubble + exposed TP, DP and pipeline communication) / step time. A pick is
called wasteful when that share is at least WASTE_THRESHOLD (30%). On the README's planning cases the share is
0-16% for the well-fed picks (MT-NLG 530B on 2,240 A100: 14%) and 48-63% for the over-scaled ones (Llama 3
405B on 16,384 H100 at batch 2,048; 1T on 65,536 H100 at batch 3,072), so 30% separates them with margin.

For a wasteful pick:
- fewer GPUs: the best plan on half and on a quarter of the nodes, with its share of the pick's tokens/s and the
  change in GPU-hours to train; and the min-gpus search (`--objective min-gpus`) as a ready command for
  NEARLY_SAME (90%) of the pick's tokens/s. It is not run inside `plan`: it plans ~log2(nodes) clusters, the
  small ones through the infeasibility analysis, 16 s of CPU for 1T on 8,192 nodes;
- a larger global batch (2x and 4x) on the same GPUs: its pick's tokens/s and MFU. A larger batch changes the
  optimisation (tokens per update), which the planner does not model: it is offered as an option to check with
  the training recipe, not as a free gain;
- the `planner scaling` command that draws the whole curve.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cost_models.step import StepEstimate
    from planner.problem import Problem
    from planner.search import PlanOptions, PlanResult

WASTE_THRESHOLD = 0.30
NEARLY_SAME = 0.90
BATCH_FACTORS = (2, 4)
FEWER_FACTORS = (2, 4)


def wasted_parts(est: StepEstimate) -> dict[str, float]:
    t, step = est.time, est.step_seconds
    return {"pipeline_bubble": t.pipeline_bubble_seconds / step, "tp_comm_exposed": t.tp_comm_seconds / step,
            "dp_comm_exposed": t.dp_comm_seconds / step, "pp_p2p_exposed": t.pp_p2p_seconds / step,
            "cp_comm_exposed": t.cp_comm_seconds / step, "ep_comm_exposed": t.ep_comm_seconds / step}


def _quiet(opts: PlanOptions) -> PlanOptions:
    return replace(opts, use_solver=False, progress=False)


def fewer_gpus(problem: Problem, result: PlanResult, opts: PlanOptions) -> list[dict[str, Any]]:
    """The best plan on half and a quarter of the nodes: its share of the pick's tokens/s and the GPU-hours saved."""
    from planner.errors import InfeasibleError
    from planner.problem import Problem
    from planner.search import plan

    out, base = [], result.pick.estimate.tokens_per_second
    for f in FEWER_FACTORS:
        nodes = problem.cluster.num_nodes // f
        if nodes < 1:
            break
        smaller = Problem(problem.model, problem.training, problem.cluster.with_nodes(nodes), problem.knobs)
        try:
            pick = plan(smaller, _quiet(opts)).pick
        except InfeasibleError:
            break
        rel = pick.estimate.tokens_per_second / base
        gpu_share = smaller.cluster.num_gpus / problem.cluster.num_gpus
        out.append({"nodes": nodes, "num_gpus": smaller.cluster.num_gpus,
                    "tokens_per_second": pick.estimate.tokens_per_second, "mfu": pick.estimate.mfu,
                    "relative_throughput": rel, "gpu_hours_change": gpu_share / rel - 1,
                    "layout_text": pick.layout.short()})
    return out


def min_gpus_command(problem: Problem, target: float) -> str:
    tr, cl = problem.training, problem.cluster
    return (f"planner plan -c {cl.name} -n {cl.num_nodes} -m {problem.model.name} -b {tr.global_batch_size} "
            f"-s {tr.seq_length} --objective min-gpus --target-tokens-per-second {target:.0f}")


def larger_batches(problem: Problem, result: PlanResult, opts: PlanOptions) -> list[dict[str, Any]]:
    from planner.errors import InfeasibleError
    from planner.problem import Problem
    from planner.search import plan

    out = []
    for f in BATCH_FACTORS:
        b = problem.training.global_batch_size * f
        bigger = Problem(problem.model, problem.training.model_copy(update={"global_batch_size": b}), problem.cluster,
                         problem.knobs)
        try:
            pick = plan(bigger, _quiet(opts)).pick
        except InfeasibleError:
            continue
        est = pick.estimate
        out.append({"global_batch_size": b, "tokens_per_second": est.tokens_per_second, "mfu": est.mfu,
                    "wasted_share": sum(wasted_parts(est).values()), "layout_text": pick.layout.short(),
                    "relative_throughput": est.tokens_per_second / result.pick.estimate.tokens_per_second})
    return out


def scaling_command(problem: Problem) -> str:
    tr, cl = problem.training, problem.cluster
    return (f"planner scaling -c {cl.name} -n {cl.num_nodes} -m {problem.model.name} -b {tr.global_batch_size} "
            f"-s {tr.seq_length} --batch-sizes {','.join(str(tr.global_batch_size * f) for f in (1, *BATCH_FACTORS))}")


def utilisation(problem: Problem, result: PlanResult, opts: PlanOptions) -> dict[str, Any]:
    """The pick's wasted share and, when it is wasteful, what would help (see the module docstring)."""
    parts = wasted_parts(result.pick.estimate)
    share = sum(parts.values())
    doc: dict[str, Any] = {"wasted_share": share, "parts": parts, "threshold": WASTE_THRESHOLD,
                           "wasteful": share >= WASTE_THRESHOLD, "fewer_gpus": [], "min_gpus_command": None,
                           "larger_batches": [], "scaling_command": None}
    if doc["wasteful"]:
        doc["fewer_gpus"] = fewer_gpus(problem, result, opts)
        doc["min_gpus_command"] = min_gpus_command(problem, NEARLY_SAME * result.pick.estimate.tokens_per_second)
        doc["larger_batches"] = larger_batches(problem, result, opts)
        doc["scaling_command"] = scaling_command(problem)
    return doc


def render_lines(doc: dict[str, Any], problem: Problem) -> list[str]:
    from planner.decisions.train import wrap
    from planner.explain.report import command_lines, count

    if not doc["wasteful"]:
        return []
    p = doc["parts"]
    import textwrap

    comm = sum(v for k, v in p.items() if k != "pipeline_bubble")
    lines = ["", *textwrap.wrap(f"The pick wastes the cluster: {doc['wasted_share']:.0%} of each step is pipeline "
                                f"bubble ({p['pipeline_bubble']:.0%}) or exposed communication ({comm:.0%}), at least "
                                f"{doc['threshold']:.0%}. What would help:", 80)]
    for f in doc["fewer_gpus"]:
        lines += wrap(f"{f['nodes']:,} nodes", f"{f['relative_throughput']:.0%} of the tokens/s on "
                                                f"{f['num_gpus'] / problem.cluster.num_gpus:.0%} of the GPUs (MFU "
                                                f"{f['mfu']:.1%}; GPU-hours to train {f['gpu_hours_change']:+.0%})")
    lines += wrap("min-gpus", f"the fewest nodes for {NEARLY_SAME:.0%} of the tokens/s:")
    lines += command_lines(doc["min_gpus_command"], "    ")  # whole, to copy
    for b in doc["larger_batches"]:
        lines += wrap(f"batch x{b['global_batch_size'] // problem.training.global_batch_size}",
                      f"{b['global_batch_size']:,} sequences: {count(b['tokens_per_second'])} tokens/s "
                                                           f"({b['relative_throughput'] - 1:+.0%}), MFU {b['mfu']:.1%}, "
                                                           f"{b['wasted_share']:.0%} wasted")
    if doc["larger_batches"]:
        lines += wrap("", "a larger batch changes the optimisation (fewer updates per token): check it with your "
                          "training recipe")
    lines += wrap("curve", "tokens/s, MFU and days over node counts and batch sizes:")
    lines += command_lines(doc["scaling_command"], "    ")  # whole, to copy
    return lines
