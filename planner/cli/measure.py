"""`planner bench`, `calibrate` (torch, imported only here and lazily) and `validate`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from planner.cli.app import app
from planner.cli.options import (
    CalibrationOpt,
    JsonOpt,
    NodesOpt,
    OutputOpt,
    emit_json,
    stderr,
    stdout,
    write_file,
)


@app.command()
def bench(
    plan_file: Annotated[Path | None, typer.Argument(readable=False, help="A plan JSON (or give --cluster/--model/--layout).")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", "-c", help="Cluster preset or file (with --layout).")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m")] = None,
    layout: Annotated[str | None, typer.Option("--layout", "-l", help="Layout string, when no plan is given.")] = None,
    nodes: NodesOpt = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", "-s", min=1, help="Sequence length (default: the plan's).")] = None,
    nproc: Annotated[int | None, typer.Option("--nproc", help="Start this many local ranks (else: run under torchrun).")] = None,
    dp: Annotated[int | None, typer.Option("--dp", help="Override the data-parallel degree (to fit fewer GPUs).")] = None,
    micro_batches: Annotated[int | None, typer.Option("--micro-batches", help="Override micro-batches per step.")] = None,
    layers_per_stage: Annotated[int | None, typer.Option(min=1, help="Scale down: this many layers per pipeline stage.")] = None,
    hidden_size: Annotated[int | None, typer.Option(min=1, help="Scale down: this hidden size (heads and FFN follow).")] = None,
    vocab_size: Annotated[int | None, typer.Option(min=1, help="Scale down: this vocabulary.")] = None,
    steps: Annotated[int, typer.Option(min=1, help="Measured steps.")] = 3,
    warmup: Annotated[int, typer.Option(min=0, help="Warm-up steps.")] = 1,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    optimizer: Annotated[str, typer.Option(help="adamw (fp32 master weights and moments: the training recipe) or "
                                                "sgd (momentum; for numerics checks).")] = "adamw",
    optimizer_states: Annotated[str | None, typer.Option(
        "--optimizer-states", help="AdamW's moments below fp32, e.g. 'moments=bf16' or 'exp_avg=bf16,exp_avg_sq=fp16' "
                                   "(bf16 or fp16; the master copy stays fp32).")] = None,
    top: Annotated[int, typer.Option("--top", help="With a plan: also run the runners-up within the plan's error "
                                                   "band, up to this many layouts in all.")] = 1,
    save_calibration: Annotated[Path | None, typer.Option(
        "--save-calibration", readable=False, help="With --top: write the measured figures as a calibration file for "
                                   "`plan --calibration`.")] = None,
    timeout: Annotated[float, typer.Option(help="Process-group timeout in seconds: a stuck rank fails the run; "
                                                "the whole run is stopped after twice this + 30 s.")] = 120.0,
    framework: Annotated[str | None, typer.Option(
        "--framework", help="Whose 'selective' recompute to run and predict: torchtitan's per-op SAC, or Megatron's "
                            "attention core (every other framework); default: the plan's framework, else generic."
    )] = None,
    calibration: CalibrationOpt = None, output: OutputOpt = None, as_json: JsonOpt = False,
) -> None:
    """Run the layout with torch.distributed (NCCL on GPUs, gloo on CPU) and compare with the prediction."""
    from planner.bench.session import BenchOptions, bench_document

    opts = BenchOptions(nproc=nproc, dp=dp, micro_batches=micro_batches, layers_per_stage=layers_per_stage,
                        hidden_size=hidden_size, vocab_size=vocab_size, steps=steps, warmup=warmup, dtype=dtype,
                        optimizer=optimizer, optimizer_states=optimizer_states, timeout_seconds=timeout,
                        framework=framework)
    doc = bench_document(opts, plan_file=plan_file, cluster=cluster, model=model, layout=layout, nodes=nodes,
                         seq_len=seq_len, top=top, save_calibration=save_calibration, calibration=calibration)
    if doc is None:  # not rank 0 of a torchrun job
        return
    write_file(output, json.dumps(doc, indent=2) + "\n")
    if as_json:
        return emit_json(doc)
    from planner.explain.report import render_bench, render_shortlist

    (render_shortlist if top > 1 else render_bench)(stdout(), doc)


@app.command()
def calibrate(
    nproc: Annotated[int, typer.Option("--nproc", help="Ranks to measure at once (GPUs, or CPU processes).")] = 2,
    output: Annotated[Path, typer.Option("-o", "--output", readable=False, help="Cluster file to write (YAML).")] = Path("local.yaml"),
    model: Annotated[str | None, typer.Option("--model", "-m", help="Measure GEMMs at this model's shapes.")] = None,
    seq_len: Annotated[int, typer.Option("--seq-len", "-s", min=1)] = 2048,
    micro_batch_size: Annotated[int, typer.Option("--micro-batch-size", min=1)] = 1,
    tp: Annotated[int, typer.Option("--tp", min=1, help="GEMM shapes as sharded by this TP degree.")] = 1,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Catalog GPU this is (keeps its datasheet peak).")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Timed repetitions per measurement (median).")] = 5,
    max_message_mib: Annotated[float, typer.Option(help="Largest collective message.")] = 8.0,
    as_json: JsonOpt = False,
) -> None:
    """Measure this machine (GEMM FLOP/s, memory and collective bandwidth) and write a cluster file of it."""
    from cluster_specs.limits import finite_option
    from planner.requests import calibration_file

    max_message_mib = finite_option("--max-message-mib", max_message_mib, low=0.0, low_inclusive=False, high=65536.0)

    spec = calibration_file(output, nproc=nproc, model=model, seq_len=seq_len, micro_batch_size=micro_batch_size,
                            tp=tp, gpu_name=gpu, repeats=repeats, max_message_mib=max_message_mib)
    if as_json:  # the spec as the cost models read it (`planner schema calibration`)
        from cluster_specs import ClusterSpec

        return emit_json(ClusterSpec.model_validate(spec))
    from planner.explain.report import render_calibration

    render_calibration(stdout(), stderr(), output, nproc, spec)


@app.command()
def validate(
    runs: Annotated[Path, typer.Option("--runs", readable=False, help="published_runs.json")] = Path("../shared/validation/published_runs.json"),
    output: Annotated[Path | None, typer.Option("-o", "--output", readable=False, help="Write the markdown report here.")] = None,
    with_planner: Annotated[bool, typer.Option(help="Also rank each published layout among the planner's.")] = True,
    write_tables: Annotated[bool, typer.Option(
        "--write-tables", help="Also rewrite the tables the planner ships from this run (planner/data/error_bands.json, "
                               "ranking_band.json): `make validate` does, on the published set.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Predict every published run the models can represent and compare with what was measured."""
    from planner.requests import validation_summary

    summary, markdown, line = validation_summary(runs, with_planner=with_planner, report=output is not None,
                                                 write_tables=write_tables)
    write_file(output, markdown)
    emit_json(summary) if as_json else stderr().print(line, highlight=False, markup=False)
