"""What was measured: requests, levels and launches as the engine served them, and what a
`tuner bench` run asked. Field names of the measured figures follow `vllm bench serve`
(output_throughput, mean_tpot_ms, p99_itl_ms, ...) so users can compare the two tools line by
line."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_validator

from tuner.records.configs import (
    EngineSpec,
    Frozen,
    MeasureSettings,
    RequestSchedule,
    TrialConfig,
    WorkloadSpec,
)
from tuner.records.migrations import OLD_LEVEL_KEYS


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
