"""How a layout differs from the pick, in one line: the fields that differ, the step-time change and its
main cause, and the memory. Used for runners-up and compared layouts (instead of repeating the pick's note)."""

from __future__ import annotations

from typing import Any

GIB = 2**30
FIELDS = (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"), ("ep", "ep"), ("zero_stage", "zero"),
          ("dp_shard", "shard"), ("offload", "offload"),
          ("micro_batch_size", "mbs"), ("recompute", "recompute"), ("sequence_parallel", "sp"),
          ("schedule", "schedule"), ("virtual_stages", "vpp"), ("layers_per_stage", "layers per stage"),
          ("recompute_layers_per_stage", "recomputed layers per stage"))


NONE_TEXT = {"dp_shard": "every dp rank"}  # what a field's None means, where 'default' would not say it


def _show(value: Any, name: str = "") -> str:
    if value is None and name in NONE_TEXT:
        return NONE_TEXT[name]
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return "/".join(str(x) for x in value)
    return "default" if value is None else str(value)


def layout_differences(pick, other) -> list[str]:
    """'pp 56 instead of 35' for each layout field that differs (CandidateReport or LayoutSpec)."""
    a, b = getattr(pick, "layout", pick), getattr(other, "layout", other)
    return [f"{label} {_show(getattr(b, name), name)} instead of {_show(getattr(a, name), name)}" for name, label in FIELDS
            if getattr(a, name) != getattr(b, name)]


def versus(pick, other) -> str:
    """One line for a runner-up or compared layout (CandidateReports)."""
    delta = other.predicted.step_time_seconds / pick.predicted.step_time_seconds - 1
    text = f"{', '.join(layout_differences(pick, other)) or 'the same layout'}: {delta:+.1%} step time"
    mine, theirs = pick.time_breakdown.exposed(), other.time_breakdown.exposed()
    sign = 1.0 if delta >= 0 else -1.0  # the part that moves the step time the way it moved
    what, diff = max(((k, theirs[k] - mine[k]) for k in mine), key=lambda kv: sign * kv[1])
    if sign * diff > 1e-3 * pick.predicted.step_time_seconds:
        text += f", mostly {what} ({diff:+.3g} s)"
    p = other.predicted
    text += f"; {p.peak_memory_bytes_per_gpu / GIB:.1f}/{p.gpu_memory_bytes / GIB:.1f} GiB on stage {p.peak_memory_stage}"
    return text + ("" if p.fits else " (does not fit)")
