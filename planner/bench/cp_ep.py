"""Context-parallel ring attention and expert-parallel dispatch/combine on real process groups (gloo on CPU), checked
against one process and timed against the cost model.

- CP (ring, Megatron's `--cp-comm-type p2p`): the sequence is cut into 2·cp chunks and rank r keeps chunks r and
  2cp-1-r (the load-balanced causal split, modern-training.md §2.2). K and V travel round the ring in cp-1 steps
  (isend/irecv to the neighbours); each step's causal attention block is merged into the running output with its
  log-sum-exp (online softmax, Ring Attention §3). The gathered output equals causal attention over the whole
  sequence in one process.
- EP (Megatron's alltoall dispatcher): every rank routes its tokens top-k over E experts (E/ep per rank), sends each
  token copy to the rank owning its expert (all_to_all_single with the exchanged counts), runs its experts, sends
  the results back and sums them with the router weights. The output equals the same MoE layer in one process.

Timing: a two-rank exchange at four sizes on the same ranks gives the link (latency, bandwidth: the CPU calibration
of this machine);
the cost model then predicts the ring's transfers (cost_models/context_parallel.py cp_transfer_seconds) and the
all-to-all (cost_models/moe.py ep_traffic, ep_all_to_all_seconds) from the bytes moved, and the report puts the
measured medians beside the predictions.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from planner.bench.cp_ep_backward import RingForward

if TYPE_CHECKING:
    from cost_models.inputs import Link


@dataclass(frozen=True)
class CpEpConfig:
    seq_length: int = 1024  # CP: tokens of the one sequence (divisible by 2·world)
    heads: int = 4
    kv_heads: int = 2  # GQA: K/V heads shared by heads/kv_heads query heads
    head_dim: int = 32
    tokens: int = 512  # EP: tokens per rank
    hidden: int = 128
    ffn: int = 64
    experts: int = 8  # divisible by world
    top_k: int = 2
    repeats: int = 5  # timed repetitions (median)
    seed: int = 0
    timeout_seconds: float = 120.0


# ---- context parallelism: ring attention -------------------------------------------------------------------


def cp_chunks(seq_length: int, cp: int, rank: int) -> tuple[int, int]:
    """The two chunk indices rank `rank` keeps: r and 2cp-1-r (Megatron utils.py, Llama 3 §3.3.2)."""
    return rank, 2 * cp - 1 - rank


def _positions(seq_length: int, cp: int, rank: int) -> torch.Tensor:
    c = seq_length // (2 * cp)
    a, b = cp_chunks(seq_length, cp, rank)
    return torch.cat([torch.arange(a * c, (a + 1) * c), torch.arange(b * c, (b + 1) * c)])


def full_qkv(cfg: CpEpConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole sequence's Q (heads), K and V (kv_heads), seeded: every rank and the reference build the same."""
    g = torch.Generator().manual_seed(cfg.seed)
    q = torch.randn(cfg.heads, cfg.seq_length, cfg.head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(cfg.kv_heads, cfg.seq_length, cfg.head_dim, generator=g, dtype=torch.float64)
    v = torch.randn(cfg.kv_heads, cfg.seq_length, cfg.head_dim, generator=g, dtype=torch.float64)
    return q, k, v


def reference_attention(cfg: CpEpConfig) -> torch.Tensor:
    """Causal GQA attention over the whole sequence in one process: (heads, s, d)."""
    return reference_attention_of(cfg, *full_qkv(cfg))


def reference_attention_of(cfg: CpEpConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    rep = cfg.heads // cfg.kv_heads
    return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0), is_causal=True)


def _block(q, k, v, q_pos, k_pos):
    """One ring step: causal attention of the local queries against one KV block, with its log-sum-exp."""
    rep = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # -inf where a query sees nothing in this block
    weights = torch.exp(scores - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse))
    return weights @ v, lse


def _merge(out, lse, blk_out, blk_lse):
    """Online softmax: combine two partial attentions by their log-sum-exps."""
    new = torch.logaddexp(lse, blk_lse)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    return out * torch.exp(lse - safe) + blk_out * torch.exp(blk_lse - safe), new


