"""Fuzz suite (hypothesis): every file reader and every command, with random and adversarial inputs.

Asserted for each case: no traceback (only the planner's own errors escape a reader; a command ends with an
exit code from the documented table, never 9 "internal error"), one JSON document on stdout with --json when the
command succeeds (and, once error documents exist, when it fails), and no file left half-written by -o.

Deterministic: the "fuzz" profile derandomizes (the same cases every run) and keeps no example database.
The case count is asserted at the end (>= 10,000 per run; see FUZZ_CASES).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import ExitCode, PlannerError

settings.register_profile("fuzz", derandomize=True, database=None, deadline=None, print_blob=False,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                 HealthCheck.data_too_large, HealthCheck.filter_too_much])
FUZZ = settings.get_profile("fuzz")
ALLOWED_EXIT = {int(c) for c in ExitCode} - {int(ExitCode.INTERNAL)}
COUNT: dict[str, int] = {}


# `make test` runs the whole suite (>= 10,000 cases); FUZZ_SCALE=0.05 runs a deterministic 5% sample while developing
FUZZ_SCALE = float(os.environ.get("FUZZ_SCALE", "1"))


def fuzz(n: int):
    """The fuzz profile with n examples (scaled by FUZZ_SCALE)."""
    return settings(FUZZ, max_examples=max(5, round(n * FUZZ_SCALE)))


def tick() -> None:
    """Count one executed case under the calling test's name."""
    name = sys._getframe(1).f_code.co_name
    COUNT[name] = COUNT.get(name, 0) + 1


# ---- values ------------------------------------------------------------------------------------------------

# the empty list and dict are built fresh for each draw: a shared literal would be mutated by one case's edits (made
# to contain itself) and poison every later case
weird_numbers = st.one_of(st.sampled_from([0, -1, 1, 3, 7, 2**31, 2**63, 10**20, -(10**20), 0.5, -0.0, 1e308,
                                           float("nan"), float("inf"), float("-inf"), "8", "", "auto", None, True,
                                           False]),
                          st.builds(list), st.builds(dict))
scalars = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.booleans(), st.none(), weird_numbers)
json_values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                           st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                           max_leaves=12)


def mapping(keys: list[str]):
    """Dicts over the keys a reader knows, with adversarial values (plus an unknown key now and then)."""
    return st.dictionaries(st.sampled_from([*keys, "unknown_key"]), st.one_of(weird_numbers, json_values), max_size=8)


def mutate(base: dict):
    """A valid document with a few keys (also nested ones) replaced by adversarial values or removed."""
    def apply(edits):
        doc = json.loads(json.dumps(base))
        for path, value in edits:
            node = doc
            for key in path[:-1]:
                node = node.get(key) if isinstance(node, dict) else None
                if not isinstance(node, dict):
                    break
            else:
                if value is _DROP:
                    node.pop(path[-1], None)
                else:
                    node[path[-1]] = copy.deepcopy(value)  # never the same object at two places
        return doc
    paths = _paths(base)
    return st.lists(st.tuples(st.sampled_from(paths), st.one_of(weird_numbers, json_values, st.just(_DROP))),
                    min_size=1, max_size=3).map(apply)


_DROP = object()


def _paths(doc, prefix=()):
    out = []
    for k, v in doc.items():
        out.append((*prefix, k))
        if isinstance(v, dict):
            out += _paths(v, (*prefix, k))
    return out


def raw_bytes():
    """Binary junk, NUL bytes, BOMs, invalid UTF-8, deep nesting, alias bombs."""
    bomb = "\n".join([f"a0: &a0 [{', '.join(['x'] * 9)}]"]
                     + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]).encode()
    adversarial = st.sampled_from([b"", b"\x00", b"\xef\xbb\xbf", b"\xef\xbb\xbf{}", b"\xff\xfe\x00{", bomb,
                                   b"[" * 5000 + b"]" * 5000, b"{\"a\":" * 3000 + b"1" + b"}" * 3000,
                                   b"a: &a [*a]", b"- " * 2000 + b"x", b"a = " + b"[" * 3000 + b"]" * 3000,
                                   b"--tensor-model-parallel-size 0", b"--pipeline-model-parallel-size -1 \\\n",
                                   b"'unterminated", b"key: !!python/object:os.system {}", b"\t\t: :\n- [",
                                   b"1" * 5000])
    return st.one_of(adversarial, st.binary(max_size=200))


