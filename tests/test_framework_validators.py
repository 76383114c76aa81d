"""The exported configs through the frameworks' own validators, where they install on CPU within CI time.

- DeepSpeed 0.19.8 (`make test` installs it with DS_BUILD_OPS=0: pure Python, no kernels): every DeepSpeed JSON the
  exporter writes goes through `deepspeed.runtime.config.DeepSpeedConfig` with the plan's data-parallel size,
  which runs the batch-triad derivation and assertion, the ZeRO/offload/precision config models; a triad that
  `planner check` fails must fail there too.
- megatron-core 0.16.1 (the newest on the package index reachable here; `make test` installs it with --no-deps: it
  needs only torch, numpy and packaging): every Megatron export builds its TransformerConfig (or MLATransformerConfig)
  and DistributedDataParallelConfig, whose __post_init__ checks hold the uneven-pipeline, recompute, TP and MoE
  rules. Megatron-LM's own `validate_args` (megatron/training, not in the wheel) is not run; the exporter follows
  its rules as frameworks.md §2.3-2.7 records them (tests/test_roundtrip.py).
- torchtitan 0.3.0 (`make test` installs it with --no-deps; importing the package pulls the Hugging Face datasets
  stack and triton, so nothing imports it): every recipe the exporter writes has its imports resolved against
  torchtitan's source, its TrainingConfig/ParallelismConfig built with torchtitan's own dataclasses (config/
  configs.py, loaded from the file), and its pipeline split run through torchtitan's own `_get_pipeline_metadata`
  and `_generate_llm_fqn_per_model_part` (executed from distributed/pipeline_parallel.py's source).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_roundtrip import PLANS, _plan

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("deepspeed", reason="DeepSpeed not installed: `make test` installs it "
                                        "(DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.19.8)")

SCRIPT = r"""
import json, sys, os
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch.distributed as tdist
tdist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % sys.argv[1], rank=0, world_size=1)
import deepspeed.comm as dist
dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
from deepspeed.runtime.config import DeepSpeedConfig

class Grid:  # the model-parallel unit DeepSpeed asks for the data-parallel size
    def __init__(self, dp): self.dp = dp
    def get_data_parallel_world_size(self): return self.dp
    def get_model_parallel_world_size(self): return 1
    def get_data_parallel_group(self): return None

out = []
for case in json.loads(sys.stdin.read()):
    try:
        c = DeepSpeedConfig(case["config"], mpu=Grid(case["dp"]))
        out.append({"ok": True, "train": c.train_batch_size, "micro": c.train_micro_batch_size_per_gpu,
                    "ga": c.gradient_accumulation_steps, "zero": c.zero_optimization_stage,
                    "offload_param": str(c.zero_config.offload_param.device) if c.zero_config.offload_param else None,
                    "overlap_comm": c.zero_config.overlap_comm,
                    "bf16": c.bfloat16_config.enabled if hasattr(c, "bfloat16_config") else c.bfloat16_enabled})
    except Exception as exc:
        out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
print(json.dumps(out))
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _validate(cases: list[dict]) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(_free_port())], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_deepspeed_accepts_every_exported_config_and_rejects_a_bad_triad():
    from cluster_specs import SpecError
    from planner.integrations.exports import export

    cases, expect = [], []
    for name in PLANS:
        doc = _plan(name)
        for framework in (None, "megatron-deepspeed"):
            try:
                exp = export(doc, "deepspeed", framework=framework)
            except SpecError:
                continue  # refused with a reason (tests/test_roundtrip.py)
            lay = exp.layout
            cases.append({"config": json.loads(exp.text), "dp": lay.dp})
            expect.append((name, framework, lay))
    # overlap_comm left out: DeepSpeed's own default per stage, which `check` assumes (readers.ds_overlap)
    defaults = [{"config": {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
                            "zero_optimization": {"stage": s}}, "dp": 8} for s in (1, 2, 3)]
    bad = json.loads((ROOT / "tests/data/configs/deepspeed/zero1_bad_triad.json").read_text())
    results = _validate(cases + defaults + [{"config": bad, "dp": 8}])
    for (name, framework, lay), res in zip(expect, results, strict=False):
        assert res["ok"], (name, framework, res)
        assert (res["train"], res["micro"], res["ga"]) == (256, lay.micro_batch_size, lay.num_micro_batches)
        assert res["zero"] == lay.zero_stage
        assert (res["offload_param"] == "cpu") == (lay.offload == "optimizer+params")
        # the overlap each profile predicts with: DeepSpeed's ZeRO-1/2 with overlap_comm on (the export turns it on),
        # Megatron-DeepSpeed's with DeepSpeed's default (off below ZeRO-3)
        assert res["overlap_comm"] == (lay.zero_stage == 3 or (lay.zero_stage >= 1 and framework is None)), name
    assert [r["overlap_comm"] for r in results[len(cases):-1]] == [False, False, True]
    assert not results[-1]["ok"] and "train_batch_size is not equal" in results[-1]["error"]
    assert len(expect) >= 6


