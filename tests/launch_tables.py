"""docs/launch.md's two closing tables of issue #11, generated from the tests' own data so that they stay true:
the round-trip plans (tests/test_roundtrip.py PLANS x TARGETS) with the framework validators that accept them
(tests/test_framework_validators.py), and the real-config fixtures with their verdicts (tests/test_real_configs.py
CASES). `make launch-doc` rewrites the document; tests/test_launch_doc.py fails when it is stale.

Run: PYTHONPATH=. python tests/launch_tables.py > docs/launch.md
"""

from __future__ import annotations

import sys
import tempfile
from argparse import Namespace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GIB = 2**30
DS_TEST = "test_deepspeed_accepts_every_exported_config_and_rejects_a_bad_triad"
MCORE_TEST = "test_megatron_core_accepts_every_exported_megatron_config"
TT_TESTS = ("test_torchtitan_trainer_config_validation_accepts_every_exported_recipe, "
            "test_torchtitan_accepts_every_exported_recipe")
# target -> the framework's own validator that accepts the export (its test runs it on every plan of the table)
VALIDATORS = {
    "megatron": "yes (M)",
    "nemo": "no CPU validator: Megatron-Bridge needs Transformer Engine (its Megatron-Core fields: M)",
    "megatron-deepspeed": "ds_config: yes (D); arguments: none (Megatron-DeepSpeed is not a package)",
    "deepspeed": "yes (D)",
    "torchtitan": "yes (T)",
    "torchtitan-toml": "no: torchtitan <= 0.2 is not installed beside 0.3 (`check` reads it back)",
}
LEGEND = f"""- D: DeepSpeed 0.19.8's `DeepSpeedConfig` with the plan's data-parallel size (batch triad, ZeRO, offload,
  precision; `overlap_comm` as the profile predicts): `{DS_TEST}`.
- M: megatron-core 0.16.1's `TransformerConfig` and `DistributedDataParallelConfig` (uneven pipeline, recompute, TP,
  overlap flags): `{MCORE_TEST}`.
- T: torchtitan 0.3.0 running the recipe's `planner_job()`: `Trainer.Config.__post_init__`, `ParallelDims` at the
  plan's world size, the model config's `update_from_config`, `Trainer.__init__`'s sequence and batch checks, and its
  own pipeline split: `{TT_TESTS.split(", ")[0]}`, `{TT_TESTS.split(", ")[1]}`.
- Round trip identical: `check` of the export gives the same layout, step time and peak memory (to 1e-9) as the plan,
  or as the nearest layout's own prediction where the export names one: tests/test_roundtrip.py.
"""
OPTION_ATTRS = {"--tp": "tp", "--pp": "pp", "-s": "seq_len", "-b": "global_batch_size", "--framework": "framework"}


def _cell(text: str, limit: int = 110) -> str:
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def roundtrip_rows() -> list[str]:
    import pytest
    from test_roundtrip import PLANS, TARGETS, round_trip

    rows = ["| framework | plan | exported | accepted by the framework's validator | round trip identical |",
            "|---|---|---|---|---|"]
    for target in TARGETS:
        for name in PLANS:
            with tempfile.TemporaryDirectory() as tmp:
                r = round_trip(target, name, Path(tmp))
            if r["refused"]:
                rows.append(f"| {target} | {name} | refused: {_cell(r['refused'], 90)} | — | — |")
                continue
            exp, got, want = r["export"], r["got"], r["want"]
            exported = "nearest: " + _cell("; ".join(c.split(" (")[0] for c in exp.changes), 80) \
                if exp.changes else "yes"
            same = (r["same_layout"] and not r["outcome"].violations and got is not None
                    and got["step_time_seconds"] == pytest.approx(want["step_time_seconds"], rel=1e-9)
                    and got["peak_memory_bytes_per_gpu"] == pytest.approx(want["peak_memory_bytes_per_gpu"], rel=1e-9))
            verdict = ("yes (as the nearest layout's prediction)" if exp.changes else "yes") if same else "NO"
            rows.append(f"| {target} | {name} | {exported} | {VALIDATORS[target]} | {verdict} |")
    return rows


def _args(cluster: str, nodes: int, model: str, extra: list[str]) -> Namespace:
    args = Namespace(cluster=cluster, nodes=nodes, model=model, global_batch_size=None, seq_len=None, tp=None, pp=None,
                     fix=None, framework=None, precision=None, headroom_gib=2.0, allow_tp_across_nodes=False,
                     calibration=None)
    it = iter(extra)
    for opt in it:
        value = next(it)
        if opt == "--fix":
            args.fix = [*(args.fix or []), value]
        else:
            setattr(args, OPTION_ATTRS[opt], value if opt == "--framework" else int(value))
    return args


