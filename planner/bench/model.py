"""GPT- and Llama-style transformers in torch, built from a cost-model `Transformer` shape.

Used three ways: by the tests as ground truth (parameter count, FLOP counter, bytes saved for backward),
by `planner bench` as the model it trains, and by `planner calibrate` for GEMM shapes. Written so that
what autograd saves matches what Megatron keeps (cost_models.memory.activation_bytes_per_layer):
separate q/k/v projections (so TP can shard them by heads), dropout via torch.native_dropout (a 1-byte
mask, as on GPU), an additive causal bias (saves no mask), the score scale applied after Q K^T.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial
from torch.utils.checkpoint import checkpoint

from cost_models.inputs import Transformer


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm that saves what fused kernels (Apex, Transformer Engine) save: its input and the fp32 rstd.

    torch's nn.RMSNorm on CPU decomposes into an fp32 upcast and saves fp32 copies, which no GPU training
    stack keeps. Numerics equal nn.RMSNorm's (tests/test_torch_ground_truth.py checks the gradients).
    """

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        g = grad_out.float() * weight.float()
        grad_x = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        grad_w = (grad_out.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
        return grad_x.to(x.dtype), grad_w.to(weight.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, DTensor):  # sequence or tensor parallel
            # the fused function on this rank's tokens; over sequence shards the weight's gradient is a partial
            # sum (Partial), reduced when the optimizer reads it (planner.bench.optim.local_grad)
            w: torch.Tensor = self.weight
            if isinstance(w, DTensor):
                sharded = any(p.is_shard() for p in x.placements)
                w = w.to_local(grad_placements=[Partial()] if sharded else None)
            out = _RMSNormFunction.apply(x.to_local(), w, self.eps)
            return DTensor.from_local(out, x.device_mesh, x.placements, run_check=False)
        if type(x) is not torch.Tensor:  # another tensor subclass (a functional collective's result): plain ops
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight
        return _RMSNormFunction.apply(x, self.weight, self.eps)


def _norm(shape: Transformer) -> nn.Module:
    if shape.rms_norm:
        return RMSNorm(shape.hidden_size, eps=1e-5)
    return nn.LayerNorm(shape.hidden_size)


class Attention(nn.Module):
    causal_bias: torch.Tensor  # a buffer, registered without flash attention

    def __init__(self, shape: Transformer, *, dropout_p: float, seq_length: int):
        super().__init__()
        h, d = shape.hidden_size, shape.head_dim
        self.head_dim = d
        self.n_kv = shape.num_kv_heads
        self.n_heads = shape.num_attention_heads
        self.flash = shape.flash_attention
        self.dropout_p = dropout_p
        self.recompute_core = False  # set by planner.bench.recompute (Megatron's selective)
        self.wq = nn.Linear(h, shape.num_attention_heads * d, bias=shape.bias)
        self.wk = nn.Linear(h, shape.num_kv_heads * d, bias=shape.bias)
        self.wv = nn.Linear(h, shape.num_kv_heads * d, bias=shape.bias)
        self.wo = nn.Linear(shape.num_attention_heads * d, h, bias=shape.bias)
        if not self.flash:
            bias = torch.full((seq_length, seq_length), float("-inf")).triu(1)
            self.register_buffer("causal_bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.head_dim
        # -1 heads: under tensor parallelism each rank holds its share of the heads
        q = self.wq(x).view(b, s, -1, d).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, d).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, d).transpose(1, 2)
        if self.recompute_core:  # Megatron's selective recompute: the core runs again in backward
            o = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            o = self.core(q, k, v)
        o = o.transpose(1, 2).reshape(b, s, -1)
        return self.wo(o)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention core, (b, heads, s, d) in and out: Q K^T, causal softmax, dropout, P V (or fused SDPA)."""
        s, d = q.shape[2], self.head_dim
        if self.flash:
            gqa = q.shape[1] != k.shape[1]
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        if q.shape[1] != k.shape[1]:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        probs = torch.softmax(scores + self.causal_bias[:s, :s].to(scores.dtype), dim=-1)
        if self.training and self.dropout_p > 0:
            probs = torch.native_dropout(probs, self.dropout_p, True)[0]
        return probs @ v


class MLP(nn.Module):
    def __init__(self, shape: Transformer):
        super().__init__()
        h, f = shape.hidden_size, shape.ffn_hidden_size
        self.swiglu = shape.swiglu
        self.squared_relu = shape.squared_relu
        self.w1 = nn.Linear(h, f, bias=shape.bias)
        self.w2 = nn.Linear(f, h, bias=shape.bias)
        if self.swiglu:
            self.w3 = nn.Linear(h, f, bias=shape.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        if self.squared_relu:
            return self.w2(F.relu(self.w1(x)).square())
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """Pre-norm transformer layer (GPT-2/3 and Llama order)."""

    def __init__(self, shape: Transformer, *, seq_length: int, dropout_p: float = 0.1):
        super().__init__()
        self.dropout_p = dropout_p if shape.dropout else 0.0
        self.norm1 = _norm(shape)
        self.attn: nn.Module = Attention(shape, dropout_p=self.dropout_p, seq_length=seq_length)  # or checkpointed
        self.norm2 = _norm(shape)
        self.mlp: MLP = MLP(shape)

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.dropout_p > 0:
            return torch.native_dropout(x, self.dropout_p, True)[0]
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._drop(self.attn(self.norm1(x)))
        return x + self._drop(self.mlp(self.norm2(x)))


class Transformer_(nn.Module):
    """Embedding (+ learned positions), layers, final norm, output layer (tied or not)."""

    def __init__(self, shape: Transformer, *, seq_length: int, num_layers: int | None = None, dropout_p: float = 0.1):
        super().__init__()
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.pos = (nn.Embedding(shape.max_position_embeddings, shape.hidden_size)
                    if shape.learned_position_embeddings else None)
        n = shape.num_layers if num_layers is None else num_layers
        self.layers = nn.ModuleList(Block(shape, seq_length=seq_length, dropout_p=dropout_p) for _ in range(n))
        self.norm = _norm(shape)
        self.output = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        if shape.tied_embeddings:
            self.output.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def build_model(shape: Transformer, *, seq_length: int, num_layers: int | None = None, dropout_p: float = 0.1,
                device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Transformer_:
    with torch.device(device):
        model = Transformer_(shape, seq_length=seq_length, num_layers=num_layers, dropout_p=dropout_p)
    return model.to(dtype=dtype)


def saved_activation_bytes(fn, *args, exclude: tuple[torch.Tensor, ...] = ()) -> tuple[int, Any]:
    """(bytes autograd saves for backward while running fn(*args), de-duplicated by storage; fn's result).

    Parameters, buffers and inputs passed in `exclude` do not count. Storages are told apart by their
    StorageImpl pointer (on the meta device every data pointer is 0).
    """
    excluded = {t.untyped_storage()._cdata for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        st = t.untyped_storage()
        key = st._cdata
        if key not in excluded:
            seen[key] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return sum(seen.values()), out
