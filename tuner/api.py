"""The orchestrator: bench(), optimize(), report(), policy() read as the pipeline.

workload -> search space -> trial config -> engine -> load -> metrics -> storage -> analysis
-> outputs. Every other module is one stage; only this one calls them in order.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

from tuner import workloads
from tuner.errors import ConfigError
from tuner.records import BenchResult, EngineSpec, MeasureSettings, TrialConfig, WorkloadSpec

CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "auto"}
# Measured (benchmarks/startup_mode.py): eager start-up is far shorter on 2 cores, and the
# compiled graph buys little for a 135M model on the CPU.
CPU_DEFAULT_ARGS = ("--enforce-eager", "--max-model-len", "4096")


def resolve_engine(
    *, model: str | None, vllm_cmd: str | None = None, extra_args: str | None = None,
    tokenizer: str | None = None, env: dict[str, str] | None = None,
    ready_timeout_s: float = 900.0, request_timeout_s: float = 300.0,
    level_timeout_s: float = 3600.0,
) -> EngineSpec:
    """The engine to launch: the user's model, or the embedded default on this machine."""
    from tuner import model as embedded

    gpu = embedded.has_nvidia_gpu()
    default_args: tuple[str, ...] = ()
    if model is None:
        model_path = str(embedded.embedded_model_dir())
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
    try:
        cmd = tuple(shlex.split(vllm_cmd)) if vllm_cmd else ()
        extra = tuple(shlex.split(extra_args)) if extra_args else ()
    except ValueError as e:
        raise ConfigError(f"Cannot split --vllm-cmd/--engine-args ({e}); check the quotes.") from None
    full_env = {} if gpu else dict(CPU_ENV)
    full_env.update(env or {})
    return EngineSpec(
        model=model_path, vllm_cmd=cmd, extra_args=default_args + extra, env=full_env,
        device="cuda" if gpu else "cpu", tokenizer=tokenizer, ready_timeout_s=ready_timeout_s,
        request_timeout_s=request_timeout_s, level_timeout_s=level_timeout_s)


def tokenizer_of(engine: EngineSpec) -> str:
    return engine.tokenizer or engine.model


def bench(
    *, workload: WorkloadSpec, engine: EngineSpec, config: TrialConfig,
    settings: MeasureSettings, out_dir: Path, show_bar: bool = False,
    say=print,
) -> BenchResult:
    """Measure one speculative config at every requested concurrency in one engine launch."""
    from tuner import runner

    wl = workloads.load(workload, tokenizer=tokenizer_of(engine))
    out_dir.mkdir(parents=True, exist_ok=True)
    say(f"Benchmarking {config.label()} on {Path(engine.model).name}, workload {workload.name} "
        f"({len(wl.prompts)} prompts), concurrency {','.join(map(str, settings.concurrencies))}")
    t0 = time.monotonic()
    result = runner.measure(engine, config, wl, settings, trial_dir=out_dir,
                            progress=lambda m: say("  " + m), show_bar=show_bar)
    runner.write_result(result, out_dir / "result.json", workload=workload.model_dump(),
                        workload_digest=wl.digest, settings=settings.model_dump(),
                        engine_spec=engine.model_dump(), wall_s=round(time.monotonic() - t0, 1))
    return result
