"""Failures at the command line: one exit code each (planner/errors.py's table), one JSON error document on stdout
with --json, one "please report" line for a bug (the traceback only with --debug), and output files that are
written whole, with the umask's mode, or not at all."""

import json
import os
import stat

import pytest

from planner import errors
from planner.cli import main

SMALL_PLAN = ["plan", "-c", "dgx-h100", "-n", "1", "-m", "gpt3-1.3b", "-b", "16", "-s", "1024", "--no-schedule",
              "--no-solver"]


def cli(capsys, *args):
    """Run the CLI in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def error_doc(out: str) -> dict:
    doc = json.loads(out)  # exactly one JSON document
    assert doc["kind"] == "error"
    return doc


def test_exit_code_table_is_in_help_and_readme(capsys):
    from pathlib import Path

    code, out, _ = cli(capsys, "--help")
    assert code == 0
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for number, (_, meaning) in errors.EXIT_CODES.items():
        assert f"{number}  {meaning}" in out
        assert f"| {number} |" in readme
    assert max(len(line) for line in out.splitlines()) <= 80 or os.environ.get("COLUMNS")


@pytest.mark.parametrize("args,code,name,needle", [
    (["plan", "--bogus"], errors.EXIT_USAGE, "usage", "--bogus"),
    (["models", "show", "llama3-8"], errors.EXIT_INPUT, "invalid_input", "did you mean llama3-8b"),
    (["estimate", "-c", "dgx-h100", "-m", "gpt3-175b", "-b", "8", "-s", "2048", "--layout", "tp=3,dp=1"],
     errors.EXIT_INPUT, "invalid_input", "tp: 3 -> must divide gpus_per_node (8)"),
    (["plan", "-c", "single-rtx4090", "-m", "llama3-405b", "-b", "8", "-s", "2048"], errors.EXIT_INFEASIBLE,
     "infeasible", "no layout fits"),
])
def test_json_errors_are_one_document_on_stdout(capsys, args, code, name, needle):
    rc, out, err = cli(capsys, *args, "--json")
    assert rc == code
    doc = error_doc(out)
    assert doc["exit_code"] == code and doc["error"] == name
    assert any(needle in p for p in doc["problems"]) and needle in err  # the human line stays on stderr
    assert doc["message"] == doc["problems"][0]
    from planner.contract import ErrorDocument

    ErrorDocument.model_validate(doc)


def test_without_json_stdout_stays_empty_on_error(capsys):
    rc, out, err = cli(capsys, "models", "show", "llama3-8")
    assert rc == errors.EXIT_INPUT and out == "" and err.startswith("error: ")


def test_internal_error_is_one_line_and_exit_9(capsys, monkeypatch):
    import planner.explain.catalog as catalog

    def boom(_specs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(catalog, "models_doc", boom)
    rc, out, err = cli(capsys, "models", "list", "--json")
    assert rc == errors.EXIT_INTERNAL == 9
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "please report" in err and "ZeroDivisionError" in err and "--debug" in err
    assert error_doc(out)["error"] == "internal_error"
    rc, out, err = cli(capsys, "models", "list", "--json", "--debug")
    assert rc == 9 and "Traceback (most recent call last)" in err and 'raise ZeroDivisionError("division by zero")' in err


# ---- output files ---------------------------------------------------------------------------------------------


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_output_file_is_whole_with_the_umask_mode(capsys, tmp_path, umask):
    out_path = tmp_path / "plan.json"
    rc, out, _ = cli(capsys, *SMALL_PLAN, "--json", "-o", str(out_path))
    assert rc == 0
    assert json.loads(out_path.read_text()) == json.loads(out)
    assert _mode(out_path) == 0o644  # 0666 & ~022, as open() would give; not mkstemp's 0600
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary file left
    os.chmod(out_path, 0o640)  # an existing file keeps its mode
    cli(capsys, *SMALL_PLAN, "-o", str(out_path))
    assert _mode(out_path) == 0o640
    os.umask(0o077)
    new = tmp_path / "new.json"
    cli(capsys, *SMALL_PLAN, "-o", str(new))
    assert _mode(new) == 0o600


@pytest.mark.parametrize("target", ["/nonexistent/dir/plan.json", "/proc/plan.json", "DIR"])
def test_unwritable_output_is_an_io_error(capsys, tmp_path, target):
    target = str(tmp_path) if target == "DIR" else target
    before = sorted(os.listdir(tmp_path))
    rc, out, err = cli(capsys, *SMALL_PLAN, "--json", "-o", target)
    assert rc == errors.EXIT_IO == 8
    doc = error_doc(out)
    assert doc["error"] == "io_error" and target in doc["message"]
    assert err.startswith(f"error: cannot write {target}") and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == before  # nothing half-written


def test_export_and_svg_to_a_missing_directory(capsys, tmp_path):
    plan = tmp_path / "plan.json"
    assert cli(capsys, *SMALL_PLAN, "-o", str(plan))[0] == 0
    rc, _, err = cli(capsys, "export", str(plan), "--to", "megatron", "-o", "/nonexistent/x")
    assert rc == 8 and "cannot write /nonexistent/x" in err
    rc, _, err = cli(capsys, "schedule", "--pp", "2", "-m", "4", "--svg", "/nonexistent/x.svg")
    assert rc == 8 and "cannot write /nonexistent/x.svg" in err


# ---- numeric options ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args,needle", [
    ([*SMALL_PLAN, "--headroom-gib", "nan"], "--headroom-gib: nan -> must be a finite number >= 0"),
    ([*SMALL_PLAN, "--headroom-gib", "inf"], "--headroom-gib: inf -> must be a finite number >= 0"),
    ([*SMALL_PLAN, "--headroom-gib", "-1"], "--headroom-gib: -1.0 -> must be a finite number >= 0"),
    ([*SMALL_PLAN, "--solver-time-limit", "-1"], "--solver-time-limit: -1.0 -> must be a finite number > 0"),
    ([*SMALL_PLAN, "--solver-time-limit", "nan"], "--solver-time-limit: nan -> must be a finite number > 0"),
    (["schedule", "--width", "-5"], "--width: -5 -> must be between 20 and 1000 columns"),
    (["schedule", "--pp", "0", "--micro-batches", "16", "--schedule", "interleaved_1f1b"], "--pp: 0 -> must be >= 1"),
    (["schedule", "--micro-batches", "0"], "--micro-batches: 0 -> must be >= 1"),
    (["schedule", "--schedule", "zigzag"], "--schedule: 'zigzag' -> allowed: naive, gpipe"),
])
def test_numeric_options_are_checked(capsys, args, needle):
    rc, out, err = cli(capsys, *args, "--json") if args[0] != "schedule" else cli(capsys, *args)
    assert rc == errors.EXIT_INPUT, err
    assert needle in err and "Traceback" not in err


@pytest.mark.parametrize("value", ['"eight"', "true", "2.5"])
def test_check_of_a_torchtitan_toml_with_a_non_integer_degree_is_bad_input(capsys, tmp_path, value):
    # issue #13: a string where torchtitan expects a number crashed check with a TypeError (exit 9)
    path = tmp_path / "job.toml"
    path.write_text(f"[parallelism]\ntensor_parallel_degree = {value}\n[training]\nlocal_batch_size = 8\n")
    code, out, err = cli(capsys, "check", str(path), "-c", "dgx-a100-80gb", "-n", "1", "-m", "llama3-8b",
                         "-s", "4096", "--json")
    assert code == errors.EXIT_INPUT
    doc = json.loads(out)  # check's own report, with the reason it could not check
    assert doc["kind"] == "check" and doc["passed"] is False
    assert "parallelism.tensor_parallel_degree" in doc["error"]
    assert "please report" not in err


@pytest.mark.parametrize("text, field", [("[parallelism]\ntensor_parallel_degree = 0\n", "tensor_parallel_degree"),
                                         ("[parallelism]\npipeline_parallel_microbatch_size = 0\n",
                                          "pipeline_parallel_microbatch_size"),
                                         ("[training]\nlocal_batch_size = -1\n", "local_batch_size")])
def test_check_of_a_torchtitan_toml_with_a_zero_degree_is_bad_input(capsys, tmp_path, text, field):
    # issue #13: tensor_parallel_degree = 0 crashed check with a ZeroDivisionError
    path = tmp_path / "job.toml"
    path.write_text(text)
    code, out, err = cli(capsys, "check", str(path), "-c", "dgx-a100-80gb", "-n", "1", "-m", "llama3-8b",
                         "-s", "4096", "--json")
    assert code == errors.EXIT_INPUT
    assert field in json.loads(out)["error"] and "please report" not in err


@pytest.mark.parametrize("section", ["zero_optimization", "bf16", "pipeline"])
def test_check_of_a_deepspeed_json_with_a_scalar_section_is_bad_input(capsys, tmp_path, section):
    # found by fuzzing: {"zero_optimization": 3} crashed the DeepSpeed reader with an AttributeError
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 64, section: 3}))
    code, out, err = cli(capsys, "check", str(path), "-c", "dgx-a100-80gb", "-n", "1", "-m", "llama3-8b",
                         "-s", "4096", "--json")
    assert code == errors.EXIT_INPUT
    assert section in json.loads(out)["error"] and "please report" not in err


@pytest.mark.parametrize("gpu, says", [
    ("H100-SXM", "this machine's ranks would run on CPU"),  # CI has no CUDA device
    ("H999", "unknown GPU 'H999'"),
])
def test_calibrate_refuses_a_catalog_gpu_it_cannot_measure_before_measuring(capsys, tmp_path, monkeypatch, gpu, says):
    """`calibrate --gpu NAME` keeps NAME's datasheet peak and scales it by what it measured: on CPU ranks that wrote
    the CPU's figures under an H100's name (a plan on it predicted 1.5e5 s steps, without a word). It is refused,
    as is an unknown name, before any rank starts, and no file is written."""
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("the CPU case needs a machine without CUDA")
    from planner.bench import runner

    def no_ranks(*_a, **_k):
        raise AssertionError("ranks started before the --gpu check")

    monkeypatch.setattr(runner, "run_ranks", no_ranks)
    out_file = tmp_path / "node.yaml"
    code, _, err = cli(capsys, "calibrate", "--nproc", "2", "--gpu", gpu, "-o", str(out_file))
    assert code == errors.ExitCode.INPUT
    assert says in err
    assert not out_file.exists()


@pytest.mark.parametrize("command", [
    ["scaling", "-c", "dgx-h100", "-n", "1", "-m", "llama3-8b", "-b", "16", "-s", "4096", "--node-counts", "1,2"],
    ["compare", "--clusters", "dgx-h100:1", "-m", "llama3-8b", "-b", "16", "-s", "4096"],
])
def test_a_figure_that_cannot_be_written_gives_one_error_document(capsys, tmp_path, command):
    """scaling/compare --figure into a missing folder with --json printed the report and then the error: two
    documents on stdout. The figure is drawn first now; stdout holds the error alone (exit 8: an output not
    written)."""
    code, out, _ = cli(capsys, *command, "--figure", str(tmp_path / "missing" / "f.png"), "--json")
    assert code == 8 and error_doc(out)["exit_code"] == 8


def _without_read_override() -> list[str] | None:
    """A prefix that runs a command without the superuser's file-read override (root reads a mode-000 file), or None
    where that cannot be done."""
    import shutil
    import subprocess

    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]
    return prefix if subprocess.run([*prefix, "true"], capture_output=True).returncode == 0 else None


@pytest.mark.parametrize("command", [
    ["check", "{f}", "-c", "dgx-h100", "-n", "1", "-m", "llama3-8b", "-b", "8", "-s", "4096", "--json"],
    ["check", "{f}", "{f}", "-c", "dgx-h100", "-n", "1", "-m", "llama3-8b", "-b", "8", "-s", "4096", "--json"],
    ["export", "{f}", "--to", "megatron"],
])
def test_an_input_file_the_os_will_not_read_is_exit_8(tmp_path, command):
    """An existing file without read permission: exit 8 (the operating system refused), not 2 (click's own 'path is
    not readable' usage error, which typer's Path arguments raised before the planner saw the file)."""
    import subprocess
    import sys

    prefix = _without_read_override()
    if prefix is None:
        pytest.skip("running as root without setpriv: a mode-000 file stays readable")
    path = tmp_path / "plan.json"
    path.write_text("{}")
    path.chmod(0)
    args = [str(path) if a == "{f}" else a for a in command]
    proc = subprocess.run([*prefix, sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 8, proc.stdout + proc.stderr
    assert "cannot read file" in proc.stdout + proc.stderr


def test_a_sequence_past_learned_positions_is_refused(capsys):
    """GPT-3 1.3B has learned positions for 2,048 tokens (Brown et al. 2020 n_ctx; the preset's
    max_position_embeddings): planning 4,096-token sequences was accepted and exported with --seq-length 4096 next to
    --max-position-embeddings 2048, which Megatron's validate_args rejects (max_position_embeddings >= seq_length)."""
    code, out, _ = cli(capsys, "estimate", "-c", "dgx-h100", "-m", "gpt3-1.3b", "-b", "64", "-s", "4096", "-l",
                       "tp=1,pp=1,dp=8,zero=1,mbs=1", "--json")
    doc = error_doc(out)
    assert code == 3 and "learned positions for 2048 tokens" in doc["message"]
    code, _, _ = cli(capsys, "estimate", "-c", "dgx-h100", "-m", "gpt3-1.3b", "-b", "64", "-s", "2048", "-l",
                     "tp=1,pp=1,dp=8,zero=1,mbs=1", "--json")
    assert code == 0


