"""Load generator stage: a closed loop of streaming requests at a fixed concurrency, or
open-loop arrivals at a request rate capped at that concurrency.

Promises: exactly `concurrency` requests in flight until the work runs out (a new one starts
when one ends, as `vllm bench serve --max-concurrency` does); with a `request_rate`, request i
is sent at its seeded Poisson arrival time (poisson_arrivals: `vllm bench serve
--request-rate`'s times) or, where `concurrency` are in flight then, as soon as one ends
(vLLM's --max-concurrency semaphore); every request becomes a
RequestRecord with TTFT, end-to-end time, chunk gaps and the server's own token count (usage
of the final stream chunk), or with the error that ended it; and with the prompt and output
token ids where the engine returns them (`return_token_ids`) and their count matches that
usage, never an inexact list. All async code of the project
lives here; callers use the synchronous `run_requests`.

The client is the measuring instrument, so it is a small HTTP/1.1 client on asyncio protocols
(uvloop where installed) rather than a general one: each slot owns one keep-alive connection,
opened before the level's clock starts; a request's clock starts just before its bytes are
written, so connection set-up and the generator's own scheduling are not counted as server
latency; every chunk is stamped the moment its bytes reach the process, before any parsing.
The HTTP framing is httptools' (llhttp); the stream is read as the SSE standard says. At high
concurrency the slots are shared by several client processes, one event loop each, so no
stamp waits behind the parsing of thousands of other chunks.
`benchmarks/fidelity.py` measures how close that comes to a server's true timing.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import multiprocessing
import os
import queue
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httptools
from pydantic import ValidationError

from tuner.errors import MeasurementFailed
from tuner.records.configs import Prompt
from tuner.records.results import RequestRecord

CONNECT_TIMEOUT_S = 30.0
MAX_HEAD_BYTES = 64 * 1024
MAX_ERROR_BODY_BYTES = 64 * 1024


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


@dataclass(frozen=True)
class RequestSettings:
    """What every request of a level sends, and how long it may take: the served model name
    and API key, the sampling (`temperature`, `top_p`, `top_k`, `min_p`, `ignore_eos`), and
    the time limits of one request and of the whole level; and when they are sent:
    `request_rate` (requests/s) makes the level open loop, request i sent at
    poisson_arrivals(n, request_rate, arrival_seed)[i], never more than the level's
    concurrency in flight (None: the closed loop)."""

    model: str
    api_key: str
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    ignore_eos: bool = False
    request_timeout_s: float = 300.0
    level_timeout_s: float = 3600.0
    request_rate: float | None = None
    arrival_seed: int = 0


@dataclass(frozen=True)
class _Level:
    """One level as each client process runs it: where requests go, what they send, whether
    they are warm-up, the clock their start_s count on and when the level must have ended."""

    url: str
    settings: RequestSettings
    concurrency: int
    warmup: bool
    origin_s: float | None
    deadline: float | None
    # Open loop: request i's arrival, in seconds after t0 (poisson_arrivals); None: closed loop.
    arrivals: tuple[float, ...] | None = None
    clock: Clock | None = None  # the driver's, for client processes (None: the wall clock)


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> tuple[float, ...]:
    """When each of `n` requests arrives, in seconds from the start, at `rate` requests/s: as
    `vllm bench serve --request-rate` (burstiness 1, no ramp-up) draws them after
    np.random.seed(seed): exponential gaps (gamma, shape 1), summed, then scaled so the last
    arrives at n / rate (vLLM's normalisation); the first comes after one gap too."""
    import numpy as np

    if n <= 0:
        return ()
    if not rate > 0 or math.isinf(rate):
        raise ValueError(f"a request rate must be positive and finite, not {rate}")
    gaps = np.random.RandomState(seed).gamma(shape=1.0, scale=1.0 / rate, size=n)
    times = np.cumsum(gaps)
    times *= (n / rate) / times[-1]
    return tuple(float(t) for t in times)


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
    (a `clock.now()` value) where given, which puts them on the caller's clock.
    The slots are shared among `processes` client processes (client_processes() by default).
    """
    # The deadline also bounds every wait inside the loop: before Python 3.12, asyncio.wait_for
    # drops a cancellation that meets a result just ready, and with thousands of slots such lost
    # cancellations kept a level running for many times --level-timeout.
    timeout_s = settings.level_timeout_s
    arrivals = (None if settings.request_rate is None else
                poisson_arrivals(len(prompts), settings.request_rate, settings.arrival_seed))
    level = _Level(url=url, settings=settings, concurrency=concurrency, warmup=warmup,
                   origin_s=origin_s, deadline=clock.now() + timeout_s,
                   arrivals=arrivals, clock=clock)
    slots = max(1, min(concurrency, len(prompts)))
    processes = min(slots, processes or client_processes(slots))
    try:
        if processes > 1:
            return _run_sharded(level, list(prompts), processes=processes, slots=slots,
                                on_done=on_done)
        coro = _closed_loop(level, prompts, on_done=on_done)
        return _event_loop_run(asyncio.wait_for(coro, timeout=timeout_s))
    except (asyncio.TimeoutError, TimeoutError):
        raise MeasurementFailed(
            f"concurrency {concurrency}: {len(prompts)} requests did not finish within "
            f"{timeout_s:.0f} s (--level-timeout)") from None


def _event_loop_run(coro):
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


def _run_sharded(level: _Level, prompts: list[Prompt], *, processes: int, slots: int,
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
    """The driver's side of _run_sharded: it starts the level's clock once every child is
    ready, and gathers their records until each says it is done."""

    def __init__(self, level: _Level, shared: _Shared, workers: list,
                 on_done: Callable[[RequestRecord], None] | None) -> None:
        self.level, self.shared, self.workers, self.on_done = level, shared, workers, on_done
        self.records: list[RequestRecord] = []
        self.ends: list[float] = []
        self.ready = 0
        self.done: set[int] = set()
        self.suspects: set[int] = set()
        self.t0 = clock.now()

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
        if clock.now() > self.level.deadline + CONNECT_TIMEOUT_S:
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
                self.t0 = self.shared.t0.value = clock.now()
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


def _shard(shard: int, slots: int, shared: _Shared, level: _Level, prompts: list[Prompt],
           driver_pid: int) -> None:
    """One client process of _run_sharded: `slots` places of the closed loop."""
    # The driver ends its children; a Ctrl-C at a terminal reaches the whole process group,
    # and a child's KeyboardInterrupt would only print a second traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    global clock
    clock = level.clock or WallClock()  # the driver's: its t0 and this process's stamps agree
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
            if os.getppid() != driver_pid or clock.now() > deadline:
                raise asyncio.TimeoutError
        return shared.t0.value

    try:
        coro = _closed_loop(level, prompts, slots=slots, claim=claim, start=start,
                            on_done=lambda rec: shared.results.put(("record", rec)))
        _, wall_s = _event_loop_run(asyncio.wait_for(
            coro, timeout=max(0.0, deadline - clock.now())))
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


def _json_codec():
    try:
        import msgspec

        return msgspec.json.decode, msgspec.json.encode, (ValueError, msgspec.DecodeError)
    except ImportError:
        return json.loads, lambda obj: json.dumps(obj).encode(), (ValueError,)


_loads, _dumps, _DECODE_ERRORS = _json_codec()


class _Target:
    """Where requests go, and the fixed part of every request's bytes."""

    def __init__(self, url: str, api_key: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            # The engine is always ours, on loopback; a URL of another shape is a bug.
            raise ValueError(f"the load generator speaks plain HTTP to the engine, not {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.address = f"{self.host}:{self.port}"
        self.health = (f"GET {parts.path.rstrip('/')}/health HTTP/1.1\r\nHost: {parts.netloc}"
                       "\r\n\r\n").encode()
        self.head = (f"POST {parts.path.rstrip('/')}/v1/completions HTTP/1.1\r\n"
                     f"Host: {parts.netloc}\r\nAuthorization: Bearer {api_key}\r\n"
                     "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                     "Content-Length: ").encode()

    def request(self, payload: dict) -> bytes:
        body = _dumps(payload)
        return b"%s%d\r\n\r\n%s" % (self.head, len(body), body)


class _EventStream:
    """Server-sent events from bytes as they arrive, as the WHATWG HTML standard parses them
    ("Parsing an event stream"): lines end in CRLF, LF or CR; a line that opens with `:` is a
    comment (servers send `: ping` to keep a connection alive); fields are data, event, id and
    retry, others are ignored; data lines join with LF; a blank line dispatches the event, and
    an event without data is none. Bytes stay bytes: the JSON decoder reads UTF-8 itself."""

    def __init__(self) -> None:
        self._line = b""  # an unfinished line
        self._after_cr = False  # the last line ended in CR: a LF that comes next ends no line
        self._first = True  # a byte-order mark may open the stream
        self._data: list[bytes] = []
        self._type = b""
        self.last_id = b""
        self.retry_ms: int | None = None

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """The (type, data) of every event that `data` completes, in order."""
        if self._after_cr and data:
            self._after_cr = False
            if data[:1] == b"\n":
                data = data[1:]
        buf = self._line + data if self._line else data
        if not buf:
            return []
        # bytes.splitlines breaks at CRLF, LF and CR only (str.splitlines would break at more).
        lines = buf.splitlines()
        self._after_cr = buf.endswith(b"\r")
        self._line = b"" if buf.endswith((b"\n", b"\r")) else lines.pop()
        if self._first and lines:
            self._first = False
            lines[0] = lines[0].removeprefix(b"\xef\xbb\xbf")
        events = []
        for line in lines:
            if not line:
                if self._data:
                    events.append((self._type or b"message", b"\n".join(self._data)))
                self._data, self._type = [], b""
                continue
            name, colon, value = line.partition(b":")
            if not name:
                continue  # a comment
            if colon and value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                self._data.append(value)
            elif name == b"event":
                self._type = value
            elif name == b"id":
                if b"\0" not in value:
                    self.last_id = value
            elif name == b"retry" and value.isdigit():
                self.retry_ms = int(value)
        return events


class _Response:
    """One HTTP response, parsed as its bytes arrive; stream events are timed on arrival.

    httptools (llhttp, the parser of Node.js and uvicorn) does the HTTP/1.1 framing: status
    line, headers, Content-Length, chunked encoding, interim 1xx answers. Everything it hands
    on is stamped with the arrival time of the read that carried it.
    """

    def __init__(self, start: float, done: asyncio.Future, *, stream: bool = True) -> None:
        self.start = start
        self.done = done
        self.stream = stream
        self.ttft: float | None = None
        self.last = start
        self.gaps: list[float] = []
        self.out_tokens = 0
        self.prompt_tokens: int | None = None
        self.prompt_ids: list[int] | None = None
        self.output_ids: list[int] = []
        self._ids_broken = False
        self.error: str | None = None
        self.end: float | None = None
        self.received = 0  # bytes of the response so far
        self.unanswered = False  # the server closed the connection without a byte of answer
        self.keep_alive = True
        self._parser = httptools.HttpResponseParser(self)
        self._now = start  # arrival time of the bytes being parsed
        self._status: int | None = None  # of the final answer, once its head is complete
        self._interim = False  # parsing a 1xx answer, which a final one follows
        self._framed = False  # Content-Length or chunked: the body's end is in the bytes
        self._events = _EventStream()
        self._error_body = b""

    # -- bytes in -------------------------------------------------------------------------

    def feed(self, data: bytes, now: float) -> None:
        if self.done.done():
            return
        self.received += len(data)
        self._now = now
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            # A callback's own _RequestError arrives wrapped, as the exception's context.
            cause = e.__context__
            self.keep_alive = False
            self._finish(now, str(cause) if isinstance(cause, _RequestError)
                         else f"malformed HTTP response: {e}")
            return
        # llhttp buffers a head without limit; ours is bounded, as before.
        if self._status is None and self.received > MAX_HEAD_BYTES:
            self.keep_alive = False
            self._finish(now, "response headers too long")

    def lost(self, exc: Exception | None, now: float) -> None:
        """The connection closed; a body that runs until close ends here, others broke off."""
        self.keep_alive = False
        if self.done.done():
            return
        if self._status is not None and not self._framed:
            self._complete(now)
            return
        why = f": {exc}" if exc else ""
        if self.received == 0:
            self.unanswered = True
            self._finish(now, f"server closed the connection before answering{why}")
        else:
            self._finish(now, f"connection lost mid-response{why}")

    # -- httptools callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._interim, self._framed = False, False

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # 100 Continue, 103 Early Hints: the answer comes after
            self._interim = True
            return
        self._status = status
        self.keep_alive = self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if not self._interim and not self.done.done():
            self._payload(body, self._now)

    def on_message_complete(self) -> None:
        if not self._interim:
            self._complete(self._now)

    # -- the body -------------------------------------------------------------------------

    def _payload(self, data: bytes, now: float) -> None:
        if not data:
            return
        if self._status != 200 or not self.stream:
            room = MAX_ERROR_BODY_BYTES - len(self._error_body)
            self._error_body += data[:max(room, 0)]
            return
        for kind, event in self._events.feed(data):
            self._event(kind, event, now)
            if self.done.done():
                return

    def _event(self, kind: bytes, data: bytes, now: float) -> None:
        if kind != b"message":
            if kind == b"error":
                raise _RequestError("server error in stream: "
                                     + data[:200].decode("utf-8", "replace"))
            return  # a named event a completion stream does not use (pings, keep-alives)
        if data == b"[DONE]":
            return
        try:
            chunk = _loads(data)
        except _DECODE_ERRORS:
            raise _RequestError(f"malformed JSON chunk: {data[:80]!r}") from None
        if not isinstance(chunk, dict):
            raise _RequestError(f"malformed chunk: {data[:80]!r}")
        if "error" in chunk:
            raise _RequestError(f"server error in stream: {str(chunk['error'])[:200]}")
        choices = chunk.get("choices")
        if choices:
            if self.ttft is None:
                self.ttft = now - self.start
            else:
                self.gaps.append(now - self.last)
            self.last = now
            # Token ids (vLLM's return_token_ids): the prompt's in the first chunk, each
            # chunk's new ones in every chunk. Checked once, in token_ids(), not per chunk.
            choice = choices[0]
            if isinstance(choice, dict):
                ids = choice.get("token_ids")
                if ids:
                    try:
                        self.output_ids.extend(ids)
                    except TypeError:  # not a list: no exact capture for this request
                        self._ids_broken = True
                if self.prompt_ids is None:
                    self.prompt_ids = choice.get("prompt_token_ids")
        usage = chunk.get("usage")
        if usage:
            self.out_tokens = int(usage.get("completion_tokens") or 0)
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0) or None

    # -- outcome --------------------------------------------------------------------------

    def _complete(self, now: float) -> None:
        if self._status != 200:
            body = self._error_body.decode("utf-8", "replace")[:300]
            self._finish(now, f"HTTP {self._status}: {body}")
        elif not self.stream:
            self._finish(now, None)
        elif self.ttft is None:
            self._finish(now, "stream ended without any token")
        elif self.out_tokens == 0:
            self._finish(now, "stream ended without a usage chunk (token count unknown)")
        else:
            self._finish(now, None)

    def _finish(self, now: float, error: str | None) -> None:
        if not self.done.done():
            self.error, self.end = error, now
            self.done.set_result(None)

    def token_ids(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """Prompt and output ids of a completed request, or None unless they are exact: the
        prompt's came, and there are as many output ids as the usage chunk counted (an
        engine that ignores return_token_ids sends none)."""
        if (self.error is not None or self._ids_broken or not isinstance(self.prompt_ids, list)
                or len(self.output_ids) != self.out_tokens):
            return None
        return tuple(self.prompt_ids), tuple(self.output_ids)


class _Protocol(asyncio.Protocol):
    """One connection; at most one request on it at a time (no pipelining)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.response: _Response | None = None
        self.closed = False
        self.requests = 0
        self._arrived: list[tuple[bytes, float]] = []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        # Stamp now, parse later: when a hundred streams are readable at once, the loop calls
        # this for each of them before it runs what call_soon queued, so every chunk is
        # stamped at its arrival rather than after the parsing of the chunks before it.
        if not self._arrived:
            asyncio.get_running_loop().call_soon(self._parse)
        self._arrived.append((data, clock.now()))

    def _parse(self) -> None:
        arrived, self._arrived = self._arrived, []
        if self.response is not None:
            for data, now in arrived:
                self.response.feed(data, now)

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._parse()
        if self.response is not None:
            self.response.lost(exc, clock.now())

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


def _left(cap_s: float, deadline: float | None) -> float:
    """A wait of at most `cap_s` that also ends at the level's deadline."""
    return cap_s if deadline is None else max(0.0, min(cap_s, deadline - clock.now()))


class _Slot:
    """One place in the closed loop, with its own keep-alive connection."""

    def __init__(self, target: _Target, deadline: float | None = None) -> None:
        self.target = target
        self.deadline = deadline
        self.conn: _Protocol | None = None

    async def connect(self) -> str | None:
        """A live connection (opened if needed), or why there is none.

        A new connection also answers one GET /health before it is used: the kernel completes
        a TCP handshake before the server's event loop has accepted the connection, and a
        server that accepts a hundred at once would otherwise charge that to the first
        request's TTFT."""
        if self.conn is not None and not self.conn.closed:
            return None
        loop = asyncio.get_running_loop()
        try:
            _, self.conn = await asyncio.wait_for(
                loop.create_connection(_Protocol, self.target.host, self.target.port),
                timeout=_left(CONNECT_TIMEOUT_S, self.deadline))
        except (OSError, asyncio.TimeoutError) as e:
            self.conn = None
            reason = getattr(e, "strerror", None) or type(e).__name__
            return f"cannot connect to {self.target.address}: {reason}"
        health = await self._exchange(self.target.health,
                                      timeout_s=_left(CONNECT_TIMEOUT_S, self.deadline),
                                      timeout_hint="", stream=False)
        if health.error is not None:
            # Not fatal here: the request itself will tell what is wrong with the server.
            self.close()
            self.conn = None
            return f"{self.target.address} did not answer GET /health: {health.error}"
        return None

    async def _exchange(self, request: bytes, *, timeout_s: float,
                        timeout_hint: str = " (--request-timeout)",
                        stream: bool = True) -> _Response:
        conn = self.conn
        conn.requests += 1
        resp = conn.response = _Response(clock.now(), asyncio.get_running_loop()
                                         .create_future(), stream=stream)
        conn.transport.write(request)
        try:
            await asyncio.wait_for(asyncio.shield(resp.done), timeout=timeout_s)
        except asyncio.TimeoutError:
            resp._finish(clock.now(), f"timed out after {timeout_s:.0f} s{timeout_hint}")
            resp.keep_alive = False
        conn.response = None
        if not resp.keep_alive:
            conn.close()
        return resp

    async def send(self, request: bytes, *, timeout_s: float) -> _Response:
        """One request and its whole response. A keep-alive connection the server closed
        while idle is retried once on a fresh one, as any HTTP client does."""
        for attempt in (0, 1):
            if (why := await self.connect()) is not None:
                failed = _Response(clock.now(), asyncio.get_running_loop().create_future())
                failed._finish(failed.start, why)
                return failed
            reused = self.conn.requests > 1  # beyond its GET /health
            resp = await self._exchange(request, timeout_s=_left(timeout_s, self.deadline))
            if not (reused and resp.unanswered) or attempt == 1:
                return resp
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


async def _closed_loop(level: _Level, prompts: Sequence[Prompt], *,
                       on_done: Callable[[RequestRecord], None] | None,
                       slots: int | None = None, claim=None, start=None
                       ) -> tuple[list[RequestRecord], float]:
    """The closed loop in this process: `slots` places (all of the level's by default), each
    taking the next prompt from `claim` (index order by default), once `start` (now by
    default) says the level's clock runs and returns its t0. Open loop (`level.arrivals`),
    a place that claims prompt i waits for its arrival before sending it."""
    target = _Target(level.url, level.settings.api_key)
    if claim is None:
        pending = iter(enumerate(prompts))

        def claim():
            return next(pending, None)
    records: list[RequestRecord] = []
    deadline = level.deadline
    places = [_Slot(target, deadline)
              for _ in range(slots or max(1, min(level.concurrency, len(prompts))))]
    try:
        # Connections first, off the clock; a slot that cannot connect retries per request
        # and records why.
        await asyncio.gather(*(s.connect() for s in places))
        t0 = start() if start is not None else clock.now()
        origin = t0 if level.origin_s is None else level.origin_s

        async def run(slot: _Slot) -> None:
            while deadline is None or clock.now() < deadline:
                if (item := claim()) is None:
                    return
                if level.arrivals is not None:  # open loop: not before its arrival
                    wait_s = t0 + level.arrivals[item[0]] - clock.now()
                    if wait_s > 0:
                        await asyncio.sleep(_left(wait_s, deadline))
                rec = await _one_request(level, target, slot, *item, origin=origin)
                records.append(rec)
                if on_done:
                    on_done(rec)

        await asyncio.gather(*(run(s) for s in places))
        wall_s = clock.now() - t0
        if deadline is not None and clock.now() >= deadline:
            raise asyncio.TimeoutError  # waits were cut at the deadline: the level is not done
    finally:
        for s in places:
            s.close()
    records.sort(key=lambda r: r.index)
    return records, wall_s


async def _one_request(level: _Level, target: _Target, slot: _Slot, index: int, prompt: Prompt,
                       *, origin: float) -> RequestRecord:
    """Send one prompt on `slot` and record how it went."""
    settings = level.settings
    request = target.request({
        "model": settings.model, "prompt": prompt.prompt, "max_tokens": prompt.output_len,
        "temperature": settings.temperature, **_sampling(settings), "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": settings.ignore_eos,
        "return_token_ids": True})
    resp = await slot.send(request, timeout_s=settings.request_timeout_s)
    fields = dict(
        concurrency=level.concurrency, index=index, warmup=level.warmup,
        start_s=round(resp.start - origin, 6), ttft_s=resp.ttft,
        e2e_s=None if resp.error else resp.end - resp.start,
        prompt_tokens=resp.prompt_tokens or prompt.prompt_len,
        output_tokens=0 if resp.error else resp.out_tokens,
        chunk_gaps_s=tuple(resp.gaps), error=resp.error)
    prompt_ids, output_ids = resp.token_ids() or (None, None)
    try:
        return RequestRecord(**fields, prompt_token_ids=prompt_ids, output_token_ids=output_ids)
    except ValidationError:  # ids that are not integers: keep the timing only
        return RequestRecord(**fields)


def _sampling(settings: RequestSettings) -> dict[str, float]:
    """top_p, top_k and min_p where they are not off; when sampling, all three: a server fills
    in what a request leaves out from the model's generation config (vLLM's default), which
    may trim the distribution the study records as untrimmed."""
    values = {"top_p": (settings.top_p, 1.0), "top_k": (settings.top_k, 0),
              "min_p": (settings.min_p, 0.0)}
    return {k: v for k, (v, off) in values.items() if settings.temperature > 0 or v != off}


class _RequestError(Exception):
    pass
