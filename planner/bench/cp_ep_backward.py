"""The backward of the CPU CP/EP benchmark (planner/bench/cp_ep.py): ring attention's backward and the gradients of
the EP dispatch/combine, on the same gloo ranks, checked against one process's autograd.

- Ring attention backward (TransformerEngine context_parallel.py, AttnFuncWithCPAndKVP2P.backward): the ring runs
  the other way (send to rank-1, receive from rank+1), starting from the K/V block the forward received last
  (the forward saves it, not its own), so that after cp steps each rank holds the gradient of its own K/V. Step 0
  sends K/V only, steps 1..cp-2 send K/V with the dK/dV accumulated so far in one buffer, step cp-1 sends dK/dV
  only: (cp-1) K/V blocks and (cp-1) dK/dV blocks, twice the forward's bytes (the cost model's backward_bytes,
  cost_models/context_parallel.py cp_traffic). Each block's gradients use the forward's final log-sum-exp
  (FlashAttention-2's backward: P = exp(S - lse), dS = P·(dP - rowsum(dO·O))).
- EP backward: the gradient of a dispatch all-to-all is an all-to-all the other way (a combine), and of a combine a
  dispatch (DeepEP README; Megatron's token dispatcher runs autograd through all_to_all). `AllToAll` below is that
  autograd function; the MoE layer's gradients (tokens, router, local experts) come from torch autograd through it.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from planner.bench.cp_ep import CpEpConfig


# ---- ring attention backward -------------------------------------------------------------------------------------


class RingForward(NamedTuple):
    """What the ring's forward keeps for its backward (TE saves q, the last received K/V, out and lse)."""

    q: torch.Tensor  # (heads, s/cp, d): this rank's queries
    pos: torch.Tensor  # their global positions
    out: torch.Tensor
    lse: torch.Tensor  # (heads, s/cp, 1): the final log-sum-exp
    kv_last: torch.Tensor  # (2, kv_heads, s/cp, d): the block the forward received last (rank+1's)
    kv_last_pos: torch.Tensor


def block_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                fwd: RingForward, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of one causal block against the forward's final lse (GQA: dK/dV summed over each K/V head's
    query heads)."""
    rep = q.shape[0] // k.shape[0]
    kr, vr = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    scale = 1 / math.sqrt(q.shape[-1])
    scores = (q @ kr.transpose(-1, -2) * scale).masked_fill(k_pos[None, None, :] > q_pos[None, :, None],
                                                             float("-inf"))
    p = torch.exp(scores - fwd.lse)
    dv = p.transpose(-1, -2) @ dout
    ds = p * (dout @ vr.transpose(-1, -2) - (dout * fwd.out).sum(-1, keepdim=True))
    dq = ds @ kr * scale
    dk = ds.transpose(-1, -2) @ q * scale

    def per_kv_head(g: torch.Tensor) -> torch.Tensor:
        return g.view(k.shape[0], rep, *g.shape[1:]).sum(1)

    return dq, per_kv_head(dk), per_kv_head(dv)


def ring_backward(fwd: RingForward, dout: torch.Tensor, rank: int, cp: int, positions: Any
                  ) -> tuple[torch.Tensor, torch.Tensor, float, int]:
    """(dQ of this rank's queries, dK/dV of its own K/V block (2, kv_heads, s/cp, d), seconds waiting on the
    transfers once a block's gradients are done, bytes sent). `positions(rank)` gives a rank's global positions."""
    dst, src = (rank - 1) % cp, (rank + 1) % cp
    kv, kv_pos = fwd.kv_last, fwd.kv_last_pos
    dq, acc, comm, sent = torch.zeros_like(fwd.q), torch.zeros_like(kv), 0.0, 0
    for i in range(cp):
        send, recv = _ring_backward_buffers(kv, acc, i, cp)
        reqs = _exchange(send, recv, dst, src)
        sent += send.numel() * send.element_size() if reqs else 0
        g_q, g_k, g_v = block_grads(fwd.q, kv[0], kv[1], fwd.pos, kv_pos, fwd, dout)
        dq += g_q
        t0 = time.perf_counter()
        for req in reqs:
            req.wait()
        comm += time.perf_counter() - t0
        incoming = recv[-1] if recv is not None and i > 0 else torch.zeros_like(acc)
        acc = incoming + torch.stack([g_k, g_v])  # the received accumulator is for this step's block
        if recv is not None and i < cp - 1:
            kv, kv_pos = recv[0], positions((rank + 2 + i) % cp)
    return dq, acc, comm, sent


def _ring_backward_buffers(kv: torch.Tensor, acc: torch.Tensor, i: int, cp: int
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """TE's send/receive buffers at backward step i: K/V (i = 0), K/V + dK/dV (0 < i < cp-1), dK/dV (i = cp-1);
    one message each (stacked: (1 or 2, 2, kv_heads, s/cp, d))."""
    if cp == 1:
        return kv, None
    if i == 0:
        parts = [kv]
    elif i < cp - 1:
        parts = [kv, acc]
    else:
        parts = [acc]
    send = torch.stack(parts).contiguous()
    return send, torch.empty_like(send)


def _exchange(send: torch.Tensor, recv: torch.Tensor | None, dst: int, src: int) -> list[dist.Work]:
    if recv is None:
        return []
    works = (dist.isend(send, dst), dist.irecv(recv, src))
    return [w for w in works if w is not None]


def ring_backward_transfer_seconds(cfg: CpEpConfig, rank: int, cp: int) -> float:
    """Seconds of the backward ring's transfers alone (TE's message sizes: 1, 2, ..., 2, 1 blocks), after a
    barrier."""
    block = torch.zeros(2, cfg.kv_heads, cfg.seq_length // cp, cfg.head_dim, dtype=torch.float64)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(cp):
        send, recv = _ring_backward_buffers(block, block, i, cp)
        for req in _exchange(send, recv, (rank - 1) % cp, (rank + 1) % cp):
            req.wait()
    return time.perf_counter() - t0


def upstream_attention_grad(cfg: CpEpConfig) -> torch.Tensor:
    """dLoss/dOut for the whole sequence (heads, s, d), seeded: every rank and the reference use the same."""
    g = torch.Generator().manual_seed(cfg.seed + 7)
    return torch.randn(cfg.heads, cfg.seq_length, cfg.head_dim, generator=g, dtype=torch.float64)


def reference_attention_grads(cfg: CpEpConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of causal GQA attention over the whole sequence in one process (torch autograd)."""
    from planner.bench.cp_ep import full_qkv, reference_attention_of

    q, k, v = (t.requires_grad_() for t in full_qkv(cfg))
    out = reference_attention_of(cfg, q, k, v)
    (out * upstream_attention_grad(cfg)).sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None
    return q.grad, k.grad, v.grad


