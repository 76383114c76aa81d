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

from planner.decisions.train import StepTimeBand, TrainingRun, for_problem

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
class Entry:
    choice: ClusterChoice
    problem: object | None
    result: object | None  # planner.search.PlanResult
    run: TrainingRun | None
    error: str | None

    @property
    def feasible(self) -> bool:
        return self.result is not None

    def per_million_tokens(self) -> dict[str, float | None]:
        """GPU-hours, cost and GPU energy (kWh) per million tokens."""
        if self.run is None:
            return {"gpu_hours": None, "cost": None, "gpu_energy_kwh": None}
        f = 1e6 / self.run.tokens
        q = self.run.quantities()
        return {"gpu_hours": q["gpu_hours"] * f, "cost": None if q["cost"] is None else q["cost"] * f,
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
            return sorted(ok, key=lambda e: e.run.wall_seconds)
        if key == "tokens_per_second_per_gpu":
            return sorted(ok, key=lambda e: -e.result.pick.estimate.tokens_per_second_per_gpu)
        if key == "cost_per_million_tokens":
            priced = all(e.run.cost is not None for e in ok)
            metric = "cost" if priced else "gpu_hours"
            return sorted(ok, key=lambda e: e.per_million_tokens()[metric])
        raise ValueError(key)

    @property
    def priced(self) -> bool:
        return all(e.run.cost is not None for e in self.entries if e.feasible)


ProblemFactory = Callable[[str, int], object]


def compare(choices: list[ClusterChoice], make_problem: ProblemFactory, opts, *, tokens: float | None = None,
            pue: float | None = None, band_for: Callable[[object, object], StepTimeBand | None] | None = None,
            ) -> Comparison:
    """Plan on each cluster. `make_problem(cluster, nodes)` builds the Problem (the CLI's own builder, so presets,
    files and calibration behave as in `plan`); an entry that has no feasible layout is kept with its reason."""
    from planner.errors import InfeasibleError
    from planner.search import plan

    budget = tokens if tokens is not None else DEFAULT_TOKENS
    entries = []
    for ch in choices:
        problem = make_problem(ch.cluster, ch.nodes)
        try:
            result = plan(problem, opts)
        except InfeasibleError as exc:
            entries.append(Entry(ch, problem, None, None, str(exc)))
            continue
        band = band_for(problem, result.pick) if band_for else None
        run = for_problem(problem, result.pick.step_seconds, tokens=budget, price_per_gpu_hour=ch.price_per_gpu_hour,
                          pue=pue, band=band)
        entries.append(Entry(ch, problem, result, run, None))
    return Comparison(entries, budget, tokens is not None)


RANKINGS = ("time_to_train", "cost_per_million_tokens", "tokens_per_second_per_gpu")


def as_json(cmp: Comparison) -> dict:
    from planner.contract import CandidateReport

    def entry(e: Entry) -> dict:
        doc = {"cluster": e.choice.cluster, "nodes": e.choice.nodes, "label": e.choice.label,
               "num_gpus": e.problem.cluster.num_gpus, "gpu": e.problem.hardware.gpu_name,
               "price_per_gpu_hour": e.choice.price_per_gpu_hour, "feasible": e.feasible, "infeasible_reason": e.error,
               "pick": None, "training_run": None, "per_million_tokens": e.per_million_tokens()}
        if e.feasible:
            pick = e.result.pick
            doc["pick"] = CandidateReport.from_estimate(
                pick.layout, pick.estimate, headroom_bytes=e.problem.knobs.memory_headroom_bytes, origin=pick.origin,
                reason=e.result.reasons.get(id(pick))).model_dump(mode="json")
            doc["training_run"] = e.run.as_json()
        return doc

    return {"tokens": cmp.tokens, "tokens_given": cmp.tokens_given, "priced": cmp.priced,
            "clusters": [entry(e) for e in cmp.entries],
            "rankings": {k: [e.choice.label for e in cmp.ranking(k)] for k in RANKINGS}}


def _days(e: Entry) -> str:
    d = e.run.wall_days
    b = e.run.bounds()["wall_clock_days"]
    return f"{d:,.1f}" if b is None else f"{d:,.1f} ({b[0]:,.1f}-{b[1]:,.1f})"


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
            lines.append(f"{e.choice.label:<20}{e.problem.cluster.num_gpus:>7,}  no layout fits")
            lines.append(f"  {e.error.splitlines()[0][:76]}")
            continue
        est, pm = e.result.pick.estimate, e.per_million_tokens()
        m = pm["cost"] if cmp.priced else pm["gpu_hours"]
        kwh = "-" if pm["gpu_energy_kwh"] is None else f"{pm['gpu_energy_kwh']:.3g}"
        lines.append(f"{e.choice.label[:19]:<20}{e.problem.cluster.num_gpus:>7,}{est.tokens_per_second_per_gpu:>10,.0f}"
                     f"{est.mfu:>7.1%}{e.run.wall_days:>9,.1f}{m:>11.3g}{kwh:>10}")
        lines.append(f"  {e.result.pick.layout.short()}")  # whole, to copy into --layout
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
