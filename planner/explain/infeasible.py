"""Why no layout fits, from the constraint that really binds, each with the number that would make it feasible.

Checked in this order (the first that explains the failure is the headline):
1. divisibility: no dp x tp x pp factorisation of the GPUs that the model (heads, layers, node size) and the global
   batch (dp must divide it) allow -> the nearest node counts and batch sizes that divide;
2. the search restriction (--framework/--fix/--schedules) leaves no layout although the arithmetic allows some;
3. host memory: some layouts fit in GPU memory only by offloading optimizer states to the host, and the node's RAM
   is too small -> the host RAM per node they need;
4. GPU memory: the least peak any layout needs, from full estimates at the memory-minimal settings (full recompute,
   the smallest micro-batch) -- never from the search's states-only lower bounds.
"""

from __future__ import annotations

from dataclasses import replace

from planner.errors import InfeasibleError

GIB = 2**30


def _tp_options(n: int, g: int, model, allow_across: bool) -> list[int]:
    from planner.search import divisors

    tps = [t for t in divisors(min(n, g)) if g % t == 0 and n % t == 0]
    if allow_across:
        tps += [t for t in range(2 * g, n + 1, g) if n % t == 0]
    return [t for t in tps if model.num_attention_heads % t == 0 and (model.kv_heads % t == 0 or t % model.kv_heads == 0)
            and model.ffn % t == 0 and model.hidden_size % t == 0]


