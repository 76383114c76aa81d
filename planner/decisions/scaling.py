"""How many GPUs: the best plan's throughput, MFU and time to train over node counts (and global batch sizes,
since the batch bounds data parallelism), and where adding GPUs stops paying.

Scaling efficiency of a point = its tokens/s per GPU / tokens/s per GPU of the smallest node count of the sweep
that fits, at the same global batch (strong scaling: same batch, more GPUs). Adding GPUs "stops paying" at the
first node count whose efficiency falls below STOP_EFFICIENCY (70%): from there each GPU delivers less than
70% of what it delivers on the smallest cluster that fits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.decisions.report import MARGIN_RELAXED, DecisionReport, Planned
from planner.defaults import DEFAULT_HEADROOM_GIB

if TYPE_CHECKING:
    from planner.problem import Problem
    from planner.search import PlanOptions, PlanResult

STOP_EFFICIENCY = 0.70
DEFAULT_POINTS = 8


def default_node_counts(nodes: int, points: int = DEFAULT_POINTS) -> list[int]:
    """`points` counts doubling up to 4x `nodes` (nodes/32 ... nodes*4), starting no lower than 1 node."""
    top = nodes * 4
    counts = [top >> k for k in range(points) if top >> k >= 1]
    return sorted(set(counts))


@dataclass
class Point(Planned):
    nodes: int
    num_gpus: int
    global_batch_size: int
    problem: Problem
    result: PlanResult | None
    error: str | None
    efficiency: float | None = None

    @property
    def label(self) -> str:
        return f"{self.nodes} nodes"

    @property
    def tokens_per_second(self) -> float | None:
        return self.result.pick.estimate.tokens_per_second if self.result else None

    @property
    def per_gpu(self) -> float | None:
        return self.result.pick.estimate.tokens_per_second_per_gpu if self.result else None


@dataclass
class Curve:
    global_batch_size: int
    points: list[Point]

    @property
    def base(self) -> Point | None:
        return next((p for p in self.points if p.feasible), None)

    @property
    def stops_paying(self) -> Point | None:
        """The first point (fewest nodes) whose scaling efficiency is below STOP_EFFICIENCY."""
        return next((p for p in self.points if p.efficiency is not None and p.efficiency < STOP_EFFICIENCY), None)


def scaling_curve(make_problem: Callable[[int, int], Problem], opts: PlanOptions, node_counts: list[int],
                  global_batch_size: int) -> Curve:
    """Plan at each node count (`make_problem(nodes, batch)`), then set each point's scaling efficiency."""
    return scaling_curves(make_problem, opts, node_counts, [global_batch_size])[0]


def _curve(batch: int, points: list[Point]) -> Curve:
    curve = Curve(batch, points)
    base = curve.base
    for p in points:
        if p.feasible and base is not None:
            p.efficiency = p.pick.estimate.tokens_per_second_per_gpu / base.pick.estimate.tokens_per_second_per_gpu
    return curve


def scaling_curves(make_problem: Callable[[int, int], Problem], opts: PlanOptions, node_counts: list[int],
                   batches: list[int]) -> list[Curve]:
    """One curve per global batch; every (node count, batch) is planned independently (planner.decisions.parallel)."""
    from planner.decisions.parallel import plan_all

    grid = [(n, b) for b in batches for n in sorted(set(node_counts))]
    problems = [make_problem(n, b) for n, b in grid]
    points = [Point(n, pr.cluster.num_gpus, b, pr, None if isinstance(res, str) else res,
                    res.splitlines()[0] if isinstance(res, str) else None)
              for (n, b), pr, res in zip(grid, problems, plan_all(problems, opts), strict=True)]
    return [_curve(b, [p for p in points if p.global_batch_size == b]) for b in batches]


def point_json(p: Point, tokens: float) -> dict[str, Any]:
    doc: dict[str, Any] = {"nodes": p.nodes, "num_gpus": p.num_gpus, "global_batch_size": p.global_batch_size, "feasible": p.feasible,
           "infeasible_reason": p.error, "layout": None, "step_time_seconds": None, "tokens_per_second": None,
           "tokens_per_second_per_gpu": None, "mfu": None, "pipeline_bubble_share": None,
           "scaling_efficiency": p.efficiency, "time_to_train_days": None,
           "memory_margin_relaxed": p.margin_relaxed}
    if p.feasible:
        est = p.pick.estimate
        doc.update(layout=p.pick.layout.model_dump(mode="json"), step_time_seconds=est.step_seconds,
                   tokens_per_second=est.tokens_per_second, tokens_per_second_per_gpu=est.tokens_per_second_per_gpu,
                   mfu=est.mfu, pipeline_bubble_share=est.time.pipeline_bubble_seconds / est.step_seconds,
                   time_to_train_days=tokens / est.tokens_per_second / 86_400)
    return doc


def as_json(curves: list[Curve], tokens: float, tokens_given: bool) -> dict[str, Any]:
    return {"tokens": tokens, "tokens_given": tokens_given, "stop_efficiency": STOP_EFFICIENCY,
            "efficiency_definition": "tokens/s per GPU relative to the smallest node count that fits, same batch",
            "curves": [{"global_batch_size": c.global_batch_size,
                        "base_nodes": c.base.nodes if c.base else None,
                        "stops_paying_at_nodes": c.stops_paying.nodes if c.stops_paying else None,
                        "points": [point_json(p, tokens) for p in c.points]} for c in curves]}


