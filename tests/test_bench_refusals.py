"""`planner bench` refuses, before any rank starts (exit 3, "field: value -> what is allowed"), what it cannot run
as asked: layouts and models it does not build, shapes that crashed the ranks, options out of range and a rank
count the layout does not fit. Each case once ran as something else with exit 0, died in the ranks (exit 7) or
ended as an internal error (exit 9): an audit's findings, 2026-12-08."""

from pathlib import Path

import pytest

from planner import errors
from planner.cli import main

pytestmark = pytest.mark.torch

TINY = ("num_layers: 4\nhidden_size: 128\nnum_attention_heads: 8\nnum_kv_heads: {kv}\nffn_hidden_size: 512\n"
        "vocab_size: {vocab}\nmlp: swiglu\nnorm: rmsnorm\nbias: false\ntied_embeddings: false\n"
        "position_embedding: rope\n")
SMALL = ("--seq-len", "64", "--steps", "1")


@pytest.fixture
def no_ranks(monkeypatch):
    """Fail the test if any rank would start."""
    pytest.importorskip("torch")
    from planner.bench import runner, session

    def started(*_a, **_k):
        raise AssertionError("ranks started before the check")

    monkeypatch.setattr(runner, "run_ranks", started)
    monkeypatch.setattr(session, "launch_local", started)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def tiny_model(tmp_path, *, kv: int = 8, vocab: int = 512) -> str:
    path = tmp_path / f"tiny-kv{kv}-v{vocab}.yaml"
    path.write_text(TINY.format(kv=kv, vocab=vocab))
    return str(path)


def bench(capsys, *args: str) -> tuple[int, str]:
    """(exit code, stderr) of `planner bench` on one 8-GPU node (the cluster only shapes the prediction)."""
    with pytest.raises(SystemExit) as done:
        main(["bench", "-c", "dgx-h100", *SMALL, *args])
    _, err = capsys.readouterr()
    assert "internal error" not in err and "Traceback" not in err
    return done.value.code, err


@pytest.mark.parametrize("args, says", [
    (["-m", "mixtral-8x7b", "--hidden-size", "128", "--vocab-size", "512", "--layers-per-stage", "1",
      "-l", "tp=1,pp=1,dp=2,ep=2", "--nproc", "2"], ["ep: 2", "moe: 8 experts"]),
    (["-m", "mixtral-8x7b", "--hidden-size", "128", "--vocab-size", "512", "--layers-per-stage", "1",
      "-l", "tp=1,pp=1,dp=2", "--nproc", "2"], ["moe: 8 experts"]),
    (["-m", "{tiny_mla}", "-l", "dp=2", "--nproc", "2"], ["mla: kv_lora_rank 32"]),
    (["-m", "{tiny}", "-l", "tp=1,pp=1,dp=1,cp=2", "--nproc", "2"], ["cp: 2 -> the benchmark runs cp=1"]),
    (["-m", "{tiny}", "-l", "tp=1,pp=1,dp=1,cp=2"], ["cp: 2"]),
    (["-m", "{tiny}", "-l", "dp=2,zero=1,offload=optimizer", "--nproc", "2"], ["offload: optimizer"]),
    (["-m", "{tiny}", "-l", "pp=2,dp=1,recompute=full,recompute_layers_per_stage=1/1", "--nproc", "2", "--micro-batches", "2"],
     ["recompute_layers_per_stage: [1, 1]"]),
])
def test_a_layout_or_model_the_benchmark_does_not_build_is_refused(capsys, tmp_path, no_ranks, args, says):
    mla = tmp_path / "tiny-mla.yaml"
    mla.write_text(TINY.format(kv=8, vocab=512) + "mla: {kv_lora_rank: 32, qk_nope_head_dim: 16, qk_rope_head_dim: 8, "
                   "v_head_dim: 16}\n")
    files = {"{tiny}": tiny_model(tmp_path), "{tiny_mla}": str(mla)}
    code, err = bench(capsys, *[files.get(a, a) for a in args])
    assert code == errors.ExitCode.INPUT, err
    for text in says:
        assert text in err


def prepared(model: str, layout: str, **opts):
    """bench_config of `layout` on one dgx-h100 node: (problem, layout, config), with no rank started."""
    from planner.bench.session import BenchOptions, bench_config, bench_target, fit_layout
    from planner.calibration import calibrated

    options = BenchOptions(**opts)
    _, md, cl, lay, seq = bench_target(plan_file=None, cluster="dgx-h100", model=model, layout=layout, nodes=None,
                                       seq_len=64, dp=options.dp, micro_batches=options.micro_batches)
    cl, knobs_kw = calibrated(cl, None)
    return bench_config(md, fit_layout(lay, options), seq, cl, knobs_kw, options)


