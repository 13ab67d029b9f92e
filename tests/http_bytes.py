"""HTTP responses and server-sent event streams as bytes, for the load generator's tests
(tests/unit/test_http_client.py feeds them to its parser, tests/integration/
test_loadgen_sockets.py serves them on loopback)."""

from __future__ import annotations

import json


def sse(tokens: int, *, usage: bool = True) -> bytes:
    events = [b'data: {"choices":[{"index":0,"text":" t%d"}]}\n\n' % i for i in range(tokens)]
    if usage:
        events.append(b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d}}'
                      b"\n\n" % tokens)
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


def chunked(body: bytes, *, piece: int = 40) -> bytes:
    out = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(body[i:i + piece]), body[i:i + piece])
                   for i in range(0, len(body), piece))
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + out + b"0\r\n\r\n")


def sse_ids(prompt: list[int], chunks: list[list[int]], *, usage: int | None = None) -> bytes:
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


def spec_stream(tokens: int, *, eol: bytes = b"\n") -> bytes:
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


def framed(body: bytes, framing: str) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    if framing == "chunked":
        return chunked(body, piece=23)
    if framing == "continue":  # an interim answer first, as to `Expect: 100-continue`
        return b"HTTP/1.1 100 Continue\r\n\r\n" + chunked(body, piece=23)
    if framing == "length":
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    raise ValueError(framing)


FRAMINGS = [(eol, framing) for eol in (b"\n", b"\r\n", b"\r")
            for framing in ("chunked", "continue", "length")]
