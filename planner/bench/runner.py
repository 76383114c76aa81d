"""Run a layout with torch.distributed and measure it (the only code that trains; torch imported here).

Each rank builds its share of a GPT/Llama model (planner.bench.model) with deterministic per-layer seeds, applies
the layout with PyTorch's own APIs, in torchtitan's order (TP -> activation checkpointing -> FSDP):

- a DeviceMesh (pp, dp, tp), TP innermost, as Megatron-LM and torchtitan order ranks;
- tensor and sequence parallelism with parallelize_module (column/row/sequence styles); the embedding and the
  loss vocabulary-parallel, as Megatron and torchtitan run them: each rank looks up and scores its rows of the
  vocabulary (vocab_parallel_embedding; torch's loss_parallel on the sharded logits);
- pipeline stages built by hand as PipelineStage, run by the plan's schedule (GPipe, 1F1B, interleaved 1F1B,
  zero-bubble as ZB-H1); `scale_grads=False`, so every layout optimises the same objective: the sum over
  micro-batches of the mean token cross-entropy, averaged over data-parallel ranks;
- ZeRO-0 as a gradient all-reduce over the DP group; ZeRO-1 as sharded optimizer state (each DP rank steps the
  parameters it owns and broadcasts them, ZeroRedundancyOptimizer's algorithm, which also works on TP's DTensor
  parameters); ZeRO-2/3 as FSDP2 fully_shard with resharding after forward off/on (also at world size 1);
- hybrid sharding (dp_shard S < dp): FSDP2 over a 2-D (dp / S replicas, S shards) mesh, which shards within S
  ranks and all-reduces the gradient shards across the replicas (torch's HSDP); ZeRO-1 with the optimizer state
  sharded over the S ranks of a shard group and the gradients averaged over every dp rank (Megatron-Core's partial
  distributed optimizer states; its reduce-scatter then all-reduce sums the same gradients);
- recomputation with torch.utils.checkpoint: full (each layer) or selective as the plan's framework means it
  (Megatron's attention core, or torchtitan's per-op SAC; planner.bench.recompute);
- the training recipe: AdamW on fp32 master weights with fp32 moments (planner.bench.optim), compute in the
  benchmark's dtype; under FSDP2 fp32 shards gathered in that dtype with gradients reduced in fp32
  (MixedPrecisionPolicy); tied embeddings as one parameter, or across pipeline stages as two copies whose
  gradients are summed over the embedding group (Megatron's). SGD with momentum only when asked (numerics tests).

It times warm-up and measured steps, measures memory (CUDA's peak allocated and peak reserved; everywhere the
bytes of parameters, gradients, optimizer state and the peak of saved activations), and times collectives on the
actual TP and DP groups and between pipeline neighbours.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import statistics
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.multiprocessing.reductions import StorageWeakRef

from cost_models.inputs import Transformer
from planner.bench.model import Block, _norm
from planner.bench.optim import local_grad, make_optimizer, optimizer_state_bytes
from planner.bench.recompute import CORE_ATTENTION, apply_recompute, cached_tensors, metering
from planner.bench.timing import timed

if TYPE_CHECKING:
    from torch.distributed.pipelining.stage import _PipelineStageBase


@dataclass
class BenchConfig:
    shape: dict  # cost_models.inputs.Transformer fields
    seq_length: int
    layout: dict  # LayoutSpec fields
    steps: int = 3
    warmup: int = 1
    lr: float | None = None  # default: 1e-4 for AdamW, 0.05 for SGD
    seed: int = 1234
    dtype: str = "float32"
    selective: str = CORE_ATTENTION  # what recompute 'selective' runs as (planner.bench.recompute.SELECTIVE_KINDS)
    optimizer: str = "adamw"  # adamw: fp32 master weights + fp32 moments (the real recipe); sgd: numerics tests
    exp_avg_dtype: str = "float32"  # AdamW's moments (torch dtype names; planner.bench.optim.MOMENT_DTYPES)
    exp_avg_sq_dtype: str = "float32"
    adam_eps: float = 1e-8
    timeout_seconds: float = 120.0
    measure_collectives: bool = True
    collect_params: bool = False
    fail_rank: int | None = None  # tests: this rank dies at the first step
    result_dir: str | None = None

    def transformer(self) -> Transformer:
        return Transformer(**self.shape)

    @property
    def moment_dtypes(self) -> dict[str, str]:
        return {"exp_avg_dtype": self.exp_avg_dtype, "exp_avg_sq_dtype": self.exp_avg_sq_dtype}

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (1e-4 if self.optimizer == "adamw" else 0.05)


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
            if shape.tied_embeddings:  # the same initial values as the embedding (tied, or synchronised copies)
                torch.manual_seed(seed + 100_000)
                self.output.weight.data.copy_(nn.Embedding(shape.vocab_size, shape.hidden_size).weight.data)
        self.first, self.last = first, last
        self.tied = shape.tied_embeddings
        self.sp_mesh = None  # set by apply_tp when learned positions must be added before sequence sharding
        self.embed_placement: Any = None  # set by apply_tp: the vocabulary-parallel embedding's output layout
        self.tie()

    def tie(self) -> None:
        """One parameter for embedding and output when this module holds both (call again after TP)."""
        if self.tied and self.first and self.last:
            self.output.weight = self.embed.weight

    def forward(self, x):
        if self.first:
            tokens = x
            if self.embed_placement is None:
                x = self.embed(tokens)
            else:
                x = vocab_parallel_embedding(tokens, self.embed.weight, self.embed_placement)
            if hasattr(self, "pos"):
                x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
                if self.sp_mesh is not None:  # Megatron's scatter to the sequence-parallel region, after the positions
                    from torch.distributed.tensor import DTensor, Replicate, Shard

                    x = DTensor.from_local(x, self.sp_mesh, [Replicate()], run_check=False)
                    x = x.redistribute(self.sp_mesh, [Shard(1)]).to_local()
        for layer in self.layers.values():
            x = layer(x)
        if self.last:
            x = self.output(self.norm(x))
        return x


def stage_layer_ids(num_layers: int, num_stages: int, layers_per_stage: list[int] | None) -> list[list[int]]:
    """Layer ids per stage: the given counts, else THE split (cost_models.stage.stage_split, as the estimate)."""
    from cost_models.stage import stage_split

    counts = layers_per_stage if layers_per_stage and len(layers_per_stage) == num_stages else None
    if counts is None:
        counts = list(stage_split(num_layers, num_stages))
    out, start = [], 0
    for c in counts:
        out.append(list(range(start, start + c)))
        start += c
    return out


def stages_of_rank(schedule: str, pp: int, v: int, pp_rank: int) -> list[int]:
    """Global stage indices this pipeline rank runs: one (ZB-H1 too); v looped (interleaved)."""
    if pp == 1:
        return [0]
    if schedule == "interleaved_1f1b":
        return [pp_rank + c * pp for c in range(v)]
    return [pp_rank]


def num_global_stages(schedule: str, pp: int, v: int) -> int:
    if pp == 1:
        return 1
    return pp * v if schedule == "interleaved_1f1b" else pp


# ---- parallelism ---------------------------------------------------------------------------------------------


def vocab_parallel_embedding(tokens: torch.Tensor, weight: DTensor, placement) -> torch.Tensor:
    """Megatron's VocabParallelEmbedding on a weight sharded by rows (Shard(0)) over the TP mesh: each rank looks up
    the ids that fall in its rows (the others read zeros) and the partial sums are reduced to `placement`
    (Replicate: an all-reduce; Shard(1): a reduce-scatter into sequence shards), so the weight's gradient stays this
    rank's rows. torch's RowwiseParallel on an nn.Embedding returns that gradient replicated, the whole vocabulary on
    every rank (torch 2.13), which no TP framework keeps: the bench measured TP gradients 1 - 1/t of the embedding
    above the model."""
    from torch.distributed.tensor import Partial

    mesh, local = weight.device_mesh, weight.to_local()  # the gradient comes back with the weight's placements
    rows_per_rank = -(-weight.shape[0] // mesh.size())  # Shard(0) splits as torch.chunk does
    ids = tokens - mesh.get_local_rank() * rows_per_rank
    outside = (ids < 0) | (ids >= local.shape[0])
    out = F.embedding(ids.masked_fill(outside, 0), local).masked_fill(outside.unsqueeze(-1), 0.0)
    return DTensor.from_local(out, mesh, [Partial()], run_check=False).redistribute(mesh, [placement]).to_local()


def make_loss(tp: int, mesh, vocab_size: int) -> tuple[Any, Any]:
    """(the token cross-entropy on fp32-cast logits, the context every step's forward and backward run in): torch's
    F.cross_entropy, as torchtitan takes it. With TP the logits are this rank's vocabulary shard (b, s, V / t) and
    the loss runs under loss_parallel: log-softmax and the target's logit reduced over the TP ranks, 4 B per local
    logit saved (the model's count, s b V / t), 16 at its backward (memory.TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import loss_parallel

    tp_mesh = mesh["tp"] if tp > 1 else None

    def loss_fn(logits, target):
        if tp_mesh is not None:
            logits = DTensor.from_local(logits, tp_mesh, [Shard(-1)], run_check=False)
        return F.cross_entropy(logits.reshape(-1, vocab_size).float(), target.reshape(-1))

    return loss_fn, (loss_parallel if tp_mesh is not None else _null)


def apply_tp(module: StageModule, tp_mesh, *, sequence_parallel: bool) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    # vocabulary-parallel embedding and output layer (Megatron's VocabParallelEmbedding / column-parallel logits)
    top: dict = {}
    if module.first:
        # with learned positions the embedding's output stays whole until the positions are added (forward)
        positions = hasattr(module, "pos")
        module.embed.weight = nn.Parameter(distribute_tensor(module.embed.weight.data, tp_mesh, [Shard(0)]))
        module.embed_placement = Shard(1) if sequence_parallel and not positions else Replicate()
        if sequence_parallel and positions:
            module.sp_mesh = tp_mesh
    if module.last:
        if sequence_parallel:
            top["norm"] = SequenceParallel()
        # logits stay sharded by vocabulary for the loss (make_loss)
        top["output"] = ColwiseParallel(input_layouts=Shard(1) if sequence_parallel else Replicate(),
                                        output_layouts=Shard(-1))
    if top:
        parallelize_module(module, tp_mesh, top)
    module.tie()
    for layer in module.layers.values():
        block = cast(Block, layer)  # TP comes before recomputation wraps a layer (torchtitan's order)
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


def apply_fsdp(module: StageModule, dp_mesh, *, reshard: bool, compute_dtype) -> None:
    """FSDP2 as torchtitan applies it: each layer a unit, then the root; fp32 sharded parameters (the master copy),
    gathered in the compute dtype, gradients reduced in fp32 (MixedPrecisionPolicy)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for block in module.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class ShardedOptimizer:
    """ZeRO-1: each DP rank keeps optimizer state only for the parameters it owns (balanced by size), steps them,
    and broadcasts them to the DP group (the algorithm of torch's ZeroRedundancyOptimizer)."""

    def __init__(self, params: list[nn.Parameter], *, dp_group, dp_ranks: list[int], lr: float, optimizer: str, eps: float,
                 moments: dict[str, str] | None = None):
        moments = moments or {}
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
        self.inner = make_optimizer(optimizer, mine, lr=lr, eps=eps, **moments) if mine else None

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


# ---- measurement helpers -----------------------------------------------------------------------------------


def storage_key(t) -> tuple[int, int] | None:
    """(storage id, bytes) of the memory behind t: a DTensor's local shard, not its global shape (a DTensor's own
    storage is a wrapper sized like the global tensor); None for a tensor on the meta device, which holds none."""
    if isinstance(t, DTensor):
        t = t._local_tensor
    if t.device.type == "meta":
        return None
    st = t.untyped_storage()
    return st._cdata, st.nbytes()


class SavedActivationMeter:
    """Peak bytes of tensors kept alive for backward (de-duplicated by storage), on CPU: autograd's saved tensors
    and what per-op SAC regions hold in their caches (`track_cache`; planner.bench.recompute). A saved tensor counts
    while its storage lives, which may outlast the tensor autograd saved (a view of a pipeline receive buffer).

    A weight (or its transposed view) that a linear saves is parameter memory, not an activation: parameters
    are told by their storage (`exclude` holds the parameters' `storage_key` ids) and, for the unsharded
    parameters FSDP2 gathers for the duration of a layer, by being (a view of) an `nn.Parameter`."""

    def __init__(self, exclude: set[int]):
        self.exclude = exclude
        self.live: dict[int, tuple[int, StorageWeakRef]] = {}
        self.caches: list[weakref.ref] = []  # the SAC regions' replay modes (their caches) of the measured step
        self.peak = 0

    def _counted(self, t) -> tuple[int, int] | None:
        found = storage_key(t)
        if found is None or isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter):
            return None
        return None if found[0] in self.exclude else found

    def pack(self, t):
        found = self._counted(t)
        if found is not None and (found[0] not in self.live or self.live[found[0]][1].expired()):
            # alive while its storage is, not the tensor object autograd saved: a layer under SP saves a view of
            # its input, which dies with the backward, while the storage (a pipeline receive buffer) stays
            self.live[found[0]] = (found[1], StorageWeakRef(_local(t).untyped_storage()))
            self.observe()
        return t

    def track_cache(self, mode) -> None:
        self.caches.append(weakref.ref(mode))

    def observe(self) -> None:
        """Update the peak with what is alive now: saved tensors still referenced, and the SAC caches' contents."""
        self.live = {k: v for k, v in self.live.items() if not v[1].expired()}
        cached = {}
        for ref in self.caches:
            mode = ref()
            for t in cached_tensors(mode) if mode is not None else ():
                found = self._counted(t)
                if found is not None and found[0] not in self.live:
                    cached[found[0]] = found[1]
        self.peak = max(self.peak, sum(v[0] for v in self.live.values()) + sum(cached.values()))

    @staticmethod
    def unpack(t):
        return t


def median_seconds(fn, repeats: int = 5, *, warmup: bool = False) -> float:
    """Median wall time of fn over `repeats` calls (after one untimed call when warmup)."""
    return timed(fn, repeats, warmup=warmup)[0]


# ---- the worker --------------------------------------------------------------------------------------------


def _start(rank: int, world: int, cfg: BenchConfig, init_method: str | None):
    """Join the process group; the device this rank uses and the (pp, dp, tp) mesh, TP innermost."""
    from datetime import timedelta

    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % max(1, torch.cuda.device_count()))
              if cuda else torch.device("cpu"))
    if cuda:
        torch.cuda.set_device(device)
    kwargs: dict[str, Any] = {"backend": "nccl" if cuda else "gloo", "timeout": timedelta(seconds=cfg.timeout_seconds)}
    if init_method:
        kwargs.update(init_method=init_method, rank=rank, world_size=world)
    dist.init_process_group(**kwargs)
    lay = cfg.layout
    tp, pp, dp = lay["tp"], lay["pp"], lay["dp"]
    if tp * pp * dp != world:
        raise RuntimeError(f"layout needs dp*tp*pp = {dp * tp * pp} ranks, got {world}")
    return device, init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))