# ---- EP: autograd through the all-to-alls ------------------------------------------------------------------------


class AllToAll(torch.autograd.Function):
    """all_to_all_single whose gradient is the all-to-all the other way. `clock` collects, per direction, the
    seconds inside the exchange (after a barrier, so a peer's compute is not counted) and the rows this rank sent
    to other ranks."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int], rank: int,
                clock: dict) -> torch.Tensor:
        ctx.splits, ctx.rank, ctx.clock = (out_splits, in_splits), rank, clock
        return _timed_all_to_all(x, out_splits, in_splits, rank, clock, "forward")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        out_splits, in_splits = ctx.splits
        return _timed_all_to_all(grad, in_splits, out_splits, ctx.rank, ctx.clock, "backward"), None, None, None, None


def _timed_all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], rank: int, clock: dict,
                      direction: str) -> torch.Tensor:
    out = torch.empty(sum(out_splits), *x.shape[1:], dtype=x.dtype)
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
    clock[f"{direction}_seconds"] = clock.get(f"{direction}_seconds", 0.0) + time.perf_counter() - t0
    rows = sum(in_splits) - in_splits[rank]
    clock[f"{direction}_rows_sent"] = clock.get(f"{direction}_rows_sent", 0) + rows
    return out


def upstream_moe_grad(cfg: CpEpConfig, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(cfg.seed + 200 + rank)
    return torch.randn(cfg.tokens, cfg.hidden, generator=g, dtype=torch.float64)


def reference_moe_grads(cfg: CpEpConfig, world: int) -> dict[str, Any]:
    """Gradients of sum_r <y_r, G_r> for the MoE layer in one process: every rank's tokens, the router, and every
    expert's fc1/fc2 (torch autograd)."""
    from planner.bench.cp_ep import moe_weights, rank_tokens, reference_moe_of

    router, fc1, fc2 = (w.requires_grad_() for w in moe_weights(cfg))
    xs = [rank_tokens(cfg, r).requires_grad_() for r in range(world)]
    ys = reference_moe_of(cfg, xs, router, fc1, fc2)
    torch.stack([(y * upstream_moe_grad(cfg, r)).sum() for r, y in enumerate(ys)]).sum().backward()
    return {"x": [x.grad for x in xs], "router": router.grad, "fc1": fc1.grad, "fc2": fc2.grad}