# ---- megatron-core 0.16.1: TransformerConfig / DistributedDataParallelConfig -----------------------------------------

MCORE_SCRIPT = r"""
import dataclasses, json, sys, warnings
warnings.simplefilter("ignore")
import torch
import torch.nn.functional as F
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.transformer.enums import LayerType
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

RENAME = {  # Megatron-LM's argument -> the core config field (training/arguments.py core_transformer_config_from_args)
    "tensor_model_parallel_size": "tensor_model_parallel_size", "num_experts": "num_moe_experts",
    "num_virtual_stages_per_pipeline_rank": "virtual_pipeline_model_parallel_size",
    "decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
    "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
    "fp8_format": "fp8", "qk_head_dim": "qk_head_dim", "qk_pos_emb_head_dim": "qk_pos_emb_head_dim",
}
out = []
for case in json.loads(sys.stdin.read()):
    args = case["args"]
    mla = args.pop("multi_latent_attention", False)
    cls = MLATransformerConfig if mla else TransformerConfig
    fields = {f.name for f in dataclasses.fields(cls)}
    ddp_fields = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    kw, ddp = {}, {}
    for name, value in args.items():
        key = RENAME.get(name, name)
        if key in fields:
            kw[key] = value
        if name in ddp_fields:
            ddp[name] = value
    if not args.get("group_query_attention"):
        kw.pop("num_query_groups", None)
    if args.get("swiglu"):
        kw.update(gated_linear_unit=True, activation_func=F.silu)
    if "moe_layer_freq" in kw:
        kw["moe_layer_freq"] = eval(kw["moe_layer_freq"])  # Megatron-LM parses this Python list expression too
    if isinstance(kw.get("recompute_modules"), str):
        kw["recompute_modules"] = kw["recompute_modules"].split()  # argparse nargs="*": a list
    dtype = torch.bfloat16 if args.get("bf16") else torch.float16 if args.get("fp16") else torch.float32
    kw.update(params_dtype=dtype, pipeline_dtype=dtype)
    if args.get("use_megatron_fsdp"):
        ddp.update(use_megatron_fsdp=True)
    try:
        c = cls(**kw)
        d = DistributedDataParallelConfig(**ddp)
        out.append({"ok": True, "tp": c.tensor_model_parallel_size, "pp": c.pipeline_model_parallel_size,
                    "vpp": c.virtual_pipeline_model_parallel_size, "first": c.num_layers_in_first_pipeline_stage,
                    "last": c.num_layers_in_last_pipeline_stage, "recompute": c.recompute_granularity,
                    "sp": c.sequence_parallel, "overlap_grad_reduce": d.overlap_grad_reduce,
                    "instances": d.num_distributed_optimizer_instances,
                    "overlap_param_gather": d.overlap_param_gather, "tp_comm_overlap": c.tp_comm_overlap,
                    "cp": c.context_parallel_size, "ep": c.expert_model_parallel_size, "fp8": c.fp8,
                    "experts": c.num_moe_experts, "recompute_modules": c.recompute_modules,
                    "layout_layers": None if c.pipeline_model_parallel_layout is None else
                    [sum(st.count(LayerType.decoder) for st in row) for row in c.pipeline_model_parallel_layout.layout]})
    except Exception as exc:
        out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
print(json.dumps(out))
"""


