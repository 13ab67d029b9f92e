"""Measurement fidelity, part (a): does our client measure TTFT and TPOT right under load?

Starts the fake engine (tuner/fake_engine.py, which writes token i of every request at
start + TTFT + i * TPOT against absolute deadlines) through the real Engine class, drives it
with tuner.loadgen.run_requests at each concurrency, aggregates with tuner.metrics.level_metrics
exactly as a trial does, and compares the measured mean TTFT and TPOT with the scripted truth
(read back from the server's /fake/script). The target is every error within 2 %. The fake's
own emission lag (how late it wrote a chunk against its deadline, from its /metrics) is printed
beside, so an error can be put on the server or on the client.

    .venv/bin/python benchmarks/fidelity.py                    # both scenarios, c = 1..128
    .venv/bin/python benchmarks/fidelity.py --client-loop uvloop --server-loop uvloop
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner import loadgen, metrics  # noqa: E402
from tuner.engine import Engine  # noqa: E402
from tuner.fake_engine import SCRIPT_ENV  # noqa: E402
from tuner.records import EngineSpec, LevelMetrics, Prompt, SpecDecodeCounts, TrialConfig  # noqa: E402

PROMPT = " ".join(f"word{i}" for i in range(32))


def _fake_stats(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {k: float(v) for line in text.splitlines() if line.startswith("fake:")
            for k, v in [line.split()]}


def _post(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url, method="POST", data=b""), timeout=10)


@contextlib.contextmanager
def _dispatch_trace(dispatch_s: list[tuple[float, float]]) -> Iterator[None]:
    """Record, per request, (client send, server receive): client start to request body
    written, and body written to server arrival. Their sum is the request's dispatch time.

    loadgen builds its own ClientSession; one with a TraceConfig stands in for it. The
    server stamps its arrival on CLOCK_MONOTONIC (x-fake-t0), the clock of perf_counter.
    """
    async def on_start(_session, ctx, _params) -> None:
        ctx.t_start = ctx.t_sent = time.perf_counter()

    async def on_sent(_session, ctx, _params) -> None:
        ctx.t_sent = time.perf_counter()

    async def on_headers(_session, ctx, params) -> None:
        t0 = params.response.headers.get("x-fake-t0")
        if t0 is not None:
            dispatch_s.append((ctx.t_sent - ctx.t_start, float(t0) - ctx.t_sent))

    original = aiohttp.ClientSession

    def traced_session(*args, **kwargs) -> aiohttp.ClientSession:
        trace = aiohttp.TraceConfig()
        trace.on_request_start.append(on_start)
        trace.on_request_chunk_sent.append(on_sent)
        trace.on_request_end.append(on_headers)
        return original(*args, trace_configs=[trace], **kwargs)

    aiohttp.ClientSession = traced_session
    try:
        yield
    finally:
        aiohttp.ClientSession = original


def measure_level(eng: Engine, c: int, *, output_tokens: int, spread: float,
                  trace: bool) -> tuple[LevelMetrics, dict, list[tuple[float, float]]]:
    """One level as a trial runs it: c short warm-up requests, then max(16, 3c) measured."""
    n = max(16, 3 * c)
    common = dict(concurrency=c, api_key=eng.api_key, model=eng.spec.served_model_name,
                  request_timeout_s=60.0, level_timeout_s=600.0)
    warm = [Prompt(prompt=PROMPT, prompt_len=32, output_len=4)] * c
    loadgen.run_requests(eng.url, warm, warmup=True, **common)
    _post(eng.url + "/fake/reset_stats")
    # Equal lengths keep a closed loop's requests in lockstep (c start together, forever);
    # a spread of lengths lets them drift apart as real requests do. TTFT/TPOT stay true.
    rng = random.Random(c)
    lo, hi = round(output_tokens * (1 - spread)), round(output_tokens * (1 + spread))
    prompts = [Prompt(prompt=PROMPT, prompt_len=32, output_len=rng.randint(lo, hi))
               for _ in range(n)]
    dispatch_s: list[tuple[float, float]] = []
    with _dispatch_trace(dispatch_s) if trace else contextlib.nullcontext():
        records, wall_s = loadgen.run_requests(eng.url, prompts, **common)
    level = metrics.level_metrics(records, concurrency=c, duration_s=wall_s,
                                  warmup_requests=c, counts=SpecDecodeCounts())
    return level, _fake_stats(eng.url), dispatch_s


def run_scenario(*, ttft_ms: float, tpot_ms: float, output_tokens: int, tokens_per_chunk: int,
                 concurrencies: list[int], server_loop: str, log_dir: Path, spread: float,
                 trace: bool) -> list[dict]:
    script = {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "tokens_per_chunk": tokens_per_chunk,
              "startup_s": 0.0}
    spec = EngineSpec(
        model="fake-model", vllm_cmd=(sys.executable, "-m", "tuner.fake_engine"),
        extra_args=("--fake-loop", server_loop), ready_timeout_s=30.0,
        env={SCRIPT_ENV: json.dumps(script),
             "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                          os.environ.get("PYTHONPATH")]))})
    config = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens":
                                             tokens_per_chunk - 1} if tokens_per_chunk > 1
                         else None)
    rows = []
    with Engine(spec, config, log_path=log_dir / f"engine-tpc{tokens_per_chunk}.log") as eng:
        with urllib.request.urlopen(eng.url + "/fake/script", timeout=10) as r:
            truth = json.load(r)  # the true values are the server's own script
        for c in concurrencies:
            level, stats, dispatch = measure_level(eng, c, output_tokens=output_tokens,
                                                   spread=spread, trace=trace)
            lag_n = max(stats["fake:emit_lag_seconds_count"], 1.0)
            send_ms = 1000 * statistics.fmean(d[0] for d in dispatch) if dispatch else math.nan
            recv_ms = 1000 * statistics.fmean(d[1] for d in dispatch) if dispatch else math.nan
            rows.append({
                "tokens_per_chunk": tokens_per_chunk, "concurrency": c,
                "requests": level.num_requests, "failed": level.failed,
                "true_ttft_ms": truth["ttft_ms"], "mean_ttft_ms": level.mean_ttft_ms,
                "ttft_err_pct": 100 * (level.mean_ttft_ms / truth["ttft_ms"] - 1),
                "true_tpot_ms": truth["tpot_ms"], "mean_tpot_ms": level.mean_tpot_ms,
                "tpot_err_pct": 100 * (level.mean_tpot_ms / truth["tpot_ms"] - 1),
                "p99_ttft_ms": level.p99_ttft_ms, "p99_tpot_ms": level.p99_tpot_ms,
                "server_lag_mean_ms": 1000 * stats["fake:emit_lag_seconds_sum"] / lag_n,
                "server_lag_max_ms": 1000 * stats["fake:emit_lag_seconds_max"],
                "max_inflight": int(stats["fake:max_inflight"]),
                "send_mean_ms": send_ms, "recv_mean_ms": recv_ms,
                # What remains once dispatch is taken out: the fake's first-chunk write,
                # loopback transit and the client's read and timestamp.
                "ttft_after_dispatch_err_pct": 100 * ((level.mean_ttft_ms - send_ms - recv_ms)
                                                      / truth["ttft_ms"] - 1),
                "output_throughput": level.output_throughput,
            })
            _print_row(rows[-1])
    return rows


HEADER = (f"{'chunk':>5} {'c':>4} {'reqs':>4} {'fail':>4} | {'true TTFT':>9} {'mean TTFT':>9} "
          f"{'err %':>6} | {'true TPOT':>9} {'mean TPOT':>9} {'err %':>6} | "
          f"{'srv lag mean/max ms':>19} {'send ms':>7} {'recv ms':>7} {'w/o disp':>8} "
          f"{'inflight':>8}")


def _print_row(r: dict) -> None:
    print(f"{r['tokens_per_chunk']:>5} {r['concurrency']:>4} {r['requests']:>4} {r['failed']:>4} | "
          f"{r['true_ttft_ms']:>9.2f} {r['mean_ttft_ms']:>9.2f} {r['ttft_err_pct']:>+6.2f} | "
          f"{r['true_tpot_ms']:>9.2f} {r['mean_tpot_ms']:>9.3f} {r['tpot_err_pct']:>+6.2f} | "
          f"{r['server_lag_mean_ms']:>8.2f} / {r['server_lag_max_ms']:>8.2f} "
          f"{r['send_mean_ms']:>7.2f} {r['recv_mean_ms']:>7.2f} "
          f"{r['ttft_after_dispatch_err_pct']:>+8.2f} "
          f"{r['max_inflight']:>8}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="1,2,4,8,16,32,64,128")
    p.add_argument("--ttft-ms", type=float, default=80.0)
    p.add_argument("--tpot-ms", type=float, default=12.0)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--tokens-per-chunk", default="1,3",
                   help="one scenario each; 3 mimics speculation (several tokens per chunk)")
    p.add_argument("--client-loop", choices=("asyncio", "uvloop"), default="asyncio")
    p.add_argument("--server-loop", choices=("asyncio", "uvloop"), default="asyncio")
    p.add_argument("--output-spread", type=float, default=0.0,
                   help="output lengths uniform in N*(1 +- spread); 0: all exactly N")
    p.add_argument("--no-trace", action="store_true",
                   help="do not time dispatch (server arrival - client start) per request")
    p.add_argument("--target-pct", type=float, default=2.0)
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    if args.client_loop == "uvloop":
        import uvloop

        # loadgen calls asyncio.run, which takes its loop from the policy.
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    print("Measurement fidelity (a): fake engine with scripted timing, measured by "
          "tuner.loadgen + tuner.metrics")
    lengths = (f"{args.output_tokens} output tokens" if not args.output_spread else
               f"output tokens uniform in {args.output_tokens} +- {args.output_spread:.0%}")
    print(f"  script: TTFT {args.ttft_ms} ms, TPOT {args.tpot_ms} ms, {lengths}, tokens per "
          f"chunk {args.tokens_per_chunk}; requests per level max(16, 3c) after c warm-up "
          f"requests")
    print(f"  machine: {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
          f"Linux {platform.release()}, Python {platform.python_version()}, aiohttp "
          f"{aiohttp.__version__}; client loop {args.client_loop}, server loop "
          f"{args.server_loop}, server in its own process; load average "
          f"{os.getloadavg()[0]:.2f} at start")
    print(f"  error % = measured mean / true - 1; target |error| <= {args.target_pct} %.\n"
          "  Diagnostics: srv lag = how late the fake wrote chunks vs its deadlines; a request's "
          "dispatch (in the measured TTFT,\n  not in the scripted one) = send (client start to "
          "request written) + recv (written to server arrival);\n  w/o disp = TTFT error % "
          "once dispatch is taken out: the first chunk's write, transit and client read.\n")
    print(HEADER)
    t0 = time.monotonic()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp:
        for tpc in (int(x) for x in args.tokens_per_chunk.split(",")):
            rows += run_scenario(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms,
                                 output_tokens=args.output_tokens, tokens_per_chunk=tpc,
                                 concurrencies=concurrencies, server_loop=args.server_loop,
                                 log_dir=Path(tmp), spread=args.output_spread,
                                 trace=not args.no_trace)
    worst_ttft = max(rows, key=lambda r: abs(r["ttft_err_pct"]))
    worst_tpot = max(rows, key=lambda r: abs(r["tpot_err_pct"]))
    failed = sum(r["failed"] for r in rows)
    print(f"\nmax |TTFT error| {abs(worst_ttft['ttft_err_pct']):.2f} % (c={worst_ttft['concurrency']}, "
          f"chunk {worst_ttft['tokens_per_chunk']}); max |TPOT error| "
          f"{abs(worst_tpot['tpot_err_pct']):.2f} % (c={worst_tpot['concurrency']}, chunk "
          f"{worst_tpot['tokens_per_chunk']}); failed requests {failed}; "
          f"{time.monotonic() - t0:.0f} s; load average {os.getloadavg()[0]:.2f} at the end")
    worst = max(abs(worst_ttft["ttft_err_pct"]), abs(worst_tpot["tpot_err_pct"]))
    ok = worst <= args.target_pct and failed == 0
    over = sorted({(r["tokens_per_chunk"], r["concurrency"]) for r in rows
                   if max(abs(r["ttft_err_pct"]), abs(r["tpot_err_pct"])) > args.target_pct})
    print(("PASS" if ok else "FAIL") + f": max error {worst:.2f} % vs target {args.target_pct} %"
          + (f"; over target at (chunk, c) {over}" if over else ""))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "cpu_count": os.cpu_count(), "rows": rows}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
