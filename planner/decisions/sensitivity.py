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
tolerance is reported as a tie, not a change. The tie tolerance is half the error band's relative width when a
band is available (two predictions closer than the model's own error cannot be ordered), else the search's 0.1%.

Ties in the plan itself: the distinct layouts whose predicted step time is within the tie tolerance of the
pick's. Among them the simplest (the search's own simplicity order: no offload, lower ZeRO stage, fewer
model-parallel GPUs, plain 1F1B, no recomputation) is recommended, and the short list for `planner bench --top K`
is named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

SHORT_LIST_MAX = 5


def shape(layout) -> tuple:
    """The layout's shape, as the plan's runners-up are told apart (the micro-batch size and the exact stage
    split are refinements of it)."""
    return (layout.tp, layout.pp, layout.dp, layout.zero_stage, layout.offload, layout.recompute, layout.schedule,
            layout.virtual_stages)


def identity(layout) -> tuple:
    """What makes two layouts the same choice to a user: the shape and the micro-batch size."""
    return (*shape(layout), layout.micro_batch_size)


def _with(problem, *, cluster=None, knobs=None):
    from planner.problem import Problem

    return Problem(problem.model, problem.training, cluster or problem.cluster, knobs or problem.knobs)


def _net(problem, factor: float):
    cl = problem.cluster
    if cl.num_nodes < 2 or cl.inter_node.nic_link() is None:
        return None
    net = cl.inter_node.model_copy(update={"nic_gbit_per_s": cl.inter_node.nic_gbit_per_s * factor})
    return _with(problem, cluster=cl.model_copy(update={"inter_node": net}))


def _intra(problem, factor: float):
    cl = problem.cluster
    if cl.gpus_per_node < 2:
        return None
    link = cl.intra_node.model_copy(update={"gb_per_s": cl.intra_node.gb_per_s * factor})
    return _with(problem, cluster=cl.model_copy(update={"intra_node": link}))


def _matmul(problem, factor: float):
    cl = problem.cluster
    gpu = cl.gpu_spec()
    gpu = gpu.model_copy(update={"matmul_efficiency": min(1.0, gpu.matmul_efficiency * factor)})
    return _with(problem, cluster=cl.model_copy(update={"gpu": gpu}))


def _compute(problem, step_factor: float):
    k = problem.knobs
    return _with(problem, knobs=replace(k, end_to_end_efficiency=min(1.0, k.end_to_end_efficiency / step_factor)))


def _one_node_fewer(problem):
    n = problem.cluster.num_nodes
    return None if n < 2 else _with(problem, cluster=problem.cluster.with_nodes(n - 1))


@dataclass(frozen=True)
class Scenario:
    name: str
    make: Callable[[object], object | None]  # problem -> perturbed problem, None when it does not apply


def scenarios(band) -> list[Scenario]:
    out = [Scenario("inter-node bandwidth x0.5", lambda p: _net(p, 0.5)),
           Scenario("inter-node bandwidth x2", lambda p: _net(p, 2.0)),
           Scenario("intra-node bandwidth x0.5", lambda p: _intra(p, 0.5)),
           Scenario("matmul efficiency +10%", lambda p: _matmul(p, 1.1)),
           Scenario("matmul efficiency -10%", lambda p: _matmul(p, 0.9))]
    if band is not None:
        out += [Scenario(f"error band top (compute x{band.upper_factor:.2f} slower)",
                         lambda p: _compute(p, band.upper_factor)),
                Scenario(f"error band bottom (compute x{band.lower_factor:.2f})", lambda p: _compute(p, band.lower_factor))]
    out.append(Scenario("one node fewer", _one_node_fewer))
    return out


@dataclass
class Outcome:
    name: str
    verdict: str  # kept | tie | changes | not applicable | infeasible
    new_pick: object | None = None  # Candidate
    original_step_seconds: float | None = None  # the original pick under the perturbation, when it can run
    new_step_seconds: float | None = None
    note: str = ""

    @property
    def regret(self) -> float | None:
        if self.original_step_seconds is None or self.new_step_seconds is None:
            return None
        return self.original_step_seconds / self.new_step_seconds - 1


def _original_under(problem, layout, allow_tp_across_nodes: bool) -> tuple[float | None, str]:
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
    if not fits_in_memory(est, problem.knobs.memory_headroom_bytes):
        return None, "the pick no longer fits in memory"
    return est.step_seconds, ""


