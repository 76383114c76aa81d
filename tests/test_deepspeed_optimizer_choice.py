"""Which optimizer DeepSpeed's engine runs, as `check` reads `data_types.grad_accum_dtype` (default: the model's
dtype): engine.py _do_optimizer_sanity_check, DeepSpeed 0.19.8. A bf16 model at ZeRO-1 accumulating in fp32, without
CPU offload, runs BF16_Optimizer, not the ZeRO optimizer: bf16 params 2 + bf16 grads 2 + a full fp32 gradient buffer
4 + fp32 master and Adam 12 sharded over DP, its gradients all-reduced in 5e8-element buckets flattened in fp32 and
cast to bf16 (3 GB), its parameters all-gathered after the step (profiles.deepspeed_bf16_optimizer_states). A bf16
pipeline without ZeRO runs it too, accumulating in bf16: 2 + 4 + 12/dp and a 1 GB bucket. Without ZeRO a dtype other
than the model's is refused at start-up. Held to the engine's own rule (DeepSpeed 0.19.8 installed
by `make test`: the same config through its _do_optimizer_sanity_check), and to the memory it predicts."""

import json
from pathlib import Path

import pytest

from tests.conftest import read_deepspeed_zero


@pytest.mark.parametrize(("zero", "types", "stage", "knobs", "rule"), [
    ({"stage": 1}, {"grad_accum_dtype": "fp32"}, 0, {"zero0_optimizer"}, None),
    ({"stage": 1}, {"grad_accum_dtype": "float32"}, 0, {"zero0_optimizer"}, None),
    ({"stage": 1}, {"grad_accum_dtype": "bf16"}, 1, set(), None),  # the model's dtype: the ZeRO optimizer
    ({"stage": 1, "offload_optimizer": {"device": "cpu"}}, {"grad_accum_dtype": "fp32"}, 1, set(), None),
    ({"stage": 2}, {"grad_accum_dtype": "fp32"}, 2, set(), None),  # ZeRO-2: the ZeRO optimizer (a note)
    ({"stage": 0}, {"grad_accum_dtype": "fp32"}, 0, set(), "grad_accum_dtype"),  # refused at start-up
    ({"stage": 1}, {"grad_accum_dtype": "fp64"}, 1, set(), "grad_accum_dtype"),  # not a DtypeEnum name
    ({"stage": 0}, None, 0, set(), None),  # no pipeline: DDP_BFLOAT16, the profile's ZeRO-0
])
def test_check_reads_which_optimizer_deepspeed_runs(tmp_path, zero, types, stage, knobs, rule):
    view = read_deepspeed_zero(tmp_path, zero, **({"data_types": types} if types else {}))
    assert view.fields["zero_stage"] == stage
    assert knobs <= set(view.knobs)
    assert not ({"zero0_optimizer"} - knobs) & set(view.knobs)
    assert ("zero0_pipeline_optimizer" in view.knobs) == bool(knobs)
    assert [e[0] for e in view.errors] == ([rule] if rule else [])


def _deepspeed_engine_wrapper(monkeypatch, precision: str, stage: int, grad_accum: str | None, offload: bool,
                              pipeline: bool = False) -> str:
    """The optimizer wrapper DeepSpeed 0.19.8's own engine method picks for that config (the method run unbound on a
    stand-in for the engine that answers its config queries; the ZeRO-supported-optimizer probe, which logs from rank
    0 of a process group, answers yes for Adam)."""
    deepspeed_engine = pytest.importorskip("deepspeed.runtime.engine")
    import torch

    monkeypatch.setattr(deepspeed_engine, "is_zero_supported_optimizer", lambda optimizer: True)

    model = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    acc = {None: model, "fp32": torch.float32, "bf16": torch.bfloat16}[grad_accum]

    class Stub:
        pipeline_parallelism = pipeline
        global_rank = 0

        def get_data_types(self):
            return model, acc

        def zero_optimization(self):
            return stage > 0

        def zero_optimization_stage(self):
            return stage

        def zero_cpu_offload(self):
            return offload

        def zero_compute_grad_norm(self):
            return True

        def zero_allow_untested_optimizer(self):
            return True

    try:
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
        wrapper = deepspeed_engine.DeepSpeedEngine._do_optimizer_sanity_check(Stub(), optimizer)
    except NotImplementedError:
        return "refused"
    return str(wrapper)


