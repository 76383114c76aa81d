"""The launch-script reader (planner/integrations/shell.py): real Megatron-LM / Megatron-DeepSpeed launch scripts
(trimmed copies in tests/data/configs, each naming its source repo@commit:path) read into the layout they run, and
snippets read against bash itself: `bash_argv` runs the snippet in a bash with an empty environment, with `torchrun`
defined as a function that prints the arguments after `pretrain_gpt.py`, so the expected words are bash's."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from planner.integrations.readers import read_config
from planner.integrations.shell import read_script, statements

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")
PROBE = ('torchrun() { while [ $# -gt 0 ] && [ "${1##*/}" != pretrain_gpt.py ]; do shift; done; shift; '
         'printf "%s\\0" "$@"; }\n')


def bash_argv(script: str) -> list[str]:
    """The words bash passes to pretrain_gpt.py when it runs `script` (no arguments, no environment but PATH)."""
    out = subprocess.run([BASH or "bash", "-c", PROBE + script], capture_output=True, timeout=30,
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    return out.stdout.decode().split("\0")[:-1]


def reader_argv(script: str) -> list[str]:
    read = read_script(script)
    assert len(read.launches) == 1, read.launches
    return read.launches[0].argv


def _read(tmp_path, text: str, gpus: int = 8, name: str = "run.sh"):
    path = tmp_path / name
    path.write_text(text)
    return read_config(path, gpus=gpus)


# ---- comments ---------------------------------------------------------------------------------------------------

@needs_bash
def test_a_comment_ending_in_a_backslash_does_not_swallow_the_next_line():
    # bash(1) COMMENTS: a word beginning with # causes that word and the rest of the line to be ignored; the
    # backslash is part of the comment, so it continues nothing (`printf '# c \\\necho hi\n' | bash` prints hi)
    text = "# c \\\necho hi\n"
    assert subprocess.run([BASH or "bash", "-c", text], capture_output=True, text=True).stdout == "hi\n"
    assert statements(text) == [(2, "echo hi")]


def test_bloom_176b_slurm_script_reads_its_launch():
    # bigscience tr11-176B-ml.slurm: line 182 `#    --universal-checkpoint \` sits above `export CMD="..."`;
    # expected from the file: TP_SIZE=4, PP_SIZE=12, MICRO_BATCH_SIZE=2, GLOBAL_BATCH_SIZE=2048, SEQ_LEN=2048,
    # --checkpoint-activations (full recompute), --bf16; dp = 48 nodes x 8 GPUs / (4 x 12) = 8 (derived)
    view = read_config(CONFIGS / "megatron-deepspeed" / "tr11_176b_ml.slurm", gpus=48 * 8)
    f = view.fields
    assert (f["tp"], f["pp"], f["dp"], f["micro_batch_size"]) == (4, 12, 8, 2)
    assert (view.global_batch_size, view.seq_length, f["recompute"], view.precision) == (2048, 2048, "full", "bf16")
    assert f["num_micro_batches"] == 2048 // (2 * 8)  # derived: GBS / (mbs x dp)
    # the data-ratio `python ...py` commands before it are not the launch; `echo $CMD` is not one either
    assert not any("--dataset-ratios-path" in n or "--split" in n for n in view.notes)


# ---- arrays, appends, defaults, inline comments -------------------------------------------------------------------

ARRAYS = """\
TOKENIZER_ARG=${3:-"MOCK"} # Path to tokenizer model, or "MOCK"
DTYPE_ARGS=()
DTYPE_ARGS+=(
    "--fp8-format hybrid"
    "--fp8-param-gather"
)
DDP_ARGS=(
    --use-distributed-optimizer   # a comment inside an array
    --overlap-grad-reduce
)
TRAINING_ARGS=(--micro-batch-size 1)
TRAINING_ARGS+=("${DDP_ARGS[@]}")
ARGS=(--tensor-model-parallel-size 8)
ARGS+=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)
ARGS+=(--use-distributed-optimizer)
QUOTED=("--tokenizer-model $TOKENIZER_ARG")
torchrun pretrain_gpt.py ${ARGS[@]} ${TRAINING_ARGS[@]} ${DTYPE_ARGS[@]} "${QUOTED[@]}" --data-path "${4:-MOCK}"
"""


@needs_bash
def test_arrays_appends_and_defaults_expand_as_bash_expands_them():
    expected = ["--tensor-model-parallel-size", "8", "--recompute-granularity", "full", "--recompute-method",
                "uniform", "--recompute-num-layers", "1", "--use-distributed-optimizer", "--micro-batch-size", "1",
                "--use-distributed-optimizer", "--overlap-grad-reduce", "--fp8-format", "hybrid",
                "--fp8-param-gather", "--tokenizer-model MOCK", "--data-path", "MOCK"]
    assert bash_argv(ARRAYS) == expected  # bash's own expansion: the source of the expected words
    assert reader_argv(ARRAYS) == expected


def test_megatron_llama3_8b_fp8_example_runs_fp8(tmp_path):
    # Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh: DTYPE="fp8" appends "--fp8-format hybrid" and
    # "--fp8-param-gather" to DTYPE_ARGS, passed unquoted (${DTYPE_ARGS[@]}: bash splits each element); DDP_ARGS
    # (--use-distributed-optimizer) is appended to TRAINING_ARGS; --fp8-recipe is not given: delayed (frameworks.md
    # §2.8); MICRO_BATCH_SIZE=1, GLOBAL_BATCH_SIZE=128, SEQ_LENGTH=8192, TP_SIZE=1 on 8 GPUs: dp 8
    view = read_config(CONFIGS / "megatron" / "llama3_8b_h100_fp8.sh", gpus=8)
    assert (view.precision, view.fp8_recipe, view.fp8_param_gather) == ("fp8", "delayed", True)
    f = view.fields
    assert (f["tp"], f["dp"], f["zero_stage"], f["micro_batch_size"]) == (1, 8, 1, 1)
    assert (view.global_batch_size, view.seq_length) == (128, 8192)
    text = " ".join(view.notes)
    assert "--fp8-format" not in text and "without --fp8-format" not in text
    assert "#" not in text  # inline comments after quoted values do not leak into the notes


def test_one_line_array_appends_are_assignments(tmp_path):
    # the audit's minimal repro: ARGS+=(... --recompute-num-layers 1) was read as '1)', ARGS+=(--use-distributed-
    # optimizer) dropped
    view = _read(tmp_path, "ARGS=(\n    --tensor-model-parallel-size 8\n    --micro-batch-size 1\n"
                 "    --global-batch-size 64\n    --seq-length 4096\n    --bf16\n)\n"
                 "ARGS+=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)\n"
                 "ARGS+=(--use-distributed-optimizer)\ntorchrun pretrain_gpt.py ${ARGS[@]}\n")
    assert (view.fields["recompute"], view.fields["zero_stage"]) == ("full", 1)  # distributed optimizer: ZeRO-1


# ---- the launch's own arguments -------------------------------------------------------------------------------

def test_launcher_and_helper_commands_are_not_megatron_options(tmp_path):
    # Megatron-DeepSpeed examples_deepspeed/rebase/ds_pretrain_gpt_1.3B.sh lines 146-147 (nvidia-smi in $( ... ))
    # and Megatron-LM examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh PROFILE_CMD (nsys flags before the
    # entry point): neither is Megatron's argument
    text = ("num_gpus_pernode=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)\n"
            "PROFILE_CMD=(\n    nsys profile\n    --sample=none --cpuctxsw=none\n"
            "    --capture-range=cudaProfilerApi --capture-range-end=stop\n)\n"
            "\"${PROFILE_CMD[@]}\" python -m torch.distributed.run --nproc_per_node $num_gpus_pernode pretrain_gpt.py "
            "--micro-batch-size 1 --global-batch-size 8 --seq-length 2048 --bf16\n")
    view = _read(tmp_path, text)
    assert not any(flag in " ".join(view.notes) for flag in ("--query-gpu", "--format", "--sample", "--capture"))
    assert view.global_batch_size == 8


# ---- if / elif / else, lists ----------------------------------------------------------------------------------

BRANCHES = """\
MODE="fp8"
N=4
EMPTY=
ARGS=(--micro-batch-size 1)
if [ "$MODE" = "bf16" ]; then
    ARGS+=(--bf16)
