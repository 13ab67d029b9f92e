"""The K axis of a model-based drafter (draft_model, EAGLE, EAGLE-3, MTP) from one launch:
what a launch measured as the prediction reads it (KLevel, KLaunch), the drafter's step cost
per level (DrafterCost), and every smaller K predicted at every level beside what a launch at
that K measured (KPoint, DrafterAxis). Built by tuner.replay.drafter_k; figures only (the
words are tuner.outputs.drafter_k's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class KLevel:
    """One launch at one level, as the K axis reads it: vLLM's counters (drafts and the
    per-position acceptance, accepted-at-position-i over drafts) and the level's timing
    medians over the config's launches."""

    concurrency: int
    drafts: float  # vllm:spec_decode_num_drafts over the measured phase
    per_position: tuple[float, ...]
    acceptance_length: float | None
    decode_ms_per_token: float  # sum(e2e - TTFT) / sum(N - 1)
    output_throughput: float
    mean_ttft_ms: float
    mean_tpot_ms: float
    tokens_per_request: float  # total output tokens / completed requests


@dataclass(frozen=True, kw_only=True)
class KLaunch:
    """A drafter's launched config at one K: its trial number and its levels."""

    number: int
    k: int
    key: str
    levels: tuple[KLevel, ...]
    trials: int = 1  # launches of this config its levels are the medians of

    def level(self, c: int) -> KLevel | None:
        return next((lv for lv in self.levels if lv.concurrency == c), None)


@dataclass(frozen=True, kw_only=True)
class DrafterCost:
    """One level's speculative step as a function of K: step(K) = base_step_ms + fixed_ms +
    per_token_ms x K, the step being the decode time per token times the tokens a request
    gains per step (1 + accepted). base_step_ms is the baseline's (the anchor); per_token_ms
    holds the target's verify of one more token per sequence and the drafter's forward for
    one more position; fixed_ms what any speculative step costs over a plain one (the path,
    the drafter's pass over the accepted tokens). With launches at one K only, fixed_ms is 0
    by assumption and `calibrated` is False; a launch at a second K fits both."""

    concurrency: int
    base_step_ms: float
    fixed_ms: float
    per_token_ms: float
    calibrated: bool
    fitted_on_k: tuple[int, ...]
    # the study's fitted step-cost slope (tuner.replay.cost) times the level's sequences: the
    # verify part of per_token_ms, where the study's cost model is calibrated; None otherwise
    verify_ms_per_token: float | None = None

    def step_ms(self, k: int) -> float:
        return self.base_step_ms + (self.fixed_ms + self.per_token_ms * k if k else 0.0)

    @property
    def drafter_ms_per_token(self) -> float | None:
        """The drafter's own cost per drafted position, where the verify part is known."""
        if self.verify_ms_per_token is None:
            return None
        return self.per_token_ms - self.verify_ms_per_token


@dataclass(frozen=True, kw_only=True)
class KPoint:
    """One K at one level: acceptance predicted from the source launch's per-position rates
    (with its standard error from the counts), throughput and TPOT on the level's DrafterCost,
    and, where a launch at this K measured it, the measured figures and the errors (percent,
    predicted above measured positive)."""

    concurrency: int
    k: int
    key: str  # the config at this K (TrialConfig.key)
    per_position: tuple[float, ...]
    acceptance_length: float
    acceptance_length_se: float
    # the stated accuracy of acceptance_length against a launch at this K (percent): the
    # larger of a floor and three standard errors of the difference from the counts
    acceptance_accuracy_pct: float
    throughput_accuracy_pct: float
    step_ms: float | None = None
    decode_ms_per_token: float | None = None
    output_throughput: float | None = None
    mean_tpot_ms: float | None = None
    mean_ttft_ms: float | None = None
    speedup: float | None = None  # over the baseline's measured throughput at this level
    source: bool = False  # the launch the rates come from
    fitted: bool = False  # the cost was fitted on this launch: its throughput error is in-sample
    measured_trials: int = 0
    meas_acceptance_length: float | None = None
    meas_acceptance_length_se: float | None = None
    meas_output_throughput: float | None = None
    meas_mean_tpot_ms: float | None = None
    err_acceptance_length_pct: float | None = None
    err_output_throughput_pct: float | None = None

    @property
    def acceptance_miss(self) -> bool:
        """A launch at this K measured acceptance further from the prediction than stated."""
        return (not self.source and _finite(self.err_acceptance_length_pct)
                and abs(self.err_acceptance_length_pct) > self.acceptance_accuracy_pct)

    @property
    def throughput_miss(self) -> bool:
        """An out-of-sample launch measured throughput further than stated."""
        return (not self.fitted and _finite(self.err_output_throughput_pct)
                and abs(self.err_output_throughput_pct) > self.throughput_accuracy_pct)


@dataclass(frozen=True, kw_only=True)
class DrafterAxis:
    """A drafter's whole K axis: the config without K, the launch the per-position rates come
    from (its largest launched K), the step cost per level, and every K from 1 to that K at
    every level."""

    method: str
    label: str  # the config's label without K
    speculative_config: str  # JSON, sorted keys, without K
    source_k: int
    source_trial: int
    costs: tuple[DrafterCost, ...]
    points: tuple[KPoint, ...]

    @property
    def launched_k(self) -> tuple[int, ...]:
        return tuple(sorted({p.k for p in self.points if p.measured_trials}))

    @property
    def calibrated(self) -> bool:
        return bool(self.costs) and all(c.calibrated for c in self.costs)

    def misses(self) -> list[KPoint]:
        return [p for p in self.points if p.acceptance_miss or p.throughput_miss]


def _finite(x: float | None) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
