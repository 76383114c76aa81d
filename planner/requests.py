"""What `estimate` and `plan` compute, without the terminal: a request in, a contract document out.

The CLI (planner/cli/) only parses options into these requests, calls one function, and prints or renders the
document. Everything a command decides lives here or below: defaults (the headroom), the calibration merge,
the framework restriction, the min-gpus search, compared layouts, the DeepSpeed TP degree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster_specs import SpecError
from planner.contract import EstimateDocument, PlanDocument
from planner.estimate import DEFAULT_HEADROOM_GIB, Problem, build_problem

OBJECTIVES = ("throughput", "memory", "min-gpus")


@dataclass(frozen=True)
class ProblemRequest:
    """The options every planning command shares."""

    cluster: str
    model: str
    global_batch_size: int
    seq_len: int
    nodes: int | None = None
    precision: str | None = None  # None: the GPU's default (planner.estimate.build_problem)
    headroom_gib: float = DEFAULT_HEADROOM_GIB
    calibration: Path | None = None
    fp8_recipe: str | None = None  # None: the framework's default recipe (with precision fp8)
    optimizer_states: str | None = None  # --optimizer-states (planner.inputs.layout_string.parse_optimizer_states)
    compile_model: bool = False  # --compile (TrainingSpec.compile)

    def problem(self, *, global_batch_size: int | None = None, seq_len: int | None = None,
                framework: str | None = None) -> Problem:
        """With a framework: its execution profile (planner/frameworks/profiles.py), as `validate` uses it."""
        from planner.inputs.layout_string import parse_optimizer_states

        return build_problem(self.cluster, self.nodes, self.model, global_batch_size or self.global_batch_size,
                             seq_len or self.seq_len, self.precision, self.headroom_gib, self.calibration, framework,
                             self.fp8_recipe, optimizer_states=parse_optimizer_states(self.optimizer_states),
                             compile_model=self.compile_model)


def estimate_document(req: ProblemRequest, layout: str, *, framework: str | None = None,
                      allow_tp_across_nodes: bool = False) -> EstimateDocument:
    from planner.estimate import estimate_layout, layout_from_arg, plan_file_framework
    from planner.frameworks.capabilities import refuse_unrunnable

    # a plan file is estimated under the framework it was planned for, as its predicted numbers were, unless
    # --framework names another
    framework = framework or plan_file_framework(layout)
    problem = req.problem(framework=framework)
    lay = layout_from_arg(layout, problem)
    fw = refuse_unrunnable(framework, lay, problem.model, problem.training)
    est = estimate_layout(problem, lay, allow_tp_across_nodes=allow_tp_across_nodes)
    from planner.frameworks import Framework

    return EstimateDocument.from_estimate(problem, lay, est, framework=Framework(fw))


@dataclass(frozen=True)
class PlanRequest:
    top: int = 5
    objective: str = "throughput"
    target_tokens_per_second: float | None = None
    compare: list[str] = field(default_factory=list)
    allow_tp_across_nodes: bool = False
    allow_async: bool = False
    use_solver: bool = True
    solver_time_limit_seconds: float = 10.0
    framework: str | None = None
    fix: list[str] | None = None
    schedules: str | None = None
    tokens: float | None = None
    gpu_hour_price: float | None = None
    pue: float | None = None
    sensitivity: bool = False
    figures: Path | None = None
    command: str = ""  # the plan command as typed (for the short-list hint)
    memory_margin: str = "band-high"  # planner.search.MEMORY_MARGINS

    def check(self) -> None:
        from cluster_specs.limits import finite_option

        finite_option("--solver-time-limit", self.solver_time_limit_seconds, low_inclusive=False)
        problems = []
        if self.objective not in OBJECTIVES:
            problems.append(f"--objective: {self.objective!r} -> allowed: {', '.join(OBJECTIVES)}")
        from planner.search import MEMORY_MARGINS

        if self.memory_margin not in MEMORY_MARGINS:
            problems.append(f"--memory-margin: {self.memory_margin!r} -> allowed: {', '.join(MEMORY_MARGINS)}")
        if self.top < 0:
            problems.append(f"--top: {self.top} -> must be >= 0")
        t = self.target_tokens_per_second
        if self.objective == "min-gpus" and (t is None or not (math.isfinite(t) and t > 0)):
            problems.append(f"--target-tokens-per-second: {t} -> required with --objective min-gpus, a finite "
                            "number > 0")
        if problems:
            raise SpecError(problems)


def plan_command(argv: list[str]) -> str:
    """The plan command as typed (argv without the program), less the options that only shape the output or name
    files; --sensitivity stays, so the plan it writes carries the short list's tolerance for `bench --top K`."""
    import shlex

    drop = {"--json", "--no-schedule"}
    args, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("-o", "--output", "--figures"):
            skip = True
            continue
        if a not in drop:
            args.append(a)
    return shlex.join(["planner", *args])


