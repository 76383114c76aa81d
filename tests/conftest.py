import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
VALIDATION = SHARED / "validation" / "published_runs.json"

os.environ.setdefault("OMP_NUM_THREADS", "1")


def gpt_shape(**kw):
    from cost_models.inputs import Transformer

    base = dict(num_layers=96, hidden_size=12288, num_attention_heads=96, num_kv_heads=96, ffn_hidden_size=4 * 12288,
                vocab_size=51200, swiglu=False, tied_embeddings=True, rms_norm=False, flash_attention=False,
                learned_position_embeddings=True, max_position_embeddings=2048, bias=True, dropout=True)
    base.update(kw)
    return Transformer(**base)


@pytest.fixture
def planner_cmd():
    return [sys.executable, "-m", "planner.cli"]
