"""What a person and an 80-column CI log see: the pick's layout whole and copy-pasteable, runners-up that say
how they differ, tables that keep the names one must type, and pipeline pictures readable without colour."""

import io
import re

import pytest
from rich.console import Console

from planner.explain.report import layout_arg, render_plan, wrap_at_commas


def console(width=80) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, no_color=True, force_terminal=False), buf


@pytest.fixture(scope="module")
def doc():
    # GPT-3 175B on 128 DGX A100 nodes: the pick is pipelined (tests/test_planner.py, row-5 scenario)
    from planner.requests import PlanRequest, ProblemRequest, plan_document

    req = ProblemRequest(cluster="dgx-a100-80gb", model="gpt3-175b", global_batch_size=1536, seq_len=2048, nodes=128)
    return plan_document(req, PlanRequest(use_solver=False, compare=["tp=8,pp=16,dp=8,schedule=1f1b"]))[0]


def test_layout_arg_round_trips(doc):
    from planner.estimate import complete_layout
    from planner.inputs.layout_string import parse_layout_string

    inputs = doc.inputs
    for c in [doc, *doc.alternatives, *doc.compared]:
        again = complete_layout(parse_layout_string(layout_arg(c.layout)), inputs.model, inputs.training,
                                inputs.cluster)
        assert again == c.layout
    lay = doc.layout.model_copy(update={"sequence_parallel": False, "layers_per_stage": [1] * doc.layout.pp})
    assert "sp=0" in layout_arg(lay) and "layers_per_stage=1/1/" in layout_arg(lay)


def test_layout_arg_keeps_the_context_and_expert_degrees():
    """A CP/EP pick's --layout line gives the same layout back (it used to drop cp, cp_comm, ep and etp: pasting
    Qwen3-30B-A3B's ep=8 pick into --layout estimated ep=1, twice the step time)."""
    from planner.estimate import build_problem, layout_from_arg

    problem = build_problem("dgx-h100", 2, "qwen3-30b-a3b", 512, 4096)
    for text in ("tp=1,pp=1,dp=16,zero=1,ep=8,mbs=1,recompute=none",
                 "tp=2,pp=1,dp=4,zero=1,cp=2,cp_comm=all_gather,ep=4,etp=2,mbs=1,recompute=full,sp=1"):
        lay = layout_from_arg(text, problem)
        assert layout_from_arg(layout_arg(lay), problem) == lay
        assert "ep=" in layout_arg(lay)


def test_wrap_at_commas_never_cuts_a_token():
    text = "tp=8,pp=56,dp=5,zero=1,mbs=1,recompute=none,sp=1,schedule=interleaved_1f1b,vpp=4"
    lines = wrap_at_commas(text, 30, "    ")
    assert all(len(line) <= 30 for line in lines)
    assert "".join(line.strip() for line in lines) == text


def test_plan_at_80_columns(doc):
    out, buf = console(80)
    render_plan(out, doc)
    lines = buf.getvalue().splitlines()
    arg = layout_arg(doc.layout)
    # the pick's layout on a line of its own, whole (the one line allowed to exceed 80 columns)
    assert lines[lines.index("layout (for --layout):") + 1] == arg
    assert all(len(line) <= 80 for line in lines if line != arg), [line for line in lines if len(line) > 80]
    text = buf.getvalue()
    for c in [*doc.alternatives, *doc.compared]:
        # each runner-up's layout is there, broken only after commas; its reason says what differs
        assert layout_arg(c.layout) in text.replace(",\n    ", ",")
        assert c.reason in text.replace("\n", " ").replace("  ", " ") or c.reason[:60] in text
        assert "instead of" in c.reason and "step time" in c.reason
    assert "compared:" in text


def test_pipeline_summary_at_scale_agrees_with_the_estimate(doc):
    out, buf = console(80)
    render_plan(out, doc)
    text = buf.getvalue()
    lay, t = doc.layout, doc.time_breakdown
    # a summary, not every stage (schedule_view: past 8 stages or 4 micro-batches a stage)
    assert lay.pp > 4 and (lay.pp > 8 or lay.num_micro_batches > 4 * lay.pp)
    assert "(summary)" in text and f"stage {lay.pp - 1}" in text and f"stage {lay.pp // 2} " not in text
    share = t.pipeline_bubble_seconds / doc.predicted.step_time_seconds
    assert f"bubble {share:.1%} of the step" in text  # the estimate's share, the same as in the reason
    if "bubble" in doc.reason:
        assert f"bubble {share:.1%}" in doc.reason
    rows = [line for line in text.splitlines() if line.startswith("stage ") and "┆" in line]
    assert "F" in rows[0] and "B" in rows[-1] and "·" in rows[-1]  # letters and dots, not colour only
    assert "end" in text and " s" in text  # a time axis in seconds


def test_full_schedule_on_request(doc):
    out, buf = console(120)
    render_plan(out, doc, full_schedule=True)
    rows = [line for line in buf.getvalue().splitlines() if re.match(r"stage \d+ +[FBW·]", line)]
    assert len(rows) == doc.layout.pp


def test_clusters_list_keeps_full_names(capsys):
    from cluster_specs import cluster_names, load_cluster
    from planner.explain.catalog import render_clusters

    out, buf = console(80)
    specs = [load_cluster(n) for n in cluster_names()]
    render_clusters(out, specs)
    text = buf.getvalue()
    for name in cluster_names():
        assert f" {name} " in text


@pytest.mark.parametrize("command", [
    "planner plan -c dgx-a100-80gb -n 280 -m mt-nlg-530b -b 1920 -s 2048 --sensitivity -o plan.json",
    "planner plan -c 'my cluster.yaml' -n 2048 -m llama3-405b -b 2048 -s 8192 --objective min-gpus "
    "--target-tokens-per-second 2257211 --fix 'pp=4,zero=1'",
    "planner plan -c dgx-h100",
])
def test_a_printed_command_fits_80_columns_and_runs_as_given(command):
    """The commands plan prints to copy (the short list's, min-gpus's) once ran to 123 columns in an 80-column log.
    Wrapped with backslashes, they split back into the same arguments."""
    import shlex

    from planner.explain.report import command_lines

    lines = command_lines(command, "    ")
    assert all(len(line) <= 80 for line in lines)
    assert all(line.endswith(" \\") for line in lines[:-1]) and not lines[-1].endswith("\\")
    assert shlex.split(" ".join(line.removesuffix("\\") for line in lines)) == shlex.split(command)


def test_whole_plan_output_fits_80_columns_with_the_waste_advice():
    """`planner plan` end to end in an 80-column terminal, on a pick that wastes the cluster (Llama 2 13B on 64 DGX
    A100 nodes at batch 64: the waste section with its min-gpus and scaling commands). Every line but the pick's
    layout fits; the scaling command once ran to 93 columns."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "80"}
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "plan", "-c", "dgx-a100-80gb", "-n", "64", "-m",
                           "llama2-13b", "-b", "64", "-s", "4096"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "  curve       tokens/s, MFU and days over node counts and batch sizes:" in lines
    layout = lines[lines.index("layout (for --layout):") + 1]
    assert [line for line in lines if len(line) > 80 and line != layout] == []
