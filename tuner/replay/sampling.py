"""Replay stage, sampling error: how far a measured run may land from a prediction when the
baseline's tokens were sampled (temperature > 0), and what to say when an engine does not.

n-gram and suffix drafts carry no probabilities, so vLLM's rejection sampler keeps the plain
engine's distribution and the replay over one sampled baseline is right in expectation
(docs/method.md, "Sampling"). What remains is sampling error: `spread` resamples the level's
measured requests with replacement (DRAWS times, seeded; counts x per-request sums, no
replay; the traffic sweep sums them a chunk of requests at a time) and takes the standard
deviation s of acceptance length, acceptance rate and output tokens per decode step. A
measured run of as many requests has an error of its own, as large and independent, so the
half-width of the 90% interval for what it shows is Z90 sqrt(2) s. Throughput and TPOT carry
the relative half-width of tokens per step: with the requests' lengths and the step's cost
held, a run takes steps in inverse proportion to it (what the draft length adds to a step's
cost, and the spread of timing, are not in it; confirm launches measure those). At
temperature 0 every half-width is None: the replay is exact.

`mismatch` tells a launch whose measured acceptance length lies outside the interval by more
than its half-width (and by more than REPLAY_ERROR, the replay's own error at temperature 0):
that engine does not sample as the rejection rule says (the CPU build 0.32, vLLM #55005).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.records.predictions import PredictedFigure, PredictedRow, Row
from tuner.replay.acceptance import Acceptance

DRAWS = 200
SEED = 0
Z90 = 1.645  # two-sided 90% of a normal
REPLAY_ERROR = 0.05  # relative: the replay's acceptance-length error at temperature 0 is ~1-2%
DEFECT = "vLLM #55005"
# A predicted row's half-widths, beside the figures they belong to (its `_pm` fields).
PM_COLUMNS = ("acceptance_rate_pm", "acceptance_length_pm", "pred_output_throughput_pm",
              "pred_mean_tpot_ms_pm")


@dataclass(frozen=True)
class Spread:
    """Half-widths of 90% intervals for a measured run of the level's number of requests."""

    acceptance_length: float
    acceptance_rate: float
    tokens_per_step_rel: float  # relative to tokens per step


@functools.lru_cache(maxsize=16)
def _counts(n: int, draws: int, seed: int) -> np.ndarray:
    """How often each of n requests is drawn in each of `draws` resamples (draws x n)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=draws).astype(np.float64)


# The columns of per_request: a request's verify steps that drafted, draft tokens, accepted
# tokens, verify steps, and decoded tokens (its output less the one its prefill emits).
PER_REQUEST = ("drafts", "draft_tokens", "accepted", "steps", "decoded")


def per_request(acc: Acceptance) -> np.ndarray:
    """The PER_REQUEST sums of each of `acc`'s measured requests, in index order (n x 5)."""
    return np.array([[(d > 0).sum(), d.sum(), a.sum(), len(d), max(0, length - 1)]
                     for d, a, length in zip(acc.request_drafts, acc.request_accepted,
                                             acc.request_lengths, strict=True)],
                    dtype=np.float64).reshape(-1, len(PER_REQUEST))


def resampled(per: np.ndarray, *, n: int, start: int = 0, draws: int = DRAWS,
              seed: int = SEED) -> np.ndarray:
    """The sums of `per` (rows start, start + 1, ... of n requests' per_request tables; any
    columns after the first axis) in each of the `draws` resamples of the n requests: draws x
    per.shape[1:]. Summed over consecutive blocks of rows, they are the whole table's."""
    weights = _counts(n, draws, seed)[:, start:start + len(per)]
    return np.tensordot(weights, per, axes=1)


def spread(acc: Acceptance | None, *, draws: int = DRAWS, seed: int = SEED) -> Spread | None:
    """The bootstrap half-widths of `acc` over its measured requests; None with fewer than
    two requests or no draft."""
    n = len(acc.request_drafts) if acc is not None else 0
    if n < 2 or not acc.drafts:
        return None
    per = per_request(acc)
    return of_sums(resampled(per, n=n, draws=draws, seed=seed), per.sum(axis=0), n=n)


def of_sums(sums: np.ndarray, whole: np.ndarray, *, n: int) -> Spread | None:
    """The half-widths from the resampled PER_REQUEST sums (draws x 5) of n requests and the
    sums over them all (5); None with fewer than two requests, no draft or no step."""
    if n < 2 or not whole[0] or not whole[3] or not whole[4]:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        length = sums[:, 2] / sums[:, 0]
        rate = sums[:, 2] / sums[:, 1]
        tps = sums[:, 4] / sums[:, 3]
    return Spread(acceptance_length=_half(length), acceptance_rate=_half(rate),
                  tokens_per_step_rel=_half(tps) / float(whole[4] / whole[3]))


