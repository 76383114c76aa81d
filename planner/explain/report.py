"""Rich rendering of specs, estimates and plans (human output; --json bypasses this module)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

GIB = 2**30


def gib(x: float) -> str:
    return f"{x / GIB:,.2f} GiB"


def seconds(x: float) -> str:
    if x >= 1:
        return f"{x:,.3f} s"
    if x >= 1e-3:
        return f"{x * 1e3:,.2f} ms"
    return f"{x * 1e6:,.1f} µs"


def count(x: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:,.2f}{unit}"
    return f"{x:,.0f}"


def kv_table(title: str | None, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left", box=None, pad_edge=False)
    table.add_column(style="bold cyan")
    table.add_column()
    for k, v in rows:
        table.add_row(k, v)
    return table


def gpu_name(cluster) -> str:
    return cluster.gpu_spec().name or str(cluster.gpu)


def _band_text(p) -> str:
    """' (29.8–35.1 s)': where the measured step time is expected (planner/bands.py), in the step time's unit."""
    rng = p.step_time_seconds_range
    if not rng or not p.error_band_rows:
        return ""
    lo, hi = seconds(rng[0]), seconds(rng[1])
    unit = lo.split()[-1]
    if hi.split()[-1] == unit:
        return f" ({lo.removesuffix(' ' + unit)}–{hi})"
    return f" ({lo}–{hi})"


TIGHT_AT_ESTIMATE = "fits at the estimate, not at the band's high end"
TIGHT_LIVE_ONLY = ("the live tensors fit, not the estimate with the allocator's cache: the allocator frees its cache "
                   "and retries (slower steps), or runs out of memory")
"""What 'tight' means (planner.bands.fit_verdict): the estimate fits (GPU minus headroom) but its band's high end
does not; or only the live tensors and the memory outside the allocator do."""


def fit_text(fit: str | None, fits: bool) -> str:
    """The fit verdict as the terminal shows it (rich markup), from `predicted.fit` and `predicted.fits`."""
    if fit is None:
        return "yes" if fits else "[red]NO[/red]"
    if fit == "tight":
        return f"[yellow]tight[/yellow] ({TIGHT_AT_ESTIMATE if fits else TIGHT_LIVE_ONLY})"
    return {"fits": "yes", "does not fit": "[red]NO[/red]"}[fit]


def _fit_text(p) -> str:
    return fit_text(p.fit, p.fits)


def render_estimate(console: Console, *, title: str, layout, predicted, memory, time) -> None:
    """One layout from the contract's models: Predicted, MemoryBreakdown, TimeReport."""
    p = predicted
    console.print(Text(title, style="bold"))
    print_layout(console, layout)
    rows = [
        ("micro-batches", f"{layout.num_micro_batches} per pipeline"),
        ("step time", seconds(p.step_time_seconds) + _band_text(p)),
        ("tokens/s", f"{p.tokens_per_second:,.0f} ({p.tokens_per_second_per_gpu:,.1f} per GPU)"),
        ("MFU / HFU", f"{p.mfu:.1%} / {p.hfu:.1%}"),
        ("peak memory/GPU", f"{gib(p.peak_memory_bytes_per_gpu)} of {gib(p.gpu_memory_bytes)} "
                            f"(stage {p.peak_memory_stage})"),
        ("fits", _fit_text(p)),
    ]
    if p.peak_allocated_bytes_per_gpu is not None:
        rows.append(("memory detail", f"allocated {gib(p.peak_allocated_bytes_per_gpu)}, reserved "
                                      f"{gib(p.peak_reserved_bytes_per_gpu)}, high end "
                                      f"{gib(p.peak_memory_bytes_per_gpu_high)}"))
    for a in p.assumptions or []:
        rows.append(("assumes", f"{a.statement}: {seconds(a.step_time_seconds_if_not)} if not"))
    if p.host_memory_bytes_per_node:
        rows.append(("host memory/node", gib(p.host_memory_bytes_per_node)))
    console.print(kv_table(None, rows))
    mem = Table(title="Memory on the peak stage", title_justify="left")
    mem.add_column("part")
    mem.add_column("per GPU", justify="right")
    for key, label in memory.PARTS.items():
        mem.add_row(label, gib(getattr(memory, key)))
    mem.add_row("total", gib(memory.total_bytes))
    tim = Table(title="Time per step", title_justify="left")
    tim.add_column("part")
    tim.add_column("seconds", justify="right")
    tim.add_column("share", justify="right")
    total = time.total_seconds or 1.0
    for label, value in time.exposed().items():
        tim.add_row(label, seconds(value), f"{value / total:.1%}")
    tim.add_row("[bold]total[/bold]", seconds(time.total_seconds), "100%")
    console.print(mem)
    console.print(tim)


def render_estimate_document(console: Console, doc) -> None:
    """`estimate`: from the contract's EstimateDocument."""
    cl = doc.inputs.cluster
    render_estimate(console, title=f"{doc.inputs.model.name} on {cl.num_gpus} x {gpu_name(cl)}{compiled(doc)}",
                    layout=doc.layout, predicted=doc.predicted, memory=doc.memory_breakdown, time=doc.time_breakdown)


