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