def hybrid_mesh(cfg: BenchConfig, device):
    """The (dp / S replicas, S shards) mesh of hybrid sharding (dp_shard S < dp), or None: the same ranks as the
    (pp, dp, tp) mesh's dp dimension, split replica-major (dp rank = replica x S + shard), so the shard groups are
    S neighbouring dp ranks, as torchtitan's (dp_replicate, dp_shard) mesh orders them."""
    from torch.distributed.device_mesh import init_device_mesh

    lay = cfg.layout
    shard, dp = lay.get("dp_shard") or lay["dp"], lay["dp"]
    if shard >= dp:
        return None
    mesh = init_device_mesh(device.type, (lay["pp"], dp // shard, shard, lay["tp"]),
                            mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"))
    return mesh["dp_replicate", "dp_shard"]


@dataclass
class _Plan:
    schedule: str
    v: int
    n_stages: int
    split: list[list[int]]
    my_stages: list[int]


def _stage_plan(cfg: BenchConfig, pp_rank: int) -> _Plan:
    lay = cfg.layout
    pp = lay["pp"]
    schedule = lay.get("schedule", "1f1b") if pp > 1 else "1f1b"
    v = lay.get("virtual_stages", 1) if schedule == "interleaved_1f1b" else 1
    n_stages = num_global_stages(schedule, pp, v)
    split = stage_layer_ids(cfg.transformer().num_layers, n_stages,
                            lay.get("layers_per_stage") if n_stages == pp else None)
    return _Plan(schedule, v, n_stages, split, stages_of_rank(schedule, pp, v, pp_rank))


def build_modules(cfg: BenchConfig, plan: _Plan, mesh, device, hsdp=None) -> list[StageModule]:
    """This rank's stage modules with TP, recompute and (ZeRO >= 2) FSDP2 applied, in torchtitan's order; over
    `hsdp` (hybrid_mesh) where the layout shards over part of the dp ranks."""
    lay = cfg.layout
    dtype = getattr(torch, cfg.dtype)
    fsdp = lay.get("zero_stage", 0) >= 2
    modules = []
    for s in plan.my_stages:
        with torch.device(device):
            m = StageModule(cfg.transformer(), cfg.seq_length, plan.split[s], first=s == 0,
                            last=s == plan.n_stages - 1, seed=cfg.seed)
        m = m.to(torch.float32 if fsdp else dtype)  # FSDP2 keeps fp32 shards and gathers in the compute dtype
        if lay["tp"] > 1:
            apply_tp(m, mesh["tp"], sequence_parallel=bool(lay.get("sequence_parallel")))
        if lay.get("recompute", "none") != "none":
            apply_recompute(m, lay["recompute"], cfg.selective)
        if fsdp:
            apply_fsdp(m, hsdp if hsdp is not None else mesh["dp"], reshard=lay["zero_stage"] == 3,
                       compute_dtype=dtype)
        modules.append(m)
    return modules


def tied_embedding_group(cfg: BenchConfig, mesh, plan_of) -> object | None:
    """Megatron's embedding group: the first- and last-stage ranks of each (dp, tp) position, when the model ties
    its embeddings and the two stages live on different pipeline ranks. Every rank must call this (new_group)."""
    lay = cfg.layout
    pp = lay["pp"]
    if not cfg.transformer().tied_embeddings or pp == 1:
        return None
    last_rank = next(r for r in range(pp) if plan_of(r).n_stages - 1 in plan_of(r).my_stages)
    if last_rank == 0:
        return None
    ranks = mesh.mesh
    mine = None
    for i in range(lay["dp"]):
        for j in range(lay["tp"]):
            pair = [int(ranks[0, i, j]), int(ranks[last_rank, i, j])]
            g = dist.new_group(pair)
            if dist.get_rank() in pair:
                mine = g
    return mine


def sync_tied_gradients(modules: list[StageModule], group) -> None:
    """Sum the embedding and output-layer gradients of a tied model held as two copies (equal updates follow)."""
    emb = [m.embed.weight for m in modules if m.first and m.tied]
    out = [m.output.weight for m in modules if m.last and m.tied]
    if emb and out and emb[0] is not out[0]:
        total = local_grad(emb[0]) + local_grad(out[0])
        local_grad(emb[0]).copy_(total)
        local_grad(out[0]).copy_(total)
    elif group is not None and (emb or out):
        dist.all_reduce(local_grad((emb or out)[0]), group=group)


def make_schedule(cfg: BenchConfig, plan: _Plan, modules, mesh, device, loss_fn):
    if cfg.layout["pp"] == 1:
        return None
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleInterleavedZeroBubble,
    )

    m_count = cfg.layout["num_micro_batches"]
    stages: list[_PipelineStageBase] = [PipelineStage(mod, idx, plan.n_stages, device, group=mesh["pp"].get_group())
              for mod, idx in zip(modules, plan.my_stages, strict=True)]
    if plan.schedule in ("gpipe", "naive"):
        return ScheduleGPipe(stages[0], m_count, loss_fn=loss_fn, scale_grads=False)
    if plan.schedule in ("1f1b", "pipedream_async"):
        return Schedule1F1B(stages[0], m_count, loss_fn=loss_fn, scale_grads=False)
    if plan.schedule == "interleaved_1f1b":
        return ScheduleInterleaved1F1B(stages, m_count, loss_fn=loss_fn, scale_grads=False)
    # ZB-H1, the schedule the model predicts: torch's ZB1P with one stage per rank (torch accepts one local stage;
    # torchtitan asks for two, which the planner does not predict: capabilities.TORCHTITAN_ZERO_BUBBLE)
    return ScheduleInterleavedZeroBubble(stages, m_count, loss_fn=loss_fn, scale_grads=False)


def _nbytes(ts) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in ts if t is not None)