CLUSTER = """name: t
gpu: {gpu}
num_nodes: 1
gpus_per_node: 8
intra_node: {{kind: nvlink, gb_per_s: {nvlink}}}
inter_node: {{kind: infiniband, nics_per_node: 8, nic_gbit_per_s: 400.0}}
host_to_device: {{gb_per_s: 50.0}}
"""
H100_SMALL = ["-c", "dgx-h100", "-n", "1", "-m", "llama3-8b", "-b", "16", "-s", "4096"]


@pytest.mark.parametrize("case", [
    # (files to write, arguments; {d} is the folder), expected exit code: each crashed (exit 9), hung, or passed
    # silently before (an audit's findings, 2026-12-07)
    ({}, ["plan", *H100_SMALL, "--fix", "mbs=0"], 3),
    ({"t.toml": '[parallelism]\ntensor_parallel_degree = 1\nexpert_parallel_degree = "x"\n[training]\n'
                "local_batch_size = 1\nseq_len = 4096\n"},
     ["check", "{d}/t.toml", "-c", "dgx-h100", "-n", "1", "-m", "mixtral-8x7b", "-b", "16"], 3),
    ({"p.json": json.dumps({"layout": {"tp": 1, "pp": None, "dp": 8}, "inputs": {"training": {}},
                            "framework": "megatron"})}, ["check", "{d}/p.json", *H100_SMALL], 3),
    ({"c.yaml": CLUSTER.format(gpu="{name: X, memory_gib: 80, tflops: {}, hbm_gb_per_s: 2000}", nvlink=450)},
     ["plan", "-c", "{d}/c.yaml", "-m", "llama3-8b", "-b", "16", "-s", "4096"], 3),
    ({"c.yaml": CLUSTER.format(gpu="{name: X, memory_gib: 80, tflops: {bf16: 1.0e+308}, hbm_gb_per_s: 2000}",
                               nvlink=450)}, ["plan", "-c", "{d}/c.yaml", "-m", "llama3-8b", "-b", "16", "-s", "4096"], 3),
    ({"c.yaml": CLUSTER.format(gpu="H100-SXM", nvlink=0)},
     ["plan", "-c", "{d}/c.yaml", "-m", "llama3-8b", "-b", "16", "-s", "4096"], 3),
    ({"m.yaml": "num_layers: 4\nhidden_size: 256\nnum_attention_heads: 4\nvocab_size: 1000\nmlp: swiglu\n"
                "ffn_hidden_size: 512\nmoe: {num_experts: 1000000000000000000000000, top_k: 2, "
                "expert_ffn_hidden_size: 128}\n"}, ["plan", "-c", "dgx-h100", "-m", "{d}/m.yaml", "-b", "16", "-s",
                                                    "4096"], 3),
    ({"r.json": "[]"}, ["validate", "--runs", "{d}/r.json"], 3),
    ({}, ["plan", *H100_SMALL, "--headroom-gib", "1e308"], 3),
    ({}, ["bench", "--save-calibration", "{d}/cal.yaml", "-c", "dgx-h100", "-m", "llama3-8b", "-l", "dp=1"], 3),
    ({}, ["bench", "--timeout", "0", "-c", "dgx-h100", "-m", "llama3-8b", "-l", "dp=1"], 3),
    ({}, ["plan", *H100_SMALL, "-o", "{d}/missing/p.json", "--figures", "{d}/figs"], 8),
])
def test_bad_input_found_by_the_audit_is_refused_with_its_code(capsys, tmp_path, case):
    files, args, expected = case
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    code, out, err = cli(capsys, *[a.replace("{d}", str(tmp_path)) for a in args])
    assert code == expected, out + err
    assert "internal error" not in err and "Traceback" not in err
    assert not (tmp_path / "figs").exists()  # nothing written before the failure


