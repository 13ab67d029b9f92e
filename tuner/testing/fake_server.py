"""The fake engine's server: the HTTP routes of the fake vLLM server (tuner.testing.fake_engine)
on aiohttp, as vLLM's OpenAI-compatible server answers them, and the lines vLLM prints.

GET /health, /version, /metrics (vLLM's spec-decode counters when a speculative config is
given, plus `fake:*` gauges) and /v1/models; POST /v1/completions, streamed on the script's
pace (tuner.testing.fake_pace); and the fake's own: POST /fake/reset_stats, GET /fake/script
and GET /fake/served, which tells per request when the server really wrote, the truth
benchmarks/fidelity.py compares with.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any

from aiohttp import web

from tuner.testing import fake_completion, fake_pace
from tuner.testing.fake_completion import CompletionRequest
from tuner.testing.fake_pace import Served, ServerState, count_chunk, sleep_until

FAKE_VERSION = "0.0.0+fake"

# When the bytes of each connection's current request first reached this process. aiohttp
# starts a handler only after parsing it and scheduling a task, which under a burst of a
# hundred requests is milliseconds later: stamping here keeps the script's clock honest.
_ARRIVALS: dict[Any, float] = {}


def _stamp_arrivals() -> None:
    from aiohttp import web_protocol

    handler = web_protocol.RequestHandler
    if getattr(handler, "_fake_stamped", False):
        return
    data_received, connection_lost = handler.data_received, handler.connection_lost

    def stamped_data_received(self, data: bytes) -> None:
        if data:  # aiohttp calls it with b"" itself to re-parse what it buffered
            _ARRIVALS.setdefault(self, fake_pace.now())
        data_received(self, data)

    def forgetting_connection_lost(self, exc) -> None:
        _ARRIVALS.pop(self, None)
        connection_lost(self, exc)

    handler.data_received = stamped_data_received
    handler.connection_lost = forgetting_connection_lost
    handler._fake_stamped = True


@web.middleware
async def _arrival(request: web.Request, handler):
    # One request at a time per connection (clients do not pipeline), so the stamp is this
    # request's; popping it leaves the next request on the connection to stamp its own.
    request["arrival"] = _ARRIVALS.pop(request.protocol, None) or fake_pace.now()
    return await handler(request)


def log(message: str, level: str = "INFO") -> None:
    """A line on stderr as vLLM's API server logs it."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"(APIServer pid={os.getpid()}) {level} {stamp} [fake_engine.py] {message}",
          file=sys.stderr, flush=True)


def exit_reaping(child: subprocess.Popen | None) -> None:
    """Exit now, after reaping `child` (the scripted EngineCore) as vLLM reaps its own."""
    if child is not None:
        child.terminate()
        child.wait(timeout=5)
    sys.stderr.flush()
    os._exit(0)


def _unauthorized(request: web.Request, state: ServerState) -> bool:
    # vLLM guards only the API routes; /health and /metrics stay open.
    if state.api_key is None or not request.path.startswith("/v1"):
        return False
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() != "bearer" or token != state.api_key


def _error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


async def _completions(request: web.Request) -> web.StreamResponse:
    t0 = request["arrival"]  # the scripted TTFT counts from here
    state: ServerState = request.app["state"]
    script = state.script
    if _unauthorized(request, state):
        return web.json_response({"error": "Unauthorized"}, status=401)
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "request body is not JSON", "BadRequestError")
    if body.get("model", state.model) != state.model:
        return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
    try:
        req = CompletionRequest.parse(body)
    except (TypeError, ValueError) as e:
        return _error(400, f"request body: {e}", "BadRequestError")
    state.requests += 1
    number = state.requests
    if script.http_error_every and number % script.http_error_every == 0:
        return _error(500, "fake engine: scripted internal error", "InternalServerError")
    state.inflight += 1
    state.max_inflight = max(state.max_inflight, state.inflight)
    state.live[number] = [t0, None]
    resp = web.StreamResponse(headers={
        "Content-Type": ("text/event-stream; charset=utf-8" if req.stream
                         else "application/json"),
        # The truth a benchmark compares with, and the arrival on CLOCK_MONOTONIC (a client's
        # perf_counter on Linux), which splits a measured TTFT into dispatch and server time.
        "x-fake-ttft-ms": str(script.ttft_ms), "x-fake-tpot-ms": str(script.tpot_ms),
        "x-fake-request-number": str(number), "x-fake-t0": repr(t0)})
    try:
        if script.stall_requests:
            await asyncio.Event().wait()
        await resp.prepare(request)
        served = Served(number=number, prompt=req.prompt_text[:64], arrival=t0)
        await _stream(resp, state, req, t0=t0, number=number, served=served)
        await resp.write_eof()
        served.eof = fake_pace.now()
        state.served.append(served)
    except ConnectionResetError:
        pass  # the client went away (its own timeout, or a chunk it rejected)
    finally:
        state.inflight -= 1
        state.live.pop(number, None)
    return resp


