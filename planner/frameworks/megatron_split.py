"""Megatron-Core's pipeline stage split: the decoder layers each pipeline rank builds from its flags, and the flags
that build a given split (frameworks.md §2.3; megatron-core transformer_config.py __post_init__, 0.16.1 L1294-1480).

`stage_layers` owns the flags' rule. The Megatron and NeMo exports write what `split_setting` finds, `check` reads a
config through `stage_layers`, the capability table refuses a split `split_setting` cannot express, and the export's
nearest split the flags express is `nearest_split`. Two ways to make the stages uneven, never together:
- `--decoder-first/last-pipeline-num-layers F K` (Bridge `model.num_layers_in_first/last_pipeline_stage`): each > 0,
  the rest divides over the middle stages; with virtual stages F, K and each middle rank's layers divide by them.
- `--account-for-embedding-in-pipeline-split` / `--account-for-loss-in-pipeline-split` (Bridge
  `model.account_for_embedding/loss_in_pipeline_split`): the embedding and the loss count as a layer each, so
  L' = L + e + l splits evenly (L' % pp == 0, with virtual stages (L'/pp) % vp == 0) and the first and last ranks
  build one decoder layer fewer. The only flags that give an interleaved pipeline k-1 layers on its end ranks.
A third way, `--pipeline-model-parallel-layout` (Bridge `model.pipeline_model_parallel_layout`), names every stage's
layers and conflicts with all the flags above. The exports write it for a split no flag builds (`split_setting`,
`layout_text`); `check` reads it (`parse_layout`, `layout_stage_layers`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass


class MegatronSplitError(ValueError):
    """A pipeline split Megatron-Core refuses at start-up (the message says which rule)."""


@dataclass(frozen=True)
class SplitFlags:
    first: int | None = None  # --decoder-first-pipeline-num-layers
    last: int | None = None  # --decoder-last-pipeline-num-layers
    embedding: bool = False  # --account-for-embedding-in-pipeline-split
    loss: bool = False  # --account-for-loss-in-pipeline-split

    def describe(self) -> str:
        parts = [f"--decoder-first-pipeline-num-layers {self.first}"] if self.first is not None else []
        parts += [f"--decoder-last-pipeline-num-layers {self.last}"] if self.last is not None else []
        parts += ["--account-for-embedding-in-pipeline-split"] if self.embedding else []
        parts += ["--account-for-loss-in-pipeline-split"] if self.loss else []
        return " ".join(parts) or "no split flags"


def stage_layers(num_layers: int, pp: int, vp: int, flags: SplitFlags) -> list[int]:
    """Decoder layers per pipeline rank (all its virtual stages together) as Megatron-Core builds them; raises
    MegatronSplitError with the rule it breaks."""
    if flags.first is not None or flags.last is not None:
        return _first_last(num_layers, pp, vp, flags)
    total = num_layers + flags.embedding + flags.loss
    counted = f"{total} layers (with the embedding and loss counted)" if total != num_layers else f"{total} layers"
    if total % pp:
        raise MegatronSplitError(f"{counted} do not divide over pp {pp} (Megatron asserts an even split)")
    per_rank = total // pp
    if vp > 1 and per_rank % vp:
        raise MegatronSplitError(f"{per_rank} layers per pipeline rank do not divide into {vp} virtual stages")
    split = [per_rank] * pp
    split[0] -= flags.embedding
    split[-1] -= flags.loss
    return split  # an end rank may build no decoder layer (k = 1): Megatron allows it, the planner's layouts do not


def _first_last(num_layers: int, pp: int, vp: int, flags: SplitFlags) -> list[int]:
    if flags.embedding or flags.loss:
        raise MegatronSplitError("--decoder-first/last-pipeline-num-layers cannot be combined with "
                                 "--account-for-embedding/loss-in-pipeline-split")
    given = [n for n in (flags.first, flags.last) if n is not None]
    if any(n <= 0 for n in given):
        raise MegatronSplitError(f"first/last stage layers {flags.first}/{flags.last} must be > 0")
    if vp > 1 and any(n % vp for n in given):
        raise MegatronSplitError(f"first/last stage layers {flags.first}/{flags.last} must each divide by the "
                                 f"{vp} virtual stages")
    middle_stages, rest = pp - len(given), num_layers - sum(given)
    if (middle_stages == 0) != (rest == 0) or rest < 0:
        raise MegatronSplitError(f"{rest} middle layers remaining but {middle_stages} middle stages")
    if middle_stages and rest % middle_stages:
        raise MegatronSplitError(f"{rest} middle layers do not divide over {middle_stages} middle stages")
    mid = rest // middle_stages if middle_stages else 0
    if middle_stages and vp > 1 and mid % vp:
        raise MegatronSplitError(f"{mid} layers per middle rank do not divide into {vp} virtual stages")
    return ([flags.first] if flags.first is not None else []) + [mid] * middle_stages + \
        ([flags.last] if flags.last is not None else [])


# account-for settings in the order the export prefers them: both (Megatron-Bridge's recipes), then the loss (the
# output layer and cross-entropy outweigh the embedding lookup), then the embedding
ACCOUNT_FOR = (SplitFlags(embedding=True, loss=True), SplitFlags(loss=True), SplitFlags(embedding=True))


def _built(num_layers: int, pp: int, vp: int, settings: Iterable[SplitFlags], least: int) -> list[list[int]]:
    """The distinct splits `settings` build (in their order) whose every stage keeps at least `least` layers."""
    out: list[list[int]] = []
    for flags in settings:
        try:
            split = stage_layers(num_layers, pp, vp, flags)
        except MegatronSplitError:
            continue
        if min(split) >= least and split not in out:
            out.append(split)
    return out


def account_for_splits(num_layers: int, pp: int, vp: int) -> list[list[int]]:
    """The splits the account-for settings build (ACCOUNT_FOR order), every chunk keeping a layer (torchtitan builds
    no empty stage either)."""
    return _built(num_layers, pp, vp, ACCOUNT_FOR, least=vp)


def split_flags(num_layers: int, pp: int, vp: int, split: list[int]) -> SplitFlags:
    """The flags that make Megatron-Core build `split` (per rank): none for an even split, else first/last, else the
    account-for flags. Raises MegatronSplitError saying why no setting builds it."""
    if pp == 1:
        return SplitFlags()
    for flags in (SplitFlags(), SplitFlags(first=split[0], last=split[-1]), *ACCOUNT_FOR):
        if _built(num_layers, pp, vp, [flags], least=0) == [list(split)]:
            return flags
    with_vp = f" with {vp} virtual stages" if vp > 1 else ""
    multiple = f" (each a multiple of {vp})" if vp > 1 else ""
    raise MegatronSplitError(
        f"{'/'.join(map(str, split))}{with_vp} -> Megatron builds an even split, first/last stages with an even middle"
        f"{multiple}, or k layers on every middle rank and k-1 or k on the end ranks (the account-for flags"
        + (f", k a multiple of {vp})" if vp > 1 else ")"))


def expressible_splits(num_layers: int, pp: int, vp: int) -> list[list[int]]:
    """Every split (per rank, each stage >= 1 layer) some Megatron flag setting builds."""
    if pp == 1:
        return [[num_layers]]
    settings = [SplitFlags(), *ACCOUNT_FOR]
    settings += [SplitFlags(first=f, last=k) for f in range(1, num_layers) for k in range(1, num_layers - f + 1)]
    return _built(num_layers, pp, vp, settings, least=1)


def nearest_split(num_layers: int, pp: int, vp: int, target: list[int]) -> list[int]:
    """The split Megatron can build closest to `target` (least largest, then total, difference per stage; then the
    smallest largest stage). Raises MegatronSplitError when no setting fills `pp` stages."""
    best, best_key = None, None
    for cand in expressible_splits(num_layers, pp, vp):
        diffs = [abs(a - b) for a, b in zip(cand, target, strict=True)]
        key = (max(diffs), sum(diffs), max(cand))
        if best_key is None or key < best_key:
            best, best_key = cand, key
    if best is None:
        with_vp = f" with {vp} virtual stages" if vp > 1 else ""
        raise MegatronSplitError(f"{num_layers} layers cannot fill {pp} Megatron stages{with_vp}")
    return best


# ---- --pipeline-model-parallel-layout (megatron-core transformer/pipeline_parallel_layer_layout.py) -------------
# One character per layer: E the embedding, t a decoder ("transformer") layer, m an MTP layer, L the loss; '|' ends
# a stage; ',' is cosmetic; "(...)*n" and "x*n" repeat. Stage i of the unrolled list is virtual stage i // pp of
# pipeline rank i % pp, so the string lists the stages in layer order and vpp = stages / pp.
LAYOUT_LAYERS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
_LAYOUT_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
_LAYOUT_CHAR = re.compile(r"(.)\*(\d+)")
MAX_LAYOUT_LAYERS = 100_000  # an unrolled layout longer than this is a typo, not a model


@dataclass(frozen=True)
class PipelineLayout:
    """A parsed layout string: the layer characters of each stage, in layer order."""
    text: str
    pp: int
    stages: tuple[str, ...]

    @property
    def virtual_stages(self) -> int:
        return len(self.stages) // self.pp

    def count(self, char: str) -> int:
        return sum(stage.count(char) for stage in self.stages)

    def rank_stages(self, rank: int) -> list[str]:
        """Pipeline rank `rank`'s stages, virtual stage 0 first."""
        return list(self.stages[rank::self.pp])


