"""The load generator's HTTP/1.1 response parsing, byte by byte, without a server.

The client is the measuring instrument, so its parser must give the same answer however the
kernel splits a response into reads: the properties feed one response in random pieces.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.measure import loadgen
from tuner.measure.loadgen import _Response


def _sse(tokens: int, *, usage: bool = True) -> bytes:
    events = [b'data: {"choices":[{"index":0,"text":" t%d"}]}\n\n' % i for i in range(tokens)]
    if usage:
        events.append(b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d}}'
                      b"\n\n" % tokens)
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


def _chunked(body: bytes, *, piece: int = 40) -> bytes:
    out = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(body[i:i + piece]), body[i:i + piece])
                   for i in range(0, len(body), piece))
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + out + b"0\r\n\r\n")


def _feed(raw: bytes, cuts: list[int], *, stream: bool = True) -> _Response:
    loop = asyncio.new_event_loop()
    try:
        resp = _Response(0.0, loop.create_future(), stream=stream)
        bounds = [0, *sorted({c % (len(raw) + 1) for c in cuts}), len(raw)]
        for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
            resp.feed(raw[a:b], float(i + 1))
        return resp
    finally:
        loop.close()


@settings(max_examples=200, deadline=None)
@given(tokens=st.integers(1, 12), piece=st.integers(1, 90),
       cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_a_chunked_stream_parses_the_same_however_it_is_split(tokens, piece, cuts) -> None:
    resp = _feed(_chunked(_sse(tokens), piece=piece), cuts)
    assert resp.done.done() and resp.error is None
    assert resp.out_tokens == tokens and resp.prompt_tokens == 7
    assert len(resp.gaps) == tokens - 1
    assert resp.ttft is not None and resp.ttft >= 1.0  # stamped at a read, never before
    assert resp.keep_alive


@given(cuts=st.lists(st.integers(0, 10_000), max_size=6))
def test_an_error_body_with_content_length_becomes_the_message(cuts) -> None:
    body = json.dumps({"error": {"message": "prompt_lookup_min must be <= max"}}).encode()
    raw = (b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n" % len(body)) + body
    resp = _feed(raw, cuts)
    assert resp.done.done()
    assert resp.error.startswith("HTTP 400: ") and "prompt_lookup_min" in resp.error


def test_a_stream_without_usage_or_tokens_is_an_error() -> None:
    assert _feed(_chunked(_sse(3, usage=False)), []).error.startswith(
        "stream ended without a usage chunk")
    assert _feed(_chunked(b"data: [DONE]\n\n"), []).error == "stream ended without any token"


@pytest.mark.parametrize("bad, message", [
    (b'data: {"choices": [{"text": \n\n', "malformed JSON chunk"),
    (b"event: error\ndata: engine dead\n\n", "server error in stream: engine dead"),
    (b'data: {"error": {"message": "engine dead"}}\n\n', "server error in stream"),
])
def test_broken_streams_end_the_request_with_the_reason(bad, message) -> None:
    first_token = _sse(2).split(b"\n\n")[0] + b"\n\n"
    resp = _feed(_chunked(first_token + bad), [])
    assert message in resp.error and not resp.keep_alive


def test_garbage_and_broken_framing_are_errors_not_exceptions() -> None:
    assert "malformed HTTP response" in _feed(b"SSH-2.0-OpenSSH\r\n\r\n", []).error
    bad_size = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
    assert "chunk size" in _feed(bad_size, []).error
    huge = b"HTTP/1.1 200 OK\r\n" + b"x-pad: %s\r\n" % (b"a" * loadgen.MAX_HEAD_BYTES)
    assert _feed(huge, [7]).error == "response headers too long"


def test_a_body_until_close_and_a_connection_lost_midway() -> None:
    loop = asyncio.new_event_loop()
    try:
        until_close = _Response(0.0, loop.create_future())
        until_close.feed(b"HTTP/1.0 200 OK\r\n\r\n" + _sse(2), 1.0)
        assert not until_close.done.done()
        until_close.lost(None, 2.0)
        assert until_close.error is None and until_close.out_tokens == 2

        cut = _Response(0.0, loop.create_future())
        cut.feed(_chunked(_sse(4))[:120], 1.0)
        cut.lost(ConnectionResetError("reset"), 2.0)
        assert cut.error.startswith("connection lost mid-response")

        silent = _Response(0.0, loop.create_future())
        silent.lost(None, 1.0)
        assert silent.error.startswith("server closed the connection before answering")
    finally:
        loop.close()


def test_health_answers_are_not_streams() -> None:
    resp = _feed(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", [], stream=False)
    assert resp.done.done() and resp.error is None


def _sse_ids(prompt: list[int], chunks: list[list[int]], *, usage: int | None = None) -> bytes:
    """vLLM's stream with return_token_ids: prompt ids in the first chunk (null after), each
    chunk's new ids; the final usage chunk has no choices."""
    events = [json.dumps({"choices": [{"index": 0, "text": "x", "prompt_token_ids":
                                       prompt if i == 0 else None, "token_ids": ids,
                                       "finish_reason": "stop" if i == len(chunks) - 1 else None}]
                          }).encode() for i, ids in enumerate(chunks)]
    count = sum(map(len, chunks)) if usage is None else usage
    events.append(b'{"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}'
                  % (len(prompt or ()), count))
    return b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n"


