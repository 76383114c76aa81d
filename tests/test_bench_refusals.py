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
