"""Records, what analysis hands outputs: a recommendation per level, the verdict it rests on
as figures (its basis, the noise its gain was held against, its interval across launches),
and its words once outputs has said them."""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import field_serializer

from tuner.records.configs import Frozen
from tuner.records.predictions import PredictionMiss
from tuner.records.selection import Selection
from tuner.records.speedup import ConfigSplit

Status = Literal["recommend", "speculation_off", "insufficient_data"]


class Basis(str, Enum):
    """What a recommendation rests on (tuner.analysis.recommend decides it; tuner.outputs
    words it)."""

    NO_BASELINE = "no_baseline"  # no plain baseline measured at the level
    TOO_FEW_CONFIGS = "too_few_configs"  # fewer than MIN_CANDIDATES speculative configs
    NO_CONFIG_MEETS_SLOS = "no_config_meets_slos"
    NOTHING_BEATS_BASELINE = "nothing_beats_baseline"  # off: the fastest is not faster
    WITHIN_NOISE = "within_noise"  # off: a gain no larger than the noise
    INTERVAL_EQUIVALENT = "interval_equivalent"  # off: the interval lies within --margin
    INTERVAL_BELOW = "interval_below"  # off: the interval lies below 1.00x
    INTERVAL_OPEN = "interval_open"  # off: past the noise floor, but the interval holds 1.00x
    BEYOND_NOISE = "beyond_noise"  # on: a gain beyond the noise floor
    INTERVAL_ABOVE = "interval_above"  # on: within the noise floor, the interval decides
    SELECTED = "selected"  # the replay's selection over the workload sample (Verdict.selection)


class Noise(str, Enum):
    """Which spread a gain was held against (the largest one counts)."""

    UNMEASURED = "unmeasured"  # neither side re-measured: UNMEASURED_NOISE
    PAIRED_WINDOWS = "paired_windows"  # measured once: its speedup across the paired windows
    UNSETTLED_WINDOWS = "unsettled_windows"  # measured once: its own windows did not settle
    SINGLE_RUN = "single_run"  # measured once: the level's repeated configs' largest spread
    MEASURED = "measured"  # the run-to-run MADs
    FLOOR = "floor"  # the MADs, below the MIN_DIFFERENCE floor


class SpeedupInterval(Frozen):
    """A speedup over the plain baseline across launches, with its interval
    (tuner.intervals.Interval), what it says against 1.00x at the study's margin, and the
    pooled between-launch spread it rests on (tuner.intervals.Pool)."""

    point: float
    lo: float
    hi: float
    confidence: float
    launches: tuple[int, int]  # (the config's, the baseline's)
    decision: Literal["above", "below", "equivalent", "open"]
    margin: float
    pool_sd: float
    pool_df: int
    pool_configs: int


class WindowSpread(Frozen):
    """How far one launch's windows spread at the level (percent), and whether they settled."""

    label: str
    pct: float
    settled: bool


class ThroughputSpread(Frozen):
    """The run-to-run spread a recommendation's gain over the plain baseline was held against
    (tuner.analysis.recommend; recommendation.json's `spread`): the config's medians and MADs
    where it was re-measured, the baseline's throughput MAD, and the larger relative MAD of
    the two (Measured.over's rule)."""

    output_throughput_median: float | None = None
    output_throughput_mad: float | None = None
    mean_tpot_ms_median: float | None = None
    mean_tpot_ms_mad: float | None = None
    baseline_output_throughput_mad: float | None = None
    relative_throughput_spread: float | None = None
    # The gain over the baseline (a fraction) a config had to exceed to count.
    noise_floor: float
    # Where the config ran once: the spread taken for it (the level's repeated configs'
    # largest, or how far its speedup moved across the windows paired with the baseline's
    # where that is more: paired_window_spread); in a study stored before the schedule, its
    # windows' spread where they did not settle (unsettled_spread).
    single_run_spread: float | None = None
    paired_window_spread: float | None = None
    unsettled_spread: float | None = None