def compiled(doc) -> str:
    """The title's marks: the framework whose profile made the numbers (none for generic), and a torch.compiled
    model (--compile, TrainingSpec.compile)."""
    framework = getattr(doc, "framework", None)
    shown = f", {framework} profile" if framework and framework != "generic" else ""
    return shown + (", torch.compile" if doc.inputs.training.compile else "")


def layout_arg(lay) -> str:
    """The layout in `--layout` syntax, complete enough to give the same layout back with the same batch."""
    parts = lay.degree_parts()
    if lay.tp > 1 or lay.sequence_parallel:
        parts.append(f"sp={int(lay.sequence_parallel)}")
    if lay.pp > 1 or lay.schedule != "1f1b":
        parts.append(f"schedule={lay.schedule}")
    if lay.virtual_stages > 1:
        parts.append(f"vpp={lay.virtual_stages}")
    for key in ("layers_per_stage", "recompute_layers_per_stage"):
        if getattr(lay, key):
            parts.append(f"{key}={'/'.join(str(n) for n in getattr(lay, key))}")
    return ",".join(parts)


def print_layout(console: Console, lay) -> None:
    """The layout on a line of its own, never cut or wrapped by us (copy-paste it into --layout)."""
    console.print("layout (for --layout):", style="bold")
    console.print(layout_arg(lay), soft_wrap=True, highlight=False, markup=False)


def wrap_at_commas(text: str, width: int, indent: str) -> list[str]:
    """Break a key=value,... string only after commas, so no token is cut."""
    lines, line = [], indent
    for token in text.split(","):
        piece = token if line == indent else "," + token
        if len(line) + len(piece) > width and line != indent:
            lines.append(line + ",")
            line = indent + token
        else:
            line += piece
    return [*lines, line]


def command_lines(command: str, indent: str = "  ", width: int = 80) -> list[str]:
    """A shell command in lines of at most `width` columns (where no option with its value is longer), continued
    with backslashes, each argument whole and quoted as the shell needs it, an option beside its value: copied as
    printed, it runs as given."""
    import shlex

    words = [shlex.quote(w) for w in shlex.split(command)]
    units: list[str] = []  # an option stays on the line of its value
    for w in words:
        if units and units[-1].startswith("-") and " " not in units[-1] and not w.startswith("-"):
            units[-1] += " " + w
        else:
            units.append(w)
    lines, line = [], indent + (units[0] if units else "")
    for w in units[1:]:
        if len(line) + 1 + len(w) + 2 > width:  # room for " \\"
            lines.append(line + " \\")
            line = indent + "    " + w
        else:
            line += " " + w
    return [*lines, line]


def render_plan(console: Console, doc, *, show_schedule: bool = True, full_schedule: bool = False) -> None:
    """The plan from the contract's PlanDocument, laid out for 80 columns."""
    cl = doc.inputs.cluster
    render_estimate(console, title=f"Plan: {doc.inputs.model.name} on {cl.num_gpus} x {gpu_name(cl)} "
                                   f"({cl.num_nodes} nodes){compiled(doc)}",
                    layout=doc.layout, predicted=doc.predicted, memory=doc.memory_breakdown, time=doc.time_breakdown)
    lay = doc.layout
    if lay.layers_per_stage:
        console.print(f"[bold]layers per stage[/bold] {lay.layers_per_stage}"
                      + (f"; fully recomputed layers per stage {lay.recompute_layers_per_stage}"
                         if lay.recompute_layers_per_stage else "") + f" ({doc.origin})")
    console.print(f"[bold]why[/bold] {doc.reason}")
    d = doc.decision
    console.print(f"\n[bold]Decision table[/bold] row {d.row}: {d.scenario} -> {d.recommendation} "
                  f"({'agrees' if d.agrees else '[yellow]the pick differs[/yellow]'})")
    for line in d.reasons:
        console.print(f"  - {line}")
    _render_others(console, doc)
    s = doc.search
    console.print(f"[dim]searched {s.candidates_considered:,} candidates, evaluated {s.candidates_evaluated:,}, "
                  f"{s.solver_runs} ILP solves ({s.solver_seconds:.2f} s; {', '.join(s.solver_statuses) or 'none'}), "
                  f"{s.total_seconds:.2f} s in all[/dim]")
    if show_schedule and lay.pp > 1:
        from planner.explain.schedule_view import render_layout_schedule

        render_layout_schedule(console, lay, doc.time_breakdown.stage_seconds, full=full_schedule,
                               bubble_seconds=doc.time_breakdown.pipeline_bubble_seconds,
                               step_seconds=doc.predicted.step_time_seconds)


