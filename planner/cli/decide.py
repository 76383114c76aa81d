"""`planner compare` (one model on several clusters) and `planner scaling` (the best plan over node counts)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner import SCHEMA_VERSION, __version__
from planner.cli.app import app
from planner.cli.options import (
    DEFAULT_HEADROOM,
    BatchOpt,
    ClusterOpt,
    HeadroomOpt,
    JsonOpt,
    ModelOpt,
    PrecisionOpt,
    SeqOpt,
    emit_json,
    stderr,
    stdout,
)


@app.command()
def compare(
    clusters: Annotated[str, typer.Option("--clusters", help="CLUSTER:NODES[@PRICE],... e.g. "
                                                              "'dgx-a100-80gb:128,dgx-h100:64,dgx-h200:64@3.1'")],
    model: ModelOpt, global_batch_size: BatchOpt, seq_len: SeqOpt,
    precision: PrecisionOpt = None, headroom_gib: HeadroomOpt = DEFAULT_HEADROOM,
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
    from planner.estimate import build_problem
    from planner.search import PlanOptions

    check_run_options(tokens if tokens is not None else 1e12, gpu_hour_price, pue)
    choices = parse_clusters(clusters, gpu_hour_price)
    _check_figure(figure)
    result = run_compare(choices, lambda c, n: build_problem(c, n, model, global_batch_size, seq_len, precision,
                                                             headroom_gib),
                         PlanOptions(use_solver=not no_solver), tokens=tokens, pue=pue, band_for=step_time_band)
    if as_json:
        first = next(e for e in result.entries)
        emit_json({"schema_version": SCHEMA_VERSION, "tool_version": __version__, "kind": "compare",
                    "inputs": {"model": first.problem.model.model_dump(mode="json"),
                               "training": first.problem.training.model_dump(mode="json")},
                    **compare_json(result)})
    else:
        for line in render_lines(result, _compare_title(result, global_batch_size, seq_len)):
            stdout().print(line, highlight=False, markup=False, soft_wrap=True)
    if figure is not None:
        from planner.explain.figures import comparison_figure

        comparison_figure(result, figure, _compare_title(result, global_batch_size, seq_len))
        stderr().print(f"wrote {figure}")


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
    precision: PrecisionOpt = None, headroom_gib: HeadroomOpt = DEFAULT_HEADROOM,
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
    from planner.estimate import build_problem
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
        emit_json({"schema_version": SCHEMA_VERSION, "tool_version": __version__, "kind": "scaling",
                    "inputs": {"cluster": first.cluster.model_dump(mode="json"),
                               "model": first.model.model_dump(mode="json"), "seq_length": seq_len},
                    **scaling_json(curves, budget, tokens is not None)})
    else:
        for line in render_lines(curves, budget, tokens is not None, title):
            stdout().print(line, highlight=False, markup=False, soft_wrap=True)
    if figure is not None:
        from planner.explain.figures import scaling_figure

        scaling_figure(curves, figure, title)
        stderr().print(f"wrote {figure}")
