"""The one reader of plan JSON files (`planner plan --json`/`-o`) for export, bench, estimate/plan --layout and
--compare: every part is validated with its schema, and the layout with `planner.rules.validate_layout`, the one rule function,
so a hand-edited plan (tp=3 for 32 heads, a batch that does not add up) is refused when loaded, not exported.
`check` reads plans too, but reports the same rules as violations instead of refusing (that is its job)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cluster_specs import ClusterSpec, SpecError, read_structured_file
from planner.inputs.specs import LayoutSpec, ModelSpec, TrainingSpec
from planner.rules import validate_layout


@dataclass(frozen=True)
class PlanParts:
    layout: LayoutSpec
    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec | None
    doc: dict


def _part(model_cls, data, where: str, source: str):
    from pydantic import ValidationError

    from cluster_specs.errors import from_pydantic

    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected an object, got {type(data).__name__}", source=source)
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        err = from_pydantic(exc, source=source)
        raise SpecError([f"{where}.{p}" for p in err.problems], source=source) from None


def schema_problem(doc: dict, source: str) -> None:
    """A plan written under another major schema version (a breaking change: planner/__init__.py SCHEMA_VERSION) is
    refused; a newer minor one only added fields this reader ignores, and a plan without the field is read as is."""
    from planner import SCHEMA_VERSION

    given = doc.get("schema_version")
    if given is None:
        return
    if not isinstance(given, str) or given.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise SpecError(f"schema_version: {given!r} -> this planner reads {SCHEMA_VERSION.split('.')[0]}.x plans "
                        f"(it writes {SCHEMA_VERSION}): plan again with this version", source=source)


def plan_parts(doc, source: str = "plan JSON") -> PlanParts:
    """Validate a plan document: layout, inputs.model, inputs.training (and inputs.cluster when present)."""
    if not isinstance(doc, dict) or "layout" not in doc or not isinstance(doc.get("inputs"), dict):
        raise SpecError("expected a plan JSON with 'layout' and 'inputs' (the output of `planner plan --json`)",
                        source=source)
    schema_problem(doc, source)
    inputs = doc["inputs"]
    for key in ("model", "training"):
        if key not in inputs:
            raise SpecError(f"inputs.{key}: missing (expected the output of `planner plan --json`)", source=source)
    layout = _part(LayoutSpec, doc["layout"], "layout", source)
    model = _part(ModelSpec, inputs["model"], "inputs.model", source)
    training = _part(TrainingSpec, inputs["training"], "inputs.training", source)
    cluster = _part(ClusterSpec, inputs["cluster"], "inputs.cluster", source) if inputs.get("cluster") else None
    # TP across nodes is a search preference (--allow-tp-across-nodes), not a rule a plan can break
    try:
        validate_layout(layout, model, training, cluster, allow_tp_across_nodes=True)
    except SpecError as exc:
        raise SpecError([f"layout: {p}" for p in exc.problems], source=source) from None
    return PlanParts(layout, model, training, cluster, doc)


def load_plan(path: str | Path) -> PlanParts:
    return plan_parts(read_structured_file(path), str(path))
