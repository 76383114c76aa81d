"""Fingerprint of the cost model's outputs, to show a speed-up (or refactoring) keeps every number byte-identical.

Runs `estimate_step` on seeded random (model, cluster, framework profile, precision, layout) cases — every preset
model, 9 clusters, every framework's knobs, bf16/fp16/fp32/FP8 recipes, CP, EP, ZeRO 0-3, offload, every schedule,
uneven splits and per-stage recompute — and writes one line per case: the inputs and the `repr` of the
`StepEstimate` (floats in full) or of the exception. Usage, from the repository root, once per tree:

    PYTHONPATH=$PWD .venv/bin/python tests/estimate_fingerprint.py OUT.txt [CASES_PER_SETUP]   # default 300
    cmp before.txt after.txt

It prints the number of estimates and the SHA-256 of the file (300 per setup: 20,700 estimates on 1 December 2026).
"""

from __future__ import annotations

import hashlib
import random
import sys
from dataclasses import replace

from cluster_specs import load_cluster
from cost_models.inputs import Knobs, Layout, Offload, Recompute, Schedule, Zero3Gather
from cost_models.step import estimate_step
from planner.frameworks.profiles import profile_knobs
from planner.inputs.models import load_model, model_names
from planner.inputs.specs import TrainingSpec
from planner.problem import Problem

CLUSTERS = [("dgx-h100", 64), ("dgx-a100-80gb", 16), ("pcie-l40s-10gbe", 4), ("single-a100-40gb", 1),
            ("v100-10gbe", 8), ("dgx-h200", 512), ("dgx-h100", 1024), ("dgx-a100-40gb", 32), ("dgx-h100", 8)]
FRAMEWORKS = [None, "megatron", "nemo", "torchtitan", "deepspeed", "megatron-deepspeed", "generic"]
PRECISIONS = [("bf16", None), ("fp16", None), ("fp32", None), ("fp8", "tensorwise"), ("fp8", "delayed"),
              ("fp8", "blockwise"), ("fp8", "mxfp8"), ("fp8", "rowwise")]


def setup(rng: random.Random, name: str) -> tuple[Problem, str, str | None, str] | str:
    """A problem for model `name` on a random cluster, framework and precision, or why it could not be built."""
    cluster, nodes = CLUSTERS[rng.randrange(len(CLUSTERS))]
    framework = FRAMEWORKS[rng.randrange(len(FRAMEWORKS))]
    precision, recipe = PRECISIONS[rng.randrange(len(PRECISIONS))]
    kw: dict = {"global_batch_size": rng.choice([64, 256, 512, 2048]),
                "seq_length": rng.choice([1024, 2048, 4096, 8192, 32768]), "precision": precision}
    if recipe:
        kw["fp8_recipe"], kw["fp8_param_gather"] = recipe, rng.random() < 0.3
    if rng.random() < 0.2:
        kw["grad_dtype"] = "bf16"
    if rng.random() < 0.2:
        kw["optimizer"] = "sgd"
    try:
        knobs = profile_knobs(framework, Knobs(memory_headroom_bytes=rng.choice([0.0, 2**31])), precision=precision)
        if rng.random() < 0.3:
            knobs = replace(knobs, zero3_gather=Zero3Gather.MODULE, bucket_bytes=1e9, tp_layer_overhead_seconds=1e-4)
        problem = Problem(load_model(name), TrainingSpec(**kw), load_cluster(cluster, nodes=nodes), knobs)
        _ = problem.cm_model, problem.cm_training, problem.hardware
    except Exception as exc:  # noqa: BLE001 - the fingerprint records any failure as text
        return f"{name} setup {type(exc).__name__}: {exc}"
    return problem, cluster, framework, precision


def random_layout(rng: random.Random, num_layers: int, moe: bool) -> Layout:
    tp, pp, dp = 2 ** rng.randint(0, 3), rng.choice([1, 1, 2, 4, 8, 3, 16]), 2 ** rng.randint(0, 6)
    schedule = rng.choice(list(Schedule)) if pp > 1 else Schedule.ONE_F_ONE_B
    lay: dict = {"dp": dp, "tp": tp, "pp": pp, "zero_stage": rng.randint(0, 3), "micro_batch_size": 2 ** rng.randint(0, 2),
                 "num_micro_batches": rng.choice([1, 2, 4, 8, 16, 32]), "recompute": rng.choice(list(Recompute)),
                 "sequence_parallel": rng.random() < 0.6, "schedule": schedule,
                 "virtual_stages": rng.choice([1, 2, 4]) if schedule == Schedule.INTERLEAVED_1F1B else 1}
    if lay["zero_stage"] >= 1 and rng.random() < 0.25:
        both = lay["zero_stage"] == 3 and rng.random() < 0.5
        lay["offload"] = Offload.OPTIMIZER_PARAMS if both else Offload.OPTIMIZER
    if rng.random() < 0.25:
        lay["cp"], lay["cp_comm"] = rng.choice([2, 4]), rng.choice(["p2p", "all_gather", "a2a"])
    if moe and rng.random() < 0.7:
        lay["ep"], lay["etp"] = rng.choice([1, 2, 4, 8]), rng.choice([1, 1, 2])
    if 1 < pp <= num_layers and rng.random() < 0.25:
        cuts = [0, *sorted(rng.sample(range(1, num_layers), pp - 1)), num_layers]
        lay["layers_per_stage"] = tuple(cuts[i + 1] - cuts[i] for i in range(pp))
        if rng.random() < 0.5:
            lay["recompute_layers_per_stage"] = tuple(rng.randint(0, n) for n in lay["layers_per_stage"])
    return Layout(**lay)


def outcome(problem: Problem, layout: Layout, fused_swiglu: bool) -> str:
    try:
        est = estimate_step(problem.cm_model, problem.cm_training, problem.hardware, layout,
                            replace(problem.knobs, fused_swiglu=fused_swiglu))
    except Exception as exc:  # noqa: BLE001 - an error is part of the fingerprint
        return f"EXC {type(exc).__name__}: {exc}"
    return f"{est!r} props={est.time.total_seconds!r},{est.peak_allocated_bytes!r},{est.peak_reserved_bytes!r}"


def main(out_path: str, per_setup: int = 300) -> int:
    rng = random.Random(12345)
    lines, count = [], 0
    for name in sorted(model_names()):
        for _ in range(3):
            for _attempt in range(5):
                built = setup(rng, name)
                if not isinstance(built, str):
                    break
                lines.append(built)
            else:
                continue
            problem, cluster, framework, precision = built
            for _ in range(per_setup):
                layout = random_layout(rng, problem.cm_model.num_layers, problem.cm_model.moe is not None)
                fused = rng.random() < 0.2
                lines.append(f"{name} {cluster} {framework} {precision} {layout!r} fs={fused} -> "
                             f"{outcome(problem, layout, fused)}")
                count += 1
    text = "\n".join(lines) + "\n"
    with open(out_path, "w") as f:
        f.write(text)
    print(count, "estimates", hashlib.sha256(text.encode()).hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *(int(a) for a in sys.argv[2:3])))