@pytest.mark.parametrize(("stage", "grad_accum", "offload", "pp", "bf16_optimizer"), [
    (1, "fp32", False, 1, True), (1, None, False, 1, False), (1, "fp32", True, 1, False), (2, "fp32", False, 1, False),
    (0, None, False, 4, True), (0, None, False, 1, False), (1, None, False, 4, False),
])
def test_the_reader_agrees_with_deepspeeds_engine(tmp_path, monkeypatch, stage, grad_accum, offload, pp,
                                                  bf16_optimizer):
    """Where DeepSpeed's engine picks its bf16 optimizer (BFLOAT16), the reader reads ZeRO-0 with that optimizer's
    states; where it picks the ZeRO optimizer (or DDP_BFLOAT16 without ZeRO), it keeps the stage and the profile."""
    wrapper = _deepspeed_engine_wrapper(monkeypatch, "bf16", stage, grad_accum, offload, pipeline=pp > 1)
    assert (wrapper == "bf16") == bf16_optimizer
    zero = {"stage": stage} | ({"offload_optimizer": {"device": "cpu"}} if offload else {})
    view = read_deepspeed_zero(tmp_path, zero, pipeline={"stages": pp},
                               **({"data_types": {"grad_accum_dtype": grad_accum}} if grad_accum else {}))
    assert ("zero0_pipeline_optimizer" in view.knobs) == bf16_optimizer
    assert view.fields["zero_stage"] == (0 if bf16_optimizer else stage)


def test_check_predicts_bf16_optimizers_memory(tmp_path):
    """Llama 2 7B on one DGX A100 (dp 8), ZeRO-1 in bf16: with fp32 accumulation the live peak is higher by
    (2 + 6 + 12/8) - (2 + 2 + 16/8) = 3.5 B per parameter and by the 3 GB bucket less the one 1 GB IPG buffer the
    ZeRO optimizer keeps without overlap_comm; a note names the reason."""
    from planner.estimate import build_problem
    from planner.integrations.check import check
    from planner.integrations.readers import read_config

    problem = build_problem("dgx-a100-80gb", 1, "llama2-7b", 64, 4096, "bf16", framework="deepspeed")
    out = {}
    for acc in (None, "fp32"):
        doc = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
               "zero_optimization": {"stage": 1}} | ({"data_types": {"grad_accum_dtype": acc}} if acc else {})
        path = Path(tmp_path) / f"ds{acc}.json"
        path.write_text(json.dumps(doc))
        out[acc] = check(read_config(path, gpus=8), problem, overrides={"recompute": "full"})
    params = out[None].estimate.stages[0].params
    more = out["fp32"].estimate.peak_allocated_bytes - out[None].estimate.peak_allocated_bytes
    assert more == pytest.approx(params * 3.5 + 2e9, rel=1e-9)
    assert any("BF16_Optimizer" in n for n in out["fp32"].notes)
    assert out["fp32"].layout.zero_stage == 0


def test_immediate_grad_update_frees_the_bf16_gradients(tmp_path):
    """bf16.immediate_grad_update: each bf16 gradient is added to the fp32 buffer by its hook and freed
    (accumulate_hp_grads_and_remove_lp), so BF16_Optimizer keeps 4 gradient bytes per parameter, not 6."""
    default = read_deepspeed_zero(tmp_path, {"stage": 1}, data_types={"grad_accum_dtype": "fp32"})
    immediate = read_deepspeed_zero(tmp_path, {"stage": 1}, data_types={"grad_accum_dtype": "fp32"},
                                    bf16={"enabled": True, "immediate_grad_update": True})
    assert default.knobs["zero0_optimizer"][0].state_bytes == (2.0, 6.0, 12.0)
    assert immediate.knobs["zero0_optimizer"][0].state_bytes == (2.0, 4.0, 12.0)
    assert default.knobs["zero0_optimizer"][0].bucket_bytes == 3e9


