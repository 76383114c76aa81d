"""The plan -> export -> check probe (not collected by pytest; tests/test_modern_round_trip.py holds its cases as
tests): for 13 problems x 5 frameworks it runs `planner plan --framework F -o`, `planner export`, then `planner check`
on the file it wrote, and prints whether check predicts the plan's step time and peak memory (to 1e-6).

    PYTHONPATH=. .venv/bin/python tests/export_check_probe.py

A line per case: OK, DIFF (with both predictions), or why it stopped (a plan or export refusal, exit 3)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

PLANNER = [sys.executable, "-m", "planner.cli"]
FRAMEWORKS = ("megatron", "nemo", "torchtitan", "deepspeed", "megatron-deepspeed")
PROBLEMS = [  # name, cluster, nodes, model, global batch, sequence, extra plan options
    ("d70", "dgx-h100", 8, "llama3-70b", 128, 8192, []),
    ("moe", "dgx-h100", 8, "mixtral-8x7b", 128, 4096, []),
    ("long", "dgx-h100", 8, "llama3-8b", 16, 131072, []),
    ("fp8", "dgx-h100", 8, "llama3-8b", 256, 8192, ["--precision", "fp8"]),
    ("dsv2", "dgx-h100", 32, "deepseek-v2", 512, 4096, []),
    ("a100", "dgx-a100-40gb", 16, "llama2-13b", 512, 4096, []),
    ("g175", "dgx-a100-80gb", 128, "gpt3-175b", 1536, 2048, []),
    ("l405", "dgx-h100", 64, "llama3-405b", 1024, 8192, []),
    ("q3", "dgx-h100", 16, "qwen3-30b-a3b", 256, 4096, []),
    ("dsv3", "dgx-h100", 128, "deepseek-v3", 2048, 4096, []),
    ("small", "dgx-a100-40gb", 1, "llama2-7b", 64, 4096, []),
    ("fp16", "v100-10gbe", 4, "gpt3-1.3b", 128, 2048, []),
    ("g2", "dgx-h100", 4, "gemma2-9b", 128, 8192, []),
]
SUFFIX = {"torchtitan": ".py", "deepspeed": ".json", "nemo": ".txt"}


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*PLANNER, *args], cwd=cwd, capture_output=True, text=True)


def probe(name, cluster, nodes, model, batch, seq, extra, fw, work: Path) -> str:
    common = ["-c", cluster, "-n", str(nodes), "-m", model]
    label = f"{name}-{fw}"
    plan = _run("plan", *common, "-b", str(batch), "-s", str(seq), "--framework", fw, "--no-schedule", "-o",
                "plan.json", *extra, cwd=work)
    if plan.returncode:
        return f"{label:28s} plan refused: {plan.stderr.strip().splitlines()[-1]}"
    cfg = f"cfg{SUFFIX.get(fw, '.sh')}"
    exp = _run("export", "plan.json", "-o", cfg, cwd=work)
    if exp.returncode:
        return f"{label:28s} export refused: {exp.stderr.strip().splitlines()[-1]}"
    layout = json.loads((work / "plan.json").read_text())["layout"]
    given = []
    if fw == "megatron-deepspeed":  # its ZeRO settings live in the ds_config beside the arguments
        _run("export", "plan.json", "--to", "deepspeed", "--framework", fw, "-o", "ds_config.json", cwd=work)
    if fw == "deepspeed":  # what the JSON cannot say (README: check --tp/--pp, --fix recompute=)
        given = ["--tp", str(layout["tp"]), "--pp", str(layout["pp"]), "--fix", f"recompute={layout['recompute']}"]
    out = _run("check", cfg, *common, "-b", str(batch), "-s", str(seq), *given, "--json", cwd=work)
    want = json.loads((work / "plan.json").read_text())["predicted"]
    doc = json.loads(out.stdout)
    got = (doc["results"][0] if "results" in doc else doc).get("predicted") or {}
    keys = ("step_time_seconds", "peak_memory_bytes_per_gpu")
    same = all(got.get(k) is not None and abs(got[k] / want[k] - 1) < 1e-6 for k in keys)
    return (f"{label:28s} {'OK  ' if same else 'DIFF'} plan {want[keys[0]]:.3f} s {want[keys[1]] / 2**30:.1f} GiB, "
            f"check {got.get(keys[0])} s {(got.get(keys[1]) or 0) / 2**30:.1f} GiB")


def main() -> None:
    counts: dict[str, int] = {}
    for fw in FRAMEWORKS:
        for case in PROBLEMS:
            with tempfile.TemporaryDirectory() as tmp:
                line = probe(*case, fw, Path(tmp))
            print(line, flush=True)
            kind = line.split()[1]
            counts[kind] = counts.get(kind, 0) + 1
    print(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))


if __name__ == "__main__":
    main()
