"""The GPU check for a short lease: `python3 -m planner.bench.gpu_check --out DIR` (or `make gpu-check`).

Runs with a bare python3 that has torch, typer, rich, PyYAML and pydantic/pulp/highspy importable (no venv and
no installed entry point needed: every step is `python3 -m planner.cli ...` in a subprocess, so one case running
out of memory cannot take the others down). In under 5 minutes on one H200:

1. `planner calibrate --nproc 1 --gpu H200 --model llama3-8b` (GEMM grid + the model's shapes, memory copy,
   pinned host-to-device link);
2. single-GPU cases on that calibration, bf16, AdamW with fp32 master weights and moments: Llama-3 8B at full size
   under each recompute policy (none and selective are predicted not to fit one GPU with Adam: running them checks
   that), a 16-layer 8B under none, selective and torchtitan's selective (per-op SAC), 70B and 175B layer proxies,
   and the ZeRO-0 and FSDP2 (ZeRO-3) recipes at world size 1 on an 8-layer 8B;
3. a predicted-vs-measured markdown table (step time; CUDA peak allocated and reserved against the prediction),
   written to --doc, and every report in DIR/gpu-check.json.

`--smoke` runs the same script on CPU with tiny shapes (tests/test_gpu_check.py), so a lease is not spent on a
typo. Each case has a time limit, and cases are skipped (and listed as such) once --budget seconds are spent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ALLOC_CONF = "expandable_segments:True"  # as torchtitan's launch script sets it

# (name, model, layout, seq, layers per stage or None for full size[, framework whose 'selective' runs])
CASES = [
    ("8B full, recompute none", "llama3-8b", "dp=1,mbs=1,recompute=none", 4096, None),
    ("8B full, recompute selective", "llama3-8b", "dp=1,mbs=1,recompute=selective", 4096, None),
    ("8B full, recompute full", "llama3-8b", "dp=1,mbs=1,recompute=full", 4096, None),
    ("8B 16 layers, recompute none", "llama3-8b", "dp=1,mbs=1,recompute=none", 4096, 16),
    ("8B 16 layers, recompute selective", "llama3-8b", "dp=1,mbs=1,recompute=selective", 4096, 16),
    ("8B 16 layers, selective as torchtitan (per-op SAC)", "llama3-8b", "dp=1,mbs=1,recompute=selective", 4096, 16,
     "torchtitan"),
    ("70B proxy (2 layers), selective", "llama3-70b", "dp=1,mbs=1,recompute=selective", 4096, 2),
    ("175B proxy (1 layer), selective", "gpt3-175b", "dp=1,mbs=1,recompute=selective", 2048, 1),
    ("8B 8 layers, ZeRO-0 (AdamW, fp32 masters)", "llama3-8b", "dp=1,mbs=1,zero=0", 4096, 8),
    ("8B 8 layers, ZeRO-3 (FSDP2, world size 1)", "llama3-8b", "dp=1,mbs=1,zero=3", 4096, 8),
]
SMOKE_SCALE = ["--hidden-size", "64", "--vocab-size", "128"]


def _dtype(smoke: bool) -> str:
    return "float32" if smoke else "bfloat16"  # a CPU calibration measures fp32 GEMMs only


def _cli(args: list[str], timeout: float, env: dict) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(exc.cmd, 124, exc.stdout or "", f"timed out after {timeout:.0f} s")


def _failure(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stderr or "") + (proc.stdout or "")
    if "out of memory" in text.lower() or "OutOfMemoryError" in text:
        return "OOM"
    if proc.returncode == 124:
        return "timed out"
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return f"failed (exit {proc.returncode}): {lines[-1][:160] if lines else ''}"


def calibrate(out: Path, smoke: bool, env: dict) -> tuple[Path, dict]:
    cal = out / ("cpu-smoke.yaml" if smoke else "h200.yaml")
    args = ["calibrate", "--nproc", "1", "-o", str(cal), "--json"]
    args += ["--repeats", "2"] if smoke else ["--gpu", "H200", "--model", "llama3-8b", "--seq-len", "4096"]
    proc = _cli(args, 300, env)
    if proc.returncode != 0:
        raise SystemExit(f"calibrate failed: {_failure(proc)}\n{proc.stderr[-2000:]}")
    return cal, json.loads(proc.stdout)


def run_case(case: tuple, cal: Path, smoke: bool, env: dict, timeout: float) -> dict:
    name, model, layout, seq, lps, *framework = case
    args = ["bench", "-c", str(cal), "-m", model, "--layout", layout, "--nproc", "1", "--dtype", _dtype(smoke),
            "--json"] + (["--framework", framework[0]] if framework else [])
    if smoke:
        args += [*SMOKE_SCALE, "--seq-len", "32", "--layers-per-stage", "2", "--steps", "1", "--warmup", "1"]
    else:
        args += ["--seq-len", str(seq), "--steps", "3", "--warmup", "2"]
        if lps:
            args += ["--layers-per-stage", str(lps)]
    t0 = time.monotonic()
    proc = _cli(args, timeout, env)
    row = {"case": name, "args": args, "seconds": time.monotonic() - t0}
    if proc.returncode == 0:
        row["report"] = json.loads(proc.stdout)
    else:
        row["failure"] = _failure(proc)
        row["stderr_tail"] = (proc.stderr or "")[-1500:]
        row["prediction"] = predict_only(case, cal, smoke)
    return row


def predict_only(case: tuple, cal: Path, smoke: bool) -> dict | None:
    """What the planner predicted for a case that did not run to the end (e.g. OOM): step time, peak, fits."""
    _, model, layout, seq, lps, *framework = case
    if smoke:
        seq, lps = 32, 2
    try:
        from cluster_specs import load_cluster
        from planner.bench.session import bench_knobs, bench_layout, bench_problem, scale_model
        from planner.calibration import calibration_knobs
        from planner.estimate import complete_layout
        from planner.inputs.layout_string import parse_layout_string
        from planner.inputs.models import load_model
        from planner.inputs.specs import TrainingSpec

        cl = load_cluster(str(cal))
        fields = parse_layout_string(layout)
        fields.setdefault("num_micro_batches", 1)
        md = load_model(model)
        lay = complete_layout(fields, md, TrainingSpec(global_batch_size=1, seq_length=seq), cl)
        scaled = scale_model(md, lay, layers_per_stage=lps, hidden_size=64 if smoke else None,
                             vocab_size=128 if smoke else None)
        lay = bench_layout(lay, scaled, planned_layers=md.num_layers)
        md = scaled
        knobs = bench_knobs(calibration_knobs(cl), framework[0] if framework else None)
        est = bench_problem(md, lay, seq, cl, _dtype(smoke), knobs).estimate(lay)
        st = est.stages[0]
        return {"step_seconds": est.step_seconds, "allocated_bytes": st.allocated_bytes,
                "fits": est.fits, "gpu_memory_bytes": est.gpu_memory_bytes}
    except Exception as exc:  # the table says the prediction is missing; the check goes on
        return {"error": f"{type(exc).__name__}: {exc}"}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _rows_of(report: dict) -> dict:
    return {r["quantity"].split(" (")[0]: r for r in report["comparison"]["rows"]}


def table_row(row: dict) -> str:
    if "report" not in row:
        p = row.get("prediction") or {}
        if "allocated_bytes" in p:
            fits = "predicted to fit" if p["fits"] else "predicted NOT to fit"
            return (f"| {row['case']} | {p['step_seconds']:.3f} | {row['failure']} | - | "
                    f"{p['allocated_bytes'] / 2**30:.1f} | {row['failure']} | - | - | - | {fits} "
                    f"({p['gpu_memory_bytes'] / 2**30:.0f} GiB card) |")
        return f"| {row['case']} | - | {row['failure']} | - | - | - | - | - | - | {p.get('error', '')} |"
    rows = _rows_of(row["report"])
    step = rows["step time"]
    alloc = rows.get("stage 0: peak allocated")
    res = next((r for q, r in rows.items() if q.startswith("stage 0: peak reserved")), None)
    if alloc is None or res is None:  # CPU smoke: tensor accounting
        acc = rows["stage 0: state + saved activations"]
        return (f"| {row['case']} | {step['predicted']:.3g} | {step['measured']:.3g} | {_pct(step['error'])} | "
                f"{acc['predicted'] / 1024:.3g} | {acc['measured'] / 1024:.3g} | {_pct(acc['error'])} | - | - | "
                "CPU tensor accounting |")
    return (f"| {row['case']} | {step['predicted']:.3f} | {step['measured']:.3f} | {_pct(step['error'])} | "
            f"{alloc['predicted']:.1f} | {alloc['measured']:.1f} | {_pct(alloc['error'])} | {res['measured']:.1f} | "
            f"{_pct(res['error'])} | |")


def markdown(cal: dict, rows: list[dict], meta: dict) -> str:
    s = cal["measured"]["summary"]
    n = cal["measured"]["noise"]
    lines = [
        "# GPU check: predicted vs measured (single GPU)",
        "",
        f"Run {meta['date']} on {s['device_name']} with torch {s['torch_version']}; "
        f"PYTORCH_CUDA_ALLOC_CONF={meta['alloc_conf']}; command `{meta['command']}` ({meta['seconds']:.0f} s).",
        "The benchmark trains with the recipe the plan is for: bf16 compute, AdamW with fp32 master weights and fp32 "
        "moments (ZeRO-0 here; ZeRO-3 as FSDP2 `fully_shard` with MixedPrecisionPolicy(bf16, reduce fp32)). "
        "Predictions use the calibration measured in the same run.",
        "",
        f"Calibration (measured, {s['dtype']}): GEMM fitted peak {s['gemm_fitted_peak_tflops']:.0f} TFLOP/s, best "
        f"{s['gemm_best_tflops']:.0f} at {s['gemm_best_shape']}, smallest {s['gemm_smallest_tflops']:.3g} at "
        f"{s['gemm_smallest_shape']} (line fit error median {s['gemm_fit_median_abs_error']:.0%}, max "
        f"{s['gemm_fit_max_abs_error']:.0%}); memory copy {s['memory_copy_gb_per_s']:.0f} GB/s; host-to-device "
        f"{'(pinned) ' if s['host_to_device_pinned'] else ''}{s['host_to_device_gb_per_s']:.1f} GB/s; repeat spread "
        f"median {n['median_spread']:.0%}.",
        "",
        "Memory columns in GiB: predicted is the estimate's allocator bytes (weights + gradients + optimizer + "
        "activations + transients; the process overhead outside the allocator excluded); reserved is compared "
        "with the same prediction (no allocator-reserve model applied).",
        "",
        "| case | step s predicted | step s measured | error | peak allocated predicted | measured | error "
        "| peak reserved measured | error vs predicted | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(table_row(r) for r in rows),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m planner.bench.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("gpu-check"), help="folder for the calibration and reports")
    ap.add_argument("--doc", type=Path, default=None, help="write the markdown table here")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: test the script itself")
    ap.add_argument("--budget", type=float, default=270.0, help="skip the cases left after this many seconds")
    ap.add_argument("--case-timeout", type=float, default=90.0)
    ap.add_argument("--only", default="", help="comma-separated case numbers (1-based) to run; default all")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF))
    if a.smoke:
        env["CUDA_VISIBLE_DEVICES"] = ""
    cal_path, cal = calibrate(a.out, a.smoke, env)
    print(f"calibrated in {time.monotonic() - t0:.0f} s: {json.dumps(cal['measured']['summary'])}", flush=True)
    rows = []
    chosen = {int(x) for x in a.only.split(",") if x.strip()}
    for case in [c for i, c in enumerate(CASES, 1) if not chosen or i in chosen]:
        if time.monotonic() - t0 > a.budget:
            rows.append({"case": case[0], "failure": "skipped (time budget)", "prediction": None})
            continue
        row = run_case(case, cal_path, a.smoke, env, a.case_timeout)
        print(table_row(row), flush=True)
        rows.append(row)
    meta = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "alloc_conf": env["PYTORCH_CUDA_ALLOC_CONF"],
            "command": "python3 -m planner.bench.gpu_check" + (" --smoke" if a.smoke else ""),
            "seconds": time.monotonic() - t0}
    (a.out / "gpu-check.json").write_text(json.dumps({"meta": meta, "calibration": cal, "cases": rows}, indent=1))
    text = markdown(cal, rows, meta)
    if a.doc is not None:
        a.doc.parent.mkdir(parents=True, exist_ok=True)
        a.doc.write_text(text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
