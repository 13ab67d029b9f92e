"""Fake Optuna studies written through the storage contract, for tests of analysis and reports.

The studies are real Optuna studies (in memory, or any storage passed in); only the
measurements are made up. `realistic_study` follows the figures measured on a 2-core CPU in
DESIGN.md (SmolLM2-135M, EditEval): n-gram and suffix decoding pay at concurrency 1 and fade
at 8.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState, create_trial

from tuner.records.configs import TrialConfig
from tuner.records.policy import LadderRun
from tuner.records.results import BenchResult, EngineInfo, LevelMetrics
from tuner.records.storage import StudySettings

DIRECTIONS = ["maximize", "minimize"]
METHOD_CHOICES = ["none", "ngram", "suffix"]


def fake_level(
    concurrency: int, *, output_throughput: float, mean_tpot_ms: float,
    mean_ttft_ms: float = 60.0, acceptance_length: float | None = None,
    per_position: tuple[float, ...] = (), k: int | None = None, num_requests: int = 16,
    output_len: int = 200,
) -> dict[str, Any]:
    """A LevelMetrics dump (as stored in user_attrs) with self-consistent derived fields."""
    total_out = num_requests * output_len
    duration = total_out / output_throughput
    accept: dict[str, Any] = {}
    if acceptance_length is not None:
        k = k or max(len(per_position), 1)
        drafts = total_out / acceptance_length
        accepted = drafts * (acceptance_length - 1)
        accept = dict(
            spec_decode_num_drafts=drafts, spec_decode_draft_tokens=drafts * k,
            spec_decode_accepted_tokens=accepted,
            spec_decode_acceptance_rate=100.0 * accepted / (drafts * k),
            spec_decode_acceptance_length=acceptance_length,
            spec_decode_per_position_acceptance_rates=tuple(per_position))
    lv = LevelMetrics(
        concurrency=concurrency, num_requests=num_requests, completed=num_requests, failed=0,
        warmup_requests=2, duration=duration, total_input_tokens=num_requests * 300,
        total_output_tokens=total_out, request_throughput=num_requests / duration,
        output_throughput=output_throughput,
        total_token_throughput=(total_out + num_requests * 300) / duration,
        mean_ttft_ms=mean_ttft_ms, median_ttft_ms=mean_ttft_ms * 0.95,
        p90_ttft_ms=mean_ttft_ms * 1.4, p99_ttft_ms=mean_ttft_ms * 1.8,
        mean_tpot_ms=mean_tpot_ms, median_tpot_ms=mean_tpot_ms * 0.9,
        p90_tpot_ms=mean_tpot_ms * 1.3, p99_tpot_ms=mean_tpot_ms * 1.6,
        std_tpot_ms=mean_tpot_ms * 0.2, mean_itl_ms=mean_tpot_ms * (acceptance_length or 1),
        median_itl_ms=mean_tpot_ms, p90_itl_ms=mean_tpot_ms * 2, p99_itl_ms=mean_tpot_ms * 3,
        mean_e2el_ms=mean_ttft_ms + mean_tpot_ms * (output_len - 1),
        median_e2el_ms=mean_ttft_ms + mean_tpot_ms * (output_len - 1),
        p99_e2el_ms=1.5 * (mean_ttft_ms + mean_tpot_ms * (output_len - 1)), **accept)
    return lv.model_dump(mode="json")


def fake_meta(
    *, model: str = "/models/SmolLM2-135M-Instruct", workload: str = "instructcoder",
    concurrencies: tuple[int, ...] = (1,), max_tpot_ms: float | None = None,
    max_ttft_ms: float | None = None,
) -> dict[str, Any]:
    """The study-level "tuner" attribute as tuner/search/study.py writes it."""
    wl = {"name": workload, "dataset_path": None, "num_prompts": 16, "seed": 0,
          "output_len": 200, "max_input_tokens": None, "skip_chat_template": False,
          "category": None, "random_input_len": 256, "random_output_len": 128,
          "temperature": 0.0, "ignore_eos": False}
    return {
        "workload": wl, "workload_digest": "0123456789abcdef",
        "engine_spec": {"model": model, "vllm_cmd": [], "extra_args": ["--enforce-eager"],
                        "env": {"VLLM_CPU_KVCACHE_SPACE": "2"}, "device": "cpu"},
        "settings": {"concurrencies": list(concurrencies), "num_requests": None,
                     "requests_per_slot": 4, "warmup_output_len": 16},
        "space": "default", "objectives": ["output_throughput", "mean_tpot_ms"],
        "target_concurrency": concurrencies[0],
        "constraints": {"max_tpot_ms": max_tpot_ms, "max_ttft_ms": max_ttft_ms},
        "fingerprint": {"tuner": "0.1.0", "vllm": "0.32.0", "torch": "2.13.0+cpu",
                        "device": "CPU: AMD EPYC (2 cores)", "model": model,
                        "workload": workload, "workload_digest": "0123456789abcdef",
                        "temperature": 0.0, "ignore_eos": False},
    }


def fake_settings(**meta: Any) -> StudySettings:
    """fake_meta as the record every stage reads (tuner.search.study.settings_of)."""
    return StudySettings.model_validate(fake_meta(**meta))


def fake_study(
    *, storage: Any = None, name: str = "fake-study", **meta: Any,
) -> optuna.Study:
    """An empty two-objective study carrying the "tuner" attribute (see fake_meta)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=storage, study_name=name, directions=DIRECTIONS)
    study.set_user_attr("tuner", fake_meta(**meta))
    return study


