"""The load generator's HTTP/1.1 response parsing, byte by byte, without a server.

The client is the measuring instrument, so its parser must give the same answer however the
kernel splits a response into reads: the properties feed one response in random pieces. The
same bytes against socket servers on loopback: tests/integration/test_loadgen_sockets.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from http_bytes import FRAMINGS, chunked, framed, spec_stream, sse, sse_ids
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.measure import loadgen_clock
from tuner.measure.event_stream import EventStream
from tuner.measure.http_client import MAX_HEAD_BYTES, Response


def _feed(raw: bytes, cuts: list[int], *, stream: bool = True) -> Response:
    loop = asyncio.new_event_loop()
    try:
        resp = Response(0.0, loop.create_future(), stream=stream)
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
    resp = _feed(chunked(sse(tokens), piece=piece), cuts)
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
    assert _feed(chunked(sse(3, usage=False)), []).error.startswith(
        "stream ended without a usage chunk")
    assert _feed(chunked(b"data: [DONE]\n\n"), []).error == "stream ended without any token"


@pytest.mark.parametrize("bad, message", [
    (b'data: {"choices": [{"text": \n\n', "malformed JSON chunk"),
    (b"event: error\ndata: engine dead\n\n", "server error in stream: engine dead"),
    (b'data: {"error": {"message": "engine dead"}}\n\n', "server error in stream"),
])
def test_broken_streams_end_the_request_with_the_reason(bad, message) -> None:
    first_token = sse(2).split(b"\n\n")[0] + b"\n\n"
    resp = _feed(chunked(first_token + bad), [])
    assert message in resp.error and not resp.keep_alive


def test_garbage_and_broken_framing_are_errors_not_exceptions() -> None:
    assert "malformed HTTP response" in _feed(b"SSH-2.0-OpenSSH\r\n\r\n", []).error
    bad_size = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
    assert "chunk size" in _feed(bad_size, []).error
    huge = b"HTTP/1.1 200 OK\r\n" + b"x-pad: %s\r\n" % (b"a" * MAX_HEAD_BYTES)
    assert _feed(huge, [7]).error == "response headers too long"


def test_a_body_until_close_and_a_connection_lost_midway() -> None:
    loop = asyncio.new_event_loop()
    try:
        until_close = Response(0.0, loop.create_future())
        until_close.feed(b"HTTP/1.0 200 OK\r\n\r\n" + sse(2), 1.0)
        assert not until_close.done.done()
        until_close.lost(None, 2.0)
        assert until_close.error is None and until_close.out_tokens == 2

        cut = Response(0.0, loop.create_future())
        cut.feed(chunked(sse(4))[:120], 1.0)
        cut.lost(ConnectionResetError("reset"), 2.0)
        assert cut.error.startswith("connection lost mid-response")

        silent = Response(0.0, loop.create_future())
        silent.lost(None, 1.0)
        assert silent.error.startswith("server closed the connection before answering")
    finally:
        loop.close()


def test_health_answers_are_not_streams() -> None:
    resp = _feed(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", [], stream=False)
    assert resp.done.done() and resp.error is None


@settings(max_examples=100, deadline=None)
@given(prompt=st.lists(st.integers(0, 49151), min_size=1, max_size=40),
       chunks=st.lists(st.lists(st.integers(0, 49151), min_size=1, max_size=5), min_size=1,
                       max_size=10),
       piece=st.integers(1, 90), cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_token_ids_are_collected_from_every_chunk_however_split(prompt, chunks, piece,
                                                                 cuts) -> None:
    resp = _feed(chunked(sse_ids(prompt, chunks), piece=piece), cuts)
    assert resp.error is None and resp.out_tokens == sum(map(len, chunks))
    assert resp.token_ids() == (tuple(prompt), tuple(i for c in chunks for i in c))
    assert len(resp.gaps) == len(chunks) - 1  # a chunk of several ids is one arrival


def test_token_ids_that_disagree_with_usage_or_are_missing_give_none() -> None:
    short = _feed(chunked(sse_ids([5, 6], [[1], [2, 3]], usage=4)), [])
    assert short.error is None and short.out_tokens == 4
    assert short.token_ids() is None  # a capture must be exact or absent
    no_ids = _feed(chunked(sse(3)), [])  # an engine that ignores return_token_ids
    assert no_ids.error is None and no_ids.token_ids() is None
    no_prompt = _feed(chunked(sse_ids(None, [[1], [2]])), [])  # type: ignore[arg-type]
    assert no_prompt.error is None and no_prompt.token_ids() is None
    broken = _feed(chunked(sse_ids([5], [[1, 2], 7], usage=2)), [])  # type: ignore[list-item]
    assert broken.error is None and broken.token_ids() is None


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
        loadgen_clock.run(swallowing())


# --- framing: what the SSE standard and HTTP/1.1 allow --------------------------------------
@pytest.mark.parametrize("eol, framing", FRAMINGS)
def test_every_framing_parses_the_same_at_every_single_cut(eol, framing) -> None:
    raw = framed(spec_stream(3, eol=eol), framing)
    for cuts in [[k] for k in range(1, len(raw))] + [list(range(1, len(raw)))]:
        resp = _feed(raw, cuts)
        assert resp.error is None, (cuts[:3], resp.error)
        assert resp.out_tokens == 3 and len(resp.gaps) == 2 and resp.keep_alive


def test_sse_fields_follow_the_standard() -> None:
    events = EventStream()
    got = events.feed(b"data\n\n:comment\ndata:a\ndata: b\r\n\nid: 7\nretry: 25\nretry: x\n"
                      b"event: e1\nunknown: 1\ndata:  c\r\r\nevent: lone\n\ndata: d\r")
    assert got == [(b"message", b""), (b"message", b"a\nb"), (b"e1", b" c")]
    assert events.last_id == b"7" and events.retry_ms == 25
    assert events.feed(b"\n") == []  # CR then LF: one line end, not two
    assert events.feed(b"\n") == [(b"message", b"d")]