@settings(max_examples=100, deadline=None)
@given(prompt=st.lists(st.integers(0, 49151), min_size=1, max_size=40),
       chunks=st.lists(st.lists(st.integers(0, 49151), min_size=1, max_size=5), min_size=1,
                       max_size=10),
       piece=st.integers(1, 90), cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_token_ids_are_collected_from_every_chunk_however_split(prompt, chunks, piece,
                                                                 cuts) -> None:
    resp = _feed(_chunked(_sse_ids(prompt, chunks), piece=piece), cuts)
    assert resp.error is None and resp.out_tokens == sum(map(len, chunks))
    assert resp.token_ids() == (tuple(prompt), tuple(i for c in chunks for i in c))
    assert len(resp.gaps) == len(chunks) - 1  # a chunk of several ids is one arrival


def test_token_ids_that_disagree_with_usage_or_are_missing_give_none() -> None:
    short = _feed(_chunked(_sse_ids([5, 6], [[1], [2, 3]], usage=4)), [])
    assert short.error is None and short.out_tokens == 4
    assert short.token_ids() is None  # a capture must be exact or absent
    no_ids = _feed(_chunked(_sse(3)), [])  # an engine that ignores return_token_ids
    assert no_ids.error is None and no_ids.token_ids() is None
    no_prompt = _feed(_chunked(_sse_ids(None, [[1], [2]])), [])  # type: ignore[arg-type]
    assert no_prompt.error is None and no_prompt.token_ids() is None
    broken = _feed(_chunked(_sse_ids([5], [[1, 2], 7], usage=2)), [])  # type: ignore[list-item]
    assert broken.error is None and broken.token_ids() is None


def test_a_record_carries_exact_ids_and_the_request_asks_for_them() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    bodies: list[dict] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            data = b""
            for answer in (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",  # GET /health
                           _chunked(_sse_ids([9, 8, 7], [[1], [2, 3, 4], [0]])),
                           _chunked(_sse_ids([9], [[1], [2]], usage=3))):
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, data = data.partition(b"\r\n\r\n")
                length = int(head.lower().partition(b"content-length:")[2].split(b"\r\n")[0]
                             or 0)
                while len(data) < length:
                    data += conn.recv(65536)
                if head.startswith(b"POST"):
                    bodies.append(json.loads(data[:length]))
                data = data[length:]
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    records = _requests_to(srv, n=2, output_len=5)
    assert [r.error for r in records] == [None, None]
    assert [b["return_token_ids"] for b in bodies] == [True, True]
    assert records[0].prompt_token_ids == (9, 8, 7)
    assert records[0].output_token_ids == (1, 2, 3, 4, 0) and records[0].output_tokens == 5
    # The count disagrees with usage: the timing stays, the ids go.
    assert records[1].output_tokens == 3
    assert records[1].prompt_token_ids is None and records[1].output_token_ids is None

def _read_request(conn: socket.socket, data: bytes) -> tuple[bytes, bytes]:
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            raise ConnectionError
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(rest) < length:
        rest += conn.recv(65536)
    return head, rest[length:]


def _one_post_per_connection_server() -> tuple[socket.socket, list[str]]:
    """A server that answers GET /health and one POST per connection, then reads the next
    request and closes without a word, as a keep-alive timeout racing a request does."""
    srv = socket.create_server(("127.0.0.1", 0))
    log: list[str] = []

    def serve(conn: socket.socket) -> None:
        with conn:
            data, posts = b"", 0
            try:
                while True:
                    head, data = _read_request(conn, data)
                    if head.startswith(b"GET /health"):
                        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    elif posts == 0:
                        posts += 1
                        # Logged before the bytes go out: the client may finish its last
                        # request and the test read the log before this thread runs again.
                        log.append("answered")
                        conn.sendall(_chunked(_sse(3)))
                    else:
                        log.append("dropped")
                        return
            except ConnectionError:
                return

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return srv, log


def _requests_to(srv: socket.socket, *, n: int, output_len: int) -> list:
    """n requests, one at a time, to a local test server; closes the server after."""
    from tuner.records import Prompt

    try:
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        prompts = [Prompt(prompt=f"p{i}", prompt_len=1, output_len=output_len)
                   for i in range(n)]
        records, _ = loadgen.run_requests(url, prompts, concurrency=1, api_key="k", model="m",
                                          request_timeout_s=10)
    finally:
        srv.close()
    return records


def test_a_keep_alive_connection_closed_while_idle_is_retried_once() -> None:
    srv, log = _one_post_per_connection_server()
    records = _requests_to(srv, n=4, output_len=3)
    assert [r.error for r in records] == [None] * 4
    assert all(r.output_tokens == 3 for r in records)
    assert log == ["answered", "dropped"] * 3 + ["answered"]


def test_no_wait_outlives_the_level_deadline_even_without_a_cancellation() -> None:
    # Before Python 3.12 asyncio.wait_for can lose the cancellation that --level-timeout sends
    # (thousands of slots made that common), so the loop must stop on its own at the deadline.
    import time

    from tuner.records import Prompt

    srv = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:  # answers GET /health, then never a POST
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)
            _read_request(conn, b"")
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    prompts = [Prompt(prompt=f"p{i}", prompt_len=1, output_len=3) for i in range(6)]
    t0 = time.perf_counter()
    try:
        with pytest.raises(asyncio.TimeoutError):
            asyncio.run(loadgen._closed_loop(  # no outer wait_for: only the deadline stops it
                url, prompts, concurrency=2, api_key="k", model="m", temperature=0.0,
                ignore_eos=False, warmup=False, request_timeout_s=30.0, on_done=None,
                origin_s=None, deadline=t0 + 0.5))
    finally:
        srv.close()
        for conn in held:
            conn.close()
    assert time.perf_counter() - t0 < 3.0


