"""Measure stage, one trial end to end: engine up, every concurrency level, engine down.

`measure` is the single place where an engine and the load generator meet. It raises a
TrialFailed subclass when the trial cannot be measured; `measure_outcome` turns that into
data (a TrialOutcome), which is what executors run, inline or in a Ray worker. Every
measured trial also leaves its token capture (tuner.tokens) in the trial folder, exact or
not at all, and the outcome carries its bytes back.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tuner import tokens
from tuner.errors import EngineDied, MeasurementFailed, TrialFailed
from tuner.measure import loadgen, metrics, windows
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
    tokens_path = trial_dir / tokens.FILE_NAME
    tokens_path.unlink(missing_ok=True)  # a file here always belongs to this measurement
    sent: list[_Sent] = []
    pool = _PromptPool(workload.prompts)
    if engine_spec.base_url:  # nothing starts: the server runs with its own config
        say(f"measuring the running server at {engine_spec.base_url}")
    else:
        say(f"engine starting for {config.label()} (log: {trial_dir / 'engine.log'})")
    with Engine(engine_spec, config, log_path=trial_dir / "engine.log") as eng:
        if not engine_spec.base_url:
            say(f"engine ready in {eng.info.start_s:.0f} s")
        for c in settings.concurrencies:
            level = _measure_level(eng, workload, settings, c, records_path, show_bar, pool,
                                   sent)
            note = level.windows_text()
            say(f"c={c}: {level.output_throughput:.1f} tok/s, mean TPOT "
                f"{level.mean_tpot_ms:.1f} ms, {level.completed}/{level.num_requests} ok"
                + (f" ({note})" if note else ""))
            levels.append(level)
        info = eng.info
    capture, why_not = capture_tokens(sent)
    if capture is None:
        say(why_not)
    else:
        capture.save(tokens_path)
    return BenchResult(config=config, engine=info, levels=tuple(levels))


# What one phase (a level's warm-up or its measured requests) sent: records and their prompts.
_Sent = tuple[list[RequestRecord], list[Prompt]]


def capture_tokens(sent: list[_Sent]) -> tuple[tokens.TokenCapture | None, str]:
    """Every ok request's token ids in the order the engine got them, or None and why not.

    Phases come in measurement order; within one the load generator sends in index order.
    A capture is exact or absent: one measured request without ids (an engine that ignores
    return_token_ids, or ids that disagree with its usage count) means none."""
    out: list[tokens.RequestTokens] = []
    missing = measured = 0
    for records, prompts in sent:
        for r in sorted(records, key=lambda r: r.index):
            if not r.ok:
                continue
            if r.prompt_token_ids is None or r.output_token_ids is None:
                if not r.warmup:
                    missing += 1
                continue
            measured += not r.warmup
            out.append(tokens.RequestTokens(
                concurrency=r.concurrency, index=r.index, warmup=r.warmup,
                prompt=np.asarray(r.prompt_token_ids, dtype=np.int32),
                output=np.asarray(r.output_token_ids, dtype=np.int32),
                max_tokens=prompts[r.index].output_len,
                chunk_ms=np.asarray(r.chunk_gaps_s, dtype=np.float32) * 1000.0))
    if missing and not measured:
        return None, "this vLLM returned no token ids; replay is unavailable for this trial"
    if missing:
        return None, (f"{missing} of {missing + measured} measured requests came back without "
                      f"exact token ids (their count differs from the usage count); no token "
                      f"capture, so replay is unavailable for this trial")
    return tokens.TokenCapture(requests=tuple(out)), ""


class _PromptPool:
    """Hands out prompts in order and never twice while the pool lasts: an engine that learns
    from earlier requests (suffix decoding, prefix caching) must not see a prompt again. Once
    it is exhausted, each further pass over it carries its own cache_salt: on the H100, the
    windows of a c=8 level went 22% faster once they wrapped onto prompts the level had
    sent (benchmarks/data/h100/noise-16p). The count of reused prompts stays, as suffix
    decoding still learns from the earlier outputs."""

    def __init__(self, prompts: tuple[Prompt, ...]) -> None:
        self.prompts, self.cursor = prompts, 0

    def take(self, k: int) -> tuple[list[Prompt], int]:
        n = len(self.prompts)
        out = [_salted(self.prompts[i % n], i // n)
               for i in range(self.cursor, self.cursor + k)]
        reused = max(0, min(k, self.cursor + k - n))
        self.cursor += k
        return out, reused


def _salted(prompt: Prompt, passes: int) -> Prompt:
    """`prompt` as pass `passes` over the pool sends it: unsalted on the first pass."""
    if passes == 0:
        return prompt
    return prompt.model_copy(update={"cache_salt": f"spec-tuner-pass-{passes}"})


def _measure_level(eng: Engine, workload: Workload, settings: MeasureSettings, c: int,
                   records_path: Path, show_bar: bool, pool: _PromptPool,
                   sent: list[_Sent]) -> LevelMetrics:
    spec = workload.spec
    # Warm-up: short requests (--num-warmups, by default one per slot), excluded from figures.
    warm_prompts, _ = pool.take(settings.warmups_for(c))
    warm = [p.model_copy(update={"output_len": min(p.output_len, settings.warmup_output_len)})
            for p in warm_prompts]
    windowed = settings.stability_pct > 0
    size = (settings.window_requests(c, spec.num_prompts) if windowed
            else settings.requests_for(c, spec.num_prompts))
    client = loadgen.RequestSettings(
        model=eng.spec.served_model_name, api_key=eng.api_key, temperature=spec.temperature,
        top_p=spec.top_p, top_k=spec.top_k, min_p=spec.min_p, ignore_eos=spec.ignore_eos,
        request_timeout_s=eng.spec.request_timeout_s, level_timeout_s=eng.spec.level_timeout_s)
    warm_records = _run(eng, warm, c, warmup=True, client=client, bar=None)[0] if warm else []
    bar = _bar(size * (settings.stable_windows if windowed else 1), f"c={c}") if show_bar else None
    if windowed:
        phases, reused = _windowed(eng, c, settings, pool, size=size, warmups=len(warm),
                                   client=client, bar=bar)
    else:
        measured, reused = pool.take(size)
        phases = _block(eng, measured, c, client=client, bar=bar)
    if bar is not None:
        bar.close()
    sent += [(warm_records + phases.settling, warm + phases.settling_prompts),
             (phases.records, phases.prompts)]
    with open(records_path, "a") as f:
        for r in warm_records + phases.settling + phases.records:
            f.write(r.model_dump_json() + "\n")
    level = metrics.level_metrics(phases.records, concurrency=c, duration_s=phases.wall_s,
                                  warmup_requests=len(warm) + len(phases.settling),
                                  counts=phases.counts,
                                  percentile_metrics=settings.percentile_metrics,
                                  metric_percentiles=settings.metric_percentiles)
    level = level.model_copy(update={"reused_prompts": reused, **phases.fields})
    if level.failed > MAX_FAILED_FRACTION * level.num_requests:
        raise MeasurementFailed(
            f"c={c}: {level.failed} of {level.num_requests} requests failed "
            f"(first error: {level.errors[0] if level.errors else '?'})",
            log_tail=log_tail(eng.log_path))
    return level


def _block(eng: Engine, prompts: list[Prompt], c: int, *, client: loadgen.RequestSettings,
           bar) -> windows.Split:
    """The level as one closed-loop block of `prompts`, every request measured."""
    before = _scrape(eng)
    records, wall_s = _run(eng, prompts, c, warmup=False, client=client, bar=bar)
    after = _scrape(eng)
    return windows.Split(settling=[], settling_prompts=[], records=records, prompts=prompts,
                         counts=metrics.delta(before, after), wall_s=wall_s, fields={})


def _windowed(eng: Engine, c: int, settings: MeasureSettings, pool: _PromptPool, *, size: int,
              warmups: int, client: loadgen.RequestSettings, bar) -> tuple[windows.Split, int]:
    """The level as windows of `size` requests back to back, on one clock, /metrics read at
    each boundary, until tuner.measure.windows says it is done; and how many of the measured
    (stable) windows' prompts were reused."""
    done: list[windows.Window] = []
    reused: list[int] = []
    t0 = time.perf_counter()
    before = _scrape(eng)
    sized = 0  # the first window of the current size: only windows of one size are compared
    while not windows.finished(done[sized:], settings, elapsed_s=time.perf_counter() - t0):
        if done and (grown := windows.grown(size, done[-1].wall_s, c, settings)) != size:
            size, sized = grown, len(done)
        prompts, again = pool.take(size)
        if bar is not None and len(done) >= settings.stable_windows:
            bar.total += size
            bar.refresh()
        records, wall_s = _run(eng, prompts, c, warmup=False, client=client, bar=bar,
                               origin_s=t0)
        after = _scrape(eng)
        done.append(windows.Window(records=tuple(records), prompts=tuple(prompts),
                                   wall_s=wall_s, before=before, after=after))
        reused.append(again)
        before = after
    phases = windows.split(done, settings, warmups=warmups, measure_s=time.perf_counter() - t0)
    return phases, sum(reused[len(done) - phases.fields["stable_windows"]:])