def _half(draws: np.ndarray) -> float:
    finite = draws[np.isfinite(draws)]
    return Z90 * math.sqrt(2.0) * float(finite.std(ddof=1)) if len(finite) > 1 else math.nan


def with_spread(row: Row, acc: Acceptance | None, *, temperature: float) -> Row:
    """`row` (tuner.replay.predict's) with its PM_COLUMNS from the bootstrap over `acc`:
    None at temperature 0, for the baseline, and where a figure is not predicted."""
    return with_half_widths(row, spread(acc) if temperature > 0 and row.speculative_config
                            else None)


def with_half_widths(row: Row, s: Spread | None) -> Row:
    """`row` with its PM_COLUMNS from its spread `s`: None without one, for the baseline,
    and where a figure is not predicted."""
    if s is None or not row.speculative_config:
        return dataclasses.replace(row, acceptance_rate_pm=None, acceptance_length_pm=None,
                                   pred_output_throughput_pm=None, pred_mean_tpot_ms_pm=None)
    return dataclasses.replace(
        row, acceptance_rate_pm=_finite(s.acceptance_rate),
        acceptance_length_pm=_finite(s.acceptance_length),
        pred_output_throughput_pm=_carried(row.pred_output_throughput, s),
        pred_mean_tpot_ms_pm=_carried(row.pred_mean_tpot_ms, s))


def _carried(value: float | None, s: Spread) -> float | None:
    """A throughput's or TPOT's half-width: the relative one of tokens per step."""
    if _finite(value) is None or _finite(s.tokens_per_step_rel) is None:
        return None
    return abs(value) * s.tokens_per_step_rel


def within(row: Row, best: Row, metric: PredictedFigure = PredictedFigure.OUTPUT_THROUGHPUT
           ) -> bool:
    """Whether `row`'s 90% interval of `metric` reaches `best`'s: the replay cannot order
    the two (False where either has no interval, as at temperature 0)."""
    metric = PredictedFigure(metric)
    values = [_finite(v) for r in (row, best) for v in (metric.of(r), metric.half_width(r))]
    if any(v is None for v in values):
        return False
    x, dx, b, db = values
    return abs(b - x) <= dx + db


def mismatch(row: PredictedRow, *, temperature: float) -> bool:
    """Whether a measured speculative row's acceptance length lies outside the predicted
    interval by more than its half-width and more than REPLAY_ERROR of the prediction."""
    pred, pm = _finite(row.acceptance_length), _finite(row.acceptance_length_pm)
    meas = _finite(row.meas_acceptance_length)
    if temperature <= 0 or not row.speculative_config or None in (pred, pm, meas):
        return False
    return abs(meas - pred) > max(2 * pm, REPLAY_ERROR * pred)


def mismatch_line(row: PredictedRow, *, temperature: float, vllm_version: str | None,
                  device: str) -> str:
    """The one line that says an engine does not sample as the replay assumes."""
    build = f"vLLM {vllm_version or '(version unknown)'} ({device})"
    known = (f" (on the CPU build up to 0.32 a known defect, {DEFECT})"
             if device == "cpu" else "")
    return (f"{build} accepted {row.meas_acceptance_length:.2f} tokens per draft step "
            f"({row.label}, c={row.concurrency}) where the replay predicts "
            f"{row.acceptance_length:.2f} ± {row.acceptance_length_pm:.2f} at "
            f"temperature {temperature:g}: this build's sampling does not match the "
            f"replay{known}; measured speedups of speculative configs here reflect this "
            f"build, not the method.")


# The last CPU release known to carry the defect; a later one is trusted until it shows it
# (the mismatch line still catches it from the measurements).
DEFECT_UP_TO = (0, 32)


def known_defect(*, device: str, temperature: float, version: str | None = None
                 ) -> str | None:
    """The warning, up front, for speculative launches on vLLM's CPU build when sampling
    (`version`: the installed vLLM's; one newer than DEFECT_UP_TO is not warned about)."""
    if device != "cpu" or temperature <= 0:
        return None
    release = tuple(int(p) for p in (version or "").split(".")[:2] if p.isdigit())
    if len(release) == 2 and release > DEFECT_UP_TO:
        return None
    return (f"Temperature {temperature:g} on vLLM's CPU build: its rejection sampler loses "
            f"each request's temperature ({DEFECT}, seen on 0.32), so measured acceptance "
            f"and speedups of speculative configs may say nothing about the method; the "
            f"replay's predictions do not depend on it.")


def _finite(x: Any) -> float | None:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None
