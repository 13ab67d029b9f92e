"""Analysis stage, the out-of-sample check (`tuner verify`): which config each level is checked
on, and whether the speedup measured on prompts the study never sent falls inside the
interval the study stated. Pure functions of the study's recommendations and the check's
launches; tuner.outputs.verification words them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

import pandas as pd

from tuner.analysis import frame
from tuner.records.configs import TrialConfig
from tuner.records.recommendations import Recommendation
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
            out.append(base.model_copy(update={
                "subject": subject, "subject_label": sel.subject,
                "stated_speedup": sel.speedup, "stated_interval": (sel.lo, sel.hi),
                "confidence": sel.confidence}))
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
    return out.model_copy(update={"measured_speedup": measured,
                                  "outcome": decide(measured, target.stated_interval)})


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
