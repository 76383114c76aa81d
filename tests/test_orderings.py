"""Seed note #6: memory efficiency TP > PP > DP and communication efficiency PP > DP > TP must come out of
the cost models on a realistic case, not be written into code."""

from cluster_specs import load_cluster
from planner.estimate import complete_layout
from planner.inputs.models import load_model
from planner.inputs.specs import TrainingSpec
from planner.problem import Problem


def _estimate(fields):
    cluster = load_cluster("dgx-a100-80gb", nodes=2)  # 16 GPUs
    problem = Problem(load_model("llama2-13b"), TrainingSpec(global_batch_size=64, seq_length=4096), cluster)
    layout = complete_layout(fields, problem.model, problem.training, cluster)
    return problem.estimate(layout)


def test_memory_and_communication_orderings():
    # GPT/Llama 13B on 16 A100s: each parallelism alone at degree 8, DP 2 on top (the same 16 GPUs)
    tp = _estimate({"tp": 8, "dp": 2, "sequence_parallel": False})
    pp = _estimate({"pp": 8, "dp": 2})
    dp = _estimate({"dp": 16})
    # memory per GPU: TP < PP < DP (TP shards weights and activations, PP only weights of other stages)
    assert tp.peak_memory_bytes < pp.peak_memory_bytes < dp.peak_memory_bytes
    # communication per step, as the models price it on this cluster (before any overlap): PP < DP < TP.
    # TP moves 4 all-reduces of b*s*h per layer per micro-batch; DP one all-reduce of the gradients per step;
    # PP one activation and one gradient per micro-batch per stage boundary (Narayanan §3.2, ZeRO §7).
    assert pp.time.pp_p2p_seconds > 0
    assert pp.time.pp_p2p_seconds < dp.time.dp_comm_total_seconds < tp.time.tp_comm_total_seconds
