"""The output contract (planner/contract.py): documents hold the estimate's values, the published schemas are
generated from the models and current, and the JSON the CLI writes is the model's."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from planner.contract import (
    SCHEMAS,
    CandidateReport,
    EstimateDocument,
    MemoryBreakdown,
    PlanDocument,
    TimeReport,
    json_schema,
)

ROOT = Path(__file__).resolve().parents[1]


def _problem(cluster="dgx-a100-80gb", nodes=8, model="gpt3-175b", batch=64, seq=2048, headroom_gib=2.0):
    from cluster_specs import load_cluster
    from cost_models.inputs import Knobs
    from planner.estimate import Problem
    from planner.inputs.models import load_model
    from planner.inputs.specs import TrainingSpec

    return Problem(load_model(model), TrainingSpec(global_batch_size=batch, seq_length=seq),
                   load_cluster(cluster, nodes=nodes), Knobs(memory_headroom_bytes=headroom_gib * 2**30))


@pytest.fixture(scope="module")
def estimate_doc():
    from planner.estimate import estimate_layout, layout_from_arg

    problem = _problem()
    lay = layout_from_arg("tp=8,pp=8,mbs=1,recompute=selective,schedule=interleaved_1f1b,vpp=3", problem)
    return problem, EstimateDocument.from_estimate(problem, lay, estimate_layout(problem, lay))


def test_predicted_values_follow_from_each_other(estimate_doc):
    problem, doc = estimate_doc
    p = doc.predicted
    tokens = problem.training.global_batch_size * problem.training.seq_length  # 64 x 2048
    assert p.tokens_per_second == pytest.approx(tokens / p.step_time_seconds, rel=1e-12)
    assert p.tokens_per_second_per_gpu * problem.cluster.num_gpus == pytest.approx(p.tokens_per_second, rel=1e-12)
    # MFU and HFU share the denominator (step time x GPUs x peak): their ratio is the FLOP counts' ratio
    assert p.mfu / p.hfu == pytest.approx(p.model_flops_per_step / p.hardware_flops_per_step, rel=1e-9)
    assert p.hardware_flops_per_step > p.model_flops_per_step  # selective recompute re-runs attention
    assert p.memory_headroom_bytes == 2 * 2**30
    assert p.fits == (p.peak_memory_bytes_per_gpu + p.memory_headroom_bytes <= p.gpu_memory_bytes)
    assert p.gpu_memory_bytes == 80 * 10**9 or p.gpu_memory_bytes == 80 * 2**30


def test_memory_breakdown_sums_to_the_peak(estimate_doc):
    _, doc = estimate_doc
    m, p = doc.memory_breakdown, doc.predicted
    parts = sum(getattr(m, k) for k in MemoryBreakdown.PARTS)
    assert parts == pytest.approx(m.total_bytes, rel=1e-12)
    assert m.total_bytes == pytest.approx(p.peak_memory_bytes_per_gpu, rel=1e-12)
    assert m.peak_stage == p.peak_memory_stage
    assert len(m.stages) == doc.layout.pp == 8
    assert max(s.total_bytes for s in m.stages) == pytest.approx(m.total_bytes, rel=1e-12)
    peak = m.stages[m.peak_stage]
    assert {k: getattr(peak, k) for k in MemoryBreakdown.PARTS} == {k: getattr(m, k) for k in MemoryBreakdown.PARTS}
    for s in m.stages:
        assert sum(getattr(s, k) for k in MemoryBreakdown.PARTS) == pytest.approx(s.total_bytes, rel=1e-12)
    assert sum(s.layers for s in m.stages) == 96  # GPT-3 175B


def test_time_breakdown_sums_to_the_step(estimate_doc):
    _, doc = estimate_doc
    t = doc.time_breakdown
    assert sum(t.exposed().values()) == pytest.approx(t.total_seconds, rel=1e-12)
    assert t.total_seconds == pytest.approx(doc.predicted.step_time_seconds, rel=1e-9)
    assert t.tp_comm_total_seconds >= t.tp_comm_exposed_seconds
    assert t.dp_comm_total_seconds >= t.dp_comm_exposed_seconds
    # dp = 1 here: no data-parallel traffic; the "dp" time is the tied-embedding gradient sync between the first and
    # last stages, counted in the total too and never hidden (it runs after the last backward; cost_models/step.py)
    assert doc.layout.dp == 1 and t.dp_comm_total_seconds == pytest.approx(t.dp_comm_exposed_seconds, rel=1e-12)
    assert t.dp_comm_total_seconds > 0
    assert len(t.stage_seconds) == 8 and all(x > 0 for x in t.stage_seconds)
    assert 0 < t.matmul_efficiency <= 1
    assert set(t.exposed()) == set(TimeReport.PARTS.values())


def test_plan_document_holds_the_result():
    from planner.estimate import layout_from_arg
    from planner.search import PlanOptions, add_compared, plan

    problem = _problem("dgx-h100", 4, "llama3-8b", 64, 8192)
    result = add_compared(problem, plan(problem, PlanOptions(top_k=3)), [layout_from_arg("tp=2,pp=2", problem)])
    doc = PlanDocument.from_result(problem, result, objective="throughput", notes=["a note"])
    assert doc.layout == result.pick.layout and doc.origin == result.pick.origin
    assert doc.predicted.step_time_seconds == result.pick.estimate.step_seconds
    assert doc.reason == result.reasons[id(result.pick)]
    assert [a.layout for a in doc.alternatives] == [c.layout for c in result.alternatives]
    assert all(a.predicted.step_time_seconds >= doc.predicted.step_time_seconds for a in doc.alternatives)
    assert [c.origin for c in doc.compared] == ["compared"]
    assert doc.compared[0].layout.tp == 2 and doc.compared[0].layout.dp == 8  # 32 GPUs / (2 x 2)
    from planner.explain.versus import versus

    delta = doc.compared[0].predicted.step_time_seconds / doc.predicted.step_time_seconds - 1
    assert doc.compared[0].reason == versus(doc, doc.compared[0])
    assert doc.compared[0].reason.startswith("tp 2 instead of") and f"{delta:+.1%} step time" in doc.compared[0].reason
    assert doc.decision.reasons[-1] == "a note" and result.decision.reasons[-1] != "a note"  # the result is not mutated
    assert doc.search.candidates_evaluated == result.stats.candidates_evaluated > 0
    # JSON round trip through the model
    again = PlanDocument.model_validate_json(doc.model_dump_json())
    assert again == doc


def test_candidate_report_of_an_estimate_equals_the_estimate_document(estimate_doc):
    problem, doc = estimate_doc
    est = problem.estimate(doc.layout)
    cand = CandidateReport.from_estimate(doc.layout, est, headroom_bytes=problem.knobs.memory_headroom_bytes,
                                         origin="search", reason=None, problem=problem, assumptions=True)
    assert cand.predicted == doc.predicted and cand.memory_breakdown == doc.memory_breakdown
    assert cand.time_breakdown == doc.time_breakdown


@pytest.mark.parametrize("which", sorted(SCHEMAS))
def test_checked_in_schema_is_current(which):
    # Generated: `make schema` (or `planner schema NAME > docs/schema/NAME.schema.json`). A change here is a change
    # to the contract: bump planner.SCHEMA_VERSION (major when it breaks consumers, minor when it adds a field).
    path = ROOT / "docs" / "schema" / f"{which}.schema.json"
    assert json.loads(path.read_text()) == json_schema(which), f"stale {path}: run `make schema`"


def test_every_field_is_described():
    def walk(schema, where):
        for name, prop in schema.get("properties", {}).items():
            yield f"{where}.{name}", prop

    missing = []
    for which in ("plan", "estimate", "check"):
        schema = json_schema(which)
        for name, d in schema["$defs"].items():
            if name in ("Predicted", "MemoryBreakdown", "StageMemoryReport", "TimeReport", "Violation"):
                missing += [w for w, p in walk(d, name) if "description" not in p and "$ref" not in p
                            and w != "MemoryBreakdown.stages"]
    assert not missing


def test_schema_command_prints_the_generated_schema():
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "schema", "estimate"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json_schema("estimate")


def test_estimate_json_is_the_model(estimate_doc):
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "estimate", "-c", "dgx-a100-80gb", "-n", "8", "-m",
                           "gpt3-175b", "-b", "64", "-s", "2048", "--layout",
                           "tp=8,pp=8,mbs=1,recompute=selective,schedule=interleaved_1f1b,vpp=3", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = EstimateDocument.model_validate_json(proc.stdout)
    _, expected = estimate_doc
    assert doc.predicted == expected.predicted and doc.layout == expected.layout
    assert doc.kind == "estimate" and not math.isnan(doc.predicted.mfu)


def test_the_schema_help_names_every_document():
    """`planner schema --help` and README list the documents SCHEMAS defines (the help once left out three)."""
    import re

    from planner.contract import SCHEMAS

    help_text = subprocess.run([sys.executable, "-m", "planner.cli", "schema", "--help"], capture_output=True,
                               text=True).stdout
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    lines = readme.splitlines()
    at = next(i for i, x in enumerate(lines) if "planner schema plan" in x)
    # the command's comment, with the lines that go on with it (a line that is only a comment)
    line = " ".join([lines[at], *(x for x in lines[at + 1:at + 4] if x.lstrip().startswith("#"))][:2])
    for name in SCHEMAS:
        assert re.search(rf"\b{re.escape(name)}\b", " ".join(help_text.split())), name
        assert re.search(rf"\b{re.escape(name)}\b", line), name


@pytest.mark.parametrize(("argv", "which"), [
    (["clusters", "list"], "clusters"), (["clusters", "show", "dgx-h100", "--nodes", "2"], "cluster"),
    (["models", "list"], "models"), (["models", "show", "deepseek-v3"], "model"), (["--version"], "version")])
def test_catalog_and_version_json_are_their_contract_models(argv, which):
    """The catalog's and --version's JSON are documents of the contract too (`planner schema NAME`): each output
    reads back through its model and prints the same again."""
    proc = subprocess.run([sys.executable, "-m", "planner.cli", *argv, "--json"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    model = SCHEMAS[which]
    doc = model.model_validate_json(proc.stdout)
    assert json.loads(doc.model_dump_json()) == json.loads(proc.stdout)
    if which == "model":
        assert doc.parameters.total == 671_026_419_200 and doc.parameters.active == 37_552_297_472
    if which == "cluster":
        assert doc.derived.num_gpus == 16 and doc.kind == "cluster"
