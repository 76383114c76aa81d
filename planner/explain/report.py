"""Rich rendering of specs, estimates and plans (human output; --json bypasses this module)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

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


def kv_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left", box=None, pad_edge=False)
    table.add_column(style="bold cyan")
    table.add_column()
    for k, v in rows:
        table.add_row(k, v)
    return table


def gpu_name(cluster) -> str:
    return cluster.gpu_spec().name or str(cluster.gpu)


def render_estimate(console: Console, *, title: str, layout, predicted, memory, time) -> None:
    """One layout from the contract's models: Predicted, MemoryBreakdown, TimeReport."""
    p = predicted
    rows = [
        ("layout", layout.short()),
        ("micro-batches", f"{layout.num_micro_batches} per pipeline"),
        ("step time", seconds(p.step_time_seconds)),
        ("tokens/s", f"{p.tokens_per_second:,.0f} ({p.tokens_per_second_per_gpu:,.1f} per GPU)"),
        ("MFU / HFU", f"{p.mfu:.1%} / {p.hfu:.1%}"),
        ("peak memory/GPU", f"{gib(p.peak_memory_bytes_per_gpu)} of {gib(p.gpu_memory_bytes)} "
                            f"(stage {p.peak_memory_stage})"),
        ("fits", "yes" if p.fits else "[red]NO[/red]"),
    ]
    if p.host_memory_bytes_per_node:
        rows.append(("host memory/node", gib(p.host_memory_bytes_per_node)))
    console.print(kv_table(title, rows))
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


def render_plan(console: Console, doc, *, show_schedule: bool = True) -> None:
    """The plan from the contract's PlanDocument."""
    cl = doc.inputs.cluster
    render_estimate(console, title=f"Plan: {doc.inputs.model.name} on {cl.num_gpus} x {gpu_name(cl)} "
                                   f"({cl.num_nodes} nodes)",
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
    rows = [*doc.alternatives, *doc.compared]
    if rows:
        table = Table(title="Runners-up and compared layouts", title_justify="left")
        for col in ("#", "layout", "step", "tokens/s", "MFU", "peak GiB"):
            table.add_column(col, overflow="fold")
        notes = []
        for i, c in enumerate(rows, 1):
            p = c.predicted
            short = c.layout.short() if c.origin != "compared" else f"[cyan]compared[/cyan] {c.layout.short()}"
            table.add_row(str(i), short, seconds(p.step_time_seconds), f"{p.tokens_per_second:,.0f}", f"{p.mfu:.1%}",
                          f"{p.peak_memory_bytes_per_gpu / GIB:.1f}" + ("" if p.fits else " [red](no fit)[/red]"))
            notes.append(f"{i}. {c.reason}")
        console.print(table)
        for n in notes:
            console.print(f"  {n}")
    s = doc.search
    console.print(f"[dim]searched {s.candidates_considered:,} candidates, evaluated {s.candidates_evaluated:,}, "
                  f"{s.solver_runs} ILP solves ({s.solver_seconds:.2f} s; {', '.join(s.solver_statuses) or 'none'}), "
                  f"{s.total_seconds:.2f} s in all[/dim]")
    if show_schedule and lay.pp > 1:
        from planner.explain.schedule_view import render_layout_schedule

        render_layout_schedule(console, lay, doc.time_breakdown.stage_seconds)
