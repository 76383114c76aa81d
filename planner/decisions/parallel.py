"""Independent plans (the clusters of `planner compare`, the node counts and batches of `planner scaling`) in
worker processes, one per CPU core this process may use.

Each worker runs the same planner.search.plan on the same Problem, so the picks are those of planning one by one
(tests/test_decisions.py checks a compare entry and a scaling point against `planner plan`). What comes back is
trimmed to what the decisions read: the pick, its runners-up and their reasons (`ranked` holds only those), so
that the results cross the process boundary quickly. PLANNER_WORKERS=1 plans in this process, one by one, as
does a process that already runs other threads (see `workers_for`).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.problem import Problem
    from planner.search import PlanOptions, PlanResult


def workers_for(jobs: int) -> int:
    """Worker processes for `jobs` independent plans: one per usable CPU core (PLANNER_WORKERS overrides), and
    none (plan here) unless this process is single-threaded: the workers are forked, and a fork copies only the
    calling thread, so a solver's thread pool (HiGHS keeps one after its first solve) would be left half-alive."""
    env = os.environ.get("PLANNER_WORKERS", "").strip()
    cores = int(env) if env.isdigit() and int(env) > 0 else len(os.sched_getaffinity(0))
    return max(1, min(jobs, cores)) if _single_threaded() else 1


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:  # no /proc (not Linux): do not fork
        return False


CANNOT_RUN = "cannot run: "
"""Prefix of plan_one's reason when the cluster's GPU cannot run the setup (a SetupError), not 'nothing fits'."""


def plan_one(problem: Problem, opts: PlanOptions) -> PlanResult | str:
    from planner.errors import InfeasibleError, SetupError
    from planner.search import plan_within_memory_margin

    try:  # the fit rule of `plan`: the problem's memory margin, relaxed to the estimate when nothing else fits
        return plan_within_memory_margin(problem, replace(opts, progress=False))[1]  # (problem, plan)
    except SetupError as exc:  # the cluster's GPU cannot run the setup (FP8), whatever the layout
        return f"{CANNOT_RUN}{exc}"
    except InfeasibleError as exc:
        return str(exc)


def _packed(problem: Problem, opts: PlanOptions) -> tuple[PlanResult | str, list[tuple[int, str]]]:
    """In the worker: the trimmed result, with its reasons keyed by position instead of by object id."""
    res = plan_one(problem, opts)
    if isinstance(res, str):
        return res, []
    keep = [res.pick, *res.alternatives, *res.compared]
    reasons = [(i, res.reasons[id(c)]) for i, c in enumerate(keep) if id(c) in res.reasons]
    return replace(res, ranked=[res.pick, *res.alternatives], reasons={}), reasons


def _unpacked(res: PlanResult | str, reasons: list[tuple[int, str]]) -> PlanResult | str:
    if isinstance(res, str):
        return res
    keep = [res.pick, *res.alternatives, *res.compared]
    res.reasons = {id(keep[i]): text for i, text in reasons}
    return res


def plan_all(problems: list[Problem], opts: PlanOptions) -> list[PlanResult | str]:
    """Each problem's plan (or why nothing fits), in order."""
    n = workers_for(len(problems))
    if n == 1:
        return [plan_one(p, opts) for p in problems]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork")) as pool:
        packed = list(pool.map(_packed, problems, [opts] * len(problems)))
    return [_unpacked(res, reasons) for res, reasons in packed]
