"""Replay stage, the selection: per level, which choice is best to within an indifference
zone, decided on the replay's forecast over the workload sample (tuner.replay.forecast).

The subject is the config with the best forecast speedup over the sample. Its interval
combines, in log space, the prompt-to-prompt spread of the sample (bootstrap SD over its
prompts) and the step-cost model's error: the residuals of the launches the model was not
fitted on (log measured over predicted throughput, on their paired requests), pooled with
the host's between-launch spread as a prior (a residual of an exact model still carries two
launches' noise: its own and the baseline's), with a Student-t quantile on their degrees of
freedom. Where the subject itself was launched, the model's error for it is measured instead:
its forecast is scaled by its launches' measured over predicted throughput on the paired
requests (RestsOn.SCALED), and the cost side of the interval is the noise of those launches
and the baseline's (the host's spread), on the host's degrees of freedom. The rule, one for
every level and every output:

- OFF when the interval's top lies below 1 + zone: nothing beats the baseline by the zone;
- ON when its bottom lies above 1.00x;
- UNDECIDED otherwise, with what keeps it open (the sample's spread, the cost model's error,
  or a subject never launched) and, where launches can close it, about how many.

The zone is the study's --margin: within it of 1.00x is no gain that matters, and within
it of each other two configs are one choice. Configs whose paired bootstrap cannot show them worse than the subject by more than the zone
are one choice with it (`equivalent`); where the best forecast was never launched but a
config of its choice was, that one is the subject, so the answer stays put as launches refit
the step cost and twins are never launched against each other. Where a launch of the subject misses the forecast beyond
its stated accuracy, the level rests on the launches instead (RestsOn.MEASURED), judged by the
same rule on their interval (tuner.intervals.speedup).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import numpy as np

from tuner import intervals
from tuner.records.selection import (
    Choice,
    HostNoise,
    RestsOn,
    Selection,
    ThroughputCheck,
    Undecided,
)
from tuner.replay.forecast import LevelForecast

MAX_PRIOR_DF = 30  # the host's spread as a prior counts as at most this many residuals
MAX_MORE_LAUNCHES = 20  # beyond this an undecided level is not worth estimating launches for
# The step-cost model's own error where its launches show nothing yet, log SD: the median
# |error| of its throughput over the stored CPU sets lies at 2.3-7.8% (docs/accuracy.md).
MODEL_SD = 0.04


def _prior_var(host: HostNoise) -> float:
    """What a residual of the model is expected to spread by before any is seen: two
    launches' noise (the config's and the baseline's it is priced against) and the model's
    own typical error (MODEL_SD)."""
    return 2.0 * host.sd ** 2 + MODEL_SD ** 2


def cost_error(residuals: Sequence[float], host: HostNoise) -> tuple[float, int]:
    """The step-cost model's error per forecast (log SD) and its degrees of freedom: the
    out-of-fit residuals (log measured over predicted throughput) pooled with a prior
    (_prior_var) on the host's degrees of freedom."""
    prior_df = min(host.df, MAX_PRIOR_DF)
    prior_var = _prior_var(host)
    ss = sum(r * r for r in residuals) + prior_df * prior_var
    df = len(residuals) + prior_df
    return (math.sqrt(ss / df) if df else math.sqrt(prior_var)), df


def accuracy(host: HostNoise, confidence: float) -> float:
    """The forecast's stated accuracy for one launch's throughput (log): a residual beyond it
    is a miss, said out loud."""
    df = max(1, min(host.df, MAX_PRIOR_DF))
    return intervals.t_quantile(0.5 + confidence / 2, df) * math.sqrt(_prior_var(host))


def choice(lo: float, hi: float, indifference: float) -> Choice:
    """The rule: off when the interval lies below 1 + zone, on when above 1.00x."""
    if hi < 1.0 + indifference:
        return Choice.OFF
    if lo > 1.0:
        return Choice.ON
    return Choice.UNDECIDED


