"""Time, cost and energy to train a token budget with one layout.

    steps        = ceil(tokens / (global batch x sequence length))
    wall clock   = steps x predicted step time
    GPU-hours    = GPUs x wall clock / 3600
    cost         = GPU-hours x price per GPU-hour (when a price is given; the currency is the price's)
    GPU energy   = GPUs x board power limit x wall clock (catalog `board_power_watts`, with its source)
    facility     = GPU energy x PUE (only when a PUE is given)

The board power limit bounds the GPUs' average draw, so the GPU energy is an upper bound for the GPUs; CPUs,
host memory, NICs and switches, storage and cooling are left out (cooling enters only through --pue).
An error band on the step time (a pair of factors) carries through every quantity, all of which are
proportional to the wall clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cluster_specs import ClusterSpec
    from planner.problem import Problem

SECONDS_PER_DAY = 86_400.0
LEFT_OUT = ("CPUs and host memory", "NICs, switches and storage", "cooling and power delivery (PUE)")


@dataclass(frozen=True)
class StepTimeBand:
    """Where the measured step time is expected to fall, as factors on the predicted one (0 < lower <= upper; a
    model that is biased on a regime can have both factors on one side of 1)."""

    lower_factor: float
    upper_factor: float
    source: str

    def __post_init__(self) -> None:
        if not (0 < self.lower_factor <= self.upper_factor) or not math.isfinite(self.upper_factor):
            raise ValueError(f"band: lower {self.lower_factor}, upper {self.upper_factor} -> need 0 < lower <= "
                             "upper < inf")

    @property
    def half_width(self) -> float:
        """Half the band's relative width: two step-time predictions closer than this are a tie (the band's
        spread is the model's error; a bias common to both layouts does not change their order)."""
        return (self.upper_factor - self.lower_factor) / 2

    def as_json(self) -> dict[str, Any]:
        return {"lower_factor": self.lower_factor, "upper_factor": self.upper_factor, "source": self.source}


@dataclass(frozen=True)
class Power:
    """A GPU's board power limit and where the figure comes from."""

    board_watts: float | None
    source: str


@dataclass(frozen=True)
class TrainingRun:
    tokens: float
    tokens_per_step: int
    steps: int
    step_seconds: float
    num_gpus: int
    price_per_gpu_hour: float | None
    power: Power
    pue: float | None
    band: StepTimeBand | None
    band_note: str

    @property
    def wall_seconds(self) -> float:
        return self.steps * self.step_seconds

    @property
    def wall_days(self) -> float:
        return self.wall_seconds / SECONDS_PER_DAY

    @property
    def gpu_hours(self) -> float:
        return self.num_gpus * self.wall_seconds / 3600.0

    @property
    def cost(self) -> float | None:
        return None if self.price_per_gpu_hour is None else self.gpu_hours * self.price_per_gpu_hour

    @property
    def gpu_energy_kwh(self) -> float | None:
        if self.power.board_watts is None:
            return None
        return self.num_gpus * self.power.board_watts * self.wall_seconds / 3.6e6

    @property
    def facility_energy_kwh(self) -> float | None:
        e = self.gpu_energy_kwh
        return None if e is None or self.pue is None else e * self.pue

    def quantities(self) -> dict[str, float | None]:
        return {"wall_clock_seconds": self.wall_seconds, "wall_clock_days": self.wall_days,
                "gpu_hours": self.gpu_hours, "cost": self.cost, "gpu_energy_kwh": self.gpu_energy_kwh,
                "facility_energy_kwh": self.facility_energy_kwh}

    def bounds(self) -> dict[str, tuple[float, float] | None]:
        """Each quantity at the band's lower and upper step time (None without a band or without the quantity)."""
        out: dict[str, tuple[float, float] | None] = {}
        for k, v in self.quantities().items():
            out[k] = None if v is None or self.band is None else (v * self.band.lower_factor,
                                                                   v * self.band.upper_factor)
        return out

    def as_json(self) -> dict[str, Any]:
        bounds = self.bounds()
        return {
            "tokens": self.tokens, "tokens_per_step": self.tokens_per_step, "steps": self.steps,
            "step_time_seconds": self.step_seconds, "num_gpus": self.num_gpus,
            **{k: _bounded(v, bounds[k]) for k, v in self.quantities().items()},
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "gpu_board_power_watts": self.power.board_watts, "gpu_board_power_source": self.power.source,
            "pue": self.pue,
            "energy_left_out": [x for x in LEFT_OUT if not (self.pue is not None and x.startswith("cooling"))],
            "error_band": None if self.band is None else self.band.as_json(),
            "error_band_note": self.band_note,
        }


def gpu_power(cluster: ClusterSpec) -> Power:
    """The catalog's board power limit for the cluster's GPU, with its source."""
    gpu = cluster.gpu_spec()
    if gpu.board_power_watts is None:
        return Power(None, f"no board power for {gpu.name or cluster.gpu} in the catalog: energy not estimated")
    return Power(gpu.board_power_watts, gpu.board_power_source or "cluster file")


NO_BAND = "no error band available for this prediction: the figures are point estimates"


