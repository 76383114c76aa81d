"""The one error hierarchy and its exit-code table (the agreed table: COMMON.md / README "Exit codes")."""

import pytest

from cluster_specs import SpecError
from planner import errors
from planner.errors import ExitCode, exit_code_for


def test_exit_code_table_is_the_agreed_one():
    assert {c.name: int(c) for c in ExitCode} == {
        "OK": 0, "CHECK_FAILED": 1, "USAGE": 2, "INPUT": 3, "INFEASIBLE": 4, "SOLVER": 5, "MISSING_DEPENDENCY": 6,
        "BENCH_FAILED": 7, "IO": 8, "INTERNAL": 9}


@pytest.mark.parametrize("cls, code", [
    (errors.InputError, 3), (errors.InfeasibleError, 4), (errors.SolverError, 5),
    (errors.MissingDependencyError, 6), (errors.BenchmarkError, 7), (errors.FileAccessError, 8),
    (errors.InternalError, 9)])
def test_each_error_class_maps_to_its_code(cls, code):
    assert exit_code_for(cls("x")) == code
    assert issubclass(cls, errors.PlannerError)


def test_spec_error_is_the_one_invalid_input_class():
    # cluster_specs' loaders and the planner raise the same class: exit 3 is defined once
    assert SpecError is errors.InputError
    exc = SpecError(["a: 1 -> bad", "b: 2 -> bad"], source="x.yaml")
    assert exc.problems == ["a: 1 -> bad", "b: 2 -> bad"]
    assert str(exc) == "x.yaml: a: 1 -> bad\nx.yaml: b: 2 -> bad"
    assert isinstance(exc, ValueError)
    one = errors.InfeasibleError("summary", problems=["line 1", "line 2"])
    assert str(one) == "summary" and one.problems == ["line 1", "line 2"]


def test_os_errors_are_io_and_bugs_are_not_mapped():
    assert exit_code_for(PermissionError("denied")) == 8
    assert exit_code_for(KeyError("bug")) is None  # the CLI reports it as an internal error (9)
