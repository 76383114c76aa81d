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
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F

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
    q, k, v = full_qkv(cfg)
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


def ring_attention(cfg: CpEpConfig, rank: int, cp: int) -> tuple[torch.Tensor, torch.Tensor, float, int]:
    """(this rank's output rows, their global positions, seconds spent waiting on the ring's transfers once the
    block's attention is done, bytes this rank sent)."""
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
    return out, pos, comm, sent


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
    router, fc1, fc2 = moe_weights(cfg)
    outs = []
    for rank in range(world):
        x = rank_tokens(cfg, rank)
        weights, experts = _route(x, router, cfg.top_k)
        y = torch.zeros_like(x)
        for j in range(cfg.top_k):
            for e in range(cfg.experts):
                rows = experts[:, j] == e
                y[rows] += weights[rows, j, None] * _expert(x[rows], e, fc1, fc2)
        outs.append(y)
    return outs


def ep_moe(cfg: CpEpConfig, rank: int, ep: int) -> tuple[torch.Tensor, float, int]:
    """(this rank's MoE output, seconds in the dispatch and combine all-to-alls, token copies sent)."""
    import time

    router, fc1, fc2 = moe_weights(cfg)
    per_rank = cfg.experts // ep
    x = rank_tokens(cfg, rank)
    weights, experts = _route(x, router, cfg.top_k)
    flat_e = experts.reshape(-1)
    order = torch.argsort(flat_e, stable=True)  # token copies grouped by expert, hence by owning rank
    copies = x.repeat_interleave(cfg.top_k, 0)[order]
    send_counts = torch.bincount(flat_e // per_rank, minlength=ep)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    dist.barrier()  # time the exchange, not the other ranks' routing
    t0 = time.perf_counter()
    recv = torch.empty(int(recv_counts.sum()), cfg.hidden, dtype=x.dtype)
    dist.all_to_all_single(recv, copies, recv_counts.tolist(), send_counts.tolist())
    comm = time.perf_counter() - t0
    recv_e = torch.empty(int(recv_counts.sum()), dtype=flat_e.dtype)
    dist.all_to_all_single(recv_e, flat_e[order].contiguous(), recv_counts.tolist(), send_counts.tolist())
    out = torch.empty_like(recv)
    for e in range(rank * per_rank, (rank + 1) * per_rank):
        rows = recv_e == e
        out[rows] = _expert(recv[rows], e, fc1, fc2)
    back = torch.empty_like(copies)
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_to_all_single(back, out, send_counts.tolist(), recv_counts.tolist())
    comm += time.perf_counter() - t0
    unsorted = torch.empty_like(back)
    unsorted[order] = back
    y = (unsorted.view(cfg.tokens, cfg.top_k, cfg.hidden) * weights[..., None]).sum(1)
    return y, comm, int(send_counts.sum() - send_counts[rank])


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


def worker(rank: int, world: int, cfg: CpEpConfig, init_method: str) -> dict:
    from datetime import timedelta

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg.timeout_seconds))
    cp_times, ep_times, hidden = [], [], []
    pings: dict[int, list[float]] = {size: [] for size in PING_BYTES}
    for _ in range(cfg.repeats + 1):  # the first round warms the connections up and is not timed
        dist.barrier()
        out, pos, exposed, ring_sent = ring_attention(cfg, rank, world)
        cp_times.append(ring_transfer_seconds(cfg, rank, world))
        hidden.append(exposed)
        dist.barrier()
        y, ep_comm, sent = ep_moe(cfg, rank, world)
        ep_times.append(ep_comm)
        for size in PING_BYTES:  # the link, measured in the same rounds (the machine's load drifts)
            pings[size].append(_exchange(rank, size, 1))
    cp_times, ep_times, hidden = cp_times[1:], ep_times[1:], hidden[1:]
    link = [(size, sorted(ts[1:])[len(ts[1:]) // 2]) for size, ts in pings.items()]
    return {"rank": rank, "attention": out.tolist(), "positions": pos.tolist(), "moe": y.tolist(),
            "cp_comm_seconds": sorted(cp_times)[len(cp_times) // 2],
            "cp_exposed_seconds": sorted(hidden)[len(hidden) // 2],
            "ep_comm_seconds": sorted(ep_times)[len(ep_times) // 2], "ep_copies_sent": sent, "link": link,
            "ring_bytes_sent": ring_sent}


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


def predictions(cfg: CpEpConfig, world: int, link, copies_sent: float) -> dict:
    """What the cost model charges for the measured exchanges on this link: the ring's forward transfers (cp-1 p2p
    steps, cost_models/context_parallel.py) and one dispatch + one combine of the copies that leave the rank
    (cost_models/moe.py: all EP ranks in one node, so every byte moves on the intra-node link)."""
    from cost_models.communication import p2p_seconds
    from cost_models.context_parallel import cp_traffic
    from cost_models.inputs import MoE
    from cost_models.moe import ep_all_to_all_seconds, ep_traffic

    ring = cp_traffic(_attention_shape(cfg), variant="p2p", micro_batch_size=1, seq_length=cfg.seq_length, tp=1,
                      cp=world, activation_bytes=8)
    cp = (world - 1) * p2p_seconds(message_bytes=ring.forward_bytes / (world - 1), link=link)
    moe = MoE(num_experts=cfg.experts, top_k=cfg.top_k, expert_ffn_hidden_size=cfg.ffn)
    copies_bytes = 2 * cfg.tokens * cfg.top_k * cfg.hidden * 8  # dispatch + combine, every copy (fp64)
    traffic = ep_traffic(moe, copies_bytes=copies_bytes, ep=world, ranks_per_node=world)
    ep = ep_all_to_all_seconds(traffic, ep=world, intra=link, network_per_gpu=None)
    return {"cp_ring_seconds": cp, "ep_all_to_all_seconds": ep, "cp_bytes_model": ring.forward_bytes,
            "ep_bytes_model": traffic.intra_node_bytes,
            "ep_bytes_sent": 2 * copies_sent * cfg.hidden * 8}


def run(cfg: CpEpConfig, world: int) -> dict:
    """Launch `world` gloo ranks; return the numerics against one process and the timings against the model."""
    from planner.bench.runner import run_ranks

    if cfg.seq_length % (2 * world) or cfg.experts % world:
        from planner.errors import BenchmarkError

        raise BenchmarkError(f"cp/ep bench: seq_length {cfg.seq_length} must divide by 2 x {world} and experts "
                             f"{cfg.experts} by {world}")
    reports = run_ranks(worker, cfg, world, cfg.timeout_seconds)
    ref_att, ref_moe = reference_attention(cfg), reference_moe(cfg, world)
    att_err = moe_err = 0.0
    for r in reports:
        got = torch.tensor(r["attention"], dtype=torch.float64)
        att_err = max(att_err, float((got - ref_att[:, r["positions"]]).abs().max()))
        moe_err = max(moe_err, float((torch.tensor(r["moe"], dtype=torch.float64) - ref_moe[r["rank"]]).abs().max()))
    link = _fit_link(reports[0]["link"])
    sent = sum(r["ep_copies_sent"] for r in reports) / world
    measured = {"cp_ring_seconds": max(r["cp_comm_seconds"] for r in reports),
                "cp_ring_exposed_behind_attention_seconds": max(r["cp_exposed_seconds"] for r in reports),
                "ep_all_to_all_seconds": max(r["ep_comm_seconds"] for r in reports)}
    return {"world": world, "config": asdict(cfg), "attention_max_abs_error": att_err, "moe_max_abs_error": moe_err,
            "link": {"bandwidth_bytes_per_second": link.bandwidth_bytes_per_second,
                     "latency_seconds": link.latency_seconds},
            "measured": measured, "predicted": predictions(cfg, world, link, sent),
            "ring_bytes_sent": reports[0]["ring_bytes_sent"]}


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