def plan_document(req: ProblemRequest, plan: PlanRequest, *, progress: bool = False) -> tuple[PlanDocument, list[str]]:
    """The plan, and the extra terminal lines the decisions package asked for (--tokens)."""
    from planner.decisions.plan_extras import PlanExtras, extend
    from planner.estimate import layout_from_arg
    from planner.frameworks.restriction import build_restriction
    from planner.search import (
        PlanOptions,
        add_compared,
        margin_cost,
        plan_min_gpus,
        plan_within_memory_margin,
        with_memory_margin,
    )

    plan.check()
    extras = PlanExtras(tokens=plan.tokens, price_per_gpu_hour=plan.gpu_hour_price, pue=plan.pue,
                        objective=plan.objective, sensitivity=plan.sensitivity, command=plan.command,
                        figures=plan.figures)
    extras.check()
    problem = with_memory_margin(req.problem(framework=plan.framework), plan.memory_margin)
    restriction = build_restriction(plan.framework, problem.model.vocab_size, plan.fix, plan.schedules,
                                    problem.training)
    opts = PlanOptions(top_k=plan.top, objective="throughput" if plan.objective == "min-gpus" else plan.objective,
                       allow_tp_across_nodes=plan.allow_tp_across_nodes, allow_async=plan.allow_async,
                       use_solver=plan.use_solver, solver_time_limit_seconds=plan.solver_time_limit_seconds,
                       progress=progress, restriction=restriction)
    notes = []
    if plan.objective == "min-gpus":
        assert plan.target_tokens_per_second is not None  # plan.check() requires it for min-gpus
        problem, note = plan_min_gpus(problem, opts, plan.target_tokens_per_second)
        notes.append(note)
    compared = [layout_from_arg(text, problem, "--compare") for text in plan.compare]
    problem, result = plan_within_memory_margin(problem, opts)
    relaxed = result.memory_margin_relaxed
    cost = margin_cost(problem, result, opts) if plan.objective == "throughput" else None
    result = add_compared(problem, result, compared)
    doc = PlanDocument.from_result(problem, result, objective=plan.objective, framework=restriction.caps.framework,
                                   notes=notes, memory_margin_relaxed=relaxed, margin_cost=cost)
    extend(doc, problem, result, extras, opts)
    return doc, extras.lines


def calibration_file(output: Path, *, nproc: int, **measure: Any) -> Any:
    """`planner calibrate`: measure this machine (planner.bench.calibrate) and write the cluster file; the spec."""
    if nproc < 1:
        raise SpecError(f"--nproc: {nproc} -> must be >= 1")
    from planner.bench import need_torch

    need_torch()
    from planner.bench.calibrate import calibrate_machine
    from planner.calibration import write_calibration_file

    spec = calibrate_machine(nproc=nproc, **measure)
    write_calibration_file(output, spec)
    return spec


def validation_document(result: Any, vt: Any) -> Any:
    """`validate --json`: the validation's summary (planner.validation.summary) and vTrain's figures, as the
    contract's ValidationSummary."""
    from planner.contract import ValidationSummary, _versions
    from planner.validation import shipped_band_table, summary
    from planner.validation_vtrain import shipped_band_coverage

    cov = shipped_band_coverage(vt.results, shipped_band_table(result))
    vtrain = {"rows": len(vt.results), "mean_abs_error": vt.mean_abs_error, "bias": vt.bias, "regret": vt.regret,
              "false_out_of_memory": vt.false_oom, "pairs_ordered_as_measured": vt.pair_accuracy,
              "inside_band": {"rows": cov.inside, "of": cov.rows, "median_width": cov.median_width}}
    return ValidationSummary(**_versions(), **summary(result), vtrain=vtrain)


def validation_summary(runs: Path, *, with_planner: bool = True, report: bool = False, write_tables: bool = False
                       ) -> tuple[dict[str, Any], str, str]:
    """`planner validate`: the published runs held out by source, and vTrain's runs. Returns the summary document,
    the markdown report (with `report`; else "") and a one-line summary. With write_tables (only when asked: a runs
    file of one's own must not change what every later estimate's band reads), the tables the planner reads are
    rewritten from this run: the error bands (planner/data/error_bands.json) and the ranking band
    (ranking_band.json)."""
    from planner.decisions.ranking import table_from_results, write_table
    from planner.validation import load_rows, render_markdown, run_validation, write_band_table
    from planner.validation_vtrain import run_vtrain

    result = run_validation(load_rows(runs))
    vt = run_vtrain(result.knobs)
    markdown = ""
    if report:
        from planner.search import published_layout_ranks

        section = published_layout_ranks(result) if with_planner else ""
        markdown = render_markdown(result, runs_path=str(runs), planner_section=section, vtrain=vt)
    if write_tables:
        write_band_table(result)
        write_table(table_from_results(vt.results))
    s = validation_document(result, vt).model_dump(mode="json")
    line = (f"{s['rows_evaluated']} rows: LOSO median |error| {s['loso_median_abs_error']:.1%}, 90th pct "
            f"{s['loso_p90_abs_error']:.1%}, false OOM {s['false_out_of_memory']}; vTrain mean |error| "
            f"{vt.mean_abs_error:.1%}, bias {vt.bias:+.1%}")
    return s, markdown, line