def write(tmp: Path, name: str, content) -> Path:
    p = tmp / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    elif isinstance(content, str):
        p.write_text(content, encoding="utf-8")
    else:
        p.write_text(json.dumps(content, allow_nan=True), encoding="utf-8")
    return p


def only_planner_errors(fn, *a, **k):
    """Run a reader: it returns, or raises one of the planner's errors with one-line problems (no traceback)."""
    try:
        return fn(*a, **k)
    except PlannerError as exc:
        assert exc.exit_code in ALLOWED_EXIT, exc
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
        return None


# ---- file readers ------------------------------------------------------------------------------------------

def _preset_doc(kind: str, name: str) -> dict:
    from importlib import resources

    import yaml

    if kind == "cluster":
        return yaml.safe_load(resources.files("cluster_specs").joinpath("clusters", f"{name}.yaml").read_text())
    return {"name": name, **yaml.safe_load(resources.files("planner.data").joinpath("models.yaml").read_text())[name]}


CLUSTER = _preset_doc("cluster", "dgx-a100-80gb")
MODEL = _preset_doc("model", "llama2-7b")
HF = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
      "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1000, "tie_word_embeddings": False}
DEEPSPEED = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
             "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": True}}
TORCHTITAN = {"parallelism": {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 1,
                              "data_parallel_shard_degree": -1, "pipeline_parallel_schedule": "1F1B"},
              "training": {"local_batch_size": 2, "global_batch_size": 64, "seq_len": 2048},
              "activation_checkpoint": {"mode": "selective"}}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def plan_doc():
    from planner.contract import PlanDocument
    from planner.estimate import build_problem
    from planner.search import PlanOptions, plan

    problem = build_problem("dgx-a100-80gb", 1, "llama2-7b", 64, 2048)
    result = plan(problem, PlanOptions(use_solver=False))
    return json.loads(PlanDocument.from_result(problem, result, objective="throughput").model_dump_json())


@fuzz(1500)
@given(data=st.one_of(mutate(CLUSTER), mapping(list(CLUSTER)), json_values), raw=raw_bytes(),
       suffix=st.sampled_from([".yaml", ".json", ".yml"]))
def test_cluster_files(tmp, data, raw, suffix):
    tick()
    from cluster_specs import load_cluster

    for content in (data, raw):
        only_planner_errors(load_cluster, str(write(tmp, f"cluster{suffix}", content)))


@fuzz(1500)
@given(data=st.one_of(mutate(MODEL), mapping(list(MODEL)), json_values), raw=raw_bytes(),
       suffix=st.sampled_from([".yaml", ".json"]))
def test_model_files(tmp, data, raw, suffix):
    tick()
    from planner.inputs.models import load_model

    for content in (data, raw):
        spec = only_planner_errors(load_model, str(write(tmp, f"model{suffix}", content)))
        if spec is not None:
            assert spec.parameter_counts()["total"] > 0


@fuzz(1500)
@given(data=st.one_of(mutate(HF), mapping(list(HF)),
                      st.sampled_from(["mixtral", "deepseek_v3", "gemma2", "phi3", "falcon", "t5", "gpt2", "qwen2",
                                       "mistral", "gpt_neox", "", None, 7]).map(lambda t: {**HF, "model_type": t})))
def test_hf_configs(tmp, data):
    tick()
    from planner.inputs.models import load_model

    snapshot = tmp / "snapshot"
    snapshot.mkdir(exist_ok=True)
    write(snapshot, "config.json", data)
    spec = only_planner_errors(load_model, str(snapshot))
    if spec is not None:
        assert spec.parameter_counts()["total"] > 0


def _check_config(tmp: Path, name: str, content) -> None:
    """read_config and check() against a small problem: what `planner check` does after reading the file."""
    from planner.estimate import build_problem
    from planner.integrations.check import check
    from planner.integrations.readers import read_config

    path = write(tmp, name, content)
    view = only_planner_errors(read_config, path, gpus=8)
    if view is None:
        return
    batch = view.global_batch_size if isinstance(view.global_batch_size, int) else 64
    seq = view.seq_length if isinstance(view.seq_length, int) else 2048
    problem = _problem_for(build_problem, batch, seq)
    if problem is not None:
        only_planner_errors(check, view, problem)


@functools.lru_cache(maxsize=256)
def _problem_for(build_problem, batch: int, seq: int):
    """The small problem of a (batch, sequence) a config states, built once: the outcome is deterministic, and
    rebuilding it per case spent most of a case's time re-reading the same presets."""
    return only_planner_errors(build_problem, "dgx-a100-80gb", 1, "llama2-7b", batch, seq)


