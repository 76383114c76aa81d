"""`planner calibrate`: measure this machine on `nproc` ranks at once and write a cluster file of what was measured.

- GEMMs on a grid from tiny to large (m, k, n), plus the model's own shapes when one is named, so the shapes a
  benchmark or plan uses are inside the measured range, never extrapolated from large ones. The cost model's size
  curve eff(x) = x / (x + x_half) means a GEMM of F FLOPs takes (F + x_half * 1e9) / peak: a straight line in F,
  fitted by least squares on relative error (fit_gemm_line); the file records how well it holds on every shape.
- device memory bandwidth (a device-to-device copy), and the host-to-device link with pinned host memory on CUDA
  (on CPU there is no such link: the file says so and uses the host memory copy);
- collective bus bandwidth and latency on the ranks (NCCL on CUDA, gloo on CPU).

Every figure is the median of `repeats` timed runs; its spread (max/min - 1) is recorded, and the summary warns
when the machine was busy (load average above its cores, or a spread over BUSY_SPREAD).
On CUDA the GEMMs run in bf16, on CPU in fp32.
"""

from __future__ import annotations

import os
import platform
import statistics
from datetime import UTC, datetime

import torch
import torch.distributed as dist

from planner.bench.timing import timed

CPU_SIZES = (32, 64, 128, 256, 512, 1024)
GPU_SIZES = (128, 256, 512, 1024, 2048, 4096, 8192)
DEFAULT_MESSAGES = [2**12, 2**16, 2**20, 2**23]
BUSY_SPREAD = 0.25  # a measurement whose repeats differ by more than this is called noisy