def fixture_rows() -> list[str]:
    from test_real_configs import CASES, CONFIGS

    from cluster_specs import load_cluster
    from planner.integrations.check import check_files

    rows = ["| config | framework | cluster | model | options | verdict (exit) | peak predicted | fix hint |",
            "|---|---|---|---|---|---|---|---|"]
    for name, cluster, nodes, model, extra, code, _says in CASES:
        args = _args(cluster, nodes, model, list(extra))
        _doc, reports, got = check_files([CONFIGS / name], args, as_json=True)
        r = reports[0]
        if got != code:
            raise AssertionError(f"{name}: exit {got}, the test expects {code}")
        p = r["predicted"]
        peak = f"{p['peak_memory_bytes_per_gpu'] / GIB:.1f} of {p['gpu_memory_bytes'] / GIB:.1f} GiB" if p else "—"
        gpus = load_cluster(cluster, nodes=nodes).num_gpus
        verdict = "PASS (0)" if got == 0 else f"FAIL ({got}): " + _cell("; ".join(v["rule"] for v in r["violations"]))
        hint = _cell(r["violations"][0]["hint"]) if r["violations"] else "—"
        rows.append(f"| {name} | {r['framework']} | {cluster} x {nodes} ({gpus} GPUs) | {model} | "
                    f"{' '.join(extra) or '—'} | {verdict} | {peak} | {hint} |")
    return rows


HEAD = """# Launch: exports the frameworks accept, round trips, real configs

Generated by `make launch-doc` (`PYTHONPATH=. python tests/launch_tables.py > docs/launch.md`) from the tests' own
data; `tests/test_launch_doc.py` fails when this file is stale. Do not edit by hand. Issue #11's closing tables.

## Exports: framework x plan

The plans are tests/test_roundtrip.py's (llama2-13b on 64 A100 80GB, global batch 256, sequence 4096), each planned
with the target framework's execution profile (`plan --framework`), exported, read back by `check` and predicted
again. "Nearest" is the layout the framework can express, with its own prediction (the changes are listed in the
exported file); "refused" names the reason (exit 3). Validators are run where they install on CPU within CI time
(DeepSpeed with DS_BUILD_OPS=0, torchtitan 0.3.0, megatron-core's configs). Megatron-LM's own `validate_args` lives
in megatron/training, which is not in the megatron-core wheel, so it is not run; the exporter follows its rules as
../shared/reference/frameworks.md §2.3-2.7 records them, and megatron-core's configs check the uneven-pipeline,
recompute, TP and MoE rules again.

"""

MIDDLE = """
## Real configs: verdicts

Configs in the shape of the frameworks' shipped examples (tests/data/configs), checked as
`planner check CONFIG -c CLUSTER -n NODES -m MODEL [options]` (tests/test_real_configs.py asserts the exit code and
what the report says). A config that trained on the hardware it was written for passes; one that cannot fit fails
with the number and the fix; one the framework itself refuses fails with the framework's reason.

"""


