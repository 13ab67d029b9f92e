"""Replay stage, step cost: what one engine step costs as a function of the tokens it scores.

Per concurrency level c, one decode step of the running batch scores c x (1 + d) tokens,
where d is the mean number of draft tokens a request adds to a step (0 without speculation).
The model is a line per level, t(n) = a + b n, fitted by least squares on measured trials of
one engine:

- a baseline (no speculation): n = c, and its step time is its TPOT (one token per step);
- a speculative trial: n = c (1 + d) with d from the replay of its own config, and its step
  time is its mean TPOT divided by the replayed steps per output token.

A speculative engine can run another engine path than the plain baseline (on the GPU build,
n-gram forces the V1 runner without async scheduling). The line is therefore fitted on one
path: the aligned baseline (no speculation on the speculative path) anchors it where the study
measured one; otherwise the plain baseline does, and the fit says so (`path`). TTFT gets the
same treatment (a line in n), which is its first-order effect: a prefill waits for the
running step, and a speculative step is longer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

PATH_ALIGNED = "speculative path (anchored on the aligned baseline)"
PATH_PLAIN = "plain baseline path (no aligned baseline: path cost and speculation not separated)"


@dataclass(frozen=True)
class Point:
    """One measured trial at one level: tokens scored per step, step time, TTFT."""

    label: str
    scored: float  # tokens per step: c x (1 + drafted per step)
    step_ms: float
    ttft_ms: float
    anchor: bool = False  # a baseline: the no-draft end of the line


@dataclass(frozen=True)
class StepCost:
    """t(n) = a + b n and ttft(n) = ta + tb n at one level, and what they were fitted on."""

    concurrency: int
    a: float
    b: float
    ttft_a: float
    ttft_b: float
    points: tuple[Point, ...]
    path: str

    def step_ms(self, scored: float) -> float:
        return self.a + self.b * scored

    def ttft_ms(self, scored: float) -> float:
        return self.ttft_a + self.ttft_b * scored

    @property
    def calibrated(self) -> bool:
        """A line needs a speculative point besides the anchor."""
        return any(not p.anchor for p in self.points)

    def describe(self) -> str:
        pts = ", ".join(f"{p.label} (n={p.scored:.1f}, {p.step_ms:.1f} ms)" for p in self.points)
        return (f"c={self.concurrency}: step = {self.a:.2f} ms + {self.b:.3f} ms x tokens "
                f"scored; fitted on {pts}; {self.path}")


def fit(concurrency: int, points: Sequence[Point], *, path: str) -> StepCost | None:
    """Least squares over `points` (at least one anchor); None without any point.

    With the anchor alone the slope is unknown: the line is flat (every config predicted at
    the baseline's step time) and `calibrated` is False."""
    pts = [p for p in points if _finite(p.step_ms) and _finite(p.scored)]
    if not pts:
        return None
    a, b = _line([(p.scored, p.step_ms) for p in pts])
    ttft = [(p.scored, p.ttft_ms) for p in pts if _finite(p.ttft_ms)]
    ta, tb = _line(ttft) if ttft else (math.nan, 0.0)
    return StepCost(concurrency=concurrency, a=a, b=b, ttft_a=ta, ttft_b=tb,
                    points=tuple(pts), path=path)


def _line(xy: Sequence[tuple[float, float]]) -> tuple[float, float]:
    xs = [x for x, _ in xy]
    ys = [y for _, y in xy]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 1e-12:  # one abscissa: no slope to fit
        return my, 0.0
    b = sum((x - mx) * (y - my) for x, y in xy) / sxx
    return my - b * mx, b


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