def divisible(num_gpus: int, gpus_per_node: int, model, batch: int, allow_across: bool = False) -> bool:
    """Is there any tp x pp x dp = num_gpus with tp allowed by the model and node, pp <= layers, dp | batch?"""
    for tp in _tp_options(num_gpus, gpus_per_node, model, allow_across):
        rest = num_gpus // tp
        for pp in range(1, min(rest, model.num_layers) + 1):
            if rest % pp == 0 and batch % (rest // pp) == 0:
                return True
    return False


def _nearest(ok, start: int, lo: int, hi: int) -> tuple[int | None, int | None]:
    """The nearest value below and above `start` (within [lo, hi]) for which ok(value) holds."""
    below = next((v for v in range(start - 1, lo - 1, -1) if ok(v)), None)
    above = next((v for v in range(start + 1, hi + 1) if ok(v)), None)
    return below, above


def _divisibility(problem, opts) -> list[str]:
    cl, model, B = problem.cluster, problem.model, problem.training.global_batch_size
    g, n = cl.gpus_per_node, cl.num_gpus
    across = opts.allow_tp_across_nodes
    head = (f"no layout divides {n:,} GPUs for {model.num_layers} layers / {model.num_attention_heads} heads at "
            f"global batch {B:,}: tp must divide the heads, KV heads, FFN and hidden size and the node's {g} GPUs, "
            f"pp <= {model.num_layers} layers, and dp = GPUs / (tp x pp) must divide the batch")
    helps = []
    nodes_ok = lambda k: divisible(k * g, g, model, B, across)  # noqa: E731
    below, above = _nearest(nodes_ok, cl.num_nodes, max(1, cl.num_nodes // 2), cl.num_nodes * 2)
    near = [f"{k:,} nodes ({k * g:,} GPUs)" for k in (below, above) if k is not None]
    if near:
        helps.append(f"use {' or '.join(near)} at batch {B:,}")
    batch_ok = lambda b: divisible(n, g, model, b, across)  # noqa: E731
    b_lo, b_hi = _nearest(batch_ok, B, max(1, B // 4), B * 4)
    batches = [f"{b:,}" for b in (b_lo, b_hi) if b is not None]
    if batches:
        helps.append(f"a global batch of {' or '.join(batches)} sequences on {n:,} GPUs")
    if not helps:
        helps.append("a node count whose GPUs factor into tp x pp x dp with dp dividing the batch")
    return [head, *[f"would help: {h}" for h in helps]]


def _memory_minimal_estimates(problem, opts):
    """(fits on the GPU, estimate) for every base at full recompute and its smallest micro-batch."""
    from planner.inputs.specs import LayoutSpec
    from planner.search import enumerate_bases

    headroom = problem.knobs.memory_headroom_bytes
    seen = set()
    for offload in (False, True):
        for base in enumerate_bases(problem, opts, offload=offload):
            key = tuple((k, str(v)) for k, v in base.items() if k not in ("micro_batch_size", "num_micro_batches"))
            if key in seen:  # bases come smallest micro-batch first; a larger one only needs more memory
                continue
            seen.add(key)
            layout = LayoutSpec.model_construct(**{"layers_per_stage": None, **base}, recompute="full",
                                                recompute_layers_per_stage=None)
            est = problem.estimate(layout)
            yield est.peak_memory_bytes + headroom <= est.gpu_memory_bytes, est


def _memory(problem, opts) -> tuple[list[str], float]:
    least_gpu, least_host = float("inf"), float("inf")
    for on_gpu, est in _memory_minimal_estimates(problem, opts):
        least_gpu = min(least_gpu, est.peak_memory_bytes)
        if on_gpu:  # fits the GPU, so the host is what failed
            least_host = min(least_host, est.host_memory_bytes_per_node)
    headroom = problem.knobs.memory_headroom_bytes
    hw = problem.hardware
    if least_host < float("inf"):
        have = hw.host_memory_bytes_per_node / GIB
        need = least_host / GIB
        head = (f"no layout fits: host memory binds: the layouts that fit in GPU memory offload optimizer states to "
                f"the host and need at least {need:,.1f} GiB of host RAM per node; a node has {have:,.1f} GiB")
        return [head, f"would help: nodes with at least {need:,.0f} GiB of host RAM (host_memory_gib in the cluster "
                      "file), or more GPUs to shard the states over"], least_gpu
    need = (least_gpu + headroom) / GIB
    head = (f"no layout fits: the least any layout needs is {need:,.1f} GiB per GPU (incl. {headroom / GIB:.1f} GiB "
            f"headroom; full recompute, smallest micro-batch, offload searched); a {hw.gpu_name} has "
            f"{hw.gpu_memory_bytes / GIB:.1f} GiB")
    return [head, f"would help: a GPU with at least {need:,.0f} GiB of memory"], least_gpu


def _other_remedies(problem, opts) -> list[str]:
    from planner.problem import Problem
    from planner.search import _any_fits

    helps, cl = [], problem.cluster
    quick = replace(opts, progress=False)
    if cl.num_nodes > 1 or cl.inter_node.nic_link() is not None:
        for factor in (2, 4, 8, 16, 32, 64):
            nodes = cl.num_nodes * factor
            if nodes * cl.gpus_per_node > 2**20:
                break
            bigger = Problem(problem.model, problem.training, cl.with_nodes(nodes), problem.knobs)
            if _any_fits(bigger, quick):
                helps.append(f"more GPUs: {nodes:,} nodes ({bigger.cluster.num_gpus:,} GPUs) fit")
                break
    s = problem.training.seq_length
    for _ in range(12):
        s //= 2
        if s < 128:
            break
        shorter = Problem(problem.model, problem.training.model_copy(update={"seq_length": s}), cl, problem.knobs)
        if _any_fits(shorter, quick):
            helps.append(f"a shorter sequence: {s:,} tokens fits")
            break
    return [f"would help: {h}" for h in helps]


def explain_infeasible(problem, opts) -> InfeasibleError:
    """The InfeasibleError (exit 4) for a request with no fitting layout, headed by the binding constraint."""
    from planner.search import enumerate_bases

    cl = problem.cluster
    if not divisible(cl.num_gpus, cl.gpus_per_node, problem.model, problem.training.global_batch_size,
                     opts.allow_tp_across_nodes):
        lines = _divisibility(problem, opts)
        return InfeasibleError(lines[0], problems=lines)
    if not any(True for off in (False, True) for _ in enumerate_bases(problem, opts, offload=off)):
        line = ("no layout is left after the --framework/--fix/--schedules restriction, although the arithmetic "
                "allows some; widen the restriction")
        return InfeasibleError(line, problems=[line])
    lines, _ = _memory(problem, opts)
    lines += _other_remedies(problem, opts)
    return InfeasibleError(lines[0], problems=lines)
