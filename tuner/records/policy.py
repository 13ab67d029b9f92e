"""What the load-aware policy measured and decided: a ladder run as the policy's companion study
stores it, and the policy document (policy.json) with its parts: each config's speedup per
level and break-even, the schedule, its verification on the ladder and its open-loop check at
each band edge. tuner.analysis.policy builds the document; tuner.api writes it to policy.json
(`model_dump()`) and tuner.outputs.report reads it back (`model_validate`), the only two places
it is JSON. A field left out of the JSON where it is None (`_left_out`) is a key the document
never had in that case, so the files keep their keys."""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

from pydantic import (
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from tuner.records.configs import Frozen, TrialConfig
from tuner.records.migrations import OLD_POLICY_KEYS, renamed
from tuner.records.results import BenchResult, LevelMetrics
from tuner.records.trials import Failure, Role

# (first batch size, last batch size, K): one band of vLLM's num_speculative_tokens_per_batch_size
Band = tuple[int, int, int]


# --- the policy's ladder runs -------------------------------------------------------------------
class RunTokens(Frozen):
    """Where a ladder run's token capture lies (tuner.search.study.store_tokens writes it)."""

    file: str  # relative to the study folder
    requests: int = 0
    output_tokens: int = 0


class LadderRun(Frozen):
    """One finished launch of a policy campaign (tuner.search.ladder), parsed once from its
    trial's user attrs: its phase ("ladder", "verify", "open_loop"), role, config and repeat,
    and the result measured at every level or the failure (neither: a run a killed driver left
    behind)."""

    key: str  # TrialConfig.key()
    phase: str | None = None
    role: str | None = None
    label: str | None = None
    repeat: int | None = None
    config: TrialConfig | None = None
    result: BenchResult | None = None
    failure: Failure | None = None
    tokens: RunTokens | None = None

    @field_validator("result", mode="before")
    @classmethod
    def _undefined_as_nan(cls, value: Any) -> Any:
        """The RESULT attr keeps an undefined metric (NaN) as null (as pydantic writes JSON:
        tuner.search.outcomes.result_attr); read back as NaN, so a run with one still counts."""
        if not isinstance(value, dict) or not isinstance(value.get("levels"), list):
            return value
        return {**value, "levels": [
            {k: math.nan if v is None and k in _FLOAT_METRICS else v for k, v in lv.items()}
            if isinstance(lv, dict) else lv for lv in value["levels"]]}


# LevelMetrics' figures that are always a number (NaN where undefined).
_FLOAT_METRICS = frozenset(name for name, field in LevelMetrics.model_fields.items()
                           if field.annotation is float)


# --- the document's parts -----------------------------------------------------------------------
class _Part(Frozen):
    """A part of policy.json; `_left_out` names the fields its JSON has no key for."""

    def _left_out(self) -> set[str]:
        return set()

    @model_serializer(mode="wrap")
    def _json(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        left_out = self._left_out()
        return {k: v for k, v in handler(self).items() if k not in left_out}


class LevelSpeedup(_Part):
    """A speedup over the plain baseline at one ladder level and its relative noise (measured,
    or a replay prediction held to the measured noise there)."""

    speedup: float
    noise: float


class LevelStat(LevelSpeedup):
    """A config at one ladder level against the baseline: medians, run counts and, where the
    study has an aligned baseline, the split (path_cost x speculation_gain = speedup, each with
    its noise; tuner.analysis.decomposition.POLICY_KEYS)."""

    throughput: float
    baseline: float
    n: int
    n_baseline: int
    path_cost: float | None = None
    path_noise: float | None = None
    speculation_gain: float | None = None
    gain_noise: float | None = None

    def _left_out(self) -> set[str]:
        return {k for k in ("path_cost", "path_noise", "speculation_gain", "gain_noise")
                if getattr(self, k) is None}


class BreakEvenStatus(str, Enum):
    ALWAYS_PAYS = "always_pays"
    NEVER_PAYS = "never_pays"
    CROSSES = "crosses"


class BreakEven(_Part):
    """Where a config's speedup falls to 1 within the noise: `concurrency` (interpolated in
    log2 between the last paying and the first non-paying level) where it crosses."""

    status: BreakEvenStatus
    concurrency: float | None = None
    last_paying: int | None = None
    first_not_paying: int | None = None


class ConfigCurve(_Part):
    """One speculative config of the ladder: its speedup per level and its break-even."""

    label: str
    role: Role
    speculative_config: dict[str, Any] | None = None  # vLLM's --speculative-config JSON
    stats: dict[int, LevelStat] = {}
    break_even: BreakEven | None = None


class PathCostCurve(_Part):
    """The study's aligned baseline on the ladder: the engine path's cost per level."""

    label: str
    config: TrialConfig
    path_cost: dict[int, LevelStat] = {}


class VerificationRow(_Part):
    """The emitted policy at one ladder level against the baseline and the static config."""

    concurrency: int
    policy_speedup: float
    policy_noise: float
    static_speedup: float | None = None
    policy_drafts: float | None = None
    below_baseline_beyond_noise: bool


class ScheduleVerification(_Part):
    """How the emitted policy fared on the ladder; where the engine refused the schedule, only
    why (`reason`). `headline`: in words (tuner.outputs.policy_words; None until worded)."""

    engine_rejected: bool
    reason: str | None = None
    honoured: bool = True
    rows: tuple[VerificationRow, ...] = ()
    worse_at: tuple[int, ...] = ()
    headline: str | None = None
    side_by_side: bool = False
    # The schedule's engine against the static config's, and where the counters and the
    # speeds contradicted the table (tuner.analysis.schedule_verification.verification)
    path_changes: tuple[PathChange, ...] = ()
    drafts_where_off: tuple[int, ...] = ()
    no_drafts_where_on: tuple[int, ...] = ()
    slower_at: tuple[int, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        return renamed(data, OLD_POLICY_KEYS)  # policy.json as stored before the rename

    def _left_out(self) -> set[str]:
        checks = {"path_changes", "drafts_where_off", "no_drafts_where_on", "slower_at"}
        if self.engine_rejected:
            return {"honoured", "rows", "worse_at"} | checks
        return {"reason"} | {k for k in checks if not getattr(self, k)}


class ScheduleBasis(str, Enum):
    """Why a schedule whose method takes a changing K is still not emitted: what vLLM's source
    says before any launch, or what the verify launch showed."""

    # vLLM's source: with the table, the engine builds another path than the static config's
    PATH_PREDICTED = "path_predicted"
    # the verify launch ran another engine path than the static config's (its log says so)
    PATH_MEASURED = "path_measured"
    # it drafted where the table says K=0, or drafted nothing where it says K>0: the table
    # was ignored
    DRAFTS_WHERE_OFF = "drafts_where_off"
    NO_DRAFTS_WHERE_ON = "no_drafts_where_on"
    # it measured below the static K of its band (K>0), or below the baseline (K=0), beyond
    # the noise
    SLOWER = "slower"


class PathChange(_Part):
    """One field of the engine path (tuner.measure.enginepath.FIELDS) on which the schedule's
    engine differs from the static config's."""

    field: str
    static: str | None = None
    schedule: str | None = None


class PathRule(_Part):
    """What vLLM's source says a K table does to the engine path of the static config, before
    any launch (tuner.speculative.schedule_rules.schedule_path): the fields it changes (none:
    the path stays), where vLLM does it, and a vLLM issue where the table is known to be
    ignored on that path."""

    changes: tuple[PathChange, ...] = ()
    vllm_source: str | None = None
    ignored_issue: int | None = None


class ScheduleCheck(_Part):
    """Why the policy does not emit its schedule though the method takes a changing K, and what
    holds instead: `basis` (one or more ScheduleBasis), the path fields that change, the ladder
    levels where the verify launch contradicted the table or lost (`levels`), the vLLM source or
    issue that says why, the schedule withheld, and the offer: `offered_k`, the static K of the
    band that pays (one engine), and `offered_bands`, a static K per band (an engine per band of
    load, tuner.outputs.policy_words.band_table)."""

    basis: tuple[ScheduleBasis, ...]
    changes: tuple[PathChange, ...] = ()
    levels: tuple[int, ...] = ()
    vllm_source: str | None = None
    vllm_issue: int | None = None
    schedule: tuple[Band, ...] = ()
    offered_k: int | None = None
    offered_bands: tuple[Band, ...] = ()


class BandEdge(_Part):
    """Where K changes: the last batch size of the lower band (`edge`) and the two Ks."""

    edge: int
    k_below: int
    k_above: int


class OpenLoopLevel(BandEdge):
    """The open-loop level that swings the batch across an edge: Poisson arrivals at `rate`
    requests/s (interpolated between the ladder levels `rate_from`), at most `concurrency`
    in flight."""

    concurrency: int
    rate: float
    rate_from: tuple[int, int]


class Figure(_Part):
    """Output throughput over open-loop repeats (median, relative MAD, spread in tok/s) and
    the median mean TPOT beside it."""

    throughput: float
    noise: float
    spread: float
    n: int
    mean_tpot_ms: float | None = None


class MergeCost(_Part):
    """What merging the bands at a dipping edge would give up on the closed-loop ladder: K `k`
    at `concurrency` measured `speedup`, where the merged K `merged_k` has `merged_speedup`
    (None: not measured there)."""

    concurrency: int
    k: int
    speedup: float
    merged_k: int
    merged_speedup: float | None = None


class EdgeCheck(OpenLoopLevel):
    """An edge measured open loop: the schedule's figure and each static K's (K 0 the
    baseline), the best static K, schedule over best and its noise, and whether it `dips`
    beyond the spread (None: not measured for the schedule or either K). `gives_up`: for a
    dipping edge, what its merge would give up (tuner.analysis.open_loop.merge_cost)."""

    policy: Figure | None = None
    static: dict[int, Figure] = {}
    best_k: int | None = None
    ratio: float | None = None
    noise: float | None = None
    dips: bool | None = None
    policy_minus_best: float | None = None
    gives_up: MergeCost | None = None

    def _left_out(self) -> set[str]:
        return ({"policy_minus_best"} if self.policy_minus_best is None else set()) | (
            set() if self.dips else {"gives_up"})


class OpenLoop(_Part):
    """The open-loop check: every edge, where the schedule dipped, where a dip was kept (its
    merge would give up a closed-loop gain), where no edge check was decided, and the schedule
    as verified on the ladder and as revised (None: not revised)."""

    edges: tuple[EdgeCheck, ...] = ()
    dipped_at: tuple[int, ...] = ()
    kept_at: tuple[int, ...] = ()
    unmeasured_at: tuple[int, ...] = ()
    revised: bool = False
    schedule_verified: tuple[Band, ...] = ()
    schedule_revised: tuple[Band, ...] | None = None


class PolicyContext(_Part):
    """What the policy step was run on (tuner.api fills it): the study, the ladder and its
    repeats, the workload as the ladder sent it."""

    study: str | None = None
    ladder: tuple[int, ...] = ()
    repeats: int | None = None
    workload: str | None = None
    num_prompts: int | None = None
    output_len: int | None = None
    requests_per_slot: int | None = None


class PolicyDocument(PolicyContext):
    """policy.json: per config its speedup per level and break-even, K per level for the first
    leader's method, the bands up to the engine's max_num_seqs and the schedule (None where the
    method's proposer takes no changing K: `schedule_refused` says why), every K the bands
    chose from (`k_stats`, measured or predicted), the speculative config that carries the
    schedule (None: speculation off, or no schedule), its verification and open-loop check.
    The sentences (`headline`, the verification's, `fallback_bands`: the band table for a
    router) are tuner.outputs.policy_words' words for these figures, None until worded."""

    method: str
    chosen: str
    configs: tuple[ConfigCurve, ...] = ()
    baseline: dict[int, list[float]] = {}
    k_by_level: dict[int, int] = {}
    schedule: tuple[Band, ...] | None = None
    bands: tuple[Band, ...] = ()
    schedule_refused: str | None = None
    k_measured: tuple[int, ...] = ()
    k_stats: dict[int, dict[int, LevelSpeedup]] = {}
    k_predicted: tuple[int, ...] = ()
    predicted_speedups: dict[int, dict[int, float]] = {}
    schedule_problems: tuple[str, ...] = ()
    speculative_config: dict[str, Any] | None = None  # vLLM's --speculative-config JSON
    serve_command: str | None = None
    serve_note: str | None = None
    verification: ScheduleVerification | None = None
    fallback_bands: tuple[str, ...] | None = None
    aligned_baseline: PathCostCurve | None = None
    decomposition: str | None = None
    headline: str | None = None
    open_loop: OpenLoop | None = None
    # What vLLM's source says the table does to the static config's engine path, and why the
    # schedule is withheld though the method takes a changing K (None: not withheld)
    path_rule: PathRule | None = None
    schedule_check: ScheduleCheck | None = None

    @property
    def needs_router(self) -> bool:
        """Whether a router must stand in for the schedule: the method's proposer takes no
        changing K, the schedule is withheld (another engine path, an ignored table, slower
        than static K), or on the ladder the engine refused the schedule or ignored it."""
        ver = self.verification
        return self.schedule_refused is not None or self.schedule_check is not None or (
            ver is not None and (ver.engine_rejected or not ver.honoured))

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        return renamed(data, OLD_POLICY_KEYS)  # policy.json as stored before the rename

    def _left_out(self) -> set[str]:
        return {k for k in ("headline", "open_loop", "path_rule", "schedule_check")
                if getattr(self, k) is None}
