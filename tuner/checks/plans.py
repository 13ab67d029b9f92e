"""Input checks across options: an options record resolved on the engine (`bench_options`,
`optimize_options`) before anything is printed or created, with the defaults that follow from
the engine and the levels (the target level, the study's name, the aligned baseline, the
policy ladder)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner import engine_cmdline
from tuner.checks.bounds import MAX_REQUESTS_PER_TRIAL, show
from tuner.checks.converters import name_value_pairs
from tuner.checks.engine import check_levels_fit_engine, ensure_open_files
from tuner.checks.files import output_dir
from tuner.checks.spec_config import vllm_accepts
from tuner.errors import ConfigError
from tuner.records.configs import (
    SAMPLING_OFF,
    AlignedBaseline,
    EngineSpec,
    MeasureSettings,
    TrialConfig,
    WorkloadSpec,
)
from tuner.records.options import BenchOptions, OptimizeOptions, OptimizePlan, PolicyOptions


def check_requests(measure: MeasureSettings, num_prompts: int) -> None:
    """Bound the requests one trial sends (all levels and warm-ups, and the workload sample
    the first baseline sends after them; not the prompts kept back for tuner verify): each is
    a prompt prepared in the driver up front and a record kept in memory and on disk."""
    total = measure.level_requests(num_prompts) + measure.sample_prompts
    if total > MAX_REQUESTS_PER_TRIAL:
        levels = ",".join(map(str, measure.concurrencies))
        raise ConfigError(
            f"--concurrency {levels} asks for {total} requests per trial "
            f"(--num-requests or --requests-per-slot x level, plus --num-warmups, by default "
            f"one warm-up per slot); at "
            f"most {MAX_REQUESTS_PER_TRIAL} (each is a prompt prepared in the driver and a "
            f"record kept). Lower --requests-per-slot or set --num-requests.")


# The search's defaults: the target level, the study's name, the aligned baseline, the ladder.
def target_concurrency(target: int | None, levels: Sequence[int]) -> int:
    """The level the objectives are read at: the first level unless given, and one of them."""
    if target is None:
        return levels[0]
    if target not in levels:
        raise ConfigError(f"--target-concurrency {target} is not among --concurrency "
                          f"{','.join(map(str, levels))}; add it there.")
    return target


def study_name(name: str) -> str:
    if not name or not all(ch.isalnum() or ch in "-_." for ch in name):
        raise ConfigError(f"--study-name '{name}': use letters, digits, '-', '_' and '.' only.")
    return name


ALIGNED_MODES = ("auto", "off")


def aligned_baseline(engine_args: str | None, env_items: Sequence[str]) -> AlignedBaseline:
    """`--aligned-baseline` and `--aligned-baseline-env` as what the search tells apart:

    - "auto" (neither option given, or `--aligned-baseline auto`): the search reads the first
      speculative trial's engine path and measures a baseline on it only where it differs;
    - "off": no aligned baseline;
    - a TrialConfig (explicit engine args such as `--aligned-baseline '--no-async-scheduling'`,
      and/or `--aligned-baseline-env NAME=VALUE`): a baseline with exactly those knobs.
    """
    mode = engine_args.strip().lower() if engine_args is not None else None
    if mode in ALIGNED_MODES:
        if env_items:
            why = ("auto finds the path's settings itself" if mode == "auto" else
                   "off measures no aligned baseline")
            raise ConfigError(
                f"--aligned-baseline {mode} with --aligned-baseline-env "
                f"{show(env_items[0], quote=True)}: the environment goes with explicit engine "
                f"args only ({why}). Give the args yourself, e.g. --aligned-baseline "
                f"'--no-async-scheduling' --aligned-baseline-env VLLM_USE_V2_MODEL_RUNNER=0, "
                f"or drop --aligned-baseline-env.")
        return mode  # type: ignore[return-value]
    if engine_args is None and not env_items:
        return "auto"
    flags = engine_cmdline.split(engine_args, flag="--aligned-baseline")
    eng_args: dict[str, Any] = {f.name.replace("-", "_"): True if f.value is None else f.value
                                for f in engine_cmdline.parse_flags(flags)}
    env = name_value_pairs(env_items, flag="--aligned-baseline-env",
                           example="VLLM_USE_V2_MODEL_RUNNER=0")
    if not eng_args and not env:
        raise ConfigError(
            f"--aligned-baseline {show(engine_args or '', quote=True)}: no engine flag and no "
            f"--aligned-baseline-env, so it would be the plain baseline again. Use auto (the "
            f"default: the tuner finds the speculative path's flags), off, or the flags as one "
            f"quoted string, e.g. --aligned-baseline '--no-async-scheduling'.")
    return TrialConfig(engine_args=eng_args, engine_env=env)


def ladder(policy: PolicyOptions) -> tuple[int, ...]:
    """The policy's concurrency ladder: as given, or powers of two up to --ladder-max."""
    if policy.ladder:
        return tuple(policy.ladder)
    top = policy.ladder_max
    out = tuple(2 ** i for i in range(0, int(math.log2(top)) + 1))
    return out if out[-1] == top else out + (top,)


