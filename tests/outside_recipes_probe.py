"""Outside check on NVIDIA's DGX H100 recipe runs that ../shared/validation does not hold (not collected by pytest;
no knob was fitted on these rows): NVIDIA/dgxc-benchmarking at v25.02 (commit 8f5cbb3799, DGX H100),
llama3.1/README_70b.md and README_405b.md, nemotron/README_15b.md and README_340b.md (NeMo 24.09-24.12) and
maxtext/README_70b.md (MaxText, JAX: FSDP within 16 nodes, DP across, remat_policy save_qkv_proj, cuDNN flash
attention; maxtext/configure.sh), 'Expected Performance' tables, the smallest and the largest scale of each; and
Megatron-Bridge's 25.11 DGX-H100 table. The same dgxc release's Llama 3.1 8B and GPT-3 175B tables are in the
published set (source 'NVIDIA/dgxc-benchmarking ... (v25.02, commit 8f5cbb3799)'), so these rows are outside the rows
the knobs were fitted on but not outside the publisher.

    PYTHONPATH=. .venv/bin/python tests/outside_recipes_probe.py

A line per row: measured and predicted step time and its error, with the shipped fitted knobs
(planner/data/error_bands.json), each row built as the published set's rows are (validation.build_case). NeMo rows:
the recompute their recipe's config sets (RECOMPUTE; searched for Megatron-Bridge's row) and the optimizer states
(STATES: bf16 gradients, and Nemotron-4 340B's bf16 master weights and moments), so a row the model judges out of
memory at it is a false out-of-memory verdict; DP = GPUs / (TP x PP x CP); ZeRO-1, the distributed
optimizer.
MaxText rows: the fsdp family (FAMILY_NAMES: JAX trainers) with a compiled step (XLA: validation.compiled_step,
profiles.COMPILED_ELEMENTWISE_SHARE; before it, these rows were +11% to +37%), ZeRO-3 over its FSDP group: every GPU
at 128, and at 2048 hybrid sharding over 128 with 16 replicas (MAXTEXT_FSDP_GPUS, LayoutSpec.dp_shard; +5.0% and
+20.0% while the planner sharded over all 2048), full recompute for save_qkv_proj (it keeps
the Q/K/V projections, the planner's full recomputes them too: a few percent of the layer's FLOPs).
Stated approximation: Nemotron-4's squared-ReLU MLP runs as a non-gated GeLU MLP (same GEMMs, 2 matrices of
h x 4h); its other fields from the Nemotron-4 papers (arXiv:2402.16819, 2406.11704): GQA with 8 KV heads, RoPE,
no biases, untied embeddings, vocabulary 256000, sequence 4096."""

from __future__ import annotations

import statistics
from dataclasses import replace

from planner.bands import load_table
from planner.inputs.layout_string import parse_optimizer_states
from planner.inputs.specs import TrainingSpec
from planner.validation import Case, band_text, case_knobs
from tests.outside_probe import predicted

SOURCE = "NVIDIA/dgxc-benchmarking {path} (v25.02, commit 8f5cbb3799)"
BRIDGE = ("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md (25.11 NeMo container, DGX-H100, FP8-CS; "
          "step = GBS x seq / (tokens/s/GPU x GPUs))")
MODELS = {  # layers, hidden, heads, KV heads, FFN, vocab, seq, printed params (B), MLP (what ran), path
    "Llama 3.1 70B": (80, 8192, 64, 8, 28672, 128256, 8192, 70.6, "swiglu", "llama3.1/README_70b.md"),
    "Nemotron-4 15B": (32, 6144, 48, 8, 24576, 256000, 4096, 15.6, "gelu", "nemotron/README_15b.md"),
    "Nemotron-4 340B": (96, 18432, 96, 8, 73728, 256000, 4096, 341.0, "gelu", "nemotron/README_340b.md"),
    "Llama 3.1 405B": (126, 16384, 128, 8, 53248, 128256, 8192, 405.9, "swiglu", "llama3.1/README_405b.md"),
    "Llama 3 70B": (80, 8192, 64, 8, 28672, 128256, 8192, 70.6, "swiglu", "maxtext/README_70b.md"),
}
# the recompute each recipe's config sets (dgxc v25.02 llama3.1/llama3.1_70b.yaml and llama3.1_405b.yaml,
# nemotron/nemotron4-15b-synth.yaml: activations_checkpoint_granularity null; nemotron4-340b-synth.yaml: selective);
# Megatron-Bridge's table states none, so its rows search it
RECOMPUTE = {"llama3.1/README_70b.md": "none", "llama3.1/README_405b.md": "none", "nemotron/README_15b.md": "none",
             "nemotron/README_340b.md": "selective"}