@fuzz(1500)
@given(data=st.one_of(mutate(DEEPSPEED), mapping(list(DEEPSPEED))), raw=raw_bytes())
def test_deepspeed_json(tmp, data, raw):
    tick()
    _check_config(tmp, "ds.json", data)
    _check_config(tmp, "raw.json", raw)


def _toml(doc) -> str:
    lines = []
    for section, body in doc.items():
        if isinstance(body, dict):
            lines.append(f"[{section}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float) and not (isinstance(v, float) and v != v):
        return repr(v) if not isinstance(v, float) or abs(v) != float("inf") else ("inf" if v > 0 else "-inf")
    if isinstance(v, float):
        return "nan"
    if v is None or isinstance(v, list | dict):
        return "[]" if isinstance(v, list) else '""'
    return json.dumps(str(v))


@fuzz(1500)
@given(data=mutate(TORCHTITAN), raw=raw_bytes())
def test_torchtitan_toml(tmp, data, raw):
    tick()
    _check_config(tmp, "tt.toml", _toml(data))
    _check_config(tmp, "raw.toml", raw)


MEGATRON_OPTS = ["--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size",
                 "--global-batch-size", "--seq-length", "--num-layers", "--hidden-size", "--num-attention-heads",
                 "--num-layers-per-virtual-pipeline-stage", "--recompute-granularity", "--sequence-parallel",
                 "--use-distributed-optimizer", "--bf16", "--fp16", "--data-parallel-size",
                 "--pipeline-model-parallel-layout", "--mtp-num-layers"]
# Megatron-Core's pipeline layout grammar (planner/frameworks/megatron_split.py), and the characters it refuses
LAYOUT_TEXT = st.text(alphabet="Etm L|()*0123456789,x", max_size=24)


@fuzz(1000)
@given(args=st.lists(st.tuples(st.sampled_from(MEGATRON_OPTS),
                               st.one_of(st.integers(-5, 10**12).map(str), st.sampled_from(["full", "x", "", "0"]),
                                         LAYOUT_TEXT.map(lambda t: f"'{t}'"))),
                     max_size=8),
       raw=raw_bytes())
def test_megatron_args(tmp, args, raw):
    tick()
    text = " \\\n".join(f"{k} {v}" for k, v in args)
    _check_config(tmp, "train.sh", text)
    _check_config(tmp, "raw.sh", raw)


@fuzz(800)
@given(edits=st.data())
def test_plan_json(tmp, plan_doc, edits):
    tick()
    from planner.inputs.plan_file import load_plan

    doc = edits.draw(mutate(plan_doc))
    parts = only_planner_errors(load_plan, write(tmp, "plan.json", doc))
    if parts is not None:  # a plan that loads satisfies every layout rule
        from planner.rules import layout_violations

        assert not layout_violations(parts.layout, parts.model, parts.training, parts.cluster,
                                     allow_tp_across_nodes=True)
    _check_config(tmp, "plan.json", doc)


@fuzz(1200)
@given(text=st.one_of(st.text(max_size=60),
                      st.lists(st.tuples(st.sampled_from(["tp", "pp", "dp", "zero", "mbs", "m", "vpp", "schedule",
                                                          "recompute", "sp", "offload", "layers_per_stage", "TP", "x"]),
                                         st.one_of(st.integers(-3, 2**40).map(str), st.text(max_size=6))),
                               max_size=6).map(lambda kv: ",".join(f"{k}={v}" for k, v in kv))))
def test_layout_strings(text):
    tick()
    from planner.estimate import build_problem, layout_from_arg

    problem = _small_problem(build_problem)
    only_planner_errors(layout_from_arg, text, problem)


_PROBLEM = {}


def _small_problem(build_problem):
    if "p" not in _PROBLEM:
        _PROBLEM["p"] = build_problem("dgx-a100-80gb", 1, "llama2-7b", 64, 2048)
    return _PROBLEM["p"]


@fuzz(500)
@given(raw=raw_bytes(), rows=json_values)
def test_validation_rows(tmp, raw, rows):
    tick()
    from planner.validation import load_rows

    only_planner_errors(load_rows, write(tmp, "runs.json", raw))
    only_planner_errors(load_rows, write(tmp, "runs.json", rows))


# ---- commands, in-process ----------------------------------------------------------------------------------

def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """main() with sys.argv patched; (exit code, stdout, stderr). A traceback fails the test."""
    from planner.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["planner", *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = old
    return code, out.getvalue(), err.getvalue()


JSON_ERRORS: dict[str, bool] = {}


def json_error_documents() -> bool:
    """True once `--json` errors print a JSON document (helper B's work): then it is asserted for every case."""
    if "on" not in JSON_ERRORS:
        code, out, _ = run_cli(["models", "show", "no-such-model", "--json"])
        JSON_ERRORS["on"] = code != 0 and bool(out.strip())
    return JSON_ERRORS["on"]


def assert_outcome(argv: list[str], code: int, out: str, err: str) -> None:
    assert code in ALLOWED_EXIT, f"{argv}: exit {code}\n{err[-2000:]}"
    assert "Traceback" not in err, f"{argv}:\n{err[-2000:]}"
    # --help is eager (click prints the help text and exits 0 before any other option is read), so `--json --help`
    # is help, not a document; every other --json outcome is exactly one JSON document
    if "--json" in argv and "--help" not in argv and (code == 0 or json_error_documents()):
        json.loads(out)  # exactly one JSON document (json.loads refuses trailing data)


CLUSTERS = ["dgx-a100-80gb", "single-rtx4090", "v100-10gbe", "nope", "/dev/zero", "/nonexistent.yaml"]
MODELS = ["llama2-7b", "gpt3-1.3b", "nope", "/dev/urandom", "/nonexistent.json"]
NUMS = st.one_of(st.integers(-2, 4096).map(str), st.sampled_from(["0", "-1", "1000000000", "99999999999999999999",
                                                                  "nan", "inf", "-inf", "1e3", "x", ""]))


def _common(draw):
    return ["-c", draw(st.sampled_from(CLUSTERS)), "-m", draw(st.sampled_from(MODELS)),
            "-b", draw(NUMS), "-s", draw(NUMS)]


@st.composite
def commands(draw, tmp: Path):
    kind = draw(st.sampled_from(["plan", "estimate", "check", "export", "schedule", "models", "clusters", "schema",
                                 "version", "junk"]))
    json_flag = ["--json"] if draw(st.booleans()) else []
    if kind == "plan":
        extra = draw(st.sampled_from([[], ["--headroom-gib", "nan"], ["--solver-time-limit", "-1"], ["--top", "-3"],
                                      ["--objective", "x"], ["--compare", "tp=3"], ["--nodes", "1000000000"],
                                      ["--precision", "fp8"], ["-o", str(tmp / "out" / "plan.json")]]))
        return ["plan", *_common(draw), "--no-solver", "--no-schedule", "-n", "1", *extra, *json_flag]
    if kind == "estimate":
        layout = draw(st.sampled_from(["tp=8", "tp=3", "tp=0", "tp=8,tp=4", "pp=0", "dp=1,tp=1", "x", "",
                                       str(tmp / "plan.json"), "/dev/zero"]))
        return ["estimate", *_common(draw), "-n", "1", "--layout", layout, *json_flag]
    if kind == "check":
        cfg = draw(st.sampled_from(["ds.json", "raw.json", "tt.toml", "raw.toml", "train.sh", "raw.sh", "plan.json",
                                    "missing.json"]))
        return ["check", str(tmp / cfg), *_common(draw), "-n", "1", *json_flag]
    if kind == "export":
        to = draw(st.sampled_from(["megatron", "deepspeed", "torchtitan", "torchrun", "nemo", "x"]))
        out = draw(st.sampled_from([[], ["-o", str(tmp / "out" / "export.txt")], ["-o", str(tmp / "nodir" / "x")]]))
        return ["export", str(tmp / draw(st.sampled_from(["plan.json", "raw.json", "ds.json"]))), "--to", to, *out]
    if kind == "schedule":
        return ["schedule", "--pp", draw(st.sampled_from(["0", "1", "4", "-1", "x"])),
                "--micro-batches", draw(st.sampled_from(["0", "4", "8", "16"])),
                "--schedule", draw(st.sampled_from(["1f1b", "interleaved_1f1b", "zero_bubble", "gpipe", "x"])),
                "-v", draw(st.sampled_from(["0", "1", "2"]))]
    if kind == "models":
        return ["models", draw(st.sampled_from(["show", "list"])), *(
            [draw(st.sampled_from(MODELS + [str(tmp / "snapshot"), str(tmp)]))] if draw(st.booleans()) else []),
            *json_flag]
    if kind == "clusters":
        return ["clusters", "show", draw(st.sampled_from(CLUSTERS)), "--nodes", draw(NUMS), *json_flag]
    if kind == "schema":
        return ["schema", draw(st.sampled_from(["plan", "check", "estimate", "x"]))]
    if kind == "version":
        return ["--version", *json_flag]
    return draw(st.lists(st.sampled_from(["plan", "-c", "-m", "--json", "-b", "8", "x", "--", "-", "--help"]),
                         max_size=6))


@fuzz(600)
@given(data=st.data())
def test_commands(tmp, plan_doc, data):
    tick()
    (tmp / "out").mkdir(exist_ok=True)
    if not (tmp / "plan.json").exists():
        write(tmp, "plan.json", plan_doc)
    argv = data.draw(commands(tmp))
    before = set((tmp / "out").iterdir())
    code, out, err = run_cli(argv)
    assert_outcome(argv, code, out, err)
    after = set((tmp / "out").iterdir())
    stray = [p for p in after - before if p.name.startswith(".")]
    assert not stray, f"{argv}: half-written temporary files left: {stray}"
    if "-o" in argv and code == 0 and argv[0] == "plan":
        json.loads((tmp / "out" / "plan.json").read_text())  # complete, not half a document


FUZZ_CASES = 1500 * 5 + 1000 + 800 + 1200 + 500 + 600


def test_fuzz_case_count():
    """The suite ran at least 10,000 cases (when every fuzz test above ran in this session)."""
    assert FUZZ_CASES >= 10_000
    expected = {"test_cluster_files", "test_model_files", "test_hf_configs", "test_deepspeed_json",
                "test_torchtitan_toml", "test_megatron_args", "test_plan_json", "test_layout_strings",
                "test_validation_rows", "test_commands"}
    if set(COUNT) != expected:
        pytest.skip(f"only {sorted(COUNT)} ran in this session")
    total = sum(COUNT.values())
    print(f"\nfuzz: {total:,} cases ({', '.join(f'{k[5:]} {v}' for k, v in sorted(COUNT.items()))})")
    assert total >= 10_000 * FUZZ_SCALE * 0.9, COUNT


def test_torchtitan_pipeline_degree_beyond_the_layers_is_refused_before_any_split():
    """Found by this suite at 10% scale: a TOML with pipeline_parallel_degree 2**62 made `check` build a per-stage
    list of 2**62 entries (a hang). It is refused with the limit, at once."""
    from planner.estimate import build_problem
    from planner.integrations.check import check
    from planner.integrations.readers import read_config

    doc = json.loads(json.dumps(TORCHTITAN))
    doc["parallelism"]["pipeline_parallel_degree"] = 2**62
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        view = read_config(write(Path(d), "tt.toml", _toml(doc)), gpus=8)
    out = check(view, build_problem("dgx-a100-80gb", 1, "llama2-7b", 64, 2048))
    assert out.estimate is None
    assert any(v["message"] == f"pipeline_parallel_degree: {2**62} -> at most the model's 32 layers"
               for v in out.violations), out.violations


def test_plan_json_with_a_context_degree_beyond_the_sequence_is_a_violation_not_a_crash(plan_doc, tmp):
    """Found by this suite at full scale: a plan JSON with layout.cp = 2**31 reached the estimate (the degree-product
    and CP-split violations did not stop it) and divided by zero. `check` now reports the violations only."""
    from planner.estimate import build_problem
    from planner.integrations.check import check
    from planner.integrations.readers import read_config

    doc = json.loads(json.dumps(plan_doc))
    doc["layout"]["cp"] = 2**31
    view = read_config(write(tmp, "cp.json", doc), gpus=8)
    out = check(view, build_problem("dgx-a100-80gb", 1, "llama2-7b", 64, 2048))
    assert out.estimate is None
    assert {"dp*tp*pp*cp", "cp"} <= {v["rule"] for v in out.violations}, out.violations


@pytest.mark.parametrize("key", ["memory_headroom_bytes", "step_time_seconds", "peak_memory_bytes_per_gpu"])
@pytest.mark.parametrize("value", [[], "2", -1.0, float("nan"), True])
def test_plan_json_with_a_predicted_figure_that_is_no_number_is_refused_not_a_crash(plan_doc, tmp, key, value):
    """Found by this suite (test_commands after test_plan_json's last mutation): `export` read the plan's predicted
    headroom and figures as given, and a list reached the fit test and the header's arithmetic (TypeError, exit
    9). It now exits 3 naming the field, the value and what is allowed."""
    doc = json.loads(json.dumps(plan_doc))
    doc["predicted"][key] = value
    code, out, err = run_cli(["export", str(write(tmp, "predicted.json", doc)), "--to", "torchtitan"])
    assert code == 3 and f"predicted.{key}" in err and "allowed" in err, (code, err)
