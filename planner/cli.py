"""The `planner` command line. Each command is thin: parse -> library call -> render.

Heavy imports (pydantic models, pulp, torch) happen inside commands, so `planner --help` stays fast and
never imports torch or pulp. With --json, stdout holds exactly one JSON document; everything else goes to
stderr. `main()` is the one place that maps errors to exit codes (listed in planner/errors.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from planner import SCHEMA_VERSION, __version__
from planner.defaults import DEFAULT_HEADROOM_GIB

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  help="Plan, predict and check the parallel layout of large transformer training.")
clusters_app = typer.Typer(no_args_is_help=True, help="Cluster presets.")
models_app = typer.Typer(no_args_is_help=True, help="Model presets and model files.")
app.add_typer(clusters_app, name="clusters")
app.add_typer(models_app, name="models")

JsonOpt = Annotated[bool, typer.Option("--json", help="Write exactly one JSON document to stdout.")]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="Cluster preset name or YAML/JSON file.")]
NodesOpt = Annotated[int | None, typer.Option("--nodes", "-n", help="Scale the cluster to this many nodes.")]
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Model preset, model YAML/JSON, or HF config.json.")]
BatchOpt = Annotated[int, typer.Option("--global-batch-size", "-b", help="Sequences per optimizer step.")]
SeqOpt = Annotated[int, typer.Option("--seq-len", "-s", help="Sequence length in tokens.")]
PrecisionOpt = Annotated[str | None, typer.Option("--precision", help="bf16, fp16, fp32 or fp8 (FP8 GEMMs, TE current "
                                                                       "scaling; default: bf16, or fp16 on a GPU "
                                                                       "without bf16 such as V100).")]
HeadroomOpt = Annotated[float, typer.Option("--headroom-gib", help="GPU memory kept free on top of the model.")]
CalibrationOpt = Annotated[Path | None, typer.Option("--calibration", help="Calibration file from `planner calibrate`.")]
FrameworkOpt = Annotated[str | None, typer.Option(
    "--framework", help="megatron, nemo, torchtitan, deepspeed, megatron-deepspeed or generic: only what it can run "
                        "(default: plan/estimate generic; export the plan's; check the config's).")]
FixOpt = Annotated[list[str] | None, typer.Option("--fix", help="Pin layout keys, e.g. tp=8 or 'pp=4,zero=1' (repeatable).")]
SchedulesOpt = Annotated[str | None, typer.Option("--schedules", help="Allowed pipeline schedules, e.g. 1f1b,interleaved_1f1b.")]


def _stdout():
    from rich.console import Console

    return Console()


def _stderr():
    from rich.console import Console

    return Console(stderr=True)


def _emit_json(doc) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj):
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def write_atomically(path: Path, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    import os
    import tempfile

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def version_callback(value: bool):
    if value:
        if "--json" in sys.argv:
            _emit_json({"tool_version": __version__, "schema_version": SCHEMA_VERSION})
        else:
            print(f"planner {__version__} (schema {SCHEMA_VERSION})")
        raise typer.Exit()


@app.callback()
def root(version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True,
                                               help="Print the version and exit (with --json: as JSON).")] = False,
         as_json: Annotated[bool, typer.Option("--json", hidden=True, help="With --version.")] = False):
    """Plan, predict and check DP x TP x PP x ZeRO layouts for transformer training."""


# ---------------------------------------------------------------------------------------------------
# clusters / models
# ---------------------------------------------------------------------------------------------------


@clusters_app.command("list")
def clusters_list(as_json: JsonOpt = False):
    """List the cluster presets."""
    from cluster_specs import cluster_names, load_cluster

    specs = [load_cluster(n) for n in cluster_names()]
    if as_json:
        _emit_json([{"name": s.name, "description": s.description, "gpu": s.gpu, "gpus_per_node": s.gpus_per_node}
                    for s in specs])
        return
    from rich.table import Table

    table = Table(title="Cluster presets (scale any with --nodes N)")
    for col in ("name", "GPU", "GPUs/node", "inside a node", "between nodes"):
        table.add_column(col)
    for s in specs:
        net = s.inter_node
        table.add_row(s.name, str(s.gpu), str(s.gpus_per_node), f"{s.intra_node.kind} {s.intra_node.gb_per_s:g} GB/s",
                      f"{net.nics_per_node} x {net.nic_gbit_per_s:g} Gb/s {net.kind}" if net.nics_per_node else "-")
    _stdout().print(table)


@clusters_app.command("show")
def clusters_show(name: str, nodes: NodesOpt = None, as_json: JsonOpt = False):
    """Show a cluster preset or file, with derived totals."""
    from cluster_specs import load_cluster

    spec = load_cluster(name, nodes=nodes)
    gpu = spec.gpu_spec()
    hw = spec.to_cost_model()
    doc = {"cluster": spec.model_dump(mode="json"), "gpu": gpu.model_dump(mode="json"),
           "derived": {"num_gpus": spec.num_gpus, "gpu_memory_bytes": gpu.memory_bytes,
                       "intra_node_bytes_per_second": hw.intra_node.bandwidth_bytes_per_second if hw.intra_node else None,
                       "node_network_bytes_per_second": hw.nic.bandwidth_bytes_per_second * hw.nics_per_node if hw.nic else None}}
    if as_json:
        _emit_json(doc)
        return
    from planner.explain.report import kv_table

    net = spec.inter_node
    _stdout().print(kv_table(f"{spec.name}: {spec.description}", [
        ("GPUs", f"{spec.num_nodes} nodes x {spec.gpus_per_node} {gpu.name} = {spec.num_gpus}"),
        ("GPU memory", f"{gpu.memory_gib:g} GiB"),
        ("dense peak", ", ".join(f"{k} {v:g} TFLOP/s" for k, v in gpu.tflops.items())),
        ("inside a node", f"{spec.intra_node.kind}, {spec.intra_node.gb_per_s:g} GB/s per GPU per direction "
                          f"(x{spec.intra_node.efficiency:g} achievable)"),
        ("between nodes", f"{net.nics_per_node} x {net.nic_gbit_per_s:g} Gb/s {net.kind} (x{net.efficiency:g})"
         if net.nics_per_node else "none"),
        ("host memory", f"{spec.host_memory_gib:g} GiB per node"),
    ]))


@models_app.command("list")
def models_list(as_json: JsonOpt = False):
    """List the model presets with their derived parameter counts."""
    from planner.inputs.models import load_model, model_names

    specs = [load_model(n) for n in model_names()]
    if as_json:
        _emit_json([{"name": s.name, "parameters": s.parameter_counts()["total"], "source": s.source} for s in specs])
        return
    from rich.table import Table

    from planner.explain.report import count

    table = Table(title="Model presets")
    for col in ("name", "parameters", "layers", "hidden", "heads (kv)", "vocab"):
        table.add_column(col)
    for s in specs:
        table.add_row(s.name, count(s.parameter_counts()["total"]), str(s.num_layers), str(s.hidden_size),
                      f"{s.num_attention_heads} ({s.kv_heads})", str(s.vocab_size))
    _stdout().print(table)


@models_app.command("show")
def models_show(name: str, as_json: JsonOpt = False):
    """Show a model (preset, spec file or HF config.json) and its parameter count per part."""
    from planner.inputs.models import load_model

    spec = load_model(name)
    counts = spec.parameter_counts()
    if as_json:
        _emit_json({"model": spec.model_dump(mode="json"), "parameters": counts})
        return
    from planner.explain.report import count, kv_table

    rows = [("parameters", f"{counts['total']:,} ({counts['total'] / 1e9:.2f}e9)"),
            ("shape", f"{spec.num_layers} layers, h={spec.hidden_size}, {spec.num_attention_heads} heads "
                      f"({spec.kv_heads} KV), ffn={spec.ffn}, vocab={spec.vocab_size}"),
            ("kind", f"{spec.mlp} MLP, {spec.norm}, {spec.attention} attention, {spec.position_embedding} positions, "
                     f"{'tied' if spec.tied_embeddings else 'untied'} embeddings")]
    rows += [(k.replace("_", " "), count(v)) for k, v in counts.items() if k != "total"]
    if spec.source:
        rows.append(("source", spec.source))
    _stdout().print(kv_table(spec.name, rows))


# ---------------------------------------------------------------------------------------------------
# estimate
# ---------------------------------------------------------------------------------------------------


def build_problem(cluster: str, nodes: int | None, model: str, global_batch_size: int, seq_len: int,
                  precision: str | None = None, headroom_gib: float | None = None, calibration: Path | None = None):
    from pydantic import ValidationError

    from cluster_specs import load_cluster
    from cluster_specs.errors import from_pydantic
    from planner.inputs.models import load_model
    from planner.inputs.specs import TrainingSpec
    from planner.problem import Problem

    cl = load_cluster(cluster, nodes=nodes)
    md = load_model(model)
    if precision is None:
        gpu = cl.gpu_spec()
        precision = gpu.default_precision()
        if precision != "bf16":
            _stderr().print(f"note: {gpu.name} has no bf16 tensor peak: using --precision {precision}", highlight=False)
    try:
        tr = TrainingSpec(global_batch_size=global_batch_size, seq_length=seq_len, precision=precision)
    except ValidationError as exc:
        raise from_pydantic(exc, source="training setup") from None
    from planner.calibration import calibration_knobs

    knobs_kw = calibration_knobs(cl)  # a cluster file written by `planner calibrate` carries its fitted knobs
    if calibration is not None:
        from planner.calibration import apply_calibration

        cl, knobs_kw = apply_calibration(cl, calibration)
    from cluster_specs.limits import finite_option
    from cost_models.inputs import Knobs

    headroom = finite_option("--headroom-gib", DEFAULT_HEADROOM_GIB if headroom_gib is None else headroom_gib)
    knobs = Knobs(memory_headroom_bytes=headroom * 2**30, **knobs_kw)
    return Problem(md, tr, cl, knobs)


@app.command()
def estimate(
    cluster: ClusterOpt, model: ModelOpt, global_batch_size: BatchOpt, seq_len: SeqOpt,
    layout: Annotated[str, typer.Option("--layout", "-l", help="e.g. 'tp=8,pp=8,dp=16,zero=1,mbs=1,recompute=selective,"
                                                            "schedule=1f1b', or a plan JSON file.")],
    nodes: NodesOpt = None, precision: PrecisionOpt = None, headroom_gib: HeadroomOpt = DEFAULT_HEADROOM_GIB,
    allow_tp_across_nodes: Annotated[bool, typer.Option(help="Allow TP groups larger than a node.")] = False,
    calibration: CalibrationOpt = None, framework: FrameworkOpt = None, as_json: JsonOpt = False,
):
    """Predict step time, throughput, MFU and memory per GPU for one layout."""
    from planner.contract import EstimateDocument
    from planner.estimate import estimate_layout, layout_from_arg

    problem = build_problem(cluster, nodes, model, global_batch_size, seq_len, precision, headroom_gib, calibration)
    lay = layout_from_arg(layout, problem)
    from planner.frameworks.capabilities import refuse_unrunnable

    fw = refuse_unrunnable(framework, lay, problem.model)
    doc = EstimateDocument.from_estimate(problem, lay, estimate_layout(problem, lay,
                                                                       allow_tp_across_nodes=allow_tp_across_nodes),
                                         framework=fw)
    if as_json:
        _emit_json(doc)
        return
    from planner.explain.report import render_estimate

    render_estimate(_stdout(), title=f"{problem.model.name} on {problem.cluster.num_gpus} x {problem.hardware.gpu_name}",
                    layout=lay, predicted=doc.predicted, memory=doc.memory_breakdown, time=doc.time_breakdown)


@app.command()
def plan(
    cluster: ClusterOpt, model: ModelOpt, global_batch_size: BatchOpt, seq_len: SeqOpt,
    nodes: NodesOpt = None, precision: PrecisionOpt = None, headroom_gib: HeadroomOpt = DEFAULT_HEADROOM_GIB,
    top: Annotated[int, typer.Option("--top", "-k", help="How many runners-up to show.")] = 5,
    objective: Annotated[str, typer.Option(help="throughput (max tokens/s), memory (min peak memory per GPU), "
                                                "or min-gpus (fewest nodes meeting --target-tokens-per-second).")] = "throughput",
    target_tokens_per_second: Annotated[float | None, typer.Option(help="For --objective min-gpus.")] = None,
    compare: Annotated[list[str] | None, typer.Option("--compare", help="Also estimate this layout (key=value string "
                                                                         "or plan JSON file, repeatable) and show it "
                                                                         "beside the pick.")] = None,
    allow_tp_across_nodes: Annotated[bool, typer.Option(help="Search TP groups larger than a node.")] = False,
    allow_async: Annotated[bool, typer.Option(help="Also search PipeDream's asynchronous 1F1B (stale weights).")] = False,
    no_solver: Annotated[bool, typer.Option("--no-solver", help="Skip the ILP refinement.")] = False,
    solver_time_limit: Annotated[float, typer.Option(help="Seconds per ILP solve.")] = 10.0,
    no_schedule: Annotated[bool, typer.Option("--no-schedule", help="Do not draw the pick's pipeline schedule.")] = False,
    calibration: CalibrationOpt = None, framework: FrameworkOpt = None, fix: FixOpt = None,
    schedules: SchedulesOpt = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the plan JSON here (atomically).")] = None,
    tokens: Annotated[float | None, typer.Option("--tokens", help="Token budget to train (e.g. 15e12): report wall "
                                                                  "clock, GPU-hours, cost and energy.")] = None,
    gpu_hour_price: Annotated[float | None, typer.Option("--gpu-hour-price", help="Price per GPU-hour, for the "
                                                                                  "cost (with --tokens).")] = None,
    pue: Annotated[float | None, typer.Option("--pue", help="Power usage effectiveness, to add facility energy "
                                                            "(with --tokens).")] = None,
    figures: Annotated[Path | None, typer.Option("--figures", help="Write memory per stage and time breakdown "
                                                                   "figures (PNG and SVG) into this folder; needs "
                                                                   "matplotlib: pip install 'planner[plots]'.")] = None,
    sensitivity: Annotated[bool, typer.Option("--sensitivity", help="Plan again under perturbed inputs (bandwidth, "
                                                                   "matmul efficiency, error band, one node fewer): "
                                                                   "does the pick survive? Names ties.")] = False,
    as_json: JsonOpt = False,
):
    """Choose the layout to run: search, solve, explain."""
    from cluster_specs import SpecError
    from planner.search import PlanOptions
    from planner.search import plan as make_plan

    if objective not in ("throughput", "memory", "min-gpus"):
        raise SpecError(f"--objective: {objective!r} -> allowed: throughput, memory, min-gpus")
    if top < 0:
        raise SpecError(f"--top: {top} -> must be >= 0")
    from cluster_specs.limits import finite_option

    finite_option("--solver-time-limit", solver_time_limit, low_inclusive=False)
    from planner.decisions.plan_extras import PlanExtras, extend

    extras = PlanExtras(tokens=tokens, price_per_gpu_hour=gpu_hour_price, pue=pue, objective=objective,
                        sensitivity=sensitivity, command=_plan_command(), figures=figures)
    extras.check()
    problem = build_problem(cluster, nodes, model, global_batch_size, seq_len, precision, headroom_gib, calibration)
    from planner.frameworks.restriction import build_restriction

    restriction = build_restriction(framework, problem.model.vocab_size, fix, schedules)
    opts = PlanOptions(top_k=top, objective="throughput" if objective == "min-gpus" else objective,
                       allow_tp_across_nodes=allow_tp_across_nodes, allow_async=allow_async, use_solver=not no_solver,
                       solver_time_limit_seconds=solver_time_limit, progress=not as_json and sys.stderr.isatty(),
                       restriction=restriction)
    min_gpus_note = None
    if objective == "min-gpus":
        from planner.search import plan_min_gpus

        if not target_tokens_per_second or target_tokens_per_second <= 0:
            raise SpecError("--target-tokens-per-second: required (> 0) with --objective min-gpus")
        problem, min_gpus_note = plan_min_gpus(problem, opts, target_tokens_per_second)
    from planner.contract import PlanDocument
    from planner.estimate import layout_from_arg
    from planner.search import add_compared

    compared = [layout_from_arg(text, problem, "--compare") for text in compare or []]
    result = add_compared(problem, make_plan(problem, opts), compared)
    doc = PlanDocument.from_result(problem, result, objective=objective, framework=restriction.caps.framework,
                                   notes=[min_gpus_note] if min_gpus_note else None)
    extend(doc, problem, result, extras, opts)
    if output is not None:
        write_atomically(output, doc.model_dump_json(indent=2) + "\n")
    if as_json:
        _emit_json(doc)
        return
    from planner.explain.report import render_plan

    render_plan(_stdout(), doc, show_schedule=not no_schedule)
    for line in extras.lines:
        _stdout().print(line, highlight=False, markup=False, soft_wrap=True)
    if output is not None:
        _stderr().print(f"wrote {output}")


def _plan_command() -> str:
    """The plan command as typed, without the options that only shape the output."""
    import shlex

    drop = {"--sensitivity", "--json", "--no-schedule"}
    args, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "--output", "--figures"):
            skip = True
            continue
        if a not in drop:
            args.append(a)
    return shlex.join(["planner", *args])


@app.command()
def compare(
    clusters: Annotated[str, typer.Option("--clusters", help="CLUSTER:NODES[@PRICE],... e.g. "
                                                              "'dgx-a100-80gb:128,dgx-h100:64,dgx-h200:64@3.1'")],
    model: ModelOpt, global_batch_size: BatchOpt, seq_len: SeqOpt,
    precision: PrecisionOpt = "bf16", headroom_gib: HeadroomOpt = 2.0,
    tokens: Annotated[float | None, typer.Option("--tokens", help="Token budget (default: days per 1T tokens).")] = None,
    gpu_hour_price: Annotated[float | None, typer.Option("--gpu-hour-price", help="Price per GPU-hour for entries "
                                                                                  "without @PRICE.")] = None,
    pue: Annotated[float | None, typer.Option("--pue", help="Power usage effectiveness (facility energy).")] = None,
    no_solver: Annotated[bool, typer.Option("--no-solver", help="Skip the ILP refinement.")] = False,
    figure: Annotated[Path | None, typer.Option("--figure", help="Also draw the comparison (.png or .svg; needs "
                                                                 "matplotlib: pip install 'planner[plots]').")] = None,
    as_json: JsonOpt = False,
):
    """Plan one model and batch on several clusters; rank by time to train, cost per token, tokens/s per GPU."""
    from planner.decisions.compare import as_json as compare_json
    from planner.decisions.compare import compare as run_compare
    from planner.decisions.compare import parse_clusters, render_lines
    from planner.decisions.plan_extras import step_time_band
    from planner.decisions.train import check_run_options
    from planner.search import PlanOptions

    check_run_options(tokens if tokens is not None else 1e12, gpu_hour_price, pue)
    choices = parse_clusters(clusters, gpu_hour_price)
    _check_figure(figure)
    result = run_compare(choices, lambda c, n: build_problem(c, n, model, global_batch_size, seq_len, precision,
                                                             headroom_gib),
                         PlanOptions(use_solver=not no_solver), tokens=tokens, pue=pue, band_for=step_time_band)
    if as_json:
        first = next(e for e in result.entries)
        _emit_json({"schema_version": SCHEMA_VERSION, "tool_version": __version__, "kind": "compare",
                    "inputs": {"model": first.problem.model.model_dump(mode="json"),
                               "training": first.problem.training.model_dump(mode="json")},
                    **compare_json(result)})
    else:
        for line in render_lines(result, _compare_title(result, global_batch_size, seq_len)):
            _stdout().print(line, highlight=False, markup=False, soft_wrap=True)
    if figure is not None:
        from planner.explain.figures import comparison_figure

        comparison_figure(result, figure, _compare_title(result, global_batch_size, seq_len))
        _stderr().print(f"wrote {figure}")


def _check_figure(figure: Path | None) -> None:
    """Before any work: the suffix is .png/.svg and matplotlib is there (exit 3 / exit 6)."""
    if figure is not None:
        from planner.explain.figures import check_path, require_matplotlib

        check_path(figure)
        require_matplotlib()


def _compare_title(result, batch: int, seq: int) -> str:
    return f"{result.entries[0].problem.model.name}, batch {batch:,} x {seq:,} tokens, on {len(result.entries)} clusters"


def _int_list(text: str | None, option: str, limit: int = 1_000_000) -> list[int] | None:
    from cluster_specs import SpecError

    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecError(f"{option}: {text!r} -> comma-separated integers") from None
    if not values or any(not 1 <= v <= limit for v in values) or len(values) > 32:
        raise SpecError(f"{option}: {text!r} -> 1 to 32 integers, each between 1 and {limit:,}")
    return values


@app.command()
def scaling(
    cluster: ClusterOpt, model: ModelOpt, global_batch_size: BatchOpt, seq_len: SeqOpt,
    nodes: Annotated[int | None, typer.Option("--nodes", "-n", help="Centre of the default sweep: nodes/32 .. nodes*4.")] = None,
    node_counts: Annotated[str | None, typer.Option("--node-counts", help="Node counts to plan, e.g. 64,128,256.")] = None,
    batch_sizes: Annotated[str | None, typer.Option("--batch-sizes", help="Global batch sizes to sweep too, "
                                                                          "e.g. 1024,2048,4096.")] = None,
    precision: PrecisionOpt = "bf16", headroom_gib: HeadroomOpt = 2.0,
    tokens: Annotated[float | None, typer.Option("--tokens", help="Token budget (default: days per 1T tokens).")] = None,
    no_solver: Annotated[bool, typer.Option("--no-solver", help="Skip the ILP refinement.")] = False,
    figure: Annotated[Path | None, typer.Option("--figure", help="Also draw the curve (.png or .svg; needs "
                                                                 "matplotlib: pip install 'planner[plots]').")] = None,
    as_json: JsonOpt = False,
):
    """The best plan's tokens/s, MFU and time to train over node counts: where adding GPUs stops paying."""
    from cluster_specs import load_cluster
    from planner.decisions.scaling import as_json as scaling_json
    from planner.decisions.scaling import default_node_counts, render_lines, scaling_curves
    from planner.decisions.train import check_run_options
    from planner.search import PlanOptions

    check_run_options(tokens if tokens is not None else 1e12, None, None)
    _check_figure(figure)
    counts = _int_list(node_counts, "--node-counts") or default_node_counts(nodes or load_cluster(cluster).num_nodes)
    batches = _int_list(batch_sizes, "--batch-sizes", 10**8) or [global_batch_size]
    curves = scaling_curves(lambda n, b: build_problem(cluster, n, model, b, seq_len, precision, headroom_gib),
                            PlanOptions(use_solver=not no_solver), counts, batches)
    budget = tokens if tokens is not None else 1e12
    first = curves[0].points[0].problem
    title = (f"Scaling: {first.model.name}, {seq_len}-token sequences, on {first.cluster.name} "
             f"({first.cluster.gpus_per_node} x {first.hardware.gpu_name} per node)")
    if as_json:
        _emit_json({"schema_version": SCHEMA_VERSION, "tool_version": __version__, "kind": "scaling",
                    "inputs": {"cluster": first.cluster.model_dump(mode="json"),
                               "model": first.model.model_dump(mode="json"), "seq_length": seq_len},
                    **scaling_json(curves, budget, tokens is not None)})
    else:
        for line in render_lines(curves, budget, tokens is not None, title):
            _stdout().print(line, highlight=False, markup=False, soft_wrap=True)
    if figure is not None:
        from planner.explain.figures import scaling_figure

        scaling_figure(curves, figure, title)
        _stderr().print(f"wrote {figure}")