def _render_others(console: Console, doc) -> None:
    """Runners-up and compared layouts: numbers, the layout (wrapped only at commas), how it differs."""
    rows = [*doc.alternatives, *doc.compared]
    if not rows:
        return
    console.print("\n[bold]Runners-up and compared layouts[/bold] (step time against the pick)")
    width = max(40, min(console.width, 120))
    for i, c in enumerate(rows, 1):
        p = c.predicted
        delta = p.step_time_seconds / doc.predicted.step_time_seconds - 1
        tag = "compared: " if c.origin == "compared" else ""
        console.print(f"{i:>2}. {tag}{seconds(p.step_time_seconds)} ({delta:+.1%}), {p.tokens_per_second:,.0f} "
                      f"tokens/s, MFU {p.mfu:.1%}, {p.peak_memory_bytes_per_gpu / GIB:.1f} GiB"
                      + ("" if p.fits else " [red](does not fit)[/red]"), highlight=False)
        for line in wrap_at_commas(layout_arg(c.layout), width, "    "):
            console.print(line, highlight=False, markup=False, soft_wrap=True)
        console.print(f"    {c.reason}", highlight=False, markup=False)


def render_bench(console: Console, doc: dict) -> None:
    """`bench`: predicted against measured, one row per quantity, then the notes."""
    from planner.inputs.specs import LayoutSpec

    lay = LayoutSpec.model_validate(doc["layout"])
    table = Table(title=f"Benchmark: {doc['model']['name']}, {lay.short()}, {doc['world_size']} ranks on "
                        f"{doc['device']} ({doc['optimizer']}, {doc['dtype']}); predicted on {doc['cluster']['name']}",
                  title_justify="left")
    for col in ("quantity", "predicted", "measured", "error"):
        table.add_column(col, justify="right" if col != "quantity" else "left")
    for r in doc["comparison"]["rows"]:
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        table.add_row(r["quantity"], f"{r['predicted']:.4g}", f"{r['measured']:.4g}", err)
    console.print(table)
    for note in doc["comparison"].get("notes", []):
        console.print(f"[dim]note: {note}[/dim]")


def render_shortlist(console: Console, summary: dict) -> None:
    """`bench --top K`: each layout's predicted and measured step, and which to launch."""
    table = Table(title=f"Short list ({summary['rule']})", title_justify="left")
    for col in ("layout", "role", "predicted s", "measured s", "error"):
        table.add_column(col, justify="left" if col in ("layout", "role") else "right")
    for r in summary["results"]:
        table.add_row(r["layout_short"], r["role"], f"{r['predicted']:.4g}", f"{r['measured']:.4g}", f"{r['error']:+.1%}")
    console.print(table)
    for line in summary["skipped"]:
        console.print(f"[dim]not run: {line}[/dim]")
    console.print(f"launch: {summary['decision']['launch']} ({summary['decision']['reason']})", highlight=False)


def render_calibration(console: Console, err: Console, output, nproc: int, spec: dict) -> None:
    """The measured figures (never a catalog peak), how well the GEMM line fits, and how noisy it was."""
    s, n = spec["measured"]["summary"], spec["measured"]["noise"]
    link = "pinned host->device" if s["host_to_device_pinned"] else "host memory copy (no host-device link on CPU)"
    out = console
    out.print(f"wrote {output}: {nproc} x {s['device_name']} (torch {s['torch_version']}, {s['dtype']})", highlight=False)
    out.print(f"  GEMM {s['dtype']}: fitted peak {s['gemm_fitted_peak_tflops']:.3g} TFLOP/s; best measured "
              f"{s['gemm_best_tflops']:.3g} at {s['gemm_best_shape']}, smallest {s['gemm_smallest_tflops']:.3g} at "
              f"{s['gemm_smallest_shape']}; fit error median {s['gemm_fit_median_abs_error']:.0%}, max "
              f"{s['gemm_fit_max_abs_error']:.0%}", highlight=False)
    out.print(f"  memory copy {s['memory_copy_gb_per_s']:.3g} GB/s; {link} {s['host_to_device_gb_per_s']:.3g} GB/s; "
              f"all-reduce bus bandwidth {spec['intra_node']['gb_per_s']:.3g} GB/s, latency "
              f"{spec['intra_node']['latency_us']:.3g} µs", highlight=False)
    if s.get("layer_probes"):
        errs = ", ".join(f"{p['fit_error']:+.0%}" for p in s["layer_probes"] if p.get("fit_error") is not None)
        out.print(f"  layer probes (forward + backward of one layer, {len(s['layer_probes'])} sizes): x_half "
                  f"{s['x_half_gflop_used']:.3g} GFLOP (GEMM line alone: {s['x_half_gflop_gemm_line']:.3g}), "
                  f"end-to-end factor {s['end_to_end_efficiency']:.3g}; fit errors {errs}", highlight=False)
    if s.get("tp_probes"):
        out.print(f"  TP probe (the same layers at tp=2 over rank pairs): {s['tp_layer_overhead_seconds'] * 1e3:.3g} ms "
                  "per layer and micro-batch beyond the model's FLOPs and collectives", highlight=False)
    load = "-" if n["load_average"] is None else f"{n['load_average']:.1f}"
    out.print(f"  noise: repeats spread {n['median_spread']:.0%} (median), {n['max_spread']:.0%} (max); load average "
              f"{load} on {n['cores']} cores", highlight=False)
    for note in spec["measured"]["notes"]:
        if note.startswith(("the machine was busy", "noisy")):
            err.print(f"warning: {note}", highlight=False)
