"""Measure stage, one trial end to end: engine up, every concurrency level, engine down.

`measure` is the single place where an engine and the load generator meet. It raises a
TrialFailed subclass when the trial cannot be measured; `measure_outcome` turns that into
data (a TrialOutcome), which is what executors run, inline or in a Ray worker.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from tuner.errors import EngineDied, MeasurementFailed, TrialFailed
from tuner.measure import loadgen, metrics
from tuner.measure.engine import Engine, log_tail
from tuner.records import (
    BenchResult,
    EngineSpec,
    Failure,
    LevelMetrics,
    MeasureSettings,
    Prompt,
    RequestRecord,
    TrialConfig,
    TrialOutcome,
    Workload,
)

MAX_FAILED_FRACTION = 0.2


def measure(
    engine_spec: EngineSpec, config: TrialConfig, workload: Workload, settings: MeasureSettings,
    *, trial_dir: Path, progress: Callable[[str], None] | None = None, show_bar: bool = False,
) -> BenchResult:
    """Launch one engine for `config` and measure every level of `settings` against it."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda _msg: None)
    levels: list[LevelMetrics] = []
    records_path = trial_dir / "requests.jsonl"
    records_path.unlink(missing_ok=True)
    pool = _PromptPool(workload.prompts)
    with Engine(engine_spec, config, log_path=trial_dir / "engine.log") as eng:
        say(f"engine ready in {eng.info.start_s:.0f} s")
        for c in settings.concurrencies:
            level = _measure_level(eng, workload, settings, c, records_path, show_bar, pool)
            say(f"c={c}: {level.output_throughput:.1f} tok/s, mean TPOT "
                f"{level.mean_tpot_ms:.1f} ms, {level.completed}/{level.num_requests} ok")
            levels.append(level)
        info = eng.info
    return BenchResult(config=config, engine=info, levels=tuple(levels))


class _PromptPool:
    """Hands out prompts in order and never twice while the pool lasts: an engine that learns
    from earlier requests (suffix decoding, prefix caching) must not see a prompt again."""

    def __init__(self, prompts: tuple[Prompt, ...]) -> None:
        self.prompts, self.cursor = prompts, 0

    def take(self, k: int) -> tuple[list[Prompt], int]:
        n = len(self.prompts)
        out = [self.prompts[(self.cursor + i) % n] for i in range(k)]
        reused = max(0, min(k, self.cursor + k - n))
        self.cursor += k
        return out, reused


def _measure_level(eng: Engine, workload: Workload, settings: MeasureSettings, c: int,
                   records_path: Path, show_bar: bool, pool: _PromptPool) -> LevelMetrics:
    spec = workload.spec
    n = settings.requests_for(c, spec.num_prompts)
    # Warm-up: one short request per slot, excluded from figures.
    warm_prompts, _ = pool.take(c)
    warm = [Prompt(prompt=p.prompt, prompt_len=p.prompt_len,
                   output_len=min(p.output_len, settings.warmup_output_len))
            for p in warm_prompts]
    measured, reused = pool.take(n)
    common = dict(api_key=eng.api_key, model=eng.spec.served_model_name,
                  temperature=spec.temperature, ignore_eos=spec.ignore_eos,
                  request_timeout_s=eng.spec.request_timeout_s,
                  level_timeout_s=eng.spec.level_timeout_s)
    warm_records, _ = _run(eng, warm, c, warmup=True, common=common, bar=None)
    before = _scrape(eng)
    bar = _bar(n, f"c={c}") if show_bar else None
    records, wall_s = _run(eng, measured, c, warmup=False, common=common, bar=bar)
    if bar is not None:
        bar.close()
    after = _scrape(eng)
    with open(records_path, "a") as f:
        for r in warm_records + records:
            f.write(r.model_dump_json() + "\n")
    level = metrics.level_metrics(records, concurrency=c, duration_s=wall_s,
                                  warmup_requests=len(warm), counts=metrics.delta(before, after))
    level = level.model_copy(update={"reused_prompts": reused})
    if level.failed > MAX_FAILED_FRACTION * level.num_requests:
        raise MeasurementFailed(
            f"c={c}: {level.failed} of {level.num_requests} requests failed "
            f"(first error: {level.errors[0] if level.errors else '?'})",
            log_tail=log_tail(eng.log_path))
    return level


def _run(eng: Engine, prompts: list[Prompt], c: int, *, warmup: bool, common: dict,
         bar) -> tuple[list[RequestRecord], float]:
    records, wall_s = loadgen.run_requests(
        eng.url, prompts, concurrency=c, warmup=warmup,
        on_done=(lambda _r: bar.update(1)) if bar is not None else None, **common)
    if not eng.alive():
        raise EngineDied(f"vLLM exited during the c={c} {'warm-up' if warmup else 'level'}",
                         log_tail=log_tail(eng.log_path))
    return records, wall_s


def _scrape(eng: Engine):
    try:
        return metrics.scrape(eng.url, eng.api_key)
    except OSError as e:
        if not eng.alive():
            raise EngineDied("vLLM exited while its /metrics were read",
                             log_tail=log_tail(eng.log_path)) from None
        raise MeasurementFailed(f"/metrics could not be read: {e}",
                                log_tail=log_tail(eng.log_path)) from None


def _bar(total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="req", leave=False, file=sys.stderr)


def failure_of(exc: TrialFailed) -> Failure:
    """A TrialFailed as data: what is stored with the FAIL trial."""
    return Failure(reason=str(exc), kind=exc.kind, log_tail=exc.log_tail[-4000:],
                   at=time.strftime("%Y-%m-%dT%H:%M:%S"))


def measure_outcome(engine_spec: EngineSpec, config: TrialConfig, workload: Workload,
                    settings: MeasureSettings, trial_dir: str) -> TrialOutcome:
    """One trial as data, a result or a failure, never an exception; runs in a Ray worker too.

    Ray sets CUDA_VISIBLE_DEVICES in the worker; the engine inherits it. We record it so a
    user can check that each engine got its own GPU.
    """
    import os

    where = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
             "host": os.uname().nodename, "ran_from": time.time()}
    try:
        result = measure(engine_spec, config, workload, settings, trial_dir=Path(trial_dir))
    except TrialFailed as e:
        return TrialOutcome(failure=failure_of(e), **where, ran_to=time.time())
    return TrialOutcome(result=result, **where, ran_to=time.time())
