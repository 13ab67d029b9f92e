"""Load generator stage: a closed loop of streaming requests at a fixed concurrency.

Promises: exactly `concurrency` requests in flight until the work runs out (a new one starts
when one ends, as `vllm bench serve --max-concurrency` does); every request becomes a
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
`benchmarks/fidelity.py` measures how close that comes to a server's true timing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from pydantic import ValidationError

from tuner.errors import MeasurementFailed
from tuner.records import Prompt, RequestRecord

CONNECT_TIMEOUT_S = 30.0
MAX_HEAD_BYTES = 64 * 1024
MAX_ERROR_BODY_BYTES = 64 * 1024


def run_requests(
    url: str,
    prompts: Sequence[Prompt],
    *,
    concurrency: int,
    api_key: str,
    model: str,
    temperature: float = 0.0,
    ignore_eos: bool = False,
    warmup: bool = False,
    request_timeout_s: float = 300.0,
    level_timeout_s: float = 3600.0,
    on_done: Callable[[RequestRecord], None] | None = None,
    origin_s: float | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send `prompts` with `concurrency` in flight; return records and the wall time (s).

    Records' start_s count from the moment the connections are ready, or from `origin_s`
    (a time.perf_counter() value) where given, which puts them on the caller's clock.
    """
    # The deadline also bounds every wait inside the loop: before Python 3.12, asyncio.wait_for
    # drops a cancellation that meets a result just ready, and with thousands of slots such lost
    # cancellations kept a level running for many times --level-timeout.
    deadline = time.perf_counter() + level_timeout_s
    coro = _closed_loop(
        url, prompts, concurrency=concurrency, api_key=api_key, model=model,
        temperature=temperature, ignore_eos=ignore_eos, warmup=warmup,
        request_timeout_s=request_timeout_s, on_done=on_done, origin_s=origin_s,
        deadline=deadline)
    try:
        return _event_loop_run(asyncio.wait_for(coro, timeout=level_timeout_s))
    except (asyncio.TimeoutError, TimeoutError):
        raise MeasurementFailed(
            f"concurrency {concurrency}: {len(prompts)} requests did not finish within "
            f"{level_timeout_s:.0f} s (--level-timeout)") from None


def _event_loop_run(coro):
    """uvloop where installed (vLLM depends on it): less client overhead per streamed chunk,
    which is what keeps client-side timestamps honest at high concurrency."""
    try:
        import uvloop
    except ImportError:
        uvloop = None
    if not hasattr(asyncio, "Runner"):  # Python 3.10
        return uvloop.run(coro) if uvloop else asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop if uvloop else None) as runner:
        result = runner.run(coro)
        # Ctrl-C cancels the main task; before Python 3.12, asyncio.wait_for can swallow that
        # cancellation when a result is ready at the same moment, and the Runner then returns
        # normally and forgets the Ctrl-C. It counts SIGINTs, so the interrupt is not lost.
        if getattr(runner, "_interrupt_count", 0):
            raise KeyboardInterrupt
        return result


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


class _Response:
    """One HTTP response, parsed as its bytes arrive; stream events are timed on arrival."""

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
        self._head = b""
        self._status: int | None = None
        self._chunked = False
        self._left: int | None = None  # Content-Length bytes still to come (None: unknown)
        self._raw = b""  # chunked transfer encoding not yet decoded
        self._events = b""  # stream text not yet split into events
        self._error_body = b""

    # -- bytes in -------------------------------------------------------------------------

    def feed(self, data: bytes, now: float) -> None:
        if self.done.done():
            return
        self.received += len(data)
        try:
            if self._status is None:
                self._head += data
                cut = self._head.find(b"\r\n\r\n")
                if cut < 0:
                    if len(self._head) > MAX_HEAD_BYTES:
                        raise _RequestError("response headers too long")
                    return
                data, head = self._head[cut + 4:], self._head[:cut]
                self._head = b""
                self._parse_head(head)
            self._body(data, now)
        except _RequestError as e:
            self.keep_alive = False
            self._finish(now, str(e))

    def lost(self, exc: Exception | None, now: float) -> None:
        """The connection closed; a body that runs until close ends here, others broke off."""
        self.keep_alive = False
        if self.done.done():
            return
        if self._status is not None and not self._chunked and self._left is None:
            self._complete(now)
            return
        why = f": {exc}" if exc else ""
        if self.received == 0:
            self.unanswered = True
            self._finish(now, f"server closed the connection before answering{why}")
        else:
            self._finish(now, f"connection lost mid-response{why}")

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        if not version.startswith(b"HTTP/1."):
            raise _RequestError(f"not an HTTP response: {lines[0][:80]!r}")
        try:
            self._status = int(rest[:3])
        except ValueError:
            raise _RequestError(f"bad status line: {lines[0][:80]!r}") from None
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        connection = headers.get(b"connection", b"")
        self.keep_alive = (b"close" not in connection if version == b"HTTP/1.1"
                           else b"keep-alive" in connection)
        if b"chunked" in headers.get(b"transfer-encoding", b""):
            self._chunked = True
        elif b"content-length" in headers:
            try:
                self._left = int(headers[b"content-length"])
            except ValueError:
                raise _RequestError("bad Content-Length") from None
        else:
            self.keep_alive = False  # the body runs until the server closes

    def _body(self, data: bytes, now: float) -> None:
        if not self._chunked:
            if self._left is not None:
                data = data[:self._left]
                self._left -= len(data)
            self._payload(data, now)
            if self._left == 0:
                self._complete(now)
            return
        raw = self._raw + data if self._raw else data
        pos = 0
        while (eol := raw.find(b"\r\n", pos)) >= 0:
            try:
                size = int(raw[pos:eol].split(b";", 1)[0], 16)
            except ValueError:
                raise _RequestError(f"bad chunk size line {raw[pos:eol][:40]!r}") from None
            if size == 0:  # the last chunk; then optional trailers and an empty line
                tail = raw[eol + 2:]
                if tail.startswith(b"\r\n") or b"\r\n\r\n" in tail:
                    self._complete(now)
                break
            end = eol + 2 + size
            if len(raw) < end + 2:
                break
            self._payload(raw[eol + 2:end], now)
            if self.done.done():
                return
            pos = end + 2
        self._raw = raw[pos:]

    def _payload(self, data: bytes, now: float) -> None:
        if not data:
            return
        if self._status != 200 or not self.stream:
            room = MAX_ERROR_BODY_BYTES - len(self._error_body)
            self._error_body += data[:max(room, 0)]
            return
        text = self._events + data if self._events else data
        pos = 0
        while (cut := text.find(b"\n\n", pos)) >= 0:
            event = text[pos:cut].strip()
            pos = cut + 2
            if event:
                self._event(event, now)
                if self.done.done():
                    return
        self._events = text[pos:]

    def _event(self, event: bytes, now: float) -> None:
        if not event.startswith(b"data:"):
            raise _RequestError(f"malformed stream event: {event[:80]!r}")
        data = event[5:].strip()
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
        self._arrived.append((data, time.perf_counter()))

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
            self.response.lost(exc, time.perf_counter())

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


