"""Measure stage, the load generator's clock: what every stamp and wait of the load generator
reads time from, and the event loop that keeps it.

One clock for the whole load generator, read by name at each use (`loadgen_clock.clock`):
tests replace it with a virtual one (tuner.testing.fake_clock) so that their timing
assertions are exact, and each client process of a level takes the driver's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """What the load generator reads time from, and the event loop that keeps it."""

    def now(self) -> float: ...

    def new_event_loop(self) -> asyncio.AbstractEventLoop: ...


class WallClock:
    """time.perf_counter, on uvloop where installed (vLLM depends on it): less client
    overhead per streamed chunk, which is what keeps client-side timestamps honest at high
    concurrency."""

    def now(self) -> float:
        return time.perf_counter()

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        try:
            import uvloop
        except ImportError:
            return asyncio.new_event_loop()
        return uvloop.new_event_loop()


# Every time the load generator stamps or waits for: the wall clock, which tests replace with
# a virtual one (tuner.testing.fake_clock) so that their timing assertions are exact.
clock: Clock = WallClock()


def run(coro):
    """Run `coro` on the clock's event loop (WallClock: uvloop where installed)."""
    if not hasattr(asyncio, "Runner"):  # Python 3.10
        loop = clock.new_event_loop()
        try:
            return loop.run_until_complete(coro)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
    with asyncio.Runner(loop_factory=clock.new_event_loop) as runner:
        result = runner.run(coro)
        # Ctrl-C cancels the main task; before Python 3.12, asyncio.wait_for can swallow that
        # cancellation when a result is ready at the same moment, and the Runner then returns
        # normally and forgets the Ctrl-C. It counts SIGINTs, so the interrupt is not lost.
        if getattr(runner, "_interrupt_count", 0):
            raise KeyboardInterrupt
        return result
