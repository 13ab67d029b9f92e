"""What is asked: the workload and its prompts, the engine, one candidate config, how each
level is driven and the requests every launch of a study sends."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.records.migrations import RETIRED_SETTINGS


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
    top_p: float = Field(1.0, exclude_if=lambda v: v == SAMPLING_OFF["top_p"])
    top_k: int = Field(0, exclude_if=lambda v: v == SAMPLING_OFF["top_k"])  # vLLM: -1 is off too
    min_p: float = Field(0.0, exclude_if=lambda v: v == SAMPLING_OFF["min_p"])
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


# WorkloadSpec's sampling parameters besides the temperature, at the values that turn them off.
SAMPLING_OFF: dict[str, float] = {"top_p": 1.0, "top_k": 0, "min_p": 0.0}


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
    # Fork each engine from a launcher that imported vLLM once (tuner.measure.launcher) where
    # vLLM runs from this Python; False: every engine is a new interpreter (`--no-fast-start`).
    fast_start: bool = True


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
        """The same config drafting `k` tokens a step, with no K schedule; a synthetic
        acceptance profile is cut (or its last rate repeated) to `k` positions, as vLLM wants
        one rate per drafted position."""
        if not self.speculative_config:
            raise ValueError("a config without speculation has no K")
        spec = {**self.speculative_config_without_k(), "num_speculative_tokens": int(k)}
        rates = spec.get("synthetic_acceptance_rates")
        if rates:
            spec["synthetic_acceptance_rates"] = (list(rates) + [rates[-1]] * int(k))[:int(k)]
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
    # `--sample-prompts`: prompts of the workload, beyond every level's, that the study's
    # first baseline launch also sends (after its levels, at SAMPLE_CONCURRENCY or the highest
    # level), so the replay predicts every config over far more prompts than a launch measures.
    sample_prompts: int = Field(128, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _drop_window_growth(cls, data: Any) -> Any:
        """Settings stored while windows drew new prompts until they agreed carry the time cap
        and the minimum window time of that protocol; they no longer mean anything."""
        if isinstance(data, dict) and ("stability_max_s" in data or "min_window_s" in data):
            return {k: v for k, v in data.items() if k not in RETIRED_SETTINGS}
        return data

    def pool_size(self, num_prompts: int) -> int:
        """Prompts needed so no level (nor its warm-up) repeats a prompt within one engine,
        with the workload sample and, beside it, as many again as the levels send: the
        sample never takes the prompts an out-of-sample check (`tuner verify`) needs."""
        levels = self.level_requests(num_prompts)
        return levels + self.sample_prompts + (levels if self.sample_prompts else 0)

    def level_requests(self, num_prompts: int) -> int:
        """Requests the levels send in one launch, warm-ups included."""
        return sum(self.requests_for(c, num_prompts) + self.warmups_for(c)
                   for c in self.concurrencies)

    def sample_concurrency(self) -> int:
        """The concurrency the workload sample is sent at: its tokens are all that is kept,
        so as many in flight as the highest level, or SAMPLE_CONCURRENCY where that is more."""
        return max(SAMPLE_CONCURRENCY, *self.concurrencies)

    def warmups_for(self, concurrency: int) -> int:
        """Short warm-up requests sent before the level, excluded from its figures."""
        return concurrency if self.num_warmups is None else self.num_warmups

    def requests_for(self, concurrency: int, num_prompts: int) -> int:
        """Enough requests that each of the c slots serves several, and every prompt once."""
        if self.num_requests:
            return self.num_requests
        return max(num_prompts, self.requests_per_slot * concurrency)


# The workload sample's lowest concurrency (MeasureSettings.sample_concurrency).
SAMPLE_CONCURRENCY = 16


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
    # The workload sample (MeasureSettings.sample_prompts): prompt indices no level sends,
    # sent once by the study's first baseline launch at `sample_concurrency`; the launches
    # that do not send it carry a schedule `without_sample()`.
    sample: tuple[int, ...] = ()
    sample_concurrency: int | None = None

    def without_sample(self) -> RequestSchedule:
        return self.model_copy(update={"sample": ()})

    def level(self, concurrency: int) -> LevelRequests:
        for lv in self.levels:
            if lv.concurrency == concurrency:
                return lv
        raise KeyError(f"the request schedule has no level {concurrency}")

    @property
    def requests(self) -> int:
        """Every request one launch sends, warm-ups included."""
        return sum(len(lv.warmups) + len(lv.measured) for lv in self.levels)
