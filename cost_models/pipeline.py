"""Pipeline schedules: closed-form bubbles and a discrete timeline simulator (standard library only).

The simulator places each stage's operations (F = forward, B = backward, or B = input-gradient and
W = weight-gradient for zero-bubble) in time, respecting data dependencies between stages. Its result
drives the bubble fraction, the peak in-flight micro-batches, and the pictures in `planner schedule`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

# ---------------------------------------------------------------------------------------------------
# The makespan the estimator uses (uneven stages by the bottleneck form; tests hold it to the simulator)
# ---------------------------------------------------------------------------------------------------


class Makespan(NamedTuple):
    seconds: float  # first forward to last backward, all micro-batches
    busy_seconds: float  # the bottleneck stage's own work, m x its time per micro-batch
    bottleneck_stage: int

    @property
    def bubble_seconds(self) -> float:
        return self.seconds - self.busy_seconds


def pipeline_makespan(*, schedule: str, stage_seconds: Sequence[float], num_micro_batches: int,
                      virtual_stages: int = 1, weight_grad_seconds: Sequence[float] | None = None) -> Makespan:
    """Makespan of one step from the per-stage time per micro-batch t_i (forward + backward), cost-models.md §5:

      naive  m x sum(t_i);  GPipe / 1F1B  sum(t_i) + (m-1) max(t_i) (Narayanan §2.2.1);
      interleaved  m max + (sum - max) / v (§2.2.2);  ZB-H1  m max + max(0, (p-1)(max - t_W) - min(m-1, p-1) t_W),
      i.e. for m >= p the bubble (p-1)(t_F + t_B - t_W) of Qi et al. Table 2 with t_B the input-gradient part and
      t_W the bottleneck's `weight_grad_seconds`, and for m < p fewer W passes to fill it;  PipeDream async  m max.
    With equal stages these are the simulator's makespans (tests/test_pipeline.py).
    """
    t, m = stage_seconds, num_micro_batches
    bottleneck = max(range(len(t)), key=t.__getitem__)
    t_max, total = t[bottleneck], sum(t)
    if schedule == "naive":
        pipe = m * total
    elif schedule in ("gpipe", "1f1b"):
        pipe = total + (m - 1) * t_max
    elif schedule == "interleaved_1f1b":
        pipe = m * t_max + (total - t_max) / virtual_stages
    elif schedule == "zero_bubble":
        t_w = weight_grad_seconds[bottleneck] if weight_grad_seconds else 0.0
        p = len(t)
        # the 1F1B bubble without the W passes, (p-1)(t - t_W), less the W passes that fill it: one per micro-batch
        # but the last (whose W ends the step), at most p - 1: Qi et al.'s (p-1)(t_F + t_B - t_W) once m >= p; with
        # fewer micro-batches than stages fewer W passes are there to fill it (the critical path: F and B through
        # every stage, then one W, at m = 1)
        pipe = m * t_max + max(0.0, (p - 1) * (t_max - t_w) - min(m - 1, p - 1) * t_w)
    elif schedule == "pipedream_async":  # no flush: the bubble is amortised away
        pipe = m * t_max
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    return Makespan(pipe, m * t_max, bottleneck)


# ---------------------------------------------------------------------------------------------------
# Timeline simulation
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Op:
    stage: int
    kind: str  # "F", "B" or "W"
    micro_batch: int
    chunk: int
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Timeline:
    schedule: str
    pp: int
    num_micro_batches: int
    virtual_stages: int
    ops: tuple[Op, ...]
    makespan: float
    busy_per_stage: tuple[float, ...]
    peak_in_flight_per_stage: tuple[float, ...]  # in whole-stage micro-batch units

    @property
    def bubble_fraction(self) -> float:
        """Idle share of all stage-time: 1 - sum(busy) / (p x makespan)."""
        return 1 - sum(self.busy_per_stage) / (self.pp * self.makespan)


def _orders(schedule: str, pp: int, m: int, v: int) -> list[list[tuple[str, int, int]]]:
    """Per stage, the fixed order of (kind, micro_batch, chunk) for the static schedules."""
    orders = []
    for r in range(pp):
        seq: list[tuple[str, int, int]] = []
        if schedule in ("gpipe", "naive"):
            seq = [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
        elif schedule in ("1f1b", "pipedream_async"):
            warm = min(pp - r - 1, m)
            fwd = iter(range(m))
            bwd = iter(range(m))
            seq = [("F", next(fwd), 0) for _ in range(warm)]
            for _ in range(m - warm):
                seq.append(("F", next(fwd), 0))
                seq.append(("B", next(bwd), 0))
            seq += [("B", i, 0) for i in bwd]
        elif schedule == "interleaved_1f1b":
            total = m * v

            def fwd_id(k: int) -> tuple[int, int]:
                group, within = divmod(k, pp * v)
                chunk = within // pp
                return group * pp + within % pp, chunk

            def bwd_id(k: int) -> tuple[int, int]:
                mb, chunk = fwd_id(k)
                return mb, v - 1 - chunk

            warm = min((pp - r - 1) * 2 + (v - 1) * pp, total)
            f = b = 0
            for _ in range(warm):
                seq.append(("F", *fwd_id(f)))
                f += 1
            for _ in range(total - warm):
                seq.append(("F", *fwd_id(f)))
                f += 1
                seq.append(("B", *bwd_id(b)))
                b += 1
            while b < total:
                seq.append(("B", *bwd_id(b)))
                b += 1
        else:
            raise ValueError(f"no static order for schedule {schedule!r}")
        orders.append(seq)
    return orders


def simulate(
    *, schedule: str, pp: int, num_micro_batches: int, virtual_stages: int = 1, t_forward: float | list[float] = 1.0,
    t_backward: float | list[float] = 2.0, t_weight: float | list[float] | None = None, t_p2p: float = 0.0,
) -> Timeline:
    """Simulate one step. Times are per stage per micro-batch for the whole stage (all its chunks).

    naive runs the whole batch as one micro-batch (m x the time); zero_bubble is ZB-H1: backward split into
    B (input gradient) and W (weight gradient, t_weight, default half of t_backward, taken from t_backward so
    that B + W = t_backward), W ops filling idle time, at most p - stage micro-batches in flight.
    """
    p, v = pp, virtual_stages if schedule == "interleaved_1f1b" else 1
    m = num_micro_batches

    def per_stage(x: float | list[float]) -> list[float]:
        return list(x) if isinstance(x, list | tuple) else [float(x)] * p

    tf, tb = per_stage(t_forward), per_stage(t_backward)
    if schedule == "naive":
        tf, tb, m = [x * m for x in tf], [x * m for x in tb], 1
    if schedule == "zero_bubble":
        tw = per_stage(t_weight) if t_weight is not None else [x / 2 for x in tb]
        return _simulate_zero_bubble(p, m, tf, tb, tw, t_p2p, num_micro_batches)
    orders = _orders("gpipe" if schedule == "naive" else schedule, p, m, v)
    done: dict[tuple[str, int, int, int], float] = {}  # (kind, stage, mb, chunk) -> end time
    free = [0.0] * p
    pos = [0] * p
    ops: list[Op] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                kind, mb, c = orders[r][pos[r]]
                dep = _dependency(kind, r, mb, c, p, v)
                ready = 0.0
                if dep is not None:
                    if dep not in done:
                        break
                    ready = done[dep] + (t_p2p if dep[1] != r else 0.0)
                if kind == "B" and ("F", r, mb, c) not in done:
                    break
                dur = (tf[r] if kind == "F" else tb[r]) / v
                start = max(free[r], ready)
                end = start + dur
                done[(kind, r, mb, c)] = end
                free[r] = end
                ops.append(Op(r, kind, mb, c, start, end))
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {schedule} deadlocked (p={p}, m={m}, v={v})")
    return _timeline(schedule, p, num_micro_batches, v, ops)


def _dependency(kind: str, r: int, mb: int, c: int, p: int, v: int) -> tuple[str, int, int, int] | None:
    if kind == "F":
        if r > 0:
            return ("F", r - 1, mb, c)
        return ("F", p - 1, mb, c - 1) if c > 0 else None
    if r < p - 1:
        return ("B", r + 1, mb, c)
    return ("B", 0, mb, c + 1) if c < v - 1 else ("F", r, mb, c)


class _ZeroBubbleState:
    """Per-stage progress of the ZB-H1 list scheduler."""

    def __init__(self, p: int, m: int, t_p2p: float):
        from collections import deque

        self.p, self.m, self.t_p2p = p, m, t_p2p
        self.f_end: list[list[float | None]] = [[None] * m for _ in range(p)]
        self.b_end: list[list[float | None]] = [[None] * m for _ in range(p)]
        self.next_f = [0] * p
        self.next_b = [0] * p
        self.pending_w: list[deque[int]] = [deque() for _ in range(p)]
        self.free = [0.0] * p

    def choice(self, r: int) -> tuple[float, str, int] | None:
        """B if it can start first (or tie), else F, else W: W only fills time no B or F can use."""
        p, fr = self.p, self.free[r]
        i, j = self.next_b[r], self.next_f[r]
        b = f = None
        if i < self.m and self.f_end[r][i] is not None:
            dep = self.f_end[r][i] if r == p - 1 else self.b_end[r + 1][i]
            if dep is not None:
                b = max(fr, dep + (self.t_p2p if r < p - 1 else 0.0))
        if j < self.m and j - i < p - r:
            dep = 0.0 if r == 0 else self.f_end[r - 1][j]
            if dep is not None:
                f = max(fr, dep + (self.t_p2p if r > 0 else 0.0))
        starts = [x for x in (b, f) if x is not None] + ([fr] if self.pending_w[r] else [])
        if not starts:
            return None
        first = min(starts) + 1e-12
        if b is not None and b <= first:
            return b, "B", i
        if f is not None and f <= first:
            return f, "F", j
        return fr, "W", self.pending_w[r][0]

    def run(self, r: int, kind: str, i: int, end: float) -> None:
        self.free[r] = end
        if kind == "F":
            self.f_end[r][i] = end
            self.next_f[r] += 1
        elif kind == "B":
            self.b_end[r][i] = end
            self.next_b[r] += 1
            self.pending_w[r].append(i)
        else:
            self.pending_w[r].popleft()


def _simulate_zero_bubble(p: int, m: int, tf: list[float], tb: list[float], tw: list[float], t_p2p: float,
                          m_reported: int) -> Timeline:
    """ZB-H1 by greedy list scheduling: each stage runs B first, then F (while fewer than p - stage
    micro-batches are in flight, as 1F1B), and W only when neither is ready (Qi et al. 2023 §3).

    Each step runs the op that can start earliest over all stages (ties: the lowest stage). A stage's choice
    depends only on its own state and its neighbours' F/B ends, so after an op only that stage and its two
    neighbours are re-evaluated."""
    duration = {"F": tf, "B": [tb[r] - tw[r] for r in range(p)], "W": tw}  # B: the input-gradient part
    state = _ZeroBubbleState(p, m, t_p2p)
    inf = float("inf")
    chosen = [state.choice(r) for r in range(p)]
    start_of = [c[0] if c is not None else inf for c in chosen]
    ops: list[Op] = []
    for _ in range(3 * p * m):
        first = min(start_of)
        if first == inf:
            raise RuntimeError("zero_bubble schedule deadlocked")
        r = start_of.index(first)
        start, kind, i = chosen[r]  # type: ignore[misc]
        end = start + duration[kind][r]
        ops.append(Op(r, kind, i, 0, start, end))
        state.run(r, kind, i, end)
        for k in range(max(0, r - 1), min(p, r + 2)):
            c = chosen[k] = state.choice(k)
            start_of[k] = c[0] if c is not None else inf
    return _timeline("zero_bubble", p, m_reported, 1, ops)


def _timeline(schedule: str, p: int, m: int, v: int, ops: list[Op]) -> Timeline:
    ops.sort(key=lambda o: (o.stage, o.start))
    makespan = max(o.end for o in ops)
    busy = [0.0] * p
    peak = [0.0] * p
    by_stage: list[list[Op]] = [[] for _ in range(p)]
    for o in ops:
        by_stage[o.stage].append(o)
    for r in range(p):
        live = 0
        best = 0
        for o in by_stage[r]:
            busy[r] += o.end - o.start
            if o.kind == "F":
                live += 1
                best = max(best, live)
            elif o.kind == "B":
                live -= 1
        peak[r] = best / v
    if schedule == "naive":
        peak = [float(m)] * p
    return Timeline(schedule, p, m, v, tuple(ops), makespan, tuple(busy), tuple(peak))