def _memory_report(cuda: bool) -> dict:
    return {
        "cuda_max_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "cuda_max_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
        "allocator_config": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") if cuda else None,
    }


def _device_report(device) -> dict:
    """The memory the allocator saw and what ran it (device, its name, torch's version)."""
    cuda = device.type == "cuda"
    return {**_memory_report(cuda), "device": device.type,
            "device_name": torch.cuda.get_device_name(device) if cuda else None, "torch_version": torch.__version__}


def average_gradients(params: list, dp_group, dp: int) -> None:
    """All-reduce each local gradient over the data-parallel group and divide by its size (ZeRO <= 1 over DP)."""
    for p in params:
        if p.grad is not None:
            g = local_grad(p)
            dist.all_reduce(g, group=dp_group)
            g.div_(dp)


def build_optimizer(cfg: BenchConfig, params: list, dp_group, hsdp=None):
    """ZeRO-1 over DP > 1: the sharded optimizer, over the shard group under hybrid sharding; else one optimizer
    over this rank's (possibly FSDP-sharded) parameters."""
    moments = cfg.moment_dtypes
    if cfg.layout.get("zero_stage", 0) == 1 and cfg.layout["dp"] > 1:
        if hsdp is not None:
            dp_group = hsdp["dp_shard"].get_group()
        return ShardedOptimizer(params, dp_group=dp_group, dp_ranks=dist.get_process_group_ranks(dp_group),
                                lr=cfg.learning_rate, optimizer=cfg.optimizer, eps=cfg.adam_eps, moments=moments)
    return make_optimizer(cfg.optimizer, params, lr=cfg.learning_rate, eps=cfg.adam_eps, **moments)


