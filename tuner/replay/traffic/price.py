"""Replay stage, traffic pricing: a study's step cost applied to another traffic's replay.

A study on the target hardware fits the cost of an engine step per level
(tuner.replay.calibration fits it to the study's measured trials, tuner.replay.cost); the
traffic's own requests, with each config's replayed drafts, are played out on it by
tuner.replay.yardstick's `play` and scaled by its `Yardstick`: the measured throughput of the
baseline the cost is anchored on over that baseline's own tokens played out, a factor applied
to every played traffic level (what the play leaves out, the load generator and the frontend,
is taken from the study).
Where the anchor is an aligned baseline, the plain baseline's throughput is the anchor's times
their measured ratio (the path's cost). TPOT and TTFT are the played figures, as in
tuner.replay.predict.

The play is step by step in Python, so at most PLAY_REQUESTS requests, spread evenly over the
file, are played per level: a closed loop of that many is in its steady state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.replay import acceptance, cost, schedule, yardstick
from tuner.replay.measured import MeasuredTrial
from tuner.tokens import TokenCapture

PLAY_REQUESTS = 256


@dataclass(frozen=True)
class Calibration:
    """What a study gives the traffic: its fitted step cost per level, its baseline's tokens,
    its measured trials and its engine's max_num_seqs."""

    costs: dict[int, cost.StepCost]
    base: TokenCapture
    measured: Sequence[MeasuredTrial]
    max_num_seqs: int
    study: str = ""

    def priced(self, c: int) -> bool:
        step = self.costs.get(c)
        return step is not None and step.calibrated


@dataclass(frozen=True)
class Level:
    """One level's step cost, requests in flight and yardstick (tuner.replay.yardstick)."""

    step: cost.StepCost
    slots: int
    yard: yardstick.Yardstick


def sample_rows(n: int) -> np.ndarray:
    """The rows of a traffic of `n` requests that are played: all, or PLAY_REQUESTS spread
    evenly over the file."""
    if n <= PLAY_REQUESTS:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, PLAY_REQUESTS).round().astype(np.int64))


def level(cal: Calibration, c: int) -> Level | None:
    """The yardstick at level c, or None where the study cannot price it."""
    if not cal.priced(c):
        return None
    step = cal.costs[c]
    yard = yardstick.yardsticks(cal.base, cal.measured, {c: step},
                                max_num_seqs=cal.max_num_seqs).get(c)
    if yard is None or yard.factor is None or yard.path_ratio is None:
        return None
    return Level(step=step, slots=min(c, cal.max_num_seqs), yard=yard)


@dataclass(frozen=True)
class Priced:
    """A traffic row's predicted figures (a TrafficRow's pred_* fields); all None where no
    study prices the level."""

    output_throughput: float | None = None
    mean_tpot_ms: float | None = None
    mean_ttft_ms: float | None = None
    speedup: float | None = None


def baseline(lv: Level, sample: TokenCapture, c: int) -> Priced:
    """The plain baseline's predicted figures over the traffic's played requests."""
    lengths, prompts = _lengths(sample, c)
    played = yardstick.play(lv.step, schedule.baseline_drafts(lengths), lengths, prompts, k=0,
                            slots=lv.slots)
    ratio = lv.yard.path_ratio
    thr = _scaled(lv.yard.factor * ratio, played.output_throughput)
    tpot = played.mean_tpot_ms / ratio if played.mean_tpot_ms is not None else None
    return Priced(output_throughput=thr, mean_tpot_ms=tpot, mean_ttft_ms=played.mean_ttft_ms,
                  speedup=1.0 if thr else None)


def config(lv: Level, sample: TokenCapture, c: int, acc: acceptance.Acceptance,
           base_throughput: float | None) -> Priced:
    """A config's predicted figures: its drafts over the traffic's played requests."""
    lengths, prompts = _lengths(sample, c)
    played = yardstick.play(lv.step, acc.request_drafts, lengths, prompts, k=acc.k,
                            slots=lv.slots)
    thr = _scaled(lv.yard.factor, played.output_throughput)
    return Priced(output_throughput=thr, mean_tpot_ms=played.mean_tpot_ms,
                  mean_ttft_ms=played.mean_ttft_ms,
                  speedup=thr / base_throughput if thr and base_throughput else None)


def _lengths(capture: TokenCapture, c: int) -> tuple[list[int], list[int]]:
    """The output and prompt lengths of the capture's requests at level c, in index order."""
    reqs = sorted(capture.level(c, warmup=False), key=lambda r: r.index)
    return [len(r.output) for r in reqs], [len(r.prompt) for r in reqs]


def _scaled(factor: float, value: float | None) -> float | None:
    return factor * value if value else None