def test_deepspeed_refuses_what_the_reader_refuses(tmp_path, monkeypatch):
    """No ZeRO, a bf16 model accumulating in fp32: DeepSpeed's engine raises ('unsupported mix'); check says so."""
    assert _deepspeed_engine_wrapper(monkeypatch, "bf16", 0, "fp32", False) == "refused"
    view = read_deepspeed_zero(tmp_path, {"stage": 0}, data_types={"grad_accum_dtype": "fp32"})
    assert [e[0] for e in view.errors] == ["grad_accum_dtype"]


def test_the_memory_fix_names_the_key_that_picks_the_optimizer(tmp_path):
    """Llama 2 13B on 16 A100s, ZeRO-1 in bf16 with fp32 accumulation: BF16_Optimizer's unsharded fp32 gradients do
    not fit (2 + 6 + 12/16 B/param: 113.5 GiB); the ZeRO optimizer would (2 + 2 + 16/16), and the fix says so in the
    config's words, not as "zero_stage=1", which the config already says."""
    from planner.estimate import build_problem
    from planner.integrations.check import check
    from planner.integrations.readers import read_config

    problem = build_problem("dgx-a100-80gb", 2, "llama2-13b", 64, 2048, "bf16", framework="deepspeed")
    path = Path(tmp_path) / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": 1}}))
    out = check(read_config(path, gpus=16), problem, overrides={"recompute": "full"})
    memory = [v for v in out.violations if v["rule"] == "memory"]
    assert len(memory) == 1
    assert memory[0]["hint"].startswith("drop data_types.grad_accum_dtype (DeepSpeed's ZeRO-1 optimizer) fits at")
    assert "zero_stage=1" not in memory[0]["hint"]


def test_a_bf16_pipeline_without_zero_accumulates_in_bf16():
    """The pipeline's BF16_Optimizer keeps its gradient buffer in the model's bf16 (grad_acc_dtype): 2 + 4 + 12/dp
    (2 + 2 + 12/dp with immediate_grad_update), and flattens 5e8 bf16 gradients with no cast: 1 GB; in fp32 3 GB."""
    from cost_models.inputs import Zero0Optimizer
    from planner.frameworks.profiles import (
        deepspeed_bf16_optimizer,
        deepspeed_bf16_optimizer_bucket_bytes,
        deepspeed_bf16_optimizer_states,
    )

    assert deepspeed_bf16_optimizer_states(2) == (2.0, 4.0, 12.0)
    assert deepspeed_bf16_optimizer_states(2, immediate_grad_update=True) == (2.0, 2.0, 12.0)
    assert deepspeed_bf16_optimizer_states(4) == (2.0, 6.0, 12.0)
    assert (deepspeed_bf16_optimizer_bucket_bytes(2), deepspeed_bf16_optimizer_bucket_bytes(4)) == (1e9, 3e9)
    assert deepspeed_bf16_optimizer(2) == Zero0Optimizer((2.0, 4.0, 12.0), sharded=True, bucket_bytes=1e9)