def test_a_ctrl_c_whose_cancellation_is_swallowed_still_interrupts():
    """Before Python 3.12 asyncio.wait_for can swallow the cancellation a Ctrl-C sends the
    main task; the level then ended normally and the Ctrl-C was lost (a CI run showed it)."""
    import os
    import signal

    async def swallowing():
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "swallowed"  # what wait_for did when a result was ready at that moment
        return "slept"

    with pytest.raises(KeyboardInterrupt):
        loadgen._event_loop_run(swallowing())


# --- framing: what the SSE standard and HTTP/1.1 allow, each against a raw socket server -------

def _spec_stream(tokens: int, *, eol: bytes = b"\n") -> bytes:
    """A completion stream using what the SSE standard allows beyond vLLM's plain `data:`
    lines: a byte-order mark, comments, event and id and retry fields, data split over lines,
    named events a completion stream ignores, and the given line end everywhere."""
    lines = [b"\xef\xbb\xbf: stream opened", b"retry: 3000", b""]
    for i in range(tokens):
        lines += [b": ping", b""] if i % 2 else []
        lines += [b"event: message", b"id: %d" % i, b'data: {"choices":',
                  b'data:[{"index":0,"text":" t%d"}]}' % i, b""]
        lines += [b"event: ping", b"data: not json, and no concern of a completion", b""]
    lines += [b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d}}'
              % tokens, b"", b"data: [DONE]", b"", b""]
    return eol.join(lines)


