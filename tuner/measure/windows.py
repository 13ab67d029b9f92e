"""Measure stage, steadiness: a level's measured requests as fixed windows.

With `--stability` on, a level's measured requests (fixed by the RequestSchedule before the
first launch) are cut, in send order, into `stable_windows` slices. Every launch cuts the same
requests into the same slices, so window j of one config and window j of another measured the
same prompts: the windows say how steady a level was (their decode times per token, half the
range over the median), and, paired across launches, how far a speedup moves within a level
(tuner.intervals). They never change what is sent: windows that keep drawing new prompts
until they agree compare different work (a plain engine's windows agree at once, a
speculative engine's, whose acceptance varies by prompt, do not). The rules are pure.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tuner.records.configs import MeasureSettings
from tuner.records.results import LevelMetrics, RequestRecord


@dataclass(frozen=True)
class Window:
    """One slice of a level's measured requests, in send order."""

    records: tuple[RequestRecord, ...]

    @property
    def wall_s(self) -> float:
        """From the slice's first request start to its last end (ok requests)."""
        ok = [r for r in self.records if r.ok and r.e2e_s is not None]
        if not ok:
            return 0.0
        return max(r.start_s + r.e2e_s for r in ok) - min(r.start_s for r in ok)

    @property
    def output_throughput(self) -> float:
        """Output tokens of the ok requests per second of the slice's wall time."""
        tokens = sum(r.output_tokens for r in self.records if r.ok)
        return tokens / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def decode_ms_per_token(self) -> float:
        """sum(e2e - TTFT) / sum(N - 1) over the ok requests that stream two tokens or more,
        in ms: TPOT weighted by tokens; NaN where none does. Not their mean TPOT, which weighs
        a two-token request whose one gap held another's prefill as much as one of 128 (on
        the H100, windows of 11 requests at c=1 kept a ±17% spread of mean TPOT for 22 s)."""
        timed = [r for r in self.records if r.ok and r.tpot_s is not None]
        decoded = sum(r.output_tokens - 1 for r in timed)
        if not decoded:
            return math.nan
        return 1000.0 * sum(r.e2e_s - r.ttft_s for r in timed) / decoded


def slices(records: Sequence[RequestRecord], n: int) -> list[Window]:
    """`records` in send order (index) cut into `n` consecutive windows of near-equal size
    (the first ones one larger where they do not divide); fewer where there are fewer."""
    ordered = sorted(records, key=lambda r: r.index)
    n = max(1, min(n, len(ordered)))
    size, extra = divmod(len(ordered), n)
    out, start = [], 0
    for j in range(n):
        end = start + size + (1 if j < extra else 0)
        out.append(Window(records=tuple(ordered[start:end])))
        start = end
    return out


def spread_pct(values: Sequence[float]) -> float:
    """Half the range over the median, in percent: 0 for equal values, inf where it cannot
    be judged (some values NaN, or a median of 0 beside other values). All NaN: 0, as the
    figure then says nothing (no request streamed two tokens) and cannot disagree."""
    if not values:
        raise ValueError("spread_pct needs at least one value")
    nan = [math.isnan(v) for v in values]
    if all(nan):
        return 0.0
    if any(nan):
        return math.inf
    half = (max(values) - min(values)) / 2.0
    if half == 0.0:
        return 0.0
    median = statistics.median(values)
    return 100.0 * half / median if median > 0 else math.inf


def stability_pct(windows: Sequence[Window]) -> float:
    """How far `windows` disagree: the spread of their decode time per token, the engine's
    per-token latency (a window's throughput also moves with its prompts' prefill)."""
    return spread_pct([w.decode_ms_per_token for w in windows])


def throughput_spread_pct(windows: Sequence[Window]) -> float:
    """The spread of `windows`' output throughput, prompt mix included."""
    return spread_pct([w.output_throughput for w in windows])


@dataclass(frozen=True)
class WindowFigures:
    """The windows' fields of LevelMetrics for one level (LevelMetrics says what each means)."""

    windows: tuple[float, ...]
    window_tpot_ms: tuple[float, ...]
    stable_windows: int
    stability_pct: float | None
    converged: bool

    def on(self, level: LevelMetrics) -> LevelMetrics:
        """`level` carrying these figures."""
        return level.model_copy(update=asdict(self))


def fields(records: Sequence[RequestRecord], settings: MeasureSettings) -> WindowFigures | None:
    """The windows' fields of LevelMetrics for a level's measured `records`; None (the
    defaults stay) where --stability is 0."""
    if settings.stability_pct <= 0 or not records:
        return None
    done = slices(records, settings.stable_windows)
    pct = stability_pct(done)
    return WindowFigures(
        windows=tuple(w.output_throughput for w in done),
        window_tpot_ms=tuple(w.decode_ms_per_token for w in done),
        stable_windows=len(done), stability_pct=pct if math.isfinite(pct) else None,
        converged=len(done) >= settings.stable_windows and pct <= settings.stability_pct)


def with_windows(level: LevelMetrics, records: Sequence[RequestRecord],
                 settings: MeasureSettings) -> LevelMetrics:
    """`level` with the windows' fields of its measured `records` (unchanged without)."""
    figures = fields(records, settings)
    return level if figures is None else figures.on(level)