def select(level: LevelForecast, counts: np.ndarray, *, host: HostNoise, confidence: float = intervals.CONFIDENCE,
           indifference: float = intervals.MARGIN, checks: Sequence[ThroughputCheck] = (),
           measured: dict[str, intervals.Interval] | None = None,
           launched: Collection[str] = ()) -> Selection | None:
    """The level's Selection from its forecast (None where it holds no config).

    `counts`: the bootstrap's resamples (tuner.replay.forecast.Forecast.counts); `checks`: the
    launches at this level the step cost was not fitted on, each against its prediction
    (their residuals, log measured over predicted throughput, make the cost model's error);
    `measured`: each launched config's measured speedup interval over the plain baseline, by
    key (the fallback where the subject missed); `launched`: the keys of every config
    launched at this level (the calibration's too). Where the subject itself was launched (a check of its own, fitted
    or not) and did not miss, its forecast is scaled by its measured over predicted throughput
    on the paired requests (RestsOn.SCALED): the step-cost model's error for this config is
    then measured, not assumed, and what is left of it is the noise of the launches behind the
    ratio (the host's spread over the subject's and the baseline's launches). The subject is the best of many
    forecasts, so its point leans high by the luck of the draw; the paired bootstrap keeps
    that small where configs move together, and `tuner verify` measures what is left."""
    if not level.keys:
        return None
    points = level.log_speedups()
    boot = level.log_speedups(counts)
    best = int(np.argmax(points))
    tried = {*launched, *(measured or {}),
             *(k for k, lab in zip(level.keys, level.labels, strict=True)
               if lab in {c.label for c in checks})}
    if level.keys[best] not in tried:  # a launched config of the same choice answers for it
        twins = [i for i in _equivalent(level, boot, best, confidence, indifference)
                 if level.keys[i] in tried]
        best = max(twins, key=lambda i: points[i], default=best)
    key, label = level.keys[best], level.labels[best]
    sample_sd = float(np.std(boot[best], ddof=1)) if boot.shape[1] > 1 else 0.0
    residuals = [math.log(c.measured / c.predicted) for c in checks if not c.fitted]
    mine = [c for c in checks if c.label == label]
    point = float(points[best])
    scaled = {}
    if mine and not any(c.missed for c in mine):
        own = mine[0]
        point += math.log(own.measured / own.predicted)
        counts_ = (max(1, own.launches), max(1, own.base_launches))
        cost_sd = host.sd * math.sqrt(1.0 / counts_[0] + 1.0 / counts_[1])
        cost_df = host.df
        scaled = dict(rests_on=RestsOn.SCALED, scale=own.measured / own.predicted,
                      scale_launches=counts_)
    else:
        cost_sd, cost_df = cost_error(residuals, host)
    t = intervals.t_quantile(0.5 + confidence / 2, max(1, cost_df))
    half = t * math.hypot(sample_sd, cost_sd)
    lo, hi = math.exp(point - half), math.exp(point + half)
    equivalent = [level.labels[i] for i in _equivalent(level, boot, best, confidence,
                                                        indifference)]
    fig = dict(
        concurrency=level.concurrency, subject=label, subject_key=key,
        confidence=confidence, indifference=indifference,
        equivalent=tuple(equivalent), equivalent_total=len(equivalent),
        sample_prompts=level.requests, sample_sd=sample_sd, cost_sd=cost_sd, cost_df=cost_df,
        residuals=len(residuals), host=host,
        launched=key in tried,
        measured_speedup=(measured or {}).get(key).point if key in (measured or {}) else None,
        checks=tuple(checks))
    if any(c.missed for c in mine):
        return _on_launches(fig, (measured or {}).get(key), indifference)
    said = choice(lo, hi, indifference)
    if said == Choice.ON and not fig["launched"]:
        return Selection(choice=Choice.UNDECIDED, speedup=math.exp(point), lo=lo, hi=hi,
                         undecided=Undecided.UNLAUNCHED, **fig)
    undecided, more = (None, None) if said != Choice.UNDECIDED else _what_decides(
        point, sample_sd, host, cost_df, confidence, indifference,
        scaled.get("scale_launches"), cost_sd)
    return Selection(choice=said, speedup=math.exp(point), lo=lo, hi=hi,
                     undecided=undecided, launches_to_decide=more, **fig, **scaled)


def _on_launches(fig: dict, measured: intervals.Interval | None, indifference: float
                 ) -> Selection:
    """The subject missed the forecast: the answer rests on its launches, by the same rule."""
    if measured is None:  # one launch each and no spread to go on: a repeat gives one
        return Selection(choice=Choice.UNDECIDED, rests_on=RestsOn.MEASURED,
                         speedup=fig["measured_speedup"], lo=None, hi=None,
                         undecided=Undecided.COST, launches_to_decide=1, **fig)
    said = choice(measured.lo, measured.hi, indifference)
    return Selection(choice=said, rests_on=RestsOn.MEASURED, speedup=measured.point,
                     lo=measured.lo, hi=measured.hi,
                     undecided=Undecided.COST if said == Choice.UNDECIDED else None, **fig)


def _equivalent(level: LevelForecast, boot: np.ndarray, best: int, confidence: float,
                indifference: float) -> list[int]:
    """The configs (indices) the paired bootstrap cannot show worse than `best` by more than
    the zone (upper bound of their log ratio above log(1 - zone)), best first."""
    diff = boot - boot[best]
    upper = np.quantile(diff, 0.5 + confidence / 2, axis=1)
    points = level.log_speedups()
    inside = [i for i in range(len(level.keys))
              if i != best and upper[i] >= math.log(1.0 - indifference)]
    return sorted(inside, key=lambda i: -points[i])


def _what_decides(point: float, sample_sd: float, host: HostNoise, cost_df: int,
                  confidence: float, indifference: float,
                  scale_launches: tuple[int, int] | None, cost_sd: float
                  ) -> tuple[Undecided, int | None]:
    """Why the interval is open, and how many more launches would close it where the cost
    side is what is short (None: launches will not). Scaled (`scale_launches`, the subject's
    and the baseline's launches): launches of either, in turn, shrink the launches' noise;
    else out-of-fit launches add degrees of freedom to the cost model's error."""
    room = max(point, math.log(1.0 + indifference) - point)  # the half-width that decides
    z = intervals.t_quantile(0.5 + confidence / 2, 10_000)
    if z * sample_sd >= room:
        return Undecided.SAMPLE, None
    if scale_launches is None and z * math.hypot(sample_sd, cost_sd) >= room:
        return Undecided.COST, None
    for more in range(1, MAX_MORE_LAUNCHES + 1):
        sd = cost_sd
        if scale_launches is not None:
            mine, base = scale_launches[0] + (more + 1) // 2, scale_launches[1] + more // 2
            sd = host.sd * math.sqrt(1.0 / mine + 1.0 / base)
        t = intervals.t_quantile(0.5 + confidence / 2,
                                 cost_df + (0 if scale_launches is not None else more))
        if t * math.hypot(sample_sd, sd) < room:
            return Undecided.COST, more
    return Undecided.COST, None
