"""Memoisation of facts that depend on the model alone (standard library only).

The planner evaluates thousands of layouts of one model; the model's parameter counts and per-token FLOPs do not
change between them. `per_model` remembers a one-argument function's result for the last model it saw, by
identity: the inputs are frozen dataclasses, so the same object always has the same values, and no hashing of a
24-field dataclass is paid on each call. The cache holds the last model (and its result) alive, so its id
cannot be reused by another object.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def per_model(fn: Callable[[T], R]) -> Callable[[T], R]:
    """fn(model), computed once per model object (the last one seen)."""
    last: list[tuple[T, R]] = []

    @wraps(fn)
    def memoised(model: T) -> R:
        if last and last[0][0] is model:
            return last[0][1]
        result = fn(model)
        last[:] = [(model, result)]
        return result

    return memoised