def ladder_fits(policy: PolicyOptions, engine: EngineSpec) -> None:
    """The ladder's top against the engine and the open-file limit, as --concurrency's levels
    are (refused before the search, not after it)."""
    top, flag = ((max(policy.ladder), "--ladder") if policy.ladder else
                 (policy.ladder_max, "--ladder-max"))
    check_levels_fit_engine([top], engine, flag=flag)
    ensure_open_files(top, flag=flag)


def check_sampling(workload: WorkloadSpec, *, speculative: bool = False) -> None:
    """--top-p, --top-k and --min-p act only when sampling (vLLM resets them at temperature 0,
    so a study would differ in name only); vLLM refuses min_p with speculative decoding."""
    flags = {k: f"--{k.replace('_', '-')}" for k in SAMPLING_OFF}
    given = [f"{flags[k]} {v:g}" for k, v in workload.sampling.items() if k in flags]
    if given and not workload.temperature:
        raise ConfigError(f"{', '.join(given)} at --temperature 0: vLLM samples greedily there "
                          f"and ignores {'them' if len(given) > 1 else 'it'}. Set --temperature "
                          f"above 0 (e.g. 0.8), or drop {', '.join(g.split()[0] for g in given)}.")
    if speculative and workload.min_p:
        raise ConfigError(f"--min-p {workload.min_p:g}: vLLM refuses min_p with speculative "
                          f"decoding (every request of a speculative config would fail). Drop "
                          f"--min-p, or use --top-p / --top-k to trim the distribution.")


# An options record resolved: the checks across its options and against the engine.
def measurement(workload: WorkloadSpec, settings: MeasureSettings, engine: EngineSpec) -> None:
    """What bench and optimize measure against the engine and this process's limits."""
    check_sampling(workload)
    check_requests(settings, workload.num_prompts)
    check_levels_fit_engine(settings.concurrencies, engine)
    ensure_open_files(max(settings.concurrencies))


def bench_options(options: BenchOptions, engine: EngineSpec) -> None:
    """Every input of `options` checked on the resolved `engine`. The output folder is
    checked, not kept: tuner.api makes it once the dataset has loaded too."""
    config = options.config
    if engine.base_url and config != TrialConfig():
        given = [f for f, v in (("--speculative-config (or --acceptance-profile)",
                                 config.speculative_config), ("--engine-args", config.engine_args),
                                ("--engine-env", config.engine_env)) if v]
        raise ConfigError(f"--base-url {engine.base_url} with {', '.join(given)}: a running "
                          f"server keeps the config it was started with, and its environment. "
                          f"Drop them to measure it as it is, or drop --base-url to let the "
                          f"tuner launch vLLM with this config.")
    if config.speculative_config:
        vllm_accepts(config.speculative_config, engine, where="--speculative-config")
    measurement(options.workload, options.settings, engine)
    check_sampling(options.workload, speculative=bool(config.speculative_config))
    output_dir(options.out_dir, keep=False)


def optimize_options(options: OptimizeOptions, engine: EngineSpec) -> OptimizePlan:
    """The plan of `options` on the resolved `engine`: every input checked and every default
    that follows from the engine or the levels filled in (the study's name and folder, the
    target level, the aligned baseline). The folder is checked, not kept: tuner.api makes it
    and announces the study once the space, objectives, sampler and dataset have passed."""
    if engine.base_url:
        raise ConfigError(f"--base-url {engine.base_url}: a study launches one engine per "
                          f"config, so it cannot use a server that is already running. Measure "
                          f"that server with `tuner bench --base-url`, or drop --base-url.")
    measurement(options.workload, options.settings, engine)
    check_sampling(options.workload, speculative=True)  # every trial but the baselines
    if options.policy is not None:
        ladder_fits(options.policy, engine)
    target = target_concurrency(options.target_concurrency, options.settings.concurrencies)
    name = study_name(options.study_name or f"{options.workload.name}-{Path(engine.model).name}")
    flags = options.aligned_baseline
    return OptimizePlan(options=options, engine=engine, target_concurrency=target,
                        study_name=name,
                        aligned_baseline=aligned_baseline(flags.engine_args, flags.env),
                        out_dir=output_dir(options.out_dir or Path("outputs") / name,
                                           keep=False))
