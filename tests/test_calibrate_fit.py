"""The calibration's fits, on synthetic measurements with known answers (no timing involved)."""

import pytest

pytest.importorskip("torch")

from planner.bench.calibrate import CPU_SIZES, GPU_SIZES, fit_gemm_line, fit_two, gemm_grid  # noqa: E402


def test_gemm_line_recovers_peak_and_overhead():
    # t = 20 us + F / 700 TFLOP/s, i.e. x_half = 20e-6 * 700e12 / 1e9 = 14 GFLOP
    pts = [(f, 20e-6 + f / 700e12) for f in (1e6, 1e8, 1e10, 1e12, 1e13)]
    peak, a = fit_gemm_line(pts)
    assert peak == pytest.approx(700e12, rel=1e-9) and a == pytest.approx(20e-6, rel=1e-9)


def test_gemm_line_never_returns_negative_overhead():
    pts = [(1e9, 1e-3), (2e9, 2.5e-3), (4e9, 6e-3)]  # super-linear: the free fit would give a < 0
    peak, a = fit_gemm_line(pts)
    assert a == 0.0 and peak > 0


def test_fit_two_recovers_both_coefficients():
    a, b = [1.0, 2.0, 5.0], [0.5, 0.1, 3.0]
    y = [ai * 26.0 + bi * 0.4 for ai, bi in zip(a, b, strict=True)]
    u, v = fit_two(a, b, y)
    assert u == pytest.approx(26.0) and v == pytest.approx(0.4)


def test_grid_spans_tiny_to_large_shapes():
    for sizes, lo, hi in ((CPU_SIZES, 32, 1024), (GPU_SIZES, 128, 8192)):
        grid = gemm_grid(sizes)
        flops = sorted(2 * m * k * n for m, k, n in grid)
        assert grid[0] == (lo, lo, lo) and (hi, hi, hi) in grid
        assert flops[-1] / flops[0] >= (hi / lo) ** 3  # six (CPU) and seven (GPU) decades of GEMM size
        assert any(k != n for _, k, n in grid)  # MLP-like rectangles, not only cubes
