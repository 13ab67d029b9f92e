"""Measure stage, steady state: when a level's back-to-back windows agree.

With `--stability` on, a level runs closed-loop windows of equal size back to back (as
Triton's perf_analyzer runs its stability windows). Once the last `stable_windows` agree,
their mean TPOT within the target (half the range over the median, in percent), they are the
level's measurement, and every window before them was warm-up: the
engine had not settled yet. A level that never settles stops at its time cap, measured on its
last windows and marked not converged. The rules are pure, figures in and verdicts out;
tuner.measure.trial runs the windows.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tuner.measure import metrics
from tuner.records import MeasureSettings, Prompt, RequestRecord, SpecDecodeCounts


@dataclass(frozen=True)
class Window:
    """One closed-loop block of a level as it ran: its records (index i sent prompts[i], in
    send order), its wall time, and vLLM's counters scraped at its start and end."""

    records: tuple[RequestRecord, ...]
    prompts: tuple[Prompt, ...]
    wall_s: float
    before: SpecDecodeCounts
    after: SpecDecodeCounts

    @property
    def output_throughput(self) -> float:
        """Output tokens of the ok requests per second of the window, as the level's."""
        tokens = sum(r.output_tokens for r in self.records if r.ok)
        return tokens / max(self.wall_s, 1e-9)

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
    per-token latency. Their throughput also moves with the prompts each window drew (their
    prefill): on the CPU two prompt sets of one level differed by 20% in throughput and 1% in
    TPOT (benchmarks/noise_sources.py), a spread more windows cannot settle."""
    return spread_pct([w.decode_ms_per_token for w in windows])


def throughput_spread_pct(windows: Sequence[Window]) -> float:
    """The spread of `windows`' output throughput, prompt mix included (stored beside)."""
    return spread_pct([w.output_throughput for w in windows])


def finished(windows: Sequence[Window], settings: MeasureSettings, *, elapsed_s: float) -> bool:
    """Whether the level stops: never before `stable_windows` windows; then once the last
    `stable_windows` agree within the target, or once the level has run `stability_max_s`."""
    n = settings.stable_windows
    if len(windows) < n:
        return False
    return (stability_pct(windows[-n:]) <= settings.stability_pct
            or elapsed_s >= settings.stability_max_s)


def grown(size: int, wall_s: float, concurrency: int, settings: MeasureSettings) -> int:
    """The next window's size: `size` while a window lasts `min_window_s`, else enough whole
    rounds of the slots to last that long (at most 8 times larger at once)."""
    if wall_s >= settings.min_window_s or wall_s <= 0:
        return size
    want = min(size * settings.min_window_s / wall_s, 8 * size)
    return max(size, math.ceil(want / concurrency) * concurrency)


@dataclass(frozen=True)
class Split:
    """A level's windows as the level's records: the settling windows' requests flagged
    warm-up and numbered after the short warm-ups, the stable windows' numbered from 0 (each
    in send order, prompts[i] sent as index i of its phase), the counters and wall time of
    the stable windows alone, and the windows' fields of LevelMetrics."""

    settling: list[RequestRecord]
    settling_prompts: list[Prompt]
    records: list[RequestRecord]
    prompts: list[Prompt]
    counts: SpecDecodeCounts
    wall_s: float
    fields: dict[str, Any]


def split(windows: Sequence[Window], settings: MeasureSettings, *, warmups: int,
          measure_s: float) -> Split:
    """The level's phases from its windows (`warmups`: the short warm-ups sent before them;
    `measure_s`: the windows' wall time, gaps between them included)."""
    if not windows:
        raise ValueError("split needs at least one window")
    n = min(settings.stable_windows, len(windows))
    settling, stable = windows[:-n], windows[-n:]
    early, early_prompts = _renumber(settling, start=warmups, warmup=True)
    records, prompts = _renumber(stable, start=0, warmup=False)
    pct = stability_pct(stable)
    fields = {"windows": tuple(w.output_throughput for w in windows),
              "window_tpot_ms": tuple(w.decode_ms_per_token for w in windows),
              "stable_windows": n, "stability_pct": pct if math.isfinite(pct) else None,
              "converged": len(windows) >= settings.stable_windows
              and pct <= settings.stability_pct,
              "measure_s": measure_s}
    return Split(settling=early, settling_prompts=early_prompts, records=records,
                 prompts=prompts, counts=metrics.delta(stable[0].before, stable[-1].after),
                 wall_s=sum(w.wall_s for w in stable), fields=fields)


def _renumber(windows: Sequence[Window], *, start: int, warmup: bool
              ) -> tuple[list[RequestRecord], list[Prompt]]:
    """The windows' records one after another from index `start`, in send order (a window's
    own index is its send order), flagged `warmup`; and their prompts in that order."""
    records: list[RequestRecord] = []
    prompts: list[Prompt] = []
    for w in windows:
        offset = start + len(prompts)
        records += [r.model_copy(update={"index": offset + r.index, "warmup": warmup})
                    for r in sorted(w.records, key=lambda r: r.index)]
        prompts += w.prompts
    return records, prompts
