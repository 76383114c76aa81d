"""DeepSpeed's ZeRO-1/2 gradient buffers: each backward allocates one buffer of reduce_bucket_size 16-bit elements
when contiguous_gradients is on (DeepSpeed's default), and a second with overlap_comm ('Use double buffers to avoid
data access conflict when overlap_comm is enabled', stage_1_and_2.py backward, DeepSpeed 0.19.8); without
contiguous_gradients each bucket is flattened as it is reduced (allreduce_bucket), one bucket's bytes. The all-gather
after the step writes in place (runtime/utils.py all_gather_into_tensor_dp_groups): no allgather_bucket_size buffer.
Held to that rule by hand (cost_models/stage.py reduce_buffer_bytes), to the profile (the export's
overlap_comm and contiguous_gradients on: 2 x 5e8 x 2 B), and to `check`, which reads the three keys from a config
(the Hugging Face Trainer's "auto" bucket is hidden_size^2 at every stage)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from cost_models.inputs import REDUCE_BUCKET_ELEMENTS
from tests.conftest import read_deepspeed_zero


def _problem(framework="deepspeed"):
    from planner.estimate import build_problem

    return build_problem("dgx-a100-80gb", 8, "llama2-7b", 512, 4096, "bf16", framework=framework)


def test_the_buffer_rule_by_hand():
    """Two buffers of 5e8 16-bit elements are 2e9 bytes, one is 1e9; a bucket of 4096^2 (the Trainer's "auto" for a
    4096-wide model) is 2 x 16.8M x 2 B = 67.1 MB doubled."""
    from cost_models.stage import reduce_buffer_bytes

    assert reduce_buffer_bytes(REDUCE_BUCKET_ELEMENTS, buffers=2) == 2e9
    assert reduce_buffer_bytes(REDUCE_BUCKET_ELEMENTS, buffers=1) == 1e9
    assert reduce_buffer_bytes(4096.0**2, buffers=2) == 4 * 4096**2 == 67_108_864


def test_the_deepspeed_profile_keeps_two_default_buffers_at_zero_1_and_2_only():
    """The DeepSpeed profile states the double 5e8 buffer (the export writes overlap_comm and contiguous_gradients
    on); the knobs move ZeRO-1/2's buffers and leave ZeRO-3's one flat bucket and ZeRO-0's figure alone.
    Megatron-DeepSpeed's recipe (its engine turned both flags off at ZeRO-1 then) keeps its own figure."""
    from cost_models.stage import bucket_bytes

    knobs = _problem().knobs
    assert (knobs.reduce_bucket_elements, knobs.reduce_bucket_buffers) == (REDUCE_BUCKET_ELEMENTS, 2)
    one = replace(knobs, reduce_bucket_buffers=1, reduce_bucket_elements=1e8)
    assert [bucket_bytes(one, zero_stage=z) for z in (1, 2)] == [2e8, 2e8]
    assert bucket_bytes(one, zero_stage=3) == bucket_bytes(knobs, zero_stage=3) == 1e9
    assert bucket_bytes(one, zero_stage=0) == bucket_bytes(knobs, zero_stage=0) == knobs.bucket_bytes
    mds = _problem("megatron-deepspeed").knobs
    assert mds.reduce_bucket_elements is None
    assert bucket_bytes(mds, zero_stage=1) == mds.bucket_bytes


@pytest.mark.parametrize(("zero", "hf", "want"), [
    ({"stage": 2}, False, {"reduce_bucket_buffers": 1}),  # overlap_comm off by default at ZeRO-1/2
    ({"stage": 1, "overlap_comm": True}, False, {}),
    ({"stage": 2, "overlap_comm": True, "contiguous_gradients": False}, False, {"reduce_bucket_buffers": 1}),
    ({"stage": 2, "overlap_comm": True, "reduce_bucket_size": 2e8}, False, {"reduce_bucket_elements": 2e8}),
    ({"stage": 2, "overlap_comm": True, "reduce_bucket_size": 5e8}, False, {}),  # the default moves nothing
    ({"stage": 2, "overlap_comm": True, "reduce_bucket_size": "auto"}, True,
     {"reduce_bucket_elements": "hidden_size^2"}),
    ({"stage": 3, "reduce_bucket_size": 2e8, "contiguous_gradients": False}, False,
     {"zero3_reduce_bucket_elements": 2e8}),
    ({"stage": 0, "reduce_bucket_size": 2e8, "contiguous_gradients": False}, False, {}),
])
def test_check_reads_the_buffer_keys(tmp_path, zero, hf, want):
    top = {"gradient_accumulation_steps": "auto"} if hf else {}
    view = read_deepspeed_zero(tmp_path, zero, **top)
    got = {k: v for k, (v, _) in view.knobs.items()
           if k in ("reduce_bucket_buffers", "reduce_bucket_elements", "zero3_reduce_bucket_elements")}
    assert got == want
    assert view.errors == []


def _allocated_and_notes(tmp_path: Path, name: str, zero: dict, **top):
    """What `planner check --json` predicts for a Llama 2 7B ZeRO config on one DGX A100 (8 GPUs)."""
    import subprocess
    import sys

    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
                                "bf16": {"enabled": True}, "zero_optimization": zero, **top}))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "check", str(path), "-c", "dgx-a100-80gb",
                          "-m", "llama2-7b", "-n", "1", "-b", "64", "-s", "4096", "--json"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    return doc["predicted"]["peak_allocated_bytes_per_gpu"], doc["notes"]


def test_check_predicts_the_buffers_a_config_keeps(tmp_path):
    """Through the CLI: DeepSpeed's defaults at ZeRO-2 (overlap_comm off) keep one 1e9-byte buffer; overlap_comm on
    keeps two (1e9 more); a 2e8 bucket with overlap_comm keeps 2 x 4e8; the Trainer's "auto" bucket for Llama 2 7B
    (4096^2) keeps 2 x 33.6 MB. The live peak moves by exactly the buffer bytes, and a note names each reason."""
    base, notes = _allocated_and_notes(tmp_path, "default", {"stage": 2})
    assert any("one reduce_bucket_size gradient buffer" in n for n in notes)
    double, _ = _allocated_and_notes(tmp_path, "overlap", {"stage": 2, "overlap_comm": True})
    assert double - base == pytest.approx(1e9, rel=1e-9)
    small, notes = _allocated_and_notes(tmp_path, "small", {"stage": 2, "overlap_comm": True,
                                                           "reduce_bucket_size": 2e8})
    assert double - small == pytest.approx(2e9 - 8e8, rel=1e-9)
    assert any("reduce_bucket_size 2e+08" in n for n in notes)
    # both Trainer configs ("auto" somewhere), which run transformers' model code (its RMSNorm saves more)
    hf, _ = _allocated_and_notes(tmp_path, "hf", {"stage": 2, "overlap_comm": True}, train_batch_size="auto")
    auto, notes = _allocated_and_notes(tmp_path, "auto", {"stage": 2, "overlap_comm": True,
                                                         "reduce_bucket_size": "auto"}, train_batch_size="auto")
    assert hf - auto == pytest.approx(2e9 - 4 * 4096**2, rel=1e-9)
    assert any("hidden_size^2" in n for n in notes)
