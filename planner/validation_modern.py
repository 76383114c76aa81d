"""The FP8, context-parallel and MoE rows of the validation set, reported on their own (docs/validation.md section).

Two figures per group: the step-time error of each row, and for rows that come in pairs (the same run in BF16
and in FP8, from the same source and layout) the error of the predicted FP8 speedup, which isolates the FP8
model (cost_models/fp8.py) from whatever the dense model gets wrong for that framework.
"""

from __future__ import annotations

import statistics


def _groups(result) -> list[str]:
    case = result.case
    out = []
    if str(case.training.precision) == "fp8":
        out.append("FP8")
    if case.layout_fields.get("cp", 1) > 1:
        out.append("CP")
    if case.model.moe is not None or case.layout_fields.get("ep", 1) > 1:
        out.append("MoE")
    return out


def _pair_key(row_id: str) -> str:
    return (row_id.replace("fp8", "X").replace("bf16", "X").replace("-float8", "").replace("-none", "")
            .replace("-async-tp", ""))


def modern_section(report) -> list[str]:
    """Markdown lines: the FP8/CP/MoE rows, the group medians, the FP8 speedup pairs and the skipped MoE rows."""
    lines = ["## FP8, context-parallel and MoE runs", "",
             "Rows that use FP8 GEMMs or context parallelism, estimated with the same knobs as every other row. The "
             "knobs were fitted before these rows could be evaluated (they were skipped then), so none of them "
             "influenced the fit: every row here is held out. Error = predicted / measured step time - 1.", "",
             "| row | group | layout evaluated | error | fits |", "|---|---|---|---|---|"]
    by_group: dict[str, list[float]] = {"FP8": [], "CP": [], "MoE": []}
    for res in report.results:
        groups = _groups(res)
        if not groups or res.error is None:
            continue
        for g in groups:
            by_group[g].append(abs(res.error))
        lines.append(f"| {res.case.row_id} | {'+'.join(groups)} | {res.layout.short()} | {res.error:+.1%} | "
                     f"{'yes' if res.fits else 'no'} |")
    lines.append("")
    moe_skipped = [rid for rid, why in report.skipped if why.startswith("MoE")]
    for g, errs in by_group.items():
        if errs:
            lines.append(f"- {g}: {len(errs)} rows, median |error| {statistics.median(errs):.1%}, max {max(errs):.1%}, "
                         f"false OOM {sum(1 for r in report.results if g in _groups(r) and not r.fits)}")
        else:
            lines.append(f"- {g}: no evaluable row ({len(moe_skipped)} MoE rows skipped: no expert shapes in the row)"
                         if g == "MoE" else f"- {g}: no evaluable row")
    return lines + ["", *fp8_speedup_pairs(report.results)]


def fp8_speedup_pairs(results) -> list[str]:
    """Predicted vs measured FP8 speedup for BF16/FP8 twins (same source, same layout)."""
    by_key: dict[str, dict] = {}
    for res in results:
        if res.error is None:
            continue
        kind = "fp8" if str(res.case.training.precision) == "fp8" else "bf16"
        by_key.setdefault(_pair_key(res.case.row_id), {})[kind] = res
    out = ["FP8 speedup over the BF16 twin (measured = BF16 step / FP8 step); this isolates the FP8 model from what "
           "the dense model gets wrong for a framework:", "",
           "| pair | measured | predicted | error |", "|---|---|---|---|"]
    errs = []
    for key, pair in sorted(by_key.items()):
        if set(pair) != {"fp8", "bf16"}:
            continue
        b, f = pair["bf16"], pair["fp8"]
        measured = b.case.measured_step_seconds / f.case.measured_step_seconds
        predicted = b.predicted_step_seconds / f.predicted_step_seconds
        errs.append(abs(predicted / measured - 1))
        out.append(f"| {key} | {measured:.2f}x | {predicted:.2f}x | {predicted / measured - 1:+.1%} |")
    out += ["", f"- {len(errs)} pairs, median |error| of the speedup {statistics.median(errs):.1%}" if errs
            else "- no BF16/FP8 pairs"]
    return out
