"""The seed's decision table (../shared/reference/seed-notes.md #11): classify a request into its row, give
the row's recommendation, and say whether the solver's pick agrees. The table is a rule of thumb: the cost
models and the solver decide; this module only classifies and compares.
"""

from __future__ import annotations

HIGH_BANDWIDTH_BYTES_PER_SECOND_PER_GPU = 5e9  # >= 40 Gb/s of network per GPU counts as high bandwidth [choice]

ROWS = {
    1: ("One GPU, memory suffices", "Plain single-GPU training"),
    2: ("One GPU, memory does not suffice", "Offload to CPU (ZeRO-Offload)"),
    3: ("One node, several GPUs, model fits on one card", "DDP, or ZeRO stage 1/2"),
    4: ("One node, several GPUs, model does not fit on one card", "Tensor parallelism, or ZeRO stage 3"),
    5: ("Several nodes, high-bandwidth network", "ZeRO, or 3D parallelism"),
    6: ("Several nodes, low-bandwidth network", "DP + PP + TP + ZeRO-1 (no TP across nodes; ZeRO first, PP if it "
                                                "still does not fit)"),
    # rows the field uses since 2024 (modern-training.md §2.7-2.8, §3.5): Llama 3 trains 128k with CP 16 at TP 8;
    # NeMo's long-sequence tables add CP as sequences grow; Megatron's MoE guide: "keep EP x TP in one NVLink
    # domain", "EP8xTP1 outperforms EP4xTP2" (MoE README L182-216)
    7: ("Long context (at least 32k tokens per sequence), several GPUs",
        "Context parallelism (ring attention) before more TP; CP inside the node first"),
    8: ("Mixture-of-experts model, several GPUs", "Expert parallelism inside the node first (EP x TP within NVLink), "
                                                  "then PP or DP"),
}
LONG_CONTEXT_TOKENS = 32768  # the "long sequences (32k-1M tokens)"


def network_bytes_per_second_per_gpu(hw) -> float:
    if hw.nic is None:
        return 0.0
    return hw.nics_per_node * hw.nic.bandwidth_bytes_per_second / hw.gpus_per_node


def classify(*, num_gpus: int, num_nodes: int, fits_one_card: bool, network_per_gpu: float, seq_length: int = 0,
             moe: bool = False) -> int:
    if num_gpus == 1:
        return 1 if fits_one_card else 2
    if seq_length >= LONG_CONTEXT_TOKENS:
        return 7
    if moe:
        return 8
    if num_nodes == 1:
        return 3 if fits_one_card else 4
    return 5 if network_per_gpu >= HIGH_BANDWIDTH_BYTES_PER_SECOND_PER_GPU else 6


def matches_row(row: int, layout, gpus_per_node: int) -> bool:
    """Does a layout follow the row's recommendation?"""
    tp, pp, dp, z = layout.tp, layout.pp, layout.dp, layout.zero_stage
    if row == 1:
        return tp == pp == dp == 1 and layout.offload == "none"
    if row == 2:
        return layout.offload != "none"
    if row == 3:
        return tp == 1 and pp == 1 and z <= 2 and layout.offload == "none"
    if row == 4:
        return tp > 1 or z == 3
    if row == 5:
        return z >= 1 or tp > 1 or pp > 1
    if row == 7:
        return getattr(layout, "cp", 1) > 1
    if row == 8:
        ep = getattr(layout, "ep", 1)
        return ep > 1 and ep * getattr(layout, "etp", 1) <= gpus_per_node
    return tp <= gpus_per_node and (z >= 1 or pp > 1)
