"""`planner compare` (one model on several clusters) and `planner scaling` (the best plan over node counts)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner.cli.app import app
from planner.cli.options import (
    DEFAULT_HEADROOM,
    BatchOpt,
    ClusterOpt,
    CompileOpt,
    Fp8RecipeOpt,
    FrameworkOpt,
    HeadroomOpt,
    JsonOpt,
    MemoryMarginOpt,
    ModelOpt,
    OptimizerStatesOpt,
    PrecisionOpt,
    SeqOpt,
    answer,
)

TokensOpt = Annotated[float | None, typer.Option("--tokens", help="Token budget (default: days per 1T tokens).")]
NoSolverOpt = Annotated[bool, typer.Option("--no-solver", help="Skip the ILP refinement.")]


def _figure_opt(what: str) -> object:
    return typer.Option("--figure", readable=False, help=f"Also draw the {what} (.png or .svg; needs matplotlib: "
                                         "pip install 'planner[plots]').")


@app.command()
def compare(
    clusters: Annotated[str, typer.Option("--clusters", help="CLUSTER:NODES[@PRICE],... e.g. "
                                                              "'dgx-a100-80gb:128,dgx-h100:64,dgx-h200:64@3.1'")],
    model: ModelOpt, global_batch_size: BatchOpt, seq_len: SeqOpt,
    precision: PrecisionOpt = None, fp8_recipe: Fp8RecipeOpt = None, framework: FrameworkOpt = None,
    optimizer_states: OptimizerStatesOpt = None, compile_model: CompileOpt = False,
    headroom_gib: HeadroomOpt = DEFAULT_HEADROOM, tokens: TokensOpt = None,
    gpu_hour_price: Annotated[float | None, typer.Option("--gpu-hour-price", help="Price per GPU-hour for entries "
                                                                                  "without @PRICE.")] = None,
    pue: Annotated[float | None, typer.Option("--pue", help="Power usage effectiveness (facility energy).")] = None,
    no_solver: NoSolverOpt = False, memory_margin: MemoryMarginOpt = "band-high",
    figure: Annotated[Path | None, _figure_opt("comparison")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Plan one model and batch on several clusters; rank by time to train, cost per token, tokens/s per GPU."""
    from planner.decisions.compare import CompareRequest, compare_report

    answer(compare_report(CompareRequest(
        clusters, model, global_batch_size, seq_len, precision, headroom_gib, tokens, gpu_hour_price, pue,
        not no_solver, figure, framework, fp8_recipe, optimizer_states, compile_model, memory_margin)), figure, as_json)


@app.command()
def scaling(
    cluster: ClusterOpt, model: ModelOpt, global_batch_size: BatchOpt, seq_len: SeqOpt,
    nodes: Annotated[int | None, typer.Option("--nodes", "-n", help="Centre of the default sweep: nodes/32 .. nodes*4.")] = None,
    node_counts: Annotated[str | None, typer.Option("--node-counts", help="Node counts to plan, e.g. 64,128,256.")] = None,
    batch_sizes: Annotated[str | None, typer.Option("--batch-sizes", help="Global batch sizes to sweep too, "
                                                                          "e.g. 1024,2048,4096.")] = None,
    precision: PrecisionOpt = None, fp8_recipe: Fp8RecipeOpt = None, framework: FrameworkOpt = None,
    optimizer_states: OptimizerStatesOpt = None, compile_model: CompileOpt = False,
    headroom_gib: HeadroomOpt = DEFAULT_HEADROOM, tokens: TokensOpt = None,
    no_solver: NoSolverOpt = False, memory_margin: MemoryMarginOpt = "band-high",
    figure: Annotated[Path | None, _figure_opt("curve")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The best plan's tokens/s, MFU and time to train over node counts: where adding GPUs stops paying."""
    from planner.decisions.scaling import ScalingRequest, scaling_report

    answer(scaling_report(ScalingRequest(
        cluster, model, global_batch_size, seq_len, nodes, node_counts, batch_sizes, precision, headroom_gib, tokens,
        not no_solver, figure, framework, fp8_recipe, optimizer_states, compile_model, memory_margin)), figure,
           as_json)