def run_scenario(sc: Scenario, problem, pick, opts, tie: float) -> Outcome:
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
    tie_tolerance: float
    tie_source: str
    outcomes: list[Outcome]
    tied: list[object]  # Candidates within the tie tolerance of the pick, the pick first
    recommended: object  # the simplest of `tied`


def tied_layouts(result, tie: float) -> list:
    """The pick and the distinct layouts (by `shape`, as the runners-up) within `tie` of the pick's step time,
    fastest first."""
    out, seen = [result.pick], {shape(result.pick.layout)}
    for c in sorted(result.ranked, key=lambda c: c.step_seconds):
        if c.step_seconds <= result.pick.step_seconds * (1 + tie) and shape(c.layout) not in seen:
            seen.add(shape(c.layout))
            out.append(c)
    return out


def sensitivity(problem, result, opts, band=None) -> Sensitivity:
    from planner.search import TIE_RELATIVE, _simplicity

    if band is not None:
        tie, source = band.half_width, f"half the error band's width ({band.source})"
    else:
        tie, source = TIE_RELATIVE, "no error band available: the search's own 0.1% tie tolerance"
    outcomes = [run_scenario(sc, problem, result.pick, opts, tie) for sc in scenarios(band)]
    tied = tied_layouts(result, tie)
    recommended = min(tied, key=lambda c: _simplicity(c.layout))
    return Sensitivity(tie, source, outcomes, tied, recommended)


def as_json(s: Sensitivity, pick) -> dict:
    def outcome(o: Outcome) -> dict:
        return {"perturbation": o.name, "verdict": o.verdict,
                "new_pick": None if o.new_pick is None else o.new_pick.layout.model_dump(mode="json"),
                "new_pick_text": None if o.new_pick is None else o.new_pick.layout.short(),
                "new_step_time_seconds": o.new_step_seconds, "original_step_time_seconds": o.original_step_seconds,
                "step_time_change": None if o.new_step_seconds is None else o.new_step_seconds / pick.step_seconds - 1,
                "regret": o.regret, "note": o.note}

    k = min(len(s.tied), SHORT_LIST_MAX)
    return {"tie_tolerance": s.tie_tolerance, "tie_source": s.tie_source,
            "scenarios": [outcome(o) for o in s.outcomes],
            "tied": [{"layout_text": c.layout.short(), "step_time_seconds": c.step_seconds,
                      "step_time_vs_pick": c.step_seconds / pick.step_seconds - 1} for c in s.tied],
            "recommended": s.recommended.layout.short(), "short_list_size": k}


def render_lines(doc: dict, plan_command: str) -> list[str]:
    """The sensitivity report in at most 80 columns (layouts on lines of their own, whole)."""
    import textwrap

    lines = ["", "Sensitivity: the plan made again under each perturbed input",
             *textwrap.wrap(f"tie tolerance {doc['tie_tolerance']:.1%}: {doc['tie_source']}", 80),
             f"  {'perturbation':<40}{'best step':>10}  {'pick':<10}{'regret':>8}"]
    for o in doc["scenarios"]:
        step = "-" if o["step_time_change"] is None else f"{o['step_time_change']:+.1%}"
        regret = "-" if o["regret"] is None else f"{max(o['regret'], 0.0):+.1%}"  # < 0: inside the search's tie
        lines.append(f"  {o['perturbation'][:39]:<40}{step:>10}  {o['verdict']:<10}{regret:>8}")
        if o["verdict"] in ("changes", "tie"):
            lines.append(f"    -> {o['new_pick_text']}")
        if o["note"] and o["verdict"] != "kept":
            lines += textwrap.wrap(o["note"], 80, initial_indent="    ", subsequent_indent="    ")
    lines += textwrap.wrap("best step: the new best's step time against the pick's today; regret: the pick's step "
                           "time under the perturbation against the new best's.", 80)
    n = len(doc["tied"])
    if n > 1:
        lines += ["", *textwrap.wrap(f"Tie: {n} layouts lie within {doc['tie_tolerance']:.1%} of the pick's step "
                                     "time; the choice between them is inside the model's error. Recommended, the "
                                     "simplest:", 80), f"  {doc['recommended']}"]
        lines += textwrap.wrap(f"Measure the short list ({doc['short_list_size']} layouts) before launching:", 80)
        lines += [f"  {plan_command} -o plan.json", f"  planner bench plan.json --top {doc['short_list_size']}"]
    else:
        lines.append(f"No other layout lies within {doc['tie_tolerance']:.1%} of the pick's step time.")
    return lines
