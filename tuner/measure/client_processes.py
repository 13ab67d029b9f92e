"""Measure stage, the client processes: a level's slots shared among several processes, one
event loop each, so that at high concurrency no chunk's stamp waits behind the parsing of
thousands of other chunks.

The processes stay one closed loop: they draw prompts from one shared counter, and their
clocks start together once every connection is ready; their records come back to the driver
as they end. The children are spawned (no fork of a driver that may hold threads), stay in the
driver's process group, and are always reaped.
"""

from __future__ import annotations

import asyncio
import gc
import math
import multiprocessing
import os
import queue
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuner.errors import MeasurementFailed
from tuner.measure import loadgen_clock
from tuner.measure.closed_loop import closed_loop
from tuner.measure.http_client import CONNECT_TIMEOUT_S
from tuner.measure.load_level import LoadLevel
from tuner.records.configs import Prompt
from tuner.records.results import RequestRecord

SLOTS_PER_PROCESS = 16


def client_processes(slots: int) -> int:
    """How many processes share a level's slots: one event loop stamps ~10k chunks/s late by
    the time it takes to parse the chunks before them (+13 % TTFT at c=128 in
    benchmarks/fidelity.py), so one process per SLOTS_PER_PROCESS slots, on at most half the
    cores this process may use: the engine's API server and engine core share the host."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(math.ceil(slots / SLOTS_PER_PROCESS), cores // 2))


@dataclass(frozen=True)
class _Shared:
    """What the client processes of one level share: the next prompt's index, the level's
    t0 (set once every connection is ready), the signal that it is set, and the queue their
    messages come back on."""

    next_index: Any
    t0: Any
    go: Any
    results: Any


def run_sharded(level: LoadLevel, prompts: list[Prompt], *, processes: int, slots: int,
                on_done: Callable[[RequestRecord], None] | None
                ) -> tuple[list[RequestRecord], float]:
    """The closed loop over `processes` child processes, each with its own event loop and a
    share of the slots, drawing prompts from one shared counter so the level stays one
    closed loop of `slots` in flight. Their clocks start together, once every connection
    is ready; records come back as they end. The children are spawned (no fork of a driver
    that may hold threads), stay in the driver's process group, and are always reaped."""
    ctx = multiprocessing.get_context("spawn")
    shared = _Shared(next_index=ctx.Value("q", 0), t0=ctx.Value("d", 0.0, lock=False),
                     go=ctx.Event(), results=ctx.Queue())
    shares = [slots // processes + (i < slots % processes) for i in range(processes)]
    workers = [ctx.Process(target=_shard, name=f"tuner-loadgen-{i}", daemon=True,
                           args=(i, share, shared, level, prompts, os.getpid()))
               for i, share in enumerate(shares)]
    driver = _ShardDriver(level, shared, workers, on_done)
    try:
        for w in workers:
            w.start()
        driver.collect()
    finally:
        _reap(workers)
        shared.results.close()
    driver.records.sort(key=lambda r: r.index)
    return driver.records, max(driver.ends) - driver.t0


class _ShardDriver:
    """The driver's side of run_sharded: it starts the level's clock once every child is
    ready, and gathers their records until each says it is done."""

    def __init__(self, level: LoadLevel, shared: _Shared, workers: list,
                 on_done: Callable[[RequestRecord], None] | None) -> None:
        self.level, self.shared, self.workers, self.on_done = level, shared, workers, on_done
        self.records: list[RequestRecord] = []
        self.ends: list[float] = []
        self.ready = 0
        self.done: set[int] = set()
        self.suspects: set[int] = set()
        self.t0 = loadgen_clock.clock.now()

    def collect(self) -> None:
        while len(self.done) < len(self.workers):
            try:
                msg = self.shared.results.get(timeout=0.2)
            except queue.Empty:
                self._check_children()
                continue
            self._take(msg)

    def _check_children(self) -> None:
        """A child that is gone with its last message not in the queue (checked twice: it may
        have written that message just after the queue was found empty) fails the level."""
        gone = {i for i, w in enumerate(self.workers) if w.exitcode is not None} - self.done
        if lost := gone & self.suspects:
            i = min(lost)
            raise MeasurementFailed(
                f"concurrency {self.level.concurrency}: load generator process {i} exited "
                f"with status {self.workers[i].exitcode} before its requests were done"
            ) from None
        self.suspects = gone
        if loadgen_clock.clock.now() > self.level.deadline + CONNECT_TIMEOUT_S:
            raise asyncio.TimeoutError from None

    def _take(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "record":
            self.records.append(msg[1])
            if self.on_done:
                self.on_done(msg[1])
        elif kind == "ready":
            self.ready += 1
            if self.ready == len(self.workers):
                self.t0 = self.shared.t0.value = loadgen_clock.clock.now()
                self.shared.go.set()
        elif kind == "done":
            self.done.add(msg[1])
            self.ends.append(msg[2])
        elif kind == "timeout":
            raise asyncio.TimeoutError
        else:  # "error": a bug in the child, shown as one
            raise RuntimeError(f"load generator process {msg[1]} failed: {msg[2]}")


def _reap(workers: list) -> None:
    started = [w for w in workers if w.pid is not None]  # a Ctrl-C may stop the starts
    for w in started:
        if w.is_alive():
            w.terminate()
    for w in started:
        w.join(5.0)
        if w.is_alive():
            w.kill()
            w.join()


def _shard(shard: int, slots: int, shared: _Shared, level: LoadLevel, prompts: list[Prompt],
           driver_pid: int) -> None:
    """One client process of run_sharded: `slots` places of the closed loop."""
    # The driver ends its children; a Ctrl-C at a terminal reaches the whole process group,
    # and a child's KeyboardInterrupt would only print a second traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    # The driver's clock: its t0 and this process's stamps agree.
    loadgen_clock.clock = level.clock or loadgen_clock.WallClock()
    deadline = level.deadline

    def claim() -> tuple[int, Prompt] | None:
        with shared.next_index.get_lock():
            index = shared.next_index.value
            if index >= len(prompts):
                return None
            shared.next_index.value = index + 1
        return index, prompts[index]

    def start() -> float:
        # A fresh interpreter's first full collections walk every object its imports made;
        # done here, off the clock, and frozen out of later ones, they cannot stall a stamp.
        gc.collect()
        gc.freeze()
        shared.results.put(("ready", shard))
        # Blocking is right here: this loop has nothing to do until every shard is ready.
        while not shared.go.wait(0.2):
            if os.getppid() != driver_pid or loadgen_clock.clock.now() > deadline:
                raise asyncio.TimeoutError
        return shared.t0.value

    try:
        coro = closed_loop(level, prompts, slots=slots, claim=claim, start=start,
                           on_done=lambda rec: shared.results.put(("record", rec)))
        _, wall_s = loadgen_clock.run(asyncio.wait_for(
            coro, timeout=max(0.0, deadline - loadgen_clock.clock.now())))
        shared.results.put(("done", shard, shared.t0.value + wall_s))
    except (asyncio.TimeoutError, TimeoutError):
        shared.results.put(("timeout", shard))
    except Exception as e:
        shared.results.put(("error", shard, f"{type(e).__name__}: {e}"))


def _die_with_parent() -> None:
    """Linux: the kernel ends this process when its parent dies (a driver killed by SIGKILL
    cannot reap it)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
