"""`plan --sensitivity`: does the pick survive a wrong assumption?

The plan is made again under each perturbed input, with the same search options:

- inter-node bandwidth x0.5 and x2 (the NICs' line rate), intra-node bandwidth x0.5 (NVLink/PCIe);
- the GPU's achievable matmul efficiency +-10% (capped at 1);
- the top and bottom of the step-time error band: the model's end-to-end compute efficiency divided by the
  band's upper and lower factor (compute that much slower or faster while the network stays as modelled), which
  shifts the balance between compute and communication, so the ranking can change;
- one node fewer (a node lost to a failure, or a smaller allocation).

For each: the new best layout, whether the pick changes, and when the original pick can still run there, its
regret: its step time under the perturbation / the new best's - 1. A change whose regret is below the tie
tolerance is reported as a tie, not a change.

The tie tolerance is the ranking error band (planner/decisions/ranking.py): the spread of the error of the
*ratio* of two layouts' predicted step times, measured on vTrain's runs (many layouts of one model on one
cluster), not one prediction's error band: two layouts of one model on one cluster share most of their error.

Ties in the plan itself: the distinct layouts (in the plan's ranking order, as `planner bench --top K` reads the
plan's runners-up) whose predicted step time is within the tie tolerance of the pick's. The first
SHORT_LIST_MAX of them are the short list to measure with `planner bench plan.json --top K`. Recommended: the
simplest on the short list (the search's own simplicity order: no offload, lower ZeRO stage, fewer
model-parallel GPUs, plain 1F1B, no recomputation) among those within the ranking band's recommendation bound
(a layout that much slower was in fact faster in 40% of past pairs) of the pick, so a simpler layout is never recommended at a large predicted cost.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from planner.decisions.ranking import RankingBand, ranking_band

if TYPE_CHECKING:
    from planner.decisions.train import StepTimeBand
    from planner.inputs.specs import LayoutSpec
    from planner.problem import Problem
    from planner.search import Candidate, PlanOptions, PlanResult

SHORT_LIST_MAX = 5


def shape(layout: LayoutSpec) -> tuple[Any, ...]:
    """The layout's shape, as the plan's runners-up are told apart (the micro-batch size and the exact stage
    split are refinements of it)."""
    return (layout.tp, layout.pp, layout.dp, layout.zero_stage, layout.offload, layout.recompute, layout.schedule,
            layout.virtual_stages)


def identity(layout: LayoutSpec) -> tuple[Any, ...]:
    """What makes two layouts the same choice to a user: the shape and the micro-batch size."""
    return (*shape(layout), layout.micro_batch_size)


def _with(problem: Problem, *, cluster: Any = None, knobs: Any = None) -> Problem:
    from planner.problem import Problem

    return Problem(problem.model, problem.training, cluster or problem.cluster, knobs or problem.knobs)


def _net(problem: Problem, factor: float) -> Problem | None:
    cl = problem.cluster
    if cl.num_nodes < 2 or cl.inter_node.nic_link() is None:
        return None
    net = cl.inter_node.model_copy(update={"nic_gbit_per_s": cl.inter_node.nic_gbit_per_s * factor})
    return _with(problem, cluster=cl.model_copy(update={"inter_node": net}))


def _intra(problem: Problem, factor: float) -> Problem | None:
    cl = problem.cluster
    if cl.gpus_per_node < 2:
        return None
    link = cl.intra_node.model_copy(update={"gb_per_s": cl.intra_node.gb_per_s * factor})
    return _with(problem, cluster=cl.model_copy(update={"intra_node": link}))


def _matmul(problem: Problem, factor: float) -> Problem:
    cl = problem.cluster
    gpu = cl.gpu_spec()
    gpu = gpu.model_copy(update={"matmul_efficiency": min(1.0, gpu.matmul_efficiency * factor)})
    return _with(problem, cluster=cl.model_copy(update={"gpu": gpu}))


def _compute(problem: Problem, step_factor: float) -> Problem:
    k = problem.knobs
    return _with(problem, knobs=replace(k, end_to_end_efficiency=min(1.0, k.end_to_end_efficiency / step_factor)))


def _one_node_fewer(problem: Problem) -> Problem | None:
    n = problem.cluster.num_nodes
    return None if n < 2 else _with(problem, cluster=problem.cluster.with_nodes(n - 1))


@dataclass(frozen=True)
class Scenario:
    name: str
    make: Callable[[Problem], Problem | None]  # problem -> perturbed problem, None when it does not apply


def scenarios(band: StepTimeBand | None) -> list[Scenario]:
    out = [Scenario("inter-node bandwidth x0.5", lambda p: _net(p, 0.5)),
           Scenario("inter-node bandwidth x2", lambda p: _net(p, 2.0)),
           Scenario("intra-node bandwidth x0.5", lambda p: _intra(p, 0.5)),
           Scenario("matmul efficiency +10%", lambda p: _matmul(p, 1.1)),
           Scenario("matmul efficiency -10%", lambda p: _matmul(p, 0.9))]
    if band is not None:
        top, bottom = band.upper_factor, band.lower_factor
        out += [Scenario(f"error band top (compute x{top:.2f} slower)", lambda p: _compute(p, top)),
                Scenario(f"error band bottom (compute x{bottom:.2f})", lambda p: _compute(p, bottom))]
    out.append(Scenario("one node fewer", _one_node_fewer))
    return out


@dataclass
class Outcome:
    name: str
    verdict: str  # kept | tie | changes | not applicable | infeasible
    new_pick: Candidate | None = None
    original_step_seconds: float | None = None  # the original pick under the perturbation, when it can run
    new_step_seconds: float | None = None
    note: str = ""

    @property
    def regret(self) -> float | None:
        if self.original_step_seconds is None or self.new_step_seconds is None:
            return None
        return self.original_step_seconds / self.new_step_seconds - 1


def _original_under(problem: Problem, layout: LayoutSpec, allow_tp_across_nodes: bool) -> tuple[float | None, str]:
    """The original pick's step time in the perturbed problem, or why it cannot run there."""
    from planner.estimate import fits_in_memory
    from planner.rules import layout_violations

    if layout.num_gpus != problem.cluster.num_gpus:
        return None, f"the pick needs {layout.num_gpus:,} GPUs; this cluster has {problem.cluster.num_gpus:,}"
    bad = layout_violations(layout, problem.model, problem.training, problem.cluster,
                            allow_tp_across_nodes=allow_tp_across_nodes)
    if bad:
        return None, str(bad[0])
    est = problem.estimate(layout)
    # the fit rule the perturbed plan was made under: its memory margin included, so the two picks are judged alike
    if not fits_in_memory(est, problem.knobs.memory_headroom_bytes, problem.knobs.memory_high_fraction):
        return None, "the pick no longer fits in memory" + (" at the memory band's high end"
                                                            if problem.knobs.memory_high_fraction > 0 else "")
    return est.step_seconds, ""


