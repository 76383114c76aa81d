"""The stage model: how the layers are split over pipeline stages, and what each stage costs.

`stage_split` is THE split: the estimator, the planner's split refinement, the layout rules and the benchmark's
stage builder all call it, so they cannot disagree on which stage holds which layers.
"""

from __future__ import annotations


def stage_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """As even as possible; the remainder goes to the inner stages first (the outer ones carry the embedding and
    the output layer), e.g. 10 layers over 4 stages -> (2, 3, 3, 2)."""
    base, extra = divmod(num_layers, pp)
    counts = [base] * pp
    order = list(range(1, pp - 1)) + [0, pp - 1] if pp > 2 else list(range(pp))
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)
