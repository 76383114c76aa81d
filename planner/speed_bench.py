"""`make bench`: planning speed over a ladder of cluster and model sizes, and the cost of one estimate.

Plans with the CLI's defaults (`default_knobs()`: 2 GiB headroom), so its picks are `planner plan`'s. Prints,
per case, candidates considered, candidates fully evaluated, solver time and total planning time (medians of
several runs), then `planner plan` end to end as a process (start-up included), and the time of one
`estimate_step` (median and best; see estimate_speed). Speed is measured here, never asserted in tests (the
machines are shared).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import timeit

LADDER = [
    # (label, cluster, nodes, model, global batch, sequence)
    ("8 GPUs / 1.3B", "dgx-a100-80gb", 1, "gpt3-1.3b", 512, 2048),
    ("64 GPUs / 13B", "dgx-a100-80gb", 8, "llama2-13b", 1024, 4096),
    ("1,024 GPUs / 175B", "dgx-a100-80gb", 128, "gpt3-175b", 1536, 2048),
    ("2,240 GPUs / 530B", "dgx-a100-80gb", 280, "mt-nlg-530b", 1920, 2048),
    ("16,384 GPUs / 405B", "dgx-h100", 2048, "llama3-405b", 2048, 8192),
    ("65,536 GPUs / 1T", "dgx-h100", 8192, "megatron-1t", 8192, 2048),
]
REPEATS = 5


def main() -> None:
    from cluster_specs import load_cluster
    from planner.inputs.models import load_model
    from planner.inputs.specs import TrainingSpec
    from planner.problem import Problem, default_knobs
    from planner.search import PlanOptions, plan

    print(f"{'case':<22}{'considered':>11}{'evaluated':>11}{'ILP runs':>9}{'solver s':>10}{'plan s':>9}  pick")
    for label, cluster, nodes, model, batch, seq in LADDER:
        problem = Problem(load_model(model), TrainingSpec(global_batch_size=batch, seq_length=seq),
                          load_cluster(cluster, nodes=nodes), default_knobs())
        totals, solver = [], []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            res = plan(problem, PlanOptions())
            totals.append(time.perf_counter() - t0)
            solver.append(res.stats.solver_seconds)
        s = res.stats
        print(f"{label:<22}{s.candidates_considered:>11,}{s.candidates_evaluated:>11,}{s.solver_runs:>9}"
              f"{statistics.median(solver):>10.3f}{statistics.median(totals):>9.3f}  {res.pick.layout.short()}")

    cmd = [sys.executable, "-m", "planner.cli", "plan", "-c", "dgx-h100", "-n", "2048", "-m", "llama3-405b",
           "-b", "2048", "-s", "8192", "--json"]
    walls = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        walls.append(time.perf_counter() - t0)
    print(f"\n`planner plan` end to end (16,384 GPUs / 405B, process start included): median "
          f"{statistics.median(walls):.2f} s over {REPEATS} runs (min {min(walls):.2f}, max {max(walls):.2f})")

    decisions_speed()

    estimate_speed()


def estimate_speed(repeats: int = 300, number: int = 20) -> None:
    """One `estimate_step` (405B, tp8 pp16 dp128): the median of `repeats` timings of `number` calls, and the best
    one, which is what an idle machine gives when other processes share the cores (the median then measures
    the load as much as the code); wall clock and this thread's CPU time (which a busy machine inflates less).
    The load average is printed with it. `python -m planner.speed_bench estimate` runs this part alone."""
    import os

    from cluster_specs import load_cluster
    from cost_models.step import estimate_step
    from planner.inputs.models import load_model
    from planner.inputs.specs import LayoutSpec, TrainingSpec
    from planner.problem import Problem, default_knobs

    problem = Problem(load_model("llama3-405b"), TrainingSpec(global_batch_size=2048, seq_length=8192),
                      load_cluster("dgx-h100", nodes=2048), default_knobs())
    layout = LayoutSpec(tp=8, pp=16, dp=128, micro_batch_size=1, num_micro_batches=16,
                        sequence_parallel=True).to_cost_model()

    def one() -> None:
        estimate_step(problem.cm_model, problem.cm_training, problem.hardware, layout, problem.knobs)

    for label, timer in (("wall", time.perf_counter), ("CPU", time.thread_time)):
        per_call = [r / number * 1e6 for r in timeit.repeat(one, number=number, repeat=repeats, timer=timer)]
        print(f"one estimate (405B, tp8 pp16 dp128), {label}: median {statistics.median(per_call):.0f} µs, best "
              f"{min(per_call):.0f} µs over {repeats} x {number} calls (load average {os.getloadavg()[0]:.1f})")


def decisions_speed(repeats: int = 3) -> None:
    """`planner compare` over 3 clusters and `planner scaling` over 8 node counts for Llama 3 405B, in process:
    wall clock and CPU time (the CPU time is what a shared machine does not inflate), medians."""
    from cluster_specs import load_cluster
    from planner.decisions.compare import compare, parse_clusters
    from planner.decisions.scaling import default_node_counts, scaling_curve
    from planner.inputs.models import load_model
    from planner.inputs.specs import TrainingSpec
    from planner.problem import Problem, default_knobs
    from planner.search import PlanOptions

    model = load_model("llama3-405b")

    def make(cluster, nodes, batch=2048):
        return Problem(model, TrainingSpec(global_batch_size=batch, seq_length=8192), load_cluster(cluster, nodes=nodes),
                       default_knobs())

    cases = {
        "compare 405B on dgx-a100-80gb:2048,dgx-h100:2048,dgx-h200:2048": lambda: compare(
            parse_clusters("dgx-a100-80gb:2048,dgx-h100:2048,dgx-h200:2048"), make, PlanOptions()),
        "scaling 405B on dgx-h100, 64..8192 nodes (8 counts)": lambda: scaling_curve(
            lambda n, b: make("dgx-h100", n, b), PlanOptions(), default_node_counts(2048), 2048),
    }
    for label, fn in cases.items():
        walls, cpus = [], []
        for _ in range(repeats):
            w0, c0 = time.perf_counter(), _cpu_seconds()
            fn()
            walls.append(time.perf_counter() - w0)
            cpus.append(_cpu_seconds() - c0)
        print(f"{label}: median {statistics.median(walls):.2f} s wall, {statistics.median(cpus):.2f} s CPU "
              f"(this process and its plan workers) over {repeats} runs")


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (the plan workers of planner.decisions.parallel)."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


if __name__ == "__main__":
    estimate_speed() if sys.argv[1:] == ["estimate"] else main()
