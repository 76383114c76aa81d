"""`planner estimate`, `plan`, `schedule`, `schema`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from planner.cli.app import app
from planner.cli.options import (
    DEFAULT_HEADROOM,
    BatchOpt,
    CalibrationOpt,
    ClusterOpt,
    CompileOpt,
    FixOpt,
    Fp8RecipeOpt,
    FrameworkOpt,
    HeadroomOpt,
    JsonOpt,
    MemoryMarginOpt,
    ModelOpt,
    NodesOpt,
    OptimizerStatesOpt,
    OutputOpt,
    PrecisionOpt,
    SchedulesOpt,
    SeqOpt,
    TpAcrossOpt,
    emit_json,
    problem_request,
    stdout,
    write_file,
)

LayoutOpt = Annotated[str, typer.Option("--layout", "-l", help="e.g. 'tp=8,pp=8,dp=16,zero=1,mbs=1,recompute=selective,"
                                                            "schedule=1f1b', or a plan JSON file.")]


@app.command()
def estimate(cluster: ClusterOpt, model: ModelOpt, global_batch_size: BatchOpt, seq_len: SeqOpt, layout: LayoutOpt,
             nodes: NodesOpt = None, precision: PrecisionOpt = None, headroom_gib: HeadroomOpt = DEFAULT_HEADROOM,
             allow_tp_across_nodes: TpAcrossOpt = False, calibration: CalibrationOpt = None,
             framework: FrameworkOpt = None, fp8_recipe: Fp8RecipeOpt = None,
             optimizer_states: OptimizerStatesOpt = None, compile_model: CompileOpt = False,
             as_json: JsonOpt = False) -> None:
    """Predict step time, throughput, MFU and memory per GPU for one layout."""
    from planner.requests import estimate_document

    req = problem_request(cluster, model, global_batch_size, seq_len, nodes, precision, headroom_gib, calibration,
                          fp8_recipe, optimizer_states, compile_model)
    doc = estimate_document(req, layout, framework=framework, allow_tp_across_nodes=allow_tp_across_nodes)
    if as_json:
        return emit_json(doc)
    from planner.explain.report import render_estimate_document

    render_estimate_document(stdout(), doc)


@app.command()
def plan(
    cluster: ClusterOpt, model: ModelOpt, global_batch_size: BatchOpt, seq_len: SeqOpt,
    nodes: NodesOpt = None, precision: PrecisionOpt = None, fp8_recipe: Fp8RecipeOpt = None,
    optimizer_states: OptimizerStatesOpt = None, compile_model: CompileOpt = False,
    headroom_gib: HeadroomOpt = DEFAULT_HEADROOM,
    top: Annotated[int, typer.Option("--top", "-k", help="How many runners-up to show.")] = 5,
    objective: Annotated[str, typer.Option(help="throughput (max tokens/s), memory (min peak memory per GPU), "
                                                "or min-gpus (fewest nodes meeting --target-tokens-per-second).")] = "throughput",
    target_tokens_per_second: Annotated[float | None, typer.Option(help="For --objective min-gpus.")] = None,
    compare: Annotated[list[str] | None, typer.Option("--compare", help="Also estimate this layout (key=value string "
                                                      "or plan JSON, repeatable) and show it beside the pick.")] = None,
    figures: Annotated[Path | None, typer.Option("--figures", readable=False, help="Write memory per stage and time breakdown "
                                                                   "figures (PNG and SVG) into this folder; needs "
                                                                   "matplotlib: pip install 'planner[plots]'.")] = None,
    sensitivity: Annotated[bool, typer.Option("--sensitivity", help="Plan again under perturbed inputs (bandwidth, "
                                                                   "matmul efficiency, error band, one node fewer): "
                                                                   "does the pick survive? Names ties.")] = False,
    allow_tp_across_nodes: TpAcrossOpt = False,
    allow_async: Annotated[bool, typer.Option(help="Also search PipeDream's asynchronous 1F1B (stale weights).")] = False,
    no_solver: Annotated[bool, typer.Option("--no-solver", help="Skip the ILP refinement.")] = False,
    solver_time_limit: Annotated[float, typer.Option(help="Seconds per ILP solve.")] = 10.0,
    no_schedule: Annotated[bool, typer.Option("--no-schedule", help="Do not draw the pick's pipeline schedule.")] = False,
    full_schedule: Annotated[bool, typer.Option("--full-schedule", help="Draw every stage and micro-batch of the "
                                                                        "pick's schedule, not the summary.")] = False,
    calibration: CalibrationOpt = None, framework: FrameworkOpt = None, fix: FixOpt = None,
    schedules: SchedulesOpt = None, output: OutputOpt = None,
    tokens: Annotated[float | None, typer.Option("--tokens", help="Token budget to train (e.g. 15e12): report wall "
                                                                  "clock, GPU-hours, cost and energy.")] = None,
    gpu_hour_price: Annotated[float | None, typer.Option("--gpu-hour-price", help="Price per GPU-hour, for the "
                                                                                  "cost (with --tokens).")] = None,
    pue: Annotated[float | None, typer.Option("--pue", help="Power usage effectiveness, to add facility energy "
                                                            "(with --tokens).")] = None,
    memory_margin: MemoryMarginOpt = "band-high",
    as_json: JsonOpt = False,
) -> None:
    """Choose the layout to run: search, solve, explain."""
    from planner.fileio import check_writable
    from planner.requests import PlanRequest, plan_command, plan_document

    check_writable(output)  # before --figures writes anything: a bad -o leaves no figures behind

    req = problem_request(cluster, model, global_batch_size, seq_len, nodes, precision, headroom_gib, calibration,
                          fp8_recipe, optimizer_states, compile_model)
    doc, lines = plan_document(req, PlanRequest(
        top=top, objective=objective, target_tokens_per_second=target_tokens_per_second, compare=compare or [],
        allow_tp_across_nodes=allow_tp_across_nodes, allow_async=allow_async, use_solver=not no_solver,
        solver_time_limit_seconds=solver_time_limit, framework=framework, fix=fix, schedules=schedules,
        tokens=tokens, gpu_hour_price=gpu_hour_price, pue=pue, sensitivity=sensitivity, figures=figures,
        command=plan_command(sys.argv[1:]), memory_margin=memory_margin),
        progress=not as_json and sys.stderr.isatty())
    write_file(output, doc.model_dump_json(indent=2) + "\n")
    if as_json:
        return emit_json(doc)
    from planner.explain.report import render_plan

    console = stdout()
    render_plan(console, doc, show_schedule=not no_schedule, full_schedule=full_schedule)
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


@app.command()
def schema(which: Annotated[str, typer.Argument(
        help="plan, estimate, check, check-batch, bench, compare, scaling, error, clusters, cluster, calibration, "
             "models, model, validation or version")] = "plan") -> None:
    """Print the JSON Schema of a document (generated from planner/contract.py; `make schema` writes docs/schema/)."""
    from planner.contract import json_schema

    emit_json(json_schema(which))


@app.command()
def schedule(
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages.")] = 4,
    micro_batches: Annotated[int, typer.Option("--micro-batches", "-m", help="Micro-batches per step.")] = 8,
    schedule_name: Annotated[str, typer.Option("--schedule", help="naive, gpipe, 1f1b, interleaved_1f1b, zero_bubble, "
                                                                  "pipedream_async")] = "1f1b",
    virtual_stages: Annotated[int, typer.Option("--virtual-stages", "-v", help="For interleaved_1f1b.")] = 2,
    compare: Annotated[str | None, typer.Option(help="Comma-separated schedules drawn one under another.")] = None,
    width: Annotated[int | None, typer.Option(help="Columns for the timeline (default: the terminal's).")] = None,
    svg: Annotated[Path | None, typer.Option("--svg", readable=False, help="Also save the drawing as SVG (atomically).")] = None,
) -> None:
    """Draw pipeline schedules per stage: forward, backward, idle, with the bubble share and peak in-flight."""
    from planner.explain.schedule_view import check_schedule_request, draw_schedules, recording_console

    names = [s.strip() for s in compare.split(",")] if compare else [schedule_name]
    check_schedule_request(names, pp=pp, micro_batches=micro_batches, virtual_stages=virtual_stages, width=width)
    console = recording_console(width) if svg is not None else stdout()
    draw_schedules(console, names, pp=pp, micro_batches=micro_batches, virtual_stages=virtual_stages, width=width)
    if svg is not None:
        write_file(svg, console.export_svg(title="planner schedule"))
