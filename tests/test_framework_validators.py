"""The exported configs through the frameworks' own validators, where they install on CPU within CI time.

- DeepSpeed 0.19.8 (`make test` installs it with DS_BUILD_OPS=0: pure Python, no kernels): every DeepSpeed JSON the
  exporter writes goes through `deepspeed.runtime.config.DeepSpeedConfig` with the plan's data-parallel size,
  which runs the batch-triad derivation and assertion, the ZeRO/offload/precision config models; a triad that
  `planner check` fails must fail there too.
- megatron-core: the package index reachable here stops at 0.16.1 (0.19.2 is not there), so its TransformerConfig is
  not run; the exporter follows the rules of frameworks.md §2.3-2.7 instead (tests/test_roundtrip.py).
- torchtitan 0.3: not installed (it pulls the Hugging Face datasets stack); tests/test_roundtrip.py reads the
  recipe back with the torchtitan split rule (frameworks.md §1.4).
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
    bad = json.loads((ROOT / "tests/data/configs/deepspeed/zero1_bad_triad.json").read_text())
    cases.append({"config": bad, "dp": 8})
    results = _validate(cases)
    for (name, framework, lay), res in zip(expect, results[:-1], strict=True):
        assert res["ok"], (name, framework, res)
        assert (res["train"], res["micro"], res["ga"]) == (256, lay.micro_batch_size, lay.num_micro_batches)
        assert res["zero"] == lay.zero_stage
        assert (res["offload_param"] == "cpu") == (lay.offload == "optimizer+params")
    assert not results[-1]["ok"] and "train_batch_size is not equal" in results[-1]["error"]
    assert len(expect) >= 6
