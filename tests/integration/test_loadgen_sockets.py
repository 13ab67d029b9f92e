"""The load generator against socket servers on loopback (threads of this process): what
the parser tests (tests/unit/test_http_client.py) feed byte by byte, here over real TCP reads:
keep-alive retries, the level's deadline, every framing and arrival times."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
from http_bytes import FRAMINGS, chunked, framed, spec_stream, sse, sse_ids

from tuner.measure import load_level, loadgen
from tuner.measure.closed_loop import closed_loop


def test_a_record_carries_exact_ids_and_the_request_asks_for_them() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    bodies: list[dict] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            data = b""
            for answer in (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",  # GET /health
                           chunked(sse_ids([9, 8, 7], [[1], [2, 3, 4], [0]])),
                           chunked(sse_ids([9], [[1], [2]], usage=3))):
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
    # No cache_salt: no engine is sent a prompt twice (tuner.measure.request_schedule).
    assert [b.get("cache_salt", "none") for b in bodies] == ["none", "none"]
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
                        conn.sendall(chunked(sse(3)))
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
    from tuner.records.configs import Prompt

    try:
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        prompts = [Prompt(prompt=f"p{i}", prompt_len=1, output_len=output_len)
                   for i in range(n)]
        records, _ = loadgen.run_requests(
            url, prompts, load_level.RequestSettings(model="m", api_key="k", request_timeout_s=10),
            concurrency=1)
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

    from tuner.records.configs import Prompt

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
            level = load_level.LoadLevel(
                url=url, settings=load_level.RequestSettings(model="m", api_key="k",
                                                          request_timeout_s=600.0),
                concurrency=2, warmup=False, origin_s=None, deadline=t0 + 0.5)
            # no outer wait_for: only the deadline stops it
            asyncio.run(closed_loop(level, prompts, on_done=None))
    finally:
        srv.close()
        for conn in held:
            conn.close()
    # Nothing else ends it before the 600 s request timeout: well under that, it was the
    # 0.5 s deadline, on any host (a bound of a few seconds is one a loaded host can break).
    assert time.perf_counter() - t0 < 120.0


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
    raw = framed(spec_stream(4, eol=eol), framing)
    pieces = [raw[i:i + 29] for i in range(0, len(raw), 29)]
    records = _requests_to(_raw_server([pieces, [raw]], pause_s=0.001), n=2, output_len=4)
    assert [r.error for r in records] == [None, None]
    assert [r.output_tokens for r in records] == [4, 4]
    assert all(len(r.chunk_gaps_s) == 3 and r.ttft_s > 0 for r in records)


def test_a_response_split_at_every_byte_boundary_across_tcp_reads() -> None:
    raw = framed(spec_stream(2, eol=b"\r\n"), "continue")
    records = _requests_to(_raw_server([[raw[:k], raw[k:]] for k in range(1, len(raw))],
                                       pause_s=0.0005), n=len(raw) - 1, output_len=2)
    assert [r.error for r in records] == [None] * (len(raw) - 1)
    assert all(r.output_tokens == 2 and len(r.chunk_gaps_s) == 1 for r in records)


def test_chunk_arrival_times_are_those_of_the_reads_that_complete_the_events() -> None:
    # The second event's blank line comes 0.2 s after the rest of it: its arrival is then.
    raw = framed(spec_stream(2), "length")
    cut = raw.index(b't1"}]}\n') + 7
    records = _requests_to(_raw_server([[raw[:cut], raw[cut:]]], pause_s=0.2), n=1,
                           output_len=2)
    assert records[0].error is None
    # Not exactly 0.2: this process's server thread and client share the GIL, so the first
    # read may be stamped a little late on a busy machine; stamped early, the gap would be ~0.
    assert records[0].chunk_gaps_s[0] >= 0.15
