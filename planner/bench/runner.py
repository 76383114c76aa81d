"""Run a layout with torch.distributed and measure it (the only code that trains; torch imported here).

Each rank builds its share of a GPT/Llama model (planner.bench.model) with deterministic per-layer seeds, applies
the layout with PyTorch's own APIs, in torchtitan's order (TP -> activation checkpointing -> FSDP):

- a DeviceMesh (pp, dp, tp), TP innermost, as Megatron-LM and torchtitan order ranks;
- tensor and sequence parallelism with parallelize_module (column/row/sequence styles);
- pipeline stages built by hand as PipelineStage, run by the plan's schedule (GPipe, 1F1B, interleaved 1F1B,
  zero-bubble as ZBV); `scale_grads=False`, so every layout optimises the same objective: the sum over
  micro-batches of the mean token cross-entropy, averaged over data-parallel ranks;
- ZeRO-0 as a gradient all-reduce over the DP group; ZeRO-1 as sharded optimizer state (each DP rank steps the
  parameters it owns and broadcasts them, ZeroRedundancyOptimizer's algorithm, which also works on TP's DTensor
  parameters); ZeRO-2/3 as FSDP2 fully_shard with resharding after forward off/on;
- recomputation with torch.utils.checkpoint: full (each layer) or selective (the attention block).

It times warm-up and measured steps, measures memory (CUDA's max allocated; on CPU the bytes of parameters,
gradients, optimizer state and the peak of saved activations), and times collectives on the actual TP and DP
groups and between pipeline neighbours.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from cost_models.inputs import Transformer
from planner.bench.model import Block, _norm


@dataclass
class BenchConfig:
    shape: dict  # cost_models.inputs.Transformer fields
    seq_length: int
    layout: dict  # LayoutSpec fields
    steps: int = 3
    warmup: int = 1
    lr: float = 0.05
    seed: int = 1234
    dtype: str = "float32"
    timeout_seconds: float = 120.0
    measure_collectives: bool = True
    collect_params: bool = False
    fail_rank: int | None = None  # tests: this rank dies at the first step
    result_dir: str | None = None

    def transformer(self) -> Transformer:
        return Transformer(**self.shape)


# ---- model pieces per stage ---------------------------------------------------------------------------------


class StageModule(nn.Module):
    """Layers [first, last) of the model, with the embedding on the first stage and norm + output on the last."""

    def __init__(self, shape: Transformer, seq_length: int, layer_ids: list[int], *, first: bool, last: bool, seed: int):
        super().__init__()
        self.layer_ids = layer_ids
        if first:
            torch.manual_seed(seed + 100_000)
            self.embed = nn.Embedding(shape.vocab_size, shape.hidden_size)
            if shape.learned_position_embeddings:
                self.pos = nn.Embedding(max(shape.max_position_embeddings, seq_length), shape.hidden_size)
        self.layers = nn.ModuleDict()
        for i in layer_ids:
            torch.manual_seed(seed + i)
            self.layers[str(i)] = Block(shape, seq_length=seq_length, dropout_p=0.0)
        if last:
            torch.manual_seed(seed + 200_000)
            self.norm = _norm(shape)
            self.output = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        self.first, self.last = first, last

    def forward(self, x):
        if self.first:
            tokens = x
            x = self.embed(tokens)
            if hasattr(self, "pos"):
                x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers.values():
            x = layer(x)
        if self.last:
            x = self.output(self.norm(x))
        return x


def stage_layer_ids(num_layers: int, num_stages: int, layers_per_stage: list[int] | None) -> list[list[int]]:
    counts = layers_per_stage if layers_per_stage and len(layers_per_stage) == num_stages else None
    if counts is None:
        base, extra = divmod(num_layers, num_stages)
        counts = [base + (1 if i < extra else 0) for i in range(num_stages)]
    out, start = [], 0
    for c in counts:
        out.append(list(range(start, start + c)))
        start += c
    return out


def stages_of_rank(schedule: str, pp: int, v: int, pp_rank: int) -> list[int]:
    """Global stage indices this pipeline rank runs: one; v looped (interleaved); two in a V (ZBV)."""
    if pp == 1:
        return [0]
    if schedule == "interleaved_1f1b":
        return [pp_rank + c * pp for c in range(v)]
    if schedule == "zero_bubble":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank]


def num_global_stages(schedule: str, pp: int, v: int) -> int:
    if pp == 1:
        return 1
    return pp * v if schedule == "interleaved_1f1b" else 2 * pp if schedule == "zero_bubble" else pp


# ---- parallelism ---------------------------------------------------------------------------------------------


def apply_tp(module: StageModule, tp_mesh, *, sequence_parallel: bool) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    top: dict = {}
    if sequence_parallel:
        if module.first:
            top["embed"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
        if module.last:
            top["norm"] = SequenceParallel()
            top["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
        if top:
            parallelize_module(module, tp_mesh, top)
    for block in module.layers.values():
        plan = {
            "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=Shard(1)) if sequence_parallel else RowwiseParallel(),
            "mlp.w1": ColwiseParallel(),
            "mlp.w2": RowwiseParallel(output_layouts=Shard(1)) if sequence_parallel else RowwiseParallel(),
        }
        if block.mlp.swiglu:
            plan["mlp.w3"] = ColwiseParallel()
        if sequence_parallel:
            plan.update({
                "norm1": SequenceParallel(), "norm2": SequenceParallel(),
                "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, tp_mesh, plan)


class _Checkpointed(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.inner, *args, use_reentrant=False)


def apply_recompute(module: StageModule, policy: str) -> None:
    """full: checkpoint every layer (keep its input only); selective: checkpoint the attention block."""
    for key in list(module.layers.keys()):
        block = module.layers[key]
        if policy == "full":
            module.layers[key] = _Checkpointed(block)
        elif policy == "selective":
            block.attn = _Checkpointed(block.attn)


def apply_fsdp(module: StageModule, dp_mesh, *, reshard: bool) -> None:
    from torch.distributed.fsdp import fully_shard

    for block in module.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard)
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class ShardedOptimizer:
    """ZeRO-1: each DP rank keeps optimizer state only for the parameters it owns (balanced by size), steps them,
    and broadcasts them to the DP group (the algorithm of torch's ZeroRedundancyOptimizer)."""

    def __init__(self, params: list[nn.Parameter], *, dp_group, dp_ranks: list[int], lr: float):
        self.params = params
        self.group = dp_group
        self.ranks = dp_ranks
        me = dist.get_rank()
        loads = [0] * len(dp_ranks)
        self.owner = []
        for p in sorted(range(len(params)), key=lambda i: -params[i].numel()):
            k = min(range(len(loads)), key=lambda j: loads[j])
            loads[k] += params[p].numel()
            self.owner.append((p, dp_ranks[k]))
        self.owner.sort()
        mine = [params[i] for i, r in self.owner if r == me]
        self.inner = torch.optim.SGD(mine, lr=lr, momentum=0.9) if mine else None

    def step(self):
        if self.inner is not None:
            self.inner.step()
        for i, owner in self.owner:
            dist.broadcast(_local(self.params[i].data), src=owner, group=self.group)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def state_bytes(self) -> int:
        return optimizer_state_bytes(self.inner) if self.inner is not None else 0


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's state tensors (momentum buffers) held by this rank."""
    return sum(_local(v).numel() * _local(v).element_size() for st in opt.state.values() for v in st.values()
               if torch.is_tensor(v))


# ---- measurement helpers -----------------------------------------------------------------------------------


class SavedActivationMeter:
    """Peak bytes of tensors autograd keeps alive for backward (de-duplicated by storage), on CPU."""

    def __init__(self, exclude: set[int]):
        self.exclude = exclude
        self.live: dict[int, tuple[int, weakref.ref]] = {}
        self.peak = 0

    def pack(self, t):
        st = t.untyped_storage()
        key = st._cdata
        if key not in self.exclude and key not in self.live:
            try:
                ref = weakref.ref(t)
            except TypeError:
                return t
            self.live[key] = (st.nbytes(), ref)
            self.live = {k: v for k, v in self.live.items() if v[1]() is not None}
            self.peak = max(self.peak, sum(v[0] for v in self.live.values()))
        return t

    @staticmethod
    def unpack(t):
        return t


def median_seconds(fn, repeats: int = 5, *, warmup: bool = False) -> float:
    """Median wall time of fn over `repeats` calls (after one untimed call when warmup)."""
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---- the worker --------------------------------------------------------------------------------------------


def worker(rank: int, world: int, cfg: BenchConfig, init_method: str | None) -> dict:
    from datetime import timedelta

    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % max(1, torch.cuda.device_count())) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    kwargs = {"backend": backend, "timeout": timedelta(seconds=cfg.timeout_seconds)}
    if init_method:
        kwargs.update(init_method=init_method, rank=rank, world_size=world)
    dist.init_process_group(**kwargs)
    lay = cfg.layout
    tp, pp, dp = lay["tp"], lay["pp"], lay["dp"]
    if tp * pp * dp != world:
        raise RuntimeError(f"layout needs dp*tp*pp = {dp * tp * pp} ranks, got {world}")
    mesh = init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    shape = cfg.transformer()
    dtype = getattr(torch, cfg.dtype)
    schedule = lay.get("schedule", "1f1b") if pp > 1 else "1f1b"
    v = lay.get("virtual_stages", 1) if schedule == "interleaved_1f1b" else 1
    n_stages = num_global_stages(schedule, pp, v)
    layer_split = stage_layer_ids(shape.num_layers, n_stages, lay.get("layers_per_stage") if n_stages == pp else None)
    my_stages = stages_of_rank(schedule, pp, v, pp_rank)
    modules = []
    for s in my_stages:
        with torch.device(device):
            m = StageModule(shape, cfg.seq_length, layer_split[s], first=s == 0, last=s == n_stages - 1, seed=cfg.seed)
        m = m.to(dtype)
        if tp > 1:
            apply_tp(m, mesh["tp"], sequence_parallel=bool(lay.get("sequence_parallel")))
        if lay.get("recompute", "none") != "none":
            apply_recompute(m, lay["recompute"])
        if lay.get("zero_stage", 0) >= 2 and dp > 1:
            apply_fsdp(m, mesh["dp"], reshard=lay["zero_stage"] == 3)
        modules.append(m)
    params = [p for m in modules for p in m.parameters()]
    zero = lay.get("zero_stage", 0)
    dp_group = mesh["dp"].get_group()
    dp_ranks = dist.get_process_group_ranks(dp_group)
    if zero == 1 and dp > 1:
        opt = ShardedOptimizer(params, dp_group=dp_group, dp_ranks=dp_ranks, lr=cfg.lr)
    else:
        opt = torch.optim.SGD(params, lr=cfg.lr, momentum=0.9)

    mbs, m_count = lay["micro_batch_size"], lay["num_micro_batches"]
    V, s = shape.vocab_size, cfg.seq_length

    def batch(step: int):
        g = torch.Generator().manual_seed(cfg.seed * 1000 + step)
        tokens = torch.randint(0, V, (dp * m_count * mbs, s), generator=g)
        targets = torch.randint(0, V, (dp * m_count * mbs, s), generator=g)
        lo = dp_rank * m_count * mbs
        return tokens[lo:lo + m_count * mbs].to(device), targets[lo:lo + m_count * mbs].to(device)

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, V).float(), target.reshape(-1))

    sched = None
    if pp > 1:
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
            ScheduleZBVZeroBubble,
        )

        stages = [PipelineStage(mod, idx, n_stages, device, group=mesh["pp"].get_group())
                  for mod, idx in zip(modules, my_stages, strict=True)]
        if schedule in ("gpipe", "naive"):
            sched = ScheduleGPipe(stages[0], m_count, loss_fn=loss_fn, scale_grads=False)
        elif schedule in ("1f1b", "pipedream_async"):
            sched = Schedule1F1B(stages[0], m_count, loss_fn=loss_fn, scale_grads=False)
        elif schedule == "interleaved_1f1b":
            sched = ScheduleInterleaved1F1B(stages, m_count, loss_fn=loss_fn, scale_grads=False)
        else:
            sched = ScheduleZBVZeroBubble(stages, m_count, loss_fn=loss_fn, scale_grads=False)
    excluded = {p.untyped_storage()._cdata for p in params}
    meter = SavedActivationMeter(excluded)

    def train_step(step: int, measure: bool):
        if cfg.fail_rank == rank:
            os._exit(3)  # tests: a rank that dies
        x, y = batch(step)
        ctx = torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack) if measure else _null()
        with ctx:
            if sched is not None:
                has_first = 0 in my_stages
                has_last = (n_stages - 1) in my_stages
                if has_first and has_last:
                    sched.step(x, target=y, losses=[])
                elif has_first:
                    sched.step(x)
                elif has_last:
                    sched.step(target=y, losses=[])
                else:
                    sched.step()
            else:
                for i in range(m_count):
                    xm, ym = x[i * mbs:(i + 1) * mbs], y[i * mbs:(i + 1) * mbs]
                    loss_fn(modules[0](xm), ym).backward()
        if zero <= 1 and dp > 1:
            for p in params:
                if p.grad is not None:
                    g = _local(p.grad)
                    dist.all_reduce(g, group=dp_group)
                    g.div_(dp)
        opt.step()
        opt.zero_grad()

    step_times = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for step in range(cfg.warmup + cfg.steps):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        train_step(step, measure=step == cfg.warmup)
        if cuda:
            torch.cuda.synchronize()
        if step >= cfg.warmup:
            step_times.append(time.perf_counter() - t0)

    def nbytes(ts):
        return sum(_local(t).numel() * _local(t).element_size() for t in ts if t is not None)

    report = {
        "rank": rank, "pp_rank": pp_rank, "dp_rank": dp_rank, "tp_rank": mesh["tp"].get_local_rank(),
        "stages": my_stages, "layers": [mm.layer_ids for mm in modules],
        "step_seconds": step_times, "median_step_seconds": statistics.median(step_times),
        "parameter_bytes": nbytes(params),
        # gradients are freed after each step; while alive they match the (local, possibly sharded) parameters
        "gradient_bytes": nbytes(params),
        "optimizer_state_bytes": opt.state_bytes() if isinstance(opt, ShardedOptimizer) else optimizer_state_bytes(opt),
        "saved_activation_peak_bytes": meter.peak,
        "cuda_max_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "device": device.type,
    }
    if cfg.measure_collectives:
        report["collectives"] = measure_collectives(mesh, shape, cfg, device, dtype)
    if cfg.collect_params:
        report["params"] = full_params(modules)
    dist.barrier()
    return report


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def measure_collectives(mesh, shape: Transformer, cfg: BenchConfig, device, dtype) -> dict:
    """Time the collectives the layout uses, on its own groups: TP all-reduce of b*s*h, DP all-reduce of the
    gradients (up to 64 MiB), and a send/recv of b*s*h/t between pipeline neighbours."""
    lay = cfg.layout
    out = {}
    elem = torch.tensor([], dtype=dtype).element_size()
    act = lay["micro_batch_size"] * cfg.seq_length * shape.hidden_size
    if lay["tp"] > 1:
        t = torch.ones(act, dtype=dtype, device=device)
        g = mesh["tp"].get_group()
        out["tp_all_reduce"] = {"bytes": act * elem, "group_size": lay["tp"],
                                "seconds": median_seconds(lambda: dist.all_reduce(t, group=g))}
    if lay["dp"] > 1:
        n = min(16 * 2**20, max(1024, act))
        t = torch.ones(n, dtype=dtype, device=device)
        g = mesh["dp"].get_group()
        out["dp_all_reduce"] = {"bytes": n * elem, "group_size": lay["dp"],
                                "seconds": median_seconds(lambda: dist.all_reduce(t, group=g))}
    if lay["pp"] > 1:
        n = max(1, act // lay["tp"])
        t = torch.ones(n, dtype=dtype, device=device)
        ranks = dist.get_process_group_ranks(mesh["pp"].get_group())
        me = ranks.index(dist.get_rank())

        def ping():
            # pairs (0,1), (2,3), ...: the even stage sends, the odd one receives; odd trailing stage idles
            if me % 2 == 0 and me + 1 < len(ranks):
                dist.send(t, dst=ranks[me + 1])
            elif me % 2 == 1:
                dist.recv(t, src=ranks[me - 1])

        out["pp_send_recv"] = {"bytes": n * elem, "group_size": 2, "seconds": median_seconds(ping)}
    return out


def full_params(modules) -> dict[str, list]:
    """Full (unsharded) parameters by global name, as nested lists (small test models only)."""
    out = {}
    for m in modules:
        for name, p in m.named_parameters():
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            key = name.replace("inner.", "")
            out[key] = t.detach().cpu().double().tolist()
    return out


# ---- launching ---------------------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(rank: int, world: int, fn, args, init_method: str, out_dir: str) -> None:
    code = 0
    try:
        report = fn(rank, world, args, init_method)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(report, fh)
    except BaseException as exc:  # report, then exit hard: never hang the parent
        with open(os.path.join(out_dir, f"rank{rank}.error"), "w") as fh:
            fh.write(f"{type(exc).__name__}: {exc}")
        code = 1
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass
        gc.collect()
        os._exit(code)


def run_ranks(fn, args, nproc: int, timeout_seconds: float) -> list[dict]:
    """Fork `nproc` ranks running fn(rank, world, args, init_method) from this process (torch already imported:
    ~2 s faster than spawn), rendezvous on 127.0.0.1. If a rank exits non-zero the others are stopped at once;
    the whole run is bounded by twice the process-group timeout. Raises BenchmarkError on any failure."""
    import multiprocessing as mp
    import tempfile

    from planner.errors import BenchmarkError

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    ctx = mp.get_context("fork")
    init = f"tcp://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="planner-bench-") as out_dir:
        procs = [ctx.Process(target=_child, args=(r, nproc, fn, args, init, out_dir)) for r in range(nproc)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_seconds * 2 + 30
        failed = None
        while any(p.is_alive() for p in procs):
            for r, p in enumerate(procs):
                if not p.is_alive() and p.exitcode not in (0, None) and failed is None:
                    failed = (r, p.exitcode)
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        timed_out = any(p.is_alive() for p in procs) and failed is None
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        if failed is None and not timed_out:
            bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
            failed = bad[0] if bad else None
        if timed_out:
            raise BenchmarkError(f"ranks still running after {timeout_seconds * 2 + 30:.0f} s; all were stopped")
        if failed is not None:
            r, code = failed
            err = os.path.join(out_dir, f"rank{r}.error")
            detail = open(err).read() if os.path.exists(err) else ""
            raise BenchmarkError(f"rank {r} failed (exit {code}){': ' + detail if detail else ''}; the other ranks "
                                 "were stopped")
        reports = []
        for r in range(nproc):
            with open(os.path.join(out_dir, f"rank{r}.json")) as fh:
                reports.append(json.load(fh))
    return reports


def launch_local(cfg: BenchConfig, nproc: int) -> list[dict]:
    return run_ranks(worker, cfg, nproc, cfg.timeout_seconds)


def reference_params(cfg: BenchConfig) -> dict[str, list]:
    """The same training, single process, no parallelism: the numerics every layout must reproduce."""
    torch.set_num_threads(1)
    shape = cfg.transformer()
    lay = cfg.layout
    dtype = getattr(torch, cfg.dtype)
    model = StageModule(shape, cfg.seq_length, list(range(shape.num_layers)), first=True, last=True, seed=cfg.seed).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    dp, m_count, mbs, V = lay["dp"], lay["num_micro_batches"], lay["micro_batch_size"], shape.vocab_size
    for step in range(cfg.warmup + cfg.steps):
        g = torch.Generator().manual_seed(cfg.seed * 1000 + step)
        tokens = torch.randint(0, V, (dp * m_count * mbs, cfg.seq_length), generator=g)
        targets = torch.randint(0, V, (dp * m_count * mbs, cfg.seq_length), generator=g)
        for r in range(dp):
            for i in range(m_count):
                lo = (r * m_count + i) * mbs
                logits = model(tokens[lo:lo + mbs])
                loss = F.cross_entropy(logits.reshape(-1, V).float(), targets[lo:lo + mbs].reshape(-1)) / dp
                loss.backward()
        opt.step()
        opt.zero_grad()
    return {name: p.detach().double().tolist() for name, p in model.named_parameters()}


def max_param_error(params: dict[str, list], ref: dict[str, list]) -> float:
    worst = 0.0
    for name, value in params.items():
        a, b = torch.tensor(value), torch.tensor(ref[name])
        worst = max(worst, float((a - b).abs().max() / (b.abs().max() + 1e-12)))
    missing = set(ref) - set(params)
    if missing:
        raise KeyError(f"parameters missing from the distributed run: {sorted(missing)[:5]}")
    return worst

