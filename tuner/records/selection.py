"""Records of the selection: per level, which choice is best to within an indifference zone,
decided on the replay's forecast over the workload sample (tuner.analysis.selection) and
confirmed by launches. Figures only; tuner.outputs.selection words them."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from tuner.records.configs import Frozen, TrialConfig


class Choice(str, Enum):
    """What a level's selection says."""

    ON = "on"  # turn on `subject`: its speedup's interval lies above 1.00x
    OFF = "off"  # leave speculation off: nothing beats the baseline by the indifference zone
    UNDECIDED = "undecided"  # the interval holds both 1.00x and a gain of the zone


class RestsOn(str, Enum):
    """Which figures the answer rests on."""

    REPLAY = "replay"  # the forecast over the workload sample, its cost model confirmed
    # The forecast over the workload sample, its step cost scaled by the subject's own
    # launches on the paired requests (their measured over predicted throughput).
    SCALED = "scaled"
    MEASURED = "measured"  # a launch missed the forecast beyond its accuracy: the launches


class Undecided(str, Enum):
    """What keeps an undecided level open, so what would decide it."""

    COST = "cost"  # the step-cost model's error: more launches of the subject and baseline
    SAMPLE = "sample"  # the prompt-to-prompt spread of the sample: a larger --sample-prompts
    UNLAUNCHED = "unlaunched"  # the subject was never launched (the budget ended first)


class HostNoise(Frozen):
    """The between-launch spread of identical launches on this machine (log throughput SD),
    with its degrees of freedom and where it came from (tuner.search.noise_profile)."""

    sd: float
    df: int
    source: Literal["profile", "study", "default"]
    launches: int = 0  # launches behind it


class ThroughputCheck(Frozen):
    """A launched config's measured throughput against the forecast's, on its paired requests:
    the residual, and the accuracy the forecast states for one launch."""

    label: str
    concurrency: int
    predicted: float
    measured: float
    error_pct: float  # 100 (predicted - measured) / measured
    accuracy_pct: float
    missed: bool
    launches: int = 1  # launches of the config behind `measured` (their mean)
    base_launches: int = 1  # launches of the plain baseline it is priced against
    fitted: bool = False  # the step cost was fitted on it (a calibration launch): no check


class Selection(Frozen):
    """One level's answer as figures: the choice, the subject (the best predicted config;
    where speculation stays off, the one that came closest), its speedup over the plain
    baseline with its interval and the parts that make it, the configs within the indifference
    zone of it, and the launches that confirmed it."""

    concurrency: int
    choice: Choice
    rests_on: RestsOn = RestsOn.REPLAY
    subject: str  # label
    subject_key: str
    subject_config: TrialConfig | None = None  # the config itself (`tuner verify` launches it)
    # The point, over the whole sample (or over the launches, RestsOn.MEASURED), and its
    # interval; None where the launches it must rest on give none yet.
    speedup: float | None
    lo: float | None
    hi: float | None
    confidence: float
    indifference: float  # the zone, a fraction (0.03: configs within 3% are one choice)
    equivalent: tuple[str, ...] = ()  # every label, best first, the subject's own left out
    equivalent_total: int = 0  # how many there are (records before 2026-12-07 kept 4 labels)
    sample_prompts: int = 0
    sample_sd: float = 0.0  # bootstrap SD of log speedup over the sample's prompts
    cost_sd: float = 0.0  # the step-cost model's error, log SD
    cost_df: int = 0
    residuals: int = 0  # out-of-fit launches behind cost_sd
    # RestsOn.SCALED: the subject's measured over predicted throughput on its paired
    # requests, which the forecast was multiplied by, and the launches behind the ratio.
    scale: float | None = None
    scale_launches: tuple[int, int] | None = None  # (the subject's, the baseline's)
    host: HostNoise | None = None
    launched: bool = False  # the subject was launched on the paired requests
    measured_speedup: float | None = None  # its measured speedup there
    checks: tuple[ThroughputCheck, ...] = ()
    undecided: Undecided | None = None
    launches_to_decide: int | None = None  # estimate, for Undecided.COST
