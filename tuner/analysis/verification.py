"""Analysis stage, the out-of-sample check (`tuner verify`): which config each level is checked
on, and whether the speedup measured on prompts the study never sent falls where the study's
statement puts it. An interval of the forecast over the workload sample is about the
workload's mean; a check measures a few fresh prompts, whose own mean strays from it by the
prompts' spread, so the check judges the measurement against the stated interval widened by
that spread and by its own launches' noise (and records the stated interval's verdict beside
it). Pure functions of the study's recommendations and the check's launches;
tuner.outputs.verification words them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

import pandas as pd

from tuner import intervals
from tuner.analysis import frame
from tuner.records.configs import TrialConfig
from tuner.records.recommendations import Recommendation
from tuner.records.selection import RestsOn
from tuner.records.verification import (
    CheckOutcome,
    LevelCheck,
    SkipReason,
    VerifyLaunch,
    VerifyTarget,
)


def targets(df: pd.DataFrame, recs: Sequence[Recommendation]) -> tuple[VerifyTarget, ...]:
    """Per level (of `recs`, the study's recommendations over its trials frame `df`), the
    config the stated interval is about: the recommended config, or where speculation stays
    off the fastest speculative config the verdict names; a level without an interval, or
    whose config is not among the study's trials, is skipped with the reason."""
    by_trial, by_label = _configs(df)
    out = []
    for rec in recs:
        iv = rec.verdict.interval
        base = VerifyTarget(concurrency=rec.concurrency, status=rec.status,
                            subject_label=rec.verdict.subject)
        sel = rec.verdict.selection
        if sel is not None:  # decided on the workload sample: its forecast is what is checked
            subject = sel.subject_config or by_label.get(sel.subject)
            if subject is None or sel.lo is None or sel.hi is None:
                out.append(base.model_copy(update={"skip": SkipReason.NO_SUBJECT
                                                   if subject is None
                                                   else SkipReason.NO_INTERVAL}))
                continue
            forecast = sel.rests_on in (RestsOn.REPLAY, RestsOn.SCALED) and sel.sample_prompts
            out.append(base.model_copy(update={
                "subject": subject, "subject_label": sel.subject,
                "stated_speedup": sel.speedup, "stated_interval": (sel.lo, sel.hi),
                "confidence": sel.confidence,
                **({"sample_sd": sel.sample_sd, "sample_prompts": sel.sample_prompts,
                    "cost_sd": sel.cost_sd, "cost_df": sel.cost_df} if forecast else {})}))
            continue
        if iv is None or rec.speedup_interval is None:
            out.append(base.model_copy(update={"skip": SkipReason.NO_INTERVAL}))
            continue
        subject = (by_trial.get(rec.trial) if rec.status == "recommend"
                   else by_label.get(rec.verdict.subject or ""))
        if subject is None or not subject.speculative_config:
            out.append(base.model_copy(update={"skip": SkipReason.NO_SUBJECT}))
            continue
        out.append(base.model_copy(update={
            "subject": subject, "subject_label": subject.label(), "stated_speedup": iv.point,
            "stated_interval": (iv.lo, iv.hi), "confidence": iv.confidence}))
    return tuple(out)


def _configs(df: pd.DataFrame) -> tuple[Mapping[int, TrialConfig], Mapping[str, TrialConfig]]:
    """The study's configs by trial number and by label (the frame's `label`, which the
    verdict names its subject by)."""
    configs = frame.configs_of(df)
    by_trial: dict[int, TrialConfig] = {}
    by_label: dict[str, TrialConfig] = {}
    for _, row in df.drop_duplicates("trial").iterrows():
        config = configs.get(str(row["config_key"]))
        if config is None or pd.isna(row["trial"]):
            continue
        by_trial[int(row["trial"])] = config
        by_label.setdefault(str(row["label"]), config)
    return by_trial, by_label


def subjects(targets: Sequence[VerifyTarget]) -> tuple[TrialConfig, ...]:
    """The distinct configs to launch beside the baseline, in level order."""
    out: dict[str, TrialConfig] = {}
    for t in targets:
        if t.subject is not None and t.skip is None:
            out.setdefault(t.subject.key(), t.subject)
    return tuple(out.values())


def decide(measured: float, interval: tuple[float, float]) -> CheckOutcome:
    """Inside the stated interval (its bounds included), or a miss above or below it."""
    lo, hi = interval
    if measured < lo:
        return CheckOutcome.BELOW
    if measured > hi:
        return CheckOutcome.ABOVE
    return CheckOutcome.INSIDE


def check(target: VerifyTarget, launches: Sequence[VerifyLaunch], *, requests: int = 0,
          asked: int | None = None) -> LevelCheck:
    """The level's check over the completed launches: the ratio of the subject's median
    throughput to the baseline's, against the stated interval."""
    if target.skip is not None or target.subject is None or target.stated_interval is None:
        return LevelCheck(target=target, outcome=CheckOutcome.SKIPPED, requests=requests,
                          asked=asked)
    c, key = target.concurrency, target.subject.key()
    mine = _throughputs(launches, c, lambda ln: ln.role == "subject" and ln.config.key() == key)
    base = _throughputs(launches, c, lambda ln: ln.role == "baseline")
    out = LevelCheck(target=target, outcome=CheckOutcome.UNMEASURED, subject_throughputs=mine,
                     baseline_throughputs=base, subject_median=_median(mine),
                     baseline_median=_median(base), subject_spread=_spread(mine),
                     baseline_spread=_spread(base), requests=requests, asked=asked)
    if not mine or not base or not out.baseline_median:
        return out
    measured = out.subject_median / out.baseline_median
    stated = decide(measured, target.stated_interval)
    expected = _expected(target, mine, base, requests)
    if expected is None:
        return out.model_copy(update={"measured_speedup": measured, "outcome": stated})
    interval, fresh_sd, launch_sd = expected
    return out.model_copy(update={
        "measured_speedup": measured, "outcome": decide(measured, interval),
        "stated_outcome": stated, "expected_interval": interval, "fresh_sd": fresh_sd,
        "launch_sd": launch_sd})


def _expected(target: VerifyTarget, mine: Sequence[float], base: Sequence[float],
              requests: int) -> tuple[tuple[float, float], float, float] | None:
    """Where a speedup measured on `requests` fresh prompts is expected, at the target's
    confidence: the stated point with the stated interval's spread (the sample's and the
    cost side's), the fresh prompts' own sampling spread (the sample's per-prompt spread over
    `requests` prompts) and the check's launches' noise (their pooled between-launch spread
    over the subject's and the baseline's launches). None where the target carries no
    sample figures (an interval resting on launches)."""
    if (target.sample_sd is None or not target.sample_prompts or not requests
            or target.cost_sd is None or not target.stated_speedup or not target.confidence):
        return None
    fresh_sd = target.sample_sd * math.sqrt(target.sample_prompts / requests)
    pool = intervals.Pool.of([mine, base])
    launch_sd = pool.sd * math.sqrt(1 / len(mine) + 1 / len(base)) if pool.df else 0.0
    df = max(1, target.cost_df or 0)
    t = intervals.t_quantile(0.5 + target.confidence / 2, df)
    half = t * math.sqrt(target.sample_sd ** 2 + target.cost_sd ** 2 + fresh_sd ** 2
                         + launch_sd ** 2)
    point = math.log(target.stated_speedup)
    return (math.exp(point - half), math.exp(point + half)), fresh_sd, launch_sd


def _throughputs(launches: Sequence[VerifyLaunch], concurrency: int, which) -> tuple[float, ...]:
    return tuple(ln.throughputs[concurrency] for ln in launches
                 if which(ln) and ln.failure is None and concurrency in ln.throughputs
                 and math.isfinite(ln.throughputs[concurrency]))


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _spread(values: Sequence[float]) -> float | None:
    """The between-launch spread as a fraction: MAD over median (frame's rule); None from
    fewer than two launches."""
    if len(values) < 2:
        return None
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return mad / median if median > 0 else None