def ring_attention(cfg: CpEpConfig, rank: int, cp: int) -> tuple[RingForward, float, int]:
    """(what the backward keeps: this rank's queries, output rows, their global positions, lse and the last K/V
    block received; seconds spent waiting on the ring's transfers once the block's attention is done; bytes this
    rank sent)."""
    import time

    q, k, v = full_qkv(cfg)
    pos = _positions(cfg.seq_length, cp, rank)
    q, kv = q[:, pos], torch.stack([k[:, pos], v[:, pos]])
    out = torch.zeros_like(q)
    lse = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype)
    src, dst, kv_pos, comm, sent = (rank - 1) % cp, (rank + 1) % cp, pos, 0.0, 0
    for step in range(cp):
        pending = []
        if step < cp - 1:  # post the next block's transfer before computing on this one (TE's double buffer)
            recv = torch.empty_like(kv)
            pending = _started(dist.isend(kv.contiguous(), dst), dist.irecv(recv, src))
            sent += kv.numel() * kv.element_size()
        out, lse = _merge(out, lse, *_block(q, kv[0], kv[1], pos, kv_pos))
        if pending:
            t0 = time.perf_counter()
            for req in pending:
                req.wait()
            comm += time.perf_counter() - t0
            kv, kv_pos = recv, _positions(cfg.seq_length, cp, (rank - step - 1) % cp)
    return RingForward(q, pos, out, lse, kv, kv_pos), comm, sent


def _started(*works: dist.Work | None) -> list[dist.Work]:
    """The requests isend/irecv started (they return None only on a rank outside the group, never here)."""
    return [w for w in works if w is not None]


