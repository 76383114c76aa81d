"""Megatron-LM overlaps nothing by default (frameworks.md §2.6: --overlap-grad-reduce, --overlap-param-gather and
--tp-comm-overlap are off): `check` predicts a config without them with that traffic exposed, and the Megatron export
writes them so that the plan's prediction (the Megatron profile: the performance recipes' flags) is what runs."""

from dataclasses import replace

import pytest

from planner.estimate import Problem, build_problem
from planner.integrations.check import check
from planner.integrations.readers import read_config

ARGS = """torchrun --nproc_per_node 8 pretrain_gpt.py \\
  --tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --sequence-parallel \\
  --use-distributed-optimizer --micro-batch-size 1 --global-batch-size 256 --seq-length 4096 \\
  --num-layers 40 --hidden-size 5120 --num-attention-heads 40 --ffn-hidden-size 13824 --swiglu \\
  --normalization RMSNorm --bf16 --recompute-granularity selective {flags}
"""
FLAGS = "--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap"


def _check(tmp_path, flags: str):
    path = tmp_path / f"run{len(flags)}.sh"
    path.write_text(ARGS.format(flags=flags))
    view = read_config(path, gpus=64)
    problem = build_problem("dgx-a100-80gb", 8, "llama2-13b", 256, 4096, "bf16", framework="megatron")
    return check(view, problem), problem


def test_megatron_config_without_overlap_flags_is_predicted_with_the_traffic_exposed(tmp_path):
    with_flags, problem = _check(tmp_path, FLAGS)
    without, _ = _check(tmp_path, "")
    assert with_flags.layout == without.layout and with_flags.violations == without.violations == []
    # with the flags: the Megatron profile as is (0.9 of DP traffic, 0.5 of TP traffic hidden; profiles.py)
    assert with_flags.estimate.step_seconds == pytest.approx(problem.estimate(with_flags.layout).step_seconds, rel=1e-12)
    # without: the same layout predicted with nothing of that traffic hidden (an independent construction)
    exposed = Problem(problem.model, problem.training, problem.cluster,
                      replace(problem.knobs, dp_overlap_fraction=0.0, zero3_overlap_fraction=0.0,
                              tp_overlap_fraction=0.0))
    assert without.estimate.step_seconds == pytest.approx(exposed.estimate(without.layout).step_seconds, rel=1e-12)
    assert without.estimate.step_seconds > with_flags.estimate.step_seconds * 1.01
    assert any("no --overlap-grad-reduce" in n for n in without.notes)
    assert any("no --tp-comm-overlap" in n for n in without.notes)
    assert not any("overlap" in n for n in with_flags.notes)


def test_megatron_export_switches_on_the_overlap_its_profile_assumes():
    from test_roundtrip import _plan

    from planner.integrations.exports import export

    text = export(_plan("interleaved-zero1"), "megatron").text.splitlines()  # tp 8 + SP, dp 2, distributed optimizer
    assert {"--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap"} <= set(text)
    text = export(_plan("zero2"), "megatron").text.splitlines()  # tp 1, dp 64, Megatron-FSDP
    assert {"--overlap-grad-reduce", "--overlap-param-gather"} <= set(text) and "--tp-comm-overlap" not in text
