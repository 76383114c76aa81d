"""Megatron-Core's stage split (planner/frameworks/megatron_split.py): the rules as megatron-core 0.16.1's
TransformerConfig.__post_init__ and frameworks.md §2.3 state them, the account-for flags the export writes where
first/last stage counts cannot be given (interleaving), `check` reading them back, and the search offering them."""

import json
import subprocess
import sys

import pytest

from planner.frameworks.megatron_split import (
    MegatronSplitError,
    SplitFlags,
    expressible_splits,
    nearest_split,
    split_flags,
    stage_layers,
)

SPLIT_405B = [15, *[16] * 6, 15]  # Llama 3.1 405B: 126 + embedding + loss = 128 over pp 8


def test_stage_layers_follows_the_documented_examples():
    """frameworks.md §2.3 examples [D] and megatron-core transformer_config.py's checks."""
    assert stage_layers(30, 4, 1, SplitFlags(first=6, last=6)) == [6, 9, 9, 6]
    assert stage_layers(32, 4, 1, SplitFlags(first=7, last=7)) == [7, 9, 9, 7]
    with pytest.raises(MegatronSplitError, match="divide by the 2 virtual stages"):
        stage_layers(32, 4, 2, SplitFlags(first=7, last=7))  # F = 7 is odd with vpp = 2
    assert stage_layers(32, 2, 1, SplitFlags(first=10)) == [10, 22]  # pp 2, F only: the last stage gets the rest
    with pytest.raises(MegatronSplitError, match="middle stages"):
        stage_layers(32, 1, 1, SplitFlags(first=10))  # pp 1 with F: "Mismatch"
    with pytest.raises(MegatronSplitError, match="cannot be combined"):
        stage_layers(126, 8, 1, SplitFlags(first=15, last=15, embedding=True))
    assert stage_layers(126, 8, 8, SplitFlags(embedding=True, loss=True)) == SPLIT_405B
    with pytest.raises(MegatronSplitError, match="divide over pp 8"):
        stage_layers(126, 8, 8, SplitFlags(loss=True))  # 127 % 8
    with pytest.raises(MegatronSplitError, match="virtual stages"):
        stage_layers(126, 8, 3, SplitFlags(embedding=True, loss=True))  # 16 per rank % 3
    assert stage_layers(31, 4, 1, SplitFlags(loss=True)) == [8, 8, 8, 7]
    assert stage_layers(31, 4, 1, SplitFlags(embedding=True)) == [7, 8, 8, 8]


@pytest.mark.parametrize("layers,pp,vp", [(40, 2, 3), (126, 8, 8), (126, 8, 1), (94, 8, 4), (30, 4, 1), (61, 4, 1),
                                          (32, 4, 2), (80, 8, 5)])
def test_every_expressible_split_maps_to_flags_that_build_it(layers, pp, vp):
    """Two derivations agree: split -> flags (split_flags) -> split (stage_layers) is the identity on every split some
    setting builds, and a split one layer off an expressible one either maps to flags that build it or is refused."""
    splits = expressible_splits(layers, pp, vp)
    assert splits
    for split in splits:
        assert stage_layers(layers, pp, vp, split_flags(layers, pp, vp, split)) == split
        moved = [split[0] + 1, *split[1:-1], split[-1] - 1]
        if min(moved) >= 1:
            try:
                flags = split_flags(layers, pp, vp, moved)
            except MegatronSplitError:
                continue
            assert stage_layers(layers, pp, vp, flags) == moved


def test_interleaved_uneven_split_is_the_account_for_split_not_first_last():
    """With vpp 8 the first/last counts must divide by 8, so 15/16x6/15 is only the account-for split, and a target
    no setting builds comes back as the nearest one that is."""
    assert split_flags(126, 8, 8, SPLIT_405B) == SplitFlags(embedding=True, loss=True)
    assert split_flags(126, 8, 1, SPLIT_405B) == SplitFlags(first=15, last=15)  # without VPP first/last say it
    assert nearest_split(126, 8, 8, [16, 16, 16, 16, 16, 16, 15, 15]) == SPLIT_405B
    with pytest.raises(MegatronSplitError, match="multiple of 8"):
        split_flags(126, 8, 8, [14, *[16] * 6, 16])


def _plan_405b(tmp_path):
    out = tmp_path / "plan.json"
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "plan", "-m", "llama3.1-405b", "-c", "dgx-h100",
                           "-n", "128", "--framework", "nemo", "--precision", "fp8", "-b", "512", "-s", "8192",
                           "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def test_search_finds_interleaving_for_405b_that_needs_the_account_for_flags(tmp_path):
    """Llama 3.1 405B on 1024 H100 under the NeMo profile: 126 layers divide no pp x vpp, so before the account-for
    split the search could only pipeline it without interleaving (pp 32, 1F1B: 14.73 s predicted). Counting the
    embedding and the loss (128 over pp 16 x vpp 4) it picks interleaving, predicted faster, and the export writes
    Megatron-Bridge's flags for it (its own 405B recipe sets both, at pp 8 x vpp 8)."""
    from planner.integrations.exports import export

    doc = _plan_405b(tmp_path)
    lay = doc["layout"]
    assert lay["schedule"] == "interleaved_1f1b" and lay["virtual_stages"] > 1
    k = (126 + 2) // lay["pp"]
    assert lay["layers_per_stage"] == [k - 1, *[k] * (lay["pp"] - 2), k - 1]
    assert doc["predicted"]["step_time_seconds"] < 14.73 and doc["predicted"]["fits"]
    text = export(doc, "nemo").text
    assert "model.account_for_embedding_in_pipeline_split=true" in text
    assert "model.account_for_loss_in_pipeline_split=true" in text and "num_layers_in_first" not in text
    meg = export(doc, "megatron").text
    assert "--account-for-embedding-in-pipeline-split" in meg and "--decoder-first" not in meg


