"""--framework / --fix / --schedules: the search covers only what the named framework can run (frameworks.md)."""

import json
import subprocess
import sys

import pytest

from cluster_specs import SpecError
from planner.frameworks import Framework
from planner.frameworks.capabilities import CAPABILITIES, capabilities
from planner.frameworks.restriction import build_restriction


def run(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, timeout=180)


def _plan(framework, *, fix=None, schedules=None, cluster="dgx-a100-80gb", nodes=16, model="llama2-13b", batch=512,
          seq=4096):
    from planner.estimate import build_problem
    from planner.search import PlanOptions, plan

    problem = build_problem(cluster, nodes, model, batch, seq)
    restriction = build_restriction(framework, problem.model.vocab_size, fix, schedules)
    return problem, plan(problem, PlanOptions(top_k=5, restriction=restriction))


def test_every_framework_has_capabilities_with_sources():
    assert set(CAPABILITIES) == set(Framework)
    for fw, caps in CAPABILITIES.items():
        if fw is not Framework.GENERIC:
            assert caps.sources.get("schedules") and caps.sources.get("zero"), fw


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "torchtitan", "megatron-deepspeed", "nemo"])
def test_search_picks_only_what_the_framework_runs(framework):
    caps = capabilities(framework)
    _, result = _plan(framework, cluster="dgx-h100", nodes=64, model="llama3-70b", batch=512, seq=8192)
    for cand in [result.pick, *result.ranked]:
        lay = cand.layout.model_dump()
        assert caps.refusal(lay) is None, (framework, lay)


def test_upstream_megatron_and_deepspeed_never_get_zero_bubble():
    # issue 11: `plan` picked zero_bubble for the 405B, which upstream Megatron-LM and DeepSpeed cannot run
    for fw in ("megatron", "deepspeed"):
        _, result = _plan(fw, cluster="dgx-h100", nodes=128, model="llama3-405b", batch=1024, seq=8192)
        assert all(c.layout.schedule != "zero_bubble" for c in result.ranked)


def test_torchtitan_gets_zero_bubble_only_when_asked():
    # torchtitan runs zero bubble with two stages per rank (ZBV / InterleavedZeroBubble), which the model does not
    # predict (it predicts ZB-H1, capabilities.TORCHTITAN_ZERO_BUBBLE): before, `plan --framework torchtitan`
    # picked zero_bubble for this 405B (tp 8, pp 16) and exported ZBVZeroBubble
    from planner.estimate import assumptions_json, build_problem

    caps = capabilities("torchtitan")
    assert "zero_bubble" in caps.schedules and "zero_bubble" in caps.unpredicted_schedules
    problem, result = _plan("torchtitan", cluster="dgx-h100", nodes=64, model="llama3-405b", batch=512, seq=8192)
    assert all(c.layout.schedule != "zero_bubble" for c in [result.pick, *result.ranked])
    _, asked = _plan("torchtitan", cluster="dgx-h100", nodes=64, model="llama3-405b", batch=512, seq=8192,
                     schedules="1f1b,zero_bubble")
    zb = [c for c in [asked.pick, *asked.ranked] if c.layout.schedule == "zero_bubble"]
    assert zb  # asked for, it is searched
    # and its prediction under the torchtitan profile says what it assumes, with the 1F1B step time as the
    # alternative; the generic profile (no framework) predicts ZB-H1 as what runs
    titan = build_problem("dgx-h100", 64, "llama3-405b", 512, 8192, framework="torchtitan")
    lay = zb[0].layout
    found = [a for a in assumptions_json(titan, lay, titan.estimate(lay))
             if a["statement"] == caps.unpredicted_schedules["zero_bubble"]]
    plain = lay.model_copy(update={"schedule": "1f1b", "virtual_stages": 1})
    assert found and found[0]["step_time_seconds_if_not"] == pytest.approx(titan.estimate(plain).step_seconds)
    assert not [a for a in assumptions_json(problem, lay, problem.estimate(lay))
                if a["statement"] == caps.unpredicted_schedules["zero_bubble"]]
    # Megatron-DeepSpeed's --enable-zbh1-pipeline is ZB-H1: searched, and no such assumption
    assert "zero_bubble" not in capabilities("megatron-deepspeed").unpredicted_schedules


