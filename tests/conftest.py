import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The project's shared data (reference notes, published runs) sits beside the checkout; CI always lays it there.
# PLANNER_SHARED_DIR points the tests elsewhere (tests/test_skips.py uses it to check the failure below).
SHARED = Path(os.environ.get("PLANNER_SHARED_DIR") or ROOT.parent / "shared")
VALIDATION = SHARED / "validation" / "published_runs.json"


def require_shared(path: Path) -> Path:
    """`path`, or a failure (never a skip) saying where the shared data should be."""
    if not path.is_file():
        pytest.fail(f"{path} is missing: the validation tests need the project's shared data at {SHARED} "
                    "(../shared beside the checkout, as CI lays it; PLANNER_SHARED_DIR=DIR points elsewhere)",
                    pytrace=False)
    return path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def gpt_shape(**kw):
    from cost_models.inputs import Transformer

    base = dict(num_layers=96, hidden_size=12288, num_attention_heads=96, num_kv_heads=96, ffn_hidden_size=4 * 12288,
                vocab_size=51200, swiglu=False, tied_embeddings=True, rms_norm=False, flash_attention=False,
                learned_position_embeddings=True, max_position_embeddings=2048, bias=True, dropout=True)
    base.update(kw)
    return Transformer(**base)


def read_deepspeed_zero(tmp_path: Path, zero: dict, *, gpus: int = 64, **top):
    """What `check` reads from a small bf16 DeepSpeed config (64 sequences of one micro-batch) with this
    `zero_optimization` section and the top-level keys `top`."""
    import json

    from planner.integrations.readers import read_config

    path = Path(tmp_path) / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
                                "bf16": {"enabled": True}, "zero_optimization": zero, **top}))
    return read_config(path, gpus=gpus)


@pytest.fixture
def planner_cmd():
    return [sys.executable, "-m", "planner.cli"]


@pytest.fixture(autouse=True)
def _release_highs_threads():
    """After each test, stop HiGHS's worker threads (highspy keeps a thread pool after its first solve). A process
    forked while that pool is alive deadlocks in its own first solve (the fork copies only the calling thread):
    `make mutate` forks one child per mutant from the process that ran the tests, so without this every mutant
    whose tests call the ILP hung until mutmut's CPU limit and was counted "timeout" (= killed) whatever it changed
    (docs/mutation.md)."""
    yield
    highspy = sys.modules.get("highspy")
    if highspy is not None:
        highspy.Highs.resetGlobalScheduler(True)