@pytest.mark.parametrize("kv, tp, refused", [(1, 2, True), (2, 4, True), (2, 2, False), (8, 4, False)])
def test_kv_heads_tp_cannot_shard_are_refused_before_the_ranks(tmp_path, kv, tp, refused):
    """GQA with num_kv_heads < tp: the ranks died reshaping K ("shape '[1, 64, -1, 16]' is invalid", exit 7)."""
    pytest.importorskip("torch")
    from cluster_specs import SpecError

    model, layout = tiny_model(tmp_path, kv=kv), f"tp={tp},dp=1"
    if refused:
        with pytest.raises(SpecError, match=f"num_kv_heads: {kv} .* a multiple of tp \\({tp}\\)"):
            prepared(model, layout, nproc=tp)
    else:
        assert prepared(model, layout, nproc=tp)[2].shape["num_kv_heads"] == kv


@pytest.mark.parametrize("layout, micro_batches, says", [
    ("pp=2,dp=1", 1, "num_micro_batches (--micro-batches): 1 -> 1f1b over 2 pipeline stages needs at least 2"),
    ("pp=4,dp=1,schedule=pipedream_async", 3, "needs at least 4"),
    ("pp=2,dp=1,schedule=zero_bubble", 5, "a multiple of 2"),
    ("pp=2,dp=1", 2, None),
    ("pp=2,dp=1,schedule=gpipe", 1, None),
])
def test_too_few_micro_batches_for_torchs_schedule_are_refused_naming_the_option(tmp_path, layout, micro_batches,
                                                                                 says):
    """1F1B with fewer micro-batches than stages failed in the ranks with torch's own ValueError (exit 7)."""
    pytest.importorskip("torch")
    from cluster_specs import SpecError

    pp = int(layout.split(",")[0].split("=")[1])
    model = tiny_model(tmp_path)
    if says is None:
        assert prepared(model, layout, nproc=pp, micro_batches=micro_batches)[1].num_micro_batches == micro_batches
    else:
        with pytest.raises(SpecError) as refused:
            prepared(model, layout, nproc=pp, micro_batches=micro_batches)
        assert says in str(refused.value)


@pytest.mark.parametrize("vocab, tp, padded", [(50257, 2, 50432), (50257, 1, 50304), (512, 2, 512), (1000, 4, 1024)])
def test_the_benchmark_pads_the_vocabulary_as_the_prediction_does(tmp_path, vocab, tp, padded):
    """gpt3-1.3b's 50,257 tokens at tp 2 died in the ranks (exit 7): the vocabulary-parallel layers split unevenly.
    Megatron pads to a multiple of 128·tp (cost_models.memory.vocab_padded); the run and its prediction both take
    the padded vocabulary. Expected values derived: ceil(V / (128 t)) · 128 t."""
    pytest.importorskip("torch")
    problem, _, cfg = prepared(tiny_model(tmp_path, vocab=vocab), f"tp={tp},dp=1", nproc=tp)
    assert cfg.shape["vocab_size"] == problem.model.vocab_size == padded


@pytest.mark.parametrize("option, value", [("nproc", 0), ("dp", 0), ("dp", -1), ("micro_batches", 0),
                                           ("micro_batches", -3), ("hidden_size", 0)])
def test_counts_below_one_are_refused_by_check_bench_options(option, value):
    """--micro-batches -3 ended as an internal error (exit 9), --dp 0 and --micro-batches 0 were silently ignored,
    --dp -1 was blamed on --nproc."""
    from cluster_specs import SpecError
    from planner.bench.session import BenchOptions, check_bench_options

    flag = "--" + option.replace("_", "-")
    with pytest.raises(SpecError, match=f"{flag}: {value} -> must be a whole number >= 1"):
        check_bench_options(BenchOptions(**{option: value}), 1, None)
    check_bench_options(BenchOptions(**{option: 1}), 1, None)


def test_a_calibration_of_fewer_ranks_than_the_layout_is_refused_with_its_gpu_count(tmp_path, capsys, no_ranks):
    """A calibration measured on 2 ranks, benched with --nproc 4: the prediction's 2-node cluster had no network
    (pydantic's "2 nodes need a network", exit 9)."""
    cal = tmp_path / "cal2.yaml"
    cal.write_text("name: local-vm\ngpu: {name: measured, memory_gib: 12, tflops: {fp32: 0.09}, hbm_gb_per_s: 12}\n"
                   "num_nodes: 1\ngpus_per_node: 2\nintra_node: {kind: pcie, gb_per_s: 0.7}\n"
                   "inter_node: {kind: none, nics_per_node: 0, nic_gbit_per_s: 0.0}\nhost_to_device: {gb_per_s: 12}\n")
    with pytest.raises(SystemExit) as done:
        main(["bench", "-c", str(cal), "-m", tiny_model(tmp_path), "-l", "dp=4", "--nproc", "4", *SMALL])
    err = capsys.readouterr().err
    assert done.value.code == errors.ExitCode.INPUT, err
    assert "has 2 GPUs on one node and no network" in err and "planner calibrate --nproc 4" in err


