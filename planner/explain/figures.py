"""Figures (matplotlib, an optional extra: pip install 'planner[plots]') and their compact terminal renderings.

- scaling curve: tokens/s against GPUs (with linear scaling from the first point) and scaling efficiency with
  the 70% line, one line per global batch, the point where adding GPUs stops paying marked;
- cluster comparison: days to train, cost (or GPU-hours) per million tokens and tokens/s per GPU, one bar per
  cluster (error bars from the error band when there is one);
- memory per pipeline stage: stacked by part (weights, gradients, optimizer, activations, transient,
  overhead) against the GPU's capacity and the capacity less the headroom;
- time breakdown: the step's parts (compute, recompute, exposed communication, bubble, optimizer, offload).

matplotlib is imported only inside these functions, with the non-interactive Agg backend; the format follows
the file's suffix (.png or .svg). Each file is written whole or not at all.
"""

from __future__ import annotations

import io
from pathlib import Path

GIB = 2**30
MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "transient", "overhead")
TIME_PARTS = (("compute", "compute_seconds"), ("recompute", "recompute_seconds"), ("TP comm", "tp_comm_seconds"),
              ("CP comm", "cp_comm_seconds"), ("EP comm", "ep_comm_seconds"),
              ("bubble", "pipeline_bubble_seconds"), ("PP send/recv", "pp_p2p_seconds"),
              ("DP comm", "dp_comm_seconds"), ("optimizer", "optimizer_seconds"), ("offload", "offload_seconds"))
FORMATS = (".png", ".svg")