def worker(rank: int, world: int, cfg: BenchConfig, init_method: str | None) -> dict:
    device, mesh = _start(rank, world, cfg, init_method)
    cuda = device.type == "cuda"
    lay = cfg.layout
    dp = lay["dp"]
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    plan = _stage_plan(cfg, pp_rank)
    hsdp = hybrid_mesh(cfg, device)
    modules = build_modules(cfg, plan, mesh, device, hsdp)
    tied_group = tied_embedding_group(cfg, mesh, lambda r: _stage_plan(cfg, r))
    params = list({id(p): p for m in modules for p in m.parameters()}.values())
    zero = lay.get("zero_stage", 0)
    dp_group = mesh["dp"].get_group()
    opt = build_optimizer(cfg, params, dp_group, hsdp)
    mbs, m_count, V = lay["micro_batch_size"], lay["num_micro_batches"], cfg.transformer().vocab_size

    loss_fn, loss_ctx = make_loss(lay["tp"], mesh, V)
    sched = make_schedule(cfg, plan, modules, mesh, device, loss_fn)
    meter = SavedActivationMeter({k[0] for p in params if (k := storage_key(p)) is not None})
    measured: dict = {}

    def train_step(step: int, measure: bool):
        if cfg.fail_rank == rank:
            os._exit(3)  # tests: a rank that dies
        x, y = training_batch(cfg, step, dp_rank, device)
        ctx = torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack) if measure else _null()
        with ctx, metering(meter if measure else None), loss_ctx():
            if sched is not None:
                run_schedule(sched, plan, x, y)
            else:
                for i in range(m_count):
                    loss_fn(modules[0](x[i * mbs:(i + 1) * mbs]), y[i * mbs:(i + 1) * mbs]).backward()
        sync_tied_gradients(modules, tied_group)
        if zero <= 1 and dp > 1:
            average_gradients(params, dp_group, dp)
        if measure:
            measured["gradient_bytes"] = _nbytes([p.grad for p in params])
        opt.step()
        opt.zero_grad()

    step_times = timed_steps(cfg, train_step, cuda)
    report = {
        "rank": rank, "pp_rank": pp_rank, "dp_rank": dp_rank, "tp_rank": mesh["tp"].get_local_rank(),
        "stages": plan.my_stages, "layers": [mm.layer_ids for mm in modules],
        "step_seconds": step_times, "median_step_seconds": statistics.median(step_times),
        "parameter_bytes": _nbytes(params), "gradient_bytes": measured["gradient_bytes"],
        "optimizer_state_bytes": optimizer_state_bytes(opt), "optimizer": cfg.optimizer,
        "saved_activation_peak_bytes": meter.peak, **_device_report(device),
    }
    if cfg.measure_collectives:
        report["collectives"] = measure_collectives(mesh, cfg.transformer(), cfg, device, getattr(torch, cfg.dtype))
    if cfg.collect_params:
        report["params"] = full_params(modules)
    dist.barrier()
    return report


