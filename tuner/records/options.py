"""The options of each command: one record per command, built once from the command line."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tuner.records.configs import (
    LEVEL_TIMEOUT_S,
    READY_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    AlignedBaseline,
    EngineSpec,
    MeasureSettings,
    TrialConfig,
    WorkloadSpec,
)

if TYPE_CHECKING:
    from argparse import Namespace


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
    fast_start: bool = True  # fork engines from a launcher that imported vLLM once

    @classmethod
    def from_cli_args(cls, args: Namespace) -> EngineOptions:
        return cls(model=args.model, tokenizer=args.tokenizer, vllm_cmd=args.vllm_cmd or (),
                   extra_args=args.engine_args or (), env=dict(args.engine_env),
                   ready_timeout_s=args.ready_timeout, request_timeout_s=args.request_timeout,
                   level_timeout_s=args.level_timeout, base_url=getattr(args, "base_url", None),
                   fast_start=getattr(args, "fast_start", cls.fast_start))


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
                           stability_pct=args.stability, allow_repeats=args.allow_repeats,
                           sample_prompts=args.sample_prompts)


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    """`tuner bench`: one config measured at every level of `settings` in one engine launch;
    `metadata` (`--metadata KEY=VALUE`) is kept in result.json for the user's records.
    `--engine-env` belongs to `config` (its label, result.json's config.engine_env): in a
    study it is every engine's environment (EngineOptions.env), but bench has one engine,
    and what it sets is part of what was measured."""

    workload: WorkloadSpec
    engine: EngineOptions = field(default_factory=EngineOptions)
    settings: MeasureSettings = field(default_factory=MeasureSettings)
    config: TrialConfig = field(default_factory=TrialConfig)
    draft_model: str | None = None  # --draft-model: the `model` of config's drafter method
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
                   settings=_measure_from(args), config=config,
                   draft_model=args.draft_model, out_dir=out, metadata=dict(args.metadata))


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
class VerifyOptions:
    """`tuner verify STUDY_DIR`: each level's recommended config (or, where speculation stays
    off, the fastest the verdict names) and the plain baseline, `launches` times each,
    interleaved, on prompts of the study's workload it never sent."""

    study_dir: Path
    storage_url: str | None = None
    study_name: str | None = None
    launches: int = 3
    num_prompts: int | None = None  # measured requests per level; None: as many as the study's

    @classmethod
    def from_cli_args(cls, args: Namespace) -> VerifyOptions:
        return cls(study_dir=args.study_dir, storage_url=args.storage,
                   study_name=args.study_name, launches=args.launches,
                   num_prompts=args.verify_num_prompts)


@dataclass(frozen=True, kw_only=True)
class AlignedBaselineFlags:
    """`--aligned-baseline` and `--aligned-baseline-env` as typed; tuner.checks reads them into
    an AlignedBaseline (the two are checked together)."""

    engine_args: str | None = None
    env: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class OptimizeOptions:
    """`tuner optimize`: the search over a space, and (`policy`) the load-aware policy after it,
    as the user asked for them. tuner.api resolves it once into an OptimizePlan, which the
    search reads."""

    workload: WorkloadSpec
    engine: EngineOptions = field(default_factory=EngineOptions)
    settings: MeasureSettings = field(default_factory=MeasureSettings)
    space_name: str = "default"
    draft_model: str | None = None  # --draft-model; None: the space's own
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
    aligned_baseline: AlignedBaselineFlags = field(default_factory=AlignedBaselineFlags)
    metadata: Mapping[str, str] = field(default_factory=dict)
    policy: PolicyOptions | None = None  # None: no policy step
    report: bool = True  # write report.html, plots and recommendation.json

    @classmethod
    def from_cli_args(cls, args: Namespace) -> OptimizeOptions:
        return cls(
            workload=_workload_from(args), engine=EngineOptions.from_cli_args(args),
            settings=_measure_from(args), space_name=args.space, draft_model=args.draft_model,
            study_name=args.study_name,
            out_dir=args.output_dir, storage_url=args.storage, n_trials=args.n_trials,
            timeout_s=args.timeout,
            # A sampler named on the command line is a request for the Optuna search.
            strategy="optuna" if args.strategy == "auto" and args.sampler else args.strategy,
            sampler=args.sampler or cls.sampler, seed=args.sampler_seed, objectives=args.objectives,
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


@dataclass(frozen=True, kw_only=True)
class OptimizePlan:
    """`tuner optimize` as it runs: the user's options and, beside them, what tuner.api
    resolved from them (tuner.checks.optimize_options): the engine on this machine, the
    aligned baseline the search tells apart, the study's name and folder, the target level.
    The search reads this record; nothing in it is resolved twice."""

    options: OptimizeOptions
    engine: EngineSpec
    aligned_baseline: AlignedBaseline
    study_name: str
    out_dir: Path
    target_concurrency: int