class Verdict(Frozen):
    """Why a recommendation is what it is, as figures: the basis, the config it is about (the
    chosen one, or the fastest where speculation stays off) against the plain baseline, the
    noise its gain was held against, and its interval across launches."""

    basis: Basis
    subject: str | None = None  # the config's label
    subject_throughput: float | None = None
    subject_tpot_ms: float | None = None
    subject_p99_ttft_ms: float | None = None
    baseline_throughput: float | None = None
    baseline_tpot_ms: float | None = None
    speedup: float | None = None  # subject over baseline throughput
    noise: Noise | None = None
    noise_spread: float | None = None  # the relative spread held against (a fraction)
    noise_floor: float | None = None  # the gain it had to exceed
    interval: SpeedupInterval | None = None
    chosen_by: Literal["knee", "slos"] | None = None
    baseline_meets_slos: bool = True
    slos_set: bool = False
    configs_completed: int | None = None
    baseline_failure: str | None = None  # the failed baseline's reason
    baseline_waiting: bool = False
    measurements: tuple[int, int] | None = None  # (the config's, the baseline's)
    windows: tuple[WindowSpread, ...] = ()
    # The line the replay strategy stored where the engine's acceptance at temperature > 0
    # did not match the replay at this level (StudySettings.sampling_mismatch).
    sampling_mismatch: str | None = None
    # Basis.SELECTED: the level's selection (tuner.replay.selection), whose figures decide.
    selection: Selection | None = None


class Recommendation(Frozen):
    """What to run at one concurrency level, or why the data cannot say."""

    concurrency: int
    status: Status
    # Why, as figures; tuner.outputs.verdicts words it (the reason and the confidence that
    # the terminal, the report and recommendation.json show).
    verdict: Verdict
    speculative_config: dict[str, Any] | None = None
    label: str | None = None
    trial: int | None = None
    serve_command: str | None = None
    # Said beside the serve command where it names other weights than those measured (the
    # embedded default: tuner.engine_cmdline.serve_note); None otherwise.
    serve_note: str | None = None
    metrics: dict[str, float | None] = {}
    baseline_metrics: dict[str, float | None] = {}
    speedup_throughput: float | None = None  # > 1: more output tokens per second
    speedup_tpot: float | None = None  # baseline TPOT / this TPOT; > 1: faster per token
    spread: ThroughputSpread | None = None  # None: a refusal (recommendation.json: {})
    n_repeats: int = 0  # re-measurements of the chosen config beyond the first
    verify_command: str | None = None
    slos: dict[str, float | None] = {}
    # The serve command as a `vllm serve --config` YAML mapping: vLLM's option names without
    # dashes, the speculative config as a mapping.
    serve_config: dict[str, Any] | None = None
    # With an aligned baseline (tuner.analysis.decomposition): the chosen (or fastest)
    # config's speedup over the plain baseline split into the engine path's cost and
    # speculation's own gain, each with its spread; None without one.
    decomposition: ConfigSplit | None = None
    # verdict.interval's bounds, confidence, margin and launches (that config's, the
    # baseline's) as recommendation.json has always listed them at its top level
    # (tuner.analysis.recommend copies them from the verdict); None where it has none.
    speedup_interval: tuple[float, float] | None = None
    confidence_level: float | None = None
    equivalence_margin: float | None = None
    launches: tuple[int, int] | None = None
    # Where the replay's prediction of the chosen config's acceptance at this level missed
    # its measurement beyond the stated accuracy (the reason says so too); () otherwise.
    prediction_misses: tuple[PredictionMiss, ...] = ()

    @field_serializer("spread")
    def _spread_out(self, spread: ThroughputSpread | None) -> ThroughputSpread | dict[str, float]:
        # A refusal's spread has always been written as an empty mapping.
        return {} if spread is None else spread


class WordedRecommendation(Recommendation):
    """A Recommendation with its words (tuner.outputs.verdicts says them): each level of
    recommendation.json, and what `tuner recommend --json` prints."""

    reason: str
    confidence: str  # "" for a refusal
