"""Megatron-Core's --pipeline-model-parallel-layout (Bridge model.pipeline_model_parallel_layout), as `check` reads it:
the per-rank split and virtual stages it builds, the start-up rules it breaks, and agreement with megatron-core's own
PipelineParallelLayerLayout."""

import json
import re
import subprocess
import sys

import pytest

from planner.frameworks.megatron_split import MegatronSplitError, layout_stage_layers, parse_layout

# Megatron-LM docs, "Custom Pipeline Model Parallel Layout": DeepSeek-V3 (61 decoder layers + 1 MTP layer) at
# PP 16 x VPP 2 -> PP rank 0: embedding + 3 decoders | 2 decoders; ranks 1-13: 2 | 2; rank 14: 2 | mtp; rank 15: 2 | loss
DEEPSEEK_V3_LAYOUT = "Et*3|(tt|)*29,m|L"
DEEPSEEK_V3_SPLIT = [5] + [4] * 13 + [2, 2]


def _split(text, pp, layers, mtp=None):
    layout = parse_layout(text, pp)
    return layout.virtual_stages, layout_stage_layers(layout, layers, mtp)


def test_the_documented_deepseek_v3_layout():
    assert _split(DEEPSEEK_V3_LAYOUT, 16, 61, 1) == (2, DEEPSEEK_V3_SPLIT)


# (layout, pp, decoder layers, mtp layers): published launch scripts' layouts (a DeepSeek-V3 FP8 recipe
# "Et*2|(tt|)*22t|(tt|)*7mL"; a 45-layer MoE at pp 4 "Et|(tt|)*22L"; a 43-layer model "Et*11|t*11|t*11|t*10mL") and
# ones Megatron refuses: wrong decoder count, MTP count, a stray character, a stage count pp does not divide,
# E or L missing or repeated, a decoder after the MTP layer, MTP outside the rank's last virtual stage.
CASES = [
    (DEEPSEEK_V3_LAYOUT, 16, 61, 1), ("Et*2|(tt|)*22t|(tt|)*7mL", 16, 61, 1), ("Et*2|(tt|)*22t|(tt|)*7mL", 8, 61, 1),
    ("Et|(tt|)*22L", 4, 45, None), ("Et*11|t*11|t*11|t*10mL", 4, 43, 1), ("Et*8|t*8|t*8|t*8L", 4, 32, None),
    ("E|t*16|t*16|L", 4, 32, None), ("Et*7|t*9|t*9|t*7L", 4, 32, 0), ("E(t|)*3tL", 4, 4, None),
    ("Et*8|t*8|t*8|t*7L", 4, 32, None), (DEEPSEEK_V3_LAYOUT, 16, 61, None), ("Et*8|t*8|t*8|t*8xL", 4, 32, None),
    ("Et*8|t*8|t*8|t*8L", 3, 32, None), ("t*8|t*8|t*8|t*8L", 4, 32, None), ("Et*8|t*8|t*8|t*8", 4, 32, None),
    ("EEt*8|t*8|t*8|t*7L", 4, 31, None), ("Et*8|t*8|t*8|t*7mtL", 4, 32, 1), ("Et*4|t*4m|t*4|t*4|(t*4|)*3t*4L", 4, 32, 1),
    ("Et*8|t*8|t*8|t*8LL", 4, 32, None), ("Et*8|t*8|t*8|t*8 L", 4, 32, None), ("", 1, 0, None),
    ("Et*4|t*4m||L", 2, 8, 1), ("Et*8m|mL", 2, 8, 2),
]
# What each case builds (virtual stages, decoder layers per rank) or the rule it breaks. The counts follow from the
# grammar (stage i is virtual stage i // pp of rank i % pp); the rules are validate_layer_layout's, in its order.
EXPECT = [
    (2, DEEPSEEK_V3_SPLIT), (2, [4] * 7 + [3] + [4] * 7 + [2]), (4, [8] * 7 + [5]), (6, [11, 12, 12, 10]),
    (1, [11, 11, 11, 10]), (1, [8, 8, 8, 8]), (1, [0, 16, 16, 0]), (1, [7, 9, 9, 7]), (1, [1, 1, 1, 1]),
    "31 decoder layers (t) but the model has 32", "1 MTP layers (m) but the config sets 0",
    "invalid layer character 'x'", "4 stages do not divide over pp 3", "the embedding (E) must be the first",
    "the loss (L) must be the last", "the embedding (E) must be the first", "decoder layers must be placed before",
    "decoder layers must be placed before", "the loss (L) must be the last", "invalid layer character ' '",
    "the embedding (E) must be the first", "pipeline rank 1 holds MTP layers outside its last virtual stage",
    "all the MTP layers must be in one virtual stage",
]