def _megatron_arg_dict(text: str) -> dict:
    """The exported command-line arguments as Megatron-LM's argparse names them (dashes -> underscores)."""
    import shlex

    args: dict = {}
    tokens = shlex.split("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    for i, tok in enumerate(tokens):
        if not tok.startswith("--"):
            continue
        value: object = True
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            raw = tokens[i + 1]
            value = int(raw) if raw.lstrip("-").isdigit() else float(raw) if raw.replace(".", "", 1).isdigit() else raw
        args[tok[2:].replace("-", "_")] = value
    return args


def test_megatron_core_accepts_every_exported_megatron_config():
    """Every Megatron export (the round-trip plans: uneven split, per-stage recompute, interleaving, distributed
    optimizer, Megatron-FSDP, offload; and the modern ones: CP, MoE/EP, MLA, FP8) builds megatron-core 0.16.1's own
    TransformerConfig and DistributedDataParallelConfig (their __post_init__ checks: the uneven-pipeline, recompute,
    TP-divisibility and MoE rules), and the config says what the plan says. A broken layout is refused there too."""
    pytest.importorskip("megatron.core", reason="megatron-core not installed: `make test` installs 0.16.1 (--no-deps)")
    from cluster_specs import SpecError
    from planner.integrations.exports import export

    cases, expect = [], []
    for name in PLANS:
        try:
            exp = export(_plan(name), "megatron")
        except SpecError:
            continue  # refused with a reason (tests/test_roundtrip.py)
        cases.append({"args": _megatron_arg_dict(exp.text)})
        expect.append((name, exp.layout))
    modern = _modern_megatron_exports()
    cases += [{"args": _megatron_arg_dict(text)} for _, text, _ in modern]
    bad = dict(cases[0]["args"], decoder_first_pipeline_num_layers=4, decoder_last_pipeline_num_layers=3,
               pipeline_model_parallel_size=4)  # 40 layers: 33 left for 2 middle stages -> refused
    cases.append({"args": bad})
    proc = subprocess.run([sys.executable, "-c", MCORE_SCRIPT], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for (name, _, want), res in zip(modern, results[len(expect):-1], strict=True):
        assert res["ok"], (name, res)
        assert {k: res[k] for k in want} == want, name
    for (name, lay), res in zip(expect, results[:len(expect)], strict=True):
        assert res["ok"], (name, res)
        assert (res["tp"], res["pp"]) == (lay.tp, lay.pp), name
        assert (res["vpp"] or 1) == (lay.virtual_stages if lay.schedule == "interleaved_1f1b" else 1), name
        assert res["sp"] == (lay.sequence_parallel and lay.tp > 1), name
        # the overlap the Megatron profile predicts with is switched on (Megatron-LM's defaults are off)
        assert res["overlap_grad_reduce"] == (lay.dp * lay.cp > 1), name  # Megatron reduces over DP x CP
        assert res["overlap_param_gather"] == (lay.dp * lay.cp > 1 and lay.zero_stage >= 1), name
        assert res["tp_comm_overlap"] == (lay.tp > 1 and lay.sequence_parallel), name
        # hybrid sharding: the partial distributed optimizer's instances (hsdp-zero1; hsdp-zero3 exports unsharded)
        assert res["instances"] == (lay.dp // lay.dp_shard if lay.hybrid_sharded else 1), name
    assert not results[-1]["ok"] and "pipeline" in results[-1]["error"].lower(), results[-1]
    assert [n for n, _ in expect] == [n for n in PLANS if n != "zero3-offload"]  # Megatron offloads no parameters


def _modern_megatron_exports() -> list[tuple[str, str, dict]]:
    """(name, exported arguments, what megatron-core must read back): long-context FP8 with CP, and DeepSeek-V3's
    MoE + MLA with EP (the layouts of tests/test_modern_exports.py)."""
    from test_modern_exports import _plan as modern_plan

    from planner.inputs.specs import LayoutSpec, TrainingSpec
    from planner.integrations.exports import export

    cp = export(modern_plan("llama3.1-405b", LayoutSpec(dp=8, tp=8, pp=16, cp=16, sequence_parallel=True, zero_stage=1,
                                                         num_micro_batches=2),
                            TrainingSpec(global_batch_size=16, seq_length=131072, precision="fp8",
                                         fp8_recipe="delayed")), "megatron").text
    moe = export(modern_plan("deepseek-v3", LayoutSpec(dp=64, pp=16, ep=64, zero_stage=1),
                             TrainingSpec(global_batch_size=64, seq_length=4096)), "megatron").text
    # selective on MLA recomputes the up-projections: Megatron-Bridge's DeepSeek-V3 B200 recipe
    # (recompute_modules=["mla_up_proj"]); MLATransformerConfig checks the module name against MLA
    up = export(modern_plan("deepseek-v3", LayoutSpec(dp=64, pp=16, ep=64, zero_stage=1, recompute="selective"),
                            TrainingSpec(global_batch_size=64, seq_length=4096)), "megatron").text
    return [("llama3.1-405b cp16 fp8", cp, {"cp": 16, "tp": 8, "pp": 16, "fp8": "hybrid"}),
            ("deepseek-v3 ep64 mla", moe, {"ep": 64, "pp": 16, "experts": 256}),
            ("deepseek-v3 ep64 mla_up_proj", up, {"ep": 64, "pp": 16, "recompute": "selective",
                                                  "recompute_modules": ["mla_up_proj"]})]


# ---- torchtitan 0.3.0: its config dataclasses and its own pipeline split ----------------------------------------------


def _torchtitan_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")  # a top-level find_spec runs nothing of the package
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torchtitan not installed: `make test` installs 0.3.0 (--no-deps)")
    return Path(list(spec.submodule_search_locations)[0])


def _top_level_names(path: Path) -> set[str]:
    import ast

    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
    return names


def _torchtitan_functions(root: Path) -> dict:
    """torchtitan's own `_get_pipeline_metadata` and `_generate_llm_fqn_per_model_part` (distributed/
    pipeline_parallel.py), executed from its source without importing the package (whose imports pull the Hugging
    Face datasets stack): their annotations are bound to placeholders, the pipelining schedules are torch's."""
    import ast
    import math
    import types

    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    src = (root / "distributed" / "pipeline_parallel.py").read_text()
    wanted = {"_get_pipeline_metadata", "_generate_llm_fqn_per_model_part"}
    nodes = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {n.name for n in nodes} == wanted, "torchtitan moved its pipeline split functions"
    space: dict = {"math": math, "get_schedule_class": get_schedule_class, "PipelineScheduleSingle":
                   PipelineScheduleSingle, "ParallelDims": object, "ParallelismConfig": object,
                   "BaseModel": types.SimpleNamespace(Config=object)}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), "pipeline_parallel.py", "exec"), space)
    return space


