"""Errors and exit codes: the one place that maps a failure to a process exit status.

0  success
1  `check`: the config violates a rule (one line per violation)
2  usage error (bad flag or option; typer/click's own code)
3  invalid input (malformed file, unknown preset, a field out of range, a layout that does not divide)
4  no feasible layout: nothing fits in memory (the message says the least memory any layout needs)
5  the solver failed (no optimal or feasible solution within its time limit)
6  an optional dependency is missing (torch for `bench`/`calibrate`)
7  the benchmark failed at run time (a rank died or timed out)
8  I/O error: the operating system could not read a file (permission denied, I/O error)
"""

from __future__ import annotations

from cluster_specs.errors import SpecError

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_INFEASIBLE = 4
EXIT_SOLVER = 5
EXIT_MISSING_DEPENDENCY = 6
EXIT_BENCH_FAILED = 7
EXIT_IO = 8


class PlannerError(Exception):
    exit_code = EXIT_INPUT

    def __init__(self, message: str, *, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or [message]


class InfeasibleError(PlannerError):
    exit_code = EXIT_INFEASIBLE


class SolverError(PlannerError):
    exit_code = EXIT_SOLVER


class MissingDependencyError(PlannerError):
    exit_code = EXIT_MISSING_DEPENDENCY


class BenchmarkError(PlannerError):
    exit_code = EXIT_BENCH_FAILED


def exit_code_for(exc: BaseException) -> int | None:
    if isinstance(exc, SpecError):
        return getattr(exc, "exit_code", EXIT_INPUT)  # cluster_specs.reading.InputIOError carries 8
    if isinstance(exc, PlannerError):
        return exc.exit_code
    return None
