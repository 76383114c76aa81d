"""What `planner plan` adds from the decisions package: the training run (--tokens), the waste check,
the sensitivity report (--sensitivity) and the figures (--figures). The CLI calls `extend` once and prints
`lines`; both are no-ops when no option asks for anything."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.contract import PlanDocument
    from planner.decisions.train import StepTimeBand
    from planner.problem import Problem
    from planner.search import Candidate, PlanOptions, PlanResult


@dataclass
class PlanExtras:
    tokens: float | None = None
    price_per_gpu_hour: float | None = None
    pue: float | None = None
    objective: str = "throughput"
    sensitivity: bool = False
    command: str = ""  # the plan command as typed, for the short-list hint
    figures: Path | None = None  # a folder for memory.png/.svg and time.png/.svg
    lines: list[str] = field(default_factory=list)

    def check(self) -> None:
        from planner.decisions.train import check_run_options

        check_run_options(self.tokens, self.price_per_gpu_hour, self.pue)
        if self.figures is not None:
            from planner.explain.figures import require_matplotlib

            require_matplotlib()


def step_time_band(problem: Problem, pick: Candidate, framework: str | None = None) -> StepTimeBand | None:
    """The error band of a pick's step time from planner.bands (the leave-one-source-out residuals of its
    regime), as factors on the predicted step time; None when no band is available (the output then says so)."""
    from planner.decisions.train import StepTimeBand

    try:
        from planner.bands import band_level, prediction_band
    except ModuleNotFoundError:  # the error-band table is not part of this install
        return None
    est = pick.estimate
    b = prediction_band(framework=framework, gpu_name=problem.hardware.gpu_name, num_gpus=problem.cluster.num_gpus,
                        step_seconds=est.step_seconds, peak_memory_bytes=est.peak_memory_bytes)
    if b.rows == 0:
        return None
    return StepTimeBand(b.step_seconds_low / est.step_seconds, b.step_seconds_high / est.step_seconds,
                        f"central {band_level():.0%} of leave-one-source-out errors (about 80% of held-out runs "
                        f"inside), regime {b.regime}, {b.rows} published runs")


def extend(doc: PlanDocument, problem: Problem, result: PlanResult, extras: PlanExtras, opts: PlanOptions) -> None:
    """Add the requested sections to the plan document (a planner.contract.PlanDocument) and the matching
    terminal lines to `extras.lines`."""
    from planner import contract

    framework = str(getattr(doc.framework, "value", doc.framework))
    if extras.objective == "throughput":
        from planner.decisions import waste

        doc.utilisation = contract.Utilisation.model_validate(waste.utilisation(problem, result, opts))
        extras.lines += waste.render_lines(doc.utilisation.model_dump(), problem)
    if extras.tokens is not None:
        from planner.decisions.train import for_problem, render_lines

        run = for_problem(problem, result.pick.step_seconds, tokens=extras.tokens,
                          price_per_gpu_hour=extras.price_per_gpu_hour, pue=extras.pue,
                          band=step_time_band(problem, result.pick, framework))
        doc.training_run = contract.TrainingRun.model_validate(run.as_json())
        extras.lines += ["", *render_lines(run)]
    if extras.sensitivity:
        from planner.decisions import sensitivity as sens

        band = step_time_band(problem, result.pick, framework)
        report = sens.as_json(sens.sensitivity(problem, result, opts, band), result.pick)
        doc.sensitivity = contract.SensitivityReport.model_validate(report)
        extras.lines += sens.render_lines(report, extras.command or "planner plan ...")
    if extras.figures is not None:
        from planner.explain import figures as fig

        est = result.pick.estimate
        written = fig.plan_figures(problem, result, extras.figures)
        doc.figures = [str(p) for p in written]
        extras.lines += ["", *fig.memory_lines(est, problem.knobs.memory_headroom_bytes), *fig.time_lines(est),
                         f"figures: {', '.join(str(p) for p in written)}"]
