"""What the outside probes share (tests/outside_*_probe.py; not collected by pytest): a row built and predicted as
the published set's rows are (validation.build_case, evaluate), or a line saying why it was not."""

from __future__ import annotations

from collections.abc import Callable

from cost_models.inputs import Knobs
from planner.validation import Case, CaseResult, build_case, evaluate


def predicted(row: dict, knobs_of: Callable[[Case], Knobs], *, width: int,
              prepare: Callable[[Case], Case] = lambda case: case) -> tuple[Case, CaseResult] | None:
    """(case, result) of `row` with the knobs `knobs_of` gives its case, after `prepare` (what the row's stack sets
    that the published rows' format does not carry); None after printing why not (skipped, or not estimated)."""
    case = build_case(row)
    if isinstance(case, str):
        print(f"{row['id']:{width}} skipped: {case}")
        return None
    case = prepare(case)
    res = evaluate(case, knobs_of(case))
    if res.predicted_step_seconds is None or res.error is None:
        print(f"{row['id']:{width}} not estimated: {res.note}")
        return None
    return case, res
