"""Replay stage, traffic pricing: a study's step cost applied to another traffic's replay.

A study on the target hardware fits the cost of an engine step per level (tuner.replay.predict
calibrates it on the study's measured trials, tuner.replay.cost); the traffic's own requests,
with each config's replayed drafts, are played out on it (tuner.replay.schedule). What the
play leaves out (the load generator, the frontend) is taken from the study: the measured
throughput of the baseline the cost is anchored on over that baseline's own tokens played out,
a factor applied to every played traffic level. Where the anchor is an aligned baseline, the
plain baseline's throughput is the anchor's times their measured ratio (the path's cost).
TPOT and TTFT are the played figures, as in tuner.replay.predict.

The play is step by step in Python, so at most PLAY_REQUESTS requests, spread evenly over the
file, are played per level: a closed loop of that many is in its steady state.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.replay import acceptance, cost, schedule
from tuner.replay.predict import MeasuredTrial
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
    """One level's yardstick: the factor a played throughput is scaled by, and the plain
    baseline's throughput over the anchor's (1 without an aligned baseline)."""

    step: cost.StepCost
    slots: int
    factor: float
    path_ratio: float


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
    anchor_role = "aligned_baseline" if step.path == cost.PATH_ALIGNED else "baseline"
    anchor = _median_throughput(cal.measured, anchor_role, c)
    plain = _median_throughput(cal.measured, "baseline", c)
    reqs = sorted(cal.base.level(c, warmup=False), key=lambda r: r.index)
    if anchor is None or plain is None or not reqs:
        return None
    slots = min(c, cal.max_num_seqs)
    played = _play(step, None, reqs, 0, slots)
    if not played.output_throughput:
        return None
    return Level(step=step, slots=slots, factor=anchor / played.output_throughput,
                 path_ratio=plain / anchor)


def baseline_row(yard: Level, sample: TokenCapture, c: int) -> dict[str, Any]:
    """The plain baseline's predicted figures over the traffic's played requests."""
    played = _play(yard.step, None, _requests(sample, c), 0, yard.slots)
    thr = _scaled(yard.factor * yard.path_ratio, played.output_throughput)
    tpot = played.mean_tpot_ms / yard.path_ratio if played.mean_tpot_ms is not None else None
    return {"pred_output_throughput": thr, "pred_mean_tpot_ms": tpot,
            "pred_mean_ttft_ms": played.mean_ttft_ms, "pred_speedup": 1.0 if thr else None}


def config_row(yard: Level, sample: TokenCapture, c: int, acc: acceptance.Acceptance,
               base_throughput: float | None) -> dict[str, Any]:
    """A config's predicted figures: its drafts over the traffic's played requests."""
    played = _play(yard.step, acc.request_drafts, _requests(sample, c), acc.k, yard.slots)
    thr = _scaled(yard.factor, played.output_throughput)
    return {"pred_output_throughput": thr, "pred_mean_tpot_ms": played.mean_tpot_ms,
            "pred_mean_ttft_ms": played.mean_ttft_ms,
            "pred_speedup": thr / base_throughput if thr and base_throughput else None}


def _requests(capture: TokenCapture, c: int) -> list:
    return sorted(capture.level(c, warmup=False), key=lambda r: r.index)


def _play(step: cost.StepCost, drafts: list[np.ndarray] | None, reqs: list, k: int,
          slots: int) -> schedule.Schedule:
    """tuner.replay.predict's play: the drafts (None: no speculation) of `reqs`, in order."""
    lengths = [len(r.output) for r in reqs]
    return schedule.simulate(
        schedule.baseline_drafts(lengths) if drafts is None else drafts, lengths,
        concurrency=slots, k=k, step_ms=step.speculative_step_ms if k else step.step_ms,
        prompts=[len(r.prompt) for r in reqs], prefill_ms_per_token=step.prefill.ms_per_token,
        overhead_ms=step.prefill.overhead_ms)


def _median_throughput(measured: Sequence[MeasuredTrial], role: str, c: int) -> float | None:
    values = [v for m in measured if m.role == role and c in m.levels
              if (v := m.levels[c].output_throughput) and v > 0]
    return statistics.median(values) if values else None


def _scaled(factor: float, value: float | None) -> float | None:
    return factor * value if value else None
