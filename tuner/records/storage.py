"""The storage contract: the names under which a study keeps its settings and each trial its
records in Optuna's user attrs."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.records.configs import (
    EngineSpec,
    MeasureSettings,
    RequestSchedule,
    TrialConfig,
    WorkloadSpec,
)
from tuner.records.predictions import PredictionMiss
from tuner.records.results import BenchResult

# The study user attr that holds a StudySettings.
STUDY_ATTR = "tuner"
# Per level, the replay strategy's Selection (tuner.records.selection), as JSON.
SELECTIONS_ATTR = "selections"


class Fingerprint(BaseModel):
    """Versions and hardware the results depend on (tuner.measure.machine.fingerprint), shown
    in every report. Unknown keys of older study folders are kept as they were stored."""

    model_config = ConfigDict(frozen=True, extra="allow")

    tuner: str | None = None
    vllm: str | None = None
    vllm_entry_point: str | None = None
    torch: str | None = None
    device: str | None = None
    model: str | None = None
    workload: str | None = None
    workload_digest: str | None = None


class StudySettings(BaseModel):
    """A study's settings, stored as its STUDY_ATTR user attr: written when the study is made
    (tuner.search.study.create, which merges a resumed command's), read through
    tuner.search.study.settings_of by every stage that needs them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: WorkloadSpec
    workload_digest: str
    engine_spec: EngineSpec
    settings: MeasureSettings = Field(default_factory=MeasureSettings)
    space: str = "default"
    # Per method that loads a drafter (draft_model, EAGLE, ...), the drafter the study launched,
    # resolved (--draft-model, or the folder the space's `model` names); {}: none, or a study
    # stored before drafters were kept (its trials' configs name them).
    drafters: dict[str, str] = Field(default_factory=dict)
    objectives: tuple[str, ...] = ("output_throughput", "mean_tpot_ms")
    target_concurrency: int | None = None
    # The SLOs the command set (--max-tpot-ms, --max-ttft-ms); None: not set.
    constraints: dict[str, float | None] = Field(default_factory=dict)
    acceptance_profile: tuple[float, ...] | None = None  # --acceptance-profile
    metadata: dict[str, str] = Field(default_factory=dict)
    # The speedup intervals' confidence and the equivalence margin, as fractions; None: a
    # study stored before they were kept (tuner.intervals' defaults then apply).
    confidence: float | None = None
    margin: float | None = None
    # The RequestSchedule every launch of the study sends; None: stored before schedules.
    schedule: RequestSchedule | None = None
    fingerprint: Fingerprint = Field(default_factory=Fingerprint)
    # What the replay strategy found while it ran, which the recommendation at the level names:
    # launched configs whose acceptance missed the prediction beyond its stated accuracy, and
    # per level (as a string key, as JSON keeps it) the line saying that the engine's
    # acceptance at temperature > 0 does not match the replay's.
    prediction_misses: tuple[PredictionMiss, ...] = ()
    sampling_mismatch: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _stored(cls, data: Any) -> Any:
        """Settings as older study folders stored them: JSON nulls where a field now has a
        default are read as that default, and an engine spec's or workload's fields that this
        version no longer has are dropped (they change nothing it does)."""
        if not isinstance(data, dict):
            return data
        out = {k: v for k, v in data.items()
               if v is not None or k in ("target_concurrency", "acceptance_profile",
                                         "confidence", "margin", "schedule")}
        for key, record in (("engine_spec", EngineSpec), ("workload", WorkloadSpec)):
            if isinstance(out.get(key), dict):
                out[key] = {k: v for k, v in out[key].items() if k in record.model_fields}
        return out

    def stored(self) -> dict[str, Any]:
        """The JSON the study's storage keeps; the drafters, and what the replay strategy
        found, are left out while empty, as studies stored before these fields read."""
        out = self.model_dump(mode="json")
        for key in ("drafters", "prediction_misses", "sampling_mismatch"):
            if not out[key]:
                del out[key]
        return out

    def misses_at(self, concurrency: int) -> tuple[PredictionMiss, ...]:
        return tuple(m for m in self.prediction_misses if m.concurrency == concurrency)


# --- the storage contract: what each trial stores in its Optuna user attrs ----------------------
class TrialAttr:
    """Names of a trial's user attrs in the study's storage; old study folders use the same."""

    CONFIG = "config"  # the TrialConfig as JSON
    CONFIG_KEY = "key"  # TrialConfig.key(): one config, whatever order its fields came in
    LABEL = "label"
    ROLE = "role"  # a Role value
    RESULT = "result"  # the BenchResult as JSON
    FAILURE = "failure"  # a Failure as JSON
    CONSTRAINT = "constraint"  # Optuna's constraint values (<= 0: the SLO is met)
    DUPLICATE_OF = "duplicate_of"  # answered from this earlier trial's storage, no launch
    REPEAT_OF = "repeat_of"
    CONFIG_OVERRIDE = "config_override"  # an enqueued config the sampler does not propose
    WALL_S = "wall_s"
    PHASE = "phase"  # policy campaigns: "ladder" or "verify"
    REPEAT = "repeat"  # policy campaigns: the repeat index
    REPEATS = "repeats"
    # {"file": the tuner.tokens capture, relative to the study folder, "requests": n,
    #  "output_tokens": n (measured requests)}; absent when the engine returned no token ids
    TOKENS = "tokens"


class StoredTrial(BaseModel):
    """One trial of a study as the search reads it: its attrs (TrialAttr) parsed once, by
    tuner.search.study.stored, the one reader of raw attrs."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    number: int
    state: str  # Optuna's TrialState name: COMPLETE, FAIL, RUNNING, WAITING, PRUNED
    role: str | None = None  # a Role value
    label: str | None = None
    config_key: str | None = None
    config: TrialConfig | None = None  # as measured
    override: TrialConfig | None = None  # as enqueued (baseline, aligned baseline, repeat)
    result: BenchResult | None = None
    failure_kind: str | None = None
    duplicate_of: int | None = None  # answered from this trial's storage, no launch
    repeat_of: int | None = None
    wall_s: float | None = None