def _run(eng: Engine, prompts: list[Prompt], c: int, *, warmup: bool,
         client: loadgen.RequestSettings, bar, origin_s: float | None = None
         ) -> tuple[list[RequestRecord], float]:
    records, wall_s = loadgen.run_requests(
        eng.url, prompts, client, concurrency=c, warmup=warmup,
        on_done=(lambda _r: bar.update(1)) if bar is not None else None, origin_s=origin_s)
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
                    settings: MeasureSettings, trial_dir: str, *,
                    progress: Callable[[str], None] | None = None,
                    show_bar: bool = False) -> TrialOutcome:
    """One trial as data, a result or a failure, never an exception; runs in a Ray worker too
    (there without `progress` and `show_bar`: a worker's terminal is not the user's).

    Ray sets CUDA_VISIBLE_DEVICES in the worker; the engine inherits it. We record it so a
    user can check that each engine got its own GPU.
    """
    import os

    where = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
             "host": os.uname().nodename, "ran_from": time.time()}
    try:
        result = measure(engine_spec, config, workload, settings, trial_dir=Path(trial_dir),
                         progress=progress, show_bar=show_bar)
    except TrialFailed as e:
        return TrialOutcome(failure=failure_of(e), **where, ran_to=time.time())
    # The capture's bytes travel with the result: the driver may not see this host's disk.
    path = Path(trial_dir) / tokens.FILE_NAME
    data = path.read_bytes() if path.is_file() else None
    return TrialOutcome(result=result, tokens=data, **where, ran_to=time.time())