def training_batch(cfg: BenchConfig, step: int, dp_rank: int, device):
    """This DP rank's share of the step's tokens and targets (the same global batch on every layout)."""
    lay = cfg.layout
    rows = lay["num_micro_batches"] * lay["micro_batch_size"]
    V = cfg.transformer().vocab_size
    g = torch.Generator().manual_seed(cfg.seed * 1000 + step)
    tokens = torch.randint(0, V, (lay["dp"] * rows, cfg.seq_length), generator=g)
    targets = torch.randint(0, V, (lay["dp"] * rows, cfg.seq_length), generator=g)
    lo = dp_rank * rows
    return tokens[lo:lo + rows].to(device), targets[lo:lo + rows].to(device)


def run_schedule(sched, plan: _Plan, x, y) -> None:
    has_first, has_last = 0 in plan.my_stages, (plan.n_stages - 1) in plan.my_stages
    if has_first and has_last:
        sched.step(x, target=y, losses=[])
    elif has_first:
        sched.step(x)
    elif has_last:
        sched.step(target=y, losses=[])
    else:
        sched.step()


def step_plan(warmup: int, steps: int) -> list[tuple[bool, bool]]:
    """(counts saved activations, timed) for each step the benchmark runs.

    The first step initialises: torch.distributed.pipelining (torch 2.13) runs each stage once on real, empty
    tensors to infer shapes, with grad enabled, and keeps the stage's outputs, and so that pass's saved tensors,
    alive through the step (one micro-batch's activations more on the first stage). Steady-state memory is
    therefore counted on an untimed step after the first (hooks cost time): the last warm-up step when there are
    two or more, else one more untimed step after the only warm-up step. With no warm-up, the first timed step."""
    if warmup == 0:
        return [(i == 0, True) for i in range(steps)]
    warm = max(warmup, 2)
    return [(i == warm - 1, False) for i in range(warm)] + [(False, True)] * steps


