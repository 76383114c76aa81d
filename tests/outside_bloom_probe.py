"""Outside check on BLOOM-176B's production run (not collected by pytest; the run is not in ../shared/validation, whose
BigScience rows are the layout search of chronicles-prequel.md, so no fitted knob of validation saw it):
bigscience-workshop/bigscience train/tr11-176B-ml at commit 39ed811 (2023-11-20).

    PYTHONPATH=. .venv/bin/python tests/outside_bloom_probe.py

The run, as README.md states it: 48 nodes of 8 A100 80GB on Jean Zay, TP=4, PP=12, DP=8, MBS=2, GBS=2048 at full
throttle, sequence 2048, NHIDDEN=14336, NLAYERS=70, NHEADS=112, the 250k vocabulary (250880 padded in the released
model), bf16 with DeepSpeed's BF16_Optimizer as ZERO_STAGE=0 ('implements its own ZeRO Stage 1'), DeepSpeed
activation checkpointing (full recompute). Its step: chronicles.md 2022-03-18, 'we are now at full throttle of
GBS=2048 and at 149-150 TFLOPs per GPU', log line 'iteration 12695 ... elapsed time per iteration (s): 105.22', and
README.md's 'iteration 85376 ... 104.70'. Not modelled: --pp-partition-method 'type:transformer|embedding', which
gives each tied embedding a pipeline slot of its own (72 slots, 6 per stage); the planner's split is its own.

A line per row: measured and predicted step time, the error and the shipped band, with the shipped fitted knobs
(planner/data/error_bands.json) and the Megatron-DeepSpeed profile, as the published BigScience rows are run."""

from __future__ import annotations

from planner.bands import load_table
from planner.validation import band_text, case_knobs
from tests.outside_probe import predicted

SOURCE = "bigscience-workshop/bigscience train/tr11-176B-ml README.md, chronicles.md (commit 39ed811)"
ROWS = [  # id, date, iteration time (s), where it is printed
    ("bloom-176b-2022-03-18", "2022-03-18", 105.22, "chronicles.md 2022-03-18, iteration 12695"),
    ("bloom-176b-2022-06-28", "2022-06-28", 104.70, "README.md, iteration 85376 (end of epoch one)"),
]


def row(rid: str, date: str, seconds: float, where: str) -> dict:
    return {
        "id": rid, "record_type": "throughput_run", "source": SOURCE, "source_locator": where,
        "model_name": "BLOOM 176B", "model_family": "BLOOM", "architecture": "dense", "params_b": 176.2,
        "num_layers": 70, "hidden_size": 14336, "num_attention_heads": 112, "num_kv_heads": None,
        "ffn_hidden_size": 4 * 14336, "vocab_size": 250880, "seq_length": 2048,
        "gpu_type": "A100 SXM 80GB (Jean Zay)", "gpu_memory_gb": 80, "total_gpus": 384, "gpus_per_node": 8,
        "interconnect": "NVLink intra-node; Omni-Path inter-node", "tp": 4, "pp": 12, "dp": 8, "zero_stage": 0,
        "micro_batch_size": 2, "global_batch_size": 2048, "activation_recomputation": "full", "precision": "BF16",
        "framework": "Megatron-DeepSpeed", "iteration_time_s": seconds,
        "notes": f"Measured at {where} (date {date}).",
    }


def main() -> None:
    table = load_table()
    fitted = table["fitted_knobs"]
    print(f"{'row':26} {'layout':62} {'step s meas/pred':>18} {'err':>7} {'band (shipped)':>15}")
    for spec in ROWS:
        r = row(*spec)
        out = predicted(r, lambda case: case_knobs(case, fitted), width=26)
        if out is None:
            continue
        case, res = out
        print(f"{r['id']:26} {res.layout.short():62} {case.measured_step_seconds:8.2f}/{res.predicted_step_seconds:<8.2f} "
              f"{res.error:+7.1%} {band_text(table, res):>15}{'' if res.fits else '  (judged OOM)'}")


if __name__ == "__main__":
    main()
