"""Runner stage: one trial end to end (engine up, every concurrency level, engine down), and
the Ray fan-out that runs several trials at once, one per GPU set.

`measure` is the single place where an engine and the load generator meet. It raises a
TrialFailed subclass when the trial cannot be measured; callers record that as data.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tuner import loadgen, metrics
from tuner.engine import Engine, log_tail
from tuner.errors import EngineDied, MeasurementFailed, TrialFailed
from tuner.records import (BenchResult, EngineSpec, LevelMetrics, MeasureSettings, Prompt,
                           RequestRecord, TrialConfig, Workload)

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


def write_result(result: BenchResult, path: Path, **extra: object) -> None:
    """Atomic JSON write: a killed process never leaves a half-written result behind."""
    payload = {**extra, **json.loads(result.model_dump_json())}
    write_json_atomic(path, payload)


def write_json_atomic(path: Path, payload: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(payload, indent=2, default=str))
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)  # gone after a rename; after a failure, not left behind


def failure_record(exc: TrialFailed) -> dict:
    return {"reason": str(exc), "kind": exc.kind, "log_tail": exc.log_tail[-4000:],
            "at": time.strftime("%Y-%m-%dT%H:%M:%S")}


# --- fan-out ---------------------------------------------------------------------------------
def measure_outcome(engine_spec: EngineSpec, config: TrialConfig, workload: Workload,
                    settings: MeasureSettings, trial_dir: str) -> dict:
    """One trial as plain data: {"result": ...} or {"failure": ...}; runs in a Ray worker too.

    Ray sets CUDA_VISIBLE_DEVICES in the worker; the engine inherits it. We record it so a
    user can check that each engine got its own GPU.
    """
    import os

    where = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
             "host": os.uname().nodename, "ran_from": time.time()}
    try:
        result = measure(engine_spec, config, workload, settings, trial_dir=Path(trial_dir))
    except TrialFailed as e:
        return {"failure": failure_record(e), **where, "ran_to": time.time()}
    return {"result": json.loads(result.model_dump_json()), **where, "ran_to": time.time()}


class InlineExecutor:
    """Runs each trial in the driver process, one at a time (CPU machines, no GPU to share)."""

    parallel = 1

    def submit(self, key: object, *args: object, num_gpus: float = 0) -> None:
        self._done = getattr(self, "_done", [])
        self._done.append((key, measure_outcome(*args)))

    def wait_one(self) -> tuple[object, dict]:
        return self._done.pop(0)

    def pending(self) -> int:
        return len(getattr(self, "_done", []))

    def shutdown(self) -> None:
        pass


class RayExecutor:
    """One Ray task per trial holding `num_gpus` GPUs; at most `parallel` in flight.

    Ask/tell stays in the driver; a worker that dies is reported as a failure of its trial.
    """

    def __init__(self, *, address: str | None, parallel: int | None, num_gpus: int | None = None
                 ) -> None:
        import ray

        kwargs: dict = {"ignore_reinit_error": True, "log_to_driver": False,
                        "include_dashboard": False}
        if address:
            kwargs["address"] = address
        elif num_gpus is not None:
            kwargs["num_gpus"] = num_gpus
        if not ray.is_initialized():
            ray.init(**kwargs)
        total = int(ray.cluster_resources().get("GPU", 0))
        self.total_gpus = total
        self.parallel = max(1, min(parallel or max(total, 1), max(total, 1)))
        self._remote = ray.remote(max_retries=0)(measure_outcome)
        self._refs: dict = {}

    def submit(self, key: object, *args: object, num_gpus: float = 1) -> None:
        ref = self._remote.options(num_gpus=num_gpus, num_cpus=1).remote(*args)
        self._refs[ref] = key

    def pending(self) -> int:
        return len(self._refs)

    def wait_one(self) -> tuple[object, dict]:
        import ray

        ready, _ = ray.wait(list(self._refs), num_returns=1)
        ref = ready[0]
        key = self._refs.pop(ref)
        try:
            return key, ray.get(ref)
        except ray.exceptions.RayError as e:  # worker died, node lost, task cancelled
            reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            return key, {"failure": {"reason": f"Ray worker failed: {type(e).__name__}: {reason}",
                                     "kind": "worker_died", "log_tail": str(e)[-2000:]}}

    def shutdown(self) -> None:
        import ray

        for ref in list(self._refs):
            ray.cancel(ref, force=True)
        self._refs.clear()