def timed_steps(cfg: BenchConfig, train_step, cuda: bool) -> list[float]:
    """Run the steps of `step_plan`; the step times of the timed ones. CUDA peak statistics cover every step after
    the first (the first initialises, see `step_plan`), the same steady state as the saved-activation count."""
    times = []
    for step, (measure, is_timed) in enumerate(step_plan(cfg.warmup, cfg.steps)):
        if cuda and step == min(1, cfg.warmup):
            torch.cuda.reset_peak_memory_stats()
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        train_step(step, measure=measure)
        if cuda:
            torch.cuda.synchronize()
        if is_timed:
            times.append(time.perf_counter() - t0)
    return times


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
        if m.tied and m.first and m.last:  # one parameter, listed once by named_parameters
            out["output.weight"] = out["embed.weight"]
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


def _report_complete(out_dir: str, rank: int) -> bool:
    """Whether a rank wrote its whole report (and no error): its work and its collectives are done."""
    if os.path.exists(os.path.join(out_dir, f"rank{rank}.error")):
        return False
    try:
        with open(os.path.join(out_dir, f"rank{rank}.json")) as fh:
            json.load(fh)
    except (OSError, ValueError):
        return False
    return True


def _failed(out_dir: str, rank: int, code: int | None) -> bool:
    """A rank that exited non-zero, unless a signal killed it after its report was complete: a rank has aborted in
    its teardown (gloo's threads, the interpreter's exit: ../shared/reference/cpu-notes.md; 'malloc(): unaligned
    tcache chunk detected' in CI) with its work done, and that run's reports stand."""
    if code in (0, None):
        return False
    return not (code < 0 and _report_complete(out_dir, rank))


