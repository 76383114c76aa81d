"""`planner compare`: plan one model and batch on several clusters and rank them.

Each entry is `CLUSTER:NODES[@PRICE]` (a preset or a cluster file, the node count, and optionally the price
per GPU-hour of that cluster; --gpu-hour-price gives one price for the entries without their own). Each is
planned with the planner's own search (planner.search.plan), and the clusters are ranked three ways:

- time to train the token budget (fewest days first; 1T tokens when no budget is given),
- cost per million tokens (with prices; without, GPU-hours per million tokens, which orders the clusters as
  tokens/s per GPU does),
- tokens per second per GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.decisions.parallel import CANNOT_RUN
from planner.decisions.report import MARGIN_RELAXED, DecisionReport, Planned
from planner.decisions.train import StepTimeBand, TrainingRun, for_problem
from planner.defaults import DEFAULT_HEADROOM_GIB

if TYPE_CHECKING:
    from planner.problem import Problem
    from planner.search import Candidate, PlanOptions, PlanResult

DEFAULT_TOKENS = 1e12  # the budget when none is given: "days per trillion tokens"


@dataclass(frozen=True)
class ClusterChoice:
    cluster: str
    nodes: int
    price_per_gpu_hour: float | None = None

    @property
    def label(self) -> str:
        return f"{self.cluster}:{self.nodes}"


def parse_clusters(text: str, default_price: float | None = None) -> list[ClusterChoice]:
    """`a:128,b:64@2.5` -> choices; one SpecError listing every malformed entry."""
    from cluster_specs import SpecError

    out, problems = [], []
    for raw in (t.strip() for t in text.split(",")):
        if not raw:
            continue
        body, _, price_txt = raw.partition("@")
        name, sep, nodes_txt = body.rpartition(":")
        try:
            nodes = int(nodes_txt)
            price = float(price_txt) if price_txt else default_price
        except ValueError:
            nodes, price = 0, None
        if not sep or not name or not 1 <= nodes <= 1_000_000:
            problems.append(f"--clusters: {raw!r} -> expected CLUSTER:NODES[@PRICE], NODES an integer 1..1000000")
        elif price is not None and not (math.isfinite(price) and 0 <= price <= 1e4):
            problems.append(f"--clusters: {raw!r} -> the price must be between 0 and 10000 per GPU-hour")
        else:
            out.append(ClusterChoice(name, nodes, price))
    if not out and not problems:
        problems.append(f"--clusters: {text!r} -> give at least one CLUSTER:NODES")
    if len({c.label for c in out}) != len(out):
        problems.append(f"--clusters: {text!r} -> an entry is repeated")
    if len(out) > 16:
        problems.append(f"--clusters: {len(out)} entries -> at most 16")
    if problems:
        raise SpecError(problems)
    return out


@dataclass
class Entry(Planned):
    choice: ClusterChoice
    problem: Problem
    result: PlanResult | None
    run: TrainingRun | None
    error: str | None

    @property
    def label(self) -> str:
        return self.choice.label

    @property
    def training(self) -> TrainingRun:
        """The training run of the pick (only for a feasible entry)."""
        if self.run is None:
            raise ValueError(f"{self.label}: no layout fits")
        return self.run

    def per_million_tokens(self) -> dict[str, float | None]:
        """GPU-hours, cost and GPU energy (kWh) per million tokens."""
        if self.run is None:
            return {"gpu_hours": None, "cost": None, "gpu_energy_kwh": None}
        f = 1e6 / self.run.tokens
        q = self.run.quantities()
        return {"gpu_hours": self.run.gpu_hours * f, "cost": None if q["cost"] is None else q["cost"] * f,
                "gpu_energy_kwh": None if q["gpu_energy_kwh"] is None else q["gpu_energy_kwh"] * f}


@dataclass
class Comparison:
    entries: list[Entry]
    tokens: float
    tokens_given: bool

    def ranking(self, key: str) -> list[Entry]:
        """Feasible entries, best first, by `time_to_train`, `cost_per_million_tokens` or `tokens_per_second_per_gpu`."""
        ok = [e for e in self.entries if e.feasible]
        if key == "time_to_train":
            return sorted(ok, key=lambda e: e.training.wall_seconds)
        if key == "tokens_per_second_per_gpu":
            return sorted(ok, key=lambda e: -e.pick.estimate.tokens_per_second_per_gpu)
        if key == "cost_per_million_tokens":
            metric = "cost" if self.priced else "gpu_hours"
            return sorted(ok, key=lambda e: e.per_million_tokens()[metric] or 0.0)
        raise ValueError(key)

    @property
    def priced(self) -> bool:
        return all(e.training.cost is not None for e in self.entries if e.feasible)


ProblemFactory = Callable[[str, int], "Problem"]


def compare(choices: list[ClusterChoice], make_problem: ProblemFactory, opts: PlanOptions, *,
            tokens: float | None = None, pue: float | None = None,
            band_for: Callable[[Problem, Candidate], StepTimeBand | None] | None = None) -> Comparison:
    """Plan on each cluster. `make_problem(cluster, nodes)` builds the Problem (the CLI's own builder, so presets,
    files and calibration behave as in `plan`); an entry that has no feasible layout is kept with its reason."""
    from planner.decisions.parallel import plan_all

    budget = tokens if tokens is not None else DEFAULT_TOKENS
    entries = []
    problems = [make_problem(ch.cluster, ch.nodes) for ch in choices]
    for ch, problem, result in zip(choices, problems, plan_all(problems, opts), strict=True):
        if isinstance(result, str):
            entries.append(Entry(ch, problem, None, None, result))
            continue
        band = band_for(problem, result.pick) if band_for else None
        run = for_problem(problem, result.pick.step_seconds, tokens=budget, price_per_gpu_hour=ch.price_per_gpu_hour,
                          pue=pue, band=band)
        entries.append(Entry(ch, problem, result, run, None))
    return Comparison(entries, budget, tokens is not None)


RANKINGS = ("time_to_train", "cost_per_million_tokens", "tokens_per_second_per_gpu")


def as_json(cmp: Comparison) -> dict[str, Any]:
    from planner.contract import CandidateReport

    def entry(e: Entry) -> dict[str, Any]:
        doc: dict[str, Any] = {"cluster": e.choice.cluster, "nodes": e.choice.nodes, "label": e.choice.label,
               "num_gpus": e.problem.cluster.num_gpus, "gpu": e.problem.hardware.gpu_name,
               "price_per_gpu_hour": e.choice.price_per_gpu_hour, "feasible": e.feasible, "infeasible_reason": e.error,
               "pick": None, "training_run": None, "per_million_tokens": e.per_million_tokens(),
               "memory_margin_relaxed": e.margin_relaxed}
        if e.result is not None:
            pick = e.result.pick
            doc["pick"] = CandidateReport.from_estimate(
                pick.layout, pick.estimate, headroom_bytes=e.problem.knobs.memory_headroom_bytes, origin=pick.origin,
                reason=e.result.reasons.get(id(pick)), problem=e.problem).model_dump(mode="json")  # with its band
            doc["training_run"] = e.training.as_json()
        return doc

    return {"tokens": cmp.tokens, "tokens_given": cmp.tokens_given, "priced": cmp.priced,
            "clusters": [entry(e) for e in cmp.entries],
            "rankings": {k: [e.choice.label for e in cmp.ranking(k)] for k in RANKINGS}}


def render_lines(cmp: Comparison, title: str) -> list[str]:
    """The comparison in at most 80 columns: one row per cluster, its pick under it, then the three rankings."""
    import textwrap

    from planner.explain.report import count

    budget = f"{count(cmp.tokens)} tokens" + ("" if cmp.tokens_given else " (no --tokens: per trillion)")
    money = "cost/Mtok" if cmp.priced else "GPU-h/Mtok"
    lines = [title, f"time to train {budget}", "",
             f"{'cluster':<20}{'GPUs':>7}{'tok/s/GPU':>10}{'MFU':>7}{'days':>9}{money:>11}{'kWh/Mtok':>10}"]
    for e in cmp.entries:
        if not e.feasible:
            why = e.error or ""
            verdict = "cannot run" if why.startswith(CANNOT_RUN) else "no layout fits"
            why = why.removeprefix(CANNOT_RUN)
            lines.append(f"{e.choice.label:<20}{e.problem.cluster.num_gpus:>7,}  {verdict}")
            lines += textwrap.wrap(why.splitlines()[0], 80, initial_indent="  ", subsequent_indent="  ") if why else [""]
            continue
        est, pm = e.pick.estimate, e.per_million_tokens()
        m = pm["cost"] if cmp.priced else pm["gpu_hours"]
        kwh = "-" if pm["gpu_energy_kwh"] is None else f"{pm['gpu_energy_kwh']:.3g}"
        lines.append(f"{e.choice.label[:19]:<20}{e.problem.cluster.num_gpus:>7,}{est.tokens_per_second_per_gpu:>10,.0f}"
                     f"{est.mfu:>7.1%}{e.training.wall_days:>9,.1f}{m:>11.3g}{kwh:>10}")
        lines.append(f"  {e.pick.layout.short()}")  # whole, to copy into --layout
        if e.margin_relaxed:
            lines += textwrap.wrap(f"! {MARGIN_RELAXED}", 80, initial_indent="  ", subsequent_indent="    ")
    lines.append("")
    names = {"time_to_train": "time to train", "tokens_per_second_per_gpu": "tokens/s per GPU",
             "cost_per_million_tokens": "cost per million tokens" if cmp.priced
             else "GPU-hours per million tokens (no prices given)"}
    for key in RANKINGS:
        order = cmp.ranking(key)
        lines += textwrap.wrap(f"by {names[key]}: " + ", ".join(f"{i}. {e.choice.label}" for i, e in enumerate(order, 1)),
                               80, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
    if any(e.run is not None and e.run.band is None for e in cmp.entries):
        from planner.decisions.train import NO_BAND, wrap

        lines += wrap("note", NO_BAND)
    return lines


@dataclass(frozen=True)
class CompareRequest:
    """`planner compare`'s options."""

    clusters: str  # CLUSTER:NODES[@PRICE],...
    model: str
    global_batch_size: int
    seq_len: int
    precision: str | None = None
    headroom_gib: float = DEFAULT_HEADROOM_GIB
    tokens: float | None = None
    gpu_hour_price: float | None = None
    pue: float | None = None
    use_solver: bool = True
    figure: Path | None = None
    framework: str | None = None  # only what it runs; its default FP8 recipe (planner/frameworks/capabilities.py)
    fp8_recipe: str | None = None  # with precision fp8; validated per framework as in `plan`
    optimizer_states: str | None = None  # --optimizer-states, as in `plan`
    compile_model: bool = False  # --compile, as in `plan`
    memory_margin: str = "band-high"  # --memory-margin, as in `plan` (planner.search.MEMORY_MARGINS)


