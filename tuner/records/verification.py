"""What `tuner verify` measured: per level, the study's stated speedup and interval beside the
speedup measured out of sample (fresh prompts of the same workload, new engine launches), and
whether it falls inside. Written as the study folder's verify.json."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from tuner.records.configs import Frozen, RequestSchedule, TrialConfig
from tuner.records.recommendations import Status
from tuner.records.trials import Failure


class CheckOutcome(str, Enum):
    """What the measured speedup says against the study's stated interval."""

    INSIDE = "inside"
    ABOVE = "above"  # a miss: faster than the study claimed
    BELOW = "below"  # a miss: slower than the study claimed
    UNMEASURED = "unmeasured"  # no completed launch of the config or of the baseline
    SKIPPED = "skipped"  # nothing to check (SkipReason)


class SkipReason(str, Enum):
    """Why a level is not checked."""

    NO_INTERVAL = "no_interval"  # the study stated no interval at the level
    NO_SUBJECT = "no_subject"  # the config the interval is about is not among its trials


class VerifyTarget(Frozen):
    """What one level is checked on (tuner.analysis.verification.targets): the config its
    interval is about (the recommended one; where speculation stays off, the fastest
    speculative config the verdict names) against the plain baseline, with what the study
    stated of it."""

    concurrency: int
    status: Status  # the study's answer at the level
    subject: TrialConfig | None = None
    subject_label: str | None = None
    stated_speedup: float | None = None  # the interval's point
    stated_interval: tuple[float, float] | None = None
    confidence: float | None = None
    skip: SkipReason | None = None
    # Where the interval is the forecast over the workload sample (Selection, REPLAY or
    # SCALED): the spread of its point over the sample (log SD of the sample's mean, over
    # `sample_prompts` prompts) and the cost side's log SD and degrees of freedom.
    sample_sd: float | None = None
    sample_prompts: int | None = None
    cost_sd: float | None = None
    cost_df: int | None = None


class VerifyLaunch(Frozen):
    """One engine launch of the check, in the order run; its files in STUDY/verify/<number>."""

    number: int
    round: int  # 1..launches: the baseline and every subject once per round
    role: Literal["baseline", "subject"]
    config: TrialConfig
    label: str
    # Output tokens/s per level, of a completed launch; {} where it failed.
    throughputs: dict[int, float] = {}
    engine_start_s: float | None = None
    failure: Failure | None = None


class LevelCheck(Frozen):
    """One level's check: the subject's and the baseline's throughput in each completed launch,
    their medians and between-launch spreads (MAD over median; None from one launch), the
    measured speedup (the ratio of the medians) and the outcome against the stated interval."""

    target: VerifyTarget
    outcome: CheckOutcome
    measured_speedup: float | None = None
    subject_throughputs: tuple[float, ...] = ()
    baseline_throughputs: tuple[float, ...] = ()
    subject_median: float | None = None
    baseline_median: float | None = None
    subject_spread: float | None = None
    baseline_spread: float | None = None
    requests: int = 0  # measured requests per launch at the level
    asked: int | None = None  # what it asked for, where too few fresh prompts were left
    # Where the target carries the sample's figures: the range a measurement on these
    # `requests` fresh prompts is expected in (the stated interval widened by the fresh
    # prompts' own sampling spread and the check's launches' noise, both log SDs), which
    # `outcome` judges; `stated_outcome` is the measurement against the stated interval alone.
    expected_interval: tuple[float, float] | None = None
    fresh_sd: float | None = None
    launch_sd: float | None = None
    stated_outcome: CheckOutcome | None = None

    @property
    def missed(self) -> bool:
        return self.outcome in (CheckOutcome.ABOVE, CheckOutcome.BELOW)


class Verification(Frozen):
    """`tuner verify STUDY`: the fresh schedule every launch sent, each launch, each level's
    check. `excluded_prompts`: the prompts of the loaded pool (`pool_prompts`) the study had
    sent, none of which was sent again."""

    study: str
    study_dir: str
    workload: str
    launches_per_config: int
    pool_prompts: int
    excluded_prompts: int
    schedule: RequestSchedule
    levels: tuple[LevelCheck, ...]
    launches: tuple[VerifyLaunch, ...] = ()
    wall_s: float = 0.0

    @property
    def misses(self) -> tuple[LevelCheck, ...]:
        return tuple(lv for lv in self.levels if lv.missed)
