"""The ILP (the only module that imports pulp): per-stage layer counts and recomputation, jointly.

Given a layout's per-layer coefficients, choose for every pipeline stage i how many layers it holds (n_i) and
how many of them are fully recomputed (r_i), so that every stage fits its memory and the slowest stage is as
fast as possible:

    minimise  T
    s.t.      T >= n_i * c_layer + r_i * c_recompute + e_i                  (stage time per micro-batch)
              n_i * w + f_i * (r_i * a_full + (n_i - r_i) * a_policy) + E_i <= M_i   (memory; f_i in flight)
              sum_i n_i = L,  1 <= n_i,  0 <= r_i <= n_i,  integers

Memory is linear because the micro-batches in flight f_i are fixed by the schedule. No closed form exists:
moving a layer off a stage frees memory that may let it drop recomputation, which changes its time. HiGHS
(through highspy) is the default solver, CBC the fallback. The solver's banner is silenced at the file-descriptor
level (HiGHS writes to fd 1 even with messages off), and optimality is read from the *solution* status: pulp's
return status can say "Optimal" for a time-limited, unproven incumbent (../shared/reference/cpu-notes.md).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from cost_models.stage import StageLinear


@dataclass(frozen=True)
class StageCoefficients:
    """One stage's row of the ILP: cost_models.stage.StageLinear and the memory the stage may use."""

    layer_seconds: float
    recompute_seconds: float
    extra_seconds: float
    layer_state_bytes: float  # weights + grads + optimizer per layer
    layer_act_policy_bytes: float  # activations per layer, all micro-batches in flight, layout's policy
    layer_act_full_bytes: float  # the same under full recompute
    fixed_bytes: float  # embedding/output states and activations, transient, overhead
    capacity_bytes: float

    @classmethod
    def of(cls, st: StageLinear, capacity_bytes: float) -> StageCoefficients:
        return cls(st.layer_seconds, st.recompute_seconds, st.extra_seconds, st.layer_state_bytes,
                   st.layer_act_policy_bytes, st.layer_act_full_bytes, st.fixed_bytes, capacity_bytes)


@dataclass(frozen=True)
class SolverResult:
    status: str  # "optimal" | "feasible" (time limit, unproven) | "infeasible" | "error: ..."
    optimal: bool
    layers_per_stage: list[int] | None
    recompute_layers_per_stage: list[int] | None
    makespan_seconds: float | None
    solver: str
    seconds: float


@contextlib.contextmanager
def _quiet_stdout():
    """Send fd 1 to /dev/null while the solver runs, so a --json document on stdout stays clean."""
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _solver(time_limit_seconds: float):
    import pulp

    if "HiGHS" in pulp.listSolvers(onlyAvailable=True):
        return pulp.HiGHS(msg=False, timeLimit=time_limit_seconds), "HiGHS"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_seconds), "CBC"


def solve_stage_recompute(stages: list[StageCoefficients], num_layers: int, *, time_limit_seconds: float = 10.0,
                          solver: str | None = None) -> SolverResult:
    import pulp

    start = time.perf_counter()
    p = len(stages)
    prob = pulp.LpProblem("stage_recompute", pulp.LpMinimize)
    n = [prob.add_variable(f"n_{i}", lowBound=1, upBound=num_layers, cat="Integer") for i in range(p)]
    r = [prob.add_variable(f"r_{i}", lowBound=0, upBound=num_layers, cat="Integer") for i in range(p)]
    T = prob.add_variable("T", lowBound=0)
    scale = max(st.layer_seconds for st in stages) or 1.0
    # minimise the slowest stage; among equal makespans prefer less recomputation (1e-6 of a layer each)
    prob += T / scale + 1e-6 * pulp.lpSum(r)
    for i, st in enumerate(stages):
        prob += T >= n[i] * st.layer_seconds + r[i] * st.recompute_seconds + st.extra_seconds
        prob += r[i] <= n[i]
        unit = max(st.capacity_bytes, 1.0)  # each memory row in units of its capacity: well scaled for any size
        prob += (n[i] * (st.layer_state_bytes + st.layer_act_policy_bytes) / unit
                 + r[i] * (st.layer_act_full_bytes - st.layer_act_policy_bytes) / unit
                 <= (st.capacity_bytes - st.fixed_bytes) / unit)
    prob += pulp.lpSum(n) == num_layers
    if solver == "CBC":
        import warnings

        with warnings.catch_warnings():  # pulp 3.3 deprecates its bundled CBC in favour of a separate install
            warnings.simplefilter("ignore", DeprecationWarning)
            backend, name = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_seconds), "CBC"
    else:
        backend, name = _solver(time_limit_seconds)
    try:
        with _quiet_stdout():
            prob.solve(backend)
    except Exception as exc:  # a solver crash is reported, not raised: the caller keeps the closed-form plan
        return SolverResult(f"error: {exc}", False, None, None, None, name, time.perf_counter() - start)
    sol = prob.sol_status
    seconds = time.perf_counter() - start
    if sol in (pulp.LpSolutionInfeasible, pulp.LpSolutionUnbounded) or prob.status == pulp.LpStatusInfeasible:
        return SolverResult("infeasible", False, None, None, None, name, seconds)
    if sol not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return SolverResult(f"no solution ({pulp.LpSolution[sol]})", False, None, None, None, name, seconds)
    layers = [round(v.value()) for v in n]
    rec = [round(v.value()) for v in r]
    makespan = max(layers[i] * st.layer_seconds + rec[i] * st.recompute_seconds + st.extra_seconds
                   for i, st in enumerate(stages))
    optimal = sol == pulp.LpSolutionOptimal
    return SolverResult("optimal" if optimal else "feasible", optimal, layers, rec, makespan, name, seconds)
