"""Outside check on torchtitan's H100 runs that print their measured memory (not collected by pytest; the rows are
not in ../shared/validation, so no fitted knob of validation saw them; but the ratio of Tables 1 and 3's compiled to
eager 8B steps sized profiles.COMPILED_ELEMENTWISE_SHARE, so those four rows are not held out from it, only their
level is): pytorch/torchtitan docs/performance.md at commit
eaea6f6a (Grand Teton: 8 H100 SXM 96GB HBM2e per host at 500 W, 400 Gb/s RDMA per GPU; torch 1963fc8, torchao
eab345c, torchtitan 9dec370, 2024-12). Memory(GiB) is torch's peak reserved, the maximum over GPUs.

    PYTHONPATH=. .venv/bin/python tests/outside_torchtitan_probe.py

A line per row: measured and predicted step time and memory, and their errors, with the shipped fitted knobs
(planner/data/error_bands.json), so a row is predicted as `planner estimate --framework torchtitan` predicts it,
except for its attention kernel: the rows are dated 2025 (the doc's commit) and their torch nightly of 2024-12 comes
after pytorch#141274, which put FlashAttention-2 before cuDNN on sm90, so they run FlashAttention-2
(validation.fsdp_attention_kernel), where torchtitan now asks for cuDNN's kernel first (profiles.py).
The rows that ran torch.compile (the table says so) name it in their framework text, so they move
profiles.COMPILED_ELEMENTWISE_SHARE of the eager elementwise traffic, the share sized on Tables 1 and 3's
eager/compiled pairs here. The memory at the head is modelled as torch holds it (tests/test_head_memory_torch.py):
the 70B run's loss_parallel at 16 B per local logit, FSDP's output unit gathered across the loss. Their torchtitan
(9dec370) runs train_configs' norm_type 'rmsnorm', torchtitan's eager RMSNorm class, which saves the fp32 upcast of
each norm's input (Knobs.norm_fp32_upcast, as `check` reads that config; compiled, the norm is fused), and copies
K and V to every query head (repeat_kv, validation.TORCHTITAN_REPEAT_KV_LAST_YEAR); a layer's backward holds its
recompute and its MLP's gradients (stage.LayerCosts.backward_working_bytes; tests/test_backward_memory_torch.py).
Not modelled, so expect them off: what else torch.compile changes (the compiled rows hold 5 GiB less than eager,
0.5 GiB of it the eager norm's upcast in the layer being recomputed; not the SAC
must-saves its backward does not need: compiled with the min-cut partitioner, a Llama block under the bench's SAC
policy keeps the same bytes as eager on CPU), the 500 W part's sustained clocks (cluster_specs/gpus.yaml
H100-SXM-HBM2e-500W: the SXM part's MAMF, a midpoint peak [U]; its 2.4 TB/s HBM2e is the doc's own figure), AsyncTP."""

from __future__ import annotations

from dataclasses import replace

from planner.bands import load_table
from planner.validation import band_text, case_knobs
from tests.outside_probe import predicted

SOURCE = "pytorch/torchtitan docs/performance.md (commit eaea6f6a, 2025-02-02)"
LLAMA3 = {  # Llama 3.1 (HF configs): layers, hidden, heads, KV heads, FFN
    "8b": (32, 4096, 32, 8, 14336, 8.03),
    "70b": (80, 8192, 64, 8, 28672, 70.6),
}
ROWS = [  # id, model, GPUs, dp, tp, local batch, recompute, precision, TPS/GPU, GiB, table
    ("t1-fsdp", "8b", 8, 8, 1, 2, "selective (op)", "BF16", 5762, 82.4, "Table 1 FSDP"),
    ("t1-compile", "8b", 8, 8, 1, 2, "selective (op)", "BF16", 6667, 77.0, "Table 1 FSDP + torch.compile"),
    ("t1-compile-fp8", "8b", 8, 8, 1, 2, "selective (op)", "FP8", 8532, 76.8, "Table 1 + Float8"),
    ("t3-fsdp", "8b", 128, 128, 1, 2, "selective (op)", "BF16", 5605, 67.0, "Table 3 FSDP"),
    ("t3-compile", "8b", 128, 128, 1, 2, "selective (op)", "BF16", 6514, 62.0, "Table 3 FSDP + torch.compile"),
    ("t3-compile-fp8", "8b", 128, 128, 1, 2, "selective (op)", "FP8", 8380, 61.8, "Table 3 + Float8"),
    ("t4-2d-fp8", "70b", 256, 32, 8, 16, "full", "FP8", 829, 71.9, "Table 4 2D, compile + Float8"),
]


def row(rid, size, n, dp, tp, lbs, recompute, precision, tps, gib, table) -> dict:
    layers, h, heads, kv, ffn, params = LLAMA3[size]
    return {
        "id": f"torchtitan-h100-{size}-{rid}", "record_type": "throughput_run", "source": SOURCE,
        "source_locator": table, "model_name": f"Llama 3.1 {size.upper()}", "model_family": "llama3",
        "architecture": "dense", "params_b": params, "num_layers": layers, "hidden_size": h,
        "num_attention_heads": heads, "num_kv_heads": kv, "ffn_hidden_size": ffn, "vocab_size": 128256,
        "seq_length": 8192, "gpu_type": "H100 SXM 96GB HBM2e (500 W)", "total_gpus": n, "gpus_per_node": 8,
        "tp": tp, "pp": 1, "dp": dp, "zero_stage": 3, "fsdp": True, "micro_batch_size": lbs,
        "global_batch_size": lbs * dp, "activation_recomputation": recompute, "precision": precision,
        "framework": "torchtitan (FSDP2)" + (" + torch.compile" if "compile" in rid + table else ""),
        "tokens_per_sec_per_gpu": tps, "peak_memory_gb_per_gpu": gib * 2**30 / 1e9,
        "memory_definition": "torchtitan Memory(GiB): torch.cuda.max_memory_reserved, the maximum over GPUs",
    }


def main() -> None:
    fitted = load_table()["fitted_knobs"]  # the shipped knobs, as `planner estimate` runs (validation fits them)
    table = load_table()
    print(f"{'row':34} {'step s meas/pred':>18} {'err':>7} {'band (shipped)':>15} {'GiB meas/pred':>15} {'err':>7}")
    for spec in ROWS:
        r = row(*spec)
        out = predicted(r, lambda case: replace(case_knobs(case, fitted), norm_fp32_upcast=True),  # 'rmsnorm'
                        width=34)
        if out is None:
            continue
        case, res = out
        gib = spec[9]
        predicted_gib = res.predicted_memory_on(case.memory_basis)  # reserved: what torchtitan prints
        mem_err = (predicted_gib - gib) / gib
        print(f"{r['id']:34} {case.measured_step_seconds:8.2f}/{res.predicted_step_seconds:<8.2f} {res.error:+7.1%} "
              f"{band_text(table, res):>15} {gib:6.1f}/{predicted_gib:<7.1f} {mem_err:+7.1%}"
              f"{'' if res.fits else '  (judged OOM)'}")


if __name__ == "__main__":
    main()
