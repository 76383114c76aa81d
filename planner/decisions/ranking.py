"""The ranking error band: how far apart two layouts' predicted step times must be before the planner may say
which one is faster.

Two layouts of the same model on the same cluster share most of their prediction error (the GPU's achievable
efficiency, the kernels, the framework's overheads), so whether they tie is judged on the error of the *ratio*
of their predictions, not on one prediction's band (which on Ampere above 512 GPUs is about +-50% wide and
would tie dozens of layouts). For two runs i, j of one model, cluster, batch and sequence length, with
e = predicted / measured - 1, the ratio error is

    r_ij = (predicted_i / predicted_j) / (measured_i / measured_j) - 1 = (1 + e_i) / (1 + e_j) - 1.

The source is vTrain's 109 measured Megatron-DeepSpeed runs on A100 (planner/validation_vtrain.py; four models,
each with 15-47 layouts on one cluster: 1,721 pairs). No knob is fitted on those rows (the knobs are the ones fitted
on ../shared/validation and shipped in planner/data/error_bands.json), so every ratio error is out of sample; a
knob that scales every prediction alike cancels in the ratio anyway.

- tie tolerance: the central BAND_COVERAGE (80%) of the signed ratio errors over both orders of each pair,
  i.e. the 80th percentile of |ln(1 + r)|, as a relative step-time difference. Two layouts closer than this
  cannot be ordered with 80% confidence: they tie, and the short list for `planner bench --top K` names them.
- recommendation bound: the 20th percentile of |ln(1 + r)|. A layout predicted that much slower than the pick
  was in fact faster in 40% of past pairs (RECOMMEND_MIN_CHANCE: the signed ratio errors are symmetric, so
  P(r > d) = P(|r| > d) / 2): nearly a coin flip. Only then is a simpler layout recommended over the pick;
  beyond it the pick stays the recommendation, so a simpler layout is never recommended at a real cost.

`planner validate --write-tables` (`make validate`) and `python -m planner.decisions.ranking` write planner/data/ranking_band.json from the data;
tests/test_decisions.py recomputes it and checks the shipped file is current.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

RANKING_FILE = "ranking_band.json"
BAND_COVERAGE = 0.8  # as planner.bands: the central 80% of errors
RECOMMEND_MIN_CHANCE = 0.4  # a simpler layout must have been in fact faster in >= 40% of pairs that far apart


@dataclass(frozen=True)
class RankingBand:
    tie_tolerance: float  # relative step-time difference below which two layouts tie
    recommend_within: float  # a simpler tied layout is recommended only within this of the pick
    pairs: int
    source: str

    @property
    def description(self) -> str:
        return (f"the ranking error of two layouts' predicted step times: {BAND_COVERAGE:.0%} of {self.pairs:,} "
                f"pairs of layouts within {self.tie_tolerance:.1%} ({self.source})")


def _quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    k = (len(v) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def log_ratio_errors(groups: Iterable[list[float]]) -> list[float]:
    """|ln((1 + e_i) / (1 + e_j))| for every unordered pair inside each group of signed errors."""
    return [abs(math.log((1 + a) / (1 + b))) for g in groups for a, b in itertools.combinations(g, 2)]


def band_figures(groups: list[list[float]]) -> dict[str, Any]:
    """The tie tolerance and the recommendation bound of groups of signed errors (one group per model, cluster,
    batch and sequence length), as relative step-time differences."""
    logs = log_ratio_errors(groups)
    if not logs:
        raise ValueError("no pair of layouts to measure a ranking error on")
    return {"pairs": len(logs), "groups": [len(g) for g in groups],
            "tie_tolerance": math.expm1(_quantile(logs, BAND_COVERAGE)),
            "recommend_within": math.expm1(_quantile(logs, 1 - 2 * RECOMMEND_MIN_CHANCE))}


def error_groups(results: Iterable[Any], *, loso: bool = False) -> list[list[float]]:
    """Signed errors of validation CaseResults grouped by source, model, GPU type and count, global batch and
    sequence: runs of one model on one cluster, the layouts a plan ranks (an A100 run and an H100 run of the same
    shape are not two layouts of one plan)."""
    out: dict[tuple[Any, ...], list[float]] = {}
    for r in results:
        e = r.loso_error if loso else r.error
        if e is None:
            continue
        c = r.case
        key = (c.source, c.model.name, str(c.cluster.gpu), c.num_gpus, c.training.global_batch_size,
               c.training.seq_length)
        out.setdefault(key, []).append(e)
    return [g for g in out.values() if len(g) >= 2]


def table_from_results(vtrain_results: Iterable[Any]) -> dict[str, Any]:
    """The table of vTrain's predicted runs (planner.validation_vtrain.run_vtrain(...).results)."""
    from planner.validation_vtrain import VTRAIN_SOURCE

    table = band_figures(error_groups(vtrain_results))
    table.update(coverage=BAND_COVERAGE, source=f"{VTRAIN_SOURCE}, out of sample",
                 generated_by="planner validate --write-tables (make validate), or python -m planner.decisions.ranking")
    return table


def vtrain_table() -> dict[str, Any]:
    """The shipped table: vTrain's runs predicted with the shipped (all-source fitted) knobs."""
    from planner.bands import load_table
    from planner.validation_vtrain import run_vtrain

    return table_from_results(run_vtrain(load_table()["fitted_knobs"]).results)


def write_table(table: dict[str, Any], path: Path | None = None) -> Path:
    from planner.fileio import write_atomically

    path = path or Path(__file__).parent.parent / "data" / RANKING_FILE
    write_atomically(path, json.dumps(table, indent=1, sort_keys=True) + "\n")
    return path


@lru_cache(maxsize=1)
def ranking_band() -> RankingBand:
    text = resources.files("planner.data").joinpath(RANKING_FILE).read_text(encoding="utf-8")
    t = json.loads(text)
    return RankingBand(t["tie_tolerance"], t["recommend_within"], t["pairs"], t["source"])


if __name__ == "__main__":
    print(write_table(vtrain_table()))
