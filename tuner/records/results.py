"""What was measured and decided: requests, levels and launches as the engine served them,
why each trial stands in a study, the split of a speedup, and what analysis hands outputs.
Field names of the measured figures follow `vllm bench serve` (output_throughput,
mean_tpot_ms, p99_itl_ms, ...) so users can compare the two tools line by line."""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_serializer, model_validator

from tuner.records.configs import (
    EngineSpec,
    Frozen,
    MeasureSettings,
    RequestSchedule,
    TrialConfig,
    WorkloadSpec,
)
from tuner.records.migrations import OLD_LEVEL_KEYS
from tuner.records.selection import Selection


class RequestRecord(Frozen):
    """One streamed request as the client saw it. Times in seconds from the level's start."""

    concurrency: int
    index: int
    warmup: bool
    start_s: float
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    chunk_gaps_s: tuple[float, ...] = ()
    error: str | None = None
    # The ids the engine tokenized and generated (tuner.tokens keeps them, compactly); None
    # when the engine returned none or they disagree with its usage count. Excluded from the
    # JSON dump so requests.jsonl stays small.
    prompt_token_ids: tuple[int, ...] | None = Field(default=None, exclude=True)
    output_token_ids: tuple[int, ...] | None = Field(default=None, exclude=True)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """(e2e - TTFT) / (output tokens - 1); undefined for fewer than two tokens."""
        if self.error or self.output_tokens < 2 or self.ttft_s is None or self.e2e_s is None:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


class SpecDecodeCounts(Frozen):
    """Deltas of vLLM's spec-decode Prometheus counters over one measured phase."""

    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    accepted_per_pos: tuple[float, ...] = ()
    # vLLM's server-side TTFT histogram (vllm:time_to_first_token_seconds), its _sum and
    # _count: it rides along because one /metrics delta per phase is what reaches the level.
    server_ttft_s_sum: float = 0.0
    server_ttft_count: float = 0.0


