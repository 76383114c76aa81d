"""What `planner compare` and `planner scaling` hand the CLI: the JSON document, the terminal lines, and a way
to draw the figure. The options are checked (exit 3 / exit 6) before any planning starts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.frameworks.restriction import Restriction
    from planner.inputs.specs import TrainingSpec
    from planner.search import Candidate, PlanResult


@dataclass
class DecisionReport:
    document: dict[str, Any]
    lines: list[str]
    draw: Callable[[Path], None] = field(repr=False)


def check_figure(figure: Path | None) -> None:
    """Before any work: the suffix is .png/.svg (exit 3) and matplotlib is there (exit 6)."""
    if figure is not None:
        from planner.explain.figures import check_path, require_matplotlib

        check_path(figure)
        require_matplotlib()


def header(kind: str) -> dict[str, Any]:
    from planner import SCHEMA_VERSION, __version__

    return {"schema_version": SCHEMA_VERSION, "tool_version": __version__, "kind": kind}


def framework_restriction(framework: str | None, model: str, training: TrainingSpec | None = None
                          ) -> Restriction | None:
    """--framework on compare/scaling: plan only what it runs (with `training`, the ZeRO stages its optimizer states
    run at), as `plan --framework` does; None without one."""
    if framework is None:
        return None
    from planner.frameworks.restriction import build_restriction
    from planner.inputs.models import load_model

    return build_restriction(framework, load_model(model).vocab_size, training=training)


def parse_counts(text: str | None, option: str, limit: int = 1_000_000) -> list[int] | None:
    """`64,128,256` -> [64, 128, 256]; None when not given; one SpecError naming the option otherwise."""
    from cluster_specs import SpecError

    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecError(f"{option}: {text!r} -> comma-separated integers") from None
    if not values or any(not 1 <= v <= limit for v in values) or len(values) > 32:
        raise SpecError(f"{option}: {text!r} -> 1 to 32 integers, each between 1 and {limit:,}")
    return values


MARGIN_RELAXED = ("fits only at the point estimate, not at the memory band's high end (nothing else fitted): may "
                  "run out of memory")
"""What a compare entry or scaling point says when its plan relaxed the memory margin (search.plan_within_memory_margin,
as `plan` does and says)."""


class Planned:
    """A plan that may have found no layout (a compare entry, a scaling point): `result` is None when none fits.
    Subclasses say what they are in `label`."""

    result: PlanResult | None

    @property
    def label(self) -> str:
        raise NotImplementedError

    @property
    def feasible(self) -> bool:
        return self.result is not None

    @property
    def margin_relaxed(self) -> bool:
        """Nothing fitted under the memory margin, so the pick was chosen at the point estimate (MARGIN_RELAXED)."""
        return self.result is not None and self.result.memory_margin_relaxed

    @property
    def pick(self) -> Candidate:
        """The plan's pick (only when feasible)."""
        if self.result is None:
            raise ValueError(f"{self.label}: no layout fits")
        return self.result.pick
