"""The command line: outputs, JSON contract, exit codes, and what it imports at start-up."""

import json
import subprocess
import sys

import pytest

from planner import errors


def run(*args, check=False):
    proc = subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_version():
    out = run("--version", check=True).stdout
    assert out.startswith("planner 0.1.0")


def test_help_and_light_commands_import_neither_torch_nor_pulp():
    code = (
        "import sys\n"
        "from planner import cli\n"
        "for argv in (['--help'], ['models', 'list'], ['clusters', 'show', 'dgx-h100'], ['estimate', '--help']):\n"
        "    sys.argv = ['planner', *argv]\n"
        "    try:\n"
        "        cli.main()\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('MODULES', 'torch' in sys.modules, 'pulp' in sys.modules, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "MODULES False False" in proc.stderr


def test_models_show_json():
    doc = json.loads(run("models", "show", "gpt3-175b", "--json", check=True).stdout)
    assert round(doc["parameters"]["total"] / 1e9, 1) == 174.6
    doc = json.loads(run("models", "show", "llama3-8b", "--json", check=True).stdout)
    assert round(doc["parameters"]["total"] / 1e9, 2) == 8.03


def test_clusters_json():
    doc = json.loads(run("clusters", "show", "dgx-h100", "--nodes", "4", "--json", check=True).stdout)
    assert doc["derived"]["num_gpus"] == 32
    d, c = doc["derived"], doc["cluster"]
    assert (c["num_nodes"], c["gpus_per_node"]) == (4, 8)
    # derived from the preset's own figures: 79.6 GiB usable per H100; NVLink 450 GB/s x 0.822 efficiency;
    # 8 NDR NICs x 400 Gb/s = 400 GB/s per node x 0.9 efficiency
    assert d["gpu_memory_bytes"] == pytest.approx(79.6 * 2**30, rel=1e-12)
    assert d["intra_node_bytes_per_second"] == pytest.approx(450e9 * 0.822, rel=1e-12)
    assert d["node_network_bytes_per_second"] == pytest.approx(8 * 400e9 / 8 * 0.9, rel=1e-12)
    names = [c["name"] for c in json.loads(run("clusters", "list", "--json", check=True).stdout)]
    from pathlib import Path

    import cluster_specs

    shipped = sorted(p.stem for p in (Path(cluster_specs.__file__).parent / "clusters").glob("*.yaml"))
    assert sorted(names) == shipped  # every preset file, and nothing else


def test_estimate_json_values():
    proc = run("estimate", "-c", "dgx-a100-80gb", "-n", "8", "-m", "gpt3-175b", "-b", "64", "-s", "2048",
               "--layout", "tp=8,pp=8,mbs=1,recompute=selective", "--json", check=True)
    doc = json.loads(proc.stdout)
    p, mem, t = doc["predicted"], doc["memory_breakdown"], doc["time_breakdown"]
    # the names scripts read (README), with values that follow from each other
    assert p["tokens_per_second"] == pytest.approx(64 * 2048 / p["step_time_seconds"], rel=1e-12)
    assert p["peak_memory_bytes_per_gpu"] == pytest.approx(mem["total_bytes"], rel=1e-12)
    assert mem["total_bytes"] == pytest.approx(sum(mem[k] for k in ("weights_bytes", "gradients_bytes", "optimizer_bytes",
                                                                    "activations_bytes", "transient_bytes", "reserve_bytes",
                                                                    "overhead_bytes")), rel=1e-12)
    assert t["total_seconds"] == pytest.approx(p["step_time_seconds"], rel=1e-9)
    assert p["fits"] is (p["peak_memory_bytes_per_gpu"] + 2 * 2**30 <= p["gpu_memory_bytes"])
    assert 0 < p["mfu"] < p["hfu"] < 1  # selective recompute: hardware FLOPs exceed model FLOPs
    assert doc["layout"]["dp"] == 1 and doc["layout"]["num_micro_batches"] == 64
    assert [s["stage"] for s in mem["stages"]] == list(range(8)) and sum(s["layers"] for s in mem["stages"]) == 96


@pytest.mark.parametrize(
    "args,code,needle",
    [
        (["models", "show", "llama3-8"], errors.EXIT_INPUT, "did you mean llama3-8b"),
        (["clusters", "show", "nope"], errors.EXIT_INPUT, "unknown cluster"),
        (["estimate", "-c", "dgx-h100", "-m", "gpt3-175b", "-b", "8", "-s", "2048", "--layout", "tp=3,dp=1"],
         errors.EXIT_INPUT, "tp: 3 -> must divide gpus_per_node"),
        (["estimate", "-c", "dgx-h100", "-m", "gpt3-175b", "-b", "0", "-s", "2048", "--layout", "tp=8"],
         errors.EXIT_INPUT, "global_batch_size"),
        (["estimate", "-c", "dgx-h100", "-m", "gpt3-175b", "-b", "8", "-s", "2048", "--layout", "tp=8,colour=red"],
         errors.EXIT_INPUT, "layout key 'colour'"),
        (["estimate", "-c", "dgx-h100", "--nodes", "0", "-m", "gpt3-175b", "-b", "8", "-s", "2048", "--layout", "tp=8"],
         errors.EXIT_INPUT, "--nodes"),
        (["estimate", "--bogus"], errors.EXIT_USAGE, ""),
    ],
)
def test_bad_input_exit_codes(args, code, needle):
    proc = run(*args)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    assert needle in proc.stderr
    assert proc.stdout == ""


def test_malformed_files(tmp_path):
    bad_yaml = tmp_path / "c.yaml"
    bad_yaml.write_text("gpu: [unclosed\n")
    proc = run("clusters", "show", str(bad_yaml))
    assert proc.returncode == errors.EXIT_INPUT and "malformed YAML" in proc.stderr and "Traceback" not in proc.stderr
    missing = tmp_path / "m.yaml"
    missing.write_text("num_layers: -1\nhidden_size: 64\nbogus: 1\n")
    proc = run("models", "show", str(missing))
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert proc.returncode == errors.EXIT_INPUT
    assert any("num_layers" in l for l in lines) and any("bogus" in l and "unknown field" in l for l in lines)
    assert any("num_attention_heads" in l and "missing" in l for l in lines)


def test_estimate_of_a_plan_file_uses_the_plan_s_framework(tmp_path):
    """`estimate -l plan.json` predicts the plan's layout under the profile the plan was made for, so it gives the
    plan's own step time; --framework still names another (the generic profile's number differs here: FSDP2's
    prefetch hides 80% of the ZeRO-3 traffic, the generic profile 50%)."""
    plan = tmp_path / "p.json"
    common = ("-c", "dgx-h100", "-n", "2", "-m", "llama3-8b", "-b", "64", "-s", "4096")
    run("plan", *common, "--framework", "torchtitan", "--top", "0", "--json", "-o", str(plan), check=True)
    planned = json.loads(plan.read_text())
    same = json.loads(run("estimate", *common, "-l", str(plan), "--json", check=True).stdout)
    assert same["framework"] == "torchtitan"
    assert same["predicted"]["step_time_seconds"] == pytest.approx(planned["predicted"]["step_time_seconds"], rel=1e-9)
    generic = json.loads(run("estimate", *common, "-l", str(plan), "--framework", "generic", "--json",
                             check=True).stdout)
    assert generic["framework"] == "generic"
    assert generic["predicted"]["step_time_seconds"] != pytest.approx(same["predicted"]["step_time_seconds"], rel=0.01)
    assert "torchtitan profile" in run("estimate", *common, "-l", str(plan), check=True).stdout.splitlines()[0]