def test_an_export_onto_its_own_plan_is_refused(capsys, tmp_path):
    code, _, _ = cli(capsys, *SMALL_PLAN, "-o", str(tmp_path / "plan.json"))
    assert code == 0
    before = (tmp_path / "plan.json").read_text()
    code, _, err = cli(capsys, "export", str(tmp_path / "plan.json"), "--to", "megatron", "-o",
                       str(tmp_path / "plan.json"))
    assert code == 8 and "the same file as the plan" in err and (tmp_path / "plan.json").read_text() == before


def test_output_through_a_symbolic_link_writes_its_target(capsys, tmp_path):
    (tmp_path / "target.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "target.json")
    code, _, _ = cli(capsys, *SMALL_PLAN, "-o", str(tmp_path / "link.json"))
    assert code == 0 and (tmp_path / "link.json").is_symlink()
    assert json.loads((tmp_path / "target.json").read_text())["kind"] == "plan"


def test_a_plan_checked_against_another_model_is_a_model_violation(capsys, tmp_path):
    code, _, _ = cli(capsys, *SMALL_PLAN, "-o", str(tmp_path / "plan.json"))  # gpt3-1.3b
    assert code == 0
    code, out, _ = cli(capsys, "check", str(tmp_path / "plan.json"), "-c", "dgx-h100", "-n", "1", "-m", "llama3-8b",
                       "--json")
    doc = json.loads(out)
    assert code == 1 and [v["rule"] for v in doc["violations"]][:1] == ["model"]


@pytest.mark.parametrize("name, text, needle", [
    ("a.sh", "--tensor-model-parallel-size 0 --micro-batch-size 1 --global-batch-size 16 --seq-length 4096 --bf16",
     "--tensor-model-parallel-size: 0 -> must be >= 1"),
    ("b.sh", "--micro-batch-size 1 --global-batch-size 16 --seq-length 4096 --bf16 --fp16", "--bf16 and --fp16"),
    ("c.txt", "model.tensor_model_parallel_size=0\ntrain.micro_batch_size=1\ntrain.global_batch_size=16\n",
     "model.tensor_model_parallel_size: 0 -> must be >= 1"),
    ("d.txt", "train.micro_batch_size=1\ntrain.global_batch_size=16\nmixed_precision=weird\n", "mixed_precision"),
    ("e.json", json.dumps({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 0}),
     "sequence_parallel_size: 0"),
    ("f.json", json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2,
                                                                                       "offload_optimizer": "cpu"}}),
     "offload_optimizer: 'cpu'"),
    ("g.toml", "[parallelism]\nexpert_parallel_degree = 0\n[training]\nlocal_batch_size = 1\nseq_len = 4096\n",
     "expert_parallel_degree: 0"),
    ("h.toml", '[training]\nlocal_batch_size = 1\nseq_len = 4096\nenable_cpu_offload = "no"\n',
     "enable_cpu_offload: 'no' -> must be true or false"),
])
def test_a_framework_config_with_a_value_the_framework_rejects_is_not_a_pass(capsys, tmp_path, name, text, needle):
    """Zero, negative or mistyped values were read as the default and the config PASSed; the framework would have
    refused it at start-up (an audit's findings, 2026-12-07)."""
    (tmp_path / name).write_text(text)
    code, out, err = cli(capsys, "check", str(tmp_path / name), "-c", "dgx-h100", "-n", "2", "-m", "llama3-8b", "-b",
                         "16", "-s", "4096")
    assert code == 3 and needle in out + err, out + err