def _left(cap_s: float, deadline: float | None) -> float:
    """A wait of at most `cap_s` that also ends at the level's deadline."""
    return cap_s if deadline is None else max(0.0, min(cap_s, deadline - time.perf_counter()))


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
        resp = conn.response = _Response(time.perf_counter(), asyncio.get_running_loop()
                                         .create_future(), stream=stream)
        conn.transport.write(request)
        try:
            await asyncio.wait_for(asyncio.shield(resp.done), timeout=timeout_s)
        except asyncio.TimeoutError:
            resp._finish(time.perf_counter(), f"timed out after {timeout_s:.0f} s{timeout_hint}")
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
                failed = _Response(time.perf_counter(), asyncio.get_running_loop().create_future())
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


async def _closed_loop(url, prompts, *, concurrency, api_key, model, temperature, ignore_eos,
                       warmup, request_timeout_s, on_done, origin_s, deadline=None):
    target = _Target(url, api_key)
    queue: asyncio.Queue[tuple[int, Prompt]] = asyncio.Queue()
    for item in enumerate(prompts):
        queue.put_nowait(item)
    records: list[RequestRecord] = []
    slots = [_Slot(target, deadline) for _ in range(max(1, min(concurrency, len(prompts))))]
    try:
        # Connections first, off the clock; a slot that cannot connect retries per request
        # and records why.
        await asyncio.gather(*(s.connect() for s in slots))
        t0 = time.perf_counter()
        origin = t0 if origin_s is None else origin_s

        async def run(slot: _Slot) -> None:
            while deadline is None or time.perf_counter() < deadline:
                try:
                    index, prompt = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                request = target.request({
                    "model": model, "prompt": prompt.prompt, "max_tokens": prompt.output_len,
                    "temperature": temperature, "stream": True,
                    "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos,
                    "return_token_ids": True})
                resp = await slot.send(request, timeout_s=request_timeout_s)
                fields = dict(
                    concurrency=concurrency, index=index, warmup=warmup,
                    start_s=round(resp.start - origin, 6), ttft_s=resp.ttft,
                    e2e_s=None if resp.error else resp.end - resp.start,
                    prompt_tokens=resp.prompt_tokens or prompt.prompt_len,
                    output_tokens=0 if resp.error else resp.out_tokens,
                    chunk_gaps_s=tuple(resp.gaps), error=resp.error)
                prompt_ids, output_ids = resp.token_ids() or (None, None)
                try:
                    rec = RequestRecord(**fields, prompt_token_ids=prompt_ids,
                                        output_token_ids=output_ids)
                except ValidationError:  # ids that are not integers: keep the timing only
                    rec = RequestRecord(**fields)
                records.append(rec)
                if on_done:
                    on_done(rec)

        await asyncio.gather(*(run(s) for s in slots))
        wall_s = time.perf_counter() - t0
        if deadline is not None and time.perf_counter() >= deadline:
            raise asyncio.TimeoutError  # waits were cut at the deadline: the level is not done
    finally:
        for s in slots:
            s.close()
    records.sort(key=lambda r: r.index)
    return records, wall_s


class _RequestError(Exception):
    pass
