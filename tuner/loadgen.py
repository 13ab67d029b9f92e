"""Load generator stage: a closed loop of streaming requests at a fixed concurrency.

Promises: exactly `concurrency` requests in flight until the work runs out (a new one starts
when one ends, as `vllm bench serve --max-concurrency` does); every request becomes a
RequestRecord with TTFT, end-to-end time, chunk gaps and the server's own token count (usage
of the final stream chunk), or with the error that ended it. All async code of the project
lives here; callers use the synchronous `run_requests`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence

from tuner.errors import MeasurementFailed
from tuner.records import Prompt, RequestRecord


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
) -> tuple[list[RequestRecord], float]:
    """Send `prompts` with `concurrency` in flight; return records and the wall time (s)."""
    coro = _closed_loop(
        url, prompts, concurrency=concurrency, api_key=api_key, model=model,
        temperature=temperature, ignore_eos=ignore_eos, warmup=warmup,
        request_timeout_s=request_timeout_s, on_done=on_done)
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
        return asyncio.run(coro)
    if not hasattr(asyncio, "Runner"):  # Python 3.10
        return uvloop.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _json_decoder():
    try:
        import msgspec

        return msgspec.json.decode, (ValueError, msgspec.DecodeError)
    except ImportError:
        return json.loads, (ValueError,)


_loads, _DECODE_ERRORS = _json_decoder()


async def _closed_loop(url, prompts, *, concurrency, api_key, model, temperature, ignore_eos,
                       warmup, request_timeout_s, on_done):
    import aiohttp

    queue: asyncio.Queue[tuple[int, Prompt]] = asyncio.Queue()
    for item in enumerate(prompts):
        queue.put_nowait(item)
    records: list[RequestRecord] = []
    headers = {"Authorization": f"Bearer {api_key}"}
    connector = aiohttp.TCPConnector(limit=max(concurrency, 1) + 4, force_close=False)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers,
                                     read_bufsize=1 << 20) as session:
        t0 = time.perf_counter()

        async def slot() -> None:
            while True:
                try:
                    index, prompt = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                rec = await _one_request(
                    session, url, prompt, index=index, t0=t0, concurrency=concurrency,
                    model=model, temperature=temperature, ignore_eos=ignore_eos,
                    warmup=warmup, request_timeout_s=request_timeout_s)
                records.append(rec)
                if on_done:
                    on_done(rec)

        await asyncio.gather(*(slot() for _ in range(max(1, min(concurrency, len(prompts))))))
        wall_s = time.perf_counter() - t0
    records.sort(key=lambda r: r.index)
    return records, wall_s


async def _one_request(session, url, prompt: Prompt, *, index, t0, concurrency, model,
                       temperature, ignore_eos, warmup, request_timeout_s) -> RequestRecord:
    import aiohttp

    payload = {
        "model": model, "prompt": prompt.prompt, "max_tokens": prompt.output_len,
        "temperature": temperature, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos,
    }
    start = time.perf_counter()
    ttft = None
    last = start
    gaps: list[float] = []
    out_tokens = 0
    prompt_tokens = prompt.prompt_len
    error = None
    buffer = b""
    try:
        async with session.post(url + "/v1/completions", json=payload) as resp:
            if resp.status != 200:
                body = (await resp.text())[:300]
                raise _RequestError(f"HTTP {resp.status}: {body}")
            async for raw in resp.content.iter_any():
                buffer += raw
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    data = event.strip()
                    if not data:
                        continue
                    if not data.startswith(b"data:"):
                        raise _RequestError(f"malformed stream event: {data[:80]!r}")
                    data = data[5:].strip()
                    if data == b"[DONE]":
                        continue
                    try:
                        chunk = _loads(data)
                    except _DECODE_ERRORS:
                        raise _RequestError(f"malformed JSON chunk: {data[:80]!r}") from None
                    if not isinstance(chunk, dict):
                        raise _RequestError(f"malformed chunk: {data[:80]!r}")
                    if "error" in chunk:
                        raise _RequestError(f"server error in stream: {str(chunk['error'])[:200]}")
                    now = time.perf_counter()
                    if chunk.get("choices"):
                        if ttft is None:
                            ttft = now - start
                        else:
                            gaps.append(now - last)
                        last = now
                    usage = chunk.get("usage")
                    if usage:
                        out_tokens = int(usage.get("completion_tokens") or 0)
                        prompt_tokens = int(usage.get("prompt_tokens") or prompt_tokens)
        if ttft is None:
            raise _RequestError("stream ended without any token")
        if out_tokens == 0:
            raise _RequestError("stream ended without a usage chunk (token count unknown)")
    except _RequestError as e:
        error = str(e)
    except asyncio.TimeoutError:
        error = f"timed out after {request_timeout_s:.0f} s (--request-timeout)"
    except aiohttp.ClientError as e:
        error = f"{type(e).__name__}: {e}"[:300]
    end = time.perf_counter()
    return RequestRecord(
        concurrency=concurrency, index=index, warmup=warmup, start_s=round(start - t0, 6),
        ttft_s=ttft, e2e_s=None if error else end - start, prompt_tokens=prompt_tokens,
        output_tokens=0 if error else out_tokens, chunk_gaps_s=tuple(gaps), error=error)


class _RequestError(Exception):
    pass