def render_lines(curves: list[Curve], tokens: float, tokens_given: bool, title: str) -> list[str]:
    import textwrap

    from planner.decisions.train import wrap
    from planner.explain.report import count

    head = (f"days: to train {count(tokens)} tokens" + ("" if tokens_given else " (no --tokens: per trillion)")
            + "; eff.: tokens/s per GPU against the first row that fits")
    lines = [*textwrap.wrap(title, 80), *textwrap.wrap(head, 80)]
    for c in curves:
        lines += ["", f"global batch {c.global_batch_size:,} sequences",
                  f"{'nodes':>6}{'GPUs':>8}{'tokens/s':>11}{'/GPU':>7}{'MFU':>7}{'eff.':>6}{'days':>9}  "
                  f"{'tp x pp x dp':<12}{'bubble':>8}"]
        stop = c.stops_paying
        for p in c.points:
            mark = " <" if p is stop else ""
            if not p.feasible:
                lines.append(f"{p.nodes:>6,}{p.num_gpus:>8,}  no layout fits")
                continue
            est, lay = p.pick.estimate, p.pick.layout
            share = est.time.pipeline_bubble_seconds / est.step_seconds
            degrees = f"{lay.tp}x{lay.pp}x{lay.dp}" + (f" cp{lay.cp}" if lay.cp > 1 else "")
            tight = " !" if p.margin_relaxed else ""
            lines.append(f"{p.nodes:>6,}{p.num_gpus:>8,}{count(est.tokens_per_second):>11}"
                         f"{est.tokens_per_second_per_gpu:>7,.0f}{est.mfu:>7.1%}{p.efficiency:>6.0%}"
                         f"{tokens / est.tokens_per_second / 86_400:>9,.1f}  {degrees:<12}{share:>8.1%}{mark}{tight}")
        if any(p.margin_relaxed for p in c.points):
            lines += wrap("!", MARGIN_RELAXED)
        if c.base is None:
            lines += wrap("note", "no node count of the sweep fits this model")
        elif stop is None:
            lines += wrap("paying", f"every count keeps scaling efficiency >= {STOP_EFFICIENCY:.0%} of {c.base.nodes:,} "
                                    "nodes' tokens/s per GPU")
        else:
            lines += wrap("stops", f"< marks where adding GPUs stops paying: at {stop.nodes:,} nodes each GPU "
                                   f"delivers {stop.efficiency:.0%} of its tokens/s on {c.base.nodes:,} nodes "
                                   f"(below {STOP_EFFICIENCY:.0%})")
    return lines


@dataclass(frozen=True)
class ScalingRequest:
    """`planner scaling`'s options."""

    cluster: str
    model: str
    global_batch_size: int
    seq_len: int
    nodes: int | None = None  # centre of the default sweep (default: the cluster's own node count)
    node_counts: str | None = None  # "64,128,256"
    batch_sizes: str | None = None  # "1024,2048"
    precision: str | None = None
    headroom_gib: float = DEFAULT_HEADROOM_GIB
    tokens: float | None = None
    use_solver: bool = True
    figure: Path | None = None
    framework: str | None = None  # only what it runs; its default FP8 recipe (planner/frameworks/capabilities.py)
    fp8_recipe: str | None = None  # with precision fp8; validated per framework as in `plan`
    optimizer_states: str | None = None  # --optimizer-states, as in `plan`
    compile_model: bool = False  # --compile, as in `plan`
    memory_margin: str = "band-high"  # --memory-margin, as in `plan` (planner.search.MEMORY_MARGINS)


def scaling_report(req: ScalingRequest) -> DecisionReport:
    """Check the options, plan at every node count and batch, and return the document, lines and figure."""
    from cluster_specs import load_cluster
    from planner.decisions.report import check_figure, framework_restriction, header, parse_counts
    from planner.decisions.train import check_run_options
    from planner.estimate import build_problem
    from planner.inputs.layout_string import parse_optimizer_states
    from planner.rules import refuse_unrunnable_setup
    from planner.search import PlanOptions, with_memory_margin

    budget = req.tokens if req.tokens is not None else 1e12
    check_run_options(budget, None, None)
    check_figure(req.figure)
    counts = (parse_counts(req.node_counts, "--node-counts")
              or default_node_counts(req.nodes or load_cluster(req.cluster).num_nodes))
    batches = parse_counts(req.batch_sizes, "--batch-sizes", 10**8) or [req.global_batch_size]

    states = parse_optimizer_states(req.optimizer_states)

    def make(nodes: int, batch: int) -> Any:  # the problem `plan` would solve, its memory margin included
        return with_memory_margin(build_problem(
            req.cluster, nodes, req.model, batch, req.seq_len, req.precision, req.headroom_gib,
            framework=req.framework, fp8_recipe=req.fp8_recipe, optimizer_states=states,
            compile_model=req.compile_model), req.memory_margin)

    base = make(counts[0], batches[0])
    refuse_unrunnable_setup(base.training, base.cluster)  # one GPU type: no point of the sweep could run it
    opts = PlanOptions(use_solver=req.use_solver, restriction=framework_restriction(
        req.framework, req.model, base.training))
    curves = scaling_curves(make, opts, counts, batches)
    first = curves[0].points[0].problem
    title = (f"Scaling: {first.model.name}, {req.seq_len}-token sequences, on {first.cluster.name} "
             f"({first.cluster.gpus_per_node} x {first.hardware.gpu_name} per node)")
    doc = {**header("scaling"), "inputs": {"cluster": first.cluster.model_dump(mode="json"),
                                           "model": first.model.model_dump(mode="json"), "seq_length": req.seq_len,
                                           "training": first.training.model_dump(mode="json")},
           "framework": opts.restriction.caps.framework.value if opts.restriction else None,
           "memory_margin": req.memory_margin, **as_json(curves, budget, req.tokens is not None)}

    def draw(path: Path) -> None:
        from planner.explain.figures import scaling_figure

        scaling_figure(curves, path, title)

    return DecisionReport(doc, render_lines(curves, budget, req.tokens is not None, title), draw)
