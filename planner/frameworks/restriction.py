"""The search space a user asked for: the framework's capabilities, pinned layout keys (`--fix tp=8`) and allowed
schedules (`--schedules 1f1b,interleaved_1f1b`). The search calls `Restriction.adjust` on every candidate."""

from __future__ import annotations

from dataclasses import dataclass, field

from cluster_specs import SpecError
from planner.frameworks.capabilities import Capabilities, capabilities
from planner.inputs.specs import SCHEDULES, TrainingSpec

# layout keys the search enumerates; per-stage lists come from the refinement, not the search
FIXABLE = ("tp", "pp", "dp", "cp", "ep", "zero_stage", "offload", "micro_batch_size", "num_micro_batches", "recompute",
           "sequence_parallel", "schedule", "virtual_stages", "dp_shard")
# keys a layout may carry that the search does not vary: why, for the refusal
NOT_SEARCHED = {
    "layers_per_stage": "per-stage lists are the refinement's output, not a search key",
    "recompute_layers_per_stage": "per-stage lists are the refinement's output, not a search key",
    "cp_comm": "the search plans the exchange the framework runs (Capabilities.planned_cp_comm: the ring where it "
               "has one, else Ulysses)",
    "etp": "the search plans experts without expert tensor parallelism (etp 1)",
}


@dataclass(frozen=True)
class Restriction:
    caps: Capabilities
    vocab_size: int
    fixed: dict = field(default_factory=dict)
    schedules: tuple[str, ...] | None = None
    training: TrainingSpec | None = None  # its optimizer states may need a ZeRO stage (Capabilities.state_zero_problem)

    def adjust(self, f: dict) -> dict | None:
        """The candidate fields as the framework would run them, or None when the candidate is excluded."""
        g = dict(f)
        if not self.caps.sequence_parallel or g.get("schedule") in self.caps.no_sp_schedules:
            g["sequence_parallel"] = False
        if g.get("cp", 1) > 1 and g.get("cp_comm") == "a2a" and self.caps.ulysses_excludes_sp:
            g["sequence_parallel"] = False  # Megatron-DeepSpeed: Ulysses cannot be combined with --sequence-parallel
        if "sequence_parallel" in self.fixed:
            g["sequence_parallel"] = self.fixed["sequence_parallel"] and g.get("tp", 1) > 1
        for key, value in self.fixed.items():
            if key in g and g[key] != value:
                return None
        schedule = g.get("schedule", "1f1b")
        if self.schedules is not None and g.get("pp", 1) > 1 and schedule not in self.schedules:
            return None
        asked = (self.schedules is not None and schedule in self.schedules) or self.fixed.get("schedule") == schedule
        if g.get("pp", 1) > 1 and schedule in self.caps.unpredicted_schedules and not asked:
            return None  # the framework runs it, the model predicts another schedule: searched only when asked
        if self.caps.refusal(g) or self.caps.vocab_problem(self.vocab_size, g.get("tp", 1)):
            return None
        if self.training is not None and self.caps.state_zero_problem(self.training, g.get("zero_stage", 0)):
            return None
        return g

    def admits(self, layout_fields: dict) -> bool:
        return self.adjust(layout_fields) == layout_fields


def parse_fix(items: list[str] | None) -> dict:
    """`--fix tp=8 --fix pp=4,zero=1` -> {'tp': 8, 'pp': 4, 'zero_stage': 1} (layout-string keys and aliases)."""
    from planner.inputs.layout_string import parse_layout_string

    fixed = parse_layout_string(",".join(items or []))
    for key, value in fixed.items():
        least = 0 if key == "zero_stage" else 1
        if isinstance(value, int) and not isinstance(value, bool) and value < least:  # sp=0 parses as False
            raise SpecError(f"--fix {key}: {value} -> must be an integer >= {least}")
        if key not in FIXABLE:
            why = NOT_SEARCHED.get(key, "not a search key")
            raise SpecError(f"--fix {key}: {why} -> estimate that layout with `planner estimate --layout`; fixable: "
                            f"{', '.join(FIXABLE)}")
    return fixed


def _shard_problem(caps: Capabilities, fixed: dict) -> str | None:
    """Why a pinned hybrid sharding degree (`--fix shard=8`) cannot be searched in this framework, or None."""
    if "dp_shard" not in fixed:
        return None
    why = caps.hybrid_shard_refusal(fixed["dp_shard"], fixed.get("zero_stage"))
    return f"{caps.framework.value}: {why}" if why else None


def parse_schedules(text: str | None) -> tuple[str, ...] | None:
    if not text:
        return None
    names = tuple(s.strip().lower() for s in text.split(",") if s.strip())
    bad = [s for s in names if s not in SCHEDULES]
    if bad or not names:
        raise SpecError(f"--schedules: {', '.join(bad) or text!r} -> allowed: {', '.join(SCHEDULES)}")
    return names


def build_restriction(framework: str | None, vocab_size: int, fix: list[str] | None = None,
                      schedules: str | None = None, training: TrainingSpec | None = None) -> Restriction:
    """Validate the options against each other and the framework; one-line errors name the conflict. With
    `training`, only the ZeRO stages its optimizer states run at in this framework are searched."""
    caps = capabilities(framework)
    fixed = parse_fix(fix)
    allowed = parse_schedules(schedules)
    if allowed is not None:
        runnable = tuple(s for s in allowed if s in caps.schedules)
        if not runnable:
            raise SpecError(f"--schedules: {', '.join(allowed)} -> {caps.framework.value} runs "
                            f"{', '.join(caps.schedules)} ({caps.sources.get('schedules', '')})")
        allowed = runnable
    probe = {"pp": 2, **fixed} if "schedule" in fixed or "virtual_stages" in fixed else dict(fixed)
    if fixed.get("cp", 1) > 1 and caps.planned_cp_comm is not None:
        probe["cp_comm"] = caps.planned_cp_comm  # what the search plans the pinned degree with
    if "zero_stage" in fixed and "pp" not in fixed and fixed["zero_stage"] >= 2:
        probe["pp"] = 1
    why = caps.refusal(probe) or (caps.state_zero_problem(training, fixed["zero_stage"])
                                  if training is not None and "zero_stage" in fixed else None) or _shard_problem(caps, fixed)
    if why:
        raise SpecError(f"--fix: {why}")
    if allowed is not None and "schedule" in fixed and fixed["schedule"] not in allowed:
        raise SpecError(f"--fix schedule={fixed['schedule']} -> not in --schedules {','.join(allowed)}")
    if "tp" in fixed:
        vocab = caps.vocab_problem(vocab_size, fixed["tp"])
        if vocab:
            raise SpecError(f"--fix tp={fixed['tp']}: {vocab}")
    return Restriction(caps, vocab_size, fixed, allowed, training)