def ring_transfer_seconds(cfg: CpEpConfig, rank: int, cp: int) -> float:
    """Seconds of the ring's cp-1 K/V transfers alone (no attention to hide behind), after a barrier."""
    import time

    kv = torch.zeros(2, cfg.kv_heads, cfg.seq_length // cp, cfg.head_dim, dtype=torch.float64)
    recv = torch.empty_like(kv)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(cp - 1):
        reqs = _started(dist.isend(kv, (rank + 1) % cp), dist.irecv(recv, (rank - 1) % cp))
        for req in reqs:
            req.wait()
        kv, recv = recv, kv
    return time.perf_counter() - t0


# ---- expert parallelism: dispatch / combine ----------------------------------------------------------------


def moe_weights(cfg: CpEpConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router (h x E) and every expert's fc1 (E x h x f) and fc2 (E x f x h), seeded identically everywhere."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    router = torch.randn(cfg.hidden, cfg.experts, generator=g, dtype=torch.float64)
    fc1 = torch.randn(cfg.experts, cfg.hidden, cfg.ffn, generator=g, dtype=torch.float64) / math.sqrt(cfg.hidden)
    fc2 = torch.randn(cfg.experts, cfg.ffn, cfg.hidden, generator=g, dtype=torch.float64) / math.sqrt(cfg.ffn)
    return router, fc1, fc2


def rank_tokens(cfg: CpEpConfig, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(cfg.seed + 100 + rank)
    return torch.randn(cfg.tokens, cfg.hidden, generator=g, dtype=torch.float64)


def _route(x: torch.Tensor, router: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(x @ router, dim=-1)
    weights, experts = probs.topk(top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), experts


def _expert(x: torch.Tensor, e: int, fc1: torch.Tensor, fc2: torch.Tensor) -> torch.Tensor:
    return F.gelu(x @ fc1[e]) @ fc2[e]


def reference_moe(cfg: CpEpConfig, world: int) -> list[torch.Tensor]:
    """Every rank's MoE output computed in one process."""
    return reference_moe_of(cfg, [rank_tokens(cfg, r) for r in range(world)], *moe_weights(cfg))


def reference_moe_of(cfg: CpEpConfig, xs: list[torch.Tensor], router: torch.Tensor, fc1: torch.Tensor,
                     fc2: torch.Tensor) -> list[torch.Tensor]:
    outs = []
    for x in xs:
        weights, experts = _route(x, router, cfg.top_k)
        y = torch.zeros_like(x)
        for j in range(cfg.top_k):
            for e in range(cfg.experts):
                rows = experts[:, j] == e
                y = y.index_add(0, rows.nonzero().flatten(), weights[rows, j, None] * _expert(x[rows], e, fc1, fc2))
        outs.append(y)
    return outs


class EpMoe(NamedTuple):
    y: torch.Tensor  # this rank's MoE output
    x: torch.Tensor  # its tokens (leaf, requires grad)
    weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # router, fc1, fc2 (leaves, require grad)
    clock: dict  # AllToAll's seconds and rows sent, per direction (forward now, backward after .backward())
    copies_sent: int


def ep_moe(cfg: CpEpConfig, rank: int, ep: int) -> EpMoe:
    """This rank's MoE layer with autograd through the dispatch and combine all-to-alls (cp_ep_backward.AllToAll):
    route top-k, send each token copy to the rank owning its expert, run the local experts, send the results back
    and sum them with the router weights."""
    from planner.bench.cp_ep_backward import AllToAll

    router, fc1, fc2 = (w.requires_grad_() for w in moe_weights(cfg))
    per_rank, clock = cfg.experts // ep, dict[str, float]()
    x = rank_tokens(cfg, rank).requires_grad_()
    weights, experts = _route(x, router, cfg.top_k)
    flat_e = experts.reshape(-1)
    order = torch.argsort(flat_e, stable=True)  # token copies grouped by expert, hence by owning rank
    copies = x.repeat_interleave(cfg.top_k, 0)[order]
    send_counts = torch.bincount(flat_e // per_rank, minlength=ep)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    sends, recvs = send_counts.tolist(), recv_counts.tolist()
    recv = AllToAll.apply(copies, recvs, sends, rank, clock)
    recv_e = torch.empty(int(recv_counts.sum()), dtype=flat_e.dtype)
    dist.all_to_all_single(recv_e, flat_e[order].contiguous(), recvs, sends)
    out = torch.zeros_like(recv)
    for e in range(rank * per_rank, (rank + 1) * per_rank):
        rows = (recv_e == e).nonzero().flatten()
        out = out.index_add(0, rows, _expert(recv[rows], e, fc1, fc2))
    back = AllToAll.apply(out, sends, recvs, rank, clock)
    unsorted = torch.empty_like(back).index_copy(0, order, back)
    y = (unsorted.view(cfg.tokens, cfg.top_k, cfg.hidden) * weights[..., None]).sum(1)
    return EpMoe(y, x, (router, fc1, fc2), clock, int(send_counts.sum() - send_counts[rank]))


# ---- the ranks ---------------------------------------------------------------------------------------------


def _exchange(rank: int, nbytes: int, repeats: int) -> float:
    """Median seconds for ranks 0 and 1 to swap nbytes at once (isend + irecv each way): the pattern of a ring step
    and of a two-rank all-to-all, measured the way they run (on CPU, gloo's copies share the cores, so a one-way
    ping-pong would overstate the link)."""
    import time

    buf, recv = torch.zeros(max(1, nbytes // 8), dtype=torch.float64), torch.empty(max(1, nbytes // 8),
                                                                                   dtype=torch.float64)
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        if rank in (0, 1):
            for req in _started(dist.isend(buf, 1 - rank), dist.irecv(recv, 1 - rank)):
                req.wait()
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[len(times[1:]) // 2]


def _round(cfg: CpEpConfig, rank: int, world: int) -> dict:
    """One round: ring attention forward and backward, the MoE layer forward and backward, and the ring's transfers
    timed alone; returns this round's results and timings."""
    from planner.bench.cp_ep_backward import (
        ring_backward,
        ring_backward_transfer_seconds,
        upstream_attention_grad,
        upstream_moe_grad,
    )

    dist.barrier()
    fwd, exposed, ring_sent = ring_attention(cfg, rank, world)
    dout = upstream_attention_grad(cfg)[:, fwd.pos]
    dq, dkv, exposed_bwd, ring_bwd_sent = ring_backward(fwd, dout, rank, world,
                                                        lambda r: _positions(cfg.seq_length, world, r))
    timed = {"cp": ring_transfer_seconds(cfg, rank, world),
             "cp_backward": ring_backward_transfer_seconds(cfg, rank, world),
             "cp_exposed": exposed, "cp_backward_exposed": exposed_bwd}
    dist.barrier()
    moe = ep_moe(cfg, rank, world)
    (moe.y * upstream_moe_grad(cfg, rank)).sum().backward()
    timed |= {"ep": moe.clock["forward_seconds"], "ep_backward": moe.clock["backward_seconds"]}
    router, fc1, fc2 = moe.weights
    local = slice(rank * cfg.experts // world, (rank + 1) * cfg.experts // world)
    return {"timed": timed, "attention": fwd.out.tolist(), "positions": fwd.pos.tolist(), "moe": moe.y.tolist(),
            "dq": dq.tolist(), "dkv": dkv.tolist(), "dx": _grad(moe.x).tolist(), "router_grad": _grad(router).tolist(),
            "fc1_grad": _grad(fc1)[local].tolist(), "fc2_grad": _grad(fc2)[local].tolist(),
            "ring_bytes_sent": ring_sent, "ring_backward_bytes_sent": ring_bwd_sent,
            "ep_copies_sent": moe.copies_sent, "ep_backward_copies_sent": moe.clock["backward_rows_sent"]}


def _grad(t: torch.Tensor) -> torch.Tensor:
    if t.grad is None:
        raise RuntimeError("no gradient reached a leaf of the MoE layer")
    return t.grad


def worker(rank: int, world: int, cfg: CpEpConfig, init_method: str) -> dict:
    from datetime import timedelta

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg.timeout_seconds))
    rounds = []
    pings: dict[int, list[float]] = {size: [] for size in PING_BYTES}
    for _ in range(cfg.repeats + 1):  # the first round warms the connections up and is not timed
        rounds.append(_round(cfg, rank, world))
        for size in PING_BYTES:  # the link, measured in the same rounds (the machine's load drifts)
            pings[size].append(_exchange(rank, size, 1))
    link = [(size, sorted(ts[1:])[len(ts[1:]) // 2]) for size, ts in pings.items()]
    last = rounds[-1]
    medians = {f"{k}_seconds": sorted(r["timed"][k] for r in rounds[1:])[len(rounds[1:]) // 2] for k in last["timed"]}
    return {"rank": rank, "link": link, **medians, **{k: v for k, v in last.items() if k != "timed"}}


PING_BYTES = (8, 2**16, 2**19, 2**21)  # spans the ring's and the all-to-all's messages (0.25-1 MB here)


def _fit_link(points: list) -> Link:
    """Latency and bandwidth of the rank-0 <-> rank-1 link: t = latency + bytes / bandwidth fitted to the ping
    sizes (planner/bench/calibrate.py fit_gemm_line: least squares on the relative error)."""
    from cost_models.inputs import Link
    from planner.bench.calibrate import fit_gemm_line

    bandwidth, latency = fit_gemm_line([(float(b), float(t)) for b, t in points])
    return Link(bandwidth, latency)


def _attention_shape(cfg: CpEpConfig):
    """The benchmark's attention as a cost-model Transformer (only the attention shape matters to CP's bytes)."""
    from cost_models.inputs import Transformer

    return Transformer(num_layers=1, hidden_size=cfg.heads * cfg.head_dim, num_attention_heads=cfg.heads,
                       num_kv_heads=cfg.kv_heads, ffn_hidden_size=cfg.ffn, vocab_size=1, swiglu=False,
                       tied_embeddings=True, rms_norm=True, flash_attention=True, learned_position_embeddings=False,
                       max_position_embeddings=cfg.seq_length, bias=False, dropout=False)


def predictions(cfg: CpEpConfig, world: int, link, copies_sent: float, backward_rows_sent: float) -> dict:
    """What the cost model charges for the measured exchanges on this link: the ring's forward transfers (cp-1 p2p
    steps, cost_models/context_parallel.py) and its backward (K/V again and dK/dV: backward_bytes in cp-1 steps);
    one dispatch + one combine of the copies that leave the rank (cost_models/moe.py: all EP ranks in one node, so
    every byte moves on the intra-node link), and as much again in the backward (all_to_all_bytes_per_layer)."""
    from cost_models.communication import p2p_seconds
    from cost_models.context_parallel import cp_traffic
    from cost_models.inputs import MoE
    from cost_models.moe import all_to_all_bytes_per_layer, ep_all_to_all_seconds, ep_traffic

    ring = cp_traffic(_attention_shape(cfg), variant="p2p", micro_batch_size=1, seq_length=cfg.seq_length, tp=1,
                      cp=world, activation_bytes=8)
    cp = (world - 1) * p2p_seconds(message_bytes=ring.forward_bytes / (world - 1), link=link)
    cp_bwd = (world - 1) * p2p_seconds(message_bytes=ring.backward_bytes / (world - 1), link=link)
    moe = MoE(num_experts=cfg.experts, top_k=cfg.top_k, expert_ffn_hidden_size=cfg.ffn)
    copies_bytes = 2 * cfg.tokens * cfg.top_k * cfg.hidden * 8  # dispatch + combine, every copy (fp64)
    traffic = ep_traffic(moe, copies_bytes=copies_bytes, ep=world, ranks_per_node=world)
    ep = ep_all_to_all_seconds(traffic, ep=world, intra=link, network_per_gpu=None)
    _, ep_bwd_bytes = all_to_all_bytes_per_layer(tokens=cfg.tokens, top_k=cfg.top_k, hidden_size=cfg.hidden, ep=world,
                                                 dispatch_bytes=8, combine_bytes=8)
    return {"cp_ring_seconds": cp, "cp_ring_backward_seconds": cp_bwd, "ep_all_to_all_seconds": ep,
            "ep_all_to_all_backward_seconds": ep, "cp_bytes_model": ring.forward_bytes,
            "cp_backward_bytes_model": ring.backward_bytes, "ep_bytes_model": traffic.intra_node_bytes,
            "ep_backward_bytes_model": ep_bwd_bytes, "ep_bytes_sent": 2 * copies_sent * cfg.hidden * 8,
            "ep_backward_bytes_sent": backward_rows_sent * cfg.hidden * 8}


def _max_error(got: list, want: torch.Tensor) -> float:
    return float((torch.tensor(got, dtype=torch.float64) - want).abs().max())


def gradient_errors(cfg: CpEpConfig, world: int, reports: list[dict]) -> dict[str, float]:
    """Max |error| of every gradient the ranks computed against one process's autograd (cp_ep_backward)."""
    from planner.bench.cp_ep_backward import reference_attention_grads, reference_moe_grads

    dq, dk, dv = reference_attention_grads(cfg)
    ref = reference_moe_grads(cfg, world)
    per = world and cfg.experts // world
    att = moe = 0.0
    for r in reports:
        pos = r["positions"]
        att = max(att, _max_error(r["dq"], dq[:, pos]), _max_error(r["dkv"], torch.stack([dk[:, pos], dv[:, pos]])))
        local = slice(r["rank"] * per, (r["rank"] + 1) * per)
        moe = max(moe, _max_error(r["dx"], ref["x"][r["rank"]]), _max_error(r["fc1_grad"], ref["fc1"][local]),
                  _max_error(r["fc2_grad"], ref["fc2"][local]))
    router = sum(torch.tensor(r["router_grad"], dtype=torch.float64) for r in reports)  # replicated: all-reduced
    moe = max(moe, float((router - ref["router"]).abs().max()))
    return {"attention_backward_max_abs_error": att, "moe_backward_max_abs_error": moe}


def run(cfg: CpEpConfig, world: int) -> dict:
    """Launch `world` gloo ranks; return the numerics (forward and backward) against one process and the timings
    against the model."""
    from planner.bench.runner import run_ranks

    if cfg.seq_length % (2 * world) or cfg.experts % world:
        from planner.errors import BenchmarkError

        raise BenchmarkError(f"cp/ep bench: seq_length {cfg.seq_length} must divide by 2 x {world} and experts "
                             f"{cfg.experts} by {world}")
    reports = run_ranks(worker, cfg, world, cfg.timeout_seconds)
    ref_att, ref_moe = reference_attention(cfg), reference_moe(cfg, world)
    att_err = max(_max_error(r["attention"], ref_att[:, r["positions"]]) for r in reports)
    moe_err = max(_max_error(r["moe"], ref_moe[r["rank"]]) for r in reports)
    link = _fit_link(reports[0]["link"])
    sent = sum(r["ep_copies_sent"] for r in reports) / world
    bwd_rows = sum(r["ep_backward_copies_sent"] for r in reports) / world

    def slowest(key: str) -> float:
        return max(r[key] for r in reports)

    measured = {"cp_ring_seconds": slowest("cp_seconds"), "cp_ring_backward_seconds": slowest("cp_backward_seconds"),
                "cp_ring_exposed_behind_attention_seconds": slowest("cp_exposed_seconds"),
                "cp_ring_backward_exposed_behind_attention_seconds": slowest("cp_backward_exposed_seconds"),
                "ep_all_to_all_seconds": slowest("ep_seconds"),
                "ep_all_to_all_backward_seconds": slowest("ep_backward_seconds")}
    return {"world": world, "config": asdict(cfg), "attention_max_abs_error": att_err, "moe_max_abs_error": moe_err,
            **gradient_errors(cfg, world, reports),
            "link": {"bandwidth_bytes_per_second": link.bandwidth_bytes_per_second,
                     "latency_seconds": link.latency_seconds},
            "measured": measured, "predicted": predictions(cfg, world, link, sent, bwd_rows),
            "ring_bytes_sent": reports[0]["ring_bytes_sent"],
            "ring_backward_bytes_sent": reports[0]["ring_backward_bytes_sent"]}


def main(argv: list[str] | None = None) -> int:
    """`python -m planner.bench.cp_ep [--ranks N] [--repeats R]`: the report as JSON on stdout."""
    import argparse
    import json
    import os

    parser = argparse.ArgumentParser(prog="python -m planner.bench.cp_ep", description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="gloo ranks (= cp = ep)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (medians)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(json.dumps(run(CpEpConfig(repeats=args.repeats), args.ranks), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
