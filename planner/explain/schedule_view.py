"""Pipeline schedules drawn in the terminal (and as SVG through rich's own export), from the timeline
simulator in cost_models.pipeline. One row per stage; a cell is a slice of time: forward (blue), backward
(green), weight-gradient (magenta, zero-bubble), idle (dim dot). The digit is the micro-batch number mod 10.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from cost_models.pipeline import Timeline, simulate

STYLES = {"F": "bold white on blue", "B": "bold black on green", "W": "bold white on magenta"}
MAX_OPS_DRAWN = 20_000
DEFAULT_WIDTH = 100  # timeline columns when neither --width nor a terminal says


def timeline_rows(tl: Timeline, width: int, stages: list[int] | None = None) -> list[Text]:
    width = max(10, width)
    scale = width / tl.makespan
    rows = []
    for r in stages if stages is not None else range(tl.pp):
        cells: list[tuple[str, str]] = [("·", "dim")] * width
        for op in (o for o in tl.ops if o.stage == r):
            a = int(op.start * scale)
            b = max(a + 1, int(op.end * scale))
            ch = str(op.micro_batch % 10)
            for x in range(a, min(b, width)):
                cells[x] = (ch, STYLES[op.kind])
        text = Text(f"stage {r:>2} ", style="bold")
        for ch, style in cells:
            text.append(ch, style=style)
        rows.append(text)
    return rows


def render_timeline(console: Console, tl: Timeline, *, title: str, width: int | None = None) -> None:
    width = width or max(40, min(console.width, 200) - 10)
    console.print(Text(title, style="bold underline"))
    stages = list(range(tl.pp))
    if tl.pp > 16:  # show the ends and a sample of the middle
        stages = sorted(set(list(range(4)) + list(range(tl.pp - 4, tl.pp)) + list(range(4, tl.pp - 4, max(1, tl.pp // 8)))))
    for row in timeline_rows(tl, width, stages):
        console.print(row)
    peak = ", ".join(f"{x:g}" for x in tl.peak_in_flight_per_stage[:8]) + (" ..." if tl.pp > 8 else "")
    console.print(f"bubble {tl.bubble_fraction:.1%} of stage-time; makespan {tl.makespan:.3g}; peak in-flight "
                  f"micro-batches per stage: {peak}")
    console.print(Text.assemble(("F", STYLES["F"]), " forward  ", ("B", STYLES["B"]), " backward  ",
                                ("W", STYLES["W"]), " weight gradient  ", ("·", "dim"), " idle"))


def schedule_timeline(*, schedule: str, pp: int, micro_batches: int, virtual_stages: int = 1,
                      t_forward=1.0, t_backward=2.0, t_weight=None) -> Timeline:
    return simulate(schedule=schedule, pp=pp, num_micro_batches=micro_batches, virtual_stages=virtual_stages,
                    t_forward=t_forward, t_backward=t_backward, t_weight=t_weight)


def recording_console(width: int | None) -> Console:
    """A console that also records for SVG, as wide as the drawing (not the terminal), so no row wraps."""
    return Console(record=True, width=max(80, (width or DEFAULT_WIDTH) + 12))


def render_layout_schedule(console: Console, lay, stage_seconds: list[float], *, full: bool = False) -> None:
    """The pick's schedule with its own per-stage forward and backward times (fewer micro-batches when huge)."""
    m = lay.num_micro_batches
    shown = m
    while lay.pp * shown * 2 * max(1, lay.virtual_stages) > MAX_OPS_DRAWN and shown > lay.pp:
        shown = max(lay.pp, shown // 2)
    if lay.schedule == "interleaved_1f1b":
        shown -= shown % lay.pp
    stage_t = list(stage_seconds)
    tf = [x / 3 for x in stage_t]
    tb = [2 * x / 3 for x in stage_t]
    tl = simulate(schedule=lay.schedule, pp=lay.pp, num_micro_batches=shown, virtual_stages=lay.virtual_stages,
                  t_forward=tf, t_backward=tb)
    note = "" if shown == m else f" (first {shown} of {m} micro-batches drawn)"
    render_timeline(console, tl, title=f"Pipeline schedule: {lay.schedule}, pp={lay.pp}{note}")


def check_schedule_request(names: list[str], *, pp: int, micro_batches: int, virtual_stages: int,
                           width: int | None) -> None:
    """`planner schedule`'s options, each checked: one line per problem (field, value, what is allowed)."""
    from cluster_specs import SpecError
    from planner.inputs.specs import SCHEDULES

    problems = [f"--schedule: {n!r} -> allowed: {', '.join(SCHEDULES)}" for n in names if n not in SCHEDULES]
    for flag, value in (("--pp", pp), ("--micro-batches", micro_batches), ("--virtual-stages", virtual_stages)):
        if value < 1:
            problems.append(f"{flag}: {value} -> must be >= 1")
    if width is not None and not 20 <= width <= 1000:
        problems.append(f"--width: {width} -> must be between 20 and 1000 columns")
    if not problems and "interleaved_1f1b" in names and micro_batches % pp:
        problems.append(f"--micro-batches: {micro_batches} -> interleaved_1f1b needs a multiple of --pp ({pp})")
    if not problems and pp * micro_batches * virtual_stages > MAX_OPS_DRAWN:
        problems.append(f"--pp x --micro-batches x --virtual-stages: {pp * micro_batches * virtual_stages:,} -> at "
                        f"most {MAX_OPS_DRAWN:,} (micro-batch, stage, chunk) steps are simulated and drawn")
    if problems:
        raise SpecError(problems)


def draw_schedules(console: Console, names: list[str], *, pp: int, micro_batches: int, virtual_stages: int,
                   width: int | None) -> None:
    """`planner schedule`: each schedule in unit times (forward 1, backward 2), one under another."""
    for name in names:
        v = virtual_stages if name == "interleaved_1f1b" else 1
        tl = schedule_timeline(schedule=name, pp=pp, micro_batches=micro_batches, virtual_stages=v,
                               t_weight=1.0 if name == "zero_bubble" else None)
        extra = f", v={v}" if v > 1 else ""
        render_timeline(console, tl, title=f"{name}: pp={pp}, {micro_batches} micro-batches{extra} "
                                           "(forward 1, backward 2 time units)", width=width)
        console.print()