def _framed(body: bytes, framing: str) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    if framing == "chunked":
        return _chunked(body, piece=23)
    if framing == "continue":  # an interim answer first, as to `Expect: 100-continue`
        return b"HTTP/1.1 100 Continue\r\n\r\n" + _chunked(body, piece=23)
    if framing == "length":
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    raise ValueError(framing)


FRAMINGS = [(eol, framing) for eol in (b"\n", b"\r\n", b"\r")
            for framing in ("chunked", "continue", "length")]


@pytest.mark.parametrize("eol, framing", FRAMINGS)
def test_every_framing_parses_the_same_at_every_single_cut(eol, framing) -> None:
    raw = _framed(_spec_stream(3, eol=eol), framing)
    for cuts in [[k] for k in range(1, len(raw))] + [list(range(1, len(raw)))]:
        resp = _feed(raw, cuts)
        assert resp.error is None, (cuts[:3], resp.error)
        assert resp.out_tokens == 3 and len(resp.gaps) == 2 and resp.keep_alive


def test_sse_fields_follow_the_standard() -> None:
    events = loadgen._EventStream()
    got = events.feed(b"data\n\n:comment\ndata:a\ndata: b\r\n\nid: 7\nretry: 25\nretry: x\n"
                      b"event: e1\nunknown: 1\ndata:  c\r\r\nevent: lone\n\ndata: d\r")
    assert got == [(b"message", b""), (b"message", b"a\nb"), (b"e1", b" c")]
    assert events.last_id == b"7" and events.retry_ms == 25
    assert events.feed(b"\n") == []  # CR then LF: one line end, not two
    assert events.feed(b"\n") == [(b"message", b"d")]


def _raw_server(answers: list[list[bytes]], *, pause_s: float = 0.0) -> socket.socket:
    """Answers GET /health, then each POST with the next answer's pieces, one write each and
    `pause_s` between them (TCP_NODELAY), so the pieces reach the client as separate reads."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            data, todo = b"", iter(answers)
            try:
                while True:
                    head, data = _read_request(conn, data)
                    if head.startswith(b"GET /health"):
                        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        continue
                    for i, piece in enumerate(next(todo)):
                        if i and pause_s:
                            time.sleep(pause_s)
                        conn.sendall(piece)
            except (ConnectionError, StopIteration):
                return

    threading.Thread(target=serve, daemon=True).start()
    return srv


@pytest.mark.parametrize("eol, framing", FRAMINGS)
def test_every_framing_against_a_socket_server(eol, framing) -> None:
    raw = _framed(_spec_stream(4, eol=eol), framing)
    pieces = [raw[i:i + 29] for i in range(0, len(raw), 29)]
    records = _requests_to(_raw_server([pieces, [raw]], pause_s=0.001), n=2, output_len=4)
    assert [r.error for r in records] == [None, None]
    assert [r.output_tokens for r in records] == [4, 4]
    assert all(len(r.chunk_gaps_s) == 3 and r.ttft_s > 0 for r in records)


def test_a_response_split_at_every_byte_boundary_across_tcp_reads() -> None:
    raw = _framed(_spec_stream(2, eol=b"\r\n"), "continue")
    records = _requests_to(_raw_server([[raw[:k], raw[k:]] for k in range(1, len(raw))],
                                       pause_s=0.0005), n=len(raw) - 1, output_len=2)
    assert [r.error for r in records] == [None] * (len(raw) - 1)
    assert all(r.output_tokens == 2 and len(r.chunk_gaps_s) == 1 for r in records)


def test_chunk_arrival_times_are_those_of_the_reads_that_complete_the_events() -> None:
    # The second event's blank line comes 0.2 s after the rest of it: its arrival is then.
    raw = _framed(_spec_stream(2), "length")
    cut = raw.index(b't1"}]}\n') + 7
    records = _requests_to(_raw_server([[raw[:cut], raw[cut:]]], pause_s=0.2), n=1,
                           output_len=2)
    assert records[0].error is None
    # Not exactly 0.2: this process's server thread and client share the GIL, so the first
    # read may be stamped a little late on a busy machine; stamped early, the gap would be ~0.
    assert records[0].chunk_gaps_s[0] >= 0.15