def _check(path, *extra):
    return subprocess.run([sys.executable, "-m", "planner.cli", "check", str(path), "-m", "llama3.1-405b", "-c",
                           "dgx-h100", "-n", "128", "--precision", "fp8", "--json", *extra],
                          capture_output=True, text=True, timeout=300)


def test_check_reads_the_exported_flags_back_with_the_plans_prediction(tmp_path):
    from planner.integrations.exports import export

    doc = _plan_405b(tmp_path)
    for target, suffix in (("megatron", ".sh"), ("nemo", ".txt")):
        path = tmp_path / f"cfg{suffix}"
        path.write_text(export(doc, target).text)
        proc = _check(path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        res = json.loads(proc.stdout)
        res = res[0] if isinstance(res, list) else res
        assert res["layout"]["layers_per_stage"] == doc["layout"]["layers_per_stage"]
        assert res["layout"]["virtual_stages"] == doc["layout"]["virtual_stages"]
        assert res["predicted"]["step_time_seconds"] == pytest.approx(doc["predicted"]["step_time_seconds"],
                                                                      rel=1e-9)


MEGATRON_BASE = ("--tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 --context-parallel-size 2 "
                 "--sequence-parallel --micro-batch-size 1 --global-batch-size 512 --seq-length 8192 "
                 "--num-layers 126 --hidden-size 16384 --ffn-hidden-size 53248 --num-attention-heads 128 "
                 "--group-query-attention --num-query-groups 8 --swiglu --untie-embeddings-and-output-weights "
                 "--use-distributed-optimizer --recompute-granularity full --recompute-method uniform "
                 "--recompute-num-layers 1 --fp8-format hybrid ")


def test_check_refuses_the_first_last_counts_megatron_rejects_with_vpp(tmp_path):
    """What the export wrote before: first/last 15 with 8 virtual stages (megatron-core: 'must be divisible by
    virtual pipeline parallel degree'). `check` now refuses it; the account-for flags, and the per-virtual-stage
    count (vpp = (128 / 8) / 2), pass."""
    bad = tmp_path / "bad.sh"
    bad.write_text(MEGATRON_BASE + "--num-virtual-stages-per-pipeline-rank 8 --decoder-first-pipeline-num-layers 15 "
                   "--decoder-last-pipeline-num-layers 15\n")
    proc = _check(bad)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "divide by the 8 virtual stages" in proc.stdout
    mixed = tmp_path / "mixed.sh"
    mixed.write_text(MEGATRON_BASE + "--decoder-first-pipeline-num-layers 15 --decoder-last-pipeline-num-layers 15 "
                     "--account-for-loss-in-pipeline-split\n")
    proc = _check(mixed)
    assert proc.returncode == 1 and "cannot be combined" in proc.stdout, proc.stdout
    good = tmp_path / "good.sh"
    good.write_text(MEGATRON_BASE + "--num-layers-per-virtual-pipeline-stage 2 --account-for-embedding-in-pipeline-split "
                    "--account-for-loss-in-pipeline-split\n")
    proc = _check(good)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(proc.stdout)
    res = res[0] if isinstance(res, list) else res
    assert res["layout"]["virtual_stages"] == 8 and res["layout"]["layers_per_stage"] == SPLIT_405B


def test_megatron_core_agrees_on_the_account_for_split():
    """megatron-core 0.16.1's own TransformerConfig accepts the exported account-for flags at pp 8 x vpp 8 and
    refuses the first/last counts of 15 with vpp 8 that `stage_layers` refuses."""
    pytest.importorskip("megatron.core", reason="megatron-core not installed: `make test` installs 0.16.1 (--no-deps)")
    from test_framework_validators import MCORE_SCRIPT, _megatron_arg_dict

    base = _megatron_arg_dict(MEGATRON_BASE + "--bf16 --num-virtual-stages-per-pipeline-rank 8")
    cases = [{"args": dict(base, account_for_embedding_in_pipeline_split=True,
                           account_for_loss_in_pipeline_split=True)},
             {"args": dict(base, decoder_first_pipeline_num_layers=15, decoder_last_pipeline_num_layers=15)},
             {"args": dict(base, decoder_first_pipeline_num_layers=16, decoder_last_pipeline_num_layers=14)}]
    proc = subprocess.run([sys.executable, "-c", MCORE_SCRIPT], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok = [r["ok"] for r in json.loads(proc.stdout.strip().splitlines()[-1])]
    ours = []
    for flags in (SplitFlags(embedding=True, loss=True), SplitFlags(first=15, last=15), SplitFlags(first=16, last=14)):
        try:
            stage_layers(126, 8, 8, flags)
            ours.append(True)
        except MegatronSplitError:
            ours.append(False)
    assert ok == ours == [True, False, False]
