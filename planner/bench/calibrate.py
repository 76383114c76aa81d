"""`planner calibrate`: measure this machine (GEMM FLOP/s at the model's shapes, memory bandwidth, collective
bus bandwidth and latency, point-to-point bandwidth) on `nproc` ranks at once, and write a cluster file whose
numbers are the measured ones. On CUDA the GEMMs run in bf16 with NCCL; on CPU in fp32 with gloo."""

from __future__ import annotations

import os
import platform
import statistics
from datetime import UTC, datetime

import torch
import torch.distributed as dist

DEFAULT_GEMMS = [(512, 512, 512), (1024, 1024, 1024), (2048, 1024, 4096), (2048, 4096, 1024)]
DEFAULT_MESSAGES = [2**12, 2**16, 2**20, 2**23]


def model_gemms(*, tokens: int, hidden: int, ffn: int, tp: int = 1) -> list[tuple[int, int, int]]:
    """(m, k, n) of a layer's GEMMs per GPU: QKV-like h -> h/t, MLP h -> f/t and f/t -> h."""
    return [(tokens, hidden, max(1, hidden // tp)), (tokens, hidden, max(1, ffn // tp)), (tokens, max(1, ffn // tp), hidden)]


def _rank(rank: int, world: int, args: dict, init_method: str) -> dict:
    from datetime import timedelta

    from planner.bench.runner import median_seconds

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank % max(1, torch.cuda.device_count())) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=args["timeout"]))

    def sync():
        if cuda:
            torch.cuda.synchronize()

    # torch 2.13 deprecates *_into_tensor / *_tensor in favour of *_single (../shared/reference/cpu-notes.md)
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    gemms = []
    for m, k, n in args["gemms"]:
        a = torch.randn(m, k, dtype=dtype, device=device)
        b = torch.randn(k, n, dtype=dtype, device=device)
        dist.barrier()
        t = median_seconds(lambda a=a, b=b: (a @ b, sync()), args["repeats"], warmup=True)
        gemms.append({"m": m, "k": k, "n": n, "flops": 2 * m * k * n, "seconds": t, "flops_per_second": 2 * m * k * n / t})
    x = torch.empty(args["copy_bytes"] // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    dist.barrier()
    t = median_seconds(lambda: (y.copy_(x), sync()), args["repeats"], warmup=True)
    mem_bw = 2 * x.numel() * 4 / t
    colls = []
    n = world
    for size in args["messages"]:
        buf = torch.ones(size // 4, dtype=torch.float32, device=device)
        out = torch.empty(size // 4 * n, dtype=torch.float32, device=device) if n > 1 else None
        if n > 1:
            dist.barrier()
            t = median_seconds(lambda buf=buf: (dist.all_reduce(buf), sync()), args["repeats"], warmup=True)
            colls.append({"op": "all_reduce", "bytes": size, "group_size": n, "seconds": t,
                          "bus_bytes_per_second": 2 * (n - 1) / n * size / t})
            dist.barrier()
            t = median_seconds(lambda buf=buf, out=out: (all_gather(out, buf), sync()), args["repeats"], warmup=True)
            colls.append({"op": "all_gather", "bytes": size * n, "group_size": n, "seconds": t,
                          "bus_bytes_per_second": (n - 1) / n * size * n / t})
            dist.barrier()
            t = median_seconds(lambda buf=buf, out=out: (reduce_scatter(buf, out), sync()), args["repeats"], warmup=True)
            colls.append({"op": "reduce_scatter", "bytes": size * n, "group_size": n, "seconds": t,
                          "bus_bytes_per_second": (n - 1) / n * size * n / t})
            dist.barrier()

            def ping(buf=buf):
                if rank == 0:
                    dist.send(buf, dst=1)
                elif rank == 1:
                    dist.recv(buf, src=0)
                sync()
            t = median_seconds(ping, args["repeats"], warmup=True)
            colls.append({"op": "send_recv", "bytes": size, "group_size": 2, "seconds": t, "bus_bytes_per_second": size / t})
    # per-step latency from a 2-rank all-reduce of a small message (the world-size figure above also carries the
    # scheduling noise of every rank sharing the machine)
    pair_latency = None
    if n > 1:
        pair = dist.new_group([0, 1])
        small = torch.ones(1024, dtype=torch.float32, device=device)
        dist.barrier()
        if rank < 2:
            t = median_seconds(lambda: (dist.all_reduce(small, group=pair), sync()), max(args["repeats"], 11), warmup=True)
            pair_latency = t / 2  # a 2-rank ring all-reduce takes 2 steps
        dist.barrier()
    return {"rank": rank, "device": device.type, "pair_latency_seconds": pair_latency, "device_name": torch.cuda.get_device_name(device) if cuda else platform.processor() or platform.machine(),
            "gemms": gemms, "memory_bytes_per_second": mem_bw, "collectives": colls,
            "device_memory_bytes": torch.cuda.get_device_properties(device).total_memory if cuda else None}


def calibrate(*, nproc: int, gemms: list[tuple[int, int, int]] | None = None, messages: list[int] | None = None,
              repeats: int = 5, copy_bytes: int = 64 * 2**20, timeout_seconds: float = 120.0,
              gpu_name: str | None = None) -> dict:
    """Measure, then return a cluster-spec mapping (with a `measured` section) for this machine."""
    from planner.bench.runner import run_ranks

    args = {"gemms": gemms or DEFAULT_GEMMS, "messages": messages or DEFAULT_MESSAGES, "repeats": repeats,
            "copy_bytes": copy_bytes, "timeout": timeout_seconds}
    reports = run_ranks(_rank, args, nproc, timeout_seconds)
    r0 = reports[0]
    cuda = r0["device"] == "cuda"
    # per shape, the slowest rank (ranks share the machine)
    per_shape = []
    for i, g in enumerate(r0["gemms"]):
        rate = min(r["gemms"][i]["flops_per_second"] for r in reports)
        per_shape.append({**{k: g[k] for k in ("m", "k", "n", "flops")}, "flops_per_second": rate})
    best = max(g["flops_per_second"] for g in per_shape)
    # fit the size curve eff(x) = x / (x + x_half) on the measured shapes (cost_models.step.matmul_efficiency)
    halves = [g["flops"] / 1e9 * (best / g["flops_per_second"] - 1) for g in per_shape if g["flops_per_second"] < best]
    x_half = statistics.median(halves) if halves else 1e-3
    dtype = "bf16" if cuda else "fp32"
    if gpu_name:
        from cluster_specs import load_gpu

        gpu = load_gpu(gpu_name).model_dump(mode="json")
        peak = gpu["tflops"].get(dtype) or gpu["tflops"].get("fp16")
        gpu["matmul_efficiency"] = min(1.0, best / (peak * 1e12))
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 8 * 2**30
        mem = r0["device_memory_bytes"] or total / nproc
        gpu = {"name": f"measured-{r0['device_name'] or r0['device']}"[:60], "memory_gib": mem / 2**30,
               "tflops": {dtype: best / 1e12}, "hbm_gb_per_s": min(r["memory_bytes_per_second"] for r in reports) / 1e9,
               "matmul_efficiency": 1.0, "source": "measured by planner calibrate"}
    allr = [c for c in r0["collectives"] if c["op"] == "all_reduce"]
    if allr:
        big = max(allr, key=lambda c: c["bytes"])
        small = min(allr, key=lambda c: c["bytes"])
        busbw = big["bus_bytes_per_second"]
        latency = r0.get("pair_latency_seconds")
        if latency is None:
            latency = max(0.0, small["seconds"] - 2 * (nproc - 1) / nproc * small["bytes"] / busbw) / (2 * (nproc - 1))
        intra = {"kind": "nvlink" if cuda else "pcie", "gb_per_s": busbw / 1e9, "efficiency": 1.0,
                 "latency_us": latency * 1e6}
    else:
        intra = {"kind": "none", "gb_per_s": 0.0, "efficiency": 1.0, "latency_us": 0.0}
    host_gib = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / 2**30 if hasattr(os, "sysconf") else 64
    knobs = {"matmul_half_efficiency_gflop": x_half}
    if not cuda:  # measured peaks already include everything a CPU step pays; nothing overlaps under gloo
        knobs.update(end_to_end_efficiency=1.0, per_process_overhead_bytes=0.0, dp_overlap_fraction=0.0,
                     pp_overlap_fraction=0.0, elementwise_traffic_factor=8.0)
    return {
        "name": f"local-{platform.node() or 'machine'}"[:60],
        "description": f"{nproc} x {gpu['name']} on this machine, measured by planner calibrate",
        "gpu": gpu,
        "num_nodes": 1,
        "gpus_per_node": nproc,
        "intra_node": intra,
        "inter_node": {"kind": "none", "nics_per_node": 0, "nic_gbit_per_s": 0.0},
        "host_to_device": {"gb_per_s": max(0.1, min(r["memory_bytes_per_second"] for r in reports) / 1e9), "efficiency": 1.0},
        "host_memory_gib": host_gib,
        "measured": {
            "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "knobs": knobs,
            "gemm": per_shape,
            "collectives": r0["collectives"],
            "notes": [f"{nproc} ranks measured at once, {'NCCL/bf16' if cuda else 'gloo/fp32'}; per GEMM shape the "
                      "slowest rank counts"],
        },
    }
