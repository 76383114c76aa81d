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
    need_torch,
    stderr,
    stdout,
    write_file,
)


@app.command()
def bench(
    plan_file: Annotated[Path | None, typer.Argument(help="A plan JSON (or give --cluster/--model/--layout).")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", "-c", help="Cluster preset or file (with --layout).")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m")] = None,
    layout: Annotated[str | None, typer.Option("--layout", "-l", help="Layout string, when no plan is given.")] = None,
    nodes: NodesOpt = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", "-s", help="Sequence length (default: the plan's).")] = None,
    nproc: Annotated[int | None, typer.Option("--nproc", help="Start this many local ranks (else: run under torchrun).")] = None,
    dp: Annotated[int | None, typer.Option("--dp", help="Override the data-parallel degree (to fit fewer GPUs).")] = None,
    micro_batches: Annotated[int | None, typer.Option("--micro-batches", help="Override micro-batches per step.")] = None,
    layers_per_stage: Annotated[int | None, typer.Option(help="Scale down: this many layers per pipeline stage.")] = None,
    hidden_size: Annotated[int | None, typer.Option(help="Scale down: this hidden size (heads and FFN follow).")] = None,
    vocab_size: Annotated[int | None, typer.Option(help="Scale down: this vocabulary.")] = None,
    steps: Annotated[int, typer.Option(help="Measured steps.")] = 3,
    warmup: Annotated[int, typer.Option(help="Warm-up steps.")] = 1,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    optimizer: Annotated[str, typer.Option(help="adamw (fp32 master weights and moments: the training recipe) or "
                                                "sgd (momentum; for numerics checks).")] = "adamw",
    top: Annotated[int, typer.Option("--top", help="With a plan: also run the runners-up within the plan's error "
                                                   "band, up to this many layouts in all.")] = 1,
    save_calibration: Annotated[Path | None, typer.Option(
        "--save-calibration", help="With --top: write the measured figures as a calibration file for "
                                   "`plan --calibration`.")] = None,
    timeout: Annotated[float, typer.Option(help="Process-group timeout in seconds: a stuck rank fails the run.")] = 120.0,
    calibration: CalibrationOpt = None, output: OutputOpt = None, as_json: JsonOpt = False,
):
    """Run the layout with torch.distributed (NCCL on GPUs, gloo on CPU) and compare with the prediction."""
    from cluster_specs import SpecError

    if dtype not in ("float32", "bfloat16"):
        raise SpecError(f"--dtype: {dtype!r} -> allowed: float32, bfloat16")
    if optimizer not in ("adamw", "sgd"):
        raise SpecError(f"--optimizer: {optimizer!r} -> allowed: adamw, sgd")
    if top < 1 or (top > 1 and plan_file is None):
        raise SpecError(f"--top: {top} -> needs a plan JSON and a value >= 1")
    need_torch()
    from planner.bench.session import BenchOptions, bench_one, bench_target, fit_layout
    from planner.calibration import calibrated

    plan_doc, md, cl, lay, seq = bench_target(plan_file=plan_file, cluster=cluster, model=model, layout=layout,
                                              nodes=nodes, seq_len=seq_len, dp=dp, micro_batches=micro_batches)
    opts = BenchOptions(nproc=nproc, dp=dp, micro_batches=micro_batches, layers_per_stage=layers_per_stage,
                        hidden_size=hidden_size, vocab_size=vocab_size, steps=steps, warmup=warmup, dtype=dtype,
                        optimizer=optimizer, timeout_seconds=timeout)
    cl, knobs_kw = calibrated(cl, calibration)
    if top > 1:
        from planner.bench.shortlist import run_shortlist

        assert plan_doc is not None  # --top > 1 needs a plan (checked above)
        doc = run_shortlist(plan_doc, top, md, seq, cl, knobs_kw, opts, save_calibration)
    else:
        doc = bench_one(md, fit_layout(lay, opts), seq, cl, knobs_kw, opts)
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
    output: Annotated[Path, typer.Option("-o", "--output", help="Cluster file to write (YAML).")] = Path("local.yaml"),
    model: Annotated[str | None, typer.Option("--model", "-m", help="Measure GEMMs at this model's shapes.")] = None,
    seq_len: Annotated[int, typer.Option("--seq-len", "-s")] = 2048,
    micro_batch_size: Annotated[int, typer.Option("--micro-batch-size")] = 1,
    tp: Annotated[int, typer.Option("--tp", help="GEMM shapes as sharded by this TP degree.")] = 1,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Catalog GPU this is (keeps its datasheet peak).")] = None,
    repeats: Annotated[int, typer.Option(help="Timed repetitions per measurement (median).")] = 5,
    max_message_mib: Annotated[float, typer.Option(help="Largest collective message.")] = 8.0,
    as_json: JsonOpt = False,
):
    """Measure this machine (GEMM FLOP/s, memory and collective bandwidth) and write a cluster file of it."""
    from cluster_specs import SpecError

    if nproc < 1:
        raise SpecError(f"--nproc: {nproc} -> must be >= 1")
    need_torch()
    from planner.bench.calibrate import calibrate_machine
    from planner.calibration import write_calibration_file

    spec = calibrate_machine(nproc=nproc, model=model, seq_len=seq_len, micro_batch_size=micro_batch_size, tp=tp,
                             gpu_name=gpu, repeats=repeats, max_message_mib=max_message_mib)
    write_calibration_file(output, spec)
    if as_json:
        return emit_json(spec)
    from planner.explain.report import render_calibration

    render_calibration(stdout(), stderr(), output, nproc, spec)


@app.command()
def validate(
    runs: Annotated[Path, typer.Option("--runs", help="published_runs.json")] = Path("../shared/validation/published_runs.json"),
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the markdown report here.")] = None,
    with_planner: Annotated[bool, typer.Option(help="Also rank each published layout among the planner's.")] = True,
    as_json: JsonOpt = False,
):
    """Predict every published run the models can represent and compare with what was measured."""
    from planner.validation import load_rows, render_markdown, run_validation, summary, write_band_table
    from planner.validation_vtrain import run_vtrain

    report = run_validation(load_rows(runs))
    vt = run_vtrain(report.knobs)
    if output is not None:
        from planner.search import published_layout_ranks

        section = published_layout_ranks(report) if with_planner else ""
        write_file(output, render_markdown(report, runs_path=str(runs), planner_section=section, vtrain=vt))
        write_band_table(report)
    s = summary(report)
    s["vtrain"] = {"rows": len(vt.results), "mean_abs_error": vt.mean_abs_error, "bias": vt.bias,
                   "regret": vt.regret, "false_out_of_memory": vt.false_oom}
    if as_json:
        return emit_json(s)
    stderr().print(f"{s['rows_evaluated']} rows: LOSO median |error| {s['loso_median_abs_error']:.1%}, 90th pct "
                   f"{s['loso_p90_abs_error']:.1%}, false OOM {s['false_out_of_memory']}; vTrain mean |error| "
                   f"{vt.mean_abs_error:.1%}, bias {vt.bias:+.1%}", highlight=False)
