"""Records, trials across the search: why a trial stands in a study (or a run in the policy's
ladder), and what one trial produced, a measured launch or the reason it failed."""

from __future__ import annotations

from enum import Enum

from tuner.records.configs import Frozen
from tuner.records.results import BenchResult


class Role(str, Enum):
    """Why a trial is in the study, or a run in the policy's ladder (stored as its plain string
    value in the trial's attrs)."""

    BASELINE = "baseline"  # no speculation, measured first in every study
    ALIGNED_BASELINE = "aligned_baseline"  # no speculation on the speculative engine path
    START_POINT = "start_point"  # a space's start point, enqueued before the sampler
    SEARCH = "search"  # proposed by the sampler (or a grid point)
    RETRY = "retry"  # re-run of a trial a dead driver left RUNNING
    REPEAT = "repeat"  # re-measurement of a leader, pooled with its original
    CALIBRATION = "calibration"  # replay strategy: the launch that fits the step-cost model
    CONFIRM = "confirm"  # replay strategy: a predicted leader, measured
    # The policy's ladder (its companion study; BASELINE and ALIGNED_BASELINE there too)
    LEADER = "leader"  # a leading config of the study, one per method
    K_VARIANT = "k_variant"  # the first leader at another K
    POLICY = "policy"  # the emitted schedule, verified
    STATIC = "static"  # the config the schedule replaces, or a band's K as a static config


class Failure(Frozen):
    """Why a trial could not be measured: a TrialFailed as data."""

    reason: str
    kind: str = "failed"
    log_tail: str = ""
    at: str | None = None


class TrialOutcome(Frozen):
    """One trial as it comes back from an executor (inline or a Ray worker on another host):
    a result or a failure, and where and when it ran."""

    result: BenchResult | None = None
    failure: Failure | None = None
    host: str | None = None
    cuda_visible_devices: str | None = None
    ran_from: float | None = None
    ran_to: float | None = None
    # The trial's token capture (tuner.tokens bytes), carried back with the result because a
    # Ray worker's trial folder may be on another host.
    tokens: bytes | None = None