# the optimizer states each recipe's config sets (planner --optimizer-states): nemotron4-340b-synth.yaml runs apex
# distributed_fused_adam with dtype bf16 (bf16 master and moments) and grad_sync_dtype bf16; llama3.1_70b.yaml and
# llama3.1_405b.yaml grad_sync_dtype bf16 (fp32 master and moments); nemotron4-15b-synth.yaml the defaults
# (mcore_distributed_optim); Megatron-Bridge's performance recipes grad_reduce_in_fp32=False
# (perf_recipes/_common.py _benchmark_common)
STATES = {"nemotron/README_340b.md": "grad=bf16,master=bf16,moments=bf16", "llama3.1/README_70b.md": "grad=bf16",
          "llama3.1/README_405b.md": "grad=bf16", BRIDGE: "grad=bf16"}
MAXTEXT = [  # GPUs, precision, step seconds (per-device batch 2, GBS = 2 x GPUs)
    (128, "BF16", 15.563), (2048, "BF16", 15.898), (128, "FP8", 9.074), (2048, "FP8", 9.339),
]
ROWS = [  # model, GPUs, GBS, tp, pp, cp, vp, mbs, precision, step seconds (, source when not dgxc)
    ("Llama 3.1 70B", 64, 128, 4, 4, 2, 5, 1, "BF16", 14.61),
    ("Llama 3.1 70B", 2048, 4096, 4, 4, 2, 5, 1, "BF16", 14.84),
    ("Llama 3.1 70B", 64, 128, 4, 4, 2, 5, 1, "FP8", 10.46),
    ("Llama 3.1 70B", 2048, 4096, 4, 4, 2, 5, 1, "FP8", 10.99),
    ("Nemotron-4 15B", 16, 64, 4, 1, 1, None, 4, "BF16", 2.812),
    ("Nemotron-4 15B", 2048, 8192, 4, 1, 1, None, 4, "BF16", 2.887),
    ("Nemotron-4 15B", 16, 64, 4, 1, 1, None, 4, "FP8", 2.039),
    ("Nemotron-4 15B", 2048, 8192, 4, 1, 1, None, 4, "FP8", 2.12),
    ("Nemotron-4 340B", 128, 32, 8, 8, 1, 12, 1, "BF16", 4.61),
    ("Nemotron-4 340B", 2048, 512, 8, 8, 1, 12, 1, "BF16", 4.84),
    ("Nemotron-4 340B", 128, 32, 8, 8, 1, 12, 1, "FP8", 3.16),
    ("Nemotron-4 340B", 2048, 512, 8, 8, 1, 12, 1, "FP8", 3.49),
    # README_405b.md's table: the 576-2304 GPU columns (GBS = DP x GA 63, from tokens/s x step / 8192); its 32-192
    # GPU columns cannot hold TP 8 x PP 9 x CP 2 = 144 GPUs and are left out
    ("Llama 3.1 405B", 576, 252, 8, 9, 2, 7, 1, "BF16", 17.50),
    ("Llama 3.1 405B", 2304, 1008, 8, 9, 2, 7, 1, "BF16", 17.70),
    ("Llama 3.1 405B", 576, 252, 8, 9, 2, 7, 1, "FP8", 11.00),
    ("Llama 3.1 405B", 2304, 1008, 8, 9, 2, 7, 1, "FP8", 11.20),
    ("Llama 3.1 70B", 64, 128, 4, 8, 1, 5, 1, "FP8", 128 * 8192 / (1602 * 64), BRIDGE),
    ("Llama 3.1 405B", 1024, 512, 8, 8, 2, 8, 1, "FP8", 512 * 8192 / (292 * 1024), BRIDGE),
]