def compare_report(req: CompareRequest) -> DecisionReport:
    """Check the options, plan on every cluster, and return the document, the terminal lines and the figure."""
    from planner.decisions.plan_extras import step_time_band
    from planner.decisions.report import check_figure, framework_restriction, header
    from planner.decisions.train import check_run_options
    from planner.estimate import build_problem
    from planner.inputs.layout_string import parse_optimizer_states
    from planner.search import PlanOptions, with_memory_margin

    check_run_options(req.tokens if req.tokens is not None else DEFAULT_TOKENS, req.gpu_hour_price, req.pue)
    choices = parse_clusters(req.clusters, req.gpu_hour_price)
    check_figure(req.figure)

    states = parse_optimizer_states(req.optimizer_states)

    def make(cluster: str, nodes: int) -> Any:  # the problem `plan` would solve, its memory margin included
        return with_memory_margin(build_problem(
            cluster, nodes, req.model, req.global_batch_size, req.seq_len, req.precision, req.headroom_gib,
            framework=req.framework, fp8_recipe=req.fp8_recipe, optimizer_states=states,
            compile_model=req.compile_model), req.memory_margin)

    opts = PlanOptions(use_solver=req.use_solver, restriction=framework_restriction(
        req.framework, req.model, make(choices[0].cluster, choices[0].nodes).training))
    result = compare(choices, make, opts, tokens=req.tokens, pue=req.pue, band_for=step_time_band)
    first = result.entries[0].problem
    title = (f"{first.model.name}, batch {req.global_batch_size:,} x {req.seq_len:,} tokens, on "
             f"{len(result.entries)} clusters")
    doc = {**header("compare"), "inputs": {"model": first.model.model_dump(mode="json"),
                                           "training": first.training.model_dump(mode="json")},
           "framework": opts.restriction.caps.framework.value if opts.restriction else None,
           "memory_margin": req.memory_margin, **as_json(result)}

    def draw(path: Path) -> None:
        from planner.explain.figures import comparison_figure

        comparison_figure(result, path, title)

    return DecisionReport(doc, render_lines(result, title), draw)