def _configs_module(root: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("torchtitan_configs", root / "config" / "configs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # dataclasses + torch only
    return module


def _recipe_calls(text: str) -> tuple[dict, list[tuple[str, list[str]]], object]:
    """(keyword literals per config call, the torchtitan imports, the activation_checkpoint expression)."""
    import ast

    tree = ast.parse(text)
    calls: dict = {}
    imports = [(n.module, [a.name for a in n.names]) for n in tree.body if isinstance(n, ast.ImportFrom)]
    ac = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("TrainingConfig", "ParallelismConfig"):
                calls[name] = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            for k in node.keywords:
                if k.arg == "activation_checkpoint":
                    ac = k.value
    return calls, imports, ac


def test_torchtitan_accepts_every_exported_recipe():
    """Every torchtitan 0.3 export: its imports name what torchtitan 0.3.0 defines; TrainingConfig and
    ParallelismConfig (torchtitan's own dataclasses, with their __post_init__ checks) accept its fields; the AC
    policy is one of torchtitan's; and torchtitan's own pipeline code, given the exported split, builds the stages
    the plan has (layers per stage, in stage order) — or the module names it lists exist in 0.3's Decoder."""
    import ast
    import types

    from cluster_specs import SpecError
    from planner.integrations.exports import export, torchtitan_stage_layers

    root = _torchtitan_root()
    configs, fns = _configs_module(root), _torchtitan_functions(root)
    decoder_src = (root / "models" / "common" / "decoder.py").read_text()
    checked = []
    for name in PLANS:
        try:
            exp = export(_plan(name), "torchtitan")
        except SpecError:
            continue  # refused with a reason (tests/test_roundtrip.py)
        lay, text = exp.layout, exp.text
        calls, imports, ac = _recipe_calls(text)
        for module, names in imports:
            base = root.parent / module.replace(".", "/")
            path = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
            assert path.exists(), (name, module)
            assert set(names) <= _top_level_names(path), (name, module, names)
        configs.TrainingConfig(**calls["TrainingConfig"])
        par = configs.ParallelismConfig(**calls["ParallelismConfig"])
        if lay.recompute == "none":
            assert isinstance(ac, ast.Constant) and ac.value is None, name
        else:
            assert isinstance(ac, ast.Call) and ac.func.attr == "Config", name
            assert ac.func.value.id == {"full": "FullAC", "selective": "SelectiveAC"}[lay.recompute], name
        if lay.pp > 1:
            L = 40  # llama2-13b
            if par.module_fqns_per_model_part is not None:
                parts = par.module_fqns_per_model_part
                attrs = {n.split(".")[0] for p in parts for n in p}
                assert all(f"self.{a} =" in decoder_src for a in attrs), (name, attrs)
            else:
                stages, layers, first, last = fns["_get_pipeline_metadata"](
                    types.SimpleNamespace(pp=lay.pp), par, types.SimpleNamespace(layers=[None] * L))
                parts = fns["_generate_llm_fqn_per_model_part"](stages, layers, first, last)
            counts = [sum(1 for n in p if n.startswith("layers.")) for p in parts]
            assert counts == torchtitan_stage_layers(lay, L), (name, counts)
            assert calls["TrainingConfig"]["local_batch_size"] % par.pipeline_parallel_microbatch_size == 0
        checked.append(name)
    assert len(checked) >= 4, checked


# ---- torchtitan 0.3.0: its own startup validation, run on each exported recipe -----------------------------------------

# Importing torchtitan.trainer pulls packages that do not install light on a CPU runner (the Hugging Face datasets
# stack with pyarrow, tensorboard with protobuf, torchdata, tyro's CLI, and torchtitan's own triton kernels): they are
# replaced by stubs in the validating subprocess only. spmd_types, which the model configs do call, is installed
# (`make test`: pure Python, 120 kB). None of the stubs is called once the imports are done: the script counts any
# call into a stub after import and the test asserts there was none, so every check that runs is torchtitan's.
TORCHTITAN_STUBS = ["datasets", "tokenizers", "torchdata", "tyro", "torch.utils.tensorboard",
                    "torchtitan.distributed.minimal_async_ep.kernels"]

TORCHTITAN_SCRIPT = r"""
import importlib.abc, importlib.machinery, json, re, sys, types, typing_extensions
STUBS, CALLS, ARMED = sys.argv[1].split(","), [], [False]

class _Meta(type(typing_extensions.Protocol)):  # a protocol-compatible metaclass: stubs may be mixed into bases
    def __getattr__(cls, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return _stub(cls.__name__ + "." + name)
    def __getitem__(cls, item):
        return cls

def _called(self, *a, **k):
    if ARMED[0]:
        CALLS.append(type(self).__name__)
    return self

def _init(self, *a, **k):
    _called(self)

def _stub(name):
    return _Meta(name, (), {"__init__": _init, "__call__": _called})

class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return _stub(self.__name__ + "." + name)

class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if any(fullname == s or fullname.startswith(s + ".") for s in STUBS):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__, m.__version__ = [], "0"
        return m
    def exec_module(self, module):
        pass

sys.meta_path.insert(0, _Finder())
from torchtitan.trainer import Trainer
from torchtitan.distributed.parallel_dims import ParallelDims
import torchtitan.models.llama3 as l3
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim

def register(flavor, dim, n_layers, n_heads, n_kv_heads, vocab_size, hidden_dim, tied):
    # what the export's note asks the user to do for a model torchtitan does not ship
    def build(attn_backend, tp_gemm_backend="default"):
        return l3.Llama3Model.Config(
            dim=dim, vocab_size=vocab_size, enable_weight_tying=tied,
            tok_embeddings=Embedding.Config(num_embeddings=vocab_size, embedding_dim=dim,
                                            param_init=l3._EMBEDDING_INIT),
            norm=RMSNorm.Config(normalized_shape=dim, param_init=l3._NORM_INIT),
            lm_head=Linear.Config(in_features=dim, out_features=vocab_size, param_init=l3._output_linear_init(dim)),
            layers=l3._build_llama3_layers(
                n_layers=n_layers, dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads,
                hidden_dim=hidden_dim,
                rope=ComplexRoPE.Config(dim=dim // n_heads, max_seq_len=131072, theta=10000),
                attn_backend=attn_backend, tp_gemm_backend=tp_gemm_backend))
    l3.llama3_configs[flavor] = build

ARMED[0] = True
out = []
for case in json.loads(sys.stdin.read()):
    note = re.search(r"ships no flavor '([^']+)': register it in \S+ with dim=(\d+), n_layers=(\d+), n_heads=(\d+), "
                     r"n_kv_heads=(\d+), vocab_size=(\d+), hidden_dim=(\d+), enable_weight_tying=(True|False)",
                     case["text"])
    if note:
        register(note.group(1), *map(int, note.groups()[1:7]), note.group(8) == "True")
    try:
        module = types.ModuleType("planner_recipe")
        exec(compile(case["text"], "recipe.py", "exec"), module.__dict__)
        cfg = module.planner_job()  # Trainer.Config and every nested config's __post_init__
        dims = ParallelDims.from_config(cfg.parallelism, case["gpus"])  # degrees x world size (_validate)
        cfg.model_spec.model.update_from_config(config=cfg)  # seq_len vs RoPE, PP vs weight tying, sharding
        # Trainer.__init__'s own checks before it touches a device (trainer.py, 0.3.0): the sequence splits over
        # SP x 2CP, and the global batch is a multiple of the local batch times the batch degree
        divisor = (dims.tp if cfg.parallelism.enable_sequence_parallel else 1) * (2 * dims.cp if dims.cp > 1 else 1)
        assert cfg.training.seq_len % divisor == 0, "seq_len not divisible by the SP/CP split"
        batch_degree = dims.dp_replicate * dims.dp_shard
        assert cfg.training.global_batch_size % (cfg.training.local_batch_size * batch_degree) == 0, "batch"
        out.append({"ok": True, "ga": cfg.training.global_batch_size // (cfg.training.local_batch_size * batch_degree),
                    "microbatches": cfg.training.local_batch_size // cfg.parallelism.pipeline_parallel_microbatch_size,
                    "ac": type(cfg.activation_checkpoint).__qualname__, "world": dims.world_size})
    except Exception as exc:
        out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
print(json.dumps({"results": out, "stub_calls": CALLS}))
"""


FLAVOR_PLANS = {  # torchtitan's shipped flavors (model_registry "70B", "8B"), 64 A100s, global batch 256
    "llama3-70b interleaved 4x5": ("llama3-70b", dict(
        tp=8, pp=4, dp=2, zero_stage=1, micro_batch_size=1, num_micro_batches=128, recompute="full",
        schedule="interleaved_1f1b", virtual_stages=5, layers_per_stage=None, recompute_layers_per_stage=None)),
    "llama3-70b uneven pp8": ("llama3-70b", dict(
        tp=8, pp=8, dp=1, zero_stage=0, micro_batch_size=1, num_micro_batches=256, recompute="full",
        schedule="1f1b", virtual_stages=1, layers_per_stage=[9, 10, 10, 10, 10, 10, 10, 11],
        recompute_layers_per_stage=None)),
    "llama3-8b fsdp": ("llama3-8b", dict(
        tp=1, pp=1, dp=64, zero_stage=3, micro_batch_size=2, num_micro_batches=2, recompute="selective",
        sequence_parallel=False, layers_per_stage=None, recompute_layers_per_stage=None)),
}


def _flavor_plan(model: str, fields: dict) -> dict:
    from test_roundtrip import UNEVEN

    from planner.contract import Predicted
    from planner.estimate import build_problem
    from planner.inputs.models import load_model
    from planner.inputs.specs import LayoutSpec

    doc = json.loads(json.dumps(UNEVEN))
    doc["inputs"]["model"] = load_model(model).model_dump(mode="json")
    doc["layout"].update(fields)
    doc["framework"] = "torchtitan"
    problem = build_problem("dgx-a100-80gb", 8, model, 256, 4096, framework="torchtitan")
    est = problem.estimate(LayoutSpec.model_validate(doc["layout"]))
    doc["predicted"] = Predicted.from_estimate(est, problem.knobs.memory_headroom_bytes).model_dump()
    return doc


def test_torchtitan_trainer_config_validation_accepts_every_exported_recipe():
    """Each torchtitan 0.3 export, executed as torchtitan runs it (`--module <file> --config planner_job`): its
    Trainer.Config.__post_init__ (pipeline micro-batch divisibility, CUDA graphs vs PP, AC policy rules), ParallelDims'
    degree check at the plan's world size, the model config's update_from_config, and Trainer.__init__'s sequence
    and batch checks. A recipe torchtitan must reject (CUDA graphs left on under PP) is rejected."""
    from cluster_specs import SpecError
    from planner.integrations.exports import export

    _torchtitan_root()
    pytest.importorskip("spmd_types", reason="`make test` installs spmd_types==0.2.3 with torchtitan 0.3.0")
    cases, layouts = [], []
    docs = {name: _plan(name, "torchtitan") for name in PLANS}
    docs.update({name: _flavor_plan(*spec) for name, spec in FLAVOR_PLANS.items()})
    for name, doc in docs.items():
        try:
            exp = export(doc, "torchtitan")
        except SpecError:
            continue  # refused with a reason (tests/test_roundtrip.py)
        lay = exp.layout
        cases.append({"text": exp.text, "gpus": lay.tp * lay.pp * lay.dp * lay.cp})
        layouts.append((name, lay))
    piped = next(c for c, (_, lay) in zip(cases, layouts, strict=True) if lay.pp > 1)
    bad = {**piped, "text": piped["text"].replace("disable_cuda_graphs=True", "disable_cuda_graphs=False")}
    assert bad["text"] != piped["text"]
    proc = subprocess.run([sys.executable, "-c", TORCHTITAN_SCRIPT, ",".join(TORCHTITAN_STUBS)],
                          input=json.dumps(cases + [bad]), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["stub_calls"] == []  # nothing stubbed took part in the validation
    results = doc["results"]
    for (name, lay), res in zip(layouts, results, strict=False):
        assert res["ok"], (name, res)
        assert res["world"] == lay.tp * lay.pp * lay.dp * lay.cp
        assert res["ac"] == {"none": "NoneType", "selective": "SelectiveAC.Config", "full": "FullAC.Config"}[
            lay.recompute.value if hasattr(lay.recompute, "value") else lay.recompute], name
        if lay.pp > 1:
            assert res["microbatches"] == lay.num_micro_batches, name
        else:
            assert res["ga"] == lay.num_micro_batches, name
    assert not results[-1]["ok"] and "CUDA graphs do not support pipeline parallelism" in results[-1]["error"]
    assert len(layouts) >= 7 and {n for n, _ in layouts} >= set(FLAVOR_PLANS)