async def _stream(resp: web.StreamResponse, state: ServerState, req: CompletionRequest, *,
                  t0: float, number: int, served: Served) -> None:
    """Write the completion on the script's schedule, as vLLM's stream (or one JSON body)."""
    script = state.script
    done = fake_completion.plan(state, req)
    pace = fake_pace.Pace(state, t0, number)
    ends = done.ends
    texts: list[str] = []
    for i, end in enumerate(ends):
        # The first and last chunk bound TTFT and TPOT, so only they pay for a precise wake-up.
        deadline = pace.due(i, ends)
        await sleep_until(deadline, precise=i in (0, len(ends) - 1))
        if (script.die_after_requests is not None and number > script.die_after_requests
                and i >= len(ends) // 2):
            log("EngineCore encountered a fatal error (scripted die_after_requests).", "ERROR")
            os._exit(1)
        if script.malformed_every and number % script.malformed_every == 0 and i > 0:
            await resp.write(b'data: {"choices": [{"text": \n\n')
            return
        start = ends[i - 1] + 1 if i else 0
        text = done.text(start, end)
        count_chunk(state, number, i, pace.k, deadline)
        if done.stream:
            await resp.write(done.chunk(i, start, text))
            if i == 0:
                served.first_write = fake_pace.now()
        else:
            texts.append(text)
    served.tokens = len(done.output_ids)
    state.agreement.pop(number, None)
    await resp.write(done.closing(texts))


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": FAKE_VERSION})  # open, as vLLM's /version is


async def _models(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    if _unauthorized(request, state):
        return web.json_response({"error": "Unauthorized"}, status=401)
    return web.json_response({"object": "list", "data": [
        {"id": state.model, "object": "model", "created": int(state.created),
         "owned_by": "vllm", "root": state.model, "max_model_len": 4096}]})


async def _metrics(request: web.Request) -> web.Response:
    s: ServerState = request.app["state"]
    labels = f'model_name="{s.model}",engine="0"'
    out = ["# TYPE vllm:num_requests_running gauge",
           f"vllm:num_requests_running{{{labels}}} {float(s.inflight)}"]
    if s.spec_tokens:
        for name, value in (("num_drafts", s.drafts), ("num_draft_tokens", s.draft_tokens),
                            ("num_accepted_tokens", s.accepted)):
            out += [f"# TYPE vllm:spec_decode_{name} counter",
                    f"vllm:spec_decode_{name}_total{{{labels}}} {float(value)}",
                    f"vllm:spec_decode_{name}_created{{{labels}}} {s.created}"]
        out.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
        for pos in range(s.spec_tokens):
            count = (s.accepted_per_pos[pos] if s.script.drafter_rates is not None
                     else s.drafts * s.script.accept_rate)
            out.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},'
                       f'position="{pos}"}} {float(count)}')
    # Not vLLM's: what the tests and the fidelity benchmark check the client against.
    out += [f"fake:inflight {s.inflight}", f"fake:max_inflight {s.max_inflight}",
            f"fake:requests_total {s.requests}", f"fake:emit_lag_seconds_sum {s.lag_sum_s}",
            f"fake:emit_lag_seconds_count {s.lag_count}",
            f"fake:emit_lag_seconds_max {s.lag_max_s}"]
    return web.Response(text="\n".join(out) + "\n", content_type="text/plain")


async def _reset_stats(request: web.Request) -> web.Response:
    """Start a fresh window for max in-flight and emission lag (one per measured level)."""
    s: ServerState = request.app["state"]
    s.max_inflight, s.lag_sum_s, s.lag_count, s.lag_max_s = s.inflight, 0.0, 0, 0.0
    s.served = []
    return web.Response(status=204)


async def _served(request: web.Request) -> web.Response:
    """Every streamed request completed since the last reset: arrival, first write, end."""
    return web.json_response([{k: v for k, v in asdict(s).items() if v is not None}
                              for s in request.app["state"].served])


async def _script(request: web.Request) -> web.Response:
    return web.json_response(request.app["state"].script.model_dump())


async def serve(state: ServerState, host: str, port: int) -> None:
    _stamp_arrivals()
    app = web.Application(middlewares=[_arrival])
    app["state"] = state
    app.add_routes([web.get("/health", _health), web.get("/version", _version),
                    web.get("/metrics", _metrics),
                    web.get("/v1/models", _models), web.post("/v1/completions", _completions),
                    web.post("/fake/reset_stats", _reset_stats), web.get("/fake/script", _script),
                    web.get("/fake/served", _served)])
    # A short shutdown timeout: a stalled request must not hold up the engine's teardown.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    # The lines vLLM (uvicorn) prints once it listens; tests read the pid and URL from them.
    log(f"Starting vLLM server on http://{host}:{port}")
    print(f"INFO:     Started server process [{os.getpid()}]", file=sys.stderr)
    print("INFO:     Application startup complete.", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT,) if state.script.ignore_sigterm else (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log("Shutting down FastAPI HTTP server.")
    # Its grace period is virtual time on a virtual clock, which stands still for a lone server.
    if not fake_pace.on_virtual_clock:
        await runner.cleanup()
    exit_reaping(state.child)