def test_under_megatron_deepspeeds_profile_its_own_optimizer_stands(tmp_path):
    """A bf16 pipeline without ZeRO (BigScience's kind of config) checked as today's DeepSpeed runs BF16_Optimizer
    accumulating in bf16 (2 + 4 + 12/dp, 1 GB bucket); checked with --framework megatron-deepspeed (the DeepSpeed of
    2022) the profile's own BF16_Optimizer stands (2 + 6 + 12/dp: fp32 accumulation, the whole buffer cast to bf16),
    the reader's choice is dropped and a note says so."""
    from planner.estimate import build_problem
    from planner.integrations.check import check
    from planner.integrations.readers import read_config

    path = Path(tmp_path) / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                "zero_optimization": {"stage": 0}, "pipeline": {"stages": 4}}))
    out = {}
    for fw in ("deepspeed", "megatron-deepspeed"):
        problem = build_problem("dgx-a100-80gb", 4, "llama2-7b", 64, 2048, "bf16", framework=fw)
        out[fw] = check(read_config(path, gpus=32), problem, overrides={"recompute": "full"}, framework=fw)
    piped = out["deepspeed"].problem.knobs.zero0_pipeline_optimizer
    assert piped is not None and (piped.state_bytes, piped.bucket_bytes) == ((2.0, 4.0, 12.0), 1e9)
    mds = out["megatron-deepspeed"]
    assert mds.problem.knobs.zero0_optimizer.state_bytes == (2, 6, 12)
    assert mds.problem.knobs.zero0_pipeline_optimizer is None
    assert any("BF16_Optimizer) is not read" in n for n in mds.notes)
    assert mds.layout.zero_stage == out["deepspeed"].layout.zero_stage == 0


def test_under_megatron_deepspeed_a_zero1_config_stays_zero1(tmp_path):
    """The DeepSpeed of 2022 had no data_types: its ZeRO-1 config runs the ZeRO optimizer, as written."""
    from planner.estimate import build_problem
    from planner.integrations.check import check
    from planner.integrations.readers import read_config

    path = Path(tmp_path) / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": 1}}))
    problem = build_problem("dgx-a100-80gb", 1, "llama2-7b", 64, 2048, "bf16", framework="megatron-deepspeed")
    out = check(read_config(path, gpus=8), problem, overrides={"recompute": "full"}, framework="megatron-deepspeed")
    assert out.layout.zero_stage == 1
    assert out.problem.knobs.zero0_optimizer == problem.knobs.zero0_optimizer
    assert problem.knobs.zero0_optimizer.state_bytes == (2, 6, 12)


@pytest.mark.parametrize(("precision", "pp", "want"), [
    ("bf16", 4, (2.0, 4.0, 12.0 / 8)),  # BF16_Optimizer under a pipeline, its optimizer sharded over dp 8
    ("bf16", 1, (2.0, 2.0, 16.0)),  # DDP_BFLOAT16 (FP16_Optimizer's path), unsharded
    ("fp16", 4, (2.0, 2.0, 16.0)),  # FP16_Optimizer, pipeline or not
])
def test_the_deepspeed_profile_runs_bf16_optimizer_for_a_bf16_pipeline_without_zero(precision, pp, want):
    """Not only `check`: plan and estimate predict the optimizer DeepSpeed's engine runs at ZeRO-0 (bf16 and a
    PipelineModule: BF16_Optimizer; else FP16_Optimizer's unsharded 20 B), and it all-gathers the parameters after
    its step only where it shards them."""
    from cost_models.stage import state_bytes_per_param, zero0_states_sharded
    from planner.estimate import build_problem

    problem = build_problem("dgx-a100-80gb", 4, "llama2-7b", 64, 2048, precision, framework="deepspeed")
    assert state_bytes_per_param(problem.cm_training, zero_stage=0, dp=8, pipeline=pp > 1) == want
    assert zero0_states_sharded(problem.cm_training, pipeline=pp > 1) == (want[2] < 16)


def test_check_and_estimate_agree_on_a_bf16_pipeline_without_zero(tmp_path):
    """The same layout read from a DeepSpeed JSON and estimated from its fields: one prediction."""
    from planner.estimate import build_problem
    from planner.integrations.check import check
    from planner.integrations.readers import read_config

    path = Path(tmp_path) / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                "zero_optimization": {"stage": 0}, "pipeline": {"stages": 4}}))
    problem = build_problem("dgx-a100-80gb", 4, "llama2-7b", 64, 2048, "bf16", framework="deepspeed")
    checked = check(read_config(path, gpus=32), problem, overrides={"recompute": "full"})
    direct = problem.estimate(checked.layout)
    assert checked.estimate.peak_memory_bytes == pytest.approx(direct.peak_memory_bytes, rel=1e-12)
    assert checked.estimate.step_seconds == pytest.approx(direct.step_seconds, rel=1e-12)
