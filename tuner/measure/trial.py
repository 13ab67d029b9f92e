"""Measure stage, one trial end to end: engine up, every concurrency level, engine down.

`measure` is the single place where an engine and the load generator meet. It raises a
TrialFailed subclass when the trial cannot be measured; `measure_outcome` turns that into
data (a TrialOutcome), which is what executors run, inline or in a Ray worker. Every
measured trial also leaves its token capture (tuner.tokens) in the trial folder, exact or
not at all, and the outcome carries its bytes back.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pydantic import Field

from tuner import tokens
from tuner.errors import EngineDied, MeasurementFailed, TrialFailed
from tuner.measure import load_level, loadgen, metrics, request_schedule, windows
from tuner.measure.engine import Engine, log_tail
from tuner.records.configs import (
    EngineSpec,
    LevelRequests,
    MeasureSettings,
    Prompt,
    RequestSchedule,
    TrialConfig,
    Workload,
    prompts_digest,
)
from tuner.records.results import BenchResult, LevelMetrics, RequestRecord
from tuner.records.trials import Failure, TrialOutcome

MAX_FAILED_FRACTION = 0.2


class OpenLoopSettings(MeasureSettings):
    """MeasureSettings whose levels in `request_rates` ({concurrency: requests/s}) are driven
    open loop: their measured requests arrive Poisson at that rate (load_level.poisson_arrivals,
    seed 0, as `vllm bench serve --request-rate`), at most the level's concurrency in flight;
    warm-ups and other levels stay the closed loop. The policy's open-loop check
    (tuner.search.ladder) measures with it; each level records its rate (LevelMetrics)."""

    request_rates: dict[int, float] = Field(default_factory=dict)


def measure(
    engine_spec: EngineSpec, config: TrialConfig, workload: Workload, settings: MeasureSettings,
    *, trial_dir: Path, schedule: RequestSchedule | None = None,
    progress: Callable[[str], None] | None = None, show_bar: bool = False,
) -> BenchResult:
    """Launch one engine for `config` and send it `schedule` (tuner.measure.request_schedule;
    None: built from `workload` and `settings`, as every launch with them builds it), level
    by level, each level's warm-ups and then its measured requests, then the workload sample
    where `schedule` carries one (RequestSchedule.sample). `request_rates`
    ({concurrency: requests/s}): those levels' measured requests arrive open loop at that
    rate (load_level.poisson_arrivals, seed 0), capped at the level's concurrency."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda _msg: None)
    if schedule is None:  # as every launch builds it; the workload sample only where given
        schedule = request_schedule.build(workload, settings)[0].without_sample()
    request_schedule.check_workload(schedule, workload)
    levels: list[LevelMetrics] = []
    records_path = trial_dir / "requests.jsonl"
    records_path.unlink(missing_ok=True)
    tokens_path = trial_dir / tokens.FILE_NAME
    tokens_path.unlink(missing_ok=True)  # a file here always belongs to this measurement
    sent: list[_Sent] = []
    seen: set[int] = set()  # prompt indices this engine has been sent
    if engine_spec.base_url:  # nothing starts: the server runs with its own config
        say(f"measuring the running server at {engine_spec.base_url}")
    else:
        say(f"engine starting for {config.label()} (log: {trial_dir / 'engine.log'})")
    with Engine(engine_spec, config, log_path=trial_dir / "engine.log") as eng:
        if not engine_spec.base_url:
            say(f"engine ready in {eng.info.start_s:.0f} s")
        for c in settings.concurrencies:
            level = _measure_level(eng, workload, settings, schedule.level(c), records_path,
                                   show_bar, sent, seen)
            note = level.windows_text()
            say(f"c={c}{_rate_text(level.request_rate)}: {level.output_throughput:.1f} tok/s, "
                f"mean TPOT {level.mean_tpot_ms:.1f} ms, {level.completed}/{level.num_requests} ok"
                + (f" ({note})" if note else ""))
            levels.append(level)
        if schedule.sample:
            sent.append(_send_sample(eng, workload, schedule, say))
        info = eng.info
    capture, why_not = capture_tokens(sent)
    if capture is None:
        say(why_not)
    else:
        capture.save(tokens_path)
    return BenchResult(config=config, engine=info, levels=tuple(levels))


