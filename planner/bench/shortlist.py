"""`planner bench --top K plan.json`: measure the pick and the runners-up the model cannot separate from it, say
which to launch, and turn the measurements into a calibration the next `plan --calibration` reads (no torch)."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime
from pathlib import Path

from cluster_specs.limits import is_finite_number

DEFAULT_BAND = 0.10  # runners-up within 10% of the pick's predicted step time (when the plan carries no band)


def plan_band(doc: dict) -> tuple[float, str]:
    """The relative error band of the plan's step-time prediction: the tie tolerance of its sensitivity report
    when it has one (the ranking band, which named the short list); else the plan's own band: its
    `predicted.step_time_seconds_range` [low, high] (every plan of planner 1.x writes it when its regime has published
    runs), or an `error_band` of measured/predicted factors {lower_factor, upper_factor} (at the top, under
    `predicted` or under `training_run`); else DEFAULT_BAND. The width is the band's larger side, relative to the
    predicted step; returned with its source."""
    pred = doc.get("predicted") or {}
    tie = (doc.get("sensitivity") or {}).get("tie_tolerance")
    if isinstance(tie, int | float) and tie >= 0:  # `plan --sensitivity`: the ranking band its short list used
        return float(tie), "the plan's tie tolerance (ranking error band, plan --sensitivity)"
    for band in (doc.get("error_band"), pred.get("error_band"), (doc.get("training_run") or {}).get("error_band")):
        if isinstance(band, dict) and {"lower_factor", "upper_factor"} <= set(band):
            width = max(abs(1 - band["lower_factor"]), abs(band["upper_factor"] - 1))
            return width, f"the plan's error band ({band.get('source', 'no source given')})"
    rng, t = pred.get("step_time_seconds_range"), pred.get("step_time_seconds")
    if (isinstance(rng, list | tuple) and len(rng) == 2 and all(is_finite_number(x) for x in rng) and is_finite_number(t) and t > 0
            and rng[0] <= t <= rng[1]):
        return max(1 - rng[0] / t, rng[1] / t - 1), "the plan's error band (predicted.step_time_seconds_range)"
    return DEFAULT_BAND, f"a default tolerance of {DEFAULT_BAND:.0%} (the plan states no error band)"


def shortlist(doc: dict, k: int) -> tuple[list[dict], str]:
    """The pick, then alternatives whose predicted step time is within the band of the pick's, fastest first, at
    most k in all. Each entry: {"layout", "predicted_step_seconds", "role"}."""
    band, source = plan_band(doc)
    pick_t = doc["predicted"]["step_time_seconds"]
    out = [{"layout": doc["layout"], "predicted_step_seconds": pick_t, "role": "pick"}]
    alts = sorted(doc.get("alternatives") or [], key=lambda a: a["predicted"]["step_time_seconds"])
    for alt in alts:
        t = alt["predicted"]["step_time_seconds"]
        if len(out) >= k:
            break
        if abs(t - pick_t) <= band * pick_t and alt["layout"] != doc["layout"]:
            out.append({"layout": alt["layout"], "predicted_step_seconds": t, "role": "runner-up"})
    return out, f"runners-up within {band:.0%} of the pick's predicted step time ({source})"


def decide(results: list[dict]) -> dict:
    """Which layout to launch: the least measured time per sequence. `results`: {"layout_short", "predicted",
    "measured", "sequences_per_step"}: scaled down to the ranks at hand, the layouts of a short list can run
    different numbers of sequences a step (dp = nproc / (tp pp)), so raw step times are not alike."""
    def per_sequence(r: dict) -> float:
        return r["measured"] / r.get("sequences_per_step", 1)

    best = min(results, key=per_sequence)
    pick = results[0]
    if best is pick:
        why = "the pick is also the fastest measured (time per sequence)"
    else:
        why = (f"{best['layout_short']} measured {per_sequence(pick) / per_sequence(best) - 1:.0%} faster per "
               f"sequence than the pick ({pick['layout_short']})")
    return {"launch": best["layout_short"], "reason": why}


def _sequences(layout: dict) -> int:
    """Sequences one step of the layout as run trains: dp x micro-batch size x micro-batches."""
    return int(layout["dp"] * layout["micro_batch_size"] * layout["num_micro_batches"])


def calibration_document(cluster: dict, knobs: dict, results: list[dict], *, source: str) -> dict:
    """The cluster the predictions were made on, with a `measured` section whose end_to_end_efficiency is scaled
    by the median predicted/measured step-time ratio of the runs (so the next plan predicts what was measured),
    and the runs themselves for the record."""
    ratio = statistics.median(r["predicted"] / r["measured"] for r in results)
    new_knobs = dict(knobs)
    new_knobs["end_to_end_efficiency"] = knobs.get("end_to_end_efficiency", _default_e2e()) * ratio
    data = {k: v for k, v in cluster.items() if k != "measured"}
    prior = cluster.get("measured") or {}
    data["measured"] = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "knobs": new_knobs,
        "gemm": prior.get("gemm", []),
        "collectives": prior.get("collectives", []),
        "notes": [*prior.get("notes", []),
                  f"planner bench --top: {len(results)} layouts measured ({source}); median predicted/measured "
                  f"step time {ratio:.3f} folded into end_to_end_efficiency",
                  *(f"{r['layout_short']}: predicted {r['predicted']:.4g} s, measured {r['measured']:.4g} s"
                    for r in results)],
    }
    return data


def _default_e2e() -> float:
    from cost_models.inputs import Knobs

    return Knobs().end_to_end_efficiency


def run_shortlist(plan: dict, top: int, md, seq: int, cl, knobs_kw: dict, opts,
                  save_calibration: Path | None) -> dict | None:
    """`bench --top K`: run the pick and its runners-up, say which to launch, write the calibration.
    Returns the summary document (None on ranks other than 0 of a torchrun job)."""
    import yaml

    from planner.bench.session import bench_run, fit_shortlist, prepared_shortlist
    from planner.fileio import write_atomically
    from planner.inputs.specs import LayoutSpec

    entries, rule = shortlist(plan, top)
    entries, layouts, skipped = fit_shortlist(entries, opts)  # refuse or skip before running anything
    entries, prepared, more = prepared_shortlist(entries, layouts, md, seq, cl, knobs_kw, opts)
    skipped += more
    docs = [d for d in (bench_run(*p, opts) for p in prepared) if d is not None]
    if len(docs) < len(prepared):  # ranks other than 0 of torchrun report nothing
        return None
    results = [{"layout_short": LayoutSpec.model_validate(e["layout"]).short(), "role": e["role"],
                "plan_predicted_step_seconds": e["predicted_step_seconds"],
                "predicted": d["comparison"]["predicted_step_seconds"],
                "measured": d["comparison"]["measured_step_seconds"],
                "sequences_per_step": _sequences(d["layout"])} for e, d in zip(entries, docs, strict=True)]
    for r in results:
        r["error"] = (r["predicted"] - r["measured"]) / r["measured"]
    from planner.contract import _versions

    summary = {**_versions(), "kind": "bench-shortlist", "rule": rule, "results": results, "decision": decide(results),
               "skipped": skipped, "runs": docs}
    if save_calibration is not None:
        cal = calibration_document(docs[0]["cluster"], knobs_kw, results, source=rule)
        write_atomically(save_calibration, "# Written by `planner bench --top`: use as `plan --calibration FILE`.\n"
                         + yaml.safe_dump(cal, sort_keys=False))
        summary["calibration_file"] = str(save_calibration)
    return summary
