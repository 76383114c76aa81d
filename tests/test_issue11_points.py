"""Issue #11, point by point: one small test for each reading rule and export rule the issue names that no other
test pins on its own (docs/launch.md's table maps every point to its test, here or elsewhere). Each expected value
names the framework rule it follows (../shared/reference/frameworks.md section, or the framework's source)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from planner.estimate import build_problem
from planner.frameworks.megatron_split import nearest_split
from planner.integrations.check import check
from planner.integrations.exports import export
from planner.integrations.readers import read_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "configs"
MEGATRON_13B = ("--num-layers 40 --hidden-size 5120 --num-attention-heads 40 --ffn-hidden-size 13824 --swiglu "
                "--normalization RMSNorm --seq-length 4096 --bf16 ")


def _read(tmp_path, name: str, text: str, gpus: int = 64, **kw):
    path = tmp_path / name
    path.write_text(text)
    return read_config(path, gpus=gpus, **kw)


def _check(view, framework: str | None = None, model: str = "llama2-13b", batch: int | None = None, nodes: int = 8):
    problem = build_problem("dgx-a100-80gb", nodes, model, batch or view.global_batch_size or 256,
                            view.seq_length or 4096, "bf16", framework=framework or view.framework.value)
    return check(view, problem)


# ---- torchtitan: its defaults (frameworks.md §1.3, §1.5) and its multi-stage schedules (§1.4) --------------------

def test_torchtitan_missing_batch_and_ac_fields_take_torchtitans_defaults(tmp_path):
    view = _read(tmp_path, "job.toml", "[parallelism]\ntensor_parallel_degree = 8\npipeline_parallel_degree = 4\n"
                                       "[training]\nseq_len = 4096\n")
    f = view.fields
    # local_batch_size 8 (not 1); pipeline_parallel_microbatch_size 1 (not the whole local batch); dp = 64/(8x4)
    assert (f["dp"], f["micro_batch_size"], f["num_micro_batches"]) == (2, 1, 8)
    assert view.global_batch_size == 8 * 2  # global_batch_size -1 = local x dp
    # no [activation_checkpoint]: torchtitan's default is selective; in the <= 0.2 TOML that is layer SAC of every
    # 2nd block (selective_ac_option "2"): half of each stage's layers fully recomputed, the rest kept; the stages
    # are torchtitan's default split, one layer's allowance for the embedding and one for the output (§1.4)
    assert any("default is selective (layer SAC, every 2nd block)" in n for n in view.notes)
    lay = _check(view, batch=16).layout
    assert list(lay.layers_per_stage) == [10, 11, 10, 9]
    assert lay.recompute == "none" and list(lay.recompute_layers_per_stage) == [5, 5, 5, 4]
    # in a 0.3 recipe it is per-op SAC: Megatron's selective is the nearest the cost model has
    recipe = _read(tmp_path, "job.py", "from torchtitan.config import ParallelismConfig, TrainingConfig\n"
                                       "from torchtitan.trainer import Trainer\n\n\ndef job():\n"
                                       "    return Trainer.Config(parallelism=ParallelismConfig(tensor_parallel_degree=8,"
                                       " pipeline_parallel_degree=4), training=TrainingConfig(seq_len=4096))\n")
    assert recipe.fields["recompute"] == "selective" and recipe.fields["num_micro_batches"] == 8


@pytest.mark.parametrize("name, schedule", [("Interleaved1F1B", "interleaved_1f1b"), ("LoopedBFS", "interleaved_1f1b"),
                                            ("InterleavedZeroBubble", "zero_bubble"), ("DualPipeV", "zero_bubble"),
                                            ("ZBVZeroBubble", "zero_bubble")])
def test_torchtitan_multi_stage_schedules_keep_their_virtual_stages(tmp_path, name, schedule):
    view = _read(tmp_path, "job.toml", "[parallelism]\ntensor_parallel_degree = 8\npipeline_parallel_degree = 4\n"
                                       f"pipeline_parallel_schedule = \"{name}\"\n[training]\nlocal_batch_size = 8\n"
                                       "seq_len = 4096\n")
    out = _check(view)
    # torchtitan's default for a multi-stage schedule: 2 stages per rank (frameworks.md §1.4), not read as 1F1B
    assert out.layout.schedule == schedule and out.layout.pp == 4
    if schedule == "interleaved_1f1b":
        assert out.layout.virtual_stages == 2
    if schedule == "zero_bubble":  # predicted as ZB-H1, which torchtitan cannot run: the check says so
        from planner.estimate import assumptions_json
        from planner.frameworks.capabilities import TORCHTITAN_ZERO_BUBBLE

        assert out.problem.knobs.profile == "torchtitan"
        assert any(a["statement"] == TORCHTITAN_ZERO_BUBBLE for a in assumptions_json(out.problem, out.layout, out.estimate))


# ---- Megatron-LM / Megatron-DeepSpeed arguments (frameworks.md §2.3-2.7, §3.4) --------------------------------------

def test_megatron_checkpoint_activations_is_refused_by_megatron_lm_and_full_under_megatron_deepspeed(tmp_path):
    args = "--tensor-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 256 --checkpoint-activations "
    lm = _check(_read(tmp_path, "lm.sh", args + MEGATRON_13B))
    assert any(v["rule"] == "recompute" and "no longer valid" in v["message"] for v in lm.violations)
    ds = _read(tmp_path, "ds.sh", args + "--deepspeed --zero-stage 1 " + MEGATRON_13B)
    assert ds.fields["recompute"] == "full" and ds.framework.value == "megatron-deepspeed"


def test_megatron_zero_stage_and_megatron_fsdp_are_read(tmp_path):
    base = "--tensor-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 256 " + MEGATRON_13B
    assert _read(tmp_path, "a.sh", base + "--deepspeed --zero-stage 2").fields["zero_stage"] == 2
    plain = _read(tmp_path, "b.sh", base + "--zero-stage 2")  # Megatron-LM has no --zero-stage: said, not read
    assert plain.fields["zero_stage"] == 0 and any("--zero-stage 2: read only with --deepspeed" in n
                                                   for n in plain.notes)
    assert _read(tmp_path, "c.sh", base + "--use-megatron-fsdp").fields["zero_stage"] == 3  # optim_grads_params
    two = _read(tmp_path, "d.sh", base + "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads")
    assert two.fields["zero_stage"] == 2


def test_megatron_block_recompute_in_quoted_shell_variables(tmp_path):
    view = read_config(CONFIGS / "megatron" / "llama2_7b_quoted_vars.sh", gpus=8)
    out = _check(view, model="llama2-7b", nodes=1)
    lay = out.layout
    # the arguments inside GPT_ARGS="..." are read: tp 2 on 8 GPUs, and --recompute-method block
    # --recompute-num-layers 8 fully recomputes 8 of the 32 layers, the others keep everything (frameworks.md §2.4)
    assert (lay.tp, lay.pp, lay.dp, lay.zero_stage) == (2, 1, 4, 1)
    assert lay.recompute == "none" and list(lay.recompute_layers_per_stage) == [8]
    assert out.violations == []


def test_megatron_sequence_parallel_with_tp1_is_a_note_not_a_failure(tmp_path):
    view = _read(tmp_path, "sp.sh", "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 8 "
                                    "--micro-batch-size 1 --global-batch-size 256 --sequence-parallel "
                                    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
                                    + MEGATRON_13B)
    out = _check(view)
    assert out.layout.sequence_parallel is False
    assert not any(v["rule"] == "sequence_parallel" for v in out.violations)
    assert any("Disabling sequence parallelism" in n for n in out.notes)


def test_megatron_ignored_options_are_named(tmp_path):
    view = _read(tmp_path, "x.sh", "--tensor-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 256 "
                                   "--moe-router-topk 2 --fp8-param-gather --lr 1e-4 " + MEGATRON_13B)
    ignored = [n for n in view.notes if n.startswith("ignored options")]
    assert ignored and "--moe-router-topk" in ignored[0]
    # read since FP8 configs are read (--fp8-format); alone it does nothing, and a note says so
    assert any(n.startswith("--fp8-param-gather without --fp8-format") for n in view.notes)
    assert "--lr" not in ignored[0]  # harmless for memory and time: not noise


# ---- DeepSpeed JSON (frameworks.md §3.2) ------------------------------------------------------------------------

@pytest.mark.parametrize("triad, want", [
    ({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2}, (2, 2, 256)),  # GA = 256 / (2 x 64)
    ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}, (2, 4, 512)),  # train = 2 x 4 x 64
    ({"train_batch_size": 256, "gradient_accumulation_steps": 2}, (2, 2, 256)),  # micro = 256 / (2 x 64)
    ({"train_batch_size": 128}, (2, 1, 128)),  # GA 1, micro = 128 / 64
])
def test_deepspeed_batch_triad_is_derived_as_deepspeed_derives_it(tmp_path, triad, want):
    view = _read(tmp_path, "ds.json", json.dumps({**triad, "zero_optimization": {"stage": 1}}))
    f = view.fields
    assert (f["micro_batch_size"], f["num_micro_batches"], view.global_batch_size) == want
    out = _check(view, batch=view.global_batch_size)
    assert not any(v["rule"] == "global_batch_size" for v in out.violations)


def test_deepspeed_precision_comes_from_the_config(tmp_path):
    from planner.integrations.check import check_file

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 1,
                                "fp16": {"enabled": True, "loss_scale": 0},
                                "zero_optimization": {"stage": 2, "overlap_comm": True}}))
    args = SimpleNamespace(cluster="dgx-a100-80gb", nodes=8, model="llama2-13b", fix=None, tp=None, pp=None,
                           global_batch_size=None, seq_len=4096, precision="bf16", headroom_gib=2.0,
                           calibration=None, framework=None, allow_tp_across_nodes=False)
    report = check_file(path, args)
    assert report["predicted"] is not None
    assert "precision fp16 from the config (not --precision bf16)" in report["notes"]
    fp16 = build_problem("dgx-a100-80gb", 8, "llama2-13b", 256, 4096, "fp16", framework="deepspeed")
    from planner.inputs.specs import LayoutSpec

    lay = LayoutSpec.model_validate(report["layout"])
    assert report["predicted"]["step_time_seconds"] == pytest.approx(fp16.estimate(lay).step_seconds, rel=1e-9)


def test_mfu_above_one_is_never_printed(tmp_path):
    from io import StringIO

    from rich.console import Console

    from planner.integrations.check import render_report

    buf = StringIO()
    report = {"config": "x", "format": "deepspeed", "framework": "deepspeed", "error": None, "violations": [],
              "notes": [], "passed": True,
              "predicted": {"mfu": 2.37, "step_time_seconds": 1.0, "tokens_per_second": 1.0,
                            "peak_memory_bytes_per_gpu": 2**30, "gpu_memory_bytes": 2**34, "peak_memory_stage": 0}}
    render_report(Console(file=buf, width=200), report, several=False)
    assert "MFU" not in buf.getvalue() and "predicted:" in buf.getvalue()


# ---- exports (frameworks.md §2.3, §2.7, §3.3) -----------------------------------------------------------------------

def test_megatron_first_last_split_leaves_an_even_middle_for_405b_on_32_stages():
    # Llama-3 405B: 126 layers on pp 32; the plan's split had 4 first and 3 last (119 middle over 30: refused)
    target = [4] + [4] * 30 + [3]
    got = nearest_split(126, 32, 1, [*target[:-1], 126 - sum(target[:-1])])
    first, *middle, last = got
    assert sum(got) == 126 and len(set(middle)) == 1 and (126 - first - last) % 30 == 0


def _roundtrip_plan(name: str, framework: str | None = None, **fields) -> dict:
    from test_roundtrip import _plan

    doc = _plan(name, framework)
    doc["layout"].update(fields)
    return doc


def test_megatron_zero3_export_has_no_gradient_accumulation_fusion_and_the_connections_variable():
    text = export(_roundtrip_plan("zero3-fsdp", "megatron"), "megatron").text.splitlines()
    assert "--no-gradient-accumulation-fusion" in text and "--use-megatron-fsdp" in text
    assert any(line.startswith("# export CUDA_DEVICE_MAX_CONNECTIONS=8") for line in text)
    tp = export(_roundtrip_plan("interleaved-zero1", "megatron"), "megatron").text.splitlines()
    assert any(line.startswith("# export CUDA_DEVICE_MAX_CONNECTIONS=1") for line in tp)


def test_torchtitan_export_is_a_python_recipe_and_the_toml_behind_an_option():
    doc = _roundtrip_plan("interleaved-zero1", "torchtitan")
    assert "def planner_job() -> Trainer.Config:" in export(doc, "torchtitan").text
    toml = export(doc, "torchtitan", torchtitan_format="toml").text
    assert "[parallelism]" in toml and "def planner_job" not in toml


def test_deepspeed_export_never_drops_tp_zero_bubble_or_the_split():
    from cluster_specs import SpecError

    tp = export(_roundtrip_plan("zero1-offload-optimizer", "deepspeed"), "deepspeed")  # tp 8, pp 1
    assert json.loads(tp.text)["tensor_parallel"] == {"autotp_size": 8}
    with pytest.raises(SpecError, match="tp: 8 with pp 4"):  # AutoTP does not combine with the pipeline engine
        export(_roundtrip_plan("interleaved-zero1", "deepspeed"), "deepspeed")
    zb = export(_roundtrip_plan("interleaved-zero1", "deepspeed", tp=1, dp=16, num_micro_batches=16,
                                schedule="zero_bubble", virtual_stages=1, sequence_parallel=False),
               "deepspeed")
    assert any(c.startswith("schedule zero_bubble -> 1f1b") for c in zb.changes) and zb.predicted is not None
    assert any("--pp 4" in n for n in zb.notes)  # the pipeline degree, which the JSON cannot hold, is said
    uneven = export(_roundtrip_plan("uneven+per-stage-recompute", "deepspeed", tp=1, dp=16, num_micro_batches=16,
                                    sequence_parallel=False), "deepspeed")
    assert uneven.changes and uneven.layout.layers_per_stage != _roundtrip_plan(
        "uneven+per-stage-recompute")["layout"]["layers_per_stage"]


def test_torchrun_with_a_program_gets_no_plan_path():
    doc = _roundtrip_plan("zero2")
    own = export(doc, "torchrun", program="train.py").text
    assert own.rstrip().endswith("train.py") and "plan.json" not in own
    args = export(doc, "torchrun", program="train.py", program_args="--config c.yaml").text
    assert args.rstrip().endswith("train.py --config c.yaml")
    assert export(doc, "torchrun").text.rstrip().endswith("-m planner.bench plan.json")
