"""Infeasibility explanations name the binding constraint with the number that would make it feasible."""

import pytest

from planner.errors import InfeasibleError
from planner.estimate import build_problem
from planner.explain.infeasible import divisible
from planner.search import PlanOptions, plan


def _why(*args) -> list[str]:
    with pytest.raises(InfeasibleError) as info:
        plan(build_problem(*args), PlanOptions(use_solver=False))
    return info.value.problems


def test_divisibility_names_the_nearest_node_counts_and_batches():
    lines = _why("dgx-h100", 10000, "llama3-405b", 2048, 8192)
    assert lines[0].startswith("no layout divides 80,000 GPUs for 126 layers / 128 heads")
    # 80,000 = 2^7 x 5^4: dp must divide 2,048 (a power of two), so tp x pp would need 625 | pp > 126 layers
    assert "9,984 nodes (79,872 GPUs)" in lines[1]
    from planner.inputs.models import load_model

    m = load_model("llama3-405b")
    assert divisible(79_872, 8, m, 2048) and not divisible(80_000, 8, m, 2048)
    assert not any("inf GiB" in line for line in lines)


def test_host_memory_is_named_when_it_binds():
    lines = _why("single-rtx4090", None, "llama2-13b", 8, 2048)
    assert "host memory binds" in lines[0] and "a node has 128.0 GiB" in lines[0]


def test_least_gpu_memory_is_a_real_peak_not_a_lower_bound():
    a100 = _why("dgx-a100-80gb", 1, "llama2-7b", 64, 100_000_000)[0]
    h200 = _why("dgx-h200", 1, "llama2-7b", 64, 100_000_000)[0]
    # the same model and batch need the same least peak whatever the GPU (before: 117.5 vs 7,233 GiB)
    assert a100.split(" per GPU")[0] == h200.split(" per GPU")[0]