def _params(spec: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    params: dict[str, Any] = {"method": (spec or {}).get("method", "none")}
    dists: dict[str, Any] = {"method": CategoricalDistribution(
        sorted({*METHOD_CHOICES, params["method"]}))}
    for key, value in (spec or {}).items():
        if key == "method":
            continue
        name = f"{params['method']}.{key}"
        params[name] = value
        if isinstance(value, int):
            dists[name] = IntDistribution(min(0, value), max(64, value))
        elif isinstance(value, float):
            dists[name] = FloatDistribution(min(0.0, value), max(4.0, value))
        else:
            dists[name] = CategoricalDistribution([value])
    return params, dists


def _attrs(spec: dict[str, Any] | None, role: str, label: str | None,
           config: TrialConfig | None = None) -> dict[str, Any]:
    config = config or TrialConfig(speculative_config=spec)
    return {"config": config.model_dump(mode="json"), "label": label or config.label(),
            "role": role}


def add_complete(
    study: optuna.Study, spec: dict[str, Any] | None, levels: list[dict[str, Any]], *,
    role: str = "search", label: str | None = None,
    repeats: list[list[dict[str, Any]]] | None = None, duplicate_of: int | None = None,
    config: TrialConfig | None = None,
) -> int:
    """Add a COMPLETE trial measured at `levels` (fake_level dumps); returns its number.
    `config`: the stored TrialConfig when it has engine args or env (an aligned baseline)."""
    params, dists = _params(spec)
    attrs = _attrs(spec, role, label, config)
    config = attrs["config"]
    attrs["result"] = {"config": config,
                       "engine": {"start_s": 61.5, "vllm_version": "0.32.0", "details": {}},
                       "levels": levels}
    if repeats:
        attrs["repeats"] = repeats
    if duplicate_of is not None:
        attrs["duplicate_of"] = duplicate_of
    first = levels[0]
    study.add_trial(create_trial(
        state=TrialState.COMPLETE, params=params, distributions=dists, user_attrs=attrs,
        values=[first["output_throughput"], first["mean_tpot_ms"]]))
    return study.trials[-1].number


def add_failed(
    study: optuna.Study, spec: dict[str, Any] | None, *, reason: str,
    kind: str = "engine_crashed", log_tail: str = "", role: str = "search",
    label: str | None = None,
) -> int:
    """Add a FAIL trial with its failure record; returns its number."""
    params, dists = _params(spec)
    attrs = _attrs(spec, role, label)
    attrs["failure"] = {"reason": reason, "kind": kind, "log_tail": log_tail}
    study.add_trial(create_trial(state=TrialState.FAIL, params=params, distributions=dists,
                                 user_attrs=attrs))
    return study.trials[-1].number


def add_running(study: optuna.Study, spec: dict[str, Any] | None, *,
                role: str = "search") -> int:
    """Add a RUNNING trial (a study in progress, or one whose driver was killed)."""
    params, dists = _params(spec)
    study.add_trial(create_trial(state=TrialState.RUNNING, params=params, distributions=dists,
                                 user_attrs=_attrs(spec, role, None)))
    return study.trials[-1].number


def ngram(k: int, lo: int = 2, hi: int = 5) -> dict[str, Any]:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo,
            "prompt_lookup_max": hi}


