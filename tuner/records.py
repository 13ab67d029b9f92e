"""Typed, immutable records that cross module boundaries.

Every stage hands the next one of these, never a loose dict. Field names of the measured
figures follow `vllm bench serve` (output_throughput, mean_tpot_ms, p99_itl_ms, ...) so users
can compare the two tools line by line.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

if TYPE_CHECKING:
    from argparse import Namespace


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Prompt(Frozen):
    """One request body as the load generator sends it (text completion, chat template applied)."""

    prompt: str
    prompt_len: int
    output_len: int


class WorkloadSpec(Frozen):
    """What a user asked for; enough to rebuild the exact prompt list."""

    name: str
    dataset_path: str | None = None
    num_prompts: int = 16
    seed: int = 0
    output_len: int | None = None  # None: the workload's default (vLLM's for that dataset)
    max_input_tokens: int | None = None
    skip_chat_template: bool = False
    category: str | None = None
    random_input_len: int = 256
    random_output_len: int = 128
    temperature: float = 0.0
    # Sampling past the temperature, as vLLM's SamplingParams take it; SAMPLING_OFF values
    # are off, and a dump leaves them out, so a study that does not set them stores and
    # fingerprints as one stored before they existed.
    top_p: float = 1.0
    top_k: int = 0  # 0: off (vLLM also takes -1)
    min_p: float = 0.0
    ignore_eos: bool = False

    @property
    def sampling(self) -> dict[str, float]:
        """The temperature and every other sampling parameter that is not off."""
        return self.sampling_of(self.__dict__)

    @staticmethod
    def sampling_of(stored: Mapping[str, Any]) -> dict[str, float]:
        """`sampling` of a stored workload (a dump, maybe from before these fields)."""
        return {"temperature": stored.get("temperature") or 0.0,
                **{k: v for k, off in SAMPLING_OFF.items()
                   if (v := stored.get(k, off)) is not None and v != off}}

    @model_serializer(mode="wrap")
    def _without_sampling_off(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        for k, off in SAMPLING_OFF.items():
            if out.get(k) == off:
                del out[k]
        return out


# WorkloadSpec's sampling parameters besides the temperature, at the values that turn them off.
SAMPLING_OFF: dict[str, float] = {"top_p": 1.0, "top_k": 0, "min_p": 0.0}
# Key of a study's "tuner" settings: {level: the line saying that the engine's measured
# acceptance at temperature > 0 does not match the replay} (the replay strategy writes it, the
# recommendation's reason at that level repeats it).
SAMPLING_MISMATCH = "sampling_mismatch"
# Key of a study's "tuner" settings: the PredictionMiss records the replay strategy found
# (dumped), which the recommendation at their level names where it rests on that config.
PREDICTION_MISSES = "prediction_misses"
# Key of a study's "tuner" settings: the RequestSchedule every launch of the study sends.
SCHEDULE = "schedule"


class Workload(Frozen):
    spec: WorkloadSpec
    prompts: tuple[Prompt, ...]

    @property
    def digest(self) -> str:
        """A short hash of the exact prompts and lengths: two studies compare only if equal."""
        return prompts_digest(self.prompts)


def prompts_digest(prompts: Sequence[Prompt]) -> str:
    """A short hash of `prompts` in order, with their output budgets: two prompt lists (a
    workload, a level's measured requests) are the same requests exactly when these agree."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(p.prompt.encode())
        h.update(f"\0{p.output_len}\0".encode())
    return h.hexdigest()[:16]


# An engine's time limits, the one home of their defaults (EngineSpec, EngineOptions and the
# CLI's --ready-timeout, --request-timeout, --level-timeout read them).
READY_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 300.0
LEVEL_TIMEOUT_S = 3600.0


class EngineSpec(Frozen):
    """How to start one vLLM server; the speculative config comes per trial."""

    model: str
    # The model as the user named it (a hub id, or the path as typed; the embedded default's
    # hub id): what a serve command shows. `model` is the resolved path the engine loads.
    model_name: str | None = None
    served_model_name: str = "model"
    vllm_cmd: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    host: str = "127.0.0.1"
    device: str = "cpu"
    ready_timeout_s: float = READY_TIMEOUT_S
    request_timeout_s: float = REQUEST_TIMEOUT_S
    level_timeout_s: float = LEVEL_TIMEOUT_S
    tokenizer: str | None = None
    # A server that is already running (`tuner bench --base-url`): measured, never launched.
    base_url: str | None = None


# vLLM's num_speculative_tokens where a config leaves it out, per method: (the config key it
# defaults to, that key's own default). n-gram and draft-model configs must name K; EAGLE and
# MTP take it from the draft model's config (vllm/config/speculative.py).
DEFAULT_K: dict[str, tuple[str, int]] = {"suffix": ("suffix_decoding_max_tree_depth", 24)}


class EngineLimits(Frozen):
    """The engine's limits that bound a replay and a K schedule, as the engine runs with them:
    its flags' values where set, vLLM's defaults for the device otherwise
    (tuner.engine_cmdline.engine_limits builds it; every reader goes through that)."""

    max_model_len: int | None = None  # None: the model's own context length (unknown here)
    max_num_seqs: int
    max_num_batched_tokens: int


class TrialConfig(Frozen):
    """One candidate: the exact `--speculative-config` (None = no speculation) and engine knobs."""

    speculative_config: dict[str, Any] | None = None
    engine_args: dict[str, Any] = Field(default_factory=dict)
    engine_env: dict[str, str] = Field(default_factory=dict)  # e.g. an aligned baseline's

    @property
    def method(self) -> str:
        return "none" if not self.speculative_config else str(self.speculative_config["method"])

    @property
    def k(self) -> int | None:
        """`num_speculative_tokens` as vLLM resolves it: the config's own, else the method's
        default (DEFAULT_K); None without speculation, or where vLLM takes K from the draft
        model's own config (EAGLE, MTP), which is not known here."""
        spec = self.speculative_config
        if not spec:
            return None
        if spec.get("num_speculative_tokens") is not None:
            return int(spec["num_speculative_tokens"])
        default = DEFAULT_K.get(str(spec.get("method")))
        return int(spec.get(default[0], default[1])) if default else None

    def with_k(self, k: int) -> TrialConfig:
        """The same config drafting `k` tokens a step, with no K schedule."""
        if not self.speculative_config:
            raise ValueError("a config without speculation has no K")
        spec = {**self.speculative_config_without_k(), "num_speculative_tokens": int(k)}
        return self.model_copy(update={"speculative_config": spec})

    def speculative_config_without_k(self) -> dict[str, Any]:
        """The config minus K and any K schedule: configs equal here differ only in K."""
        return {k: v for k, v in (self.speculative_config or {}).items()
                if k not in ("num_speculative_tokens", "num_speculative_tokens_per_batch_size")}

    def with_acceptance_profile(self, rates: list[float] | None) -> TrialConfig:
        """Use vLLM's synthetic rejection sampling with a measured per-position acceptance
        profile (for dummy-weight models, whose own acceptance is meaningless). Positions
        beyond the profile repeat its last rate; vLLM wants the rates non-increasing."""
        if not rates or not self.speculative_config:
            return self
        k = self.k or len(rates)
        profile = [min(rates[: i + 1]) for i in range(len(rates))]
        profile = (profile + [profile[-1]] * k)[:k]
        spec = {**self.speculative_config, "rejection_sample_method": "synthetic",
                "synthetic_acceptance_rates": [round(r, 4) for r in profile]}
        return self.model_copy(update={"speculative_config": spec})

    def spec_json(self) -> str:
        return json.dumps(self.speculative_config, sort_keys=True, separators=(",", ":"))

    def key(self) -> str:
        """Canonical identity used to answer duplicate configs from storage."""
        ident: dict[str, Any] = {"spec": self.speculative_config, "engine": self.engine_args}
        if self.engine_env:
            ident["env"] = self.engine_env
        return json.dumps(ident, sort_keys=True)

    def label(self) -> str:
        s = self.speculative_config
        if not s:
            text = "baseline (no speculation)"
        else:
            parts = [s["method"]]
            if "num_speculative_tokens" in s:
                parts.append(f"k={s['num_speculative_tokens']}")
            if "prompt_lookup_min" in s or "prompt_lookup_max" in s:
                parts.append(f"window {s.get('prompt_lookup_min', '?')}-{s.get('prompt_lookup_max', '?')}")
            for name in sorted(s):
                if name in ("rejection_sample_method", "synthetic_acceptance_rates",
                            "synthetic_acceptance_length", "num_speculative_tokens_per_batch_size"):
                    continue
                if name not in ("method", "num_speculative_tokens", "prompt_lookup_min",
                                "prompt_lookup_max"):
                    value = s[name]
                    if isinstance(value, str) and len(value) > 24:
                        value = "..." + value[-20:]
                    parts.append(f"{name.replace('suffix_decoding_', '')}={value}")
            if s.get("num_speculative_tokens_per_batch_size"):
                text_k = ",".join(f"{a}-{b}:{k}" for a, b, k in
                                  s["num_speculative_tokens_per_batch_size"])
                parts.append(f"K by batch [{text_k}]")
            if s.get("rejection_sample_method") == "synthetic":
                # Results of synthetic acceptance are labelled as such everywhere they appear.
                parts.append("[SYNTHETIC acceptance]")
            text = " ".join(parts)
        knobs = {**self.engine_args, **self.engine_env}
        if knobs:
            text += " [" + " ".join(f"{k}={v}" for k, v in sorted(knobs.items())) + "]"
        return text


# `--aligned-baseline`: "auto" (the search finds the speculative engine path and aligns to it
# where it differs), "off", or an explicit baseline on that path (tuner.checks.aligned_baseline).
AlignedBaseline = Literal["auto", "off"] | TrialConfig


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


# Keys of LevelMetrics as stored before they took vLLM's names; LevelMetrics.migrate renames
# them (and turns the acceptance rate, then a fraction, into vLLM's percentage).
_OLD_LEVEL_KEYS = {"spec_decode_num_draft_tokens": "spec_decode_draft_tokens",
                   "spec_decode_num_accepted_tokens": "spec_decode_accepted_tokens"}


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

    @model_validator(mode="before")
    @classmethod
    def _read_old_keys(cls, data: Any) -> Any:
        return cls.migrate(data) if isinstance(data, dict) else data

    @staticmethod
    def migrate(level: dict[str, Any]) -> dict[str, Any]:
        """A stored level dict with today's keys and units: old study folders wrote
        `spec_decode_num_draft_tokens` / `..._num_accepted_tokens` and the acceptance rate as
        a fraction. The one place old keys are read; a current dict comes back unchanged."""
        if not any(k in level for k in _OLD_LEVEL_KEYS):
            return level
        out = {_OLD_LEVEL_KEYS.get(k, k): v for k, v in level.items()}
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
        """The windows' verdict in a table cell: '±1.2%' where they agreed, 'unsteady ±6.1%'
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


class MeasureSettings(Frozen):
    """How each concurrency level is driven; stored with every result."""

    concurrencies: tuple[int, ...] = (1,)
    num_requests: int | None = None  # measured requests per level; None: see requests_for()
    requests_per_slot: int = 4
    warmup_output_len: int = 16
    # `vllm bench serve --percentile-metrics / --metric-percentiles`, with vLLM's defaults for
    # a generative model; the fixed p90/p99 fields are recorded whatever is selected.
    percentile_metrics: tuple[str, ...] = ("ttft", "tpot", "itl")
    metric_percentiles: tuple[float, ...] = (99.0,)
    # Warm-up requests before each level (`--num-warmups`); None: one per slot.
    num_warmups: int | None = None
    # Windows (`--stability`, tuner.measure.windows): each level's measured requests are cut
    # into `stable_windows` fixed slices; the level is steady when their decode times per
    # token agree within `stability_pct` percent. 0: no windows. Nothing more is sent either way.
    stability_pct: float = Field(3.0, ge=0.0)
    stable_windows: int = Field(3, ge=1)
    # `--allow-repeats`: the schedule may send a prompt to one engine again where the data
    # holds too few (RequestSchedule); otherwise levels are shortened instead.
    allow_repeats: bool = False

    @model_validator(mode="before")
    @classmethod
    def _drop_window_growth(cls, data: Any) -> Any:
        """Settings stored while windows drew new prompts until they agreed carry the time cap
        and the minimum window time of that protocol; they no longer mean anything."""
        if isinstance(data, dict) and ("stability_max_s" in data or "min_window_s" in data):
            return {k: v for k, v in data.items() if k not in _RETIRED_SETTINGS}
        return data

    def pool_size(self, num_prompts: int) -> int:
        """Prompts needed so no level (nor its warm-up) repeats a prompt within one engine."""
        return sum(self.requests_for(c, num_prompts) + self.warmups_for(c)
                   for c in self.concurrencies)

    def warmups_for(self, concurrency: int) -> int:
        """Short warm-up requests sent before the level, excluded from its figures."""
        return concurrency if self.num_warmups is None else self.num_warmups

    def requests_for(self, concurrency: int, num_prompts: int) -> int:
        """Enough requests that each of the c slots serves several, and every prompt once."""
        if self.num_requests:
            return self.num_requests
        return max(num_prompts, self.requests_per_slot * concurrency)


_RETIRED_SETTINGS = ("stability_max_s", "min_window_s")


class LevelRequests(Frozen):
    """One level of a RequestSchedule: indices into the workload's prompts, its warm-ups sent
    first (short, never measured), then its measured requests; measured request i of every
    launch is the prompt `measured[i]`."""

    concurrency: int
    warmups: tuple[int, ...]
    measured: tuple[int, ...]
    # How many measured requests the settings asked for, where the data held too few distinct
    # prompts and the level was shortened (None: as asked).
    asked: int | None = None


class RequestSchedule(Frozen):
    """What every launch of a study (and `tuner bench` with the same workload and settings)
    sends, level by level in this order: built once by tuner.measure.request_schedule from
    the workload and the settings, stored with the study. Without `allow_repeats` no index
    appears twice in the whole schedule, so no engine is sent a prompt twice."""

    workload_digest: str
    levels: tuple[LevelRequests, ...]
    allow_repeats: bool = False

    def level(self, concurrency: int) -> LevelRequests:
        for lv in self.levels:
            if lv.concurrency == concurrency:
                return lv
        raise KeyError(f"the request schedule has no level {concurrency}")

    @property
    def requests(self) -> int:
        """Every request one launch sends, warm-ups included."""
        return sum(len(lv.warmups) + len(lv.measured) for lv in self.levels)


# --- options: one record per command, built once from the command line ---------------------
# `from_cli_args` reads a namespace whose every value tuner.cli converted and checked as it
# parsed it (tuner.checks, as argparse `type=`). What needs several options, the machine or
# the engine (the engine resolved, levels against its --max-num-seqs, the output folder, the
# defaults that follow from those) is checked by tuner.checks too, when tuner.api resolves the
# record, before anything is printed or created.
@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """The engine as the user named it (`--model`, `--engine-args`, ...). tuner.api resolves
    it into an EngineSpec: the user's model or the embedded default, with this machine's
    device and defaults; or the server already running at `base_url`."""

    model: str | None = None  # None: the embedded default
    tokenizer: str | None = None
    vllm_cmd: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    ready_timeout_s: float = READY_TIMEOUT_S
    request_timeout_s: float = REQUEST_TIMEOUT_S
    level_timeout_s: float = LEVEL_TIMEOUT_S
    base_url: str | None = None

    @classmethod
    def from_cli_args(cls, args: Namespace) -> EngineOptions:
        return cls(model=args.model, tokenizer=args.tokenizer, vllm_cmd=args.vllm_cmd or (),
                   extra_args=args.engine_args or (), env=dict(args.engine_env),
                   ready_timeout_s=args.ready_timeout, request_timeout_s=args.request_timeout,
                   level_timeout_s=args.level_timeout, base_url=getattr(args, "base_url", None))


def _workload_from(args: Namespace) -> WorkloadSpec:
    return WorkloadSpec(
        name=args.workload, dataset_path=args.dataset_path, num_prompts=args.num_prompts,
        seed=args.seed, output_len=args.output_len, max_input_tokens=args.max_input_tokens,
        category=args.category, random_input_len=args.random_input_len,
        random_output_len=args.random_output_len, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        ignore_eos=args.ignore_eos, skip_chat_template=args.skip_chat_template)


def _measure_from(args: Namespace) -> MeasureSettings:
    return MeasureSettings(concurrencies=args.concurrency, num_requests=args.num_requests,
                           requests_per_slot=args.requests_per_slot, num_warmups=args.num_warmups,
                           percentile_metrics=args.percentile_metrics,
                           metric_percentiles=args.metric_percentiles,
                           stability_pct=args.stability, allow_repeats=args.allow_repeats)


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    """`tuner bench`: one config measured at every level of `settings` in one engine launch;
    `metadata` (`--metadata KEY=VALUE`) is kept in result.json for the user's records.
    `--engine-env` belongs to `config` (its label, result.json's config.engine_env): in a
    study it is every engine's environment (EngineOptions.env), but bench has one engine,
    and what it sets is part of what was measured."""

    workload: WorkloadSpec
    engine: EngineSpec | EngineOptions
    settings: MeasureSettings = field(default_factory=MeasureSettings)
    config: TrialConfig = field(default_factory=TrialConfig)
    out_dir: Path
    metadata: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_cli_args(cls, args: Namespace) -> BenchOptions:
        config = TrialConfig(speculative_config=args.speculative_config,
                             engine_env=dict(args.engine_env)
                             ).with_acceptance_profile(args.acceptance_profile)
        out = args.output_dir or Path("outputs") / (
            f"bench-{time.strftime('%Y%m%d-%H%M%S')}-{config.method}")
        engine = replace(EngineOptions.from_cli_args(args), env={})  # in `config` instead
        return cls(workload=_workload_from(args), engine=engine,
                   settings=_measure_from(args), config=config, out_dir=out,
                   metadata=dict(args.metadata))


@dataclass(frozen=True, kw_only=True)
class PolicyOptions:
    """The load-aware policy (`tuner policy`, `tuner optimize --policy`): the leading configs
    measured `repeats` times on a concurrency ladder, and the schedule verified on it."""

    ladder: tuple[int, ...] | None = None  # None: powers of two up to ladder_max
    ladder_max: int = 16  # the top of the default ladder (the highest load it measures)
    repeats: int = 2
    leaders: int = 2
    k_values: tuple[int, ...] | None = None  # K values of the chosen method to measure
    num_prompts: int | None = None  # None: the study's
    output_len: int | None = None  # None: the study's
    requests_per_slot: int = 4
    side_by_side: bool = False  # re-measure baseline and static config beside the policy

    @classmethod
    def from_cli_args(cls, args: Namespace) -> PolicyOptions:
        return cls(ladder=args.ladder, ladder_max=args.ladder_max, repeats=args.policy_repeats,
                   leaders=args.leaders, k_values=args.k_values,
                   num_prompts=args.policy_num_prompts, output_len=args.policy_output_len,
                   requests_per_slot=args.policy_requests_per_slot,
                   side_by_side=args.side_by_side)


@dataclass(frozen=True, kw_only=True)
class TrafficOptions:
    """`tuner predict --traffic FILE`: a user's own request logs replayed over a space at each
    level (a closed loop of c), priced on a study's step cost where `study_dir` is given."""

    traffic_path: Path
    model: str | None = None  # the model or its tokenizer; None: the study's or records' own
    space_name: str | None = None  # None: ngram
    levels: tuple[int, ...] | None = None  # None: (1,)
    study_dir: Path | None = None
    storage_url: str | None = None
    study_name: str | None = None
    out_dir: Path | None = None  # None: outputs/traffic-<the file's stem>
    top: int = 10

    @classmethod
    def from_cli_args(cls, args: Namespace) -> TrafficOptions:
        return cls(traffic_path=args.traffic, model=args.model, space_name=args.space,
                   levels=args.levels, study_dir=args.study or args.study_dir,
                   storage_url=args.storage, study_name=args.study_name,
                   out_dir=args.output_dir, top=args.top)


@dataclass(frozen=True, kw_only=True)
class AlignedBaselineFlags:
    """`--aligned-baseline` and `--aligned-baseline-env` as typed; tuner.checks reads them into
    an AlignedBaseline (the two are checked together)."""

    engine_args: str | None = None
    env: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class OptimizeOptions:
    """`tuner optimize`: the search over a space, and (`policy`) the load-aware policy after it.

    tuner.api resolves it once (tuner.checks.optimize_options): `engine` an EngineSpec,
    `aligned_baseline` an AlignedBaseline, and the defaults below that follow from the
    engine or the levels filled in; the search reads that resolved record."""

    workload: WorkloadSpec
    engine: EngineSpec | EngineOptions
    settings: MeasureSettings = field(default_factory=MeasureSettings)
    space_name: str = "default"
    study_name: str | None = None  # None: WORKLOAD-MODEL
    out_dir: Path | None = None  # None: outputs/STUDY_NAME
    storage_url: str | None = None  # None: a journal in the study folder
    n_trials: int = 12
    timeout_s: float | None = None
    strategy: Literal["auto", "replay", "optuna"] = "auto"
    sampler: str = "tpe"
    seed: int | None = 0  # the sampler's, and the replay's choices
    objectives: Sequence[str] = ("output_throughput", "mean_tpot_ms")
    target_concurrency: int | None = None  # None: the first level
    constraints: Mapping[str, float | None] = field(default_factory=dict)  # the SLOs
    repeats: int = 1
    confirm_leaders: int = 2
    # The speedup intervals' confidence and the equivalence margin, as fractions (--confidence
    # 95, --margin 2): when confirm launches stop, what the recommendation claims.
    confidence: float = 0.95
    margin: float = 0.02
    ray_address: str | None = None
    parallel: int | None = None
    gpus_per_trial: float | None = None
    logical_gpus: int | None = None  # tests: ray.init(num_gpus=N)
    acceptance_rates: list[float] | None = None  # --acceptance-profile
    aligned_baseline: AlignedBaseline | AlignedBaselineFlags = "auto"
    metadata: Mapping[str, str] = field(default_factory=dict)
    policy: PolicyOptions | None = None  # None: no policy step
    report: bool = True  # write report.html, plots and recommendation.json

    @classmethod
    def from_cli_args(cls, args: Namespace) -> OptimizeOptions:
        return cls(
            workload=_workload_from(args), engine=EngineOptions.from_cli_args(args),
            settings=_measure_from(args), space_name=args.space, study_name=args.study_name,
            out_dir=args.output_dir, storage_url=args.storage, n_trials=args.n_trials,
            timeout_s=args.timeout,
            # A sampler named on the command line is a request for the Optuna search.
            strategy="optuna" if args.strategy == "auto" and args.sampler else args.strategy,
            sampler=args.sampler or "tpe", seed=args.sampler_seed, objectives=args.objectives,
            target_concurrency=args.target_concurrency,
            constraints={"max_tpot_ms": args.max_tpot_ms, "max_ttft_ms": args.max_ttft_ms},
            repeats=args.repeats, confirm_leaders=args.confirm_leaders,
            confidence=args.confidence / 100, margin=args.margin / 100,
            ray_address=args.ray_address, parallel=args.parallel,
            gpus_per_trial=args.gpus_per_trial, logical_gpus=args.logical_gpus,
            acceptance_rates=args.acceptance_profile, metadata=dict(args.metadata),
            aligned_baseline=AlignedBaselineFlags(engine_args=args.aligned_baseline,
                                                  env=tuple(args.aligned_baseline_env)),
            policy=PolicyOptions.from_cli_args(args) if args.policy else None,
            report=not args.no_report)


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


# --- across the search: what one trial produced, and why it stands in the study --------------
class Role(str, Enum):
    """Why a trial is in the study (stored as its plain string value in the trial's attrs)."""

    BASELINE = "baseline"  # no speculation, measured first in every study
    ALIGNED_BASELINE = "aligned_baseline"  # no speculation on the speculative engine path
    START_POINT = "start_point"  # a space's start point, enqueued before the sampler
    SEARCH = "search"  # proposed by the sampler (or a grid point)
    RETRY = "retry"  # re-run of a trial a dead driver left RUNNING
    REPEAT = "repeat"  # re-measurement of a leader, pooled with its original
    CALIBRATION = "calibration"  # replay strategy: the launch that fits the step-cost model
    CONFIRM = "confirm"  # replay strategy: a predicted leader, measured


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


def stored_misses(settings: Mapping[str, Any]) -> list[PredictionMiss]:
    """The PredictionMiss records kept in a study's settings (PREDICTION_MISSES)."""
    return [PredictionMiss.model_validate(m) for m in settings.get(PREDICTION_MISSES) or []]


class Recommendation(Frozen):
    """What to run at one concurrency level, or why the data cannot say."""

    concurrency: int
    status: Status
    reason: str
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
    spread: dict[str, float | None] = {}
    n_repeats: int = 0  # re-measurements of the chosen config beyond the first
    confidence: str = ""
    verify_command: str | None = None
    slos: dict[str, float | None] = {}
    # The serve command as a `vllm serve --config` YAML mapping: vLLM's option names without
    # dashes, the speculative config as a mapping.
    serve_config: dict[str, Any] | None = None
    # With an aligned baseline (tuner.analysis.decomposition): the chosen (or fastest)
    # config's speedup over the plain baseline split into the engine path's cost and
    # speculation's own gain, each with its spread; None without one.
    decomposition: dict[str, Any] | None = None
    # The speedup over the plain baseline of the chosen config (where speculation stays off:
    # of the fastest speculative one) with its interval, from the per-launch throughputs and
    # the between-launch spread pooled over the level (tuner.intervals); None where too few
    # launches give one. `launches`: (that config's, the baseline's).
    speedup_interval: tuple[float, float] | None = None
    confidence_level: float | None = None
    equivalence_margin: float | None = None
    launches: tuple[int, int] | None = None
    # Where the replay's prediction of the chosen config's acceptance at this level missed
    # its measurement beyond the stated accuracy (the reason says so too); () otherwise.
    prediction_misses: tuple[PredictionMiss, ...] = ()


class TrafficOutcome(Frozen):
    """What `tuner predict --traffic` hands the CLI: the table, the notes beside it, the rows
    (for --json) and the files written."""

    table: str
    notes: tuple[str, ...] = ()
    rows: tuple[dict[str, Any], ...] = ()
    paths: dict[str, Path] = {}
    requests: int = 0
    configs: int = 0
    seconds: float = 0.0


class StudyOutcome(Frozen):
    """What `tuner optimize` hands the CLI: where the study is, whether it has anything to
    compare (`failed`: the one line saying why not), the outputs and recommendations."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    study_name: str
    out_dir: Path
    failed: str | None = None
    paths: dict[str, Path] = {}
    recommendations: tuple[Recommendation, ...] = ()
    policy: dict[str, Any] | None = None