@app.command()
def export(
    plan_file: Annotated[Path, typer.Argument(help="A plan JSON from `planner plan --json`/`-o`.")],
    to: Annotated[str | None, typer.Option("--to", help="megatron, nemo, megatron-deepspeed, deepspeed, torchtitan or "
                                                        "torchrun (default: the plan's --framework)")] = None,
    framework: FrameworkOpt = None,
    torchtitan_format: Annotated[str, typer.Option("--torchtitan-format", help="python (torchtitan 0.3 recipe "
                                                   "module) or toml (torchtitan <= 0.2)")] = "python",
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write here (atomically) instead of stdout.")] = None,
    program: Annotated[str | None, typer.Option(help="torchrun: the program to launch (default: the planner's "
                                                     "benchmark, given the plan path).")] = None,
    program_args: Annotated[str | None, typer.Option(help="torchrun: the program's arguments.")] = None,
):
    """Turn a plan into launch settings the framework accepts (the nearest expressible layout, or a refusal)."""
    from cluster_specs import SpecError, read_structured_file
    from planner.integrations.exports import export as make_export

    if torchtitan_format not in ("python", "toml"):
        raise SpecError(f"--torchtitan-format: {torchtitan_format!r} -> allowed: python, toml")
    doc = read_structured_file(plan_file)
    if not isinstance(doc, dict):
        raise SpecError("expected a plan JSON object", source=str(plan_file))
    result = make_export(doc, to, framework=framework, torchtitan_format=torchtitan_format, program=program,
                         program_args=program_args, plan_path=str(plan_file))
    err = _stderr()
    for line in result.notes:
        err.print(f"note: {line}", highlight=False, markup=False)
    if output is not None:
        write_atomically(output, result.text)
        err.print(f"wrote {output}")
    else:
        sys.stdout.write(result.text)


