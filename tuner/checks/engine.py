"""Input checks, the engine: the engine to launch resolved from its options (the user's
model, or the embedded default with the CPU engine's flags on a machine without a GPU), and
the levels against the engine's --max-num-seqs and this process's open-file limit. Nothing
here starts an engine or probes the machine: tuner.api hands in what the machine is."""

from __future__ import annotations

import os
import resource
from collections.abc import Sequence
from pathlib import Path

from tuner import engine_cmdline
from tuner.errors import ConfigError
from tuner.records.configs import EngineSpec
from tuner.records.options import EngineOptions

OPEN_FILES_SPARE = 64  # journal, logs, engine pipes, the tokenizer's files


# Levels against the engine and against this process's open-file limit.
def check_levels_fit_engine(levels: Sequence[int], engine: EngineSpec, *,
                            flag: str = "--concurrency") -> None:
    """Refuse a level above the engine's --max-num-seqs: vLLM would queue the extra requests,
    and the level would measure queueing under a concurrency label. Refused rather than capped,
    because a capped level would be a different experiment under the asked-for name."""
    seqs = engine_cmdline.engine_setting(engine, "max_num_seqs")
    if seqs is not None and levels and max(levels) > seqs:
        raise ConfigError(
            f"{flag} {max(levels)}: above the engine's --max-num-seqs {seqs}, so vLLM would "
            f"run only {seqs} at once and queue the rest: the level would measure queueing, not "
            f"concurrency. Use levels of at most {seqs}, or raise --max-num-seqs in "
            f"--engine-args.")


def ensure_open_files(max_level: int, *, flag: str = "--concurrency") -> None:
    """The driver opens one socket per slot: raise the soft open-file limit when the hard one
    allows (as vLLM's server does), else refuse before an engine is launched for nothing."""
    need = max_level + OPEN_FILES_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return
    raise ConfigError(f"{flag} {max_level}: needs about {need} open files (a socket per slot), "
                      f"but this process may open only {hard} (`ulimit -Hn`). Raise the limit "
                      f"(ulimit -n {need}) or use levels of at most {hard - OPEN_FILES_SPARE}.")


# The engine: the user's model, or the embedded default on this machine.
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "auto"}
# Measured (benchmarks/cpu_engine_modes.py): eager start-up is far shorter on 2 cores, and the
# compiled graph buys little for a 135M model on the CPU.
CPU_DEFAULT_ARGS = ("--enforce-eager", "--max-model-len", "4096")


def engine_spec(options: EngineOptions, *, gpu: bool, embedded_model: str | None
                ) -> EngineSpec:
    """The engine to launch: the user's model (checked), or the embedded default
    (`embedded_model`, its folder, which tuner.api resolves) with the CPU engine's flags and
    environment where there is no GPU (`gpu`, this machine's, also from tuner.api)."""
    default_args: tuple[str, ...] = ()
    model = options.model
    if model is None:
        model_path = str(embedded_model)
        if not gpu:
            default_args = CPU_DEFAULT_ARGS
    else:
        model_path = model
        looks_local = model.startswith((".", "/", "~")) or os.path.exists(model)
        if looks_local and not Path(model).expanduser().exists():
            raise ConfigError(f"Model path '{model}' does not exist. Pass the folder of a Hugging "
                              f"Face checkpoint, a hub id (online machines), or omit --model for "
                              f"the embedded SmolLM2-135M-Instruct.")
        if looks_local:
            model_path = str(Path(model).expanduser().resolve())
    env = {} if gpu else dict(CPU_ENV)
    env.update(options.env)
    return EngineSpec(
        model=model_path, model_name=model or engine_cmdline.EMBEDDED_HUB_ID,
        vllm_cmd=options.vllm_cmd, extra_args=default_args + options.extra_args, env=env,
        device="cuda" if gpu else "cpu", tokenizer=options.tokenizer,
        ready_timeout_s=options.ready_timeout_s, request_timeout_s=options.request_timeout_s,
        level_timeout_s=options.level_timeout_s, fast_start=options.fast_start)


def live_engine_options(options: EngineOptions) -> None:
    """`--base-url`: a server already running, launched by nobody here, so the options that
    say how to launch one would be ignored; refused instead."""
    given = [f for f, v in (("--vllm-cmd", options.vllm_cmd), ("--engine-args",
                                                              options.extra_args),
                            ("--engine-env", options.env)) if v]
    if given:
        raise ConfigError(f"--base-url {options.base_url} with {', '.join(given)}: the tuner "
                          f"starts no engine there, so these would be ignored. Drop them, or "
                          f"drop --base-url to let the tuner launch vLLM with them.")