class LevelMetrics(Frozen):
    """Everything measured at one concurrency level, named and in the units `vllm bench serve`
    uses (acceptance rate in percent, `spec_decode_draft_tokens`, ...). `concurrency` and
    `num_requests` are dumped as vLLM's `max_concurrency` and `num_prompts` with
    `by_alias=True`; either name is read. `percentiles` holds the extra percentiles a user
    selected (`--metric-percentiles`), keyed as vLLM keys them ("p95_tpot_ms")."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True,
                              validate_by_alias=True)

    concurrency: int = Field(alias="max_concurrency")
    num_requests: int = Field(alias="num_prompts")
    completed: int
    failed: int
    warmup_requests: int
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    mean_ttft_ms: float
    median_ttft_ms: float
    p90_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    p90_tpot_ms: float
    p99_tpot_ms: float
    std_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    p90_itl_ms: float
    p99_itl_ms: float
    mean_e2el_ms: float
    median_e2el_ms: float
    p99_e2el_ms: float
    std_ttft_ms: float | None = None  # None: stored before the tuner recorded it
    std_itl_ms: float | None = None
    std_e2el_ms: float | None = None
    percentiles: dict[str, float] = Field(default_factory=dict)
    spec_decode_num_drafts: float = 0.0
    spec_decode_draft_tokens: float = 0.0
    spec_decode_accepted_tokens: float = 0.0
    spec_decode_acceptance_rate: float | None = None  # percent, as vLLM reports it
    spec_decode_acceptance_length: float | None = None
    spec_decode_per_position_acceptance_rates: tuple[float, ...] = ()  # fractions, as vLLM's
    errors: tuple[str, ...] = ()
    # Requests whose prompt this engine had been sent before in this launch: 0 unless the
    # schedule was built with --allow-repeats (RequestSchedule), where suffix decoding then
    # learns from the earlier answers as it would from traffic that truly repeats.
    reused_prompts: int = 0
    # vLLM's own mean TTFT over the level (delta of its histogram), beside ours: it starts when
    # the server has the request, so ours minus it is the wire and the server's pickup.
    # None where the engine exports no histogram, or the level was stored before.
    server_mean_ttft_ms: float | None = None
    # A hash of the level's measured prompts in send order (RequestSchedule): launches whose
    # levels carry the same digest were measured on the same requests. None: stored before.
    prompts_digest: str | None = None
    # Windows (tuner.measure.windows): the measured requests cut, in send order, into
    # `stable_windows` fixed slices of the schedule (the same prompts in every launch), each
    # slice's output throughput and decode time per token (sum(e2e - TTFT) / sum(N - 1)).
    # `stability_pct`: how far the slices' decode times per token spread (half-range over
    # median); `converged`: within MeasureSettings.stability_pct. They say how steady the
    # level was and give the paired within-level spread; they never change what is sent.
    # converged None: no windows (--stability 0). `measure_s`: the level's wall time.
    windows: tuple[float, ...] = ()
    window_tpot_ms: tuple[float, ...] = ()
    stable_windows: int = 0
    stability_pct: float | None = None
    converged: bool | None = None
    measure_s: float | None = None
    # `vllm bench serve --request-rate`: the level's requests arrived open loop, Poisson at
    # this many per second (tuner.measure.loadgen.poisson_arrivals), at most `concurrency` in
    # flight. None: the closed loop (c always in flight); left out of the dump then, so a
    # closed-loop level is stored as before.
    request_rate: float | None = Field(None, exclude_if=lambda v: v is None)

    @model_validator(mode="before")
    @classmethod
    def _read_old_keys(cls, data: Any) -> Any:
        return cls.migrate(data) if isinstance(data, dict) else data

    @staticmethod
    def migrate(level: dict[str, Any]) -> dict[str, Any]:
        """A stored level dict with today's keys and units: old study folders wrote
        `spec_decode_num_draft_tokens` / `..._num_accepted_tokens` and the acceptance rate as
        a fraction. The one place old keys are read; a current dict comes back unchanged."""
        if not any(k in level for k in OLD_LEVEL_KEYS):
            return level
        out = {OLD_LEVEL_KEYS.get(k, k): v for k, v in level.items()}
        if out.get("spec_decode_acceptance_rate") is not None:
            out["spec_decode_acceptance_rate"] = 100.0 * float(out["spec_decode_acceptance_rate"])
        return out

    def vllm_record(self) -> dict[str, Any]:
        """One flat dict keyed as `vllm bench serve --save-result` keys its result: vLLM's
        names, no per-request lists, and the percentiles the user selected in place of the
        fixed p90/p99 fields (which the tuner keeps for itself; a level stored before the
        selection existed has only those, so it keeps them)."""
        fixed = {name for name in type(self).model_fields if name[0] == "p" and name[1].isdigit()}
        out = self.model_dump(mode="json", by_alias=True,
                              exclude={"percentiles", *(fixed if self.percentiles else ())})
        return {**out, **self.percentiles}

    @staticmethod
    def stability_text(converged: bool | None, stability_pct: float | None) -> str:
        """The windows' agreement in a table cell: '±1.2%' where they agreed, 'unsteady ±6.1%'
        where they spread more than --stability, '' for a level measured without."""
        if converged is None:
            return ""
        spread = "±?" if stability_pct is None else f"±{stability_pct:.1f}%"
        return spread if converged else f"unsteady {spread}"

    def windows_text(self) -> str:
        """How steady the level was, for the line printed after it: '3 windows ±1.2%' or
        'unsteady: 3 windows ±6.1%'; '' without windows."""
        if self.converged is None:
            return ""
        spread = self.stability_text(True, self.stability_pct)
        text = f"{len(self.windows)} windows {spread}"
        return text if self.converged else f"unsteady: {text}"


class EngineInfo(Frozen):
    """What the engine told us about itself at start-up (read from engine.log)."""

    start_s: float
    vllm_version: str | None = None
    details: dict[str, str] = Field(default_factory=dict)

    @property
    def launched(self) -> bool:
        """False for a server that was already running (`tuner bench --base-url`): nobody
        here started it, so `start_s` says nothing about it."""
        return "base_url" not in self.details


class BenchResult(Frozen):
    """One engine launch, measured at every requested concurrency."""

    config: TrialConfig
    engine: EngineInfo
    levels: tuple[LevelMetrics, ...]

    def level(self, concurrency: int) -> LevelMetrics | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def label(self) -> str:
        """The config's label; a live server (`tuner bench --base-url`) runs a config of its
        own, unknown here, so it is named as what it is."""
        url = self.engine.details.get("base_url")
        return f"live server at {url} (its own config)" if url else self.config.label()


class BenchHeader(Frozen):
    """What a `tuner bench` run asked and how long it took: result.json's first keys, ahead
    of its BenchResult (tuner.outputs.files.write_bench_result)."""

    workload: WorkloadSpec
    workload_digest: str
    settings: MeasureSettings
    schedule: RequestSchedule
    engine_spec: EngineSpec
    wall_s: float
    metadata: dict[str, str] = Field(default_factory=dict)


# --- across the search: what one trial produced, and why it stands in the study --------------
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


# --- the split of a speedup: analysis, the replay's predictions, outputs -----------------------
class Measured(Frozen):
    """A figure (a throughput, or a ratio of two) with its run-to-run spread as a fraction of
    it: MAD over median of its repeats; NaN where it was measured once."""

    value: float
    relative_spread: float = math.nan

    @property
    def spread(self) -> float:
        """The spread in the figure's own units (NaN where not measured)."""
        return self.value * self.relative_spread

    def over(self, base: Measured) -> Measured:
        """This figure over `base` (NaN where `base` is not positive), with the larger relative
        spread of the two: a ratio is known no better than its less certain side."""
        value = self.value / base.value if base.value > 0 else math.nan
        known = [r for r in (self.relative_spread, base.relative_spread) if not math.isnan(r)]
        return Measured(value=value, relative_spread=max(known) if known else math.nan)


