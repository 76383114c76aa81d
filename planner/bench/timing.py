"""The one wall-clock timer of the benchmark and the calibration."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], object], repeats: int, *, warmup: bool = True) -> tuple[float, float]:
    """(median seconds, spread = max/min - 1) of fn over `repeats` calls, after one untimed call when warmup."""
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), max(times) / max(min(times), 1e-12) - 1
