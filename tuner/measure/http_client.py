"""Measure stage, the load generator's HTTP client: one keep-alive connection per slot of a
level, one streamed completion request on it at a time, every chunk stamped on arrival.

The client is the measuring instrument, so it is a small HTTP/1.1 client on asyncio protocols
rather than a general one: a slot's connection is opened, and checked with GET /health, before
the level's clock starts; a request's clock starts just before its bytes are written, so
connection set-up and the generator's own scheduling are not counted as server latency; every
chunk is stamped (tuner.measure.loadgen_clock) the moment its bytes reach the process, before
any parsing. The HTTP framing is httptools' (llhttp); the stream is read as the SSE standard
says (tuner.measure.event_stream).
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import httptools

from tuner.measure import loadgen_clock
from tuner.measure.event_stream import EventStream

CONNECT_TIMEOUT_S = 30.0
MAX_HEAD_BYTES = 64 * 1024
MAX_ERROR_BODY_BYTES = 64 * 1024


class _RequestError(Exception):
    pass


def _json_codec():
    try:
        import msgspec

        return msgspec.json.decode, msgspec.json.encode, (ValueError, msgspec.DecodeError)
    except ImportError:
        return json.loads, lambda obj: json.dumps(obj).encode(), (ValueError,)


_loads, _dumps, _DECODE_ERRORS = _json_codec()


class Target:
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


class Response:
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
        self._events = EventStream()
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
        self.response: Response | None = None
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
        self._arrived.append((data, loadgen_clock.clock.now()))

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
            self.response.lost(exc, loadgen_clock.clock.now())

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


def wait_within(cap_s: float, deadline: float | None) -> float:
    """A wait of at most `cap_s` that also ends at the level's deadline."""
    if deadline is None:
        return cap_s
    return max(0.0, min(cap_s, deadline - loadgen_clock.clock.now()))


class Slot:
    """One place in the closed loop, with its own keep-alive connection."""

    def __init__(self, target: Target, deadline: float | None = None) -> None:
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
                timeout=wait_within(CONNECT_TIMEOUT_S, self.deadline))
        except (OSError, asyncio.TimeoutError) as e:
            self.conn = None
            reason = getattr(e, "strerror", None) or type(e).__name__
            return f"cannot connect to {self.target.address}: {reason}"
        health = await self._exchange(self.target.health,
                                      timeout_s=wait_within(CONNECT_TIMEOUT_S, self.deadline),
                                      timeout_hint="", stream=False)
        if health.error is not None:
            # Not fatal here: the request itself will tell what is wrong with the server.
            self.close()
            self.conn = None
            return f"{self.target.address} did not answer GET /health: {health.error}"
        return None

    async def _exchange(self, request: bytes, *, timeout_s: float,
                        timeout_hint: str = " (--request-timeout)",
                        stream: bool = True) -> Response:
        conn = self.conn
        conn.requests += 1
        resp = conn.response = Response(loadgen_clock.clock.now(),
                                        asyncio.get_running_loop().create_future(),
                                        stream=stream)
        conn.transport.write(request)
        try:
            await asyncio.wait_for(asyncio.shield(resp.done), timeout=timeout_s)
        except asyncio.TimeoutError:
            resp._finish(loadgen_clock.clock.now(),
                         f"timed out after {timeout_s:.0f} s{timeout_hint}")
            resp.keep_alive = False
        conn.response = None
        if not resp.keep_alive:
            conn.close()
        return resp

    async def send(self, request: bytes, *, timeout_s: float) -> Response:
        """One request and its whole response. A keep-alive connection the server closed
        while idle is retried once on a fresh one, as any HTTP client does."""
        for attempt in (0, 1):
            if (why := await self.connect()) is not None:
                failed = Response(loadgen_clock.clock.now(),
                                  asyncio.get_running_loop().create_future())
                failed._finish(failed.start, why)
                return failed
            reused = self.conn.requests > 1  # beyond its GET /health
            resp = await self._exchange(request, timeout_s=wait_within(timeout_s, self.deadline))
            if not (reused and resp.unanswered) or attempt == 1:
                return resp
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