elif [[ $MODE == fp* ]] && [ $N -gt 1 ]; then
    ARGS+=(--fp8-format hybrid)
else
    ARGS+=(--fp16)
fi
if [ -n "$EMPTY" ] || [[ -z "$EMPTY" && $N -le 4 ]]; then ARGS+=(--sequence-parallel); fi
if [ ! "$N" -eq 4 ]; then ARGS+=(--use-distributed-optimizer); fi
[ "$N" -ne 4 ] && ARGS+=(--overlap-grad-reduce)
[ "$N" -ne 4 ] || ARGS+=(--overlap-param-gather)
if [ -z ${DATA_PATH+x} ]; then ARGS+=(--mock-data); else ARGS+=(--data-path "$DATA_PATH"); fi
if [ "$N" = 4 ]; then
    if [ "$MODE" != "fp8" ]; then ARGS+=(--bf16); fi
fi
torchrun pretrain_gpt.py "${ARGS[@]}"
"""


@needs_bash
def test_only_the_branch_bash_takes_is_read():
    expected = ["--micro-batch-size", "1", "--fp8-format", "hybrid", "--sequence-parallel", "--overlap-param-gather",
                "--mock-data"]
    assert bash_argv(BRANCHES) == expected  # bash's own choice of branches: the source of the expected words
    assert reader_argv(BRANCHES) == expected


def test_megatron_deepspeed_llama2_example_reads_its_activation_checkpoint_switch():
    # microsoft Megatron-DeepSpeed examples_deepspeed/pretrain_llama2_distributed.sh: activation_checkpoint="false",
    # so the `if [ "${activation_checkpoint}" = "true" ]` branch adding --recompute-granularity full is not run;
    # TP=2, PP=2, MICRO_BATCH_SIZE=4, GLOBAL_BATCH_SIZE=32 on 8 GPUs: dp = 8 / (2 x 2) = 2 (derived)
    view = read_config(CONFIGS / "megatron-deepspeed" / "llama2_distributed.sh", gpus=8)
    f = view.fields
    assert (f["recompute"], f["tp"], f["pp"], f["dp"], f["micro_batch_size"]) == ("none", 2, 2, 2, 4)
    assert view.global_batch_size == 32


def test_a_condition_on_the_environment_is_read_unset_and_said(tmp_path):
    # rule 2 (shell.py docstring): DATA_PATH is not set in the file; bash run without it takes the then-branch
    view = _read(tmp_path, "ARGS=\"--micro-batch-size 1 --global-batch-size 8 --seq-length 2048\"\n"
                 "if [ -z \"$DATA_PATH\" ]; then\n  ARGS=\"$ARGS --recompute-granularity full\"\nfi\n"
                 "torchrun pretrain_gpt.py $ARGS\n")
    assert view.fields["recompute"] == "full"
    assert any("line 2" in n and "$DATA_PATH" in n and "read as unset" in n and "true" in n for n in view.notes)


def test_a_condition_that_cannot_be_decided_is_refused_where_its_branch_reaches_the_launch(tmp_path):
    # rule 3: whether ./use_full exists is known only where the script runs
    from cluster_specs import SpecError

    text = ("RECOMPUTE=\nif [ -f ./use_full ]; then\n  RECOMPUTE=\"--recompute-granularity full\"\nfi\n"
            "torchrun pretrain_gpt.py --micro-batch-size 1 --global-batch-size 8 $RECOMPUTE\n")
    with pytest.raises(SpecError) as err:
        _read(tmp_path, text)
    message = " ".join(err.value.problems)
    assert "$RECOMPUTE" in message and "line 2" in message and "-f ./use_full" in message
    # ... and passed over where its branches set nothing the launch reads
    view = _read(tmp_path, "if [ ! -f pretrain_gpt.py ]; then\n  echo missing\n  exit 1\nfi\n"
                 "torchrun pretrain_gpt.py --micro-batch-size 1 --global-batch-size 8\n", name="quiet.sh")
    assert view.global_batch_size == 8 and not any("line 1" in n for n in view.notes)


# ---- $(( arithmetic )) ----------------------------------------------------------------------------------------

ARITHMETIC = """\
GPN=8
MICRO_BATCH=4
NODES=2
HEADS=64
KV=8
A=-7
torchrun pretrain_gpt.py --global-batch-size $(( ${GPN} * ${MICRO_BATCH} * ${NODES} )) \\
    --num-query-groups $(( HEADS / (HEADS / KV) )) --x $(($A / 2)) --y $((A % 3)) --z "$(( (1 + 2) * -3 ))" \\
    --w $(( 2 > 1 )) --v $((0x10 - 010 + 10))
