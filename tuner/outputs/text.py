"""Outputs stage, text: every number, ratio and split as the terminal, report.md, report.html
and the plots write it. The wording of a ratio with its spread and of the split is
tuner.records' (ratio_text, split_text): analysis writes the same words into
recommendation.json and policy.json and may not import this stage, so the rows here call it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tuner.analysis.frame import number
from tuner.records import ratio_text, split_text


def num(value: float | None, fmt: str = "{:.1f}") -> str:
    """A measured figure, or "-" when it is missing or undefined."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def times(value: float | None) -> str:
    """A ratio without its spread: "1.23x"."""
    return ratio_text(number(value))


def signed_pct(value: float | None) -> str:
    """An error already in percent, signed: "+4.2%" (predicted above measured)."""
    return num(value, "{:+.1f}%")


def with_noise(ratio: float, noise: float) -> str:
    """A ratio with its relative noise, as the policy's tables show it: "1.05x \u00b13%"."""
    return f"{ratio:.2f}x \u00b1{noise:.0%}"


def versus(predicted: Any, measured: Any, error_pct: Any, fmt: str = "{:.1f}") -> str:
    """One cell: "54.0 / 57.4 (-5.9%)", the error left out where it is unknown."""
    err = signed_pct(error_pct)
    return f"{num(predicted, fmt)} / {num(measured, fmt)}" + (f" ({err})" if err != "-" else "")


def ratio(row: Mapping[str, Any], name: str) -> str:
    """One ratio of the split (tuner.analysis.decomposition.COLUMNS) from a frame row or a
    recommendation's record: its value and `<name>_spread`."""
    return ratio_text(number(row.get(name)), number(row.get(f"{name}_spread")))


def split(row: Mapping[str, Any]) -> str:
    """The split of a frame row or a recommendation's record: "path 0.83x \u00b10.02 x
    speculation 1.28x \u00b10.04"."""
    return split_text(*(number(row.get(c)) for c in (
        "path_cost", "path_cost_spread", "speculation_gain", "speculation_gain_spread")))
