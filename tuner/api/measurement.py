"""`tuner bench` as tuner.api runs it: one speculative config measured at every requested
concurrency in one engine launch, its result.json written."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from tuner import checks
from tuner.api import drafters, engines
from tuner.records.configs import EngineSpec
from tuner.records.options import BenchOptions
from tuner.records.results import BenchResult

Say = Callable[[str], None]


def bench(options: BenchOptions, *, engine: EngineSpec | None = None, say: Say = print,
          show_bar: bool = False) -> BenchResult:
    """Measure one speculative config at every requested concurrency in one engine launch.
    With `base_url` the server already runs: measured as it is, with its own config.
    `engine`: one resolved already (a scripted engine, a launcher of one's own) in place of
    `options.engine`. `show_bar`: a bar over each level's requests, for a TTY."""
    from tuner.measure import trial
    from tuner.outputs import files
    from tuner.records.results import BenchHeader

    engine = engine or engines.resolve_engine(options.engine)
    options = dataclasses.replace(options, config=drafters.drafted_config(
        options.config, engine, options.draft_model))
    checks.bench_options(options, engine)
    workload, settings, out_dir = options.workload, options.settings, options.out_dir
    wl, schedule = engines.load_workload(workload, engine, settings, say)
    out_dir.mkdir(parents=True, exist_ok=True)
    what = (f"the live server at {engine.base_url} (its own config)" if engine.base_url
            else options.config.label())
    if options.config.speculative_config:
        engines.warn_sampling(engine, workload, say)
    levels = settings.concurrencies
    requests = _per_level([len(schedule.level(c).measured) for c in levels], "request")
    warmups = _per_level([len(schedule.level(c).warmups) for c in levels], "warm-up")
    say(f"Benchmarking {what} on {Path(engine.model).name}, workload {workload.name} "
        f"({schedule.requests} distinct prompts: {requests} and {warmups} per level), "
        f"concurrency {','.join(map(str, levels))}")
    t0 = time.monotonic()
    result = trial.measure(engine, options.config, wl, settings, trial_dir=out_dir,
                           schedule=schedule, progress=lambda m: say("  " + m), show_bar=show_bar)
    files.write_bench_result(out_dir, result, header=BenchHeader(
        workload=workload, workload_digest=wl.digest, settings=settings, schedule=schedule,
        engine_spec=engine, wall_s=round(time.monotonic() - t0, 1),
        metadata=dict(options.metadata)))
    return result


def _per_level(counts: list[int], noun: str) -> str:
    """Counts per concurrency level as the banner lists them: "1 warm-up", "4 requests",
    "4,8 requests" (one number when all levels agree)."""
    text = str(counts[0]) if len(set(counts)) == 1 else ",".join(map(str, counts))
    return f"{text} {noun}" + ("" if text == "1" else "s")