class SpeedupSplit(Frozen):
    """A speedup over the plain baseline (what a user gets today) = the engine path's cost (the
    aligned baseline over the plain one: the speculative configs' engine path without
    speculation) x speculation's own gain (the config over the aligned baseline); exactly, as
    ratios of the same throughputs. tuner.analysis.decomposition names its fields in tables
    and documents."""

    total_speedup: Measured
    path_cost: Measured
    speculation_gain: Measured

    @classmethod
    def of(cls, throughput: Measured, *, plain: Measured, aligned: Measured
           ) -> SpeedupSplit | None:
        """None where either baseline's throughput is not a positive number; an unknown (NaN)
        `throughput` leaves the total and the gain NaN and the path's cost known."""
        if not all(math.isfinite(b.value) and b.value > 0 for b in (plain, aligned)):
            return None
        return cls(total_speedup=throughput.over(plain), path_cost=aligned.over(plain),
                   speculation_gain=throughput.over(aligned))

    def __str__(self) -> str:
        return split_text(self.path_cost.value, self.path_cost.spread,
                          self.speculation_gain.value, self.speculation_gain.spread)


class ConfigSplit(Frozen):
    """One config's SpeedupSplit at a level as a recommendation carries it (recommendation.json's
    `decomposition`): its label, and each ratio with its spread in the ratio's units, None
    where unknown (an unknown throughput leaves the total and the gain unknown; the spread of
    a config measured once)."""

    label: str
    total_speedup: float | None = None
    total_speedup_spread: float | None = None
    path_cost: float
    path_cost_spread: float | None = None
    speculation_gain: float | None = None
    speculation_gain_spread: float | None = None

    def split_text(self) -> str:
        """The split in its one wording: "path 0.83x \u00b10.02 x speculation 1.28x \u00b10.04"."""
        return split_text(self.path_cost, self.path_cost_spread, self.speculation_gain,
                          self.speculation_gain_spread)


# The one wording of a ratio and of the split. It lives with the records because analysis
# writes it into recommendation.json and policy.json and may not import tuner.outputs, whose
# tables and plots (tuner.outputs.text) must write it the same.
def ratio_text(value: float | None, spread: float | None = None) -> str:
    """A ratio as every table and sentence shows it: "1.07x \u00b10.02" (the spread in the
    ratio's units), the spread left out where it was not measured; "-" without a value."""
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.2f}x" + ("" if spread is None or math.isnan(spread)
                              else f" \u00b1{spread:.2f}")


def split_text(path: float | None, path_spread: float | None, gain: float | None,
               gain_spread: float | None) -> str:
    """The split in one wording: "path 0.83x \u00b10.02 x speculation 1.28x \u00b10.04"."""
    return f"path {ratio_text(path, path_spread)} x speculation {ratio_text(gain, gain_spread)}"


# --- analysis -> outputs -----------------------------------------------------------------------
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


class PredictionMiss(Frozen):
    """A launched config whose measured acceptance length at a level lies further from the
    replay's prediction, over the same requests, than the replay's stated accuracy
    (tuner.replay.predict.ACCEPTANCE_ACCURACY_PCT): the prediction, or the measurement, is
    not what it claims to be."""

    key: str
    label: str
    concurrency: int
    predicted: float
    measured: float
    error_pct: float  # 100 (predicted - measured) / measured
    accuracy_pct: float

    def text(self) -> str:
        """The one line the study prints and the report and the recommendation repeat."""
        return (f"Prediction missed at c={self.concurrency}: {self.label} measured acceptance "
                f"length {self.measured:.2f} where the replay predicted {self.predicted:.2f} "
                f"over the same requests ({self.error_pct:+.1f}%, beyond its stated "
                f"±{self.accuracy_pct:g}%); check that launch's engine log and tokens before "
                f"relying on it.")


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
