"""torch as ground truth for the cost models: parameter counts, FLOPs, bytes saved for backward.

Tolerances are the issue's: FLOPs within 1%, saved bytes within 5%, parameter counts exact. What remains
between torch and the formulas is the fp32 LayerNorm/RMSNorm statistics (8-16 bytes per token), which
Korthikanti et al. 2022 ignore.
"""

import pytest

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from cost_models.compute import layer_forward_flops, parameter_counts  # noqa: E402
from cost_models.memory import activation_bytes_per_layer  # noqa: E402
from planner.bench.model import RMSNorm, build_model, saved_activation_bytes  # noqa: E402
from planner.inputs.models import load_model  # noqa: E402
from tests.conftest import gpt_shape  # noqa: E402

pytestmark = pytest.mark.torch
torch.set_num_threads(1)


def llama_shape(**kw):
    base = dict(hidden_size=256, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=688, swiglu=True,
                rms_norm=True, flash_attention=True, dropout=False, bias=False, learned_position_embeddings=False)
    base.update(kw)
    return gpt_shape(**base)


@pytest.mark.parametrize("name", ["gpt3-175b", "llama3-8b", "llama3-405b", "gpt-neox-20b", "bloom-176b", "gpt2-1.5b"])
def test_parameter_count_matches_torch(name):
    spec = load_model(name)
    shape = spec.to_cost_model(seq_length=2048)
    model = build_model(shape, seq_length=8, device="meta")
    got = sum(p.numel() for p in model.parameters())  # tied weights are one Parameter, counted once
    assert got == parameter_counts(shape).total == spec.parameter_counts()["total"]


def test_named_parameter_counts():
    # the two anchors: GPT-3 175B ~174.6e9 (Narayanan Eq. 2), Llama 3 8B 8.03e9 (Meta's model card)
    assert round(load_model("gpt3-175b").parameter_counts()["total"] / 1e9, 1) == 174.6
    assert round(load_model("llama3-8b").parameter_counts()["total"] / 1e9, 2) == 8.03


@pytest.mark.parametrize("kind", ["gpt-standard", "gpt-flash", "llama-flash", "llama-standard"])
def test_flop_counter_matches_closed_form(kind):
    if kind.startswith("gpt"):
        shape = gpt_shape(num_layers=1, flash_attention=kind.endswith("flash"), dropout=False)
    else:
        shape = llama_shape(num_layers=1, hidden_size=8192, num_attention_heads=64, num_kv_heads=8,
                            ffn_hidden_size=28672, flash_attention=kind.endswith("flash"))
    s, b = 2048, 1
    model = build_model(shape, seq_length=s, num_layers=1, device="meta", dtype=torch.bfloat16)
    block = model.layers[0]
    with torch.device("meta"):
        x = torch.randn(b, s, shape.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        block(x).sum().backward()
    gemm, core = layer_forward_flops(shape, tokens=b * s, seq_length=s)
    assert counter.get_total_flops() == pytest.approx(3 * (gemm + core), rel=0.01)


CASES = [
    ("gpt, standard attention, dropout", dict(flash_attention=False, dropout=True), "meta"),
    ("gpt, standard attention, no dropout", dict(flash_attention=False, dropout=False), "meta"),
    ("gpt, flash attention", dict(flash_attention=True, dropout=False), "cpu"),
    ("llama, flash attention (GQA)", "llama-flash", "cpu"),
    ("llama, standard attention (GQA)", "llama-standard", "meta"),
]


def _shape(case):
    if case == "llama-flash":
        return llama_shape()
    if case == "llama-standard":
        return llama_shape(flash_attention=False)
    return gpt_shape(hidden_size=256, num_attention_heads=4, num_kv_heads=4, ffn_hidden_size=1024, **case)


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("title,case,device", CASES)
def test_saved_bytes_match_activation_model(title, case, device, recompute):
    shape = _shape(case)
    s, b = 128, 2
    model = build_model(shape, seq_length=s, num_layers=1, device=device, dtype=torch.bfloat16)
    block = model.layers[0]
    with torch.device(device):
        x = torch.randn(b, s, shape.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    exclude = tuple(block.parameters()) + tuple(block.buffers())
    if recompute == "full":
        from torch.utils.checkpoint import checkpoint

        def run(inp):
            return checkpoint(block, inp, use_reentrant=False)
    else:
        run = block
    got, _ = saved_activation_bytes(run, x, exclude=exclude)
    want = activation_bytes_per_layer(shape, seq_length=s, micro_batch_size=b, recompute=recompute)
    assert got == pytest.approx(want, rel=0.05), title


def test_fused_rmsnorm_matches_torch():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    ours = RMSNorm(16).double()
    ref = torch.nn.RMSNorm(16, eps=1e-5).double()
    with torch.no_grad():
        ours.weight.copy_(torch.rand(16, dtype=torch.float64) + 0.5)
        ref.weight.copy_(ours.weight)
    g = torch.randn(3, 5, 16, dtype=torch.float64)
    (ours(x) * g).sum().backward()
    gx, gw = x.grad.clone(), ours.weight.grad.clone()
    x.grad = None
    (ref(x) * g).sum().backward()
    assert torch.allclose(gx, x.grad, atol=1e-10) and torch.allclose(gw, ref.weight.grad, atol=1e-10)


@pytest.mark.parametrize("case", ["llama-flash", "gpt-flash"])
def test_per_op_sac_saved_bytes_match_torch(case):
    """torchtitan's per-op SAC (frameworks.md §1.5) run through torch's own selective checkpointing with the policy
    `planner bench` runs (planner.bench.recompute.op_sac_policy: mm and SDPA outputs must-saved except every 2nd
    mm of the block; the CPU flash SDPA op stands for the CUDA one torchtitan's list names). What torch keeps (the
    region input through autograd's saved-tensor hooks, the must-save outputs in SAC's cache) equals
    cost_models/op_sac.py's save set."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from cost_models import op_sac
    from planner.bench.recompute import cached_tensors, op_sac_policy

    shape = llama_shape() if case == "llama-flash" else gpt_shape(
        hidden_size=256, num_attention_heads=4, num_kv_heads=4, ffn_hidden_size=1024, flash_attention=True,
        dropout=False, bias=False)  # torchtitan's linears have no bias: aten.mm (a biased one is addmm)
    s, b = 128, 2
    block = build_model(shape, seq_length=s, num_layers=1, device="cpu", dtype=torch.bfloat16).layers[0]
    x = torch.randn(b, s, shape.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    modes = []

    def context_fn():
        contexts = create_selective_checkpoint_contexts(op_sac_policy())
        modes.append(contexts[1])
        return contexts

    hooked, out = saved_activation_bytes(lambda t: checkpoint(block, t, use_reentrant=False, context_fn=context_fn),
                                         x, exclude=tuple(block.parameters()) + tuple(block.buffers()))
    cached = sum(t.untyped_storage().nbytes() for t in cached_tensors(modes[0]))
    assert hooked == 2 * s * b * shape.hidden_size  # the region's input
    assert hooked + cached == op_sac.saved_bytes_per_layer(shape, seq_length=s, micro_batch_size=b)
    out.sum().backward()  # the policy recomputes what it did not save
    assert x.grad is not None and x.grad.shape == x.shape