def run_scenario(sc: Scenario, problem: Problem, pick: Candidate, opts: PlanOptions, tie: float) -> Outcome:
    from planner.errors import InfeasibleError
    from planner.search import plan

    perturbed = sc.make(problem)
    if perturbed is None:
        return Outcome(sc.name, "not applicable", note="the cluster has no such link or node to remove")
    try:
        new = plan(perturbed, replace(opts, progress=False)).pick
    except InfeasibleError as exc:
        return Outcome(sc.name, "infeasible", note=str(exc).splitlines()[0])
    orig, why = _original_under(perturbed, pick.layout, opts.allow_tp_across_nodes)
    out = Outcome(sc.name, "kept", new, orig, new.step_seconds, why)
    if identity(new.layout) == identity(pick.layout):
        return out
    out.verdict = "tie" if out.regret is not None and out.regret <= tie else "changes"
    return out


@dataclass
class Sensitivity:
    ranking: RankingBand
    outcomes: list[Outcome]
    tied: list[Candidate]  # the pick and the distinct layouts within the tie tolerance of it, plan order
    recommended: Candidate  # the simplest of the short list within the recommendation bound

    @property
    def tie_tolerance(self) -> float:
        return self.ranking.tie_tolerance

    @property
    def short_list(self) -> list[Candidate]:
        return self.tied[:SHORT_LIST_MAX]


def tied_layouts(result: PlanResult, tie: float) -> list[Candidate]:
    """The pick and the distinct layouts (by `shape`, as the runners-up) within `tie` of the pick's step time, in
    the plan's ranking order (the order of its runners-up, which `planner bench --top K` measures)."""
    out, seen = [result.pick], {shape(result.pick.layout)}
    for c in result.ranked:
        if c.step_seconds <= result.pick.step_seconds * (1 + tie) and shape(c.layout) not in seen:
            seen.add(shape(c.layout))
            out.append(c)
    return out


def recommend(short_list: list[Candidate], within: float) -> Candidate:
    """The simplest layout of the short list whose predicted step time is within `within` of the pick's (the
    first entry); among equally simple ones, the faster."""
    from planner.search import _simplicity

    pick = short_list[0]
    near = [c for c in short_list if c.step_seconds <= pick.step_seconds * (1 + within)]
    return min(near, key=lambda c: (_simplicity(c.layout), c.step_seconds))


