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

STOP_EFFICIENCY = 0.70
DEFAULT_POINTS = 8


def default_node_counts(nodes: int, points: int = DEFAULT_POINTS) -> list[int]:
    """`points` counts doubling up to 4x `nodes` (nodes/32 ... nodes*4), starting no lower than 1 node."""
    top = nodes * 4
    counts = [top >> k for k in range(points) if top >> k >= 1]
    return sorted(set(counts))


@dataclass
class Point:
    nodes: int
    num_gpus: int
    global_batch_size: int
    problem: object
    result: object | None  # planner.search.PlanResult
    error: str | None
    efficiency: float | None = None

    @property
    def feasible(self) -> bool:
        return self.result is not None

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


def scaling_curve(make_problem: Callable[[int, int], object], opts, node_counts: list[int],
                  global_batch_size: int) -> Curve:
    """Plan at each node count (`make_problem(nodes, batch)`), then set each point's scaling efficiency."""
    from planner.errors import InfeasibleError
    from planner.search import plan

    points = []
    for n in sorted(set(node_counts)):
        problem = make_problem(n, global_batch_size)
        try:
            points.append(Point(n, problem.cluster.num_gpus, global_batch_size, problem, plan(problem, opts), None))
        except InfeasibleError as exc:
            points.append(Point(n, problem.cluster.num_gpus, global_batch_size, problem, None,
                                str(exc).splitlines()[0]))
    curve = Curve(global_batch_size, points)
    base = curve.base
    for p in points:
        if p.feasible and base is not None:
            p.efficiency = p.per_gpu / base.per_gpu
    return curve


def scaling_curves(make_problem, opts, node_counts: list[int], batches: list[int]) -> list[Curve]:
    return [scaling_curve(make_problem, opts, node_counts, b) for b in batches]


def point_json(p: Point, tokens: float) -> dict:
    doc = {"nodes": p.nodes, "num_gpus": p.num_gpus, "global_batch_size": p.global_batch_size, "feasible": p.feasible,
           "infeasible_reason": p.error, "layout": None, "step_time_seconds": None, "tokens_per_second": None,
           "tokens_per_second_per_gpu": None, "mfu": None, "pipeline_bubble_share": None,
           "scaling_efficiency": p.efficiency, "time_to_train_days": None}
    if p.feasible:
        est = p.result.pick.estimate
        doc.update(layout=p.result.pick.layout.model_dump(mode="json"), step_time_seconds=est.step_seconds,
                   tokens_per_second=est.tokens_per_second, tokens_per_second_per_gpu=est.tokens_per_second_per_gpu,
                   mfu=est.mfu, pipeline_bubble_share=est.time.pipeline_bubble_seconds / est.step_seconds,
                   time_to_train_days=tokens / est.tokens_per_second / 86_400)
    return doc


def as_json(curves: list[Curve], tokens: float, tokens_given: bool) -> dict:
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
                  f"{'nodes':>6}{'GPUs':>8}{'tokens/s':>11}{'/GPU':>7}{'MFU':>7}{'eff.':>6}{'days':>9}  tp x pp x dp"
                  f"{'bubble':>8}"]
        stop = c.stops_paying
        for p in c.points:
            mark = " <" if p is stop else ""
            if not p.feasible:
                lines.append(f"{p.nodes:>6,}{p.num_gpus:>8,}  no layout fits")
                continue
            est, lay = p.result.pick.estimate, p.result.pick.layout
            share = est.time.pipeline_bubble_seconds / est.step_seconds
            degrees = f"{lay.tp}x{lay.pp}x{lay.dp}"
            lines.append(f"{p.nodes:>6,}{p.num_gpus:>8,}{count(est.tokens_per_second):>11}"
                         f"{est.tokens_per_second_per_gpu:>7,.0f}{est.mfu:>7.1%}{p.efficiency:>6.0%}"
                         f"{tokens / est.tokens_per_second / 86_400:>9,.1f}  {degrees:<12}{share:>8.1%}{mark}")
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
