"""Sparklines on a fixed scale and a fixed time axis (pure functions; see
test_tui_snapshots.py for how they look on screen)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ddptui.monitor import NA
from ddptui.tui.widgets.spark import (
    BARS,
    MISSING,
    scale_fraction,
    spark_level,
    spark_rows,
    spark_text,
)
from ddptui.tui.widgets.system import PERCENT_SCALE, TEMPERATURE_SCALE, power_scale


@pytest.mark.parametrize(
    ("value", "low", "high", "expected"),
    [
        (0.0, 0.0, 100.0, 0.0),
        (100.0, 0.0, 100.0, 1.0),
        (42.0, 0.0, 100.0, 0.42),
        (150.0, 0.0, 100.0, 1.0),  # above the scale: clamped, never off the chart
        (-5.0, 0.0, 100.0, 0.0),
        (300.0, 0.0, 400.0, 0.75),  # power against its limit
        (math.nan, 0.0, 100.0, 0.0),
        (math.inf, 0.0, 100.0, 1.0),
        (5.0, 10.0, 10.0, 0.0),  # a scale with no width
        (5.0, 10.0, 0.0, 0.0),
        (5.0, 0.0, math.inf, 0.0),
    ],
)
def test_scale_fraction_is_against_the_fixed_scale(value, low, high, expected):
    assert scale_fraction(value, low, high) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("value", "height", "expected"),
    [(0.0, 1, 1), (100.0, 1, 8), (50.0, 1, 5), (42.0, 1, 4), (0.0, 2, 1), (100.0, 2, 16)],
)
def test_spark_level_runs_from_a_floor_to_full_height(value, height, expected):
    assert spark_level(value, 0.0, 100.0, height) == expected


def test_an_idle_gpu_draws_a_floor_not_a_full_bar():
    # Scaled to its own min..max, a constant series used to fill the whole height.
    assert spark_rows([0.0] * 6, 6, *PERCENT_SCALE) == [BARS[0] * 6]


def test_a_steady_temperature_draws_a_steady_low_line():
    (row,) = spark_rows([42.0] * 5, 5, *TEMPERATURE_SCALE)
    assert row == BARS[3] * 5  # 42 % of the way up, every sample alike


def test_one_column_per_sample_newest_at_the_right():
    (row,) = spark_rows([0.0, 50.0, 100.0], 8, *PERCENT_SCALE)
    assert row == " " * 5 + BARS[0] + BARS[4] + BARS[7]  # empty on the left, not stretched


def test_more_samples_than_columns_keeps_the_newest():
    (row,) = spark_rows([100.0] * 10 + [0.0, 0.0], 4, *PERCENT_SCALE)
    assert row == BARS[7] * 2 + BARS[0] * 2


def test_missing_samples_keep_their_column():
    (row,) = spark_rows([100.0, None, 100.0, math.nan], 4, *PERCENT_SCALE)
    assert row == BARS[7] + MISSING + BARS[7] + MISSING


def test_two_rows_share_the_height():
    top, bottom = spark_rows([0.0, 50.0, 100.0, None], 5, *PERCENT_SCALE, height=2)
    # 50 % of 16 eighths: 1 + round(0.5 * 15) = 9 -> a full bottom cell and one eighth on top.
    assert bottom == " " + BARS[0] + BARS[7] + BARS[7] + MISSING
    assert top == " " + " " + BARS[0] + BARS[7] + " "


def test_nothing_to_draw():
    assert spark_rows([], 3, *PERCENT_SCALE) == ["   "]
    assert spark_rows([1.0], 0, *PERCENT_SCALE) == [""]


def test_colours_follow_the_fixed_scale():
    text = spark_text([10.0, 70.0, 95.0, None], 5, *PERCENT_SCALE)
    assert text.plain == " " + BARS[1] + BARS[5] + BARS[7] + MISSING
    styles = [str(span.style) for span in text.spans]
    assert styles == ["green", "yellow", "red", "dim"]


@pytest.mark.parametrize(
    ("limit", "draws", "expected"),
    [
        (400.0, [100.0, 250.0], (0.0, 400.0)),  # 0 to the power limit
        (NA, [100.0, None, 250.0], (0.0, 250.0)),  # no limit known: 0 to the highest draw
        (NA, [], (0.0, 1.0)),
        (0.0, [0.0], (0.0, 1.0)),
    ],
)
def test_power_scale(limit, draws, expected):
    assert power_scale(limit, draws) == expected


def test_pcie_is_shown_on_a_gpu_card_only_where_measured_and_with_its_age():
    from ddptui.monitor import GpuSnapshot
    from ddptui.tui.widgets.system import pcie_label

    gpu = GpuSnapshot(0, "GPU", "GPU-a", NA, 1, 1, 1, 2, 40, 1.0, 2.0, 1, NA, NA)
    assert pcie_label(gpu) is None
    measured = dataclasses.replace(gpu, pcie_rx=3 * 1024**3, pcie_tx=512 * 1024**2, pcie_age=2.4)
    assert pcie_label(measured) == "pcie rx 3.0G/s tx 512.0M/s 2s ago"