# issue #11's points -> the tests that prove them (tests/test_launch_doc.py checks that each named test exists)
POINTS = [
    ("`--framework` restricts the pick (schedules, ZeRO/FSDP, SP, splits, recompute); `--fix`, `--schedules`; the plan "
     "JSON records the framework; no zero-bubble for upstream Megatron-LM/DeepSpeed, and for torchtitan (two stages "
     "per rank, not the ZB-H1 predicted) only when asked, with the assumption stated",
     ["test_search_picks_only_what_the_framework_runs", "test_fix_pins_degrees_and_schedules_restrict",
      "test_upstream_megatron_and_deepspeed_never_get_zero_bubble", "test_torchtitan_gets_zero_bubble_only_when_asked",
      "test_plan_json_records_the_framework_and_estimate_refuses_what_it_cannot_run"]),
    ("vocabulary padding per framework (Megatron/NeMo/Megatron-DeepSpeed pad; torchtitan/DeepSpeed keep tp a divisor of the vocabulary)",
     ["test_vocab_rule_per_framework"]),
    ("Megatron first/last pipeline layers leave an even middle (405B on pp 32)",
     ["test_megatron_first_last_split_leaves_an_even_middle_for_405b_on_32_stages",
      "test_megatron_export_uneven_stages_and_partial_recompute", MCORE_TEST]),
    ("Megatron/NeMo interleaving with an uneven split: the account-for flags (first/last counts must divide by the "
     "virtual stages), read back by `check`; the search offers it (405B: pp 16 x vpp 4 over 126 + 2 layers)",
     ["test_interleaved_uneven_split_is_the_account_for_split_not_first_last",
      "test_search_finds_interleaving_for_405b_that_needs_the_account_for_flags",
      "test_check_reads_the_exported_flags_back_with_the_plans_prediction",
      "test_check_refuses_the_first_last_counts_megatron_rejects_with_vpp",
      "test_megatron_core_agrees_on_the_account_for_split", MCORE_TEST]),
    ("Megatron/NeMo splits no flag builds (Llama 3 8B over pp 6, DeepSeek-V3's 61 layers over pp 32): a "
     "`--pipeline-model-parallel-layout` string (Bridge `model.pipeline_model_parallel_layout`) that megatron-core "
     "builds; `check` reads layout strings with megatron-core's rules (E, L, decoder and MTP counts, stage count over "
     "pp, no other split flag)",
     ["test_a_split_no_flag_builds_is_exported_as_a_layout_that_megatron_core_builds_and_check_reads_back",
      "test_the_layout_the_export_writes_builds_the_split", "test_megatron_core_agrees_on_every_case",
      "test_check_reads_the_deepseek_v3_layout_in_megatron_and_bridge_configs",
      "test_check_refuses_a_layout_megatron_core_refuses",
      "test_check_predicts_a_layout_as_the_flags_that_build_the_same_split"]),
    ("ZeRO-3/Megatron-FSDP exports: `--no-gradient-accumulation-fusion`, `CUDA_DEVICE_MAX_CONNECTIONS`",
     ["test_megatron_zero3_export_has_no_gradient_accumulation_fusion_and_the_connections_variable"]),
    ("torchtitan 0.3 Python recipe, the <= 0.2 TOML behind `--torchtitan-format toml`; torchtitan's own validation",
     ["test_torchtitan_export_is_a_python_recipe_and_the_toml_behind_an_option", "test_torchtitan_export",
      *TT_TESTS.split(", ")]),
    ("DeepSpeed export never drops tp, zero_bubble or the split (AutoTP, nearest layout, refusal with the reason)",
     ["test_deepspeed_export_never_drops_tp_zero_bubble_or_the_split", DS_TEST]),
    ("torchrun with `--program`: no plan path appended", ["test_torchrun_with_a_program_gets_no_plan_path"]),
    ("overlap like for like: Megatron's flags, DeepSpeed's `overlap_comm` (absent: DeepSpeed's default per stage), "
     "pipeline p2p overlap only with virtual stages (Megatron/NeMo)",
     ["test_megatron_config_without_overlap_flags_is_predicted_with_the_traffic_exposed",
      "test_deepspeed_zero2_without_overlap_comm_is_predicted_with_the_reduce_after_backward",
      "test_deepspeed_zero3_overlap_comm_defaults_on_and_off_exposes_the_reduce_scatters",
      "test_deepspeed_export_turns_on_overlap_comm_where_its_profile_predicts_with_it",
      "test_pipeline_p2p_overlap_applies_only_with_virtual_stages"]),
    ("torchtitan reader: local batch 8, PP micro-batch 1, selective AC by default, multi-stage schedules, "
     "`reshard_after_forward = never` is ZeRO-2",
     ["test_torchtitan_missing_batch_and_ac_fields_take_torchtitans_defaults",
      "test_torchtitan_multi_stage_schedules_keep_their_virtual_stages",
      "test_torchtitan_reshard_never_is_zero2_not_zero3"]),
    ("Megatron reader: `--checkpoint-activations`, `--zero-stage`, `--use-megatron-fsdp`, block recompute, quoted "
     "shell variables, `$VAR`, SP at tp 1, ignored options named, model mismatch",
     ["test_megatron_checkpoint_activations_is_refused_by_megatron_lm_and_full_under_megatron_deepspeed",
      "test_megatron_zero_stage_and_megatron_fsdp_are_read", "test_megatron_block_recompute_in_quoted_shell_variables",
      "test_unexpanded_variable_is_a_clear_error", "test_megatron_sequence_parallel_with_tp1_is_a_note_not_a_failure",
      "test_megatron_ignored_options_are_named", "test_real_config_verdicts"]),
    ("DeepSpeed reader: the batch triad as DeepSpeed derives it, `--pp`, `\"auto\"`, precision from the config",
     ["test_deepspeed_batch_triad_is_derived_as_deepspeed_derives_it", "test_deepspeed_precision_comes_from_the_config",
      "test_export_then_check_gives_the_same_layout_and_prediction", "test_real_config_verdicts"]),
    ("remedy hints said once; MFU above 100% never printed",
     ["test_real_config_verdicts", "test_mfu_above_one_is_never_printed"]),
    ("round trip for every framework over uneven splits, per-stage recompute, interleaving, ZeRO-1/2/3/FSDP, offload",
     ["test_export_then_check_gives_the_same_layout_and_prediction"]),
    ("real-config fixtures with verdicts", ["test_real_config_verdicts"]),
    ("the README's pre-commit hook and GitHub Actions step run as written",
     ["test_readme_pre_commit_hook_runs_as_written", "test_readme_github_actions_step_runs_as_written"]),
    ("`check` takes several files; exit 0 / 1 / 3; `--json` one document, errors included",
     ["test_several_files_one_document_and_the_worst_exit_code", "test_json_errors_are_one_document_on_stdout",
      "test_exit_code_table_is_the_agreed_one"]),
]


def points_rows() -> list[str]:
    rows = ["| point of the issue | tests |", "|---|---|"]
    rows += [f"| {point} | {', '.join(f'`{t}`' for t in tests)} |" for point, tests in POINTS]
    return rows


TAIL = """
## Each point of the issue and its test

"""


def document() -> str:
    return (HEAD + LEGEND + "\n" + "\n".join(roundtrip_rows()) + "\n" + MIDDLE + "\n".join(fixture_rows()) + "\n"
            + TAIL + "\n".join(points_rows()) + "\n")


if __name__ == "__main__":
    sys.stdout.write(document())
