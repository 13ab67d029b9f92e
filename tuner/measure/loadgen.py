"""Load generator stage: a closed loop of streaming requests at a fixed concurrency, or
open-loop arrivals at a request rate capped at that concurrency.

Promises: exactly `concurrency` requests in flight until the work runs out (a new one starts
when one ends, as `vllm bench serve --max-concurrency` does); with a `request_rate`, request i
is sent at its seeded Poisson arrival time (tuner.measure.load_level.poisson_arrivals: `vllm
bench serve --request-rate`'s times) or, where `concurrency` are in flight then, as soon as one
ends (vLLM's --max-concurrency semaphore); every request becomes a RequestRecord with TTFT,
end-to-end time, chunk gaps and the server's own token count (usage of the final stream chunk),
or with the error that ended it; and with the prompt and output token ids where the engine
returns them (`return_token_ids`) and their count matches that usage, never an inexact list.
All async code of the project lives in the load generator; callers use the synchronous
`run_requests` here.

Its parts, one module each: the level's settings and arrival times (load_level), the clock
every stamp reads (loadgen_clock), the HTTP client that is the measuring instrument
(http_client, event_stream), one request and its record (completion_request), the loop of a
level in one process (closed_loop), and, at high concurrency, the client processes that share
its slots, one event loop each, so no stamp waits behind the parsing of thousands of other
chunks (client_processes). `benchmarks/fidelity.py` measures how close that comes to a
server's true timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from tuner.errors import MeasurementFailed
from tuner.measure import loadgen_clock
from tuner.measure.client_processes import client_processes, run_sharded
from tuner.measure.closed_loop import closed_loop
from tuner.measure.load_level import LoadLevel, RequestSettings, poisson_arrivals
from tuner.records.configs import Prompt
from tuner.records.results import RequestRecord


def run_requests(
    url: str,
    prompts: Sequence[Prompt],
    settings: RequestSettings,
    *,
    concurrency: int,
    warmup: bool = False,
    on_done: Callable[[RequestRecord], None] | None = None,
    origin_s: float | None = None,
    processes: int | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send `prompts` with `concurrency` in flight; return records and the wall time (s).
    With `settings.request_rate` the level is open loop: prompt i is sent at its arrival
    (poisson_arrivals), never with more than `concurrency` in flight; the wall time runs
    from t0 to the last end either way, as vLLM's benchmark duration.

    Records' start_s count from the moment the connections are ready, or from `origin_s`
    (a `loadgen_clock.clock.now()` value) where given, which puts them on the caller's clock.
    The slots are shared among `processes` client processes (client_processes() by default).
    """
    clock = loadgen_clock.clock
    # The deadline also bounds every wait inside the loop: before Python 3.12, asyncio.wait_for
    # drops a cancellation that meets a result just ready, and with thousands of slots such lost
    # cancellations kept a level running for many times --level-timeout.
    timeout_s = settings.level_timeout_s
    arrivals = (None if settings.request_rate is None else
                poisson_arrivals(len(prompts), settings.request_rate, settings.arrival_seed))
    level = LoadLevel(url=url, settings=settings, concurrency=concurrency, warmup=warmup,
                      origin_s=origin_s, deadline=clock.now() + timeout_s,
                      arrivals=arrivals, clock=clock)
    slots = max(1, min(concurrency, len(prompts)))
    processes = min(slots, processes or client_processes(slots))
    try:
        if processes > 1:
            return run_sharded(level, list(prompts), processes=processes, slots=slots,
                               on_done=on_done)
        coro = closed_loop(level, prompts, on_done=on_done)
        return loadgen_clock.run(asyncio.wait_for(coro, timeout=timeout_s))
    except (asyncio.TimeoutError, TimeoutError):
        raise MeasurementFailed(
            f"concurrency {concurrency}: {len(prompts)} requests did not finish within "
            f"{timeout_s:.0f} s (--level-timeout)") from None