"""


@needs_bash
def test_arithmetic_evaluates_as_bash_does():
    # bash's own results are the source; -7 / 2 = -3 and -7 % 3 = -1 (C: toward zero); 010 is octal (8) in bash,
    # which the planner does not read: the last word is left opaque, so only the first 13 words are compared
    expected = ["--global-batch-size", "64", "--num-query-groups", "8", "--x", "-3", "--y", "-1", "--z", "-9",
                "--w", "1", "--v"]
    got = bash_argv(ARITHMETIC)
    assert got[:13] == expected and got[13] == str(16 - 8 + 10)
    mine = reader_argv(ARITHMETIC)
    assert mine[:13] == expected and mine[13].startswith("$((")  # octal: refused, not misread as 10


def test_megatron_deepspeed_azure_175b_global_batch_is_evaluated():
    # microsoft Megatron-DeepSpeed examples_deepspeed/azure/run-175b.sh: GLOBAL_BATCH=$(( ${GPN} * ${MICRO_BATCH} *
    # ${NODES} )) with GPN=8, MICRO_BATCH=4, NODES=1: 32 (derived); TP=1, PP=1 (--no-pipeline-parallel), ZeRO-3,
    # --checkpoint-activations, --fp16, SEQ=1024
    view = read_config(CONFIGS / "megatron-deepspeed" / "azure_run_175b.sh", gpus=8)
    f = view.fields
    assert (view.global_batch_size, f["micro_batch_size"], f["dp"], f["num_micro_batches"]) == (32, 4, 8, 1)
    assert (f["zero_stage"], f["recompute"], view.precision, view.seq_length) == (3, "full", "fp16", 1024)


def test_amd_llama3_example_reads_its_defaults():
    # NVIDIA/Megatron-LM (AMD ROCm copy) examples/llama/train_llama3.sh read as run with no arguments and no
    # environment: MODEL_SIZE=70 -> 80 layers, hidden 8192, 64 heads, 8 KV heads; NUM_GROUPS = 64 / (64 / 8) = 8
    # ($(( )) twice); TP=8, PP=1, MBS=1, BS=8, SEQ_LENGTH=2048; FSDP=0 and OPTIMIZER=adam -> --use-distributed-
    # optimizer; SEQ_PARALLEL=1 -> --sequence-parallel; RECOMPUTE=0 and TE_FP8=0 -> no recompute, bf16; on 8 GPUs:
    # dp 1 (derived); DATA_PATH is not set in the file: --mock-data, said in a note
    view = read_config(CONFIGS / "megatron" / "amd_train_llama3.sh", gpus=8)
    f = view.fields
    assert (f["tp"], f["pp"], f["dp"], f["micro_batch_size"], view.global_batch_size) == (8, 1, 1, 1, 8)
    assert (f["zero_stage"], f["sequence_parallel"], f["recompute"], view.precision) == (1, True, "none", "bf16")
    assert (view.model["num_layers"], view.model["hidden_size"], view.model["num_kv_heads"]) == (80, 8192, 8)
    assert any("$DATA_PATH" in n and "read as unset" in n for n in view.notes)


def test_arithmetic_the_file_cannot_settle_is_refused_naming_it(tmp_path):
    from cluster_specs import SpecError

    # the text is never run: a name is a variable the file sets, or the construct is refused
    for expr, why in (("$(nproc) * 2", "runs a command"), ("GPN * 2", "GPN is not set in the file"),
                      ("__import__('os').getpid()", "__import__ is not set in the file"),
                      ("7 // 2", "not integer arithmetic")):
        with pytest.raises(SpecError) as err:
            _read(tmp_path, f"torchrun pretrain_gpt.py --micro-batch-size 1 --global-batch-size $(( {expr} ))\n")
        message = " ".join(err.value.problems)
        assert "--global-batch-size" in message and "line 1" in message and why in message, message


def test_pathological_scripts_are_one_line_errors_not_tracebacks(tmp_path):
    from cluster_specs import SpecError

    doubling = "A=x\n" + "A=$A$A\n" * 25  # 2**25 characters: over shell.MAX_VALUE_CHARS
    with pytest.raises(SpecError) as err:
        _read(tmp_path, doubling + "torchrun pretrain_gpt.py --micro-batch-size 1\n")
    assert "line 21: A: a value over 1,000,000 characters" in err.value.problems[0]  # 2**20 > 10**6
    deep = "X=" + "${a:-" * 3000 + "}" * 3000 + "\ntorchrun pretrain_gpt.py --micro-batch-size 1\n"
    with pytest.raises(SpecError, match="nests expansions too deeply"):
        _read(tmp_path, deep, name="deep.sh")


LAUNCH = "torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size $TP --micro-batch-size 1\n"


@needs_bash
def test_false_fails_its_list():
    """`false && TP=4` leaves TP at 2 in bash; the reader took every command but a test to succeed (audit of
    2026-12-08)."""
    script = "TP=2\nfalse && TP=4\ntrue || TP=8\n" + LAUNCH
    assert reader_argv(script) == bash_argv(script)
    assert "2" in reader_argv(script)


def test_base_notation_is_not_evaluated_as_python_would():
    """bash reads $((2#11)) as 3; Python's ast read `#` as a comment and gave 2 (audit of 2026-12-08)."""
    from cluster_specs import SpecError

    with pytest.raises(SpecError, match="base#digits"):
        read_config_text("TP=$((2#11))\n" + LAUNCH)


def read_config_text(text: str):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "run.sh"
        path.write_text(text)
        return read_config(path, gpus=8)


@pytest.mark.parametrize(("text", "says"), [
    ("TP=2\r\n" + LAUNCH.replace("\n", "\r\n"), "CRLF line endings"),
    ('TP="2\n' + LAUNCH, 'opened and never closed'),
    ("ARGS=(--tensor-model-parallel-size 2\n" + LAUNCH, "( opened and never closed"),
    ("echo hello\n", "no launch"),
    ("TP=2\nexit 0\n" + LAUNCH, "no launch"),
])
def test_a_script_bash_would_not_run_as_read_is_refused(text, says):
    """An unterminated quote or array, CRLF line endings, or no launch on the path bash takes was checked as
    Megatron's defaults (tp 1, fp32, 'micro_batch_size missing'), exit 1 (audit of 2026-12-08); bash stops with
    'unexpected EOF', reads the carriage returns into the words, or launches nothing."""
    from cluster_specs import SpecError

    with pytest.raises(SpecError, match=re.escape(says)):
        read_config_text(text)


def test_two_launches_say_which_was_read():
    view = read_config_text("TP=2\n" + LAUNCH + "TP=8\n" + LAUNCH.replace("--micro-batch-size 1",
                                                                          "--micro-batch-size 1 --seq-length 4096"))
    assert any("2 launches (lines 2, 4): read the one at line 4" in n for n in view.notes), view.notes


def test_a_long_value_is_refused_before_it_is_split(monkeypatch):
    """`A=$A$A` doubled past the bound took 18 s to be refused: the value was split (at a cost growing with its
    length squared) before its length was checked. Now nothing past the bound reaches split_words."""
    from cluster_specs import SpecError
    from planner.integrations import shell

    longest = []
    real = shell.split_words
    monkeypatch.setattr(shell, "split_words", lambda text: longest.append(len(text)) or real(text))
    with pytest.raises(SpecError, match="A: a value over 1,000,000 characters"):
        read_config_text("A=x\n" + "A=$A$A\n" * 25 + LAUNCH)
    assert max(longest) <= shell.MAX_VALUE_CHARS
