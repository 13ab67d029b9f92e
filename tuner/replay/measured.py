"""Replay stage, the measured side of a prediction: a finished trial as the predictor needs it
(MeasuredTrial; the search stage builds these), and its figures' medians over the repeats of a
config, which the step-cost fit, the yardsticks and the measured columns all read.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.records.configs import TrialConfig
from tuner.records.results import LevelMetrics
from tuner.records.trials import Role
from tuner.tokens import TokenCapture


@dataclass(frozen=True)
class MeasuredTrial:
    """A finished trial as the predictor needs it (the search stage builds these)."""

    number: int
    config: TrialConfig
    role: Role  # a Role value given as its string is read as the Role
    levels: dict[int, LevelMetrics]
    capture: TokenCapture | None = None
    cudagraph_mode: str | None = None  # as the engine path read it from the trial's log
    ngram_path: str | None = None  # an n-gram launch's proposer, as the engine path read it

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", Role(self.role))

    @property
    def aligned(self) -> bool:
        return self.role == Role.ALIGNED_BASELINE

    @property
    def speculative(self) -> bool:
        return bool(self.config.speculative_config)


def by_config(measured: Iterable[MeasuredTrial]) -> dict[str, list[MeasuredTrial]]:
    """The trials grouped by config (TrialConfig.key), each group a config's repeats."""
    out: dict[str, list[MeasuredTrial]] = {}
    for m in measured:
        out.setdefault(m.config.key(), []).append(m)
    return out


_FIELDS = ("output_throughput", "mean_tpot_ms", "mean_ttft_ms", "spec_decode_acceptance_length")


def median_level(group: Sequence[MeasuredTrial], c: int) -> dict[str, float] | None:
    """Each figure's median over the group's repeats at level c (None where none measured c)."""
    levels = [m.levels[c] for m in group if c in m.levels]
    if not levels:
        return None
    out = {}
    for name in _FIELDS:
        values = [v for lv in levels if finite(v := getattr(lv, name))]
        out[name] = statistics.median(values) if values else None
    values = [v for lv in levels if finite(v := _decode_ms_per_token(lv))]
    out["decode_ms_per_token"] = statistics.median(values) if values else None
    return out


def _decode_ms_per_token(lv: LevelMetrics) -> float | None:
    """sum(e2e - TTFT) / sum(N - 1) over the level's completed requests: its decode time per
    token (mean TPOT where the level holds no latencies to derive it from). The cost fit reads
    this, not mean TPOT: at c=4 on sharegpt (16 requests, five of one or two tokens) one
    request of two tokens whose only gap held another's 1.2 s prefill made the baseline's
    mean TPOT 145 ms in one pass and 57 ms in the next."""
    decoded = lv.total_output_tokens - lv.completed
    if decoded <= 0 or not finite(lv.mean_e2el_ms) or not finite(lv.mean_ttft_ms):
        return lv.mean_tpot_ms
    return (lv.mean_e2el_ms - lv.mean_ttft_ms) * lv.completed / decoded


def pooled(group: Sequence[MeasuredTrial]) -> dict[int, dict[str, float]]:
    """median_level at every level any trial of the group measured."""
    levels = sorted({c for m in group for c in m.levels})
    return {c: lv for c in levels if (lv := median_level(group, c)) is not None}


def finite(x: Any) -> bool:
    """Whether `x` is a number and not NaN or infinite (None and other types are not)."""
    return isinstance(x, (int, float)) and math.isfinite(x)
