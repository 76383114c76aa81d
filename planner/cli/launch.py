"""`planner export` (launch settings from a plan) and `planner check` (a config, for CI)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from planner.cli.app import app
from planner.cli.options import (
    DEFAULT_HEADROOM,
    CalibrationOpt,
    ClusterOpt,
    FixOpt,
    FrameworkOpt,
    HeadroomOpt,
    JsonOpt,
    ModelOpt,
    NodesOpt,
    PrecisionOpt,
    TpAcrossOpt,
    emit_json,
    stderr,
    stdout,
    write_file,
)


@app.command()
def export(
    plan_file: Annotated[Path, typer.Argument(readable=False, help="A plan JSON from `planner plan --json`/`-o`.")],
    to: Annotated[str | None, typer.Option("--to", help="megatron, nemo, megatron-deepspeed, deepspeed, torchtitan or "
                                                        "torchrun (default: the plan's --framework)")] = None,
    framework: FrameworkOpt = None,
    torchtitan_format: Annotated[str | None, typer.Option(
        "--torchtitan-format", help="python (torchtitan 0.3 recipe module) or toml (torchtitan <= 0.2); default: "
                                    "toml when -o names a .toml file, else python")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", readable=False, help="Write here (atomically) instead of stdout.")] = None,
    program: Annotated[str | None, typer.Option(help="torchrun: the program to launch (default: the planner's "
                                                     "benchmark, given the plan path).")] = None,
    program_args: Annotated[str | None, typer.Option(help="torchrun: the program's arguments.")] = None,
) -> None:
    """Turn a plan into launch settings the framework accepts (the nearest expressible layout, or a refusal)."""
    from cluster_specs import SpecError, read_structured_file
    from planner.integrations.exports import export as make_export

    suffix = output.suffix.lower() if output is not None else ""
    if torchtitan_format is None:  # the file's name says which (check reads a file by its suffix too)
        torchtitan_format = "toml" if suffix == ".toml" else "python"
    if torchtitan_format not in ("python", "toml"):
        raise SpecError(f"--torchtitan-format: {torchtitan_format!r} -> allowed: python, toml")
    if {"python": ".toml", "toml": ".py"}[torchtitan_format] == suffix:
        raise SpecError(f"--torchtitan-format: {torchtitan_format} with -o {output} -> a {suffix} file is read as "
                        f"{'TOML' if suffix == '.toml' else 'Python'} (by torchtitan and by `planner check`): name it "
                        f"{'.py' if torchtitan_format == 'python' else '.toml'}")
    from planner.fileio import refuse_overwriting_input

    refuse_overwriting_input(output, plan_file, "plan")
    doc = read_structured_file(plan_file)
    if not isinstance(doc, dict):
        raise SpecError("expected a plan JSON object", source=str(plan_file))
    result = make_export(doc, to, framework=framework, torchtitan_format=torchtitan_format, program=program,
                         program_args=program_args, plan_path=str(plan_file))
    for line in result.notes:
        stderr().print(f"note: {line}", highlight=False, markup=False)
    write_file(output, result.text) if output is not None else sys.stdout.write(result.text)


@app.command()
def check(
    configs: Annotated[list[Path], typer.Argument(readable=False, help="Configs: plan JSON, DeepSpeed JSON (HF \"auto\" too), "
                                                      "torchtitan TOML or Python recipe, Megatron arguments or launch "
                                                      "script, Megatron-Bridge overrides (lines or YAML), "
                                                      "NeMo-Framework-Launcher YAML. Several are checked in turn.")],
    cluster: ClusterOpt, model: ModelOpt, nodes: NodesOpt = None,
    global_batch_size: Annotated[int | None, typer.Option("--global-batch-size", "-b",
                                                          help="When the config does not say (fills HF \"auto\").")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", "-s", help="When the config does not say.")] = None,
    tp: Annotated[int | None, typer.Option("--tp", min=1, help="The tensor-parallel degree, where the config does not say "
                                                        "(DeepSpeed JSON).")] = None,
    pp: Annotated[int | None, typer.Option("--pp", min=1, help="The pipeline degree, where the config does not say "
                                                        "(DeepSpeed JSON: the model's PipelineModule).")] = None,
    fix: FixOpt = None, framework: FrameworkOpt = None,
    precision: PrecisionOpt = None, headroom_gib: HeadroomOpt = DEFAULT_HEADROOM,
    allow_tp_across_nodes: TpAcrossOpt = False, calibration: CalibrationOpt = None, as_json: JsonOpt = False,
    config_function: Annotated[str | None, typer.Option(
        "--config-function", help="The config function to check in a torchtitan Python module that holds several "
                                  "(a config_registry.py; torchtitan's --config).")] = None,
) -> None:
    """Check configs in CI: framework rules, degrees, divisibility, batch arithmetic, schedules, model, memory.

    Exit 0: every config passes; 1: a violation; 3: a config could not be checked (3 wins over 1)."""
    import argparse

    from planner.integrations.check import check_files, render_report

    args = argparse.Namespace(cluster=cluster, nodes=nodes, model=model, global_batch_size=global_batch_size,
                              seq_len=seq_len, tp=tp, pp=pp, fix=fix, framework=framework, precision=precision,
                              headroom_gib=headroom_gib, allow_tp_across_nodes=allow_tp_across_nodes,
                              calibration=calibration, config_function=config_function)
    doc, reports, code = check_files(configs, args, as_json=as_json)
    if as_json:
        emit_json(doc)
    else:
        for r in reports:
            render_report(stdout(), r, several=len(reports) > 1)
    if code:
        raise typer.Exit(code)