def suffix(k: int, depth: int = 24) -> dict[str, Any]:
    return {"method": "suffix", "num_speculative_tokens": k,
            "suffix_decoding_max_tree_depth": depth, "suffix_decoding_max_spec_factor": 1.0,
            "suffix_decoding_min_token_prob": 0.1}


def _decay(k: int, first: float, ratio: float) -> tuple[float, ...]:
    return tuple(round(first * ratio**i, 3) for i in range(k))


def realistic_study(*, storage: Any = None, name: str = "realistic",
                    with_failures: bool = True, **meta: Any) -> optuna.Study:
    """Baseline, n-gram and suffix trials at concurrency 1 and 8 (DESIGN.md's CPU figures),
    with one re-measured config, a duplicate, a failed and a running trial."""
    study = fake_study(storage=storage, name=name, concurrencies=(1, 8), **meta)

    def levels(t1: float, t8: float, acc: float | None = None, k: int | None = None,
               first: float = 0.7, ratio: float = 0.75) -> list[dict[str, Any]]:
        pos = _decay(k, first, ratio) if k else ()
        out = []
        for c, tput in ((1, t1), (8, t8)):
            tpot = 1000.0 * c / tput * 0.92  # closed loop: tokens/s per slot ~ 1000/TPOT
            out.append(fake_level(c, output_throughput=tput, mean_tpot_ms=tpot,
                                  mean_ttft_ms=45.0 * c ** 0.5, acceptance_length=acc,
                                  per_position=pos, k=k))
        return out

    add_complete(study, None, levels(22.8, 111.0), role="baseline",
                 repeats=[levels(22.1, 109.5), levels(23.3, 112.4)])
    add_complete(study, ngram(5), levels(47.7, 113.6, 3.31, 5), role="start_point",
                 repeats=[levels(46.9, 112.0, 3.30, 5), levels(48.4, 114.9, 3.33, 5)])
    add_complete(study, suffix(8), levels(57.4, 159.7, 3.9, 8, 0.78, 0.82), role="start_point")
    add_complete(study, ngram(3, 1, 3), levels(38.0, 118.0, 2.4, 3, 0.62, 0.7))
    add_complete(study, ngram(8, 2, 6), levels(44.1, 96.0, 3.5, 8, 0.66, 0.78))
    add_complete(study, ngram(2, 1, 4), levels(31.5, 115.0, 1.9, 2, 0.55, 0.7))
    add_complete(study, suffix(16, 32), levels(55.0, 150.2, 4.4, 16, 0.8, 0.86))
    add_complete(study, suffix(4, 16), levels(49.0, 141.0, 2.9, 4, 0.75, 0.8))
    add_complete(study, ngram(5), levels(47.7, 113.6, 3.31, 5), duplicate_of=1)
    if with_failures:
        add_failed(study, suffix(32, 64), kind="engine_crashed",
                   reason="vLLM exited with status 1 after 41 s, before /health answered: "
                          "ValueError: num_speculative_tokens <script>alert(1)</script> too big",
                   log_tail="INFO starting\nTraceback (most recent call last):\n"
                            "ValueError: <b>bad</b> & worse")
        add_running(study, ngram(6, 3, 6))
    return study


