"""Errors and exit codes: the one error hierarchy and the one table that maps a failure to an exit status.

Every error the planner raises on purpose is a `PlannerError`; its class fixes the exit code. `cluster_specs`
raises `InputError` too (re-exported there as `SpecError`), so "invalid input" is exit 3 in exactly one place.
Standard library only: `cluster_specs` imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import ClassVar


class ExitCode(IntEnum):
    """The process exit statuses of `planner` (README "Exit codes" shows this table)."""

    OK = 0  # success
    CHECK_FAILED = 1  # `check`: the config violates a rule (one line per violation)
    USAGE = 2  # bad flag or option (typer/click's own code)
    INPUT = 3  # invalid input: malformed file, unknown preset, a field out of range, a layout that does not divide
    INFEASIBLE = 4  # no feasible layout: nothing fits (the message says the least memory any layout needs)
    SOLVER = 5  # the ILP solver failed
    MISSING_DEPENDENCY = 6  # an optional dependency is missing (torch for `bench`/`calibrate`)
    BENCH_FAILED = 7  # the benchmark failed at run time (a rank died or timed out)
    IO = 8  # a file could not be read or written
    INTERNAL = 9  # a bug in the planner: one line "please report", the traceback only with --debug


# the same codes as plain names, for call sites that predate the enum
EXIT_OK = ExitCode.OK
EXIT_CHECK_FAILED = ExitCode.CHECK_FAILED
EXIT_USAGE = ExitCode.USAGE
EXIT_INPUT = ExitCode.INPUT
EXIT_INFEASIBLE = ExitCode.INFEASIBLE
EXIT_SOLVER = ExitCode.SOLVER
EXIT_MISSING_DEPENDENCY = ExitCode.MISSING_DEPENDENCY
EXIT_BENCH_FAILED = ExitCode.BENCH_FAILED
EXIT_IO = ExitCode.IO
EXIT_INTERNAL = ExitCode.INTERNAL

# name and meaning of each code (one line each, under 72 characters): `planner --help`, the README's table and the
# --json error document (`error` is the name) read this
EXIT_CODES: dict[ExitCode, tuple[str, str]] = {
    ExitCode.OK: ("ok", "success"),
    ExitCode.CHECK_FAILED: ("violation", "check: the config violates a rule (one line per violation)"),
    ExitCode.USAGE: ("usage", "usage error: unknown command or flag, missing option"),
    ExitCode.INPUT: ("invalid_input", "invalid input: missing or bad file, unknown name, bad value"),
    ExitCode.INFEASIBLE: ("infeasible", "no feasible layout (the binding limit and what would help)"),
    ExitCode.SOLVER: ("solver_failed", "the ILP solver failed"),
    ExitCode.MISSING_DEPENDENCY: ("missing_dependency", "optional dependency missing (torch: bench, calibrate)"),
    ExitCode.BENCH_FAILED: ("benchmark_failed", "the benchmark failed at run time (a rank died or timed out)"),
    ExitCode.IO: ("io_error", "I/O error: an output not written, or an existing input not read"),
    ExitCode.INTERNAL: ("internal_error", "internal error, a bug: please report it (--debug: traceback)"),
}


class PlannerError(Exception):
    """Root of every deliberate failure. `problems` holds one line per problem (field, value, what is allowed).

    `PlannerError("one line")`, `PlannerError(["line", "line"], source="file.yaml")` and
    `PlannerError("summary", problems=[...])` all work; `str()` is the lines joined (prefixed by the source).
    """

    exit_code: ClassVar[ExitCode] = ExitCode.INTERNAL

    def __init__(self, message: str | Sequence[str], *, problems: Sequence[str] | None = None,
                 source: str | None = None):
        lines = [message] if isinstance(message, str) else list(message)
        self.problems: list[str] = list(problems) if problems else lines
        self.source = source
        prefix = f"{source}: " if source else ""
        super().__init__("\n".join(prefix + line for line in lines))


class InputError(PlannerError, ValueError):
    """Invalid input (exit 3): a malformed file, an unknown preset, a field out of range, a layout that does not
    divide. Also a `ValueError`, so pure code that validates its arguments can be caught the usual way."""

    exit_code = ExitCode.INPUT


class SetupError(InputError):
    """The training setup cannot run on the cluster's GPU whatever the layout (FP8 without FP8 tensor cores): exit 3
    for one plan; compare and scaling show the cluster as a row with this reason."""


class InfeasibleError(PlannerError):
    exit_code = ExitCode.INFEASIBLE


class SolverError(PlannerError):
    exit_code = ExitCode.SOLVER


class MissingDependencyError(PlannerError):
    exit_code = ExitCode.MISSING_DEPENDENCY


class BenchmarkError(PlannerError):
    exit_code = ExitCode.BENCH_FAILED


class FileAccessError(PlannerError):
    """A file could not be read or written (permissions, a missing directory, a full disk): exit 8."""

    exit_code = ExitCode.IO


class InternalError(PlannerError):
    """A bug: something the planner's own invariants rule out (exit 9)."""

    exit_code = ExitCode.INTERNAL


def exit_code_for(exc: BaseException) -> int | None:
    """The exit code of a deliberate failure; None for anything else (a bug: the caller decides, exit 9)."""
    if isinstance(exc, PlannerError):
        return int(exc.exit_code)
    if isinstance(exc, OSError):  # reading or writing a file failed outside the readers' own checks
        return int(ExitCode.IO)
    return None