def _reports_complete(out_dir: str, nproc: int) -> bool:
    """Whether every rank wrote its whole report: the run's work is done, whatever its teardown still does."""
    names = [os.path.join(out_dir, f"rank{r}.json") for r in range(nproc)]
    return all(os.path.exists(n) for n in names) and all(_report_complete(out_dir, r) for r in range(nproc))


def _first_failure(procs: list, deadline: float, out_dir: str) -> tuple[int, int | None] | None:
    """Wait until every rank has exited or written its whole report, one fails (its (rank, exit code); _failed) or
    the deadline passes. A rank stuck in its teardown after its report (gloo waiting on a peer that aborted there,
    _failed) does not hold the run: the caller stops it."""
    failed = None
    while any(p.is_alive() for p in procs):
        for r, p in enumerate(procs):
            if not p.is_alive() and failed is None and _failed(out_dir, r, p.exitcode):
                failed = (r, p.exitcode)
        if failed or time.monotonic() > deadline or _reports_complete(out_dir, len(procs)):
            break
        time.sleep(0.05)
    return failed


def _stop_all(procs: list) -> None:
    """Terminate the ranks still running, then kill any that ignore it for 5 s."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()


def _rank_failure(out_dir: str, rank: int, code: int | None) -> str:
    """A failed rank's message, with the error it wrote before it exited."""
    err = os.path.join(out_dir, f"rank{rank}.error")
    detail = open(err).read() if os.path.exists(err) else ""
    return f"rank {rank} failed (exit {code}){': ' + detail if detail else ''}; the other ranks were stopped"


def _read_reports(out_dir: str, nproc: int) -> list[dict]:
    reports = []
    for r in range(nproc):
        with open(os.path.join(out_dir, f"rank{r}.json")) as fh:
            reports.append(json.load(fh))
    return reports