@app.command()
def check(
    configs: Annotated[list[Path], typer.Argument(help="Configs: plan JSON, DeepSpeed JSON (HF \"auto\" too), "
                                                      "torchtitan TOML or Python recipe, Megatron arguments or launch "
                                                      "script, Megatron-Bridge overrides. Several are checked in turn.")],
    cluster: ClusterOpt, model: ModelOpt, nodes: NodesOpt = None,
    global_batch_size: Annotated[int | None, typer.Option("--global-batch-size", "-b",
                                                          help="When the config does not say (fills HF \"auto\").")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", "-s", help="When the config does not say.")] = None,
    tp: Annotated[int | None, typer.Option("--tp", help="The tensor-parallel degree, where the config does not say "
                                                        "(DeepSpeed JSON).")] = None,
    pp: Annotated[int | None, typer.Option("--pp", help="The pipeline degree, where the config does not say "
                                                        "(DeepSpeed JSON: the model's PipelineModule).")] = None,
    fix: FixOpt = None, framework: FrameworkOpt = None,
    precision: PrecisionOpt = None, headroom_gib: HeadroomOpt = DEFAULT_HEADROOM_GIB,
    allow_tp_across_nodes: Annotated[bool, typer.Option(help="Accept TP groups larger than a node.")] = False,
    calibration: CalibrationOpt = None, as_json: JsonOpt = False,
):
    """Check configs in CI: framework rules, degrees, divisibility, batch arithmetic, schedules, model, memory.

    Exit 0: every config passes; 1: a violation; 3: a config could not be checked (3 wins over 1)."""
    import argparse

    from cluster_specs import SpecError
    from planner.frameworks.capabilities import parse_framework
    from planner.integrations.check import check_file

    if framework is not None:
        framework = parse_framework(framework).value
    args = argparse.Namespace(cluster=cluster, nodes=nodes, model=model, global_batch_size=global_batch_size,
                              seq_len=seq_len, tp=tp, pp=pp, fix=fix, framework=framework, precision=precision,
                              headroom_gib=headroom_gib, allow_tp_across_nodes=allow_tp_across_nodes,
                              calibration=calibration)
    reports = []
    for path in configs:
        head = {"schema_version": SCHEMA_VERSION, "tool_version": __version__, "kind": "check"}
        try:
            reports.append({**head, **check_file(path, args)})
        except SpecError as exc:
            if len(configs) == 1 and not as_json:
                raise
            reports.append({**head, "config": str(path), "format": None, "framework": framework, "layout": None,
                            "passed": False, "violations": [], "predicted": None, "notes": [],
                            "error": str(exc).splitlines()[0] if str(exc) else "could not check"})
    code = 3 if any(r["error"] for r in reports) else 1 if any(not r["passed"] for r in reports) else 0
    if as_json:
        from planner.contract import CheckBatch, CheckReport

        typed = [CheckReport.model_validate(r) for r in reports]
        _emit_json(typed[0] if len(typed) == 1 else
                   CheckBatch(schema_version=SCHEMA_VERSION, tool_version=__version__, passed=code == 0,
                              exit_code=code, reports=typed))
    else:
        from planner.integrations.check import render_report

        for r in reports:
            render_report(_stdout(), r, several=len(reports) > 1)
    if code:
        raise typer.Exit(code)


@app.command()
def schema(which: Annotated[str, typer.Argument(help="plan, estimate, check or bench")] = "plan"):
    """Print the JSON Schema of a document (generated from planner/contract.py; `make schema` writes docs/schema/)."""
    from cluster_specs import SpecError
    from planner.contract import SCHEMAS, json_schema

    if which not in SCHEMAS:
        raise SpecError(f"schema: {which!r} -> allowed: {', '.join(SCHEMAS)}")
    _emit_json(json_schema(which))


@app.command()
def schedule(
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages.")] = 4,
    micro_batches: Annotated[int, typer.Option("--micro-batches", "-m", help="Micro-batches per step.")] = 8,
    schedule_name: Annotated[str, typer.Option("--schedule", help="naive, gpipe, 1f1b, interleaved_1f1b, zero_bubble, "
                                                                  "pipedream_async")] = "1f1b",
    virtual_stages: Annotated[int, typer.Option("--virtual-stages", "-v", help="For interleaved_1f1b.")] = 2,
    compare: Annotated[str | None, typer.Option(help="Comma-separated schedules drawn one under another.")] = None,
    width: Annotated[int | None, typer.Option(help="Columns for the timeline.")] = None,
    svg: Annotated[Path | None, typer.Option("--svg", help="Also save the drawing as SVG (rich's export).")] = None,
):
    """Draw pipeline schedules per stage: forward, backward, idle, with the bubble share and peak in-flight."""
    from rich.console import Console

    from cluster_specs import SpecError
    from planner.explain.schedule_view import render_timeline, schedule_timeline
    from planner.inputs.specs import SCHEDULES

    names = [s.strip() for s in compare.split(",")] if compare else [schedule_name]
    problems = [f"schedule: {n!r} -> allowed: {', '.join(SCHEDULES)}" for n in names if n not in SCHEDULES]
    if pp < 1 or micro_batches < 1 or virtual_stages < 1:
        problems.append("--pp, --micro-batches and --virtual-stages must be >= 1")
    if "interleaved_1f1b" in names and micro_batches % pp:
        problems.append(f"--micro-batches: {micro_batches} -> interleaved_1f1b needs a multiple of --pp ({pp})")
    if pp * micro_batches * virtual_stages > 20_000:
        problems.append("--pp x --micro-batches x --virtual-stages: too many operations to draw (max 20,000)")
    if problems:
        raise SpecError(problems)
    console = Console(record=svg is not None)
    for name in names:
        v = virtual_stages if name == "interleaved_1f1b" else 1
        tl = schedule_timeline(schedule=name, pp=pp, micro_batches=micro_batches, virtual_stages=v,
                               t_weight=1.0 if name == "zero_bubble" else None)
        extra = f", v={v}" if v > 1 else ""
        render_timeline(console, tl, title=f"{name}: pp={pp}, {micro_batches} micro-batches{extra} "
                                           "(forward 1, backward 2 time units)", width=width)
        console.print()
    if svg is not None:
        console.save_svg(str(svg), title="planner schedule")
        _stderr().print(f"wrote {svg}")


def _need_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        from planner.errors import MissingDependencyError

        raise MissingDependencyError(
            "torch is not installed: `pip install 'planner[bench]'` (torch==2.13.0) for bench and calibrate") from None


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
    calibration: CalibrationOpt = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the report JSON here (atomically).")] = None,
    as_json: JsonOpt = False,
):
    """Run the layout with torch.distributed (NCCL on GPUs, gloo on CPU) and compare with the prediction."""
    from cluster_specs import SpecError, load_cluster
    from planner.calibration import apply_calibration, calibration_knobs
    from planner.estimate import complete_layout
    from planner.inputs.layout_string import parse_layout_string
    from planner.inputs.models import load_model
    from planner.inputs.specs import TrainingSpec

    if dtype not in ("float32", "bfloat16"):
        raise SpecError(f"--dtype: {dtype!r} -> allowed: float32, bfloat16")
    if optimizer not in ("adamw", "sgd"):
        raise SpecError(f"--optimizer: {optimizer!r} -> allowed: adamw, sgd")
    if top < 1 or (top > 1 and plan_file is None):
        raise SpecError(f"--top: {top} -> needs a plan JSON and a value >= 1")
    if plan_file is not None:
        from planner.inputs.plan_file import load_plan

        parts = load_plan(plan_file)
        if parts.cluster is None:
            raise SpecError("inputs.cluster: missing (expected the output of `planner plan --json`)",
                            source=str(plan_file))
        lay, md, cl, doc = parts.layout, parts.model, parts.cluster, parts.doc
        seq = seq_len or parts.training.seq_length
    else:
        if not (cluster and model and layout):
            raise SpecError("give a plan JSON, or --cluster, --model and --layout")
        cl = load_cluster(cluster, nodes=nodes)
        md = load_model(model)
        seq = seq_len or 2048
        fields = parse_layout_string(layout)
        fields.setdefault("dp", dp or max(1, cl.num_gpus // (fields.get("tp", 1) * fields.get("pp", 1))))
        fields.setdefault("num_micro_batches", micro_batches or max(1, fields.get("pp", 1)))
        tr = TrainingSpec(global_batch_size=fields.get("micro_batch_size", 1) * fields["num_micro_batches"] * fields["dp"],
                          seq_length=seq)
        lay = complete_layout(fields, md, tr, cl)
    _need_torch()
    from planner.bench.session import BenchOptions, bench_one, fit_layout

    opts = BenchOptions(nproc=nproc, dp=dp, micro_batches=micro_batches, layers_per_stage=layers_per_stage,
                        hidden_size=hidden_size, vocab_size=vocab_size, steps=steps, warmup=warmup, dtype=dtype,
                        optimizer=optimizer, timeout_seconds=timeout)
    knobs_kw = calibration_knobs(cl)
    if calibration is not None:
        cl, knobs_kw = apply_calibration(cl, calibration)
    if top > 1:
        return _bench_shortlist(doc, top, md, seq, cl, knobs_kw, opts, output, save_calibration, as_json)
    report = bench_one(md, fit_layout(lay, opts), seq, cl, knobs_kw, opts)
    if report is None:  # not rank 0 of a torchrun job
        return
    if output is not None:
        write_atomically(output, json.dumps(report, indent=2) + "\n")
    if as_json:
        _emit_json(report)
        return
    _print_bench(report)
    if output is not None:
        _stderr().print(f"wrote {output}")


def _print_bench(doc: dict) -> None:
    from rich.table import Table

    from planner.inputs.specs import LayoutSpec

    lay = LayoutSpec.model_validate(doc["layout"])
    table = Table(title=f"Benchmark: {doc['model']['name']}, {lay.short()}, {doc['world_size']} ranks on "
                        f"{doc['device']} ({doc['optimizer']}, {doc['dtype']}); predicted on {doc['cluster']['name']}",
                  title_justify="left")
    for col in ("quantity", "predicted", "measured", "error"):
        table.add_column(col, justify="right" if col != "quantity" else "left")
    for r in doc["comparison"]["rows"]:
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        table.add_row(r["quantity"], f"{r['predicted']:.4g}", f"{r['measured']:.4g}", err)
    _stdout().print(table)
    for note in doc["comparison"].get("notes", []):
        _stdout().print(f"[dim]note: {note}[/dim]")


def _bench_shortlist(plan: dict, top: int, md, seq: int, cl, knobs_kw: dict, opts, output, save_calibration,
                     as_json: bool) -> None:
    """`bench --top K`: run the pick and its runners-up, say which to launch, write the calibration."""
    import yaml

    from planner.bench.session import bench_one, fit_shortlist
    from planner.bench.shortlist import calibration_document, decide, shortlist
    from planner.inputs.specs import LayoutSpec

    entries, rule = shortlist(plan, top)
    entries, layouts, skipped = fit_shortlist(entries, opts)  # refuse or skip before running anything
    docs = [bench_one(md, lay, seq, cl, knobs_kw, opts) for lay in layouts]
    if docs[0] is None:
        return
    results = [{"layout_short": LayoutSpec.model_validate(e["layout"]).short(), "role": e["role"],
                "plan_predicted_step_seconds": e["predicted_step_seconds"],
                "predicted": d["comparison"]["predicted_step_seconds"],
                "measured": d["comparison"]["measured_step_seconds"]} for e, d in zip(entries, docs, strict=True)]
    for r in results:
        r["error"] = (r["predicted"] - r["measured"]) / r["measured"]
    summary = {"kind": "bench-shortlist", "rule": rule, "results": results, "decision": decide(results),
               "skipped": skipped, "runs": docs}
    if save_calibration is not None:
        cal = calibration_document(docs[0]["cluster"], knobs_kw, results, source=rule)
        write_atomically(save_calibration, "# Written by `planner bench --top`: use as `plan --calibration FILE`.\n"
                         + yaml.safe_dump(cal, sort_keys=False))
        summary["calibration_file"] = str(save_calibration)
    if output is not None:
        write_atomically(output, json.dumps(summary, indent=2) + "\n")
    if as_json:
        _emit_json(summary)
        return
    from rich.table import Table

    table = Table(title=f"Short list ({rule})", title_justify="left")
    for col in ("layout", "role", "predicted s", "measured s", "error"):
        table.add_column(col, justify="left" if col in ("layout", "role") else "right")
    for r in results:
        table.add_row(r["layout_short"], r["role"], f"{r['predicted']:.4g}", f"{r['measured']:.4g}", f"{r['error']:+.1%}")
    _stdout().print(table)
    for line in skipped:
        _stdout().print(f"[dim]not run: {line}[/dim]")
    _stdout().print(f"launch: {summary['decision']['launch']} ({summary['decision']['reason']})", highlight=False)
    if save_calibration is not None:
        _stderr().print(f"wrote {save_calibration}")


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
    import yaml

    from cluster_specs import SpecError, load_cluster

    if nproc < 1:
        raise SpecError(f"--nproc: {nproc} -> must be >= 1")
    _need_torch()
    from planner.bench.calibrate import calibrate as measure
    from planner.bench.calibrate import model_gemms

    extra = None
    if model:
        from planner.inputs.models import load_model

        md = load_model(model)
        extra = model_gemms(tokens=micro_batch_size * seq_len, hidden=md.hidden_size, ffn=md.ffn, tp=tp,
                            kv_dim=md.kv_heads * md.hidden_size // md.num_attention_heads, vocab=md.vocab_size)
    top = int(max_message_mib * 2**20)
    messages = sorted({max(4096, top // 4**k) // 4 * 4 for k in range(4)})
    spec = measure(nproc=nproc, messages=messages, repeats=repeats, gpu_name=gpu, extra_gemms=extra)
    text = "# Written by `planner calibrate`: this machine, measured. Use as --cluster FILE or --calibration FILE.\n"
    text += yaml.safe_dump(spec, sort_keys=False)
    write_atomically(output, text)
    load_cluster(str(output))  # what was written loads back as a cluster
    if as_json:
        _emit_json(spec)
        return
    _print_calibration(output, nproc, spec)


def _print_calibration(output: Path, nproc: int, spec: dict) -> None:
    """The measured figures (never a catalog peak), how well the GEMM line fits, and how noisy it was."""
    s, n = spec["measured"]["summary"], spec["measured"]["noise"]
    link = "pinned host->device" if s["host_to_device_pinned"] else "host memory copy (no host-device link on CPU)"
    out = _stdout()
    out.print(f"wrote {output}: {nproc} x {s['device_name']} (torch {s['torch_version']}, {s['dtype']})", highlight=False)
    out.print(f"  GEMM {s['dtype']}: fitted peak {s['gemm_fitted_peak_tflops']:.3g} TFLOP/s; best measured "
              f"{s['gemm_best_tflops']:.3g} at {s['gemm_best_shape']}, smallest {s['gemm_smallest_tflops']:.3g} at "
              f"{s['gemm_smallest_shape']}; fit error median {s['gemm_fit_median_abs_error']:.0%}, max "
              f"{s['gemm_fit_max_abs_error']:.0%}", highlight=False)
    out.print(f"  memory copy {s['memory_copy_gb_per_s']:.3g} GB/s; {link} {s['host_to_device_gb_per_s']:.3g} GB/s; "
              f"all-reduce bus bandwidth {spec['intra_node']['gb_per_s']:.3g} GB/s, latency "
              f"{spec['intra_node']['latency_us']:.3g} µs", highlight=False)
    if s.get("layer_probes"):
        errs = ", ".join(f"{p['fit_error']:+.0%}" for p in s["layer_probes"] if p.get("fit_error") is not None)
        out.print(f"  layer probes (forward + backward of one layer, {len(s['layer_probes'])} sizes): x_half "
                  f"{s['x_half_gflop_used']:.3g} GFLOP (GEMM line alone: {s['x_half_gflop_gemm_line']:.3g}), "
                  f"end-to-end factor {s['end_to_end_efficiency']:.3g}; fit errors {errs}", highlight=False)
    if s.get("tp_probes"):
        out.print(f"  TP probe (the same layers at tp=2 over rank pairs): {s['tp_layer_overhead_seconds'] * 1e3:.3g} ms "
                  "per layer and micro-batch beyond the model's FLOPs and collectives", highlight=False)
    load = "-" if n["load_average"] is None else f"{n['load_average']:.1f}"
    out.print(f"  noise: repeats spread {n['median_spread']:.0%} (median), {n['max_spread']:.0%} (max); load average "
              f"{load} on {n['cores']} cores", highlight=False)
    for note in spec["measured"]["notes"]:
        if note.startswith(("the machine was busy", "noisy")):
            _stderr().print(f"warning: {note}", highlight=False)


@app.command()
def validate(
    runs: Annotated[Path, typer.Option("--runs", help="published_runs.json")] = Path("../shared/validation/published_runs.json"),
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the markdown report here.")] = None,
    with_planner: Annotated[bool, typer.Option(help="Also rank each published layout among the planner's.")] = True,
    as_json: JsonOpt = False,
):
    """Predict every published run the models can represent and compare with what was measured."""
    from planner.validation import load_rows, render_markdown, run_validation, summary

    report = run_validation(load_rows(runs))
    section = ""
    if with_planner:
        from planner.search import published_layout_ranks

        section = published_layout_ranks(report)
    if output is not None:
        write_atomically(output, render_markdown(report, runs_path=str(runs), planner_section=section))
    s = summary(report)
    if as_json:
        _emit_json(s)
        return
    _stderr().print(f"{s['rows_evaluated']} rows: median |error| {s['median_abs_error']:.1%}, "
                    f"90th pct {s['p90_abs_error']:.1%}, held-out median {s['held_out_median_abs_error']:.1%}, "
                    f"false OOM {s['false_out_of_memory']}" + (f"; wrote {output}" if output else ""))


def main() -> None:
    from planner.errors import exit_code_for

    try:
        app()
    except SystemExit:
        raise
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # the one place errors become exit codes
        code = exit_code_for(exc)
        if code is None:
            raise
        problems = getattr(exc, "problems", None) or [str(exc)]
        source = getattr(exc, "source", None)
        for line in problems:
            print(f"error: {source + ': ' if source else ''}{line}", file=sys.stderr)
        sys.exit(code)


if __name__ == "__main__":
    main()
