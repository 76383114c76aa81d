"""torch as ground truth for the memory at the model's head: what the loss holds per logit, and which FSDP unit
stays gathered across it.

torchtitan's loss is F.cross_entropy on the fp32-cast logits; with TP it runs on the vocabulary-sharded logits inside
torch's loss_parallel(). What each keeps from forward to backward and what it holds at its peak, per (local) logit,
are the constants the memory model charges (cost_models/memory.py TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT,
TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT, loss_saved_bytes_per_logit). Measured with torch's MemTracker (live tensor
bytes by storage, on CPU: which tensors are alive together does not depend on the device); loss_parallel on two
real gloo ranks. Tolerance 2%: the per-row statistics (max, log-sum-exp, the targets) are O(rows), not O(logits).
FSDP: torch's fully_shard on two gloo ranks, a unit per layer then the root, as torchtitan and the benchmark wrap a
model; after forward the layer units are resharded and the root unit (the output head) is still gathered, as
cost_models/stage.py fsdp_head_unit_params charges it.
"""

import contextlib
import os

import pytest

torch = pytest.importorskip("torch")

from cost_models.memory import (  # noqa: E402
    TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT,
    TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT,
    loss_saved_bytes_per_logit,
)

pytestmark = pytest.mark.torch
os.environ.setdefault("OMP_NUM_THREADS", "1")
_WARNINGS = "ignore:FSDP2-wrapped module"  # the toy units return views; nothing here writes into them

ROWS, VOCAB = 1024, 8192  # tokens x vocabulary: 8 Mi logits (32 MiB in fp32)


def _live(tracker) -> float:
    return sum(tracker.get_tracker_snapshot("current")[torch.device("cpu")][k] for k in ("Activation", "Temp"))


def loss_bytes_per_logit(world: int = 1, mesh=None) -> tuple[float, float]:
    """(bytes kept after the loss's forward, bytes at its peak), per local logit, of torchtitan's loss:
    cross_entropy(pred.flatten(0, 1).float(), labels) with `del pred` before backward (its train_step), on
    vocabulary-sharded logits under loss_parallel when `mesh` is given."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel

    torch.manual_seed(0)
    labels = torch.randint(0, VOCAB, (ROWS,))
    leaf = torch.randn(ROWS, VOCAB // world, dtype=torch.bfloat16, requires_grad=True)
    tracker = MemTracker()
    with tracker, (loss_parallel() if mesh is not None else contextlib.nullcontext()):
        logits = leaf * 1  # the output projection's 16-bit logits, produced inside the step
        pred = DTensor.from_local(logits, mesh, [Shard(1)]) if mesh is not None else logits
        del logits
        loss = torch.nn.functional.cross_entropy(pred.float(), labels)
        del pred
        kept = _live(tracker)
        loss.backward()
        snap = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    peak = snap["Activation"] + snap["Temp"]
    return kept / leaf.numel(), peak / leaf.numel()


def _sharded_worker(rank: int, world: int, _args, init_method: str) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        kept, peak = loss_bytes_per_logit(world, init_device_mesh("cpu", (world,)))
    finally:
        dist.destroy_process_group()
    return {"rank": rank, "kept": kept, "peak": peak}


def test_torch_cross_entropy_bytes_per_logit():
    """Unsharded: log_softmax keeps its fp32 output (4 B); at its backward the fp32 incoming and input gradients
    join it (12 B)."""
    kept, peak = loss_bytes_per_logit()
    assert kept == pytest.approx(loss_saved_bytes_per_logit(TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT), rel=0.02)
    assert peak == pytest.approx(TORCH_CROSS_ENTROPY_PEAK_BYTES_PER_LOGIT, rel=0.02)


@pytest.mark.distributed
def test_loss_parallel_bytes_per_local_logit_on_two_ranks():
    """Vocabulary-sharded on 2 gloo ranks under loss_parallel: the same 4 B kept, 16 B at the backward
    ((grad_input + exp(x)) * grad_output: the saved output, the zeroed gradient, exp of the output, their sum)."""
    from planner.bench.runner import run_ranks

    reports = run_ranks(_sharded_worker, None, 2, 120.0)
    for r in reports:
        assert r["kept"] == pytest.approx(
            loss_saved_bytes_per_logit(TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT), rel=0.02), r
        assert r["peak"] == pytest.approx(TORCH_LOSS_PARALLEL_PEAK_BYTES_PER_LOGIT, rel=0.02), r


def _fsdp_worker(rank: int, world: int, _args, init_method: str) -> dict:
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.LayerNorm(16),
                              nn.Linear(16, 64))
        layers = (model[1], model[2])
        for layer in layers:
            fully_shard(layer, mesh=mesh)  # reshard_after_forward=True, torchtitan's default without PP
        fully_shard(model, mesh=mesh)

        def gathered(m) -> bool:
            return m._get_fsdp_state()._fsdp_param_group.is_unsharded

        out = model(torch.randint(0, 64, (4, 8)))
        after_forward = {"root": gathered(model), "layers": [gathered(m) for m in layers]}
        out.float().logsumexp(-1).sum().backward()
        return {"rank": rank, **after_forward, "root_after_backward": gathered(model)}
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.filterwarnings(_WARNINGS)
def test_fsdp_root_unit_stays_gathered_from_forward_to_backward():
    from planner.bench.runner import run_ranks

    for r in run_ranks(_fsdp_worker, None, 2, 120.0):
        assert r["layers"] == [False, False], r  # resharded after their forward
        assert r["root"] is True, r  # the head's unit, gathered across the loss
        assert r["root_after_backward"] is False, r  # resharded once its backward is done
