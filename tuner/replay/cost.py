"""Replay stage, step cost: what one engine step costs as a function of the tokens it scores.

Per level, t(n, u) = a + b n + m u: n the tokens a decode step scores (each request 1 + the
draft it verifies), u 1 where the step is not uniform (some request drafted fewer than K tokens,
which leaves the full CUDA graph; m is fitted only where the engine splits CUDA graphs). `fit`
solves by least squares through an anchor, the aligned baseline where the study measured one
(the speculative engine path), else the plain baseline (`path` says which), over the
calibration launches; each trial's step time is its decode time per token
(sum(e2e - TTFT) / sum(N - 1)) over its replayed steps per token, prefill stalls subtracted.

At c=1 on an engine that does not split CUDA graphs, a calibration launch that drafts every
length (suffix) adds the step shape: how a step of n tokens differs from its own launch's line,
added to speculative steps (`speculative_step_ms`). `Prefill` holds the cost per prompt token
and the frontend's latency, fitted on measured TTFTs. docs/method.md explains the model;
docs/accuracy.md gives its measured errors.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.records.decisions import CostPoint, StepCostFit

PATH_ALIGNED = "speculative path (anchored on the aligned baseline)"
PATH_PLAIN = "plain baseline path (no aligned baseline: path cost and speculation not separated)"
PROFILE_MIN_STEPS = 20  # a profiled n: at least this many steps (the mean gap's spread ~2%)
# vLLM's CUDAGraphMode names whose runtime dispatch gives uniform decode batches their own graph
SPLIT_CUDAGRAPH_MODES = frozenset({"FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"})


@dataclass(frozen=True)
class Point:
    """One measured trial at one level: tokens scored per step, step time, TTFT."""

    label: str
    scored: float  # tokens per step: c x (1 + drafted per step)
    step_ms: float
    ttft_ms: float
    anchor: bool = False  # a baseline: the no-draft end of the line
    mixed: float = 0.0  # u: the share of its decode steps that are not uniform (0: a baseline)


@dataclass(frozen=True)
class Prefill:
    """What a request's first token costs, engine-wide: the step that prefills it takes
    `ms_per_token` more per prompt token (for every request in that step), and the frontend
    adds `overhead_ms` before the engine sees the request (fitted on the measured TTFTs by
    tuner.replay.predict; the schedule plays both out)."""

    ms_per_token: float = 0.0
    overhead_ms: float = 0.0


@dataclass(frozen=True)
class StepCost:
    """t(n, u) = a + b n + m u at one level, the engine's prefill cost, and what they were
    fitted on."""

    concurrency: int
    a: float
    b: float
    points: tuple[Point, ...]
    path: str
    m: float = 0.0  # ms a step costs more when it is not uniform (mixed_fitted only)
    mixed_term: bool = False  # the engine splits CUDA graphs by batch shape: u matters
    mixed_fitted: bool = False  # the points spanned u, so m was fitted
    prefill: Prefill = Prefill()
    # the step shape: (n, ms a speculative step of n tokens costs over the line, steps it was
    # measured on), n ascending (empty: the line alone)
    profile: tuple[tuple[int, float, int], ...] = ()

    def step_ms(self, scored: float, mixed: float = 0.0) -> float:
        return self.a + self.b * scored + self.m * mixed

    def speculative_step_ms(self, scored: float, mixed: float = 0.0) -> float:
        """What a step of a speculative engine costs: the line, plus the shape where the
        profile has one (linear between profiled n, nothing outside them)."""
        step = self.step_ms(scored, mixed)
        if not self.profile:
            return step
        ns = [n for n, _, _ in self.profile]
        if scored < ns[0] or scored > ns[-1]:
            return step
        return step + float(np.interp(scored, ns, [r for _, r, _ in self.profile]))

    @property
    def needs_mixed_point(self) -> bool:
        """u matters on this engine but no measured speculative point has another u yet."""
        return self.mixed_term and not self.mixed_fitted

    @property
    def calibrated(self) -> bool:
        """A line needs a speculative point besides the anchor."""
        return any(not p.anchor for p in self.points)

    def fit_record(self) -> StepCostFit:
        """This step cost as the record a study keeps of it (tuner.outputs.decision_words
        words it)."""
        return StepCostFit(
            concurrency=self.concurrency, a_ms=self.a, b_ms=self.b, m_ms=self.m,
            mixed_term=self.mixed_term, mixed_fitted=self.mixed_fitted,
            prefill_ms_per_token=self.prefill.ms_per_token,
            prefill_overhead_ms=self.prefill.overhead_ms,
            points=tuple(CostPoint(label=p.label, scored=p.scored, mixed=p.mixed,
                                   step_ms=p.step_ms) for p in self.points),
            profile=tuple(self.profile), path=self.path)


MIN_MIXED_SPREAD = 0.1  # u values closer than this cannot tell m from the slope


def fit(concurrency: int, points: Sequence[Point], *, path: str,
        mixed_term: bool = False) -> StepCost | None:
    """Least squares over `points` through the anchor (the mean of the anchor points: the
    baseline is the reference every prediction is set against, measured most often, so the
    fit passes through it and spends its freedom on the speculative points); None without
    any point.

    With the anchor alone the slope is unknown: the line is flat (every config predicted at
    the baseline's step time) and `calibrated` is False. With `mixed_term`, m is fitted once
    two speculative points are measured and the points (anchor included) pin a, b and m:
    u spread by at least MIN_MIXED_SPREAD, n and u not collinear. Until then, the line."""
    pts = [p for p in points if _finite(p.step_ms) and _finite(p.scored)]
    if not pts:
        return None
    common = dict(concurrency=concurrency, points=tuple(pts), path=path, mixed_term=mixed_term)
    anchors = [p for p in pts if p.anchor] or pts
    origin = np.array([statistics.fmean(p.scored for p in anchors),
                       statistics.fmean(p.mixed for p in anchors)])
    t0 = statistics.fmean(p.step_ms for p in anchors)
    if mixed_term and (plane := _plane(pts, origin, t0)) is not None:
        a, b, m = plane
        return StepCost(a=a, b=b, m=m, mixed_fitted=True, **common)
    a, b = _line(pts, origin[0], t0)
    return StepCost(a=a, b=b, **common)


def profile(launches: Sequence[Sequence[tuple[int, float]]]
            ) -> tuple[tuple[int, float, int], ...]:
    """The step shape from each launch's (n, step ms) samples: per launch the mean step per n
    (n with at least PROFILE_MIN_STEPS samples) less that launch's own least-squares line
    through those means (weighted by steps), so what is kept is how steps of different n differ
    within one launch, not the launch's level, which moves 10-15% from launch to launch on a
    shared machine; then per n the residuals' mean over launches, weighted by steps. A launch
    with fewer than three profiled n has no shape beyond its line and adds nothing."""
    by_n: dict[int, list[tuple[float, int]]] = {}
    for samples in launches:
        groups: dict[int, list[float]] = {}
        for n, t in samples:
            if _finite(t):
                groups.setdefault(int(n), []).append(float(t))
        means = [(n, statistics.fmean(v), len(v)) for n, v in sorted(groups.items())
                 if len(v) >= PROFILE_MIN_STEPS]
        if len(means) < 3:
            continue
        x = np.array([n for n, _, _ in means], dtype=float)
        y = np.array([t for _, t, _ in means])
        w = np.array([k for _, _, k in means], dtype=float)
        slope, intercept = np.polyfit(x, y, 1, w=np.sqrt(w))
        for (n, t, k), fit_t in zip(means, intercept + slope * x, strict=True):
            by_n.setdefault(n, []).append((t - float(fit_t), k))
    return tuple((n, sum(r * k for r, k in v) / sum(k for _, k in v), sum(k for _, k in v))
                 for n, v in sorted(by_n.items()))


def _plane(pts: Sequence[Point], origin: np.ndarray, t0: float
           ) -> tuple[float, float, float] | None:
    """(a, b, m) of t = a + b n + m u through (origin, t0), least squares over the rest, or
    None where the points do not pin b and m: fewer than three, or u (or n) without spread
    among them."""
    if len(pts) < 3:
        return None
    us = [p.mixed for p in pts]
    spec_us = [p.mixed for p in pts if not p.anchor]
    if max(us) - min(us) < MIN_MIXED_SPREAD or len(spec_us) < 2:
        return None
    x = np.array([[1.0, p.scored, p.mixed] for p in pts])
    if np.linalg.matrix_rank(x / np.maximum(np.abs(x).max(axis=0), 1e-12), tol=1e-3) < 3:
        return None
    dx = np.array([[p.scored - origin[0], p.mixed - origin[1]] for p in pts])
    dy = np.array([p.step_ms - t0 for p in pts])
    (b, m), *_ = np.linalg.lstsq(dx, dy, rcond=None)
    return float(t0 - b * origin[0] - m * origin[1]), float(b), float(m)


def _line(pts: Sequence[Point], x0: float, t0: float) -> tuple[float, float]:
    """(a, b) of t = a + b n through (x0, t0), least squares over the rest (flat where no
    point has another n)."""
    dx = np.array([p.scored - x0 for p in pts])
    dy = np.array([p.step_ms - t0 for p in pts])
    sxx = float(dx @ dx)
    if sxx <= 1e-12:  # one abscissa: no slope to fit
        return t0, 0.0
    b = float(dx @ dy) / sxx
    return t0 - b * x0, b


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