def require_matplotlib():
    """The pyplot module on the Agg backend, or a MissingDependencyError (exit 6) saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        from planner.errors import MissingDependencyError

        raise MissingDependencyError("matplotlib is not installed: `pip install 'planner[plots]'` for figures") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def check_path(path: Path) -> None:
    from cluster_specs import SpecError

    if Path(path).suffix.lower() not in FORMATS:
        raise SpecError(f"figure: {str(path)!r} -> the file name must end in .png or .svg")


def save(fig, path: Path) -> None:
    """Render to memory, then write beside `path` and rename (no half-written figure)."""
    import os
    import tempfile

    from planner.errors import FileAccessError

    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lower()[1:], dpi=120, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent if str(path.parent) else ".")
    except OSError as exc:
        raise FileAccessError(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(buf.getvalue())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise FileAccessError(f"{path}: cannot write: {exc.strerror or exc}") from None


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- the four figures ------------------------------------------------------------------------------------


def scaling_figure(curves, path: Path, title: str) -> None:
    from planner.decisions.scaling import STOP_EFFICIENCY

    plt = require_matplotlib()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, c in enumerate(curves):
        pts = [p for p in c.points if p.feasible]
        if not pts:
            continue
        gpus = [p.num_gpus for p in pts]
        (line,) = ax1.plot(gpus, [p.tokens_per_second for p in pts], "o-", label=f"batch {c.global_batch_size:,}")
        base = pts[0]
        ax1.plot(gpus, [base.tokens_per_second * g / base.num_gpus for g in gpus], ":", color=line.get_color(),
                 alpha=0.6)
        ax2.plot(gpus, [p.efficiency * 100 for p in pts], "o-", color=line.get_color(),
                 label=f"batch {c.global_batch_size:,}")
        stop = c.stops_paying
        if stop is not None:
            ax2.plot([stop.num_gpus], [stop.efficiency * 100], "x", ms=12, mew=2.5, color=line.get_color())
            ax2.annotate(f"stops paying\n{stop.nodes:,} nodes", (stop.num_gpus, stop.efficiency * 100),
                         textcoords="offset points", xytext=(8, 10 if i % 2 == 0 else -28), fontsize=8,
                         color=line.get_color())
    ax1.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="tokens/s (dotted: linear from the first point)",
            title="Throughput of the best plan")
    ax2.axhline(STOP_EFFICIENCY * 100, color="grey", ls="--", lw=1)
    ax2.text(0.01, STOP_EFFICIENCY * 100 + 1, f"{STOP_EFFICIENCY:.0%}",
             transform=ax2.get_yaxis_transform(), fontsize=8, color="grey")
    ax2.set(xscale="log", xlabel="GPUs", ylabel="scaling efficiency (%)", title="Tokens/s per GPU vs the first point",
            ylim=(0, max(110, ax2.get_ylim()[1])))
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def comparison_figure(cmp, path: Path, title: str) -> None:
    plt = require_matplotlib()
    ok = [e for e in cmp.entries if e.feasible]
    labels = [e.choice.label for e in ok]
    money = "cost" if cmp.priced else "gpu_hours"
    panels = [("days to train", [e.run.wall_days for e in ok], [e.run.bounds()["wall_clock_days"] for e in ok]),
              ("cost per million tokens" if cmp.priced else "GPU-hours per million tokens",
               [e.per_million_tokens()[money] for e in ok], [None] * len(ok)),
              ("tokens/s per GPU", [e.result.pick.estimate.tokens_per_second_per_gpu for e in ok], [None] * len(ok))]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, (name, values, bounds) in zip(axes, panels, strict=True):
        err = None
        if all(b is not None for b in bounds) and bounds:
            err = [[v - b[0] for v, b in zip(values, bounds, strict=True)],
                   [b[1] - v for v, b in zip(values, bounds, strict=True)]]
        bars = ax.bar(range(len(values)), values, yerr=err, capsize=4, color="#4c72b0")
        best = min(range(len(values)), key=lambda i: values[i] if name != "tokens/s per GPU" else -values[i])
        bars[best].set_color("#55a868")
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 100 else f"{v:.3g}" for v in values], fontsize=8)
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_title(name, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"{title} (best in green)", fontsize=10)
    save(fig, path)


def memory_figure(est, path: Path, title: str, headroom_bytes: float) -> None:
    plt = require_matplotlib()
    stages = est.stages
    fig, ax = plt.subplots(figsize=(max(6.0, min(16.0, 0.3 * len(stages) + 4)), 4.2))
    bottom = [0.0] * len(stages)
    for part in MEMORY_PARTS:
        vals = [getattr(s, f"{part}_bytes") / GIB for s in stages]
        ax.bar(range(len(stages)), vals, bottom=bottom, label=part, width=0.8)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    cap = est.gpu_memory_bytes / GIB
    ax.axhline(cap, color="red", lw=1.5, label=f"GPU capacity {cap:.0f} GiB")
    if headroom_bytes > 0:
        ax.axhline(cap - headroom_bytes / GIB, color="red", ls="--", lw=1, label="capacity less headroom")
    ax.set(xlabel="pipeline stage", ylabel="GiB per GPU", title=title, ylim=(0, cap * 1.12))
    step = max(1, len(stages) // 20)
    ax.set_xticks(range(0, len(stages), step))
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=4)
    ax.grid(True, axis="y", alpha=0.3)
    save(fig, path)


def time_figure(est, path: Path, title: str) -> None:
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(10, 2.6))
    left, step = 0.0, est.step_seconds
    for name, attr in TIME_PARTS:
        v = getattr(est.time, attr)
        if v <= 0:
            continue
        ax.barh([0], [v], left=left, label=f"{name} {v / step:.1%}", height=0.6)
        if v / step >= 0.06:
            ax.text(left + v / 2, 0, f"{name}\n{v:.3g} s", ha="center", va="center", fontsize=8, color="white")
        left += v
    ax.set(xlim=(0, left * 1.001), yticks=[], xlabel="seconds per step", title=title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=4)
    save(fig, path)


def plan_figures(problem, result, folder: Path) -> list[Path]:
    """memory.png/.svg and time.png/.svg of the pick in `folder` (created if missing)."""
    from planner.errors import FileAccessError

    require_matplotlib()
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FileAccessError(f"{folder}: cannot create the figures folder: {exc.strerror or exc}") from None
    est, lay = result.pick.estimate, result.pick.layout
    name = f"{problem.model.name} on {problem.cluster.num_gpus:,} x {problem.hardware.gpu_name}"
    out = []
    for ext in FORMATS:
        p = folder / f"memory{ext}"
        memory_figure(est, p, f"Memory per pipeline stage: {name}\n{lay.short()}",
                      problem.knobs.memory_headroom_bytes)
        out.append(p)
        p = folder / f"time{ext}"
        time_figure(est, p, f"Time per step {est.step_seconds:.3g} s: {name}")
        out.append(p)
    return out


# ---- compact terminal renderings --------------------------------------------------------------------------

MEMORY_SYMBOLS = {"weights": "W", "gradients": "G", "optimizer": "O", "activations": "A", "transient": "T",
                  "overhead": "x"}
TIME_SYMBOLS = {"compute": "C", "recompute": "R", "TP comm": "t", "CP comm": "c", "EP comm": "e", "bubble": ".",
                "PP send/recv": "p",
                "DP comm": "d", "optimizer": "o", "offload": "f"}


def _bar(parts: list[tuple[str, float]], total: float, width: int) -> str:
    """Letters in proportion (largest-remainder rounding, so the bar is exactly its share of `width`)."""
    if total <= 0:
        return ""
    raw = [(sym, v / total * width) for sym, v in parts]
    cells = [int(r) for _, r in raw]
    order = sorted(range(len(raw)), key=lambda i: -(raw[i][1] - cells[i]))
    for i in order[: max(0, round(sum(r for _, r in raw)) - sum(cells))]:
        cells[i] += 1
    return "".join(sym * n for (sym, _), n in zip(raw, cells, strict=True))


def memory_lines(est, headroom_bytes: float, width: int = 50, max_rows: int = 12) -> list[str]:
    """Memory per stage as letter bars against the capacity `|` (survives without colour); at most `max_rows`
    stages: the first ones, the peak and the last, with a line for those left out."""
    cap = est.gpu_memory_bytes
    stages = list(est.stages)
    show = stages
    if len(stages) > max_rows:
        keep = {0, 1, 2, est.peak_stage, len(stages) - 2, len(stages) - 1}
        show = [s for s in stages if s.stage in keep]
    legend = ", ".join(f"{v} {k}" for k, v in MEMORY_SYMBOLS.items())
    lines = [f"Memory per stage (GiB; | = capacity {cap / GIB:.0f} GiB, ! = less {headroom_bytes / GIB:.0f} GiB "
             "headroom)", f"  {legend}"]
    prev = -1
    for s in show:
        if s.stage != prev + 1:
            lines.append(f"  ... {s.stage - prev - 1} stages not shown (all are in --json and the figure)")
        prev = s.stage
        bar = _bar([(MEMORY_SYMBOLS[p], getattr(s, f"{p}_bytes")) for p in MEMORY_PARTS], cap, width)
        cells = list(bar.ljust(width))
        mark = min(width - 1, int((cap - headroom_bytes) / cap * width))
        if cells[mark] == " ":
            cells[mark] = "!"
        lines.append(f"  s{s.stage:<4}{''.join(cells)}|{s.total_bytes / GIB:6.1f}")
    return lines


def time_lines(est, width: int = 60) -> list[str]:
    parts = [(TIME_SYMBOLS[name], getattr(est.time, attr)) for name, attr in TIME_PARTS]
    bar = _bar(parts, est.step_seconds, width)
    used = [f"{TIME_SYMBOLS[n]} {n} {getattr(est.time, a) / est.step_seconds:.0%}" for n, a in TIME_PARTS
            if getattr(est.time, a) / est.step_seconds >= 0.005]
    import textwrap

    return [f"Time per step ({est.step_seconds:.3g} s)", f"  [{bar}]",
            *textwrap.wrap(", ".join(used), 78, initial_indent="  ", subsequent_indent="  ")]