@contextlib.contextmanager
def _ranks_stopped_on_interrupt(procs: list):
    """While the ranks run, SIGTERM or Ctrl-C to this process alone stops them before it exits: the ranks are not
    daemons (they start process groups of their own), so a parent killed by SIGTERM left them training, and one
    interrupted waited at exit to join them (audit of 2026-12-08). SIGTERM is raised as KeyboardInterrupt here
    (the main thread only: signal handlers can be set nowhere else)."""
    import signal
    import threading

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, interrupted) if main else None
    try:
        yield
    except KeyboardInterrupt:
        _stop_all(procs)
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def run_ranks(fn, args, nproc: int, timeout_seconds: float) -> list[dict]:
    """Start `nproc` ranks running fn(rank, world, args, init_method) (fn a module-level function, args picklable),
    rendezvous on 127.0.0.1. If a rank exits non-zero the others are stopped at once; the whole run is bounded by
    twice the process-group timeout. Raises BenchmarkError on any failure.

    The ranks are forked from a forkserver, a fresh process that has only imported torch and this module, not from
    the calling process, whose runtime state (torch's thread pools, OpenMP, earlier process groups, a test runner's
    threads) a plain fork copies: a rank forked from the test process once died in CI with 'malloc(): unaligned
    tcache chunk detected' [U: root cause not isolated]. It costs about 0.5 s per run more than a plain fork. The
    same abort came back once from a forkserver rank (2026-12-06): a rank a signal kills after its report is
    complete counts as finished (_failed); one killed before it fails the run as before."""
    import multiprocessing as mp
    import tempfile

    from planner.errors import BenchmarkError

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", __name__])
    init = f"tcp://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="planner-bench-") as out_dir:
        procs = [ctx.Process(target=_child, args=(r, nproc, fn, args, init, out_dir)) for r in range(nproc)]
        with _ranks_stopped_on_interrupt(procs):
            for p in procs:
                p.start()
            failed = _first_failure(procs, time.monotonic() + timeout_seconds * 2 + 30, out_dir)
        timed_out = any(p.is_alive() for p in procs) and failed is None and not _reports_complete(out_dir, nproc)
        _stop_all(procs)
        if failed is None and not timed_out:
            bad = [(r, p.exitcode) for r, p in enumerate(procs) if _failed(out_dir, r, p.exitcode)]
            failed = bad[0] if bad else None
        if timed_out:
            raise BenchmarkError(f"ranks still running after {timeout_seconds * 2 + 30:.0f} s; all were stopped")
        if failed is not None:
            raise BenchmarkError(_rank_failure(out_dir, *failed))
        return _read_reports(out_dir, nproc)


def launch_local(cfg: BenchConfig, nproc: int) -> list[dict]:
    return run_ranks(worker, cfg, nproc, cfg.timeout_seconds)


def reference_params(cfg: BenchConfig) -> dict[str, list]:
    """The same training, single process, no parallelism: the numerics every layout must reproduce."""
    torch.set_num_threads(1)
    shape = cfg.transformer()
    lay = cfg.layout
    dtype = getattr(torch, cfg.dtype)
    model = StageModule(shape, cfg.seq_length, list(range(shape.num_layers)), first=True, last=True, seed=cfg.seed).to(dtype)
    opt = make_optimizer(cfg.optimizer, list(model.parameters()), lr=cfg.learning_rate, eps=cfg.adam_eps,
                         **cfg.moment_dtypes)
    dp, m_count, mbs, V = lay["dp"], lay["num_micro_batches"], lay["micro_batch_size"], shape.vocab_size
    loss_fn, _ = make_loss(1, None, V)
    for step in range(len(step_plan(cfg.warmup, cfg.steps))):
        g = torch.Generator().manual_seed(cfg.seed * 1000 + step)
        tokens = torch.randint(0, V, (dp * m_count * mbs, cfg.seq_length), generator=g)
        targets = torch.randint(0, V, (dp * m_count * mbs, cfg.seq_length), generator=g)
        for r in range(dp):
            for i in range(m_count):
                lo = (r * m_count + i) * mbs
                logits = model(tokens[lo:lo + mbs])
                loss = loss_fn(logits, targets[lo:lo + mbs]) / dp
                loss.backward()
        opt.step()
        opt.zero_grad()
    out = {name: p.detach().double().tolist() for name, p in model.named_parameters()}
    if model.tied:  # the distributed run holds the tied weight as two synchronised copies (pp > 1)
        out["output.weight"] = out["embed.weight"]
    return out


def max_param_error(params: dict[str, list], ref: dict[str, list]) -> float:
    worst = 0.0
    for name, value in params.items():
        a, b = torch.tensor(value), torch.tensor(ref[name])
        worst = max(worst, float((a - b).abs().max() / (b.abs().max() + 1e-12)))
    missing = set(ref) - set(params)
    if missing:
        raise KeyError(f"parameters missing from the distributed run: {sorted(missing)[:5]}")
    return worst

