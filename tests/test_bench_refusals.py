"""`planner bench` refuses, before any rank starts (exit 3, "field: value -> what is allowed"), what it cannot run
as asked: layouts and models it does not build, shapes that crashed the ranks, options out of range and a rank
count the layout does not fit. Each case once ran as something else with exit 0, died in the ranks (exit 7) or
ended as an internal error (exit 9): an audit's findings, 2026-12-08."""

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
