"""Best contiguous split of layers over pipeline stages (min-max stage time under per-stage memory caps).

Two exact methods:
- `best_split_dp`: a dynamic program over arbitrary per-layer costs, O(p L^2). The reference.
- `best_split_uniform`: for identical layers (the transformer case) with per-stage extras (embedding on the
  first stage, output layer on the last) and per-stage caps on the layer count (memory): a threshold search
  over the finitely many candidate makespans, O(p log(p L)). Tests check it against the DP.
With the 1F1B makespan sum(t_i) + (m-1) max(t_i) and sum(t_i) fixed by the model, minimising the slowest stage
minimises the step time.
"""

from __future__ import annotations

import math


def best_split_dp(layer_seconds: list[float], stage_extra_seconds: list[float],
                  max_layers_per_stage: list[int] | None = None) -> tuple[float, list[int]] | None:
    """Exact min over contiguous splits of max_i(sum of its layers + extra_i). None when the caps forbid all."""
    L, p = len(layer_seconds), len(stage_extra_seconds)
    caps = max_layers_per_stage or [L] * p
    prefix = [0.0]
    for c in layer_seconds:
        prefix.append(prefix[-1] + c)
    INF = math.inf
    # best[k][i]: min max-stage time placing the first i layers on the first k stages (each stage >= 1 layer)
    best = [[INF] * (L + 1) for _ in range(p + 1)]
    choice = [[0] * (L + 1) for _ in range(p + 1)]
    best[0][0] = 0.0
    for k in range(1, p + 1):
        extra, cap = stage_extra_seconds[k - 1], caps[k - 1]
        for i in range(k, L - (p - k) + 1):
            for j in range(max(k - 1, i - cap), i):
                if best[k - 1][j] == INF:
                    continue
                val = max(best[k - 1][j], prefix[i] - prefix[j] + extra)
                if val < best[k][i]:
                    best[k][i], choice[k][i] = val, j
    if best[p][L] == INF:
        return None
    counts, i = [], L
    for k in range(p, 0, -1):
        j = choice[k][i]
        counts.append(i - j)
        i = j
    return best[p][L], counts[::-1]


def best_split_uniform(num_layers: int, layer_seconds: float, stage_extra_seconds: list[float],
                       max_layers_per_stage: list[int] | None = None) -> tuple[float, list[int]] | None:
    """The same optimum for identical layers: the least T such that sum_i min(cap_i, floor((T - e_i)/c)) >= L."""
    p, c, L = len(stage_extra_seconds), layer_seconds, num_layers
    caps = max_layers_per_stage or [L] * p
    if any(cap < 1 for cap in caps) or sum(min(cap, L) for cap in caps) < L or L < p:
        return None

    def count(T: float) -> list[int] | None:
        ns = []
        for e, cap in zip(stage_extra_seconds, caps, strict=True):
            n = min(cap, math.floor((T - e) / c + 1e-9)) if c > 0 else cap
            if n < 1:
                return None
            ns.append(n)
        return ns if sum(ns) >= L else None

    # candidate makespans: n c + e_i for n in 1..L (the optimum is one of them)
    candidates = sorted({n * c + e for e in stage_extra_seconds for n in range(1, L + 1)})
    lo, hi = 0, len(candidates) - 1
    if count(candidates[hi]) is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if count(candidates[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    T = candidates[lo]
    ns = count(T)
    if ns is None:  # cannot happen: the search ends on a feasible makespan
        return None
    # remove the surplus from the stages with the most slack; every stage stays <= T and >= 1 layer
    surplus = sum(ns) - L
    while surplus > 0:
        i = max((k for k in range(p) if ns[k] > 1), key=lambda k: (ns[k] * c + stage_extra_seconds[k], ns[k]))
        ns[i] -= 1
        surplus -= 1
    makespan = max(n * c + e for n, e in zip(ns, stage_extra_seconds, strict=True))
    return makespan, ns