def test_a_width_no_head_count_splits_over_tp_is_refused():
    """--hidden-size 128 with tp 3: no head count divides 128 and splits over 3 (ZeroDivisionError, exit 9)."""
    from cluster_specs import SpecError
    from planner.bench.session import scale_model
    from planner.inputs.models import load_model
    from planner.inputs.specs import LayoutSpec

    with pytest.raises(SpecError, match="--hidden-size: 128 -> with tp 3"):
        scale_model(load_model("gpt3-1.3b"), LayoutSpec(dp=1, tp=3), layers_per_stage=None, hidden_size=128,
                    vocab_size=None)
    scaled = scale_model(load_model("gpt3-1.3b"), LayoutSpec(dp=1, tp=3), layers_per_stage=None, hidden_size=192,
                         vocab_size=None)
    assert (scaled.num_attention_heads, scaled.num_kv_heads) == (12, 12)  # derived: 16 heads down to 12 (12 | 192, 3 | 12)


@pytest.mark.parametrize("preset, layers, field, expected", [
    ("gemma2-9b", 1, "sliding_window_layers", 1),  # derived: 21 of 42 layers, half of 1 rounded up
    ("gemma2-9b", 4, "sliding_window_layers", 2),  # 21 of 42 -> 2 of 4
    ("deepseek-v2", 1, "num_dense_layers", 0),  # 1 of 60 leading dense layers; fewer than the layers
    ("deepseek-v2", 2, "num_dense_layers", 0),
])
def test_scaled_layers_keep_the_counts_of_layers_of_a_kind_within_the_layers(preset, layers, field, expected):
    """--layers-per-stage 1 left gemma2-9b 21 sliding-window layers of 1 and deepseek-v2 1 dense layer of 1: models
    the specs refuse (exit 9). The counts scale with the layers; the scaled model validates."""
    from planner.bench.session import scale_model
    from planner.inputs.models import load_model
    from planner.inputs.specs import LayoutSpec, ModelSpec

    scaled = scale_model(load_model(preset), LayoutSpec(dp=1), layers_per_stage=layers, hidden_size=None,
                         vocab_size=None)
    got = scaled.sliding_window_layers if field == "sliding_window_layers" else scaled.moe.num_dense_layers
    assert (scaled.num_layers, got) == (layers, expected)
    ModelSpec.model_validate(scaled.model_dump())


