"""Records of what the search decided, and on which figures: one event kind per fact the
search records (the replay of the space, the calibration launches, the engine path, the
step-cost fit, the token streams, the climb, the leaders, the confirmation, the selection,
a forecast or prediction miss, sampling, why it stopped), and the progress events a person
reads as the study runs (a trial ended, failed, was answered from storage). Figures, labels
and enums only: tuner.outputs.decision_words words them; decisions.json stores the
decisions (`topic` not None) as JSON with their `kind`.

A decision is kept under (topic, slot): a later event of the same slot replaces an earlier
one, so a resumed study updates what it decides again (tuner.outputs.decisions).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, TypeAdapter

from tuner.records.configs import Frozen
from tuner.records.predictions import PredictionMiss
from tuner.records.selection import Selection, ThroughputCheck


class Event(Frozen):
    """One fact of the search. `topic`: the report section it belongs to (None: a progress
    line only, never stored)."""

    topic: ClassVar[str | None] = None

    def slot(self) -> str:
        """The key it is kept under within its topic ("" for a topic's one fact)."""
        return ""


# -- the strategy ---------------------------------------------------------------------------
class NoTokens(Event):
    """The baseline trial holds no token ids: replay cannot predict; Optuna takes over."""

    kind: Literal["no_tokens"] = "no_tokens"
    topic: ClassVar[str | None] = "strategy"


class ExpectedTime(Event):
    """What the launches left cost, from the baseline's wall time (every launch sends the
    same requests)."""

    kind: Literal["expected_time"] = "expected_time"
    topic: ClassVar[str | None] = "strategy"
    requests: int
    baseline_s: float
    launches_left: int

    def slot(self) -> str:
        return "expected time"


# -- the replay of the space ----------------------------------------------------------------
class ReplayStarted(Event):
    """The replay of the space begins (a progress line)."""

    kind: Literal["replay_started"] = "replay_started"
    configs: int
    space: str


class SpaceReplayed(Event):
    kind: Literal["space_replayed"] = "space_replayed"
    topic: ClassVar[str | None] = "replay"
    configs: int
    space: str
    requests_per_level: int
    seconds: float


class Calibration(Event):
    """The first calibration launch: the candidate that drafts the most per step."""

    kind: Literal["calibration"] = "calibration"
    topic: ClassVar[str | None] = "calibration"
    label: str
    drafted_per_step: float

    def slot(self) -> str:
        return "first"


class MixedCalibration(Event):
    """The second calibration launch, on an engine that splits CUDA graphs by batch shape:
    the candidate whose steps are least often uniform."""

    kind: Literal["mixed_calibration"] = "mixed_calibration"
    topic: ClassVar[str | None] = "calibration"
    label: str
    uniform_share: float
    concurrency: int

    def slot(self) -> str:
        return "second"


class Climb(Event):
    """The sampled grids searched around the predicted leaders."""

    kind: Literal["climb"] = "climb"
    topic: ClassVar[str | None] = "climb"
    added: int
    configs: int
    seconds: float


# -- the engine path ------------------------------------------------------------------------
class PathSame(Event):
    """The first speculative trial ran the plain baseline's path: no aligned baseline."""

    kind: Literal["path_same"] = "path_same"
    topic: ClassVar[str | None] = "engine_path"
    trial: int
    label: str

    def slot(self) -> str:
        return "decision"


class PathLeft(Event):
    """The first speculative trial left the plain baseline's path: an aligned baseline is
    measured once. `difference`: the paths' difference as tuner.measure.enginepath names it;
    `knobs`: the engine arguments and environment that put a baseline on that path."""

    kind: Literal["path_left"] = "path_left"
    topic: ClassVar[str | None] = "engine_path"
    trial: int
    label: str
    difference: str
    knobs: tuple[str, ...]

    def slot(self) -> str:
        return "decision"


class PathGap(Event):
    """The measured aligned baseline still differs from the speculative trial's path."""

    kind: Literal["path_gap"] = "path_gap"
    topic: ClassVar[str | None] = "engine_path"
    aligned_trial: int
    trial: int
    difference: str

    def slot(self) -> str:
        return "check"


# -- the predictions ------------------------------------------------------------------------
class CostPoint(Frozen):
    """A measured point the step cost was fitted on."""

    label: str
    scored: float  # tokens per step
    mixed: float  # the share of its steps that are not uniform
    step_ms: float


class StepCostFit(Event):
    """The step cost at one level (tuner.replay.cost StepCost): step = a + b x tokens scored
    (+ m x non-uniform share), the first token's cost, and the points it was fitted on."""

    kind: Literal["step_cost"] = "step_cost"
    topic: ClassVar[str | None] = "step_cost"
    concurrency: int
    a_ms: float
    b_ms: float
    m_ms: float = 0.0
    mixed_term: bool = False
    mixed_fitted: bool = False
    prefill_ms_per_token: float = 0.0
    prefill_overhead_ms: float = 0.0
    points: tuple[CostPoint, ...] = ()
    # (n, ms a speculative step of n tokens costs over the line, steps it was measured on)
    profile: tuple[tuple[int, float, int], ...] = ()
    path: str = ""  # the engine path the line was measured on, as tuner.replay.cost names it

    def slot(self) -> str:
        return f"c={self.concurrency}"


class TokenStreams(Event):
    """Where a speculative launch's tokens part from the baseline's. `line`: the replay's
    own summary (tuner.replay.predict builds it; its figures are not on the Prediction)."""

    kind: Literal["token_streams"] = "token_streams"
    topic: ClassVar[str | None] = "streams"
    line: str


class PredictionMissed(Event):
    """A launched config's measured acceptance the replay missed beyond its accuracy."""

    kind: Literal["prediction_miss"] = "prediction_miss"
    topic: ClassVar[str | None] = "prediction_miss"
    miss: PredictionMiss

    def slot(self) -> str:
        return f"c={self.miss.concurrency}"


class SamplingMismatch(Event):
    """At temperature > 0, a launch whose measured acceptance lies outside the replay's
    interval. `line`: tuner.replay.sampling's mismatch line, which the study's settings keep
    for the recommendation's reason."""

    kind: Literal["sampling_mismatch"] = "sampling_mismatch"
    topic: ClassVar[str | None] = "sampling"
    concurrency: int
    line: str

    def slot(self) -> str:
        return f"c={self.concurrency}"


# -- the leaders and their confirmation -----------------------------------------------------
class Leader(Frozen):
    label: str
    output_throughput: float
    output_throughput_pm: float | None = None  # the sampling half-width (temperature > 0)
    speedup: float


class NoLeader(Event):
    kind: Literal["no_leader"] = "no_leader"
    topic: ClassVar[str | None] = "leaders"


class Leaders(Event):
    """The predicted leaders at the target level, launched to confirm them."""

    kind: Literal["leaders"] = "leaders"
    topic: ClassVar[str | None] = "leaders"
    concurrency: int
    leaders: tuple[Leader, ...]


class TiedLeaders(Event):
    """At temperature > 0, the configs whose throughput intervals overlap the best's."""

    kind: Literal["tied_leaders"] = "tied_leaders"
    topic: ClassVar[str | None] = "leaders"
    temperature: float
    tied: int
    best: str
    launched: tuple[str, ...]

    def slot(self) -> str:
        return "tied"


class LaunchFailed(Event):
    """A confirm launch failed: a leader leaves the confirmation, a baseline ends it."""

    kind: Literal["launch_failed"] = "launch_failed"
    topic: ClassVar[str | None] = "confirmation"
    label: str
    key: str
    leader: bool

    def slot(self) -> str:
        return f"failed {self.key}"


class LevelSelected(Event):
    """A level's selection on the workload sample (the latest)."""

    kind: Literal["level_selected"] = "level_selected"
    topic: ClassVar[str | None] = "selection"
    selection: Selection

    def slot(self) -> str:
        return f"c={self.selection.concurrency}"


class ForecastMissed(Event):
    """A launch that missed the forecast beyond its accuracy."""

    kind: Literal["forecast_miss"] = "forecast_miss"
    topic: ClassVar[str | None] = "forecast_miss"
    check: ThroughputCheck

    def slot(self) -> str:
        return f"c={self.check.concurrency} {self.check.label}"


# -- why it stopped -------------------------------------------------------------------------
class BudgetSpent(Event):
    """--timeout or --n-trials ran out. `launches`: the replay strategy, whose --n-trials
    counts engine launches."""

    kind: Literal["budget_spent"] = "budget_spent"
    topic: ClassVar[str | None] = "stop"
    limit: Literal["timeout", "n_trials"]
    timeout_s: float | None = None
    n_trials: int | None = None
    launches: bool = False


class SpaceExhausted(Event):
    kind: Literal["space_exhausted"] = "space_exhausted"
    topic: ClassVar[str | None] = "stop"
    space: str
    configs: int


class SamplerRepeating(Event):
    kind: Literal["sampler_repeating"] = "sampler_repeating"
    topic: ClassVar[str | None] = "stop"


# -- a trial's progress lines (never stored) ------------------------------------------------
class TrialEnded(Event):
    """A trial measured: its figures (tuner.outputs.console's trial line)."""

    kind: Literal["trial_ended"] = "trial_ended"
    done: int
    total: int
    trial: int
    result: Any  # a BenchResult
    baseline: dict | None = None  # the baseline's result JSON, for the speedup
    wall_s: float


class TrialFailedEvent(Event):
    kind: Literal["trial_failed"] = "trial_failed"
    done: int
    total: int
    trial: int
    label: str
    failure_kind: str
    reason: str
    wall_s: float
    log: str


class RefusedBefore(Event):
    """A config the same engine refused before, answered from storage as FAIL."""

    kind: Literal["refused_before"] = "refused_before"
    trial: int
    label: str
    refused_trial: int
    failure_kind: str | None = None


class SameConfig(Event):
    """A config measured before, answered from storage."""

    kind: Literal["same_config"] = "same_config"
    trial: int
    label: str
    duplicate_of: int


class TokensUnreadable(Event):
    kind: Literal["tokens_unreadable"] = "tokens_unreadable"
    trial: int


class EngineStarting(Event):
    """A Ray worker's engine is starting (its own lines never reach this terminal)."""

    kind: Literal["engine_starting"] = "engine_starting"
    trial: int
    label: str
    log: str


class RepeatOf(Event):
    kind: Literal["repeat_of"] = "repeat_of"
    trial: int
    label: str


# -- what keeps a study from an answer -----------------------------------------------------
class NoAnswer(Frozen):
    """A study with nothing to compare (no completed trial, or no completed baseline): the
    trials that completed and failed, and the most common failure (its kind, how often, the
    last one's reason and log); kind None where none failed (the baseline has not run)."""

    study_name: str
    completed: int
    failed: int
    kind: str | None = None
    count: int = 0
    reason: str = ""
    log: str = ""


class Unreplayable(Frozen):
    """Why the replay strategy cannot predict a space: a method replay has no proposer for
    (`methods`, against the `replayable` ones), engine knobs the step-cost model does not
    cover, or a synthetic acceptance (--acceptance-profile)."""

    why: Literal["methods", "engine_knobs", "acceptance_profile"]
    methods: tuple[str, ...] = ()
    replayable: tuple[str, ...] = ()


# -- text -----------------------------------------------------------------------------------
class Note(Event):
    """A fact recorded as text: an entry of a decisions.json written before the events (its
    topic, key and text), or one tuner.outputs worded itself."""

    kind: Literal["note"] = "note"
    topic_name: str = Field(alias="topic")
    key: str = ""
    text: str

    def slot(self) -> str:
        return self.key

    @property
    def section(self) -> str:
        return self.topic_name


Stored = Annotated[
    NoTokens | ExpectedTime | SpaceReplayed | Calibration | MixedCalibration | Climb
    | PathSame | PathLeft | PathGap | StepCostFit | TokenStreams | PredictionMissed
    | SamplingMismatch | NoLeader | Leaders | TiedLeaders | LaunchFailed | LevelSelected
    | ForecastMissed | BudgetSpent | SpaceExhausted | SamplerRepeating | Note,
    Field(discriminator="kind")]
STORED: TypeAdapter[Any] = TypeAdapter(Stored)


def topic_of(event: Event) -> str | None:
    """The report section an event belongs to (a Note's own topic), None: a progress line."""
    return event.section if isinstance(event, Note) else event.topic


def load_event(entry: dict) -> Event:
    """A decisions.json entry as its event: one written before the events (topic, key, text,
    no kind) as a Note. Raises ValueError on an entry neither reads as."""
    if "kind" not in entry and "topic" in entry and "text" in entry:
        return Note(topic=str(entry["topic"]), key=str(entry.get("key") or ""),
                    text=str(entry["text"]))
    return STORED.validate_python(entry)


def dump_event(event: Event) -> dict:
    """An event as a decisions.json entry (its kind included)."""
    return event.model_dump(mode="json", by_alias=True)