def gemm_grid(sizes: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(m, k, n) shapes: every cube, and for each m the transformer's rectangles (k -> 4k and 4k -> k, as in an MLP,
    and k -> k/4, as in a GQA projection)."""
    shapes = {(s, s, s) for s in sizes}
    for m in sizes:
        for k in sizes[1:-2:2]:
            shapes.update({(m, k, 4 * k), (m, 4 * k, k), (m, 4 * k, max(1, k))})
    return sorted(shapes, key=lambda g: g[0] * g[1] * g[2])


def model_gemms(*, tokens: int, hidden: int, ffn: int, tp: int = 1, kv_dim: int | None = None,
                vocab: int | None = None) -> list[tuple[int, int, int]]:
    """(m, k, n) of a layer's GEMMs per GPU: QKV h -> h/t (and h -> kv/t), MLP h -> f/t and f/t -> h, logits."""
    out = [(tokens, hidden, max(1, hidden // tp)), (tokens, hidden, max(1, ffn // tp)),
           (tokens, max(1, ffn // tp), hidden)]
    if kv_dim:
        out.append((tokens, hidden, max(1, kv_dim // tp)))
    if vocab:
        out.append((tokens, hidden, max(1, vocab // tp)))
    return out


def fit_gemm_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Fit t = a + F / peak to (flops, seconds) points, minimising the squared relative error; a >= 0.
    Returns (peak FLOP/s, a seconds)."""
    w = [1 / t**2 for _, t in points]
    sw = sum(w)
    swf = sum(wi * f for wi, (f, _) in zip(w, points, strict=True))
    swt = sum(wi * t for wi, (_, t) in zip(w, points, strict=True))
    swff = sum(wi * f * f for wi, (f, _) in zip(w, points, strict=True))
    swft = sum(wi * f * t for wi, (f, t) in zip(w, points, strict=True))
    det = sw * swff - swf * swf
    a, b = 0.0, swft / swff
    if det > 0:
        a_, b_ = (swff * swt - swf * swft) / det, (sw * swft - swf * swt) / det
        if a_ >= 0 and b_ > 0:
            a, b = a_, b_
    return 1 / b, a


def _gemms(args: dict, device, dtype, sync, cuda: bool) -> list[dict]:
    """Seconds per GEMM. On CUDA, `inner` products are queued back to back before one synchronisation, as a
    training step queues them (one product per sync would add the launch-and-wait latency to every GEMM)."""
    out = []
    for m, k, n in args["gemms"]:
        a = torch.randn(m, k, dtype=dtype, device=device)
        b = torch.randn(k, n, dtype=dtype, device=device)
        dist.barrier()
        flops = 2 * m * k * n
        reps = args["repeats"] if flops > 1e8 else 4 * args["repeats"]  # small ones are cheap and noisier
        inner = (20 if flops < 1e11 else 4) if cuda else 1

        def run(a=a, b=b, inner=inner):
            for _ in range(inner):
                a @ b
            sync()

        t, spread = timed(run, reps)
        out.append({"m": m, "k": k, "n": n, "flops": flops, "seconds": t / inner, "spread": spread})
    return out


def _links(args: dict, device, cuda: bool, sync) -> dict:
    x = torch.empty(args["copy_bytes"] // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    dist.barrier()
    t, spread = timed(lambda: (y.copy_(x), sync()), args["repeats"])
    out = {"memory_bytes_per_second": 2 * x.numel() * 4 / t, "memory_spread": spread}
    if cuda:  # the host link: pinned host memory -> device, the path offloading uses
        host = torch.empty(args["copy_bytes"] // 4, dtype=torch.float32, pin_memory=True)
        dist.barrier()
        t, spread = timed(lambda: (x.copy_(host, non_blocking=True), sync()), args["repeats"])
        out.update(host_to_device_pinned_bytes_per_second=host.numel() * 4 / t, host_to_device_spread=spread)
    return out


def _collectives(args: dict, rank: int, world: int, device, sync) -> tuple[list[dict], float | None]:
    # torch 2.13 deprecates *_into_tensor / *_tensor in favour of *_single (../shared/reference/cpu-notes.md)
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    colls: list[dict] = []
    if world == 1:
        return colls, None
    reps = args["repeats"]
    for size in args["messages"]:
        buf = torch.ones(size // 4, dtype=torch.float32, device=device)
        out = torch.empty(size // 4 * world, dtype=torch.float32, device=device)

        def ping(buf=buf):
            if rank == 0:
                dist.send(buf, dst=1)
            elif rank == 1:
                dist.recv(buf, src=0)
            sync()

        for op, fn, nbytes, factor in (
                ("all_reduce", lambda buf=buf: (dist.all_reduce(buf), sync()), size, 2 * (world - 1) / world),
                ("all_gather", lambda buf=buf, out=out: (all_gather(out, buf), sync()), size * world, (world - 1) / world),
                ("reduce_scatter", lambda buf=buf, out=out: (reduce_scatter(buf, out), sync()), size * world,
                 (world - 1) / world),
                ("send_recv", ping, size, 1.0)):
            dist.barrier()
            t, spread = timed(fn, reps)
            colls.append({"op": op, "bytes": nbytes, "group_size": 2 if op == "send_recv" else world, "seconds": t,
                          "bus_bytes_per_second": factor * nbytes / t, "spread": spread})
    # per-step latency from a 2-rank all-reduce of a small message (the world-size figure above also carries the
    # scheduling noise of every rank sharing the machine)
    pair = dist.new_group([0, 1])
    small = torch.ones(1024, dtype=torch.float32, device=device)
    dist.barrier()
    latency = None
    if rank < 2:
        t, _ = timed(lambda: (dist.all_reduce(small, group=pair), sync()), max(reps, 11))
        latency = t / 2  # a 2-rank ring all-reduce takes 2 steps
    dist.barrier()
    return colls, latency


PROBE_SHAPES = ((64, 128), (128, 256), (256, 512))  # (tokens, hidden) of the CPU layer probe


def probe_shape(hidden: int):
    """A Llama-style layer of this width (head dim 32, GQA 2:1, SwiGLU FFN 8h/3 rounded to 32, SDPA attention)."""
    from cost_models.inputs import Transformer

    heads = max(1, hidden // 32)
    return Transformer(num_layers=1, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=max(1, heads // 2),
                       ffn_hidden_size=-(-8 * hidden // 3 // 32) * 32, vocab_size=256, swiglu=True,
                       tied_embeddings=False, rms_norm=True, flash_attention=True, learned_position_embeddings=False,
                       max_position_embeddings=4096, bias=False, dropout=False)


def _layer_probe(args: dict, device, dtype) -> list[dict]:
    """Forward + backward of one transformer layer at small shapes: what a CPU step pays per layer beyond its
    GEMMs (operator dispatch, autograd, the small kernels), which the GEMM grid alone cannot show."""
    from planner.bench.model import Block

    out = []
    for tokens, hidden in args["probes"]:
        torch.manual_seed(0)
        block = Block(probe_shape(hidden), seq_length=tokens, dropout_p=0.0).to(device=device, dtype=dtype)
        x = torch.randn(1, tokens, hidden, dtype=dtype, device=device, requires_grad=True)

        def step(block=block, x=x):
            block(x).sum().backward()

        dist.barrier()
        t, spread = timed(step, args["repeats"])
        out.append({"tokens": tokens, "hidden": hidden, "seconds": t, "spread": spread})
    return out


def _tp_probe(args: dict, world: int, dtype) -> list[dict]:
    """The same layers tensor-parallel over pairs of ranks (tp=2, sequence parallel, as the benchmark applies it):
    what sharded operators cost beyond their FLOPs and collectives on these ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    from planner.bench.runner import StageModule, apply_tp

    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("pair", "tp"))
    out = []
    for tokens, hidden in args["probes"]:
        torch.manual_seed(0)
        m = StageModule(probe_shape(hidden), tokens, [0], first=False, last=False, seed=0).to(dtype)
        apply_tp(m, mesh["tp"], sequence_parallel=True)
        x = torch.randn(1, tokens // 2, hidden, dtype=dtype, requires_grad=True)

        def step(m=m, x=x):
            m(x).sum().backward()

        dist.barrier()
        t, spread = timed(step, args["repeats"])
        out.append({"tokens": tokens, "hidden": hidden, "seconds": t, "spread": spread})
    return out


def _rank(rank: int, world: int, args: dict, init_method: str) -> dict:
    from datetime import timedelta

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank % max(1, torch.cuda.device_count())) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if cuda else torch.float32
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=args["timeout"]))

    def sync():
        if cuda:
            torch.cuda.synchronize()

    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    gemms = _gemms(args, device, dtype, sync, cuda)
    probes = [] if cuda else _layer_probe(args, device, dtype)
    tp_probes = _tp_probe(args, world, dtype) if not cuda and world >= 2 and world % 2 == 0 else []
    links = _links(args, device, cuda, sync)
    colls, latency = _collectives(args, rank, world, device, sync)
    return {"rank": rank, "device": device.type, "pair_latency_seconds": latency,
            "device_name": torch.cuda.get_device_name(device) if cuda else platform.processor() or platform.machine(),
            "gemms": gemms, "layer_probes": probes, "tp_probes": tp_probes, **links, "collectives": colls, "torch_version": torch.__version__,
            "load_average": [load_before, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
            "device_memory_bytes": torch.cuda.get_device_properties(device).total_memory if cuda else None}


def gemm_summary(reports: list[dict]) -> dict:
    """Per shape the slowest rank (ranks share the machine); the fitted line; how far each shape is from it."""
    per_shape = []
    for i, g in enumerate(reports[0]["gemms"]):
        worst = max((r["gemms"][i] for r in reports), key=lambda x: x["seconds"])
        per_shape.append({**{k: g[k] for k in ("m", "k", "n", "flops")}, "seconds": worst["seconds"],
                          "flops_per_second": g["flops"] / worst["seconds"],
                          "spread": max(r["gemms"][i]["spread"] for r in reports)})
    peak, overhead = fit_gemm_line([(g["flops"], g["seconds"]) for g in per_shape])
    for g in per_shape:
        g["fit_error"] = (overhead + g["flops"] / peak) / g["seconds"] - 1
    best = max(per_shape, key=lambda g: g["flops_per_second"])
    errs = sorted(abs(g["fit_error"]) for g in per_shape)
    return {"shapes": per_shape, "peak_flops_per_second": peak, "overhead_seconds": overhead,
            "x_half_gflop": overhead * peak / 1e9, "best": best, "smallest": per_shape[0],
            "fit_median_abs_error": statistics.median(errs), "fit_max_abs_error": errs[-1]}


def fit_two(a: list[float], b: list[float], y: list[float]) -> tuple[float, float]:
    """Least squares on relative error of y ~ a u + b v with u > 0, v >= 0 (v = 0 when the free fit is negative)."""
    w = [1 / yi**2 for yi in y]
    saa = sum(wi * ai * ai for wi, ai in zip(w, a, strict=True))
    sbb = sum(wi * bi * bi for wi, bi in zip(w, b, strict=True))
    sab = sum(wi * ai * bi for wi, ai, bi in zip(w, a, b, strict=True))
    say = sum(wi * ai * yi for wi, ai, yi in zip(w, a, y, strict=True))
    sby = sum(wi * bi * yi for wi, bi, yi in zip(w, b, y, strict=True))
    det = saa * sbb - sab * sab
    if det > 0:
        u, v = (sbb * say - sab * sby) / det, (saa * sby - sab * say) / det
        if u > 0 and v >= 0:
            return u, v
    return say / saa, 0.0


def layer_probe_fit(reports: list[dict], gpu: dict, knobs: dict, dtype: str) -> tuple[dict, list[dict]]:
    """Knobs that make the cost model's layer time (cost_models.step.layer_costs; forward + backward = 3 forwards)
    match the measured layer probes (median over ranks): the model's time is
    t = A / e2e * (1 + x_half / x) + M  (A: FLOPs at the fitted GEMM peak, M: memory-bound kernels),
    read off the model itself at three knob settings; then y - M = A u + (A / x) v is fitted for u = 1 / e2e and
    v = x_half / e2e. Returns ({end_to_end_efficiency, matmul_half_efficiency_gflop}, per-probe rows)."""
    from cluster_specs import ClusterSpec
    from cost_models.inputs import Knobs, Layout, Training
    from cost_models.step import layer_costs
    from planner.inputs.specs import PRECISION_BYTES

    hw = ClusterSpec.model_validate({"gpu": gpu, "num_nodes": 1, "gpus_per_node": 1,
                                     "intra_node": {"kind": "none", "gb_per_s": 0.0},
                                     "inter_node": {"kind": "none", "nics_per_node": 0, "nic_gbit_per_s": 0.0},
                                     "host_to_device": {"gb_per_s": 1.0}}).to_cost_model(dtype)
    nb = PRECISION_BYTES[dtype]
    rows, A, B, Y = [], [], [], []
    for i, p in enumerate(reports[0]["layer_probes"]):
        measured = statistics.median(r["layer_probes"][i]["seconds"] for r in reports)
        training = Training(global_batch_size=1, seq_length=p["tokens"], activation_bytes=nb, param_bytes=nb,
                            grad_bytes=nb, optimizer_bytes=8, grad_reduce_bytes=nb)

        def model(x_half: float, e2e: float, p=p, training=training) -> float:
            kn = Knobs(**{**knobs, "matmul_half_efficiency_gflop": x_half, "end_to_end_efficiency": e2e})
            return 3 * layer_costs(probe_shape(p["hidden"]), training, hw, Layout(dp=1, tp=1, pp=1), kn).t_layer_forward

        base = model(0.0, 1.0)
        a_i = model(0.0, 0.5) - base
        A.append(a_i)
        B.append(model(1.0, 1.0) - base)
        Y.append(measured - (base - a_i))
        rows.append({**p, "seconds": measured, "model_seconds_at_peak": base})
    u, v = fit_two(A, B, Y)
    if u <= 0:  # only fit_two's fallback gives it (with v = 0): the probes ran no slower than their memory-bound part
        u = 1.0
    e2e = min(1.0, 1 / u)
    x_half = v / u
    for row, a_i, b_i, y_i in zip(rows, A, B, Y, strict=True):
        row["fit_error"] = (a_i / e2e + b_i * x_half / e2e) / y_i - 1 if y_i > 0 else None
    return {"end_to_end_efficiency": e2e, "matmul_half_efficiency_gflop": x_half}, rows


def tp_probe_overhead(reports: list[dict], gpu: dict, knobs: dict, dtype: str, intra: dict) -> tuple[float, list]:
    """tp_layer_overhead_seconds: the measured tp=2 probe (median over ranks) less the model's time for the same
    layer at tp=2 with sequence parallelism (3 forwards + its 4 TP collectives on the measured link), median over
    the probe shapes, never negative."""
    from cluster_specs import ClusterSpec
    from cost_models.inputs import Knobs, Layout, Training
    from cost_models.step import layer_costs
    from planner.inputs.specs import PRECISION_BYTES

    hw = ClusterSpec.model_validate({"gpu": gpu, "num_nodes": 1, "gpus_per_node": 2, "intra_node": intra,
                                     "inter_node": {"kind": "none", "nics_per_node": 0, "nic_gbit_per_s": 0.0},
                                     "host_to_device": {"gb_per_s": 1.0}}).to_cost_model(dtype)
    nb = PRECISION_BYTES[dtype]
    kn = Knobs(**{**knobs, "tp_layer_overhead_seconds": 0.0})
    rows = []
    for i, p in enumerate(reports[0]["tp_probes"]):
        measured = statistics.median(r["tp_probes"][i]["seconds"] for r in reports)
        training = Training(global_batch_size=1, seq_length=p["tokens"], activation_bytes=nb, param_bytes=nb,
                            grad_bytes=nb, optimizer_bytes=8, grad_reduce_bytes=nb)
        lc = layer_costs(probe_shape(p["hidden"]), training, hw, Layout(dp=1, tp=2, pp=1, sequence_parallel=True), kn)
        model = 3 * lc.t_layer_forward + 4 * lc.t_tp_all_reduce * lc.tp_expose
        rows.append({**p, "seconds": measured, "model_seconds_without_overhead": model,
                     "overhead_seconds": max(0.0, measured - model)})
    return statistics.median(r["overhead_seconds"] for r in rows), rows


def noise_summary(reports: list[dict], nproc: int, gemm: dict) -> dict:
    spreads = [g["spread"] for g in gemm["shapes"]] + [r["memory_spread"] for r in reports]
    spreads += [c["spread"] for r in reports for c in r["collectives"]]
    spreads += [p["spread"] for r in reports for p in r["layer_probes"] + r["tp_probes"]]
    loads = [x for r in reports for x in r["load_average"] if x is not None]
    cores = os.cpu_count() or 1
    load = max(loads) if loads else None
    warnings = []
    if load is not None and load > cores:
        warnings.append(f"the machine was busy: load average {load:.1f} on {cores} cores (other processes took "
                        "CPU time while measuring; the figures are pessimistic and vary between runs)")
    median_spread = statistics.median(spreads)
    if median_spread > BUSY_SPREAD:
        warnings.append(f"noisy: the repeats of a measurement differ by {median_spread:.0%} (median of max/min - 1)")
    return {"median_spread": median_spread, "max_spread": max(spreads), "load_average": load, "cores": cores,
            "ranks": nproc, "warnings": warnings}


def _gpu_entry(r0: dict, reports: list[dict], gemm: dict, nproc: int, gpu_name: str | None, dtype: str) -> dict:
    mem_bw = min(r["memory_bytes_per_second"] for r in reports)
    if gpu_name:
        from cluster_specs import load_gpu

        gpu = load_gpu(gpu_name).model_dump(mode="json")
        peak = gpu["tflops"].get(dtype) or gpu["tflops"].get("fp16")
        gpu["matmul_efficiency"] = min(1.0, gemm["peak_flops_per_second"] / (peak * 1e12))
        gpu["hbm_gb_per_s"] = mem_bw / 1e9
        gpu["source"] = (f"{gpu.get('source', '')}; matmul_efficiency and hbm_gb_per_s measured by planner "
                         "calibrate").lstrip("; ")
        return gpu
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 8 * 2**30
    mem = r0["device_memory_bytes"] or total / nproc
    return {"name": f"measured-{r0['device_name'] or r0['device']}"[:60], "memory_gib": mem / 2**30,
            "tflops": {dtype: gemm["peak_flops_per_second"] / 1e12}, "hbm_gb_per_s": mem_bw / 1e9,
            "matmul_efficiency": 1.0, "source": "measured by planner calibrate"}


def _intra(r0: dict, nproc: int, cuda: bool) -> dict:
    allr = [c for c in r0["collectives"] if c["op"] == "all_reduce"]
    if not allr:
        return {"kind": "none", "gb_per_s": 0.0, "efficiency": 1.0, "latency_us": 0.0}
    big = max(allr, key=lambda c: c["bytes"])
    small = min(allr, key=lambda c: c["bytes"])
    busbw = big["bus_bytes_per_second"]
    latency = r0.get("pair_latency_seconds")
    if latency is None:
        latency = max(0.0, small["seconds"] - 2 * (nproc - 1) / nproc * small["bytes"] / busbw) / (2 * (nproc - 1))
    return {"kind": "nvlink" if cuda else "pcie", "gb_per_s": busbw / 1e9, "efficiency": 1.0,
            "latency_us": latency * 1e6}


def cpu_knobs(reports: list[dict], gpu: dict, nproc: int, dtype: str) -> tuple[dict, list[dict], list[dict]]:
    """Knobs for CPU ranks: measured peaks already include everything a CPU step pays, gloo allocates no NCCL
    communicators, and nothing overlaps under gloo; a layer of small GEMMs pays per-operator costs (and, on a shared
    machine, waits for a core) that the GEMM line does not see, so x_half and the end-to-end factor are fitted to
    whole layers measured the same way, and tensor parallelism's dispatch cost to the same layers at tp=2."""
    knobs: dict = {"end_to_end_efficiency": 1.0, "per_process_overhead_bytes": 0.0, "nccl_bytes_scale": 0.0,
                   "dp_overlap_fraction": 0.0, "pp_overlap_fraction": 0.0, "elementwise_traffic_factor": 8.0,
                   "gemm_half_efficiency_dim": 0.0}
    fitted, probes = layer_probe_fit(reports, gpu, knobs, dtype)
    knobs.update(fitted)
    tp_rows: list[dict] = []
    if reports[0]["tp_probes"]:
        knobs["tp_layer_overhead_seconds"], tp_rows = tp_probe_overhead(reports, gpu, knobs, dtype,
                                                                        _intra(reports[0], nproc, False))
    return knobs, probes, tp_rows


def _summary(gemm: dict, knobs: dict, probes: list[dict], tp_rows: list[dict]) -> dict:
    """The headline figures the file and the terminal show: measured, never a catalog peak."""
    return {"gemm_fitted_peak_tflops": gemm["peak_flops_per_second"] / 1e12,
            "gemm_best_tflops": gemm["best"]["flops_per_second"] / 1e12,
            "gemm_best_shape": [gemm["best"][k] for k in ("m", "k", "n")],
            "gemm_smallest_tflops": gemm["smallest"]["flops_per_second"] / 1e12,
            "gemm_smallest_shape": [gemm["smallest"][k] for k in ("m", "k", "n")],
            "gemm_fit_median_abs_error": gemm["fit_median_abs_error"],
            "gemm_fit_max_abs_error": gemm["fit_max_abs_error"],
            "x_half_gflop_gemm_line": gemm["x_half_gflop"],
            "x_half_gflop_used": knobs["matmul_half_efficiency_gflop"],
            "end_to_end_efficiency": knobs.get("end_to_end_efficiency"),
            "tp_layer_overhead_seconds": knobs.get("tp_layer_overhead_seconds"), "tp_probes": tp_rows,
            "layer_probes": probes}


def calibrate(*, nproc: int, gemms: list[tuple[int, int, int]] | None = None, messages: list[int] | None = None,
              repeats: int = 5, copy_bytes: int = 64 * 2**20, timeout_seconds: float = 120.0,
              gpu_name: str | None = None, extra_gemms: list[tuple[int, int, int]] | None = None) -> dict:
    """Measure, then return a cluster-spec mapping (with a `measured` section) for this machine."""
    from planner.bench.runner import run_ranks

    grid = gemms or gemm_grid(GPU_SIZES if torch.cuda.is_available() else CPU_SIZES)
    grid = sorted(set(grid) | set(extra_gemms or []), key=lambda g: g[0] * g[1] * g[2])
    args = {"gemms": grid, "messages": messages or DEFAULT_MESSAGES, "repeats": repeats, "probes": PROBE_SHAPES,
            "copy_bytes": copy_bytes, "timeout": timeout_seconds}
    reports = run_ranks(_rank, args, nproc, timeout_seconds)
    r0 = reports[0]
    cuda = r0["device"] == "cuda"
    dtype = "bf16" if cuda else "fp32"
    gemm = gemm_summary(reports)
    noise = noise_summary(reports, nproc, gemm)
    gpu = _gpu_entry(r0, reports, gemm, nproc, gpu_name, dtype)
    knobs = {"matmul_half_efficiency_gflop": gemm["x_half_gflop"]}
    probes: list[dict] = []
    tp_rows: list[dict] = []
    if not cuda:
        knobs, probes, tp_rows = cpu_knobs(reports, gpu, nproc, dtype)
    if cuda:
        h2d = min(r["host_to_device_pinned_bytes_per_second"] for r in reports)
        h2d_note = f"host_to_device: pinned host memory -> device copy of {copy_bytes / 2**20:.0f} MiB"
    else:
        h2d = min(r["memory_bytes_per_second"] for r in reports)
        h2d_note = "host_to_device: CPU ranks have no host-device link; the host memory copy bandwidth stands in"
    host_gib = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / 2**30 if hasattr(os, "sysconf") else 64
    mem_bw = min(r["memory_bytes_per_second"] for r in reports)
    summary = {**_summary(gemm, knobs, probes, tp_rows), "memory_copy_gb_per_s": mem_bw / 1e9,
               "host_to_device_gb_per_s": h2d / 1e9, "host_to_device_pinned": cuda,
               "dtype": dtype, "device_name": r0["device_name"], "torch_version": r0["torch_version"]}
    intra = _intra(r0, nproc, cuda)
    return {
        "name": f"local-{platform.node() or 'machine'}"[:60],
        "description": f"{nproc} x {gpu['name']} on this machine, measured by planner calibrate",
        "gpu": gpu,
        "num_nodes": 1,
        "gpus_per_node": nproc,
        "intra_node": intra,
        "inter_node": {"kind": "none", "nics_per_node": 0, "nic_gbit_per_s": 0.0},
        "host_to_device": {"gb_per_s": max(0.1, h2d / 1e9), "efficiency": 1.0},
        "host_memory_gib": host_gib,
        "measured": {
            "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "knobs": knobs,
            "gemm": gemm["shapes"],
            "collectives": r0["collectives"],
            "summary": summary,
            "noise": {k: v for k, v in noise.items() if k != "warnings"},
            "notes": [f"{nproc} ranks measured at once, {'NCCL/bf16' if cuda else 'gloo/fp32'}; per GEMM shape the "
                      "slowest rank counts; each figure is the median of its repeats", h2d_note, *noise["warnings"]],
        },
    }


def calibrate_machine(*, nproc: int, model: str | None, seq_len: int, micro_batch_size: int, tp: int,
                      gpu_name: str | None, repeats: int, max_message_mib: float) -> dict:
    """`planner calibrate`: the standard GEMM sweep plus the model's shapes, collectives up to max_message_mib.
    A catalog GPU (`gpu_name`) is checked before anything is measured: it must exist, and the ranks must run on a
    GPU, since the file keeps that GPU's datasheet peak and scales it by what was measured here."""
    if gpu_name:
        from cluster_specs import SpecError, load_gpu

        load_gpu(gpu_name)  # an unknown name is refused here, not after minutes of measuring
        if not torch.cuda.is_available():
            raise SpecError(f"--gpu: {gpu_name} -> this machine's ranks would run on CPU (torch sees no CUDA "
                            "device), so the figures would be the CPU's under the GPU's name: run calibrate on a "
                            "node of the target cluster, or leave --gpu out to describe this machine as it is")
    extra = None
    if model:
        from planner.inputs.models import load_model

        md = load_model(model)
        extra = model_gemms(tokens=micro_batch_size * seq_len, hidden=md.hidden_size, ffn=md.ffn, tp=tp,
                            kv_dim=md.kv_heads * md.hidden_size // md.num_attention_heads, vocab=md.vocab_size)
    top = int(max_message_mib * 2**20)
    messages = sorted({max(4096, top // 4**k) // 4 * 4 for k in range(4)})
    return calibrate(nproc=nproc, messages=messages, repeats=repeats, gpu_name=gpu_name, extra_gemms=extra)