def shorten(text: str, most: int = 60) -> str:
    """`text` as an error message quotes it: at most `most` characters."""
    return text if len(text) <= most else text[:most - 3] + "..."


def _unroll(text: str) -> str:
    def repeat(match: re.Match[str]) -> str:
        digits = match.group(2)
        if len(digits) > len(str(MAX_LAYOUT_LAYERS)) or len(match.group(1)) * int(digits) > MAX_LAYOUT_LAYERS:
            raise MegatronSplitError(f"{shorten(match.group(0))!r} repeats to more than {MAX_LAYOUT_LAYERS:,} layers")
        return match.group(1) * int(digits)

    out = text.replace(",", "")
    for pattern in (_LAYOUT_GROUP, _LAYOUT_CHAR):
        out = pattern.sub(repeat, out)
        if len(out) > MAX_LAYOUT_LAYERS:
            raise MegatronSplitError(f"the layout unrolls to more than {MAX_LAYOUT_LAYERS:,} layers")
    return out


def parse_layout(text: str, pp: int) -> PipelineLayout:
    """The stages a --pipeline-model-parallel-layout string describes (PipelineParallelLayerLayout.parse_str_to_list
    and its constructor's checks); raises MegatronSplitError with the rule it breaks."""
    stages = tuple(_unroll(text).split("|"))
    for stage in stages:
        bad = sorted(set(stage) - set(LAYOUT_LAYERS))
        if bad:
            raise MegatronSplitError(f"invalid layer character {bad[0]!r} in stage {stage!r} (known: "
                                     + ", ".join(f"{c} {name}" for c, name in LAYOUT_LAYERS.items()) + ")")
    if len(stages) % pp:
        raise MegatronSplitError(f"{len(stages)} stages do not divide over pp {pp} (the stage count must be a "
                                 "multiple of the pipeline size)")
    return PipelineLayout(text, pp, stages)