@pytest.mark.parametrize("env, args, says", [
    ({}, ["-l", "tp=2,dp=1"], "--nproc: not given (one local rank, not under torchrun) -> the layout needs "
                              "dp*tp*pp*cp = 2 ranks: give --nproc 2"),
    ({}, ["-l", "tp=2,dp=1", "--nproc", "4"], "--nproc: 4 -> the layout needs dp*tp*pp*cp = 2 ranks"),
    ({"RANK": "1", "WORLD_SIZE": "4"}, ["-l", "tp=2,dp=1"],
     "WORLD_SIZE: 4 (torchrun's ranks) -> the layout needs dp*tp*pp*cp = 2 ranks"),
])
def test_ranks_the_layout_does_not_fit_are_a_usage_error_naming_the_option(capsys, tmp_path, monkeypatch, no_ranks,
                                                                          env, args, says):
    """Without --nproc a tp=2 layout started one rank, which failed (exit 7, "rank 0 failed"); under torchrun with
    another world size every rank reported an internal error (exit 9)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, err = bench(capsys, "-m", tiny_model(tmp_path), *args)
    assert code == errors.ExitCode.INPUT, err
    assert says in err


def test_save_calibration_of_cpu_runs_against_gpu_predictions_is_refused():
    """bench --top --save-calibration folds measured/predicted into the cluster's end-to-end factor: runs on this
    machine's CPU against predictions for A100s wrote 0.07 into the A100 cluster's file, and the next plan predicted
    95 s where it had said 7.7 s (audit of 2026-12-08). A cluster measured by `planner calibrate` is this machine."""
    torch = pytest.importorskip("torch")
    from cluster_specs import SpecError, load_cluster
    from planner.bench.session import check_calibration_device

    if torch.cuda.is_available():
        pytest.skip("on CUDA the runs are the GPUs'")
    with pytest.raises(SpecError, match="--save-calibration: the runs are on this machine's CPU"):
        check_calibration_device(load_cluster("dgx-a100-80gb", nodes=16))
    measured = load_cluster("dgx-a100-80gb").model_copy(update={"measured": {"measured_at": "now"}})
    check_calibration_device(measured)  # a calibration of this machine: allowed


def _sleeping_rank(rank, world, args, init_method):
    """A rank that trains for a minute (module level: the forkserver imports it)."""
    import time

    time.sleep(60)
    return {}


def test_sigterm_to_the_parent_stops_the_ranks(tmp_path):
    """`kill -TERM <bench pid>` ended the parent (exit 143) and left both ranks training, and the forkserver, with a
    /tmp/planner-bench-* folder behind (audit of 2026-12-08): the ranks are not daemons. run_ranks now stops them."""
    pytest.importorskip("torch")
    import os
    import signal
    import subprocess
    import sys
    import time

    root = str(Path(__file__).resolve().parents[1])
    code = (f"import sys; sys.path.insert(0, {root!r})\n"
            "from planner.bench.runner import run_ranks\n"
            "from tests.test_bench_refusals import _sleeping_rank\n"
            "import os; print('PIDS', os.getpid(), flush=True)\n"
            "run_ranks(_sleeping_rank, None, 2, 60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    proc.stdout.readline()
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("planner-bench-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # the ranks started
    children, frontier = [], [str(proc.pid)]
    while frontier:  # every descendant: the ranks are the forkserver's children
        found = subprocess.run(["pgrep", "-P", ",".join(frontier)], capture_output=True, text=True).stdout.split()
        children += found
        frontier = found
    assert len(children) >= 3  # the forkserver and two ranks at least
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    time.sleep(1)
    alive = [pid for pid in children if os.path.exists(f"/proc/{pid}") and
             "zombie" not in open(f"/proc/{pid}/status").read().lower()]
    assert not alive, alive
    assert not list(tmp_path.glob("planner-bench-*"))


def test_run_notes_say_what_the_prediction_does():
    """The notes beside bench's rows contradicted its prediction (audit of 2026-12-08): the SP note said the
    prediction was Megatron's, but bench_knobs predicts torch's DTensor SP; the FSDP2 note said the estimate books
    2 + 12 B where an fp32 run's books 4 + 8; ZeRO-2's parameters row read +100% without a word (FSDP2 shards
    the parameters); pipedream_async's note said 'same memory' where the estimate books a weight stash."""
    from planner.bench.session import run_notes
    from planner.estimate import build_problem
    from planner.inputs.specs import LayoutSpec

    fp32 = build_problem("dgx-h100", 1, "llama3-8b", 8, 1024, "fp32")
    notes = " ".join(run_notes(fp32, LayoutSpec(dp=8, zero_stage=2, num_micro_batches=1), "cpu"))
    assert "as the estimate books them" in notes and "ZeRO-2 runs as FSDP2 too" in notes
    bf16 = build_problem("dgx-h100", 1, "llama3-8b", 8, 1024, "bf16")
    notes = " ".join(run_notes(bf16, LayoutSpec(dp=4, tp=2, sequence_parallel=True, zero_stage=3, num_micro_batches=1), "cuda"))
    assert "books 2 B of weights + 12 B of optimizer state" in notes and "ZeRO-2" not in notes
    assert "predicted as torch's DTensor sequence parallelism runs" in notes
    pipe = run_notes(bf16, LayoutSpec(dp=2, pp=4, num_micro_batches=8, schedule="pipedream_async"), "cuda")
    assert any("stashed weight versions" in n and "read high" in n for n in pipe)


def test_a_cpu_calibration_of_another_rank_count_is_said():
    """A CPU calibration made with 4 ranks on 2 cores predicted dp=1 at +224% and dp=4 at -35% of the same per-rank
    work (audit of 2026-12-08): on CPU the ranks share the cores, so the rates hold at the calibration's rank count."""
    from planner.bench.session import run_notes
    from planner.estimate import build_problem
    from planner.inputs.specs import LayoutSpec

    p = build_problem("dgx-h100", 1, "llama3-8b", 8, 1024, "fp32")
    measured = p.cluster.model_copy(update={"measured": {"measured_at": "now"}, "gpus_per_node": 4})
    p = type(p)(p.model, p.training, measured, p.knobs)
    lay = LayoutSpec(dp=2, num_micro_batches=4)
    assert any("measured 4 ranks at once and this run has 2" in n for n in run_notes(p, lay, "cpu", 2))
    assert not any("ranks at once" in n for n in run_notes(p, lay, "cpu", 4))