@pytest.mark.parametrize("name, text", [
    ("c.yaml", "name: t\ngpu: H100-SXM\nnum_nodes: 1\nnum_nodes: 4\ngpus_per_node: 8\n"
               "intra_node: {kind: nvlink, gb_per_s: 450}\ninter_node: {kind: infiniband, nics_per_node: 8, "
               "nic_gbit_per_s: 400}\nhost_to_device: {gb_per_s: 50}\n"),
    ("c.json", '{"name": "t", "gpu": "H100-SXM", "num_nodes": 1, "num_nodes": 4}'),
])
def test_a_key_given_twice_is_refused(capsys, tmp_path, name, text):
    """YAML and JSON readers kept a repeated key's last value silently (4 nodes planned where the file also said 1);
    the layout string already refused repeats."""
    (tmp_path / name).write_text(text)
    code, out, _ = cli(capsys, "plan", "-c", str(tmp_path / name), "-m", "llama3-8b", "-b", "16", "-s", "4096",
                       "--json")
    assert code == 3 and "num_nodes: given twice" in error_doc(out)["message"]


def test_a_plan_of_another_major_schema_version_is_refused(capsys, tmp_path):
    code, _, _ = cli(capsys, *SMALL_PLAN, "-o", str(tmp_path / "plan.json"))
    doc = json.loads((tmp_path / "plan.json").read_text())
    (tmp_path / "old.json").write_text(json.dumps({**doc, "schema_version": "0.9"}))
    code, _, err = cli(capsys, "export", str(tmp_path / "old.json"), "--to", "megatron")
    assert code == 3 and "schema_version: '0.9'" in err


def test_json_before_the_command_is_the_command_s_json(capsys):
    """`planner --json plan ...` printed the plan as text (the top level's --json is --version's) and only its errors
    as JSON; it now means `planner plan ... --json`."""
    code, out, _ = cli(capsys, "--json", *SMALL_PLAN)
    assert code == 0 and json.loads(out)["kind"] == "plan"
