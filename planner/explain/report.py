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


def render_estimate(console: Console, *, title: str, layout, predicted: dict, memory: dict, time: dict) -> None:
    rows = [
        ("layout", layout.short()),
        ("micro-batches", f"{layout.num_micro_batches} per pipeline"),
        ("step time", seconds(predicted["step_time_seconds"])),
        ("tokens/s", f"{predicted['tokens_per_second']:,.0f} ({predicted['tokens_per_second_per_gpu']:,.1f} per GPU)"),
        ("MFU / HFU", f"{predicted['mfu']:.1%} / {predicted['hfu']:.1%}"),
        ("peak memory/GPU", f"{gib(predicted['peak_memory_bytes_per_gpu'])} of {gib(predicted['gpu_memory_bytes'])} "
                            f"(stage {predicted['peak_memory_stage']})"),
        ("fits", "yes" if predicted["fits"] else "[red]NO[/red]"),
    ]
    if predicted.get("host_memory_bytes_per_node"):
        rows.append(("host memory/node", gib(predicted["host_memory_bytes_per_node"])))
    console.print(kv_table(title, rows))
    mem = Table(title="Memory on the peak stage", title_justify="left")
    mem.add_column("part")
    mem.add_column("per GPU", justify="right")
    for key in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "transient_bytes",
                "overhead_bytes", "total_bytes"):
        mem.add_row(key.removesuffix("_bytes"), gib(memory[key]))
    tim = Table(title="Time per step", title_justify="left")
    tim.add_column("part")
    tim.add_column("seconds", justify="right")
    tim.add_column("share", justify="right")
    total = time["total_seconds"] or 1.0
    for key in ("compute_seconds", "recompute_seconds", "tp_comm_exposed_seconds", "pipeline_bubble_seconds",
                "pp_p2p_exposed_seconds", "dp_comm_exposed_seconds", "optimizer_seconds", "offload_seconds"):
        tim.add_row(key.removesuffix("_seconds").replace("_", " "), seconds(time[key]), f"{time[key] / total:.1%}")
    tim.add_row("[bold]total[/bold]", seconds(time["total_seconds"]), "100%")
    console.print(mem)
    console.print(tim)


def render_plan(console: Console, problem, result, doc: dict, *, show_schedule: bool = True) -> None:
    pick = result.pick
    render_estimate(console, title=f"Plan: {problem.model.name} on {problem.cluster.num_gpus} x "
                                   f"{problem.hardware.gpu_name} ({problem.cluster.num_nodes} nodes)",
                    layout=pick.layout, predicted=doc["predicted"], memory=doc["memory_breakdown"],
                    time=doc["time_breakdown"])
    if pick.layout.layers_per_stage:
        console.print(f"[bold]layers per stage[/bold] {pick.layout.layers_per_stage}"
                      + (f"; fully recomputed layers per stage {pick.layout.recompute_layers_per_stage}"
                         if pick.layout.recompute_layers_per_stage else "") + f" ({pick.origin})")
    console.print(f"[bold]why[/bold] {result.reasons[id(pick)]}")
    d = doc["decision"]
    console.print(f"\n[bold]Decision table[/bold] row {d['row']}: {d['scenario']} -> {d['recommendation']} "
                  f"({'agrees' if d['agrees'] else '[yellow]the pick differs[/yellow]'})")
    for line in d["reasons"]:
        console.print(f"  - {line}")
    rows = result.alternatives
    if rows or doc["compared"]:
        table = Table(title="Runners-up and compared layouts", title_justify="left")
        for col in ("#", "layout", "step", "tokens/s", "MFU", "peak GiB"):
            table.add_column(col, overflow="fold")
        notes = []
        for i, c in enumerate(rows, 1):
            e = c.estimate
            table.add_row(str(i), c.layout.short(), seconds(e.step_seconds), f"{e.tokens_per_second:,.0f}",
                          f"{e.mfu:.1%}", f"{e.peak_memory_bytes / GIB:.1f}")
            notes.append(f"{i}. {result.reasons[id(c)]}")
        for j, c in enumerate(doc["compared"], len(rows) + 1):
            p = c["predicted"]
            lay = c["layout"]
            short = (f"[cyan]compared[/cyan] tp={lay['tp']},pp={lay['pp']},dp={lay['dp']},zero={lay['zero_stage']},"
                     f"mbs={lay['micro_batch_size']},recompute={lay['recompute']},schedule={lay['schedule']}")
            table.add_row(str(j), short, seconds(p["step_time_seconds"]), f"{p['tokens_per_second']:,.0f}",
                          f"{p['mfu']:.1%}",
                          f"{p['peak_memory_bytes_per_gpu'] / GIB:.1f}" + ("" if p["fits"] else " [red](no fit)[/red]"))
            notes.append(f"{j}. {c['reason']}")
        console.print(table)
        for n in notes:
            console.print(f"  {n}")
    s = doc["search"]
    console.print(f"[dim]searched {s['candidates_considered']:,} candidates, evaluated {s['candidates_evaluated']:,}, "
                  f"{s['solver_runs']} ILP solves ({s['solver_seconds']:.2f} s; {', '.join(s['solver_statuses']) or 'none'}), "
                  f"{s['total_seconds']:.2f} s in all[/dim]")
    if show_schedule and pick.layout.pp > 1:
        from planner.explain.schedule_view import render_layout_schedule

        render_layout_schedule(console, pick)