def training_run(*, tokens: float, global_batch_size: int, seq_length: int, step_seconds: float, num_gpus: int,
                 power: Power, price_per_gpu_hour: float | None = None, pue: float | None = None,
                 band: StepTimeBand | None = None, band_note: str | None = None) -> TrainingRun:
    """The run that trains `tokens` tokens at `step_seconds` per step (see the module docstring)."""
    per_step = global_batch_size * seq_length
    return TrainingRun(tokens=tokens, tokens_per_step=per_step, steps=math.ceil(tokens / per_step),
                       step_seconds=step_seconds, num_gpus=num_gpus, price_per_gpu_hour=price_per_gpu_hour,
                       power=power, pue=pue, band=band,
                       band_note=band_note or (band.source if band is not None else NO_BAND))


def for_problem(problem: Problem, step_seconds: float, *, tokens: float, price_per_gpu_hour: float | None = None,
                pue: float | None = None, band: StepTimeBand | None = None) -> TrainingRun:
    tr = problem.training
    return training_run(tokens=tokens, global_batch_size=tr.global_batch_size, seq_length=tr.seq_length,
                        step_seconds=step_seconds, num_gpus=problem.cluster.num_gpus, power=gpu_power(problem.cluster),
                        price_per_gpu_hour=price_per_gpu_hour, pue=pue, band=band)


def check_run_options(tokens: float | None, price: float | None, pue: float | None) -> None:
    """One SpecError listing every bad option (field, value, what is allowed)."""
    from cluster_specs import SpecError

    problems = []
    if tokens is not None and not (math.isfinite(tokens) and 1 <= tokens <= 1e17):
        problems.append(f"--tokens: {tokens} -> must be a number of tokens between 1 and 1e17")
    if price is not None and not (math.isfinite(price) and 0 <= price <= 1e4):
        problems.append(f"--gpu-hour-price: {price} -> must be between 0 and 10000 per GPU-hour")
    if pue is not None and not (math.isfinite(pue) and 1 <= pue <= 5):
        problems.append(f"--pue: {pue} -> must be between 1.0 and 5.0 (facility energy / IT energy)")
    if (price is not None or pue is not None) and tokens is None:
        problems.append("--gpu-hour-price/--pue: need --tokens (the token budget to train)")
    if problems:
        raise SpecError(problems)


def _energy(kwh: float) -> str:
    for unit, scale in (("GWh", 1e6), ("MWh", 1e3)):
        if kwh >= scale:
            return f"{kwh / scale:,.3g} {unit}"
    return f"{kwh:,.3g} kWh"


def _days(d: float) -> str:
    return f"{d:,.1f} days" if d >= 1 else f"{d * 24:,.1f} hours"


def _range(run: TrainingRun, key: str, fmt: Callable[[float], str]) -> str:
    b = run.bounds()[key]
    return "" if b is None else f" (band {fmt(b[0])} - {fmt(b[1])})"


def wrap(label: str, text: str, width: int = 80) -> list[str]:
    """`  label       text`, wrapped at `width` with a hanging indent (the terminal blocks' one layout)."""
    import textwrap

    head = f"  {label:<12}"
    return textwrap.wrap(text, width=width, initial_indent=head, subsequent_indent=" " * len(head),
                         break_on_hyphens=False) or [head.rstrip()]


def render_lines(run: TrainingRun) -> list[str]:
    """The training run as plain lines of at most 80 columns."""
    from planner.explain.report import count

    lines = [f"Training {count(run.tokens)} tokens: {run.steps:,} steps of {run.tokens_per_step:,} tokens, "
             f"{run.num_gpus:,} GPUs"]
    lines += wrap("wall clock", f"{_days(run.wall_days)}{_range(run, 'wall_clock_days', _days)}")
    lines += wrap("GPU-hours", f"{run.gpu_hours:,.0f}{_range(run, 'gpu_hours', lambda x: f'{x:,.0f}')}")
    if run.cost is not None:
        lines += wrap("cost", f"{run.cost:,.0f} at {run.price_per_gpu_hour:g} per GPU-hour"
                              f"{_range(run, 'cost', lambda x: f'{x:,.0f}')}")
    if run.gpu_energy_kwh is not None:
        lines += wrap("GPU energy", f"{_energy(run.gpu_energy_kwh)}{_range(run, 'gpu_energy_kwh', _energy)}, an upper "
                                    f"bound: {run.power.board_watts:g} W per GPU ({run.power.source})")
        if run.facility_energy_kwh is not None:
            lines += wrap("facility", f"{_energy(run.facility_energy_kwh)} with PUE {run.pue:g} (the GPUs' share)")
        left = [x for x in LEFT_OUT if not (run.pue is not None and x.startswith("cooling"))]
        lines += wrap("left out", "; ".join(left))
    else:
        lines += wrap("energy", run.power.source)
    if run.band is None:
        lines += wrap("note", run.band_note)
    else:
        lines += wrap("band", f"step time x{run.band.lower_factor:.2f} to x{run.band.upper_factor:.2f} "
                              f"({run.band.source})")
    return lines


def _bounded(value: float | None, band: tuple[float, float] | None) -> dict[str, float | None]:
    return {"value": value, "low": None if band is None else band[0], "high": None if band is None else band[1]}
