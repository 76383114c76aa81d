"""The optimizers the benchmark trains with (torch imported here).

The default is the recipe large-model training runs (ZeRO paper §3.1, "mixed-precision Adam", K = 12): parameters
and gradients in the compute dtype (bf16/fp16, 2 + 2 bytes), an fp32 master copy of every parameter and fp32 Adam
moments (4 + 4 + 4 bytes). `MasterAdamW` implements it for ZeRO-0 and (per owned shard) ZeRO-1; under FSDP2 the
sharded fp32 parameters *are* the master copy (MasterAdamW then keeps no extra copy).

SGD with momentum stays as an explicit option: the distributed numerics tests compare it, in fp32, against a
single-process reference.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 26  # the fp32 copy of a gradient is made this many elements at a time (256 MiB transient)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def local_grad(p):
    """This rank's gradient of p, laid out as p's own local shard. (Under TP a DTensor gradient can come back with
    another placement than its parameter, e.g. a norm weight's as Partial over sequence shards (planner.bench.model
    RMSNorm): it is redistributed, in place on p.grad, to the parameter's placement first.)"""
    g = p.grad
    if hasattr(g, "placements") and tuple(g.placements) != tuple(p.placements):
        g = g.redistribute(p.device_mesh, p.placements)
        p.grad = g
    return _local(g)


class MasterAdamW:
    """AdamW (Loshchilov & Hutter, decoupled weight decay; torch.optim.AdamW's update) on fp32 master weights.

    For each parameter: an fp32 master (the parameter itself when it already is fp32) and fp32 moments. A step
    reads the low-precision gradient in chunks, updates master and moments in fp32, and writes the master back
    into the low-precision parameter. Works on DTensor parameters through their local shards.
    """

    def __init__(self, params, *, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.1, exp_avg_dtype: torch.dtype = torch.float32,
                 exp_avg_sq_dtype: torch.dtype = torch.float32):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.step_count = 0
        self.master = []
        self.exp_avg = []
        self.exp_avg_sq = []
        for p in self.params:
            local = _local(p.data)
            master = local if local.dtype == torch.float32 else local.detach().float().clone()
            self.master.append(master)
            self.exp_avg.append(torch.zeros_like(master, dtype=exp_avg_dtype))
            self.exp_avg_sq.append(torch.zeros_like(master, dtype=exp_avg_sq_dtype))

    @torch.no_grad()
    def step(self) -> None:
        self.step_count += 1
        b1, b2 = self.betas
        bias1 = 1 - b1 ** self.step_count
        bias2 = 1 - b2 ** self.step_count
        step_size = self.lr / bias1
        for p, master, m, v in zip(self.params, self.master, self.exp_avg, self.exp_avg_sq, strict=True):
            if p.grad is None:
                continue
            grad = local_grad(p).reshape(-1)
            flat, fm, fv = master.view(-1), m.view(-1), v.view(-1)
            for lo in range(0, flat.numel(), CHUNK_ELEMENTS):
                hi = min(flat.numel(), lo + CHUNK_ELEMENTS)
                g = grad[lo:hi].float()
                w = flat[lo:hi]
                w.mul_(1 - self.lr * self.weight_decay)
                # moments below fp32 are updated in fp32, a chunk at a time, and stored back rounded (the
                # precision-aware optimizer's arithmetic); fp32 ones in place
                m32, v32 = fm[lo:hi].float(), fv[lo:hi].float()
                m32.lerp_(g, 1 - b1)
                v32.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (v32 / bias2).sqrt_().add_(self.eps)
                w.addcdiv_(m32, denom, value=-step_size)
                if m32.data_ptr() != fm[lo:hi].data_ptr():
                    fm[lo:hi].copy_(m32)
                if v32.data_ptr() != fv[lo:hi].data_ptr():
                    fv[lo:hi].copy_(v32)
            local = _local(p.data)
            if master.data_ptr() != local.data_ptr():
                local.copy_(master)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_bytes(self) -> int:
        """fp32 master copies (where they are copies) + both moments at their element size, on this rank."""
        total = 0
        for p, master, m, v in zip(self.params, self.master, self.exp_avg, self.exp_avg_sq, strict=True):
            copy = master.data_ptr() != _local(p.data).data_ptr()
            total += (master.numel() * 4 if copy else 0) + m.numel() * m.element_size() + v.numel() * v.element_size()
        return total


def sgd(params, *, lr: float):
    """SGD with momentum 0.9 (the numerics tests' optimizer)."""
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def optimizer_state_bytes(opt) -> int:
    """Bytes of the optimizer's state held by this rank (moments; MasterAdamW adds its fp32 master copies)."""
    if hasattr(opt, "state_bytes"):
        return opt.state_bytes()
    return sum(_local(v).numel() * _local(v).element_size() for st in opt.state.values() for v in st.values()
               if torch.is_tensor(v) and _local(v).dim() > 0)


# the moment dtypes the benchmark keeps (BenchConfig.exp_avg_dtype / exp_avg_sq_dtype: torch names); fp8 moments need
# a per-tensor scale the benchmark does not implement
MOMENT_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def make_optimizer(name: str, params, *, lr: float, eps: float = 1e-8, exp_avg_dtype: str = "float32",
                   exp_avg_sq_dtype: str = "float32"):
    """`adamw` (mixed precision with fp32 masters; moments in the dtypes given) or `sgd` (momentum), over these
    (local) parameters."""
    if name == "sgd":
        if (exp_avg_dtype, exp_avg_sq_dtype) != ("float32", "float32"):
            raise ValueError("optimizer: sgd keeps an fp32 momentum buffer -> moments below fp32 need adamw")
        return sgd(params, lr=lr)
    if name == "adamw":
        return MasterAdamW(params, lr=lr, eps=eps, exp_avg_dtype=getattr(torch, exp_avg_dtype),
                           exp_avg_sq_dtype=getattr(torch, exp_avg_sq_dtype))
    raise ValueError(f"optimizer: {name!r} -> allowed: adamw, sgd")

