"""Real configs, in the shape of the frameworks' shipped examples (tests/data/configs), with the verdict a user
expects: a config that trained on the hardware it was written for passes; one that cannot fit fails with the
number and a fix; one the framework itself refuses fails with the framework's reason. Also the README's CI
recipes (pre-commit hook, GitHub Actions step) run as written."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "configs"


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, timeout=180,
                          cwd=cwd)


# (config, cluster, nodes, model, extra options, exit code, what the report must say)
CASES = [
    # torchtitan's own Llama-3 runs (benchmarks/llama3_h100_202412_torchtitan.md: 8, 64 and 128 H100s)
    ("torchtitan/llama3_8b.toml", "dgx-h100", 1, "llama3-8b", [], 0, ["torchtitan <= 0.2 TOML"]),
    ("torchtitan/llama3_8b_recipe.py", "dgx-h100", 1, "llama3-8b", [], 0, ["torchtitan 0.3 Python recipe"]),
    ("torchtitan/llama3_70b.toml", "dgx-h100", 8, "llama3-70b", [], 0, []),
    ("torchtitan/llama3_405b.toml", "dgx-h100", 16, "llama3-405b", [], 0, []),
    # the 70B without activation checkpointing cannot fit: the number and the remedy
    ("torchtitan/llama3_70b_no_ac.toml", "dgx-h100", 8, "llama3-70b", [], 1,
     [r"memory: \d+\.\d GiB live tensors", "recompute=full fits at"]),
    # Megatron-LM's GPT-3 175B example script (bash arrays, torchrun line) on 1,024 A100s
    ("megatron/gpt3_175b.sh", "dgx-a100-80gb", 128, "gpt3-175b", [], 0, ["--attention-backend"]),
    # arguments inside quoted shell variables, block recompute
    ("megatron/llama2_7b_quoted_vars.sh", "dgx-a100-80gb", 1, "llama2-7b", [], 0, []),
    # ... checked against the wrong model: said, and failed
    ("megatron/llama2_7b_quoted_vars.sh", "dgx-a100-80gb", 1, "llama2-13b", [], 1,
     ["the config describes a different model", "num_layers 32"]),
    # Megatron-LM's GPT-3 175B example as shipped (d98e8a64): --global-batch-size with --step-batch-size-schedule,
    # which Megatron-LM's validate_args refuses (arguments.py L698-700)
    ("megatron/train_gpt3_175b_distributed.sh", "dgx-a100-80gb", 16, "gpt3-175b", [], 1,
     ["Cannot specify both --step-batch-size-schedule and --global-batch-size"]),
    # BLOOM-176B's own tr11 slurm script (bigscience 9e64edec, trimmed): its launch after a commented-out option
    # ending in a backslash, through srun ... bash -c "$LAUNCHER ... $CMD"
    ("megatron-deepspeed/tr11_176b_ml.slurm", "dgx-a100-80gb", 48, "bloom-176b", [], 0, ["BF16_Optimizer"]),
    # BLOOM-176B (Megatron-DeepSpeed, 384 A100s), its arguments and its ds_config (a DeepSpeed JSON is checked as
    # plain DeepSpeed unless --framework says which framework runs it: this one is Megatron-DeepSpeed's)
    ("megatron-deepspeed/bloom176b.sh", "dgx-a100-80gb", 48, "bloom-176b", [], 0, ["BF16_Optimizer"]),
    ("megatron-deepspeed/bloom176b_ds_config.json", "dgx-a100-80gb", 48, "bloom-176b",
     ["--tp", "4", "--pp", "12", "-s", "2048", "--fix", "recompute=full", "--framework", "megatron-deepspeed"], 0,
     []),
    # DeepSpeedExamples' ZeRO-3 offload config, 7B, 8 sequences of 2048 per GPU without checkpointing: too big
    ("deepspeed/zero3_offload.json", "dgx-a100-80gb", 1, "llama2-7b", ["-s", "2048"], 1,
     ["GiB live tensors", "recompute=full fits"]),
    ("deepspeed/zero3_offload.json", "dgx-a100-80gb", 1, "llama2-7b", ["-s", "2048", "--fix", "recompute=full"], 0, []),
    # MiCS (ZeRO-3 over groups of 8, the README's example): predicted as it ran, and refused by DeepSpeed 0.19.8
    ("deepspeed/zero3_mics.json", "dgx-h100", 128, "llama3-8b", ["-s", "8192"], 1,
     ["DeepSpeed 0.19.8 refuses it at start-up", "read as hybrid sharding over 8 of the 1024 dp ranks",
      r'"dp_shard": 8']),
    # a triad DeepSpeed's own assertion rejects (100 != 3 x 4 x 8)
    ("deepspeed/zero1_bad_triad.json", "dgx-a100-80gb", 1, "llama2-7b", ["-s", "2048"], 1,
     ["train_batch_size 100 != micro 3 x GA 4 x data-parallel size 8"]),
    # the Hugging Face Trainer's "auto" config, filled from -b and the cluster
    ("hf/ds_config_zero2_auto.json", "dgx-a100-80gb", 1, "llama2-7b",
     ["-s", "2048", "-b", "64", "--fix", "recompute=full"], 0,
     ["filled as the Hugging Face Trainer does", "transformers' RMSNorm \\(LlamaRMSNorm"]),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[3]}-{c[5]}" for c in CASES])
def test_real_config_verdicts(case):
    name, cluster, nodes, model, extra, code, says = case
    proc = run("check", str(CONFIGS / name), "-c", cluster, "-n", str(nodes), "-m", model, *extra, "--json")
    assert proc.returncode == code, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    text = json.dumps(report)
    for pattern in says:
        assert re.search(pattern, text), (pattern, report)
    assert report["predicted"] is None or report["predicted"]["mfu"] <= 1.0
    hints = [v["hint"] for v in report["violations"]]
    for h in hints:  # no remedy said twice
        parts = h.split("; ")
        assert len(parts) == len(set(parts)), h


def test_several_files_one_document_and_the_worst_exit_code(tmp_path):
    bad = tmp_path / "broken.toml"
    bad.write_text("[parallelism\n")
    good = CONFIGS / "torchtitan/llama3_70b.toml"
    fails = CONFIGS / "torchtitan/llama3_70b_no_ac.toml"
    proc = run("check", str(good), str(fails), "-c", "dgx-h100", "-n", "8", "-m", "llama3-70b", "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["kind"] == "check-batch" and doc["exit_code"] == 1
    assert [r["passed"] for r in doc["reports"]] == [True, False]
    proc = run("check", str(good), str(bad), "-c", "dgx-h100", "-n", "8", "-m", "llama3-70b", "--json")
    doc = json.loads(proc.stdout)  # could-not-check wins (exit 3), still one JSON document
    assert proc.returncode == 3 and doc["reports"][1]["error"] and "malformed TOML" in doc["reports"][1]["error"]
    proc = run("check", str(bad), "-c", "dgx-h100", "-n", "8", "-m", "llama3-70b", "--json")
    assert proc.returncode == 3 and json.loads(proc.stdout)["error"]


def test_unexpanded_variable_is_a_clear_error(tmp_path):
    path = tmp_path / "args.sh"
    path.write_text("torchrun pretrain_gpt.py --tensor-model-parallel-size $TP --micro-batch-size 1\n")
    proc = run("check", str(path), "-c", "dgx-a100-80gb", "-n", "1", "-m", "llama2-7b", "-s", "2048")
    assert proc.returncode == 3 and "unexpanded shell variable" in proc.stderr and "usage" not in proc.stderr


def _readme_block(after: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(after)
    block = text[text.index("```yaml", start) + 7:]
    return block[:block.index("```")]


def test_readme_pre_commit_hook_runs_as_written(tmp_path):
    import yaml

    hook = yaml.safe_load(_readme_block("As a pre-commit hook"))["repos"][0]["hooks"][0]
    configs = tmp_path / "configs"
    configs.mkdir()
    for src in ("torchtitan/llama3_70b.toml", "hf/ds_config_zero2_auto.json"):
        (configs / Path(src).name).write_text((CONFIGS / src).read_text())
    files = sorted(str(p.relative_to(tmp_path)) for p in configs.iterdir() if re.match(hook["files"], str(
        p.relative_to(tmp_path))))
    assert len(files) == 2
    entry = hook["entry"].split()
    assert entry[0] == "planner"
    proc = run(*entry[1:], *files, cwd=tmp_path)  # pre-commit passes every matching file at once
    assert proc.returncode in (0, 1), proc.stderr  # checked (pass or violation), never "could not check"
    assert "COULD NOT CHECK" not in proc.stdout


def test_readme_github_actions_step_runs_as_written(tmp_path):
    import yaml

    step = yaml.safe_load(_readme_block("As a GitHub Actions step"))[0]
    line = [ln for ln in step["run"].splitlines() if ln.strip().startswith("planner check")][0].split()
    configs = tmp_path / "configs"
    configs.mkdir()
    target = line[2]
    (tmp_path / target).write_text((CONFIGS / "torchtitan/llama3_70b.toml").read_text())
    proc = run(*line[1:], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _check_json(name, cluster, nodes, model, *extra):
    proc = run("check", str(CONFIGS / name), "-c", cluster, "-n", str(nodes), "-m", model, *extra, "--json")
    return proc, (json.loads(proc.stdout) if proc.stdout.strip() else None)


def test_a_pipeline_schedule_with_pp_1_is_unused_not_a_violation():
    """torchtitan v0.2.2's deepseek_v3_671b.toml (and deepseek_v3_16b.toml) set pipeline_parallel_schedule
    Interleaved1F1B with pipeline_parallel_degree 1: torchtitan builds a schedule only when parallel_dims.pp_enabled
    (torchtitan train.py@v0.2.2 L218, trainer.py@release/0.3 L443), so the run has no pipeline and no schedule."""
    proc, report = _check_json("torchtitan/deepseek_v3_671b.toml", "dgx-h100", 64, "deepseek-v3")
    assert report is not None, proc.stderr
    rules = [v["rule"] for v in report["violations"]]
    assert "schedule" not in rules and "virtual_stages" not in rules, report["violations"]
    assert report["layout"]["pp"] == 1 and report["layout"]["virtual_stages"] == 1
    assert report["layout"]["schedule"] == "1f1b"
    assert any("Interleaved1F1B" in n and "pp 1" in n and "unused" in n for n in report["notes"]), report["notes"]
    assert report["predicted"] is not None


REGISTRY = "torchtitan/llama3_config_registry.py"  # torchtitan@release/0.3 config_registry.py, four of its functions


def test_a_module_of_several_config_functions_is_refused_naming_them():
    """torchtitan@release/0.3's llama3/config_registry.py holds one config function per run (torchtitan runs the one
    its --config names); read together they mixed tp 8 (llama3_70b), flavor debugmodel, Interleaved1F1B and local
    batch 8 into one run that no function describes."""
    proc, report = _check_json(REGISTRY, "dgx-h100", 8, "llama3-70b")
    assert proc.returncode == 3 and report["error"], proc.stdout
    for name in ("llama3_debugmodel", "llama3_8b", "llama3_8b_mxfp8", "llama3_70b", "--config-function NAME"):
        assert name in report["error"]


def test_the_config_function_named_is_the_one_read():
    """llama3_70b() as release/0.3 writes it: ParallelismConfig(tensor_parallel_degree=8), TrainingConfig(
    local_batch_size=8, seq_len=8192), FullAC, model_registry("70B"); no pipeline (its schedule is the default)."""
    proc, report = _check_json(REGISTRY, "dgx-h100", 8, "llama3-70b", "--config-function", "llama3_70b")
    assert proc.returncode in (0, 1) and report["error"] is None, proc.stdout + proc.stderr
    lay = report["layout"]
    assert (lay["tp"], lay["pp"], lay["micro_batch_size"], lay["recompute"]) == (8, 1, 8, "full")
    assert not [v for v in report["violations"] if v["rule"] == "model"], report["violations"]  # flavor 70B, not debug
    assert "read config function llama3_70b()" in report["notes"]


def test_a_derived_config_function_is_read_over_its_base():
    """llama3_8b_mxfp8() starts from llama3_8b() (local batch 1, seq 8192) and sets
    config.compile = CompileConfig(enable=True, components=["model"])."""
    proc, report = _check_json(REGISTRY, "dgx-h100", 1, "llama3-8b", "--config-function", "llama3_8b_mxfp8")
    assert report is not None and report["error"] is None, proc.stdout + proc.stderr
    assert report["layout"]["micro_batch_size"] == 1
    text = " ".join(report["notes"])
    assert "built on llama3_8b()" in text and "torch.compile" in text


@pytest.mark.parametrize("name,config,needle", [
    (REGISTRY, "llama3_1b", "'llama3_1b' -> one of llama3_debugmodel, llama3_8b, llama3_8b_mxfp8, llama3_70b"),
    ("torchtitan/llama3_8b.toml", "llama3_8b", "names a function of a torchtitan Python recipe module"),
])
def test_a_config_function_that_is_not_there_is_a_clear_error(name, config, needle):
    proc, report = _check_json(name, "dgx-h100", 1, "llama3-8b", "--config-function", config)
    assert proc.returncode == 3 and needle in report["error"], proc.stdout


PIPELINE_NO_PRECISION = "deepspeed/pipeline_no_precision.json"  # DeepSpeedExamples pipeline_parallelism/ds_config.json


def test_a_deepspeed_config_without_a_16_bit_section_is_checked_in_fp32():
    """DeepSpeedExamples' training/pipeline_parallelism/ds_config.json has neither a bf16 nor an fp16 section: both
    default to enabled=false (DeepSpeed runtime/precision_config.py DeepSpeedBF16Config / DeepSpeedFP16Config), so
    the engine keeps the model in fp32. It was predicted in bf16 without a word."""
    args = ("--pp", "2", "-s", "2048")
    proc, fp32 = _check_json(PIPELINE_NO_PRECISION, "dgx-a100-80gb", 1, "llama2-7b", *args)
    assert fp32 is not None and fp32["error"] is None, proc.stdout + proc.stderr
    assert (fp32["precision"], fp32["precision_source"], fp32["fp8_recipe"]) == ("fp32", "framework default", None)
    assert any("fp32" in n and "DeepSpeed's default" in n for n in fp32["notes"]), fp32["notes"]
    proc, bf16 = _check_json(PIPELINE_NO_PRECISION, "dgx-a100-80gb", 1, "llama2-7b", *args, "--precision", "bf16")
    assert (bf16["precision"], bf16["precision_source"]) == ("bf16", "--precision")
    assert any("--precision bf16" in n and "fp32" in n for n in bf16["notes"]), bf16["notes"]
    # fp32 moves 4-byte activations and weights through the A100's 19.5 TFLOP/s fp32 peak (tf32 aside), not 312 bf16
    assert fp32["predicted"]["step_time_seconds"] > 2 * bf16["predicted"]["step_time_seconds"]
    assert fp32["predicted"]["peak_memory_bytes_per_gpu"] > bf16["predicted"]["peak_memory_bytes_per_gpu"]


def test_bridge_overrides_take_the_recipe_defaults_they_do_not_show():
    """Megatron-Bridge's quick-start overrides (docs/megatron-lm-to-megatron-bridge.md) set no ddp.* key: every pretrain
    recipe builds on _pretrain_common(), whose DistributedDataParallelConfig sets use_distributed_optimizer=True
    (recipes/common.py@067f987d L87) and mixed_precision="bf16_mixed" (L130; frameworks.md §4.4). It was read as
    ZeRO-0 and failed on memory with no note; tp, pp, cp and recompute come from a recipe the planner cannot see."""
    proc, report = _check_json("nemo/bridge_quickstart_overrides.txt", "dgx-h100", 1, "llama3-8b")
    assert report is not None and report["error"] is None, proc.stdout + proc.stderr
    assert report["layout"]["zero_stage"] == 1
    assert (report["precision"], report["precision_source"]) == ("bf16", "framework default")
    notes = " | ".join(report["notes"])
    assert "ddp.use_distributed_optimizer" in notes and "_pretrain_common" in notes, notes
    for key in ("model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
                "model.context_parallel_size", "model.recompute_granularity"):
        assert key in notes, (key, notes)


# NeMo-Framework-Launcher@26e42fa9 conf/training YAML (NeMo 1.x): (file, cluster, nodes, model, extra, expected layout
# fields, as each file writes them: tensor/pipeline/virtual/context/expert parallel sizes, micro and global batch,
# sequence parallelism; the distributed optimizer is optim.name mcore_distributed_optim, NeMo's
# megatron_base_model.py L151-152)
LAUNCHER = [
    ("nemo/launcher_llama3_8b.yaml", "dgx-h100", 16, "llama3-8b", ["-s", "8192"],
     {"tp": 1, "pp": 1, "cp": 2, "dp": 64, "micro_batch_size": 1, "num_micro_batches": 2048 // 64, "zero_stage": 1,
      "recompute": "none", "sequence_parallel": False}),
    # its data.seq_length and model.encoder_seq_length are 2048; its ffn_hidden_size is a Hydra interpolation
    ("nemo/launcher_gpt3_175b.yaml", "dgx-a100-80gb", 128, "gpt3-175b", [],
     {"tp": 4, "pp": 8, "virtual_stages": 6, "schedule": "interleaved_1f1b", "dp": 32, "micro_batch_size": 1,
      "num_micro_batches": 2048 // 32, "zero_stage": 1, "sequence_parallel": True}),
    # sequence_parallel: True at tensor_model_parallel_size 1: NeMo turns it off (megatron_base_model.py L1019-1025)
    ("nemo/launcher_mixtral_8x7b.yaml", "dgx-h100", 8, "mixtral-8x7b", [],
     {"tp": 1, "pp": 4, "virtual_stages": 8, "ep": 8, "dp": 16, "micro_batch_size": 1, "num_micro_batches": 16,
      "zero_stage": 1, "sequence_parallel": False}),
]


@pytest.mark.parametrize("case", LAUNCHER, ids=[c[0] for c in LAUNCHER])
def test_nemo_launcher_yaml_is_read_as_nemo_reads_it(case):
    """These were parsed as a Megatron shell script: llama3_8b "micro_batch_size: missing" and 204.5 GiB, gpt3/175b
    "cannot split Megatron arguments: No closing quotation" (exit 3)."""
    name, cluster, nodes, model, extra, fields = case
    proc, report = _check_json(name, cluster, nodes, model, *extra)
    assert report is not None and report["error"] is None, proc.stdout + proc.stderr
    assert (report["format"], report["framework"]) == ("nemo-launcher", "nemo")
    assert {k: report["layout"][k] for k in fields} == fields
    assert (report["precision"], report["precision_source"]) == ("bf16", "config")  # trainer.precision: bf16
    assert not [v for v in report["violations"] if v["rule"] in ("micro_batch_size", "model")], report["violations"]


def test_nemo_launcher_notes_what_nemo_changes_and_what_is_not_read():
    _, mixtral = _check_json("nemo/launcher_mixtral_8x7b.yaml", "dgx-h100", 8, "mixtral-8x7b")
    assert any("model.sequence_parallel true with tp 1" in n for n in mixtral["notes"]), mixtral["notes"]
    _, gpt3 = _check_json("nemo/launcher_gpt3_175b.yaml", "dgx-a100-80gb", 128, "gpt3-175b")
    assert any("not resolved" in n and "model.ffn_hidden_size" in n for n in gpt3["notes"]), gpt3["notes"]
    assert any("ub_tp_comm_overlap" in n for n in gpt3["notes"])  # ub_tp_comm_overlap: False at tp 4


def test_a_megatron_bridge_override_yaml_is_read_as_its_overrides():
    """Megatron-Bridge's qwen3_vl_pretrain_override_example.yaml nests run_recipe.py's KEY=VALUE overrides: tp 1, pp 1,
    cp 1, recompute full/uniform/1, micro batch 4, global batch 8, dataset.seq_length 4096 (it was read as a Megatron
    script: "--seq-len: the config does not say"). On 8 GPUs its batch does not divide (8 < 4 x 8): a violation."""
    proc, report = _check_json("nemo/bridge_qwen3_vl_override.yaml", "dgx-h100", 1, "llama3-8b")
    assert report is not None and report["error"] is None, proc.stdout + proc.stderr
    assert report["format"] == "nemo"
    lay = report["layout"]
    assert (lay["tp"], lay["pp"], lay["micro_batch_size"], lay["recompute"], lay["zero_stage"]) == (1, 1, 4, "full", 1)
    assert [v["rule"] for v in report["violations"]] == ["global_batch_size"]
    assert not any("model.tensor_model_parallel_size" in n for n in report["notes"])  # the file sets them


def test_a_yaml_that_is_no_nemo_config_is_refused_naming_the_formats(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("name: my-cluster\nnodes: 4\n")
    proc = run("check", str(path), "-c", "dgx-h100", "-n", "1", "-m", "llama3-8b", "-s", "4096")
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    assert "neither a Megatron-Bridge override file nor a NeMo-Framework-Launcher" in proc.stderr
    assert "KEY=VALUE lines" in proc.stderr


@pytest.mark.parametrize("text", [
    "trainer: {devices: 8, num_nodes: 1, precision: bf16}\nmodel:\n  tensor_model_parallel_size: {a: 1}\n"
    "  micro_batch_size: 1\n  global_batch_size: 64\n",
    "model:\n  tensor_model_parallel_size: [2]\ntrain:\n  micro_batch_size: 1\n",
])
def test_a_nemo_yaml_section_where_one_value_belongs_is_refused(tmp_path, text):
    """`tensor_model_parallel_size: {a: 1}` was read as no value and tp 1 taken in silence (audit of 2026-12-08)."""
    from cluster_specs import SpecError
    from planner.integrations.readers import read_config

    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="tensor_model_parallel_size: (dict|list) -> one value"):
        read_config(path, gpus=8)


def test_a_nemo_launcher_file_s_problems_name_its_own_keys(tmp_path):
    """A NeMo-Framework-Launcher file says model.micro_batch_size; its error named Bridge's train.micro_batch_size,
    a key the file does not have (audit of 2026-12-08)."""
    from cluster_specs import SpecError
    from planner.integrations.readers import read_config

    path = tmp_path / "cfg.yaml"
    path.write_text("trainer: {devices: 8, num_nodes: 1, precision: bf16}\nmodel:\n  micro_batch_size: -1\n"
                    "  global_batch_size: 64\n")
    with pytest.raises(SpecError, match=r"model\.micro_batch_size: -1 -> must be >= 1"):
        read_config(path, gpus=8)
