"""Options shared by several commands, and the two ways a command answers: JSON on stdout, or the terminal."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from planner.defaults import DEFAULT_HEADROOM_GIB

if TYPE_CHECKING:
    from rich.console import Console

    from planner.requests import ProblemRequest

JsonOpt = Annotated[bool, typer.Option("--json", help="Write exactly one JSON document to stdout (errors too).")]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="Cluster preset name or YAML/JSON file.")]
NodesOpt = Annotated[int | None, typer.Option("--nodes", "-n", help="Scale the cluster to this many nodes.")]
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Model preset, model YAML/JSON, or HF config.json.")]
BatchOpt = Annotated[int, typer.Option("--global-batch-size", "-b", help="Sequences per optimizer step.")]
SeqOpt = Annotated[int, typer.Option("--seq-len", "-s", help="Sequence length in tokens.")]
PrecisionOpt = Annotated[str | None, typer.Option("--precision", help="bf16, fp16, fp32 or fp8 (FP8 GEMMs, recipe: "
                                                                       "--fp8-recipe; default: bf16, or fp16 on a GPU "
                                                                       "without bf16 such as V100).")]
Fp8RecipeOpt = Annotated[str | None, typer.Option(
    "--fp8-recipe", help="With --precision fp8: delayed, tensorwise (TE current scaling), blockwise, mxfp8 "
                         "(Blackwell) or rowwise (torchao); default: the framework's (Megatron-LM delayed, NeMo "
                         "tensorwise, torchtitan rowwise, otherwise tensorwise).")]
OptimizerStatesOpt = Annotated[str | None, typer.Option(
    "--optimizer-states", help="Optimizer states below fp32, e.g. 'moments=bf16' or 'grad=bf16,master=fp16,"
                               "exp_avg=fp8,exp_avg_sq=bf16' (keys grad, master, exp_avg, exp_avg_sq, moments; "
                               "dtypes fp32, bf16, fp16, fp8 for moments; Megatron's precision-aware optimizer). "
                               "Default: fp32 master weights and moments, the framework's gradient buffer.")]
CompileOpt = Annotated[bool, typer.Option(
    "--compile", help="torch.compile the model (torchtitan: compile.enable with compile.components ['model'], which "
                      "export writes): fused elementwise kernels move 5/12 of eager's bytes. Default: eager, "
                      "torchtitan's default; Megatron, NeMo and DeepSpeed have no such setting.")]
HeadroomOpt = Annotated[float, typer.Option("--headroom-gib", help="GPU memory kept free on top of the model.")]
CalibrationOpt = Annotated[Path | None, typer.Option("--calibration", readable=False, help="Calibration file from `planner calibrate`.")]
TpAcrossOpt = Annotated[bool, typer.Option("--allow-tp-across-nodes", help="Allow TP groups larger than a node.")]
OutputOpt = Annotated[Path | None, typer.Option("-o", "--output", readable=False, help="Also write the JSON document here (atomically).")]
FrameworkOpt = Annotated[str | None, typer.Option(
    "--framework", help="megatron, nemo, torchtitan, deepspeed, megatron-deepspeed or generic: only what it can run "
                        "(default: plan/estimate generic; export the plan's; check the config's).")]
FixOpt = Annotated[list[str] | None, typer.Option("--fix", help="Pin layout keys, e.g. tp=8 or 'pp=4,zero=1' (repeatable).")]
MemoryMarginOpt = Annotated[str, typer.Option(
    "--memory-margin", help="band-high (default): a layout fits when its predicted peak raised to the memory band's "
                            "high end still fits; estimate: the point estimate only (may run out of memory).")]
SchedulesOpt = Annotated[str | None, typer.Option("--schedules", help="Allowed pipeline schedules, e.g. 1f1b,interleaved_1f1b.")]
DEFAULT_HEADROOM = DEFAULT_HEADROOM_GIB  # the one default (planner.estimate), shown by --help


def problem_request(cluster: str, model: str, global_batch_size: int, seq_len: int, nodes: int | None,
                    precision: str | None, headroom_gib: float, calibration: Path | None,
                    fp8_recipe: str | None = None, optimizer_states: str | None = None,
                    compile_model: bool = False) -> ProblemRequest:
    from planner.requests import ProblemRequest

    return ProblemRequest(cluster=cluster, model=model, global_batch_size=global_batch_size, seq_len=seq_len,
                          nodes=nodes, precision=precision, headroom_gib=headroom_gib, calibration=calibration,
                          fp8_recipe=fp8_recipe, optimizer_states=optimizer_states, compile_model=compile_model)


def stdout() -> Console:
    from rich.console import Console

    return Console()


def stderr() -> Console:
    from rich.console import Console

    return Console(stderr=True)


def emit_json(doc: Any) -> None:
    text = doc.model_dump_json(indent=2) if hasattr(doc, "model_dump_json") else json.dumps(doc, indent=2)
    sys.stdout.write(text + "\n")


def write_file(path: Path | None, text: str | bytes) -> None:
    """-o/--svg: written atomically with the umask's mode; 'wrote PATH' on stderr."""
    if path is None:
        return
    from planner.fileio import write_atomically

    write_atomically(path, text)
    stderr().print(f"wrote {path}", highlight=False, markup=False)


def print_lines(lines: list[str]) -> None:
    """Plain lines (already wrapped to 80 columns), no markup or highlighting."""
    console = stdout()
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def answer(report: Any, figure: Path | None, as_json: bool) -> None:
    """A decisions report (planner/decisions/report.py): the figure when asked for, then JSON or lines. The figure
    goes first: where it cannot be written the command fails with one error document, not the report and then the
    error (stdout holds exactly one JSON document)."""
    if figure is not None:
        report.draw(figure)
        stderr().print(f"wrote {figure}", highlight=False, markup=False)
    emit_json(report.document) if as_json else print_lines(report.lines)
