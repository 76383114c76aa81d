"""Pipeline schedules drawn in the terminal (and as SVG through rich's own export), from the timeline
simulator in cost_models.pipeline. One row per stage; a cell is a slice of time. Readable without colour:
an op's first cell is its letter (F forward, B backward or input gradient, W weight gradient), the rest of
its cells repeat it in lower case, or show the model chunk (1..v) under interleaving; idle is a dot.
A time axis runs under the rows.

At scale (`plan` of a deep pipeline) the picture is a summary: the first stages and the last one, the fill
and the drain at full resolution with the steady state between them left out, and the bubble share of the
step from the estimate (the same number as the pick's reason). `plan --full-schedule` draws everything.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from cost_models.pipeline import Op, Timeline, simulate

STYLES = {"F": "bold white on blue", "B": "bold black on green", "W": "bold white on magenta"}
MAX_OPS_DRAWN = 20_000
DEFAULT_WIDTH = 100  # timeline columns when neither --width nor a terminal says
LABEL = 9  # "stage 34 "
SUMMARY_STAGES = 3  # first stages shown in a summary, plus the last


def _cells(ops: list[Op], t0: float, t1: float, width: int, interleaved: bool) -> list[tuple[str, str]]:
    cells: list[tuple[str, str]] = [("·", "dim")] * width
    scale = width / (t1 - t0) if t1 > t0 else 0.0
    for op in ops:
        if op.end <= t0 or op.start >= t1:
            continue
        a = max(0, int((op.start - t0) * scale))
        b = min(width, max(a + 1, int((op.end - t0) * scale)))
        rest = str(op.chunk + 1) if interleaved else op.kind.lower()
        for x in range(a, b):
            first = x == a and op.start >= t0
            cells[x] = (op.kind if first else rest, STYLES[op.kind])
    return cells


def _row(label: str, *windows: list[tuple[str, str]]) -> Text:
    text = Text(f"{label:<{LABEL}}", style="bold")
    for k, cells in enumerate(windows):
        if k:
            text.append(" ┆ ", style="dim")
        for ch, style in cells:
            text.append(ch, style=style)
    return text


def _axis(t0: float, t1: float, width: int, unit: str, *, prefix: str = "") -> str:
    """Tick labels under a window: its start, middle and end."""
    def label(t: float) -> str:
        return prefix if prefix and t == 0 else f"{prefix}{t:.3g}{unit}"

    left, mid, right = label(t0), label((t0 + t1) / 2), label(t1)
    line = [" "] * width
    for pos, text in ((0, left), (width // 2 - len(mid) // 2, mid), (width - len(right), right)):
        for k, ch in enumerate(text):
            if 0 <= pos + k < width:
                line[pos + k] = ch
    return "".join(line)


def _by_stage(tl: Timeline) -> list[list[Op]]:
    out: list[list[Op]] = [[] for _ in range(tl.pp)]
    for op in tl.ops:
        out[op.stage].append(op)
    return out


def legend(interleaved: bool) -> Text:
    text = Text.assemble(("F", STYLES["F"]), " forward  ", ("B", STYLES["B"]), " backward  ",
                         ("W", STYLES["W"]), " weight gradient  ", ("·", "dim"), " idle")
    text.append("; digits: model chunk" if interleaved else "; lower case: the op continues")
    return text


def render_timeline(console: Console, tl: Timeline, *, title: str, width: int | None = None,
                    unit: str = "", stages: list[int] | None = None) -> None:
    """Every micro-batch, one row per stage (a sample of the stages when there are more than 16)."""
    width = width or max(40, min(console.width, 200) - LABEL)
    console.print(Text(title, style="bold underline"))
    if stages is None:
        stages = list(range(tl.pp))
        if tl.pp > 16:  # the ends and a sample of the middle
            stages = sorted({*range(4), *range(tl.pp - 4, tl.pp), *range(4, tl.pp - 4, max(1, tl.pp // 8))})
    rows = _by_stage(tl)
    inter = tl.virtual_stages > 1
    for r in stages:
        console.print(_row(f"stage {r}", _cells(rows[r], 0.0, tl.makespan, width, inter)), no_wrap=True, crop=False)
    console.print(" " * LABEL + _axis(0.0, tl.makespan, width, unit), no_wrap=True, crop=False, highlight=False)
    peak = ", ".join(f"{x:g}" for x in tl.peak_in_flight_per_stage[:8]) + (" ..." if tl.pp > 8 else "")
    console.print(f"bubble {tl.bubble_fraction:.1%} of stage-time; makespan {tl.makespan:.3g}{unit}", highlight=False)
    console.print(f"peak in-flight micro-batches per stage: {peak}", highlight=False)
    console.print(legend(inter))


def schedule_timeline(*, schedule: str, pp: int, micro_batches: int, virtual_stages: int = 1,
                      t_forward=1.0, t_backward=2.0, t_weight=None) -> Timeline:
    return simulate(schedule=schedule, pp=pp, num_micro_batches=micro_batches, virtual_stages=virtual_stages,
                    t_forward=t_forward, t_backward=t_backward, t_weight=t_weight)


def recording_console(width: int | None) -> Console:
    """A console that also records for SVG, as wide as the drawing (not the terminal), so no row wraps."""
    return Console(record=True, width=max(80, (width or DEFAULT_WIDTH) + 12))


def _layout_timeline(lay, stage_seconds: list[float], micro_batches: int) -> Timeline:
    tf = [x / 3 for x in stage_seconds]  # forward : backward = 1 : 2 (the cost model's split)
    tb = [2 * x / 3 for x in stage_seconds]
    return simulate(schedule=lay.schedule, pp=lay.pp, num_micro_batches=micro_batches,
                    virtual_stages=lay.virtual_stages, t_forward=tf, t_backward=tb)


def _shown_micro_batches(lay, limit: int) -> int:
    shown = min(lay.num_micro_batches, limit)
    if lay.schedule == "interleaved_1f1b":
        shown = max(lay.pp, shown - shown % lay.pp)
    return shown


def render_layout_schedule(console: Console, lay, stage_seconds: list[float], *, bubble_seconds: float,
                           step_seconds: float, full: bool = False) -> None:
    """The pick's schedule with its own per-stage times: a summary at scale, everything with `full`."""
    m, p = lay.num_micro_batches, lay.pp
    name = f"{lay.schedule}" + (f", vpp={lay.virtual_stages}" if lay.virtual_stages > 1 else "")
    share = f"bubble {bubble_seconds / step_seconds:.1%} of the step ({bubble_seconds:.3g} s of {step_seconds:.3g} s)"
    if full or (p <= 8 and m <= 4 * p):
        ops_per_mb = 2 * p * max(1, lay.virtual_stages) + (p if lay.schedule == "zero_bubble" else 0)
        shown = _shown_micro_batches(lay, max(p, MAX_OPS_DRAWN // ops_per_mb))
        tl = _layout_timeline(lay, stage_seconds, shown)
        note = "" if shown == m else f"; first {shown} of {m} micro-batches"
        render_timeline(console, tl, title=f"Pipeline schedule: {name}, pp={p}, {m} micro-batches{note}", unit=" s",
                        stages=list(range(p)) if full else None)
        console.print(f"{share}, as in the time table (the line above: every stage's idle share)",
                      highlight=False)
        return
    shown = _shown_micro_batches(lay, 2 * p)
    tl = _layout_timeline(lay, stage_seconds, shown)
    rows = _by_stage(tl)
    stages = [*range(min(SUMMARY_STAGES, p - 1)), p - 1]
    half = max(10, (min(console.width, 200) - LABEL - 3) // 2)
    window = tl.makespan * min(0.5, p / (shown + p))
    inter = lay.virtual_stages > 1
    console.print(Text(f"Pipeline schedule: {name}, pp={p}, {m} micro-batches (summary)", style="bold underline"))
    console.print(f"stages 0-{stages[-2]} and {p - 1}: the fill | the drain (--full-schedule: every stage)",
                  highlight=False)
    for r in stages:
        console.print(_row(f"stage {r}", _cells(rows[r], 0.0, window, half, inter),
                           _cells(rows[r], tl.makespan - window, tl.makespan, half, inter)), no_wrap=True, crop=False)
    console.print(" " * LABEL + _axis(0.0, window, half, " s") + "   " + _axis(-window, 0.0, half, " s", prefix="end"),
                  no_wrap=True, crop=False, highlight=False)
    console.print(f"{share}, as in the time table", highlight=False)
    console.print(legend(inter))


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