def test_deepspeed_autotp_has_no_sequence_parallelism_and_no_tp_with_pipelining():
    _, result = _plan("deepspeed", cluster="dgx-h100", nodes=16, model="llama3-70b", batch=256, seq=8192)
    for c in result.ranked:
        assert not c.layout.sequence_parallel
        assert c.layout.tp == 1 or (c.layout.pp == 1 and c.layout.zero_stage <= 2)


def test_fix_pins_degrees_and_schedules_restrict():
    _, result = _plan("megatron", fix=["tp=4", "pp=2,zero=1"], schedules="1f1b")
    for c in result.ranked:
        assert (c.layout.tp, c.layout.pp, c.layout.zero_stage, c.layout.schedule) == (4, 2, 1, "1f1b")


def test_fix_recompute_and_sp_off():
    _, result = _plan("generic", fix=["recompute=full", "sp=0", "tp=2"])
    assert {c.layout.recompute for c in result.ranked} == {"full"}
    assert not any(c.layout.sequence_parallel for c in result.ranked)


def test_vocab_rule_per_framework():
    # GPT-3's 50,257-entry vocabulary is odd: Megatron pads it (to 128 x tp), torchtitan and DeepSpeed do not
    assert capabilities("megatron").vocab_problem(50257, 8) is None
    assert capabilities("megatron").padded_vocab(50257, 8) == 51200  # 50 x 1024
    assert "not divisible by tp (8)" in capabilities("torchtitan").vocab_problem(50257, 8)
    _, result = _plan("torchtitan", cluster="dgx-a100-80gb", nodes=8, model="gpt3-1.3b", batch=256, seq=2048)
    assert all(c.layout.tp == 1 for c in result.ranked)


@pytest.mark.parametrize("framework,fix,schedules,needle", [
    ("megatron", ["schedule=zero_bubble"], None, "schedule zero_bubble -> not available"),
    ("deepspeed", None, "interleaved_1f1b", "deepspeed runs 1f1b"),
    ("torchtitan", ["zero=1", "pp=1"], None, "zero_stage 1 -> allowed: (0, 2, 3)"),
    ("generic", ["layers_per_stage=1/2"], None, "not a search key"),
    ("megatron", ["bogus=1"], None, "layout key 'bogus'"),
    ("fairseq", None, None, "allowed: megatron, nemo"),
    ("generic", None, "1f1b,wavefront", "wavefront"),
])
def test_conflicting_options_are_one_line_errors(framework, fix, schedules, needle):
    with pytest.raises(SpecError) as exc:
        build_restriction(framework, 32000, fix, schedules)
    assert needle in str(exc.value)


def test_megatron_uneven_split_and_per_stage_recompute_rules():
    meg = capabilities("megatron")
    base = {"pp": 4, "schedule": "1f1b", "zero_stage": 1}
    assert meg.refusal({**base, "layers_per_stage": [7, 9, 9, 7]}) is None  # middle even
    # no flag setting builds 8/9/8/7, a --pipeline-model-parallel-layout string does (megatron_split.split_setting)
    assert meg.refusal({**base, "layers_per_stage": [8, 9, 8, 7]}) is None
    # interleaved: first/last must divide by the virtual stages (megatron-core transformer_config.py), so 15/16x6/15
    # over pp 8 x vpp 8 is the account-for split (126 + 2 = 128); 14/16x6/16 is neither but is a layout; 6/16x6/24
    # would leave two of rank 0's eight virtual stages without a layer
    ilv = {"pp": 8, "schedule": "interleaved_1f1b", "virtual_stages": 8, "zero_stage": 1}
    assert meg.refusal({**ilv, "layers_per_stage": [15, *[16] * 6, 15]}) is None
    assert meg.refusal({**ilv, "layers_per_stage": [14, *[16] * 6, 16]}) is None
    assert "would hold no decoder layer" in meg.refusal({**ilv, "layers_per_stage": [6, *[16] * 6, 24]})
    assert meg.refusal({**base, "recompute_layers_per_stage": [2, 2, 2, 2]}) is None
    assert "one recompute count" in meg.refusal({**base, "recompute_layers_per_stage": [3, 2, 1, 0]})
    assert capabilities("torchtitan").refusal({**base, "layers_per_stage": [8, 9, 8, 7]}) is None


