"""The one base of every input spec (cluster, GPU, model, training, layout): frozen, unknown fields rejected, no
inf/NaN, and no silent change of kind between true/false and numbers.

pydantic's lax mode reads `num_nodes: true` as 1 and `bias: 0` as false. A YAML or JSON file that gives a number
where a switch belongs, or a switch where a number belongs, is a mistake the planner should name, not a value it
should guess (`--layout` strings are parsed to their types before they get here: planner/inputs/layout_string.py).
Strings of digits ("4096") and whole floats (8.0) are still read as numbers: they mean the number they spell.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

NUMBER = "number"
SWITCH = "switch"


def _kinds(annotation: Any) -> set[str]:
    """The scalar kinds an annotation admits, looking through `X | None`, Literal excluded."""
    if annotation is bool:
        return {SWITCH}
    if annotation in (int, float):
        return {NUMBER}
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set().union(*(_kinds(a) for a in typing.get_args(annotation)))
    return set()


def _items(annotation: Any, value: Any) -> list[tuple[str, Any, Any]]:
    """(path suffix, element annotation, element) for a field's value: the value itself, or the elements of a
    list[X] / tuple[X, ...] / dict[K, X] field."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (list, tuple) and args and isinstance(value, list | tuple):
        return [(f"[{i}]", args[0], v) for i, v in enumerate(value)]
    if origin is dict and len(args) == 2 and isinstance(value, dict):
        return [(f".{k}", args[1], v) for k, v in value.items()]
    return [("", annotation, value)]


def kind_problems(model: type[BaseModel], data: dict) -> list[str]:
    """'field: value -> ...' for each given value whose kind (true/false or number) is not the field's."""
    problems = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key not in data:
            continue
        for suffix, annotation, value in _items(field.annotation, data[key]):
            kinds = _kinds(annotation)
            if NUMBER in kinds and SWITCH not in kinds and isinstance(value, bool):
                problems.append(f"{key}{suffix}: {str(value).lower()} -> must be a number, not true/false")
            elif kinds == {SWITCH} and isinstance(value, int | float) and not isinstance(value, bool):
                problems.append(f"{key}{suffix}: {value!r} -> must be true or false")
    return problems


class FrozenSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _kinds_as_given(cls, data: Any) -> Any:
        if isinstance(data, dict):
            problems = kind_problems(cls, data)
            if problems:
                raise ValueError("; ".join(problems))
        return data