def _send_sample(eng: Engine, workload: Workload, schedule: RequestSchedule,
                 say: Callable[[str], None]) -> _Sent:
    """The workload sample (RequestSchedule.sample), sent after every level: only its tokens
    are kept (as tuner.tokens.SAMPLE_LEVEL), for the replay; no figure is measured on it."""
    prompts = request_schedule.sample(workload, schedule)
    c = schedule.sample_concurrency or 1
    t0 = time.perf_counter()
    records, _wall_s = _run(eng, prompts, c, warmup=False, client=_client(eng, workload),
                            bar=None)
    records = [r.model_copy(update={"concurrency": tokens.SAMPLE_LEVEL}) for r in records]
    ok = sum(r.ok for r in records)
    say(f"workload sample: {ok}/{len(prompts)} requests at c={c} in "
        f"{time.perf_counter() - t0:.0f} s (tokens kept for the replay, not measured)")
    return records, prompts


def _rate_text(rate: float | None) -> str:
    return "" if rate is None else f" at {rate:.2f} req/s"


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


def _measure_level(eng: Engine, workload: Workload, settings: MeasureSettings,
                   planned: LevelRequests, records_path: Path, show_bar: bool,
                   sent: list[_Sent], seen: set[int]) -> LevelMetrics:
    """One level as the schedule has it: its short warm-ups (excluded from the figures), then
    its measured requests as one closed-loop block (open loop at the level's rate where
    `settings` is an OpenLoopSettings that gives one), /metrics read before and after."""
    c = planned.concurrency
    sent_before = reused = 0  # requests whose prompt this engine was sent already
    for pos, i in enumerate(planned.warmups + planned.measured):
        again = i in seen
        sent_before += again
        reused += again and pos >= len(planned.warmups)  # measured ones among them
        seen.add(i)
    if sent_before and not settings.allow_repeats:  # the schedule's builder never does this
        raise MeasurementFailed(f"c={c}: the request schedule sends {sent_before} prompt(s) "
                                f"this engine was sent before, without --allow-repeats")
    warm = request_schedule.warmups(workload, planned, settings)
    prompts = request_schedule.measured(workload, planned)
    client = _client(eng, workload)
    warm_records = _run(eng, warm, c, warmup=True, client=client, bar=None)[0] if warm else []
    bar = _bar(len(prompts), f"c={c}") if show_bar else None
    t0 = time.perf_counter()
    before = _scrape(eng)
    request_rate = settings.request_rates.get(c) if isinstance(settings, OpenLoopSettings) \
        else None
    records, wall_s = _run(eng, prompts, c, warmup=False, bar=bar,
                           client=dataclasses.replace(client, request_rate=request_rate))
    counts = metrics.delta(before, _scrape(eng))
    if bar is not None:
        bar.close()
    sent += [(warm_records, warm), (records, prompts)]
    with open(records_path, "a") as f:
        for r in warm_records + records:
            f.write(r.model_dump_json() + "\n")
    level = metrics.level_metrics(records, concurrency=c, duration_s=wall_s,
                                  warmup_requests=len(warm), counts=counts,
                                  percentile_metrics=settings.percentile_metrics,
                                  metric_percentiles=settings.metric_percentiles)
    level = windows.with_windows(level.model_copy(update={
        "reused_prompts": reused, "prompts_digest": prompts_digest(prompts),
        "measure_s": time.perf_counter() - t0, "request_rate": request_rate}), records, settings)
    if level.failed > MAX_FAILED_FRACTION * level.num_requests:
        raise MeasurementFailed(
            f"c={c}: {level.failed} of {level.num_requests} requests failed "
            f"(first error: {level.errors[0] if level.errors else '?'})",
            log_tail=log_tail(eng.log_path))
    return level


def _client(eng: Engine, workload: Workload) -> load_level.RequestSettings:
    """How every request of this engine is sent: the workload's sampling, the engine's key."""
    spec = workload.spec
    return load_level.RequestSettings(
        model=eng.spec.served_model_name, api_key=eng.api_key, temperature=spec.temperature,
        top_p=spec.top_p, top_k=spec.top_k, min_p=spec.min_p, ignore_eos=spec.ignore_eos,
        request_timeout_s=eng.spec.request_timeout_s, level_timeout_s=eng.spec.level_timeout_s)


def _run(eng: Engine, prompts: list[Prompt], c: int, *, warmup: bool,
         client: load_level.RequestSettings, bar) -> tuple[list[RequestRecord], float]:
    records, wall_s = loadgen.run_requests(
        eng.url, prompts, client, concurrency=c, warmup=warmup,
        on_done=(lambda _r: bar.update(1)) if bar is not None else None)
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
                    schedule: RequestSchedule | None = None,
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
                         schedule=schedule, progress=progress, show_bar=show_bar)
    except TrialFailed as e:
        return TrialOutcome(failure=failure_of(e), **where, ran_to=time.time())
    # The capture's bytes travel with the result: the driver may not see this host's disk.
    path = Path(trial_dir) / tokens.FILE_NAME
    data = path.read_bytes() if path.is_file() else None
    return TrialOutcome(result=result, tokens=data, **where, ran_to=time.time())