def test_plan_json_records_the_framework_and_estimate_refuses_what_it_cannot_run(tmp_path):
    proc = run("plan", "-c", "dgx-a100-80gb", "-n", "2", "-m", "llama2-7b", "-b", "64", "-s", "2048",
               "--framework", "megatron", "--fix", "tp=8", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["framework"] == "megatron" and doc["layout"]["tp"] == 8
    proc = run("estimate", "-c", "dgx-a100-80gb", "-n", "2", "-m", "llama2-7b", "-b", "64", "-s", "2048",
               "--layout", "tp=8,pp=2,schedule=zero_bubble", "--framework", "megatron")
    assert proc.returncode == 3
    assert "megatron: schedule zero_bubble -> not available" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("text, family", [
    ("NeMo/Megatron-Core (recipe)", "mcore"), ("Megatron Core 0.9", "mcore"), ("Megatron-Bridge (NeMo 2)", "mcore"),
    ("GPT-NeoX", "megatron-deepspeed"), ("Megatron-DeepSpeed (ZeRO-1)", "megatron-deepspeed"),
    ("HF Trainer + DeepSpeed ZeRO-3", "deepspeed"), ("MaxText (JAX, FSDP)", "fsdp"), ("PyTorch FSDP", "fsdp"),
    ("torchtitan (FSDP2 + TP)", "fsdp"), ("Megatron-LM (2020)", "megatron-classic"), (None, "megatron-classic"),
])
def test_a_rows_framework_text_names_its_family(text, family):
    """validation.FAMILY_NAMES: the published set's spellings and the stated ones for rows from elsewhere."""
    from planner.validation import _framework_family

    assert _framework_family({"framework": text}) == family


@pytest.mark.parametrize("gpu, base", [
    ("H100 80GB", "dgx-h100"), ("H200 141GB SXM", "dgx-h200"), ("B200 (DGX B200)", "dgx-b200"),
    ("A100 40GB", "dgx-a100-40gb"), ("GB200 NVL72", None), ("GH200 96GB", None), ("H200 NVL", None),
    ("MI300X", None), ("H800 SXM", "hgx-h800"), ("A800 80GB", "dgx-a100-80gb"), ("H100 PCIe", "dgx-h100"),
    ("A100 80GB PCIe", "dgx-a100-80gb"), ("H100 NVL", None), ("A100 40GB PCIe", None),
    ("H100 SXM 95GB HBM2e (lower TDP)", "dgx-h100"),
])
def test_a_rows_gpu_text_names_its_cluster(gpu, base):
    """validation._gpu_and_cluster: H200, B200 and H800 rows run on their presets, A800 and the PCIe cards on a DGX
    preset with their own GPU and link (before, 'H100 PCIe' ran as the SXM part on NVSwitch and H800/A800 rows were
    skipped); Grace superchips, the NVL cards and GPUs outside the catalog are skipped with the reason."""
    from planner.validation import _gpu_and_cluster

    got = _gpu_and_cluster({"gpu_type": gpu, "total_gpus": 16, "gpus_per_node": 8})
    if base is None:
        assert isinstance(got, str) and gpu in got
        return
    assert got[0] == base and got[1]["num_nodes"] == 2
    # the export parts keep their silicon and lose NVLink bandwidth; a PCIe card talks over PCIe, at its own peak
    from cluster_specs import ClusterSpec

    cluster = ClusterSpec.model_validate(got[1])
    gpu_spec, intra = cluster.gpu_spec(), cluster.intra_node
    expected = {"H800 SXM": ("H800", "nvlink", 200.0), "A800 80GB": ("A800-SXM4-80GB", "nvlink", 200.0),
                "H100 PCIe": ("H100-PCIe", "pcie", 50.0), "A100 80GB PCIe": ("A100-PCIe-80GB", "pcie", 25.0),
                "H100 SXM 95GB HBM2e (lower TDP)": ("H100-SXM-HBM2e-500W", "nvlink", 450.0)}
    if gpu in expected:
        assert (gpu_spec.name, intra.kind, intra.gb_per_s) == expected[gpu]


@pytest.mark.parametrize("framework, tp, printed, expected", [
    ("torchtitan (FSDP2)", 8, None, True),  # enable_sequence_parallel defaults to True
    ("torchtitan (FSDP2)", 8, False, False),  # a printed value stands
    ("torchtitan (FSDP2)", 1, None, False),  # no TP, no SP
    ("NeMo", 8, None, True),
    ("Megatron-DeepSpeed", 8, None, False),
])
def test_a_rows_unprinted_sequence_parallelism_is_its_frameworks_default(framework, tp, printed, expected):
    """torchtitan's published 2D runs (docs/performance.md at eaea6f6a, Table 4: Llama 3.1 70B, FSDP 32 x TP 8,
    local batch 16, 71.9 GiB measured) do not print SP; without it their TP ranks would each hold the full
    sequence's checkpoints, 213.8 GiB predicted (a false OOM) where 62.8 GiB is predicted with it
    (tests/outside_torchtitan_probe.py)."""
    from planner.validation import _framework_family, _layout_fields

    row = {"framework": framework, "tp": tp, "pp": 1, "dp": 4, "sequence_parallel": printed}
    fields = _layout_fields(row, _framework_family(row), 4 * tp)
    assert fields["sequence_parallel"] is expected


def test_torchtitans_h100_rows_run_on_the_500w_hbm2e_part():
    """torchtitan's H100 rows ran on Grand Teton's HBM2e SXM H100 at 500 W: 'the actual peak TFLOPs number is
    between SXM and NVL, and we don't know its exact value' (docs/performance.md footnote). The catalog takes the
    midpoint of the SXM's dense 989 TFLOP/s and the NVL's 835.5 (NVIDIA H100 NVL datasheet: 1,671 with sparsity),
    FP8 twice that, and 95 GB."""
    from cluster_specs import load_gpu

    part, sxm = load_gpu("H100-SXM-HBM2e-500W"), load_gpu("H100-SXM")
    assert part.tflops["bf16"] == pytest.approx((989.0 + 835.5) / 2, abs=1.0)
    assert part.tflops["fp8"] == 2 * part.tflops["bf16"]
    assert part.board_power_watts == 500 and part.memory_gib * 2**30 == pytest.approx(95e9)
    assert part.tflops["bf16"] < sxm.tflops["bf16"]


@pytest.mark.parametrize("framework, compiled", [
    ("MaxText (JAX)", True), ("Pax (JAX)", True), ("levanter", True),
    ("torchtitan (FSDP2) + torch.compile", True), ("torchtitan (FSDP2)", False),
    ("llm-foundry/Composer FSDP FULL_SHARD (MP mode PURE), FlashAttention", False), ("Megatron-LM", False)])
def test_a_compiled_step_moves_the_compiled_share_of_elementwise_traffic(framework, compiled):
    """validation.compiled_step: JAX trainers compile the whole step (XLA), PyTorch rows only when they say
    torch.compile (eager is the default); their knobs carry profiles.COMPILED_ELEMENTWISE_SHARE, others 1."""
    from planner.frameworks.profiles import COMPILED_ELEMENTWISE_SHARE
    from planner.validation import build_case, compiled_step

    assert compiled_step({"framework": framework}) is compiled
    row = {"id": "r", "record_type": "throughput_run", "source": "s", "model_name": "Llama 3 8B",
           "architecture": "dense", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_kv_heads": 8, "ffn_hidden_size": 14336, "vocab_size": 128256, "seq_length": 8192,
           "gpu_type": "H100 80GB SXM", "total_gpus": 8, "gpus_per_node": 8, "tp": 1, "pp": 1, "dp": 8,
           "zero_stage": 3, "fsdp": True, "micro_batch_size": 1, "global_batch_size": 8, "precision": "BF16",
           "activation_recomputation": "full", "framework": framework, "iteration_time_s": 1.0}
    case = build_case(row)
    assert not isinstance(case, str), case
    assert case.knobs.compiled_elementwise_share == (COMPILED_ELEMENTWISE_SHARE.value if compiled else 1.0)


def test_no_published_row_is_a_compiled_step():
    """The elementwise fit of ../shared/validation is the eager one (profiles.COMPILED_ELEMENTWISE_SHARE): if a row
    there names a compiled step, the share joins the fit and must be sized inside it, with LOSO."""
    from planner.validation import compiled_step, load_rows
    from tests.conftest import VALIDATION, require_shared

    assert not [r["id"] for r in load_rows(require_shared(VALIDATION)) if compiled_step(r)]


def test_the_compiled_share_gives_torchtitans_published_compile_speedup():
    """profiles.COMPILED_ELEMENTWISE_SHARE is sized on torchtitan's eager/compiled pairs (docs/performance.md at
    eaea6f6a, Llama 3.1 8B, H100, local batch 2, selective op AC; Table 1, 8 GPUs: 5762 -> 6667 tokens/s per GPU;
    Table 3, 128 GPUs: 5605 -> 6514): the predicted step ratio stays within 0.01 of the published one."""
    from planner.bands import load_table
    from planner.validation import build_case, case_knobs, evaluate
    from tests.outside_torchtitan_probe import ROWS, row

    fitted = load_table()["fitted_knobs"]
    spec = {s[0]: s for s in ROWS}
    for eager, compiled, published in (("t1-fsdp", "t1-compile", 5762 / 6667), ("t3-fsdp", "t3-compile", 5605 / 6514)):
        steps = []
        for rid in (eager, compiled):
            case = build_case(row(*spec[rid]))
            steps.append(evaluate(case, case_knobs(case, fitted)).predicted_step_seconds)
        assert steps[1] / steps[0] == pytest.approx(published, abs=0.01)


@pytest.mark.parametrize("framework", ["megatron", "nemo"])
def test_optimizer_offload_is_planned_only_where_the_export_runs_it(framework, capsys):
    """Megatron's --optimizer-cpu-offload runs with the distributed optimizer (ZeRO-1): plan, estimate, compare and
    scaling once picked tp 4 x dp 2 at ZeRO-3 with the optimizer offloaded for Llama 3 70B on one DGX H100, which
    export then refused. One rule (Capabilities.optimizer_offload_zero_stages) now holds for all of them."""
    from planner.frameworks import Framework
    from planner.frameworks.capabilities import capabilities

    caps = capabilities(Framework(framework))
    assert caps.optimizer_offload_zero_stages == (1,)
    why = caps.refusal({"tp": 4, "pp": 1, "dp": 2, "zero_stage": 3, "offload": "optimizer"})
    assert why is not None and "offload optimizer with zero_stage 3" in why
    assert caps.refusal({"tp": 4, "pp": 1, "dp": 2, "zero_stage": 1, "offload": "optimizer"}) is None
