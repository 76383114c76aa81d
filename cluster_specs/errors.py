"""The error every loader raises: a list of problems, one line each (field, value, allowed).

`SpecError` is `planner.errors.InputError` (exit 3), the one error hierarchy's invalid-input class.
"""

from __future__ import annotations

import difflib
import re

from planner.errors import InputError

SpecError = InputError


def from_pydantic(exc, *, source: str | None = None, what: str = "") -> SpecError:
    """Turn a pydantic ValidationError into a SpecError with one line per failing field."""
    lines = []
    for err in exc.errors():
        loc = ".".join(_loc_parts(err["loc"])) or what or "(top level)"
        value = err.get("input")
        shown = _short(value)
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "missing":
            lines.append(f"{loc}: missing (required)")
            continue
        if err["type"] == "value_error" and _NAMED.match(msg.removeprefix("Value error, ")):
            # a validator across fields already says "field: value -> allowed": that line, under its object's path,
            # without pydantic's dump of the whole input
            prefix = ".".join(_loc_parts(err["loc"]))
            lines.append(f"{prefix + '.' if prefix else ''}{msg.removeprefix('Value error, ')}")
            continue
        if err["type"] in ("less_than_equal", "less_than") and err["loc"]:
            from cluster_specs.limits import reason_for

            why = reason_for(str(err["loc"][-1]))
            msg += f" ({why})" if why else ""
        lines.append(f"{loc}: {shown} -> {msg}")
    return SpecError(lines, source=source)


def _loc_parts(loc) -> list[str]:
    """The field path as the file spells it: pydantic's union-member and validator labels
    ('function-after[_positive_peaks(), GPUSpec]', 'str', 'GPUSpec') are not keys of the file."""
    return [str(p) for p in loc if not (isinstance(p, str) and (_VALIDATOR_LABEL.match(p) or p in _TYPE_LABELS))]


_VALIDATOR_LABEL = re.compile(r"^function-(after|before|wrap|plain)\[")
_TYPE_LABELS = frozenset({"str", "int", "float", "bool", "list", "dict", "GPUSpec", "ModelSpec", "MoESpec", "MLASpec",
                          "ClusterSpec", "LayoutSpec", "TrainingSpec"})
_NAMED = re.compile(r"^[A-Za-z_][\w.]*(?: / [A-Za-z_][\w.]*)?: .* -> ")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def unknown_name(kind: str, name: str, known: list[str]) -> SpecError:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return SpecError(f"unknown {kind} {name!r}{hint} (known: {', '.join(sorted(known))})")
