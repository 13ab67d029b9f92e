"""Measure stage, the closed loop: a level's requests in this process, `concurrency` slots
each sending its next prompt as soon as its last request ends (as `vllm bench serve
--max-concurrency` does), or, open loop, each prompt not before its arrival time.

Every slot owns a connection (tuner.measure.http_client), opened before the level's clock
starts; the loop runs on the load generator's clock (tuner.measure.loadgen_clock) and stops at
the level's deadline. The slots of one level may be shared among several processes
(tuner.measure.client_processes), each running this loop over its share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from tuner.measure import completion_request, loadgen_clock
from tuner.measure.http_client import Slot, Target, wait_within
from tuner.measure.load_level import LoadLevel
from tuner.records.configs import Prompt
from tuner.records.results import RequestRecord


async def closed_loop(level: LoadLevel, prompts: Sequence[Prompt], *,
                     on_done: Callable[[RequestRecord], None] | None,
                     slots: int | None = None, claim=None, start=None
                     ) -> tuple[list[RequestRecord], float]:
    """The closed loop in this process: `slots` places (all of the level's by default), each
    taking the next prompt from `claim` (index order by default), once `start` (now by
    default) says the level's clock runs and returns its t0. Open loop (`level.arrivals`),
    a place that claims prompt i waits for its arrival before sending it."""
    target = Target(level.url, level.settings.api_key)
    if claim is None:
        pending = iter(enumerate(prompts))

        def claim():
            return next(pending, None)
    records: list[RequestRecord] = []
    deadline = level.deadline
    places = [Slot(target, deadline)
              for _ in range(slots or max(1, min(level.concurrency, len(prompts))))]
    try:
        # Connections first, off the clock; a slot that cannot connect retries per request
        # and records why.
        await asyncio.gather(*(s.connect() for s in places))
        t0 = start() if start is not None else loadgen_clock.clock.now()
        origin = t0 if level.origin_s is None else level.origin_s

        async def run(slot: Slot) -> None:
            while deadline is None or loadgen_clock.clock.now() < deadline:
                if (item := claim()) is None:
                    return
                if level.arrivals is not None:  # open loop: not before its arrival
                    wait_s = t0 + level.arrivals[item[0]] - loadgen_clock.clock.now()
                    if wait_s > 0:
                        await asyncio.sleep(wait_within(wait_s, deadline))
                rec = await completion_request.send(level, target, slot, *item, origin=origin)
                records.append(rec)
                if on_done:
                    on_done(rec)

        await asyncio.gather(*(run(s) for s in places))
        wall_s = loadgen_clock.clock.now() - t0
        if deadline is not None and loadgen_clock.clock.now() >= deadline:
            raise asyncio.TimeoutError  # waits were cut at the deadline: the level is not done
    finally:
        for s in places:
            s.close()
    records.sort(key=lambda r: r.index)
    return records, wall_s