def sensitivity(problem: Problem, result: PlanResult, opts: PlanOptions, band: StepTimeBand | None = None,
                ranking: RankingBand | None = None) -> Sensitivity:
    ranking = ranking or ranking_band()
    tie = ranking.tie_tolerance
    outcomes = [run_scenario(sc, problem, result.pick, opts, tie) for sc in scenarios(band)]
    tied = tied_layouts(result, tie)
    return Sensitivity(ranking, outcomes, tied, recommend(tied[:SHORT_LIST_MAX], ranking.recommend_within))


def _outcome_json(o: Outcome, pick: Candidate) -> dict[str, Any]:
    return {"perturbation": o.name, "verdict": o.verdict,
            "new_pick": None if o.new_pick is None else o.new_pick.layout.model_dump(mode="json"),
            "new_pick_text": None if o.new_pick is None else o.new_pick.layout.short(),
            "new_step_time_seconds": o.new_step_seconds, "original_step_time_seconds": o.original_step_seconds,
            "step_time_change": None if o.new_step_seconds is None else o.new_step_seconds / pick.step_seconds - 1,
            "regret": o.regret, "note": o.note}


def as_json(s: Sensitivity, pick: Candidate) -> dict[str, Any]:
    return {"tie_tolerance": s.tie_tolerance, "tie_source": s.ranking.description,
            "recommend_within": s.ranking.recommend_within,
            "scenarios": [_outcome_json(o, pick) for o in s.outcomes],
            "tied": [{"layout_text": c.layout.short(), "step_time_seconds": c.step_seconds,
                      "step_time_vs_pick": c.step_seconds / pick.step_seconds - 1} for c in s.tied],
            "recommended": s.recommended.layout.short(),
            "recommended_step_time_vs_pick": s.recommended.step_seconds / pick.step_seconds - 1,
            "short_list": [c.layout.short() for c in s.short_list], "short_list_size": len(s.short_list)}


def _scenario_lines(doc: dict[str, Any]) -> list[str]:
    lines = [f"  {'perturbation':<40}{'best step':>10}  {'pick':<10}{'regret':>8}"]
    for o in doc["scenarios"]:
        step = "-" if o["step_time_change"] is None else f"{o['step_time_change']:+.1%}"
        regret = "-" if o["regret"] is None else f"{max(o['regret'], 0.0):+.1%}"  # < 0: inside the search's tie
        lines.append(f"  {o['perturbation'][:39]:<40}{step:>10}  {o['verdict']:<10}{regret:>8}")
        if o["verdict"] in ("changes", "tie"):
            lines.append(f"    -> {o['new_pick_text']}")
        if o["note"] and o["verdict"] != "kept":
            lines += textwrap.wrap(o["note"], 80, initial_indent="    ", subsequent_indent="    ")
    return lines


def _tie_lines(doc: dict[str, Any], plan_command: str) -> list[str]:
    from planner.explain.report import command_lines

    n, k, tol = len(doc["tied"]), doc["short_list_size"], doc["tie_tolerance"]
    if n == 1:
        return [f"No other layout lies within {tol:.1%} of the pick's step time."]
    lines = textwrap.wrap(f"Tie: {n} layouts lie within {tol:.1%} of the pick's step time: the model cannot "
                          f"order them. The short list ({k} fastest):", 80)
    lines += [f"  {t['step_time_vs_pick']:+6.1%}  {t['layout_text']}" for t in doc["tied"][:k]]
    if doc["recommended"] == doc["tied"][0]["layout_text"]:
        why = (f"Recommended: the pick (no simpler layout of the short list is within "
               f"{doc['recommend_within']:.1%} of it).")
        lines += textwrap.wrap(why, 80)
    else:
        lines += textwrap.wrap(f"Recommended, the simplest of the short list within {doc['recommend_within']:.1%} "
                               f"of the pick ({doc['recommended_step_time_vs_pick']:+.1%} step time):", 80)
        lines.append(f"  {doc['recommended']}")
    lines += textwrap.wrap(f"Measure the short list ({k} layouts) before launching:", 80)
    return lines + command_lines(f"{plan_command} -o plan.json") + [f"  planner bench plan.json --top {k}"]


def render_lines(doc: dict[str, Any], plan_command: str) -> list[str]:
    """The sensitivity report in at most 80 columns (layouts on lines of their own, whole)."""
    lines = ["", "Sensitivity: the plan made again under each perturbed input",
             *textwrap.wrap(f"tie tolerance {doc['tie_tolerance']:.1%}: {doc['tie_source']}", 80),
             *_scenario_lines(doc)]
    lines += textwrap.wrap("best step: the new best's step time against the pick's today; regret: the pick's step "
                           "time under the perturbation against the new best's.", 80)
    return lines + ["", *_tie_lines(doc, plan_command)]