def layout_stage_layers(layout: PipelineLayout, num_layers: int, mtp_layers: int | None) -> list[int]:
    """Decoder layers per pipeline rank (its virtual stages together) the layout builds, after Megatron-Core's
    validate_layer_layout rules; raises MegatronSplitError with the rule it breaks."""
    flat = "".join(layout.stages)
    if not flat.startswith("E") or flat.count("E") != 1:
        raise MegatronSplitError("the embedding (E) must be the first layer and appear exactly once")
    if not flat.endswith("L") or flat.count("L") != 1:
        raise MegatronSplitError("the loss (L) must be the last layer and appear exactly once")
    if flat.count("t") != num_layers:
        raise MegatronSplitError(f"{flat.count('t')} decoder layers (t) but the model has {num_layers}")
    mtp = flat.count("m")
    if mtp != (mtp_layers or 0):
        raise MegatronSplitError(f"{mtp} MTP layers (m) but the config sets {mtp_layers or 0} (mtp_num_layers)")
    if mtp and "t" in flat[flat.index("m"):]:
        raise MegatronSplitError("decoder layers must be placed before the MTP layers")
    for rank in range(layout.pp):
        own = layout.rank_stages(rank)
        if any("m" in stage for stage in own[:-1]):
            raise MegatronSplitError(f"pipeline rank {rank} holds MTP layers outside its last virtual stage")
        if "m" in own[-1] and own[-1].count("m") != mtp:
            raise MegatronSplitError("all the MTP layers must be in one virtual stage")
    return [sum(stage.count("t") for stage in layout.rank_stages(rank)) for rank in range(layout.pp)]


def layout_text(split: list[int], vp: int) -> str:
    """The --pipeline-model-parallel-layout string that builds `split` (decoder layers per rank) over `vp` virtual
    stages: each rank's layers dealt over its virtual stages, the larger ones first; runs of equal stages written
    "(t*n|)*k". Raises MegatronSplitError when a virtual stage would hold no decoder layer."""
    pp = len(split)
    if min(split) < vp:
        raise MegatronSplitError(f"{'/'.join(map(str, split))} with {vp} virtual stages -> a virtual stage would "
                                 "hold no decoder layer")
    chunks = [[n // vp + (k < n % vp) for k in range(vp)] for n in split]
    stages = [chunks[i % pp][i // pp] for i in range(pp * vp)]
    words = [("E" if i == 0 else "") + (f"t*{n}" if n > 1 else "t") + ("L" if i == len(stages) - 1 else "")
             for i, n in enumerate(stages)]
    runs = [(word, len(list(group))) for word, group in itertools.groupby(words)]
    return "".join(f"({word}|)*{n}" if n > 1 else word + "|" for word, n in runs).removesuffix("|")


def split_setting(num_layers: int, pp: int, vp: int, split: list[int]) -> SplitFlags | str:
    """How the Megatron exports build `split`: the flags `split_flags` finds, else the layout string (megatron-core
    0.16.1 reads it; its own parser builds the same stages in the tests). Raises MegatronSplitError when neither
    does (a rank with fewer layers than virtual stages)."""
    try:
        return split_flags(num_layers, pp, vp, split)
    except MegatronSplitError:
        if sum(split) != num_layers or len(split) != pp:
            raise
        return layout_text(split, vp)