def row(model, n, gbs, tp, pp, cp, vp, mbs, precision, step, source=None) -> dict:
    layers, h, heads, kv, ffn, vocab, seq, params, mlp, path = MODELS[model]
    return {
        "id": f"{'bridge' if source else 'dgxc'}-{model.split()[0].lower()}-{model.split()[-1]}-{precision.lower()}-{n}gpu",
        "record_type": "throughput_run", "source": source or SOURCE.format(path=path),
        "source_locator": "Expected Performance table", "model_name": model, "model_family": model.split()[0],
        "architecture": "dense", "params_b": params, "num_layers": layers, "hidden_size": h,
        "num_attention_heads": heads, "num_kv_heads": kv, "ffn_hidden_size": ffn, "vocab_size": vocab,
        "seq_length": seq, "gpu_type": "H100 80GB SXM (DGX-H100)", "gpu_memory_gb": 80, "total_gpus": n,
        "gpus_per_node": 8, "tp": tp, "pp": pp, "dp": n // (tp * pp * cp), "vpp": vp, "cp": cp, "zero_stage": 1,
        "micro_batch_size": mbs, "global_batch_size": gbs,
        "activation_recomputation": None if source else RECOMPUTE.get(path),
        "sequence_parallel": tp > 1, "precision": precision, "framework": "NeMo/Megatron-Core (recipe)",
        "iteration_time_s": step, "optimizer_states": STATES.get(source or path, ""),
    }


MAXTEXT_FSDP_GPUS = 128  # maxtext/configure.sh: ici FSDP within 16 nodes of 8 GPUs, dcn data parallelism across


def maxtext_row(n, precision, step) -> dict:
    r = row("Llama 3 70B", n, 2 * n, 1, 1, 1, None, 2, precision, step)
    r.update(id=f"maxtext-llama3-70B-{precision.lower()}-{n}gpu", framework="MaxText (JAX)", zero_stage=3, fsdp=True,
             vpp=None, sequence_parallel=False, activation_recomputation="full (remat_policy save_qkv_proj)")
    return r


def _as_run(case: Case, r: dict) -> Case:
    """The case as its recipe ran it where the published rows' format cannot say so: MaxText's FSDP within 16 nodes
    and DP across them, and the optimizer state dtypes a NeMo recipe sets."""
    if r["id"].startswith("maxtext") and r["total_gpus"] > MAXTEXT_FSDP_GPUS:  # FSDP within 16 nodes, DP across
        case = replace(case, layout_fields={**case.layout_fields, "dp_shard": MAXTEXT_FSDP_GPUS})
    states = parse_optimizer_states(r.get("optimizer_states"))
    if states:  # the published set's rows print no optimizer dtype: the harness builds the default
        training = TrainingSpec.model_validate({**case.training.model_dump(), **states})
        case = replace(case, training=training)
    return case


def main() -> None:
    fitted = load_table()["fitted_knobs"]  # the shipped knobs, as `planner estimate` runs (validation fits them)
    table = load_table()
    print(f"{'row':34} {'layout':58} {'step s meas/pred':>18} {'err':>7} {'band (shipped)':>15}")
    errors: dict[str, list[float]] = {}
    for r in [row(*spec) for spec in ROWS] + [maxtext_row(*spec) for spec in MAXTEXT]:
        out = predicted(r, lambda case: case_knobs(case, fitted), width=34, prepare=lambda case, r=r: _as_run(case, r))
        if out is None:
            continue
        case, res = out
        errors.setdefault("MaxText" if r["id"].startswith("maxtext") else "NeMo", []).append(res.error)
        lay = res.layout
        text = (f"tp{lay.tp} pp{lay.pp} dp{lay.dp}{f'/{lay.dp_shard}' if lay.hybrid_sharded else ''} cp{lay.cp} "
                f"vp{lay.virtual_stages} mbs{lay.micro_batch_size} {lay.recompute}") if lay else ""
        print(f"{r['id']:34} {text:58} {case.measured_step_seconds:8.2f}/{res.predicted_step_seconds:<8.2f} "
              f"{res.error:+7.1%} {band_text(table, res):>15}{'' if res.fits else '  (judged OOM)'}")
    for stack, errs in errors.items():
        print(f"{stack}: median |error| {statistics.median(abs(e) for e in errs):.1%}, mean signed "
              f"{statistics.fmean(errs):+.1%} over {len(errs)} rows")


if __name__ == "__main__":
    main()
