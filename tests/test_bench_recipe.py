"""The benchmark's training recipe (planner.bench.optim.MasterAdamW) against torch.optim.AdamW, single process.

MasterAdamW is AdamW on fp32 master weights with fp32 moments, the recipe the bench trains with and the memory
model counts (12 B per parameter of optimizer state with a 16-bit model, 8 with an fp32 one). Its update must be
torch's AdamW update: on fp32 parameters the same numbers (to fp32 rounding, 1e-6 of the largest weight: the
two order their fp32 operations differently), and on bf16 parameters the fp32 master must follow an fp32
torch.optim.AdamW run on the same gradients, with the bf16 weight its rounding.
"""

import pytest

torch = pytest.importorskip("torch")

from planner.bench import optim  # noqa: E402
from planner.bench.optim import MasterAdamW  # noqa: E402

pytestmark = pytest.mark.torch
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1
SHAPES = [(7, 5), (11,), (3, 4, 2)]


def _maxabs(t: torch.Tensor) -> float:
    return float(t.detach().abs().max())


def _grads(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _params(dtype) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in SHAPES]


def _run(opt, params, steps: int = 4) -> None:
    for step in range(steps):
        for p, g in zip(params, _grads(step), strict=True):
            p.grad = g.to(p.dtype)
        opt.step()
        opt.zero_grad()


def test_fp32_update_is_torch_adamw():
    ours, ref, start = _params(torch.float32), _params(torch.float32), _params(torch.float32)
    _run(MasterAdamW(ours, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD), ours)
    _run(torch.optim.AdamW(ref, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD), ref)
    for a, b, s in zip(ours, ref, start, strict=True):
        assert _maxabs(a - b) <= 1e-6 * _maxabs(b)
        assert _maxabs(b - s) > 2 * LR  # four steps of ~lr each moved it: the comparison is not vacuous


def test_bf16_master_follows_fp32_adamw():
    ours = _params(torch.bfloat16)
    ref = [torch.nn.Parameter(p.detach().float().clone()) for p in ours]  # the same starting values, in fp32
    opt = MasterAdamW(ours, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    torch_opt = torch.optim.AdamW(ref, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    for step in range(4):
        for p, r, g in zip(ours, ref, _grads(step), strict=True):
            p.grad = g.to(torch.bfloat16)  # what the bf16 model computed; torch's run steps on the same values
            r.grad = p.grad.float()
        opt.step()
        torch_opt.step()
        opt.zero_grad()
        torch_opt.zero_grad()
    for p, master, r in zip(ours, opt.master, ref, strict=True):
        assert master.dtype == torch.float32
        assert _maxabs(master - r) <= 1e-6 * _maxabs(r)
        assert torch.equal(p.detach(), master.to(torch.bfloat16))  # the 16-bit weight is the master's rounding


def test_chunked_update_equals_one_pass(monkeypatch):
    whole = _params(torch.float32)
    _run(MasterAdamW(whole, lr=LR), whole)
    monkeypatch.setattr(optim, "CHUNK_ELEMENTS", 4)  # every tensor in several chunks, the last one partial
    chunked = _params(torch.float32)
    _run(MasterAdamW(chunked, lr=LR), chunked)
    for a, b in zip(chunked, whole, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype,bytes_per_param", [(torch.float32, 8), (torch.bfloat16, 12)])
def test_state_bytes_are_the_models_count(dtype, bytes_per_param):
    # two fp32 moments, plus an fp32 master where the model is not fp32 itself (cost_models.memory's recipe)
    params = _params(dtype)
    n = sum(p.numel() for p in params)
    assert MasterAdamW(params).state_bytes() == bytes_per_param * n