@pytest.mark.parametrize("case,expect", list(zip(CASES, EXPECT, strict=True)))
def test_layout_rules(case, expect):
    if isinstance(expect, str):
        with pytest.raises(MegatronSplitError, match=re.escape(expect)):
            _split(*case)
    else:
        assert _split(*case) == expect


MCORE_LAYOUT_SCRIPT = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from megatron.core.transformer.enums import LayerType
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
out = []
for text, pp, layers, mtp in json.loads(sys.stdin.read()):
    try:
        lay = PipelineParallelLayerLayout(text, pp)
        lay.validate_layer_layout(num_layers=layers, mtp_num_layers=mtp)
    except (AssertionError, KeyError, ValueError, IndexError, NotImplementedError) as exc:
        out.append(None)
        continue
    out.append([lay.virtual_pipeline_model_parallel_size,
                [sum(stage.count(LayerType.decoder) for stage in row) for row in lay.layout]])
print(json.dumps(out))
"""


def test_megatron_core_agrees_on_every_case():
    """megatron-core 0.16.1's own parser and validate_layer_layout accept and refuse the same layouts, and build the
    same virtual stages and per-rank decoder counts."""
    pytest.importorskip("megatron.core", reason="megatron-core not installed: `make test` installs 0.16.1 (--no-deps)")
    proc = subprocess.run([sys.executable, "-c", MCORE_LAYOUT_SCRIPT], input=json.dumps(CASES), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = []
    for text, pp, layers, mtp in CASES:
        try:
            vp, split = _split(text, pp, layers, mtp)
            ours.append([vp, split])
        except MegatronSplitError:
            ours.append(None)
    assert ours == theirs
    assert sum(r is not None for r in ours) == 9  # both accept the nine valid cases and refuse the rest


def test_a_repeat_count_that_would_build_a_huge_string_is_refused_before_building_it():
    for text in ("t*" + "9" * 5000, "(tt|)*99999999", "Et*100001L"):
        with pytest.raises(MegatronSplitError, match="more than 100,000 layers"):
            parse_layout(text, 1)


LLAMA3_8B_PP4 = ("torchrun pretrain_gpt.py --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 "
                 "--micro-batch-size 1 --global-batch-size 256 --seq-length 4096 --num-layers 32 --hidden-size 4096 "
                 "--ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
                 "--swiglu --untie-embeddings-and-output-weights --use-distributed-optimizer --bf16 "
                 "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 ")


def _check(tmp_path, text, *args, name="run.sh"):
    path = tmp_path / name
    path.write_text(text + "\n")
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "check", str(path), "--json", *args],
                          capture_output=True, text=True, timeout=300)
    res = json.loads(proc.stdout) if proc.stdout.strip().startswith(("{", "[")) else {}
    return proc, (res[0] if isinstance(res, list) else res)


def test_check_predicts_a_layout_as_the_flags_that_build_the_same_split(tmp_path):
    """Two independent ways to the same stages give the same prediction: the layout 'Et*7|t*9|t*9|t*7L' and
    --decoder-first/last-pipeline-num-layers 7 7 (middle 18 over 2 ranks) both build 7/9/9/7; the even layout
    'Et*8|t*8|t*8|t*8L' is the split with no flags at all."""
    args = ("-m", "llama3-8b", "-c", "dgx-h100", "-n", "2")
    pairs = [("--pipeline-model-parallel-layout 'Et*7|t*9|t*9|t*7L'",
              "--decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 7"),
             ("--pipeline-model-parallel-layout 'Et*8|t*8|t*8|t*8L'", "")]
    for (layout, flags), split in zip(pairs, ([7, 9, 9, 7], [8, 8, 8, 8]), strict=True):
        proc_a, a = _check(tmp_path, LLAMA3_8B_PP4 + layout, *args)
        proc_b, b = _check(tmp_path, LLAMA3_8B_PP4 + flags, *args)
        assert proc_a.returncode == proc_b.returncode == 0, proc_a.stdout + proc_b.stdout
        assert a["layout"]["layers_per_stage"] == split
        assert b["layout"].get("layers_per_stage") == (split if flags else None)  # no flags: the even split
        assert a["predicted"]["step_time_seconds"] == pytest.approx(b["predicted"]["step_time_seconds"], rel=1e-9)
        assert a["predicted"]["peak_memory_bytes_per_gpu"] == pytest.approx(b["predicted"]["peak_memory_bytes_per_gpu"],
                                                                            rel=1e-9)


def test_check_reads_the_deepseek_v3_layout_in_megatron_and_bridge_configs(tmp_path):
    args = ("-m", "deepseek-v3", "-c", "dgx-h100", "-n", "128")
    megatron = ("torchrun pretrain_gpt.py --tensor-model-parallel-size 1 --pipeline-model-parallel-size 16 "
                "--expert-model-parallel-size 64 --micro-batch-size 1 --global-batch-size 8192 --seq-length 4096 "
                "--num-layers 61 --hidden-size 7168 --num-attention-heads 128 --use-distributed-optimizer --bf16 "
                "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
                f"--pipeline-model-parallel-layout \"{DEEPSEEK_V3_LAYOUT}\" --mtp-num-layers 1")
    bridge = "\n".join(["model.tensor_model_parallel_size=1", "model.pipeline_model_parallel_size=16",
                        "model.expert_model_parallel_size=64", f'model.pipeline_model_parallel_layout="{DEEPSEEK_V3_LAYOUT}"',
                        "model.mtp_num_layers=1", "train.micro_batch_size=1", "train.global_batch_size=8192",
                        "dataset.seq_length=4096", "ddp.use_distributed_optimizer=true",
                        "model.recompute_granularity=full", "model.recompute_method=uniform",
                        "model.recompute_num_layers=1", "mixed_precision=bf16_mixed"])
    for text, name in ((megatron, "run.sh"), (bridge, "overrides.txt")):
        proc, res = _check(tmp_path, text, *args, name=name)
        assert proc.returncode in (0, 1) and res, proc.stdout + proc.stderr
        lay = res["layout"]
        assert (lay["schedule"], lay["virtual_stages"], lay["layers_per_stage"]) == \
            ("interleaved_1f1b", 2, DEEPSEEK_V3_SPLIT), name
        assert not res["violations"], (name, res["violations"])
        assert any("multi-token-prediction" in n and "not costed" in n for n in res["notes"]), name


@pytest.mark.parametrize("extra,message", [
    ("--pipeline-model-parallel-layout 'Et*7|t*9|t*9|t*7L' --account-for-loss-in-pipeline-split",
     "cannot be set with other pipeline layout arguments"),
    ("--pipeline-model-parallel-layout 'Et*7|t*9|t*9|t*7L' --num-virtual-stages-per-pipeline-rank 2",
     "takes the virtual stages from one of them only"),
    ("--pipeline-model-parallel-layout 'Et*7|t*9|t*9|t*6L'", "31 decoder layers (t) but the model has 32"),
    ("--pipeline-model-parallel-layout 'Et*8|t*8|t*8|t*8L|'", "5 stages do not divide over pp 4"),
    ("--pipeline-model-parallel-layout 'Et*7|t*9|t*9|t*7mL'", "1 MTP layers (m) but the config sets 0"),
    ("--pipeline-model-parallel-layout 't*999999999999'", "more than 100,000 layers"),
])
def test_check_refuses_a_layout_megatron_core_refuses(tmp_path, extra, message):
    proc, res = _check(tmp_path, LLAMA3_8B_PP4 + extra, "-m", "llama3-8b", "-c", "dgx-h100", "-n", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert any(message in v["message"] for v in res["violations"]), res["violations"]


@pytest.mark.parametrize("split,vp", [([1] + [2] * 29 + [1, 1], 1), (DEEPSEEK_V3_SPLIT, 2), ([8, 8, 8, 8], 1),
                                      ([7, 9, 9, 7], 2), ([3, 4, 4, 3], 3), ([5, 6, 5, 5, 6, 5], 1), ([1], 1),
                                      ([2, 2], 2)])
def test_the_layout_the_export_writes_builds_the_split(split, vp):
    from planner.frameworks.megatron_split import layout_text

    text = layout_text(split, vp)
    assert _split(text, len(split), sum(split)) == (vp, split), text


def test_no_layout_for_a_rank_with_fewer_layers_than_virtual_stages():
    from planner.frameworks.megatron_split import layout_text

    with pytest.raises(MegatronSplitError, match="no decoder layer"):
        layout_text([1, 3, 3, 1], 2)


def _plan(tmp_path, *fix):
    out = tmp_path / "plan.json"
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "plan", "-m", "llama3-8b", "-c", "dgx-h100", "-n", "3",
                           "-b", "48", "-s", "4096", "--framework", "megatron", *fix, "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def test_a_split_no_flag_builds_is_exported_as_a_layout_that_megatron_core_builds_and_check_reads_back(tmp_path):
    """Llama-3-8B's 32 layers over pp 6: neither the even split 5/5/6/6/5/5 (its middle 22 does not divide over 4)
    nor the split the search refines to has a first/last or account-for setting. Before, the export moved it to the nearest split the flags build; now it writes
    the layout string, megatron-core 0.16.1's TransformerConfig builds the same stages, and `check` of the Megatron
    and Bridge files gives the plan's own prediction."""
    pytest.importorskip("megatron.core", reason="megatron-core not installed: `make test` installs 0.16.1 (--no-deps)")
    from test_framework_validators import MCORE_SCRIPT, _megatron_arg_dict

    from planner.frameworks.megatron_split import split_flags
    from planner.integrations.exports import export
    from planner.search import stage_split

    doc = _plan(tmp_path, "--fix", "tp=4,pp=6")
    lay = doc["layout"]
    split = lay["layers_per_stage"] or list(stage_split(32, 6))
    assert lay["pp"] == 6 and sum(split) == 32
    with pytest.raises(MegatronSplitError):
        split_flags(32, 6, 1, split)  # no flag setting builds it
    meg = export(doc, "megatron")
    assert "--pipeline-model-parallel-layout" in meg.text and "--decoder-first" not in meg.text
    assert "--num-virtual-stages-per-pipeline-rank" not in meg.text
    assert not any("layers_per_stage" in c for c in meg.changes)  # exported as planned, not moved
    proc = subprocess.run([sys.executable, "-c", MCORE_SCRIPT],
                          input=json.dumps([{"args": dict(_megatron_arg_dict(meg.text), bf16=True)}]),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])[0]
    assert res["ok"], res
    assert res["layout_layers"] == split
    for target, name in (("megatron", "run.sh"), ("nemo", "overrides.txt")):
        proc, got = _check(tmp_path, export(doc, target).text, "-m", "llama3-8b", "-c", "dgx-h100", "-n", "3",
                           "-b", "48", "-s", "4096", name=name)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert got["layout"]["layers_per_stage"] == split, target
        assert got["predicted"]["step_time_seconds"] == pytest.approx(doc["predicted"]["step_time_seconds"], rel=1e-9)


def test_recompute_modules_the_model_does_not_cost_are_named_with_the_direction_of_the_error(tmp_path):
    """DeepSeek-V3's Megatron recipe recomputes mla_up_proj, moe, mlp and layernorm; the planner models only the
    first. The note says which way the prediction errs: memory over (its FAIL may be false), time under."""
    text = ("torchrun pretrain_gpt.py --tensor-model-parallel-size 1 --pipeline-model-parallel-size 16 "
            "--expert-model-parallel-size 64 --micro-batch-size 1 --global-batch-size 8192 --seq-length 4096 "
            "--num-layers 61 --hidden-size 7168 --num-attention-heads 128 --use-distributed-optimizer --bf16 "
            f"--pipeline-model-parallel-layout \"{DEEPSEEK_V3_LAYOUT}\" --mtp-num-layers 1 "
            "--recompute-granularity selective --recompute-modules mla_up_proj moe mlp layernorm")
    proc, res = _check(tmp_path, text, "-m", "deepseek-v3", "-c", "dgx-h100", "-n", "128")
    note = next(n for n in res["notes"] if n.startswith("--recompute-modules"))
    assert "layernorm, mlp, moe not modelled" in note and "over-stated" in note and "under-stated" in note
