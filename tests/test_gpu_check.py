"""The GPU check script, run end to end on CPU with tiny shapes (--smoke), so a GPU lease is never spent on a bug
in the script: calibration, a case that runs, the table written."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytestmark = [pytest.mark.distributed, pytest.mark.torch]


def test_gpu_check_smoke_writes_the_table(tmp_path):
    doc = tmp_path / "validation-gpu.md"
    proc = subprocess.run([sys.executable, "-m", "planner.bench.gpu_check", "--smoke", "--out", str(tmp_path),
                           "--doc", str(doc), "--only", "6,10"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = doc.read_text()
    assert "| 8B 8 layers, ZeRO-3 (FSDP2, world size 1) |" in text and "CPU tensor accounting" in text
    data = json.loads((tmp_path / "gpu-check.json").read_text())
    sac, case = data["cases"]
    assert "report" in sac, sac.get("failure")
    assert (sac["report"]["framework"], sac["report"]["selective"]) == ("torchtitan", "per_op")
    saved = {r["quantity"]: r for r in sac["report"]["comparison"]["rows"]}["stage 0: saved activations (peak) (MiB)"]
    assert abs(saved["error"]) < 0.01  # torchtitan's per-op SAC, as predicted (planner.bench.recompute)
    assert "report" in case, case.get("failure")
    rep = case["report"]
    assert rep["optimizer"] == "adamw" and rep["layout"]["zero_stage"] == 3
    rows = {r["quantity"]: r for r in rep["comparison"]["rows"]}
    assert rows["step time (s)"]["measured"] > 0
    # FSDP2 at world size 1 holds every byte: parameters (fp32 shards) + gradients (fp32) + AdamW moments (fp32)
    assert rows["stage 0: optimizer state (MiB)"]["measured"] == pytest.approx(2 * rows["stage 0: parameters (MiB)"]["measured"])
    assert data["calibration"]["measured"]["summary"]["host_to_device_pinned"] is False