# The H200 study of issue 16 (vLLM 0.26, SmolLM2-135M): the plain baseline's throughput per
# level, what the n-gram engine path alone costs, and what speculation gains on top of it.
H200_PLAIN = {1: 517.0, 8: 3073.0, 32: 7851.0}
H200_PATH = {1: 0.83, 8: 1.06, 32: 0.92}
H200_GAIN = {"k3": {1: 1.28, 8: 0.85, 32: 0.66}, "k5": {1: 1.06, 8: 0.92, 32: 0.89}}
ALIGNED = TrialConfig(engine_args={"async_scheduling": False},
                      engine_env={"VLLM_USE_V2_MODEL_RUNNER": "0"})


def aligned_study(*, storage: Any = None, name: str = "aligned", **meta: Any) -> optuna.Study:
    """Issue 16's H200 figures with an aligned baseline: plain and aligned baselines and
    n-gram k3 (window 1-3) measured three times each, n-gram k5 (window 2-5) once; the user
    named the embedded default, which resolved to a cache path."""
    study = fake_study(storage=storage, name=name, concurrencies=(1, 8, 32),
                       model="/root/.cache/spec-tuner/models/smollm2-135m-instruct-bf16", **meta)
    attrs = dict(study.user_attrs["tuner"])
    attrs["engine_spec"] = {**attrs["engine_spec"],
                            "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
                            "extra_args": ["--max-model-len", "4096", "--enforce-eager"]}
    study.set_user_attr("tuner", attrs)

    def levels(factor: dict[int, float], acc: float | None = None, k: int | None = None,
               jitter: float = 1.0) -> list[dict[str, Any]]:
        return [fake_level(c, output_throughput=H200_PLAIN[c] * factor[c] * jitter,
                           mean_tpot_ms=1000.0 * c / (H200_PLAIN[c] * factor[c] * jitter),
                           acceptance_length=acc, k=k) for c in (1, 8, 32)]

    one = dict.fromkeys(H200_PLAIN, 1.0)
    k3 = {c: H200_PATH[c] * H200_GAIN["k3"][c] for c in H200_PLAIN}
    k5 = {c: H200_PATH[c] * H200_GAIN["k5"][c] for c in H200_PLAIN}
    add_complete(study, None, levels(one), role="baseline",
                 repeats=[levels(one, jitter=0.98), levels(one, jitter=1.02)])
    add_complete(study, None, levels(H200_PATH), role="aligned_baseline", config=ALIGNED,
                 repeats=[levels(H200_PATH, jitter=0.97), levels(H200_PATH, jitter=1.03)])
    add_complete(study, ngram(3, 1, 3), levels(k3, 2.9, 3),
                 repeats=[levels(k3, 2.9, 3, 0.99), levels(k3, 2.9, 3, 1.01)])
    add_complete(study, ngram(5, 2, 5), levels(k5, 3.2, 5))
    return study


def ladder_runs(key: str, figures: dict[int, list[float]]) -> list[LadderRun]:
    """Stored policy runs of one config (tuner.records.policy.LadderRun), one per repeat, with
    these output throughputs per level (a level drops out of a repeat its list is too short
    for); mean TPOT 1000 / throughput, request throughput a tenth of it."""
    n = max(len(xs) for xs in figures.values())
    return [LadderRun(key=key, result=BenchResult(
        config=TrialConfig(), engine=EngineInfo(start_s=1.0), levels=tuple(
            LevelMetrics.model_validate({**fake_level(c, output_throughput=xs[i],
                                                      mean_tpot_ms=1000.0 / xs[i]),
                                         "request_throughput": xs[i] / 10})
            for c, xs in figures.items() if i < len(xs))))
        for i in range(n)]
